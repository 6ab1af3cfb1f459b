// The per-element arithmetic of the CUDA reduce and scale kernels (kernels.cu): load and widen,
// combine, finish (the avg division) and round on the store. Plain C++17 that nvcc compiles for the
// device and g++ compiles for the host, so kernel_math_test.cc checks it against HostReduce /
// HostScale on any machine, GPU or not.
//
// The contract is runtime/device/host_reduce.h's, bit for bit:
//  - float16 / bfloat16 widen to float32 (runtime/core/half.h's conversions, reproduced here without
//    the CUDA half headers so the host compiles the same code), accumulate in float32 in input
//    order and round once on the store, to nearest even. float32 accumulates in float32, float64
//    in float64. Nothing here depends on FMA contraction, flush-to-zero or approximate division:
//    kernels.cu is built with -fmad=false -ftz=false -prec-div=true.
//  - Integers accumulate in the unsigned type of the same width (wrapping, never UB); min / max
//    compare as the storage type (signed types as signed).
//  - Floating min / max are IEEE 754-2019's minimum / maximum, as host_reduce.h defines them for
//    every backend: -0 orders below +0 and any NaN operand gives the canonical quiet NaN, so the
//    result does not depend on the order of the inputs (OrderedMinMax). No fmin / fmax: they
//    return the other operand of a NaN, and either zero of a pair of zeros.
//  - avg: the sum in the accumulation type divided by the divisor converted to it (float32 for
//    float16 / bfloat16 / float32, float64 for float64); integers divide the wrapped sum, taken as
//    the storage type, truncating toward zero (signed as signed: -7 / 2 = -3).
//  - Scale (the second half of a split avg) is avg's finish applied to one input.
//
// NaN payloads: the bits of a NaN that arithmetic (sum, prod, avg, scale) produces are not part of
// the contract. The GPU returns the canonical NaN (0x7fffffff) where x86 propagates an operand's
// payload, and which operand's depends on the host compiler's instruction choice; every backend's
// tests compare such results as "both NaN". min / max of two or more inputs give the canonical
// quiet NaN (float16 0x7e00, bfloat16 0x7fc0, float32 0x7fc00000, float64 0x7ff8000000000000)
// everywhere. A NaN that passes through unchanged (a one-input reduce) keeps its bits exactly,
// quieted by the float16 / bfloat16 store as half.h does.
#pragma once

#include <stdint.h>
#include <string.h>

#include <type_traits>

#if defined(__CUDACC__)
#define KZ_HD __host__ __device__ __forceinline__
#else
#define KZ_HD inline
#endif

namespace kizuna::cuda::math {

// The reduce operators, in kernel_abi.h's naming order. kizuna::ReduceOp (runtime/core/dtype.h) is not
// used because that header needs C++20, and this one is compiled by nvcc as C++17.
enum class Op { kSum, kProd, kMin, kMax, kAvg };

// Element-type tags for the two 16-bit floating types; their storage is uint16_t.
struct F16 {};
struct BF16 {};

// ---- Bit casts and integer helpers that exist on both sides ----

KZ_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

KZ_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

KZ_HD uint64_t DoubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
#endif
}

KZ_HD double BitsToDouble(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
#endif
}

// x >= 1.
KZ_HD int CountLeadingZeros32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(x));
#else
  return __builtin_clz(x);
#endif
}

KZ_HD uint32_t MulHi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

KZ_HD uint64_t MulHi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  __extension__ using U128 = unsigned __int128;
  return static_cast<uint64_t>((static_cast<U128>(a) * b) >> 64);
#endif
}

// ---- float16 / bfloat16 ----

