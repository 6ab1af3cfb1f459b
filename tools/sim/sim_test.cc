#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/cost/model.h"
#include "tools/sim/network.h"
#include "tools/sim/timed_run.h"

namespace kizuna::sim {
namespace {

using collectives::Algorithm;
using collectives::Collective;
using collectives::CollectiveRequest;
using collectives::CommTopology;

// Devices and the executor too fast to matter: the network alone sets the time.
DeviceModel Instant() {
  DeviceModel d;
  d.copy_gbps = d.reduce_gbps = 1e9;
  d.launch_us = 1e-9;
  d.message_us = d.step_us = 0;
  return d;
}

// `ranks` on a network of one `kind` (switch, full, ring), every link alike.
Result<Network> Uniform(const std::string& kind, int ranks, double gbps, double latency_us) {
  NetworkSpec s;
  s.kind = kind;
  s.ranks = ranks;
  s.link_gbps = gbps;
  s.latency_us = latency_us;
  return Network::Build(s);
}

CommTopology AllLinked(int p) {
  collectives::LinkDesc l;
  l.reachable = true;
  return CommTopology::Uniform(p, collectives::RankDesc{}, l);
}

Result<TimedResult> Simulate(Algorithm a, Collective c, int p, uint64_t count, const Network& net,
                             uint64_t chunk = 1u << 30, const CommTopology* shape = nullptr) {
  CollectiveRequest req{c, p, count, DataType::kFloat32, ReduceOp::kSum, 0, false};
  collectives::PlanOptions options;
  options.chunk_count = chunk;
  const CommTopology all = AllLinked(p);
  auto plan = collectives::BuildPlan(a, req, shape ? *shape : all, options, -1);
  if (!plan.ok()) return plan.status();
  return RunTimed(*plan, net, Instant(), collectives::CostConstants{});
}

TEST(Network, RoutesFollowTheShape) {
  NetworkSpec s;
  s.kind = "torus2d";
  s.dims = {4, 4};
  auto t = Network::Build(s);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->ranks(), 16);
  EXPECT_EQ(t->Route(0, 1).size(), 1u);
  EXPECT_EQ(t->Route(0, 3).size(), 1u);   // wraps around
  EXPECT_EQ(t->Route(0, 10).size(), 4u);  // two hops along x, two along y
  s.kind = "rails";
  s.hosts = 2;
  s.per_host = 4;
  s.nics = 4;
  auto r = Network::Build(s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Route(0, 1).size(), 2u);  // through the host switch
  EXPECT_EQ(r->Route(0, 4).size(), 4u);  // accelerator, NIC, rail switch, NIC, accelerator
  EXPECT_EQ(r->Route(0, 5).size(), 6u);  // another rail: through the spine
  s.kind = "mesh";
  EXPECT_FALSE(Network::Build(s).ok());
}

// Two ranks on a switch exchanging halves (ring AllReduce of 2): two rounds, each half the data
// over two links each way at the link's rate, plus the route's latency.
TEST(TimedRun, ATransferTakesItsBytesOverTheBandwidthPlusTheLatency) {
  auto net = Uniform("switch", 2, 10, 5);
  ASSERT_TRUE(net.ok());
  const uint64_t count = 1u << 20;  // 4 MiB
  auto r = Simulate(Algorithm::kRing, Collective::kAllReduce, 2, count, *net);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double round = 2 * 5e-6 + (count * 4.0 / 2) / 10e9;
  EXPECT_NEAR(r->seconds, 2 * round, 2 * round * 0.01);
  EXPECT_NEAR(r->bottleneck_busy, (2 * count * 4.0 / 2 / 10e9) / r->seconds, 0.01);
}

// Four ranks on a switch exchanging blocks (pairwise AllToAll): whatever the rounds, each rank's
// one link carries its three outgoing blocks, so the run takes at least their bytes over it.
TEST(TimedRun, FlowsOnOneLinkShareIt) {
  auto net = Uniform("switch", 4, 10, 0);
  ASSERT_TRUE(net.ok());
  auto a2a = Simulate(Algorithm::kPairwise, Collective::kAllToAll, 4, 1u << 18, *net);
  ASSERT_TRUE(a2a.ok()) << a2a.status().ToString();
  // Every rank sends 3 blocks of 1 MiB and receives 3: at least 3 MiB over each rank's links.
  EXPECT_GE(a2a->seconds, 3 * (1u << 20) / 10e9 * 0.999);
  EXPECT_GT(a2a->bottleneck_busy, 0.9);
}

// FIFO links carry one flow at a time, in the order the sends started. Recursive doubling on two
// channels over a full mesh: fair sharing ends both channels' transfers of a round together, a
// FIFO cable ends the first channel's first, which goes on to the next round on another cable
// while the second still uses this one; the rounds overlap.
TEST(TimedRun, FifoLinksLetChannelsRunAhead) {
  auto net = Uniform("full", 4, 1, 0);
  ASSERT_TRUE(net.ok());
  CollectiveRequest req{Collective::kAllReduce, 4, 1u << 18, DataType::kFloat32, ReduceOp::kSum, 0, false};
  collectives::PlanOptions options;
  options.chunk_count = 1u << 17;
  options.channels = 2;
  auto plan = collectives::BuildPlan(Algorithm::kRd, req, AllLinked(4), options, -1);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceModel fifo = Instant();
  fifo.fifo = true;
  auto fair = RunTimed(*plan, *net, Instant(), collectives::CostConstants{});
  auto turn = RunTimed(*plan, *net, fifo, collectives::CostConstants{});
  ASSERT_TRUE(fair.ok() && turn.ok());
  const double round = (1u << 20) / 1e9;  // 1 MiB each way per round, two rounds
  EXPECT_NEAR(fair->seconds, 2 * round, 2 * round * 0.01);
  EXPECT_NEAR(turn->seconds, 1.5 * round, 1.5 * round * 0.01);
}

// A rail-optimised cluster against the same hosts with one NIC each: the hierarchical AllReduce
// sends each host's data through all its NICs at once in one, through one in the other.
TEST(TimedRun, RailsCarryWhatOneNicCannot) {
  NetworkSpec s;
  s.kind = "rails";
  s.hosts = 2;
  s.per_host = 4;
  s.link_gbps = 25;
  s.nics = 4;
  auto rails = Network::Build(s);
  s.nics = 1;
  auto one = Network::Build(s);
  ASSERT_TRUE(rails.ok() && one.ok());
  CommTopology shape = AllLinked(8);
  for (int r = 0; r < 8; ++r) shape.ranks[static_cast<size_t>(r)].host_id = r < 4 ? "a" : "b";
  const uint64_t count = 16u << 20;
  auto fast = Simulate(Algorithm::kHierRing, Collective::kAllReduce, 8, count, *rails, 1u << 17, &shape);
  auto slow = Simulate(Algorithm::kHierRing, Collective::kAllReduce, 8, count, *one, 1u << 17, &shape);
  ASSERT_TRUE(fast.ok()) << fast.status().ToString();
  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  EXPECT_GT(slow->seconds, 2.5 * fast->seconds) << fast->seconds << " vs " << slow->seconds;
  EXPECT_NE(slow->bottleneck.find("nic0"), std::string::npos) << slow->bottleneck;
}

// Every rank's plan of a pairwise AllReduce of `count` floats in chunks of `chunk`.
Result<collectives::Plan> PairwiseAllReduce(int p, uint64_t count, uint64_t chunk) {
  CollectiveRequest req{Collective::kAllReduce, p, count, DataType::kFloat32, ReduceOp::kSum, 0, false};
  collectives::PlanOptions options;
  options.chunk_count = chunk;
  return collectives::BuildPlan(Algorithm::kPairwise, req, AllLinked(p), options, -1);
}

// Staged transfers copy on both devices; devices that share a host's CPUs take turns on them.
// Pairwise AllReduce of 4 ranks on a switch so fast that the devices alone set the time.
TEST(TimedRun, StagingCopiesAndSharedCpusCostDeviceTime) {
  auto net = Uniform("switch", 4, 1e6, 0);
  ASSERT_TRUE(net.ok());
  auto plan = PairwiseAllReduce(4, 1u << 22, 1u << 20);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceModel d;
  d.copy_gbps = d.reduce_gbps = 1;  // 1 ns a byte
  d.launch_us = 1e-9;
  d.message_us = d.step_us = 0;
  auto run = [&](const DeviceModel& m) {
    auto r = RunTimed(*plan, *net, m, collectives::CostConstants{});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->seconds : 0.0;
  };
  const double plain = run(d);
  d.staged = true;
  const double staged = run(d);
  // Each rank copies in the 3 parts it sends and the 3 results it returns, and copies out the 3
  // results it receives (4 MiB each, 4.2 ms): 9 copies on its device, 12 on the longest chain
  // (a receiver's reduction waits for a copy queued behind the sender's own).
  const double copy = 4.0 * (1u << 20) / 1e9;
  EXPECT_GE(staged - plain, 9 * copy * 0.999) << plain << " " << staged;
  EXPECT_LE(staged - plain, 12 * copy * 1.001) << plain << " " << staged;
  d.host_cpus = 1;
  d.ranks_per_host = 4;
  const double one_cpu = run(d);
  d.host_cpus = 4;
  EXPECT_NEAR(run(d), staged, staged * 1e-9);  // a CPU each: as if unshared
  EXPECT_GT(one_cpu, 3 * staged);              // four devices' work on one CPU
}

// The executors' CPU time per message (message_cpu_us) on the host's CPUs: nothing without
// shared CPUs; on 2 CPUs shared by 8 ranks the messages queue for them, more so the more a
// message copies.
TEST(TimedRun, MessagesTakeTheSharedCpus) {
  auto net = Uniform("full", 8, 1e6, 0);
  ASSERT_TRUE(net.ok());
  auto plan = PairwiseAllReduce(8, 1u << 18, 1u << 17);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto run = [&](int cpus, double message_cpu_us, double copy_gbps) {
    DeviceModel d = Instant();
    d.host_cpus = cpus;
    d.ranks_per_host = 8;
    d.message_cpu_us = message_cpu_us;
    if (copy_gbps > 0) d.copy_gbps = copy_gbps;
    auto r = RunTimed(*plan, *net, d, collectives::CostConstants{});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->seconds : 0.0;
  };
  const double free = run(0, 0, 0);
  EXPECT_EQ(run(0, 100, 0), free);  // no shared CPUs: no CPU work
  // 8 ranks x 14 messages, each 100 us at both ends: 22.4 ms of CPU on 2 CPUs, 11.2 ms at least.
  const double busy = run(2, 100, 0);
  EXPECT_GE(busy, 11.2e-3 * 0.999) << busy;
  EXPECT_LT(run(8, 100, 0), busy);  // a CPU each: less queueing
  // The senders' copies too: 8 x 14 messages of 128 KiB at 1 GB/s, 14.7 ms of CPU, 7.3 ms more
  // on 2 CPUs.
  EXPECT_NEAR(run(2, 100, 1), busy + 7.34e-3, 0.05e-3) << busy;
}

// Every algorithm's plans for every collective it serves complete on a torus, where most pairs
// are several hops apart.
TEST(TimedRun, EveryAlgorithmCompletesOnATorus) {
  NetworkSpec s;
  s.kind = "torus2d";
  s.dims = {3, 2};
  auto net = Network::Build(s);
  ASSERT_TRUE(net.ok());
  int ran = 0;
  for (int a = 0; a < collectives::kNumAlgorithms; ++a)
    for (int c = 0; c < collectives::kNumCollectives; ++c) {
      const auto coll = static_cast<Collective>(c);
      if (collectives::IsPointToPoint(coll) || coll == Collective::kBarrier) continue;
      auto r = Simulate(static_cast<Algorithm>(a), coll, 6, 1000, *net, 128);
      if (!r.ok() && (r.status().code() == StatusCode::kNotSupported ||
                      r.status().message().find("outside their steps") != std::string::npos))
        continue;
      ASSERT_TRUE(r.ok()) << collectives::AlgorithmName(static_cast<Algorithm>(a)) << " "
                          << collectives::CollectiveName(coll) << ": " << r.status().ToString();
      EXPECT_GT(r->seconds, 0);
      ++ran;
    }
  EXPECT_GE(ran, 15);
}

}  // namespace
}  // namespace kizuna::sim
