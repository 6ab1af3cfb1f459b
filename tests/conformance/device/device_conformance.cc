// The test-side half of device_conformance.h (conformance_main.cc holds the world and the import
// child): the group table, the byte checks, DeviceBytes, the gate callback, the fixture, and the
// instantiation of every parameterized group. Every TEST_P runs once per backend whose capability
// tags the group needs; test names end in the backend's name.
//
// Groups, and the files that hold their tests:
//  - DeviceConformance: every backend (unavailable ones skip, broken ones fail): properties,
//    allocation and out-of-memory, host memory (AllocateHost) or its kNotSupported
//    (memory_conformance_test.cc), argument checks (data_conformance_test.cc), stream and event
//    semantics through host callbacks, cross-backend events (stream_conformance_test.cc), export
//    range checks, DMA-BUF export or its kNotSupported, cross-backend imports
//    (export_conformance_test.cc).
//  - DataConformance (host_accessible or host_memory): copies and reductions checked byte for
//    byte (data_conformance_test.cc), stream ordering over long dependent chains, cross-stream
//    data dependencies (stream_conformance_test.cc).
//  - HostAccessConformance (host_accessible): the CPU reading and writing device memory directly
//    (stream_conformance_test.cc).
//  - MultiDeviceConformance (host_accessible or host_memory, and multi_device): copies and events
//    across devices (stream_conformance_test.cc).
//  - ExportConformance (host_accessible or host_memory, and export_fd or export_opaque): import in
//    this process and in a second process spawned from this binary (export_conformance_test.cc).
//  - HostEmulatedFaultInjection: host_emulated only, through its factory with fault injection set
//    (fault_injection_test.cc); not parameterized over the registry.

#include "tests/conformance/device/device_conformance.h"

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::device::conformance {

// ---- The groups and their requirements (also printed at startup) ----

const std::vector<TestGroup>& TestGroups() {
  static const std::vector<TestGroup> groups = {
      {"DeviceConformance", {}, ""},
      {"DataConformance",
       {{Tag::kHostAccessible, Tag::kHostMemory}},
       "bytes are checked through the CPU: directly on host-accessible memory, or staged through "
       "Device::AllocateHost memory with stream copies, and the backend has neither"},
      {"HostAccessConformance",
       {{Tag::kHostAccessible}},
       "these tests are about the CPU dereferencing device memory (plain loads and stores, also from "
       "host callbacks)"},
      {"MultiDeviceConformance",
       {{Tag::kHostAccessible, Tag::kHostMemory}, {Tag::kMultiDevice}},
       "needs a second device of the same backend, and host access or host memory to check the bytes"},
      {"ExportConformance",
       {{Tag::kHostAccessible, Tag::kHostMemory}, {Tag::kExportFd, Tag::kExportOpaque}},
       "needs memory export (an fd or an opaque IPC handle), and host access or host memory to check "
       "the bytes on both sides"},
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

// ---- DeviceBytes ----

Result<DeviceBytes> DeviceBytes::Create(Buffer& buffer) {
  Device& device = buffer.device();
  if (device.properties().host_accessible)
    return DeviceBytes(&buffer, static_cast<uint8_t*>(buffer.data()), nullptr, nullptr);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> image, device.AllocateHost(buffer.size()));
  if (image->size() != buffer.size())
    return Internal(fmt::format("{}: AllocateHost({}) returned {} bytes", device.label(), buffer.size(),
                                image->size()));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, device.CreateStream());
  auto* host = static_cast<uint8_t*>(image->data());
  return DeviceBytes(&buffer, host, std::move(image), std::move(stream));
}

Status DeviceBytes::CheckRange(size_t offset, size_t bytes) const {
  if (offset > size() || bytes > size() - offset)
    return InvalidArgument(fmt::format("range [{}, +{}) exceeds the viewed buffer's {} bytes", offset, bytes, size()));
  return Status::Ok();
}

Status DeviceBytes::Upload(size_t offset, size_t bytes, Deadline deadline) {
  KZ_RETURN_IF_ERROR(CheckRange(offset, bytes));
  if (!staged() || bytes == 0) return Status::Ok();
  KZ_RETURN_IF_ERROR(stream_->Copy(At(*buffer_, offset), host_ + offset, bytes).WithContext("upload"));
  return stream_->Synchronize(deadline).WithContext("upload");
}

Status DeviceBytes::Download(size_t offset, size_t bytes, Deadline deadline) {
  KZ_RETURN_IF_ERROR(CheckRange(offset, bytes));
  if (!staged() || bytes == 0) return Status::Ok();
  KZ_RETURN_IF_ERROR(stream_->Copy(host_ + offset, At(*buffer_, offset), bytes).WithContext("download"));
  return stream_->Synchronize(deadline).WithContext("download");
}

Status DeviceBytes::EnqueueDownload(Stream& stream, size_t offset, size_t bytes) {
  KZ_RETURN_IF_ERROR(CheckRange(offset, bytes));
  if (!staged() || bytes == 0) return Status::Ok();
  return stream.Copy(host_ + offset, At(*buffer_, offset), bytes).WithContext("download");
}

Status DeviceBytes::Fill(uint64_t seed) {
  FillPattern(host_, size(), seed);
  return Upload();
}

::testing::AssertionResult DeviceBytes::HasPattern(size_t offset, size_t bytes, uint64_t seed) {
  if (Status s = Download(offset, bytes); !s.ok()) return ::testing::AssertionFailure() << s.ToString();
  return conformance::HasPattern(host_ + offset, bytes, seed);
}

::testing::AssertionResult DeviceBytes::Equals(size_t offset, const void* expected, size_t bytes) {
  if (Status s = Download(offset, bytes); !s.ok()) return ::testing::AssertionFailure() << s.ToString();
  return BytesEqual(host_ + offset, expected, bytes);
}

std::vector<uint8_t> DeviceBytes::Read() {
  if (Status s = Download(); !s.ok()) {
    ADD_FAILURE() << buffer_->device().label() << ": " << s.ToString();
    return {};
  }
  return std::vector<uint8_t>(host_, host_ + size());
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
INSTANTIATE_TEST_SUITE_P(Backends, HostAccessConformance,
                         ::testing::ValuesIn(World().ParamsFor("HostAccessConformance")), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, MultiDeviceConformance,
                         ::testing::ValuesIn(World().ParamsFor("MultiDeviceConformance")), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, ExportConformance, ::testing::ValuesIn(World().ParamsFor("ExportConformance")),
                         BackendTestName);
// A run whose backends lack a capability leaves its group empty; that is reported at startup.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DataConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(HostAccessConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiDeviceConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ExportConformance);

}  // namespace
}  // namespace kizuna::device::conformance
