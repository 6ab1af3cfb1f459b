// Deterministic mode (bitwise identical results across algorithms, chunks and channels) and
// heterogeneous splits (work shared by the ranks' reported speeds), through BuildPlan and
// SimulatePlan as algorithms_test.cc.
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
#include "collectives/algorithms/algorithms_test_util.h"
#include "collectives/algorithms/reference.h"
#include "collectives/algorithms/simulate.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/shares.h"
#include "collectives/plan/topology.h"
#include "runtime/core/half.h"

namespace kizuna::collectives {
namespace {

using namespace algotest;  // NOLINT(build/namespaces): the helpers of these tests

// ---- Deterministic mode ----------------------------------------------------------------------

std::vector<Algorithm> ReductionAlgorithms(Collective coll) {
  std::vector<Algorithm> v;
  for (const auto& [a, c] : SupportedPairs())
    if (c == coll && a != Algorithm::kFused) v.push_back(a);
  return v;
}

// Random non-integer inputs (so the order of additions shows in the low bits).
Fill RandomFill(DataType t, uint32_t seed) {
  return [t, seed](int rank, uint8_t* in, uint64_t n) {
    std::mt19937 gen(seed * 1000 + static_cast<uint32_t>(rank));
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    for (uint64_t i = 0; i < n; ++i) {
      const float v = dist(gen);
      if (t == DataType::kFloat16) {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(in + i * 2, &h, 2);
      } else {
        std::memcpy(in + i * 4, &v, 4);
      }
    }
  };
}

TEST(DeterministicTest, BitwiseIdenticalAcrossAlgorithmsChunksAndChannels) {
  for (int p : {5, 8})
    for (DataType t : {DataType::kFloat32, DataType::kFloat16})
      for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kReduce}) {
        const std::vector<Algorithm> algos = ReductionAlgorithms(coll);
        ASSERT_GE(algos.size(), 2u) << CollectiveName(coll);
        std::vector<Bytes> first;  // the first run's outputs: every other run must equal them
        for (Algorithm algo : algos)
          for (uint64_t chunk : kChunks)
            for (int channels : kChannels) {
              Case c;
              c.coll = coll;
              c.algo = algo;
              c.p = p;
              c.count = 1003;
              c.chunk = chunk;
              c.channels = channels;
              c.dtype = t;
              c.root = p - 2;
              c.in_place = (chunk + static_cast<uint64_t>(channels)) % 2 == 0;
              c.deterministic = true;
              std::vector<Bytes> inputs, before, after;
              ASSERT_TRUE(Simulate(c, RandomFill(t, 7), &inputs, &before, &after));
              // The reference reduces in rank order in float32 and rounds once.
              ASSERT_TRUE(MatchesReference(c, after, reference::Expected(c.Request(), inputs, before)));
              // Reduce writes only the root's output (the others keep what they had).
              const std::vector<Bytes> results =
                  coll == Collective::kReduce ? std::vector<Bytes>{after[static_cast<size_t>(c.root)]} : after;
              if (first.empty()) first = results;
              ASSERT_TRUE(results == first) << c.Name();
            }
      }
}

TEST(DeterministicTest, AvgIsDeterministicToo) {
  std::vector<Bytes> first;
  for (Algorithm algo : ReductionAlgorithms(Collective::kAllReduce)) {
    Case c;
    c.algo = algo;
    c.p = 6;
    c.count = 101;
    c.chunk = 5;
    c.channels = 2;
    c.dtype = DataType::kFloat16;
    c.op = ReduceOp::kAvg;
    c.deterministic = true;
    std::vector<Bytes> inputs, before, after;
    ASSERT_TRUE(Simulate(c, RandomFill(c.dtype, 3), &inputs, &before, &after));
    if (first.empty()) first = after;
    EXPECT_TRUE(after == first) << c.Name();
    // The sum divided before its one rounding (Step::average), as the reference and the fused
    // algorithm round it: bit for bit, no tolerance.
    EXPECT_TRUE(after == reference::Expected(c.Request(), inputs, before)) << c.Name();
  }
}

