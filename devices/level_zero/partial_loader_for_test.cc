// A shared library that looks like the start of a Level Zero loader: it exports zeInit and
// zeDriverGet and nothing else, so loader_test can check that OpenLoader names exactly the
// missing functions (and closes the library again).
#include <level_zero/ze_api.h>

extern "C" {

ZE_APIEXPORT ze_result_t ZE_APICALL zeInit(ze_init_flags_t) { return ZE_RESULT_ERROR_UNINITIALIZED; }

ZE_APIEXPORT ze_result_t ZE_APICALL zeDriverGet(uint32_t* count, ze_driver_handle_t*) {
  if (count != nullptr) *count = 0;
  return ZE_RESULT_SUCCESS;
}

}  // extern "C"
