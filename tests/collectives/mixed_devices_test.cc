// Ranks on different kinds of device in one communicator: the emulated accelerator and a vendor
// plugin's devices (the example plugin, loaded with dlopen), exchanging through the same engine.
// Usage: mixed_devices_test --plugin=<path to libkz_example_device.so>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/communicator.h"
#include "runtime/device/registry.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

std::string g_plugin;

TEST(MixedDevices, EmulatedAndPluginDevicesInOneCommunicator) {
  ASSERT_FALSE(g_plugin.empty()) << "pass --plugin=<path to the example device plugin>";
  Config config = WorldConfig(2);
  config.device_plugins = {g_plugin};
  auto registry = device::DeviceRegistry::Create(config);
  std::vector<device::Device*> emulated, plugin;
  for (device::Device* d : registry->devices())
    (d->properties().backend == "host_emulated" ? emulated : plugin).push_back(d);
  ASSERT_GE(emulated.size(), 2u);
  ASSERT_GE(plugin.size(), 2u) << "the example plugin did not load";
  // Ranks 0 and 2 emulated, 1 and 3 on the plugin: every neighbour pair crosses device kinds.
  std::vector<device::Device*> devices = {emulated[0], plugin[0], emulated[1], plugin[1]};
  CommOptions options;
  options.config = &config;
  options.staging_bytes = 2u << 20;
  auto comms = Communicator::CreateLocal(devices, options);
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  const size_t count = 10007;
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  std::vector<std::unique_ptr<device::Stream>> streams;
  for (int r = 0; r < 4; ++r) {
    auto a = devices[r]->Allocate(count * 4), b = devices[r]->Allocate(4 * count * 4);
    auto s = devices[r]->CreateStream();
    ASSERT_TRUE(a.ok() && b.ok() && s.ok());
    for (size_t i = 0; i < count; ++i) static_cast<float*>((*a)->data())[i] = static_cast<float>(r * 10 + i % 3);
    in.push_back(std::move(*a));
    out.push_back(std::move(*b));
    streams.push_back(std::move(*s));
  }
  for (collectives::Algorithm algo :
       {collectives::Algorithm::kRing, collectives::Algorithm::kTree, collectives::Algorithm::kRhd}) {
    CallOptions call;
    call.algorithm = algo;
    for (int r = 0; r < 4; ++r)
      ASSERT_TRUE((*comms)[r]->AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                         *streams[r], call).ok());
    for (int r = 0; r < 4; ++r) ASSERT_TRUE(streams[r]->Synchronize(Deadline::AfterSeconds(60)).ok());
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE((*comms)[r]->AsyncError().ok()) << (*comms)[r]->AsyncError().ToString();
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(static_cast<float*>(out[r]->data())[i], static_cast<float>(60 + 4 * (i % 3)))
            << collectives::AlgorithmName(algo) << " rank " << r << " element " << i;
    }
  }
  // AllGather across the kinds too.
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE((*comms)[r]->AllGather(in[r]->data(), out[r]->data(), count, DataType::kFloat32, *streams[r]).ok());
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(streams[r]->Synchronize(Deadline::AfterSeconds(60)).ok());
  for (int r = 0; r < 4; ++r)
    for (int q = 0; q < 4; ++q) ASSERT_EQ(static_cast<float*>(out[r]->data())[q * count + 1], q * 10 + 1.0f);
  streams.clear();
  in.clear();
  out.clear();
  comms->clear();
}

}  // namespace
}  // namespace kizuna::test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--plugin=", 9) == 0) kizuna::test::g_plugin = argv[i] + 9;
  return RUN_ALL_TESTS();
}
