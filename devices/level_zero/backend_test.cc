// The backend as the registry sees it on a machine without a Level Zero driver (the build
// machines): registered as a hardware backend, unavailable with the reason (the loader's zeInit
// result, or the missing loader), zero devices. On a machine with a driver the unavailable-path
// checks skip, and the device conformance suite covers the backend instead.
#include "devices/level_zero/backend.h"

#include <string>

#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/device/registry.h"
#include "runtime/core/status.h"

namespace kizuna::level_zero {
namespace {

bool NamesTheReason(const Status& s) {
  return s.message().find("ZE_RESULT_") != std::string::npos ||
         s.message().find("cannot load libze_loader.so.1") != std::string::npos;
}

TEST(LevelZeroBackend, IsRegisteredAsHardwareBackend) {
  bool found = false;
  for (const auto& reg : device::RegisteredDeviceBackends()) {
    if (reg.name != "level_zero") continue;
    found = true;
    EXPECT_TRUE(reg.needs_hardware);
  }
  EXPECT_TRUE(found) << "the registration in backend.cc was dropped by the linker";
}

TEST(LevelZeroBackend, WithoutDriverIsUnavailableWithReason) {
  const Config config;
  auto backend = CreateLevelZeroBackend(config);
  if (backend.ok())
    GTEST_SKIP() << "a Level Zero device is present (" << (*backend)->device_count()
                 << " device(s)): run the device conformance suite instead";
  EXPECT_EQ(backend.status().code(), StatusCode::kUnavailable) << backend.status().ToString();
  EXPECT_TRUE(NamesTheReason(backend.status())) << backend.status().ToString();
}

TEST(LevelZeroBackend, RegistryRecordsTheReasonAndNoDevices) {
  const Config config;
  auto registry = device::DeviceRegistry::Create(config);
  const device::BackendSlot* slot = nullptr;
  for (const auto& s : registry->backends())
    if (s.name == "level_zero") slot = &s;
  ASSERT_NE(slot, nullptr) << "the registry has no level_zero slot";
  EXPECT_EQ(slot->origin, "built-in");
  EXPECT_TRUE(slot->needs_hardware);
  if (slot->status.ok()) GTEST_SKIP() << "a Level Zero device is present";
  EXPECT_EQ(slot->status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(NamesTheReason(slot->status)) << slot->status.ToString();
  EXPECT_EQ(slot->backend, nullptr);
  EXPECT_EQ(registry->Find("level_zero"), nullptr);
  for (device::Device* d : registry->devices()) EXPECT_NE(d->properties().backend, "level_zero");
}

}  // namespace
}  // namespace kizuna::level_zero
