/* Tagged send and receive for the example fabric: the receiver-announced protocol described in
 * example_fabric.h, driven from isend / irecv / test / wait on the caller's thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "example_fabric.h"

/* Outbound segments handed to one sendmsg. */
#define XF_IOV_MAX 16
/* Payload bytes one progress call reads before returning, so one test cannot stay inside a very
 * large message for long; the next test continues. */
#define XF_READ_BUDGET (UINT64_C(64) << 20)

static void xf_put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static void xf_put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t xf_get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t xf_get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

xf_comm_t* xf_comm_new(xf_context_t* ctx, int fd, int is_send) {
  xf_comm_t* c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->magic = XF_COMM_MAGIC;
  c->is_send = is_send;
  c->fd = fd;
  c->ctx = ctx;
  return c;
}

static void xf_fail(xf_request_t* r, kz_fabric_result_t error, const char* message) {
  r->state = XF_FAILED;
  r->error = error;
  snprintf(r->message, sizeof r->message, "%s", message);
}

/* The connection is unusable (peer gone, protocol broken): every live request fails with the
 * reason, queued output is dropped, and later posts are refused. */
static void xf_break(xf_comm_t* c, kz_fabric_result_t error, const char* format, ...)
    __attribute__((format(printf, 3, 4)));
static void xf_break(xf_comm_t* c, kz_fabric_result_t error, const char* format, ...) {
  if (c->broken) return;
  va_list args;
  va_start(args, format);
  vsnprintf(c->broken_message, sizeof c->broken_message, format, args);
  va_end(args);
  c->broken = 1;
  c->broken_error = error;
  for (xf_request_t* r = c->head; r != NULL; r = r->next)
    if (r->state != XF_DONE && r->state != XF_FAILED) xf_fail(r, error, c->broken_message);
  while (c->out_head != NULL) {
    xf_segment_t* s = c->out_head;
    c->out_head = s->next;
    free(s);
  }
  c->out_tail = NULL;
  c->in_data = NULL;
  /* Wake the peer at once rather than at its next write. */
  shutdown(c->fd, SHUT_RDWR);
}

static xf_segment_t* xf_queue(xf_comm_t* c, const uint8_t* ptr, uint64_t len, xf_request_t* completes) {
  xf_segment_t* s = calloc(1, sizeof *s);
  if (s == NULL) return NULL;
  s->ptr = ptr;
  s->len = len;
  s->completes = completes;
  if (c->out_tail != NULL) c->out_tail->next = s;
  else c->out_head = s;
  c->out_tail = s;
  return s;
}

/* Queues a frame; its bytes live in the segment. Returns 0 when out of memory (the comm is then
 * broken: a lost frame would desynchronise both sides). */
static int xf_queue_frame(xf_comm_t* c, uint32_t type, int32_t tag, uint64_t id, uint64_t size,
                          xf_request_t* completes) {
  xf_segment_t* s = xf_queue(c, NULL, XF_FRAME_BYTES, completes);
  if (s == NULL) {
    xf_break(c, KZ_FABRIC_ERR_OUT_OF_MEMORY, "out of memory queueing a frame");
    return 0;
  }
  xf_put_u32(s->frame, type);
  xf_put_u32(s->frame + 4, (uint32_t)tag);
  xf_put_u64(s->frame + 8, id);
  xf_put_u64(s->frame + 16, size);
  s->ptr = s->frame;
  return 1;
}

/* Send side: pairs sends with announced receives of the same tag, both in posting order. A send
 * that fits moves straight into the receive's buffer; one that does not fails here and tells the
 * receiver, so both sides name both sizes and no payload moves. */
