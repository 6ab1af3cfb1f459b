/* Internal to the example device plugin: the context, devices, memory regions, and the functions
 * backend.c puts into the api table. Nothing here is exported (the library is built with
 * -fvisibility=hidden; only kzDevicePluginGetApi is visible).
 *
 * The example's "device" is host memory: each allocation is a memfd mapped into the process, so
 * the CPU can read it (KZ_PLUGIN_DEVICE_HOST_ACCESSIBLE) and another process can map the same
 * pages from an exported fd (KZ_PLUGIN_DEVICE_EXPORT_FD). A vendor replaces memory.c and the
 * operations in stream.c with calls into their driver and keeps the rest.
 */
#ifndef KIZUNA_DEVICES_EXAMPLE_PLUGIN_EXAMPLE_PLUGIN_H_
#define KIZUNA_DEVICES_EXAMPLE_PLUGIN_EXAMPLE_PLUGIN_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "runtime/device/kizuna_device_plugin.h"

/* KZ_EXAMPLE_DEVICES: how many devices the plugin shows (default 2; 0 makes init report
 * KZ_PLUGIN_ERR_UNAVAILABLE, as a plugin does on a machine without its hardware). */
#define EXAMPLE_DEFAULT_DEVICES 2
#define EXAMPLE_MAX_DEVICES 64

/* The longest the plugin itself waits: a stream waiting for another stream's event, and each of
 * stream_destroy's two waits (for queued work, then for a cancelled stream's thread to finish its
 * host callbacks). The ABI gives these waits no timeout argument, so the plugin takes kizuna's
 * KIZUNA_TIMEOUT from the environment when it is set (read once, in init) and otherwise this
 * default, kizuna's own default. Reaching it means a dependency cycle or a hung host callback,
 * which then fails instead of hanging. */
#ifndef EXAMPLE_INTERNAL_TIMEOUT_NS
#define EXAMPLE_INTERNAL_TIMEOUT_NS (600ull * 1000000000ull)
#endif

/* Object tags: every handle kizuna passes back is checked, so a stale or foreign pointer gives
 * KZ_PLUGIN_ERR_INVALID_ARGUMENT instead of corrupting memory (as far as a tag can tell). */
#define EXAMPLE_CONTEXT_MAGIC 0x6b7a6378u /* "kzcx" */
#define EXAMPLE_STREAM_MAGIC 0x6b7a7374u  /* "kzst" */
#define EXAMPLE_EVENT_MAGIC 0x6b7a6576u   /* "kzev" */

/* One mapping: an allocation (fd is the memfd; map == ptr) or an import (fd is -1; map is the
 * page-aligned mapping that contains ptr). */
typedef struct example_region {
  struct example_region* next;
  void* ptr;       /* what kizuna sees */
  uint64_t bytes;  /* what kizuna asked for */
  void* map;       /* what munmap takes */
  uint64_t map_bytes;
  int fd;
} example_region_t;

typedef struct example_device {
  int32_t index;
  uint64_t capacity_bytes; /* reported as memory_bytes; allocations beyond it fail */
  pthread_mutex_t mu;      /* guards everything below */
  uint64_t allocated_bytes;
  example_region_t* allocations;
  example_region_t* imports;
} example_device_t;

typedef struct example_context {
  uint32_t magic;
  int32_t device_count;
  example_device_t devices[EXAMPLE_MAX_DEVICES];
  /* KZ_EXAMPLE_FAIL_STREAM_OP=k: the k-th copy, reduce or scale enqueued in this context fails
   * when it runs (fault injection, so the sticky-error path can be tested through kizuna). 0: never. */
  uint64_t fail_stream_op;
  atomic_uint_fast64_t stream_ops; /* copies, reduces and scales enqueued so far */
  /* The bound of the plugin's internal waits: KIZUNA_TIMEOUT, or EXAMPLE_INTERNAL_TIMEOUT_NS. */
  uint64_t internal_timeout_ns;
} example_context_t;

