/* kizuna fabric plugin ABI — the one header an out-of-tree fabric (a NIC, a transport) is built
 * against.
 *
 * A plugin is a shared library exporting one C function, kzFabricPluginGetApi, that returns a table
 * of function pointers. kizuna loads it with dlopen from a path in KIZUNA_FABRIC_PLUGINS and wraps
 * it as a fabric (fabric/fabric.h) beside the built-in ones; it then runs the same fabric
 * conformance suite (tests/conformance/fabric/). Start from fabric/example_plugin/.
 *
 * The calls follow NCCL's net plugin (ncclNet_t in ext-net/ of NCCL's repository), so a vendor with
 * an ncclNet_t maps it call for call:
 *
 *   ncclNet_t                 kz_fabric_plugin_api_t
 *   devices/getProperties     device_count / device_properties
 *   listen/connect/accept     listen / connect (+ connect_abort) / accept (+ wait_acceptable)
 *   regMr / regMrDmaBuf       reg_mr / reg_mr_fd
 *   deregMr                   dereg_mr
 *   isend / irecv / test      isend / irecv / test (+ wait)
 *   iflush                    flush
 *   closeSend/Recv/Listen     close_send / close_recv / close_listen
 *   (RDMA write + immediate)  expose / iwrite / poll_immediate (optional)
 *
 * Differences from ncclNet_t, on purpose: every error carries a message (last_error); waits take a
 * timeout and block in the plugin's own primitive (wait, wait_acceptable) instead of making kizuna
 * spin; connect keeps its progress in an opaque state kizuna hands back, not in the handle; a
 * receive is one buffer (no grouped irecv); isend/irecv sizes are 64-bit.
 *
 * Versioning (as the device plugin ABI, PJRT and NCCL's plugins do it):
 *  - Every struct starts with struct_size, set by whoever fills the struct to sizeof() of its
 *    version of the struct. Fields are only ever appended; the reader uses a field only when
 *    struct_size shows it is present.
 *  - api_major changes on any incompatible change; kizuna refuses a plugin whose major differs
 *    (with an error naming both versions). api_minor grows when fields are appended; a plugin with
 *    a newer minor works with an older kizuna (the extra fields are ignored), and an older one
 *    works with a newer kizuna (missing fields count as "not supported").
 *
 * Conventions:
 *  - Every function returns KZ_FABRIC_OK or an error code; after an error, last_error() called on
 *    the same thread returns a message naming what went wrong (valid until the next call).
 *  - Optional functions may be NULL: kizuna then reports "not supported" (or, for wait and
 *    wait_acceptable, sleeps with a short backoff instead).
 *  - kizuna checks arguments before calling (ranges inside registrations, device indices, sizes
 *    within max_message_bytes, the in-flight limit), but a plugin must still not crash on a bad
 *    handle from a peer: handles are untrusted bytes.
 *  - Threading: the context-level calls (device_count, device_properties, listen, connect,
 *    connect_abort) may be called from several threads at once. A listen, send or receive comm,
 *    and everything on it (registrations, requests), is used by one thread at a time; different
 *    comms may be used from different threads concurrently.
 *  - Progress: kizuna has no progress thread for a plugin. isend, irecv, test, wait, accept and
 *    poll_immediate are where a plugin without its own thread moves bytes.
 *  - A peer that closes its comm or dies surfaces as KZ_FABRIC_ERR_REMOTE on the survivor's
 *    requests (never a hang, never SIGPIPE).
 *  - Every blocking call takes a timeout in nanoseconds.
 *  - No C++ exceptions, no longjmp across this boundary.
 */
#ifndef KIZUNA_FABRIC_PLUGIN_H_
#define KIZUNA_FABRIC_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KZ_FABRIC_PLUGIN_API_MAJOR 1
#define KZ_FABRIC_PLUGIN_API_MINOR 0
#define KZ_FABRIC_PLUGIN_ENTRY_POINT "kzFabricPluginGetApi"

typedef int32_t kz_fabric_result_t;
#define KZ_FABRIC_OK 0
#define KZ_FABRIC_ERR_INVALID_ARGUMENT 1 /* also: a message longer than the receive (name both sizes) */
#define KZ_FABRIC_ERR_UNAVAILABLE 2      /* no NIC / provider here: the fabric is skipped, not failed */
#define KZ_FABRIC_ERR_NOT_SUPPORTED 3
#define KZ_FABRIC_ERR_OUT_OF_MEMORY 4
#define KZ_FABRIC_ERR_TIMEOUT 5
#define KZ_FABRIC_ERR_ABORTED 6
#define KZ_FABRIC_ERR_REMOTE 7           /* the peer closed its comm, died, or broke the protocol */
#define KZ_FABRIC_ERR_INTERNAL 8

