// The conformance binary's main: builds the one Config and DeviceRegistry of the process, lists
// every backend's capability tags, then runs the suites. With --child-import it is instead the
// second process of the cross-process import test and runs no tests.
//
//   device_conformance_test [--plugin=PATH]... [gtest flags]
//   device_conformance_test --child-import=<backend>:<device>:<socket fd> [--plugin=PATH]...

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/device/exported_memory.h"
#include "runtime/device/registry.h"
#include "runtime/core/dtype.h"
#include "runtime/core/logging.h"
#include "runtime/core/unique_fd.h"
#include "tests/conformance/device/device_conformance.h"

namespace kizuna::device::conformance {
namespace {

std::unique_ptr<ConformanceWorld>& WorldSlot() {
  static std::unique_ptr<ConformanceWorld> world;
  return world;
}

std::vector<std::string>& PluginArgs() {
  static std::vector<std::string> paths;
  return paths;
}

std::string Sanitize(std::string_view s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out += ok ? c : '_';
  }
  return out.empty() ? std::string("unnamed") : out;
}

// A failed plugin's slot is named by its path; its test name uses the file name.
std::string TestNameFor(const BackendSlot& slot) {
  if (slot.status.ok() || slot.origin == "built-in") return Sanitize(slot.name);
  std::string_view base = slot.name;
  if (size_t slash = base.rfind('/'); slash != std::string_view::npos) base.remove_prefix(slash + 1);
  if (size_t dot = base.find('.'); dot != std::string_view::npos) base = base.substr(0, dot);
  return "plugin_" + Sanitize(base);
}

// Canonical form of a plugin path, so the same library named twice (argument and environment) is
// loaded once, and the import child (which may run elsewhere) finds it. Under `bazel run` the
// working directory is the runfiles tree, so a relative path that is not found there is also
// tried against the directory the command was started from (BUILD_WORKING_DIRECTORY). A path
// that does not resolve is kept as written: the loader reports it.
std::string CanonicalPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) != nullptr) return resolved;
  const char* started_in = std::getenv("BUILD_WORKING_DIRECTORY");
  if (!path.empty() && path[0] != '/' && started_in != nullptr && started_in[0] != '\0') {
    const std::string joined = std::string(started_in) + "/" + path;
    if (::realpath(joined.c_str(), resolved) != nullptr) return resolved;
  }
  return path;
}

Status WaitFd(int fd, short events, Deadline deadline, std::string_view what) {
  while (true) {
    if (deadline.Expired()) return Timeout(fmt::format("{}: deadline passed", what));
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms + 1, 1 << 30)));
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return FromErrno(errno, "poll");
  }
}

// Device::AllocateHost on a backend whose memory the CPU cannot reach: one small allocation on
// its first device (host-accessible backends have host memory by definition and are not asked).
bool ProbeHostMemory(Backend& backend) {
  Device* d = backend.device(0);
  if (d == nullptr) return false;
  Result<std::unique_ptr<Buffer>> host = d->AllocateHost(64);
  if (!host.ok()) {
    KZ_INFO(kLogDevice, "device conformance: {} has no host memory: {}", d->label(), host.status().ToString());
    return false;
  }
  return (*host)->size() == 64 && (*host)->data() != nullptr;
}

// Stream::Scale is an optional operation (the default DoScale, and a plugin built against api
// 1.0, answer kNotSupported), so it is no property to read: the listing asks the backend's first
// device with one in-place scale of a single byte (one allocation and one stream operation, which
// KIZUNA_EMU_FAIL_* numbering counts). Ok: supported; kNotSupported: the Scale tests skip;
// anything else: they will fail, and the listing already says why.
Status ProbeScale(Backend& backend) {
  Device* d = backend.device(0);
  if (d == nullptr) return Internal("device(0) is null");
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> byte, d->Allocate(1));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, d->CreateStream());  // after the buffer: drained first
  KZ_RETURN_IF_ERROR(stream->Scale(byte->data(), byte->data(), 1, DataType::kUint8, 1));
  return stream->Synchronize(TestDeadline());
}

// ---- The import child ----

struct ChildSpec {
  std::string backend;
  int device = 0;
  int fd = -1;
};

