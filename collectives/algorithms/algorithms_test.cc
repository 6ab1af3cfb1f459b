// Every algorithm x collective through BuildPlan (all ranks) and SimulatePlan, checked against
// the independent reference (reference.h). Deterministic mode and heterogeneous splits are
// algorithms_order_test.cc; Supports and BuildPlan's argument checks algorithm_test.cc, the
// simulator's own reports simulate_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/algorithms_test_util.h"
#include "collectives/algorithms/reference.h"
#include "collectives/algorithms/simulate.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/rings.h"
#include "collectives/plan/topology.h"
#include "runtime/core/half.h"

namespace kizuna::collectives {
namespace {

using namespace algotest;  // NOLINT(build/namespaces): the helpers of these tests

TEST(AlgorithmsTest, TableIsIndexedByAlgorithm) {
  ASSERT_EQ(AllAlgorithms().size(), static_cast<size_t>(kNumAlgorithms));
  for (int a = 0; a < kNumAlgorithms; ++a) {
    EXPECT_EQ(AllAlgorithms()[static_cast<size_t>(a)]->id(), static_cast<Algorithm>(a));
    EXPECT_EQ(&GetAlgorithm(static_cast<Algorithm>(a)), AllAlgorithms()[static_cast<size_t>(a)]);
  }
}

TEST(AlgorithmsTest, SupportsExactlyTheDocumentedCollectives) {
  for (int a = 0; a < kNumAlgorithms; ++a)
    for (int c = 0; c < kNumCollectives; ++c) {
      const auto algo = static_cast<Algorithm>(a);
      const auto coll = static_cast<Collective>(c);
      CollectiveRequest req{coll, 4, 16, DataType::kFloat32, ReduceOp::kSum, 1, false};
      if (coll == Collective::kBarrier) req.count = 0;
      CommTopology shape = Full(4);
      shape.direct = true;  // fused needs it; nothing else looks at it
      const Status s = GetAlgorithm(algo).Supports(req, shape);
      const bool listed = std::find(SupportedPairs().begin(), SupportedPairs().end(), std::pair(algo, coll)) !=
                          SupportedPairs().end();
      EXPECT_EQ(s.ok(), listed) << AlgorithmName(algo) << " " << CollectiveName(coll) << ": " << s.ToString();
      if (!listed) {
        EXPECT_EQ(s.code(), StatusCode::kNotSupported);
        EXPECT_NE(s.message().find(CollectiveName(coll)), std::string::npos) << s.message();
      }
    }
}

TEST(AlgorithmsTest, FusedNeedsDirectAccessAndCarriesNoSteps) {
  CollectiveRequest req{Collective::kAllReduce, 4, 16, DataType::kFloat32, ReduceOp::kAvg, 0, false};
  const Status s = GetAlgorithm(Algorithm::kFused).Supports(req, Full(4));
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("directly"), std::string::npos) << s.message();
  CommTopology shape = Full(4);
  shape.direct = true;
  PlanOptions options;
  Result<Plan> plan = BuildPlan(Algorithm::kFused, req, shape, options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->request.op, ReduceOp::kAvg);  // divided in its one pass: the executor reads it here
  for (const RankPlan& r : plan->ranks) {
    EXPECT_EQ(r.step_count(), 0u);
    EXPECT_TRUE(r.epilogue.empty());
  }
}

// The structural matrix: every rank count, count, placement, chunk, channel count and window,
// for one (algorithm, collective) pair; dtype x op cycle through all 50 combinations (10 x 5)
// across the matrix, and roots through every rank.
class MatrixTest : public testing::TestWithParam<std::pair<Algorithm, Collective>> {};

TEST_P(MatrixTest, MatchesReference) {
  const auto [algo, coll] = GetParam();
  const bool reduction = IsReduction(coll);
  uint64_t index = 0;
  std::vector<bool> seen(kNumDataTypes * kNumReduceOps, false);
  for (int p : kRankCounts)
    for (uint64_t count : kCounts)
      for (bool in_place : {false, true})
        for (uint64_t chunk : kChunks)
          for (int channels : kChannels)
            for (int window : kWindows) {
              if (coll == Collective::kBarrier && (count != 0 || in_place)) continue;
              if (coll == Collective::kAllToAll && in_place) continue;  // not supported (SupportsTest)
              Case c;
              c.coll = coll;
              c.algo = algo;
              c.p = p;
              c.count = count;
              c.in_place = in_place;
              c.chunk = chunk;
              c.channels = channels;
              c.window = window;
              const uint64_t combo = index++;
              c.dtype = static_cast<DataType>(combo % kNumDataTypes);
              c.op = reduction ? static_cast<ReduceOp>((combo / kNumDataTypes) % kNumReduceOps) : ReduceOp::kSum;
              c.root = static_cast<int>(combo % static_cast<uint64_t>(p));
              seen[static_cast<size_t>(c.dtype) * kNumReduceOps + static_cast<size_t>(c.op)] = true;
              ASSERT_TRUE(RunExact(c));
              // Deterministic mode builds different plans for the reductions: run them over
              // most of the matrix too (the one-element chunks are the slow part, and the chunks
              // of 3 cover the same uneven splits).
              if (reduction && window == 2 && chunk != 1) {
                c.deterministic = true;
                ASSERT_TRUE(RunExact(c));
              }
            }
  for (int t = 0; t < kNumDataTypes; ++t)
    for (int o = 0; o < (reduction ? kNumReduceOps : 1); ++o)
      EXPECT_TRUE(seen[static_cast<size_t>(t * kNumReduceOps + o)])
          << DataTypeName(static_cast<DataType>(t)) << " " << ReduceOpName(static_cast<ReduceOp>(o));
}

std::vector<std::pair<Algorithm, Collective>> SimulatedPairs() {
  std::vector<std::pair<Algorithm, Collective>> v;
  for (const auto& pair : SupportedPairs())
    // p2p pairs ranks; fused has no steps (the executor runs it directly, tests/collectives).
    if (pair.first != Algorithm::kP2p && pair.first != Algorithm::kFused) v.push_back(pair);
  return v;
}

INSTANTIATE_TEST_SUITE_P(All, MatrixTest, testing::ValuesIn(SimulatedPairs()), [](const auto& info) {
  return fmt::format("{}_{}", AlgorithmName(info.param.first), CollectiveName(info.param.second));
});

// Larger and odd communicators, fewer combinations: deeper trees, more fold pairs.
TEST(AlgorithmsTest, LargerCommunicators) {
  for (const auto& [algo, coll] : SimulatedPairs())
    for (int p : {12, 31, 32, 33}) {
      Case c;
      c.coll = coll;
      c.algo = algo;
      c.p = p;
      c.count = coll == Collective::kBarrier ? 0 : 100;
      c.chunk = 7;
      c.channels = 2;
      c.dtype = DataType::kInt32;
      c.root = p / 3;
      ASSERT_TRUE(RunExact(c));
    }
}

// Tree plans follow one global order of transfers (tree.cc), so they need no window at all
// beyond the step in progress.
TEST(AlgorithmsTest, TreesCompleteWithAWindowOfOne) {
  for (Collective coll : {Collective::kAllReduce, Collective::kBroadcast, Collective::kReduce})
    for (int p : kRankCounts)
      for (uint64_t chunk : {uint64_t{1}, uint64_t{3}})
        for (int channels : {1, 2}) {
          Case c;
          c.coll = coll;
          c.algo = Algorithm::kTree;
          c.p = p;
          c.count = 41;
          c.chunk = chunk;
          c.channels = channels;
          c.window = 1;
          c.dtype = DataType::kInt64;
          c.root = p / 2;
          ASSERT_TRUE(RunExact(c));
        }
}

// Building one rank gives exactly that rank of the all-ranks plan, and building is pure.
TEST(AlgorithmsTest, SingleRankPlanEqualsItsPartOfTheWhole) {
  for (const auto& [algo, coll] : SimulatedPairs())
    for (bool deterministic : {false, true}) {
      const CollectiveRequest req{coll, 6, coll == Collective::kBarrier ? 0u : 50u, DataType::kFloat32,
                                  ReduceOp::kAvg, 4, false};
      PlanOptions options;
      options.chunk_count = 4;
      options.channels = 2;
      options.deterministic = deterministic;
      Result<Plan> all = BuildPlan(algo, req, Full(6), options, -1);
      ASSERT_TRUE(all.ok()) << all.status().ToString();
      for (int r = 0; r < 6; ++r) {
        Result<Plan> one = BuildPlan(algo, req, Full(6), options, r);
        ASSERT_TRUE(one.ok()) << one.status().ToString();
        ASSERT_EQ(one->ranks.size(), 1u);
        const RankPlan& a = one->ranks[0];
        const RankPlan& b = all->ranks[static_cast<size_t>(r)];
        EXPECT_EQ(a.rank, r);
        EXPECT_TRUE(a.channels == b.channels && a.epilogue == b.epilogue && a.scratch_count == b.scratch_count &&
                    a.divisor == b.divisor)
            << AlgorithmName(algo) << " " << CollectiveName(coll) << " rank " << r;
      }
    }
}

TEST(AlgorithmsTest, AvgAddsAScaleEpilogueOnTheRanksThatComputeResults) {
  PlanOptions options;
  options.chunk_count = 10;
  const CollectiveRequest reduce{Collective::kReduce, 4, 25, DataType::kFloat32, ReduceOp::kAvg, 2, false};
  Result<Plan> plan = BuildPlan(Algorithm::kRing, reduce, Full(4), options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const RankPlan& rp : plan->ranks) {
    if (rp.rank != 2) {
      EXPECT_TRUE(rp.epilogue.empty()) << rp.rank;
      continue;
    }
    EXPECT_EQ(rp.divisor, 4u);
    uint64_t scaled = 0;
    for (const Step& s : rp.epilogue)
      if (s.kind == StepKind::kScale) {
        EXPECT_LE(s.count(), 10u);
        scaled += s.count();
      }
    EXPECT_EQ(scaled, 25u);  // the whole output, in chunks
  }
  // Other collectives' plans carry no epilogue and the sum's op.
  const CollectiveRequest sum{Collective::kAllReduce, 4, 25, DataType::kFloat32, ReduceOp::kSum, 0, false};
  Result<Plan> plain = BuildPlan(Algorithm::kRing, sum, Full(4), options, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->ranks[0].epilogue.empty());
}

// The ring on shapes without the link r -> r+1 goes round a cycle over the links they have: on a
// 2 x 2 and a 3 x 2 torus of cables (rank = x + X y, neighbours along each dimension only) every
// collective the ring serves matches the reference, each rank sending to one neighbour only.
TEST(AlgorithmsTest, RingGoesRoundATorusOfCables) {
  for (const auto& [X, Y] : {std::pair{2, 2}, std::pair{3, 2}}) {
    const int p = X * Y;
    CommTopology torus = Full(p);
    for (int a = 0; a < p; ++a)
      for (int b = 0; b < p; ++b) {
        const int ax = a % X, ay = a / X, bx = b % X, by = b / X;
        const bool along_x = ay == by && (bx == (ax + 1) % X || ax == (bx + 1) % X);
        const bool along_y = ax == bx && (by == (ay + 1) % Y || ay == (by + 1) % Y);
        if (a != b) torus.link(a, b).reachable = along_x || along_y;
      }
    for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                            Collective::kBroadcast, Collective::kReduce}) {
      Case c;
      c.coll = coll;
      c.algo = Algorithm::kRing;
      c.p = p;
      c.count = 1000;
      c.chunk = 64;
      c.channels = 2;
      c.root = p - 1;
      c.shape = torus;
      EXPECT_TRUE(RunExact(c));
      Result<Plan> plan = BuildPlan(Algorithm::kRing, c.Request(), torus, {}, -1);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      for (int r = 0; r < p; ++r)
        for (const auto& steps : plan->ranks[static_cast<size_t>(r)].channels)
          for (const Step& st : steps) {
            if (st.kind == StepKind::kSend) {
              EXPECT_TRUE(torus.Reachable(r, st.peer)) << r << " -> " << st.peer;
            }
          }
    }
  }
}

