// The CUDA driver API, reached at run time through dlopen("libcuda.so.1"): the project never links
// libcuda, so every binary builds and runs on machines without a driver (the build machines have
// the toolkit's headers only), and the backend then reports "unavailable" with the reason.
//
// Each entry point is looked up under the exact symbol the toolkit's cuda.h binds its name to
// (cuMemAlloc -> cuMemAlloc_v2, cuStreamDestroy -> cuStreamDestroy_v2, ...), so the function
// pointer types come straight from the header's declarations and cannot drift from them. A driver
// older than the toolkit lacks some versioned symbol; the loader then names it.
//
// Threading: Driver() is thread-safe and loads once per process; the table never changes after.
// The library is never unloaded (a driver cannot be unloaded safely while contexts exist).
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna::cuda {

// X(name) for every driver function the backend calls.
#define KZ_CUDA_DRIVER_FUNCTIONS(X)   \
  X(cuInit)                           \
  X(cuDriverGetVersion)               \
  X(cuGetErrorName)                   \
  X(cuGetErrorString)                 \
  X(cuDeviceGetCount)                 \
  X(cuDeviceGet)                      \
  X(cuDeviceGetName)                  \
  X(cuDeviceTotalMem)                 \
  X(cuDeviceGetAttribute)             \
  X(cuDeviceGetPCIBusId)              \
  X(cuDeviceGetUuid)                  \
  X(cuDeviceCanAccessPeer)            \
  X(cuDevicePrimaryCtxRetain)         \
  X(cuDevicePrimaryCtxRelease)        \
  X(cuCtxGetCurrent)                  \
  X(cuCtxSetCurrent)                  \
  X(cuCtxEnablePeerAccess)            \
  X(cuMemGetAllocationGranularity)    \
  X(cuMemCreate)                      \
  X(cuMemRelease)                     \
  X(cuMemAddressReserve)              \
  X(cuMemAddressFree)                 \
  X(cuMemMap)                         \
  X(cuMemUnmap)                       \
  X(cuMemSetAccess)                   \
  X(cuMemExportToShareableHandle)     \
  X(cuMemImportFromShareableHandle)   \
  X(cuMemGetHandleForAddressRange)    \
  X(cuMemHostAlloc)                   \
  X(cuMemFreeHost)                    \
  X(cuMemAllocAsync)                  \
  X(cuMemFreeAsync)                   \
  X(cuPointerGetAttribute)            \
  X(cuStreamCreate)                   \
  X(cuStreamDestroy)                  \
  X(cuStreamGetCtx)                   \
  X(cuStreamQuery)                    \
  X(cuStreamSynchronize)              \
  X(cuStreamWaitEvent)                \
  X(cuStreamAddCallback)              \
  X(cuStreamWaitValue32)              \
  X(cuStreamWriteValue32)             \
  X(cuEventCreate)                    \
  X(cuEventDestroy)                   \
  X(cuEventRecord)                    \
  X(cuEventQuery)                     \
  X(cuMemcpyAsync)                    \
  X(cuModuleLoadData)                 \
  X(cuModuleUnload)                   \
  X(cuModuleGetFunction)              \
  X(cuFuncLoad)                       \
  X(cuLaunchKernel)

// The function table. Members carry the header's names (macros included), so `api.cuMemAlloc`
// reads as the CUDA call it is.
struct DriverApi {
#define KZ_CUDA_DECLARE_MEMBER(name) decltype(&::name) name = nullptr;
  KZ_CUDA_DRIVER_FUNCTIONS(KZ_CUDA_DECLARE_MEMBER)
#undef KZ_CUDA_DECLARE_MEMBER
  int driver_version = 0;  // cuDriverGetVersion: 13000 for CUDA 13.0
  std::string library;     // the path dlopen resolved, for logs
};

// Loads libcuda.so.1 (the driver's soname, found by the dynamic loader's search) and calls
// cuInit(0), once. kUnavailable naming the reason when there is no driver, no symbol, or cuInit
// fails (CUDA_ERROR_NO_DEVICE on a machine without a GPU). The same result every call.
Result<const DriverApi*> Driver();

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
std::string ErrorText(const DriverApi& api, CUresult r);

// A status for a failed call: `what` then the CUDA error. CUDA_ERROR_OUT_OF_MEMORY maps to
// kOutOfMemory, CUDA_ERROR_INVALID_VALUE to kInvalidArgument, CUDA_ERROR_NOT_SUPPORTED to
// kNotSupported, everything else to kInternal.
Status CudaError(const DriverApi& api, CUresult r, std::string_view what);

// Makes `ctx` current on this thread for the scope, restoring the previous one (a framework's
// context stays as it was).
class ScopedContext {
 public:
  ScopedContext(const DriverApi& api, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  bool ok() const { return result_ == CUDA_SUCCESS; }
  CUresult result() const { return result_; }

 private:
  const DriverApi& api_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
  CUresult result_ = CUDA_SUCCESS;
};

}  // namespace kizuna::cuda
