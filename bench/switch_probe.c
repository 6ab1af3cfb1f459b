/* switch_probe: what it costs to hand a CPU from one process to another, the floor under every
 * collective whose processes outnumber the CPUs. N processes (fork) on the first C CPUs this
 * process may use, process i on CPU i % C: the processes of each CPU form a ring and pass an
 * operation number around it in shared memory, each sleeping on a futex until its predecessor's
 * number is there (`futex`), or each calls sched_yield (`yield`, as MPI's polling does), which
 * switches to another process of the CPU every time. Every lap is one hand-over per process of
 * the ring. The rings of all C CPUs run at once, as a job of N processes on C CPUs does.
 *
 * The cost grows with the processes per CPU: on the 2-CPU build machines (a VM) a hand-over took
 * 5-7 us with 2 processes per CPU and 9-11 us with 4, where one between threads of one process
 * takes 2 us (an address-space switch is most of it).
 *
 *   switch_probe [--procs N] [--cpus C] [--exchanges X]     (defaults: 2 processes on 1 CPU)
 *
 * prints "RESULT lib=floor coll=switch-futex n=N cpus=C exchanges=X time_us=T" and the same for
 * switch-yield: T per hand-over, on the slowest CPU's ring, the best of 5 runs of X laps.
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

/* The i-th CPU this process may use (wrapping around), or -1 when the kernel does not say. */
static int usable_cpu(int i, int* count) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  int cpus[CPU_SETSIZE], n = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus[n++] = c;
  if (count != NULL) *count = n;
  return n == 0 ? -1 : cpus[i % n];
}

static void pin(int cpu) {
  if (cpu < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  (void)sched_setaffinity(0, sizeof one, &one);
}

/* One process of a ring, `rounds` laps. futex: a directed hand-over; `first` publishes first, the
 * others after their predecessor (`theirs`), each sleeping until woken; operation numbers from
 * base + 1 to base + rounds. yield: each process calls sched_yield once a lap, and the kernel
 * switches to another process of the CPU each time, so every switch is one a collective would
 * want (a process that still has to arrive): the least a hand-over costs. (Waiting for the
 * predecessor's number while yielding also switches to processes whose turn it is not: twice
 * the time with 4 per CPU.) */
static void run(struct word* mine, struct word* theirs, int use_futex, int first, uint32_t base, long rounds) {
  if (!use_futex) {
    for (long r = 0; r < rounds; ++r) sched_yield();
    return;
  }
  for (uint32_t s = base + 1; s <= base + (uint32_t)rounds; ++s) {
    if (!first)
      while (atomic_load_explicit(&theirs->seq, memory_order_acquire) < s) (void)futex(&theirs->seq, FUTEX_WAIT, s - 1);
    atomic_store_explicit(&mine->seq, s, memory_order_release);
    futex(&mine->seq, FUTEX_WAKE, INT_MAX);
    if (first)
      while (atomic_load_explicit(&theirs->seq, memory_order_acquire) < s) (void)futex(&theirs->seq, FUTEX_WAIT, s - 1);
  }
}

int main(int argc, char** argv) {
  long exchanges = 20000, procs = 2, ncpus = 1;
  for (int i = 1; i < argc; ++i) {
    long* what = NULL;
    if (strcmp(argv[i], "--exchanges") == 0) what = &exchanges;
    if (strcmp(argv[i], "--procs") == 0) what = &procs;
    if (strcmp(argv[i], "--cpus") == 0) what = &ncpus;
    if (what == NULL || i + 1 >= argc) {
      fprintf(stderr, "usage: switch_probe [--procs N] [--cpus C] [--exchanges X]\n");
      return 2;
    }
    *what = strtol(argv[++i], NULL, 10);
  }
  if (exchanges <= 0 || exchanges > 10000000) {
    fprintf(stderr, "switch_probe: --exchanges must be 1..10000000\n");
    return 2;
  }
  int usable = 0;
  (void)usable_cpu(0, &usable);
  if (ncpus < 1 || (usable > 0 && ncpus > usable) || procs < 2 * ncpus || procs > 256) {
    fprintf(stderr,
            "switch_probe: need 1 <= --cpus <= %d (the CPUs this process may use) and 2 x cpus <= --procs <= 256, "
            "so that every CPU has a ring of at least 2 (got %ld processes on %ld CPUs)\n",
            usable, procs, ncpus);
    return 2;
  }
  const int runs = 5;
  const char* names[2] = {"switch-yield", "switch-futex"};
  for (int use_futex = 0; use_futex < 2; ++use_futex) {
    /* procs words, then one best time per CPU (written by the ring's first process). */
    const size_t bytes = (size_t)procs * sizeof(struct word) + (size_t)ncpus * sizeof(double);
    struct word* w = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) {
      perror("switch_probe: mmap");
      return 1;
    }
    memset(w, 0, bytes);
    double* best = (double*)(w + procs);
    pid_t pids[256];
    for (long i = 0; i < procs; ++i) {
      pids[i] = fork();
      if (pids[i] < 0) {
        perror("switch_probe: fork");
        for (long j = 0; j < i; ++j) kill(pids[j], SIGKILL);
        return 1;
      }
      if (pids[i] > 0) continue;
      /* Process i: CPU i % C, ring position i / C; its predecessor is the one before it on that
       * CPU (the ring's last for the first). */
      const long cpu = i % ncpus, pos = i / ncpus, ring = (procs - cpu + ncpus - 1) / ncpus;
      const long pred = pos == 0 ? cpu + (ring - 1) * ncpus : i - ncpus;
      pin(usable_cpu((int)cpu, NULL));
      double mine = 1e30;
      for (int r = 0; r < runs + 1; ++r) {  /* the first run warms up */
        const double t0 = now();
        run(&w[i], &w[pred], use_futex, pos == 0, (uint32_t)(r * exchanges), exchanges);
        const double t = now() - t0;
        if (r > 0 && t < mine) mine = t;
      }
      if (pos == 0) best[cpu] = mine / (double)exchanges / (double)ring;
      _exit(0);
    }
    int failed = 0;
    for (long i = 0; i < procs; ++i) {
      int status = 0;
      if (waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    if (failed) {
      fprintf(stderr, "switch_probe: a process of the rings failed\n");
      return 1;
    }
    double worst = 0;
    for (long c = 0; c < ncpus; ++c)
      if (best[c] > worst) worst = best[c];
    munmap(w, bytes);
    printf("RESULT lib=floor coll=%s n=%ld cpus=%ld exchanges=%ld time_us=%.3f\n", names[use_futex], procs, ncpus,
           exchanges, worst * 1e6);
  }
  return 0;
}
