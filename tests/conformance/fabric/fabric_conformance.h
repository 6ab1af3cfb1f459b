// The fabric conformance suite (README.md; like tests/conformance/device/): one set of tests,
// compiled once, instantiated for every fabric registered in the binary (the fabrics whose
// libraries are linked in: directconnect now; ofi, roce as they arrive).
//
// Contract of this header:
//  - conformance_main.cc calls InitConformance() once, before InitGoogleTest (the INSTANTIATE
//    generators read the fabric list there), and keeps the world alive while the tests run.
//  - The world plays two ranks of one job: for each fabric, rank 0 and rank 1 each get their own
//    Fabric instance (CreateFabric with FabricContext rank 0 / 1, world size 2). For
//    point-to-point fabrics the suite writes a 2-worker ring topology and points
//    Config::topology at it, so ranks 0 and 1 are linked (any KIZUNA_TOPOLOGY is replaced).
//  - Tests run the two ranks as two threads of this process; the cross-process tests run rank 1
//    as a second process (this binary again, `--fabric-child=...`), which exchanges handles and
//    its verdict with the parent over an inherited Unix socket.
//  - Each fabric carries capability tags from its properties; a group needing a tag is
//    instantiated only for fabrics that have it, and the startup listing says which groups are
//    left out and why. A fabric whose factory reports kUnavailable is instantiated in the groups
//    that need no tag and every test skips with the reason; any other failure fails every test.
//  - Every wait has a deadline (TestDeadline()), so a broken fabric fails a test, never hangs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/status_testing.h"
#include "runtime/device/registry.h"

namespace kizuna::fabric::conformance {

// The longest any single wait in the suite may take: a wedged fabric fails its test, not the
// binary's Bazel timeout.
inline constexpr double kTestTimeoutSeconds = 30.0;
inline Deadline TestDeadline() { return Deadline::AfterSeconds(kTestTimeoutSeconds); }

// The largest message of the default run, and of `--large` (capped by each fabric's
// max_message_bytes). README.md: up to 1 GiB on the host.
inline constexpr uint64_t kDefaultMaxBytes = uint64_t{64} << 20;
inline constexpr uint64_t kLargeMaxBytes = uint64_t{1} << 30;

// ---- Capability tags ----

enum class Tag : uint8_t {
  kWriteImmediate,  // FabricDeviceProperties::write_immediate
  kFdMemory,        // ptr_support has kPtrFd (and an emulated device exports fds in this binary)
  kPointToPoint,    // devices reach one link peer each (directconnect)
  kNoWriteImmediate,  // the opposite of kWriteImmediate: one-sided calls must say "not supported"
};
std::string_view TagName(Tag tag);

struct FabricUnderTest {
  std::string name;
  const FabricSlot* slot = nullptr;  // rank 0's registry slot (its status decides skip / fail)
  std::vector<Tag> tags;
  uint64_t max_bytes = 0;  // the largest message this run sends on it

  bool available() const { return slot->status.ok(); }
  bool Has(Tag tag) const;
  std::string TagList() const;
};

struct TestGroup {
  std::string_view suite;
  std::vector<Tag> requires_all;
  std::string_view reason;
  bool AppliesTo(const FabricUnderTest& f) const;
};

struct FabricParam {
  size_t index = 0;
};
void PrintTo(const FabricParam& param, std::ostream* os);

struct Options {
  uint64_t max_bytes = kDefaultMaxBytes;  // --large: kLargeMaxBytes; --max-bytes=N
  std::string topology_path;              // the suite's ring topology (written by main)
};

class ConformanceWorld {
 public:
  ConformanceWorld(Config config, Options options);

  const Config& config() const { return *config_; }
  const Options& options() const { return options_; }
  const std::vector<FabricUnderTest>& fabrics() const { return fabrics_; }
  const FabricUnderTest& fabric(const FabricParam& p) const { return fabrics_.at(p.index); }
  // The emulated devices (for fd registration); nullptr when none is linked in.
  device::Device* emulated_device() const;
  std::vector<FabricParam> ParamsFor(std::string_view suite) const;

