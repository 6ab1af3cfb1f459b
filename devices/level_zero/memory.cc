// Device memory of the Level Zero backend.
//
// - Allocate: zeMemAllocDevice in the driver's context, page aligned. Where the device can export
//   allocations as DMA-BUF (zeDeviceGetExternalMemoryProperties), the export is requested at
//   allocation (ze_external_memory_export_desc_t, ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF), since
//   Level Zero only exports what was allocated exportable.
// - AllocateHost: zeMemAllocHost: host memory the CPU and the device's streams both use.
// - Export: the allocation's IPC handle (zeMemGetIpcHandle on the allocation's base) as an opaque
//   blob (ExportKind::kOpaque, runtime/device/README.md) plus the region's offset; Import opens it in this
//   process (zeMemOpenIpcHandle) and closes it with the buffer (zeMemCloseIpcHandle).
// - ExportDmaBuf: zeMemGetAllocProperties with ze_external_memory_export_fd_t chained. The driver
//   keeps the fd it returns (it hands out the same one on every call), so the export carries a
//   dup of it, which the ExportedMemory owns.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include <fmt/format.h>

#include "devices/level_zero/backend.h"
#include "runtime/core/logging.h"

namespace kizuna::level_zero {
namespace {

// Alignment of every allocation: a page, so that a whole buffer is a page-aligned DMA-BUF range.
constexpr size_t kAllocationAlignment = 4096;

enum class BufferKind : uint8_t { kDevice, kHost, kImported };

class ZeBuffer final : public device::Buffer {
 public:
  // `base` is what the driver returned (freed or closed with the buffer); data() is base + offset.
  ZeBuffer(ZeDevice* device, std::shared_ptr<DeviceCore> core, void* base, size_t offset, size_t size,
           BufferKind kind)
      : Buffer(device, base == nullptr ? nullptr : static_cast<uint8_t*>(base) + offset, size,
               kind == BufferKind::kImported),
        core_(std::move(core)),
        base_(base),
        kind_(kind) {
    if (data() != nullptr) core_->ranges->Insert(data(), size);
  }
  ~ZeBuffer() override {
    if (base_ == nullptr) return;
    core_->ranges->Erase(data());
    const ZeApi& api = core_->api();
    const ze_result_t r = kind_ == BufferKind::kImported ? api.zeMemCloseIpcHandle(core_->ctx(), base_)
                                                         : api.zeMemFree(core_->ctx(), base_);
    if (r != ZE_RESULT_SUCCESS)
      KZ_WARN(kLogDevice, "{}: {} failed: {}", core_->label,
              kind_ == BufferKind::kImported ? "zeMemCloseIpcHandle" : "zeMemFree", ResultName(r));
  }

  void* base() const { return base_; }
  BufferKind kind() const { return kind_; }

