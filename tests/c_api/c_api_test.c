/* The C API from C (no C++ in this file): kizuna.h must compile as C, and the NCCL-style calls
 * must work: devices, memory, streams, kzCommInitAll, every collective once, groups, errors,
 * destroyed handles; non-blocking creation and kzCommFinalize; a framework's stream adopted. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Two ranks created from this one thread with blocking = 0 (each call returns at once), polled
 * until ready; an AllReduce, kzCommFinalize; a creation that fails reports its error through
 * kzCommGetAsyncError; a config not from KZ_CONFIG_INITIALIZER is refused. */
static void NonBlocking(void) {
  enum { R = 2, M = 257 };
  kzUniqueId id;
  kzComm_t comm[R];
  kzDevice_t dev[R];
  kzStream_t stream[R];
  float* data[R];
  kzConfig_t config = KZ_CONFIG_INITIALIZER;
  config.blocking = 0;
  OK(kzGetUniqueId(&id));
  for (int r = 0; r < R; ++r) {
    OK(kzDeviceGet(r, &dev[r]));
    kzResult_t res = kzCommInitRankConfig(&comm[r], R, id, r, dev[r], &config);
    CHECK(res == kzInProgress, "non-blocking init rank %d: %s (%s)", r, kzGetErrorString(res), kzGetLastError());
  }
  /* Ready within 30 s: polled as a framework's progress loop would. */
  int ready = 0;
  for (int i = 0; i < 30000 && ready < R; ++i) {
    ready = 0;
    for (int r = 0; r < R; ++r) {
      kzResult_t async = kzInternalError;
      OK(kzCommGetAsyncError(comm[r], &async));
      CHECK(async == kzSuccess || async == kzInProgress, "rank %d creation: %s", r, kzGetLastError());
      ready += async == kzSuccess;
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  CHECK(ready == R, "%d of %d non-blocking communicators ready after 30 s", ready, R);
  if (ready != R) return;
  for (int r = 0; r < R; ++r) {
    int count = 0;
    OK(kzCommCount(comm[r], &count));
    CHECK(count == R, "count %d", count);
    OK(kzStreamCreate(dev[r], &stream[r]));
    OK(kzMalloc(dev[r], M * sizeof(float), (void**)&data[r]));
    for (int i = 0; i < M; ++i) data[r][i] = (float)(r + 1) * (float)i;
  }
  for (int r = 0; r < R; ++r) OK(kzAllReduce(data[r], data[r], M, kzFloat32, kzSum, comm[r], stream[r]));
  /* Finalize waits for the AllReduce (no stream synchronization here); later calls are refused. */
  for (int r = 0; r < R; ++r) OK(kzCommFinalize(comm[r]));
  for (int r = 0; r < R; ++r) CHECK(data[r][M - 1] == 3.0f * (M - 1), "finalized allreduce: %g", data[r][M - 1]);
  kzResult_t res = kzAllReduce(data[0], data[0], M, kzFloat32, kzSum, comm[0], stream[0]);
  CHECK(res == kzInvalidArgument && strstr(kzGetLastError(), "finalized") != NULL, "after finalize: %s",
        kzGetLastError());
  for (int r = 0; r < R; ++r) {
    OK(kzFree(dev[r], data[r]));
    OK(kzStreamDestroy(stream[r]));
    OK(kzCommDestroy(comm[r]));
  }

  /* A creation that fails on its thread: rank 5 of 2. */
  kzComm_t bad = NULL;
  res = kzCommInitRankConfig(&bad, R, id, 5, dev[0], &config);
  if (res == kzInProgress) {
    kzResult_t async = kzInProgress;
    for (int i = 0; i < 30000 && async == kzInProgress; ++i) {
      OK(kzCommGetAsyncError(bad, &async));
      struct timespec ms = {0, 1000000};
      nanosleep(&ms, NULL);
    }
    CHECK(async == kzInvalidArgument, "rank 5 of 2: %s", kzGetErrorString(async));
    int count = 0;
    res = kzCommCount(bad, &count);
    CHECK(res == kzInvalidArgument && strstr(kzGetLastError(), "creation failed") != NULL, "count: %s",
          kzGetLastError());
    OK(kzCommDestroy(bad));
  } else {
    CHECK(res == kzInvalidArgument, "rank 5 of 2: %s", kzGetErrorString(res));
  }
  kzConfig_t junk = KZ_CONFIG_INITIALIZER;
  junk.magic = 0;
  res = kzCommInitRankConfig(&bad, R, id, 0, dev[0], &junk);
  CHECK(res == kzInvalidArgument && strstr(kzGetLastError(), "KZ_CONFIG_INITIALIZER") != NULL, "junk config: %s",
        kzGetLastError());
}

/* A framework's stream: the collective goes onto the native stream that kzStreamAdopt wraps, so
 * synchronizing the original stream waits for it; releasing the adopted handle leaves the native
 * stream working; a stray, foreign or dead native handle is refused. */
static void Adopted(void) {
  enum { R = 2, M = 1000 };
  kzComm_t comm[R];
  kzDevice_t dev[R];
  kzStream_t own[R], adopted[R];
  void* native[R];
  float* data[R];
  OK(kzCommInitAll(comm, R, NULL));
  for (int r = 0; r < R; ++r) {
    OK(kzCommDevice(comm[r], &dev[r]));
    OK(kzStreamCreate(dev[r], &own[r]));
    OK(kzStreamGetNative(own[r], &native[r]));
    OK(kzStreamAdopt(dev[r], native[r], &adopted[r]));
    OK(kzMalloc(dev[r], M * sizeof(float), (void**)&data[r]));
    for (int i = 0; i < M; ++i) data[r][i] = (float)(r + 1);
  }
  for (int r = 0; r < R; ++r) OK(kzAllReduce(data[r], data[r], M, kzFloat32, kzSum, comm[r], adopted[r]));
  for (int r = 0; r < R; ++r) OK(kzStreamSynchronize(own[r])); /* the native stream carried the work */
  for (int r = 0; r < R; ++r) CHECK(data[r][M - 1] == 3.0f, "adopted-stream allreduce: %g", data[r][M - 1]);
  for (int r = 0; r < R; ++r) OK(kzStreamDestroy(adopted[r]));
  for (int r = 0; r < R; ++r) OK(kzAllReduce(data[r], data[r], M, kzFloat32, kzSum, comm[r], own[r]));
  for (int r = 0; r < R; ++r) OK(kzStreamSynchronize(own[r]));
  CHECK(data[0][0] == 6.0f, "the native stream after its adopted handle went: %g", data[0][0]);
  /* Registration (ncclCommRegister): a handle per buffer, refused once deregistered. */
  void* reg = NULL;
  OK(kzCommRegister(comm[0], data[0], M * sizeof(float), &reg));
  OK(kzCommDeregister(comm[0], reg));
  kzResult_t res = kzCommDeregister(comm[0], reg);
  CHECK(res == kzInvalidArgument && strstr(kzGetLastError(), "handle") != NULL, "deregistered twice: %s",
        kzGetLastError());
  res = kzCommRegister(comm[0], NULL, 16, &reg);
  CHECK(res == kzInvalidArgument, "a null buffer registered: %s", kzGetErrorString(res));
  kzStream_t bad = NULL;
  res = kzStreamAdopt(dev[0], native[1], &bad);
  CHECK(res == kzInvalidArgument && strstr(kzGetLastError(), "belongs to") != NULL, "another device's stream: %s",
        kzGetLastError());
  res = kzStreamAdopt(dev[0], NULL, &bad);
  CHECK(res == kzInvalidArgument, "the emulated device adopted a null stream: %s", kzGetErrorString(res));
  int stray = 0;
  res = kzStreamAdopt(dev[0], &stray, &bad);
  CHECK(res == kzInvalidArgument && strstr(kzGetLastError(), "not a live stream") != NULL, "a stray pointer: %s",
        kzGetLastError());
  for (int r = 0; r < R; ++r) {
    OK(kzFree(dev[r], data[r]));
    OK(kzStreamDestroy(own[r]));
    OK(kzCommDestroy(comm[r]));
  }
  res = kzStreamAdopt(dev[0], native[0], &bad);
  CHECK(res == kzInvalidArgument, "a destroyed stream's native handle: %s", kzGetErrorString(res));
}

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
  NonBlocking();
  Adopted();
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
