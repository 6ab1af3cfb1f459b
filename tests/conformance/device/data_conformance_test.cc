// Copies and reductions, byte for byte: DataConformance (host_accessible) copies of odd sizes at
// odd offsets and reductions of every dtype x op against reference_reduce.h, and the argument
// checks of Stream::Copy / Stream::Reduce (DeviceConformance: every backend; DataConformance:
// rejected calls change no memory). What the groups check and need: README.md.

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/dtype.h"
#include "tests/conformance/device/device_conformance.h"
#include "tests/conformance/device/reference_reduce.h"

namespace kizuna::device::conformance {
namespace {

// ---- Copies ----

TEST_P(DataConformance, CopyOddSizesAndOffsetsBetweenBuffers) {
  for (size_t size : kOddSizes) {
    const size_t total = size + kMaxOffset + 64;  // 64 guard bytes past the farthest end
    auto src = MustAllocate(total);
    auto dst = MustAllocate(total);
    // A stream per size, after the buffers it copies between: destroyed (drained) before them.
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_NOT_NULL(src);
    KZ_ASSERT_NOT_NULL(dst);
    FillPattern(src->data(), total, 1000 + size);
    for (const OffsetPair& o : kOffsetPairs) {
      SCOPED_TRACE(fmt::format("{} bytes, src offset {}, dst offset {}", size, o.src, o.dst));
      FillPattern(dst->data(), total, 7);
      KZ_ASSERT_OK(stream->Copy(Bytes(*dst) + o.dst, Bytes(*src) + o.src, size));
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
      EXPECT_TRUE(BytesEqual(Bytes(*dst) + o.dst, Bytes(*src) + o.src, size));
      // Nothing outside the destination range was touched.
      std::vector<uint8_t> expect(total);
      FillPattern(expect.data(), total, 7);
      EXPECT_TRUE(BytesEqual(Bytes(*dst), expect.data(), o.dst)) << "bytes before the destination";
      EXPECT_TRUE(BytesEqual(Bytes(*dst) + o.dst + size, expect.data() + o.dst + size, total - o.dst - size))
          << "bytes after the destination";
    }
    EXPECT_TRUE(HasPattern(src->data(), total, 1000 + size)) << "the source changed";
  }
}

TEST_P(DataConformance, CopyWithinOneBuffer) {
  for (size_t size : kOddSizes) {
    SCOPED_TRACE(fmt::format("{} bytes", size));
    // [guard][src at 5][gap 3][dst][guard]: odd offsets, adjacent but not overlapping.
    const size_t src_off = 5, dst_off = src_off + size + 3, total = dst_off + size + 11;
    auto buffer = MustAllocate(total);
    auto stream = MustCreateStream();  // after the buffer: destroyed (drained) before it
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_NOT_NULL(buffer);
    FillPattern(buffer->data(), total, size);
    std::vector<uint8_t> expect(Bytes(*buffer), Bytes(*buffer) + total);
    std::memcpy(expect.data() + dst_off, expect.data() + src_off, size);
    KZ_ASSERT_OK(stream->Copy(Bytes(*buffer) + dst_off, Bytes(*buffer) + src_off, size));
    // Adjacent ranges (dst ends where src begins) are not an overlap either.
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    EXPECT_TRUE(BytesEqual(Bytes(*buffer), expect.data(), total));
  }
  auto adjacent = MustAllocate(64);
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(adjacent);
  FillPattern(adjacent->data(), 64, 3);
  std::vector<uint8_t> expect(Bytes(*adjacent), Bytes(*adjacent) + 64);
  std::memcpy(expect.data(), expect.data() + 32, 32);
  KZ_ASSERT_OK(stream->Copy(Bytes(*adjacent), Bytes(*adjacent) + 32, 32));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(BytesEqual(Bytes(*adjacent), expect.data(), 64));
}

// ---- Argument checks ----

TEST_P(DeviceConformance, InvalidCopyArgumentsAreRejected) {
  auto buffer = MustAllocate(4096);
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* p = Bytes(*buffer);
  KZ_EXPECT_CODE(stream->Copy(nullptr, p, 16), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Copy(p, nullptr, 16), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Copy(p + 8, p, 16), StatusCode::kInvalidArgument);  // overlap
  KZ_EXPECT_CODE(stream->Copy(p, p + 15, 16), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(stream->Copy(p, p + 16, 0));  // nothing to do
  KZ_EXPECT_OK(stream->Copy(nullptr, nullptr, 0));
  auto q = stream->Query();
  KZ_ASSERT_OK(q.status());
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline())) << "a rejected call must not poison the stream";
}

TEST_P(DeviceConformance, InvalidReduceArgumentsAreRejected) {
  constexpr size_t kCount = 64;
  auto buffer = MustAllocate(4 * kCount * sizeof(float));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* f = static_cast<float*>(buffer->data());
  const void* a = f;
  const void* b = f + kCount;
  void* out = f + 2 * kCount;
  const void* two[] = {a, b};
  KZ_EXPECT_CODE(stream->Reduce(out, std::span<const void* const>(), kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Reduce(nullptr, two, kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  const void* with_null[] = {a, nullptr};
  KZ_EXPECT_CODE(stream->Reduce(out, with_null, kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Reduce(out, two, kCount, static_cast<DataType>(42), ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Reduce(out, two, kCount, DataType::kFloat32, static_cast<ReduceOp>(17)),
                 StatusCode::kInvalidArgument);
  // Output overlapping an input by part of its range (not exactly in place).
  const void* shifted[] = {f + 2 * kCount + 1, b};
  KZ_EXPECT_CODE(stream->Reduce(out, shifted, kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  const void* overlap_b[] = {a, f + kCount + kCount / 2};
  KZ_EXPECT_CODE(stream->Reduce(f + kCount, overlap_b, kCount, DataType::kFloat32, ReduceOp::kMax),
                 StatusCode::kInvalidArgument);
  // Count 0 is valid and does nothing.
  KZ_EXPECT_OK(stream->Reduce(out, two, 0, DataType::kFloat32, ReduceOp::kSum));
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline())) << "a rejected call must not poison the stream";
}

TEST_P(DataConformance, RejectedCallsEnqueueNothing) {
  constexpr size_t kCount = 256;
  auto buffer = MustAllocate(4 * kCount * sizeof(int32_t));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  const size_t total = buffer->size();
  FillPattern(buffer->data(), total, 99);
  auto* v = static_cast<int32_t*>(buffer->data());
  const void* in[] = {v, v + kCount};
  const void* partial[] = {v + 2 * kCount + 3, v + kCount};
  EXPECT_FALSE(stream->Copy(v + 10, v, kCount * sizeof(int32_t)).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, partial, kCount, DataType::kInt32, ReduceOp::kSum).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, in, kCount, static_cast<DataType>(200), ReduceOp::kSum).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, in, kCount, DataType::kInt32, static_cast<ReduceOp>(200)).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, std::span<const void* const>(), kCount, DataType::kInt32,
                              ReduceOp::kSum).ok());
  KZ_EXPECT_OK(stream->Reduce(v + 2 * kCount, in, 0, DataType::kInt32, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(buffer->data(), total, 99)) << "a rejected (or empty) call changed memory";
}


// ---- Reductions ----

// One batch per data type: every op x 1..8 inputs x counts {1, 3, 1031}, enqueued back to back on
// one stream (outputs in one buffer, inputs in another), then checked after one Synchronize.
TEST_P(DataConformance, ReduceEveryTypeOpAndInputCount) {
  constexpr size_t kMaxInputs = 8;
  constexpr size_t kCounts[] = {1, 3, 1031};
  constexpr size_t kMaxCount = 1031;
  Rng rng(2024);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t esize = DataTypeSize(type);
    const size_t stride = kMaxCount * esize;
    auto inputs = MustAllocate(kMaxInputs * stride);
    KZ_ASSERT_NOT_NULL(inputs);
    for (size_t k = 0; k < kMaxInputs; ++k) FillInputs(Bytes(*inputs) + k * stride, kMaxCount, type, rng);
    const std::vector<uint8_t> host(Bytes(*inputs), Bytes(*inputs) + inputs->size());

    struct Case {
      ReduceOp op;
      size_t n, count, out_offset;
    };
    std::vector<Case> cases;
    size_t out_bytes = 0;
    for (ReduceOp op : AllReduceOps())
      for (size_t n = 1; n <= kMaxInputs; ++n)
        for (size_t count : kCounts) {
          cases.push_back({op, n, count, out_bytes});
          out_bytes += count * esize + 8 * esize;  // a small gap keeps neighbours apart
        }
    auto outputs = MustAllocate(out_bytes);
    // A stream per type, after the buffers its batch uses: destroyed (drained) before them.
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_NOT_NULL(outputs);
    FillPattern(outputs->data(), out_bytes, 5);
    for (const Case& c : cases) {
      std::vector<const void*> srcs;
      for (size_t k = 0; k < c.n; ++k) srcs.push_back(Bytes(*inputs) + k * stride);
      KZ_ASSERT_OK(stream->Reduce(Bytes(*outputs) + c.out_offset, srcs, c.count, type, c.op))
          << CaseName(type, c.op, c.n, c.count);
    }
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    for (const Case& c : cases) {
      std::vector<const void*> srcs;
      for (size_t k = 0; k < c.n; ++k) srcs.push_back(host.data() + k * stride);
      EXPECT_TRUE(CheckReduce(Bytes(*outputs) + c.out_offset, srcs, c.count, type, c.op))
          << CaseName(type, c.op, c.n, c.count);
      // The gap after each output is untouched.
      std::vector<uint8_t> gap(8 * esize);
      const size_t gap_at = c.out_offset + c.count * esize;
      for (size_t i = 0; i < gap.size(); ++i) gap[i] = PatternByte(5, gap_at + i);
      EXPECT_TRUE(BytesEqual(Bytes(*outputs) + gap_at, gap.data(), gap.size()))
          << CaseName(type, c.op, c.n, c.count) << " wrote past its output";
    }
    EXPECT_TRUE(BytesEqual(Bytes(*inputs), host.data(), host.size())) << "a reduce changed its inputs";
  }
}

// Large counts take the multi-threaded paths of a backend (host_emulated splits past 1 MiB).
TEST_P(DataConformance, ReduceLargeCount) {
  constexpr size_t kCount = (size_t{1} << 20) + 3;
  constexpr size_t kInputs = 4;
  Rng rng(7);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t bytes = kCount * DataTypeSize(type);
    auto inputs = MustAllocate(kInputs * bytes);
    auto outputs = MustAllocate(kNumReduceOps * bytes);
    // A stream per type, after the buffers its reduces use: destroyed (drained) before them.
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_NOT_NULL(inputs);
    KZ_ASSERT_NOT_NULL(outputs);
    std::vector<const void*> srcs;
    for (size_t k = 0; k < kInputs; ++k) {
      FillInputs(Bytes(*inputs) + k * bytes, kCount, type, rng);
      srcs.push_back(Bytes(*inputs) + k * bytes);
    }
    for (size_t o = 0; o < AllReduceOps().size(); ++o)
      KZ_ASSERT_OK(stream->Reduce(Bytes(*outputs) + o * bytes, srcs, kCount, type, AllReduceOps()[o]));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    for (size_t o = 0; o < AllReduceOps().size(); ++o)
      EXPECT_TRUE(CheckReduce(Bytes(*outputs) + o * bytes, srcs, kCount, type, AllReduceOps()[o]))
          << CaseName(type, AllReduceOps()[o], kInputs, kCount);
  }
}

TEST_P(DataConformance, ReduceInPlace) {
  constexpr size_t kCount = 1031;
  Rng rng(11);
  for (DataType type : AllDataTypes()) {
    for (ReduceOp op : AllReduceOps()) {
      // dst == srcs[0] (the NCCL in-place form), and dst == the last of four inputs.
      for (size_t inplace_at : {size_t{0}, size_t{3}}) {
        const size_t n = inplace_at == 0 ? 3 : 4;
        SCOPED_TRACE(CaseName(type, op, n, kCount) + fmt::format(", output is input {}", inplace_at));
        const size_t bytes = kCount * DataTypeSize(type);
        auto buffer = MustAllocate(n * bytes);
        auto stream = MustCreateStream();  // after the buffer: destroyed (drained) before it
        KZ_ASSERT_NOT_NULL(stream);
        KZ_ASSERT_NOT_NULL(buffer);
        for (size_t k = 0; k < n; ++k) FillInputs(Bytes(*buffer) + k * bytes, kCount, type, rng);
        const std::vector<uint8_t> host(Bytes(*buffer), Bytes(*buffer) + n * bytes);
        std::vector<const void*> srcs, host_srcs;
        for (size_t k = 0; k < n; ++k) {
          srcs.push_back(Bytes(*buffer) + k * bytes);
          host_srcs.push_back(host.data() + k * bytes);
        }
        void* dst = Bytes(*buffer) + inplace_at * bytes;
        KZ_ASSERT_OK(stream->Reduce(dst, srcs, kCount, type, op));
        KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
        EXPECT_TRUE(CheckReduce(dst, host_srcs, kCount, type, op));
      }
    }
  }
  // In place at a large count (the parallel path reads and writes the same memory).
  constexpr size_t kLarge = (size_t{1} << 20) + 3;
  auto big = MustAllocate(3 * kLarge * sizeof(float));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(big);
  auto* f = static_cast<float*>(big->data());
  FillInputs(f, 3 * kLarge, DataType::kFloat32, rng);
  const std::vector<float> host(f, f + 3 * kLarge);
  const void* srcs[] = {f, f + kLarge, f + 2 * kLarge};
  const void* host_srcs[] = {host.data(), host.data() + kLarge, host.data() + 2 * kLarge};
  KZ_ASSERT_OK(stream->Reduce(f, srcs, kLarge, DataType::kFloat32, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(CheckReduce(f, host_srcs, kLarge, DataType::kFloat32, ReduceOp::kSum));
}

TEST_P(DataConformance, ReduceCountZeroAndRepeatedInputs) {
  constexpr size_t kCount = 333;
  auto buffer = MustAllocate(3 * kCount * sizeof(int64_t));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* v = static_cast<int64_t*>(buffer->data());
  Rng rng(5);
  FillInputs(v, 2 * kCount, DataType::kInt64, rng);
  FillPattern(v + 2 * kCount, kCount * sizeof(int64_t), 17);
  const void* in[] = {v, v + kCount};
  KZ_ASSERT_OK(stream->Reduce(v + 2 * kCount, in, 0, DataType::kInt64, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(v + 2 * kCount, kCount * sizeof(int64_t), 17)) << "count 0 wrote memory";

  // The same input may appear several times (only the output's overlap is restricted).
  const void* repeated[] = {v, v + kCount, v, v};
  KZ_ASSERT_OK(stream->Reduce(v + 2 * kCount, repeated, kCount, DataType::kInt64, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(CheckReduce(v + 2 * kCount, repeated, kCount, DataType::kInt64, ReduceOp::kSum));
}

}  // namespace
}  // namespace kizuna::device::conformance
