/* ceiling: what this host's memory allows, measured in the same run as kizuna and the peers.
 *
 * 1. A STREAM-style copy (dst[i] = src[i] over arrays far larger than the caches) with 1 and 2
 *    threads; GB/s counts the bytes read and written, as STREAM's Copy does.
 * 2. The fused one-pass AllReduce over n input and n output buffers of S bytes, in one process: the
 *    elements are split across the threads, and each thread reads its slice of all n inputs once
 *    and writes the sum straight into all n outputs. That moves 2nS bytes, the minimum of any
 *    shared-memory AllReduce (every input byte read once, every output byte written once); with
 *    non-temporal stores no output line is read first (ordinary stores would add nS of
 *    write-allocate reads). Both store kinds are timed and the faster is kept: ordinary stores win
 *    while everything fits in the caches, non-temporal ones beyond.
 *
 * Each figure is the best of several repetitions. No process synchronisation is included, so small
 * messages are flattered and DRAM-sized ones barely. busbw uses nccl-tests' AllReduce factor
 * 2(n-1)/n so that it compares with the peers' column directly.
 *
 *   ceiling [--sizes 1M,64M,256M] [--ranks 2,4,8] [--threads T] [--copy-bytes 1G]
 *
 * prints "RESULT lib=ceiling coll=copy threads=1 bytes=... time_us=... gbps=..." and
 * "RESULT lib=ceiling coll=allreduce n=2 bytes=... threads=2 time_us=... busbw=... traffic_gbps=...
 * stores=nt wrong=0".
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { kMaxThreads = 64, kMaxRanks = 64, kMaxList = 16, kLine = 16 /* floats per cache line */ };
static const double kTargetSeconds = 0.3; /* per store kind and case: best of ~0.3 s of repetitions */
static const int kMinReps = 5, kMaxReps = 200;

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- kernels: 64-byte lines, streaming or ordinary stores ---- */

static void CopyLines(float* dst, const float* src, size_t count, int nt) {
#if defined(__AVX512F__)
  for (size_t i = 0; i < count; i += kLine) {
    __m512 v = _mm512_load_ps(src + i);
    if (nt) _mm512_stream_ps(dst + i, v);
    else _mm512_store_ps(dst + i, v);
  }
#elif defined(__AVX__)
  for (size_t i = 0; i < count; i += kLine) {
    __m256 a = _mm256_load_ps(src + i), b = _mm256_load_ps(src + i + 8);
    if (nt) {
      _mm256_stream_ps(dst + i, a);
      _mm256_stream_ps(dst + i + 8, b);
    } else {
      _mm256_store_ps(dst + i, a);
      _mm256_store_ps(dst + i + 8, b);
    }
  }
#else
  (void)nt;
  memcpy(dst, src, count * sizeof(float));
#endif
  if (nt) _mm_sfence();
}

/* out[k][i] = sum over j of in[j][i], for every k, i in [lo, hi): one pass over the slice. */
static void FusedSlice(float* const* out, const float* const* in, int n, size_t lo, size_t hi, int nt) {
#if defined(__AVX512F__)
  for (size_t i = lo; i < hi; i += kLine) {
    __m512 acc = _mm512_load_ps(in[0] + i);
    for (int j = 1; j < n; ++j) acc = _mm512_add_ps(acc, _mm512_load_ps(in[j] + i));
    for (int k = 0; k < n; ++k) {
      if (nt) _mm512_stream_ps(out[k] + i, acc);
      else _mm512_store_ps(out[k] + i, acc);
    }
  }
#elif defined(__AVX__)
  for (size_t i = lo; i < hi; i += kLine) {
    __m256 a = _mm256_load_ps(in[0] + i), b = _mm256_load_ps(in[0] + i + 8);
    for (int j = 1; j < n; ++j) {
      a = _mm256_add_ps(a, _mm256_load_ps(in[j] + i));
      b = _mm256_add_ps(b, _mm256_load_ps(in[j] + i + 8));
    }
    for (int k = 0; k < n; ++k) {
      if (nt) {
        _mm256_stream_ps(out[k] + i, a);
        _mm256_stream_ps(out[k] + i + 8, b);
      } else {
        _mm256_store_ps(out[k] + i, a);
        _mm256_store_ps(out[k] + i + 8, b);
      }
    }
  }
#else
  (void)nt;
  for (size_t i = lo; i < hi; ++i) {
    float acc = in[0][i];
    for (int j = 1; j < n; ++j) acc += in[j][i];
    for (int k = 0; k < n; ++k) out[k][i] = acc;
  }
#endif
  if (nt) _mm_sfence();
}

/* ---- a team of threads that runs one job per repetition ----
 *
 * The calling thread is thread 0 and the others spin on a generation counter: a futex-based
 * barrier costs tens of microseconds per wake-up in a VM, as much as a 1 MiB AllReduce itself. */

