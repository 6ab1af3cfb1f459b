// Helpers of the algorithm tests (algorithms_test.cc, algorithms_order_test.cc): a fully
// connected shape, exact inputs for every dtype x op, a case description, and a run of every
// rank's plan through SimulatePlan checked against the independent reference (reference.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/plan/plan.h"
#include "collectives/algorithms/reference.h"
#include "collectives/plan/topology.h"
#include "collectives/algorithms/simulate.h"
#include "runtime/core/half.h"

namespace kizuna::collectives::algotest {

using reference::Bytes;

inline constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();
inline constexpr int kRankCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
inline constexpr uint64_t kCounts[] = {0, 1, 7, 1003};
inline constexpr uint64_t kChunks[] = {1, 3, 64, kUnlimited};
inline constexpr int kChannels[] = {1, 2, 3};
inline constexpr int kWindows[] = {2, 8};
inline constexpr unsigned char kSentinel = 0xcd;  // output bytes a collective must not write

inline CommTopology Full(int p) {
  RankDesc rank;
  rank.host_id = "host";
  rank.device = "emu:";
  LinkDesc link;
  link.reachable = true;
  return CommTopology::Uniform(p, rank, link);
}

// Elements a rank's plan reduces (destination counts of its reduction steps): where splits by
// speed put the reduction work.
inline uint64_t ReducedElements(const RankPlan& plan) {
  uint64_t n = 0;
  for (const auto& ch : plan.channels)
    for (const Step& s : ch)
      if (s.kind == StepKind::kReduce || s.kind == StepKind::kRecvReduce) n += s.dst.count;
  return n;
}

inline bool IsUnsigned(DataType t) {
  return t == DataType::kUint8 || t == DataType::kUint32 || t == DataType::kUint64;
}

// Writes the integer v as one element of type t (exact for the small values used here).
inline void Put(DataType t, uint8_t* dst, int64_t v) {
  auto put = [&](auto x) { std::memcpy(dst, &x, sizeof x); };
  switch (t) {
    case DataType::kFloat16: return put(FloatToHalf(static_cast<float>(v)));
    case DataType::kBfloat16: return put(FloatToBfloat16(static_cast<float>(v)));
    case DataType::kFloat32: return put(static_cast<float>(v));
    case DataType::kFloat64: return put(static_cast<double>(v));
    case DataType::kInt8: return put(static_cast<int8_t>(v));
    case DataType::kUint8: return put(static_cast<uint8_t>(v));
    case DataType::kInt32: return put(static_cast<int32_t>(v));
    case DataType::kUint32: return put(static_cast<uint32_t>(v));
    case DataType::kInt64: return put(static_cast<int64_t>(v));
    case DataType::kUint64: return put(static_cast<uint64_t>(v));
  }
}

inline double Get(DataType t, const uint8_t* src) {
  auto get = [&](auto x) {
    std::memcpy(&x, src, sizeof x);
    return x;
  };
  switch (t) {
    case DataType::kFloat16: return HalfToFloat(get(uint16_t{}));
    case DataType::kBfloat16: return Bfloat16ToFloat(get(uint16_t{}));
    case DataType::kFloat32: return get(float{});
    case DataType::kFloat64: return get(double{});
    case DataType::kInt8: return get(int8_t{});
    case DataType::kUint8: return get(uint8_t{});
    case DataType::kInt32: return get(int32_t{});
    case DataType::kUint32: return get(uint32_t{});
    case DataType::kInt64: return static_cast<double>(get(int64_t{}));
    case DataType::kUint64: return static_cast<double>(get(uint64_t{}));
  }
  return 0;
}

// Integer inputs small enough that every order of reduction is exact in every dtype for up to 16
// ranks: sums stay within [-64, 112] (int8, bfloat16's 8-bit mantissa), products are +-2^k with
// k <= 4, min/max pick an input. Non-reductions get values that differ by rank and index.
inline int64_t Value(const CollectiveRequest& req, int rank, uint64_t i) {
  const auto r = static_cast<uint64_t>(rank);
  const bool uns = IsUnsigned(req.dtype);
  if (!IsReduction(req.collective)) return static_cast<int64_t>((r * 131 + i * 7 + 1) % 251);
  switch (req.op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return uns ? static_cast<int64_t>((r * 7 + i * 3) % 8) : static_cast<int64_t>((r * 7 + i * 3) % 9) - 4;
    case ReduceOp::kProd: {
      int64_t v = (r + i) % 5 == 0 ? 2 : 1;
      if (!uns && (r * 3 + i) % 7 == 0) v = -v;
      return v;
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return uns ? static_cast<int64_t>((r * 5 + i * 11) % 13) : static_cast<int64_t>((r * 5 + i * 11) % 13) - 6;
  }
  return 0;
}

// How a float avg may differ from the reference: the plan rounds the sum to the dtype and then
// divides (two roundings), dtype.h's avg rounds once. The sums of the inputs above are exact in
// every dtype, so only the quotient is rounded, identically on both sides, and the results agree
// exactly in practice; the bound allows the one unit in the last place (relative 2^-10 float16,
// 2^-7 bfloat16, 2^-23 float32, 2^-52 float64) that the second rounding may cost on inputs
// whose sums are inexact.
inline double AvgTolerance(DataType t, double want) {
  const double eps = t == DataType::kFloat16    ? std::ldexp(1.0, -10)
                     : t == DataType::kBfloat16 ? std::ldexp(1.0, -7)
                     : t == DataType::kFloat32  ? std::ldexp(1.0, -23)
                                                : std::ldexp(1.0, -52);
  return eps * std::max(std::fabs(want), 1.0);
}

struct Case {
  Collective coll = Collective::kAllReduce;
  Algorithm algo = Algorithm::kRing;
  int p = 1;
  uint64_t count = 0;
  bool in_place = false;
  uint64_t chunk = kUnlimited;
  int channels = 1;
  int window = 2;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  bool deterministic = false;
  std::optional<CommTopology> shape;  // default: Full(p)
  bool balance = true;

  CollectiveRequest Request() const { return {coll, p, count, dtype, op, root, in_place}; }
  std::string Name() const {
    return fmt::format("{} {} chunk={} channels={} window={}{}", AlgorithmName(algo), Request().ToString(),
                       chunk == kUnlimited ? std::string("unlimited") : std::to_string(chunk), channels, window,
                       deterministic ? " deterministic" : "");
  }
};

// One rank's memory: separate input and output, or (in place) one buffer both alias as plan.h's
// table says.
struct RankMemory {
  Bytes in, out, both;
  size_t in_at = 0, out_at = 0;  // offsets into `both`
  uint8_t* input(bool in_place) { return in_place ? both.data() + in_at : in.data(); }
  uint8_t* output(bool in_place) { return in_place ? both.data() + out_at : out.data(); }
};

// Sets up every rank's buffers (inputs from `fill`), runs the plan, and returns each rank's
// output; fails if the plan is rejected, the simulation fails, or an out-of-place input or the
// rest of an in-place buffer changed.
using Fill = std::function<void(int rank, uint8_t* input, uint64_t elements)>;

inline testing::AssertionResult Simulate(const Case& c, const Fill& fill, std::vector<Bytes>* inputs,
                                         std::vector<Bytes>* before, std::vector<Bytes>* after,
                                         SimStats* stats = nullptr) {
  const CollectiveRequest req = c.Request();
  PlanOptions options;
  options.chunk_count = c.chunk;
  options.channels = c.channels;
  options.deterministic = c.deterministic;
  options.balance = c.balance;
  Result<Plan> plan = BuildPlan(c.algo, req, c.shape ? *c.shape : Full(c.p), options, -1);
  if (!plan.ok()) return testing::AssertionFailure() << c.Name() << ": " << plan.status().ToString();
  const size_t es = DataTypeSize(c.dtype);
  const size_t in_bytes = req.input_count() * es, out_bytes = req.output_count() * es;
  std::vector<RankMemory> mem(static_cast<size_t>(c.p));
  std::vector<SimRankBuffers> buffers(static_cast<size_t>(c.p));
  inputs->assign(static_cast<size_t>(c.p), {});
  before->assign(static_cast<size_t>(c.p), {});
  after->assign(static_cast<size_t>(c.p), {});
  for (int r = 0; r < c.p; ++r) {
    RankMemory& m = mem[static_cast<size_t>(r)];
    if (c.in_place) {
      m.both.assign(std::max(in_bytes, out_bytes), kSentinel);
      const size_t own = static_cast<size_t>(r) * c.count * es;
      if (c.coll == Collective::kReduceScatter) m.out_at = own;
      if (c.coll == Collective::kAllGather) m.in_at = own;
    } else {
      m.in.assign(in_bytes, kSentinel);
      m.out.assign(out_bytes, kSentinel);
    }
    fill(r, m.input(c.in_place), req.input_count());
    (*inputs)[static_cast<size_t>(r)].assign(m.input(c.in_place), m.input(c.in_place) + in_bytes);
    (*before)[static_cast<size_t>(r)].assign(m.output(c.in_place), m.output(c.in_place) + out_bytes);
    buffers[static_cast<size_t>(r)] = {m.input(c.in_place), m.output(c.in_place)};
  }
  std::vector<Bytes> whole;  // in place: every buffer before the run
  for (RankMemory& m : mem) whole.push_back(m.both);
  SimOptions sim;
  sim.window = c.window;
  // hier:fused's host level: the hosts of the shape's ranks.
  for (int r = 0; c.shape && r < c.p; ++r) {
    const std::string& id = c.shape->ranks[static_cast<size_t>(r)].host_id;
    int h = 0;
    while (h < r && c.shape->ranks[static_cast<size_t>(h)].host_id != id) ++h;
    sim.host_of.push_back(h);
  }
  Result<SimStats> ran = SimulatePlan(*plan, buffers, sim);
  if (!ran.ok()) return testing::AssertionFailure() << c.Name() << ": " << ran.status().ToString();
  if (stats != nullptr) *stats = *ran;
  for (int r = 0; r < c.p; ++r) {
    RankMemory& m = mem[static_cast<size_t>(r)];
    (*after)[static_cast<size_t>(r)].assign(m.output(c.in_place), m.output(c.in_place) + out_bytes);
    if (!c.in_place && m.in != (*inputs)[static_cast<size_t>(r)])
      return testing::AssertionFailure() << c.Name() << ": rank " << r << "'s input changed";
    if (c.in_place) {
      // Outside the output region the buffer is input the collective must leave alone.
      Bytes rest = m.both, was = whole[static_cast<size_t>(r)];
      std::fill(rest.begin() + static_cast<std::ptrdiff_t>(m.out_at),
                rest.begin() + static_cast<std::ptrdiff_t>(m.out_at + out_bytes), 0);
      std::fill(was.begin() + static_cast<std::ptrdiff_t>(m.out_at),
                was.begin() + static_cast<std::ptrdiff_t>(m.out_at + out_bytes), 0);
      if (rest != was) return testing::AssertionFailure() << c.Name() << ": rank " << r << " wrote outside its output";
    }
  }
  return testing::AssertionSuccess();
}

// Compares every rank's output with the reference: bitwise, except float avg (AvgTolerance).
inline testing::AssertionResult MatchesReference(const Case& c, const std::vector<Bytes>& got,
                                                const std::vector<Bytes>& want) {
  const size_t es = DataTypeSize(c.dtype);
  const bool tolerant = IsReduction(c.coll) && c.op == ReduceOp::kAvg && IsFloatingPoint(c.dtype);
  for (int r = 0; r < c.p; ++r) {
    const Bytes& g = got[static_cast<size_t>(r)];
    const Bytes& w = want[static_cast<size_t>(r)];
    if (g.size() != w.size()) return testing::AssertionFailure() << c.Name() << ": output sizes differ";
    for (size_t i = 0; i < g.size() / es; ++i) {
      if (std::memcmp(g.data() + i * es, w.data() + i * es, es) == 0) continue;
      const double gv = Get(c.dtype, g.data() + i * es), wv = Get(c.dtype, w.data() + i * es);
      if (tolerant && std::fabs(gv - wv) <= AvgTolerance(c.dtype, wv)) continue;
      return testing::AssertionFailure() << c.Name() << ": rank " << r << " element " << i << " is " << gv
                                         << ", expected " << wv;
    }
  }
  return testing::AssertionSuccess();
}

inline testing::AssertionResult RunExact(const Case& c, SimStats* stats = nullptr) {
  const CollectiveRequest req = c.Request();
  const size_t es = DataTypeSize(c.dtype);
  Fill fill = [&](int r, uint8_t* in, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) Put(c.dtype, in + i * es, Value(req, r, i));
  };
  std::vector<Bytes> inputs, before, after;
  if (auto ok = Simulate(c, fill, &inputs, &before, &after, stats); !ok) return ok;
  return MatchesReference(c, after, reference::Expected(req, inputs, before));
}

// The collectives each algorithm implements (Supports on a fully connected shape).
inline const std::vector<std::pair<Algorithm, Collective>>& SupportedPairs() {
  static const std::vector<std::pair<Algorithm, Collective>> pairs = {
      {Algorithm::kRing, Collective::kAllReduce},
      {Algorithm::kRing, Collective::kReduceScatter},
      {Algorithm::kRing, Collective::kAllGather},
      {Algorithm::kRing, Collective::kBroadcast},
      {Algorithm::kRing, Collective::kReduce},
      {Algorithm::kRing, Collective::kBarrier},
      {Algorithm::kTree, Collective::kAllReduce},
      {Algorithm::kTree, Collective::kBroadcast},
      {Algorithm::kTree, Collective::kReduce},
      {Algorithm::kRhd, Collective::kAllReduce},
      {Algorithm::kRhd, Collective::kReduceScatter},
      {Algorithm::kRhd, Collective::kAllGather},
      {Algorithm::kRd, Collective::kAllReduce},
      {Algorithm::kRd, Collective::kBarrier},
      {Algorithm::kPairwise, Collective::kAllToAll},
      {Algorithm::kPairwise, Collective::kAllGather},
      {Algorithm::kPairwise, Collective::kReduceScatter},
      {Algorithm::kPairwise, Collective::kAllReduce},
      {Algorithm::kPairwise, Collective::kBarrier},
      {Algorithm::kP2p, Collective::kSend},
      {Algorithm::kP2p, Collective::kRecv},
      {Algorithm::kFused, Collective::kAllReduce},
      {Algorithm::kFused, Collective::kReduceScatter},
      {Algorithm::kFused, Collective::kAllGather},
      {Algorithm::kFused, Collective::kBroadcast},
      {Algorithm::kFused, Collective::kReduce},
      {Algorithm::kFused, Collective::kBarrier},
      {Algorithm::kTorus, Collective::kAllReduce},
      {Algorithm::kTorus, Collective::kAllToAll},
  };
  return pairs;
}

}  // namespace kizuna::collectives::algotest
