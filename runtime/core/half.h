// float16 (IEEE binary16) and bfloat16 conversions, round-to-nearest-even, header-only so the
// reduction kernels inline them. NaN stays NaN (quiet); overflow rounds to infinity as IEEE says.
#pragma once

#include <bit>
#include <cstdint>

namespace kizuna {

// Both directions are branch-free (selects, not jumps) so that the reduction kernels' loops
// vectorize; the classic exponent-rebias formulation, checked exhaustively in dtype_test.cc.

inline float HalfToFloat(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;  // half's exponent field, in float position
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa in place
  const uint32_t exp = bits & kShiftedExp;
  bits += (127 - 15) << 23;  // rebias the exponent
  // Inf / NaN: push the exponent the rest of the way to 255 (the payload stays).
  const uint32_t inf_nan = bits + ((128 - 16) << 23);
  // Subnormal (or zero): let the FPU normalise mant * 2^-24 by subtracting 2^-14 from 2^-14 + x.
  const float sub = std::bit_cast<float>(bits + (1u << 23)) - std::bit_cast<float>(113u << 23);
  const uint32_t subnormal = std::bit_cast<uint32_t>(sub);
  bits = exp == kShiftedExp ? inf_nan : (exp == 0 ? subnormal : bits);
  return std::bit_cast<float>(bits | sign);
}

inline uint16_t FloatToHalf(float f) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16) << 23;      // 65536.0f: at or above, infinity
  constexpr uint32_t kDenormMagic = ((127u - 15) + (23 - 10) + 1) << 23;  // 0.5f
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  const uint32_t a = x ^ sign;
  // Too large for a normal half (65520 <= |f| < 65536 rounds up into the infinity encoding below).
  const uint32_t big = a > kF32Inf ? (0x7e00u | ((a >> 13) & 0x1ffu)) : 0x7c00u;
  // Subnormal result: adding 0.5 aligns the mantissa so the FPU's own round-to-nearest-even does
  // the rounding at the 2^-24 position; the low bits are then the half's subnormal mantissa.
  const uint32_t small =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + std::bit_cast<float>(kDenormMagic)) - kDenormMagic;
  // Normal: rebias, round the 13 dropped bits to nearest even (a carry may step into the next
  // exponent, or into infinity, which is right).
  const uint32_t odd = (a >> 13) & 1u;
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  const uint32_t h = a >= kF16Overflow ? big : (a < (113u << 23) ? small : normal);
  return static_cast<uint16_t>(h | (sign >> 16));
}

inline float Bfloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBfloat16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t nan = (x >> 16) | 0x0040u;  // quiet NaN, payload kept
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest even; may carry to inf
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace kizuna
