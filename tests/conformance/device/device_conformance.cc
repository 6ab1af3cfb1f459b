// The test-side half of device_conformance.h (conformance_main.cc holds the world and the import
// child): the group table, the byte checks, the gate callback, the fixture, and the instantiation
// of every parameterized group. Every TEST_P runs once per backend whose capability tags the group
// needs; test names end in the backend's name.
//
// Groups, and the files that hold their tests:
//  - DeviceConformance: every backend (unavailable ones skip, broken ones fail): properties,
//    allocation and out-of-memory (memory_conformance_test.cc), argument checks
//    (data_conformance_test.cc), stream and event semantics through host callbacks, cross-backend
//    events (stream_conformance_test.cc), export range checks and cross-backend imports
//    (export_conformance_test.cc).
//  - DataConformance (host_accessible): copies and reductions checked byte for byte
//    (data_conformance_test.cc), stream ordering over long dependent chains, cross-stream data
//    dependencies (stream_conformance_test.cc).
//  - MultiDeviceConformance (host_accessible, multi_device): copies and events across devices
//    (stream_conformance_test.cc).
//  - ExportConformance (host_accessible, export_fd or export_opaque): import in this process and
//    in a second process spawned from this binary (export_conformance_test.cc).
//  - HostEmulatedFaultInjection: host_emulated only, through its factory with fault injection set
//    (fault_injection_test.cc); not parameterized over the registry.

#include "tests/conformance/device/device_conformance.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/deadline.h"
#include "runtime/status.h"

namespace kizuna::device::conformance {

// ---- The groups and their requirements (also printed at startup) ----

const std::vector<TestGroup>& TestGroups() {
  static const std::vector<TestGroup> groups = {
      {"DeviceConformance", {}, {}, ""},
      {"DataConformance",
       {Tag::kHostAccessible},
       {},
       "bytes are checked by reading device memory from the CPU, and the device API has no host-copy "
       "call to stage them through"},
      {"MultiDeviceConformance",
       {Tag::kHostAccessible, Tag::kMultiDevice},
       {},
       "needs a second device of the same backend, and host access to check the bytes"},
      {"ExportConformance",
       {Tag::kHostAccessible},
       {Tag::kExportFd, Tag::kExportOpaque},
       "needs memory export (an fd or an opaque IPC handle), and host access to check the bytes on "
       "both sides"},
  };
  return groups;
}

// ---- Helpers declared in device_conformance.h ----

::testing::AssertionResult HasPattern(const void* p, size_t bytes, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != PatternByte(seed, i)) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << bytes << " bytes differ from pattern " << seed
                                       << "; first at " << first << ": " << int{b[first]} << " instead of "
                                       << int{PatternByte(seed, first)};
}

::testing::AssertionResult BytesEqual(const void* actual, const void* expected, size_t bytes) {
  if (bytes == 0 || std::memcmp(actual, expected, bytes) == 0) return ::testing::AssertionSuccess();
  const auto* a = static_cast<const uint8_t*>(actual);
  const auto* e = static_cast<const uint8_t*>(expected);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (a[i] != e[i]) {
      if (wrong++ == 0) first = i;
    }
  }
  return ::testing::AssertionFailure() << wrong << " of " << bytes << " bytes differ; first at " << first << ": "
                                       << int{a[first]} << " instead of " << int{e[first]};
}

Status EnqueueGate(Stream& stream, std::shared_ptr<Gate> gate) {
  return stream.EnqueueHostCallback([gate](const Status&) {
    gate->MarkReached();
    // Bounded: a test that fails before opening the gate must not wedge the stream.
    gate->WaitOpen(Deadline::After(kGateMaxHold));
  });
}

void BackendTest::SetUp() {
  const BackendUnderTest& b = under_test();
  const BackendSlot& slot = *b.slot;
  if (!slot.status.ok()) {
    if (slot.status.code() == StatusCode::kUnavailable)
      GTEST_SKIP() << "backend " << b.name << " is unavailable here: " << slot.status.message();
    FAIL() << "backend " << b.name << " (" << slot.origin << ") did not start: " << slot.status.ToString();
  }
  backend_ = slot.backend.get();
  ASSERT_GT(backend_->device_count(), 0) << "backend " << b.name << " started with no devices (a backend "
                                         << "without devices must report kUnavailable instead)";
  device_ = backend_->device(0);
  ASSERT_NE(device_, nullptr) << "backend " << b.name << ": device(0) is null";
}

std::unique_ptr<Buffer> BackendTest::MustAllocate(Device& d, size_t bytes) {
  auto r = d.Allocate(bytes);
  EXPECT_TRUE(r.ok()) << d.label() << ": Allocate(" << bytes << ") -> " << r.status().ToString();
  if (!r.ok()) return nullptr;
  EXPECT_EQ((*r)->size(), bytes);
  return std::move(r).value();
}

std::unique_ptr<Stream> BackendTest::MustCreateStream(Device& d) {
  auto r = d.CreateStream();
  EXPECT_TRUE(r.ok()) << d.label() << ": CreateStream -> " << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<Event> BackendTest::MustCreateEvent(Device& d) {
  auto r = d.CreateEvent();
  EXPECT_TRUE(r.ok()) << d.label() << ": CreateEvent -> " << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

namespace {

// ============================================================================================
// Instantiation: each group for the backends its tags select (device_conformance.h).
// ============================================================================================

INSTANTIATE_TEST_SUITE_P(Backends, DeviceConformance, ::testing::ValuesIn(World().ParamsFor("DeviceConformance")),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, DataConformance, ::testing::ValuesIn(World().ParamsFor("DataConformance")),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, MultiDeviceConformance,
                         ::testing::ValuesIn(World().ParamsFor("MultiDeviceConformance")), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, ExportConformance, ::testing::ValuesIn(World().ParamsFor("ExportConformance")),
                         BackendTestName);
// A run whose backends lack a capability leaves its group empty; that is reported at startup.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DataConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiDeviceConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ExportConformance);

}  // namespace
}  // namespace kizuna::device::conformance
