// Copies and reductions, byte for byte: DataConformance (host_accessible or host_memory) copies of
// odd sizes at odd offsets and reductions of every dtype x op against reference_reduce.h; and the
// argument checks of Stream::Copy / Reduce (DeviceConformance: every backend; DataConformance:
// rejected calls change no memory). Scales: scale_conformance_test.cc. Device bytes are written
// and read through DeviceBytes (device_conformance.h). What the groups check and need: README.md.

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
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
    KZ_ASSERT_NOT_NULL(src);
    KZ_ASSERT_NOT_NULL(dst);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes dst_bytes, DeviceBytes::Create(*dst));
    // A stream per size, after the buffers it copies between: destroyed (drained) before them.
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_OK(src_bytes.Fill(1000 + size));
    std::vector<uint8_t> source(total), before(total);
    FillPattern(source.data(), total, 1000 + size);
    FillPattern(before.data(), total, 7);
    for (const OffsetPair& o : kOffsetPairs) {
      SCOPED_TRACE(fmt::format("{} bytes, src offset {}, dst offset {}", size, o.src, o.dst));
      KZ_ASSERT_OK(dst_bytes.Fill(7));
      KZ_ASSERT_OK(stream->Copy(At(*dst, o.dst), At(*src, o.src), size));
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
      KZ_ASSERT_OK(dst_bytes.Download());
      const uint8_t* got = dst_bytes.host();
      EXPECT_TRUE(BytesEqual(got + o.dst, source.data() + o.src, size));
      // Nothing outside the destination range was touched.
      EXPECT_TRUE(BytesEqual(got, before.data(), o.dst)) << "bytes before the destination";
      EXPECT_TRUE(BytesEqual(got + o.dst + size, before.data() + o.dst + size, total - o.dst - size))
          << "bytes after the destination";
    }
    EXPECT_TRUE(src_bytes.HasPattern(1000 + size)) << "the source changed";
  }
}

TEST_P(DataConformance, CopyWithinOneBuffer) {
  for (size_t size : kOddSizes) {
    SCOPED_TRACE(fmt::format("{} bytes", size));
    // [guard][src at 5][gap 3][dst][guard]: odd offsets, adjacent but not overlapping.
    const size_t src_off = 5, dst_off = src_off + size + 3, total = dst_off + size + 11;
    auto buffer = MustAllocate(total);
    KZ_ASSERT_NOT_NULL(buffer);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*buffer));
    auto stream = MustCreateStream();  // after the buffer: destroyed (drained) before it
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_OK(bytes.Fill(size));
    std::vector<uint8_t> expect(bytes.host(), bytes.host() + total);
    std::memcpy(expect.data() + dst_off, expect.data() + src_off, size);
    KZ_ASSERT_OK(stream->Copy(At(*buffer, dst_off), At(*buffer, src_off), size));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    EXPECT_TRUE(bytes.Equals(0, expect.data(), total));
  }
  // Adjacent ranges (dst ends where src begins) are not an overlap either.
  auto adjacent = MustAllocate(64);
  KZ_ASSERT_NOT_NULL(adjacent);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*adjacent));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(bytes.Fill(3));
  std::vector<uint8_t> expect(bytes.host(), bytes.host() + 64);
  std::memcpy(expect.data(), expect.data() + 32, 32);
  KZ_ASSERT_OK(stream->Copy(At(*adjacent), At(*adjacent, 32), 32));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(bytes.Equals(0, expect.data(), 64));
}

// ---- Argument checks ----

