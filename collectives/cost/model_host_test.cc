// The cost model's host term (model_host.h) by hand: ranks that outnumber their host's CPUs take
// turns and are woken, devices that compute on the host share its memory, and operations that fit
// its cache run faster.
#include <string>

#include <gtest/gtest.h>

#include "collectives/cost/model.h"
#include "collectives/cost/model_test_util.h"

namespace kizuna::collectives {
namespace {

using namespace cost_testing;  // NOLINT: the tests' shared requests and shapes

// Ranks sharing a host with fewer CPUs than ranks take turns (the slowdown m / C on the critical
// rank's terms) and wait for each rank beyond the CPUs to be scheduled (a wake-up per stage).
TEST(CostModelTest, OversubscribedHostByHand) {
  const CostConstants k;
  const CollectiveRequest r = Request(Collective::kAllReduce, 4, 4096);
  const CommTopology two_cpus = WithHostCpus(HandShape(4), 2);
  const CommTopology four_cpus = WithHostCpus(HandShape(4), 4);
  // With a CPU each the host term adds nothing: RingAllReduceByHand's figures.
  const Prediction free = Predict(Algorithm::kRing, r, four_cpus, Options(), k);
  EXPECT_NEAR(free.seconds, 23.472e-6, 1e-12);
  // Two CPUs: every stage's CPU, wire and reduce terms twice as long, plus 2 wake-ups per stage.
  const Prediction ring = Predict(Algorithm::kRing, r, two_cpus, Options(), k);
  const double cpu = 2 * MessageOverhead(k);
  EXPECT_NEAR(ring.alpha_s, 3 * (3e-6 + 2 * cpu) + 3 * (1e-6 + 2 * cpu) + 6 * 2 * k.oversubscribed_wake_us * 1e-6,
              1e-15);
  EXPECT_NEAR(ring.beta_s, 2 * 6 * (4096 / 10e9), 1e-15);
  EXPECT_NEAR(ring.gamma_s, 2 * 3 * (2 * 4096 / 40e9), 1e-15);
  // The fused pass: two rendezvous with 2 wake-ups each, the pass itself twice as long.
  const Prediction fused = Predict(Algorithm::kFused, r, two_cpus, Options(), k);
  EXPECT_NEAR(fused.alpha_s, 2e-6 + (k.direct_rendezvous_us + 2 * 2 * k.oversubscribed_wake_us) * 1e-6, 1e-12);
  EXPECT_NEAR(fused.gamma_s, 2 * 16384 / 20e9, 1e-12);
  // Ranks on two hosts of 2 CPUs each are not oversubscribed.
  CommTopology two_hosts = two_cpus;
  two_hosts.ranks[2].host_id = two_hosts.ranks[3].host_id = "other";
  EXPECT_NEAR(Predict(Algorithm::kRing, r, two_hosts, Options(), k).seconds, 23.472e-6, 1e-12);
  // Two host names on one kernel (namespace or container hosts: host ids that share a boot id)
  // are one machine: its 2 CPUs run all 4 ranks, as on one host.
  CommTopology one_kernel = two_cpus;
  for (int i = 0; i < 4; ++i)
    one_kernel.ranks[static_cast<size_t>(i)].host_id = std::string(i < 2 ? "ns0:" : "ns1:") + "b00710";
  EXPECT_NEAR(Predict(Algorithm::kRing, r, one_kernel, Options(), k).seconds, ring.seconds, 1e-15);
  CommTopology two_kernels = one_kernel;
  two_kernels.ranks[2].host_id = two_kernels.ranks[3].host_id = "ns1:c0ffee00";
  EXPECT_NEAR(Predict(Algorithm::kRing, r, two_kernels, Options(), k).seconds, 23.472e-6, 1e-12);
  // Cables at their own pace (LinkDesc::paced: namespace hosts wired by shaped cables): the CPUs'
  // turns stretch the CPU and reduce terms, not the wire's.
  CommTopology cabled = one_kernel;
  for (LinkDesc& l : cabled.links) l.paced = true;
  const Prediction paced = Predict(Algorithm::kRing, r, cabled, Options(), k);
  EXPECT_NEAR(paced.alpha_s, ring.alpha_s, 1e-15);
  EXPECT_NEAR(paced.beta_s, 6 * (4096 / 10e9), 1e-15);
  EXPECT_NEAR(paced.gamma_s, ring.gamma_s, 1e-15);
  // Devices that compute on the host: a plan step also needs the device's stream thread, so 4
  // ranks on 4 CPUs run 8 threads: 4 wake-ups per ring stage, none for the fused pass (the
  // calling threads alone). The memory and cache terms are kept out of the way here.
  CostConstants fast_memory = k;
  fast_memory.host_memory_gbps = 1e9;
  fast_memory.cache_speedup = 1;
  CommTopology emulated = four_cpus;
  for (RankDesc& d : emulated.ranks) d.host_compute = true;
  EXPECT_NEAR(Predict(Algorithm::kRing, r, emulated, Options(), fast_memory).seconds,
              23.472e-6 + 6 * 4 * k.oversubscribed_wake_us * 1e-6, 1e-12);
  EXPECT_NEAR(Predict(Algorithm::kFused, r, emulated, Options(), fast_memory).alpha_s,
              2e-6 + k.direct_rendezvous_us * 1e-6, 1e-12);
}

// Devices that compute on the host share its memory: a fused AllReduce over 8 such ranks moves
// 2 x 8 x S bytes through one memory system, whatever each device's own copy speed.
// A rank that sat a stage out on a host whose ranks outnumber its CPUs has slept, and is woken
// before it can take part again: recursive doubling over 3 ranks on 2 CPUs folds rank 2 into
// rank 0 (ranks 2 and 0), exchanges between ranks 0 and 1 (rank 1 rejoins), and hands rank 2 the
// result (rank 2 rejoins). Each stage has 2 ranks, as many as the CPUs: no other wake-up.
TEST(CostModelTest, RanksThatSatAStageOutAreWokenOnAnOversubscribedHost) {
  const CostConstants k;
  const CollectiveRequest r = Request(Collective::kAllReduce, 3, 2);
  const CommTopology two_cpus = WithHostCpus(HandShape(3), 2);
  const CommTopology three_cpus = WithHostCpus(HandShape(3), 3);
  const Prediction busy = Predict(Algorithm::kRd, r, two_cpus, Options(), k);
  const Prediction free = Predict(Algorithm::kRd, r, three_cpus, Options(), k);
  ASSERT_TRUE(busy.finite() && free.finite()) << busy.note << free.note;
  EXPECT_NEAR(busy.seconds - free.seconds, 2 * k.oversubscribed_wake_us * 1e-6, 1e-12);
  // A transfer between two ranks wakes no one else.
  CollectiveRequest send = Request(Collective::kSend, 3, 2);
  send.root = 1;
  EXPECT_NEAR(Predict(Algorithm::kP2p, send, two_cpus, Options(), k).seconds,
              Predict(Algorithm::kP2p, send, three_cpus, Options(), k).seconds, 1e-15);
}

TEST(CostModelTest, HostMemoryBoundsDevicesThatComputeOnTheHost) {
  CostConstants k;
  k.host_memory_gbps = 40;
  const uint64_t count = 16 << 20;  // 64 MiB of float32
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, count);
  CommTopology emulated = HandShape(8);
  for (RankDesc& d : emulated.ranks) d.host_compute = true;
  const Prediction fused = Predict(Algorithm::kFused, r, emulated, Options(), k);
  EXPECT_NEAR(fused.gamma_s, 2.0 * 8 * 4 * count / 40e9, 1e-9);
  // Without host_compute (a GPU's memory) each device's pass runs at its own copy speed.
  EXPECT_NEAR(Predict(Algorithm::kFused, r, HandShape(8), Options(), k).gamma_s, 4.0 * count / 20e9, 1e-9);
  // The ring pays its memory traffic too (a reduced message: read, written, two reads and a
  // write), so the fused pass, the least traffic, stays the cheaper one.
  const Prediction ring = Predict(Algorithm::kRing, r, emulated, Options(), k);
  EXPECT_GT(ring.seconds, fused.seconds);
  EXPECT_GT(ring.beta_s + ring.gamma_s, Predict(Algorithm::kRing, r, HandShape(8), Options(), k).beta_s);
}

TEST(CostModelTest, OperationsThatFitTheHostsCacheRunFaster) {
  CostConstants k;
  k.host_memory_gbps = 40;
  k.host_cache_mib = 32;
  k.cache_speedup = 2;
  CommTopology emulated = HandShape(8);
  for (RankDesc& d : emulated.ranks) d.host_compute = true;
  // 8 ranks x (1 MiB in + 1 MiB out) = 16 MiB fit in 32 MiB: the memory floor at twice the rate.
  const uint64_t small = 256 << 10;  // 1 MiB of float32
  const Prediction cached =
      Predict(Algorithm::kFused, Request(Collective::kAllReduce, 8, small), emulated, Options(), k);
  EXPECT_NEAR(cached.gamma_s, 2.0 * 8 * 4 * small / 80e9, 1e-12);
  // 8 x 8 MiB = 64 MiB do not: memory rates.
  const uint64_t large = 1 << 20;  // 4 MiB of float32
  const Prediction memory =
      Predict(Algorithm::kFused, Request(Collective::kAllReduce, 8, large), emulated, Options(), k);
  EXPECT_NEAR(memory.gamma_s, 2.0 * 8 * 4 * large / 40e9, 1e-12);
  // Devices with memory of their own (a GPU's) have no host cache term.
  const Prediction gpu =
      Predict(Algorithm::kFused, Request(Collective::kAllReduce, 8, small), HandShape(8), Options(), k);
  EXPECT_NEAR(gpu.gamma_s, 4.0 * small / 20e9, 1e-12);
}

// Devices that compute on the host at speeds of their own (throttled emulated devices, 4 at 0.4
// GB/s and 4 at 0.1): fused's parts sized by speed (shares.h) each take as long as the others,
// 4 x 0.4 + 4 x 0.1 = 2 GB/s together; the even split waits for the slow ones.
TEST(CostModelTest, FusedPartsSizedBySpeedTakeTheTimeOfTheirShare) {
  CostConstants k;
  CommTopology unlike = WithHostCpus(HandShape(8), 2);
  for (int r = 0; r < 8; ++r) {
    RankDesc& d = unlike.ranks[static_cast<size_t>(r)];
    d.host_compute = true;
    d.device = "emu:" + std::to_string(r);
    d.copy_gbps = d.reduce_gbps = r < 4 ? 0.4 : 0.1;
  }
  unlike.direct = true;
  const uint64_t count = 4 << 20;  // 16 MiB of float32
  PlanOptions even = Options();
  even.balance = false;
  for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather}) {
    // Every rank's device reads (reductions) or writes (copies) 8 x its part: 8 x 16 MiB of work
    // in all (AllReduce's vector; ReduceScatter's and AllGather's 8 blocks of 2 MiB).
    const uint64_t n = c == Collective::kAllReduce ? count : count / 8;
    const Prediction by_speed = Predict(Algorithm::kFused, Request(c, 8, n), unlike, Options(), k);
    const Prediction evenly = Predict(Algorithm::kFused, Request(c, 8, n), unlike, even, k);
    const double work = 8.0 * 4 * count;
    EXPECT_NEAR(by_speed.gamma_s, work / 2e9, work / 2e9 * 0.01) << CollectiveName(c);
    EXPECT_NEAR(evenly.gamma_s, work / 8 / 0.1e9, work / 8 / 0.1e9 * 0.01) << CollectiveName(c);
  }
}

