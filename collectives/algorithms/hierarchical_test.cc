// The hierarchical algorithms (hierarchical.cc) over hosts x ranks shapes, even and uneven, run
// whole in the simulator and compared with the reference; and the structure that makes them worth
// having: a rank talks across hosts only with its rail.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/algorithms/algorithms_test_util.h"
#include "collectives/plan/shares.h"

namespace kizuna::collectives {
namespace {

using namespace algotest;  // NOLINT(build/namespaces): the helpers of these tests

// Ranks on hosts of the given sizes, hosts interleaved when `interleave` (rank r on host
// r mod hosts, as a launcher that deals ranks out round-robin would place them), else in blocks.
CommTopology Hosts(const std::vector<int>& sizes, bool interleave = false) {
  int p = 0;
  for (int s : sizes) p += s;
  CommTopology shape = Full(p);
  std::vector<int> host_of;
  if (interleave) {
    std::vector<int> left = sizes;
    for (size_t h = 0; static_cast<int>(host_of.size()) < p; h = (h + 1) % sizes.size())
      if (left[h] > 0) {
        --left[h];
        host_of.push_back(static_cast<int>(h));
      }
  } else {
    for (size_t h = 0; h < sizes.size(); ++h)
      for (int i = 0; i < sizes[h]; ++i) host_of.push_back(static_cast<int>(h));
  }
  for (int r = 0; r < p; ++r)
    shape.ranks[static_cast<size_t>(r)].host_id = fmt::format("host{}", host_of[static_cast<size_t>(r)]);
  return shape;
}

const std::vector<std::pair<Algorithm, Collective>>& HierPairs() {
  static const std::vector<std::pair<Algorithm, Collective>> pairs = {
      {Algorithm::kHierRing, Collective::kAllReduce}, {Algorithm::kHierRing, Collective::kReduceScatter},
      {Algorithm::kHierRing, Collective::kAllGather}, {Algorithm::kHierRing, Collective::kBroadcast},
      {Algorithm::kHierRing, Collective::kReduce},    {Algorithm::kHierRd, Collective::kAllReduce},
      {Algorithm::kHierRing, Collective::kAllToAll},
  };
  return pairs;
}

const std::vector<std::vector<int>>& Layouts() {
  static const std::vector<std::vector<int>> layouts = {{1, 1}, {2, 2},    {1, 3},          {3, 5},   {2, 3, 1},
                                                        {4, 4}, {2, 2, 2}, {3, 3, 3, 3, 3}, {1, 1, 1}};
  return layouts;
}

class HierMatrixTest : public testing::TestWithParam<std::pair<Algorithm, Collective>> {};

TEST_P(HierMatrixTest, MatchesReference) {
  const auto [algo, coll] = GetParam();
  uint64_t index = 0;
  for (const std::vector<int>& layout : Layouts())
    for (bool interleave : {false, true})
      for (uint64_t count : kCounts)
        for (bool in_place : {false, true})
          for (uint64_t chunk : {uint64_t{1}, uint64_t{3}, uint64_t{64}, kUnlimited})
            for (int channels : {1, 2})
              for (int window : {2, 8}) {
                if (coll == Collective::kAllToAll && in_place) continue;  // not supported
                Case c;
                c.coll = coll;
                c.algo = algo;
                c.shape = Hosts(layout, interleave);
                c.p = c.shape->nranks;
                c.count = count;
                c.in_place = in_place;
                c.chunk = chunk;
                c.channels = channels;
                c.window = window;
                const uint64_t combo = index++;
                c.dtype = static_cast<DataType>(combo % kNumDataTypes);
                c.op =
                    IsReduction(coll) ? static_cast<ReduceOp>((combo / kNumDataTypes) % kNumReduceOps) : ReduceOp::kSum;
                c.root = static_cast<int>(combo % static_cast<uint64_t>(c.p));
                ASSERT_TRUE(RunExact(c)) << "hosts " << fmt::format("{}", fmt::join(layout, "+"))
                                         << (interleave ? " interleaved" : "");
              }
}

INSTANTIATE_TEST_SUITE_P(All, HierMatrixTest, testing::ValuesIn(HierPairs()), [](const auto& info) {
  std::string name = fmt::format("{}_{}", AlgorithmName(info.param.first), CollectiveName(info.param.second));
  for (char& ch : name)
    if (ch == ':' || ch == '/') ch = '_';
  return name;
});

// Up to 8 hosts x 8 ranks, one size each, every hierarchical pair.
TEST(HierarchicalTest, LargerShapes) {
  for (const auto& [algo, coll] : HierPairs())
    for (const std::vector<int>& layout :
         {std::vector<int>(8, 8), std::vector<int>{5, 8, 1, 7}, std::vector<int>(4, 2)}) {
      Case c;
      c.coll = coll;
      c.algo = algo;
      c.shape = Hosts(layout);
      c.p = c.shape->nranks;
      c.count = 300;
      c.chunk = 17;
      c.channels = 2;
      c.dtype = DataType::kInt32;
      c.root = c.p / 3;
      ASSERT_TRUE(RunExact(c)) << fmt::format("{}", fmt::join(layout, "+"));
    }
}

// With equal hosts, rank (host h, local i) sends to other hosts only to local rank i there (its
// rail), and the AllReduce's bytes cross the network once per direction: each rank sends 1/P of
// the data (x 2(H-1)/H for the ring over H hosts).
// hier:fused: the network level simulated between the host level the executor runs
// (SimOptions::host_of), against the reference: even, uneven and interleaved hosts, the leader
// form (one part) and the rail form (a part per 64 KiB up to the widest host's ranks), avg, in
// place, several channels and chunks.
TEST(HierarchicalTest, FusedHostLevelMatchesReference) {
  for (Algorithm algo : {Algorithm::kHierFusedRing, Algorithm::kHierFusedRd})
    for (const std::vector<int>& layout : std::vector<std::vector<int>>{{1, 1}, {2, 2}, {1, 3}, {3, 5}, {2, 3, 1}, {4, 4}})
      for (bool interleave : {false, true})
        for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{1000}, uint64_t{40000}})
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
            for (bool in_place : {false, true}) {
              Case c;
              c.algo = algo;
              c.shape = Hosts(layout, interleave);
              c.shape->host_direct = true;
              c.p = c.shape->nranks;
              c.count = count;
              c.op = op;
              c.in_place = in_place;
              c.channels = count > 100 ? 2 : 1;
              c.chunk = count > 100 ? 997 : kUnlimited;
              EXPECT_TRUE(RunExact(c));
            }
  // ReduceScatter (each rank's blocks summed over its host into its output or scratch) and
  // AllGather (blocks copied from the local rank that received them), every data type.
  uint64_t index = 0;
  for (Collective coll : {Collective::kReduceScatter, Collective::kAllGather})
    for (const std::vector<int>& layout :
         std::vector<std::vector<int>>{{1, 1}, {2, 2}, {1, 3}, {3, 5}, {2, 3, 1}, {4, 4}, {1, 2, 1}})
      for (bool interleave : {false, true})
        for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000}})
          for (bool in_place : {false, true}) {
            Case c;
            c.coll = coll;
            c.algo = Algorithm::kHierFusedRing;
            c.shape = Hosts(layout, interleave);
            c.shape->host_direct = true;
            c.p = c.shape->nranks;
            c.count = count;
            const uint64_t combo = index++;
            c.dtype = static_cast<DataType>(combo % kNumDataTypes);
            if (coll == Collective::kReduceScatter) c.op = static_cast<ReduceOp>((combo / 3) % kNumReduceOps);
            c.in_place = in_place;
            c.channels = count > 100 ? 2 : 1;
            c.chunk = count > 100 ? 97 : kUnlimited;
            EXPECT_TRUE(RunExact(c)) << fmt::format("{}", fmt::join(layout, "+"));
          }
  // A barrier: the host level and the first ranks' tokens complete.
  Case b;
  b.coll = Collective::kBarrier;
  b.algo = Algorithm::kHierFusedRd;
  b.shape = Hosts({2, 3, 1});
  b.shape->host_direct = true;
  b.p = 6;
  EXPECT_TRUE(RunExact(b));
}

