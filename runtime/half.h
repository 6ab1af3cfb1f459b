// float16 (IEEE binary16) and bfloat16 conversions, round-to-nearest-even, header-only so the
// reduction kernels inline them. NaN stays NaN (quiet); overflow rounds to infinity as IEEE says.
#pragma once

#include <bit>
#include <cstdint>

namespace kizuna {

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // 112 = 127 - 15
  } else if (mant == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: value = mant * 2^-24; normalise into a float.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absx >> 13) & 0x1ffu));  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {
    // Result is subnormal or zero: value / 2^-24, rounded to nearest even.
    if (absx < 0x33000000u) return sign;  // below half of the smallest subnormal (2^-25): zero
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 113 - exp + 13
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  uint32_t r = absx - 0x38000000u;  // exponent 127 -> 15 bias
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | r);
}

inline float Bfloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToBfloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even; overflow carries to inf correctly
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kizuna