static void xf_match(xf_comm_t* c) {
  for (xf_request_t* r = c->head; r != NULL && !c->broken; r = r->next) {
    if (r->state != XF_UNMATCHED) continue;
    xf_arrival_t** link = &c->arrivals_head;
    xf_arrival_t* prev = NULL;
    while (*link != NULL && (*link)->tag != r->tag) {
      prev = *link;
      link = &(*link)->next;
    }
    xf_arrival_t* a = *link;
    if (a == NULL) continue; /* no receive of this tag yet; later sends of other tags may match */
    *link = a->next;
    if (c->arrivals_tail == a) c->arrivals_tail = prev;
    if (r->size > a->size) {
      char message[200];
      snprintf(message, sizeof message,
               "the message of %llu bytes (tag %d) is longer than the peer's receive capacity of %llu bytes",
               (unsigned long long)r->size, r->tag, (unsigned long long)a->size);
      xf_fail(r, KZ_FABRIC_ERR_INVALID_ARGUMENT, message);
      xf_queue_frame(c, XF_FRAME_TRUNC, r->tag, a->id, r->size, NULL);
    } else {
      r->state = XF_SENDING;
      if (xf_queue_frame(c, XF_FRAME_DATA, r->tag, a->id, r->size, r->size == 0 ? r : NULL) && r->size > 0 &&
          xf_queue(c, r->data, r->size, r) == NULL)
        xf_break(c, KZ_FABRIC_ERR_OUT_OF_MEMORY, "out of memory queueing a payload");
    }
    free(a);
  }
}

static xf_request_t* xf_find_posted(xf_comm_t* c, uint64_t id) {
  for (xf_request_t* r = c->head; r != NULL; r = r->next)
    if (r->id == id && r->state == XF_POSTED) return r;
  return NULL;
}

static void xf_on_frame(xf_comm_t* c) {
  const uint32_t type = xf_get_u32(c->in_frame);
  const int32_t tag = (int32_t)xf_get_u32(c->in_frame + 4);
  const uint64_t id = xf_get_u64(c->in_frame + 8);
  const uint64_t size = xf_get_u64(c->in_frame + 16);
  if (c->is_send && type == XF_FRAME_POSTED) {
    xf_arrival_t* a = calloc(1, sizeof *a);
    if (a == NULL) {
      xf_break(c, KZ_FABRIC_ERR_OUT_OF_MEMORY, "out of memory recording a posted receive");
      return;
    }
    a->id = id;
    a->tag = tag;
    a->size = size;
    if (c->arrivals_tail != NULL) c->arrivals_tail->next = a;
    else c->arrivals_head = a;
    c->arrivals_tail = a;
    xf_match(c);
  } else if (!c->is_send && (type == XF_FRAME_DATA || type == XF_FRAME_TRUNC)) {
    xf_request_t* r = xf_find_posted(c, id);
    if (r == NULL || r->tag != tag || (type == XF_FRAME_DATA && size > r->size)) {
      xf_break(c, KZ_FABRIC_ERR_REMOTE, "protocol error: a message for receive %llu that does not expect it",
               (unsigned long long)id);
      return;
    }
    if (type == XF_FRAME_TRUNC) {
      char message[200];
      snprintf(message, sizeof message,
               "a message of %llu bytes (tag %d) is longer than the receive's capacity of %llu bytes",
               (unsigned long long)size, tag, (unsigned long long)r->size);
      xf_fail(r, KZ_FABRIC_ERR_INVALID_ARGUMENT, message);
      return;
    }
    r->done_bytes = size;
    if (size == 0) {
      r->state = XF_DONE;
    } else {
      r->state = XF_MATCHED;
      c->in_data = r;
      c->in_data_left = size;
    }
  } else {
    xf_break(c, KZ_FABRIC_ERR_REMOTE, "protocol error: unexpected frame type %u on a %s comm", type,
             c->is_send ? "send" : "receive");
  }
}

