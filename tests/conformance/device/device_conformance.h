// The device conformance suite (README.md; in the manner of IREE's CTS): one set of tests,
// compiled once, instantiated for every backend the DeviceRegistry holds — the built-in backends
// linked into the binary and every plugin named with --plugin=PATH or KIZUNA_DEVICE_PLUGINS.
//
// Contract of this header:
//  - conformance_main.cc calls InitConformance() once, before InitGoogleTest (the suites'
//    INSTANTIATE generators run inside InitGoogleTest and read the backend list), and keeps the
//    world alive until the tests have run. Tests reach it through World().
//  - Each backend carries capability tags derived from its first device's properties (and one
//    probe: host_memory). A test group needing a tag is instantiated only for backends that have
//    it; PrintCapabilities() lists, per backend, its tags and the groups left out with the reason.
//  - Tests read and write device bytes only through DeviceBytes: directly on host-accessible
//    backends, staged through Device::AllocateHost memory and stream copies on the others, so the
//    same test checks bytes on both.
//  - A backend whose registry slot is not ok is instantiated in the groups that need no tag:
//    kUnavailable skips each test with the reason; any other status fails each test.
//  - Every helper that waits takes a deadline (TestDeadline() unless stated), so a broken backend
//    fails a test instead of hanging the binary.
//  - Declaration order in a test: first everything a stream's queued work touches (buffers, events
//    recorded or waited on, gates, locals its host callbacks capture), then the streams, then any
//    OpenOnExit guard. Locals die in reverse order, so when an ASSERT returns early the gate opens,
//    then each stream's destructor drains (or aborts) its queue, and only then is that memory
//    freed: a failed assertion stays a failed test, never a use-after-free that takes the binary
//    (and every other test's result) down. Buffers allocated per loop iteration get a stream
//    created in the same iteration, after them. A DeviceBytes view comes after its buffer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/status_testing.h"
#include "runtime/device/device.h"
#include "runtime/device/registry.h"

namespace kizuna::device::conformance {

// The longest any single wait in the suite may take. Far below KIZUNA_TIMEOUT's default (600 s):
// a wedged backend must fail its test, not the binary's Bazel timeout.
inline constexpr double kTestTimeoutSeconds = 30.0;
inline Deadline TestDeadline() { return Deadline::AfterSeconds(kTestTimeoutSeconds); }

// ---- Capability tags ----

enum class Tag : uint8_t {
  kHostAccessible,  // DeviceProperties::host_accessible: the CPU may read and write device memory
  kHostMemory,      // Device::AllocateHost works (probed once at world creation; implied by the above)
  kExportFd,        // DeviceProperties::export_fd: Export() yields an fd (memfd / DMA-BUF)
  kExportOpaque,    // DeviceProperties::export_opaque: Export() yields a vendor IPC handle
  kMultiDevice,     // the backend has at least two devices
};
std::string_view TagName(Tag tag);

// One backend under test: a registry slot and what the suite derived from it.
struct BackendUnderTest {
  std::string name;       // registry name (for a plugin that failed to load: its path)
  std::string test_name;  // `name` reduced to [A-Za-z0-9_], unique: the suffix of every test name
  const BackendSlot* slot = nullptr;
  std::vector<Tag> tags;  // empty unless the slot is ok

  bool available() const { return slot->status.ok(); }
  bool Has(Tag tag) const;
  std::string TagList() const;  // "host_accessible, export_fd" or "(none)"
};

// A test group and what a backend needs for it to apply: every clause of `needs`, each met by any
// one of its tags ({{host_accessible, host_memory}, {multi_device}} reads "host_accessible or
// host_memory, and multi_device"). `reason` says why it is left out.
struct TestGroup {
  std::string_view suite;
  std::vector<std::vector<Tag>> needs;
  std::string_view reason;