// AllReduce split by speed (HierarchicalWeights). Rails: local rank 1 of each of 2 hosts x 2 ranks
// reduces 4x slower, so part 1 (rail 1's) is a fifth of the data, in the rail form and in
// hier:fused's host parts (RankPlan::host_part_weights). Hosts: host 1's
// devices are 4x slower, so in hier:fused each part's ring over the hosts leaves host 1 the
// smaller share to reduce (the rail form keeps its rings even). Uneven hosts (1 + 3): host 0's one
// rank owns all 3 parts, so host 0 counts as a third as fast per part and owns the larger share of
// each ring (a ring member reduces every share but its own). Results exact in every case.
TEST(HierarchicalTest, AllReduceSplitsBySpeed) {
  auto speeds = [](CommTopology shape, auto slow) {
    for (int r = 0; r < shape.nranks; ++r) {
      RankDesc& d = shape.ranks[static_cast<size_t>(r)];
      d.reduce_gbps = d.copy_gbps = slow(r) ? 5 : 20;
    }
    shape.host_direct = true;
    return shape;
  };
  const CommTopology rails = speeds(Hosts({2, 2}), [](int r) { return r % 2 == 1; });
  const CommTopology slow_host = speeds(Hosts({2, 2}), [](int r) { return r >= 2; });
  const CommTopology uneven = speeds(Hosts({1, 3}), [](int) { return false; });
  const CollectiveRequest req{Collective::kAllReduce, 4, 100000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions options;
  options.chunk_count = 1 << 20;
  auto reduced = [&](Algorithm algo, const CommTopology& shape, int rank, bool balance) {
    options.balance = balance;
    auto plan = BuildPlan(algo, req, shape, options, -1);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? static_cast<double>(ReducedElements(plan->ranks[static_cast<size_t>(rank)])) : 0.0;
  };
  // Rails: rank 1 owns 20000 of 100000 elements (weights 20 and 5) against 50000 even.
  EXPECT_NEAR(reduced(Algorithm::kHierRing, rails, 1, true) / reduced(Algorithm::kHierRing, rails, 1, false), 0.4,
              0.02);
  EXPECT_NEAR(reduced(Algorithm::kHierRing, rails, 0, true) / reduced(Algorithm::kHierRing, rails, 0, false), 1.6,
              0.02);
  options.balance = true;
  auto fused = BuildPlan(Algorithm::kHierFusedRing, req, rails, options, -1);
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  EXPECT_EQ(fused->ranks[0].host_part_weights, (std::vector<uint64_t>{1 << 20, 1 << 18}));
  EXPECT_EQ(HostPart(100000, 1, 2, 0, 1, fused->ranks[0].host_part_weights).second, 20000u);
  EXPECT_NEAR(reduced(Algorithm::kHierFusedRing, rails, 1, true) / reduced(Algorithm::kHierFusedRing, rails, 1, false),
              0.4, 0.02);
  // Slow host: in hier:fused its ranks reduce less between hosts, the fast host's more.
  EXPECT_LT(reduced(Algorithm::kHierFusedRing, slow_host, 2, true),
            0.8 * reduced(Algorithm::kHierFusedRing, slow_host, 2, false));
  EXPECT_GT(reduced(Algorithm::kHierFusedRing, slow_host, 0, true),
            1.1 * reduced(Algorithm::kHierFusedRing, slow_host, 0, false));
  EXPECT_EQ(reduced(Algorithm::kHierRing, slow_host, 2, true), reduced(Algorithm::kHierRing, slow_host, 2, false));
  const HierarchicalShares sh = HierarchicalWeights(slow_host, {{0, 1}, {2, 3}}, 2, true, /*fused=*/true);
  EXPECT_TRUE(sh.parts.empty());
  ASSERT_EQ(sh.network.size(), 2u);
  // Uneven hosts of equal devices: host 0's rank owns 3 parts, so it reduces less between hosts.
  const HierarchicalShares un = HierarchicalWeights(uneven, {{0}, {1, 2, 3}}, 3, true, /*fused=*/true);
  ASSERT_EQ(un.network.size(), 3u);
  EXPECT_GT(Shares(un.network[0])[0], Shares(un.network[0])[1]) << "host 0 owns the larger sub-part";
  EXPECT_TRUE(HierarchicalWeights(Hosts({2, 2}), {{0, 1}, {2, 3}}, 2, true, true).network.empty()) << "no speeds known";
  for (const CommTopology& shape : {rails, slow_host, uneven})
    for (Algorithm algo : {Algorithm::kHierRing, Algorithm::kHierRd, Algorithm::kHierFusedRing})
      for (bool balance : {true, false}) {
        Case c;
        c.algo = algo;
        c.shape = shape;
        c.p = shape.nranks;
        c.count = 100007;
        c.chunk = 997;
        c.channels = 2;
        c.balance = balance;
        EXPECT_TRUE(RunExact(c)) << AlgorithmName(algo) << " balance " << balance;
      }
}

TEST(HierarchicalTest, FusedNeedsHostGroupsAndCrossesHostsOncePerPart) {
  const CollectiveRequest req{Collective::kAllReduce, 8, 1u << 20, DataType::kFloat32, ReduceOp::kSum, 0, false};
  CommTopology shape = Hosts({4, 4});
  const Status no_groups = GetAlgorithm(Algorithm::kHierFusedRing).Supports(req, shape);
  EXPECT_EQ(no_groups.code(), StatusCode::kNotSupported);
  EXPECT_NE(no_groups.message().find("do not share their buffers"), std::string::npos) << no_groups.message();
  shape.host_direct = true;
  PlanOptions options;
  options.chunk_count = 1u << 20;
  // 4 MiB: four parts, each rank its rail's; only network steps, only along the rail.
  Result<Plan> plan = BuildPlan(Algorithm::kHierFusedRing, req, shape, options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const RankPlan& rp : plan->ranks) {
    EXPECT_EQ(rp.host_parts, 4u);
    for (const auto& ch : rp.channels)
      for (const Step& s : ch) {
        if (s.peer >= 0) {
          EXPECT_EQ(s.peer, (rp.rank + 4) % 8) << "rank " << rp.rank;
        }
      }
  }
  // 8 bytes: the leader form, one part: the hosts' first ranks alone have steps.
  const CollectiveRequest small{Collective::kAllReduce, 8, 2, DataType::kFloat32, ReduceOp::kSum, 0, false};
  plan = BuildPlan(Algorithm::kHierFusedRd, small, shape, options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const RankPlan& rp : plan->ranks) {
    EXPECT_EQ(rp.host_parts, 1u);
    EXPECT_EQ(rp.step_count() > 0, rp.rank % 4 == 0) << "rank " << rp.rank;
  }
  EXPECT_EQ(GetAlgorithm(Algorithm::kHierFusedRd).Describe(small, shape, 5),
            "host level: mapped memory among the 4 ranks of host 1 (4, 5, 6, 7); network level: recursive "
            "doubling over 2 hosts among the owners of the 1 part(s), none of them this rank's");
  // ReduceScatter and AllGather: the host level is the executor's (its blocks in the plan), the
  // steps only cross hosts, along the rail; hier:fused/rd serves neither.
  for (Collective coll : {Collective::kReduceScatter, Collective::kAllGather}) {
    const CollectiveRequest blocks{coll, 8, 1000, DataType::kFloat32, ReduceOp::kSum, 0, false};
    EXPECT_EQ(GetAlgorithm(Algorithm::kHierFusedRd).Supports(blocks, shape).code(), StatusCode::kNotSupported);
    plan = BuildPlan(Algorithm::kHierFusedRing, blocks, shape, options, -1);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    for (const RankPlan& rp : plan->ranks) {
      // ReduceScatter: its own block and its rail's block of the other host; AllGather: the
      // 6 blocks of the other ranks that it neither has nor received.
      EXPECT_EQ(rp.host_blocks.size(), coll == Collective::kReduceScatter ? 2u : 6u) << "rank " << rp.rank;
      for (const auto& ch : rp.channels)
        for (const Step& s : ch)
          if (s.peer >= 0) {
            EXPECT_EQ(s.peer, (rp.rank + 4) % 8) << "rank " << rp.rank;
          }
    }
  }
}

TEST(HierarchicalTest, AcrossHostsOnlyAlongTheRail) {
  const CommTopology shape = Hosts({4, 4, 4});
  const CollectiveRequest req{Collective::kAllReduce, 12, 1200, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions options;
  options.chunk_count = 1u << 20;
  Result<Plan> plan = BuildPlan(Algorithm::kHierRing, req, shape, options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const RankPlan& rp : plan->ranks) {
    uint64_t across = 0;
    for (const auto& ch : rp.channels)
      for (const Step& s : ch) {
        if (s.kind != StepKind::kSend || s.peer / 4 == rp.rank / 4) continue;
        EXPECT_EQ(s.peer % 4, rp.rank % 4) << "rank " << rp.rank << " sends to rank " << s.peer;
        across += s.count();
      }
    EXPECT_EQ(across, 1200u / 4 * 2 * 2 / 3) << "rank " << rp.rank;
  }
}

TEST(HierarchicalTest, DescribesEachLevel) {
  const CollectiveRequest req{Collective::kAllReduce, 8, 64, DataType::kFloat32, ReduceOp::kSum, 0, false};
  EXPECT_EQ(GetAlgorithm(Algorithm::kHierRing).Describe(req, Hosts({4, 4}), 5),
            "host level: direct exchange among the 4 ranks of host 1 (4, 5, 6, 7); network level: ring over 2 "
            "hosts, with ranks 1, 5 (rail 1: part 1 of 4)");
  const CollectiveRequest small{Collective::kAllReduce, 6, 64, DataType::kFloat32, ReduceOp::kSum, 0, false};
  EXPECT_EQ(GetAlgorithm(Algorithm::kHierRd).Describe(small, Hosts({2, 4}), 0),
            "host level: direct exchange among the 2 ranks of host 0 (0, 1); network level: recursive doubling "
            "over 2 hosts, with ranks 0, 2 (rail 0: parts 0, 2 of 4)");
}

TEST(HierarchicalTest, OneHostAndDeterministicModeAreRefused) {
  const CollectiveRequest req{Collective::kAllReduce, 4, 16, DataType::kFloat32, ReduceOp::kSum, 0, false};
  const Status one = GetAlgorithm(Algorithm::kHierRing).Supports(req, Full(4));
  EXPECT_EQ(one.code(), StatusCode::kNotSupported);
  EXPECT_NE(one.message().find("one host"), std::string::npos) << one.message();
  PlanOptions options;
  options.deterministic = true;
  Result<Plan> plan = BuildPlan(Algorithm::kHierRd, req, Hosts({2, 2}), options, 0);
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(plan.status().message().find("deterministic"), std::string::npos) << plan.status().message();
  CommTopology cut = Hosts({2, 2});
  cut.link(1, 3).reachable = false;  // local rank 1's rail between the two hosts
  const Status rail = GetAlgorithm(Algorithm::kHierRing).Supports(req, cut);
  EXPECT_EQ(rail.code(), StatusCode::kNotSupported);
  EXPECT_NE(rail.message().find("rank 1 cannot reach rank 3"), std::string::npos) << rail.message();
}

}  // namespace
}  // namespace kizuna::collectives