// Without deterministic mode the order differs between algorithms, and the check above would
// notice: ring and rhd at 7 ranks disagree in some bit of a float32 sum, and at least one of
// them disagrees with the rank-order reference.
TEST(DeterministicTest, OrderDiffersWithoutIt) {
  std::vector<std::vector<Bytes>> results;
  std::vector<Bytes> want;
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kRhd}) {
    Case c;
    c.algo = algo;
    c.p = 7;
    c.count = 1003;
    c.chunk = 64;
    std::vector<Bytes> inputs, before, after;
    ASSERT_TRUE(Simulate(c, RandomFill(DataType::kFloat32, 11), &inputs, &before, &after));
    want = reference::Expected(c.Request(), inputs, before);
    results.push_back(after);
  }
  EXPECT_NE(results[0], results[1]);
  EXPECT_TRUE(results[0] != want || results[1] != want);
}

TEST(DeterministicTest, NeedsAFullyConnectedShape) {
  CommTopology ring_only = Full(5);
  for (int a = 0; a < 5; ++a)
    for (int b = 0; b < 5; ++b)
      if (b != (a + 1) % 5) ring_only.link(a, b).reachable = false;
  const CollectiveRequest req{Collective::kAllReduce, 5, 100, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions options;
  ASSERT_TRUE(BuildPlan(Algorithm::kRing, req, ring_only, options, -1).ok());
  options.deterministic = true;
  Result<Plan> plan = BuildPlan(Algorithm::kRing, req, ring_only, options, -1);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(plan.status().message().find("deterministic"), std::string::npos) << plan.status().ToString();
}

// ---- Heterogeneity ----

// Six ranks whose links and devices report speeds; rank 2 reduces 4x slower than the others.
CommTopology SlowReducer() {
  CommTopology shape = Full(6);
  for (RankDesc& r : shape.ranks) r.reduce_gbps = 20;
  shape.ranks[2].reduce_gbps = 5;
  for (int a = 0; a < 6; ++a)
    for (int b = 0; b < 6; ++b)
      if (a != b) shape.link(a, b).gbps = 10;
  return shape;
}

// An AllReduce of `algo` on `shape` gives exact results with the work split by speed and evenly.
void ExpectExactBothWays(Algorithm algo, const CommTopology& shape, uint64_t count, int channels = 1) {
  for (bool balance : {true, false}) {
    Case c;
    c.coll = Collective::kAllReduce;
    c.algo = algo;
    c.p = shape.nranks;
    c.count = count;
    c.chunk = 512;
    c.channels = channels;
    c.shape = shape;
    c.balance = balance;
    EXPECT_TRUE(RunExact(c)) << AlgorithmName(algo) << ", " << shape.nranks << " ranks, balance " << balance;
  }
}

TEST(HeterogeneousTest, PairwiseGivesTheSlowReducerASmallerPart) {
  const CollectiveRequest req{Collective::kAllReduce, 6, 6000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions options;
  options.chunk_count = 512;
  auto plan = BuildPlan(Algorithm::kPairwise, req, SlowReducer(), options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // Part j is reduced by rank j from 6 inputs: weights 20,20,5,20,20,20 give rank 2 a part 4x
  // smaller (285 of 6000 elements, the others 1143).
  const uint64_t slow = ReducedElements(plan->ranks[2]), fast = ReducedElements(plan->ranks[0]);
  EXPECT_GT(fast, 3 * slow) << "rank 0 reduces " << fast << ", rank 2 " << slow;
  options.balance = false;
  auto even = BuildPlan(Algorithm::kPairwise, req, SlowReducer(), options, -1);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(ReducedElements(even->ranks[2]), ReducedElements(even->ranks[0]));
  ExpectExactBothWays(Algorithm::kPairwise, SlowReducer(), 6000);
  // The INFO plan line says so.
  const std::string said = DescribeSplit(Algorithm::kPairwise, req, SlowReducer(), true, {});
  EXPECT_NE(said.find("parts sized so that every rank's reductions and copies take one time: ranks 0-1 "),
            std::string::npos)
      << said;
  EXPECT_NE(said.find(", rank 2 4.8% (5 GB/s), "), std::string::npos) << said;
  EXPECT_EQ(DescribeSplit(Algorithm::kPairwise, req, SlowReducer(), false, {}), "");
}

TEST(HeterogeneousTest, TreesShareTheDataByTheirStreamingRates) {
  for (Collective coll : {Collective::kAllReduce, Collective::kBroadcast, Collective::kReduce}) {
    const CollectiveRequest req{coll, 6, 6000, DataType::kFloat32, ReduceOp::kSum, 1, false};
    PlanOptions options;
    options.chunk_count = 512;
    CommTopology shape = SlowReducer();
    // A slow link too, so that Broadcast (which reduces nothing) sees a difference.
    shape.link(0, 1).gbps = shape.link(1, 0).gbps = 1;
    auto balanced = BuildPlan(Algorithm::kTree, req, shape, options, -1);
    options.balance = false;
    auto even = BuildPlan(Algorithm::kTree, req, shape, options, -1);
    ASSERT_TRUE(balanced.ok() && even.ok());
    EXPECT_NE(PlanToString(*balanced), PlanToString(*even)) << CollectiveName(coll);
    // Equal speeds: balance changes nothing.
    options.balance = true;
    auto uniform = BuildPlan(Algorithm::kTree, req, Full(6), options, -1);
    options.balance = false;
    auto uniform_even = BuildPlan(Algorithm::kTree, req, Full(6), options, -1);
    ASSERT_TRUE(uniform.ok() && uniform_even.ok());
    EXPECT_EQ(PlanToString(*uniform), PlanToString(*uniform_even));
    Case c;
    c.coll = coll;
    c.algo = Algorithm::kTree;
    c.p = 6;
    c.count = 6000;
    c.chunk = 512;
    c.root = 1;
    c.shape = shape;
    EXPECT_TRUE(RunExact(c)) << CollectiveName(coll);
  }
}

// tree AllReduce with half the ranks slow: the slow ones go on the first tree's leaves (inner in
// the second), the first tree carries most of the data, and the slow ranks reduce a fraction of
// what the fast ones do; where every tree had a slow inner node, the split was even.
TEST(HeterogeneousTest, TreesPutTheSlowRanksOnTheFirstTreesLeaves) {
  for (int p : {8, 6}) {
    CommTopology shape = Full(p);
    const int fast_ranks = p / 2;  // the first tree's inner nodes and root: the even labels
    for (int r = 0; r < p; ++r) shape.ranks[static_cast<size_t>(r)].reduce_gbps = r < fast_ranks ? 20 : 5;
    const CollectiveRequest req{Collective::kAllReduce, p, 8000, DataType::kFloat32, ReduceOp::kSum, 0, false};
    PlanOptions options;
    options.chunk_count = 512;
    options.channels = 2;
    auto plan = BuildPlan(Algorithm::kTree, req, shape, options, -1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    uint64_t fast = 0, slow = 0;
    for (int r = 0; r < p; ++r) {
      uint64_t& busiest = r < fast_ranks ? fast : slow;
      busiest = std::max(busiest, ReducedElements(plan->ranks[static_cast<size_t>(r)]));
    }
    EXPECT_LT(3 * slow, fast) << p << " ranks: the busiest slow rank reduces " << slow << ", fast " << fast;
    ExpectExactBothWays(Algorithm::kTree, shape, 8000, /*channels=*/2);
    const std::string said = DescribeSplit(Algorithm::kTree, req, shape, true, {});
    EXPECT_NE(said.find("on the first tree's leaves"), std::string::npos) << said;
  }
}

// rhd AllReduce: blocks sized by their final owners' speeds. Ranks 4-7 of 8 reduce 4x slower:
// at the first halving step each fast rank keeps 4/5 of what it holds (the slow half's blocks
// are a fifth of the data), and reduces 4x as many elements as a slow rank in all.
TEST(HeterogeneousTest, HalvingDoublingSizesBlocksBySpeed) {
  CommTopology shape = Full(8);
  for (int r = 0; r < 8; ++r) shape.ranks[static_cast<size_t>(r)].reduce_gbps = r < 4 ? 20 : 5;
  const CollectiveRequest req{Collective::kAllReduce, 8, 8000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions options;
  options.chunk_count = 512;
  auto plan = BuildPlan(Algorithm::kRhd, req, shape, options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const double fast = static_cast<double>(ReducedElements(plan->ranks[0]));
  const double slow = static_cast<double>(ReducedElements(plan->ranks[5]));
  EXPECT_NEAR(fast / slow, 4.0, 0.1) << fast << " against " << slow;
  options.balance = false;
  auto even = BuildPlan(Algorithm::kRhd, req, shape, options, -1);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(ReducedElements(even->ranks[0]), ReducedElements(even->ranks[5]));
  // Exact results, the fold of a rank count that is not a power of two included.
  ExpectExactBothWays(Algorithm::kRhd, shape, 8000);
  ExpectExactBothWays(Algorithm::kRhd, SlowReducer(), 8000);
}

// Ring AllReduce: rank j reduces every part but part j and copies all but two, so the parts are
// sized by RingWeights' count. One rank of 8 4x slower at copies and reductions: it and the rank
// after it own half the data each, and the slow rank reduces half as much as a fast one. Four of
// 8 slow: no split pays enough (RingWeights' threshold), so the plan is the even one.
TEST(HeterogeneousTest, RingPartsSpareTheSlowRanks) {
  auto shape_with = [](int slow) {
    CommTopology shape = Full(8);
    for (int r = 0; r < 8; ++r)
      shape.ranks[static_cast<size_t>(r)].reduce_gbps = shape.ranks[static_cast<size_t>(r)].copy_gbps =
          r < 8 - slow ? 20 : 5;
    return shape;
  };
  const CollectiveRequest req{Collective::kAllReduce, 8, 8000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions options;
  options.chunk_count = 512;
  const CommTopology one_slow = shape_with(1);
  const std::vector<double> shares = Shares(RingWeights(one_slow, true));
  EXPECT_NEAR(shares[7], 0.5, 0.02);
  EXPECT_NEAR(shares[0], 0.5, 0.02);
  auto plan = BuildPlan(Algorithm::kRing, req, one_slow, options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const double fast = static_cast<double>(ReducedElements(plan->ranks[3]));
  const double slow = static_cast<double>(ReducedElements(plan->ranks[7]));
  EXPECT_NEAR(slow / fast, 0.5, 0.05) << slow << " against " << fast;
  const std::string said = DescribeSplit(Algorithm::kRing, req, one_slow, true, {});
  EXPECT_NE(said.find(": rank 0 50.0% (20 GB/s), ranks 1-6 0.0% each (20 GB/s), rank 7 50.0% (5 GB/s)"),
            std::string::npos)
      << said;
  options.balance = false;
  auto even = BuildPlan(Algorithm::kRing, req, one_slow, options, -1);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ(ReducedElements(even->ranks[3]), ReducedElements(even->ranks[7]));
  options.balance = true;
  auto four_slow = BuildPlan(Algorithm::kRing, req, shape_with(4), options, -1);
  ASSERT_TRUE(four_slow.ok());
  EXPECT_EQ(PlanToString(*four_slow), PlanToString(*even));
  EXPECT_EQ(DescribeSplit(Algorithm::kRing, req, shape_with(4), true, {}), "");
  // Exact results with empty parts, two channels, and 2 and 3 slow ranks.
  ExpectExactBothWays(Algorithm::kRing, one_slow, 8000, /*channels=*/2);
  ExpectExactBothWays(Algorithm::kRing, shape_with(2), 8000);
  ExpectExactBothWays(Algorithm::kRing, shape_with(3), 777);
}

// fused: each rank's part in proportion to its speed (the reduce speed for reductions, the copy
// speed for AllGather and Broadcast), shared by the ranks of one device; even where a speed is
// unknown, the speeds are equal, or balance is off.
TEST(HeterogeneousTest, FusedPartsFollowTheSpeeds) {
  CommTopology shape = SlowReducer();  // rank 2 reduces at 5 GB/s, the others at 20
  shape.direct = true;
  auto bounds = [&](Collective coll, const CommTopology& s, bool balance) {
    const CollectiveRequest req{coll, 6, 6000, DataType::kFloat32, ReduceOp::kSum, 0, false};
    PlanOptions options;
    options.balance = balance;
    auto plan = BuildPlan(Algorithm::kFused, req, s, options, -1);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? plan->ranks[0].fused_bounds : std::vector<uint64_t>{};
  };
  // 20, 20, 5, 20, 20, 20: rank 2 takes 5 / 105 of 6000 elements (285.7), the others 1142.9.
  const std::vector<uint64_t> ar = bounds(Collective::kAllReduce, shape, true);
  ASSERT_EQ(ar.size(), 7u);
  EXPECT_NEAR(static_cast<double>(ar[3] - ar[2]), 285.7, 1.0);
  EXPECT_NEAR(static_cast<double>(ar[1] - ar[0]), 1142.9, 1.0);
  EXPECT_EQ(ar.back(), 6000u);
  const CollectiveRequest ar_req{Collective::kAllReduce, 6, 6000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  const std::string said = DescribeSplit(Algorithm::kFused, ar_req, shape, true, ar);
  EXPECT_NE(said.find("parts by each device's reduce speed: ranks 0-1 "), std::string::npos) << said;
  EXPECT_NE(said.find(", rank 2 4.8% (5 GB/s), ranks 3-5 "), std::string::npos) << said;
  EXPECT_EQ(DescribeSplit(Algorithm::kFused, ar_req, shape, true, {}), "");
  // ReduceScatter cuts its 6 blocks laid end to end.
  EXPECT_EQ(bounds(Collective::kReduceScatter, shape, true).back(), 36000u);
  EXPECT_TRUE(bounds(Collective::kAllReduce, shape, false).empty());
  // Copies: no copy speed known, so even; then rank 4 copies half as fast as the others.
  EXPECT_TRUE(bounds(Collective::kAllGather, shape, true).empty());
  for (RankDesc& r : shape.ranks) r.copy_gbps = 10;
  EXPECT_TRUE(bounds(Collective::kAllGather, shape, true).empty()) << "equal speeds";
  shape.ranks[4].copy_gbps = 5;
  const std::vector<uint64_t> ag = bounds(Collective::kAllGather, shape, true);
  ASSERT_EQ(ag.size(), 7u);
  EXPECT_NEAR(2.0 * static_cast<double>(ag[5] - ag[4]), static_cast<double>(ag[1] - ag[0]), 2.0);
  // Ranks 0 and 1 on one device share it: each gets half of what its speed alone would give.
  CommTopology shared = SlowReducer();
  shared.direct = true;
  for (RankDesc& r : shared.ranks) r.device = "emu:" + std::to_string(&r - shared.ranks.data());
  shared.ranks[1].device = shared.ranks[0].device;
  const std::vector<uint64_t> sh = bounds(Collective::kAllReduce, shared, true);
  ASSERT_EQ(sh.size(), 7u);
  EXPECT_NEAR(static_cast<double>(sh[1] - sh[0]), (sh[4] - sh[3]) / 2.0, 1.0);
  // The plan check refuses bounds that do not cut the work in order.
  const CollectiveRequest req{Collective::kAllReduce, 6, 6000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  RankPlan bad;
  bad.fused_bounds = {0, 10, 5, 20, 30, 40, 6000};
  EXPECT_EQ(ValidateRankPlan(req, bad, 0).code(), StatusCode::kInternal);
  bad.fused_bounds = {0, 6000};
  EXPECT_EQ(ValidateRankPlan(req, bad, 0).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace kizuna::collectives
