/* The example tuner plugin: ring, with chunks of at most 256 KiB, for every collective of 1 MiB or
 * more that ring can serve; below that, or where ring cannot serve the call, the cost model's
 * choice stays.
 *
 * A deterministic rule, as the ABI requires: the answer depends on the call alone (its size and the
 * candidates), the same on every rank. kizuna calls init once per communicator and finalize when
 * it is destroyed; get_coll_info when it plans a call (README.md).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/tuner/kizuna_tuner_plugin.h"

#define XT_NAME "example_ring"
#define XT_VERSION "1.0.0"
#define XT_RING_FROM_BYTES (UINT64_C(1) << 20)
#define XT_RING_CHUNK_BYTES (UINT64_C(256) << 10)
#define XT_CONTEXT_MAGIC 0x78744b5au /* "ZKtx" */

/* The ABI makes last_error per thread: a message belongs to the failing call on this thread. */
static _Thread_local char xt_last_error_text[512];

static kz_tuner_result_t xt_error(kz_tuner_result_t code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(xt_last_error_text, sizeof xt_last_error_text, format, args);
  va_end(args);
  return code;
}

static const char* xt_last_error(void) { return xt_last_error_text; }

typedef struct xt_context {
  uint32_t magic;
  int32_t nranks;
  int32_t nhosts;
} xt_context_t;

/* A field is there when the struct, as its writer built it, reaches the field's end. */
#define XT_HAS(ptr, type, field) ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

static kz_tuner_result_t xt_init(const kz_tuner_init_args_t* args, void** context) {
  if (args == NULL || context == NULL) return xt_error(KZ_TUNER_ERR_INVALID_ARGUMENT, "init: null argument");
  if (!XT_HAS(args, kz_tuner_init_args_t, log_context))
    return xt_error(KZ_TUNER_ERR_INVALID_ARGUMENT, "init: the host's arguments (%zu bytes) are too short",
                    args->struct_size);
  xt_context_t* ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return xt_error(KZ_TUNER_ERR_OUT_OF_MEMORY, "init: out of memory");
  ctx->magic = XT_CONTEXT_MAGIC;
  ctx->nranks = args->nranks;
  ctx->nhosts = args->nhosts;
  if (args->rank == 0) {
    char line[256];
    snprintf(line, sizeof line, "ring for calls of %llu bytes or more on %d ranks over %d host(s)",
             (unsigned long long)XT_RING_FROM_BYTES, (int)args->nranks, (int)args->nhosts);
    args->log(args->log_context, KZ_TUNER_LOG_INFO, line);
  }
  *context = ctx;
  return KZ_TUNER_OK;
}

static void xt_finalize(void* context) {
  xt_context_t* ctx = context;
  if (ctx == NULL || ctx->magic != XT_CONTEXT_MAGIC) return;
  ctx->magic = 0;
  free(ctx);
}

static kz_tuner_result_t xt_get_coll_info(void* context, const kz_tuner_call_t* call, kz_tuner_decision_t* decision) {
  const xt_context_t* ctx = context;
  if (ctx == NULL || ctx->magic != XT_CONTEXT_MAGIC)
    return xt_error(KZ_TUNER_ERR_INVALID_ARGUMENT, "context %p is not an example_ring context", context);
  if (call == NULL || decision == NULL) return xt_error(KZ_TUNER_ERR_INVALID_ARGUMENT, "get_coll_info: null argument");
  if (!XT_HAS(call, kz_tuner_call_t, candidate_predicted_us) || !XT_HAS(decision, kz_tuner_decision_t, channels))
    return xt_error(KZ_TUNER_ERR_INVALID_ARGUMENT, "get_coll_info: the host's structs are too short");
  if (call->bytes < XT_RING_FROM_BYTES) return KZ_TUNER_OK; /* the model's choice */
  for (uint32_t i = 0; i < call->num_candidates; ++i) {
    if (strcmp(call->candidate_names[i], "ring") != 0) continue;
    if (!call->candidate_supported[i]) return KZ_TUNER_OK; /* ring cannot serve this call */
    decision->algorithm = "ring";
    if (decision->chunk_bytes > XT_RING_CHUNK_BYTES) decision->chunk_bytes = XT_RING_CHUNK_BYTES;
    return KZ_TUNER_OK;
  }
  return KZ_TUNER_OK; /* no ring in this kizuna */
}

static const kz_tuner_plugin_api_t xt_api = {
    .struct_size = sizeof(kz_tuner_plugin_api_t),
    .api_major = KZ_TUNER_PLUGIN_API_MAJOR,
    .api_minor = KZ_TUNER_PLUGIN_API_MINOR,
    .name = XT_NAME,
    .version = XT_VERSION,
    .last_error = xt_last_error,
    .init = xt_init,
    .finalize = xt_finalize,
    .get_coll_info = xt_get_coll_info,
};

/* The only exported symbol (the library is built with -fvisibility=hidden). */
__attribute__((visibility("default"))) const kz_tuner_plugin_api_t* kzTunerPluginGetApi(uint32_t host_api_major,
                                                                                        uint32_t host_api_minor) {
  (void)host_api_minor; /* any 1.x host reads the 1.0 table */
  return host_api_major == KZ_TUNER_PLUGIN_API_MAJOR ? &xt_api : NULL;
}
