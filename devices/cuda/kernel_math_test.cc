// kernel_math.h (the CUDA kernels' per-element arithmetic) compiled for the host and compared with
// HostReduce / HostScale bit for bit: every element type x op, 1..8 inputs, values that include
// NaN, infinities, signed zeros, subnormals, rounding ties and integer extremes. Runs on every
// machine; the kernels themselves compile this same code for the device.
#include "devices/cuda/kernel_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::cuda::math {
namespace {

template <typename T>
uint64_t Bits(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

// ---- float16 / bfloat16 conversions against runtime/core/half.h ----

TEST(KernelMathConversion, HalfToFloatMatchesHalfHForEveryHalf) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    ASSERT_EQ(Bits(math::HalfToFloat(static_cast<uint16_t>(h))), Bits(kizuna::HalfToFloat(static_cast<uint16_t>(h))))
        << "half 0x" << std::hex << h;
  }
}

TEST(KernelMathConversion, Bfloat16ToFloatMatchesHalfHForEveryBfloat16) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    ASSERT_EQ(Bits(math::Bfloat16ToFloat(static_cast<uint16_t>(b))),
              Bits(kizuna::Bfloat16ToFloat(static_cast<uint16_t>(b))))
        << "bfloat16 0x" << std::hex << b;
  }
}

// Every float32 bit pattern whose low bits are near a rounding boundary of either format, plus a
// stride through all others: ties, just-below and just-above ties, subnormal results, overflow to
// infinity and NaN payloads all occur.
TEST(KernelMathConversion, FloatToHalfAndBfloat16MatchHalfH) {
  auto check = [](uint32_t x) {
    float f;
    std::memcpy(&f, &x, sizeof f);
    ASSERT_EQ(math::FloatToHalf(f), kizuna::FloatToHalf(f)) << "float 0x" << std::hex << x;
    ASSERT_EQ(math::FloatToBfloat16(f), kizuna::FloatToBfloat16(f)) << "float 0x" << std::hex << x;
  };
  for (uint64_t x = 0; x <= 0xffffffffu; x += 997) check(static_cast<uint32_t>(x));
  for (uint32_t hi = 0; hi < (1u << 19); ++hi) {  // every exponent and top mantissa bits, both signs
    const uint32_t base = hi << 13;
    for (uint32_t low : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) check(base | low);
  }
  for (uint32_t hi = 0; hi < (1u << 16); ++hi) {
    const uint32_t base = hi << 16;
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) check(base | low);
  }
}

// ---- Division by an invariant divisor ----

std::vector<uint32_t> Divisors(std::mt19937_64& rng) {
  std::vector<uint32_t> d = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 24, 25, 31, 32, 33, 100, 127, 128,
                             255, 256, 257, 641, 1000, 6700417, 65535, 65536, 65537, (1u << 24) - 1, 1u << 24,
                             (1u << 24) + 1, 0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu, 0xffffffffu};
  for (int i = 0; i < 200; ++i) {
    const int bits = 1 + static_cast<int>(rng() % 32);
    const uint32_t v = static_cast<uint32_t>(rng()) >> (32 - bits);
    d.push_back(v == 0 ? 1 : v);
  }
  return d;
}

template <typename U>
std::vector<U> Numerators(std::mt19937_64& rng, uint32_t d) {
  constexpr U kMax = std::numeric_limits<U>::max();
  std::vector<U> n = {0, 1, 2, kMax, kMax - 1, kMax / 2, kMax / 2 + 1, static_cast<U>(d), static_cast<U>(d - 1),
                      static_cast<U>(d + 1)};
  // Multiples of d and their neighbours near the top of the range, where the magic number's error
  // would show first.
  const U top = kMax / d * d;
  for (U k = 0; k < 4; ++k) {
    const U m = top - k * d;
    n.push_back(m);
    n.push_back(m - 1);
    if (m != kMax) n.push_back(m + 1);
  }
  for (int i = 0; i < 500; ++i) {
    const int bits = 1 + static_cast<int>(rng() % (8 * sizeof(U)));
    n.push_back(static_cast<U>(rng() >> (64 - bits)));
  }
  return n;
}

TEST(KernelMathDivision, UnsignedDivider32MatchesIntegerDivision) {
  std::mt19937_64 rng(1);
  for (uint32_t d : Divisors(rng)) {
    const UnsignedDivider32 div(d);
    for (uint32_t n : Numerators<uint32_t>(rng, d)) ASSERT_EQ(div(n), n / d) << n << " / " << d;
  }
}

