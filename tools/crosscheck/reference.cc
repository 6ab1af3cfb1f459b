#include "tools/crosscheck/reference.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "tools/crosscheck/rng.h"

namespace kizuna::crosscheck {
namespace {

struct FloatFormat {
  int precision;  // significand bits, hidden bit included
  int emin;       // exponent of the smallest normal
  int emax;
};

FloatFormat FormatOf(DataType type) {
  switch (type) {
    case DataType::kFloat16: return {11, -14, 15};
    case DataType::kBfloat16: return {8, -126, 127};
    case DataType::kFloat32: return {24, -126, 127};
    default: return {53, -1022, 1023};
  }
}

long double MaxFinite(DataType type) {
  const FloatFormat f = FormatOf(type);
  return std::ldexp(2.0L - std::ldexp(1.0L, 1 - f.precision), f.emax);
}

int IntegerBytes(DataType type) { return static_cast<int>(DataTypeSize(type)); }

bool IsSigned(DataType type) { return type == DataType::kInt8 || type == DataType::kInt32 || type == DataType::kInt64; }

uint64_t Mask(DataType type) {
  const int bits = 8 * IntegerBytes(type);
  return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// The value of the low 8*bytes bits of v in `type`: sign-extended for signed types.
uint64_t Wrap(uint64_t v, DataType type) {
  v &= Mask(type);
  const int bits = 8 * IntegerBytes(type);
  if (IsSigned(type) && bits < 64 && (v >> (bits - 1)) != 0) v |= ~Mask(type);
  return v;
}

void StoreInteger(uint64_t v, DataType type, uint8_t* out) {
  for (int b = 0; b < IntegerBytes(type); ++b) out[b] = static_cast<uint8_t>(v >> (8 * b));
}

// For a finite non-zero x: the exponent of its lowest set significand bit, and the bit length of
// its significand with the trailing zeros removed (its odd part).
void SignificandShape(long double x, int* lowest_bit, int* odd_bits) {
  int e = 0;
  const long double f = std::frexp(std::fabs(x), &e);  // [0.5, 1)
  const auto m = static_cast<uint64_t>(std::ldexp(f, 64));
  const int tz = std::countr_zero(m);
  *lowest_bit = e - 64 + tz;
  *odd_bits = static_cast<int>(std::bit_width(m >> tz));
}

// -0 below +0: IEEE 754-2019's minimum / maximum order for non-NaN values.
bool Below(long double a, long double b) { return a < b || (a == b && std::signbit(a) && !std::signbit(b)); }

bool SameFloat(long double a, long double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

std::string Number(long double v) { return fmt::format("{}", static_cast<double>(v)); }

bool CheckFloat(DataType type, ReduceOp op, std::span<const uint8_t* const> inputs, const uint8_t* got_bytes,
                std::string* why) {
  const int n = static_cast<int>(inputs.size());
  const FloatFormat f = FormatOf(type);
  const long double eps = std::ldexp(1.0L, 1 - f.precision);
  const long double max_finite = MaxFinite(type);
  const long double got = DecodeFloat(got_bytes, type);
  bool any_nan = false;
  for (const uint8_t* in : inputs) any_nan = any_nan || std::isnan(DecodeFloat(in, type));
  if (any_nan) {
    if (std::isnan(got)) return true;
    if (why != nullptr) *why = "want a NaN (an input is NaN)";
    return false;
  }
  auto exactly = [&](long double want) {
    if (SameFloat(got, want)) return true;
    if (why != nullptr) *why = fmt::format("want {} exactly", Number(want));
    return false;
  };
  auto within = [&](long double want, long double tol) {
    if (!std::isnan(got) && std::fabs(got - want) <= tol) return true;
    if (why != nullptr) *why = fmt::format("want {} +- {}", Number(want), Number(tol));
    return false;
  };
  // Half the spacing at the larger of want and got: the final rounding.
  auto half_ulp = [&](long double want) {
    const long double g = std::isfinite(got) ? got : want;
    return std::max(UlpOf(want, type), UlpOf(g, type)) / 2;
  };

  if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
    long double want = DecodeFloat(inputs[0], type);
    for (int q = 1; q < n; ++q) {
      const long double v = DecodeFloat(inputs[static_cast<size_t>(q)], type);
      if (op == ReduceOp::kMin ? Below(v, want) : Below(want, v)) want = v;
    }
    return exactly(want);
  }

  if (op == ReduceOp::kProd) {
    long double product = 1, magnitude_high = 1, magnitude_low = 1;
    int odd_bits = 0;
    for (const uint8_t* in : inputs) {
      const long double v = DecodeFloat(in, type);
      product *= v;
      if (v == 0) continue;
      const long double a = std::fabs(v);
      magnitude_high *= std::max(a, 1.0L);
      magnitude_low *= std::min(a, 1.0L);
      int lowest = 0, bits = 0;
      SignificandShape(v, &lowest, &bits);
      odd_bits += bits;
    }
    // Every partial product of every order lies in [magnitude_low, magnitude_high] (or is 0).
    const bool in_range = magnitude_high <= max_finite && magnitude_low >= std::ldexp(1.0L, f.emin);
    if (in_range && odd_bits <= f.precision) return exactly(product);
    const long double a = std::fabs(product);
    return within(product, (n - 1) * eps * a * (1 + 0x1p-8L) + half_ulp(product) + a * n * 0x1p-62L);
  }

  // Sum and avg.
  long double sum = 0, sum_abs = 0;
  bool all_negative_zero = true;
  int lowest = std::numeric_limits<int>::max();
  for (const uint8_t* in : inputs) {
    const long double v = DecodeFloat(in, type);
    sum += v;
    sum_abs += std::fabs(v);
    all_negative_zero = all_negative_zero && v == 0 && std::signbit(v);
    if (v != 0) {
      int low = 0, bits = 0;
      SignificandShape(v, &low, &bits);
      lowest = std::min(lowest, low);
    }
  }
  if (sum == 0) sum = all_negative_zero ? -0.0L : 0.0L;
  const int quantum_min = f.emin - (f.precision - 1);
  const bool exact = sum_abs == 0 || (lowest >= quantum_min && sum_abs < std::ldexp(1.0L, f.precision + lowest) &&
                                      sum_abs <= max_finite);
  const long double bound = (n - 1) * eps * sum_abs + sum_abs * n * 0x1p-62L;
  if (op == ReduceOp::kSum) return exact ? exactly(sum) : within(sum, bound + half_ulp(sum));

  // avg: the sum divided by n, rounded once (for 16-bit types the division runs in float32).
  const long double quotient = sum / n;
  const bool narrow = type == DataType::kFloat16 || type == DataType::kBfloat16;
  if (!exact) {
    const long double f32_step = narrow ? UlpOf(quotient, DataType::kFloat32) / 2 : 0;
    return within(quotient, bound / n + half_ulp(quotient) + f32_step);
  }
  const long double nearest = RoundToType(quotient, type);
  if (SameFloat(got, nearest)) return true;
  const long double ulp = UlpOf(quotient, type);
  const long double low = std::floor(quotient / ulp) * ulp, high = low + ulp;
  const long double window = std::fabs(quotient) * (narrow                       ? 0x1p-22L
                                                    : type == DataType::kFloat32 ? 0x1p-50L
                                                                                 : 0x1p-60L);
  if (std::fabs(quotient - (low + high) / 2) <= window && (got == low || got == high)) return true;
  if (why != nullptr) *why = fmt::format("want {} (the sum {} / {}, rounded once)", Number(nearest), Number(sum), n);
  return false;
}

bool CheckInteger(DataType type, ReduceOp op, std::span<const uint8_t* const> inputs, const uint8_t* got_bytes,
                  std::string* why) {
  const int n = static_cast<int>(inputs.size());
  const bool is_signed = IsSigned(type);
  uint64_t acc = DecodeInteger(inputs[0], type);
  for (int q = 1; q < n; ++q) {
    const uint64_t v = DecodeInteger(inputs[static_cast<size_t>(q)], type);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin:
        if (is_signed ? static_cast<int64_t>(v) < static_cast<int64_t>(acc) : v < acc) acc = v;
        break;
      case ReduceOp::kMax:
        if (is_signed ? static_cast<int64_t>(v) > static_cast<int64_t>(acc) : v > acc) acc = v;
        break;
    }
  }
  uint64_t want = Wrap(acc, type);
  if (op == ReduceOp::kAvg) {
    want = is_signed ? static_cast<uint64_t>(static_cast<int64_t>(want) / n) : want / static_cast<uint64_t>(n);
    want = Wrap(want, type);
  }
  const uint64_t got = DecodeInteger(got_bytes, type);
  if (got == want) return true;
  if (why != nullptr)
    *why = is_signed ? fmt::format("want {}", static_cast<int64_t>(want)) : fmt::format("want {}", want);
  return false;
}

}  // namespace

std::string_view ValueKindName(ValueKind k) {
  switch (k) {
    case ValueKind::kSmallInt: return "small-int";
    case ValueKind::kDyadic: return "dyadic";
    case ValueKind::kGeneral: return "general";
    case ValueKind::kSignedZero: return "signed-zero";
    case ValueKind::kExtreme: return "extreme";
  }
  return "invalid";
}

int Precision(DataType type) { return FormatOf(type).precision; }

long double DecodeFloat(const uint8_t* element, DataType type) {
  switch (type) {
    case DataType::kFloat16: {
      const uint16_t h = static_cast<uint16_t>(element[0] | (element[1] << 8));
      const int e = (h >> 10) & 31;
      const int m = h & 1023;
      long double v = 0;
      if (e == 0)
        v = std::ldexp(static_cast<long double>(m), -24);
      else if (e == 31)
        v = m == 0 ? std::numeric_limits<long double>::infinity() : std::numeric_limits<long double>::quiet_NaN();
      else
        v = std::ldexp(static_cast<long double>(1024 + m), e - 25);
      return (h >> 15) != 0 ? -v : v;
    }
    case DataType::kBfloat16: {
      const uint32_t u = (static_cast<uint32_t>(element[0]) | (static_cast<uint32_t>(element[1]) << 8)) << 16;
      return std::bit_cast<float>(u);
    }
    case DataType::kFloat32: {
      float x;
      std::memcpy(&x, element, 4);
      return x;
    }
    default: {
      double x;
      std::memcpy(&x, element, 8);
      return x;
    }
  }
}

uint64_t DecodeInteger(const uint8_t* element, DataType type) {
  uint64_t v = 0;
  for (int b = 0; b < IntegerBytes(type); ++b) v |= static_cast<uint64_t>(element[b]) << (8 * b);
  return Wrap(v, type);
}

long double RoundToType(long double v, DataType type) {
  if (v == 0 || !std::isfinite(v)) return v;
  const FloatFormat f = FormatOf(type);
  const int e = std::max(std::ilogb(v), f.emin);
  const int quantum = e - (f.precision - 1);
  const long double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum)), quantum);
  if (std::fabs(r) > MaxFinite(type)) return std::copysign(std::numeric_limits<long double>::infinity(), v);
  return r == 0 ? std::copysign(0.0L, v) : r;
}