/* The largest listen handle (NCCL_NET_HANDLE_MAXSIZE) and remote key. */
#define KZ_FABRIC_HANDLE_MAX_BYTES 128
#define KZ_FABRIC_REMOTE_KEY_MAX_BYTES 64

/* kz_fabric_device_properties_t.ptr_support (NCCL_PTR_HOST / NCCL_PTR_CUDA / NCCL_PTR_DMABUF). */
#define KZ_FABRIC_PTR_HOST (1u << 0)   /* host memory, reg_mr by pointer */
#define KZ_FABRIC_PTR_DEVICE (1u << 1) /* device memory, reg_mr by pointer */
#define KZ_FABRIC_PTR_FD (1u << 2)     /* memory by fd + offset (DMA-BUF, memfd): reg_mr_fd */

/* kz_fabric_device_properties_t.flags */
#define KZ_FABRIC_DEVICE_WRITE_IMMEDIATE (1u << 0) /* expose / iwrite / poll_immediate work */
#define KZ_FABRIC_DEVICE_NEEDS_FLUSH (1u << 1)     /* flush does real work (NCCL's forceFlush) */
/* Every payload byte passes through an intermediate buffer (a socket buffer, a bounce buffer):
 * kizuna counts it in TransferStats::staged_bytes. */
#define KZ_FABRIC_DEVICE_STAGED (1u << 2)

/* Memory types for reg_mr / reg_mr_fd. */
#define KZ_FABRIC_MEM_HOST 0
#define KZ_FABRIC_MEM_DEVICE 1

/* What kizuna tells init about the calling rank. Strings are valid during init only. */
typedef struct kz_fabric_init_args {
  size_t struct_size;   /* set by kizuna */
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  const char* host_id;  /* identical for every rank on one host */
  uint64_t timeout_ns;  /* KIZUNA_TIMEOUT: the bound for any wait the plugin makes on its own */
} kz_fabric_init_args_t;

typedef struct kz_fabric_device_properties {
  size_t struct_size;     /* set by kizuna before the call; the plugin sets it to what it filled */
  char name[128];         /* human-readable, e.g. "mlx5_0:1" */
  char pci_path[256];     /* sysfs PCI path; "" when none */
  double speed_gbps;      /* per direction; 0: unknown */
  double latency_us;      /* one-way, small message; 0: unknown */
  uint32_t ptr_support;   /* KZ_FABRIC_PTR_*; KZ_FABRIC_PTR_HOST is required */
  uint32_t flags;         /* KZ_FABRIC_DEVICE_* */
  int32_t max_requests;   /* requests in flight per comm, >= 1 */
  int32_t numa_node;      /* -1: unknown */
  uint64_t max_message_bytes; /* the largest single isend / irecv / iwrite, >= 1 MiB */
} kz_fabric_device_properties_t;

/* Opaque objects of the plugin. */
typedef struct kz_fabric_listen_comm* kz_fabric_listen_comm_t;
typedef struct kz_fabric_send_comm* kz_fabric_send_comm_t;
typedef struct kz_fabric_recv_comm* kz_fabric_recv_comm_t;
/* reg_mr and friends take either kind of comm: a kz_fabric_send_comm_t or kz_fabric_recv_comm_t
 * passed as this type, together with is_send saying which. */
typedef void* kz_fabric_comm_t;
typedef struct kz_fabric_mr* kz_fabric_mr_t;
typedef struct kz_fabric_request* kz_fabric_request_t;
typedef struct kz_fabric_connect_state* kz_fabric_connect_state_t;