Result<ChildSpec> ParseChildSpec(std::string_view spec) {
  const size_t last = spec.rfind(':');
  const size_t mid = last == std::string_view::npos || last == 0 ? std::string_view::npos : spec.rfind(':', last - 1);
  if (mid == std::string_view::npos || mid == 0)
    return InvalidArgument(fmt::format("--child-import='{}': expected <backend>:<device>:<fd>", spec));
  ChildSpec out;
  out.backend = std::string(spec.substr(0, mid));
  const std::string device(spec.substr(mid + 1, last - mid - 1));
  const std::string fd(spec.substr(last + 1));
  char* end = nullptr;
  const long d = std::strtol(device.c_str(), &end, 10);
  if (device.empty() || *end != '\0' || d < 0 || d > INT_MAX)
    return InvalidArgument(fmt::format("--child-import: bad device index '{}'", device));
  const long f = std::strtol(fd.c_str(), &end, 10);
  if (fd.empty() || *end != '\0' || f < 0 || f > INT_MAX)
    return InvalidArgument(fmt::format("--child-import: bad socket fd '{}'", fd));
  out.device = static_cast<int>(d);
  out.fd = static_cast<int>(f);
  return out;
}

// Imports what the parent exported, checks the parent's bytes (through the CPU's view of the
// import, and through a stream copy), overwrites the region with the child's bytes through a
// stream copy and synchronizes. Works on every backend the parent's ExportConformance runs on:
// host-accessible ones are read directly, the others through host memory (DeviceBytes).
Status ImportAndExchange(const ChildSpec& spec, int sock, const Config& config, Deadline deadline) {
  std::unique_ptr<DeviceRegistry> registry = DeviceRegistry::Create(config);
  Backend* backend = registry->Find(spec.backend);
  if (backend == nullptr) {
    for (const BackendSlot& s : registry->backends())
      if (s.name == spec.backend) return s.status.WithContext(fmt::format("backend '{}' in the child", spec.backend));
    return InvalidArgument(fmt::format("backend '{}' is not in the child's registry", spec.backend));
  }
  Device* device = backend->device(spec.device);
  if (device == nullptr)
    return InvalidArgument(fmt::format("backend '{}' has no device {}", spec.backend, spec.device));
  KZ_ASSIGN_OR_RETURN(ExportedMemory exported, ReceiveExportedMemory(sock, deadline));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> imported, device->Import(exported));
  const size_t size = exported.size;
  if (imported->size() != size)
    return Internal(fmt::format("imported buffer has {} bytes, the export said {}", imported->size(), size));
  if (!imported->imported()) return Internal("Import returned a buffer that does not say imported()");

  // The parent's bytes, read through the CPU's view of the import (directly on a host-accessible
  // device, else staged through host memory) ...
  KZ_ASSIGN_OR_RETURN(DeviceBytes imported_bytes, DeviceBytes::Create(*imported));
  KZ_RETURN_IF_ERROR(imported_bytes.Download(deadline));
  for (size_t i = 0; i < size; ++i)
    if (imported_bytes.host()[i] != ParentByte(i))
      return Internal(fmt::format("child read byte {} of the import as {:#04x}, the parent wrote {:#04x}", i,
                                  imported_bytes.host()[i], ParentByte(i)));

  // ... and through a stream copy into a buffer of the child's own. The stream after the buffers
  // its work touches: on an early return it is destroyed (drained) first.
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> local, device->Allocate(size));
  KZ_ASSIGN_OR_RETURN(DeviceBytes local_bytes, DeviceBytes::Create(*local));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device->CreateStream());
  KZ_RETURN_IF_ERROR(stream->Copy(local->data(), imported->data(), size));
  KZ_RETURN_IF_ERROR(stream->Synchronize(deadline));
  KZ_RETURN_IF_ERROR(local_bytes.Download(deadline));
  for (size_t i = 0; i < size; ++i)
    if (local_bytes.host()[i] != ParentByte(i))
      return Internal(fmt::format("child's stream copy of the import has byte {} = {:#04x}, expected {:#04x}", i,
                                  local_bytes.host()[i], ParentByte(i)));

  // The child's bytes go into its own buffer, then through a stream copy into the import.
  for (size_t i = 0; i < size; ++i) local_bytes.host()[i] = ChildByte(i);
  KZ_RETURN_IF_ERROR(local_bytes.Upload(deadline));
  KZ_RETURN_IF_ERROR(stream->Copy(imported->data(), local->data(), size));
  return stream->Synchronize(deadline);
}

