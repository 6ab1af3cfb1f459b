// One block simulated for all (symmetry.h) against every rank simulated, and the flow table's
// incremental sharing against the shares worked out by hand.
#include "tools/sim/symmetry.h"

#include <cmath>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/cost/model.h"
#include "tools/sim/flows.h"
#include "tools/sim/network.h"
#include "tools/sim/timed_run.h"

namespace kizuna::sim {
namespace {

using collectives::Algorithm;
using collectives::Collective;
using collectives::CollectiveRequest;
using collectives::CommTopology;

Network Rails(int hosts, int per_host, int nics) {
  NetworkSpec s;
  s.kind = "rails";
  s.hosts = hosts;
  s.per_host = per_host;
  s.nics = nics;
  auto net = Network::Build(s);
  EXPECT_TRUE(net.ok()) << net.status().ToString();
  return std::move(*net);
}

CommTopology HostsOf(int ranks, int per_host) {
  collectives::LinkDesc l;
  l.reachable = true;
  l.gbps = 25;
  l.latency_us = 2;
  CommTopology shape = CommTopology::Uniform(ranks, collectives::RankDesc{}, l);
  for (int r = 0; r < ranks; ++r) shape.ranks[static_cast<size_t>(r)].host_id = "host" + std::to_string(r / per_host);
  return shape;
}

struct Pair {
  TimedResult whole, block0;
  std::string how;
};

// The same plan run over every rank and over block 0 alone.
Pair RunBoth(Algorithm a, Collective c, const Network& net, int per_host, uint64_t count) {
  const int p = net.ranks();
  CollectiveRequest req{c, p, count, DataType::kFloat32, ReduceOp::kSum, 0, false};
  collectives::PlanOptions options;
  options.chunk_count = 1u << 17;
  options.channels = 2;
  const CommTopology shape = HostsOf(p, per_host);
  Pair out;
  std::string none;
  auto whole = RunAlgorithm(a, req, shape, options, net, DeviceModel{}, collectives::CostConstants{}, false, &none);
  auto block0 = RunAlgorithm(a, req, shape, options, net, DeviceModel{}, collectives::CostConstants{}, true, &out.how);
  EXPECT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(block0.ok()) << block0.status().ToString();
  EXPECT_TRUE(none.empty());
  if (whole.ok()) out.whole = *whole;
  if (block0.ok()) out.block0 = *block0;
  return out;
}

TEST(RankGroup, MovesBlocksAndUndoesIt) {
  const RankGroup torus(RankGroup::Op::kAdd, 2, {4, 3});  // 12 blocks of 2 ranks on a 4 x 3 grid
  EXPECT_EQ(torus.ranks(), 24);
  EXPECT_EQ(torus.ApplyBlock(1, 3), 0);     // (3, 0) + (1, 0) wraps to (0, 0)
  EXPECT_EQ(torus.ApplyBlock(4, 9), 1);     // (1, 2) + (0, 1) wraps to (1, 0)
  EXPECT_EQ(torus.Apply(5, 1), 2 * 5 + 1);  // block 0 to block 5, local rank 1 kept
  EXPECT_EQ(torus.Generators(), (std::vector<int>{1, 4}));
  for (int e = 0; e < torus.order(); ++e)
    for (int b = 0; b < torus.blocks(); ++b) EXPECT_EQ(torus.ApplyBlock(torus.Inverse(e), torus.ApplyBlock(e, b)), b);
  const RankGroup x(RankGroup::Op::kXor, 8, {8});
  EXPECT_EQ(x.Apply(5, 3), (5 ^ 0) * 8 + 3);
  EXPECT_EQ(x.Apply(5, 8 * 6 + 1), (6 ^ 5) * 8 + 1);
  EXPECT_EQ(x.Generators(), (std::vector<int>{1, 2, 4}));
}

TEST(Network, RailsHostsFormOrbitsAndTheSpineStaysPut) {
  const Network net = Rails(4, 2, 2);
  ASSERT_FALSE(net.Symmetries().empty());
  const RankGroup& g = net.Symmetries().front();
  EXPECT_EQ(g.unit(), 2);
  EXPECT_EQ(g.blocks(), 4);
  const Network::Orbits o = net.LinkOrbits(g);
  for (size_t l = 0; l < net.links().size(); ++l) {
    const std::string& name = net.links()[l].name;
    const bool spine = name.find("spine") != std::string::npos;
    EXPECT_EQ(o.size[l], spine ? 1 : 4) << name;
    const std::string& canon = net.links()[static_cast<size_t>(o.canon[l])].name;
    if (spine) {
      EXPECT_EQ(canon, name);
    } else {
      EXPECT_NE(canon.find("h0."), std::string::npos) << name << " stands for " << canon;
    }
  }
}

// Ring, halving-doubling, recursive doubling, pairwise and the hierarchical algorithms look the same
// from every host of a rails cluster (hosts shifted, or XORed): block 0 alone gives every figure
// of the whole run. Two NICs per host make some routes cross the spine.
TEST(Symmetry, OneHostStandsForEveryHost) {
  for (int nics : {4, 2}) {
    const Network net = Rails(8, 4, nics);
    for (Algorithm a : {Algorithm::kRing, Algorithm::kRhd, Algorithm::kRd, Algorithm::kPairwise, Algorithm::kHierRing,
                        Algorithm::kHierRd}) {
      const Pair r = RunBoth(a, Collective::kAllReduce, net, 4, 1u << 19);
      const std::string what = fmt::format("{} with {} NICs", collectives::AlgorithmName(a), nics);
      EXPECT_FALSE(r.how.empty()) << what;
      EXPECT_NEAR(r.block0.seconds, r.whole.seconds, r.whole.seconds * 1e-6) << what;
      EXPECT_EQ(r.block0.flows, r.whole.flows) << what;
      EXPECT_EQ(r.block0.simulated_flows * 8, r.whole.flows) << what;
      EXPECT_NEAR(r.block0.network_bytes, r.whole.network_bytes, r.whole.network_bytes * 1e-6) << what;
      EXPECT_NEAR(r.block0.bottleneck_busy, r.whole.bottleneck_busy, 1e-6) << what;
    }
    for (Collective c : {Collective::kAllGather, Collective::kReduceScatter}) {
      const Pair r = RunBoth(Algorithm::kRing, c, net, 4, 1u << 16);
      EXPECT_FALSE(r.how.empty());
      EXPECT_NEAR(r.block0.seconds, r.whole.seconds, r.whole.seconds * 1e-6) << collectives::CollectiveName(c);
    }
  }
}

// A fat tree of 4 leaves of 2 hosts: whole leaves shifted map it onto itself, and one leaf stands
// for all. Oversubscribed 4:1, the leaves' uplinks limit pairwise, whose every rank sends to every
// other leaf, more than the hierarchical ring, whose hosts' rings cross a leaf's uplink only
// between neighbouring hosts.
TEST(Symmetry, FatTreeLeavesStandForEachOther) {
  NetworkSpec s;
  s.kind = "fat-tree";
  s.hosts = 8;
  s.per_host = 4;
  s.nics = 4;
  s.leaf_hosts = 2;
  auto open = Network::Build(s);
  s.oversubscription = 4;
  auto thin = Network::Build(s);
  ASSERT_TRUE(open.ok() && thin.ok()) << open.status().ToString();
  ASSERT_FALSE(thin->Symmetries().empty());
  EXPECT_EQ(thin->Symmetries().front().unit(), 8);
  const Pair pairwise_open = RunBoth(Algorithm::kPairwise, Collective::kAllReduce, *open, 4, 1u << 22);
  const Pair pairwise_thin = RunBoth(Algorithm::kPairwise, Collective::kAllReduce, *thin, 4, 1u << 22);
  const Pair hier_open = RunBoth(Algorithm::kHierRing, Collective::kAllReduce, *open, 4, 1u << 22);
  const Pair hier_thin = RunBoth(Algorithm::kHierRing, Collective::kAllReduce, *thin, 4, 1u << 22);
  for (const Pair* r : {&pairwise_open, &pairwise_thin, &hier_open, &hier_thin}) {
    EXPECT_FALSE(r->how.empty());
    EXPECT_NEAR(r->block0.seconds, r->whole.seconds, r->whole.seconds * 1e-6);
  }
  EXPECT_GT(pairwise_thin.whole.seconds, 1.8 * pairwise_open.whole.seconds);
  EXPECT_NE(pairwise_thin.whole.bottleneck.find("spine"), std::string::npos) << pairwise_thin.whole.bottleneck;
  EXPECT_GT(pairwise_thin.whole.seconds / pairwise_open.whole.seconds,
            1.2 * hier_thin.whole.seconds / hier_open.whole.seconds);
}

// Where the ranks differ by more than their place, every rank is simulated: the double binary
// tree gives each host its own position, and a count smaller than the ranks leaves some empty.
TEST(Symmetry, PlansThatDifferByHostRunWhole) {
  const Network net = Rails(8, 4, 4);
  const Pair tree = RunBoth(Algorithm::kTree, Collective::kAllReduce, net, 4, 1u << 18);
  EXPECT_TRUE(tree.how.empty()) << tree.how;
  EXPECT_EQ(tree.block0.seconds, tree.whole.seconds);
  const Pair few = RunBoth(Algorithm::kRing, Collective::kAllReduce, net, 4, 20);
  EXPECT_TRUE(few.how.empty()) << few.how;
}

// Two flows into one link share it; the third, elsewhere, keeps its own; a flow that starts later
// takes its share from then on and the first speeds up again when it ends.
TEST(FlowTable, SharesWhereFlowsMeetAndOnlyThere) {
  NetworkSpec s;
  s.kind = "switch";
  s.ranks = 4;
  s.link_gbps = 1;
  s.latency_us = 0;
  auto net = Network::Build(s);
  ASSERT_TRUE(net.ok());
  auto load = [&](int a, int b) {
    FlowTable::Load l;
    for (int link : net->Route(a, b)) l.emplace_back(link, 1.0);
    return l;
  };
  const FlowTable::Load to1 = load(0, 1), also_to1 = load(2, 1), to0 = load(3, 0);
  FlowTable t(*net, false);
  t.Add(0, 1e9, &to1, 0);
  t.Add(0, 1e9, &also_to1, 1);
  const size_t alone = t.Add(0, 1e9, &to0, 2);
  t.Share(0);
  EXPECT_NEAR(t.NextEnd(), 1.0, 1e-9);
  EXPECT_EQ(t.TakeEnded(1.0), std::vector<size_t>{alone});
  t.Share(1.0);
  EXPECT_NEAR(t.NextEnd(), 2.0, 1e-9);
  EXPECT_EQ(t.TakeEnded(2.0).size(), 2u);
  EXPECT_EQ(t.active(), 0u);

  FlowTable u(*net, false);
  u.Add(0, 1e9, &to1, 0);
  u.Share(0);
  EXPECT_NEAR(u.NextEnd(), 1.0, 1e-9);
  u.Add(0.5, 1e9, &also_to1, 1);  // half of the first is through: the rest at half speed
  u.Share(0.5);
  EXPECT_NEAR(u.NextEnd(), 1.5, 1e-9);
  EXPECT_EQ(u.TakeEnded(1.5).size(), 1u);
  u.Share(1.5);
  EXPECT_NEAR(u.NextEnd(), 2.0, 1e-9);  // the second: 0.5 GB moved, the rest alone
  EXPECT_EQ(u.TakeEnded(2.0).size(), 1u);
  EXPECT_NEAR(u.link_bytes()[static_cast<size_t>(to1.back().first)], 2e9, 1);  // sw->r1 carried both
}

}  // namespace
}  // namespace kizuna::sim
