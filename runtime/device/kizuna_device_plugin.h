/* kizuna device plugin ABI — the one header an out-of-tree device backend is built against.
 *
 * A plugin is a shared library exporting one C function, kzDevicePluginGetApi, that returns a
 * table of function pointers. kizuna loads it with dlopen from a path in KIZUNA_DEVICE_PLUGINS
 * and wraps it as a device backend; the plugin then runs the same device conformance suite as the
 * in-tree backends (tests/conformance/device/). Start from devices/example_plugin/.
 *
 * Versioning (as PJRT and NCCL's net plugins do it):
 *  - Every struct starts with struct_size, set by whoever fills the struct to sizeof() of its
 *    version of the struct. Fields are only ever appended; the reader uses a field only when
 *    struct_size shows it is present.
 *  - api_major changes on any incompatible change; kizuna refuses a plugin whose major differs
 *    (with an error naming both versions). api_minor grows when fields are appended; a plugin
 *    with a newer minor works with an older kizuna (the extra fields are ignored), and an older
 *    one works with a newer kizuna (missing fields count as "not supported").
 *  - History: 1.0 the first table (up to event_synchronize). 1.1 appends stream_scale (optional).
 *    A plugin built against 1.0 has the smaller struct_size and so no stream_scale: kizuna then
 *    answers kNotSupported to Stream::Scale (and a caller falls back), everything else unchanged.
 *
 * Conventions:
 *  - Every function returns KZ_PLUGIN_OK or an error code; after an error, last_error() called on
 *    the same thread returns a message naming what went wrong (valid until the next call).
 *  - Optional functions may be NULL: kizuna then reports "not supported".
 *  - Device pointers are opaque to kizuna; it only passes them back (plus offsets).
 *  - Streams are in-order queues. Enqueue functions return quickly; a failure of queued work makes
 *    the stream report that error from stream_synchronize / stream_query and to later events
 *    and host callbacks (sticky, like a CUDA stream error).
 *  - A stream that waits on an event whose captured work failed takes that error (sticky).
 *  - Every wait takes a timeout in nanoseconds and returns KZ_PLUGIN_ERR_TIMEOUT when it passes.
 *    The one exception (since api 1.0) is stream_destroy (see there): the plugin bounds it itself.
 *  - Functions may be called from several threads at once.
 *  - No C++ exceptions, no longjmp across this boundary.
 *
 * Host callbacks and the threads they run on:
 *  - kizuna never calls stream_destroy or finalize, and never unloads the library, from inside a
 *    host callback on a plugin thread (not even when the application destroys a stream, or drops
 *    the last object of the plugin, in its callback): it hands those to a thread of its own. Nor
 *    does kizuna's own code make a blocking call (stream_synchronize, event_synchronize,
 *    stream_destroy) from a host callback. So a plugin never has to join, or wait for, the thread
 *    a call arrives on, and its code stays mapped while any of its threads runs.
 *  - The application's code inside a callback may still call into the plugin (enqueue, query,
 *    free memory, destroy events). It must not block for long and must not synchronize its own
 *    stream (runtime/device/device.h); a plugin should answer a wait on the calling callback's own
 *    stream with KZ_PLUGIN_ERR_INVALID_ARGUMENT rather than deadlock.
 */
#ifndef KIZUNA_DEVICE_PLUGIN_H_
#define KIZUNA_DEVICE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KZ_DEVICE_PLUGIN_API_MAJOR 1
#define KZ_DEVICE_PLUGIN_API_MINOR 1
#define KZ_DEVICE_PLUGIN_ENTRY_POINT "kzDevicePluginGetApi"

typedef int32_t kz_plugin_result_t;
#define KZ_PLUGIN_OK 0
#define KZ_PLUGIN_ERR_INVALID_ARGUMENT 1
#define KZ_PLUGIN_ERR_UNAVAILABLE 2 /* no hardware / driver here: the backend is skipped, not failed */
#define KZ_PLUGIN_ERR_NOT_SUPPORTED 3
#define KZ_PLUGIN_ERR_OUT_OF_MEMORY 4
#define KZ_PLUGIN_ERR_TIMEOUT 5
#define KZ_PLUGIN_ERR_ABORTED 6
#define KZ_PLUGIN_ERR_REMOTE 7
#define KZ_PLUGIN_ERR_INTERNAL 8
#define KZ_PLUGIN_NOT_READY 9 /* event_query / stream_query: work still pending (not an error) */

/* Element types (values match kizuna::DataType). */
#define KZ_PLUGIN_FLOAT16 0
#define KZ_PLUGIN_BFLOAT16 1
#define KZ_PLUGIN_FLOAT32 2
#define KZ_PLUGIN_FLOAT64 3
#define KZ_PLUGIN_INT8 4
#define KZ_PLUGIN_UINT8 5
#define KZ_PLUGIN_INT32 6
#define KZ_PLUGIN_UINT32 7
#define KZ_PLUGIN_INT64 8
#define KZ_PLUGIN_UINT64 9

