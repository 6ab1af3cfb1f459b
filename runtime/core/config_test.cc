#include "runtime/core/config.h"

#include <set>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

bool AnyWarningContains(const ParsedConfig& p, std::string_view text) {
  for (const std::string& w : p.warnings)
    if (w.find(text) != std::string::npos) return true;
  return false;
}

TEST(ConfigTest, DefaultsWithEmptyEnvironment) {
  ParsedConfig p = ParseConfig({});
  EXPECT_TRUE(p.warnings.empty());
  EXPECT_EQ(p.config.debug, LogLevel::kWarn);
  EXPECT_EQ(p.config.timeout_s, 600.0);
  EXPECT_EQ(p.config.emulated_devices, 8);
  EXPECT_FALSE(p.config.device.has_value());
  EXPECT_FALSE(p.config.emu_fail_alloc.has_value());
  EXPECT_FALSE(p.config.deterministic);
  EXPECT_TRUE(p.config.tuner_plugin.empty());
}

TEST(ConfigTest, ParsesEveryKind) {
  ParsedConfig p = ParseConfig({
      {"KIZUNA_DEBUG", "info"},
      {"KIZUNA_DEBUG_SUBSYS", "INIT,device"},
      {"KIZUNA_TIMEOUT", "2.5"},
      {"KIZUNA_DEVICE_PLUGINS", "/a/libx.so: /b/liby.so"},
      {"KIZUNA_TUNER_PLUGIN", " /opt/tuners/libmy_tuner.so "},
      {"KIZUNA_EMULATED_DEVICES", "3"},
      {"KIZUNA_DEVICE", "2"},
      {"KIZUNA_EMU_MEM_BYTES", "64M"},
      {"KIZUNA_EMU_COPY_GBPS", "12.5"},
      {"KIZUNA_EMU_LAUNCH_US", "0"},
      {"KIZUNA_EMU_FAIL_ALLOC", "4"},
      {"KIZUNA_EMU_OPAQUE", "1"},
      {"KIZUNA_EMU_SYNC_FREE", " 1 "},
      {"KIZUNA_FABRIC", "directconnect, ofi"},
      {"KIZUNA_DETERMINISTIC", "1"},
      {"KIZUNA_CHUNK_BYTES", "4KiB"},
      {"KIZUNA_IB_TC", "106"},
      {"KIZUNA_IB_ADDR_FAMILY", "ipv6"},
      {"OTHER_VARIABLE", "ignored"},
  });
  EXPECT_TRUE(p.warnings.empty()) << p.warnings[0];
  const Config& c = p.config;
  EXPECT_EQ(c.debug, LogLevel::kInfo);
  EXPECT_EQ(c.debug_subsys, static_cast<uint32_t>(kLogInit | kLogDevice));
  EXPECT_EQ(c.timeout_s, 2.5);
  EXPECT_EQ(c.device_plugins, (std::vector<std::string>{"/a/libx.so", "/b/liby.so"}));
  EXPECT_EQ(c.tuner_plugin, "/opt/tuners/libmy_tuner.so");
  EXPECT_EQ(c.emulated_devices, 3);
  EXPECT_EQ(c.device, 2);
  EXPECT_EQ(c.emu_mem_bytes, uint64_t{64} << 20);
  EXPECT_EQ(c.emu_copy_gbps, 12.5);
  EXPECT_EQ(c.emu_launch_us, 0.0);
  EXPECT_EQ(c.emu_fail_alloc, 4u);
  EXPECT_TRUE(c.emu_opaque);
  EXPECT_TRUE(c.emu_sync_free);
  EXPECT_EQ(c.fabric, (std::vector<std::string>{"directconnect", "ofi"}));
  EXPECT_TRUE(c.deterministic);
  EXPECT_EQ(c.chunk_bytes, 4096u);
  EXPECT_EQ(c.ib_tc, 106);
  EXPECT_EQ(c.ib_addr_family, "ipv6");
}

TEST(ConfigTest, SubsystemRemoval) {
  ParsedConfig p = ParseConfig({{"KIZUNA_DEBUG_SUBSYS", "^DEVICE"}});
  EXPECT_TRUE(p.warnings.empty());
  EXPECT_EQ(p.config.debug_subsys & kLogDevice, 0u);
  EXPECT_NE(p.config.debug_subsys & kLogColl, 0u);
  p = ParseConfig({{"KIZUNA_DEBUG_SUBSYS", "ALL,^FABRIC"}});
  EXPECT_EQ(p.config.debug_subsys & kLogFabric, 0u);
  EXPECT_NE(p.config.debug_subsys & kLogInit, 0u);
}