  bool AppliesTo(const BackendUnderTest& b) const;
  // "host_accessible|host_memory, multi_device": the clauses `b` does not meet.
  std::string Missing(const BackendUnderTest& b) const;
};

// The parameter of every TEST_P: an index into World().backends().
struct BackendParam {
  size_t index = 0;
};
void PrintTo(const BackendParam& param, std::ostream* os);

class ConformanceWorld {
 public:
  // Creates the registry (built-in backends and config.device_plugins) and derives the tags.
  explicit ConformanceWorld(Config config);

  const Config& config() const { return *config_; }
  DeviceRegistry& registry() const { return *registry_; }
  const std::vector<BackendUnderTest>& backends() const { return backends_; }
  const BackendUnderTest& backend(const BackendParam& p) const { return backends_.at(p.index); }

  // The backends the group applies to, as INSTANTIATE_TEST_SUITE_P parameters.
  std::vector<BackendParam> ParamsFor(std::string_view suite) const;

 private:
  std::unique_ptr<Config> config_;  // stable address: devices keep a pointer to it
  std::unique_ptr<DeviceRegistry> registry_;
  std::vector<BackendUnderTest> backends_;
};

// The groups (defined in device_conformance.cc), with their requirements (for instantiation and
// for the startup listing).
const std::vector<TestGroup>& TestGroups();

// Builds the registry from `config` (plugins included) and installs the world. Called once.
void InitConformance(Config config);
// Destroys the world (streams and buffers must be gone): backends are released before exit, in
// main's order rather than static-destructor order.
void ShutdownConformance();
// The installed world; aborts with a message when InitConformance has not run.
const ConformanceWorld& World();
// Plugin paths given on the command line (re-passed to the import child process).
const std::vector<std::string>& CommandLinePlugins();
void SetCommandLinePlugins(std::vector<std::string> paths);

// Writes, for every backend: origin, status, device count, tags, and the groups left out with the
// reason; then the suites that are not parameterized over the registry.
void PrintCapabilities(std::FILE* out);

// The name generator for INSTANTIATE_TEST_SUITE_P: the backend's test_name.
std::string BackendTestName(const ::testing::TestParamInfo<BackendParam>& info);

// ---- Cross-process import (parent in export_conformance_test.cc, child in conformance_main.cc) ----

// argv flag that turns the binary into the import child: --child-import=<backend>:<device>:<fd>.
inline constexpr std::string_view kChildImportFlag = "--child-import=";
// The child's whole run is bounded by this; the parent waits a little longer for it.
inline constexpr double kChildTimeoutSeconds = 20.0;
// The child's report on the socket: kChildOk, or kChildFailPrefix followed by the reason.
inline constexpr std::string_view kChildOk = "ok";
inline constexpr std::string_view kChildFailPrefix = "fail: ";

// Deterministic byte patterns: the parent writes ParentByte(i) at byte i of the exported region,
// the child checks it and writes ChildByte(i). The two differ at almost every index, so a write
// that did not arrive shows up.
inline uint8_t ParentByte(size_t i) { return static_cast<uint8_t>((i * 131u + 7u) ^ (i >> 11)); }
inline uint8_t ChildByte(size_t i) { return static_cast<uint8_t>((i * 197u + 101u) ^ (i >> 9)); }

// Sends a whole message on a stream socket, then shuts down the write side; bounded by deadline.
Status SendReport(int fd, std::string_view message, Deadline deadline);
// Reads until the peer closes (at most max_bytes); kTimeout at the deadline.
Result<std::string> ReceiveReport(int fd, size_t max_bytes, Deadline deadline);

// ---- Byte patterns and checks ----

// Byte i of the pattern named `seed` (FillPattern writes it, HasPattern checks it).
inline uint8_t PatternByte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}
inline void FillPattern(void* p, size_t bytes, uint64_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i) b[i] = PatternByte(seed, i);
}
// Success when [p, p + bytes) equals the pattern; otherwise names the first wrong byte.
::testing::AssertionResult HasPattern(const void* p, size_t bytes, uint64_t seed);
// Success when the two ranges are equal; otherwise names the first difference and how many differ.
::testing::AssertionResult BytesEqual(const void* actual, const void* expected, size_t bytes);

