// The fabric conformance binary's main: builds the Config (with the suite's own ring topology for
// point-to-point fabrics), lists every fabric's capability tags, then runs the suites. With
// --fabric-child it is instead rank 1 of a cross-process test and runs no tests.
//
//   fabric_conformance_test [--plugin=PATH ...] [--large | --max-bytes=N] [--topology=PATH | --no-topology]
//                           [gtest flags]
//   fabric_conformance_test --fabric-child=<fabric>:<scenario>:<fd> --topology=PATH --max-bytes=N

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/directconnect/topology.h"
#include "runtime/core/config.h"
#include "tests/conformance/fabric/fabric_conformance.h"

namespace {

using kizuna::fabric::conformance::Options;

// Writes a 2-worker ring (ranks 0 and 1 linked twice) for point-to-point fabrics; returns its path.
std::string WriteRingTopology() {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path =
      fmt::format("{}/kizuna-fabric-conformance-{}.json", dir != nullptr && dir[0] != '\0' ? dir : "/tmp", ::getpid());
  auto topo = kizuna::fabric::directconnect::GenerateRing(2, {100, 1});
  if (!topo.ok()) {
    std::fprintf(stderr, "fabric conformance: generating the ring topology: %s\n", topo.status().ToString().c_str());
    std::exit(2);
  }
  std::ofstream out(path);
  out << kizuna::fabric::directconnect::TopologyToJson(*topo);
  if (!out) {
    std::fprintf(stderr, "fabric conformance: cannot write %s\n", path.c_str());
    std::exit(2);
  }
  return path;
}

bool ParseBytes(std::string_view s, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) v = v * 10 + static_cast<uint64_t>(s[i] - '0');
  if (i == 0) return false;
  std::string_view unit = s.substr(i);
  if (unit == "K" || unit == "KiB") v <<= 10;
  else if (unit == "M" || unit == "MiB") v <<= 20;
  else if (unit == "G" || unit == "GiB") v <<= 30;
  else if (!unit.empty()) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kizuna::fabric::conformance;
  Options options;
  std::string child_spec;
  bool child = false;
  bool no_topology = false;
  std::vector<char*> rest;
  std::vector<std::string> plugins;
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (i > 0 && a.starts_with("--plugin=")) {
      // Absolute, so that child processes (which inherit KIZUNA_FABRIC_PLUGINS) find it too.
      std::string path(a.substr(9));
      char resolved[PATH_MAX];
      if (::realpath(path.c_str(), resolved) != nullptr) path = resolved;
      plugins.push_back(path);
    } else if (i > 0 && a == "--large") {
      options.max_bytes = kLargeMaxBytes;
    } else if (i > 0 && a.starts_with("--max-bytes=")) {
      if (!ParseBytes(a.substr(12), &options.max_bytes)) {
        std::fprintf(stderr, "fabric conformance: bad --max-bytes value '%s' (e.g. 64M, 1G)\n", argv[i] + 12);
        return 2;
      }
    } else if (i > 0 && a == "--no-topology") {
      no_topology = true;
    } else if (i > 0 && a.starts_with("--topology=")) {
      options.topology_path = std::string(a.substr(11));
    } else if (i > 0 && a.starts_with(kChildFlag)) {
      child = true;
      child_spec = std::string(a.substr(kChildFlag.size()));
    } else {
      rest.push_back(argv[i]);
    }
  }

  kizuna::Config config = kizuna::GlobalConfig();
  if (!plugins.empty()) {
    config.fabric_plugins.insert(config.fabric_plugins.end(), plugins.begin(), plugins.end());
    std::string joined;
    for (const std::string& p : config.fabric_plugins) joined += (joined.empty() ? "" : ":") + p;
    ::setenv("KIZUNA_FABRIC_PLUGINS", joined.c_str(), 1);  // the cross-process tests' children
  }
  // Bound the fabrics' own internal waits like the tests' waits, unless KIZUNA_TIMEOUT was set.
  if (kizuna::KizunaEnvironment().count("KIZUNA_TIMEOUT") == 0)
    config.timeout_s = std::min(config.timeout_s, kTestTimeoutSeconds);
  // Two emulated devices are all the fd-registration tests need.
  config.emulated_devices = 2;
  // --no-topology: point-to-point fabrics get none (they must then say unavailable, and their
  // tests skip); --topology=PATH: that file; by default the suite's own 2-worker ring.
  const bool own_topology = options.topology_path.empty() && !no_topology;
  if (own_topology) options.topology_path = WriteRingTopology();
  config.topology = no_topology ? std::string() : options.topology_path;

  if (child) return RunChild(child_spec, config, options);

  InitConformance(config, options);
  PrintCapabilities(stdout);
  int gtest_argc = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  ::testing::InitGoogleTest(&gtest_argc, rest.data());
  const int rc = RUN_ALL_TESTS();
  ShutdownConformance();
  if (own_topology) ::unlink(options.topology_path.c_str());
  return rc;
}
