// The cost model without any transport or device: formulas against values computed by hand (the
// host term's in model_host_test.cc), monotonicity, the regimes the formulas must reproduce (ring
// for large messages, rd and tree for small ones), heterogeneous shapes, unreachable links,
// malformed inputs, determinism, and the constants table.
#include "collectives/cost/model.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/cost/model_test_util.h"

namespace kizuna::collectives {
namespace {

using namespace cost_testing;  // NOLINT: the tests' shared requests and shapes

TEST(CostModelTest, FusedAllReduceByHand) {
  const CostConstants k;
  // 4 ranks, 4096 float32: each rank reads its 1024-element slice of 4 inputs and writes it to 4
  // outputs, 16384 bytes each way, at the copy speed (20 GB/s); one launch (2 us) and the
  // rendezvous; avg is divided in the same pass (no epilogue).
  CollectiveRequest r = Request(Collective::kAllReduce, 4, 4096);
  r.op = ReduceOp::kAvg;
  const CommTopology separate = HandShape(4);  // devices dev0..dev3
  CommTopology one_device = HandShape(4);
  for (int q = 0; q < 4; ++q) one_device.ranks[static_cast<size_t>(q)].device = "dev";
  const Prediction alone = Predict(Algorithm::kFused, r, separate, Options(), k);
  EXPECT_NEAR(alone.alpha_s, 2e-6 + k.direct_rendezvous_us * 1e-6, 1e-12);
  EXPECT_NEAR(alone.gamma_s, 16384 / 20e9, 1e-12);
  EXPECT_EQ(alone.beta_s, 0);
  // The same four ranks on one device share its memory: four times the device time.
  const Prediction shared = Predict(Algorithm::kFused, r, one_device, Options(), k);
  EXPECT_NEAR(shared.gamma_s, 4 * 16384 / 20e9, 1e-12);
  // AllGather of 1024 elements per rank: every rank reads its block of 4096 bytes once and writes
  // it into 4 outputs: (4 + 1) / 2 copied blocks.
  const Prediction gather =
      Predict(Algorithm::kFused, Request(Collective::kAllGather, 4, 1024), separate, Options(), k);
  EXPECT_NEAR(gather.gamma_s, 2.5 * 4096 / 20e9, 1e-12);
  // ReduceScatter of 1024 elements per rank: 4 blocks read, one written: (4 + 1) / 2 copied blocks.
  const Prediction scatter =
      Predict(Algorithm::kFused, Request(Collective::kReduceScatter, 4, 1024), separate, Options(), k);
  EXPECT_NEAR(scatter.gamma_s, 2.5 * 4096 / 20e9, 1e-12);
  EXPECT_FALSE(Predict(Algorithm::kFused, Request(Collective::kAllToAll, 4, 4096), separate, Options(), k).finite());
}

TEST(CostModelTest, RingAllReduceByHand) {
  const CostConstants k;
  // 4 ranks, 4096 float32: parts of 1024 elements = 4096 bytes, one chunk: 3 reduce-scatter and
  // 3 allgather stages.
  const Prediction p = Predict(Algorithm::kRing, Request(Collective::kAllReduce, 4, 4096), HandShape(4), Options(), k);
  ASSERT_TRUE(p.finite()) << p.note;
  const double cpu = 2 * MessageOverhead(k);  // each rank sends one and receives one message
  // Reduce-scatter: latency + the receiver's reduce launch; allgather: latency only.
  const double alpha = 3 * (1e-6 + 2e-6 + cpu) + 3 * (1e-6 + cpu);
  const double beta = 6 * (4096 / 10e9);
  const double gamma = 3 * (2 * 4096 / 40e9);  // 2 inputs read per reduced message
  EXPECT_NEAR(p.alpha_s, alpha, 1e-15);
  EXPECT_NEAR(p.beta_s, beta, 1e-15);
  EXPECT_NEAR(p.gamma_s, gamma, 1e-15);
  EXPECT_NEAR(p.seconds, alpha + beta + gamma, 1e-15);
  EXPECT_NEAR(p.seconds, 23.472e-6, 1e-12);
  EXPECT_EQ(p.stages, 6);
  EXPECT_EQ(p.structure, "reduce-scatter 3 + allgather 3");
}

TEST(CostModelTest, StagedSendWithDefaultsByHand) {
  const CostConstants k;
  // 1 MiB float32 from rank 0 to rank 1 in 4 chunks of 256 KiB over a staged link, every speed
  // unknown: latency 1.1 us, 25 GB/s, staging copies at 28 GB/s at both ends, launch 4.2 us.
  CollectiveRequest r = Request(Collective::kSend, 2, 262144);
  r.root = 1;
  const Prediction p = Predict(Algorithm::kP2p, r, DefaultShape(2), Options(65536), k);
  ASSERT_TRUE(p.finite()) << p.note;
  const double bytes = 262144;
  const double alpha = 4 * (k.unknown_link_latency_us * 1e-6 + 2 * k.unknown_launch_us * 1e-6 + MessageOverhead(k));
  const double beta = 4 * (bytes / (k.unknown_link_gbps * 1e9) + bytes / (k.unknown_copy_gbps * 1e9));
  EXPECT_NEAR(p.alpha_s, alpha, 1e-15);
  EXPECT_NEAR(p.beta_s, beta, 1e-15);
  EXPECT_EQ(p.gamma_s, 0);
  EXPECT_EQ(p.stages, 4);
  EXPECT_NEAR(p.seconds, 120.19e-6, 0.01e-6);
}

TEST(CostModelTest, StagingCopyIsCappedByTheHostLink) {
  CostConstants k;
  // A device that copies at 1500 GB/s (an H100's device-local copy) stages at 55 GB/s: host memory.
  CommTopology fast = CommTopology::Uniform(2, RankDesc{"h", "gpu", 1500, 3000, 4.2}, LinkDesc{true, 2, 50, true});
  CollectiveRequest r = Request(Collective::kRecv, 2, 1 << 20);
  const Prediction p = Predict(Algorithm::kP2p, r, fast, Options(), k);
  const double bytes = 4.0 * (1 << 20);
  EXPECT_NEAR(p.beta_s, bytes / 50e9 + bytes / 55e9, 1e-12);
  k.staging_copy_max_gbps = 1000;
  EXPECT_NEAR(Predict(Algorithm::kP2p, r, fast, Options(), k).beta_s, bytes / 50e9 + bytes / 1000e9, 1e-12);
}

TEST(CostModelTest, RecursiveDoublingByHand) {
  const CostConstants k;
  // 4 ranks: 2 rounds, each exchanging and reducing all 4000 bytes.
  const Prediction p = Predict(Algorithm::kRd, Request(Collective::kAllReduce, 4, 1000), HandShape(4), Options(), k);
  const double round = 1e-6 + 2e-6 + 2 * MessageOverhead(k) + 4000 / 10e9 + 2 * 4000 / 40e9;
  EXPECT_NEAR(p.seconds, 2 * round, 1e-15);
  EXPECT_EQ(p.structure, "doubling 2");
  // 5 ranks fold: rank 0 hands its vector to rank 1 first and gets the result back last.
  const Prediction q = Predict(Algorithm::kRd, Request(Collective::kAllReduce, 5, 1000), HandShape(5), Options(), k);
  EXPECT_EQ(q.structure, "fold 1 + doubling 2 + unfold 1");
  const double fold = 1e-6 + 2e-6 + MessageOverhead(k) + 4000 / 10e9 + 2 * 4000 / 40e9;
  const double unfold = 1e-6 + MessageOverhead(k) + 4000 / 10e9;
  EXPECT_NEAR(q.seconds, fold + 2 * round + unfold, 1e-15);
}

TEST(CostModelTest, PipelinedChainBroadcastByHand) {
  const CostConstants k;
  // 4 ranks, root 1, 1000 float32 in chunks of 250: a chain of 3 hops carrying 4 chunks is
  // 3 + 4 - 1 = 6 stages of 1000 bytes; no launches (nothing staged, nothing reduced).
  CollectiveRequest r = Request(Collective::kBroadcast, 4, 1000);
  r.root = 1;
  r.in_place = true;
  const double stage = 1e-6 + 2 * MessageOverhead(k) + 1000 / 10e9;
  const Prediction p = Predict(Algorithm::kRing, r, HandShape(4), Options(250), k);
  EXPECT_NEAR(p.seconds, 6 * stage, 1e-15);
  EXPECT_EQ(p.stages, 6);
  // Out of place the root also copies its input to its output, one device operation per chunk.
  r.in_place = false;
  const Prediction q = Predict(Algorithm::kRing, r, HandShape(4), Options(250), k);
  EXPECT_NEAR(q.seconds - p.seconds, 4 * (2e-6 + k.step_overhead_us * 1e-6 + 1000 / 20e9), 1e-15);
}

TEST(CostModelTest, DisseminationBarrierByHand) {
  const CostConstants k;
  // ceil(log2 5) = 3 rounds of empty messages: latency and overheads only, no device work.
  const Prediction p = Predict(Algorithm::kRd, Request(Collective::kBarrier, 5, 0), DefaultShape(5), Options(), k);
  EXPECT_NEAR(p.seconds, 3 * (k.unknown_link_latency_us * 1e-6 + 2 * MessageOverhead(k)), 1e-15);
  EXPECT_EQ(p.beta_s, 0);
  EXPECT_EQ(p.gamma_s, 0);
}

TEST(CostModelTest, AvgAddsOneScalingPass) {
  const CostConstants k;
  CollectiveRequest r = Request(Collective::kAllReduce, 4, 4096);
  const Prediction sum = Predict(Algorithm::kRing, r, HandShape(4), Options(), k);
  r.op = ReduceOp::kAvg;
  const Prediction avg = Predict(Algorithm::kRing, r, HandShape(4), Options(), k);
  EXPECT_NEAR(avg.alpha_s - sum.alpha_s, 2e-6 + k.step_overhead_us * 1e-6, 1e-15);
  EXPECT_NEAR(avg.gamma_s - sum.gamma_s, 4096 * 4 / 20e9, 1e-15);
  EXPECT_NE(avg.structure.find("avg epilogue"), std::string::npos);
}

TEST(CostModelTest, ChannelsShortenChunkedRings) {
  const CostConstants k;
  // 8192 float32 over 4 ranks: parts of 2048 elements; chunks of 256 make 8 chunk rounds on one
  // channel, 4 per channel on two.
  const CollectiveRequest r = Request(Collective::kAllReduce, 4, 8192);
  const Prediction one = Predict(Algorithm::kRing, r, HandShape(4), Options(256, 1), k);
  const Prediction two = Predict(Algorithm::kRing, r, HandShape(4), Options(256, 2), k);
  EXPECT_EQ(one.stages, 2 * 8 * 3);
  EXPECT_EQ(two.stages, 2 * 4 * 3);
  EXPECT_LT(two.seconds, one.seconds);
  // The bytes are the same: two channels share the links.
  EXPECT_NEAR(two.beta_s, one.beta_s, 1e-15);
}

TEST(CostModelTest, DeterministicModeCostsTheExchangeAndTheOrderedReduce) {
  const CostConstants k;
  PlanOptions o = Options();
  o.deterministic = true;
  const CollectiveRequest r = Request(Collective::kAllReduce, 4, 4096);
  const Prediction ring = Predict(Algorithm::kRing, r, HandShape(4), o, k);
  ASSERT_TRUE(ring.finite()) << ring.note;
  EXPECT_EQ(ring.structure, "exchange 3 + ordered reduce 1 + allgather 3");
  // The ordered reduce reads all 4 contributions of a 4096-byte part at the owner.
  EXPECT_NEAR(ring.gamma_s, 4 * 4096 / 40e9, 1e-15);
  EXPECT_EQ(Predict(Algorithm::kPairwise, r, HandShape(4), o, k).structure,
            "exchange 3 + ordered reduce 1 + direct allgather 3");
  CollectiveRequest reduce = Request(Collective::kReduce, 4, 4096);
  reduce.root = 2;
  // Reduce: the root receives the others' contributions one round each, then reduces.
  EXPECT_EQ(Predict(Algorithm::kTree, reduce, HandShape(4), o, k).structure, "gather 3 + ordered reduce 1");
  // Tree AllReduce: the two trees' roots own a half each and broadcast it down their tree; rhd's
  // active ranks own a block each and run the doubling allgather.
  EXPECT_EQ(Predict(Algorithm::kTree, r, HandShape(4), o, k).structure,
            "exchange 3 + ordered reduce 1 + tree broadcast 2");
  EXPECT_EQ(Predict(Algorithm::kRhd, r, HandShape(4), o, k).structure, "exchange 3 + ordered reduce 1 + doubling 3");
  EXPECT_EQ(Predict(Algorithm::kRhd, Request(Collective::kAllReduce, 6, 4096), HandShape(6), o, k).structure,
            "exchange 5 + ordered reduce 1 + doubling 3 + unfold 1");
  // Collectives without a reduction are unaffected.
  const CollectiveRequest ag = Request(Collective::kAllGather, 4, 4096);
  EXPECT_EQ(Predict(Algorithm::kRing, ag, HandShape(4), o, k).seconds,
            Predict(Algorithm::kRing, ag, HandShape(4), Options(), k).seconds);
}

// Every (algorithm, collective) pair the model serves.
std::vector<std::pair<Algorithm, Collective>> ServedPairs() {
  std::vector<std::pair<Algorithm, Collective>> out;
  const CommTopology shape = HandShape(3);
  for (int a = 0; a < kNumAlgorithms; ++a)
    for (int c = 0; c < kNumCollectives; ++c) {
      CollectiveRequest r = Request(static_cast<Collective>(c), 3, 8);
      r.root = 1;
      if (Predict(static_cast<Algorithm>(a), r, shape, Options(), CostConstants{}).finite())
        out.emplace_back(static_cast<Algorithm>(a), static_cast<Collective>(c));
    }
  return out;
}

TEST(CostModelTest, ServesWhatTheAlgorithmsServe) {
  // algorithm.h: ring 5, tree 3, rhd 3, rd 2, pairwise 5, p2p 2, fused 6 (torus only where some pair
  // has no link).
  EXPECT_EQ(ServedPairs().size(), 26u);
  CollectiveRequest r = Request(Collective::kAllToAll, 4, 8);
  const Prediction p = Predict(Algorithm::kTree, r, HandShape(4), Options(), CostConstants{});
  EXPECT_FALSE(p.finite());
  EXPECT_EQ(p.note, "tree does not serve alltoall");
}

// The hierarchical plans on hosts of 1-4 ranks (even and uneven): finite, and growing with the
// count like every other prediction.
TEST(CostModelTest, HierarchicalOverHosts) {
  const CostConstants k;
  for (Algorithm a : {Algorithm::kHierRing, Algorithm::kHierRd})
    for (const std::vector<int>& sizes : {std::vector<int>{1, 1}, {4, 4}, {3, 5}, {2, 2, 2}, {1, 4, 2}}) {
      int n = 0;
      for (int s : sizes) n += s;
      CommTopology shape = HandShape(n);
      for (int r = 0, h = 0, left = sizes[0]; r < n; ++r, --left) {
        if (left == 0) left = sizes[static_cast<size_t>(++h)];
        shape.ranks[static_cast<size_t>(r)].host_id = "h" + std::to_string(h);
      }
      for (int c = 0; c < kNumCollectives; ++c) {
        double last = 0;
        for (uint64_t count = 0; count <= (uint64_t{1} << 26); count = count == 0 ? 1 : count * 5) {
          CollectiveRequest r = Request(static_cast<Collective>(c), n, count);
          r.root = n - 1;
          const Prediction p = Predict(a, r, shape, Options(1024, 2), k);
          const bool served = a == Algorithm::kHierRing ? (c <= static_cast<int>(Collective::kAllToAll))
                                                        : r.collective == Collective::kAllReduce;
          ASSERT_EQ(p.finite(), served) << AlgorithmName(a) << " " << r.ToString() << ": " << p.note;
          if (!served) break;
          ASSERT_GE(p.seconds, last) << AlgorithmName(a) << " " << r.ToString();
          last = p.seconds;
        }
      }
    }
  // One host: no prediction.
  const Prediction one =
      Predict(Algorithm::kHierRing, Request(Collective::kAllReduce, 4, 64), HandShape(4), Options(), k);
  EXPECT_FALSE(one.finite());
  EXPECT_NE(one.note.find("two hosts"), std::string::npos) << one.note;
}

TEST(CostModelTest, MonotonicInSize) {
  const CostConstants k;
  for (const auto& [algorithm, collective] : ServedPairs()) {
    for (int n : {2, 3, 8, 13}) {
      for (const CommTopology& shape : {HandShape(n), DefaultShape(n)}) {
        for (const PlanOptions& o : {Options(), Options(1024, 1), Options(1024, 3)}) {
          double last = 0;
          for (uint64_t count = 0; count <= (uint64_t{1} << 26); count = count == 0 ? 1 : count * 3) {
            CollectiveRequest r = Request(collective, n, count);
            r.root = n - 1;
            const Prediction p = Predict(algorithm, r, shape, o, k);
            ASSERT_TRUE(p.finite()) << AlgorithmName(algorithm) << " " << r.ToString() << ": " << p.note;
            ASSERT_GE(p.seconds, last) << AlgorithmName(algorithm) << " " << r.ToString() << " chunk " << o.chunk_count
                                       << " channels " << o.channels;
            last = p.seconds;
          }
        }
      }
    }
  }
}

TEST(CostModelTest, RegimesAtEightRanksWithDefaults) {
  const CostConstants k;
  const CommTopology shape = DefaultShape(8);
  const PlanOptions o = Options(262144, 1);  // 1 MiB chunks of float32
  auto seconds = [&](Algorithm a, uint64_t count) {
    return PredictSeconds(a, Request(Collective::kAllReduce, 8, count), shape, o, k);
  };
  // 8 bytes: latency-bound; ring pays 14 steps, rd 3 rounds, tree 2 log2(8) = 6 stages.
  EXPECT_LT(seconds(Algorithm::kRd, 2), seconds(Algorithm::kRing, 2));
  EXPECT_LT(seconds(Algorithm::kTree, 2), seconds(Algorithm::kRing, 2));
  // 256 MiB: bandwidth-bound; rd moves the whole vector 3 times, the ring 2 * 7/8 of it.
  const uint64_t big = uint64_t{64} << 20;
  EXPECT_LT(seconds(Algorithm::kRing, big), seconds(Algorithm::kRd, big));
  EXPECT_LT(seconds(Algorithm::kRing, big), 0.6 * seconds(Algorithm::kRd, big));
  // The crossover exists: somewhere in between rd stops winning.
  EXPECT_LT(seconds(Algorithm::kRd, 1024), seconds(Algorithm::kRing, 1024));
}

// Ring AllReduce at 8 ranks, links unstaged, overheads zero: the β term is the slowest hop's.
TEST(CostModelTest, SlowLinkSlowsTheRingByItsFactor) {
  CostConstants k;
  k.message_overhead_us = 0;
  k.step_overhead_us = 0;
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, 1 << 22);
  const CommTopology uniform = HandShape(8);
  CommTopology slow = uniform;
  slow.link(3, 4).gbps = 10.0 / 4;
  const Prediction a = Predict(Algorithm::kRing, r, uniform, Options(), k);
  const Prediction b = Predict(Algorithm::kRing, r, slow, Options(), k);
  EXPECT_NEAR(b.beta_s / a.beta_s, 4.0, 1e-12);
  EXPECT_EQ(b.gamma_s, a.gamma_s);
  EXPECT_GT(b.seconds, 2 * a.seconds);
  // rhd uses the pair 3-4 only in its distance-1 rounds, which move 1/8 of the vector each.
  const Prediction c = Predict(Algorithm::kRhd, r, uniform, Options(), k);
  const Prediction d = Predict(Algorithm::kRhd, r, slow, Options(), k);
  EXPECT_LT(d.beta_s / c.beta_s, 2.0);
  // A link the ring does not use changes nothing.
  CommTopology unused = uniform;
  unused.link(4, 3).gbps = 10.0 / 4;
  EXPECT_EQ(Predict(Algorithm::kRing, r, unused, Options(), k).seconds, a.seconds);
}

// The ring split evenly (PlanOptions::balance off): a slow device slows it by its factor. Split
// by speed (RingWeights), less.
TEST(CostModelTest, SlowDeviceSlowsTheRingByItsFactor) {
  CostConstants k;
  k.message_overhead_us = 0;
  k.step_overhead_us = 0;
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, 1 << 22);
  PlanOptions even = Options();
  even.balance = false;
  const CommTopology uniform = HandShape(8);
  CommTopology slow = uniform;
  slow.ranks[5].reduce_gbps = 40.0 / 4;
  const Prediction a = Predict(Algorithm::kRing, r, uniform, even, k);
  const Prediction b = Predict(Algorithm::kRing, r, slow, even, k);
  EXPECT_NEAR(b.gamma_s / a.gamma_s, 4.0, 1e-12);
  EXPECT_EQ(b.beta_s, a.beta_s);
  EXPECT_LT(Predict(Algorithm::kRing, r, slow, Options(), k).gamma_s, 0.75 * b.gamma_s);
  // A slow copy engine shows where copies happen: the staging copies of staged links.
  CommTopology staged = uniform;
  for (LinkDesc& l : staged.links) l.staged = true;
  CommTopology slow_copy = staged;
  slow_copy.ranks[2].copy_gbps = 20.0 / 4;
  EXPECT_GT(Predict(Algorithm::kRing, r, slow_copy, even, k).beta_s,
            1.5 * Predict(Algorithm::kRing, r, staged, even, k).beta_s);
}

