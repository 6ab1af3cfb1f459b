// Stream::Scale, byte for byte: the argument checks (DeviceConformance: every backend;
// DataConformance: rejected calls change no memory), and scales of every dtype x divisor (in
// place, large counts, sum-then-scale averages) against dtype.h's kAvg division. Device bytes are
// written and read through DeviceBytes (device_conformance.h). What the groups check and need:
// README.md.

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

// ---- Scale: the division that finishes an average ----
//
// Stream::Scale is optional for a backend (Stream::DoScale answers kNotSupported by default, and a
// plugin built against api 1.0 has none): a test whose first Scale call answers kNotSupported
// skips, saying so, and the startup listing names such backends. Argument checks apply to every
// backend (the public wrapper makes them before asking the backend).

// 1 (the identity), small divisors, powers of two (a backend may shift), 2^24 + 1 (not exact in
// float32: converted first, as kAvg converts its count) and the largest.
constexpr uint32_t kScaleDivisors[] = {1, 2, 3, 7, 8, 1000, 16777217, 0xffffffffu};

// dtype.h's kAvg division applied to one element, from host copies: floating types widened to the
// accumulation type (float32 for float16 / bfloat16 / float32), divided by the divisor converted
// to it, rounded once; integers divided as their own signedness, truncating toward zero.
void ExpectedScale(void* out, const void* in, size_t count, DataType type, uint32_t divisor) {
  auto each = [&]<typename T>(auto&& f) {
    const T* s = static_cast<const T*>(in);
    T* d = static_cast<T*>(out);
    for (size_t i = 0; i < count; ++i) d[i] = f(s[i]);
  };
  const float fd = static_cast<float>(divisor);
  switch (type) {
    case DataType::kFloat16:
      return each.operator()<uint16_t>([&](uint16_t x) { return FloatToHalf(HalfToFloat(x) / fd); });
    case DataType::kBfloat16:
      return each.operator()<uint16_t>([&](uint16_t x) { return FloatToBfloat16(Bfloat16ToFloat(x) / fd); });
    case DataType::kFloat32: return each.operator()<float>([&](float x) { return x / fd; });
    case DataType::kFloat64:
      return each.operator()<double>([&](double x) { return x / static_cast<double>(divisor); });
    case DataType::kInt8:
      return each.operator()<int8_t>([&](int8_t x) { return static_cast<int8_t>(x / int64_t{divisor}); });
    case DataType::kUint8:
      return each.operator()<uint8_t>([&](uint8_t x) { return static_cast<uint8_t>(x / uint64_t{divisor}); });
    case DataType::kInt32:
      return each.operator()<int32_t>([&](int32_t x) { return static_cast<int32_t>(x / int64_t{divisor}); });
    case DataType::kUint32:
      return each.operator()<uint32_t>([&](uint32_t x) { return static_cast<uint32_t>(x / uint64_t{divisor}); });
    case DataType::kInt64: return each.operator()<int64_t>([&](int64_t x) { return x / int64_t{divisor}; });
    case DataType::kUint64: return each.operator()<uint64_t>([&](uint64_t x) { return x / uint64_t{divisor}; });
  }
}

// Bit for bit: a scale is one division, so no summation order leaves room for a tolerance.
::testing::AssertionResult CheckScale(const void* out, const void* host_in, size_t count, DataType type,
                                      uint32_t divisor) {
  const size_t esize = DataTypeSize(type);
  std::vector<uint8_t> expected(count * esize);
  ExpectedScale(expected.data(), host_in, count, type, divisor);
  if (std::memcmp(out, expected.data(), expected.size()) == 0) return ::testing::AssertionSuccess();
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < count; ++i)
    if (std::memcmp(static_cast<const uint8_t*>(out) + i * esize, expected.data() + i * esize, esize) != 0 &&
        wrong++ == 0)
      first = i;
  auto bits = [esize](const void* p, size_t i) {
    uint64_t v = 0;
    std::memcpy(&v, static_cast<const uint8_t*>(p) + i * esize, esize);
    return v;
  };
  return ::testing::AssertionFailure() << fmt::format(
             "{} of {} elements wrong; first [{}]: input {:#x} / {} gave {:#x}, expected {:#x}", wrong, count, first,
             bits(host_in, first), divisor, bits(out, first), bits(expected.data(), first));
}

