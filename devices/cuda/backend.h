// The CUDA device backend (README.md): NVIDIA GPUs through the driver API, reached with dlopen
// (loader.h). Registered as the built-in backend `cuda` (needs hardware: on a machine without a
// driver or GPU its factory answers kUnavailable with the reason and its tests skip).
//
// A CudaDevice is one GPU seen through its primary context (the context the CUDA runtime and
// frameworks use, so memory and streams interoperate with theirs). Memory: memory.cc (cuMem* VMM
// allocations exportable as POSIX fds and DMA-BUF, pinned host memory); streams, events and
// kernels: stream.cc.
#pragma once

#include <cuda.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "devices/cuda/loader.h"
#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna::cuda {

// Creates the backend: kUnavailable when there is no driver, cuInit fails or no GPU is visible.
Result<std::unique_ptr<device::Backend>> CreateCudaBackend(const Config& config);

// The live allocations, imports and host allocations of one backend instance as [start, end)
// ranges: the fast answer to Device::Addressable before asking the driver.
class AddressRanges {
 public:
  void Insert(const void* start, size_t bytes);
  void Erase(const void* start);
  bool Contains(const void* ptr, size_t bytes) const;

 private:
  mutable std::shared_mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_;  // start -> end (exclusive); guarded by mu_
};

// What a device shares with its buffers, streams and events, which may outlive it: the primary
// context stays retained until the last of them is gone.
struct DeviceCore {
  DeviceCore(const DriverApi& api, CUdevice dev, CUcontext ctx, int index, std::shared_ptr<AddressRanges> ranges)
      : api(api), dev(dev), ctx(ctx), index(index), ranges(std::move(ranges)) {}
  ~DeviceCore() { api.cuDevicePrimaryCtxRelease(dev); }
  DeviceCore(const DeviceCore&) = delete;
  DeviceCore& operator=(const DeviceCore&) = delete;

  const DriverApi& api;
  const CUdevice dev;
  const CUcontext ctx;
  const int index;
  const std::shared_ptr<AddressRanges> ranges;  // backend-wide
};

// The kernels of kernel_abi.h, loaded into one device's context on first use.
struct KernelTable {
  CUmodule module = nullptr;
  std::array<std::array<CUfunction, kNumReduceOps>, kNumDataTypes> reduce{};
  std::array<CUfunction, kNumDataTypes> scale{};
};

class CudaDevice final : public device::Device {
 public:
  struct Attributes {
    int sm_count = 0;
    int cc_major = 0, cc_minor = 0;
    bool vmm = false;             // cuMemCreate / cuMemMap
    bool posix_fd = false;        // POSIX-fd handles for cuMemCreate allocations
    bool rdma_vmm = false;        // the gpuDirectRDMACapable flag of cuMemCreate
    bool dmabuf = false;          // cuMemGetHandleForAddressRange(DMA_BUF_FD)
    size_t granularity = 0;       // recommended cuMemCreate granularity
  };

  CudaDevice(std::shared_ptr<DeviceCore> core, device::DeviceProperties properties, Attributes attributes,
             const Config* config);
  ~CudaDevice() override;

  const DriverApi& api() const { return core_->api; }
  CUcontext context() const { return core_->ctx; }
  CUdevice cu_device() const { return core_->dev; }
  const std::shared_ptr<DeviceCore>& core() const { return core_; }
  const Attributes& attributes() const { return attributes_; }

  // Every device of the backend (set once by the backend after creation): the devices that may
  // be given access to an allocation (cuMemSetAccess) are this one and its peers.
  void SetSiblings(std::vector<CudaDevice*> siblings) { siblings_ = std::move(siblings); }

  // The kernels, loaded on first use (cuModuleLoadData of the embedded fatbin); an error names
  // the device's compute capability when the fatbin has no code for it.
  Result<const KernelTable*> Kernels();

  // Inside a live allocation, import or host allocation of this backend, or memory the driver
  // knows (cudaMalloc'd, pinned or registered host memory of the application).
  bool Addressable(const void* ptr, size_t bytes) const override;

 protected:
  Result<std::unique_ptr<device::Buffer>> DoAllocate(size_t bytes) override;
  Result<std::unique_ptr<device::Buffer>> DoAllocateHost(size_t bytes) override;
  Result<std::unique_ptr<device::Stream>> DoCreateStream() override;
  Result<std::unique_ptr<device::Stream>> DoAdoptStream(void* native) override;
  Result<std::unique_ptr<device::Event>> DoCreateEvent() override;
  Result<device::ExportedMemory> DoExport(const device::Buffer& buffer, size_t offset, size_t size) override;
  Result<device::ExportedMemory> DoExportDmaBuf(const device::Buffer& buffer, size_t offset, size_t size) override;
  Result<std::unique_ptr<device::Buffer>> DoImport(const device::ExportedMemory& exported) override;

 private:
  // The access descriptors for memory located on `owner` (this device when null): every sibling
  // that is the owner or can access it as a peer.
  std::vector<CUmemAccessDesc> AccessFor(CUdevice owner) const;
  Result<std::unique_ptr<device::Buffer>> MapHandle(CUmemGenericAllocationHandle handle, size_t map_bytes,
                                                    size_t offset, size_t size, bool imported, CUdevice owner);

  std::shared_ptr<DeviceCore> core_;
  Attributes attributes_;
  std::vector<CudaDevice*> siblings_;
  std::once_flag kernels_once_;
  Status kernels_status_;
  KernelTable kernels_;
};

}  // namespace kizuna::cuda