TEST(CostModelTest, HeterogeneityCanChangeTheCheapestAlgorithm) {
  const CostConstants k;
  // 6 ranks (rhd and rd fold), 64 MiB: the ring is cheapest on a uniform shape.
  const CollectiveRequest r = Request(Collective::kAllReduce, 6, 16 << 20);
  auto cheapest = [&](const CommTopology& shape) {
    Algorithm best = Algorithm::kRing;
    double best_s = std::numeric_limits<double>::infinity();
    for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kRd, Algorithm::kPairwise}) {
      const double s = PredictSeconds(a, r, shape, Options(262144), k);
      if (s < best_s) {
        best = a;
        best_s = s;
      }
    }
    return best;
  };
  const CommTopology uniform = DefaultShape(6);
  EXPECT_EQ(cheapest(uniform), Algorithm::kRing);
  // The link between ranks 4 and 5 4x slower (both directions): every ring step crosses it, the
  // direct exchange only in 2 of its 10 rounds, the trees on one edge.
  CommTopology slow = uniform;
  slow.link(4, 5).gbps = slow.link(5, 4).gbps = k.unknown_link_gbps / 4;
  EXPECT_NE(cheapest(slow), Algorithm::kRing);
  // A slow link that no ring step crosses keeps the ring.
  CommTopology other = uniform;
  other.link(5, 4).gbps = k.unknown_link_gbps / 4;
  EXPECT_EQ(cheapest(other), Algorithm::kRing);
}