 private:
  std::unique_ptr<Config> config_;  // stable address: fabrics and devices keep a pointer to it
  Options options_;
  std::unique_ptr<device::DeviceRegistry> devices_;
  std::unique_ptr<FabricRegistry> registry_;  // rank 0's, for the listing and the slots
  std::vector<FabricUnderTest> fabrics_;
};

const std::vector<TestGroup>& TestGroups();
void InitConformance(Config config, Options options);
void ShutdownConformance();
const ConformanceWorld& World();
void PrintCapabilities(std::FILE* out);
std::string FabricTestName(const ::testing::TestParamInfo<FabricParam>& info);

// The FabricContext of rank `rank` in the suite's world of two.
FabricContext RankContext(int rank);

// ---- Byte patterns (word-wise: fast enough for 1 GiB) ----

void FillPattern(void* p, size_t bytes, uint64_t seed);
::testing::AssertionResult HasPattern(const void* p, size_t bytes, uint64_t seed);

// ---- Host memory, page-aligned and released on scope exit ----

class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool ok() const { return data_ != nullptr || size_ == 0; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// ---- A connection between the two ranks ----

// One direction: `send` lives on the connecting rank, `recv` on the listening rank.
struct Connection {
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// Which device each side uses so that the connecting side reaches the listening side: for
// point-to-point fabrics, the listener's port whose link goes to the other rank and the port at
// the link's far end; otherwise device 0 on both.
struct DevicePair {
  int listen_dev = 0;
  int connect_dev = 0;
};
Result<DevicePair> PickDevices(const Fabric& listener, int listener_rank, const Fabric& connector, int connector_rank);

// Listens on `listener`, connects from `connector` and accepts, concurrently (a fabric may need
// both sides to progress), all bounded by `deadline`.
Result<Connection> Connect(Fabric& listener, int listener_rank, Fabric& connector, int connector_rank,
                           Deadline deadline);

// Runs two functions on two threads and joins them (the two ranks). Each must bound its waits.
void RunBoth(const std::function<void()>& a, const std::function<void()>& b);

// ---- Fixture ----

class FabricTest : public ::testing::TestWithParam<FabricParam> {
 protected:
  void SetUp() override;

  const FabricUnderTest& under_test() const { return World().fabric(GetParam()); }
  // This test's own instances of the fabric for ranks 0 and 1.
  Fabric& rank0() const { return *rank0_; }
  Fabric& rank1() const { return *rank1_; }
  uint64_t max_bytes() const { return under_test().max_bytes; }
  // rank 1 -> rank 0 (send on rank 1, receive on rank 0). Fails the test when it cannot.
  Connection MustConnect();

 private:
  std::unique_ptr<Fabric> rank0_;
  std::unique_ptr<Fabric> rank1_;
};

class FabricConformance : public FabricTest {};
class TransferConformance : public FabricTest {};
class WriteConformance : public FabricTest {};
class NoWriteConformance : public FabricTest {};
class FdMemoryConformance : public FabricTest {};
class ProcessConformance : public FabricTest {};
class FdProcessConformance : public FabricTest {};
class FdWriteConformance : public FabricTest {};

// ---- The second process (parent side in process_conformance_test.cc, child in conformance_main.cc) ----

// argv flag of the child: --fabric-child=<fabric>:<scenario>:<socket fd>.
inline constexpr std::string_view kChildFlag = "--fabric-child=";
inline constexpr double kChildTimeoutSeconds = 25.0;
// Scenarios: "echo" (host buffers), "echo-fd" (emulated device buffers registered by fd),
// "die" (connects, starts receiving, reports ready, then waits to be killed).
int RunChild(std::string_view spec, const Config& config, const Options& options);
// Message sizes of the echo scenarios (the last one is `max`).
std::vector<uint64_t> EchoSizes(uint64_t max);

// Lines on the control socket between parent and child ("handle <hex>", "ready", "ok",
// "fail: <reason>"), each bounded by the deadline.
Status SendLine(int fd, std::string_view line, Deadline deadline);
Result<std::string> ReceiveLine(int fd, Deadline deadline);

}  // namespace kizuna::fabric::conformance
