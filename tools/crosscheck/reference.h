// The cross-check's inputs and its reference, written here independently of kizuna's kernels and
// algorithms: element encodings of every DataType, the inputs of a case, and the check of one
// reduced element against the reduction of the ranks' inputs computed in straight loops with
// wide arithmetic (int64 / uint64 for integers, long double for floating types).
//
// What a reduced element must be (runtime/core/dtype.h, runtime/device/host_reduce.h):
//  - integers: exact. Sum and prod wrap modulo 2^bits; min / max compare in the type's
//    signedness; avg is the wrapped sum divided by the rank count with truncation toward zero.
//  - floating types, min / max: exact, with -0 ordered below +0 (IEEE 754-2019 minimum and
//    maximum); a NaN input gives a NaN.
//  - floating types, sum / prod / avg: any order of the ranks' contributions is allowed, so the
//    result is checked against the exact value x = sum (or product) of the inputs:
//      |got - x| <= (n - 1) * eps * sum(|x_i|) + ulp(x) / 2      (sum; prod: |x| for sum(|x_i|))
//    with eps the type's (2^-10 for float16, 2^-7 for bfloat16). When every partial result of
//    every order is representable (the inputs are multiples of 2^g and sum(|x_i|) < 2^(p+g), p
//    the type's precision; for prod, the odd parts of the inputs' significands fit p bits) the
//    check is exact: got must be x, bit for bit (the sign of a zero sum included: -0 only when
//    every input is -0). avg is x / n rounded once: exact sums demand the nearest value (either
//    neighbour when x / n lies within a float32 rounding of the midpoint, as the division runs
//    in float32 for 16-bit types); other sums allow (bound of the sum) / n + ulp / 2.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "runtime/core/dtype.h"

namespace kizuna::crosscheck {

// How a case's inputs are drawn. Integer types read kDyadic and kSignedZero as kSmallInt.
enum class ValueKind : uint8_t {
  kSmallInt,    // small integers: every order of every op exact (integers: wrap-free)
  kDyadic,      // m * 2^-s: exact sums while they fit the precision, bounded beyond
  kGeneral,     // random significands over a few binades (floats), random bits (integers)
  kSignedZero,  // +0 and -0 among small integers: min / max / sum signs of zero
  kExtreme,     // integers: min, max, 0, +-1 and their neighbours (wrapping)
};
inline constexpr int kNumValueKinds = 5;
std::string_view ValueKindName(ValueKind k);

// What fixes rank r's inputs of one case.
struct InputSpec {
  uint64_t key = 0;  // from the seed and the case index
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // products get small magnitudes
  ValueKind kind = ValueKind::kGeneral;
  bool nans = false;  // one element in 32 a quiet NaN (floating types)
};

// Rank `rank`'s input element `i`, as the bytes of spec.type (little-endian) at `out`.
void InputElement(const InputSpec& spec, int rank, uint64_t i, uint8_t* out);
// Elements [0, count) of rank `rank`'s input into `out` (count * DataTypeSize bytes).
void FillInputs(const InputSpec& spec, int rank, uint64_t count, uint8_t* out);
// Random bytes (point-to-point messages, guard patterns are fixed): `bytes` bytes from `key`.
void FillBytes(uint64_t key, uint64_t bytes, uint8_t* out);

// Element `i` of a buffer of `type`, as a number: floating types exactly (long double holds
// every value of them), integers sign- or zero-extended to 64 bits.
long double DecodeFloat(const uint8_t* element, DataType type);
uint64_t DecodeInteger(const uint8_t* element, DataType type);  // signed types sign-extended
// `v` must be representable in `type` (checked: kInvalid otherwise). Writes its bytes.
bool EncodeFloat(long double v, DataType type, uint8_t* out);
// The nearest value of `type` to v, ties to even (subnormals and overflow to infinity included).
long double RoundToType(long double v, DataType type);
// The spacing of `type` at v: 2^(max(exponent of v, emin) - (p - 1)).
long double UlpOf(long double v, DataType type);
int Precision(DataType type);  // significand bits, the hidden one included

// Checks one reduced element: `inputs[q]` points at rank q's input element, q = 0..n-1, `got`
// at the element the collective wrote. true when got is acceptable (see the header comment);
// otherwise false, and `why` says what was expected ("want 12 exactly", "want 3.25 +- 0.0039").
bool CheckReduced(DataType type, ReduceOp op, std::span<const uint8_t* const> inputs, const uint8_t* got,
                  std::string* why);

// "3.5 (0x4300)": a value and its bits, for reports.
std::string FormatElement(const uint8_t* element, DataType type);

}  // namespace kizuna::crosscheck