TEST(CostModelTest, UnreachableLinksGiveInfinity) {
  const CostConstants k;
  CommTopology shape = DefaultShape(8);
  shape.link(2, 3).reachable = false;
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, 1000);
  // The ring goes round another way (RingOrder); with no way round, its stage names the link.
  EXPECT_TRUE(Predict(Algorithm::kRing, r, shape, Options(), k).finite());
  CommTopology line = DefaultShape(8);
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) line.link(a, b).reachable = a != b && (a + 1 == b || b + 1 == a);
  const Prediction ring = Predict(Algorithm::kRing, r, line, Options(), k);
  EXPECT_FALSE(ring.finite());
  EXPECT_EQ(ring.seconds, std::numeric_limits<double>::infinity());
  EXPECT_NE(ring.note.find("7->0"), std::string::npos) << ring.note;
  EXPECT_FALSE(Predict(Algorithm::kPairwise, r, shape, Options(), k).finite());
  // rhd at 8 ranks pairs 2 with 6, 0 and 3: it needs 2->3 too.
  EXPECT_FALSE(Predict(Algorithm::kRhd, r, shape, Options(), k).finite());

  // A bidirectional ring topology: neighbours only.
  CommTopology ring_only = DefaultShape(8);
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) ring_only.link(a, b).reachable = a != b && ((a + 1) % 8 == b || (b + 1) % 8 == a);
  EXPECT_TRUE(Predict(Algorithm::kRing, r, ring_only, Options(), k).finite());
  EXPECT_FALSE(Predict(Algorithm::kRhd, r, ring_only, Options(), k).finite());
  EXPECT_FALSE(Predict(Algorithm::kRd, Request(Collective::kBarrier, 8, 0), ring_only, Options(), k).finite());
  // Send: the slowest reachable peer counts; nobody reaching the peer is infinite.
  CollectiveRequest send = Request(Collective::kSend, 8, 1000);
  send.root = 0;
  EXPECT_TRUE(Predict(Algorithm::kP2p, send, ring_only, Options(), k).finite());
  CommTopology isolated = DefaultShape(3);
  isolated.link(1, 0).reachable = isolated.link(2, 0).reachable = false;
  send.nranks = 3;
  EXPECT_FALSE(Predict(Algorithm::kP2p, send, isolated, Options(), k).finite());
}