TEST(KernelMathDivision, UnsignedDivider64MatchesIntegerDivision) {
  std::mt19937_64 rng(2);
  for (uint32_t d : Divisors(rng)) {
    const UnsignedDivider64 div(d);
    for (uint64_t n : Numerators<uint64_t>(rng, d)) ASSERT_EQ(div(n), n / d) << n << " / " << d;
  }
}

TEST(KernelMathDivision, ZeroDivisorIsTakenAsOne) {
  EXPECT_EQ(UnsignedDivider32(0)(12345u), 12345u);
  EXPECT_EQ(UnsignedDivider64(0)(~uint64_t{0}), ~uint64_t{0});
  EXPECT_EQ((Finisher<int32_t, Op::kAvg>(0)(static_cast<uint32_t>(-7))), -7);
  EXPECT_EQ((Finisher<float, Op::kAvg>(0)(2.5f)), 2.5f);
}

// ---- Reduce and scale against HostReduce / HostScale ----

template <typename T>
struct TypeInfo;
template <>
struct TypeInfo<F16> { static constexpr DataType kType = DataType::kFloat16; };
template <>
struct TypeInfo<BF16> { static constexpr DataType kType = DataType::kBfloat16; };
template <>
struct TypeInfo<float> { static constexpr DataType kType = DataType::kFloat32; };
template <>
struct TypeInfo<double> { static constexpr DataType kType = DataType::kFloat64; };
template <>
struct TypeInfo<int8_t> { static constexpr DataType kType = DataType::kInt8; };
template <>
struct TypeInfo<uint8_t> { static constexpr DataType kType = DataType::kUint8; };
template <>
struct TypeInfo<int32_t> { static constexpr DataType kType = DataType::kInt32; };
template <>
struct TypeInfo<uint32_t> { static constexpr DataType kType = DataType::kUint32; };
template <>
struct TypeInfo<int64_t> { static constexpr DataType kType = DataType::kInt64; };
template <>
struct TypeInfo<uint64_t> { static constexpr DataType kType = DataType::kUint64; };

template <typename T>
constexpr bool kFloating = !std::is_integral<T>::value;

// Values of every class the semantics distinguish, in proportions that keep sums and products of
// up to 8 inputs mostly finite (so rounding is exercised, not only saturation).
template <typename T>
StorageOf<T> RandomValue(std::mt19937_64& rng) {
  const uint64_t r = rng();
  const int cls = static_cast<int>(r % 16);
  const uint64_t bits = rng();
  if constexpr (std::is_same_v<T, F16> || std::is_same_v<T, BF16>) {
    constexpr bool kHalf = std::is_same_v<T, F16>;
    constexpr uint16_t kInf = kHalf ? 0x7c00 : 0x7f80;
    const uint16_t sign = (bits >> 20) & 1 ? 0x8000 : 0;
    switch (cls) {
      case 0: return static_cast<uint16_t>(sign | kInf | (kHalf ? 1 + bits % 0x3ff : 1 + bits % 0x7f));  // NaN
      case 1: return static_cast<uint16_t>(sign | kInf);
      case 2: return sign;                                                                  // signed zero
      case 3: return static_cast<uint16_t>(sign | (1 + bits % (kHalf ? 0x3ff : 0x7f)));    // subnormal
      case 4: return static_cast<uint16_t>(bits);                                           // anything
      case 5: return kHalf ? static_cast<uint16_t>(sign | 0x7bff) : static_cast<uint16_t>(sign | 0x7f7f);  // max
      default: {
        // Moderate magnitudes: float in [-8, 8), converted with half.h.
        const float f = static_cast<float>(static_cast<int64_t>(bits % (1u << 24)) - (1 << 23)) / (1 << 20);
        return kHalf ? kizuna::FloatToHalf(f) : kizuna::FloatToBfloat16(f);
      }
    }
  } else if constexpr (kFloating<T>) {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    constexpr int kMant = std::numeric_limits<T>::digits - 1;
    const U sign = static_cast<U>((bits >> 62) & 1) << (8 * sizeof(T) - 1);
    const U exp_all = static_cast<U>(~U{0} >> 1) & ~((U{1} << kMant) - 1);
    const U mant = static_cast<U>(bits) & ((U{1} << kMant) - 1);
    U u;
    switch (cls) {
      case 0: u = sign | exp_all | (mant == 0 ? 1 : mant); break;  // NaN (quiet or signalling)
      case 1: u = sign | exp_all; break;                           // infinity
      case 2: u = sign; break;                                     // signed zero
      case 3: u = sign | (mant == 0 ? 1 : mant); break;            // subnormal
      case 4: u = static_cast<U>(bits); break;                     // anything
      case 5: {  // near the largest finite value: sums overflow
        T v = std::numeric_limits<T>::max() * static_cast<T>(0.75 + static_cast<double>(bits % 1000) / 4000);
        std::memcpy(&u, &v, sizeof u);
        u |= sign;
        break;
      }
      case 6: {  // near the smallest normal: sums and products land on subnormals
        T v = std::numeric_limits<T>::min() * static_cast<T>(1 + static_cast<double>(bits % 1000) / 100);
        std::memcpy(&u, &v, sizeof u);
        u |= sign;
        break;
      }
      default: {
        T v = static_cast<T>(static_cast<double>(static_cast<int64_t>(bits % 2000001) - 1000000) / 1024.0);
        std::memcpy(&u, &v, sizeof u);
        break;
      }
    }
    T v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  } else {
    using L = std::numeric_limits<T>;
    switch (cls) {
      case 0: return L::min();
      case 1: return L::max();
      case 2: return 0;
      case 3: return static_cast<T>(-1);
      case 4: return static_cast<T>(L::min() + 1);
      case 5: return static_cast<T>(L::max() - 1);
      case 6:
      case 7: return static_cast<T>(static_cast<int64_t>(bits % 21) - 10);
      default: return static_cast<T>(bits);
    }
  }
}

