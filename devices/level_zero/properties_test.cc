// Property translation, pure: what a device reports becomes DeviceProperties, and the staged
// reduce's throughput is what the cost model is told.
#include "devices/level_zero/properties.h"

#include <cstring>

#include <gtest/gtest.h>

namespace kizuna::level_zero {
namespace {

ze_device_uuid_t Uuid() {
  ze_device_uuid_t u{};
  for (int i = 0; i < ZE_MAX_DEVICE_UUID_SIZE; ++i) u.id[i] = static_cast<uint8_t>(0x10 * (i % 16) + i);
  return u;
}

TEST(LevelZeroProperties, UuidText) {
  EXPECT_EQ(UuidText(Uuid()), "ZE-00112233-4455-6677-8899-aabbccddeeff");
  EXPECT_EQ(UuidText(ze_device_uuid_t{}), "ZE-00000000-0000-0000-0000-000000000000");
}

TEST(LevelZeroProperties, PciBusIdText) {
  EXPECT_EQ(PciBusIdText({0, 0x3a, 0, 0}), "0000:3a:00.0");
  EXPECT_EQ(PciBusIdText({0x10, 0x9c, 0x1f, 7}), "0010:9c:1f.7");
}

TEST(LevelZeroProperties, PeakMemoryGbps) {
  // 1600 MHz x 2 x 8192 bits / 8 = 3276.8 GB/s.
  EXPECT_DOUBLE_EQ(PeakMemoryGbps(1600, 8192), 3276.8);
  EXPECT_EQ(PeakMemoryGbps(0, 8192), 0);
  EXPECT_EQ(PeakMemoryGbps(1600, 0), 0);
}

TEST(LevelZeroProperties, StagedReduceIsSlowerThanEitherPart) {
  // Two inputs, PCIe 10 GB/s, CPU 40 GB/s: per byte of one input, 2/10 + 2/40 + 1/10 = 0.35 ns,
  // for 2 bytes of input read: 2 / 0.35 GB/s.
  EXPECT_NEAR(StagedReduceGbps(10, 40), 2 / 0.35, 1e-9);
  // One input (a scale): 1/10 + 1/40 + 1/10.
  EXPECT_NEAR(StagedReduceGbps(10, 40, 1), 1 / 0.225, 1e-9);
  // More inputs amortize the copy back: closer to the bound n / (n/p + n/c) = 8 GB/s.
  EXPECT_GT(StagedReduceGbps(10, 40, 8), StagedReduceGbps(10, 40, 2));
  EXPECT_LT(StagedReduceGbps(10, 40, 8), 8.0);
  EXPECT_EQ(StagedReduceGbps(0, 40), 0);
  EXPECT_EQ(StagedReduceGbps(10, -1), 0);
  EXPECT_EQ(StagedReduceGbps(10, 40, 0), 0);
}

TEST(LevelZeroProperties, StagingPcieGbps) {
  EXPECT_DOUBLE_EQ(StagingPcieGbps(std::nullopt), kDefaultPcieGbps * kPcieEfficiency);
  ze_pci_ext_properties_t pci{};
  pci.maxSpeed.maxBandwidth = -1;  // unknown
  EXPECT_DOUBLE_EQ(StagingPcieGbps(pci), kDefaultPcieGbps * kPcieEfficiency);
  pci.maxSpeed.maxBandwidth = 63'000'000'000;  // PCIe 5.0 x16
  EXPECT_DOUBLE_EQ(StagingPcieGbps(pci), 63 * kPcieEfficiency);
}

DeviceFacts SampleFacts() {
  DeviceFacts f;
  f.device.type = ZE_DEVICE_TYPE_GPU;
  std::strcpy(f.device.name, "Intel(R) Data Center GPU Max 1550");
  f.device.uuid = Uuid();
  f.memories.resize(2);
  f.memories[0].totalSize = uint64_t{64} << 30;  // one per stack
  f.memories[0].maxClockRate = 1600;
  f.memories[0].maxBusWidth = 4096;
  f.memories[1] = f.memories[0];
  ze_pci_ext_properties_t pci{};
  pci.address = {0, 0x29, 0, 0};
  pci.maxSpeed.maxBandwidth = 31'500'000'000;
  f.pci = pci;
  f.external.memoryAllocationExportTypes = ZE_EXTERNAL_MEMORY_TYPE_FLAG_OPAQUE_FD | ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF;
  f.driver_ipc_memory = true;
  f.numa_node = 1;
  return f;
}

TEST(LevelZeroProperties, Translate) {
  const device::DeviceProperties p = TranslateProperties(SampleFacts(), 3);
  EXPECT_EQ(p.backend, "level_zero");
  EXPECT_EQ(p.index, 3);
  EXPECT_EQ(p.name, "Intel(R) Data Center GPU Max 1550");
  EXPECT_EQ(p.uuid, "ZE-00112233-4455-6677-8899-aabbccddeeff");
  EXPECT_EQ(p.memory_bytes, uint64_t{128} << 30);
  // Two memories of 1600 MHz x 2 x 4096 bits = 1638.4 GB/s each; a copy reads and writes.
  EXPECT_DOUBLE_EQ(p.copy_gbps, 2 * 1638.4 * kStreamingEfficiency / 2);
  // The reduce is the host-staged path, far below the memory: the engine must not think it fast.
  EXPECT_DOUBLE_EQ(p.reduce_gbps, StagedReduceGbps(31.5 * kPcieEfficiency, kHostReduceGbps));
  EXPECT_LT(p.reduce_gbps, 20.0);
  EXPECT_LT(p.reduce_gbps, p.copy_gbps / 50);
  EXPECT_DOUBLE_EQ(p.launch_latency_us, kLaunchLatencyUs);
  EXPECT_FALSE(p.host_accessible);
  EXPECT_FALSE(p.export_fd);
  EXPECT_TRUE(p.export_opaque);
  EXPECT_TRUE(p.export_dmabuf);
  EXPECT_EQ(p.pci_bus_id, "0000:29:00.0");
  EXPECT_EQ(p.numa_node, 1);
}

TEST(LevelZeroProperties, TranslateWhatIsMissing) {
  DeviceFacts f = SampleFacts();
  std::memset(f.device.name, 0, sizeof(f.device.name));
  f.memories.clear();
  f.pci.reset();
  f.external.memoryAllocationExportTypes = ZE_EXTERNAL_MEMORY_TYPE_FLAG_OPAQUE_FD;  // no DMA-BUF
  f.driver_ipc_memory = false;
  f.numa_node = -1;
  const device::DeviceProperties p = TranslateProperties(f, 0);
  EXPECT_EQ(p.name, "Level Zero device 0");
  EXPECT_EQ(p.memory_bytes, 0u);
  EXPECT_EQ(p.copy_gbps, 0);  // unknown, not a guess
  EXPECT_DOUBLE_EQ(p.reduce_gbps, StagedReduceGbps(kDefaultPcieGbps * kPcieEfficiency, kHostReduceGbps));
  EXPECT_FALSE(p.export_opaque);
  EXPECT_FALSE(p.export_dmabuf);
  EXPECT_EQ(p.pci_bus_id, "");
  EXPECT_EQ(p.numa_node, -1);
}

TEST(LevelZeroProperties, NameWithoutTerminator) {
  DeviceFacts f = SampleFacts();
  std::memset(f.device.name, 'x', sizeof(f.device.name));  // a driver filling all 256 bytes
  EXPECT_EQ(TranslateProperties(f, 0).name, std::string(sizeof(f.device.name), 'x'));
}

}  // namespace
}  // namespace kizuna::level_zero
