// Device memory of the CUDA backend.
//
// Device allocations use the virtual memory management API: cuMemCreate (with POSIX-fd handles
// requested where the device supports them, and the GPUDirect RDMA flag where it supports that),
// cuMemAddressReserve + cuMemMap, cuMemSetAccess for this device and its peers. So every
// allocation can be
//  - exported to another process as a POSIX fd (cuMemExportToShareableHandle) that travels over a
//    Unix socket (SCM_RIGHTS) and is mapped there (cuMemImportFromShareableHandle): several ranks
//    in several processes share one GPU's memory this way;
//  - exported as a DMA-BUF fd (cuMemGetHandleForAddressRange) for an RDMA NIC to register.
// Sizes are rounded up to the allocation granularity (2 MiB on current GPUs); the buffer reports
// the size asked for.
//
// Host memory (AllocateHost) is cuMemHostAlloc(PORTABLE | DEVICEMAP): pinned, mapped into every
// context, at the same address for the CPU and the GPU (unified addressing), so streams copy to
// and from it and kernels read it directly.
#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "devices/cuda/backend.h"
#include "runtime/core/logging.h"

namespace kizuna::cuda {
namespace {

size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

enum class BufferKind : uint8_t { kDevice, kImported, kHost };

class CudaBuffer final : public device::Buffer {
 public:
  CudaBuffer(CudaDevice* device, std::shared_ptr<DeviceCore> core, void* data, size_t size, BufferKind kind,
             CUmemGenericAllocationHandle handle, CUdeviceptr base, size_t mapped)
      : Buffer(device, data, size, kind == BufferKind::kImported),
        core_(std::move(core)),
        kind_(kind),
        handle_(handle),
        base_(base),
        mapped_(mapped) {
    if (data != nullptr) core_->ranges->Insert(data, size);
  }
  ~CudaBuffer() override {
    if (data() == nullptr) return;
    core_->ranges->Erase(data());
    const DriverApi& api = core_->api;
    if (kind_ == BufferKind::kHost) {
      ScopedContext scope(api, core_->ctx);
      if (CUresult r = api.cuMemFreeHost(data()); r != CUDA_SUCCESS)
        KZ_WARN(kLogDevice, "cuda:{}: cuMemFreeHost failed: {}", core_->index, ErrorText(api, r));
      return;
    }
    // The VMM calls need no current context.
    if (CUresult r = api.cuMemUnmap(base_, mapped_); r != CUDA_SUCCESS)
      KZ_WARN(kLogDevice, "cuda:{}: cuMemUnmap failed: {}", core_->index, ErrorText(api, r));
    api.cuMemAddressFree(base_, mapped_);
    api.cuMemRelease(handle_);
  }

  BufferKind kind() const { return kind_; }
  CUmemGenericAllocationHandle handle() const { return handle_; }
  CUdeviceptr base() const { return base_; }
  size_t mapped() const { return mapped_; }

