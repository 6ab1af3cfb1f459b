/* kizuna's C API: NCCL's names and semantics with a kz prefix, so that a framework that calls
 * NCCL switches with little more than a rename (ncclAllReduce -> kzAllReduce, ncclComm_t ->
 * kzComm_t, ncclFloat32 -> kzFloat32, ...). The C++ API (runtime/communicator.h) is the
 * reference for semantics; this header repeats what differs.
 *
 * Devices and streams. kizuna drives many kinds of device, so where NCCL takes a cudaStream_t
 * this API takes a kzStream_t created on one of kizuna's devices (kzDeviceGet, kzStreamCreate).
 * Device memory comes from kzMalloc; for host-accessible devices (the emulated accelerator) the
 * pointers may be read and written by the CPU directly.
 *
 * Errors. Every function returns kzResult_t. kzGetErrorString names the code; kzGetLastError
 * returns the full message of the calling thread's last failure (which argument, which rank,
 * which peer), valid until the thread's next failing call.
 *
 * Handles. kzComm_t, kzStream_t and kzDevice_t are opaque values, not pointers: never dereference
 * one. A handle is live from the call that made it until the call that ends it (kzCommDestroy or
 * kzCommAbort; kzStreamDestroy; device handles of kzDeviceGet live as long as the process). Any
 * call given a handle that was destroyed, a second kzCommDestroy or kzStreamDestroy included,
 * returns kzInvalidArgument and changes nothing; kzGetLastError then says "communicator handle
 * 0x... was destroyed" (or stream, device). A value that never was a handle of that kind (another
 * kind's handle, a stray pointer) gets kzInvalidArgument and "... is not a communicator handle"
 * (or stream, device), and is never dereferenced. NULL gets kzInvalidArgument ("comm is NULL"),
 * except in kzCommDestroy and kzStreamDestroy, where it does nothing and returns kzSuccess.
 * Destroying a handle while a call on another thread uses it is safe: that call finishes with the
 * object, which is destroyed when the last such call returns. A communicator of
 * kzCommInitFromEnv owns its device: the streams, memory and split communicators made on that
 * device keep it (and so the communicator's resources) until they are destroyed too. kzFree of a
 * pointer that kzMalloc did not return, or that was freed already, returns kzInvalidArgument.
 *
 * Threading and lifetimes are otherwise as in the C++ API. Values of the enums are stable (append
 * only).
 */
#ifndef KIZUNA_H_
#define KIZUNA_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version (libkizuna.so.KZ_MAJOR: the major is the ABI's; ranks of different majors
 * refuse to form a communicator). kzGetVersion returns the loaded library's KZ_VERSION_CODE. */
#define KZ_MAJOR 1
#define KZ_MINOR 1
#define KZ_PATCH 0
#define KZ_VERSION_CODE (KZ_MAJOR * 10000 + KZ_MINOR * 100 + KZ_PATCH)

typedef enum {
  kzSuccess = 0,
  kzInvalidArgument = 1,
  kzUnavailable = 2,
  kzNotSupported = 3,
  kzOutOfMemory = 4,
  kzTimeout = 5,
  kzAborted = 6,
  kzRemoteError = 7,
  kzInternalError = 8,
  kzInProgress = 9, /* a non-blocking communicator is still being created (kzCommInitRankConfig) */
} kzResult_t;

typedef enum {
  kzFloat16 = 0,
  kzBfloat16 = 1,
  kzFloat32 = 2,
  kzFloat64 = 3,
  kzInt8 = 4,
  kzUint8 = 5,
  kzInt32 = 6,
  kzUint32 = 7,
  kzInt64 = 8,
  kzUint64 = 9,
} kzDataType_t;

typedef enum { kzSum = 0, kzProd = 1, kzMin = 2, kzMax = 3, kzAvg = 4 } kzRedOp_t;

#define KZ_UNIQUE_ID_BYTES 128
/* The rendezvous id: printable text (NUL-terminated) naming the root's address and a secret. */
typedef struct {
  char internal[KZ_UNIQUE_ID_BYTES];
} kzUniqueId;