TEST_P(DeviceConformance, InvalidCopyArgumentsAreRejected) {
  auto buffer = MustAllocate(4096);
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  uint8_t* p = At(*buffer);
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
  KZ_ASSERT_NOT_NULL(buffer);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*buffer));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(bytes.Fill(99));
  auto* v = static_cast<int32_t*>(buffer->data());  // device addresses: never dereferenced here
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
  EXPECT_TRUE(bytes.HasPattern(99)) << "a rejected (or empty) call changed memory";
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
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes in_bytes, DeviceBytes::Create(*inputs));
    for (size_t k = 0; k < kMaxInputs; ++k) FillInputs(in_bytes.host() + k * stride, kMaxCount, type, rng);
    KZ_ASSERT_OK(in_bytes.Upload());
    const std::vector<uint8_t> host(in_bytes.host(), in_bytes.host() + inputs->size());

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
    KZ_ASSERT_NOT_NULL(outputs);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes out_bytes_view, DeviceBytes::Create(*outputs));
    // A stream per type, after the buffers its batch uses: destroyed (drained) before them.
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_OK(out_bytes_view.Fill(5));
    for (const Case& c : cases) {
      std::vector<const void*> srcs;
      for (size_t k = 0; k < c.n; ++k) srcs.push_back(At(*inputs, k * stride));
      KZ_ASSERT_OK(stream->Reduce(At(*outputs, c.out_offset), srcs, c.count, type, c.op))
          << CaseName(type, c.op, c.n, c.count);
    }
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(out_bytes_view.Download());
    for (const Case& c : cases) {
      std::vector<const void*> srcs;
      for (size_t k = 0; k < c.n; ++k) srcs.push_back(host.data() + k * stride);
      EXPECT_TRUE(CheckReduce(out_bytes_view.host() + c.out_offset, srcs, c.count, type, c.op))
          << CaseName(type, c.op, c.n, c.count);
      // The gap after each output is untouched.
      std::vector<uint8_t> gap(8 * esize);
      const size_t gap_at = c.out_offset + c.count * esize;
      for (size_t i = 0; i < gap.size(); ++i) gap[i] = PatternByte(5, gap_at + i);
      EXPECT_TRUE(BytesEqual(out_bytes_view.host() + gap_at, gap.data(), gap.size()))
          << CaseName(type, c.op, c.n, c.count) << " wrote past its output";
    }
    EXPECT_TRUE(in_bytes.Equals(0, host.data(), host.size())) << "a reduce changed its inputs";
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
    KZ_ASSERT_NOT_NULL(inputs);
    KZ_ASSERT_NOT_NULL(outputs);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes in_bytes, DeviceBytes::Create(*inputs));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes out_bytes, DeviceBytes::Create(*outputs));
    // A stream per type, after the buffers its reduces use: destroyed (drained) before them.
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    std::vector<const void*> srcs, host_srcs;  // the inputs on the device, and as the CPU wrote them
    for (size_t k = 0; k < kInputs; ++k) {
      FillInputs(in_bytes.host() + k * bytes, kCount, type, rng);
      srcs.push_back(At(*inputs, k * bytes));
      host_srcs.push_back(in_bytes.host() + k * bytes);
    }
    KZ_ASSERT_OK(in_bytes.Upload());
    for (size_t o = 0; o < AllReduceOps().size(); ++o)
      KZ_ASSERT_OK(stream->Reduce(At(*outputs, o * bytes), srcs, kCount, type, AllReduceOps()[o]));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(out_bytes.Download());
    for (size_t o = 0; o < AllReduceOps().size(); ++o)
      EXPECT_TRUE(CheckReduce(out_bytes.host() + o * bytes, host_srcs, kCount, type, AllReduceOps()[o]))
          << CaseName(type, AllReduceOps()[o], kInputs, kCount);
  }
}

