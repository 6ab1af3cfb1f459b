/* tcp_probe: the floor under a 2-rank AllReduce over TCP between two hosts (here two network
 * namespaces). A 2-rank AllReduce of S bytes must carry S bytes each way (each rank needs every
 * element of the other's input or of the reduced half), so its busbw (S / time) cannot exceed
 * what one connection moves per direction while the other direction is busy too. Both ends send
 * S bytes and receive S bytes at once on one connection (a sender and a receiver thread each,
 * TCP_NODELAY, the kernel's default buffers), five times after a warm-up round. With
 * --connections K the S bytes are split over K connections (K sender and K receiver threads): what
 * more connections would buy. --rounds R (default 6) for a longer run under a profiler. With
 * --reduce each end also adds the first half of what it receives, as floats, into a buffer of its
 * own as the bytes arrive (coll=tcp-duplex-reduce[-K]): the least a 2-rank AllReduce of S bytes
 * does besides moving them (each rank reduces half the elements), where the same CPUs carry both
 * hosts' network stacks and the reduction takes its share of them.
 *
 * --exchanges N measures the small-message floor instead: on one thread, each end sends S bytes
 * and then receives the other's S bytes, N times in a row (after 100 unmeasured), as a 2-rank
 * AllReduce of S bytes must (each rank needs the other's input); no thread hand-off, blocking
 * calls. The median exchange is reported as coll=tcp-exchange, its time_us what one AllReduce of
 * S bytes between these two ends cannot beat over TCP when it waits in the kernel. With --poll
 * the receives never block (MSG_DONTWAIT, retried at once), as the MPIs' progress loops poll:
 * coll=tcp-exchange-poll, the floor of a library that spins on its sockets. With --one-way each
 * direction has a connection of its own (as NCCL's net API has them, and kizuna's tcp fabric had
 * before its connections went both ways), so the
 * receiver's acknowledgements travel as packets of their own instead of riding on its data.
 *
 *   tcp_probe --listen PORT --bytes S [--connections K] [--reduce]          (one end)
 *   tcp_probe --connect ADDR PORT --bytes S [--connections K] [--reduce]    (the other; retries for 10 s)
 *
 * The listening end prints "RESULT lib=floor coll=tcp-duplex n=2 bytes=S time_us=T busbw=G" (the
 * best of the five rounds; busbw = S / T in GB/s, per direction); with K > 1 the coll is
 * "tcp-duplex-K".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNECTIONS 16

static size_t bytes;
static int nconn = 1;
static int rounds = 6; /* the first warms up */
static int fds[MAX_CONNECTIONS];
static char *sendbuf, *recvbuf;
static int failed;
static int exchanges; /* > 0: the small-message floor (--exchanges) */
static int poll_recv; /* --poll: receives never block (MSG_DONTWAIT, retried), as the MPIs poll */
static int one_way;   /* --one-way: each direction on a connection of its own (NCCL's net API) */
static float* reduced; /* --reduce: the first half of what arrives is added into it */

/* Connection i carries bytes [lo, hi) of the buffers. */
static size_t slice_lo(int i) { return one_way ? 0 : bytes / (size_t)nconn * (size_t)i; }
static size_t slice_hi(int i) { return one_way || i + 1 == nconn ? bytes : slice_lo(i + 1); }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --reduce: adds the whole floats of recvbuf[from, to) that lie in the first half into reduced. */
static void reduce_range(size_t from, size_t to) {
  const size_t half = bytes / 2 / sizeof(float);
  const float* in = (const float*)recvbuf;
  for (size_t e = (from + sizeof(float) - 1) / sizeof(float); e < to / sizeof(float) && e < half; ++e)
    reduced[e] += in[e];
}

/* Moves connection i's slice: sends it from sendbuf, or receives it into recvbuf. */
static void move_slice(int i, int sending) {
  for (size_t off = slice_lo(i), end = slice_hi(i), summed = off; off < end;) {
    const ssize_t k = sending ? send(fds[i], sendbuf + off, end - off, MSG_NOSIGNAL)
                              : recv(fds[i], recvbuf + off, end - off, poll_recv ? MSG_DONTWAIT : 0);
    if (k <= 0) {
      if (k < 0 && (errno == EINTR || (poll_recv && (errno == EAGAIN || errno == EWOULDBLOCK)))) continue;
      fprintf(stderr, "tcp_probe: %s: %s\n", sending ? "send" : "recv", k < 0 ? strerror(errno) : "connection closed");
      failed = 1;
      return;
    }
    off += (size_t)k;
    if (!sending && reduced != NULL) {
      reduce_range(summed, off);
      summed = off / sizeof(float) * sizeof(float);
    }
  }
}

static void* sender(void* arg) {
  move_slice((int)(intptr_t)arg, 1);
  return arg;
}

static void* receiver(void* arg) {
  move_slice((int)(intptr_t)arg, 0);
  return arg;
}

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* --exchanges: each end sends its S bytes, then receives the other's, n times; the median. With
 * --one-way the listener sends on connection 0 and receives on 1, the other end the reverse: no
 * acknowledgement rides on data going back. */
