// Reference reductions for the data tests (data_conformance_test.cc).
//
// Computed on the CPU from host copies of the inputs, independent of runtime/device/host_reduce.cc:
//  - integers: exact modular arithmetic in uint64 (sum, prod wrap modulo 2^bits; avg is the
//    wrapped sum reinterpreted in the type, divided truncating toward zero — dtype.h);
//  - float32 / float64: the exact-as-possible value in long double, compared with an error bound
//    for the backend's (unspecified) summation order: n·eps·Σ|x| for sum, n·eps·|p| for prod;
//  - float16 / bfloat16: inputs are multiples of 1/4 in [-2, 2], so every sum and product of up to
//    8 of them is exact in float32; the expected value is that exact float32 result rounded once
//    to the type (avg: the exact float32 sum divided by n in float32, then rounded — dtype.h's
//    "computed in the accumulation type and rounded once"), and results are compared bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/dtype.h"
#include "runtime/core/half.h"
#include "tests/conformance/device/device_conformance.h"

namespace kizuna::device::conformance {

template <typename T>
T IntReference(std::span<const T* const> in, size_t i, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  const size_t n = in.size();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: {
      uint64_t acc = 0;
      for (const T* s : in) acc += static_cast<uint64_t>(static_cast<U>(s[i]));
      const T wrapped = static_cast<T>(static_cast<U>(acc));
      if (op == ReduceOp::kSum) return wrapped;
      if constexpr (std::is_signed_v<T>) return static_cast<T>(static_cast<int64_t>(wrapped) / static_cast<int64_t>(n));
      else return static_cast<T>(static_cast<uint64_t>(wrapped) / static_cast<uint64_t>(n));
    }
    case ReduceOp::kProd: {
      uint64_t acc = 1;
      for (const T* s : in) acc *= static_cast<uint64_t>(static_cast<U>(s[i]));
      return static_cast<T>(static_cast<U>(acc));
    }
    case ReduceOp::kMin: {
      T m = in[0][i];
      for (const T* s : in) m = std::min(m, s[i]);
      return m;
    }
    case ReduceOp::kMax: {
      T m = in[0][i];
      for (const T* s : in) m = std::max(m, s[i]);
      return m;
    }
  }
  return T{};
}

