/* The example device plugin's entry point, api table, context and device enumeration.
 *
 * kizuna calls kzDevicePluginGetApi once after dlopen, checks the table, then init once per load;
 * finalize comes after every stream, event and allocation of that context has been released.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "example_plugin.h"

#define EXAMPLE_PLUGIN_NAME "example"
#define EXAMPLE_PLUGIN_VERSION "1.1.0 (host memory via memfd)"

/* The ABI makes last_error per thread: a message belongs to the failing call on this thread. */
static _Thread_local char example_last_error_text[512];

kz_plugin_result_t example_error(kz_plugin_result_t code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(example_last_error_text, sizeof example_last_error_text, format, args);
  va_end(args);
  return code;
}

static const char* example_last_error(void) { return example_last_error_text; }

kz_plugin_result_t example_check_context(void* context, example_context_t** out) {
  example_context_t* ctx = (example_context_t*)context;
  if (ctx == NULL || ctx->magic != EXAMPLE_CONTEXT_MAGIC)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "context %p is not an example plugin context", context);
  *out = ctx;
  return KZ_PLUGIN_OK;
}

kz_plugin_result_t example_check_device(void* context, int32_t device, example_device_t** out) {
  example_context_t* ctx = NULL;
  kz_plugin_result_t rc = example_check_context(context, &ctx);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (device < 0 || device >= ctx->device_count)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "unknown device %d (the plugin has %d)", (int)device,
                         (int)ctx->device_count);
  *out = &ctx->devices[device];
  return KZ_PLUGIN_OK;
}

/* Parses a non-negative decimal environment variable; *value is left alone when it is unset. */
static kz_plugin_result_t example_env_u64(const char* name, uint64_t max, uint64_t* value) {
  const char* text = getenv(name);
  if (text == NULL || *text == '\0') return KZ_PLUGIN_OK;
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-' || v > max)
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "%s='%s' is not a whole number from 0 to %llu", name, text,
                         (unsigned long long)max);
  *value = v;
  return KZ_PLUGIN_OK;
}

/* The bound of the plugin's internal waits (see EXAMPLE_INTERNAL_TIMEOUT_NS): KIZUNA_TIMEOUT in
 * seconds when it is set, so that the plugin gives up when kizuna does. A malformed value counts
 * as unset, as it does for kizuna itself (which warns about it and uses its default, the same
 * 600 s). */
static uint64_t example_internal_timeout_ns(void) {
  const char* text = getenv("KIZUNA_TIMEOUT");
  if (text == NULL) return EXAMPLE_INTERNAL_TIMEOUT_NS;
  while (isspace((unsigned char)*text)) ++text;
  char* end = NULL;
  errno = 0;
  const double seconds = strtod(text, &end);
  if (end == text || errno != 0) return EXAMPLE_INTERNAL_TIMEOUT_NS;
  while (isspace((unsigned char)*end)) ++end;
  /* kizuna's range: positive, at most 1e9 s (so the nanoseconds fit in 64 bits). */
  if (*end != '\0' || !isfinite(seconds) || seconds <= 0 || seconds > 1e9) return EXAMPLE_INTERNAL_TIMEOUT_NS;
  const double ns = seconds * 1e9;
  return ns < 1.0 ? 1u : (uint64_t)ns;
}

/* Each device may use all of the host's memory, as emulated devices do: they share it, and the
 * first one to run out reports KZ_PLUGIN_ERR_OUT_OF_MEMORY. */
static uint64_t example_host_memory_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return (uint64_t)1 << 30; /* unknown: claim 1 GiB */
  return (uint64_t)pages * (uint64_t)page_size;
}

static kz_plugin_result_t example_init(void** context) {
  if (context == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "init: context is NULL");
  uint64_t devices = EXAMPLE_DEFAULT_DEVICES;
  uint64_t fail_stream_op = 0;
  kz_plugin_result_t rc = example_env_u64("KZ_EXAMPLE_DEVICES", EXAMPLE_MAX_DEVICES, &devices);
  if (rc != KZ_PLUGIN_OK) return rc;
  rc = example_env_u64("KZ_EXAMPLE_FAIL_STREAM_OP", UINT64_MAX, &fail_stream_op);
  if (rc != KZ_PLUGIN_OK) return rc;
  /* Read by kzDevicePluginGetApi (which cannot report an error); checked here so a bad value fails
   * with a message instead of silently serving the newest table. */
  uint64_t api_minor = KZ_DEVICE_PLUGIN_API_MINOR;
  rc = example_env_u64("KZ_EXAMPLE_API_MINOR", KZ_DEVICE_PLUGIN_API_MINOR, &api_minor);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (devices == 0)
    return example_error(KZ_PLUGIN_ERR_UNAVAILABLE, "KZ_EXAMPLE_DEVICES=0: no example devices on this machine");

  example_context_t* ctx = (example_context_t*)calloc(1, sizeof *ctx);
  if (ctx == NULL) return example_error(KZ_PLUGIN_ERR_OUT_OF_MEMORY, "init: cannot allocate the context");
  ctx->magic = EXAMPLE_CONTEXT_MAGIC;
  ctx->device_count = (int32_t)devices;
  ctx->fail_stream_op = fail_stream_op;
  atomic_init(&ctx->stream_ops, 0);
  ctx->internal_timeout_ns = example_internal_timeout_ns();
  const uint64_t capacity = example_host_memory_bytes();
  for (int32_t i = 0; i < ctx->device_count; ++i) example_device_init(&ctx->devices[i], i, capacity);
  *context = ctx;
  return KZ_PLUGIN_OK;
}