template <typename T>
bool IsNan(StorageOf<T> v) {
  return std::isnan(static_cast<double>(Traits<T>::Load(v)));
}

// Bit-equal, or (for floating results of arithmetic) both NaN: kernel_math.h, "NaN payloads".
template <typename T>
bool SameResult(StorageOf<T> got, StorageOf<T> want, bool arithmetic) {
  if (Bits(got) == Bits(want)) return true;
  if constexpr (kFloating<T>) return arithmetic && IsNan<T>(got) && IsNan<T>(want);
  return false;
}

template <typename T>
std::string Hex(StorageOf<T> v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llx", static_cast<int>(2 * sizeof v), static_cast<unsigned long long>(Bits(v)));
  return buf;
}

constexpr size_t kCount = 3000;

template <typename T, Op kOp>
void CheckReduceOp(ReduceOp host_op, std::mt19937_64& rng) {
  using S = StorageOf<T>;
  const DataType type = TypeInfo<T>::kType;
  constexpr bool kArithmetic = kOp == Op::kSum || kOp == Op::kProd || kOp == Op::kAvg;
  for (int n = 1; n <= 8; ++n) {
    std::vector<std::vector<S>> inputs(n, std::vector<S>(kCount));
    for (auto& in : inputs)
      for (auto& v : in) v = RandomValue<T>(rng);
    std::vector<const void*> srcs;
    for (auto& in : inputs) srcs.push_back(in.data());
    std::vector<S> want(kCount);
    ASSERT_TRUE(HostReduce(want.data(), srcs, kCount, type, host_op).ok());
    const Finisher<T, kOp> finish(static_cast<uint32_t>(n));
    for (size_t i = 0; i < kCount; ++i) {
      S values[8] = {};
      for (int k = 0; k < n; ++k) values[k] = inputs[k][i];
      const S got = ReduceElement<T, kOp>(values, n, finish);
      if (!SameResult<T>(got, want[i], kArithmetic)) {
        std::string in;
        for (int k = 0; k < n; ++k) in += " " + Hex<T>(values[k]);
        FAIL() << DataTypeName(type) << " " << ReduceOpName(host_op) << " n=" << n << " element " << i << ": got "
               << Hex<T>(got) << ", HostReduce " << Hex<T>(want[i]) << "; inputs" << in;
      }
    }
  }
}