TEST(CostModelTest, SendCountsTheSlowestPeer) {
  const CostConstants k;
  CommTopology shape = HandShape(4);
  CollectiveRequest send = Request(Collective::kSend, 4, 1 << 20);
  send.root = 0;
  const double uniform = PredictSeconds(Algorithm::kP2p, send, shape, Options(), k);
  shape.link(2, 0).gbps = 1;
  const double slow = PredictSeconds(Algorithm::kP2p, send, shape, Options(), k);
  EXPECT_NEAR(slow - uniform, 4.0 * (1 << 20) * (1 / 1e9 - 1 / 10e9), 1e-12);
}

// A pair forwarded by ranks in between (LinkDesc::hops): each cable's latency and a relay per rank in
// between, and its bytes on the wire once per cable.
TEST(CostModelTest, AForwardedPairCountsItsCablesAndRelays) {
  const CostConstants k;
  CommTopology shape = HandShape(4);
  CollectiveRequest send = Request(Collective::kSend, 4, 1 << 20);
  send.root = 0;
  const double direct = PredictSeconds(Algorithm::kP2p, send, shape, Options(), k);
  shape.link(2, 0).hops = 3;
  const double forwarded = PredictSeconds(Algorithm::kP2p, send, shape, Options(), k);
  EXPECT_NEAR(forwarded - direct, 2 * (1e-6 + k.relay_us * 1e-6) + 2 * 4.0 * (1 << 20) / 10e9, 1e-12);
  // The shape's structure keeps to cables: a forwarded pair is reachable, not adjacent.
  EXPECT_TRUE(shape.Reachable(2, 0));
  EXPECT_FALSE(shape.Adjacent(2, 0));
  EXPECT_FALSE(shape.FullyConnected());
}