// FillInputs' values (negative integers included: full-range bits), with the edges of each type
// in front: integer minimum / maximum / -1, float16 / bfloat16 subnormals whose halves are ties,
// the largest finite values, and -0.
void FillScaleInputs(void* p, size_t count, DataType type, Rng& rng) {
  FillInputs(p, count, type, rng);
  auto put = [&]<typename T>(std::initializer_list<T> values) {
    size_t i = 0;
    for (T v : values)
      if (i < count) static_cast<T*>(p)[i++] = v;
  };
  using Bits = std::initializer_list<uint16_t>;
  switch (type) {
    case DataType::kFloat16: return put(Bits{0x0001, 0x0003, 0x8003, 0x7bff, 0xfbff, 0x8000});
    case DataType::kBfloat16: return put(Bits{0x0001, 0x0003, 0x8003, 0x7f7f, 0xff7f, 0x8000});
    case DataType::kFloat32: return put({-0.0f, 3.0e38f, -1.0e-40f, 1.0f});
    case DataType::kFloat64: return put({-0.0, 1.0e308, -4.9e-324, 1.0});
    case DataType::kInt8: return put(std::initializer_list<int8_t>{INT8_MIN, INT8_MAX, -1, -7, 7});
    case DataType::kUint8: return put(std::initializer_list<uint8_t>{UINT8_MAX, 0, 1});
    case DataType::kInt32: return put({INT32_MIN, INT32_MAX, -1, -7, 7});
    case DataType::kUint32: return put({UINT32_MAX, 0u, 1u, 0x80000000u});
    case DataType::kInt64: return put(std::initializer_list<int64_t>{INT64_MIN, INT64_MAX, -1, -7, 7});
    case DataType::kUint64: return put(std::initializer_list<uint64_t>{UINT64_MAX, 0, 1, uint64_t{1} << 63});
  }
}

TEST_P(DeviceConformance, InvalidScaleArgumentsAreRejected) {
  constexpr size_t kCount = 64;
  auto buffer = MustAllocate(3 * kCount * sizeof(float));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* f = static_cast<float*>(buffer->data());
  float* in = f;
  float* out = f + kCount;
  KZ_EXPECT_CODE(stream->Scale(out, in, kCount, DataType::kFloat32, 0), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Scale(out, in, 0, DataType::kFloat32, 0), StatusCode::kInvalidArgument)
      << "divisor 0 is refused even with nothing to do";
  KZ_EXPECT_CODE(stream->Scale(nullptr, in, kCount, DataType::kFloat32, 2), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Scale(out, nullptr, kCount, DataType::kFloat32, 2), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Scale(out, in, kCount, static_cast<DataType>(42), 2), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Scale(out, in, SIZE_MAX / 2, DataType::kFloat32, 2), StatusCode::kInvalidArgument);
  // Partial overlap, either way round (only dst == src is in place).
  KZ_EXPECT_CODE(stream->Scale(in + 1, in, kCount, DataType::kFloat32, 2), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Scale(out, out + kCount / 2, kCount, DataType::kFloat32, 2), StatusCode::kInvalidArgument);
  // Count 0 is valid and does nothing (pointers are not even looked at).
  KZ_EXPECT_OK(stream->Scale(out, in, 0, DataType::kFloat32, 3));
  KZ_EXPECT_OK(stream->Scale(nullptr, nullptr, 0, DataType::kInt8, 1));
  // A valid call either enqueues or, on a backend without the operation, says so.
  const Status valid = stream->Scale(in, in, kCount, DataType::kFloat32, 2);
  EXPECT_TRUE(valid.ok() || valid.code() == StatusCode::kNotSupported) << valid.ToString();
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline())) << "a rejected call must not poison the stream";
}

TEST_P(DataConformance, RejectedScaleCallsEnqueueNothing) {
  constexpr size_t kCount = 256;
  auto buffer = MustAllocate(3 * kCount * sizeof(int32_t));
  KZ_ASSERT_NOT_NULL(buffer);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*buffer));
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(bytes.Fill(98));
  auto* v = static_cast<int32_t*>(buffer->data());  // device addresses
  EXPECT_FALSE(stream->Scale(v + kCount, v, kCount, DataType::kInt32, 0).ok());
  EXPECT_FALSE(stream->Scale(v + 3, v, kCount, DataType::kInt32, 2).ok());
  EXPECT_FALSE(stream->Scale(v + kCount, v, kCount, static_cast<DataType>(200), 2).ok());
  KZ_EXPECT_OK(stream->Scale(v + kCount, v, 0, DataType::kInt32, 2));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  auto q = stream->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);
  EXPECT_TRUE(bytes.HasPattern(98)) << "a rejected (or empty) scale changed memory";
}