// runtime/core/half.h's algorithms, operation for operation: what the host computes, and the reference
// for the device's hardware conversions below.
namespace portable {

KZ_HD float HalfToFloat(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;  // half's exponent field, in float position
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa in place
  const uint32_t exp = bits & kShiftedExp;
  bits += (127u - 15u) << 23;  // rebias the exponent
  // Inf / NaN: push the exponent the rest of the way to 255 (the payload stays).
  const uint32_t inf_nan = bits + ((128u - 16u) << 23);
  // Subnormal (or zero): mant * 2^-24 as (2^-14 + mant * 2^-24) - 2^-14, exact in float32 (the
  // difference is a normal float, so flush-to-zero could not touch it either).
  const float sub = BitsToFloat(bits + (1u << 23)) - BitsToFloat(113u << 23);
  const uint32_t subnormal = FloatBits(sub);
  bits = exp == kShiftedExp ? inf_nan : (exp == 0 ? subnormal : bits);
  return BitsToFloat(bits | sign);
}

KZ_HD uint16_t FloatToHalf(float f) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;                      // 65536.0f
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5f
  const uint32_t x = FloatBits(f);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t a = x ^ sign;
  // At or above 65536: infinity, or a quiet NaN keeping the payload's top bits.
  const uint32_t big = a > kF32Inf ? (0x7e00u | ((a >> 13) & 0x1ffu)) : 0x7c00u;
  // Subnormal result: adding 0.5 aligns the mantissa so the FPU's round-to-nearest-even rounds at
  // the 2^-24 position (an exact-or-correctly-rounded float add; the sum is normal, so no FTZ).
  const uint32_t small = FloatBits(BitsToFloat(a) + BitsToFloat(kDenormMagic)) - kDenormMagic;
  // Normal: rebias, round the 13 dropped bits to nearest even (a carry may step into the next
  // exponent, or into infinity, which is right).
  const uint32_t odd = (a >> 13) & 1u;
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  const uint32_t h = a >= kF16Overflow ? big : (a < (113u << 23) ? small : normal);
  return static_cast<uint16_t>(h | (sign >> 16));
}

KZ_HD float Bfloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

KZ_HD uint16_t FloatToBfloat16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t nan = (x >> 16) | 0x0040u;                          // quiet NaN, payload kept
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest even; may carry to inf
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace portable

// The device converts float16 with the hardware's cvt (one instruction each way instead of about
// a dozen: the float16 kernels are otherwise bound by these conversions, not by memory). cvt is
// exact from half to float and rounds to nearest even from float to half, with subnormals and
// overflow to infinity as IEEE says, so it equals half.h for every non-NaN value; NaNs are
// rebuilt as half.h builds them (cvt would return the canonical NaN), payload and sign kept.
// Checked against the portable versions for every half and every float on an H100.
KZ_HD float HalfToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  const uint32_t nan =
      (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7f800000u | (static_cast<uint32_t>(h & 0x3ffu) << 13);
  return (h & 0x7fffu) > 0x7c00u ? BitsToFloat(nan) : f;
#else
  return portable::HalfToFloat(h);
#endif
}