/* Reduction operators (values match kizuna::ReduceOp). Semantics: runtime/device/host_reduce.h —
 * float16/bfloat16 accumulate in float32 and round once; integer sum/prod wrap; avg = sum / n
 * (integers: truncating toward zero). */
#define KZ_PLUGIN_SUM 0
#define KZ_PLUGIN_PROD 1
#define KZ_PLUGIN_MIN 2
#define KZ_PLUGIN_MAX 3
#define KZ_PLUGIN_AVG 4

/* kz_plugin_device_properties_t.flags */
#define KZ_PLUGIN_DEVICE_HOST_ACCESSIBLE (1u << 0) /* the CPU may dereference device pointers */
#define KZ_PLUGIN_DEVICE_EXPORT_FD (1u << 1)       /* mem_export_fd works (memfd or DMA-BUF) */

typedef struct kz_plugin_device_properties {
  size_t struct_size; /* set by kizuna before the call */
  char name[128];     /* human-readable */
  char uuid[64];      /* the same for this device in every process on the host */
  char pci_bus_id[32];/* "" when none */
  uint64_t memory_bytes;
  double copy_gbps;   /* 0: unknown */
  double reduce_gbps; /* 0: unknown */
  double launch_latency_us;
  int32_t numa_node;  /* -1: unknown */
  uint32_t flags;     /* KZ_PLUGIN_DEVICE_* */
} kz_plugin_device_properties_t;

typedef struct kz_plugin_stream* kz_plugin_stream_t;
typedef struct kz_plugin_event* kz_plugin_event_t;

/* Called once all earlier work on the stream is done, with KZ_PLUGIN_OK or the stream's error.
 * Runs on a plugin thread; must not block for long. Called exactly once, also after a stream error
 * or when the stream is destroyed with the callback still queued, so user_data can always be freed;
 * always before stream_destroy of its stream returns. kizuna's function never calls stream_destroy
 * or finalize, nor unloads the library, on this thread (see "Host callbacks" above). */
typedef void (*kz_plugin_host_fn_t)(void* user_data, kz_plugin_result_t stream_status);

