// Creating communicators: from a unique id, a bootstrap, the launcher's environment, or N local
// devices (communicator.h). The engine does the collective part (collectives/engine.h: fabrics,
// connections, the shape); this file finds the device and the bootstrap.
#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "collectives/direct/same_process_group.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/communicator.h"
#include "runtime/core/logging.h"
#include "runtime/device/registry.h"
#include "runtime/job_status.h"

namespace kizuna {
namespace {

// Whether every device's streams take memory of every other (probed with one small allocation per
// distinct device, each checked against the first device and the first's against each).
bool MutuallyAddressable(std::span<device::Device* const> devices) {
  constexpr size_t kProbeBytes = 64;
  auto first = devices[0]->Allocate(kProbeBytes);
  if (!first.ok()) return false;
  for (device::Device* d : devices) {
    if (d == devices[0]) continue;
    auto mine = d->Allocate(kProbeBytes);
    if (!mine.ok() || !devices[0]->Addressable((*mine)->data(), kProbeBytes) ||
        !d->Addressable((*first)->data(), kProbeBytes))
      return false;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<Communicator>> Communicator::Init(std::shared_ptr<bootstrap::Bootstrap> boot,
                                                         device::Device& device, const CommOptions& options,
                                                         std::shared_ptr<collectives::SameProcessGroup> same_process) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->config_ = options.config != nullptr ? options.config : &GlobalConfig();
  c->options_ = options;
  c->device_ = &device;
  c->bootstrap_ = boot;
  collectives::EngineOptions eopts;
  eopts.config = c->config_;
  eopts.staging_bytes = options.staging_bytes;
  eopts.host_id = options.host_id;
  eopts.version = options.version;
  eopts.direct_access = options.direct_access;
  eopts.force_host_staging = options.force_host_staging;
  // Ranks that met through a unique id are processes of their own, each making its calls: one
  // thread driving several ranks (CreateLocal) would wait in the first rank's measurement for the
  // others it has not called yet.
  c->auto_reweigh_ = c->config_->reweigh_calls > 0 && boot->kind() == "tcp";
  KZ_ASSIGN_OR_RETURN(c->engine_, collectives::Engine::Create(boot, device, eopts, std::move(same_process)));
  if (const bootstrap::UniqueId* job = boot->job()) {
    Communicator* self = c.get();
    c->status_ = status::Serve(*job, c->config_->run_dir, c->rank(), [self] {
      nlohmann::ordered_json j = nlohmann::ordered_json::parse(self->FlightRecord(), nullptr, false);
      if (j.is_discarded()) j = nlohmann::ordered_json::object();
      j["size"] = self->size();
      j["comm"] = self->bootstrap_->kind() == "tcp" ? std::string("world") : std::string(self->bootstrap_->kind());
      j["host"] = self->topology().ranks[static_cast<size_t>(self->rank())].host_id;
      const Status e = self->AsyncError();
      j["async_error"] = e.ok() ? std::string() : e.ToString();
      return j;
    });
  }
  return c;
}

Result<std::unique_ptr<Communicator>> Communicator::Create(std::shared_ptr<bootstrap::Bootstrap> bootstrap,
                                                           device::Device& device, const CommOptions& options) {
  if (!bootstrap) return InvalidArgument("Communicator::Create: no bootstrap");
  return Init(std::move(bootstrap), device, options);
}

Result<std::unique_ptr<Communicator>> Communicator::Create(const bootstrap::UniqueId& id, int rank, int size,
                                                           device::Device& device, const CommOptions& options) {
  const Config& config = options.config != nullptr ? *options.config : GlobalConfig();
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument(fmt::format("Communicator::Create: rank {} of {} ranks", rank, size));
  KZ_ASSIGN_OR_RETURN(auto boot,
                      bootstrap::CreateTcpBootstrap(id, rank, size, Deadline::AfterSeconds(config.timeout_s)));
  return Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(boot)), device, options);
}

Result<std::unique_ptr<Communicator>> Communicator::CreateFromEnvironment(const CommOptions& options) {
  const Config& config = options.config != nullptr ? *options.config : GlobalConfig();
  const bootstrap::Environment env = bootstrap::ProcessEnvironment();
  KZ_ASSIGN_OR_RETURN(bootstrap::LaunchInfo launch, bootstrap::DetectLaunch(env));
  auto registry = device::DeviceRegistry::Create(config);
  std::vector<device::Device*> devices = registry->devices();
  if (devices.empty()) {
    std::string why;
    for (const auto& slot : registry->backends()) why += fmt::format("; {}: {}", slot.name, slot.status.ToString());
    return Unavailable(fmt::format("no device for rank {}{}", launch.rank, why));
  }
  // Real accelerators first (a GPU machine uses its GPUs, as NCCL users expect), else the first
  // available backend in registry order (the emulated devices on a machine without hardware).
  std::string backend = devices[0]->properties().backend;
  for (const auto& slot : registry->backends()) {
    if (slot.status.ok() && slot.needs_hardware && slot.backend->device_count() > 0) {
      backend = slot.name;
      break;
    }
  }
  KZ_INFO(kLogInit, "rank {}: devices of backend {} (KIZUNA_EMULATED_DEVICES=0 leaves out the emulated ones)",
          launch.rank, backend);
  std::erase_if(devices, [&](device::Device* d) { return d->properties().backend != backend; });
  int index = launch.local_rank % static_cast<int>(devices.size());
  if (config.device) {
    if (*config.device < 0 || *config.device >= static_cast<int>(devices.size()))
      return InvalidArgument(fmt::format("KIZUNA_DEVICE={} but {} has {} devices", *config.device, backend,
                                         devices.size()));
    index = *config.device;
  }
  device::Device* device = devices[static_cast<size_t>(index)];
  KZ_ASSIGN_OR_RETURN(auto boot, bootstrap::BootstrapFromEnvironment());
  KZ_ASSIGN_OR_RETURN(auto comm, Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(boot)), *device, options));
  comm->owned_devices_ = std::move(registry);
  return comm;
}

