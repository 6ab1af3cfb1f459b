#include "devices/level_zero/loader.h"

#include <dlfcn.h>
#include <link.h>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::level_zero {
namespace {

// Every ze_result_t enumerator of the 1.4 headers.
#define KZ_ZE_RESULTS(X)                              \
  X(ZE_RESULT_SUCCESS)                                \
  X(ZE_RESULT_NOT_READY)                              \
  X(ZE_RESULT_ERROR_DEVICE_LOST)                      \
  X(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)               \
  X(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)             \
  X(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE)             \
  X(ZE_RESULT_ERROR_MODULE_LINK_FAILURE)              \
  X(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET)            \
  X(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)        \
  X(ZE_RESULT_EXP_ERROR_DEVICE_IS_NOT_VERTEX)         \
  X(ZE_RESULT_EXP_ERROR_VERTEX_IS_NOT_DEVICE)         \
  X(ZE_RESULT_EXP_ERROR_REMOTE_DEVICE)                \
  X(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS)         \
  X(ZE_RESULT_ERROR_NOT_AVAILABLE)                    \
  X(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)           \
  X(ZE_RESULT_WARNING_DROPPED_DATA)                   \
  X(ZE_RESULT_ERROR_UNINITIALIZED)                    \
  X(ZE_RESULT_ERROR_UNSUPPORTED_VERSION)              \
  X(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)              \
  X(ZE_RESULT_ERROR_INVALID_ARGUMENT)                 \
  X(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)              \
  X(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE)             \
  X(ZE_RESULT_ERROR_INVALID_NULL_POINTER)             \
  X(ZE_RESULT_ERROR_INVALID_SIZE)                     \
  X(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)                 \
  X(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT)            \
  X(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT)   \
  X(ZE_RESULT_ERROR_INVALID_ENUMERATION)              \
  X(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION)          \
  X(ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT)         \
  X(ZE_RESULT_ERROR_INVALID_NATIVE_BINARY)            \
  X(ZE_RESULT_ERROR_INVALID_GLOBAL_NAME)              \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_NAME)              \
  X(ZE_RESULT_ERROR_INVALID_FUNCTION_NAME)            \
  X(ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION)     \
  X(ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION)   \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX)    \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE)     \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE)   \
  X(ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED)          \
  X(ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE)        \
  X(ZE_RESULT_ERROR_OVERLAPPING_REGIONS)              \
  X(ZE_RESULT_WARNING_ACTION_REQUIRED)                \
  X(ZE_RESULT_ERROR_UNKNOWN)

}  // namespace

Result<std::unique_ptr<ZeApi>> OpenLoader(const std::string& library) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    return Unavailable(fmt::format("no Level Zero loader: cannot load {} ({})", library, err != nullptr ? err : "?"));
  }
  auto api = std::make_unique<ZeApi>();
  link_map* map = nullptr;
  api->library = ::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr ? map->l_name : library;
  std::string missing;
#define KZ_ZE_LOOKUP(fn)                                                       \
  api->fn = reinterpret_cast<decltype(api->fn)>(::dlsym(handle, #fn));         \
  if (api->fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(#fn);
  KZ_ZE_FUNCTIONS(KZ_ZE_LOOKUP)
#undef KZ_ZE_LOOKUP
#define KZ_ZE_LOOKUP_OPTIONAL(fn) api->fn = reinterpret_cast<decltype(api->fn)>(::dlsym(handle, #fn));
  KZ_ZE_OPTIONAL_FUNCTIONS(KZ_ZE_LOOKUP_OPTIONAL)
#undef KZ_ZE_LOOKUP_OPTIONAL
  if (!missing.empty()) {
    // Nothing of the library is used: close it again (no constructor of ours ran in it).
    const std::string path = api->library;
    ::dlclose(handle);
    return Unavailable(fmt::format("{} is not a Level Zero 1.4 loader: it lacks {}", path, missing));
  }
  return api;
}

Status InitDrivers(const ZeApi& api) {
  const ze_result_t r = api.zeInit(0);
  if (r == ZE_RESULT_SUCCESS) return Status::Ok();
  if (r == ZE_RESULT_ERROR_UNINITIALIZED)
    return Unavailable(fmt::format("zeInit: {} (no Level Zero driver; loader {})", ResultName(r), api.library));
  return Unavailable(fmt::format("zeInit: {} (loader {})", ResultName(r), api.library));
}

Result<const ZeApi*> Loader() {
  static const Result<const ZeApi*> loaded = []() -> Result<const ZeApi*> {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<ZeApi> api, OpenLoader(kLoaderLibrary));
    KZ_RETURN_IF_ERROR(InitDrivers(*api));
    KZ_INFO(kLogDevice, "level_zero: loader {} initialised", api->library);
    return api.release();  // lives as long as the process, like the library
  }();
  return loaded;
}

std::string ResultName(ze_result_t result) {
  switch (result) {
#define KZ_ZE_RESULT_CASE(name) \
  case name:                    \
    return #name;
    KZ_ZE_RESULTS(KZ_ZE_RESULT_CASE)
#undef KZ_ZE_RESULT_CASE
    default:
      return fmt::format("ze_result_t {:#010x}", static_cast<uint32_t>(result));
  }
}

Status ZeError(ze_result_t result, std::string_view what) {
  std::string message = fmt::format("{}: {}", what, ResultName(result));
  switch (result) {
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
      return OutOfMemory(std::move(message));
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER:
    case ZE_RESULT_ERROR_INVALID_SIZE:
    case ZE_RESULT_ERROR_INVALID_ENUMERATION:
    case ZE_RESULT_ERROR_OVERLAPPING_REGIONS:
      return InvalidArgument(std::move(message));
    case ZE_RESULT_ERROR_UNSUPPORTED_VERSION:
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
    case ZE_RESULT_ERROR_UNSUPPORTED_SIZE:
    case ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT:
    case ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION:
      return NotSupported(std::move(message));
    case ZE_RESULT_ERROR_UNINITIALIZED:
      return Unavailable(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

}  // namespace kizuna::level_zero
