/* mpi_bench: the race's MPI peer. Times AllReduce, ReduceScatter, AllGather and Broadcast through
 * the MPI C API alone (no kizuna code), with the method of the race (bench/README.md):
 *
 *   float32 sum, out of place, page-aligned buffers touched before use; 5 warm-up calls;
 *   iterations = clamp(1 s / estimate, 5, 1000); each timed iteration is barrier -> collective,
 *   its time the maximum over ranks; the median is reported; busbw = size / time x factor
 *   (allreduce 2(n-1)/n, reducescatter and allgather (n-1)/n with size = the full buffer,
 *   broadcast 1). Every size's result is checked once, after the timing.
 *
 * Built twice by bench/race.sh, with mpicc.openmpi and mpicc.mpich. Rank 0 prints one line per
 * case:
 *
 *   RESULT lib=openmpi coll=allreduce n=4 bytes=67108864 iters=12 time_us=... busbw=... wrong=0
 *
 * Usage: mpi_bench --coll allreduce[,allgather,...] --sizes 8,1M,64M [--lib NAME] [--tag TEXT]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kWarmups = 5, kMinIters = 5, kMaxIters = 1000, kMaxList = 32 };
static const double kTargetSeconds = 1.0;

typedef enum { kAllReduce, kReduceScatter, kAllGather, kBroadcast } Coll;

static const char* const kCollNames[] = {"allreduce", "reducescatter", "allgather", "broadcast"};

static int ParseColl(const char* s, Coll* out) {
  for (int i = 0; i < 4; ++i) {
    if (strcmp(s, kCollNames[i]) == 0) {
      *out = (Coll)i;
      return 1;
    }
  }
  return 0;
}

/* "64M" -> 67108864; K, M, G are powers of 1024. 0 on a malformed size. */
static size_t ParseSize(const char* s) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return 0;
  switch (*end) {
    case 'K': case 'k': v <<= 10; ++end; break;
    case 'M': case 'm': v <<= 20; ++end; break;
    case 'G': case 'g': v <<= 30; ++end; break;
    default: break;
  }
  return *end == '\0' ? (size_t)v : 0;
}

/* The library's name from its version string, so one source serves both builds. */
static const char* DetectLibrary(void) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  if (strstr(version, "Open MPI")) return "openmpi";
  if (strstr(version, "MPICH")) return "mpich";
  return "mpi";
}

static double BusFactor(Coll coll, int n) {
  switch (coll) {
    case kAllReduce: return 2.0 * (n - 1) / n;
    case kReduceScatter:
    case kAllGather: return (double)(n - 1) / n;
    case kBroadcast: return 1.0;
  }
  return 1.0;
}

/* Page-aligned and touched: first-touch page faults stay out of the timed calls. */
static float* AllocTouched(size_t bytes) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  if (rounded == 0) rounded = 4096;
  float* p = aligned_alloc(4096, rounded);
  if (p == NULL) {
    fprintf(stderr, "mpi_bench: cannot allocate %zu bytes\n", rounded);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  memset(p, 0, rounded);
  return p;
}

/* Inputs: rank r holds r + 1 + (i mod 7) at element i, small integers whose sums are exact. */
static float InputValue(int rank, size_t i) { return (float)(rank + 1 + (int)(i % 7)); }

typedef struct {
  Coll coll;
  int rank, n;
  size_t bytes;  /* the full buffer: allreduce's and broadcast's message, RS's input, AG's output */
  size_t count;  /* elements of the full buffer, a multiple of n for RS and AG */
  float* in;
  float* out;
} Case;