TEST(CostModelTest, MalformedInputsGiveInfinityNotACrash) {
  const CostConstants k;
  const CommTopology shape = HandShape(4);
  auto note = [&](Algorithm a, const CollectiveRequest& r, const CommTopology& s, const PlanOptions& o) {
    const Prediction p = Predict(a, r, s, o, k);
    EXPECT_FALSE(p.finite());
    EXPECT_FALSE(p.note.empty());
    EXPECT_NE(p.ToString().find("no prediction"), std::string::npos);
    return p.note;
  };
  EXPECT_NE(note(Algorithm::kRing, Request(Collective::kAllReduce, 5, 10), shape, Options()).find("describes 4 ranks"),
            std::string::npos);
  CommTopology truncated = shape;
  truncated.links.pop_back();
  note(Algorithm::kRing, Request(Collective::kAllReduce, 4, 10), truncated, Options());
  note(Algorithm::kRing, Request(Collective::kAllReduce, 4, 10), shape, Options(0));
  PlanOptions no_channels = Options();
  no_channels.channels = 0;
  note(Algorithm::kRing, Request(Collective::kAllReduce, 4, 10), shape, no_channels);
  note(Algorithm::kRing, Request(Collective::kAllReduce, 4, 10, static_cast<DataType>(99)), shape, Options());
  note(static_cast<Algorithm>(42), Request(Collective::kAllReduce, 4, 10), shape, Options());
  CollectiveRequest bad_root = Request(Collective::kBroadcast, 4, 10);
  bad_root.root = 4;
  note(Algorithm::kRing, bad_root, shape, Options());
  note(Algorithm::kP2p, Request(Collective::kSend, 1, 10), HandShape(1), Options());
  CollectiveRequest zero_ranks = Request(Collective::kAllReduce, 0, 10);
  CommTopology empty;
  empty.nranks = 0;
  note(Algorithm::kRing, zero_ranks, empty, Options());

  // Garbage speeds count as unknown.
  CommTopology garbage = DefaultShape(4);
  garbage.ranks[1].copy_gbps = -3;
  garbage.ranks[2].reduce_gbps = std::numeric_limits<double>::quiet_NaN();
  garbage.link(0, 1).gbps = std::numeric_limits<double>::infinity();
  garbage.link(1, 2).latency_us = -1;
  const CollectiveRequest r = Request(Collective::kAllReduce, 4, 1 << 16);
  EXPECT_EQ(PredictSeconds(Algorithm::kRing, r, garbage, Options(), k),
            PredictSeconds(Algorithm::kRing, r, DefaultShape(4), Options(), k));
  // So does a count far beyond any memory: a number, not an overflow.
  const Prediction huge =
      Predict(Algorithm::kRing, Request(Collective::kAllReduce, 4, uint64_t{1} << 61), DefaultShape(4), Options(1), k);
  EXPECT_TRUE(huge.finite());
  EXPECT_GT(huge.stages, 1e18);
}

