// How the device registry adds plugins: each plugin file once, however it is spelled, and each
// backend name once (a plugin cannot take a name another plugin or a built-in backend holds).
#include "runtime/device/plugin_backend.h"

#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/device/registry.h"
#include "runtime/core/status.h"
#include "tests/device_plugin/plugin_test_util.h"

namespace kizuna::device {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(PluginRegistry, APluginListedTwiceIsLoadedOnce) {
  Config config = TestConfig();
  // The same file spelled three ways (as KIZUNA_DEVICE_PLUGINS and --plugin may name it).
  config.device_plugins = {g_example_plugin, "./" + g_example_plugin, Canonical(g_example_plugin)};
  auto registry = DeviceRegistry::Create(config, {});
  ASSERT_EQ(registry->backends().size(), 1u);
  const BackendSlot& slot = registry->backends()[0];
  EXPECT_TRUE(slot.status.ok()) << slot.status.ToString();
  EXPECT_EQ(slot.name, "example");
  EXPECT_EQ(slot.origin, Canonical(g_example_plugin));
  EXPECT_EQ(registry->devices().size(), 2u);
}

TEST(PluginRegistry, ASecondPluginWithATakenNameIsRefused) {
  const std::string copy = CopyOfExamplePlugin("libkz_example_copy.so");
  Config config = TestConfig();
  config.device_plugins = {g_example_plugin, copy};
  auto registry = DeviceRegistry::Create(config, {});
  ASSERT_EQ(registry->backends().size(), 2u);
  const BackendSlot& first = registry->backends()[0];
  const BackendSlot& second = registry->backends()[1];
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_EQ(second.status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(second.status.message(),
              AllOf(HasSubstr(Canonical(copy)), HasSubstr("backend name 'example' is already taken by device plugin " +
                                                          Canonical(g_example_plugin))));
  EXPECT_EQ(second.backend, nullptr);
  EXPECT_EQ(second.name, Canonical(copy));
  EXPECT_EQ(registry->Find("example"), first.backend.get());
  EXPECT_EQ(registry->devices().size(), 2u) << "the refused copy's devices must not appear";
}

Result<std::unique_ptr<Backend>> UnavailableStandIn(const Config&) {
  return Unavailable("test stand-in for a built-in backend without its hardware");
}

TEST(PluginRegistry, APluginCannotImpersonateABuiltInBackend) {
  // A built-in called "example" that cannot run here: a plugin of that name must not take its
  // place (as a plugin named host_emulated must not replace the emulated devices).
  Config config = TestConfig();
  config.device_plugins = {g_example_plugin};
  auto registry = DeviceRegistry::Create(config, {BackendRegistration{"example", &UnavailableStandIn, false}});
  ASSERT_EQ(registry->backends().size(), 2u);
  EXPECT_EQ(registry->backends()[0].status.code(), StatusCode::kUnavailable);
  const BackendSlot& plugin = registry->backends()[1];
  EXPECT_EQ(plugin.status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(plugin.status.message(), HasSubstr("backend name 'example' is already taken by the built-in backend"));
  EXPECT_EQ(registry->Find("example"), nullptr);
  EXPECT_TRUE(registry->devices().empty());
}

}  // namespace
}  // namespace kizuna::device