int RunImportChild(std::string_view spec_text, const Config& config) {
  const Deadline deadline = Deadline::AfterSeconds(kChildTimeoutSeconds);
  Result<ChildSpec> spec = ParseChildSpec(spec_text);
  if (!spec.ok()) {
    std::fprintf(stderr, "import child: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  UniqueFd sock(spec->fd);
  Status s = ImportAndExchange(*spec, sock.get(), config, deadline);
  const std::string report = s.ok() ? std::string(kChildOk) : std::string(kChildFailPrefix) + s.ToString();
  Status sent = SendReport(sock.get(), report, deadline);
  if (!s.ok()) std::fprintf(stderr, "import child: %s\n", s.ToString().c_str());
  if (!sent.ok()) std::fprintf(stderr, "import child: sending the report: %s\n", sent.ToString().c_str());
  return s.ok() && sent.ok() ? 0 : 1;
}

}  // namespace

// ---- World ----

std::string_view TagName(Tag tag) {
  switch (tag) {
    case Tag::kHostAccessible: return "host_accessible";
    case Tag::kHostMemory: return "host_memory";
    case Tag::kExportFd: return "export_fd";
    case Tag::kExportOpaque: return "export_opaque";
    case Tag::kMultiDevice: return "multi_device";
  }
  return "invalid";
}

bool BackendUnderTest::Has(Tag tag) const {
  for (Tag t : tags)
    if (t == tag) return true;
  return false;
}

std::string BackendUnderTest::TagList() const {
  std::string out;
  for (Tag t : tags) {
    if (!out.empty()) out += ", ";
    out += TagName(t);
  }
  return out.empty() ? "(none)" : out;
}

bool TestGroup::AppliesTo(const BackendUnderTest& b) const {
  if (!b.available()) return needs.empty();
  return Missing(b).empty();
}

std::string TestGroup::Missing(const BackendUnderTest& b) const {
  std::string out;
  for (const std::vector<Tag>& clause : needs) {
    bool met = false;
    for (Tag t : clause) met = met || b.Has(t);
    if (met) continue;
    if (!out.empty()) out += ", ";
    for (size_t i = 0; i < clause.size(); ++i) out += (i ? "|" : "") + std::string(TagName(clause[i]));
  }
  return out;
}

void PrintTo(const BackendParam& param, std::ostream* os) {
  const auto& backends = World().backends();
  if (param.index < backends.size()) *os << backends[param.index].name;
  else *os << "backend #" << param.index;
}

ConformanceWorld::ConformanceWorld(Config config)
    : config_(std::make_unique<Config>(std::move(config))), registry_(DeviceRegistry::Create(*config_)) {
  std::map<std::string, int> used;
  for (const BackendSlot& slot : registry_->backends()) {
    BackendUnderTest b;
    b.name = slot.name;
    b.slot = &slot;
    b.test_name = TestNameFor(slot);
    if (int n = ++used[b.test_name]; n > 1) b.test_name += fmt::format("_{}", n);
    if (slot.status.ok() && slot.backend->device_count() > 0) {
      const Device* d0 = slot.backend->device(0);
      if (d0 != nullptr) {
        const DeviceProperties& p = d0->properties();
        if (p.host_accessible) b.tags.push_back(Tag::kHostAccessible);
        if (p.host_accessible || ProbeHostMemory(*slot.backend)) b.tags.push_back(Tag::kHostMemory);
        if (p.export_fd) b.tags.push_back(Tag::kExportFd);
        if (p.export_opaque) b.tags.push_back(Tag::kExportOpaque);
      }
      if (slot.backend->device_count() >= 2) b.tags.push_back(Tag::kMultiDevice);
    }
    backends_.push_back(std::move(b));
  }
}

std::vector<BackendParam> ConformanceWorld::ParamsFor(std::string_view suite) const {
  const TestGroup* group = nullptr;
  for (const TestGroup& g : TestGroups())
    if (g.suite == suite) group = &g;
  std::vector<BackendParam> out;
  if (group == nullptr) {
    std::fprintf(stderr, "device conformance: no test group named %.*s\n", static_cast<int>(suite.size()),
                 suite.data());
    return out;
  }
  for (size_t i = 0; i < backends_.size(); ++i)
    if (group->AppliesTo(backends_[i])) out.push_back(BackendParam{i});
  return out;
}

void InitConformance(Config config) { WorldSlot() = std::make_unique<ConformanceWorld>(std::move(config)); }
void ShutdownConformance() { WorldSlot().reset(); }

const ConformanceWorld& World() {
  if (WorldSlot() == nullptr) {
    std::fprintf(stderr, "device conformance: World() used before InitConformance()\n");
    std::abort();
  }
  return *WorldSlot();
}

const std::vector<std::string>& CommandLinePlugins() { return PluginArgs(); }
void SetCommandLinePlugins(std::vector<std::string> paths) { PluginArgs() = std::move(paths); }

std::string BackendTestName(const ::testing::TestParamInfo<BackendParam>& info) {
  return World().backend(info.param).test_name;
}

void PrintCapabilities(std::FILE* out) {
  const ConformanceWorld& w = World();
  std::string text = fmt::format("[ kizuna ] device conformance: {} backend(s); backend waits bounded by {} s\n",
                                 w.backends().size(), w.config().timeout_s);
  for (const BackendUnderTest& b : w.backends()) {
    const BackendSlot& slot = *b.slot;
    const std::string origin = slot.origin == "built-in" ? "built-in" : "plugin " + slot.origin;
    if (!slot.status.ok()) {
      const bool unavailable = slot.status.code() == StatusCode::kUnavailable;
      text += fmt::format("[ kizuna ]   {} ({}): {} — {}\n", b.name, origin, slot.status.ToString(),
                          unavailable ? "its tests skip" : "BROKEN: its tests fail");
      text += fmt::format("[ kizuna ]     tests named .../{}; capability groups not instantiated (no device to "
                          "read tags from)\n",
                          b.test_name);
      continue;
    }
    text += fmt::format("[ kizuna ]   {} ({}): {} device(s); tags: {}; tests named .../{}\n", b.name, origin,
                        slot.backend->device_count(), b.TagList(), b.test_name);
    bool any = false;
    for (const TestGroup& g : TestGroups()) {
      if (g.AppliesTo(b)) continue;
      text += fmt::format("[ kizuna ]     unsupported: {}.* — lacks {}: {}\n", g.suite, g.Missing(b), g.reason);
      any = true;
    }
    const Status scale = ProbeScale(*slot.backend);
    if (scale.code() == StatusCode::kNotSupported) {
      text += fmt::format("[ kizuna ]     unsupported: Stream::Scale (optional) — {}: the Scale tests skip\n",
                          scale.ToString());
      any = true;
    }
    if (!any) text += "[ kizuna ]     unsupported: (none)\n";
    if (!scale.ok() && scale.code() != StatusCode::kNotSupported)
      text += fmt::format(
          "[ kizuna ]     BROKEN: a one-byte Stream::Scale probe failed: {}; the Scale tests will fail\n",
          scale.ToString());
  }
  text += "[ kizuna ]   fault injection: host_emulated only (HostEmulatedFaultInjection.*), through its own "
          "factory with emu_fail_alloc / emu_fail_stream_op\n";
  std::fputs(text.c_str(), out);
  std::fflush(out);
}

// ---- Reports on the child's socket ----

Status SendReport(int fd, std::string_view message, Deadline deadline) {
  size_t sent = 0;
  while (sent < message.size()) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, "sending the import report"));
    const ssize_t n = ::send(fd, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "send");
    }
    sent += static_cast<size_t>(n);
  }
  if (::shutdown(fd, SHUT_WR) != 0) return FromErrno(errno, "shutdown");
  return Status::Ok();
}