// Floating min / max are IEEE 754-2019's minimum / maximum (runtime/device/host_reduce.h): -0
// orders below +0 and any NaN gives the canonical quiet NaN, so that ranks combining the same
// values in different orders store the same bits. Each element is one pair of special values,
// reduced as (a, b), (b, a) and (b, a, b); 3 x 3 x 13 pairs fill whole vectors and a tail.
TEST_P(DataConformance, MinMaxOfSignedZerosAndNaNsIgnoreTheInputOrder) {
  struct Kind {
    DataType type;
    uint64_t sign, quiet_nan, infinity, one;
  };
  constexpr Kind kKinds[] = {{DataType::kFloat16, 0x8000, 0x7e00, 0x7c00, 0x3c00},
                             {DataType::kBfloat16, 0x8000, 0x7fc0, 0x7f80, 0x3f80},
                             {DataType::kFloat32, 0x80000000u, 0x7fc00000u, 0x7f800000u, 0x3f800000u},
                             {DataType::kFloat64, uint64_t{1} << 63, 0x7ff8000000000000u, 0x7ff0000000000000u,
                              0x3ff0000000000000u}};
  for (const Kind& f : kKinds) {
    SCOPED_TRACE(DataTypeName(f.type));
    const size_t esize = DataTypeSize(f.type);
    // +0, -0, NaNs (a payload, signalling, negative), -1, +infinity; every ordered pair.
    const uint64_t values[] = {0, f.sign, f.quiet_nan | 1, f.infinity | 1, f.quiet_nan | f.sign, f.one | f.sign,
                               f.infinity};
    std::vector<uint64_t> a, b;
    for (uint64_t x : values)
      for (uint64_t y : values) {
        a.push_back(x);
        b.push_back(y);
      }
    const size_t count = a.size();
    // The expected bits, from the rule: NaN if either is; the zeros by sign; else the ordered pick.
    auto expected = [&](ReduceOp op, uint64_t x, uint64_t y) -> uint64_t {
      auto nan = [&](uint64_t v) { return (v & ~f.sign) > f.infinity; };
      if (nan(x) || nan(y)) return f.quiet_nan;
      if ((x & ~f.sign) == 0 && (y & ~f.sign) == 0) return op == ReduceOp::kMax ? (x & y) : (x | y);
      const double dx = x == f.infinity ? 1e300 : (x == (f.one | f.sign) ? -1 : 0);
      const double dy = y == f.infinity ? 1e300 : (y == (f.one | f.sign) ? -1 : 0);
      return (op == ReduceOp::kMax) == (dx < dy) ? y : x;
    };
    auto buffer = MustAllocate(8 * count * esize);  // a, b, then three outputs per op
    KZ_ASSERT_NOT_NULL(buffer);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*buffer));
    auto stream = MustCreateStream();  // after the buffer: destroyed (drained) before it
    KZ_ASSERT_NOT_NULL(stream);
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(view.host() + i * esize, &a[i], esize);
      std::memcpy(view.host() + (count + i) * esize, &b[i], esize);
    }
    KZ_ASSERT_OK(view.Upload());
    const void* da = At(*buffer, 0);
    const void* db = At(*buffer, count * esize);
    const std::vector<std::vector<const void*>> orders = {{da, db}, {db, da}, {db, da, db}};
    const ReduceOp ops[] = {ReduceOp::kMin, ReduceOp::kMax};
    for (size_t o = 0; o < 2; ++o)
      for (size_t k = 0; k < orders.size(); ++k)
        KZ_ASSERT_OK(stream->Reduce(At(*buffer, (2 + 3 * o + k) * count * esize), orders[k], count, f.type, ops[o]));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(view.Download());
    for (size_t o = 0; o < 2; ++o)
      for (size_t k = 0; k < orders.size(); ++k)
        for (size_t i = 0; i < count; ++i) {
          uint64_t got = 0;
          std::memcpy(&got, view.host() + ((2 + 3 * o + k) * count + i) * esize, esize);
          const uint64_t want = expected(ops[o], a[i], b[i]);
          EXPECT_EQ(got, want) << fmt::format("{} of {:#x} and {:#x} ({} inputs, b first: {}): {:#x}, expected {:#x}",
                                              ReduceOpName(ops[o]), a[i], b[i], orders[k].size(), k > 0, got, want);
        }
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
        KZ_ASSERT_NOT_NULL(buffer);
        KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*buffer));
        auto stream = MustCreateStream();  // after the buffer: destroyed (drained) before it
        KZ_ASSERT_NOT_NULL(stream);
        for (size_t k = 0; k < n; ++k) FillInputs(view.host() + k * bytes, kCount, type, rng);
        KZ_ASSERT_OK(view.Upload());
        const std::vector<uint8_t> host(view.host(), view.host() + n * bytes);
        std::vector<const void*> srcs, host_srcs;
        for (size_t k = 0; k < n; ++k) {
          srcs.push_back(At(*buffer, k * bytes));
          host_srcs.push_back(host.data() + k * bytes);
        }
        KZ_ASSERT_OK(stream->Reduce(At(*buffer, inplace_at * bytes), srcs, kCount, type, op));
        KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
        KZ_ASSERT_OK(view.Download());
        EXPECT_TRUE(CheckReduce(view.host() + inplace_at * bytes, host_srcs, kCount, type, op));
      }
    }
  }
  // In place at a large count (the parallel path reads and writes the same memory).
  constexpr size_t kLarge = (size_t{1} << 20) + 3;
  auto big = MustAllocate(3 * kLarge * sizeof(float));
  KZ_ASSERT_NOT_NULL(big);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*big));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  auto* f = reinterpret_cast<float*>(view.host());
  FillInputs(f, 3 * kLarge, DataType::kFloat32, rng);
  KZ_ASSERT_OK(view.Upload());
  const std::vector<float> host(f, f + 3 * kLarge);
  auto* d = static_cast<float*>(big->data());  // device addresses
  const void* srcs[] = {d, d + kLarge, d + 2 * kLarge};
  const void* host_srcs[] = {host.data(), host.data() + kLarge, host.data() + 2 * kLarge};
  KZ_ASSERT_OK(stream->Reduce(d, srcs, kLarge, DataType::kFloat32, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  KZ_ASSERT_OK(view.Download());
  EXPECT_TRUE(CheckReduce(f, host_srcs, kLarge, DataType::kFloat32, ReduceOp::kSum));
}

// ReduceMulti: one pass, several outputs — each output either one of the inputs (the in-place
// fused AllReduce: rank q's slice is input q and output q) or separate memory.
TEST_P(DataConformance, ReduceMultiEveryTypeAndOp) {
  constexpr size_t kCount = 1031;
  Rng rng(23);
  for (DataType type : AllDataTypes()) {
    for (ReduceOp op : AllReduceOps()) {
      for (bool in_place : {false, true}) {
        constexpr size_t n = 4;
        SCOPED_TRACE(CaseName(type, op, n, kCount) + (in_place ? ", outputs are the inputs" : ", separate outputs"));
        const size_t bytes = kCount * DataTypeSize(type);
        auto buffer = MustAllocate(2 * n * bytes);  // n inputs, then n separate outputs
        KZ_ASSERT_NOT_NULL(buffer);
        KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*buffer));
        auto stream = MustCreateStream();
        KZ_ASSERT_NOT_NULL(stream);
        for (size_t k = 0; k < 2 * n; ++k) FillInputs(view.host() + k * bytes, kCount, type, rng);
        KZ_ASSERT_OK(view.Upload());
        const std::vector<uint8_t> host(view.host(), view.host() + n * bytes);
        std::vector<const void*> srcs, host_srcs;
        std::vector<void*> dsts;
        for (size_t k = 0; k < n; ++k) {
          srcs.push_back(At(*buffer, k * bytes));
          host_srcs.push_back(host.data() + k * bytes);
          dsts.push_back(At(*buffer, (in_place ? k : n + k) * bytes));
        }
        KZ_ASSERT_OK(stream->ReduceMulti(dsts, srcs, kCount, type, op));
        KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
        KZ_ASSERT_OK(view.Download());
        for (size_t k = 0; k < n; ++k) {
          SCOPED_TRACE(fmt::format("output {}", k));
          EXPECT_TRUE(CheckReduce(view.host() + (in_place ? k : n + k) * bytes, host_srcs, kCount, type, op));
        }
      }
    }
  }
  // Bad outputs: none, overlapping each other, partially overlapping an input.
  auto buffer = MustAllocate(4096);
  KZ_ASSERT_NOT_NULL(buffer);
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  const void* srcs[] = {At(*buffer, 0)};
  void* none[] = {nullptr};
  KZ_EXPECT_CODE(stream->ReduceMulti(std::span<void* const>(none, 0), srcs, 16, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  void* overlapping[] = {At(*buffer, 1024), At(*buffer, 1024 + 32)};
  KZ_EXPECT_CODE(stream->ReduceMulti(overlapping, srcs, 16, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  void* partial[] = {At(*buffer, 8)};
  KZ_EXPECT_CODE(stream->ReduceMulti(partial, srcs, 16, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

TEST_P(DataConformance, ReduceCountZeroAndRepeatedInputs) {
  constexpr size_t kCount = 333;
  constexpr size_t kBytes = kCount * sizeof(int64_t);
  auto buffer = MustAllocate(3 * kBytes);
  KZ_ASSERT_NOT_NULL(buffer);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*buffer));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  Rng rng(5);
  FillInputs(view.host(), 2 * kCount, DataType::kInt64, rng);
  FillPattern(view.host() + 2 * kBytes, kBytes, 17);
  KZ_ASSERT_OK(view.Upload());
  const std::vector<uint8_t> host(view.host(), view.host() + 2 * kBytes);
  auto* v = static_cast<int64_t*>(buffer->data());  // device addresses
  const void* in[] = {v, v + kCount};
  KZ_ASSERT_OK(stream->Reduce(v + 2 * kCount, in, 0, DataType::kInt64, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(view.HasPattern(2 * kBytes, kBytes, 17)) << "count 0 wrote memory";

  // The same input may appear several times (only the output's overlap is restricted).
  const void* repeated[] = {v, v + kCount, v, v};
  const void* host_repeated[] = {host.data(), host.data() + kBytes, host.data(), host.data()};
  KZ_ASSERT_OK(stream->Reduce(v + 2 * kCount, repeated, kCount, DataType::kInt64, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  KZ_ASSERT_OK(view.Download());
  EXPECT_TRUE(CheckReduce(view.host() + 2 * kBytes, host_repeated, kCount, DataType::kInt64, ReduceOp::kSum));
}

}  // namespace
}  // namespace kizuna::device::conformance
