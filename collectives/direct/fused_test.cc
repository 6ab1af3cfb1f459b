// The fused parts (fused.h) with parts sized by speed (RankPlan::fused_bounds): every rank's part
// run on the CPU over plain host buffers, then every output compared with sums computed here.
// Uneven bounds cut ReduceScatter's and AllGather's blocks in the middle, give a rank nothing, and
// give one rank several blocks; in place as well as out of place.
#include "collectives/direct/fused.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/plan/plan.h"

namespace kizuna::collectives {
namespace {

constexpr int kRanks = 5;
constexpr uint64_t kCount = 13;  // elements per rank (the vector, or a block)

// Rank r's input element i: small integers, so that float sums are exact in any order.
float In(int r, uint64_t i) { return static_cast<float>((static_cast<uint64_t>(r) * 7 + i) % 11); }

// Bounds over `work` elements: uneven, one part empty (rank 1), the last rank's part the largest.
std::vector<uint64_t> UnevenBounds(uint64_t work) { return {0, work / 9, work / 9, work / 3, work / 2, work}; }

struct Buffers {
  std::vector<std::vector<float>> in, out;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
};

// Every rank's buffers for `req`; in place, each input is the slice of its output that
// communicator.h names (AllGather: block r of the output; ReduceScatter: the output is block r
// of the input; AllReduce, Reduce and Broadcast: the output itself).
Buffers Make(const CollectiveRequest& req) {
  Buffers b;
  b.in.resize(kRanks);
  b.out.resize(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    b.in[static_cast<size_t>(r)].resize(req.input_count());
    for (uint64_t i = 0; i < req.input_count(); ++i) b.in[static_cast<size_t>(r)][i] = In(r, i);
    b.out[static_cast<size_t>(r)].assign(req.output_count(), -1.0f);
  }
  for (int r = 0; r < kRanks; ++r) {
    auto& in = b.in[static_cast<size_t>(r)];
    auto& out = b.out[static_cast<size_t>(r)];
    if (!req.in_place) {
      b.inputs.push_back(in.data());
      b.outputs.push_back(out.data());
      continue;
    }
    if (req.collective == Collective::kAllGather) {
      std::copy(in.begin(), in.end(), out.begin() + static_cast<ptrdiff_t>(static_cast<uint64_t>(r) * req.count));
      b.inputs.push_back(out.data() + static_cast<uint64_t>(r) * req.count);
      b.outputs.push_back(out.data());
    } else if (req.collective == Collective::kReduceScatter) {
      b.inputs.push_back(in.data());
      b.outputs.push_back(in.data() + static_cast<uint64_t>(r) * req.count);
    } else {
      out = in;
      b.inputs.push_back(out.data());
      b.outputs.push_back(out.data());
    }
  }
  return b;
}

// What rank r's output must hold at element i.
float Want(const CollectiveRequest& req, int r, uint64_t i) {
  float sum = 0;
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce:
      for (int q = 0; q < kRanks; ++q) sum += In(q, i);
      return sum;
    case Collective::kReduceScatter:
      for (int q = 0; q < kRanks; ++q) sum += In(q, static_cast<uint64_t>(r) * req.count + i);
      return sum;
    case Collective::kAllGather: return In(static_cast<int>(i / req.count), i % req.count);
    case Collective::kBroadcast: return In(req.root, i);
    default: return -2;
  }
}

// Runs every rank's part but `skip`'s, and checks every output.
void Check(const CollectiveRequest& req, const std::vector<uint64_t>& bounds, int skip = -1) {
  Buffers b = Make(req);
  for (int r = 0; r < kRanks; ++r) {
    if (r == skip) continue;
    ASSERT_TRUE(RunFusedPartOnCpu(req, r, bounds, b.inputs, b.outputs).ok()) << req.ToString() << " rank " << r;
  }
  for (int r = 0; r < kRanks; ++r) {
    if (req.collective == Collective::kReduce && r != req.root) continue;
    const float* out = static_cast<const float*>(b.outputs[static_cast<size_t>(r)]);
    for (uint64_t i = 0; i < req.output_count(); ++i)
      ASSERT_EQ(out[i], Want(req, r, i)) << req.ToString() << " bounds " << (bounds.empty() ? "even" : "uneven")
                                         << ", rank " << r << " element " << i;
  }
}

TEST(FusedTest, PartsOfAnySizeGiveEveryResult) {
  for (Collective coll : {Collective::kAllReduce, Collective::kReduce, Collective::kReduceScatter,
                          Collective::kAllGather, Collective::kBroadcast}) {
    for (bool in_place : {false, true}) {
      const CollectiveRequest req{coll, kRanks, kCount, DataType::kFloat32, ReduceOp::kSum, 3, in_place};
      const std::vector<uint64_t> bounds = UnevenBounds(FusedWorkCount(req));
      Check(req, {});
      // Rank 1's part is empty: the others' parts alone complete the operation, as they do only
      // where the bounds are followed.
      Check(req, bounds, /*skip=*/1);
      // Sanity of the case itself: the bounds are uneven and cut a block in the middle.
      EXPECT_NE(bounds[3] % kCount, 0u);
    }
  }
}

TEST(FusedTest, WorkCountIsTheVectorOrEveryBlock) {
  EXPECT_EQ(FusedWorkCount({Collective::kAllReduce, 4, 10}), 10u);
  EXPECT_EQ(FusedWorkCount({Collective::kBroadcast, 4, 10}), 10u);
  EXPECT_EQ(FusedWorkCount({Collective::kReduceScatter, 4, 10}), 40u);
  EXPECT_EQ(FusedWorkCount({Collective::kAllGather, 4, 10}), 40u);
}

}  // namespace
}  // namespace kizuna::collectives
