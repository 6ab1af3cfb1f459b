#include "runtime/device/host_reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "runtime/core/half.h"

namespace kizuna {
namespace {

TEST(HostReduceTest, Float16AccumulatesInFloat32AndRoundsOnce) {
  // 2048 + 1 + 1 in float16 pairwise would be 2048 (each +1 ties to even); in float32 it is 2050.
  std::vector<uint16_t> a = {FloatToHalf(2048.f)}, b = {FloatToHalf(1.f)}, c = {FloatToHalf(1.f)}, out(1);
  const void* srcs[] = {a.data(), b.data(), c.data()};
  ASSERT_TRUE(HostReduce(out.data(), srcs, 1, DataType::kFloat16, ReduceOp::kSum).ok());
  EXPECT_EQ(HalfToFloat(out[0]), 2050.f);
}

TEST(HostReduceTest, IntegersWrapAndAverageTruncates) {
  std::vector<int8_t> a = {127, -128, -7, 5}, b = {1, -1, 0, 0}, out(4);
  const void* srcs[] = {a.data(), b.data()};
  ASSERT_TRUE(HostReduce(out.data(), srcs, 4, DataType::kInt8, ReduceOp::kSum).ok());
  EXPECT_EQ(out, (std::vector<int8_t>{-128, 127, -7, 5}));
  ASSERT_TRUE(HostReduce(out.data(), srcs, 4, DataType::kInt8, ReduceOp::kAvg).ok());
  EXPECT_EQ(out, (std::vector<int8_t>{-64, 63, -3, 2}));  // wrapped sum / 2, toward zero
  std::vector<int32_t> x = {-5, 7}, y = {3, -9}, o(2);
  const void* s2[] = {x.data(), y.data()};
  ASSERT_TRUE(HostReduce(o.data(), s2, 2, DataType::kInt32, ReduceOp::kMin).ok());
  EXPECT_EQ(o, (std::vector<int32_t>{-5, -9}));
  ASSERT_TRUE(HostReduce(o.data(), s2, 2, DataType::kInt32, ReduceOp::kMax).ok());
  EXPECT_EQ(o, (std::vector<int32_t>{3, 7}));
  std::vector<int64_t> big = {INT64_MAX}, two = {2}, p(1);
  const void* s3[] = {big.data(), two.data()};
  ASSERT_TRUE(HostReduce(p.data(), s3, 1, DataType::kInt64, ReduceOp::kProd).ok());
  EXPECT_EQ(p[0], -2);  // wraps modulo 2^64
}

TEST(HostReduceTest, InPlaceAndSingleInput) {
  std::vector<float> a(1000), b(1000);
  std::iota(a.begin(), a.end(), 0.f);
  std::iota(b.begin(), b.end(), 1.f);
  const void* srcs[] = {a.data(), b.data()};
  ASSERT_TRUE(HostReduce(a.data(), srcs, a.size(), DataType::kFloat32, ReduceOp::kSum).ok());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], 2.f * i + 1) << i;
  std::vector<float> out(1000);
  const void* one[] = {b.data()};
  ASSERT_TRUE(HostReduce(out.data(), one, out.size(), DataType::kFloat32, ReduceOp::kAvg).ok());
  EXPECT_EQ(out, b);
}

TEST(HostReduceTest, ParallelPathMatchesSerial) {
  const size_t n = (size_t{1} << 21) + 3;  // big enough for the multi-threaded split, not a block multiple
  std::vector<double> a(n), b(n), c(n), par(n), ser(n);
  for (size_t i = 0; i < n; ++i) a[i] = i * 0.5, b[i] = -double(i % 97), c[i] = 3.0;
  const void* srcs[] = {a.data(), b.data(), c.data()};
  ASSERT_TRUE(HostReduce(par.data(), srcs, n, DataType::kFloat64, ReduceOp::kSum).ok());
  HostReduceRange(ser.data(), srcs, 0, n, DataType::kFloat64, ReduceOp::kSum);
  EXPECT_EQ(par, ser);
  EXPECT_EQ(par[n - 1], (n - 1) * 0.5 - double((n - 1) % 97) + 3.0);
}

