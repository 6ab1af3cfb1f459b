#include "devices/cuda/loader.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::cuda {
namespace {

// The symbol a name is bound to by cuda.h's macros: KZ_CUDA_SYMBOL(cuMemAlloc) is "cuMemAlloc_v2".
#define KZ_CUDA_SYMBOL_STR(x) #x
#define KZ_CUDA_SYMBOL(x) KZ_CUDA_SYMBOL_STR(x)

Result<const DriverApi*> Load() {
  static DriverApi api;
  const std::string name = "libcuda.so.1";
  void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = ::dlerror();
    return Unavailable(fmt::format("no CUDA driver: cannot load {} ({})", name, err != nullptr ? err : "?"));
  }
  link_map* map = nullptr;
  api.library = ::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr ? map->l_name : name;
  std::string missing;
#define KZ_CUDA_LOOKUP(fn)                                                          \
  api.fn = reinterpret_cast<decltype(api.fn)>(::dlsym(handle, KZ_CUDA_SYMBOL(fn))); \
  if (api.fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(KZ_CUDA_SYMBOL(fn));
  KZ_CUDA_DRIVER_FUNCTIONS(KZ_CUDA_LOOKUP)
#undef KZ_CUDA_LOOKUP
  if (!missing.empty())
    return Unavailable(fmt::format("the CUDA driver {} is older than the CUDA {} API this build uses: it lacks {}",
                                   api.library, CUDA_VERSION / 1000, missing));
  // Kernels must be loaded before any stream is held: a function loaded lazily at its first launch
  // can wait for the whole context while a held stream waits for that launch (NCCL gives the same
  // advice, CUDA_MODULE_LOADING=EAGER). The backend loads its kernels when it opens a device;
  // eager loading keeps the driver from deferring them. A value the user set is left alone.
  if (std::getenv("CUDA_MODULE_LOADING") == nullptr) {
    ::setenv("CUDA_MODULE_LOADING", "EAGER", 0);
    KZ_INFO(kLogDevice, "cuda: CUDA_MODULE_LOADING=EAGER (kernels load before streams are held)");
  }
  CUresult r = api.cuInit(0);
  if (r != CUDA_SUCCESS) return Unavailable(fmt::format("cuInit failed: {}", ErrorText(api, r)));
  r = api.cuDriverGetVersion(&api.driver_version);
  if (r != CUDA_SUCCESS) return Unavailable(fmt::format("cuDriverGetVersion failed: {}", ErrorText(api, r)));
  if (api.driver_version < CUDA_VERSION)
    return Unavailable(fmt::format("the CUDA driver {} supports CUDA {}.{}, this build needs {}.{}", api.library,
                                   api.driver_version / 1000, api.driver_version % 1000 / 10, CUDA_VERSION / 1000,
                                   CUDA_VERSION % 1000 / 10));
  KZ_INFO(kLogDevice, "cuda: driver {} (CUDA {}.{})", api.library, api.driver_version / 1000,
          api.driver_version % 1000 / 10);
  return &api;
}

}  // namespace

Result<const DriverApi*> Driver() {
  static const Result<const DriverApi*> loaded = Load();
  return loaded;
}

std::string ErrorText(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  if (name == nullptr) return fmt::format("CUDA error {}", static_cast<int>(r));
  return text != nullptr ? fmt::format("{} ({})", name, text) : std::string(name);
}

Status CudaError(const DriverApi& api, CUresult r, std::string_view what) {
  std::string message = fmt::format("{}: {}", what, ErrorText(api, r));
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return OutOfMemory(std::move(message));
    case CUDA_ERROR_INVALID_VALUE:
      return InvalidArgument(std::move(message));
    case CUDA_ERROR_NOT_SUPPORTED:
      return NotSupported(std::move(message));
    default:
      return Internal(std::move(message));
  }
}

ScopedContext::ScopedContext(const DriverApi& api, CUcontext ctx) : api_(api) {
  if (api_.cuCtxGetCurrent(&previous_) != CUDA_SUCCESS) previous_ = nullptr;
  if (previous_ == ctx) return;
  result_ = api_.cuCtxSetCurrent(ctx);
  restore_ = result_ == CUDA_SUCCESS;
}

ScopedContext::~ScopedContext() {
  if (restore_) api_.cuCtxSetCurrent(previous_);
}

}  // namespace kizuna::cuda