typedef struct Team Team;
typedef void (*Job)(Team* team, int t);

struct Team {
  int threads;
  pthread_t tid[kMaxThreads];
  _Atomic unsigned long go;   /* bumped by thread 0 to start a repetition */
  _Atomic int finished;       /* workers done with the current repetition */
  _Atomic int quit;
  Job job;
  /* the job's arguments */
  int nt, n;
  size_t count; /* floats, a multiple of kLine */
  float* src;
  float* dst;
  float* in[kMaxRanks];
  float* out[kMaxRanks];
};

typedef struct {
  Team* team;
  int t;
} Worker;

static Worker workers[kMaxThreads];

static void* WorkerMain(void* arg) {
  Worker* w = arg;
  Team* team = w->team;
  unsigned long seen = 0;
  for (;;) {
    unsigned long g;
    while ((g = atomic_load_explicit(&team->go, memory_order_acquire)) == seen) _mm_pause();
    seen = g;
    if (atomic_load(&team->quit)) return NULL;
    team->job(team, w->t);
    atomic_fetch_add_explicit(&team->finished, 1, memory_order_release);
  }
}

/* Call after the buffers are filled: the workers spin from here on. */
static void TeamStart(Team* team, int threads) {
  team->threads = threads;
  atomic_store(&team->go, 0);
  atomic_store(&team->finished, 0);
  atomic_store(&team->quit, 0);
  for (int t = 1; t < threads; ++t) {
    workers[t] = (Worker){team, t};
    pthread_create(&team->tid[t], NULL, WorkerMain, &workers[t]);
  }
}

static void TeamStop(Team* team) {
  atomic_store(&team->quit, 1);
  atomic_fetch_add_explicit(&team->go, 1, memory_order_release);
  for (int t = 1; t < team->threads; ++t) pthread_join(team->tid[t], NULL);
}

/* One repetition: wall time from the start signal until the last thread is done. */
static double TeamRun(Team* team, Job job) {
  team->job = job;
  atomic_store(&team->finished, 0);
  double t0 = Now();
  atomic_fetch_add_explicit(&team->go, 1, memory_order_release);
  job(team, 0);
  while (atomic_load_explicit(&team->finished, memory_order_acquire) != team->threads - 1) _mm_pause();
  return Now() - t0;
}

/* Thread t's share of count floats, cut at cache lines so no line has two writers. */
static void Slice(const Team* team, int t, size_t* lo, size_t* hi) {
  size_t lines = team->count / kLine;
  *lo = lines * (size_t)t / (size_t)team->threads * kLine;
  *hi = lines * (size_t)(t + 1) / (size_t)team->threads * kLine;
}

static void CopyJob(Team* team, int t) {
  size_t lo, hi;
  Slice(team, t, &lo, &hi);
  CopyLines(team->dst + lo, team->src + lo, hi - lo, team->nt);
}

static void FusedJob(Team* team, int t) {
  size_t lo, hi;
  Slice(team, t, &lo, &hi);
  FusedSlice(team->out, (const float* const*)team->in, team->n, lo, hi, team->nt);
}

/* Best time of a few repetitions; the first, untimed, also sizes the count of repetitions. */
static double Best(Team* team, Job job) {
  double first = TeamRun(team, job);
  int reps = first > 0 ? (int)(kTargetSeconds / first) : kMaxReps;
  if (reps < kMinReps) reps = kMinReps;
  if (reps > kMaxReps) reps = kMaxReps;
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t = TeamRun(team, job);
    if (t < best) best = t;
  }
  return best;
}

/* ---- buffers and command line ---- */

/* Transparent huge pages where the kernel gives them: the probe measures the memory, not the page
 * fault path (4 KiB faults cost a VM here ~30 s over the default cases) nor TLB misses. */
static float* AllocTouched(size_t bytes) {
  const size_t kHuge = 2u << 20;
  size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  float* p = aligned_alloc(kHuge, rounded);
  if (p == NULL) {
    fprintf(stderr, "ceiling: cannot allocate %zu bytes\n", rounded);
    exit(2);
  }
  madvise(p, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages work too */
  memset(p, 0, rounded);
  return p;
}

static size_t ParseSize(const char* s) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  if (*end == 'K' || *end == 'k') v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm') v <<= 20, ++end;
  else if (*end == 'G' || *end == 'g') v <<= 30, ++end;
  return *end == '\0' ? (size_t)v : 0;
}

/* A comma list of sizes (or plain numbers); returns how many, 0 on a malformed item. */
static int ParseList(const char* text, size_t* out) {
  char* copy = strdup(text);
  int k = 0;
  for (char* tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
    if (k == kMaxList || (out[k++] = ParseSize(tok)) == 0) {
      free(copy);
      return 0;
    }
  }
  free(copy);
  return k;
}