KZ_HD uint16_t FloatToHalf(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  const uint32_t x = FloatBits(f);
  const uint32_t nan = ((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x1ffu);
  return (x & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>(nan) : h;
#else
  return portable::FloatToHalf(f);
#endif
}

// bfloat16 widens with a shift, and rounds in a few integer operations: no need for the hardware.
KZ_HD float Bfloat16ToFloat(uint16_t b) { return portable::Bfloat16ToFloat(b); }
KZ_HD uint16_t FloatToBfloat16(float f) { return portable::FloatToBfloat16(f); }

// ---- Storage, accumulation, load and store per element type ----

template <typename T, bool = std::is_integral<T>::value>
struct AccOf {
  using type = T;
};
template <typename T>
struct AccOf<T, true> {
  using type = typename std::make_unsigned<T>::type;
};

template <typename T>
struct Traits {
  using Storage = T;
  using Acc = typename AccOf<T>::type;
  static KZ_HD Acc Load(T v) { return static_cast<Acc>(v); }
  static KZ_HD T Store(Acc v) { return static_cast<T>(v); }
};
template <>
struct Traits<F16> {
  using Storage = uint16_t;
  using Acc = float;
  static KZ_HD float Load(uint16_t v) { return HalfToFloat(v); }
  static KZ_HD uint16_t Store(float v) { return FloatToHalf(v); }
};
template <>
struct Traits<BF16> {
  using Storage = uint16_t;
  using Acc = float;
  static KZ_HD float Load(uint16_t v) { return Bfloat16ToFloat(v); }
  static KZ_HD uint16_t Store(float v) { return FloatToBfloat16(v); }
};

template <typename T>
using StorageOf = typename Traits<T>::Storage;
template <typename T>
using AccumulatorOf = typename Traits<T>::Acc;

// ---- Combine ----

// IEEE 754-2019 minimum / maximum of float32 or float64 (host_reduce.cc's OrderedMinMax, the same
// operations): both selections are made; they differ only for operands that compare equal or
// unordered; equal ones are ANDed (max: +0 & -0 = +0) or ORed (min: -0), an unordered pair
// becomes the canonical quiet NaN.
template <bool kMax>
KZ_HD float OrderedMinMax(float a, float b) {
  const float x = kMax ? (a < b ? b : a) : (b < a ? b : a);
  const float y = kMax ? (b < a ? a : b) : (a < b ? a : b);
  const uint32_t r = kMax ? (FloatBits(x) & FloatBits(y)) : (FloatBits(x) | FloatBits(y));
  return BitsToFloat((a != a || b != b) ? 0x7fc00000u : r);
}

template <bool kMax>
KZ_HD double OrderedMinMax(double a, double b) {
  const double x = kMax ? (a < b ? b : a) : (b < a ? b : a);
  const double y = kMax ? (b < a ? a : b) : (a < b ? a : b);
  const uint64_t r = kMax ? (DoubleBits(x) & DoubleBits(y)) : (DoubleBits(x) | DoubleBits(y));
  return BitsToDouble((a != a || b != b) ? uint64_t{0x7ff8000000000000u} : r);
}

template <typename T, Op kOp>
KZ_HD AccumulatorOf<T> Combine(AccumulatorOf<T> a, AccumulatorOf<T> b) {
  using Acc = AccumulatorOf<T>;
  // 8-bit accumulators would promote to int; widen to unsigned explicitly so that no operation
  // is ever a signed overflow.
  using Wide = typename std::conditional<std::is_integral<Acc>::value && (sizeof(Acc) < 4), uint32_t, Acc>::type;
  if constexpr (kOp == Op::kSum || kOp == Op::kAvg) {
    return static_cast<Acc>(static_cast<Wide>(a) + static_cast<Wide>(b));
  } else if constexpr (kOp == Op::kProd) {
    return static_cast<Acc>(static_cast<Wide>(a) * static_cast<Wide>(b));
  } else if constexpr (kOp == Op::kMin) {
    if constexpr (std::is_integral<T>::value) return static_cast<T>(b) < static_cast<T>(a) ? b : a;
    else return OrderedMinMax<false>(a, b);
  } else {
    if constexpr (std::is_integral<T>::value) return static_cast<T>(a) < static_cast<T>(b) ? b : a;
    else return OrderedMinMax<true>(a, b);
  }
}

// ---- Division by a launch-uniform divisor ----

// Unsigned division by an invariant d (Granlund & Montgomery, "Division by invariant integers
// using multiplication", 1994, figure 4.1): one multiply-high, a subtract, an add and two shifts
// per element instead of the GPU's multi-instruction division sequence (a call for 64 bits).
// Exact for every numerator and every 1 <= d < 2^32: with l = ceil(log2 d) and
// m = floor(2^N * (2^l - d) / d) + 1 (< 2^N), q = (t + ((n - t) >> min(l, 1))) >> max(l - 1, 0)
// where t = mulhi(m, n). A divisor of 0 is taken as 1 (kernel_abi.h requires >= 1; this keeps a
// bad launch from computing garbage quotients out of a shift by 32 or 64).
struct UnsignedDivider32 {
  uint32_t magic;
  int shift1;
  int shift2;

  KZ_HD explicit UnsignedDivider32(uint32_t d) {
    if (d == 0) d = 1;
    const int l = d == 1 ? 0 : 32 - CountLeadingZeros32(d - 1);
    magic = static_cast<uint32_t>((((uint64_t{1} << l) - d) << 32) / d + 1);
    shift1 = l > 0 ? 1 : 0;
    shift2 = l > 0 ? l - 1 : 0;
  }
  KZ_HD uint32_t operator()(uint32_t n) const {
    const uint32_t t = MulHi32(magic, n);
    return (t + ((n - t) >> shift1)) >> shift2;
  }
};

// The same for 64-bit numerators (the divisor is still below 2^32). m needs a 96-by-32-bit
// division, done as two 64-by-32 steps: 2^64 * r / d = 2^32 * (hi + rem / d) with
// hi = floor(2^32 * r / d), and both partial quotients are below 2^32 because r = 2^l - d < d.
struct UnsignedDivider64 {
  uint64_t magic;
  int shift1;
  int shift2;

  KZ_HD explicit UnsignedDivider64(uint32_t d) {
    if (d == 0) d = 1;
    const int l = d == 1 ? 0 : 32 - CountLeadingZeros32(d - 1);
    const uint64_t r = (uint64_t{1} << l) - d;
    const uint64_t hi = (r << 32) / d;
    const uint64_t lo = (((r << 32) % d) << 32) / d;
    magic = ((hi << 32) | lo) + 1;
    shift1 = l > 0 ? 1 : 0;
    shift2 = l > 0 ? l - 1 : 0;
  }
  KZ_HD uint64_t operator()(uint64_t n) const {
    const uint64_t t = MulHi64(magic, n);
    return (t + ((n - t) >> shift1)) >> shift2;
  }
};

// avg's finish for one element type: takes the accumulator, returns the stored element.
template <typename T, bool = std::is_integral<T>::value>
struct Divider {
  // Floating types: x / float(d) rounded once. A power-of-two d multiplies by its reciprocal
  // instead, which is exact (2^-k, k <= 31, is representable), so x * 2^-k and x / 2^k are the
  // correct rounding of the same real number: the same bits, at a multiply's cost.
  using Acc = AccumulatorOf<T>;
  Acc divisor;
  Acc inverse;
  bool power_of_two;

  KZ_HD explicit Divider(uint32_t d) {
    if (d == 0) d = 1;
    divisor = static_cast<Acc>(d);
    inverse = Acc{1} / divisor;
    power_of_two = (d & (d - 1)) == 0;
  }
  KZ_HD StorageOf<T> operator()(Acc x) const {
    return Traits<T>::Store(power_of_two ? x * inverse : x / divisor);
  }
};

template <typename T>
struct Divider<T, true> {
  // Integers: the wrapped sum taken as T, divided truncating toward zero. Signed values divide
  // their magnitude as unsigned (INT_MIN's magnitude fits the unsigned type) and negate back;
  // the quotient's magnitude never exceeds the dividend's, so it fits T.
  using Acc = AccumulatorOf<T>;
  using Unsigned = typename std::conditional<sizeof(T) == 8, uint64_t, uint32_t>::type;
  using Signed = typename std::make_signed<Unsigned>::type;
  typename std::conditional<sizeof(T) == 8, UnsignedDivider64, UnsignedDivider32>::type divide;

  KZ_HD explicit Divider(uint32_t d) : divide(d) {}
  KZ_HD T operator()(Acc x) const {
    if constexpr (std::is_signed<T>::value) {
      const Signed v = static_cast<T>(x);  // sign-extends
      const Unsigned magnitude = v < 0 ? Unsigned{0} - static_cast<Unsigned>(v) : static_cast<Unsigned>(v);
      const Unsigned q = divide(magnitude);
      return static_cast<T>(v < 0 ? Unsigned{0} - q : q);
    } else {
      return static_cast<T>(divide(static_cast<Unsigned>(x)));
    }
  }
};

// ---- Finish: accumulator -> stored element ----

// Every op but avg stores the accumulator; avg divides it. The kernels build one Finisher per
// thread from the launch's divisor, so the divider's setup is paid once, not per element.
template <typename T, Op kOp>
struct Finisher {
  KZ_HD explicit Finisher(uint32_t /*avg_divisor*/) {}
  KZ_HD StorageOf<T> operator()(AccumulatorOf<T> x) const { return Traits<T>::Store(x); }
};

template <typename T>
struct Finisher<T, Op::kAvg> {
  Divider<T> divide;
  KZ_HD explicit Finisher(uint32_t avg_divisor) : divide(avg_divisor) {}
  KZ_HD StorageOf<T> operator()(AccumulatorOf<T> x) const { return divide(x); }
};

// ---- Whole elements, for the scalar paths and the tests ----

// dst = srcs[0] op srcs[1] op ... op srcs[n-1] for one element (n >= 1).
template <typename T, Op kOp>
KZ_HD StorageOf<T> ReduceElement(const StorageOf<T>* values, int n, const Finisher<T, kOp>& finish) {
  AccumulatorOf<T> acc = Traits<T>::Load(values[0]);
  for (int k = 1; k < n; ++k) acc = Combine<T, kOp>(acc, Traits<T>::Load(values[k]));
  return finish(acc);
}

// HostScale's element: avg's finish on one input.
template <typename T>
KZ_HD StorageOf<T> ScaleElement(StorageOf<T> x, const Finisher<T, Op::kAvg>& finish) {
  return finish(Traits<T>::Load(x));
}

}  // namespace kizuna::cuda::math