// A torus of cables: rank x + X (y + Y z), linked to its neighbours along each dimension only.
CommTopology TorusOfCables(const std::vector<int>& dims) {
  int p = 1;
  for (int d : dims) p *= d;
  CommTopology torus = Full(p);
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      int differ = 0, apart = 0, stride = 1;
      for (int d : dims) {
        const int ca = (a / stride) % d, cb = (b / stride) % d;
        if (ca != cb) {
          ++differ;
          apart = (cb - ca + d) % d;
          apart = std::min(apart, d - apart);
        }
        stride *= d;
      }
      torus.link(a, b).reachable = differ == 1 && apart == 1;
    }
  return torus;
}

// An exact AllReduce case of `algo` on `shape` (int32, 1000 elements in chunks of 16).
Case ShapeCase(Algorithm algo, const CommTopology& shape, bool in_place, int channels) {
  Case c;
  c.algo = algo;
  c.p = shape.nranks;
  c.count = 1000;
  c.chunk = 16;
  c.channels = channels;
  c.in_place = in_place;
  c.dtype = DataType::kInt32;
  c.shape = shape;
  return c;
}

// The torus algorithm on tori of cables of one to three dimensions (a ring out of rank order as
// well): the reference's results for AllReduce and AllToAll (which forwards through the ranks in
// between), sends to neighbours only, and with two channels asked for, 2k AllReduce channels whose
// first sends leave over 2k different ports wherever the lines are longer than 2.
TEST(AlgorithmsTest, TorusGoesAlongEveryDimensionBothWays) {
  CommTopology ring = Full(5);  // cabled 0-2-4-1-3-0
  for (int a = 0; a < 5; ++a)
    for (int b = 0; b < 5; ++b) ring.link(a, b).reachable = a != b && ((b - a + 5) % 5 == 2 || (a - b + 5) % 5 == 2);
  std::vector<std::pair<std::vector<int>, CommTopology>> shapes = {{{5}, ring}};
  for (const std::vector<int>& dims :
       std::vector<std::vector<int>>{{2, 2}, {2, 4}, {3, 3}, {4, 3}, {2, 2, 2}, {3, 3, 2}})
    shapes.emplace_back(dims, TorusOfCables(dims));
  for (const auto& [dims, shape] : shapes) {
    const Torus t = FindTorus(shape);
    EXPECT_EQ(t.dims, dims);
    const int p = shape.nranks;
    for (bool in_place : {false, true})
      for (int channels : {1, 2}) {
        Case c = ShapeCase(Algorithm::kTorus, shape, in_place, channels);
        EXPECT_TRUE(RunExact(c)) << fmt::format("{}", fmt::join(dims, "x"));
        if (in_place) continue;
        c.coll = Collective::kAllToAll;
        c.count = 37;
        c.chunk = 8;
        EXPECT_TRUE(RunExact(c)) << fmt::format("alltoall {}", fmt::join(dims, "x"));
        Result<Plan> a2a = BuildPlan(Algorithm::kTorus, c.Request(), shape, {}, -1);
        ASSERT_TRUE(a2a.ok()) << a2a.status().ToString();
        for (int r = 0; r < p; ++r)
          for (const auto& steps : a2a->ranks[static_cast<size_t>(r)].channels)
            for (const Step& st : steps)
              EXPECT_TRUE(st.peer < 0 || shape.Reachable(r, st.peer)) << r << " -> " << st.peer;
      }
    PlanOptions options;
    options.channels = 2;
    options.chunk_count = 64;
    const CollectiveRequest req{Collective::kAllReduce, p, 4096, DataType::kFloat32, ReduceOp::kSum, 0, false};
    Result<Plan> plan = BuildPlan(Algorithm::kTorus, req, shape, options, -1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(plan->ranks[static_cast<size_t>(r)].channels.size(), 2 * dims.size());
      std::set<int> first;
      for (const auto& steps : plan->ranks[static_cast<size_t>(r)].channels) {
        ASSERT_FALSE(steps.empty());
        for (const Step& st : steps) EXPECT_TRUE(st.peer < 0 || shape.Reachable(r, st.peer)) << r << " -> " << st.peer;
        for (const Step& st : steps)
          if (st.kind == StepKind::kSend) {
            first.insert(st.peer);
            break;
          }
      }
      const bool long_lines = std::all_of(dims.begin(), dims.end(), [](int d) { return d > 2; });
      if (long_lines) {
        EXPECT_EQ(first.size(), 2 * dims.size()) << "rank " << r;
      }
    }
  }
  // No torus and no ring: not supported, saying why.
  CommTopology line = Full(3);
  line.link(0, 2).reachable = line.link(2, 0).reachable = false;
  const CollectiveRequest req{Collective::kAllReduce, 3, 10, DataType::kFloat32, ReduceOp::kSum, 0, false};
  const Status s = GetAlgorithm(Algorithm::kTorus).Supports(req, line);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_NE(s.message().find("no torus"), std::string::npos) << s.message();
}

