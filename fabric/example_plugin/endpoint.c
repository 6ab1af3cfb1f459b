/* Listen, connect and accept for the example fabric: a TCP listener on 127.0.0.1 with an ephemeral
 * port, a handle carrying its address, port and a random token, and a handshake that proves the
 * connector knows the token before the listener hands out a comm.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "example_fabric.h"

static const uint8_t kHandleMagic[4] = {'K', 'Z', 'T', 'F'};
static const uint8_t kHelloMagic[4] = {'K', 'Z', 'T', 'H'};
static const uint8_t kAckMagic[4] = {'K', 'Z', 'T', 'A'};
#define XF_HANDLE_VERSION 1
#define XF_FAMILY_IPV4 4

int xf_poll_fd(int fd, short events, uint64_t timeout_ns) {
  struct pollfd p = {.fd = fd, .events = events, .revents = 0};
  struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000), .tv_nsec = (long)(timeout_ns % 1000000000)};
  int rc;
  do {
    rc = ppoll(&p, 1, &ts, NULL);
  } while (rc < 0 && errno == EINTR);
  return rc;
}

/* Sockets that never block the caller and never leak into exec'd children. */
static int xf_socket(void) { return socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0); }

static void xf_tune(int fd) {
  const int one = 1;
  /* Small frames (a posted receive, a data header) must not wait for Nagle. */
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

kz_fabric_result_t xf_listen(void* context, int32_t dev, void* handle, uint32_t* handle_size,
                             kz_fabric_listen_comm_t* listen_comm) {
  xf_context_t* ctx = context;
  if (ctx == NULL || ctx->magic != XF_CONTEXT_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "listen: not an example_tcp context");
  if (dev != 0) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "listen: device %d out of range (1 device)", dev);
  if (handle == NULL || handle_size == NULL || listen_comm == NULL)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "listen: null argument");

  xf_listen_t* l = calloc(1, sizeof *l);
  if (l == NULL) return xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "listen: out of memory");
  if (getrandom(l->token, sizeof l->token, 0) != (ssize_t)sizeof l->token) {
    const int err = errno;
    free(l);
    return xf_error(KZ_FABRIC_ERR_INTERNAL, "listen: getrandom for the handle's token failed: %s", strerror(err));
  }
  l->fd = xf_socket();
  if (l->fd < 0) {
    const int err = errno;
    free(l);
    return xf_error(KZ_FABRIC_ERR_INTERNAL, "listen: socket: %s", strerror(err));
  }
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0; /* an ephemeral port: two listeners never share a handle */
  socklen_t len = sizeof addr;
  if (bind(l->fd, (struct sockaddr*)&addr, sizeof addr) != 0 || listen(l->fd, 64) != 0 ||
      getsockname(l->fd, (struct sockaddr*)&addr, &len) != 0) {
    const int err = errno;
    close(l->fd);
    free(l);
    return xf_error(KZ_FABRIC_ERR_INTERNAL, "listen: binding 127.0.0.1: %s", strerror(err));
  }
  l->magic = XF_LISTEN_MAGIC;
  l->ctx = ctx;

  uint8_t* h = handle;
  memcpy(h, kHandleMagic, 4);
  h[4] = XF_HANDLE_VERSION;
  h[5] = XF_FAMILY_IPV4;
  memcpy(h + 6, &addr.sin_port, 2);         /* network order, as the socket keeps it */
  memcpy(h + 8, &addr.sin_addr.s_addr, 4);  /* likewise */
  memcpy(h + 12, l->token, XF_TOKEN_BYTES);
  *handle_size = XF_HANDLE_BYTES;
  *listen_comm = l;
  return KZ_FABRIC_OK;
}

static void xf_connect_free(xf_connect_t* c) {
  if (c == NULL) return;
  if (c->fd >= 0) close(c->fd);
  c->magic = 0;
  free(c);
}