template <typename T>
::testing::AssertionResult CheckIntReduce(const void* out_v, std::span<const void* const> in_v, size_t count,
                                          ReduceOp op) {
  const T* out = static_cast<const T*>(out_v);
  std::vector<const T*> in;
  for (const void* p : in_v) in.push_back(static_cast<const T*>(p));
  size_t wrong = 0, first = 0;
  T first_expected{}, first_actual{};
  for (size_t i = 0; i < count; ++i) {
    const T e = IntReference<T>(in, i, op);
    if (out[i] != e && wrong++ == 0) {
      first = i;
      first_expected = e;
      first_actual = out[i];
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << count << " elements wrong; first [" << first
                                       << "] = " << +first_actual << ", expected " << +first_expected;
}

template <typename T>  // float or double
::testing::AssertionResult CheckFloatReduce(const void* out_v, std::span<const void* const> in_v, size_t count,
                                            ReduceOp op) {
  using R = long double;
  const T* out = static_cast<const T*>(out_v);
  const size_t n = in_v.size();
  const R eps = std::numeric_limits<T>::epsilon();
  const R tiny = std::numeric_limits<T>::denorm_min();
  size_t wrong = 0, first = 0;
  R first_expected = 0, first_actual = 0, first_tol = 0;
  for (size_t i = 0; i < count; ++i) {
    R sum = 0, abs_sum = 0, prod = 1;
    T mn = static_cast<const T*>(in_v[0])[i], mx = mn;
    for (const void* p : in_v) {
      const T x = static_cast<const T*>(p)[i];
      sum += x;
      abs_sum += std::fabs(static_cast<R>(x));
      prod *= x;
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    R expected = 0, tol = 0;
    switch (op) {
      case ReduceOp::kSum: expected = sum; tol = n * eps * abs_sum; break;
      case ReduceOp::kProd: expected = prod; tol = n * eps * std::fabs(prod); break;
      case ReduceOp::kMin: expected = mn; break;
      case ReduceOp::kMax: expected = mx; break;
      case ReduceOp::kAvg: expected = sum / n; tol = (n + 1) * eps * abs_sum / n; break;
    }
    if (tol > 0) tol += tiny;
    const R actual = out[i];
    if (!(std::fabs(actual - expected) <= tol) && wrong++ == 0) {
      first = i;
      first_expected = expected;
      first_actual = actual;
      first_tol = tol;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << count << " elements wrong; first [" << first
                                       << "] = " << static_cast<double>(first_actual) << ", expected "
                                       << static_cast<double>(first_expected) << " within "
                                       << static_cast<double>(first_tol);
}

// float16 / bfloat16: bit-exact against one rounding of the exact float32 result.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
::testing::AssertionResult CheckHalfReduce(const void* out_v, std::span<const void* const> in_v, size_t count,
                                           ReduceOp op) {
  const auto* out = static_cast<const uint16_t*>(out_v);
  const size_t n = in_v.size();
  size_t wrong = 0, first = 0;
  uint16_t first_expected = 0, first_actual = 0;
  for (size_t i = 0; i < count; ++i) {
    // The same operations in the same order in double: exact for these inputs (see above), so
    // the float32 conversion below is exact too.
    double acc = ToFloat(static_cast<const uint16_t*>(in_v[0])[i]);
    for (size_t k = 1; k < n; ++k) {
      const double x = ToFloat(static_cast<const uint16_t*>(in_v[k])[i]);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += x; break;
        case ReduceOp::kProd: acc *= x; break;
        case ReduceOp::kMin: acc = x < acc ? x : acc; break;
        case ReduceOp::kMax: acc = acc < x ? x : acc; break;
      }
    }
    const float exact = static_cast<float>(acc);
    const uint16_t e =
        op == ReduceOp::kAvg ? FromFloat(exact / static_cast<float>(n)) : FromFloat(exact);
    if (out[i] != e && wrong++ == 0) {
      first = i;
      first_expected = e;
      first_actual = out[i];
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << count << " elements wrong; first [" << first
                                       << "] = " << ToFloat(first_actual) << fmt::format(" ({:#06x})", first_actual)
                                       << ", expected " << ToFloat(first_expected)
                                       << fmt::format(" ({:#06x})", first_expected);
}

// Checks `count` elements at `out` against the reference of `inputs` (host copies).
inline ::testing::AssertionResult CheckReduce(const void* out, std::span<const void* const> inputs, size_t count,
                                       DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat16: return CheckHalfReduce<HalfToFloat, FloatToHalf>(out, inputs, count, op);
    case DataType::kBfloat16: return CheckHalfReduce<Bfloat16ToFloat, FloatToBfloat16>(out, inputs, count, op);
    case DataType::kFloat32: return CheckFloatReduce<float>(out, inputs, count, op);
    case DataType::kFloat64: return CheckFloatReduce<double>(out, inputs, count, op);
    case DataType::kInt8: return CheckIntReduce<int8_t>(out, inputs, count, op);
    case DataType::kUint8: return CheckIntReduce<uint8_t>(out, inputs, count, op);
    case DataType::kInt32: return CheckIntReduce<int32_t>(out, inputs, count, op);
    case DataType::kUint32: return CheckIntReduce<uint32_t>(out, inputs, count, op);
    case DataType::kInt64: return CheckIntReduce<int64_t>(out, inputs, count, op);
    case DataType::kUint64: return CheckIntReduce<uint64_t>(out, inputs, count, op);
  }
  return ::testing::AssertionFailure() << "invalid data type " << static_cast<int>(type);
}

// Fills `count` elements of `type` with inputs suited to the checks above: full-range integers
// (so sums and products wrap), floats in [-4, 4], float16/bfloat16 multiples of 1/4 in [-2, 2].
inline void FillInputs(void* p, size_t count, DataType type, Rng& rng) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kBfloat16: {
      auto* d = static_cast<uint16_t*>(p);
      for (size_t i = 0; i < count; ++i) {
        const float v = static_cast<float>(rng.Uniform(-8, 8)) / 4.0f;
        d[i] = type == DataType::kFloat16 ? FloatToHalf(v) : FloatToBfloat16(v);
      }
      return;
    }
    case DataType::kFloat32: {
      auto* d = static_cast<float*>(p);
      for (size_t i = 0; i < count; ++i) d[i] = static_cast<float>(rng.UniformDouble(-4, 4));
      return;
    }
    case DataType::kFloat64: {
      auto* d = static_cast<double*>(p);
      for (size_t i = 0; i < count; ++i) d[i] = rng.UniformDouble(-4, 4);
      return;
    }
    default: {
      const size_t esize = DataTypeSize(type);
      auto* d = static_cast<uint8_t*>(p);
      for (size_t i = 0; i < count; ++i) {
        const uint64_t v = rng.Next();
        std::memcpy(d + i * esize, &v, esize);  // little-endian: the low bytes
      }
      return;
    }
  }
}

inline std::string CaseName(DataType type, ReduceOp op, size_t inputs, size_t count) {
  return fmt::format("{} {} of {} input(s), count {}", DataTypeName(type), ReduceOpName(op), inputs, count);
}

}  // namespace kizuna::device::conformance