static void example_finalize(void* context) {
  example_context_t* ctx = NULL;
  if (example_check_context(context, &ctx) != KZ_PLUGIN_OK) return;
  for (int32_t i = 0; i < ctx->device_count; ++i) example_device_release(&ctx->devices[i]);
  ctx->magic = 0;
  free(ctx);
}

static kz_plugin_result_t example_device_count(void* context, int32_t* count) {
  example_context_t* ctx = NULL;
  kz_plugin_result_t rc = example_check_context(context, &ctx);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (count == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = ctx->device_count;
  return KZ_PLUGIN_OK;
}

static kz_plugin_result_t example_device_properties(void* context, int32_t device,
                                                    kz_plugin_device_properties_t* props) {
  example_device_t* dev = NULL;
  kz_plugin_result_t rc = example_check_device(context, device, &dev);
  if (rc != KZ_PLUGIN_OK) return rc;
  if (props == NULL) return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "device_properties: props is NULL");

  /* Fill our own version of the struct, then copy only as much as both sides know: a newer
   * kizuna passes a larger struct (its extra fields keep its defaults), an older one a smaller
   * struct. struct_size then says how much was filled. */
  kz_plugin_device_properties_t p;
  memset(&p, 0, sizeof p);
  snprintf(p.name, sizeof p.name, "example device %d (host memory)", (int)device);
  /* Devices are numbered the same in every process, so the index identifies one host-wide. */
  snprintf(p.uuid, sizeof p.uuid, "kz-example-%d", (int)device);
  p.pci_bus_id[0] = '\0';
  p.memory_bytes = dev->capacity_bytes;
  /* Not measured: 0 tells kizuna's cost model to use its defaults. A real plugin reports its
   * device's copy and reduce throughput and its launch latency here. */
  p.copy_gbps = 0;
  p.reduce_gbps = 0;
  p.launch_latency_us = 0;
  p.numa_node = -1;
  p.flags = KZ_PLUGIN_DEVICE_HOST_ACCESSIBLE | KZ_PLUGIN_DEVICE_EXPORT_FD;

  size_t n = props->struct_size < sizeof p ? props->struct_size : sizeof p;
  if (n < sizeof(size_t))
    return example_error(KZ_PLUGIN_ERR_INVALID_ARGUMENT, "device_properties: struct_size %zu is too small",
                         props->struct_size);
  p.struct_size = n;
  memcpy(props, &p, n);
  return KZ_PLUGIN_OK;
}

/* Designated initializers: every field is named, so the table cannot silently shift. */
static const kz_device_plugin_api_t example_api = {
    .struct_size = sizeof(kz_device_plugin_api_t),
    .api_major = KZ_DEVICE_PLUGIN_API_MAJOR,
    .api_minor = KZ_DEVICE_PLUGIN_API_MINOR,
    .name = EXAMPLE_PLUGIN_NAME,
    .version = EXAMPLE_PLUGIN_VERSION,
    .last_error = example_last_error,
    .init = example_init,
    .finalize = example_finalize,
    .device_count = example_device_count,
    .device_properties = example_device_properties,
    .mem_alloc = example_mem_alloc,
    .mem_free = example_mem_free,
    .mem_export_fd = example_mem_export_fd,
    .mem_import_fd = example_mem_import_fd,
    .mem_unimport = example_mem_unimport,
    .stream_create = example_stream_create,
    .stream_destroy = example_stream_destroy,
    .stream_copy = example_stream_copy,
    .stream_reduce = example_stream_reduce,
    .stream_host_callback = example_stream_host_callback,
    .stream_synchronize = example_stream_synchronize,
    .stream_query = example_stream_query,
    .event_create = example_event_create,
    .event_destroy = example_event_destroy,
    .event_record = example_event_record,
    .stream_wait_event = example_stream_wait_event,
    .event_query = example_event_query,
    .event_synchronize = example_event_synchronize,
    /* api 1.1 */
    .stream_scale = example_stream_scale,
};

/* KZ_EXAMPLE_API_MINOR=0 serves the table a plugin built against api 1.0 has (struct_size ending at
 * event_synchronize, api_minor 0), so hosts can test that such a plugin still loads and answers
 * "not supported" for what 1.1 added. stream_scale stays set in the bytes past struct_size: a host
 * that read beyond struct_size would call it, and its tests would notice. */
static kz_device_plugin_api_t example_api_1_0;
static pthread_once_t example_api_1_0_once = PTHREAD_ONCE_INIT;

/* KZ_EXAMPLE_API_MINOR parsed as init parses it (a malformed value makes init fail). */
static int example_wants_api_1_0(void) {
  const char* text = getenv("KZ_EXAMPLE_API_MINOR");
  if (text == NULL || *text == '\0' || *text == '-') return 0;
  char* end = NULL;
  errno = 0;
  const unsigned long long v = strtoull(text, &end, 10);
  return errno == 0 && *end == '\0' && v == 0;
}

static void example_make_api_1_0(void) {
  example_api_1_0 = example_api;
  example_api_1_0.struct_size = offsetof(kz_device_plugin_api_t, stream_scale);
  example_api_1_0.api_minor = 0;
}

/* The one exported symbol. A host of another major version gets NULL (it reports the mismatch);
 * any minor of major 1 gets this table, since minors only append fields (a 1.0 host ignores
 * stream_scale). */
__attribute__((visibility("default"))) const kz_device_plugin_api_t* kzDevicePluginGetApi(uint32_t host_api_major,
                                                                                          uint32_t host_api_minor) {
  (void)host_api_minor;
  if (host_api_major != KZ_DEVICE_PLUGIN_API_MAJOR) return NULL;
  if (example_wants_api_1_0()) {
    pthread_once(&example_api_1_0_once, example_make_api_1_0);
    return &example_api_1_0;
  }
  return &example_api;
}
