// The algorithm interface's checks (algorithm.h): Supports names the link an algorithm lacks or
// the collective it does not implement, and BuildPlan rejects every bad argument by name.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"

namespace kizuna::collectives {
namespace {

// p ranks on one host, every pair linked.
CommTopology Full(int p) { return CommTopology::Uniform(p, RankDesc{"host", "emu:"}, LinkDesc{true}); }

Status BuildStatus(Algorithm algo, const CollectiveRequest& req, const CommTopology& shape, PlanOptions options = {},
                   int rank = -1) {
  return BuildPlan(algo, req, shape, options, rank).status();
}

void ExpectStatus(const Status& s, StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << "'" << part << "' not in: " << s.ToString();
}

TEST(SupportsTest, RingNeedsACycleThroughEveryRank) {
  // Without 3 -> 4 the ring goes round another way (RingOrder).
  CommTopology shape = Full(6);
  shape.link(3, 4).reachable = false;
  const CollectiveRequest req{Collective::kAllReduce, 6, 100, DataType::kFloat32, ReduceOp::kSum, 0, false};
  EXPECT_TRUE(GetAlgorithm(Algorithm::kRing).Supports(req, shape).ok());
  // Rank 4 linked to rank 3 alone, both ways: no cycle; the error names rank order's missing link.
  for (int r = 0; r < 6; ++r)
    if (r != 3 && r != 4) shape.link(r, 4).reachable = shape.link(4, r).reachable = false;
  shape.link(3, 4).reachable = true;
  ExpectStatus(GetAlgorithm(Algorithm::kRing).Supports(req, shape), StatusCode::kNotSupported,
               "rank 4 cannot reach rank 5");
  ExpectStatus(BuildStatus(Algorithm::kRing, req, shape), StatusCode::kNotSupported, "rank 4 cannot reach rank 5");
  // The reverse direction is not needed by the ring.
  shape = Full(6);
  shape.link(4, 3).reachable = false;
  EXPECT_TRUE(GetAlgorithm(Algorithm::kRing).Supports(req, shape).ok());
}

TEST(SupportsTest, OtherAlgorithmsNameTheMissingLink) {
  const CollectiveRequest req{Collective::kAllReduce, 8, 100, DataType::kFloat32, ReduceOp::kSum, 0, false};
  CommTopology shape = Full(8);
  shape.link(0, 4).reachable = false;  // a tree edge (0's child is 4) and a hypercube pair
  ExpectStatus(GetAlgorithm(Algorithm::kTree).Supports(req, shape), StatusCode::kNotSupported,
               "rank 0 cannot reach rank 4");
  ExpectStatus(GetAlgorithm(Algorithm::kRhd).Supports(req, shape), StatusCode::kNotSupported,
               "rank 0 cannot reach rank 4");
  ExpectStatus(GetAlgorithm(Algorithm::kRd).Supports(req, shape), StatusCode::kNotSupported,
               "rank 0 cannot reach rank 4");
  ExpectStatus(GetAlgorithm(Algorithm::kPairwise).Supports(req, shape), StatusCode::kNotSupported,
               "rank 0 cannot reach rank 4");
  // A Send over a missing link is refused when the sending rank's plan is built.
  const CollectiveRequest send{Collective::kSend, 8, 10, DataType::kFloat32, ReduceOp::kSum, 4, false};
  ExpectStatus(BuildStatus(Algorithm::kP2p, send, shape, {}, 0), StatusCode::kNotSupported,
               "rank 0 cannot reach rank 4");
  EXPECT_TRUE(BuildPlan(Algorithm::kP2p, send, shape, {}, 1).ok());
}

TEST(SupportsTest, InPlaceAllToAllAndBarrierOnTree) {
  const CollectiveRequest a2a{Collective::kAllToAll, 4, 10, DataType::kFloat32, ReduceOp::kSum, 0, true};
  ExpectStatus(BuildStatus(Algorithm::kPairwise, a2a, Full(4)), StatusCode::kNotSupported, "in place");
  const CollectiveRequest barrier{Collective::kBarrier, 4, 0, DataType::kFloat32, ReduceOp::kSum, 0, false};
  ExpectStatus(BuildStatus(Algorithm::kTree, barrier, Full(4)), StatusCode::kNotSupported,
               "tree does not implement barrier");
  // The ring's barrier needs the ring's links only (a ring of cables has no others).
  CommTopology ring = Full(4);
  ring.link(0, 2).reachable = ring.link(2, 0).reachable = ring.link(1, 3).reachable = ring.link(3, 1).reachable = false;
  EXPECT_TRUE(BuildStatus(Algorithm::kRing, barrier, ring).ok());
  ExpectStatus(BuildStatus(Algorithm::kRd, barrier, ring), StatusCode::kNotSupported, "cannot reach");
}

TEST(BuildPlanTest, RejectsBadArgumentsByName) {
  const CollectiveRequest good{Collective::kBroadcast, 4, 10, DataType::kFloat32, ReduceOp::kSum, 1, false};
  ASSERT_TRUE(BuildPlan(Algorithm::kRing, good, Full(4), {}, -1).ok());
  auto with = [&](auto change) {
    CollectiveRequest r = good;
    change(r);
    return r;
  };
  ExpectStatus(BuildStatus(Algorithm::kRing, with([](auto& r) { r.nranks = 0; }), Full(4)),
               StatusCode::kInvalidArgument, "nranks 0");
  ExpectStatus(BuildStatus(Algorithm::kRing, good, Full(5)), StatusCode::kInvalidArgument, "shape 5");
  ExpectStatus(BuildStatus(Algorithm::kRing, with([](auto& r) { r.root = 4; }), Full(4)), StatusCode::kInvalidArgument,
               "root 4");
  ExpectStatus(BuildStatus(Algorithm::kRing, with([](auto& r) { r.root = -1; }), Full(4)), StatusCode::kInvalidArgument,
               "root -1");
  ExpectStatus(BuildStatus(Algorithm::kRing, with([](auto& r) { r.dtype = static_cast<DataType>(42); }), Full(4)),
               StatusCode::kInvalidArgument, "data type 42");
  ExpectStatus(BuildStatus(Algorithm::kRing,
                           with([](auto& r) {
                             r.collective = Collective::kAllReduce;
                             r.op = static_cast<ReduceOp>(9);
                           }),
                           Full(4)),
               StatusCode::kInvalidArgument, "op 9");
  ExpectStatus(
      BuildStatus(Algorithm::kRing, with([](auto& r) { r.collective = static_cast<Collective>(77); }), Full(4)),
      StatusCode::kInvalidArgument, "collective 77");
  ExpectStatus(BuildStatus(static_cast<Algorithm>(99), good, Full(4)), StatusCode::kInvalidArgument, "algorithm 99");
  ExpectStatus(BuildStatus(Algorithm::kRing, good, Full(4), {}, 4), StatusCode::kInvalidArgument, "rank 4");
  PlanOptions zero_chunk;
  zero_chunk.chunk_count = 0;
  ExpectStatus(BuildStatus(Algorithm::kRing, good, Full(4), zero_chunk), StatusCode::kInvalidArgument, "chunk_count");
  PlanOptions no_channels;
  no_channels.channels = 0;
  ExpectStatus(BuildStatus(Algorithm::kRing, good, Full(4), no_channels), StatusCode::kInvalidArgument, "channels 0");
  PlanOptions many_channels;
  many_channels.channels = 1 << 30;
  ExpectStatus(BuildStatus(Algorithm::kRing, good, Full(4), many_channels), StatusCode::kInvalidArgument, "channels");
  ExpectStatus(BuildStatus(Algorithm::kRing, with([](auto& r) { r.count = uint64_t{1} << 62; }), Full(4)),
               StatusCode::kInvalidArgument, "too large");
  ExpectStatus(BuildStatus(Algorithm::kRing, with([](auto& r) { r.count = uint64_t{1} << 40; }), Full(4)),
               StatusCode::kInvalidArgument, "chunk_count 1 is too small");
  const CollectiveRequest self{Collective::kSend, 4, 10, DataType::kFloat32, ReduceOp::kSum, 2, false};
  ExpectStatus(BuildStatus(Algorithm::kP2p, self, Full(4), {}, 2), StatusCode::kInvalidArgument, "send to itself");
  ExpectStatus(BuildStatus(Algorithm::kP2p, with([](auto& r) {
                             r.collective = Collective::kRecv;
                             r.root = 9;
                           }),
                           Full(4)),
               StatusCode::kInvalidArgument, "peer 9");
  // A barrier has no buffers (plan.h's table), so its count means nothing and is not checked.
  const CollectiveRequest barrier{Collective::kBarrier, 4, 3, DataType::kFloat32, ReduceOp::kSum, 0, false};
  EXPECT_TRUE(BuildPlan(Algorithm::kRd, barrier, Full(4), {}, -1).ok());
}

}  // namespace
}  // namespace kizuna::collectives