TEST(CostModelTest, OneRankCopiesOrDoesNothing) {
  const CostConstants k;
  CollectiveRequest r = Request(Collective::kAllReduce, 1, 1000);
  const Prediction copy = Predict(Algorithm::kRing, r, HandShape(1), Options(), k);
  EXPECT_NEAR(copy.seconds, 2e-6 + k.step_overhead_us * 1e-6 + 4000 / 20e9, 1e-15);
  r.in_place = true;
  EXPECT_EQ(PredictSeconds(Algorithm::kRing, r, HandShape(1), Options(), k), 0);
  EXPECT_EQ(PredictSeconds(Algorithm::kRd, Request(Collective::kBarrier, 1, 0), HandShape(1), Options(), k), 0);
  // Nothing to move costs nothing.
  EXPECT_EQ(PredictSeconds(Algorithm::kRing, Request(Collective::kAllReduce, 8, 0), HandShape(8), Options(), k), 0);
}

TEST(CostModelTest, DeterministicAcrossCallsAndCopies) {
  const CostConstants k;
  CommTopology shape = DefaultShape(7);
  shape.ranks[3].reduce_gbps = 11.5;
  shape.link(1, 2).gbps = 3.3;
  for (RankDesc& d : shape.ranks) d.host_cpus = 3, d.host_compute = true;  // the host term applies
  const CommTopology copy = *CommTopology::Deserialize(shape.Serialize());
  EXPECT_EQ(copy.ranks[4].host_cpus, 3);
  EXPECT_TRUE(copy.ranks[4].host_compute);
  for (const auto& [algorithm, collective] : ServedPairs()) {
    for (uint64_t count : {uint64_t{1}, uint64_t{1000}, uint64_t{123457}, uint64_t{1} << 24}) {
      CollectiveRequest r = Request(collective, 7, count);
      r.root = 2;
      const Prediction a = Predict(algorithm, r, shape, Options(4096, 2), k);
      const Prediction b = Predict(algorithm, r, copy, Options(4096, 2), k);
      EXPECT_EQ(std::memcmp(&a.seconds, &b.seconds, sizeof(double)), 0);
      EXPECT_EQ(a.structure, b.structure);
    }
  }
}

