/* The example fabric plugin's entry point, api table, context and its one device.
 *
 * kizuna calls kzFabricPluginGetApi once after dlopen, checks the table, then init once per fabric
 * it creates (one per rank; contexts share nothing); finalize comes after every comm of a context
 * has been closed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_fabric.h"

#define XF_NAME "example_tcp"
#define XF_VERSION "1.0.0 (TCP over 127.0.0.1, host memory)"

/* The ABI makes last_error per thread: a message belongs to the failing call on this thread. */
static _Thread_local char xf_last_error_text[512];

kz_fabric_result_t xf_error(kz_fabric_result_t code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(xf_last_error_text, sizeof xf_last_error_text, format, args);
  va_end(args);
  return code;
}

const char* xf_last_error(void) { return xf_last_error_text; }

int xf_expired(const struct timespec* started, uint64_t timeout_ns) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t elapsed = (int64_t)(now.tv_sec - started->tv_sec) * 1000000000 + (now.tv_nsec - started->tv_nsec);
  return elapsed >= 0 && (uint64_t)elapsed >= timeout_ns;
}

static kz_fabric_result_t xf_init(const kz_fabric_init_args_t* args, void** context) {
  if (args == NULL || context == NULL) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "init: null argument");
  xf_context_t* ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return xf_error(KZ_FABRIC_ERR_OUT_OF_MEMORY, "init: out of memory");
  ctx->magic = XF_CONTEXT_MAGIC;
  /* Older hosts may pass a shorter struct: read timeout_ns only when it is there. */
  const size_t timeout_end = offsetof(kz_fabric_init_args_t, timeout_ns) + sizeof args->timeout_ns;
  ctx->timeout_ns = args->struct_size >= timeout_end && args->timeout_ns > 0 ? args->timeout_ns
                                                                             : UINT64_C(600) * 1000000000;
  *context = ctx;
  return KZ_FABRIC_OK;
}

static void xf_finalize(void* context) {
  xf_context_t* ctx = context;
  if (ctx == NULL || ctx->magic != XF_CONTEXT_MAGIC) return;
  ctx->magic = 0;
  free(ctx);
}

static kz_fabric_result_t xf_check_context(void* context) {
  const xf_context_t* ctx = context;
  if (ctx == NULL || ctx->magic != XF_CONTEXT_MAGIC)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "context %p is not an example_tcp context", context);
  return KZ_FABRIC_OK;
}

static kz_fabric_result_t xf_device_count(void* context, int32_t* count) {
  kz_fabric_result_t rc = xf_check_context(context);
  if (rc != KZ_FABRIC_OK) return rc;
  *count = 1; /* the loopback interface */
  return KZ_FABRIC_OK;
}

static kz_fabric_result_t xf_device_properties(void* context, int32_t dev, kz_fabric_device_properties_t* props) {
  kz_fabric_result_t rc = xf_check_context(context);
  if (rc != KZ_FABRIC_OK) return rc;
  if (dev != 0) return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "device %d out of range (1 device)", dev);
  if (props == NULL || props->struct_size < offsetof(kz_fabric_device_properties_t, max_message_bytes) +
                                                sizeof props->max_message_bytes)
    return xf_error(KZ_FABRIC_ERR_INVALID_ARGUMENT, "device_properties: the host's struct is too small");
  kz_fabric_device_properties_t p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  snprintf(p.name, sizeof p.name, "lo:127.0.0.1");
  p.speed_gbps = 0; /* loopback: memory speed, not a link; unknown */
  p.latency_us = 0;
  p.ptr_support = KZ_FABRIC_PTR_HOST;
  /* Payload passes through the kernel's socket buffers. */
  p.flags = KZ_FABRIC_DEVICE_STAGED;
  p.max_requests = XF_MAX_REQUESTS;
  p.numa_node = -1;
  p.max_message_bytes = XF_MAX_MESSAGE_BYTES;
  /* Fill only what both sides know (the host's struct may be older or newer than ours). */
  const size_t n = props->struct_size < sizeof p ? props->struct_size : sizeof p;
  memcpy(props, &p, n);
  props->struct_size = n;
  return KZ_FABRIC_OK;
}

static const kz_fabric_plugin_api_t xf_api = {
    .struct_size = sizeof(kz_fabric_plugin_api_t),
    .api_major = KZ_FABRIC_PLUGIN_API_MAJOR,
    .api_minor = KZ_FABRIC_PLUGIN_API_MINOR,
    .name = XF_NAME,
    .version = XF_VERSION,
    .last_error = xf_last_error,
    .init = xf_init,
    .finalize = xf_finalize,
    .device_count = xf_device_count,
    .device_properties = xf_device_properties,
    .listen = xf_listen,
    .connect = xf_connect,
    .connect_abort = xf_connect_abort,
    .accept = xf_accept,
    .close_listen = xf_close_listen,
    .reg_mr = xf_reg_mr,
    .dereg_mr = xf_dereg_mr,
    .isend = xf_isend,
    .irecv = xf_irecv,
    .test = xf_test,
    .close_send = xf_close_send,
    .close_recv = xf_close_recv,
    .wait = xf_wait,
    .wait_acceptable = xf_wait_acceptable,
    /* No fd registration, no flush, no one-sided writes: the ABI's optional entries stay NULL. */
    .reg_mr_fd = NULL,
    .flush = NULL,
    .expose = NULL,
    .iwrite = NULL,
    .poll_immediate = NULL,
};

/* The only exported symbol (the library is built with -fvisibility=hidden). */
__attribute__((visibility("default"))) const kz_fabric_plugin_api_t* kzFabricPluginGetApi(uint32_t host_api_major,
                                                                                          uint32_t host_api_minor) {
  (void)host_api_minor; /* any 1.x host reads the 1.0 table */
  return host_api_major == KZ_FABRIC_PLUGIN_API_MAJOR ? &xf_api : NULL;
}