 private:
  std::shared_ptr<DeviceCore> core_;
  void* base_;
  BufferKind kind_;
};

std::unique_ptr<device::Buffer> EmptyBuffer(ZeDevice* device, const std::shared_ptr<DeviceCore>& core,
                                            BufferKind kind) {
  return std::make_unique<ZeBuffer>(device, core, nullptr, 0, 0, kind);
}

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

// ---- ZeDevice: memory ----

bool ZeDevice::Addressable(const void* ptr, size_t bytes) const {
  if (core_->ranges->Contains(ptr, bytes)) return true;
  // Memory the application allocated in this context itself (a SYCL / oneCCL buffer): the
  // driver knows the allocation and its extent.
  void* base = nullptr;
  size_t size = 0;
  if (api().zeMemGetAddressRange(core_->ctx(), ptr, &base, &size) != ZE_RESULT_SUCCESS || base == nullptr) return false;
  const auto p = reinterpret_cast<uintptr_t>(ptr), b = reinterpret_cast<uintptr_t>(base);
  return p >= b && p - b <= size && bytes <= size - (p - b);
}

Result<std::unique_ptr<device::Buffer>> ZeDevice::DoAllocate(size_t bytes) {
  if (bytes == 0) return EmptyBuffer(this, core_, BufferKind::kDevice);
  if (bytes > properties_.memory_bytes)
    return OutOfMemory(
        fmt::format("{}: {} bytes requested, the device has {} bytes", label(), bytes, properties_.memory_bytes));
  if (core_->max_alloc_bytes != 0 && bytes > core_->max_alloc_bytes)
    return OutOfMemory(fmt::format("{}: {} bytes requested, the device's largest allocation is {} bytes "
                                   "(maxMemAllocSize)",
                                   label(), bytes, core_->max_alloc_bytes));
  ze_external_memory_export_desc_t export_desc{};
  export_desc.stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC;
  export_desc.flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF;
  ze_device_mem_alloc_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  desc.pNext = core_->dmabuf_export ? &export_desc : nullptr;
  desc.ordinal = 0;
  void* p = nullptr;
  const ze_result_t r =
      api().zeMemAllocDevice(core_->ctx(), &desc, bytes, kAllocationAlignment, core_->device, &p);
  if (r != ZE_RESULT_SUCCESS) {
    Status s = ZeError(r, fmt::format("{}: zeMemAllocDevice of {} bytes", label(), bytes));
    // Running out of device memory is kOutOfMemory whatever the driver's code for it.
    if (r == ZE_RESULT_ERROR_UNSUPPORTED_SIZE) return OutOfMemory(s.message());
    return s;
  }
  return std::unique_ptr<device::Buffer>(new ZeBuffer(this, core_, p, 0, bytes, BufferKind::kDevice));
}

Result<std::unique_ptr<device::Buffer>> ZeDevice::DoAllocateHost(size_t bytes) {
  if (bytes == 0) return EmptyBuffer(this, core_, BufferKind::kHost);
  ze_host_mem_alloc_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* p = nullptr;
  const ze_result_t r = api().zeMemAllocHost(core_->ctx(), &desc, bytes, kAllocationAlignment, &p);
  if (r != ZE_RESULT_SUCCESS) {
    Status s = ZeError(r, fmt::format("{}: zeMemAllocHost of {} bytes", label(), bytes));
    if (r == ZE_RESULT_ERROR_UNSUPPORTED_SIZE) return OutOfMemory(s.message());
    return s;
  }
  return std::unique_ptr<device::Buffer>(new ZeBuffer(this, core_, p, 0, bytes, BufferKind::kHost));
}

Result<device::ExportedMemory> ZeDevice::DoExport(const device::Buffer& buffer, size_t offset, size_t) {
  const auto& b = static_cast<const ZeBuffer&>(buffer);
  if (b.kind() != BufferKind::kDevice)
    return NotSupported(fmt::format("{}: only device memory is exported (not AllocateHost memory)", label()));
  ze_ipc_mem_handle_t handle{};
  const ze_result_t r = api().zeMemGetIpcHandle(core_->ctx(), b.base(), &handle);
  if (r != ZE_RESULT_SUCCESS) return ZeError(r, fmt::format("{}: zeMemGetIpcHandle", label()));
  device::ExportedMemory e;
  e.kind = device::ExportKind::kOpaque;
  e.opaque.assign(handle.data, handle.data + sizeof(handle.data));
  e.offset = offset;  // the handle names the whole allocation, which starts at data()
  return e;
}

Result<device::ExportedMemory> ZeDevice::DoExportDmaBuf(const device::Buffer& buffer, size_t offset, size_t size) {
  const auto& b = static_cast<const ZeBuffer&>(buffer);
  if (b.kind() != BufferKind::kDevice)
    return NotSupported(fmt::format("{}: only device memory is exported as DMA-BUF (not AllocateHost memory)",
                                    label()));
  ze_external_memory_export_fd_t export_fd{};
  export_fd.stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD;
  export_fd.flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF;
  export_fd.fd = -1;
  ze_memory_allocation_properties_t props{};
  props.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
  props.pNext = &export_fd;
  const ze_result_t r = api().zeMemGetAllocProperties(core_->ctx(), b.base(), &props, nullptr);
  if (r != ZE_RESULT_SUCCESS)
    return ZeError(r, fmt::format("{}: zeMemGetAllocProperties (DMA-BUF export of {} bytes)", label(), size));
  if (export_fd.fd < 0)
    return Internal(fmt::format("{}: zeMemGetAllocProperties returned no DMA-BUF fd", label()));
  const int fd = ::fcntl(export_fd.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return FromErrno(errno, "fcntl(F_DUPFD_CLOEXEC) of the DMA-BUF fd");
  device::ExportedMemory e;
  e.fd = UniqueFd(fd);
  e.offset = offset;  // the DMA-BUF is the whole allocation, which starts at data()
  KZ_INFO(kLogDevice, "{}: DMA-BUF fd for {} bytes (region at offset {} of a {}-byte allocation)", label(), size,
          offset, b.size());
  return e;
}

Result<std::unique_ptr<device::Buffer>> ZeDevice::DoImport(const device::ExportedMemory& exported) {
  if (exported.kind != device::ExportKind::kOpaque)
    return NotSupported(fmt::format("{}: only IPC-handle exports (opaque) can be imported, not an fd{}", label(),
                                    exported.dmabuf ? " (a DMA-BUF export is for NICs)" : ""));
  ze_ipc_mem_handle_t handle{};
  if (exported.opaque.size() != sizeof(handle.data))
    return InvalidArgument(fmt::format("{}: an IPC handle has {} bytes, the export carries {}", label(),
                                       sizeof(handle.data), exported.opaque.size()));
  std::memcpy(handle.data, exported.opaque.data(), sizeof(handle.data));
  void* base = nullptr;
  const ze_result_t r = api().zeMemOpenIpcHandle(core_->ctx(), core_->device, handle, 0, &base);
  if (r != ZE_RESULT_SUCCESS)
    return ZeError(r, fmt::format("{}: zeMemOpenIpcHandle of memory exported by {}:{}", label(), exported.backend,
                                  exported.device_index));
  return std::unique_ptr<device::Buffer>(
      new ZeBuffer(this, core_, base, exported.offset, exported.size, BufferKind::kImported));
}

}  // namespace kizuna::level_zero