#define KZ_SPLIT_NOCOLOR (-1)

typedef struct kzComm* kzComm_t;
typedef struct kzDevice* kzDevice_t;
typedef struct kzStream* kzStream_t;

/* ---- Library ---- */
const char* kzGetErrorString(kzResult_t result);
const char* kzGetLastError(void);
kzResult_t kzGetVersion(int* version);

/* ---- Devices, memory, streams ---- */
/* Devices of the first available backend (the emulated accelerator when nothing else is). */
kzResult_t kzDeviceCount(int* count);
kzResult_t kzDeviceGet(int index, kzDevice_t* device);
/* "host_emulated:3" */
const char* kzDeviceName(kzDevice_t device);
kzResult_t kzMalloc(kzDevice_t device, size_t bytes, void** ptr);
/* kzInvalidArgument when ptr is not live memory of kzMalloc on `device` (freed already, or never
 * allocated); NULL is a no-op. Waits first for the work queued on the device's streams, as cudaFree
 * does, so that a collective still queued or running never meets freed memory; when that work does
 * not finish within KIZUNA_TIMEOUT the memory is not freed and the error says so. */
kzResult_t kzFree(kzDevice_t device, void* ptr);
kzResult_t kzStreamCreate(kzDevice_t device, kzStream_t* stream);
/* A framework's own stream (a cudaStream_t / CUstream on CUDA; on the emulated device the token
 * kzStreamGetNative gives) as a kzStream_t, so that collectives enqueue on the framework's stream
 * and return, as NCCL's do on a cudaStream_t. The native stream stays the caller's: it must
 * outlive the handle, and kzStreamDestroy releases only the handle. NULL is CUDA's legacy default
 * stream. kzInvalidArgument when `native` is not a live stream of `device`; kzNotSupported when its
 * backend adopts none. */
kzResult_t kzStreamAdopt(kzDevice_t device, void* native, kzStream_t* stream);
/* The backend's own handle of a stream (kzNotSupported where its backend has none). */
kzResult_t kzStreamGetNative(kzStream_t stream, void** native);
/* A destroyed stream's handle is refused by every later call (see Handles above). */
kzResult_t kzStreamDestroy(kzStream_t stream);
kzResult_t kzStreamSynchronize(kzStream_t stream);

/* ---- Communicators ---- */
kzResult_t kzGetUniqueId(kzUniqueId* id);
kzResult_t kzCommInitRank(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device);
/* One communicator per device, in one process: devlist indexes kzDeviceGet's devices (NULL: 0..ndev-1). */
kzResult_t kzCommInitAll(kzComm_t* comms, int ndev, const int* devlist);
/* Rank, size and rendezvous from the launcher (kizuna-run, torchrun, mpirun, srun). */
kzResult_t kzCommInitFromEnv(kzComm_t* comm);
kzResult_t kzCommSplit(kzComm_t comm, int color, int key, kzComm_t* newcomm);
/* Creation with options (ncclCommInitRankConfig). `config` NULL: the defaults, as kzCommInitRank.
 * With config->blocking = 0 the call returns at once, kzInProgress, with *comm a live handle;
 * the communicator is created on a thread of the library's, and kzCommGetAsyncError reports
 * kzInProgress until it is ready (then kzSuccess), or the creation's error. Until then every call
 * that needs the communicator returns kzInProgress; kzCommDestroy and kzCommAbort wait for the
 * creation to end (bounded by KIZUNA_TIMEOUT). */
typedef struct {
  size_t size;          /* sizeof(kzConfig_t), as KZ_CONFIG_INITIALIZER sets it */
  unsigned int magic;   /* KZ_CONFIG_MAGIC */
  unsigned int version; /* the KZ_VERSION_CODE the caller was built with */
  int blocking;         /* 1 (default): return when the communicator is ready; 0: at once */
} kzConfig_t;
#define KZ_CONFIG_MAGIC 0x6b7a4346u
#define KZ_CONFIG_INITIALIZER {sizeof(kzConfig_t), KZ_CONFIG_MAGIC, KZ_VERSION_CODE, 1}
kzResult_t kzCommInitRankConfig(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device,
                                const kzConfig_t* config);
