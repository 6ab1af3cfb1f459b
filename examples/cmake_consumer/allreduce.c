/* An AllReduce through kizuna's C API, from a program built outside kizuna's tree: one rank per
 * process, under a launcher (kizuna-run, torchrun, mpirun). Exits 0 when every element is right. */
#include <stdio.h>
#include <stdlib.h>

#include <kizuna/kizuna.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kzResult_t r_ = (call);                                                              \
    if (r_ != kzSuccess) {                                                               \
      fprintf(stderr, "%s: %s: %s\n", #call, kzGetErrorString(r_), kzGetLastError());    \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

int main(void) {
  const size_t count = 1 << 16;
  int version = 0, rank = 0, nranks = 0;
  kzComm_t comm;
  kzDevice_t device;
  kzStream_t stream;
  float* data = NULL;
  CHECK(kzGetVersion(&version));
  if (version / 10000 != KZ_MAJOR) {
    fprintf(stderr, "built against kizuna %d, loaded %d\n", KZ_VERSION_CODE, version);
    return 1;
  }
  CHECK(kzCommInitFromEnv(&comm));
  CHECK(kzCommUserRank(comm, &rank));
  CHECK(kzCommCount(comm, &nranks));
  CHECK(kzCommDevice(comm, &device));
  CHECK(kzStreamCreate(device, &stream));
  CHECK(kzMalloc(device, count * sizeof(float), (void**)&data));
  /* The emulated accelerator's memory is host-accessible: the CPU fills and reads it. */
  for (size_t i = 0; i < count; ++i) data[i] = (float)(rank + 1) + (float)(i % 7);
  CHECK(kzAllReduce(data, data, count, kzFloat32, kzSum, comm, stream));
  CHECK(kzStreamSynchronize(stream));
  for (size_t i = 0; i < count; ++i) {
    const float want = (float)(nranks * (nranks + 1) / 2) + (float)(nranks * (int)(i % 7));
    if (data[i] != want) {
      fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, data[i], want);
      return 1;
    }
  }
  printf("C: rank %d of %d: AllReduce of %zu floats ok (kizuna %d.%d.%d)\n", rank, nranks, count, version / 10000,
         version / 100 % 100, version % 100);
  CHECK(kzFree(device, data));
  CHECK(kzStreamDestroy(stream));
  CHECK(kzCommDestroy(comm));
  return 0;
}