TEST(ConfigTest, UnknownNamesWarnWithSuggestion) {
  ParsedConfig p = ParseConfig({{"KIZUNA_TIMOUT", "5"}, {"KIZUNA_COMPLETELY_ELSE", "1"}});
  ASSERT_EQ(p.warnings.size(), 2u);
  EXPECT_TRUE(AnyWarningContains(p, "unknown variable KIZUNA_TIMOUT (ignored; did you mean KIZUNA_TIMEOUT?)"));
  EXPECT_TRUE(AnyWarningContains(p, "unknown variable KIZUNA_COMPLETELY_ELSE (ignored)"));
  EXPECT_EQ(p.config.timeout_s, 600.0);
}

TEST(ConfigTest, MalformedValuesWarnAndKeepDefaults) {
  ParsedConfig p = ParseConfig({
      {"KIZUNA_DEBUG", "LOUD"},
      {"KIZUNA_TIMEOUT", "-1"},
      {"KIZUNA_EMULATED_DEVICES", "eight"},
      {"KIZUNA_EMU_MEM_BYTES", "12X"},
      {"KIZUNA_EMU_COPY_GBPS", "0"},
      {"KIZUNA_DETERMINISTIC", "yes"},
      {"KIZUNA_IB_SL", "16"},
      {"KIZUNA_DEBUG_SUBSYS", "INIT,NOPE"},
      {"KIZUNA_DEVICE", "1.5"},
      {"KIZUNA_EMU_SYNC_FREE", "on"},
  });
  EXPECT_EQ(p.warnings.size(), 10u);
  EXPECT_TRUE(AnyWarningContains(p, "KIZUNA_DEBUG='LOUD' is malformed"));
  EXPECT_TRUE(AnyWarningContains(p, "KIZUNA_EMULATED_DEVICES='eight' is malformed"));
  EXPECT_TRUE(AnyWarningContains(p, "unknown subsystem 'NOPE'"));
  EXPECT_EQ(p.config.debug, LogLevel::kWarn);
  EXPECT_EQ(p.config.timeout_s, 600.0);
  EXPECT_EQ(p.config.emulated_devices, 8);
  EXPECT_FALSE(p.config.emu_mem_bytes.has_value());
  EXPECT_FALSE(p.config.emu_copy_gbps.has_value());
  EXPECT_FALSE(p.config.deterministic);
  EXPECT_FALSE(p.config.ib_sl.has_value());
  EXPECT_FALSE(p.config.device.has_value());
  EXPECT_FALSE(p.config.emu_sync_free);
}

// A value or name of any length and content gives one short printable warning line: a 1 MiB value
// was repeated whole in its warning, and control bytes went to the log as they were.
TEST(ConfigTest, WarningsShowValuesCutAndEscaped) {
  const std::string huge(1 << 20, 'x');
  ParsedConfig p = ParseConfig({
      {"KIZUNA_TIMEOUT", huge},
      {"KIZUNA_DEBUG", "LOUD\n\x1b[2Jfake log line"},
      {"KIZUNA_DEBUG_SUBSYS", "INIT," + huge},
      {"KIZUNA_" + huge, "1"},
  });
  ASSERT_EQ(p.warnings.size(), 4u);
  for (const std::string& w : p.warnings) {
    EXPECT_LT(w.size(), 400u) << w.substr(0, 400);
    for (char c : w) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int(static_cast<unsigned char>(c)) << " in " << w;
  }
  EXPECT_TRUE(AnyWarningContains(p, "KIZUNA_TIMEOUT='" + std::string(64, 'x') + "...(1048576 bytes)' is malformed"));
  EXPECT_TRUE(AnyWarningContains(p, "KIZUNA_DEBUG='LOUD\\x0a\\x1b[2Jfake log line' is malformed"));
  EXPECT_TRUE(AnyWarningContains(p, "unknown subsystem '" + std::string(64, 'X') + "...(1048576 bytes)'"));
  EXPECT_TRUE(
      AnyWarningContains(p, "unknown variable KIZUNA_" + std::string(57, 'x') + "...(1048583 bytes) (ignored)"));
}

TEST(ConfigTest, EveryDocumentedVariableParses) {
  // The table is the single source for parsing, warnings and docs: every row has a name, form,
  // default and meaning, and names are unique.
  std::set<std::string_view> names;
  for (const ConfigVariable& v : ConfigVariables()) {
    EXPECT_EQ(v.name.rfind("KIZUNA_", 0), 0u) << v.name;
    EXPECT_FALSE(v.form.empty()) << v.name;
    EXPECT_FALSE(v.meaning.empty()) << v.name;
    EXPECT_TRUE(names.insert(v.name).second) << "duplicate " << v.name;
  }
  EXPECT_GE(names.size(), 27u);
  for (std::string_view must : {"KIZUNA_DEBUG", "KIZUNA_TIMEOUT", "KIZUNA_EMULATED_DEVICES", "KIZUNA_DEVICE_PLUGINS",
                                "KIZUNA_EMU_FAIL_STREAM_OP", "KIZUNA_ALGO", "KIZUNA_IB_GID_INDEX",
                                "KIZUNA_TUNER_PLUGIN"})
    EXPECT_TRUE(names.count(must)) << must;
}

}  // namespace
}  // namespace kizuna
