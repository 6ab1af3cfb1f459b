#include "runtime/device/registry.h"

#include <mutex>

#include "runtime/device/plugin_backend.h"
#include "runtime/logging.h"

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
  auto registry = std::make_unique<DeviceRegistry>();
  for (const BackendRegistration& reg : RegisteredDeviceBackends()) {
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
  for (const std::string& path : config.device_plugins) {
    BackendSlot slot{path, path, false, Status::Ok(), nullptr};
    auto backend = LoadDevicePlugin(path, config);
    if (backend.ok()) {
      slot.name = std::string((*backend)->name());
      slot.backend = std::move(backend).value();
    } else {
      slot.status = backend.status();
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
