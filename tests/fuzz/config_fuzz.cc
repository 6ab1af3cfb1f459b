// Fuzz target: the settings (runtime/core/config.h), every KIZUNA_* variable's value parser. The
// input is read twice: as lines "NAME=VALUE" (an environment, names as given), and whole as the
// value of each known variable in turn.
//
// Asserted: parsing never fails outright (a malformed value is a warning and keeps the default),
// every parsed value lies in its documented range, each warning is short and printable whatever the
// value (values are quoted cut and escaped), there is at most one warning per variable given, and
// the same environment always parses the same way.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "runtime/core/config.h"
#include "tests/fuzz/fuzz_check.h"

namespace kizuna {
namespace {

constexpr size_t kMaxWarningBytes = 1024;

void CheckConfig(const ParsedConfig& p, const std::map<std::string, std::string>& env) {
  const Config& c = p.config;
  KZ_FUZZ_CHECK(std::isfinite(c.timeout_s) && c.timeout_s > 0 && c.timeout_s <= 1e9, "KIZUNA_TIMEOUT out of range");
  KZ_FUZZ_CHECK(c.emulated_devices >= 0 && c.emulated_devices <= 1024, "KIZUNA_EMULATED_DEVICES out of range");
  KZ_FUZZ_CHECK(!c.device || (*c.device >= 0 && *c.device <= (1 << 20)), "KIZUNA_DEVICE out of range");
  KZ_FUZZ_CHECK(!c.emu_mem_bytes || *c.emu_mem_bytes > 0, "KIZUNA_EMU_MEM_BYTES of 0");
  for (const auto* d : {&c.emu_copy_gbps, &c.emu_reduce_gbps, &c.emu_launch_us})
    KZ_FUZZ_CHECK(!*d || (std::isfinite(**d) && **d >= 0 && **d <= 1e12), "a KIZUNA_EMU_* figure out of range");
  KZ_FUZZ_CHECK(!c.emu_copy_gbps || *c.emu_copy_gbps > 0, "KIZUNA_EMU_COPY_GBPS of 0");
  KZ_FUZZ_CHECK(!c.emu_reduce_gbps || *c.emu_reduce_gbps > 0, "KIZUNA_EMU_REDUCE_GBPS of 0");
  KZ_FUZZ_CHECK(!c.emu_fail_alloc || *c.emu_fail_alloc > 0, "KIZUNA_EMU_FAIL_ALLOC of 0");
  KZ_FUZZ_CHECK(!c.emu_fail_stream_op || *c.emu_fail_stream_op > 0, "KIZUNA_EMU_FAIL_STREAM_OP of 0");
  KZ_FUZZ_CHECK(!c.chunk_bytes || *c.chunk_bytes > 0, "KIZUNA_CHUNK_BYTES of 0");
  KZ_FUZZ_CHECK(!c.ib_gid_index || (*c.ib_gid_index >= 0 && *c.ib_gid_index <= 65535), "KIZUNA_IB_GID_INDEX");
  KZ_FUZZ_CHECK(!c.ib_tc || (*c.ib_tc >= 0 && *c.ib_tc <= 255), "KIZUNA_IB_TC out of range");
  KZ_FUZZ_CHECK(!c.ib_sl || (*c.ib_sl >= 0 && *c.ib_sl <= 15), "KIZUNA_IB_SL out of range");
  KZ_FUZZ_CHECK(c.ib_addr_family.empty() || c.ib_addr_family == "ipv4" || c.ib_addr_family == "ipv6",
                "KIZUNA_IB_ADDR_FAMILY: " + c.ib_addr_family);
  for (const auto* list : {&c.device_plugins, &c.fabric_plugins, &c.fabric})
    for (const std::string& item : *list) KZ_FUZZ_CHECK(!item.empty(), "an empty item in a list");

  size_t given = 0;
  for (const auto& [name, value] : env) given += name.rfind("KIZUNA_", 0) == 0 ? 1 : 0;
  KZ_FUZZ_CHECK(p.warnings.size() <= given, "more warnings than variables");
  for (const std::string& w : p.warnings) {
    KZ_FUZZ_CHECK(!w.empty() && w.size() <= kMaxWarningBytes,
                  std::to_string(w.size()) + " bytes of warning: " + w.substr(0, 200));
    for (char ch : w)
      KZ_FUZZ_CHECK(static_cast<unsigned char>(ch) >= ' ' && ch != 0x7f,
                    "a control byte in a warning: " + w.substr(0, 200));
  }
}

void ParseAndCheck(const std::map<std::string, std::string>& env) {
  const ParsedConfig p = ParseConfig(env);
  CheckConfig(p, env);
  const ParsedConfig q = ParseConfig(env);
  KZ_FUZZ_CHECK(p.warnings == q.warnings, "the same environment parsed twice gave other warnings");
}

}  // namespace
}  // namespace kizuna

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kizuna;
  const std::string_view text = fuzz::AsText(data, size);

  // Lines of NAME=VALUE (the first '=' separates them, as in an environment).
  std::map<std::string, std::string> env;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string_view::npos) env[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
    start = end + 1;
  }
  ParseAndCheck(env);

  // The whole input as each variable's value.
  for (const ConfigVariable& v : ConfigVariables()) ParseAndCheck({{std::string(v.name), std::string(text)}});
  return 0;
}