 private:
  std::shared_ptr<DeviceCore> core_;
  BufferKind kind_;
  CUmemGenericAllocationHandle handle_;
  CUdeviceptr base_;
  size_t mapped_;
};

}  // namespace

// ---- AddressRanges ----

void AddressRanges::Insert(const void* start, size_t bytes) {
  std::unique_lock lock(mu_);
  const auto s = reinterpret_cast<uintptr_t>(start);
  ranges_[s] = s + bytes;
}

void AddressRanges::Erase(const void* start) {
  std::unique_lock lock(mu_);
  ranges_.erase(reinterpret_cast<uintptr_t>(start));
}

bool AddressRanges::Contains(const void* ptr, size_t bytes) const {
  std::shared_lock lock(mu_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return false;
  --it;
  return p >= it->first && p <= it->second && bytes <= it->second - p;
}

// ---- CudaDevice: memory ----

bool CudaDevice::Addressable(const void* ptr, size_t bytes) const {
  if (core_->ranges->Contains(ptr, bytes)) return true;
  // Memory the application allocated itself (cudaMalloc, cudaMallocHost, cudaHostRegister): the
  // driver knows both ends of the range.
  const DriverApi& a = api();
  auto known = [&](const void* p) {
    unsigned int type = 0;
    return a.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS;
  };
  if (!known(ptr)) return false;
  return bytes <= 1 || known(static_cast<const uint8_t*>(ptr) + bytes - 1);
}

std::vector<CUmemAccessDesc> CudaDevice::AccessFor(CUdevice owner) const {
  std::vector<CUmemAccessDesc> descs;
  auto grant = [&](CUdevice d) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    descs.push_back(desc);
  };
  grant(cu_device());
  for (const CudaDevice* s : siblings_) {
    if (s == this) continue;
    int can = 0;
    if (s->cu_device() == owner || (api().cuDeviceCanAccessPeer(&can, s->cu_device(), owner) == CUDA_SUCCESS && can))
      grant(s->cu_device());
  }
  return descs;
}

Result<std::unique_ptr<device::Buffer>> CudaDevice::MapHandle(CUmemGenericAllocationHandle handle, size_t map_bytes,
                                                              size_t offset, size_t size, bool imported,
                                                              CUdevice owner) {
  const DriverApi& a = api();
  CUdeviceptr base = 0;
  CUresult r = a.cuMemAddressReserve(&base, map_bytes, attributes_.granularity, 0, 0);
  if (r != CUDA_SUCCESS) {
    a.cuMemRelease(handle);
    return CudaError(a, r, fmt::format("{}: reserving {} bytes of address space", label(), map_bytes));
  }
  r = a.cuMemMap(base, map_bytes, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    a.cuMemAddressFree(base, map_bytes);
    a.cuMemRelease(handle);
    return CudaError(a, r, fmt::format("{}: mapping {} bytes", label(), map_bytes));
  }
  const std::vector<CUmemAccessDesc> access = AccessFor(owner);
  r = a.cuMemSetAccess(base, map_bytes, access.data(), access.size());
  if (r != CUDA_SUCCESS) {
    a.cuMemUnmap(base, map_bytes);
    a.cuMemAddressFree(base, map_bytes);
    a.cuMemRelease(handle);
    return CudaError(a, r, fmt::format("{}: granting access to {} bytes", label(), map_bytes));
  }
  void* data = reinterpret_cast<void*>(base + offset);
  return std::unique_ptr<device::Buffer>(new CudaBuffer(this, core_, data, size,
                                                        imported ? BufferKind::kImported : BufferKind::kDevice,
                                                        handle, base, map_bytes));
}

Result<std::unique_ptr<device::Buffer>> CudaDevice::DoAllocate(size_t bytes) {
  if (bytes == 0)
    return std::unique_ptr<device::Buffer>(new CudaBuffer(this, core_, nullptr, 0, BufferKind::kDevice, 0, 0, 0));
  if (bytes > properties_.memory_bytes)
    return OutOfMemory(fmt::format("{}: {} bytes requested, the device has {} bytes", label(), bytes,
                                   properties_.memory_bytes));
  const size_t map_bytes = RoundUp(bytes, attributes_.granularity);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = cu_device();
  prop.requestedHandleTypes =
      attributes_.posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  prop.allocFlags.gpuDirectRDMACapable = attributes_.rdma_vmm ? 1 : 0;
  CUmemGenericAllocationHandle handle = 0;
  const DriverApi& a = api();
  ScopedContext scope(a, context());
  CUresult r = a.cuMemCreate(&handle, map_bytes, &prop, 0);
  if (r != CUDA_SUCCESS) {
    Status s = CudaError(a, r, fmt::format("{}: allocating {} bytes", label(), bytes));
    // Running out of device memory is kOutOfMemory whatever the driver's code for it.
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_INVALID_VALUE) return OutOfMemory(s.message());
    return s;
  }
  return MapHandle(handle, map_bytes, 0, bytes, /*imported=*/false, cu_device());
}