// The cycles algorithm on tori of cables whose dimensions of 2 bundle two cables per pair (twice the
// speed, as kizuna-topo cables them): two cycles through every rank that use no cable twice, the
// reference's AllReduce, sends to neighbours only; not supported where the cables hold no two.
TEST(AlgorithmsTest, CyclesGoRoundTwoCyclesThatShareNoCable) {
  for (const std::vector<int>& dims : std::vector<std::vector<int>>{{2, 4}, {4, 4}, {3, 3}, {4, 2}, {3, 4}}) {
    CommTopology shape = TorusOfCables(dims);
    const int p = shape.nranks;
    for (int a = 0; a < p; ++a)
      for (int b = 0; b < p; ++b) {
        LinkDesc& l = shape.link(a, b);
        if (!l.reachable) continue;
        // Neighbours along a dimension of 2 are so both ways round: two cables.
        int stride = 1, cables = 1;
        for (int d : dims) {
          if ((a / stride) % d != (b / stride) % d && d == 2) cables = 2;
          stride *= d;
        }
        l.gbps = cables;
      }
    // Speeds unknown, the cables counted (FabricDeviceProperties::cables): the same two cycles.
    CommTopology counted = shape;
    for (LinkDesc& l : counted.links) {
      l.cables = static_cast<int>(l.gbps);
      l.gbps = 0;
    }
    EXPECT_EQ(DisjointCycles(counted), DisjointCycles(shape)) << fmt::format("{}", fmt::join(dims, "x"));
    const std::vector<std::vector<int>> cycles = DisjointCycles(shape);
    ASSERT_EQ(cycles.size(), 2u) << fmt::format("{}", fmt::join(dims, "x"));
    std::map<std::pair<int, int>, int> used;
    for (const std::vector<int>& cycle : cycles) {
      ASSERT_EQ(static_cast<int>(cycle.size()), p);
      EXPECT_EQ(std::set<int>(cycle.begin(), cycle.end()).size(), static_cast<size_t>(p)) << "every rank once";
      for (int i = 0; i < p; ++i) {
        const int a = cycle[static_cast<size_t>(i)], b = cycle[static_cast<size_t>((i + 1) % p)];
        ASSERT_TRUE(shape.Reachable(a, b)) << a << " - " << b;
        ++used[{std::min(a, b), std::max(a, b)}];
      }
    }
    for (const auto& [pair, n] : used)
      EXPECT_LE(n, static_cast<int>(shape.link(pair.first, pair.second).gbps))
          << pair.first << " - " << pair.second << " in " << fmt::format("{}", fmt::join(dims, "x"));
    for (bool in_place : {false, true})
      for (int channels : {1, 2})
        EXPECT_TRUE(RunExact(ShapeCase(Algorithm::kCycles, shape, in_place, channels)))
            << fmt::format("{}", fmt::join(dims, "x"));
    PlanOptions options;
    options.channels = 2;
    options.chunk_count = 64;
    const CollectiveRequest req{Collective::kAllReduce, p, 4096, DataType::kFloat32, ReduceOp::kSum, 0, false};
    Result<Plan> plan = BuildPlan(Algorithm::kCycles, req, shape, options, -1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(plan->ranks[static_cast<size_t>(r)].channels.size(), 4u);
      for (const auto& steps : plan->ranks[static_cast<size_t>(r)].channels)
        for (const Step& st : steps) EXPECT_TRUE(st.peer < 0 || shape.Reachable(r, st.peer)) << r << " -> " << st.peer;
    }
  }
  // A ring of cables, and a 2 x 2 torus whose links are all bundles alike: one cycle only.
  const CollectiveRequest req{Collective::kAllReduce, 4, 10, DataType::kFloat32, ReduceOp::kSum, 0, false};
  for (const CommTopology& shape : {TorusOfCables({4}), TorusOfCables({2, 2})}) {
    const Status s = GetAlgorithm(Algorithm::kCycles).Supports(req, shape);
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_NE(s.message().find("no two cycles"), std::string::npos) << s.message();
  }
}