Result<std::string> ReceiveReport(int fd, size_t max_bytes, Deadline deadline) {
  std::string out;
  char buf[512];
  while (out.size() < max_bytes) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, "waiting for the import child's report"));
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "recv");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace kizuna::device::conformance

int main(int argc, char** argv) {
  using namespace kizuna::device::conformance;
  // Our flags are taken out before GoogleTest sees argv.
  std::vector<std::string> plugins;
  std::string child_spec;
  bool child = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (i > 0 && a.starts_with("--plugin=")) {
      plugins.emplace_back(a.substr(std::string_view("--plugin=").size()));
    } else if (i > 0 && a == "--plugin" && i + 1 < argc) {
      plugins.emplace_back(argv[++i]);
    } else if (i > 0 && a.starts_with(kChildImportFlag)) {
      child = true;
      child_spec = std::string(a.substr(kChildImportFlag.size()));
    } else {
      rest.push_back(argv[i]);
    }
  }
  for (std::string& p : plugins) p = CanonicalPath(p);

  // One configuration for the process: the environment's (KIZUNA_DEVICE_PLUGINS included) plus
  // the plugins named on the command line, each library once.
  kizuna::Config config = kizuna::GlobalConfig();
  std::vector<std::string> merged;
  auto add = [&merged](const std::string& p) {
    const std::string c = CanonicalPath(p);
    for (const std::string& m : merged)
      if (m == c) return;
    merged.push_back(c);
  };
  for (const std::string& p : config.device_plugins) add(p);
  for (const std::string& p : plugins) add(p);
  config.device_plugins = merged;
  // The backends' own bounded waits (stream teardown, event waits on their workers) use
  // KIZUNA_TIMEOUT; unless it was set, bound them like the tests' waits, so that a wedged backend
  // fails one test instead of running into the binary's Bazel timeout.
  if (kizuna::KizunaEnvironment().count("KIZUNA_TIMEOUT") == 0)
    config.timeout_s = std::min(config.timeout_s, kTestTimeoutSeconds);

  if (child) return RunImportChild(child_spec, config);

  SetCommandLinePlugins(plugins);
  // The registry exists before InitGoogleTest: the INSTANTIATE generators run inside it.
  InitConformance(std::move(config));
  PrintCapabilities(stdout);

  int gtest_argc = static_cast<int>(rest.size());
  rest.push_back(nullptr);
  ::testing::InitGoogleTest(&gtest_argc, rest.data());
  const int rc = RUN_ALL_TESTS();
  ShutdownConformance();
  return rc;
}
