// The Level Zero device backend (README.md): Intel GPUs (and any Level Zero GPU driver) through
// the loader, reached with dlopen (loader.h). Registered as the built-in backend `level_zero`
// (needs hardware: without the loader, or with the loader but no driver, its factory answers
// kUnavailable with the reason, e.g. "zeInit: ZE_RESULT_ERROR_UNINITIALIZED (no Level Zero
// driver; ...)", and its tests skip).
//
// One context per driver (zeContextCreate) is shared by that driver's devices, so memory of one
// device is usable by another device's streams where the driver allows it. Every root device of
// type GPU becomes a device::Device (sub-devices are not split out). Memory: memory.cc
// (zeMemAllocDevice, optionally exportable as DMA-BUF; zeMemAllocHost; IPC handles); streams and
// events: stream.h.
//
// Lifetimes: buffers, streams and events keep their device's DeviceCore (and through it the
// context) alive, so the context is destroyed after the last of them, whatever the order of
// destruction.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>

#include "devices/level_zero/loader.h"
#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::level_zero {

// Creates the backend: kUnavailable when the loader is missing, zeInit fails (no driver), or the
// drivers expose no GPU; a failing query of a device that exists is a real error (kInternal ...).
Result<std::unique_ptr<device::Backend>> CreateLevelZeroBackend(const Config& config);

// The live allocations, imports and host allocations of one backend instance as [start, end)
// ranges: the fast answer to Device::Addressable before asking the driver. Thread-safe.
class AddressRanges {
 public:
  void Insert(const void* start, size_t bytes);
  void Erase(const void* start);
  bool Contains(const void* ptr, size_t bytes) const;

 private:
  mutable std::shared_mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_;  // start -> end (exclusive); guarded by mu_
};

// One driver's context; destroyed with the last DeviceCore that shares it.
struct ContextCore {
  ContextCore(const ZeApi& api, ze_driver_handle_t driver, ze_context_handle_t context)
      : api(api), driver(driver), context(context) {}
  ~ContextCore() { api.zeContextDestroy(context); }
  ContextCore(const ContextCore&) = delete;
  ContextCore& operator=(const ContextCore&) = delete;

  const ZeApi& api;
  const ze_driver_handle_t driver;
  const ze_context_handle_t context;
};

// What a device shares with its buffers, streams and events, which may outlive it.
struct DeviceCore {
  const ZeApi& api() const { return context->api; }
  ze_context_handle_t ctx() const { return context->context; }

  std::shared_ptr<ContextCore> context;
  ze_device_handle_t device = nullptr;
  uint32_t queue_ordinal = 0;    // the command queue group streams use (compute, else copy)
  uint64_t max_alloc_bytes = 0;  // ze_device_properties_t::maxMemAllocSize
  bool dmabuf_export = false;    // allocations request ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF export
  std::string label;             // "level_zero:0"
  double timeout_s = 600;        // Config::timeout_s: bound of every wait of the backend
  std::shared_ptr<AddressRanges> ranges;  // backend-wide
};

class ZeDevice final : public device::Device {
 public:
  ZeDevice(std::shared_ptr<DeviceCore> core, device::DeviceProperties properties, const Config* config)
      : Device(std::move(properties), config), core_(std::move(core)) {}

  const std::shared_ptr<DeviceCore>& core() const { return core_; }
  const ZeApi& api() const { return core_->api(); }

  // Inside a live allocation, import or host allocation of this backend, or memory the driver
  // knows in this device's context (zeMemGetAllocProperties: host, device or shared).
  bool Addressable(const void* ptr, size_t bytes) const override;

 protected:
  Result<std::unique_ptr<device::Buffer>> DoAllocate(size_t bytes) override;
  Result<std::unique_ptr<device::Buffer>> DoAllocateHost(size_t bytes) override;
  Result<std::unique_ptr<device::Stream>> DoCreateStream() override;
  Result<std::unique_ptr<device::Event>> DoCreateEvent() override;
  Result<device::ExportedMemory> DoExport(const device::Buffer& buffer, size_t offset, size_t size) override;
  Result<device::ExportedMemory> DoExportDmaBuf(const device::Buffer& buffer, size_t offset, size_t size) override;
  Result<std::unique_ptr<device::Buffer>> DoImport(const device::ExportedMemory& exported) override;

 private:
  std::shared_ptr<DeviceCore> core_;
};

}  // namespace kizuna::level_zero