static void MeasureCopy(size_t bytes, int threads) {
  Team team = {0};
  team.count = bytes / sizeof(float) / kLine * kLine;
  team.src = AllocTouched(team.count * sizeof(float));
  team.dst = AllocTouched(team.count * sizeof(float));
  team.nt = 1;
  TeamStart(&team, threads);
  double t = Best(&team, CopyJob);
  size_t moved = 2 * team.count * sizeof(float);
  printf("RESULT lib=ceiling coll=copy threads=%d bytes=%zu time_us=%.2f gbps=%.3f\n", threads,
         team.count * sizeof(float), t * 1e6, (double)moved / t / 1e9);
  fflush(stdout);
  TeamStop(&team);
  free(team.src);
  free(team.dst);
}

static void MeasureAllReduce(int n, size_t bytes, int max_threads) {
  Team team = {0};
  int threads = n < max_threads ? n : max_threads;
  team.n = n;
  team.count = bytes / sizeof(float) / kLine * kLine;
  if (team.count == 0) team.count = kLine;
  for (int k = 0; k < n; ++k) {
    team.in[k] = AllocTouched(team.count * sizeof(float));
    team.out[k] = AllocTouched(team.count * sizeof(float));
    for (size_t i = 0; i < team.count; ++i) team.in[k][i] = (float)(k + 1 + (int)(i % 7));
  }
  TeamStart(&team, threads);
  double best = 1e30;
  int best_nt = 0;
  for (int nt = 0; nt <= 1; ++nt) {
    team.nt = nt;
    double t = Best(&team, FusedJob);
    if (t < best) best = t, best_nt = nt;
  }

  /* Checked once: every output of every "rank" holds the sum. */
  for (int k = 0; k < n; ++k) memset(team.out[k], 0xff, team.count * sizeof(float));
  TeamRun(&team, FusedJob);
  long long wrong = 0;
  const float rank_sum = (float)n * (n + 1) / 2;
  for (int k = 0; k < n; ++k)
    for (size_t i = 0; i < team.count; ++i)
      if (team.out[k][i] != rank_sum + (float)n * (float)(i % 7)) ++wrong;

  size_t s = team.count * sizeof(float);
  printf("RESULT lib=ceiling coll=allreduce n=%d bytes=%zu threads=%d time_us=%.2f busbw=%.4f traffic_gbps=%.3f "
         "stores=%s wrong=%lld\n",
         n, s, threads, best * 1e6, (double)s / best / 1e9 * 2.0 * (n - 1) / n, 2.0 * n * (double)s / best / 1e9,
         best_nt ? "nt" : "plain", wrong);
  fflush(stdout);
  TeamStop(&team);
  for (int k = 0; k < n; ++k) {
    free(team.in[k]);
    free(team.out[k]);
  }
}

int main(int argc, char** argv) {
  size_t sizes[kMaxList] = {1u << 20, 64u << 20, 256u << 20}, ranks[kMaxList] = {2, 4, 8};
  int nsizes = 3, nranks = 3;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int max_threads = cpus >= 2 ? 2 : 1;
  size_t copy_bytes = 1u << 30; /* far beyond the caches: 64 MiB copies run at twice the 1 GiB rate here */
  for (int i = 1; i < argc; ++i) {
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    int ok = v != NULL;
    if (ok && strcmp(argv[i], "--sizes") == 0) ok = (nsizes = ParseList(v, sizes)) > 0;
    else if (ok && strcmp(argv[i], "--ranks") == 0) ok = (nranks = ParseList(v, ranks)) > 0;
    else if (ok && strcmp(argv[i], "--threads") == 0) ok = (max_threads = atoi(v)) >= 1 && max_threads <= kMaxThreads;
    else if (ok && strcmp(argv[i], "--copy-bytes") == 0) ok = (copy_bytes = ParseSize(v)) > 0;
    else ok = 0;
    if (!ok) {
      fprintf(stderr,
              "ceiling: bad argument '%s'\nusage: ceiling [--sizes 1M,64M,256M] [--ranks 2,4,8] [--threads T] "
              "[--copy-bytes 1G]\n",
              argv[i]);
      return 2;
    }
    ++i;
  }
  for (int r = 0; r < nranks; ++r) {
    if (ranks[r] < 1 || ranks[r] > kMaxRanks) {
      fprintf(stderr, "ceiling: --ranks: %zu is outside 1..%d\n", ranks[r], kMaxRanks);
      return 2;
    }
  }
  MeasureCopy(copy_bytes, 1);
  if (max_threads > 1) MeasureCopy(copy_bytes, max_threads);
  for (int r = 0; r < nranks; ++r)
    for (int s = 0; s < nsizes; ++s) MeasureAllReduce((int)ranks[r], sizes[s], max_threads);
  return 0;
}
