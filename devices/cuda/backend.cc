#include "devices/cuda/backend.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "runtime/device/registry.h"
#include "runtime/core/logging.h"

namespace kizuna::cuda {
namespace {

// Share of the HBM's peak (clock x bus width x 2) a streaming kernel reaches: a device-to-device
// copy and an 8-input reduce both measured 3.0 TB/s (read + write) on an H100 whose peak is
// 3.35 TB/s (docs/PERFORMANCE.md, "CUDA backend on an H100").
constexpr double kStreamingEfficiency = 0.9;
// Launch cost of one small kernel or copy, measured on an H100 (docs/PERFORMANCE.md, same section).
constexpr double kLaunchLatencyUs = 4.2;

std::string UuidText(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  return fmt::format(
      "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", b[0],
      b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int NumaNodeOf(const std::string& pci_bus_id) {
  std::ifstream f("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (f >> node) return node;
  return -1;
}

class CudaBackend final : public device::Backend {
 public:
  explicit CudaBackend(std::vector<std::unique_ptr<CudaDevice>> devices) : devices_(std::move(devices)) {
    // Kernels are loaded now, never on a first reduce: loading can wait for the whole context,
    // and by then a stream may be held waiting for the engine (loader.cc). A device whose
    // kernels fail to load reports that at its first reduce.
    for (auto& d : devices_)
      if (auto k = d->Kernels(); !k.ok()) KZ_WARN(kLogDevice, "{}", k.status().ToString());
    std::vector<CudaDevice*> all;
    for (auto& d : devices_) all.push_back(d.get());
    for (auto& d : devices_) d->SetSiblings(all);
  }
  std::string_view name() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  device::Device* device(int index) override {
    if (index < 0 || index >= device_count()) return nullptr;
    return devices_[static_cast<size_t>(index)].get();
  }

 private:
  std::vector<std::unique_ptr<CudaDevice>> devices_;
};

Result<std::unique_ptr<CudaDevice>> OpenDevice(const DriverApi& api, int ordinal, const Config& config,
                                               const std::shared_ptr<AddressRanges>& ranges) {
  const std::string where = fmt::format("cuda:{}", ordinal);
  CUdevice dev = 0;
  CUresult r = api.cuDeviceGet(&dev, ordinal);
  if (r != CUDA_SUCCESS) return CudaError(api, r, where + ": cuDeviceGet");
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    return api.cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : 0;
  };
  device::DeviceProperties p;
  p.backend = "cuda";
  p.index = ordinal;
  char name[256] = {};
  if (api.cuDeviceGetName(name, sizeof(name) - 1, dev) == CUDA_SUCCESS) p.name = name;
  CUuuid uuid{};
  r = api.cuDeviceGetUuid(&uuid, dev);
  if (r != CUDA_SUCCESS) return CudaError(api, r, where + ": cuDeviceGetUuid");
  p.uuid = UuidText(uuid);
  size_t total = 0;
  r = api.cuDeviceTotalMem(&total, dev);
  if (r != CUDA_SUCCESS) return CudaError(api, r, where + ": cuDeviceTotalMem");
  p.memory_bytes = total;
  char bus[64] = {};
  if (api.cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, dev) == CUDA_SUCCESS) {
    p.pci_bus_id = bus;
    std::transform(p.pci_bus_id.begin(), p.pci_bus_id.end(), p.pci_bus_id.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    p.numa_node = NumaNodeOf(p.pci_bus_id);
  }
  // Peak HBM bandwidth: memory clock (kHz) x 2 (double data rate) x bus width (bytes).
  const double peak_gbps = 2.0 * attr(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE) * 1e3 *
                           attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) / 8 / 1e9;
  // A copy of n bytes reads and writes n; a two-input reduce reads 2n and writes n.
  p.copy_gbps = peak_gbps * kStreamingEfficiency / 2;
  p.reduce_gbps = peak_gbps * kStreamingEfficiency * 2 / 3;
  p.launch_latency_us = kLaunchLatencyUs;
  p.host_accessible = false;

  CudaDevice::Attributes a;
  a.sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  a.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  a.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  a.vmm = attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
  a.posix_fd = attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0;
  a.rdma_vmm = attr(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED) != 0;
  a.dmabuf = attr(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED) != 0;
  if (!a.vmm)
    return Unavailable(fmt::format("{} ({}) has no virtual memory management (cuMemCreate), which the backend "
                                   "allocates with", where, p.name));
  if (attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 0)
    return Unavailable(fmt::format("{} ({}) has no unified addressing", where, p.name));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = a.posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  r = api.cuMemGetAllocationGranularity(&a.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || a.granularity == 0) return CudaError(api, r, where + ": cuMemGetAllocationGranularity");
  p.export_fd = a.posix_fd;
  p.export_dmabuf = a.dmabuf;

  CUcontext ctx = nullptr;
  r = api.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != CUDA_SUCCESS) return CudaError(api, r, where + ": cuDevicePrimaryCtxRetain");
  auto core = std::make_shared<DeviceCore>(api, dev, ctx, ordinal, ranges);
  KZ_INFO(kLogDevice,
          "{}: {} (sm_{}{}, {} SMs, {:.1f} GiB, PCI {}, NUMA node {}, HBM peak {:.0f} GB/s); export: {}{}; "
          "allocation granularity {} KiB",
          where, p.name, a.cc_major, a.cc_minor, a.sm_count, static_cast<double>(total) / (1 << 30), p.pci_bus_id,
          p.numa_node, peak_gbps, a.posix_fd ? "POSIX fd (IPC)" : "none", a.dmabuf ? ", DMA-BUF" : "",
          a.granularity >> 10);
  return std::make_unique<CudaDevice>(std::move(core), std::move(p), a, &config);
}

}  // namespace

Result<std::unique_ptr<device::Backend>> CreateCudaBackend(const Config& config) {
  KZ_ASSIGN_OR_RETURN(const DriverApi* api, Driver());
  int count = 0;
  CUresult r = api->cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return Unavailable(fmt::format("cuDeviceGetCount failed: {}", ErrorText(*api, r)));
  if (count == 0) return Unavailable("the CUDA driver sees no GPU");
  auto ranges = std::make_shared<AddressRanges>();
  std::vector<std::unique_ptr<CudaDevice>> devices;
  for (int i = 0; i < count; ++i) {
    KZ_ASSIGN_OR_RETURN(auto d, OpenDevice(*api, i, config, ranges));
    devices.push_back(std::move(d));
  }
  return std::unique_ptr<device::Backend>(new CudaBackend(std::move(devices)));
}

CudaDevice::CudaDevice(std::shared_ptr<DeviceCore> core, device::DeviceProperties properties, Attributes attributes,
                       const Config* config)
    : Device(std::move(properties), config), core_(std::move(core)), attributes_(attributes) {}

CudaDevice::~CudaDevice() {
  if (kernels_.module != nullptr) {
    ScopedContext scope(api(), context());
    api().cuModuleUnload(kernels_.module);
  }
}

KZ_REGISTER_DEVICE_BACKEND(cuda, &CreateCudaBackend, true);

}  // namespace kizuna::cuda
