#include "devices/host_emulated/backend.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "devices/host_emulated/memory.h"
#include "devices/host_emulated/stream.h"
#include "runtime/core/logging.h"
#include "runtime/device/registry.h"

namespace kizuna::host_emulated {
namespace {

constexpr std::string_view kBackendName = "host_emulated";

std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// Keeps a uuid printable and free of separators whatever the host name contains.
std::string Sanitize(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '.' || c == '_' || c == '-') out.push_back(c);
  }
  return out;
}

// What makes a device uuid host-wide: the host name for people reading logs, plus the kernel's
// boot id, because memfd sharing works exactly within one running kernel (cloned VMs and
// containers may share a host name or machine-id, never a boot id). Falls back to the
// machine-id, then to the host name alone.
std::string HostIdentity() {
  char host[256] = {};
  std::string name = ::gethostname(host, sizeof(host) - 1) == 0 ? Sanitize(host) : "";
  if (name.empty()) name = "localhost";
  std::string id = Sanitize(ReadFirstLine("/proc/sys/kernel/random/boot_id"));
  if (id.empty()) id = Sanitize(ReadFirstLine("/etc/machine-id"));
  if (id.empty()) return name;
  return fmt::format("{}-{}", name, id.substr(0, 8));
}

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return uint64_t{1} << 30;  // unknowable: a modest 1 GiB
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

// The NUMA node of emulated device memory: only meaningful when the host has exactly one node
// (allocations are not bound, so on a multi-node host the pages land where they are touched).
int SingleNumaNode() {
  const std::string online = ReadFirstLine("/sys/devices/system/node/online");  // "0" or "0-1,3"
  int node = -1;
  const char* end = online.data() + online.size();
  auto [ptr, ec] = std::from_chars(online.data(), end, node);
  if (ec != std::errc() || ptr != end || online.empty()) return -1;
  return node;
}

// Every live allocation holds one memfd (its export handle), so a process with many buffers
// needs many descriptors; the common soft limit of 1024 is below what a test allocating 1,000
// buffers needs. Raise the soft limit to the hard one once per process, as Go's runtime does;
// past the hard limit, allocation reports the exhaustion as an error.
void RaiseDescriptorLimit() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct rlimit lim {};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
    const rlim_t before = lim.rlim_cur;
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0)
      KZ_INFO(kLogDevice, "host_emulated: raised the open-file limit from {} to {} (one memfd per allocation)",
              static_cast<uint64_t>(before), static_cast<uint64_t>(lim.rlim_cur));
  });
}

class EmuDevice final : public device::Device {
 public:
  EmuDevice(device::DeviceProperties properties, const Config* config, MemoryManager* memory,
            StreamEnvironment* streams, const std::string& host_identity)
      : Device(std::move(properties), config),
        memory_(memory),
        streams_(streams),
        pacer_(std::make_shared<DevicePacer>(host_identity, properties_.index)) {}

  bool Addressable(const void* ptr, size_t bytes) const override { return memory_->Addressable(ptr, bytes); }
  Result<device::AllocationRef> FindAllocation(const void* ptr, size_t bytes) const override {
    return memory_->FindAllocation(ptr, bytes);
  }

 protected:
  Result<std::unique_ptr<device::Buffer>> DoAllocate(size_t bytes) override { return memory_->Allocate(this, bytes); }
  // Host-accessible (the default mode): device memory is host memory already, as the base class
  // answers. Opaque: a separate mapping the CPU reads directly.
  Result<std::unique_ptr<device::Buffer>> DoAllocateHost(size_t bytes) override {
    if (!memory_->opaque()) return Device::DoAllocateHost(bytes);
    return memory_->AllocateHost(this, bytes);
  }
  Result<std::unique_ptr<device::Stream>> DoCreateStream() override {
    // Only opaque streams translate addresses; the others never look one up.
    std::shared_ptr<const MemoryManager> translator;
    if (memory_->opaque()) translator = memory_->shared_from_this();
    return MakeStream(this, streams_, pacer_, std::move(translator));
  }
  Result<std::unique_ptr<device::Stream>> DoAdoptStream(void* native) override {
    return host_emulated::AdoptStream(this, streams_, native);
  }
  Result<std::unique_ptr<device::Event>> DoCreateEvent() override { return MakeEvent(this, streams_); }
  Result<device::ExportedMemory> DoExport(const device::Buffer& buffer, size_t offset, size_t size) override {
    return memory_->Export(buffer, offset, size);
  }
  Result<std::unique_ptr<device::Buffer>> DoImport(const device::ExportedMemory& exported) override {
    return memory_->Import(this, exported);
  }

 private:
  MemoryManager* memory_;       // owned by the backend
  StreamEnvironment* streams_;  // owned by the backend
  std::shared_ptr<DevicePacer> pacer_;
};

