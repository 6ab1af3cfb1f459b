// DeviceConformance, memory (every backend): device properties, allocation (zero bytes, 1,000
// live buffers without overlap), out-of-memory that leaves the device usable, and host memory
// (Device::AllocateHost) or its kNotSupported. What the groups check and need: README.md; the
// fixture and instantiation: device_conformance.cc.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/dtype.h"
#include "tests/conformance/device/device_conformance.h"

namespace kizuna::device::conformance {
namespace {

TEST_P(DeviceConformance, PropertiesDescribeEachDevice) {
  std::vector<std::string> uuids;
  for (int i = 0; i < backend().device_count(); ++i) {
    SCOPED_TRACE(fmt::format("device {}", i));
    Device* d = backend().device(i);
    ASSERT_NE(d, nullptr);
    const DeviceProperties& p = d->properties();
    EXPECT_EQ(p.backend, backend().name()) << "properties().backend must be the registry name";
    EXPECT_EQ(p.index, i);
    EXPECT_FALSE(p.name.empty()) << "every device needs a human-readable name";
    EXPECT_FALSE(p.uuid.empty()) << "every device needs a host-wide uuid (export/import matches on it)";
    EXPECT_GT(p.memory_bytes, 0u) << "memory_bytes sizes the out-of-memory checks and the cost model";
    EXPECT_GE(p.copy_gbps, 0.0);
    EXPECT_GE(p.reduce_gbps, 0.0);
    EXPECT_GE(p.launch_latency_us, 0.0);
    EXPECT_GE(p.numa_node, -1);
    EXPECT_EQ(d->label(), fmt::format("{}:{}", backend().name(), i));
    EXPECT_EQ(std::count(uuids.begin(), uuids.end(), p.uuid), 0) << "uuid " << p.uuid << " is not unique";
    uuids.push_back(p.uuid);
  }
  EXPECT_EQ(backend().device(backend().device_count()), nullptr) << "device(count) must be null";
  EXPECT_EQ(backend().device(-1), nullptr) << "device(-1) must be null";
}

TEST_P(DeviceConformance, AllocateZeroBytes) {
  auto r = device().Allocate(0);
  KZ_ASSERT_OK(r.status());
  EXPECT_EQ((*r)->size(), 0u);
  EXPECT_EQ(&(*r)->device(), &device());
  EXPECT_FALSE((*r)->imported());
}

TEST_P(DeviceConformance, AllocateManyBuffersWithoutOverlap) {
  constexpr int kBuffers = 1000;
  Rng rng(1);
  std::vector<std::unique_ptr<Buffer>> buffers;
  buffers.reserve(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    const size_t bytes = i % 97 == 0 ? 0 : static_cast<size_t>(rng.Uniform(1, 8192));
    auto b = MustAllocate(bytes);
    KZ_ASSERT_NOT_NULL(b);
    buffers.push_back(std::move(b));
  }
  // Live buffers never share bytes.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const auto& b : buffers)
    if (b->size() > 0) ranges.emplace_back(reinterpret_cast<uintptr_t>(b->data()), b->size());
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    ASSERT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first) << "two live buffers overlap";
  // Every buffer keeps its own bytes (written to all first, then read back), where the bytes can
  // be reached. One view at a time: a staged view holds host memory and a stream.
  if (under_test().Has(Tag::kHostAccessible) || under_test().Has(Tag::kHostMemory)) {
    for (size_t i = 0; i < buffers.size(); ++i) {
      KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*buffers[i]));
      KZ_ASSERT_OK(bytes.Fill(i)) << "buffer " << i;
    }
    for (size_t i = 0; i < buffers.size(); ++i) {
      KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*buffers[i]));
      ASSERT_TRUE(bytes.HasPattern(i)) << "buffer " << i;
    }
  }
  // Free in a scrambled order, then the device must still allocate.
  for (size_t i = buffers.size(); i > 1; --i) std::swap(buffers[i - 1], buffers[rng.Next() % i]);
  buffers.clear();
  auto again = MustAllocate(1 << 20);
  EXPECT_NE(again, nullptr);
}

TEST_P(DeviceConformance, AllocationBeyondMemoryIsOutOfMemory) {
  const uint64_t memory = device().properties().memory_bytes;
  if (memory > 0 && memory < std::numeric_limits<size_t>::max()) {
    KZ_EXPECT_CODE(device().Allocate(static_cast<size_t>(memory) + 1).status(), StatusCode::kOutOfMemory);
  }
  KZ_EXPECT_CODE(device().Allocate(size_t{1} << 62).status(), StatusCode::kOutOfMemory);
  // A failed allocation leaves the device usable.
  auto b = MustAllocate(4096);
  EXPECT_NE(b, nullptr);
}

// Device::AllocateHost: memory the CPU reads and writes and the device's streams take as copy
// source and destination and as reduce input and output. Host-accessible backends answer with
// device memory; others either have host memory (the host_memory tag) or say kNotSupported.
TEST_P(DeviceConformance, AllocateHostOrNotSupported) {
  if (!under_test().Has(Tag::kHostMemory)) {
    KZ_EXPECT_CODE(device().AllocateHost(4096).status(), StatusCode::kNotSupported);
    return;
  }
  auto empty = device().AllocateHost(0);
  KZ_ASSERT_OK(empty.status());
  EXPECT_EQ((*empty)->size(), 0u);
  EXPECT_EQ(&(*empty)->device(), &device());
  EXPECT_FALSE((*empty)->imported());

  // A pattern written by the CPU survives host -> device -> host through stream copies, at odd
  // sizes and offsets; the host buffers are addressable by the device's streams.
  constexpr size_t kBytes = (size_t{1} << 20) + 13;
  KZ_ASSERT_OK_AND_ASSIGN(auto in, device().AllocateHost(kBytes));
  KZ_ASSERT_OK_AND_ASSIGN(auto out, device().AllocateHost(kBytes));
  auto middle = MustAllocate(kBytes);
  auto stream = MustCreateStream();  // after the buffers its work touches
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(middle);
  ASSERT_EQ(in->size(), kBytes);
  ASSERT_EQ(out->size(), kBytes);
  EXPECT_TRUE(device().Addressable(in->data(), kBytes));
  EXPECT_TRUE(device().Addressable(out->data(), kBytes));
  FillPattern(in->data(), kBytes, 301);
  FillPattern(out->data(), kBytes, 302);
  KZ_ASSERT_OK(stream->Copy(At(*middle), At(*in), kBytes));
  KZ_ASSERT_OK(stream->Copy(At(*out, 3), At(*middle, 5), kBytes - 8));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(BytesEqual(At(*out, 3), At(*in, 5), kBytes - 8)) << "the round trip lost bytes";
  EXPECT_TRUE(HasPattern(out->data(), 3, 302)) << "bytes before the destination";
  EXPECT_TRUE(HasPattern(in->data(), kBytes, 301)) << "the source changed";

  // Host memory as reduce inputs and output, beside device memory: out = in + middle (= 2 x in).
  constexpr size_t kCount = 1031;
  const void* srcs[] = {At(*in), At(*middle)};
  KZ_ASSERT_OK(stream->Reduce(At(*out), srcs, kCount, DataType::kUint8, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += At(*out)[i] != static_cast<uint8_t>(2 * PatternByte(301, i));
  EXPECT_EQ(wrong, 0u) << "of " << kCount << " bytes of a reduce into host memory";
}

}  // namespace
}  // namespace kizuna::device::conformance