// avg with a divisor other than the launch's input count (a reduce split over several launches:
// the earlier ones sum, the last one divides by the whole count). For every type but float16 /
// bfloat16 that is HostReduce(kSum) then HostScale (host_reduce.h); for those two the sum stays
// float32 until the one rounding, as a float32 reduce of the widened inputs followed by the
// division in float32 and half.h's rounding.
template <typename T>
void CheckSplitAvg(std::mt19937_64& rng) {
  using S = StorageOf<T>;
  const DataType type = TypeInfo<T>::kType;
  for (int n : {1, 3, 5}) {
    for (uint32_t divisor : {1u, 2u, 7u, 8u, 12u, 1000u, 0x80000000u, 0xffffffffu}) {
      std::vector<std::vector<S>> inputs(n, std::vector<S>(kCount));
      for (auto& in : inputs)
        for (auto& v : in) v = RandomValue<T>(rng);
      std::vector<S> want(kCount);
      if constexpr (std::is_same_v<T, F16> || std::is_same_v<T, BF16>) {
        std::vector<std::vector<float>> wide(n, std::vector<float>(kCount));
        std::vector<const void*> srcs;
        for (int k = 0; k < n; ++k) {
          for (size_t i = 0; i < kCount; ++i) wide[k][i] = Traits<T>::Load(inputs[k][i]);
          srcs.push_back(wide[k].data());
        }
        std::vector<float> sum(kCount);
        ASSERT_TRUE(HostReduce(sum.data(), srcs, kCount, DataType::kFloat32, ReduceOp::kSum).ok());
        for (size_t i = 0; i < kCount; ++i) {
          const float q = sum[i] / static_cast<float>(divisor);
          want[i] = std::is_same_v<T, F16> ? kizuna::FloatToHalf(q) : kizuna::FloatToBfloat16(q);
        }
      } else {
        std::vector<const void*> srcs;
        for (auto& in : inputs) srcs.push_back(in.data());
        ASSERT_TRUE(HostReduce(want.data(), srcs, kCount, type, ReduceOp::kSum).ok());
        ASSERT_TRUE(HostScale(want.data(), want.data(), kCount, type, divisor).ok());
      }
      const Finisher<T, Op::kAvg> finish(divisor);
      for (size_t i = 0; i < kCount; ++i) {
        S values[8] = {};
        for (int k = 0; k < n; ++k) values[k] = inputs[k][i];
        const S got = ReduceElement<T, Op::kAvg>(values, n, finish);
        ASSERT_TRUE(SameResult<T>(got, want[i], true))
            << DataTypeName(type) << " avg n=" << n << " divisor " << divisor << " element " << i << ": got "
            << Hex<T>(got) << ", expected " << Hex<T>(want[i]);
      }
    }
  }
}

template <typename T>
void CheckScale(std::mt19937_64& rng) {
  using S = StorageOf<T>;
  const DataType type = TypeInfo<T>::kType;
  std::vector<uint32_t> divisors = Divisors(rng);
  divisors.resize(60);
  for (uint32_t divisor : divisors) {
    std::vector<S> in(kCount), want(kCount);
    for (auto& v : in) v = RandomValue<T>(rng);
    ASSERT_TRUE(HostScale(want.data(), in.data(), kCount, type, divisor).ok());
    const Finisher<T, Op::kAvg> finish(divisor);
    for (size_t i = 0; i < kCount; ++i) {
      const S got = ScaleElement<T>(in[i], finish);
      ASSERT_TRUE(SameResult<T>(got, want[i], true))
          << DataTypeName(type) << " scale by " << divisor << " of " << Hex<T>(in[i]) << ": got " << Hex<T>(got)
          << ", HostScale " << Hex<T>(want[i]);
    }
  }
}

template <typename T>
void CheckType() {
  std::mt19937_64 rng(static_cast<uint64_t>(TypeInfo<T>::kType) * 7919 + 17);
  CheckReduceOp<T, Op::kSum>(ReduceOp::kSum, rng);
  CheckReduceOp<T, Op::kProd>(ReduceOp::kProd, rng);
  CheckReduceOp<T, Op::kMin>(ReduceOp::kMin, rng);
  CheckReduceOp<T, Op::kMax>(ReduceOp::kMax, rng);
  CheckReduceOp<T, Op::kAvg>(ReduceOp::kAvg, rng);
  CheckSplitAvg<T>(rng);
  CheckScale<T>(rng);
}

TEST(KernelMathReduce, Float16) { CheckType<F16>(); }
TEST(KernelMathReduce, Bfloat16) { CheckType<BF16>(); }
TEST(KernelMathReduce, Float32) { CheckType<float>(); }
TEST(KernelMathReduce, Float64) { CheckType<double>(); }
TEST(KernelMathReduce, Int8) { CheckType<int8_t>(); }
TEST(KernelMathReduce, Uint8) { CheckType<uint8_t>(); }
TEST(KernelMathReduce, Int32) { CheckType<int32_t>(); }
TEST(KernelMathReduce, Uint32) { CheckType<uint32_t>(); }
TEST(KernelMathReduce, Int64) { CheckType<int64_t>(); }
TEST(KernelMathReduce, Uint64) { CheckType<uint64_t>(); }