TEST(CostModelTest, ExplainShowsTheTerms) {
  const std::string s = ExplainPrediction(Algorithm::kRing, Request(Collective::kAllReduce, 4, 4096), HandShape(4),
                                          Options(), CostConstants{});
  EXPECT_EQ(s, "ring: 23.5 us (alpha 20.4 us, beta 2.46 us, gamma 614 ns; 6 stages: reduce-scatter 3 + allgather 3)");
}

TEST(CostModelTest, FormatSeconds) {
  EXPECT_EQ(FormatSeconds(0), "0 ns");
  EXPECT_EQ(FormatSeconds(950e-9), "950 ns");
  EXPECT_EQ(FormatSeconds(12.34e-6), "12.3 us");
  EXPECT_EQ(FormatSeconds(1.25e-3), "1.25 ms");
  EXPECT_EQ(FormatSeconds(2.5), "2.5 s");
  EXPECT_EQ(FormatSeconds(std::numeric_limits<double>::infinity()), "inf");
}

// The fields of "name=value,name=value,...", split at the commas and the first '=' of each item;
// a value that is not a whole number reads as NaN.
std::vector<std::pair<std::string, double>> ParseDump(const std::string& text) {
  std::vector<std::pair<std::string, double>> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    double v = std::numeric_limits<double>::quiet_NaN();
    if (eq != std::string::npos) {
      const char* first = item.data() + eq + 1;
      const char* last = item.data() + item.size();
      const auto [ptr, ec] = std::from_chars(first, last, v);
      if (ec != std::errc() || ptr != last || first == last) v = std::numeric_limits<double>::quiet_NaN();
    }
    out.emplace_back(item.substr(0, eq), v);
  }
  return out;
}