static int run_exchanges(int listening) {
  const int out = one_way && !listening, in = one_way && listening;
  double* t = malloc(sizeof(double) * (size_t)exchanges);
  if (t == NULL) return 1;
  for (int i = -100; i < exchanges; ++i) {
    const double t0 = now();
    move_slice(out, 1);
    move_slice(in, 0);
    if (failed) return 1;
    if (i >= 0) t[i] = now() - t0;
  }
  qsort(t, (size_t)exchanges, sizeof(double), cmp_double);
  if (listening)
    printf("RESULT lib=floor coll=%s n=2 bytes=%zu time_us=%.2f busbw=%.4f\n",
           one_way ? (poll_recv ? "tcp-exchange-one-way-poll" : "tcp-exchange-one-way")
                   : (poll_recv ? "tcp-exchange-poll" : "tcp-exchange"),
           bytes, t[exchanges / 2] * 1e6, (double)bytes / t[exchanges / 2] / 1e9);
  free(t);
  return 0;
}

static int usage(void) {
  fprintf(stderr,
          "usage: tcp_probe --listen PORT --bytes S | --connect ADDR PORT --bytes S [--connections K] "
          "[--rounds R] [--reduce] [--exchanges N [--poll] [--one-way]]\n");
  return 2;
}

/* Kept whole: a standalone probe, its argument parsing and both roles read as one script. */
int main(int argc, char** argv) {
  const char* addr = NULL;
  int port = 0, listening = 0, reduce = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
      listening = 1;
      port = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--connect") == 0 && i + 2 < argc) {
      addr = argv[++i];
      port = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
      bytes = strtoull(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--exchanges") == 0 && i + 1 < argc) {
      exchanges = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--poll") == 0) {
      poll_recv = 1;
    } else if (strcmp(argv[i], "--one-way") == 0) {
      one_way = 1;
      nconn = 2;
    } else if (strcmp(argv[i], "--reduce") == 0) {
      reduce = 1;
    } else if (strcmp(argv[i], "--connections") == 0 && i + 1 < argc) {
      nconn = atoi(argv[++i]);
    } else {
      return usage();
    }
  }
  if ((listening == (addr != NULL)) || port <= 0 || port > 65535 || bytes == 0 || nconn < 1 ||
      nconn > MAX_CONNECTIONS || rounds < 2 || exchanges < 0 || (exchanges > 0 && nconn != 1 + one_way) ||
      (one_way && exchanges == 0) || (reduce && exchanges > 0))
    return usage();
  sendbuf = malloc(bytes);
  recvbuf = malloc(bytes);
  if (sendbuf == NULL || recvbuf == NULL) {
    fprintf(stderr, "tcp_probe: cannot allocate 2 x %zu bytes\n", bytes);
    return 1;
  }
  memset(sendbuf, 1, bytes);
  memset(recvbuf, 0, bytes);
  if (reduce) {
    reduced = calloc(bytes / 2 / sizeof(float) + 1, sizeof(float));
    if (reduced == NULL) {
      fprintf(stderr, "tcp_probe: cannot allocate %zu bytes to reduce into\n", bytes / 2);
      return 1;
    }
  }
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  if (listening) {
    const int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (l < 0 || bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, nconn) != 0) {
      fprintf(stderr, "tcp_probe: listen on port %d: %s\n", port, strerror(errno));
      return 1;
    }
    for (int i = 0; i < nconn; ++i) fds[i] = accept(l, NULL, NULL);
    close(l);
  } else {
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
      fprintf(stderr, "tcp_probe: '%s' is not an IPv4 address\n", addr);
      return 2;
    }
    const double give_up = now() + 10;
    for (int i = 0; i < nconn; ++i) {
      while (1) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] >= 0 && connect(fds[i], (struct sockaddr*)&a, sizeof a) == 0) break;
        if (fds[i] >= 0) close(fds[i]);
        fds[i] = -1;
        if (now() > give_up) break;
        usleep(50000);
      }
    }
  }
  for (int i = 0; i < nconn; ++i) {
    if (fds[i] < 0) {
      fprintf(stderr, "tcp_probe: no connection (%s:%d): %s\n", addr ? addr : "listen", port, strerror(errno));
      return 1;
    }
    const int one = 1;
    setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  if (exchanges > 0) {
    const int rc = run_exchanges(listening);
    for (int i = 0; i < nconn; ++i) close(fds[i]);
    return rc;
  }
  double best = 1e30;
  for (int round = 0; round < rounds && !failed; ++round) {
    char token = 0;  /* both ends start together */
    if (send(fds[0], &token, 1, MSG_NOSIGNAL) != 1 || recv(fds[0], &token, 1, MSG_WAITALL) != 1) {
      fprintf(stderr, "tcp_probe: the other end went away\n");
      return 1;
    }
    const double t0 = now();
    pthread_t s[MAX_CONNECTIONS], r[MAX_CONNECTIONS];
    for (int i = 0; i < nconn; ++i) {
      pthread_create(&s[i], NULL, sender, (void*)(intptr_t)i);
      pthread_create(&r[i], NULL, receiver, (void*)(intptr_t)i);
    }
    for (int i = 0; i < nconn; ++i) {
      pthread_join(s[i], NULL);
      pthread_join(r[i], NULL);
    }
    const double t = now() - t0;
    if (round > 0 && t < best) best = t;  /* round 0 warms up */
  }
  for (int i = 0; i < nconn; ++i) close(fds[i]);
  if (failed) return 1;
  if (listening) {
    char coll[32];
    snprintf(coll, sizeof coll, "tcp-duplex%s", reduce ? "-reduce" : "");
    if (nconn > 1) snprintf(coll + strlen(coll), sizeof coll - strlen(coll), "-%d", nconn);
    printf("RESULT lib=floor coll=%s n=2 bytes=%zu time_us=%.1f busbw=%.4f\n", coll, bytes, best * 1e6,
           (double)bytes / best / 1e9);
  }
  return 0;
}