// One batch per data type: every divisor x counts {1, 3, 1031}, out of place, into one output
// buffer with a guarded gap after each result, then checked bit for bit after one Synchronize.
TEST_P(DataConformance, ScaleEveryTypeAndDivisor) {
  constexpr size_t kCounts[] = {1, 3, 1031};
  constexpr size_t kMaxCount = 1031;
  Rng rng(4242);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t esize = DataTypeSize(type);
    auto input = MustAllocate(kMaxCount * esize);
    KZ_ASSERT_NOT_NULL(input);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes in_bytes, DeviceBytes::Create(*input));
    FillScaleInputs(in_bytes.host(), kMaxCount, type, rng);
    KZ_ASSERT_OK(in_bytes.Upload());
    const std::vector<uint8_t> host(in_bytes.host(), in_bytes.host() + input->size());

    struct Case {
      uint32_t divisor;
      size_t count, out_offset;
    };
    std::vector<Case> cases;
    size_t out_bytes = 0;
    for (uint32_t d : kScaleDivisors)
      for (size_t count : kCounts) {
        cases.push_back({d, count, out_bytes});
        out_bytes += count * esize + 8 * esize;
      }
    auto outputs = MustAllocate(out_bytes);
    KZ_ASSERT_NOT_NULL(outputs);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes out_view, DeviceBytes::Create(*outputs));
    auto stream = MustCreateStream();  // after the buffers: destroyed (drained) before them
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_OK(out_view.Fill(6));
    for (const Case& c : cases) {
      const Status s = stream->Scale(At(*outputs, c.out_offset), At(*input), c.count, type, c.divisor);
      if (s.code() == StatusCode::kNotSupported && &c == &cases.front())
        GTEST_SKIP() << "the backend has no scale operation (optional): " << s.ToString();
      KZ_ASSERT_OK(s) << fmt::format("{} / {}, count {}", DataTypeName(type), c.divisor, c.count);
    }
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(out_view.Download());
    for (const Case& c : cases) {
      EXPECT_TRUE(CheckScale(out_view.host() + c.out_offset, host.data(), c.count, type, c.divisor))
          << fmt::format("{} / {}, count {}", DataTypeName(type), c.divisor, c.count);
      std::vector<uint8_t> gap(8 * esize);
      const size_t gap_at = c.out_offset + c.count * esize;
      for (size_t i = 0; i < gap.size(); ++i) gap[i] = PatternByte(6, gap_at + i);
      EXPECT_TRUE(BytesEqual(out_view.host() + gap_at, gap.data(), gap.size()))
          << fmt::format("{} / {}, count {} wrote past its output", DataTypeName(type), c.divisor, c.count);
    }
    EXPECT_TRUE(in_bytes.Equals(0, host.data(), host.size())) << "a scale changed its input";
  }
}

// In place (dst == src) at a small and at a large count (a backend's multi-threaded path reads and
// writes the same memory), and a large out-of-place scale; divisor 1 leaves the bytes as they are.
TEST_P(DataConformance, ScaleInPlaceAndLargeCount) {
  constexpr size_t kLarge = (size_t{1} << 20) + 3;
  Rng rng(77);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t bytes = kLarge * DataTypeSize(type);
    auto a = MustAllocate(bytes);
    auto b = MustAllocate(bytes);
    KZ_ASSERT_NOT_NULL(a);
    KZ_ASSERT_NOT_NULL(b);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes a_bytes, DeviceBytes::Create(*a));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes b_bytes, DeviceBytes::Create(*b));
    auto stream = MustCreateStream();  // after the buffers: destroyed (drained) before them
    KZ_ASSERT_NOT_NULL(stream);
    FillScaleInputs(a_bytes.host(), kLarge, type, rng);
    KZ_ASSERT_OK(a_bytes.Upload());
    const std::vector<uint8_t> host(a_bytes.host(), a_bytes.host() + bytes);

    const Status first = stream->Scale(At(*b), At(*a), kLarge, type, 3);
    if (first.code() == StatusCode::kNotSupported)
      GTEST_SKIP() << "the backend has no scale operation (optional): " << first.ToString();
    KZ_ASSERT_OK(first);
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(b_bytes.Download());
    EXPECT_TRUE(CheckScale(b_bytes.host(), host.data(), kLarge, type, 3)) << "out of place, large";

    KZ_ASSERT_OK(stream->Scale(At(*a), At(*a), kLarge, type, 8));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(a_bytes.Download());
    EXPECT_TRUE(CheckScale(a_bytes.host(), host.data(), kLarge, type, 8)) << "in place, large";

    constexpr size_t kSmall = 1031;
    const size_t small_bytes = kSmall * DataTypeSize(type);
    std::memcpy(a_bytes.host(), host.data(), bytes);  // the stream is idle: synchronized above
    KZ_ASSERT_OK(a_bytes.Upload());
    const std::vector<uint8_t> b_before = b_bytes.Read();
    KZ_ASSERT_OK(stream->Scale(At(*a), At(*a), kSmall, type, 7));
    KZ_ASSERT_OK(stream->Scale(At(*b), At(*b), kLarge, type, 1));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(a_bytes.Download());
    EXPECT_TRUE(CheckScale(a_bytes.host(), host.data(), kSmall, type, 7)) << "in place, small";
    EXPECT_TRUE(BytesEqual(a_bytes.host() + small_bytes, host.data() + small_bytes, bytes - small_bytes))
        << "an in-place scale wrote past its count";
    ASSERT_EQ(b_before.size(), bytes);
    EXPECT_TRUE(b_bytes.Equals(0, b_before.data(), bytes)) << "divisor 1 changed the data";
  }
}