/* Kept whole: the example's connect state machine (first call, then each resumed step) reads best in one place. */
kz_fabric_result_t xf_connect(void* context, int32_t dev, const void* handle, uint32_t handle_size,
                              kz_fabric_connect_state_t* state, kz_fabric_send_comm_t* send_comm) {
  xf_context_t* ctx = context;
  if (ctx == NULL || ctx->magic != XF_CONTEXT_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "connect: not an example_tcp context");
  if (state == NULL || send_comm == NULL) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "connect: null argument");
  *send_comm = NULL;
  xf_connect_t* c = *state;
  if (c != NULL && c->magic != XF_CONNECT_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "connect: %p is not a connect state of this plugin", (void*)c);

  if (c == NULL) {
    /* A first call: the handle is untrusted bytes from a peer; check every field. */
    if (dev != 0) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "connect: device %d out of range (1 device)", dev);
    const uint8_t* h = handle;
    if (h == NULL || handle_size != XF_HANDLE_BYTES)
      return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "connect: handle of %u bytes (an example_tcp handle has %d)",
                      handle_size, XF_HANDLE_BYTES);
    if (memcmp(h, kHandleMagic, 4) != 0 || h[4] != XF_HANDLE_VERSION || h[5] != XF_FAMILY_IPV4)
      return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT,
                      "connect: not an example_tcp handle (bad magic, version %u or address family %u)", h[4], h[5]);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    memcpy(&addr.sin_port, h + 6, 2);
    memcpy(&addr.sin_addr.s_addr, h + 8, 4);
    if (addr.sin_port == 0) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "connect: handle names port 0");

    c = calloc(1, sizeof *c);
    if (c == NULL) return xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "connect: out of memory");
    c->magic = XF_CONNECT_MAGIC;
    c->fd = xf_socket();
    if (c->fd < 0) {
      const int err = errno;
      xf_connect_free(c);
      return xf_error(KZ_FABRIC_ERR_INTERNAL, "connect: socket: %s", strerror(err));
    }
    xf_tune(c->fd);
    clock_gettime(CLOCK_MONOTONIC, &c->started);
    memcpy(c->hello, kHelloMagic, 4);
    const uint32_t version = XF_HANDLE_VERSION;
    memcpy(c->hello + 4, &version, 4);
    memcpy(c->hello + 8, h + 12, XF_TOKEN_BYTES);
    if (connect(c->fd, (struct sockaddr*)&addr, sizeof addr) == 0) {
      c->phase = XF_SENDING_HELLO;
    } else if (errno == EINPROGRESS) {
      c->phase = XF_CONNECTING;
    } else {
      const int err = errno;
      xf_connect_free(c);
      return xf_error(KZ_FABRIC_ERR_REMOTE, "connect to 127.0.0.1:%u: %s (is the listener closed?)",
                      ntohs(addr.sin_port), strerror(err));
    }
  }

  kz_fabric_result_t rc = KZ_FABRIC_OK;
  if (c->phase == XF_CONNECTING) {
    int err = 0;
    socklen_t len = sizeof err;
    if (xf_poll_fd(c->fd, POLLOUT, 0) > 0) {
      if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        rc = xf_error(KZ_FABRIC_ERR_REMOTE, "connect: %s (is the listener closed?)", strerror(err));
        goto fail;
      }
      c->phase = XF_SENDING_HELLO;
    }
  }
  if (c->phase == XF_SENDING_HELLO) {
    ssize_t n = send(c->fd, c->hello + c->sent, XF_HELLO_BYTES - c->sent, MSG_NOSIGNAL);
    if (n > 0) c->sent += (size_t)n;
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      rc = xf_error(KZ_FABRIC_ERR_REMOTE, "connect: sending the hello: %s", strerror(errno));
      goto fail;
    }
    if (c->sent == XF_HELLO_BYTES) c->phase = XF_WAITING_ACK;
  }
  if (c->phase == XF_WAITING_ACK) {
    ssize_t n = recv(c->fd, c->ack + c->got, XF_ACK_BYTES - c->got, 0);
    if (n > 0) c->got += (size_t)n;
    else if (n == 0) {
      rc = xf_error(KZ_FABRIC_ERR_REMOTE,
                    "connect: the listener closed the connection during the handshake (closed, or a stale handle "
                    "whose port now belongs to another listener)");
      goto fail;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      rc = xf_error(KZ_FABRIC_ERR_REMOTE, "connect: waiting for the listener's answer: %s", strerror(errno));
      goto fail;
    }
    if (c->got == XF_ACK_BYTES) {
      if (memcmp(c->ack, kAckMagic, XF_ACK_BYTES) != 0) {
        rc = xf_error(KZ_FABRIC_ERR_REMOTE, "connect: the listener answered with something else than an ack");
        goto fail;
      }
      xf_comm_t* comm = xf_comm_new(ctx, c->fd, 1);
      if (comm == NULL) {
        rc = xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "connect: out of memory");
        goto fail;
      }
      c->fd = -1; /* the comm owns it now */
      xf_connect_free(c);
      *state = NULL;
      *send_comm = (kz_fabric_send_comm_t)comm;
      return KZ_FABRIC_OK;
    }
  }
  if (xf_expired(&c->started, ctx->timeout_ns)) {
    rc = xf_error(KZ_FABRIC_ERR_TIMEOUT, "connect: no handshake within the %.1f s timeout", ctx->timeout_ns / 1e9);
    goto fail;
  }
  *state = c;
  return KZ_FABRIC_OK;

