/* line_probe: the floor under a small AllReduce between two processes of this host. Two processes
 * (fork; each on a CPU of its own when there are two) take turns to publish an operation number in
 * a cache line of shared memory and wait until the other's line shows the same number: each
 * exchange is what any shared-memory protocol needs at least for an 8-byte AllReduce of 2 ranks
 * (each rank's value reaching the other), with no call path, no check and no reduction.
 *
 *   line_probe [--exchanges N]
 *
 * prints "RESULT lib=floor coll=line n=2 exchanges=N time_us=T" (T per exchange, the best of 5
 * runs of N).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct line {
  _Atomic uint64_t seq;
  uint64_t data[7];
} __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Pins the calling process to the k-th CPU it may use, when there are at least two. */
static void pin(int k) {
  cpu_set_t set, one;
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) < 2) return;
  CPU_ZERO(&one);
  for (int c = 0, seen = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set) && seen++ == k) {
      CPU_SET(c, &one);
      (void)sched_setaffinity(0, sizeof one, &one);
      return;
    }
}

/* Both processes run `rounds` exchanges starting at operation `base`. */
static void exchange(struct line* mine, const struct line* theirs, uint64_t base, long rounds) {
  for (uint64_t s = base + 1; s <= base + (uint64_t)rounds; ++s) {
    mine->data[0] = s;
    atomic_store_explicit(&mine->seq, s, memory_order_release);
    while (atomic_load_explicit(&theirs->seq, memory_order_acquire) < s) _mm_pause();
  }
}

int main(int argc, char** argv) {
  long n = 200000;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--exchanges") == 0 && i + 1 < argc) {
      n = strtol(argv[++i], NULL, 10);
    } else {
      fprintf(stderr, "usage: line_probe [--exchanges N]\n");
      return 2;
    }
  }
  if (n < 1) {
    fprintf(stderr, "line_probe: --exchanges must be at least 1\n");
    return 2;
  }
  struct line* lines = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (lines == MAP_FAILED) {
    fprintf(stderr, "line_probe: mmap: %s\n", strerror(errno));
    return 1;
  }
  memset(lines, 0, 4096);
  const pid_t child = fork();
  if (child < 0) {
    fprintf(stderr, "line_probe: fork: %s\n", strerror(errno));
    return 1;
  }
  const int r = child == 0;
  pin(r);
  struct line* mine = &lines[r];
  const struct line* theirs = &lines[1 - r];
  double best = 1e30;
  uint64_t base = 0;
  exchange(mine, theirs, base, 1000); /* warm-up */
  base += 1000;
  for (int run = 0; run < 5; ++run) {
    const double t0 = now();
    exchange(mine, theirs, base, n);
    const double t = now() - t0;
    base += (uint64_t)n;
    if (t < best) best = t;
  }
  if (r == 1) _exit(0);
  int status = 0;
  if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "line_probe: the second process failed\n");
    return 1;
  }
  printf("RESULT lib=floor coll=line n=2 exchanges=%ld time_us=%.3f\n", n, best / (double)n * 1e6);
  return 0;
}