Result<std::vector<std::unique_ptr<Communicator>>> Communicator::CreateLocal(std::span<device::Device* const> devices,
                                                                           const CommOptions& options) {
  if (devices.empty()) return InvalidArgument("Communicator::CreateLocal: no devices");
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] == nullptr) return InvalidArgument(fmt::format("Communicator::CreateLocal: device {} is null", i));
  const int n = static_cast<int>(devices.size());
  KZ_ASSIGN_OR_RETURN(auto boots, bootstrap::CreateInProcessBootstraps(n));
  // Ranks of one process address each other's buffers directly when they share one device, or
  // when their devices are of one backend whose memory the CPU addresses (emulated devices: any
  // of their streams takes any of their memory). GPUs of one process would need peer access.
  bool direct = options.direct_access;
  for (device::Device* d : devices)
    direct = direct && d->properties().backend == devices[0]->properties().backend &&
             (d == devices[0] || (d->properties().host_accessible && devices[0]->properties().host_accessible));
  // Two instances of one backend (an application's own beside the registry's) keep their memory
  // apart: each device's streams must take the first device's memory and the first's each other's.
  if (direct && n > 1) direct = MutuallyAddressable(devices);
  auto group = direct ? std::make_shared<collectives::SameProcessGroup>(n) : nullptr;
  KZ_INFO(kLogInit, "{} local ranks: {}", n,
          direct ? "they address each other's memory directly (fused algorithms available)"
                 : "no direct access between them (fused algorithms not available)");
  std::vector<Result<std::unique_ptr<Communicator>>> results;
  for (int r = 0; r < n; ++r) results.emplace_back(Internal("not created"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)] =
          Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(boots[static_cast<size_t>(r)])),
               *devices[static_cast<size_t>(r)], options, group);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    auto& res = results[static_cast<size_t>(r)];
    if (!res.ok()) return res.status().WithContext(fmt::format("rank {}", r));
    comms.push_back(std::move(*res));
  }
  return comms;
}

Communicator::~Communicator() = default;

}  // namespace kizuna