// Large work under ScopedSerialHostWork (one thread) gives the same bits as the split path, for
// every entry point it affects; scopes nest and restore.
TEST(HostReduceTest, SerialScopeGivesTheSameResults) {
  const size_t n = (size_t{1} << 21) + 5;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 1013) * 0.25f;
    b[i] = 1.0f / static_cast<float>(1 + i % 7);
  }
  const void* srcs[] = {a.data(), b.data()};
  std::vector<float> par(n), par2(n), par_scaled(n), par_copy(n);
  void* par_dsts[] = {par.data(), par2.data()};
  ASSERT_TRUE(HostReduceMulti(par_dsts, srcs, n, DataType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(HostScale(par_scaled.data(), par.data(), n, DataType::kFloat32, 3).ok());
  HostCopy(par_copy.data(), a.data(), n * sizeof(float));

  std::vector<float> ser(n), ser2(n), ser_scaled(n), ser_copy(n);
  {
    const ScopedSerialHostWork serial;
    {
      const ScopedSerialHostWork not_serial(false);  // an inner scope that does not ask keeps it serial
      void* ser_dsts[] = {ser.data(), ser2.data()};
      ASSERT_TRUE(HostReduceMulti(ser_dsts, srcs, n, DataType::kFloat32, ReduceOp::kSum).ok());
    }
    ASSERT_TRUE(HostScale(ser_scaled.data(), ser.data(), n, DataType::kFloat32, 3).ok());
    HostCopy(ser_copy.data(), a.data(), n * sizeof(float));
  }
  EXPECT_EQ(ser, par);
  EXPECT_EQ(ser2, par2);
  EXPECT_EQ(ser_scaled, par_scaled);
  EXPECT_EQ(ser_copy, a);
  EXPECT_EQ(par_copy, a);
  EXPECT_EQ(par[n - 1], a[n - 1] + b[n - 1]);
}

TEST(HostReduceTest, MultiWritesEveryOutputInPlaceToo) {
  // The fused AllReduce's shape: every rank's buffer is an input and an output (in place), and
  // sizes on both sides of the threaded split.
  for (size_t n : {size_t{5}, size_t{3000}, (size_t{1} << 20) + 7}) {
    std::vector<std::vector<float>> bufs(3, std::vector<float>(n));
    for (size_t r = 0; r < bufs.size(); ++r)
      for (size_t i = 0; i < n; ++i) bufs[r][i] = static_cast<float>((i % 1000) * (r + 1));
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = static_cast<float>((i % 1000) * 6);
    const void* srcs[] = {bufs[0].data(), bufs[1].data(), bufs[2].data()};
    void* dsts[] = {bufs[2].data(), bufs[0].data(), bufs[1].data()};
    ASSERT_TRUE(HostReduceMulti(dsts, srcs, n, DataType::kFloat32, ReduceOp::kSum).ok());
    for (size_t r = 0; r < bufs.size(); ++r) EXPECT_EQ(bufs[r], want) << "output " << r << ", n " << n;
  }
  std::vector<int32_t> a(100, 1), b(100, 2), x(100), y(100);
  const void* srcs[] = {a.data(), b.data()};
  void* outs[] = {x.data(), y.data()};
  ASSERT_TRUE(HostReduceMulti(outs, srcs, 100, DataType::kInt32, ReduceOp::kMax).ok());
  EXPECT_EQ(x, std::vector<int32_t>(100, 2));
  EXPECT_EQ(y, std::vector<int32_t>(100, 2));
  void* overlapping[] = {x.data(), x.data() + 1};
  EXPECT_EQ(HostReduceMulti(overlapping, srcs, 50, DataType::kInt32, ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  void* partial[] = {x.data(), a.data() + 1};
  EXPECT_EQ(HostReduceMulti(partial, srcs, 50, DataType::kInt32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
}

TEST(HostReduceTest, RejectsBadArguments) {
  float a[4] = {}, out[4] = {};
  const void* srcs[] = {a};
  EXPECT_EQ(HostReduce(out, {}, 4, DataType::kFloat32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HostReduce(nullptr, srcs, 4, DataType::kFloat32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HostReduce(out, srcs, 4, static_cast<DataType>(42), ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HostReduce(out, srcs, 4, DataType::kFloat32, static_cast<ReduceOp>(9)).code(),
            StatusCode::kInvalidArgument);
  const void* shifted[] = {a + 1};
  EXPECT_EQ(HostReduce(a, shifted, 3, DataType::kFloat32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HostReduce(out, srcs, 0, DataType::kFloat32, ReduceOp::kSum).ok());
}

// Small deterministic generator (splitmix64), so failures reproduce.
uint64_t NextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- min / max of floating types: IEEE 754-2019 minimum / maximum, whatever the input order ----

const DataType kFloatingTypes[] = {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64};

// Bit patterns of floating elements, held in a uint64_t whatever the element size.
struct FloatBits {
  uint64_t sign, quiet_nan, infinity, one;
};
FloatBits BitsOf(DataType type) {
  switch (type) {
    case DataType::kFloat16: return {0x8000, 0x7e00, 0x7c00, 0x3c00};
    case DataType::kBfloat16: return {0x8000, 0x7fc0, 0x7f80, 0x3f80};
    case DataType::kFloat32: return {0x80000000u, 0x7fc00000u, 0x7f800000u, 0x3f800000u};
    default: return {0x8000000000000000u, 0x7ff8000000000000u, 0x7ff0000000000000u, 0x3ff0000000000000u};
  }
}

double Decode(DataType type, uint64_t bits) {
  switch (type) {
    case DataType::kFloat16: return HalfToFloat(static_cast<uint16_t>(bits));
    case DataType::kBfloat16: return Bfloat16ToFloat(static_cast<uint16_t>(bits));
    case DataType::kFloat32: return std::bit_cast<float>(static_cast<uint32_t>(bits));
    default: return std::bit_cast<double>(bits);
  }
}

// Values that exercise the rules: both zeros, NaNs of both signs, quiet and signalling, with
// payloads, infinities, ordinary numbers and the smallest subnormal.
std::vector<uint64_t> SpecialBits(DataType type) {
  const FloatBits f = BitsOf(type);
  return {0,          f.sign,          f.quiet_nan,          f.quiet_nan | 1, f.quiet_nan | f.sign, f.infinity | 1,
          f.infinity, f.infinity | f.sign, f.one, f.one | f.sign, f.one + 1,       1,                    f.sign | 1};
}

// The IEEE 754-2019 rule, written from its definition: any NaN gives the canonical quiet NaN;
// otherwise the largest (max) or smallest (min) value, -0 counting below +0.
uint64_t ReferenceMinMax(DataType type, ReduceOp op, const std::vector<uint64_t>& inputs) {
  const FloatBits f = BitsOf(type);
  for (uint64_t x : inputs)
    if (std::isnan(Decode(type, x))) return f.quiet_nan;
  uint64_t best = inputs[0];
  for (uint64_t x : inputs) {
    const double v = Decode(type, x), b = Decode(type, best);
    const bool better = op == ReduceOp::kMax ? (v > b || (v == b && std::signbit(b) && !std::signbit(v)))
                                             : (v < b || (v == b && !std::signbit(b) && std::signbit(v)));
    if (better) best = x;
  }
  return best;
}

// Reduces `columns` (input k's elements: columns[k]) with `op`, every element through HostReduce;
// returns the output's elements as bits.
std::vector<uint64_t> ReduceBits(DataType type, ReduceOp op, const std::vector<std::vector<uint64_t>>& columns) {
  const size_t esize = DataTypeSize(type), count = columns[0].size();
  std::vector<std::vector<uint8_t>> in(columns.size(), std::vector<uint8_t>(count * esize));
  std::vector<const void*> srcs;
  for (size_t k = 0; k < columns.size(); ++k) {
    for (size_t i = 0; i < count; ++i) std::memcpy(in[k].data() + i * esize, &columns[k][i], esize);
    srcs.push_back(in[k].data());
  }
  std::vector<uint8_t> out(count * esize);
  EXPECT_TRUE(HostReduce(out.data(), srcs, count, type, op).ok());
  std::vector<uint64_t> bits(count, 0);
  for (size_t i = 0; i < count; ++i) std::memcpy(&bits[i], out.data() + i * esize, esize);
  return bits;
}

TEST(HostReduceMinMaxTest, SignedZerosOrderTheSameWhateverTheInputOrder) {
  for (DataType type : kFloatingTypes) {
    const uint64_t neg0 = BitsOf(type).sign;
    // 37 elements: whole vectors and a scalar tail. Two inputs (the fused loop) and three (the
    // accumulator's passes), the +0 first, last and in the middle.
    for (const std::vector<uint64_t>& in : std::vector<std::vector<uint64_t>>{
             {0, neg0}, {neg0, 0}, {0, neg0, neg0}, {neg0, 0, neg0}, {neg0, neg0, 0}, {neg0, neg0, neg0, neg0, 0}}) {
      std::vector<std::vector<uint64_t>> columns;
      for (uint64_t x : in) columns.emplace_back(37, x);
      SCOPED_TRACE(fmt::format("{}, {} inputs, +0 at {}", DataTypeName(type), in.size(),
                               std::find(in.begin(), in.end(), uint64_t{0}) - in.begin()));
      EXPECT_EQ(ReduceBits(type, ReduceOp::kMax, columns), std::vector<uint64_t>(37, 0));
      EXPECT_EQ(ReduceBits(type, ReduceOp::kMin, columns), std::vector<uint64_t>(37, neg0));
    }
  }
}

TEST(HostReduceMinMaxTest, AnyNaNGivesTheCanonicalQuietNaN) {
  for (DataType type : kFloatingTypes) {
    const FloatBits f = BitsOf(type);
    // A quiet NaN with a payload, a signalling one, a negative one; first or second, against a
    // number, an infinity, a zero or another NaN.
    for (uint64_t nan : {f.quiet_nan | 5, f.infinity | 3, f.quiet_nan | f.sign})
      for (uint64_t other : {f.one, f.infinity, f.infinity | f.sign, uint64_t{0}, f.sign, f.quiet_nan | 1})
        for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
          SCOPED_TRACE(fmt::format("{} {} of {:#x} and {:#x}", DataTypeName(type), ReduceOpName(op), nan, other));
          EXPECT_EQ(ReduceBits(type, op, {std::vector<uint64_t>(37, nan), std::vector<uint64_t>(37, other)}),
                    std::vector<uint64_t>(37, f.quiet_nan));
          EXPECT_EQ(ReduceBits(type, op, {std::vector<uint64_t>(37, other), std::vector<uint64_t>(37, nan)}),
                    std::vector<uint64_t>(37, f.quiet_nan));
          EXPECT_EQ(ReduceBits(type, op,
                               {std::vector<uint64_t>(37, other), std::vector<uint64_t>(37, nan),
                                std::vector<uint64_t>(37, f.one)}),
                    std::vector<uint64_t>(37, f.quiet_nan));
        }
  }
}

TEST(HostReduceMinMaxTest, EveryHalfEncodingAgainstTheRuleInBothOrders) {
  // Every float16 / bfloat16 encoding against each special value, in both orders and as three
  // inputs (the accumulator's passes); random bit patterns for float32 / float64.
  uint64_t state = 99;
  for (DataType type : kFloatingTypes) {
    std::vector<uint64_t> a;
    if (DataTypeSize(type) == 2) {
      for (uint64_t x = 0; x < 65536; ++x) a.push_back(x);
    } else {
      a = SpecialBits(type);
      const uint64_t mask = type == DataType::kFloat32 ? 0xffffffffu : ~uint64_t{0};
      while (a.size() < 20000) a.push_back(NextRandom(state) & mask);
    }
    for (uint64_t b : SpecialBits(type))
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        const std::vector<uint64_t> bs(a.size(), b);
        const std::vector<uint64_t> ab = ReduceBits(type, op, {a, bs});
        const std::vector<uint64_t> ba = ReduceBits(type, op, {bs, a});
        const std::vector<uint64_t> bab = ReduceBits(type, op, {bs, a, bs});
        for (size_t i = 0; i < a.size(); ++i) {
          const uint64_t want = ReferenceMinMax(type, op, {a[i], b});
          ASSERT_EQ(ab[i], want) << DataTypeName(type) << " " << ReduceOpName(op) << std::hex << " of " << a[i]
                                 << " and " << b;
          ASSERT_EQ(ba[i], want) << DataTypeName(type) << " " << ReduceOpName(op) << std::hex << " of " << b
                                 << " and " << a[i];
          ASSERT_EQ(bab[i], want) << DataTypeName(type) << " " << ReduceOpName(op) << std::hex << " of " << b
                                  << ", " << a[i] << " and " << b;
        }
      }
  }
}

TEST(HostReduceMinMaxTest, EveryOrderOfFiveInputsGivesTheSameBits) {
  // What a collective needs: ranks that combine the same contributions in different orders
  // (recursive doubling, trees, partial results) store the same bits.
  uint64_t state = 5;
  for (DataType type : kFloatingTypes) {
    const std::vector<uint64_t> pool = SpecialBits(type);
    std::vector<std::vector<uint64_t>> columns(5, std::vector<uint64_t>(1031));
    for (auto& column : columns)
      for (uint64_t& x : column) {
        // Mostly zeros of either sign and ones, so that ties are common; a NaN now and then.
        const uint64_t r = NextRandom(state) % 16;
        x = r < 12 ? pool[r % 2 == 0 ? 0 : 1] : pool[r % pool.size()];
      }
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<uint64_t> want(1031);
      for (size_t i = 0; i < want.size(); ++i) {
        std::vector<uint64_t> element;
        for (const auto& column : columns) element.push_back(column[i]);
        want[i] = ReferenceMinMax(type, op, element);
      }
      std::vector<int> order = {0, 1, 2, 3, 4};
      do {
        std::vector<std::vector<uint64_t>> permuted;
        for (int k : order) permuted.push_back(columns[static_cast<size_t>(k)]);
        ASSERT_EQ(ReduceBits(type, op, permuted), want)
            << DataTypeName(type) << " " << ReduceOpName(op) << " in order "
            << fmt::format("{}", fmt::join(order, ","));
      } while (std::next_permutation(order.begin(), order.end()));
    }
  }
}

// ---- HostScale ----

// Random elements of `type`: full-range bits for integers, values in [-8, 8] for float32 /
// float64, multiples of 1/4 in [-2, 2] for float16 / bfloat16 (so that sums of up to 8 are exact
// in the type and Scale(sum) can be compared with kAvg bit for bit).
std::vector<uint8_t> RandomElements(DataType type, size_t count, uint64_t& state) {
  const size_t esize = DataTypeSize(type);
  std::vector<uint8_t> out(count * esize);
  for (size_t i = 0; i < count; ++i) {
    const uint64_t r = NextRandom(state);
    switch (type) {
      case DataType::kFloat16:
      case DataType::kBfloat16: {
        const float v = static_cast<float>(static_cast<int>(r % 17) - 8) / 4.0f;
        const uint16_t h = type == DataType::kFloat16 ? FloatToHalf(v) : FloatToBfloat16(v);
        std::memcpy(out.data() + i * 2, &h, 2);
        break;
      }
      case DataType::kFloat32: {
        const float v = static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-53 * 16.0 - 8.0);
        std::memcpy(out.data() + i * 4, &v, 4);
        break;
      }
      case DataType::kFloat64: {
        const double v = static_cast<double>(r >> 11) * 0x1.0p-53 * 16.0 - 8.0;
        std::memcpy(out.data() + i * 8, &v, 8);
        break;
      }
      default:
        std::memcpy(out.data() + i * esize, &r, esize);  // little-endian: the low bytes
        break;
    }
  }
  return out;
}

// The kAvg definition (dtype.h) applied to one element, written out independently of the kernels.
template <typename T>
T ScaleReference(T x, uint32_t divisor) {
  if constexpr (std::is_floating_point_v<T>) return x / static_cast<T>(divisor);
  else if constexpr (std::is_signed_v<T>) return static_cast<T>(static_cast<int64_t>(x) / int64_t{divisor});
  else return static_cast<T>(static_cast<uint64_t>(x) / uint64_t{divisor});
}

template <typename T>
void ExpectIntegerScale(const std::vector<T>& in, const std::vector<uint32_t>& divisors, DataType type) {
  std::vector<T> out(in.size());
  for (uint32_t d : divisors) {
    ASSERT_TRUE(HostScale(out.data(), in.data(), in.size(), type, d).ok());
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i], ScaleReference(in[i], d)) << DataTypeName(type) << " " << +in[i] << " / " << d;
  }
}

TEST(HostScaleTest, ScaledSumEqualsAverageForEveryType) {
  // The property the collective engine relies on: sum over all ranks, then divide once.
  constexpr size_t kCount = 1031;  // a partial vector at the end
  uint64_t state = 42;
  for (DataType type : AllDataTypes()) {
    for (size_t n : {1, 2, 3, 5, 8}) {
      SCOPED_TRACE(fmt::format("{}, {} inputs", DataTypeName(type), n));
      std::vector<std::vector<uint8_t>> inputs;
      std::vector<const void*> srcs;
      for (size_t k = 0; k < n; ++k) inputs.push_back(RandomElements(type, kCount, state));
      for (const auto& in : inputs) srcs.push_back(in.data());
      const size_t bytes = kCount * DataTypeSize(type);
      std::vector<uint8_t> sum(bytes), avg(bytes), scaled(bytes);
      ASSERT_TRUE(HostReduce(sum.data(), srcs, kCount, type, ReduceOp::kSum).ok());
      ASSERT_TRUE(HostReduce(avg.data(), srcs, kCount, type, ReduceOp::kAvg).ok());
      ASSERT_TRUE(HostScale(scaled.data(), sum.data(), kCount, type, static_cast<uint32_t>(n)).ok());
      EXPECT_EQ(scaled, avg);
      // In place gives the same bits.
      ASSERT_TRUE(HostScale(sum.data(), sum.data(), kCount, type, static_cast<uint32_t>(n)).ok());
      EXPECT_EQ(sum, avg);
    }
  }
}

TEST(HostScaleTest, SignedIntegersTruncateTowardZero) {
  std::vector<int8_t> i8;
  for (int v = -128; v <= 127; ++v) i8.push_back(static_cast<int8_t>(v));
  std::vector<uint8_t> u8;
  for (int v = 0; v <= 255; ++v) u8.push_back(static_cast<uint8_t>(v));
  std::vector<uint32_t> small;
  for (uint32_t d = 1; d <= 300; ++d) small.push_back(d);
  small.insert(small.end(), {65536u, 16777217u, 0x7fffffffu, 0x80000000u, 0xffffffffu});
  ASSERT_NO_FATAL_FAILURE(ExpectIntegerScale(i8, small, DataType::kInt8));  // every int8 value
  ASSERT_NO_FATAL_FAILURE(ExpectIntegerScale(u8, small, DataType::kUint8));

  // Spot values first: the sign of the quotient, and no rounding toward minus infinity.
  std::vector<int32_t> a = {-7, 7, -1, -128, INT32_MIN, INT32_MAX, -6, 0}, out(a.size());
  ASSERT_TRUE(HostScale(out.data(), a.data(), a.size(), DataType::kInt32, 2).ok());
  EXPECT_EQ(out, (std::vector<int32_t>{-3, 3, 0, -64, INT32_MIN / 2, INT32_MAX / 2, -3, 0}));
  std::vector<int64_t> b = {-7, -9, INT64_MIN, INT64_MAX, -1, 9}, o64(b.size());
  ASSERT_TRUE(HostScale(o64.data(), b.data(), b.size(), DataType::kInt64, 4).ok());  // the shift path
  EXPECT_EQ(o64, (std::vector<int64_t>{-1, -2, INT64_MIN / 4, INT64_MAX / 4, 0, 2}));
  ASSERT_TRUE(HostScale(o64.data(), b.data(), b.size(), DataType::kInt64, 3).ok());  // the division path
  EXPECT_EQ(o64, (std::vector<int64_t>{-2, -3, INT64_MIN / 3, INT64_MAX / 3, 0, 3}));

  // Random full-range values (the 32-bit types divide in double; this checks it stays exact)
  // against divisors that include powers of two (the 64-bit shift path) and ones past 2^24.
  uint64_t state = 7;
  std::vector<uint32_t> divisors = {1, 2, 3, 4, 7, 8, 10, 1024, 1000003, 16777216, 16777217, 0x7fffffffu,
                                    0x80000000u, 0xfffffffeu, 0xffffffffu};
  for (int k = 0; k < 16; ++k) divisors.push_back(static_cast<uint32_t>(NextRandom(state)) | 1u);
  for (int k = 0; k < 16; ++k) divisors.push_back(static_cast<uint32_t>(NextRandom(state) >> 40) + 1);
  std::vector<int32_t> i32 = {INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX};
  std::vector<uint32_t> u32 = {0, 1, 2, 0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu, 0xffffffffu};
  std::vector<int64_t> i64 = {INT64_MIN, INT64_MIN + 1, -1, 0, 1, INT64_MAX};
  std::vector<uint64_t> u64 = {0, 1, UINT64_MAX - 1, UINT64_MAX, uint64_t{1} << 63};
  for (int k = 0; k < 4000; ++k) {
    const uint64_t r = NextRandom(state);
    i32.push_back(static_cast<int32_t>(static_cast<uint32_t>(r)));
    u32.push_back(static_cast<uint32_t>(r >> 32));
    i64.push_back(static_cast<int64_t>(r));
    u64.push_back(NextRandom(state));
  }
  // Quotients just below an integer are where an inexact division would round up: x = q*d - 1.
  for (uint32_t d : {3u, 7u, 1000003u, 0xfffffffbu}) {
    for (uint64_t q : {uint64_t{1}, uint64_t{2}, uint64_t{1} << 20, uint64_t{0xffffffffu} / d}) {
      if (q * d - 1 <= 0xffffffffu) u32.push_back(static_cast<uint32_t>(q * d - 1));
      if (q * d - 1 <= 0x7fffffffu) {
        i32.push_back(static_cast<int32_t>(q * d - 1));
        i32.push_back(-static_cast<int32_t>(q * d - 1));
      }
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectIntegerScale(i32, divisors, DataType::kInt32));
  ASSERT_NO_FATAL_FAILURE(ExpectIntegerScale(u32, divisors, DataType::kUint32));
  ASSERT_NO_FATAL_FAILURE(ExpectIntegerScale(i64, divisors, DataType::kInt64));
  ASSERT_NO_FATAL_FAILURE(ExpectIntegerScale(u64, divisors, DataType::kUint64));
}

TEST(HostScaleTest, HalfTypesDivideInFloat32AndRoundOnce) {
  // float16: 1/3 = 0x3555 (rounded down), 5/3 = 0x3eab (rounded up), 3 * 2^-24 / 2 = 1.5 * 2^-24
  // is a tie between subnormals 1 and 2 (to even: 2), 2^-24 / 2 a tie between 0 and 1 (to 0);
  // -1/3 keeps its sign; 6/3 is exact.
  std::vector<uint16_t> h = {0x3c00, 0x4500, 0x0003, 0x0001, 0xbc00, 0x4600}, ho(h.size());
  ASSERT_TRUE(HostScale(ho.data(), h.data(), 4, DataType::kFloat16, 3).ok());
  EXPECT_EQ(ho[0], 0x3555);
  EXPECT_EQ(ho[1], 0x3eab);
  ASSERT_TRUE(HostScale(ho.data() + 2, h.data() + 2, 2, DataType::kFloat16, 2).ok());
  EXPECT_EQ(ho[2], 0x0002);
  EXPECT_EQ(ho[3], 0x0000);
  ASSERT_TRUE(HostScale(ho.data() + 4, h.data() + 4, 2, DataType::kFloat16, 3).ok());
  EXPECT_EQ(ho[4], 0xb555);
  EXPECT_EQ(ho[5], 0x4000);
  // bfloat16: 1/3 = float32 0x3eaaaaab, rounded up to 0x3eab; the smallest subnormals halve to
  // ties as above (float32 holds 2^-134 exactly, so the one rounding happens on the store).
  std::vector<uint16_t> b = {0x3f80, 0x0003, 0x0001, 0xc040}, bo(b.size());
  ASSERT_TRUE(HostScale(bo.data(), b.data(), 1, DataType::kBfloat16, 3).ok());
  EXPECT_EQ(bo[0], 0x3eab);
  ASSERT_TRUE(HostScale(bo.data() + 1, b.data() + 1, 3, DataType::kBfloat16, 2).ok());
  EXPECT_EQ(bo[1], 0x0002);
  EXPECT_EQ(bo[2], 0x0000);
  EXPECT_EQ(bo[3], 0xbfc0);  // -3 / 2 = -1.5

  // Every float16 and bfloat16 encoding, against the definition: widen, divide in float32, round.
  std::vector<uint16_t> all(65536), out(65536);
  std::iota(all.begin(), all.end(), uint16_t{0});
  for (uint32_t d : {1u, 2u, 3u, 7u, 8u, 10u, 1000u, 1024u, 0x80000000u, 0xffffffffu}) {
    ASSERT_TRUE(HostScale(out.data(), all.data(), all.size(), DataType::kFloat16, d).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      const uint16_t e = FloatToHalf(HalfToFloat(all[i]) / static_cast<float>(d));
      ASSERT_TRUE(out[i] == e || (std::isnan(HalfToFloat(e)) && std::isnan(HalfToFloat(out[i]))))
          << std::hex << "float16 " << all[i] << " / " << std::dec << d << ": " << std::hex << out[i] << " != " << e;
    }
    ASSERT_TRUE(HostScale(out.data(), all.data(), all.size(), DataType::kBfloat16, d).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      const uint16_t e = FloatToBfloat16(Bfloat16ToFloat(all[i]) / static_cast<float>(d));
      ASSERT_TRUE(out[i] == e || (std::isnan(Bfloat16ToFloat(e)) && std::isnan(Bfloat16ToFloat(out[i]))))
          << std::hex << "bfloat16 " << all[i] << " / " << std::dec << d << ": " << std::hex << out[i] << " != " << e;
    }
  }
}

TEST(HostScaleTest, FloatTypesDivideOnceInTheirOwnPrecision) {
  std::vector<float> f = {1.0f, -1.0f, 16777216.0f, 0.0f, -0.0f, 3.0f}, fo(f.size());
  ASSERT_TRUE(HostScale(fo.data(), f.data(), f.size(), DataType::kFloat32, 3).ok());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(fo[i], f[i] / 3.0f) << f[i];
  EXPECT_TRUE(std::signbit(fo[4])) << "-0 / 3 is -0";
  // The divisor is converted to float32 first, as kAvg converts its count: 2^24 + 1 becomes 2^24.
  ASSERT_TRUE(HostScale(fo.data(), f.data() + 2, 1, DataType::kFloat32, 16777217).ok());
  EXPECT_EQ(fo[0], 1.0f);
  std::vector<double> g = {1.0, -2.5, 1e300, -0.0}, go(g.size());
  ASSERT_TRUE(HostScale(go.data(), g.data(), g.size(), DataType::kFloat64, 3).ok());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(go[i], g[i] / 3.0) << g[i];
  ASSERT_TRUE(HostScale(go.data(), g.data(), 1, DataType::kFloat64, 16777217).ok());
  EXPECT_EQ(go[0], 1.0 / 16777217.0) << "float64 holds every uint32 divisor exactly";
  // Infinity and NaN pass through as IEEE division says.
  std::vector<float> special = {INFINITY, -INFINITY, NAN}, so(3);
  ASSERT_TRUE(HostScale(so.data(), special.data(), 3, DataType::kFloat32, 5).ok());
  EXPECT_EQ(so[0], INFINITY);
  EXPECT_EQ(so[1], -INFINITY);
  EXPECT_TRUE(std::isnan(so[2]));
}

TEST(HostScaleTest, InPlaceAndParallelPathMatchSerial) {
  const size_t n = (size_t{1} << 20) + 5;  // past the multi-threaded threshold for every type
  uint64_t state = 3;
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const std::vector<uint8_t> in = RandomElements(type, n, state);
    std::vector<uint8_t> serial(in.size()), parallel(in.size()), in_place = in;
    for (uint32_t d : {1u, 6u, 8u}) {
      HostScaleRange(serial.data(), in.data(), 0, n, type, d);
      ASSERT_TRUE(HostScale(parallel.data(), in.data(), n, type, d).ok());
      EXPECT_EQ(parallel, serial) << "divisor " << d;
      in_place = in;
      ASSERT_TRUE(HostScale(in_place.data(), in_place.data(), n, type, d).ok());
      EXPECT_EQ(in_place, serial) << "divisor " << d << ", in place";
    }
    // Divisor 1 is the identity (these inputs hold no signalling NaNs).
    HostScaleRange(serial.data(), in.data(), 0, n, type, 1);
    EXPECT_EQ(serial, in);
  }
}

TEST(HostScaleTest, RejectsBadArguments) {
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {};
  auto code = [](Status s) { return s.code(); };
  EXPECT_EQ(code(HostScale(out, a, 8, DataType::kFloat32, 0)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(HostScale(out, a, 0, DataType::kFloat32, 0)), StatusCode::kInvalidArgument)
      << "divisor 0 is refused even with nothing to do";
  EXPECT_EQ(code(HostScale(nullptr, a, 8, DataType::kFloat32, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(HostScale(out, nullptr, 8, DataType::kFloat32, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(HostScale(out, a, 8, static_cast<DataType>(42), 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(HostScale(a + 1, a, 4, DataType::kFloat32, 2)), StatusCode::kInvalidArgument);  // partial overlap
  EXPECT_EQ(code(HostScale(a, a + 3, 4, DataType::kFloat32, 2)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(HostScale(out, a, SIZE_MAX / 2, DataType::kFloat32, 2)), StatusCode::kInvalidArgument);
  const Status zero = HostScale(out, a, 8, DataType::kFloat32, 0);
  EXPECT_NE(zero.message().find("divisor"), std::string::npos) << zero.ToString();
  // Nothing was written by any refused call; count 0 is valid and touches nothing.
  for (float v : out) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(HostScale(nullptr, nullptr, 0, DataType::kFloat32, 2).ok());
  EXPECT_TRUE(HostScale(a + 4, a, 4, DataType::kFloat32, 2).ok());  // adjacent is not overlapping
  EXPECT_EQ(a[4], 0.5f);
  EXPECT_EQ(a[7], 2.0f);
}

TEST(HostCopyTest, LargeAndOverlapping) {
  std::vector<uint8_t> src(3 << 20), dst(3 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  HostCopy(dst.data(), src.data(), src.size());
  EXPECT_EQ(src, dst);
  HostCopy(dst.data() + 1, dst.data(), dst.size() - 1);  // overlapping: memmove semantics
  EXPECT_EQ(dst[1], src[0]);
  EXPECT_EQ(dst.back(), src[src.size() - 2]);
}

// Copies of 4 MiB and more use non-temporal stores: every byte lands, whatever the alignment of
// either end and whatever the length's remainder (head, 64-byte body, 16-byte and byte tails).
TEST(HostCopyTest, StreamedCopiesAtEveryAlignment) {
  const size_t n = (size_t{5} << 20) + 77;
  std::vector<uint8_t> src(n + 64), dst(n + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 13 + 5);
  for (size_t dst_off : {0, 1, 15, 33}) {
    for (size_t src_off : {0, 7}) {
      std::fill(dst.begin(), dst.end(), uint8_t{0});
      const size_t len = n - dst_off - src_off;
      HostCopy(dst.data() + dst_off, src.data() + src_off, len);
      ASSERT_TRUE(std::equal(dst.begin() + dst_off, dst.begin() + dst_off + len, src.begin() + src_off))
          << "dst offset " << dst_off << ", src offset " << src_off;
      EXPECT_EQ(dst[dst_off + len], 0) << "wrote past the end";
      if (dst_off > 0) {
        EXPECT_EQ(dst[dst_off - 1], 0) << "wrote before the start";
      }
    }
  }
}

// Broadcast's kernel: one source into every output, small (cached stores) and large (streamed,
// threaded), at odd offsets and lengths; the bytes around each output stay untouched.
TEST(HostCopyTest, MultiCopiesIntoEveryOutput) {
  for (size_t n : {size_t{1}, size_t{100}, (size_t{3} << 20) + 9}) {
    std::vector<uint8_t> src(n + 3);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 11 + 3);
    std::vector<std::vector<uint8_t>> outs(3, std::vector<uint8_t>(n + 2, 0xee));
    void* dsts[] = {outs[0].data() + 1, outs[1].data() + 1, outs[2].data() + 1};
    HostCopyMulti(dsts, src.data() + 3, n);
    for (size_t k = 0; k < outs.size(); ++k) {
      EXPECT_TRUE(std::equal(outs[k].begin() + 1, outs[k].begin() + 1 + n, src.begin() + 3))
          << "output " << k << ", n " << n;
      EXPECT_EQ(outs[k].front(), 0xee);
      EXPECT_EQ(outs[k].back(), 0xee);
    }
    std::vector<uint8_t> serial(n + 2, 0xee);
    void* one[] = {serial.data() + 1};
    const ScopedSerialHostWork scope;
    HostCopyMulti(one, src.data() + 3, n);
    EXPECT_EQ(serial, outs[0]);
  }
}

// Two outputs of a large copy are written line by line from one read of the source when they are
// aligned alike, block by block when not: every byte either way, nothing around them.
TEST(HostCopyTest, PairCopiesAtEveryAlignment) {
  for (size_t n : {size_t{2} << 20, (size_t{2} << 20) + 17, (size_t{3} << 20) + 63}) {
    std::vector<uint8_t> src(n + 1);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
    for (auto [a0, a1] : {std::pair<size_t, size_t>{0, 0}, {5, 5}, {3, 7}}) {
      std::vector<uint8_t> out0(n + 32, 0xee), out1(n + 32, 0xee);
      void* dsts[] = {out0.data() + 16 + a0, out1.data() + 16 + a1};
      HostCopyMulti(dsts, src.data() + 1, n);
      for (auto [out, a] : {std::pair{&out0, a0}, {&out1, a1}}) {
        EXPECT_TRUE(std::equal(out->begin() + 16 + a, out->begin() + 16 + a + n, src.begin() + 1))
            << "n " << n << ", alignments " << a0 << " / " << a1;
        EXPECT_TRUE(std::all_of(out->begin(), out->begin() + 16 + a, [](uint8_t v) { return v == 0xee; }));
        EXPECT_TRUE(std::all_of(out->begin() + 16 + a + n, out->end(), [](uint8_t v) { return v == 0xee; }));
      }
    }
  }
}

// A large reduction of two inputs into one output streams through an L1 scratch: the same bits
// as the plain kernel, in place and out of place, at a length that is not a block multiple.
TEST(HostReduceTest, StreamedReduceMatchesThePlainKernel) {
  const size_t n = (size_t{3} << 20) + 11;  // 6 MiB of bfloat16: above the streaming threshold
  std::vector<uint16_t> a(n), b(n), want(n), got(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = FloatToBfloat16(static_cast<float>(i % 251) * 0.5f);
    b[i] = FloatToBfloat16(static_cast<float>(i % 17) - 8.0f);
  }
  const void* srcs[] = {a.data(), b.data()};
  HostReduceRange(want.data(), srcs, 0, n, DataType::kBfloat16, ReduceOp::kSum);
  ASSERT_TRUE(HostReduce(got.data(), srcs, n, DataType::kBfloat16, ReduceOp::kSum).ok());
  EXPECT_EQ(got, want);
  ASSERT_TRUE(HostReduce(a.data(), srcs, n, DataType::kBfloat16, ReduceOp::kSum).ok());  // in place
  EXPECT_EQ(a, want);
}

}  // namespace
}  // namespace kizuna
