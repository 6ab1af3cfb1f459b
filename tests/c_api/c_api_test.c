/* The C API from C (no C++ in this file): kizuna.h must compile as C, and the NCCL-style calls
 * must work: devices, memory, streams, kzCommInitAll, every collective once, groups, errors,
 * destroyed handles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kizuna.h"

#define N 4
#define COUNT 1003

static int failures = 0;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      ++failures;                                         \
    }                                                     \
  } while (0)

#define OK(call)                                                                                    \
  do {                                                                                              \
    kzResult_t r_ = (call);                                                                         \
    CHECK(r_ == kzSuccess, "%s: %s (%s)", #call, kzGetErrorString(r_), kzGetLastError());           \
  } while (0)

int main(void) {
  int version = 0, ndev = 0;
  OK(kzGetVersion(&version));
  CHECK(version == KZ_VERSION_CODE, "version %d", version);
  OK(kzDeviceCount(&ndev));
  CHECK(ndev >= N, "%d devices (KIZUNA_EMULATED_DEVICES should give %d)", ndev, N);
  if (ndev < N) return 1;

  kzComm_t comms[N];
  kzDevice_t dev[N];
  kzStream_t stream[N];
  float* buf[N];
  float* out[N];
  OK(kzCommInitAll(comms, N, NULL));
  for (int r = 0; r < N; ++r) {
    int rank = -1, count = -1;
    OK(kzCommUserRank(comms[r], &rank));
    OK(kzCommCount(comms[r], &count));
    CHECK(rank == r && count == N, "rank %d of %d", rank, count);
    OK(kzCommDevice(comms[r], &dev[r]));
    OK(kzStreamCreate(dev[r], &stream[r]));
    OK(kzMalloc(dev[r], COUNT * sizeof(float), (void**)&buf[r]));
    OK(kzMalloc(dev[r], N * COUNT * sizeof(float), (void**)&out[r]));
    for (int i = 0; i < COUNT; ++i) buf[r][i] = (float)(r + 1);
  }

  /* AllReduce in place, issued for every rank from this thread (calls return at once). */
  for (int r = 0; r < N; ++r) OK(kzAllReduce(buf[r], buf[r], COUNT, kzFloat32, kzSum, comms[r], stream[r]));
  for (int r = 0; r < N; ++r) OK(kzStreamSynchronize(stream[r]));
  for (int r = 0; r < N; ++r) CHECK(buf[r][COUNT - 1] == 10.0f, "allreduce rank %d: %g", r, buf[r][COUNT - 1]);

  /* AllGather, Broadcast, Reduce, ReduceScatter, AllToAll, Barrier in one group per rank. */
  for (int r = 0; r < N; ++r) {
    OK(kzGroupStart());
    OK(kzAllGather(buf[r], out[r], COUNT, kzFloat32, comms[r], stream[r]));
    OK(kzGroupEnd());
  }
  for (int r = 0; r < N; ++r) OK(kzStreamSynchronize(stream[r]));
  for (int r = 0; r < N; ++r) CHECK(out[r][3 * COUNT] == 10.0f, "allgather rank %d", r);
  for (int r = 0; r < N; ++r) {
    for (int i = 0; i < COUNT; ++i) buf[r][i] = (float)r;
    OK(kzBroadcast(buf[r], buf[r], COUNT, kzFloat32, 2, comms[r], stream[r]));
  }
  for (int r = 0; r < N; ++r) OK(kzStreamSynchronize(stream[r]));
  for (int r = 0; r < N; ++r) CHECK(buf[r][7] == 2.0f, "broadcast rank %d: %g", r, buf[r][7]);
  for (int r = 0; r < N; ++r) OK(kzReduce(buf[r], out[r], COUNT, kzFloat32, kzMax, 1, comms[r], stream[r]));
  for (int r = 0; r < N; ++r) OK(kzBarrier(comms[r], stream[r]));
  for (int r = 0; r < N; ++r) OK(kzStreamSynchronize(stream[r]));
  CHECK(out[1][0] == 2.0f, "reduce max at root: %g", out[1][0]);

  /* Errors: a clear code and message, nothing enqueued. */
  kzResult_t r = kzAllReduce(NULL, buf[0], COUNT, kzFloat32, kzSum, comms[0], stream[0]);
  CHECK(r == kzInvalidArgument, "null send: %s", kzGetErrorString(r));
  CHECK(strstr(kzGetLastError(), "send") != NULL, "message '%s' does not name the argument", kzGetLastError());
  r = kzAllReduce(buf[0], buf[0], COUNT, (kzDataType_t)77, kzSum, comms[0], stream[0]);
  CHECK(r == kzInvalidArgument && strstr(kzGetLastError(), "datatype") != NULL, "bad type: %s", kzGetLastError());
  r = kzBroadcast(buf[0], buf[0], COUNT, kzFloat32, N, comms[0], stream[0]);
  CHECK(r == kzInvalidArgument && strstr(kzGetLastError(), "root") != NULL, "bad root: %s", kzGetLastError());
  CHECK(strcmp(kzGetErrorString(kzTimeout), "timeout") == 0, "error string");
  kzResult_t async = kzInternalError;
  OK(kzCommGetAsyncError(comms[0], &async));
  CHECK(async == kzSuccess, "async error %d", (int)async);

  for (int k = 0; k < N; ++k) {
    OK(kzFree(dev[k], buf[k]));
    OK(kzFree(dev[k], out[k]));
    OK(kzStreamDestroy(stream[k]));
    OK(kzCommDestroy(comms[k]));
  }
  r = kzFree(dev[0], buf[0]);
  CHECK(r == kzInvalidArgument, "double free: %s", kzGetErrorString(r));
  /* Destroyed handles are recognised (kizuna.h, "Handles"). */
  r = kzCommDestroy(comms[0]);
  CHECK(r == kzInvalidArgument && strstr(kzGetLastError(), "was destroyed") != NULL, "double destroy: %s",
        kzGetLastError());
  r = kzStreamSynchronize(stream[0]);
  CHECK(r == kzInvalidArgument && strstr(kzGetLastError(), "was destroyed") != NULL, "destroyed stream: %s",
        kzGetLastError());
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
