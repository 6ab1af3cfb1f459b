// Behaviour specific to the emulated backend, and the main of its test binary (with memory_test.cc
// and stream_test.cc): registration, the KIZUNA_EMULATED_DEVICES=0 switch, device properties
// (also in opaque mode) and host-wide uuids. The generic contract is the device conformance suite's job
// (tests/conformance/device/).

#include <cstdint>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "devices/host_emulated/test_util.h"
#include "runtime/core/config.h"
#include "runtime/device/registry.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated::test {
namespace {

// ---- Registration and properties ----

TEST(HostEmulatedBackend, IsRegisteredAsBuiltIn) {
  bool found = false;
  for (const auto& reg : device::RegisteredDeviceBackends()) {
    if (reg.name != "host_emulated") continue;
    found = true;
    EXPECT_FALSE(reg.needs_hardware);
  }
  EXPECT_TRUE(found) << "the registration in backend.cc was dropped by the linker";
}

TEST(HostEmulatedBackend, ZeroDevicesIsUnavailable) {
  const Config config = ParseConfig({{"KIZUNA_EMULATED_DEVICES", "0"}}).config;
  auto r = CreateHostEmulatedBackend(config);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(HasCode(r.status(), StatusCode::kUnavailable));
  EXPECT_TRUE(Mentions(r.status(), "disabled by KIZUNA_EMULATED_DEVICES=0"));

  // The registry records it as unavailable (a skip, not a failure).
  auto registry = device::DeviceRegistry::Create(config);
  EXPECT_EQ(registry->Find("host_emulated"), nullptr);
  bool slot_found = false;
  for (const auto& slot : registry->backends()) {
    if (slot.name != "host_emulated") continue;
    slot_found = true;
    EXPECT_TRUE(HasCode(slot.status, StatusCode::kUnavailable));
  }
  EXPECT_TRUE(slot_found);

  Config negative;
  negative.emulated_devices = -1;
  EXPECT_TRUE(HasCode(CreateHostEmulatedBackend(negative).status(), StatusCode::kInvalidArgument));
}

TEST(HostEmulatedBackend, PropertiesAndHostWideUuids) {
  Config c;
  c.emulated_devices = 3;
  c.emu_mem_bytes = 1 << 20;
  c.emu_copy_gbps = 2.5;
  c.emu_reduce_gbps = 1.5;
  c.emu_launch_us = 7;
  Emu a(c), b(c);
  ASSERT_EQ(a.backend().device_count(), 3);
  EXPECT_EQ(a.backend().name(), "host_emulated");
  EXPECT_EQ(a.backend().device(3), nullptr);
  EXPECT_EQ(a.backend().device(-1), nullptr);
  std::set<std::string> uuids;
  for (int i = 0; i < 3; ++i) {
    const auto& p = a.dev(i).properties();
    EXPECT_EQ(p.backend, "host_emulated");
    EXPECT_EQ(p.index, i);
    EXPECT_EQ(p.name, "emulated accelerator " + std::to_string(i));
    EXPECT_EQ(p.uuid.rfind("emu-", 0), 0u) << p.uuid;
    EXPECT_EQ(p.uuid.substr(p.uuid.size() - 2), "-" + std::to_string(i)) << p.uuid;
    // Another instance (as in another process on this host) sees the same device identity.
    EXPECT_EQ(p.uuid, b.dev(i).properties().uuid);
    uuids.insert(p.uuid);
    EXPECT_EQ(p.memory_bytes, uint64_t{1} << 20);
    EXPECT_DOUBLE_EQ(p.copy_gbps, 2.5);
    EXPECT_DOUBLE_EQ(p.reduce_gbps, 1.5);
    EXPECT_DOUBLE_EQ(p.launch_latency_us, 7);
    EXPECT_TRUE(p.host_accessible);
    EXPECT_TRUE(p.export_fd);
    EXPECT_FALSE(p.export_opaque);
    EXPECT_FALSE(p.export_dmabuf);
    EXPECT_EQ(a.dev(i).label(), "host_emulated:" + std::to_string(i));
  }
  EXPECT_EQ(uuids.size(), 3u);

  Emu unthrottled(SmallConfig());
  const auto& p = unthrottled.dev(0).properties();
  EXPECT_GT(p.memory_bytes, uint64_t{0});  // the host's physical memory
  EXPECT_EQ(p.copy_gbps, 0);
  EXPECT_EQ(p.reduce_gbps, 0);
  EXPECT_EQ(p.launch_latency_us, 0);
}

TEST(HostEmulatedBackend, OpaqueModeIsNotHostAccessible) {
  const ParsedConfig parsed = ParseConfig({{"KIZUNA_EMU_OPAQUE", "1"}, {"KIZUNA_EMULATED_DEVICES", "2"}});
  EXPECT_TRUE(parsed.warnings.empty());
  ASSERT_TRUE(parsed.config.emu_opaque);
  Emu emu(parsed.config);
  for (int i = 0; i < 2; ++i) {
    const auto& p = emu.dev(i).properties();
    EXPECT_FALSE(p.host_accessible);
    EXPECT_TRUE(p.export_fd);  // export and import keep working (memory_test.cc)
    EXPECT_FALSE(p.export_opaque);
    EXPECT_FALSE(p.export_dmabuf);
    EXPECT_EQ(p.uuid, Emu(SmallConfig()).dev(i).properties().uuid) << "the mode does not change the device";
  }
  // A DMA-BUF export is not something a memfd can be: refused in both modes.
  auto buf = emu.Alloc(0, 4096);
  ASSERT_NE(buf, nullptr);
  EXPECT_TRUE(HasCode(emu.dev(0).ExportDmaBuf(*buf, 0, 4096).status(), StatusCode::kNotSupported));

  EXPECT_FALSE(ParseConfig({}).config.emu_opaque);  // off unless asked for
  EXPECT_FALSE(ParseConfig({{"KIZUNA_EMU_OPAQUE", "yes"}}).warnings.empty());
}

}  // namespace
}  // namespace kizuna::host_emulated::test

int main(int argc, char** argv) {
  // The opaque-memory death tests would fork a process that has stream threads (and oneTBB's):
  // the threadsafe style re-executes the binary for each death test instead. Set before
  // InitGoogleTest, so --gtest_death_test_style still overrides it.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