static void xf_write(xf_comm_t* c) {
  while (c->out_head != NULL && !c->broken) {
    struct iovec iov[XF_IOV_MAX];
    int n = 0;
    for (xf_segment_t* s = c->out_head; s != NULL && n < XF_IOV_MAX; s = s->next) {
      uint64_t left = s->len - s->off;
      iov[n].iov_base = (void*)(s->ptr + s->off);
      iov[n].iov_len = left > (uint64_t)(SSIZE_MAX / XF_IOV_MAX) ? (size_t)(SSIZE_MAX / XF_IOV_MAX) : (size_t)left;
      ++n;
    }
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n;
    ssize_t sent = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      xf_break(c, KZ_FABRIC_ERR_REMOTE, "the peer went away (send: %s)", strerror(errno));
      return;
    }
    uint64_t left = (uint64_t)sent;
    while (c->out_head != NULL) {
      xf_segment_t* s = c->out_head;
      uint64_t take = s->len - s->off < left ? s->len - s->off : left;
      s->off += take;
      left -= take;
      if (s->off < s->len) break;
      if (s->completes != NULL) {
        s->completes->state = XF_DONE;
        s->completes->done_bytes = s->completes->size;
      }
      c->out_head = s->next;
      if (c->out_head == NULL) c->out_tail = NULL;
      free(s);
    }
  }
}

static void xf_read(xf_comm_t* c) {
  uint64_t budget = XF_READ_BUDGET;
  while (!c->broken && budget > 0) {
    ssize_t n;
    if (c->in_data != NULL) {
      xf_request_t* r = c->in_data;
      uint64_t want = c->in_data_left < budget ? c->in_data_left : budget;
      if (want > (uint64_t)SSIZE_MAX) want = (uint64_t)SSIZE_MAX;
      n = recv(c->fd, r->data + (r->done_bytes - c->in_data_left), (size_t)want, MSG_DONTWAIT);
      if (n > 0) {
        c->in_data_left -= (uint64_t)n;
        budget -= (uint64_t)n;
        if (c->in_data_left == 0) {
          r->state = XF_DONE;
          c->in_data = NULL;
        }
        continue;
      }
    } else {
      n = recv(c->fd, c->in_frame + c->in_frame_got, XF_FRAME_BYTES - c->in_frame_got, MSG_DONTWAIT);
      if (n > 0) {
        c->in_frame_got += (size_t)n;
        if (c->in_frame_got == XF_FRAME_BYTES) {
          c->in_frame_got = 0;
          xf_on_frame(c);
        }
        continue;
      }
    }
    if (n == 0) {
      xf_break(c, KZ_FABRIC_ERR_REMOTE, "the peer closed the connection");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    xf_break(c, KZ_FABRIC_ERR_REMOTE, "the peer went away (recv: %s)", strerror(errno));
    return;
  }
}

/* Moves whatever can move without blocking: frames queued by reads are written in the same call. */
static void xf_progress(xf_comm_t* c) {
  xf_write(c);
  xf_read(c);
  xf_write(c);
}

static kz_fabric_result_t xf_post(xf_comm_t* c, int is_send, uint8_t* data, uint64_t size, int32_t tag,
                                  kz_fabric_mr_t mr, kz_fabric_request_t* request) {
  if (request == NULL) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "null request pointer");
  *request = NULL;
  if (c->broken) return xf_error(c->broken_error, "%s", c->broken_message);
  if (size > XF_MAX_MESSAGE_BYTES)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "%llu bytes exceed the limit of %llu",
                    (unsigned long long)size, (unsigned long long)XF_MAX_MESSAGE_BYTES);
  if (size > 0) {
    if (mr == NULL || mr->magic != XF_MR_MAGIC || mr->comm != c)
      return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "registration %p is not one of this comm", (void*)mr);
    if (data < mr->data || (uint64_t)(data - mr->data) > mr->size || size > mr->size - (uint64_t)(data - mr->data))
      return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "range outside its registration");
  }
  if (c->nrequests >= XF_MAX_REQUESTS) return KZ_FABRIC_OK; /* busy: the caller tests and retries */
  xf_request_t* r = calloc(1, sizeof *r);
  if (r == NULL) return xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "out of memory posting a request");
  r->magic = XF_REQUEST_MAGIC;
  r->comm = c;
  r->tag = tag;
  r->data = data;
  r->size = size;
  r->state = is_send ? XF_UNMATCHED : XF_POSTED;
  if (!is_send) r->id = c->next_id++;
  r->prev = c->tail;
  if (c->tail != NULL) c->tail->next = r;
  else c->head = r;
  c->tail = r;
  c->nrequests++;
  if (is_send) xf_match(c);
  else xf_queue_frame(c, XF_FRAME_POSTED, tag, r->id, size, NULL);
  xf_progress(c);
  *request = r;
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_isend(kz_fabric_send_comm_t send_comm, const void* data, uint64_t size, int32_t tag,
                            kz_fabric_mr_t mr, kz_fabric_request_t* request) {
  xf_comm_t* c;
  kz_fabric_result_t rc = xf_check_comm(send_comm, 1, &c);
  if (rc != KZ_FABRIC_OK) return rc;
  return xf_post(c, 1, (uint8_t*)data, size, tag, mr, request);
}

