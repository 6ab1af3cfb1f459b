// The backend registry. In-tree backends register a factory at static-initialisation time
// (KZ_REGISTER_DEVICE_BACKEND in the backend's backend.cc; its Bazel library is alwayslink), and
// plugins named in KIZUNA_DEVICE_PLUGINS are loaded with dlopen when a DeviceRegistry is created.
// The engine and the runtime only ever see Backend / Device interfaces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::device {

// Creates a backend from the configuration. Returns kUnavailable (with the reason: no driver, no
// device, ...) when the backend cannot run on this machine; any other error is a real failure.
using BackendFactory = Result<std::unique_ptr<Backend>> (*)(const Config& config);

struct BackendRegistration {
  std::string name;
  BackendFactory factory;
  // true for backends that need hardware (cuda, level_zero): their unavailability is expected on
  // machines without it, and tests skip them saying why.
  bool needs_hardware;
};

// Called by KZ_REGISTER_DEVICE_BACKEND. Returns true so it can initialise a static.
bool RegisterDeviceBackend(BackendRegistration registration);
// The built-in factories, in registration order.
std::vector<BackendRegistration> RegisteredDeviceBackends();

// One backend as the registry found it.
struct BackendSlot {
  std::string name;    // backend name (for a plugin that failed to load or was refused: its path)
  std::string origin;  // "built-in" or the plugin's canonical path
  bool needs_hardware = false;
  Status status;       // ok, or why the backend is not usable
  std::unique_ptr<Backend> backend;  // set when status is ok
};

// Every backend the configuration allows, created once. Owns the backends (and through them the
// devices); keep it alive as long as any device, buffer, stream or event is in use.
class DeviceRegistry {
 public:
  // Never fails as a whole: a backend that cannot start is recorded in its slot with the reason
  // and logged (INFO for unavailable hardware, WARN for a broken plugin). `config` must outlive
  // the registry.
  //
  // Plugins: each path of config.device_plugins that names a file (contains a '/') is made
  // canonical (realpath), and each file is loaded once however often, and however spelled, it is
  // listed; a name without '/' is passed to dlopen as written (its library search) and matched as
  // written. Backend names are unique: a plugin whose name an earlier slot already has (a built-in
  // or an earlier plugin) is unloaded again and its slot records kInvalidArgument "backend name
  // 'x' is already taken by <origin>", so no plugin can stand in for another backend.
  static std::unique_ptr<DeviceRegistry> Create(const Config& config);
  // The same with these built-in registrations instead of RegisteredDeviceBackends(): for tests.
  static std::unique_ptr<DeviceRegistry> Create(const Config& config,
                                                const std::vector<BackendRegistration>& built_ins);

  const std::vector<BackendSlot>& backends() const { return slots_; }
  // The available backend of that name, or nullptr.
  Backend* Find(std::string_view name) const;
  // Every device of every available backend, in registry order.
  std::vector<Device*> devices() const;

 private:
  std::vector<BackendSlot> slots_;
};

}  // namespace kizuna::device

// Registers a built-in backend: KZ_REGISTER_DEVICE_BACKEND(host_emulated, &CreateBackend, false);
#define KZ_REGISTER_DEVICE_BACKEND(name, factory, needs_hardware)               \
  [[maybe_unused]] static const bool kz_device_backend_registered_##name =      \
      ::kizuna::device::RegisterDeviceBackend({#name, factory, needs_hardware})
