#include "fabric/registry.h"

#include <mutex>

#include <fmt/format.h>

#include "runtime/logging.h"

namespace kizuna::fabric {
namespace {

std::mutex& RegistrationMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<FabricRegistration>& Registrations() {
  static std::vector<FabricRegistration> regs;
  return regs;
}

void LogSlot(const FabricSlot& slot) {
  if (slot.status.ok()) {
    KZ_INFO(kLogInit, "fabric {} ({}): {} device(s)", slot.name, slot.origin, slot.fabric->device_count());
  } else if (slot.status.code() == StatusCode::kUnavailable) {
    KZ_INFO(kLogInit, "fabric {} ({}) unavailable: {}", slot.name, slot.origin, slot.status.message());
  } else {
    KZ_WARN(kLogInit, "fabric {} ({}) failed: {}", slot.name, slot.origin, slot.status.ToString());
  }
}

std::string RegisteredNames() {
  std::string out;
  for (const FabricRegistration& r : RegisteredFabrics()) out += (out.empty() ? "" : ", ") + r.name;
  return out.empty() ? "(none linked in)" : out;
}

}  // namespace

bool RegisterFabric(FabricRegistration registration) {
  std::lock_guard<std::mutex> lock(RegistrationMutex());
  Registrations().push_back(std::move(registration));
  return true;
}

std::vector<FabricRegistration> RegisteredFabrics() {
  std::lock_guard<std::mutex> lock(RegistrationMutex());
  return Registrations();
}

Result<std::unique_ptr<Fabric>> CreateFabric(std::string_view name, const Config& config,
                                             const FabricContext& context) {
  for (const FabricRegistration& reg : RegisteredFabrics())
    if (reg.name == name) return reg.factory(config, context);
  return InvalidArgument(fmt::format("no fabric named '{}' is linked in (registered: {})", name, RegisteredNames()));
}

std::unique_ptr<FabricRegistry> FabricRegistry::Create(const Config& config, const FabricContext& context) {
  std::unique_ptr<FabricRegistry> registry(new FabricRegistry(&config));
  for (const FabricRegistration& reg : RegisteredFabrics()) {
    FabricSlot slot{reg.name, "built-in", reg.needs_hardware, Status::Ok(), nullptr};
    auto fabric = reg.factory(config, context);
    if (fabric.ok()) {
      slot.fabric = std::move(fabric).value();
    } else {
      slot.status = fabric.status();
    }
    LogSlot(slot);
    registry->slots_.push_back(std::move(slot));
  }
  // The seam for fabric plugins (see registry.h): until the loader exists, a configured plugin is
  // a visible failure rather than a silently missing fabric.
  for (const std::string& path : config.fabric_plugins) {
    FabricSlot slot{path, path, false,
                    NotSupported(fmt::format("fabric plugin {} not loaded: this build of kizuna has no fabric "
                                             "plugin loader yet (KIZUNA_FABRIC_PLUGINS is reserved for it)",
                                             path)),
                    nullptr};
    LogSlot(slot);
    registry->slots_.push_back(std::move(slot));
  }
  return registry;
}

Fabric* FabricRegistry::Find(std::string_view name) const {
  for (const FabricSlot& s : slots_)
    if (s.fabric != nullptr && s.name == name) return s.fabric.get();
  return nullptr;
}

Result<Fabric*> FabricRegistry::Select() const {
  std::string reasons;
  auto note = [&reasons](const FabricSlot& s) {
    reasons += fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", s.name, s.status.ToString());
  };
  if (!config_->fabric.empty()) {
    for (const std::string& wanted : config_->fabric) {
      bool known = false;
      for (const FabricSlot& s : slots_) {
        if (s.name != wanted) continue;
        known = true;
        if (s.fabric != nullptr) {
          KZ_INFO(kLogInit, "fabric {} selected (KIZUNA_FABRIC)", s.name);
          return s.fabric.get();
        }
        note(s);
      }
      if (!known) reasons += fmt::format("{}{}: not linked in", reasons.empty() ? "" : "; ", wanted);
    }
    return Unavailable(fmt::format("none of the fabrics named in KIZUNA_FABRIC is usable ({})", reasons));
  }
  for (const FabricSlot& s : slots_) {
    if (s.fabric != nullptr) {
      KZ_INFO(kLogInit, "fabric {} selected (first available)", s.name);
      return s.fabric.get();
    }
    note(s);
  }
  return Unavailable(slots_.empty() ? std::string("no fabric is linked in")
                                    : fmt::format("no fabric is usable ({})", reasons));
}

}  // namespace kizuna::fabric
