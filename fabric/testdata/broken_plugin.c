/* Deliberately broken fabric plugins for //fabric:plugin_test. One source, built once per defect:
 * exactly one BROKEN_* macro is defined, and the table below is a complete, well-formed api 1.0
 * table except for that one defect. Past validation, the functions refuse politely; nothing here
 * moves bytes.
 */
#include <stddef.h>
#include <string.h>

#include "fabric/kizuna_fabric_plugin.h"

/* Each variant leaves some of these out of its table. */
#define BROKEN_FN static __attribute__((unused))

static int broken_context;

BROKEN_FN const char* broken_last_error(void) {
  return "no broken_test hardware on this machine (deliberately unavailable)";
}

BROKEN_FN kz_fabric_result_t broken_init(const kz_fabric_init_args_t* args, void** context) {
  (void)args;
#ifdef BROKEN_INIT_UNAVAILABLE
  (void)context, (void)broken_context;
  return KZ_FABRIC_ERR_UNAVAILABLE;
#else
  *context = &broken_context;
  return KZ_FABRIC_OK;
#endif
}

BROKEN_FN void broken_finalize(void* context) { (void)context; }

BROKEN_FN kz_fabric_result_t broken_device_count(void* context, int32_t* count) {
  (void)context;
#ifdef BROKEN_NO_DEVICES
  *count = 0;
#else
  *count = 1;
#endif
  return KZ_FABRIC_OK;
}

BROKEN_FN kz_fabric_result_t broken_device_properties(void* context, int32_t dev, kz_fabric_device_properties_t* p) {
  (void)context, (void)dev;
  kz_fabric_device_properties_t q;
  memset(&q, 0, sizeof q);
  q.struct_size = sizeof q;
  strcpy(q.name, "broken0");
  q.ptr_support = KZ_FABRIC_PTR_HOST;
  q.max_requests = 1;
  q.max_message_bytes = 1u << 20;
  q.numa_node = -1;
#ifdef BROKEN_FD_WITHOUT_REG_MR_FD
  q.ptr_support |= KZ_FABRIC_PTR_FD;
#endif
#ifdef BROKEN_ZERO_MAX_REQUESTS
  q.max_requests = 0;
#endif
  memcpy(p, &q, p->struct_size < sizeof q ? p->struct_size : sizeof q);
  return KZ_FABRIC_OK;
}

BROKEN_FN kz_fabric_result_t broken_listen(void* c, int32_t d, void* h, uint32_t* hs, kz_fabric_listen_comm_t* l) {
  (void)c, (void)d, (void)h, (void)hs, (void)l;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN kz_fabric_result_t broken_connect(void* c, int32_t d, const void* h, uint32_t hs, kz_fabric_connect_state_t* st,
                                         kz_fabric_send_comm_t* s) {
  (void)c, (void)d, (void)h, (void)hs, (void)st, (void)s;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN void broken_connect_abort(void* c, kz_fabric_connect_state_t st) { (void)c, (void)st; }
BROKEN_FN kz_fabric_result_t broken_accept(kz_fabric_listen_comm_t l, kz_fabric_recv_comm_t* r) {
  (void)l, (void)r;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN kz_fabric_result_t broken_close_listen(kz_fabric_listen_comm_t l) {
  (void)l;
  return KZ_FABRIC_OK;
}
BROKEN_FN kz_fabric_result_t broken_reg_mr(kz_fabric_comm_t c, int32_t s, void* d, uint64_t n, int32_t t,
                                        kz_fabric_mr_t* m) {
  (void)c, (void)s, (void)d, (void)n, (void)t, (void)m;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN kz_fabric_result_t broken_dereg_mr(kz_fabric_comm_t c, int32_t s, kz_fabric_mr_t m) {
  (void)c, (void)s, (void)m;
  return KZ_FABRIC_OK;
}
BROKEN_FN kz_fabric_result_t broken_isend(kz_fabric_send_comm_t c, const void* d, uint64_t n, int32_t t, kz_fabric_mr_t m,
                                       kz_fabric_request_t* r) {
  (void)c, (void)d, (void)n, (void)t, (void)m, (void)r;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN kz_fabric_result_t broken_irecv(kz_fabric_recv_comm_t c, void* d, uint64_t n, int32_t t, kz_fabric_mr_t m,
                                       kz_fabric_request_t* r) {
  (void)c, (void)d, (void)n, (void)t, (void)m, (void)r;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN kz_fabric_result_t broken_test(kz_fabric_request_t r, int32_t* done, uint64_t* n) {
  (void)r, (void)done, (void)n;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
BROKEN_FN kz_fabric_result_t broken_close_send(kz_fabric_send_comm_t c) {
  (void)c;
  return KZ_FABRIC_OK;
}
BROKEN_FN kz_fabric_result_t broken_close_recv(kz_fabric_recv_comm_t c) {
  (void)c;
  return KZ_FABRIC_OK;
}
#ifdef BROKEN_HALF_WRITE
BROKEN_FN kz_fabric_result_t broken_expose(kz_fabric_recv_comm_t c, kz_fabric_mr_t m, void* k, uint32_t* ks) {
  (void)c, (void)m, (void)k, (void)ks;
  return KZ_FABRIC_ERR_NOT_SUPPORTED;
}
#endif

static const kz_fabric_plugin_api_t broken_api = {
#ifdef BROKEN_SHORT_TABLE
    .struct_size = offsetof(kz_fabric_plugin_api_t, test),
#else
    .struct_size = sizeof(kz_fabric_plugin_api_t),
#endif
#ifdef BROKEN_API_MAJOR_99
    .api_major = 99,
#else
    .api_major = KZ_FABRIC_PLUGIN_API_MAJOR,
#endif
    .api_minor = KZ_FABRIC_PLUGIN_API_MINOR,
#if defined(BROKEN_BAD_NAME)
    .name = "Broken-Test",
#elif defined(BROKEN_IMPOSTOR)
    .name = "example_tcp",
#else
    .name = "broken_test",
#endif
    .version = "0 (deliberately broken)",
    .last_error = broken_last_error,
    .init = broken_init,
    .finalize = broken_finalize,
    .device_count = broken_device_count,
    .device_properties = broken_device_properties,
    .listen = broken_listen,
    .connect = broken_connect,
    .connect_abort = broken_connect_abort,
    .accept = broken_accept,
    .close_listen = broken_close_listen,
    .reg_mr = broken_reg_mr,
    .dereg_mr = broken_dereg_mr,
    .isend = broken_isend,
    .irecv = broken_irecv,
#ifdef BROKEN_MISSING_FUNCTION
    .test = NULL,
#else
    .test = broken_test,
#endif
    .close_send = broken_close_send,
    .close_recv = broken_close_recv,
#ifdef BROKEN_HALF_WRITE
    .expose = broken_expose,
#endif
};

#ifdef BROKEN_NO_ENTRY_POINT
/* The wrong spelling: kizuna looks for kzFabricPluginGetApi. */
const kz_fabric_plugin_api_t* kzFabricPluginGetAPI(uint32_t major, uint32_t minor);
const kz_fabric_plugin_api_t* kzFabricPluginGetAPI(uint32_t major, uint32_t minor) {
#else
const kz_fabric_plugin_api_t* kzFabricPluginGetApi(uint32_t major, uint32_t minor) {
#endif
  (void)major, (void)minor;
#ifdef BROKEN_NULL_TABLE
  /* The table stays referenced so this variant compiles like the others. */
  return major == 0 && minor == 0xffffffffu ? &broken_api : NULL;
#else
  return &broken_api;
#endif
}
