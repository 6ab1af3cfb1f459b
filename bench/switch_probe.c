/* switch_probe: what it costs to hand a CPU from one process to another, the floor under every
 * collective whose processes outnumber the CPUs. Two processes (fork), both on the first CPU this
 * process may use, take turns: each publishes an operation number in shared memory and waits for
 * the other's, either sleeping on a futex that the other wakes (`futex`) or calling sched_yield
 * until the number is there (`yield`, as MPI's polling does). Every exchange is two switches
 * between the processes.
 *
 *   switch_probe [--exchanges N]
 *
 * prints "RESULT lib=floor coll=switch-futex n=2 exchanges=N time_us=T" and the same for
 * switch-yield (T per switch: half an exchange; the best of 5 runs of N).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct word {
  _Atomic uint32_t seq;
  char pad[60];
} __attribute__((aligned(64)));

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long futex(_Atomic uint32_t* w, int op, uint32_t v) {
  return syscall(SYS_futex, (uint32_t*)w, op, v, NULL, NULL, 0);
}

/* Pins the calling process to the first CPU it may use. */
static void pin_first(void) {
  cpu_set_t set, one;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      CPU_SET(c, &one);
      (void)sched_setaffinity(0, sizeof one, &one);
      return;
    }
}

/* One side: `first` publishes first. Operation numbers from base + 1 to base + rounds. */
static void run(struct word* mine, struct word* theirs, int use_futex, int first, uint32_t base, long rounds) {
  for (uint32_t s = base + 1; s <= base + (uint32_t)rounds; ++s) {
    if (!first) {
      while (atomic_load_explicit(&theirs->seq, memory_order_acquire) < s) {
        if (use_futex) {
          (void)futex(&theirs->seq, FUTEX_WAIT, s - 1);
        } else {
          sched_yield();
        }
      }
    }
    atomic_store_explicit(&mine->seq, s, memory_order_release);
    if (use_futex) futex(&mine->seq, FUTEX_WAKE, INT_MAX);
    if (first) {
      while (atomic_load_explicit(&theirs->seq, memory_order_acquire) < s) {
        if (use_futex) {
          (void)futex(&theirs->seq, FUTEX_WAIT, s - 1);
        } else {
          sched_yield();
        }
      }
    }
  }
}

int main(int argc, char** argv) {
  long exchanges = 20000;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--exchanges") == 0 && i + 1 < argc) {
      exchanges = strtol(argv[++i], NULL, 10);
    } else {
      fprintf(stderr, "usage: switch_probe [--exchanges N]\n");
      return 2;
    }
  }
  if (exchanges <= 0 || exchanges > 10000000) {
    fprintf(stderr, "switch_probe: --exchanges must be 1..10000000\n");
    return 2;
  }
  pin_first();
  const char* names[2] = {"switch-yield", "switch-futex"};
  for (int use_futex = 0; use_futex < 2; ++use_futex) {
    struct word* w = mmap(NULL, 2 * sizeof(struct word), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) {
      perror("switch_probe: mmap");
      return 1;
    }
    memset(w, 0, 2 * sizeof(struct word));
    const int runs = 5;
    pid_t child = fork();
    if (child < 0) {
      perror("switch_probe: fork");
      return 1;
    }
    if (child == 0) {
      for (int r = 0; r < runs + 1; ++r) run(&w[1], &w[0], use_futex, 0, (uint32_t)(r * exchanges), exchanges);
      _exit(0);
    }
    double best = 1e30;
    for (int r = 0; r < runs + 1; ++r) {  // the first run warms up
      const double t0 = now();
      run(&w[0], &w[1], use_futex, 1, (uint32_t)(r * exchanges), exchanges);
      const double t = now() - t0;
      if (r > 0 && t < best) best = t;
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "switch_probe: the other process failed\n");
      return 1;
    }
    munmap(w, 2 * sizeof(struct word));
    printf("RESULT lib=floor coll=%s n=2 exchanges=%ld time_us=%.3f\n", names[use_futex], exchanges,
           best / (double)exchanges / 2 * 1e6);
  }
  return 0;
}
