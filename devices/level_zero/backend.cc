#include "devices/level_zero/backend.h"

#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "devices/level_zero/properties.h"
#include "devices/level_zero/stream.h"
#include "runtime/device/registry.h"
#include "runtime/core/logging.h"

namespace kizuna::level_zero {
namespace {

int NumaNodeOf(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return -1;
  std::ifstream f("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (f >> node) return node;
  return -1;
}

class LevelZeroBackend final : public device::Backend {
 public:
  explicit LevelZeroBackend(std::vector<std::unique_ptr<ZeDevice>> devices) : devices_(std::move(devices)) {}
  std::string_view name() const override { return "level_zero"; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  device::Device* device(int index) override {
    if (index < 0 || index >= device_count()) return nullptr;
    return devices_[static_cast<size_t>(index)].get();
  }

 private:
  std::vector<std::unique_ptr<ZeDevice>> devices_;
};

// The command queue group streams use: the first that takes compute commands (it takes copies
// too), else the first copy group.
Result<uint32_t> QueueOrdinal(const ZeApi& api, ze_device_handle_t dev, const std::string& where) {
  uint32_t count = 0;
  ze_result_t r = api.zeDeviceGetCommandQueueGroupProperties(dev, &count, nullptr);
  if (r != ZE_RESULT_SUCCESS) return ZeError(r, where + ": zeDeviceGetCommandQueueGroupProperties");
  std::vector<ze_command_queue_group_properties_t> groups(count);
  for (auto& g : groups) g.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
  r = api.zeDeviceGetCommandQueueGroupProperties(dev, &count, groups.data());
  if (r != ZE_RESULT_SUCCESS) return ZeError(r, where + ": zeDeviceGetCommandQueueGroupProperties");
  for (uint32_t i = 0; i < count; ++i)
    if (groups[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) return i;
  for (uint32_t i = 0; i < count; ++i)
    if (groups[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) return i;
  return Unavailable(fmt::format("{}: no command queue group takes copy commands", where));
}

// Queries one device; nullptr (no error) for a device that is not a GPU.
Result<std::unique_ptr<ZeDevice>> OpenDevice(const std::shared_ptr<ContextCore>& context, ze_device_handle_t dev,
                                             bool driver_ipc_memory, int index, const Config& config,
                                             const std::shared_ptr<AddressRanges>& ranges) {
  const ZeApi& api = context->api;
  const std::string where = fmt::format("level_zero:{}", index);
  DeviceFacts facts;
  facts.device.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  ze_result_t r = api.zeDeviceGetProperties(dev, &facts.device);
  if (r != ZE_RESULT_SUCCESS) return ZeError(r, where + ": zeDeviceGetProperties");
  if (facts.device.type != ZE_DEVICE_TYPE_GPU) {
    KZ_INFO(kLogDevice, "level_zero: skipping '{}', a device of type {} (only GPUs are used)", facts.device.name,
            static_cast<int>(facts.device.type));
    return std::unique_ptr<ZeDevice>();
  }
  uint32_t nmem = 0;
  r = api.zeDeviceGetMemoryProperties(dev, &nmem, nullptr);
  if (r != ZE_RESULT_SUCCESS) return ZeError(r, where + ": zeDeviceGetMemoryProperties");
  facts.memories.resize(nmem);
  for (auto& m : facts.memories) m.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
  r = api.zeDeviceGetMemoryProperties(dev, &nmem, facts.memories.data());
  if (r != ZE_RESULT_SUCCESS) return ZeError(r, where + ": zeDeviceGetMemoryProperties");
  facts.memories.resize(nmem);
  facts.external.stype = ZE_STRUCTURE_TYPE_DEVICE_EXTERNAL_MEMORY_PROPERTIES;
  r = api.zeDeviceGetExternalMemoryProperties(dev, &facts.external);
  if (r != ZE_RESULT_SUCCESS) {
    KZ_INFO(kLogDevice, "{}: zeDeviceGetExternalMemoryProperties: {} (no DMA-BUF export)", where, ResultName(r));
    facts.external = {};
  }
  if (api.zeDevicePciGetPropertiesExt != nullptr) {
    ze_pci_ext_properties_t pci{};
    pci.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES;
    r = api.zeDevicePciGetPropertiesExt(dev, &pci);
    if (r == ZE_RESULT_SUCCESS) {
      facts.pci = pci;
    } else {
      KZ_INFO(kLogDevice, "{}: zeDevicePciGetPropertiesExt: {} (no PCI bus id)", where, ResultName(r));
    }
  }
  facts.driver_ipc_memory = driver_ipc_memory;
  device::DeviceProperties p = TranslateProperties(facts, index);
  p.numa_node = NumaNodeOf(p.pci_bus_id);
  KZ_ASSIGN_OR_RETURN(const uint32_t ordinal, QueueOrdinal(api, dev, where));

  auto core = std::make_shared<DeviceCore>();
  core->context = context;
  core->device = dev;
  core->queue_ordinal = ordinal;
  core->max_alloc_bytes = facts.device.maxMemAllocSize;
  core->dmabuf_export = p.export_dmabuf;
  core->label = where;
  core->timeout_s = config.timeout_s;
  core->ranges = ranges;
  KZ_INFO(kLogDevice,
          "{}: {} ({}, {:.1f} GiB in {} memory module(s), largest allocation {:.1f} GiB, PCI {}, NUMA node {}); "
          "copy {:.0f} GB/s, host-staged reduce {:.1f} GB/s; export: {}{}; queue group {}",
          where, p.name, p.uuid, static_cast<double>(p.memory_bytes) / (1 << 30), facts.memories.size(),
          static_cast<double>(core->max_alloc_bytes) / (1 << 30), p.pci_bus_id.empty() ? "?" : p.pci_bus_id,
          p.numa_node, p.copy_gbps, p.reduce_gbps, p.export_opaque ? "IPC handle" : "none",
          p.export_dmabuf ? ", DMA-BUF" : "", ordinal);
  return std::make_unique<ZeDevice>(std::move(core), std::move(p), &config);
}

}  // namespace

Result<std::unique_ptr<device::Backend>> CreateLevelZeroBackend(const Config& config) {
  KZ_ASSIGN_OR_RETURN(const ZeApi* api, Loader());
  uint32_t ndrivers = 0;
  ze_result_t r = api->zeDriverGet(&ndrivers, nullptr);
  if (r != ZE_RESULT_SUCCESS) return Unavailable(fmt::format("zeDriverGet: {}", ResultName(r)));
  if (ndrivers == 0) return Unavailable("the Level Zero loader found no driver");
  std::vector<ze_driver_handle_t> drivers(ndrivers);
  r = api->zeDriverGet(&ndrivers, drivers.data());
  if (r != ZE_RESULT_SUCCESS) return Unavailable(fmt::format("zeDriverGet: {}", ResultName(r)));
  drivers.resize(ndrivers);

  auto ranges = std::make_shared<AddressRanges>();
  std::vector<std::unique_ptr<ZeDevice>> devices;
  for (ze_driver_handle_t driver : drivers) {
    ze_api_version_t version{};
    if (api->zeDriverGetApiVersion(driver, &version) == ZE_RESULT_SUCCESS)
      KZ_INFO(kLogDevice, "level_zero: driver {} implements API {}.{}", static_cast<void*>(driver),
              ZE_MAJOR_VERSION(version), ZE_MINOR_VERSION(version));
    ze_driver_ipc_properties_t ipc{};
    ipc.stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES;
    const bool ipc_memory = api->zeDriverGetIpcProperties(driver, &ipc) == ZE_RESULT_SUCCESS &&
                            (ipc.flags & ZE_IPC_PROPERTY_FLAG_MEMORY) != 0;
    uint32_t ndevices = 0;
    r = api->zeDeviceGet(driver, &ndevices, nullptr);
    if (r != ZE_RESULT_SUCCESS) return ZeError(r, "zeDeviceGet");
    if (ndevices == 0) continue;
    std::vector<ze_device_handle_t> handles(ndevices);
    r = api->zeDeviceGet(driver, &ndevices, handles.data());
    if (r != ZE_RESULT_SUCCESS) return ZeError(r, "zeDeviceGet");
    handles.resize(ndevices);
    ze_context_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
    ze_context_handle_t ctx = nullptr;
    r = api->zeContextCreate(driver, &desc, &ctx);
    if (r != ZE_RESULT_SUCCESS) return ZeError(r, "zeContextCreate");
    auto context = std::make_shared<ContextCore>(*api, driver, ctx);
    for (ze_device_handle_t dev : handles) {
      KZ_ASSIGN_OR_RETURN(std::unique_ptr<ZeDevice> d,
                          OpenDevice(context, dev, ipc_memory, static_cast<int>(devices.size()), config, ranges));
      if (d != nullptr) devices.push_back(std::move(d));
    }
  }
  if (devices.empty()) return Unavailable(fmt::format("the Level Zero drivers ({}) expose no GPU", ndrivers));
  return std::unique_ptr<device::Backend>(new LevelZeroBackend(std::move(devices)));
}

Result<std::unique_ptr<device::Stream>> ZeDevice::DoCreateStream() { return MakeStream(this, core_); }
Result<std::unique_ptr<device::Event>> ZeDevice::DoCreateEvent() { return MakeEvent(this); }

KZ_REGISTER_DEVICE_BACKEND(level_zero, &CreateLevelZeroBackend, true);

}  // namespace kizuna::level_zero