fail:
  xf_connect_free(c);
  *state = NULL;
  return rc;
}

void xf_connect_abort(void* context, kz_fabric_connect_state_t state) {
  (void)context;
  if (state != NULL && state->magic == XF_CONNECT_MAGIC) xf_connect_free(state);
}

static void xf_drop_pending(xf_listen_t* l, int i) {
  close(l->pending[i].fd);
  l->pending[i] = l->pending[--l->npending];
}

kz_fabric_result_t xf_accept(kz_fabric_listen_comm_t listen_comm, kz_fabric_recv_comm_t* recv_comm) {
  xf_listen_t* l = listen_comm;
  if (l == NULL || l->magic != XF_LISTEN_MAGIC || recv_comm == NULL)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "accept: not an example_tcp listen comm");
  *recv_comm = NULL;
  /* Take every waiting connection; their hellos are read below. */
  for (;;) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return xf_error(KZ_FABRIC_ERR_INTERNAL, "accept: %s", strerror(errno));
    }
    xf_tune(fd);
    /* A full table means someone opened connections and said nothing: drop the oldest. */
    if (l->npending == XF_MAX_PENDING) xf_drop_pending(l, 0);
    l->pending[l->npending].fd = fd;
    l->pending[l->npending].got = 0;
    l->npending++;
  }
  for (int i = 0; i < l->npending;) {
    xf_pending_t* p = &l->pending[i];
    ssize_t n = recv(p->fd, p->hello + p->got, XF_HELLO_BYTES - p->got, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      xf_drop_pending(l, i); /* gave up before finishing its hello */
      continue;
    }
    if (n > 0) p->got += (size_t)n;
    if (p->got < XF_HELLO_BYTES) {
      ++i;
      continue;
    }
    uint32_t version;
    memcpy(&version, p->hello + 4, 4);
    if (memcmp(p->hello, kHelloMagic, 4) != 0 || version != XF_HANDLE_VERSION ||
        memcmp(p->hello + 8, l->token, XF_TOKEN_BYTES) != 0) {
      fprintf(stderr, "kizuna example_tcp fabric: rejected a connection without this listener's token\n");
      xf_drop_pending(l, i);
      continue;
    }
    /* A fresh socket's buffer always takes 4 bytes; anything less means the peer is gone. */
    if (send(p->fd, kAckMagic, XF_ACK_BYTES, MSG_NOSIGNAL) != XF_ACK_BYTES) {
      xf_drop_pending(l, i);
      continue;
    }
    xf_comm_t* comm = xf_comm_new(l->ctx, p->fd, 0);
    if (comm == NULL) return xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "accept: out of memory");
    l->pending[i] = l->pending[--l->npending];
    *recv_comm = (kz_fabric_recv_comm_t)comm;
    return KZ_FABRIC_OK;
  }
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_wait_acceptable(kz_fabric_listen_comm_t listen_comm, uint64_t timeout_ns) {
  xf_listen_t* l = listen_comm;
  if (l == NULL || l->magic != XF_LISTEN_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "wait_acceptable: not an example_tcp listen comm");
  struct pollfd fds[1 + XF_MAX_PENDING];
  int n = 0;
  fds[n++] = (struct pollfd){.fd = l->fd, .events = POLLIN, .revents = 0};
  for (int i = 0; i < l->npending; ++i) fds[n++] = (struct pollfd){.fd = l->pending[i].fd, .events = POLLIN, .revents = 0};
  struct timespec ts = {.tv_sec = (time_t)(timeout_ns / 1000000000), .tv_nsec = (long)(timeout_ns % 1000000000)};
  if (ppoll(fds, (nfds_t)n, &ts, NULL) < 0 && errno != EINTR)
    return xf_error(KZ_FABRIC_ERR_INTERNAL, "wait_acceptable: poll: %s", strerror(errno));
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_close_listen(kz_fabric_listen_comm_t listen_comm) {
  xf_listen_t* l = listen_comm;
  if (l == NULL || l->magic != XF_LISTEN_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "close_listen: not an example_tcp listen comm");
  while (l->npending > 0) xf_drop_pending(l, l->npending - 1);
  close(l->fd);
  l->magic = 0;
  free(l);
  return KZ_FABRIC_OK;
}