typedef struct kz_device_plugin_api {
  size_t struct_size;      /* sizeof(kz_device_plugin_api_t) as the plugin was built */
  uint32_t api_major;      /* KZ_DEVICE_PLUGIN_API_MAJOR the plugin was built with */
  uint32_t api_minor;      /* KZ_DEVICE_PLUGIN_API_MINOR the plugin was built with */
  const char* name;        /* backend name: [a-z0-9_]+, unique among backends */
  const char* version;     /* the plugin's own version, free text */

  /* ---- api 1.0 ---- */
  const char* (*last_error)(void);

  /* Creates the plugin's context. KZ_PLUGIN_ERR_UNAVAILABLE (with last_error saying why) when there
   * is no device or driver on this machine. */
  kz_plugin_result_t (*init)(void** context);
  /* Called once per context, after every stream, event and allocation of it has been released,
   * and never on a plugin thread (see "Host callbacks" above). Not called at all when a
   * stream_destroy of the context failed: a thread of the plugin may still be running then. */
  void (*finalize)(void* context);

  kz_plugin_result_t (*device_count)(void* context, int32_t* count);
  /* kizuna sets props->struct_size to its size of the struct; the plugin fills only the fields both
   * sides know and sets struct_size to the size it filled. kizuna reads only fields inside it. */
  kz_plugin_result_t (*device_properties)(void* context, int32_t device, kz_plugin_device_properties_t* props);

  /* bytes == 0 yields *ptr == NULL and KZ_PLUGIN_OK. KZ_PLUGIN_ERR_OUT_OF_MEMORY when full. */
  kz_plugin_result_t (*mem_alloc)(void* context, int32_t device, uint64_t bytes, void** ptr);
  kz_plugin_result_t (*mem_free)(void* context, int32_t device, void* ptr);

  /* Optional. Returns a new fd the caller owns, and the offset of ptr within that fd's object. */
  kz_plugin_result_t (*mem_export_fd)(void* context, int32_t device, void* ptr, uint64_t bytes, int32_t* fd,
                                      uint64_t* offset);
  /* Optional (required with mem_export_fd). Maps [offset, offset + bytes) of fd; does not take the
   * fd (the plugin dup()s it if it needs it later). Undone by mem_unimport. */
  kz_plugin_result_t (*mem_import_fd)(void* context, int32_t device, int32_t fd, uint64_t offset, uint64_t bytes,
                                      void** ptr);
  kz_plugin_result_t (*mem_unimport)(void* context, int32_t device, void* ptr, uint64_t bytes);

  kz_plugin_result_t (*stream_create)(void* context, int32_t device, kz_plugin_stream_t* stream);
  /* Waits for queued work, then frees the stream. When it returns, every host callback of the
   * stream has run, exactly once, and returned (callbacks still queued at a cancel run with the
   * stream's error or KZ_PLUGIN_ERR_ABORTED), so the host may free what they use. Never called on
   * a plugin thread (see "Host callbacks" above).
   * api 1.0 gives stream_destroy no timeout, so the plugin MUST bound its own wait with an
   * internal timeout (the example plugin takes KIZUNA_TIMEOUT from the environment, default
   * 600 s): when it runs out, the plugin cancels what is left and returns KZ_PLUGIN_ERR_TIMEOUT,
   * and must not hang. If a host callback still has not returned then, the plugin may leave the
   * stream to its own thread and return KZ_PLUGIN_ERR_TIMEOUT: after any failed stream_destroy
   * kizuna assumes plugin code may still be running, so it never calls finalize for that context
   * and never unloads the library. A stream_destroy variant that takes a timeout_ns is a
   * candidate for a later minor. */
  kz_plugin_result_t (*stream_destroy)(void* context, kz_plugin_stream_t stream);
  kz_plugin_result_t (*stream_copy)(void* context, kz_plugin_stream_t stream, void* dst, const void* src,
                                    uint64_t bytes);
  /* srcs (the array of num_srcs pointers) is read during this call only: copy the pointers if the
   * reduction runs later. The memory they point to is read when the operation runs. */
  kz_plugin_result_t (*stream_reduce)(void* context, kz_plugin_stream_t stream, void* dst, const void* const* srcs,
                                      uint32_t num_srcs, uint64_t count, int32_t dtype, int32_t op);
  kz_plugin_result_t (*stream_host_callback)(void* context, kz_plugin_stream_t stream, kz_plugin_host_fn_t fn,
                                             void* user_data);
  kz_plugin_result_t (*stream_synchronize)(void* context, kz_plugin_stream_t stream, uint64_t timeout_ns);
  /* KZ_PLUGIN_OK when all work is done, KZ_PLUGIN_NOT_READY when some is pending, or the error. */
  kz_plugin_result_t (*stream_query)(void* context, kz_plugin_stream_t stream);

  kz_plugin_result_t (*event_create)(void* context, int32_t device, kz_plugin_event_t* event);
  kz_plugin_result_t (*event_destroy)(void* context, kz_plugin_event_t event);
  kz_plugin_result_t (*event_record)(void* context, kz_plugin_event_t event, kz_plugin_stream_t stream);
  kz_plugin_result_t (*stream_wait_event)(void* context, kz_plugin_stream_t stream, kz_plugin_event_t event);
  /* KZ_PLUGIN_OK when the captured work is done (or never recorded), KZ_PLUGIN_NOT_READY, or its error. */
  kz_plugin_result_t (*event_query)(void* context, kz_plugin_event_t event);
  kz_plugin_result_t (*event_synchronize)(void* context, kz_plugin_event_t event, uint64_t timeout_ns);

  /* ---- api 1.1 ---- */
  /* Optional (NULL, or absent from a table whose struct_size ends before it, i.e. a plugin built
   * against api 1.0: kizuna then answers kNotSupported and never calls it).
   * Enqueues dst[i] = src[i] / divisor for i < count: the division that finishes an average
   * (KZ_PLUGIN_AVG) after a sum over all ranks. Rounding is exactly KZ_PLUGIN_AVG's applied to
   * one already-summed input: float16 / bfloat16 / float32 are widened to float32, divided by
   * (float)divisor and rounded once to the type (to nearest even); float64 divides in double;
   * integer types truncate toward zero (signed types divide the value as the signed type:
   * -7 / 2 = -3). dst == src is allowed (in place); any other overlap is invalid.
   * kizuna has already checked the arguments (divisor >= 1, count >= 1, a known dtype, non-null
   * pointers, no partial overlap) and never calls it with count 0; a plugin still refuses bad
   * ones with KZ_PLUGIN_ERR_INVALID_ARGUMENT and enqueues nothing. Ordered, failing and skipped
   * like stream_copy and stream_reduce (sticky errors). */
  kz_plugin_result_t (*stream_scale)(void* context, kz_plugin_stream_t stream, void* dst, const void* src,
                                     uint64_t count, int32_t dtype, uint32_t divisor);
  /* ---- append api 1.2 fields below this line ---- */
} kz_device_plugin_api_t;

/* The entry point. kizuna passes its own api version; a plugin may return NULL when it cannot
 * serve that version (kizuna then reports the mismatch). */
typedef const kz_device_plugin_api_t* (*kz_device_plugin_get_api_fn)(uint32_t host_api_major,
                                                                     uint32_t host_api_minor);
const kz_device_plugin_api_t* kzDevicePluginGetApi(uint32_t host_api_major, uint32_t host_api_minor);

#ifdef __cplusplus
}
#endif

#endif /* KIZUNA_DEVICE_PLUGIN_H_ */
