#include "fabric/registry.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "fabric/plugin_fabric.h"
#include "runtime/core/logging.h"

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
  // Then the configured plugins, in order: a process that needs one fabric by name (a test's
  // second rank, a child process) finds a plugin the same way as a built-in. A plugin's name is
  // known only once it is loaded; the ones that are not `name` are released again at once.
  std::string plugins;
  for (const std::string& path : config.fabric_plugins) {
    auto fabric = LoadFabricPlugin(path, config, context);
    if (fabric.ok() && (*fabric)->name() == name) return fabric;
    plugins += fmt::format("{}{} ({})", plugins.empty() ? "" : ", ", path,
                           fabric.ok() ? (*fabric)->name() : fabric.status().ToString());
  }
  return InvalidArgument(fmt::format("no fabric named '{}' is linked in (registered: {}){}", name, RegisteredNames(),
                                     plugins.empty() ? "" : "; nor is it among the fabric plugins: " + plugins));
}

std::unique_ptr<FabricRegistry> FabricRegistry::Create(const Config& config, const FabricContext& context,
                                                       bool every) {
  std::unique_ptr<FabricRegistry> registry(new FabricRegistry(&config));
  for (const FabricRegistration& reg : RegisteredFabrics()) {
    FabricSlot slot{reg.name, "built-in", reg.needs_hardware, Status::Ok(), nullptr};
    if (std::string why;
        !every && config.fabric.empty() && reg.started_by_default != nullptr && !reg.started_by_default(&why)) {
      slot.status = Unavailable(fmt::format("not started: {} (KIZUNA_FABRIC={} starts it)", why, reg.name));
      LogSlot(slot);
      registry->slots_.push_back(std::move(slot));
      continue;
    }
    auto fabric = reg.factory(config, context);
    if (fabric.ok()) {
      slot.fabric = std::move(fabric).value();
    } else {
      slot.status = fabric.status();
    }
    LogSlot(slot);
    registry->slots_.push_back(std::move(slot));
  }
  // Fabric plugins (KIZUNA_FABRIC_PLUGINS), after the built-in fabrics, in the order listed. A
  // plugin that fails to load is a visible slot (named by its path), never a silently missing
  // fabric; one whose name is taken would make KIZUNA_FABRIC ambiguous, so it is refused.
  for (size_t i = 0; i < config.fabric_plugins.size(); ++i) {
    const std::string& path = config.fabric_plugins[i];
    if (std::find(config.fabric_plugins.begin(), config.fabric_plugins.begin() + i, path) !=
        config.fabric_plugins.begin() + i) {
      KZ_INFO(kLogInit, "fabric plugin {} is listed more than once; it is loaded once", path);
      continue;
    }
    FabricSlot slot{path, path, false, Status::Ok(), nullptr};
    auto fabric = LoadFabricPlugin(path, config, context);
    if (!fabric.ok()) {
      slot.status = fabric.status();
    } else {
      const std::string name = (*fabric)->name();
      const FabricSlot* taken = nullptr;
      for (const FabricSlot& s : registry->slots_)
        if (s.name == name) taken = &s;
      if (taken != nullptr) {
        slot.status = InvalidArgument(fmt::format(
            "fabric plugin {}: fabric name '{}' is already taken by {}", path, name,
            taken->origin == "built-in" ? std::string("the built-in fabric") : "fabric plugin " + taken->origin));
      } else {
        slot.name = name;
        slot.fabric = std::move(fabric).value();
      }
    }
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
    for (const std::string& entry : config_->fabric) {
      // "ofi:shm" names the fabric "ofi" (the part after ':' is that fabric's own device choice).
      const std::string wanted = entry.substr(0, entry.find(':'));
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

Result<std::vector<Fabric*>> FabricRegistry::SelectAll() const {
  std::vector<Fabric*> chosen;
  std::string names, reasons;
  auto take = [&](const FabricSlot& s) {
    if (std::find(chosen.begin(), chosen.end(), s.fabric.get()) != chosen.end()) return;
    chosen.push_back(s.fabric.get());
    names += fmt::format("{}{}", names.empty() ? "" : ", ", s.name);
  };
  auto note = [&reasons](std::string_view name, std::string_view why) {
    reasons += fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", name, why);
  };
  if (!config_->fabric.empty()) {
    std::vector<std::string> seen;
    for (const std::string& entry : config_->fabric) {
      // "ofi:shm" names the fabric "ofi"; "ofi:shm,ofi:tcp" lists it once.
      const std::string wanted = entry.substr(0, entry.find(':'));
      if (std::find(seen.begin(), seen.end(), wanted) != seen.end()) continue;
      seen.push_back(wanted);
      bool known = false;
      for (const FabricSlot& s : slots_) {
        if (s.name != wanted) continue;
        known = true;
        if (s.fabric != nullptr) {
          take(s);
        } else {
          note(s.name, s.status.ToString());
        }
      }
      if (!known) note(wanted, "not linked in");
    }
    if (chosen.empty())
      return Unavailable(fmt::format("none of the fabrics named in KIZUNA_FABRIC is usable ({})", reasons));
    KZ_INFO(kLogInit, "fabrics selected, in preference order: {} (KIZUNA_FABRIC)", names);
    return chosen;
  }
  // Direct fabrics first, then the others, each group in registration order. Registration order
  // alone follows the link order of the binary, which says nothing about which fabric is better;
  // a fabric whose devices are all point-to-point (direct links) serves only the pairs it is
  // cabled for, and for those it is the shorter path (NCCL likewise tries P2P/SHM before NET).
  auto direct = [](const Fabric& f) {
    if (f.device_count() == 0) return false;
    for (int d = 0; d < f.device_count(); ++d) {
      auto p = f.properties(d);
      if (!p.ok() || !p->point_to_point) return false;
    }
    return true;
  };
  // The others by their default rank (Fabric::DefaultRank): between hosts, a fabric with its
  // own path to the NIC before plain sockets, and plain sockets before sockets under a layer.
  std::vector<const FabricSlot*> others;
  for (const FabricSlot& s : slots_) {
    if (s.fabric != nullptr && direct(*s.fabric)) take(s);
    if (s.fabric != nullptr && !direct(*s.fabric)) others.push_back(&s);
  }
  std::stable_sort(others.begin(), others.end(), [](const FabricSlot* a, const FabricSlot* b) {
    return a->fabric->default_rank() < b->fabric->default_rank();
  });
  for (const FabricSlot* s : others) take(*s);
  for (const FabricSlot& s : slots_)
    if (s.fabric == nullptr) note(s.name, s.status.ToString());
  if (chosen.empty())
    return Unavailable(slots_.empty() ? std::string("no fabric is linked in")
                                      : fmt::format("no fabric is usable ({})", reasons));
  KZ_INFO(kLogInit,
          "fabrics selected, in preference order: {} (every available one: direct links first, then by "
          "default rank)",
          names);
  return chosen;
}

}  // namespace kizuna::fabric