// One element of a reduce, for spelled-out cases.
template <typename T, Op kOp>
StorageOf<T> Reduce(std::initializer_list<StorageOf<T>> values, uint32_t divisor = 0) {
  const Finisher<T, kOp> finish(divisor == 0 ? static_cast<uint32_t>(values.size()) : divisor);
  return ReduceElement<T, kOp>(values.begin(), static_cast<int>(values.size()), finish);
}

// min / max for NaN and signed zeros (kernel_math.h), spelled out: the same bits in either order.
TEST(KernelMathReduce, MinMaxOrderSignedZerosAndCanonicalizeNaNsInEitherOrder) {
  const float nan = BitsToFloat(0xffc00001u);  // negative, with a payload
  for (float other : {1.0f, -0.0f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(FloatBits(Reduce<float, Op::kMin>({nan, other})), 0x7fc00000u);
    EXPECT_EQ(FloatBits(Reduce<float, Op::kMin>({other, nan})), 0x7fc00000u);
    EXPECT_EQ(FloatBits(Reduce<float, Op::kMax>({nan, other})), 0x7fc00000u);
    EXPECT_EQ(FloatBits(Reduce<float, Op::kMax>({other, nan})), 0x7fc00000u);
  }
  EXPECT_EQ(FloatBits(Reduce<float, Op::kMin>({-0.0f, 0.0f})), 0x80000000u);
  EXPECT_EQ(FloatBits(Reduce<float, Op::kMin>({0.0f, -0.0f})), 0x80000000u);
  EXPECT_EQ(FloatBits(Reduce<float, Op::kMax>({-0.0f, 0.0f})), 0u);
  EXPECT_EQ(FloatBits(Reduce<float, Op::kMax>({0.0f, -0.0f})), 0u);
  EXPECT_EQ(FloatBits(Reduce<float, Op::kMax>({-0.0f, -0.0f, 0.0f})), 0u);
  EXPECT_EQ(DoubleBits(Reduce<double, Op::kMax>({-0.0, 0.0})), 0u);
  EXPECT_EQ(DoubleBits(Reduce<double, Op::kMin>({0.0, -0.0})), uint64_t{1} << 63);
  EXPECT_EQ(DoubleBits(Reduce<double, Op::kMin>({2.0, BitsToDouble(0x7ff0000000000001u)})), 0x7ff8000000000000u);
  // float16 / bfloat16: through float32, then the store's canonical NaN.
  EXPECT_EQ((Reduce<F16, Op::kMax>({0x8000, 0x0000})), 0x0000);
  EXPECT_EQ((Reduce<F16, Op::kMin>({0x0000, 0x8000})), 0x8000);
  EXPECT_EQ((Reduce<F16, Op::kMin>({0x3c00, 0xfc01})), 0x7e00);
  EXPECT_EQ((Reduce<BF16, Op::kMax>({0xffc1, 0x3f80})), 0x7fc0);
}

TEST(KernelMathReduce, IntegersCompareAsTheirTypeAndAverageTruncatingTowardZero) {
  // Signed integers compare as signed although they accumulate unsigned.
  EXPECT_EQ((Reduce<int8_t, Op::kMin>({-1, 1})), -1);
  EXPECT_EQ((Reduce<int8_t, Op::kMax>({-1, 1})), 1);
  // avg divides the wrapped sum, as the signed type, truncating toward zero.
  EXPECT_EQ((Reduce<int8_t, Op::kAvg>({-7, 0})), -3);
  EXPECT_EQ((Reduce<int8_t, Op::kAvg>({127, 1})), -64);  // 128 wraps to -128
  EXPECT_EQ((Reduce<uint8_t, Op::kAvg>({255, 3})), 1);   // 258 wraps to 2
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  EXPECT_EQ((Reduce<int64_t, Op::kAvg>({kMin64}, 1)), kMin64);
  EXPECT_EQ((Reduce<int64_t, Op::kAvg>({kMin64}, 3)), kMin64 / 3);
  EXPECT_EQ((Reduce<int64_t, Op::kAvg>({kMin64, -1}, 2)), std::numeric_limits<int64_t>::max() / 2);  // wraps
}

}  // namespace
}  // namespace kizuna::cuda::math