long double UlpOf(long double v, DataType type) {
  const FloatFormat f = FormatOf(type);
  const int e = (v == 0 || !std::isfinite(v)) ? f.emin : std::max(std::ilogb(v), f.emin);
  return std::ldexp(1.0L, e - (f.precision - 1));
}

bool EncodeFloat(long double v, DataType type, uint8_t* out) {
  if (!std::isnan(v) && !SameFloat(RoundToType(v, type), v)) return false;
  switch (type) {
    case DataType::kFloat16: {
      uint16_t bits = 0;
      const long double a = std::fabs(v);
      if (std::isnan(v))
        bits = 0x7e00;
      else if (std::isinf(v))
        bits = 0x7c00;
      else if (a == 0)
        bits = 0;
      else if (std::ilogb(a) < -14)
        bits = static_cast<uint16_t>(std::ldexp(a, 24));
      else {
        const int e = std::ilogb(a);
        bits = static_cast<uint16_t>(((e + 15) << 10) | (static_cast<int>(std::ldexp(a, 10 - e)) - 1024));
      }
      if (std::signbit(v) && !std::isnan(v)) bits |= 0x8000;
      out[0] = static_cast<uint8_t>(bits);
      out[1] = static_cast<uint8_t>(bits >> 8);
      return true;
    }
    case DataType::kBfloat16: {
      const uint32_t u = std::isnan(v) ? 0x7fc00000u : std::bit_cast<uint32_t>(static_cast<float>(v));
      out[0] = static_cast<uint8_t>(u >> 16);
      out[1] = static_cast<uint8_t>(u >> 24);
      return true;
    }
    case DataType::kFloat32: {
      const float x = std::isnan(v) ? std::bit_cast<float>(0x7fc00000u) : static_cast<float>(v);
      std::memcpy(out, &x, 4);
      return true;
    }
    default: {
      const double x = std::isnan(v) ? std::bit_cast<double>(0x7ff8000000000000ull) : static_cast<double>(v);
      std::memcpy(out, &x, 8);
      return true;
    }
  }
}