TEST(CostModelTest, ConstantsTableGivesTheDefaults) {
  const CostConstants defaults;
  const std::span<const CostConstantInfo> table = CostConstantTable();
  EXPECT_EQ(table.size(), 16u);
  for (const CostConstantInfo& c : table) {
    EXPECT_EQ(defaults.*c.field, c.value) << c.name << ": the default is not the table's value";
    EXPECT_TRUE(std::isfinite(c.value) && c.value >= 0) << c.name;
    if (c.unit == "GB/s") {
      EXPECT_GT(c.value, 0) << c.name << ": a speed";
    }
    EXPECT_TRUE(c.unit == "GB/s" || c.unit == "us" || c.unit == "MiB" || c.unit == "x") << c.name << ": " << c.unit;
    EXPECT_FALSE(c.source.empty()) << c.name << " has no reason for its value";
  }
}

TEST(CostModelTest, ConstantsRoundTripAndOverride) {
  const CostConstants defaults;
  const std::span<const CostConstantInfo> table = CostConstantTable();
  const std::string text = CostConstantsToString(defaults);
  // The form: one "name=value" per constant, comma-separated, in table order, each value a number
  // that reads back as exactly the constant's value.
  const auto fields = ParseDump(text);
  ASSERT_EQ(fields.size(), table.size()) << text;
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(fields[i].first, table[i].name) << text;
    EXPECT_EQ(fields[i].second, defaults.*table[i].field) << table[i].name << " in " << text;
  }
  auto back = ParseCostConstants(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (const CostConstantInfo& c : table) EXPECT_EQ((*back).*c.field, defaults.*c.field) << c.name;
  EXPECT_EQ(CostConstantsToString(*back), text);
  // Values with no short decimal form survive the text too, bit for bit.
  CostConstants odd;
  double v = 1.0 / 3;
  for (const CostConstantInfo& c : table) odd.*c.field = (v *= 7.1);
  auto odd_back = ParseCostConstants(CostConstantsToString(odd));
  ASSERT_TRUE(odd_back.ok()) << odd_back.status().ToString();
  for (const CostConstantInfo& c : table) EXPECT_EQ((*odd_back).*c.field, odd.*c.field) << c.name;

  auto changed = ParseCostConstants(" unknown_link_gbps = 12.5 , message_overhead_us=0,");
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_EQ(changed->unknown_link_gbps, 12.5);
  EXPECT_EQ(changed->message_overhead_us, 0);
  EXPECT_EQ(changed->unknown_copy_gbps, defaults.unknown_copy_gbps);
  const CollectiveRequest r = Request(Collective::kAllReduce, 4, 1 << 20);
  EXPECT_GT(PredictSeconds(Algorithm::kRing, r, DefaultShape(4), Options(), *changed),
            PredictSeconds(Algorithm::kRing, r, DefaultShape(4), Options(), defaults));
  EXPECT_TRUE(ParseCostConstants("").ok());

  for (const char* bad :
       {"unknown_link_gbps", "nonsense=1", "=3", "unknown_link_gbps=", "unknown_link_gbps=abc", "unknown_link_gbps=-1",
        "unknown_link_gbps=0", "unknown_link_gbps=nan", "unknown_link_gbps=inf", "unknown_link_gbps=1x"}) {
    auto p = ParseCostConstants(bad);
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find("cost constants"), std::string::npos) << p.status().message();
  }
  EXPECT_NE(ParseCostConstants("nonsense=1").status().message().find("known: unknown_link_latency_us"),
            std::string::npos);
  // A zero latency or overhead is a legitimate model; a zero speed is not.
  EXPECT_TRUE(ParseCostConstants("unknown_launch_us=0,step_overhead_us=0").ok());
}

}  // namespace
}  // namespace kizuna::collectives
