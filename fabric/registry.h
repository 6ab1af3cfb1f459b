// The fabric registry, like the device layer's (runtime/device/registry.h). In-tree fabrics
// register a factory at static-initialisation time (KZ_REGISTER_FABRIC in the backend's
// fabric.cc; its Bazel library is alwayslink); linking a fabric's library into a binary is what
// makes it available there. The engine and the runtime only ever see the Fabric interface.
//
// Plugins: KIZUNA_FABRIC_PLUGINS (Config::fabric_plugins) names shared libraries built against
// fabric/kizuna_fabric_plugin.h (a C ABI shaped after NCCL's ext-net), loaded here beside the
// built-in fabrics by plugin_fabric.h (FabricSlot::origin is then the library's path). A plugin
// that cannot be loaded is a visible slot with the reason; a name already taken is refused.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/fabric.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::fabric {

// Creates a fabric for the calling rank. Returns kUnavailable (with the reason: no NIC, no
// provider, no topology) when the fabric cannot run here; any other error is a real failure
// (a malformed topology file, a rank the topology has no node for).
using FabricFactory = Result<std::unique_ptr<Fabric>> (*)(const Config& config, const FabricContext& context);

struct FabricRegistration {
  std::string name;
  FabricFactory factory;
  // true for fabrics that need hardware (roce, ofi on verbs): their unavailability is expected on
  // machines without it, and tests skip them saying why.
  bool needs_hardware;
  // When KIZUNA_FABRIC names no fabric, the registry starts this one only where this says it may
  // serve a pair the others cannot (null: always); `why` says why not. For a fabric whose start is
  // costly and whose devices here would only repeat another fabric's (ofi without RDMA devices).
  bool (*started_by_default)(std::string* why) = nullptr;
};

// Called by KZ_REGISTER_FABRIC. Returns true so it can initialise a static.
bool RegisterFabric(FabricRegistration registration);
// The built-in factories, in registration order.
std::vector<FabricRegistration> RegisteredFabrics();

// Creates one fabric by name — a built-in one, or a plugin from config.fabric_plugins (tests,
// tools, and processes that need one fabric only).
// kInvalidArgument naming the registered fabrics when `name` is not one of them.
Result<std::unique_ptr<Fabric>> CreateFabric(std::string_view name, const Config& config,
                                             const FabricContext& context);

// One fabric as the registry found it.
struct FabricSlot {
  std::string name;    // fabric name (for a plugin: its path)
  std::string origin;  // "built-in" or the plugin's path
  bool needs_hardware = false;
  Status status;       // ok, or why the fabric is not usable
  std::unique_ptr<Fabric> fabric;  // set when status is ok
};

// Every fabric linked in and every configured plugin, created once for the calling rank. Owns the
// fabrics; keep it alive as long as any comm is in use.
class FabricRegistry {
 public:
  // Never fails as a whole: a fabric that cannot start is recorded in its slot with the reason
  // and logged (INFO for unavailable, WARN for other failures). `config` must outlive the registry.
  // Where KIZUNA_FABRIC names no fabric, one whose FabricRegistration::started_by_default says no
  // is left unstarted (its slot says why) unless `every`: tools and conformance suites that
  // measure or check each fabric linked in.
  static std::unique_ptr<FabricRegistry> Create(const Config& config, const FabricContext& context,
                                                bool every = false);

  const std::vector<FabricSlot>& fabrics() const { return slots_; }
  // The available fabric of that name, or nullptr.
  Fabric* Find(std::string_view name) const;
  // The fabric to use: the first available one named in KIZUNA_FABRIC (Config::fabric, in
  // preference order; an entry "name:device" names the fabric "name" and leaves the device part
  // to that fabric, e.g. "ofi:shm"), or, when that list is empty, the first available one in registration
  // order. kUnavailable naming every candidate and why it is not usable when there is none.
  Result<Fabric*> Select() const;
  // Every available fabric, in preference order: the fabrics named in KIZUNA_FABRIC in the order
  // listed (entries "name:device" count as "name"; a fabric named twice is listed once), or, when
  // that list is empty, every available fabric: direct fabrics — every device point-to-point, as
  // directconnect's ports — first (a direct fabric serves only the pairs it has links for, and
  // those best), then the others by Fabric::default_rank, ties in registration order (built-ins,
  // then plugins; registration order follows the binary's link order, which ranks nothing: a
  // fabric's rank says what it is, e.g. plain sockets before sockets under ofi_rxm). Fabrics that are not
  // available here are left out. kUnavailable, naming every candidate and
  // why it is not usable, when none is. A communicator uses them all: per pair of ranks, the first
  // fabric that connects the two (collectives/transport/transport.h).
  Result<std::vector<Fabric*>> SelectAll() const;

 private:
  explicit FabricRegistry(const Config* config) : config_(config) {}
  const Config* config_;
  std::vector<FabricSlot> slots_;
};

}  // namespace kizuna::fabric

// Registers a built-in fabric: KZ_REGISTER_FABRIC(directconnect, &CreateFabric, false);
#define KZ_REGISTER_FABRIC(name, factory, needs_hardware)                \
  [[maybe_unused]] static const bool kz_fabric_registered_##name =       \
      ::kizuna::fabric::RegisterFabric({#name, factory, needs_hardware})
// The same with FabricRegistration::started_by_default.
#define KZ_REGISTER_FABRIC_WHEN(name, factory, needs_hardware, started_by_default) \
  [[maybe_unused]] static const bool kz_fabric_registered_##name =                 \
      ::kizuna::fabric::RegisterFabric({#name, factory, needs_hardware, started_by_default})