// An average computed as the engine does it: a sum on the device, then one division by the number
// of inputs, on the same stream. The result must meet the kAvg reference of the inputs (bit for
// bit for integers and float16 / bfloat16, whose sums here are exact; within the summation-order
// bound for float32 / float64).
TEST_P(DataConformance, ScaleOfASumIsTheAverage) {
  constexpr size_t kCount = 1031;
  constexpr size_t kInputCounts[] = {2, 3, 5, 8};
  constexpr size_t kMaxInputs = 8;
  Rng rng(31);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t bytes = kCount * DataTypeSize(type);
    auto inputs = MustAllocate(kMaxInputs * bytes);
    auto sums = MustAllocate(std::size(kInputCounts) * bytes);
    auto averages = MustAllocate(std::size(kInputCounts) * bytes);
    KZ_ASSERT_NOT_NULL(inputs);
    KZ_ASSERT_NOT_NULL(sums);
    KZ_ASSERT_NOT_NULL(averages);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes in_bytes, DeviceBytes::Create(*inputs));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes sum_bytes, DeviceBytes::Create(*sums));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes avg_bytes, DeviceBytes::Create(*averages));
    auto stream = MustCreateStream();  // after the buffers: destroyed (drained) before them
    KZ_ASSERT_NOT_NULL(stream);
    for (size_t k = 0; k < kMaxInputs; ++k) FillInputs(in_bytes.host() + k * bytes, kCount, type, rng);
    KZ_ASSERT_OK(in_bytes.Upload());
    const std::vector<uint8_t> host(in_bytes.host(), in_bytes.host() + inputs->size());
    for (size_t c = 0; c < std::size(kInputCounts); ++c) {
      const size_t n = kInputCounts[c];
      std::vector<const void*> srcs;
      for (size_t k = 0; k < n; ++k) srcs.push_back(At(*inputs, k * bytes));
      uint8_t* sum = At(*sums, c * bytes);
      KZ_ASSERT_OK(stream->Reduce(sum, srcs, kCount, type, ReduceOp::kSum));
      const Status s = stream->Scale(At(*averages, c * bytes), sum, kCount, type, static_cast<uint32_t>(n));
      if (s.code() == StatusCode::kNotSupported)
        GTEST_SKIP() << "the backend has no scale operation (optional): " << s.ToString();
      KZ_ASSERT_OK(s);
      KZ_ASSERT_OK(stream->Scale(sum, sum, kCount, type, static_cast<uint32_t>(n)));  // and in place
    }
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    KZ_ASSERT_OK(sum_bytes.Download());
    KZ_ASSERT_OK(avg_bytes.Download());
    for (size_t c = 0; c < std::size(kInputCounts); ++c) {
      const size_t n = kInputCounts[c];
      std::vector<const void*> host_srcs;
      for (size_t k = 0; k < n; ++k) host_srcs.push_back(host.data() + k * bytes);
      EXPECT_TRUE(CheckReduce(avg_bytes.host() + c * bytes, host_srcs, kCount, type, ReduceOp::kAvg))
          << CaseName(type, ReduceOp::kAvg, n, kCount) << " as sum, then scale";
      EXPECT_TRUE(BytesEqual(sum_bytes.host() + c * bytes, avg_bytes.host() + c * bytes, bytes))
          << CaseName(type, ReduceOp::kAvg, n, kCount) << ": in place and out of place differ";
    }
  }
}

}  // namespace
}  // namespace kizuna::device::conformance