// Pairwise's channels start their rounds at different distances: on a mesh with a link per pair,
// a rank's channels then send over different links at a time rather than queueing on one.
TEST(AlgorithmsTest, PairwiseChannelsTalkToDifferentPeersAtATime) {
  for (Collective coll : {Collective::kAllReduce, Collective::kAllGather, Collective::kAllToAll}) {
    const int p = 8;
    PlanOptions options;
    options.channels = 2;
    const CollectiveRequest req{coll, p, 4096, DataType::kFloat32, ReduceOp::kSum, 0, false};
    Result<Plan> plan = BuildPlan(Algorithm::kPairwise, req, Full(p), options, -1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (int r = 0; r < p; ++r) {
      std::vector<int> first;  // each channel's first peer it sends to
      for (const auto& steps : plan->ranks[static_cast<size_t>(r)].channels)
        for (const Step& s : steps)
          if (s.kind == StepKind::kSend) {
            first.push_back(s.peer);
            break;
          }
      ASSERT_EQ(first.size(), 2u);
      EXPECT_EQ(first[0], (r + 1) % p) << CollectiveName(coll);
      EXPECT_EQ(first[1], (r + 1 + (p - 1) / 2) % p) << CollectiveName(coll);
    }
  }
}

// ---- Send / Recv -----------------------------------------------------------------------------

// A Send plan and the matching Recv plan are one Plan's worth of steps each (a Plan holds one
// request), so the pair is matched here: per channel, the k-th send is the k-th receive.
TEST(AlgorithmsTest, SendAndRecvMatchChunkByChunk) {
  for (int p : {2, 5})
    for (uint64_t count : kCounts)
      for (uint64_t chunk : kChunks)
        for (int channels : kChannels) {
          const int from = p - 1, to = p / 2 - (p == 2 ? 1 : 0);
          PlanOptions options;
          options.chunk_count = chunk;
          options.channels = channels;
          const CollectiveRequest send{Collective::kSend, p, count, DataType::kUint8, ReduceOp::kSum, to, false};
          const CollectiveRequest recv{Collective::kRecv, p, count, DataType::kUint8, ReduceOp::kSum, from, false};
          Result<Plan> s = BuildPlan(Algorithm::kP2p, send, Full(p), options, from);
          Result<Plan> r = BuildPlan(Algorithm::kP2p, recv, Full(p), options, to);
          ASSERT_TRUE(s.ok() && r.ok()) << s.status().ToString() << r.status().ToString();
          const RankPlan& sp = s->ranks[0];
          const RankPlan& rp = r->ranks[0];
          ASSERT_EQ(sp.channels.size(), rp.channels.size());
          Bytes in(count), out(count, kSentinel);
          for (uint64_t i = 0; i < count; ++i) in[i] = static_cast<uint8_t>(i * 37 + 11);
          for (size_t c = 0; c < sp.channels.size(); ++c) {
            const auto& a = sp.channels[c];
            const auto& b = rp.channels[c];
            ASSERT_EQ(a.size(), b.size());
            for (size_t k = 0; k < a.size(); ++k) {
              ASSERT_EQ(a[k].kind, StepKind::kSend);
              ASSERT_EQ(a[k].peer, to);
              ASSERT_EQ(b[k].kind, StepKind::kRecv);
              ASSERT_EQ(b[k].peer, from);
              ASSERT_EQ(a[k].count(), b[k].count());
              ASSERT_LE(a[k].count(), chunk);
              std::memcpy(out.data() + b[k].dst.offset, in.data() + a[k].srcs[0].offset, a[k].count());
            }
          }
          EXPECT_EQ(out, in) << "p=" << p << " count=" << count << " chunk=" << chunk << " channels=" << channels;
          // Built for every rank: each other rank sends to the peer, which itself does nothing.
          Result<Plan> every = BuildPlan(Algorithm::kP2p, send, Full(p), options, -1);
          ASSERT_TRUE(every.ok());
          EXPECT_EQ(every->ranks[static_cast<size_t>(to)].step_count(), 0u);
        }
}

}  // namespace
}  // namespace kizuna::collectives