/* ---- backend.c ---- */
/* Records the thread's error message (printf-style) and returns `code`, so a failure reads
 * `return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "...", ...);`. */
kz_plugin_result_t example_error(kz_plugin_result_t code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
/* Checks that `context` is ours and `device` one of its devices; on success *out is the device. */
kz_plugin_result_t example_check_device(void* context, int32_t device, example_device_t** out);
/* Checks that `context` is a context of this plugin. */
kz_plugin_result_t example_check_context(void* context, example_context_t** out);

/* ---- memory.c ---- */
void example_device_init(example_device_t* device, int32_t index, uint64_t capacity_bytes);
/* Releases whatever kizuna did not free (finalize) and the device's lock. */
void example_device_release(example_device_t* device);
kz_plugin_result_t example_mem_alloc(void* context, int32_t device, uint64_t bytes, void** ptr);
kz_plugin_result_t example_mem_free(void* context, int32_t device, void* ptr);
kz_plugin_result_t example_mem_export_fd(void* context, int32_t device, void* ptr, uint64_t bytes, int32_t* fd,
                                         uint64_t* offset);
kz_plugin_result_t example_mem_import_fd(void* context, int32_t device, int32_t fd, uint64_t offset, uint64_t bytes,
                                         void** ptr);
kz_plugin_result_t example_mem_unimport(void* context, int32_t device, void* ptr, uint64_t bytes);

/* ---- stream.c ---- */
kz_plugin_result_t example_stream_create(void* context, int32_t device, kz_plugin_stream_t* stream);
kz_plugin_result_t example_stream_destroy(void* context, kz_plugin_stream_t stream);
kz_plugin_result_t example_stream_copy(void* context, kz_plugin_stream_t stream, void* dst, const void* src,
                                       uint64_t bytes);
kz_plugin_result_t example_stream_reduce(void* context, kz_plugin_stream_t stream, void* dst,
                                         const void* const* srcs, uint32_t num_srcs, uint64_t count, int32_t dtype,
                                         int32_t op);
kz_plugin_result_t example_stream_scale(void* context, kz_plugin_stream_t stream, void* dst, const void* src,
                                        uint64_t count, int32_t dtype, uint32_t divisor);
kz_plugin_result_t example_stream_host_callback(void* context, kz_plugin_stream_t stream, kz_plugin_host_fn_t fn,
                                                void* user_data);
kz_plugin_result_t example_stream_synchronize(void* context, kz_plugin_stream_t stream, uint64_t timeout_ns);
kz_plugin_result_t example_stream_query(void* context, kz_plugin_stream_t stream);
kz_plugin_result_t example_event_create(void* context, int32_t device, kz_plugin_event_t* event);
kz_plugin_result_t example_event_destroy(void* context, kz_plugin_event_t event);
kz_plugin_result_t example_event_record(void* context, kz_plugin_event_t event, kz_plugin_stream_t stream);
kz_plugin_result_t example_stream_wait_event(void* context, kz_plugin_stream_t stream, kz_plugin_event_t event);
kz_plugin_result_t example_event_query(void* context, kz_plugin_event_t event);
kz_plugin_result_t example_event_synchronize(void* context, kz_plugin_event_t event, uint64_t timeout_ns);

/* ---- reduce.c ---- */
/* dst[i] = srcs[0][i] op ... op srcs[n-1][i] for i < count; arguments already validated. */
void example_reduce(void* dst, const void* const* srcs, uint32_t num_srcs, uint64_t count, int32_t dtype,
                    int32_t op);
/* dst[i] = src[i] / divisor for i < count (dst == src allowed); arguments already validated. */
void example_scale(void* dst, const void* src, uint64_t count, int32_t dtype, uint32_t divisor);
/* Bytes per element; 0 for an unknown dtype. */
uint64_t example_dtype_size(int32_t dtype);

#endif /* KIZUNA_DEVICES_EXAMPLE_PLUGIN_EXAMPLE_PLUGIN_H_ */