static void RunOnce(const Case* c) {
  switch (c->coll) {
    case kAllReduce:
      MPI_Allreduce(c->in, c->out, (int)c->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case kReduceScatter:
      MPI_Reduce_scatter_block(c->in, c->out, (int)(c->count / c->n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case kAllGather:
      MPI_Allgather(c->in, (int)(c->count / c->n), MPI_FLOAT, c->out, (int)(c->count / c->n), MPI_FLOAT,
                    MPI_COMM_WORLD);
      break;
    case kBroadcast:
      /* Out of place as the other libraries offer it: the root sends from its input, every other
       * rank receives into its output. */
      MPI_Bcast(c->rank == 0 ? c->in : c->out, (int)c->count, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
  }
}

/* One barrier -> collective iteration; returns the slowest rank's time, on every rank. */
static double TimedMax(const Case* c) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  RunOnce(c);
  double t = MPI_Wtime() - t0, tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

static int CompareDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double Median(double* v, int k) {
  qsort(v, (size_t)k, sizeof *v, CompareDouble);
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

/* Wrong elements of this rank's output after one call on the inputs InputValue gives. */
static long long CheckOnce(const Case* c) {
  size_t in_count = c->coll == kAllGather ? c->count / c->n : c->count;
  for (size_t i = 0; i < in_count; ++i) c->in[i] = InputValue(c->rank, i);
  size_t out_count = c->coll == kReduceScatter ? c->count / c->n : c->count;
  memset(c->out, 0xff, out_count * sizeof(float)); /* NaN: an element never written is wrong */
  RunOnce(c);
  long long wrong = 0;
  const float rank_sum = (float)c->n * (c->n + 1) / 2;
  for (size_t i = 0; i < out_count; ++i) {
    float want = 0;
    switch (c->coll) {
      case kAllReduce: want = rank_sum + (float)c->n * (float)(i % 7); break;
      case kReduceScatter: {
        size_t g = (size_t)c->rank * out_count + i; /* this rank's block of the full vector */
        want = rank_sum + (float)c->n * (float)(g % 7);
        break;
      }
      case kAllGather: {
        size_t block = c->count / c->n;
        want = InputValue((int)(i / block), i % block);
        break;
      }
      case kBroadcast:
        if (c->rank == 0) continue; /* the root's output is not written */
        want = InputValue(0, i);
        break;
    }
    if (c->out[i] != want) ++wrong;
  }
  return wrong;
}

static void RunCase(Coll coll, size_t requested, const char* lib, const char* tag, int rank, int n) {
  Case c = {.coll = coll, .rank = rank, .n = n};
  c.count = requested / sizeof(float);
  if (coll == kReduceScatter || coll == kAllGather) c.count = c.count / (size_t)n * (size_t)n;
  if (c.count == 0) c.count = (coll == kReduceScatter || coll == kAllGather) ? (size_t)n : 1;
  c.bytes = c.count * sizeof(float);
  size_t in_bytes = coll == kAllGather ? c.bytes / (size_t)n : c.bytes;
  size_t out_bytes = coll == kReduceScatter ? c.bytes / (size_t)n : c.bytes;
  c.in = AllocTouched(in_bytes);
  c.out = AllocTouched(out_bytes);
  for (size_t i = 0; i < in_bytes / sizeof(float); ++i) c.in[i] = InputValue(rank, i);

  double warm[kWarmups];
  for (int w = 0; w < kWarmups; ++w) warm[w] = TimedMax(&c);
  double estimate = Median(warm, kWarmups);
  long iters = estimate > 0 ? (long)(kTargetSeconds / estimate) : kMaxIters;
  if (iters < kMinIters) iters = kMinIters;
  if (iters > kMaxIters) iters = kMaxIters;

  /* Each rank keeps its own times; one MAX reduction afterwards gives each iteration's slowest
   * rank without adding a reduction between the timed calls. */
  double* mine = malloc((size_t)iters * sizeof(double));
  double* slowest = malloc((size_t)iters * sizeof(double));
  for (long it = 0; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    RunOnce(&c);
    mine[it] = MPI_Wtime() - t0;
  }
  MPI_Reduce(mine, slowest, (int)iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

  long long wrong = CheckOnce(&c), wrong_total = 0;
  MPI_Reduce(&wrong, &wrong_total, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double t = Median(slowest, (int)iters);
    double busbw = (double)c.bytes / t / 1e9 * BusFactor(coll, n);
    printf("RESULT lib=%s coll=%s n=%d bytes=%zu iters=%ld time_us=%.2f busbw=%.4f wrong=%lld%s%s\n", lib,
           kCollNames[coll], n, c.bytes, iters, t * 1e6, busbw, wrong_total, tag[0] ? " tag=" : "", tag);
    fflush(stdout);
  }
  free(mine);
  free(slowest);
  free(c.in);
  free(c.out);
}

static void Usage(void) {
  fprintf(stderr,
          "usage: mpi_bench --coll allreduce|reducescatter|allgather|broadcast[,...] --sizes 8,1M,64M "
          "[--lib NAME] [--tag TEXT]\n");
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  Coll colls[kMaxList];
  size_t sizes[kMaxList];
  int ncolls = 0, nsizes = 0;
  const char* lib = NULL;
  const char* tag = "";
  for (int i = 1; i < argc; ++i) {
    const char* value = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(argv[i], "--coll") == 0 && value) {
      char* list = strdup(value);
      for (char* tok = strtok(list, ","); tok && ncolls < kMaxList; tok = strtok(NULL, ",")) {
        if (!ParseColl(tok, &colls[ncolls++])) {
          if (rank == 0) fprintf(stderr, "mpi_bench: --coll: unknown collective '%s'\n", tok);
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
      }
      free(list);
      ++i;
    } else if (strcmp(argv[i], "--sizes") == 0 && value) {
      char* list = strdup(value);
      for (char* tok = strtok(list, ","); tok && nsizes < kMaxList; tok = strtok(NULL, ",")) {
        if ((sizes[nsizes++] = ParseSize(tok)) == 0) {
          if (rank == 0) fprintf(stderr, "mpi_bench: --sizes: malformed size '%s' (e.g. 8, 1M, 64M)\n", tok);
          MPI_Abort(MPI_COMM_WORLD, 2);
        }
      }
      free(list);
      ++i;
    } else if (strcmp(argv[i], "--lib") == 0 && value) {
      lib = value;
      ++i;
    } else if (strcmp(argv[i], "--tag") == 0 && value) {
      tag = value;
      ++i;
    } else {
      if (rank == 0) {
        fprintf(stderr, "mpi_bench: unknown or incomplete argument '%s'\n", argv[i]);
        Usage();
      }
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (ncolls == 0 || nsizes == 0) {
    if (rank == 0) Usage();
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (lib == NULL) lib = DetectLibrary();
  for (int ci = 0; ci < ncolls; ++ci)
    for (int si = 0; si < nsizes; ++si) RunCase(colls[ci], sizes[si], lib, tag, rank, n);
  MPI_Finalize();
  return 0;
}
