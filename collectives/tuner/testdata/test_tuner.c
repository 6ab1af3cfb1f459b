/* Test tuner plugins for //collectives/tuner:tuner_plugin_test and //tests/tuner. One source, built
 * once per case: exactly one CASE_* macro is defined. The table below is a complete, well-formed
 * api 1.0 table except for that case's defect: a table kizuna must refuse at load or init, or
 * answers it must refuse call by call (the model's choice runs instead). CASE_RHD_4_CHANNELS has
 * no defect: a valid answer that sets every field.
 */
#include <stddef.h>
#include <string.h>

#include "collectives/tuner/kizuna_tuner_plugin.h"

/* Each case leaves some of these out of its table. */
#define TEST_FN static __attribute__((unused))

static int test_context;

TEST_FN const char* test_last_error(void) { return "the test_tuner plugin failed on purpose"; }

TEST_FN kz_tuner_result_t test_init(const kz_tuner_init_args_t* args, void** context) {
  (void)args;
#ifdef CASE_INIT_ERROR
  (void)context, (void)test_context;
  return KZ_TUNER_ERR_INVALID_ARGUMENT;
#else
  *context = &test_context;
  return KZ_TUNER_OK;
#endif
}

TEST_FN void test_finalize(void* context) { (void)context; }

/* The first candidate that cannot serve the call, or -1. */
TEST_FN int32_t first_unsupported(const kz_tuner_call_t* call) {
  for (uint32_t i = 0; i < call->num_candidates; ++i)
    if (!call->candidate_supported[i]) return (int32_t)i;
  return -1;
}

TEST_FN kz_tuner_result_t test_get_coll_info(void* context, const kz_tuner_call_t* call,
                                            kz_tuner_decision_t* decision) {
  (void)context, (void)call;
#if defined(CASE_ERROR_CODE)
  (void)decision;
  return KZ_TUNER_ERR_INTERNAL;
#elif defined(CASE_UNKNOWN_CODE)
  (void)decision;
  return 77;
#elif defined(CASE_BAD_INDEX)
  decision->candidate = (int32_t)call->num_candidates; /* one past the end */
#elif defined(CASE_NEGATIVE_INDEX)
  decision->candidate = -1;
#elif defined(CASE_UNKNOWN_NAME)
  decision->algorithm = "warp_drive";
#elif defined(CASE_UNSUPPORTED)
  /* By index, and with it a valid chunk and channel count: the choice alone is wrong. */
  decision->candidate = first_unsupported(call);
  decision->channels = 1;
#elif defined(CASE_CHUNK_ZERO)
  decision->chunk_bytes = 0;
#elif defined(CASE_CHUNK_HUGE)
  decision->chunk_bytes = UINT64_C(1) << 40;
#elif defined(CASE_CHANNELS_NEGATIVE)
  decision->channels = -3;
#elif defined(CASE_CHANNELS_HUGE)
  decision->channels = 1 << 20;
#elif defined(CASE_RHD_4_CHANNELS)
  /* rhd by index where it can serve the call, 4 channels, chunks of at most 64 KiB. */
  for (uint32_t i = 0; i < call->num_candidates; ++i)
    if (strcmp(call->candidate_names[i], "rhd") == 0 && call->candidate_supported[i]) decision->candidate = (int32_t)i;
  decision->channels = 4;
  if (decision->chunk_bytes > (UINT64_C(64) << 10)) decision->chunk_bytes = UINT64_C(64) << 10;
#else
  (void)decision;
#endif
  return KZ_TUNER_OK;
}

static const kz_tuner_plugin_api_t test_api __attribute__((unused)) = {
    .struct_size =
#ifdef CASE_SHORT_TABLE
        offsetof(kz_tuner_plugin_api_t, last_error),
#else
        sizeof(kz_tuner_plugin_api_t),
#endif
#ifdef CASE_API_MAJOR_99
    .api_major = 99,
#else
    .api_major = KZ_TUNER_PLUGIN_API_MAJOR,
#endif
    .api_minor = KZ_TUNER_PLUGIN_API_MINOR,
#ifdef CASE_BAD_NAME
    .name = "Broken Tuner!",
#else
    .name = "test_tuner",
#endif
    .version = "0.0.1",
    .last_error = test_last_error,
    .init = test_init,
    .finalize = test_finalize,
#ifdef CASE_MISSING_FUNCTION
    .get_coll_info = NULL,
#else
    .get_coll_info = test_get_coll_info,
#endif
};

#ifdef CASE_NO_ENTRY_POINT
/* The wrong spelling: kizuna looks for kzTunerPluginGetApi. */
const kz_tuner_plugin_api_t* kzTunerPluginGetAPI(uint32_t major, uint32_t minor);
const kz_tuner_plugin_api_t* kzTunerPluginGetAPI(uint32_t major, uint32_t minor) {
#else
const kz_tuner_plugin_api_t* kzTunerPluginGetApi(uint32_t major, uint32_t minor) {
#endif
  (void)major, (void)minor;
#ifdef CASE_NULL_TABLE
  return NULL;
#else
  return &test_api;
#endif
}