// pairwise's parts, rhd's blocks and the trees' placement and shares sized by reduce speed (4
// ranks at 20 GB/s, 4 at 5): the reductions, which the slow ranks set, take well under the even
// split's time; equal speeds predict the same either way.
TEST(CostModelTest, WeightedPlansArePredictedAsBuilt) {
  CostConstants k;
  CommTopology unlike = HandShape(8);
  for (int r = 4; r < 8; ++r) unlike.ranks[static_cast<size_t>(r)].reduce_gbps = 5;
  for (RankDesc& d : unlike.ranks) d.copy_gbps = 20;
  PlanOptions even = Options(1 << 16);
  even.balance = false;
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, 16 << 20);
  for (Algorithm a : {Algorithm::kPairwise, Algorithm::kRhd, Algorithm::kTree}) {
    const Prediction by_speed = Predict(a, r, unlike, Options(1 << 16), k);
    const Prediction evenly = Predict(a, r, unlike, even, k);
    EXPECT_LT(by_speed.gamma_s, 0.6 * evenly.gamma_s) << AlgorithmName(a);
    EXPECT_LT(by_speed.seconds, evenly.seconds) << AlgorithmName(a);
    EXPECT_DOUBLE_EQ(Predict(a, r, HandShape(8), Options(1 << 16), k).seconds,
                     Predict(a, r, HandShape(8), even, k).seconds)
        << AlgorithmName(a);
  }
  // The ring's parts (RingWeights): one rank 4x slower at copies and reductions. Its part and the
  // next rank's take the data; the slow rank then reduces half of it and copies the rest, and the
  // ring is predicted to take (2 + 1 + 2) / (7/8 (2 + 1 + 2)) of the even split's transfer time.
  CommTopology one_slow = HandShape(8);
  for (RankDesc& d : one_slow.ranks) d.copy_gbps = 20, d.reduce_gbps = 20;
  one_slow.ranks[7].copy_gbps = one_slow.ranks[7].reduce_gbps = 5;
  const Prediction ring = Predict(Algorithm::kRing, r, one_slow, Options(1 << 16), k);
  const Prediction ring_even = Predict(Algorithm::kRing, r, one_slow, even, k);
  EXPECT_LT(ring.seconds, 0.8 * ring_even.seconds);
  EXPECT_GT(ring.seconds, 0.6 * ring_even.seconds);
  // Hierarchical, 2 hosts x 2 ranks: rail 1 4x slower (the rail form's parts), host 1 4x slower
  // (hier:fused's rings over the hosts). Staged links, as between hosts.
  CommTopology two_hosts = HandShape(4);
  two_hosts.host_direct = true;
  for (LinkDesc& l : two_hosts.links) l.staged = true;
  for (int q = 0; q < 4; ++q) {
    RankDesc& d = two_hosts.ranks[static_cast<size_t>(q)];
    d.host_id = q < 2 ? "h0" : "h1";
    d.copy_gbps = d.reduce_gbps = 20;
  }
  CommTopology rails = two_hosts, slow_host = two_hosts;
  for (int q : {1, 3})
    rails.ranks[static_cast<size_t>(q)].copy_gbps = rails.ranks[static_cast<size_t>(q)].reduce_gbps = 5;
  for (int q : {2, 3})
    slow_host.ranks[static_cast<size_t>(q)].copy_gbps = slow_host.ranks[static_cast<size_t>(q)].reduce_gbps = 5;
  const CollectiveRequest r4 = Request(Collective::kAllReduce, 4, 16 << 20);
  for (const auto& [a, shape] :
       {std::pair{Algorithm::kHierRing, rails}, std::pair{Algorithm::kHierFusedRing, slow_host}})
    EXPECT_LT(Predict(a, r4, shape, Options(1 << 16), k).seconds, 0.95 * Predict(a, r4, shape, even, k).seconds)
        << AlgorithmName(a);
}

}  // namespace
}  // namespace kizuna::collectives
