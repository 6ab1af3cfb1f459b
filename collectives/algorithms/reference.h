// A reference implementation of every collective on host buffers, for checking plans: plain loops
// in rank order over every rank's input, written from plan.h's table and dtype.h's definitions
// alone (no plan, no engine code, no HostReduce), so that an error in the algorithms or the
// simulator cannot hide itself by being repeated here.
//
// Reductions combine the ranks' values in rank order 0, 1, ..., p-1 in the accumulation type
// (float32 for float16 / bfloat16 / float32, float64 for float64, the unsigned type of the same
// width for integers so that sum and prod wrap) and round once on the store; avg divides the sum
// by p in the accumulation type (integers: the wrapped sum, truncating toward zero).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/dtype.h"
#include "runtime/core/half.h"

namespace kizuna::collectives::reference {

using Bytes = std::vector<uint8_t>;

namespace detail {

struct Half {};
struct Bfloat {};

// The accumulation type: integers wrap in their unsigned type, float32 stays float32.
template <typename T, bool = std::is_integral_v<T>> struct AccOf { using type = T; };
template <typename T> struct AccOf<T, true> { using type = std::make_unsigned_t<T>; };

template <typename T> struct Kind {
  using Storage = T;
  using Acc = typename AccOf<T>::type;
  static Acc Load(T v) { return static_cast<Acc>(v); }
  static T Store(Acc v) { return static_cast<T>(v); }
};
template <> struct Kind<Half> {
  using Storage = uint16_t;
  using Acc = float;
  static float Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};
template <> struct Kind<Bfloat> {
  using Storage = uint16_t;
  using Acc = float;
  static float Load(uint16_t v) { return Bfloat16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBfloat16(v); }
};

// IEEE 754-2019 minimum / maximum (host_reduce.h): a NaN gives the canonical quiet NaN, -0 orders
// below +0.
template <typename A>
A MinMax(bool max, A acc, A v) {
  if (std::isnan(acc) || std::isnan(v)) return std::numeric_limits<A>::quiet_NaN();
  if (acc == v) return std::signbit(acc) == max ? v : acc;  // zeros: max keeps +0, min -0
  return (max ? acc < v : v < acc) ? v : acc;
}

// dst[0] = srcs[0][0] op srcs[1][0] op ... (one element each).
template <typename T>
void ReduceOne(ReduceOp op, const std::vector<const uint8_t*>& srcs, uint8_t* dst) {
  using K = Kind<T>;
  using S = typename K::Storage;
  using A = typename K::Acc;
  constexpr bool kInt = std::is_integral_v<T>;
  auto load = [](const uint8_t* p) {
    S v;
    std::memcpy(&v, p, sizeof(S));
    return v;
  };
  S first = load(srcs[0]);
  A acc = K::Load(first);
  for (size_t q = 1; q < srcs.size(); ++q) {
    const S raw = load(srcs[q]);
    const A v = K::Load(raw);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = static_cast<A>(acc + v);
        break;
      case ReduceOp::kProd:
        acc = static_cast<A>(acc * v);
        break;
      case ReduceOp::kMin:
        if constexpr (kInt) acc = raw < static_cast<T>(acc) ? v : acc;
        else acc = MinMax(false, acc, v);
        break;
      case ReduceOp::kMax:
        if constexpr (kInt) acc = static_cast<T>(acc) < raw ? v : acc;
        else acc = MinMax(true, acc, v);
        break;
    }
  }
  S out;
  const auto n = srcs.size();
  if (op != ReduceOp::kAvg) {
    out = K::Store(acc);
  } else if constexpr (kInt) {
    const T sum = static_cast<T>(acc);
    if constexpr (std::is_signed_v<T>) out = static_cast<T>(static_cast<int64_t>(sum) / static_cast<int64_t>(n));
    else out = static_cast<T>(static_cast<uint64_t>(sum) / static_cast<uint64_t>(n));
  } else {
    out = K::Store(static_cast<A>(acc / static_cast<A>(n)));
  }
  std::memcpy(dst, &out, sizeof(S));
}

inline void ReduceElement(DataType t, ReduceOp op, const std::vector<const uint8_t*>& srcs, uint8_t* dst) {
  switch (t) {
    case DataType::kFloat16: return ReduceOne<Half>(op, srcs, dst);
    case DataType::kBfloat16: return ReduceOne<Bfloat>(op, srcs, dst);
    case DataType::kFloat32: return ReduceOne<float>(op, srcs, dst);
    case DataType::kFloat64: return ReduceOne<double>(op, srcs, dst);
    case DataType::kInt8: return ReduceOne<int8_t>(op, srcs, dst);
    case DataType::kUint8: return ReduceOne<uint8_t>(op, srcs, dst);
    case DataType::kInt32: return ReduceOne<int32_t>(op, srcs, dst);
    case DataType::kUint32: return ReduceOne<uint32_t>(op, srcs, dst);
    case DataType::kInt64: return ReduceOne<int64_t>(op, srcs, dst);
    case DataType::kUint64: return ReduceOne<uint64_t>(op, srcs, dst);
  }
}

}  // namespace detail

// Every rank's output after the collective, from every rank's input and every rank's output
// before it (what a rank whose output the collective does not write keeps: Reduce's non-roots,
// Barrier). Send and Recv have no collective output: a Recv's output is the sender's input.
inline std::vector<Bytes> Expected(const CollectiveRequest& req, const std::vector<Bytes>& in,
                                   const std::vector<Bytes>& out_before) {
  const int p = req.nranks;
  const uint64_t n = req.count;
  const size_t es = DataTypeSize(req.dtype);
  std::vector<Bytes> out = out_before;
  // The reduction of element i of every rank's input, in rank order.
  auto reduce = [&](uint64_t i, uint8_t* dst) {
    std::vector<const uint8_t*> srcs;
    for (int q = 0; q < p; ++q) srcs.push_back(in[static_cast<size_t>(q)].data() + i * es);
    detail::ReduceElement(req.dtype, req.op, srcs, dst);
  };
  auto at = [&](std::vector<Bytes>& v, int r, uint64_t i) { return v[static_cast<size_t>(r)].data() + i * es; };
  auto from = [&](int r, uint64_t i) { return in[static_cast<size_t>(r)].data() + i * es; };
  for (int r = 0; r < p; ++r) {
    switch (req.collective) {
      case Collective::kAllReduce:
        for (uint64_t i = 0; i < n; ++i) reduce(i, at(out, r, i));
        break;
      case Collective::kReduceScatter:
        for (uint64_t i = 0; i < n; ++i) reduce(static_cast<uint64_t>(r) * n + i, at(out, r, i));
        break;
      case Collective::kAllGather:
        for (int q = 0; q < p; ++q)
          for (uint64_t i = 0; i < n; ++i) std::memcpy(at(out, r, static_cast<uint64_t>(q) * n + i), from(q, i), es);
        break;
      case Collective::kBroadcast:
        for (uint64_t i = 0; i < n; ++i) std::memcpy(at(out, r, i), from(req.root, i), es);
        break;
      case Collective::kReduce:
        if (r == req.root)
          for (uint64_t i = 0; i < n; ++i) reduce(i, at(out, r, i));
        break;
      case Collective::kAllToAll:
        for (int j = 0; j < p; ++j)
          for (uint64_t i = 0; i < n; ++i)
            std::memcpy(at(out, r, static_cast<uint64_t>(j) * n + i), from(j, static_cast<uint64_t>(r) * n + i), es);
        break;
      case Collective::kSend:
      case Collective::kRecv:
      case Collective::kBarrier:
        break;
    }
  }
  return out;
}

}  // namespace kizuna::collectives::reference