void InputElement(const InputSpec& spec, int rank, uint64_t i, uint8_t* out) {
  const uint64_t h = Key(spec.key, static_cast<uint64_t>(rank), i);
  const uint64_t h2 = Mix64(h);
  const bool prod = spec.op == ReduceOp::kProd;
  if (!IsFloatingPoint(spec.type)) {
    const bool is_signed = IsSigned(spec.type);
    const uint64_t mask = Mask(spec.type);
    uint64_t v = 0;
    switch (spec.kind) {
      case ValueKind::kGeneral: v = h2; break;
      case ValueKind::kExtreme: {
        const uint64_t min = is_signed ? ~(mask >> 1) : 0, max = is_signed ? mask >> 1 : mask;
        const uint64_t choices[7] = {min, min + 1, is_signed ? ~uint64_t{0} : max / 2, 0, 1, max - 1, max};
        v = choices[h % 7];
        break;
      }
      default:
        if (is_signed)
          v = static_cast<uint64_t>(prod ? static_cast<int64_t>(h % 7) - 3 : static_cast<int64_t>(h % 41) - 20);
        else
          v = prod ? h % 4 : h % 41;
        break;
    }
    StoreInteger(v, spec.type, out);
    return;
  }
  const int p = Precision(spec.type);
  long double v = 0;
  if (spec.nans && (h2 & 31) == 0) {
    v = std::numeric_limits<long double>::quiet_NaN();
  } else {
    switch (spec.kind) {
      case ValueKind::kSmallInt: {
        static constexpr int kProd[4] = {-2, -1, 1, 2};
        v = prod ? kProd[h % 4] : static_cast<long double>(static_cast<int64_t>(h % 33) - 16);
        break;
      }
      case ValueKind::kDyadic: {
        if (prod) {
          static constexpr long double kProd[7] = {0.5L, 0.75L, 1.0L, 1.25L, 1.5L, 2.0L, 3.0L};
          v = kProd[h % 7] * ((h >> 8) & 1 ? -1 : 1);
        } else {
          const int bits = std::min(p - 3, 8);
          const auto span = static_cast<int64_t>(1) << bits;
          const auto m = static_cast<int64_t>(h % static_cast<uint64_t>(2 * span + 1)) - span;
          v = std::ldexp(static_cast<long double>(m), -static_cast<int>((h >> 32) % 7));
        }
        break;
      }
      case ValueKind::kSignedZero: {
        static constexpr long double kChoices[8] = {0.0L, -0.0L, -0.0L, 0.0L, 1.0L, -1.0L, 2.0L, -3.0L};
        v = kChoices[h % 8];
        break;
      }
      default: {
        // A random significand in a few binades: [0.5, 2) for products (8 ranks stay far from
        // overflow and underflow in every type), 2^-3 .. 2^6 otherwise (no subnormal partial sum
        // in float16).
        const int e = prod ? static_cast<int>(h % 2) - 1 : static_cast<int>(h % 9) - 3;
        const uint64_t frac = h2 >> (64 - (p - 1));
        v = std::ldexp(static_cast<long double>((uint64_t{1} << (p - 1)) + frac), e - (p - 1));
        if ((h >> 40) & 1) v = -v;
        break;
      }
    }
  }
  EncodeFloat(v, spec.type, out);
}