typedef struct kz_fabric_plugin_api {
  size_t struct_size;  /* sizeof(kz_fabric_plugin_api_t) as the plugin was built */
  uint32_t api_major;  /* KZ_FABRIC_PLUGIN_API_MAJOR the plugin was built with */
  uint32_t api_minor;  /* KZ_FABRIC_PLUGIN_API_MINOR the plugin was built with */
  const char* name;    /* fabric name: [a-z0-9_]+, unique among fabrics (KIZUNA_FABRIC names it) */
  const char* version; /* the plugin's own version, free text */

  /* ---- api 1.0: required ---- */
  const char* (*last_error)(void);

  /* Creates a context for one rank (kizuna may create several in one process, e.g. one per rank
   * in a threaded test: contexts must not share mutable state). KZ_FABRIC_ERR_UNAVAILABLE, with
   * last_error saying why, when there is no device here. */
  kz_fabric_result_t (*init)(const kz_fabric_init_args_t* args, void** context);
  /* Called once per context, after every comm of it has been closed. */
  void (*finalize)(void* context);

  kz_fabric_result_t (*device_count)(void* context, int32_t* count);
  kz_fabric_result_t (*device_properties)(void* context, int32_t dev, kz_fabric_device_properties_t* props);

  /* Starts listening on `dev`. Writes the handle (at most KZ_FABRIC_HANDLE_MAX_BYTES, non-empty)
   * to `handle` and its length to *handle_size. The handle is all a peer needs to connect: put an
   * unguessable secret in it, so a stranger cannot attach. Two listeners never share a handle. */
  kz_fabric_result_t (*listen)(void* context, int32_t dev, void* handle, uint32_t* handle_size,
                               kz_fabric_listen_comm_t* listen_comm);
  /* Non-blocking connect to the listener that produced `handle` (untrusted bytes: a malformed one
   * is KZ_FABRIC_ERR_INVALID_ARGUMENT). *state is NULL on the first call. While the connection is
   * in progress the plugin returns KZ_FABRIC_OK with *send_comm NULL and may set *state to keep
   * its progress; kizuna calls again with the same dev, handle and *state. When it returns a comm
   * or an error, the plugin has released the state (kizuna forgets it). A listener that is gone
   * must fail the attempt in bounded time (a refused or reset connection). */
  kz_fabric_result_t (*connect)(void* context, int32_t dev, const void* handle, uint32_t handle_size,
                                kz_fabric_connect_state_t* state, kz_fabric_send_comm_t* send_comm);
  /* Releases an in-progress connect state kizuna gives up on (deadline passed, fabric destroyed). */
  void (*connect_abort)(void* context, kz_fabric_connect_state_t state);
  /* Non-blocking: a receive comm for the next peer that connected with this listener's handle, or
   * KZ_FABRIC_OK with *recv_comm NULL while none has. An attempt without the handle's secret is
   * dropped (and may be logged to stderr), never returned. */
  kz_fabric_result_t (*accept)(kz_fabric_listen_comm_t listen_comm, kz_fabric_recv_comm_t* recv_comm);
  /* Closes the listener; pending, unaccepted attempts are dropped. */
  kz_fabric_result_t (*close_listen)(kz_fabric_listen_comm_t listen_comm);

  /* Registers [data, data + size) for posts on `comm` (is_send: 1 for a send comm, 0 for a receive
   * comm). mem_type: KZ_FABRIC_MEM_HOST or KZ_FABRIC_MEM_DEVICE. KZ_FABRIC_ERR_NOT_SUPPORTED for
   * memory the device cannot reach. */
  kz_fabric_result_t (*reg_mr)(kz_fabric_comm_t comm, int32_t is_send, void* data, uint64_t size, int32_t mem_type,
                               kz_fabric_mr_t* mr);
  /* Releases a registration; kizuna calls it only when no request posted on it is in flight. */
  kz_fabric_result_t (*dereg_mr)(kz_fabric_comm_t comm, int32_t is_send, kz_fabric_mr_t mr);

  /* Posts a send of [data, data + size) with `tag` (size may be 0, with mr NULL). Sends and
   * receives of one tag on one connection match in posting order; different tags are independent
   * (a message waiting for its receive on one tag never holds up another tag). KZ_FABRIC_OK with
   * *request NULL when the plugin's queues are full (kizuna tests and posts again). The data must
   * not be touched after the request completes. */
  kz_fabric_result_t (*isend)(kz_fabric_send_comm_t send_comm, const void* data, uint64_t size, int32_t tag,
                              kz_fabric_mr_t mr, kz_fabric_request_t* request);
  /* Posts a receive into [data, data + capacity) for `tag`. A message longer than `capacity` fails
   * this request and the matching send with KZ_FABRIC_ERR_INVALID_ARGUMENT, last_error naming both
   * sizes; the connection stays usable. Busy: as for isend. */
  kz_fabric_result_t (*irecv)(kz_fabric_recv_comm_t recv_comm, void* data, uint64_t capacity, int32_t tag,
                              kz_fabric_mr_t mr, kz_fabric_request_t* request);
  /* Non-blocking: progresses the request's comm and sets *done (0 or 1) and, when done, *size
   * (bytes received for a receive, sent or written otherwise). When it reports done, or returns an
   * error (the request failed), the plugin has released the request and kizuna forgets it. */
  kz_fabric_result_t (*test)(kz_fabric_request_t request, int32_t* done, uint64_t* size);

  /* Close a comm. Requests still in flight on it are abandoned and released by the plugin (the
   * peer's then fail with KZ_FABRIC_ERR_REMOTE), as are its registrations. Must not block for long:
   * a close never waits for the peer. */
  kz_fabric_result_t (*close_send)(kz_fabric_send_comm_t send_comm);
  kz_fabric_result_t (*close_recv)(kz_fabric_recv_comm_t recv_comm);

  /* ---- api 1.0: optional (NULL when absent) ---- */

  /* Blocks until something may have changed for the comm (peer data, buffer space, a completion)
   * or timeout_ns passes; KZ_FABRIC_OK in both cases (spurious returns are fine). NULL: kizuna
   * sleeps with a short backoff between tests instead. */
  kz_fabric_result_t (*wait)(kz_fabric_comm_t comm, int32_t is_send, uint64_t timeout_ns);
  /* Blocks until a connection attempt may be pending or timeout_ns passes (KZ_FABRIC_OK both). */
  kz_fabric_result_t (*wait_acceptable)(kz_fabric_listen_comm_t listen_comm, uint64_t timeout_ns);
  /* Registers memory by fd + offset (regMrDmaBuf): `data` is the region's local address and
   * [offset, offset + size) the same bytes in the fd's object. The fd is borrowed for the call: the
   * plugin dup()s it if it keeps it. Required when a device sets KZ_FABRIC_PTR_FD. */
  kz_fabric_result_t (*reg_mr_fd)(kz_fabric_comm_t comm, int32_t is_send, void* data, uint64_t size,
                                  int32_t mem_type, int32_t fd, uint64_t offset, kz_fabric_mr_t* mr);
  /* Makes received bytes in [data, data + size) visible to the local device (iflush), within
   * timeout_ns. Required when a device sets KZ_FABRIC_DEVICE_NEEDS_FLUSH. */
  kz_fabric_result_t (*flush)(kz_fabric_recv_comm_t recv_comm, void* data, uint64_t size, kz_fabric_mr_t mr,
                              uint64_t timeout_ns);
  /* One-sided writes: all three or none; required when a device sets
   * KZ_FABRIC_DEVICE_WRITE_IMMEDIATE.
   * expose: writes a remote key (<= KZ_FABRIC_REMOTE_KEY_MAX_BYTES) for a registered region of the
   * receive comm, to be sent to the peer; the region stays exposed until dereg_mr.
   * iwrite: writes [data, data + size) into the peer's exposed region `key` at remote_offset; with
   * has_immediate, the peer's poll_immediate yields `immediate` after the bytes are visible there.
   * Writes and immediates arrive in posting order. The request completes when the local buffer may
   * be reused. A key of another connection, or a range beyond the region: INVALID_ARGUMENT.
   * poll_immediate: the next immediate in posting order (*has_immediate 1) or none yet (0);
   * KZ_FABRIC_ERR_REMOTE once the peer is gone and none are queued. */
  kz_fabric_result_t (*expose)(kz_fabric_recv_comm_t recv_comm, kz_fabric_mr_t mr, void* key, uint32_t* key_size);
  kz_fabric_result_t (*iwrite)(kz_fabric_send_comm_t send_comm, const void* data, uint64_t size, kz_fabric_mr_t mr,
                               const void* key, uint32_t key_size, uint64_t remote_offset, int32_t has_immediate,
                               uint32_t immediate, kz_fabric_request_t* request);
  kz_fabric_result_t (*poll_immediate)(kz_fabric_recv_comm_t recv_comm, int32_t* has_immediate, uint32_t* immediate);
  /* ---- append api 1.1 fields below this line ---- */
} kz_fabric_plugin_api_t;

/* The entry point. kizuna passes its own api version; a plugin may return NULL when it cannot
 * serve that version (kizuna then reports the mismatch). */
typedef const kz_fabric_plugin_api_t* (*kz_fabric_plugin_get_api_fn)(uint32_t host_api_major,
                                                                     uint32_t host_api_minor);
const kz_fabric_plugin_api_t* kzFabricPluginGetApi(uint32_t host_api_major, uint32_t host_api_minor);

#ifdef __cplusplus
}
#endif

#endif /* KIZUNA_FABRIC_PLUGIN_H_ */
