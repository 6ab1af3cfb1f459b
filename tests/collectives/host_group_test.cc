// SameHostGroup (collectives/direct/same_host_group.h) in one process: which devices it takes, and that memory it stops
// using waits for ReleaseRetired. The protocol between processes is tested by tests/collectives/process_test.sh.
#include "collectives/direct/same_host_group.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/core/config.h"

namespace kizuna::collectives {
namespace {

// One rank's AllGather: its own bytes back.
SameHostGroup::AllGather Alone() {
  return [](std::span<const uint8_t> bytes) -> Result<std::vector<std::vector<uint8_t>>> {
    return std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(bytes.begin(), bytes.end())};
  };
}

// An emulated device that cannot name the allocation behind an address (the device layer's
// default FindAllocation), as a backend whose exports are not per-allocation files.
class Unnamed final : public device::Device {
 public:
  Unnamed(device::Device& inner, const Config* config) : Device(inner.properties(), config), inner_(inner) {}

 protected:
  Result<std::unique_ptr<device::Buffer>> DoAllocate(size_t bytes) override { return inner_.Allocate(bytes); }
  Result<std::unique_ptr<device::Stream>> DoCreateStream() override { return inner_.CreateStream(); }
  Result<std::unique_ptr<device::Event>> DoCreateEvent() override { return inner_.CreateEvent(); }

 private:
  device::Device& inner_;
};

class HostGroupTest : public testing::Test {
 protected:
  void SetUp() override {
    config_.emulated_devices = 1;
    config_.timeout_s = 10;
    auto b = host_emulated::CreateHostEmulatedBackend(config_);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(*b);
  }
  device::Device& device() { return *backend_->device(0); }

  Config config_;
  std::unique_ptr<device::Backend> backend_;
};

TEST_F(HostGroupTest, AnEmulatedDeviceFormsAGroup) {
  auto g = SameHostGroup::Create(0, 1, device(), Alone());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->nranks(), 1);
  EXPECT_EQ((*g)->cached_imports(), 0u);
  EXPECT_EQ((*g)->retired(), 0u);
}

TEST_F(HostGroupTest, ADeviceThatCannotNameAllocationsIsNotSupported) {
  // Every fused call would fail when it publishes its buffers: the group is declined at once,
  // so the engine never plans a fused collective through it.
  Unnamed unnamed(device(), &config_);
  auto g = SameHostGroup::Create(0, 1, unnamed, Alone());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotSupported) << g.status().ToString();
  EXPECT_NE(g.status().message().find("cannot name the allocation"), std::string::npos) << g.status().ToString();
}

}  // namespace
}  // namespace kizuna::collectives