void FillInputs(const InputSpec& spec, int rank, uint64_t count, uint8_t* out) {
  const size_t elem = DataTypeSize(spec.type);
  for (uint64_t i = 0; i < count; ++i) InputElement(spec, rank, i, out + i * elem);
}

void FillBytes(uint64_t key, uint64_t bytes, uint8_t* out) {
  for (uint64_t i = 0; i < bytes; i += 8) {
    const uint64_t w = Mix64(key + i);
    const uint64_t take = std::min<uint64_t>(8, bytes - i);
    std::memcpy(out + i, &w, take);
  }
}

bool CheckReduced(DataType type, ReduceOp op, std::span<const uint8_t* const> inputs, const uint8_t* got,
                  std::string* why) {
  if (IsFloatingPoint(type)) return CheckFloat(type, op, inputs, got, why);
  return CheckInteger(type, op, inputs, got, why);
}

std::string FormatElement(const uint8_t* element, DataType type) {
  const size_t bytes = DataTypeSize(type);
  uint64_t bits = 0;
  for (size_t b = 0; b < bytes; ++b) bits |= static_cast<uint64_t>(element[b]) << (8 * b);
  std::string value;
  if (IsFloatingPoint(type)) {
    const long double v = DecodeFloat(element, type);
    value = (v == 0 && std::signbit(v)) ? std::string("-0") : Number(v);
  } else {
    const uint64_t v = DecodeInteger(element, type);
    value = IsSigned(type) ? fmt::format("{}", static_cast<int64_t>(v)) : fmt::format("{}", v);
  }
  return fmt::format("{} (0x{:0{}x})", value, bits, 2 * bytes);
}

}  // namespace kizuna::crosscheck