// A small deterministic generator (splitmix64): tests reproduce exactly from run to run.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (inclusive), for small ranges.
  int64_t Uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  double UniformDouble(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(Next() >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t state_;
};

// ---- A gate that holds a stream behind a host callback ----
//
// Open() releases every waiter. A callback blocks for at most kGateMaxHold (a host callback must
// not block for long), so a test that fails before opening the gate cannot wedge the stream.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Blocks until Open() or the deadline; true when opened.
  bool WaitOpen(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline.when(), [this] { return open_; });
  }
  // Records that a callback is holding the stream (so a test can wait until the gate is reached).
  void MarkReached() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reached_ = true;
    }
    cv_.notify_all();
  }
  bool WaitReached(Deadline deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline.when(), [this] { return reached_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;     // guarded by mu_
  bool reached_ = false;  // guarded by mu_
};

// Opens a gate when the scope ends, so a failed assertion never leaves a stream held. Declare it
// after the streams it protects (and the Gate itself before them): it then runs before their
// destructors drain them.
class OpenOnExit {
 public:
  explicit OpenOnExit(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  ~OpenOnExit() { gate_->Open(); }
  OpenOnExit(const OpenOnExit&) = delete;
  OpenOnExit& operator=(const OpenOnExit&) = delete;

 private:
  std::shared_ptr<Gate> gate_;
};

// How long a gate callback may hold its stream before giving up on its own.
inline constexpr std::chrono::seconds kGateMaxHold{10};

// Enqueues a host callback that blocks until the gate opens (at most kGateMaxHold).
Status EnqueueGate(Stream& stream, std::shared_ptr<Gate> gate);

// ---- Fixture ----

// Every TEST_P's fixture: resolves the parameter to a backend, skips an unavailable one with the
// reason, fails a broken one, and offers the backend's first device.
class BackendTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override;

  const BackendUnderTest& under_test() const { return World().backend(GetParam()); }
  Backend& backend() const { return *backend_; }
  Device& device() const { return *device_; }
  Device& device(int index) const { return *backend_->device(index); }

  // Allocation and creation helpers that record a failure naming the status.
  std::unique_ptr<Buffer> MustAllocate(Device& d, size_t bytes);
  std::unique_ptr<Buffer> MustAllocate(size_t bytes) { return MustAllocate(device(), bytes); }
  std::unique_ptr<Stream> MustCreateStream(Device& d);
  std::unique_ptr<Stream> MustCreateStream() { return MustCreateStream(device()); }
  std::unique_ptr<Event> MustCreateEvent(Device& d);
  std::unique_ptr<Event> MustCreateEvent() { return MustCreateEvent(device()); }

 private:
  Backend* backend_ = nullptr;
  Device* device_ = nullptr;
};

// The parameterized groups, one fixture each. Their tests are spread over the *_test.cc files of
// this folder by concept; device_conformance.cc instantiates each group once, for the backends
// TestGroups() selects.
class DeviceConformance : public BackendTest {};
class DataConformance : public BackendTest {};
class HostAccessConformance : public BackendTest {};
class MultiDeviceConformance : public BackendTest {};
class ExportConformance : public BackendTest {};

// The device address `offset` bytes into a buffer, for stream operations. The CPU may dereference
// it only on a host-accessible backend: tests reach the bytes through DeviceBytes.
inline uint8_t* At(const Buffer& b, size_t offset = 0) { return static_cast<uint8_t*>(b.data()) + offset; }

// ---- The CPU's view of a device buffer ----
//
// host() is where the test reads and writes the buffer's bytes; Upload() makes the device see
// what was written there, Download() makes host() show what the device holds:
//
//   KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
//   FillPattern(src_bytes.host(), src_bytes.size(), 1);
//   KZ_ASSERT_OK(src_bytes.Upload());
//   ... stream work on At(*src), At(*dst); synchronize ...
//   EXPECT_TRUE(dst_bytes.HasPattern(1));  // downloads, then compares
//
// On a host-accessible backend host() is the device memory itself and Upload / Download do
// nothing, so those backends are checked by direct CPU access exactly as before. On any other
// backend host() is an image of the whole buffer in Device::AllocateHost memory of the buffer's
// device, and Upload / Download copy a range between image and buffer (same offsets) on a stream
// of the view's own and synchronize it. Transfers are bounded by `deadline`; an error (the
// backend's, or kTimeout) is returned, never a hang.
//
// The view neither orders itself with other streams nor knows when they write: download after
// the test's streams have synchronized (or use EnqueueDownload on the stream itself). Declare it
// after its buffer: its stream is destroyed (drained) before the buffer is freed. Not thread-safe.
class DeviceBytes {
 public:
  // kNotSupported (from AllocateHost) when the backend is neither host-accessible nor has host
  // memory; other errors as Device::AllocateHost and Device::CreateStream return them.
  static Result<DeviceBytes> Create(Buffer& buffer);

  DeviceBytes(DeviceBytes&&) noexcept = default;
  DeviceBytes& operator=(DeviceBytes&&) noexcept = default;
  ~DeviceBytes() = default;

  uint8_t* host() const { return host_; }
  size_t size() const { return buffer_->size(); }
  Buffer& buffer() const { return *buffer_; }
  // True when transfers go through host memory (the backend is not host-accessible).
  bool staged() const { return stream_ != nullptr; }

  Status Upload(Deadline deadline = TestDeadline()) { return Upload(0, size(), deadline); }
  Status Upload(size_t offset, size_t bytes, Deadline deadline = TestDeadline());
  Status Download(Deadline deadline = TestDeadline()) { return Download(0, size(), deadline); }
  Status Download(size_t offset, size_t bytes, Deadline deadline = TestDeadline());
  // Enqueues the download of a range on `stream` (of the buffer's device) and returns: a host
  // callback enqueued after it on that stream sees the range in host(). Nothing to enqueue on a
  // host-accessible backend, where the callback reads the device memory itself.
  Status EnqueueDownload(Stream& stream, size_t offset, size_t bytes);

  // FillPattern over the whole buffer, then Upload.
  Status Fill(uint64_t seed);
  // Download the range, then the free functions' checks (a failed download is a failed check):
  // the range holds pattern `seed` as FillPattern(host() + offset, bytes, seed) writes it; the
  // range equals `expected`.
  ::testing::AssertionResult HasPattern(uint64_t seed) { return HasPattern(0, size(), seed); }
  ::testing::AssertionResult HasPattern(size_t offset, size_t bytes, uint64_t seed);
  ::testing::AssertionResult Equals(size_t offset, const void* expected, size_t bytes);
  // Download, then a copy of the whole buffer (empty on a failed download, with a test failure).
  std::vector<uint8_t> Read();

 private:
  DeviceBytes(Buffer* buffer, uint8_t* host, std::unique_ptr<Buffer> image, std::unique_ptr<Stream> stream)
      : buffer_(buffer), host_(host), image_(std::move(image)), stream_(std::move(stream)) {}
  Status CheckRange(size_t offset, size_t bytes) const;

  Buffer* buffer_;
  uint8_t* host_;
  std::unique_ptr<Buffer> image_;   // staged only: AllocateHost memory, buffer-sized
  std::unique_ptr<Stream> stream_;  // staged only; after image_, so destroyed (drained) first
};

// Copy shapes of the data and multi-device copy tests: odd sizes at odd source and destination
// offsets (kMaxOffset is the largest offset in kOffsetPairs).
inline constexpr size_t kOddSizes[] = {1, 3, 4095, 4096, 65537, (size_t{1} << 20) + 7};
struct OffsetPair {
  size_t src, dst;
};
inline constexpr OffsetPair kOffsetPairs[] = {{0, 0}, {1, 3}, {3, 1}, {4097, 0}, {0, 4097}, {7, 7}};
inline constexpr size_t kMaxOffset = 4097;

}  // namespace kizuna::device::conformance

// Fails the test (and returns from it) when an allocation/creation helper returned null.
#define KZ_ASSERT_NOT_NULL(p) ASSERT_NE((p), nullptr) << #p " could not be created"
