/* Deliberately broken device plugins for plugin_backend_test. One source, built once per defect:
 * exactly one BROKEN_* macro is defined, and the table below is a complete, well-formed api 1.0
 * table except for that one defect. The functions only ever run when the loader gets past
 * validation (BROKEN_INIT_UNAVAILABLE); they refuse politely.
 */
#include <stddef.h>

#include "runtime/device/kizuna_device_plugin.h"

static const char* broken_last_error(void) {
  return "no broken_test hardware on this machine (deliberately unavailable)";
}

static kz_plugin_result_t broken_init(void** context) {
  (void)context;
  return KZ_PLUGIN_ERR_UNAVAILABLE;
}

static void broken_finalize(void* context) { (void)context; }

static kz_plugin_result_t broken_device_count(void* context, int32_t* count) {
  (void)context;
  *count = 0;
  return KZ_PLUGIN_OK;
}

static kz_plugin_result_t broken_device_properties(void* c, int32_t d, kz_plugin_device_properties_t* p) {
  (void)c, (void)d, (void)p;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_mem_alloc(void* c, int32_t d, uint64_t b, void** p) {
  (void)c, (void)d, (void)b, (void)p;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_mem_free(void* c, int32_t d, void* p) {
  (void)c, (void)d, (void)p;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

#if defined(BROKEN_EXPORT_WITHOUT_IMPORT)
static kz_plugin_result_t broken_mem_export_fd(void* c, int32_t d, void* p, uint64_t b, int32_t* fd, uint64_t* o) {
  (void)c, (void)d, (void)p, (void)b, (void)fd, (void)o;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}
#endif

static kz_plugin_result_t broken_stream_create(void* c, int32_t d, kz_plugin_stream_t* s) {
  (void)c, (void)d, (void)s;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_stream_op(void* c, kz_plugin_stream_t s) {
  (void)c, (void)s;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_stream_copy(void* c, kz_plugin_stream_t s, void* dst, const void* src, uint64_t b) {
  (void)c, (void)s, (void)dst, (void)src, (void)b;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_stream_reduce(void* c, kz_plugin_stream_t s, void* dst, const void* const* srcs,
                                               uint32_t n, uint64_t count, int32_t dtype, int32_t op) {
  (void)c, (void)s, (void)dst, (void)srcs, (void)n, (void)count, (void)dtype, (void)op;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_stream_host_callback(void* c, kz_plugin_stream_t s, kz_plugin_host_fn_t fn,
                                                      void* user_data) {
  (void)c, (void)s, (void)fn, (void)user_data;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_stream_synchronize(void* c, kz_plugin_stream_t s, uint64_t timeout_ns) {
  (void)c, (void)s, (void)timeout_ns;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_event_create(void* c, int32_t d, kz_plugin_event_t* e) {
  (void)c, (void)d, (void)e;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_event_op(void* c, kz_plugin_event_t e) {
  (void)c, (void)e;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_event_record(void* c, kz_plugin_event_t e, kz_plugin_stream_t s) {
  (void)c, (void)e, (void)s;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_stream_wait_event(void* c, kz_plugin_stream_t s, kz_plugin_event_t e) {
  (void)c, (void)s, (void)e;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static kz_plugin_result_t broken_event_synchronize(void* c, kz_plugin_event_t e, uint64_t timeout_ns) {
  (void)c, (void)e, (void)timeout_ns;
  return KZ_PLUGIN_ERR_NOT_SUPPORTED;
}

static const kz_device_plugin_api_t broken_api = {
#if defined(BROKEN_SHORT_TABLE)
    /* Claims to end before stream_query: an api 1.0 table cut short. */
    .struct_size = offsetof(kz_device_plugin_api_t, stream_query),
#else
    .struct_size = sizeof(kz_device_plugin_api_t),
#endif
#if defined(BROKEN_API_MAJOR_99)
    .api_major = 99,
#else
    .api_major = KZ_DEVICE_PLUGIN_API_MAJOR,
#endif
    .api_minor = 0,
#if defined(BROKEN_BAD_NAME)
    .name = "Broken-Test!",
#else
    .name = "broken_test",
#endif
    .version = "0.0 (deliberately broken)",
    .last_error = broken_last_error,
    .init = broken_init,
    .finalize = broken_finalize,
    .device_count = broken_device_count,
    .device_properties = broken_device_properties,
    .mem_alloc = broken_mem_alloc,
    .mem_free = broken_mem_free,
#if defined(BROKEN_EXPORT_WITHOUT_IMPORT)
    /* Export is optional, but then import must be there too. */
    .mem_export_fd = broken_mem_export_fd,
#endif
    .stream_create = broken_stream_create,
    .stream_destroy = broken_stream_op,
    .stream_copy = broken_stream_copy,
    .stream_reduce = broken_stream_reduce,
    .stream_host_callback = broken_stream_host_callback,
    .stream_synchronize = broken_stream_synchronize,
#if !defined(BROKEN_MISSING_FUNCTION)
    .stream_query = broken_stream_op,
#endif
    .event_create = broken_event_create,
    .event_destroy = broken_event_op,
    .event_record = broken_event_record,
    .stream_wait_event = broken_stream_wait_event,
    .event_query = broken_event_op,
    .event_synchronize = broken_event_synchronize,
};

#if defined(BROKEN_NO_ENTRY_POINT)
/* A misspelt entry point: the library loads, but kizuna finds nothing to call. */
const kz_device_plugin_api_t* kzDevicePluginGetAPI(uint32_t host_api_major, uint32_t host_api_minor) {
  (void)host_api_major, (void)host_api_minor;
  return &broken_api;
}
#else
const kz_device_plugin_api_t* kzDevicePluginGetApi(uint32_t host_api_major, uint32_t host_api_minor) {
  (void)host_api_major, (void)host_api_minor;
#if defined(BROKEN_NULL_TABLE)
  (void)broken_api; /* it would have been valid; the entry point refuses anyway */
  return NULL;
#else
  return &broken_api;
#endif
}
#endif
