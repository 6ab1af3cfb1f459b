// The Level Zero API, reached at run time through dlopen("libze_loader.so.1"): the project never
// links the loader, so every binary builds and runs on machines without it, and the backend then
// reports "unavailable" with the reason.
//
// Built against Debian's loader headers (libze-dev 1.8, API spec 1.4: no zeInitDrivers, no
// zeCommandListHostSynchronize, no zeMemPutIpcHandle). Each entry point's pointer type comes
// straight from the header's declaration (decltype), so the table cannot drift from it.
//
// Two steps, kept apart so that both can be tested on a machine without a driver:
//  - OpenLoader(library) loads a library and looks up every function; kUnavailable naming the
//    library when dlopen fails, or naming every missing symbol.
//  - InitDrivers(api) calls zeInit(0); kUnavailable naming the ze_result_t when it fails. With the
//    loader but no driver, zeInit returns ZE_RESULT_ERROR_UNINITIALIZED (loader 1.8).
// Loader() does both once per process for "libze_loader.so.1".
//
// Threading: Loader() is thread-safe and loads once; the table never changes after. The library
// is never unloaded (drivers do not support it while contexts exist).
#pragma once

#include <level_zero/ze_api.h>

#include <memory>
#include <string>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna::level_zero {

// The loader's soname (Debian's libze1; Intel's packages ship the same name).
inline constexpr char kLoaderLibrary[] = "libze_loader.so.1";

// X(name) for every Level Zero function the backend requires.
#define KZ_ZE_FUNCTIONS(X)                  \
  X(zeInit)                                 \
  X(zeDriverGet)                            \
  X(zeDriverGetApiVersion)                  \
  X(zeDriverGetProperties)                  \
  X(zeDriverGetIpcProperties)               \
  X(zeDeviceGet)                            \
  X(zeDeviceGetProperties)                  \
  X(zeDeviceGetMemoryProperties)            \
  X(zeDeviceGetExternalMemoryProperties)    \
  X(zeDeviceGetCommandQueueGroupProperties) \
  X(zeContextCreate)                        \
  X(zeContextDestroy)                       \
  X(zeCommandListCreateImmediate)           \
  X(zeCommandListDestroy)                   \
  X(zeCommandListAppendMemoryCopy)          \
  X(zeCommandListAppendBarrier)             \
  X(zeEventPoolCreate)                      \
  X(zeEventPoolDestroy)                     \
  X(zeEventCreate)                          \
  X(zeEventDestroy)                         \
  X(zeEventQueryStatus)                     \
  X(zeEventHostReset)                       \
  X(zeMemAllocDevice)                       \
  X(zeMemAllocHost)                         \
  X(zeMemFree)                              \
  X(zeMemGetAllocProperties)                \
  X(zeMemGetAddressRange)                   \
  X(zeMemGetIpcHandle)                      \
  X(zeMemOpenIpcHandle)                     \
  X(zeMemCloseIpcHandle)

// X(name) for functions used when present (an extension an older loader may lack).
#define KZ_ZE_OPTIONAL_FUNCTIONS(X) X(zeDevicePciGetPropertiesExt)

// The function table. Members carry the API's names, so `api.zeMemAllocDevice(...)` reads as the
// call it is.
struct ZeApi {
#define KZ_ZE_DECLARE_MEMBER(name) decltype(&::name) name = nullptr;
  KZ_ZE_FUNCTIONS(KZ_ZE_DECLARE_MEMBER)
  KZ_ZE_OPTIONAL_FUNCTIONS(KZ_ZE_DECLARE_MEMBER)
#undef KZ_ZE_DECLARE_MEMBER
  std::string library;  // the path dlopen resolved, for logs
};

// dlopen(library) and dlsym of every function of KZ_ZE_FUNCTIONS (and, where present,
// KZ_ZE_OPTIONAL_FUNCTIONS). kUnavailable "cannot load <library> (<dlerror>)" or "<library> lacks
// <names>" (every missing required symbol). Calls nothing in the library. The handle is kept open
// for the life of the process.
Result<std::unique_ptr<ZeApi>> OpenLoader(const std::string& library);

// zeInit(0): ok, or kUnavailable "zeInit: <result name>" — with "(no Level Zero driver)" added for
// ZE_RESULT_ERROR_UNINITIALIZED, which is what the loader answers when no driver is installed.
Status InitDrivers(const ZeApi& api);

// OpenLoader(kLoaderLibrary) then InitDrivers, once per process; the same result every call.
Result<const ZeApi*> Loader();

// The enumerator's name: "ZE_RESULT_ERROR_UNINITIALIZED"; "ze_result_t 0x12345678" for a value
// the 1.4 headers do not define.
std::string ResultName(ze_result_t result);

// A status for a failed call: "<what>: <result name>". Out of device or host memory map to
// kOutOfMemory; invalid argument, null pointer, size and enumeration errors to kInvalidArgument;
// unsupported feature / size / alignment / enumeration / version to kNotSupported;
// ZE_RESULT_ERROR_UNINITIALIZED to kUnavailable; everything else (device lost, unknown, ...) to
// kInternal.
Status ZeError(ze_result_t result, std::string_view what);

}  // namespace kizuna::level_zero
