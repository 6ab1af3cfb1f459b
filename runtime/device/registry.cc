#include "runtime/device/registry.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "runtime/device/plugin_backend.h"
#include "runtime/core/logging.h"

namespace kizuna::device {
namespace {

std::mutex& RegistrationMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<BackendRegistration>& Registrations() {
  static std::vector<BackendRegistration> regs;
  return regs;
}

void LogSlot(const BackendSlot& slot) {
  if (slot.status.ok()) {
    KZ_INFO(kLogInit, "device backend {} ({}): {} device(s)", slot.name, slot.origin, slot.backend->device_count());
  } else if (slot.status.code() == StatusCode::kUnavailable) {
    KZ_INFO(kLogInit, "device backend {} ({}) unavailable: {}", slot.name, slot.origin, slot.status.message());
  } else {
    KZ_WARN(kLogInit, "device backend {} ({}) failed: {}", slot.name, slot.origin, slot.status.ToString());
  }
}

// The form under which a plugin is loaded and recognised when listed twice (registry.h).
std::string CanonicalPluginPath(const std::string& path) {
  if (path.find('/') == std::string::npos) return path;  // dlopen searches the library path for it
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) return path;  // the loader reports what is wrong
  return resolved;
}

}  // namespace

bool RegisterDeviceBackend(BackendRegistration registration) {
  std::lock_guard<std::mutex> lock(RegistrationMutex());
  Registrations().push_back(std::move(registration));
  return true;
}

std::vector<BackendRegistration> RegisteredDeviceBackends() {
  std::lock_guard<std::mutex> lock(RegistrationMutex());
  return Registrations();
}

std::unique_ptr<DeviceRegistry> DeviceRegistry::Create(const Config& config) {
  return Create(config, RegisteredDeviceBackends());
}

std::unique_ptr<DeviceRegistry> DeviceRegistry::Create(const Config& config,
                                                       const std::vector<BackendRegistration>& built_ins) {
  auto registry = std::make_unique<DeviceRegistry>();
  // The earlier slot that holds the backend name `name`: a built-in (available or not: a plugin
  // must not stand in for a built-in that cannot start here) or a loaded plugin. Plugins that
  // failed are named by their path, not by a backend name.
  auto taken_by = [&registry](std::string_view name) -> const BackendSlot* {
    for (const BackendSlot& s : registry->slots_)
      if (s.name == name && (s.backend != nullptr || s.origin == "built-in")) return &s;
    return nullptr;
  };
  for (const BackendRegistration& reg : built_ins) {
    BackendSlot slot{reg.name, "built-in", reg.needs_hardware, Status::Ok(), nullptr};
    auto backend = reg.factory(config);
    if (backend.ok()) {
      slot.backend = std::move(backend).value();
    } else {
      slot.status = backend.status();
    }
    LogSlot(slot);
    registry->slots_.push_back(std::move(slot));
  }
  std::vector<std::string> loaded_files;  // canonical paths, in order
  for (const std::string& listed : config.device_plugins) {
    const std::string path = CanonicalPluginPath(listed);
    if (std::find(loaded_files.begin(), loaded_files.end(), path) != loaded_files.end()) {
      // Listed twice (say in KIZUNA_DEVICE_PLUGINS and on a command line): a second load would
      // give a second backend of the same name and devices.
      KZ_INFO(kLogInit, "device plugin {} is listed more than once{}; it is loaded once", path,
              listed == path ? "" : fmt::format(" (here as {})", listed));
      continue;
    }
    loaded_files.push_back(path);
    BackendSlot slot{path, path, false, Status::Ok(), nullptr};
    auto backend = LoadDevicePlugin(path, config);
    if (!backend.ok()) {
      slot.status = backend.status();
    } else if (const BackendSlot* earlier = taken_by((*backend)->name())) {
      // Another file with a taken name: a copy of a plugin, or one that would impersonate a
      // built-in backend. Dropping the backend finalizes and unloads it again.
      slot.status = InvalidArgument(
          fmt::format("device plugin {}: backend name '{}' is already taken by {}", path, (*backend)->name(),
                      earlier->origin == "built-in" ? "the built-in backend" : "device plugin " + earlier->origin));
    } else {
      slot.name = std::string((*backend)->name());
      slot.backend = std::move(backend).value();
    }
    LogSlot(slot);
    registry->slots_.push_back(std::move(slot));
  }
  return registry;
}

Backend* DeviceRegistry::Find(std::string_view name) const {
  for (const BackendSlot& s : slots_)
    if (s.backend != nullptr && s.name == name) return s.backend.get();
  return nullptr;
}

std::vector<Device*> DeviceRegistry::devices() const {
  std::vector<Device*> out;
  for (const BackendSlot& s : slots_) {
    if (s.backend == nullptr) continue;
    for (int i = 0; i < s.backend->device_count(); ++i) out.push_back(s.backend->device(i));
  }
  return out;
}

}  // namespace kizuna::device