/* Waits until every operation enqueued on the communicator so far has finished (bounded by
 * KIZUNA_TIMEOUT) and returns its first error, if any (ncclCommFinalize); then kzCommDestroy frees
 * it without waiting. Collectives enqueued after it are refused. */
kzResult_t kzCommFinalize(kzComm_t comm);
/* Both end the handle: every later call with it, a second destroy included, returns
 * kzInvalidArgument ("communicator handle 0x... was destroyed"). */
kzResult_t kzCommDestroy(kzComm_t comm);
kzResult_t kzCommAbort(kzComm_t comm);
/* Surviving a lost rank (ncclCommRevoke, ncclCommShrink). kzCommRevoke fails the communicator's
 * queued and running operations (kzAborted), refuses later ones and tells the peers, so that ranks
 * waiting on this one fail at once; the handle stays live for kzCommShrink and kzCommDestroy.
 * `flags` is 0. kzCommShrink makes *newcomm of comm's ranks but the `exclude_count` ranks in
 * `exclude_ranks` (say those lost), in the same order: only the remaining ranks call it, each with
 * the same list (a different list fails every caller, naming both); the excluded ranks need not be
 * alive, nor comm's rank 0. KZ_SHRINK_ABORT revokes comm's operations first (after a failure);
 * KZ_SHRINK_DEFAULT needs none in flight and leaves comm usable. `config` NULL or blocking. */
#define KZ_SHRINK_DEFAULT 0
#define KZ_SHRINK_ABORT 1
kzResult_t kzCommRevoke(kzComm_t comm, int flags);
kzResult_t kzCommShrink(kzComm_t comm, const int* exclude_ranks, int exclude_count, kzComm_t* newcomm,
                        const kzConfig_t* config, int flags);
kzResult_t kzCommGetAsyncError(kzComm_t comm, kzResult_t* async_error);
/* Collective, between calls: every rank measures its device's copy and reduce speeds and the ranks
 * exchange them; later calls split their work by the measured speeds, as when another job has come
 * to share one device (Communicator::Reweigh; KIZUNA_REWEIGH_CALLS does it every N calls). */
kzResult_t kzCommReweigh(kzComm_t comm);
/* ncclCommRegister / ncclCommDeregister: [buff, buff + size) stays the caller's while registered,
 * and the communicator's transfers from and into it go straight over any fabric (registered once
 * per connection) instead of through its staging memory. Host-accessible memory (host memory, the
 * emulated device's); kzNotSupported otherwise. Deregister waits for the operation running now;
 * do not deregister a buffer that queued operations still use. */
kzResult_t kzCommRegister(const kzComm_t comm, void* buff, size_t size, void** handle);
kzResult_t kzCommDeregister(const kzComm_t comm, void* handle);
kzResult_t kzCommCount(const kzComm_t comm, int* count);
kzResult_t kzCommUserRank(const kzComm_t comm, int* rank);
kzResult_t kzCommDevice(const kzComm_t comm, kzDevice_t* device);

/* ---- Collectives (enqueued on `stream`; return at once) ---- */
kzResult_t kzAllReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op,
                       kzComm_t comm, kzStream_t stream);
kzResult_t kzBroadcast(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, int root,
                       kzComm_t comm, kzStream_t stream);
kzResult_t kzReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op, int root,
                    kzComm_t comm, kzStream_t stream);
kzResult_t kzAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, kzDataType_t datatype, kzComm_t comm,
                       kzStream_t stream);
kzResult_t kzReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, kzDataType_t datatype,
                           kzRedOp_t op, kzComm_t comm, kzStream_t stream);
kzResult_t kzAllToAll(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzComm_t comm,
                      kzStream_t stream);
kzResult_t kzSend(const void* sendbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm,
                  kzStream_t stream);
kzResult_t kzRecv(void* recvbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm, kzStream_t stream);
kzResult_t kzBarrier(kzComm_t comm, kzStream_t stream);
kzResult_t kzGroupStart(void);
kzResult_t kzGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* KIZUNA_H_ */