kz_fabric_result_t xf_irecv(kz_fabric_recv_comm_t recv_comm, void* data, uint64_t capacity, int32_t tag,
                            kz_fabric_mr_t mr, kz_fabric_request_t* request) {
  xf_comm_t* c;
  kz_fabric_result_t rc = xf_check_comm(recv_comm, 0, &c);
  if (rc != KZ_FABRIC_OK) return rc;
  return xf_post(c, 0, data, capacity, tag, mr, request);
}

static void xf_release(xf_request_t* r) {
  xf_comm_t* c = r->comm;
  if (r->prev != NULL) r->prev->next = r->next;
  else c->head = r->next;
  if (r->next != NULL) r->next->prev = r->prev;
  else c->tail = r->prev;
  c->nrequests--;
  r->magic = 0;
  free(r);
}

kz_fabric_result_t xf_test(kz_fabric_request_t request, int32_t* done, uint64_t* size) {
  xf_request_t* r = request;
  if (r == NULL || r->magic != XF_REQUEST_MAGIC || done == NULL || size == NULL)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "test: %p is not a live example_tcp request", (void*)request);
  *done = 0;
  *size = 0;
  if (r->state != XF_DONE && r->state != XF_FAILED) xf_progress(r->comm);
  if (r->state == XF_DONE) {
    *done = 1;
    *size = r->done_bytes;
    xf_release(r);
    return KZ_FABRIC_OK;
  }
  if (r->state == XF_FAILED) {
    kz_fabric_result_t rc = xf_error(r->error, "%s", r->message);
    xf_release(r);
    return rc;
  }
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_wait(kz_fabric_comm_t comm, int32_t is_send, uint64_t timeout_ns) {
  xf_comm_t* c;
  kz_fabric_result_t rc = xf_check_comm(comm, is_send, &c);
  if (rc != KZ_FABRIC_OK) return rc;
  if (c->broken) return KZ_FABRIC_OK; /* the next test reports it */
  short events = POLLIN;
  if (c->out_head != NULL) events |= POLLOUT;
  if (xf_poll_fd(c->fd, events, timeout_ns) < 0)
    return xf_error(KZ_FABRIC_ERR_INTERNAL, "wait: poll: %s", strerror(errno));
  return KZ_FABRIC_OK;
}

static kz_fabric_result_t xf_close(kz_fabric_comm_t comm, int is_send) {
  xf_comm_t* c;
  kz_fabric_result_t rc = xf_check_comm(comm, is_send, &c);
  if (rc != KZ_FABRIC_OK) return rc;
  /* Closing the socket is the whole goodbye: the peer's reads see the end of the stream. */
  close(c->fd);
  while (c->head != NULL) xf_release(c->head);
  while (c->out_head != NULL) {
    xf_segment_t* s = c->out_head;
    c->out_head = s->next;
    free(s);
  }
  while (c->arrivals_head != NULL) {
    xf_arrival_t* a = c->arrivals_head;
    c->arrivals_head = a->next;
    free(a);
  }
  while (c->mrs != NULL) {
    xf_mr_t* m = c->mrs;
    c->mrs = m->next;
    m->magic = 0;
    free(m);
  }
  c->magic = 0;
  free(c);
  return KZ_FABRIC_OK;
}

kz_fabric_result_t xf_close_send(kz_fabric_send_comm_t send_comm) { return xf_close(send_comm, 1); }
kz_fabric_result_t xf_close_recv(kz_fabric_recv_comm_t recv_comm) { return xf_close(recv_comm, 0); }