Result<std::unique_ptr<device::Buffer>> CudaDevice::DoAllocateHost(size_t bytes) {
  if (bytes == 0)
    return std::unique_ptr<device::Buffer>(new CudaBuffer(this, core_, nullptr, 0, BufferKind::kHost, 0, 0, 0));
  ScopedContext scope(api(), context());
  void* p = nullptr;
  CUresult r = api().cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    Status s = CudaError(api(), r, fmt::format("{}: allocating {} bytes of pinned host memory", label(), bytes));
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_INVALID_VALUE) return OutOfMemory(s.message());
    return s;
  }
  return std::unique_ptr<device::Buffer>(new CudaBuffer(this, core_, p, bytes, BufferKind::kHost, 0, 0, bytes));
}

Result<device::ExportedMemory> CudaDevice::DoExport(const device::Buffer& buffer, size_t offset, size_t size) {
  const auto& b = static_cast<const CudaBuffer&>(buffer);
  if (b.kind() == BufferKind::kHost)
    return NotSupported(fmt::format("{}: host memory from AllocateHost cannot be exported", label()));
  ScopedContext scope(api(), context());
  int fd = -1;
  CUresult r = api().cuMemExportToShareableHandle(&fd, b.handle(), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return CudaError(api(), r, fmt::format("{}: exporting {} bytes as a POSIX fd", label(), size));
  device::ExportedMemory e;
  e.kind = device::ExportKind::kFd;
  e.fd = UniqueFd(fd);
  // Where the region starts within the allocation (the importer maps the allocation from 0).
  e.offset = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(b.data()) - b.base()) + offset;
  return e;
}

Result<device::ExportedMemory> CudaDevice::DoExportDmaBuf(const device::Buffer& buffer, size_t offset, size_t size) {
  const auto& b = static_cast<const CudaBuffer&>(buffer);
  if (b.kind() == BufferKind::kHost)
    return NotSupported(fmt::format("{}: host memory from AllocateHost is not exported as DMA-BUF", label()));
  // The range handed to the driver must be page aligned; the mapping is granularity aligned, so
  // widening the region to whole pages stays inside it.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(b.data()) + offset;
  const uintptr_t lo = start / page * page;
  const uintptr_t hi = (start + size + page - 1) / page * page;
  ScopedContext scope(api(), context());  // the range lookup needs a current context
  int fd = -1;
  CUresult r = api().cuMemGetHandleForAddressRange(&fd, static_cast<CUdeviceptr>(lo), hi - lo,
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS)
    return CudaError(api(), r, fmt::format("{}: exporting [{:#x}, +{}) as DMA-BUF", label(), lo, hi - lo));
  device::ExportedMemory e;
  e.fd = UniqueFd(fd);
  e.offset = start - lo;
  KZ_INFO(kLogDevice, "{}: DMA-BUF fd for {} bytes (region at offset {} of a {}-byte DMA-BUF)", label(), size,
          e.offset, hi - lo);
  return e;
}

Result<std::unique_ptr<device::Buffer>> CudaDevice::DoImport(const device::ExportedMemory& exported) {
  if (exported.kind != device::ExportKind::kFd)
    return NotSupported(fmt::format("{}: only POSIX-fd exports can be imported (got an opaque handle)", label()));
  if (exported.dmabuf)
    return NotSupported(fmt::format("{}: a DMA-BUF export is for NICs; import the POSIX-fd export (Export) instead",
                                    label()));
  const DriverApi& a = api();
  ScopedContext scope(a, context());
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = a.cuMemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(exported.fd.get())),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS)
    return CudaError(a, r, fmt::format("{}: importing an fd exported by {}:{} (not a CUDA POSIX-fd handle?)",
                                       label(), exported.backend, exported.device_index));
  // The exporting GPU, when this process sees it (same uuid), owns the memory; peers get access.
  CUdevice owner = cu_device();
  for (const CudaDevice* s : siblings_)
    if (s->properties().uuid == exported.device_uuid) owner = s->cu_device();
  const size_t map_bytes = RoundUp(exported.offset + exported.size, attributes_.granularity);
  return MapHandle(handle, map_bytes, exported.offset, exported.size, /*imported=*/true, owner);
}

}  // namespace kizuna::cuda