class EmuBackend final : public device::Backend {
 public:
  explicit EmuBackend(const Config& config)
      : streams_(config),
        memory_(MemoryManager::Create(config, config.emulated_devices,
                                      config.emu_mem_bytes.value_or(PhysicalMemoryBytes()))) {
    if (config.emu_sync_free) {
      // What CUDA does at cudaFree / cuMemFreeHost: wait for the device. A wait that runs past
      // the deadline has failed the streams it waited for (the error names the free); the free
      // itself goes on, since a destructor cannot report.
      memory_->SetFreeHook([streams = streams_.device_streams(), timeout_s = config.timeout_s](
                               int device, std::string_view what) {
        Status s = streams->WaitForDevice(device, Deadline::AfterSeconds(timeout_s), what);
        if (!s.ok()) KZ_WARN(kLogDevice, "host_emulated:{}: {}", device, s.ToString());
      });
    }
    const std::string host = HostIdentity();
    const int numa_node = SingleNumaNode();
    for (int i = 0; i < config.emulated_devices; ++i) {
      device::DeviceProperties p;
      p.backend = std::string(kBackendName);
      p.index = i;
      p.name = fmt::format("emulated accelerator {}", i);
      p.uuid = fmt::format("emu-{}-{}", host, i);
      p.memory_bytes = memory_->capacity_bytes();
      const double factor = static_cast<size_t>(i) < config.emu_speed_factors.size()
                                ? config.emu_speed_factors[static_cast<size_t>(i)]
                                : 1.0;
      p.copy_gbps = config.emu_copy_gbps.value_or(0.0) * factor;
      p.reduce_gbps = config.emu_reduce_gbps.value_or(0.0) * factor;
      p.launch_latency_us = config.emu_launch_us.value_or(0.0);
      p.host_accessible = !config.emu_opaque;
      p.host_compute = true;
      p.faults_injected = config.emu_fail_stream_op.has_value();
      p.export_fd = true;
      p.numa_node = numa_node;
      if (static_cast<size_t>(i) < config.emu_pci_bus_ids.size())
        p.pci_bus_id = config.emu_pci_bus_ids[static_cast<size_t>(i)];
      devices_.push_back(std::make_unique<EmuDevice>(std::move(p), &config, memory_.get(), &streams_, host));
    }
  }

  std::string_view name() const override { return kBackendName; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  device::Device* device(int index) override {
    if (index < 0 || index >= device_count()) return nullptr;
    return devices_[static_cast<size_t>(index)].get();
  }

 private:
  StreamEnvironment streams_;
  std::shared_ptr<MemoryManager> memory_;
  std::vector<std::unique_ptr<EmuDevice>> devices_;  // destroyed first: they point at the above
};

std::string Throttles(const Config& c) {
  std::string out;
  if (c.emu_copy_gbps) out += fmt::format(" copy {} GB/s", *c.emu_copy_gbps);
  if (c.emu_reduce_gbps) out += fmt::format(" reduce {} GB/s", *c.emu_reduce_gbps);
  if (c.emu_launch_us) out += fmt::format(" launch {} us", *c.emu_launch_us);
  if (!c.emu_speed_factors.empty() && (c.emu_copy_gbps || c.emu_reduce_gbps))
    out += fmt::format(", times {} per device", fmt::join(c.emu_speed_factors, ", "));
  return out.empty() ? " none" : out;
}

}  // namespace

Result<std::unique_ptr<device::Backend>> CreateHostEmulatedBackend(const Config& config) {
  if (config.emulated_devices == 0) return Unavailable("emulated devices disabled by KIZUNA_EMULATED_DEVICES=0");
  if (config.emulated_devices < 0)
    return InvalidArgument(fmt::format("emulated device count {} is negative", config.emulated_devices));
  RaiseDescriptorLimit();
  auto backend = std::make_unique<EmuBackend>(config);
  const device::DeviceProperties& p = backend->device(0)->properties();
  KZ_INFO(kLogDevice, "host_emulated: {} device(s) ({} ... {}), {:.1f} GiB each, memfd-backed{}; throttles:{}",
          backend->device_count(), p.uuid, backend->device(backend->device_count() - 1)->properties().uuid,
          static_cast<double>(p.memory_bytes) / double(uint64_t{1} << 30),
          config.emu_opaque ? ", opaque (the CPU cannot dereference device memory; KIZUNA_EMU_OPAQUE=1)" : "",
          Throttles(config));
  if (config.emu_sync_free)
    KZ_INFO(kLogDevice, "host_emulated: freeing memory waits for the device's streams, as cudaFree does "
                        "(KIZUNA_EMU_SYNC_FREE)");
  if (config.emu_fail_alloc)
    KZ_INFO(kLogDevice, "host_emulated: allocation #{} will fail (KIZUNA_EMU_FAIL_ALLOC)", *config.emu_fail_alloc);
  if (config.emu_fail_stream_op)
    KZ_INFO(kLogDevice, "host_emulated: stream operation #{} will fail (KIZUNA_EMU_FAIL_STREAM_OP)",
            *config.emu_fail_stream_op);
  return std::unique_ptr<device::Backend>(std::move(backend));
}

KZ_REGISTER_DEVICE_BACKEND(host_emulated, &CreateHostEmulatedBackend, false);

}  // namespace kizuna::host_emulated
