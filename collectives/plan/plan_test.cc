// plan.cc: names and parsers, the request's buffer table, step conflicts, ValidateRankPlan's
// checks (one bad plan per kind of mistake), and the printed forms.
#include "collectives/plan/plan.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kizuna::collectives {
namespace {

Slice In(uint64_t off, uint64_t n) { return {BufferKind::kInput, off, n}; }
Slice Out(uint64_t off, uint64_t n) { return {BufferKind::kOutput, off, n}; }
Slice Scr(uint64_t off, uint64_t n) { return {BufferKind::kScratch, off, n}; }

TEST(PlanTest, CollectiveNamesRoundTrip) {
  for (int i = 0; i < kNumCollectives; ++i) {
    const auto c = static_cast<Collective>(i);
    EXPECT_EQ(ParseCollective(CollectiveName(c)), c) << CollectiveName(c);
  }
  EXPECT_EQ(CollectiveName(static_cast<Collective>(kNumCollectives)), "invalid");
  EXPECT_EQ(ParseCollective("AllReduce"), Collective::kAllReduce);
  EXPECT_EQ(ParseCollective("all_reduce"), Collective::kAllReduce);
  EXPECT_EQ(ParseCollective("Reduce-Scatter"), Collective::kReduceScatter);
  EXPECT_EQ(ParseCollective("ALLGATHER"), Collective::kAllGather);
  EXPECT_EQ(ParseCollective("AllToAll"), Collective::kAllToAll);
  EXPECT_EQ(ParseCollective("sendrecv"), Collective::kSend);
  EXPECT_EQ(ParseCollective(""), std::nullopt);
  EXPECT_EQ(ParseCollective("allreduc"), std::nullopt);
  EXPECT_EQ(ParseCollective("ring"), std::nullopt);
}

TEST(PlanTest, AlgorithmNamesRoundTrip) {
  for (int i = 0; i < kNumAlgorithms; ++i) {
    const auto a = static_cast<Algorithm>(i);
    EXPECT_EQ(ParseAlgorithm(AlgorithmName(a)), a) << AlgorithmName(a);
  }
  EXPECT_EQ(AlgorithmName(Algorithm::kRing), "ring");
  EXPECT_EQ(AlgorithmName(Algorithm::kP2p), "p2p");
  EXPECT_EQ(AlgorithmName(static_cast<Algorithm>(kNumAlgorithms)), "invalid");
  EXPECT_EQ(ParseAlgorithm("Ring"), Algorithm::kRing);
  EXPECT_EQ(ParseAlgorithm("double_binary_tree"), Algorithm::kTree);
  EXPECT_EQ(ParseAlgorithm("DBT"), Algorithm::kTree);
  EXPECT_EQ(ParseAlgorithm("Rabenseifner"), Algorithm::kRhd);
  EXPECT_EQ(ParseAlgorithm("halving-doubling"), Algorithm::kRhd);
  EXPECT_EQ(ParseAlgorithm("recursive_doubling"), Algorithm::kRd);
  EXPECT_EQ(ParseAlgorithm("direct"), Algorithm::kPairwise);
  EXPECT_EQ(ParseAlgorithm("ina"), Algorithm::kIna);
  EXPECT_EQ(ParseAlgorithm("pina"), Algorithm::kIna);  // partial INA's name: the same algorithm
  EXPECT_EQ(ParseAlgorithm("twoshot"), std::nullopt);
  EXPECT_EQ(ParseAlgorithm(""), std::nullopt);
}

TEST(PlanTest, OtherNames) {
  EXPECT_EQ(BufferKindName(BufferKind::kInput), "in");
  EXPECT_EQ(BufferKindName(BufferKind::kOutput), "out");
  EXPECT_EQ(BufferKindName(BufferKind::kScratch), "scratch");
  EXPECT_EQ(BufferKindName(static_cast<BufferKind>(3)), "invalid");
  const std::vector<std::string> steps = {"send", "recv", "recv-reduce", "copy", "reduce", "scale"};
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(StepKindName(static_cast<StepKind>(i)), steps[i]);
  EXPECT_EQ(StepKindName(static_cast<StepKind>(6)), "invalid");
}

TEST(PlanTest, ReductionsAndRoots) {
  for (int i = 0; i < kNumCollectives; ++i) {
    const auto c = static_cast<Collective>(i);
    const bool reduction = c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
    const bool root = c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kSend ||
                      c == Collective::kRecv;
    EXPECT_EQ(IsReduction(c), reduction) << CollectiveName(c);
    EXPECT_EQ(HasRoot(c), root) << CollectiveName(c);
  }
}

TEST(PlanTest, BufferCountsFollowTheTable) {
  struct Row {
    Collective c;
    uint64_t in, out;
  };
  // nranks 4, count 10.
  const std::vector<Row> rows = {
      {Collective::kAllReduce, 10, 10}, {Collective::kReduceScatter, 40, 10}, {Collective::kAllGather, 10, 40},
      {Collective::kBroadcast, 10, 10}, {Collective::kReduce, 10, 10},        {Collective::kAllToAll, 40, 40},
      {Collective::kSend, 10, 0},       {Collective::kRecv, 0, 10},           {Collective::kBarrier, 0, 0},
  };
  for (const Row& row : rows) {
    CollectiveRequest r;
    r.collective = row.c;
    r.nranks = 4;
    r.count = 10;
    EXPECT_EQ(r.input_count(), row.in) << CollectiveName(row.c);
    EXPECT_EQ(r.output_count(), row.out) << CollectiveName(row.c);
  }
}

TEST(PlanTest, RequestToString) {
  CollectiveRequest r{Collective::kAllReduce, 8, 1000, DataType::kFloat32, ReduceOp::kSum, 0, false};
  EXPECT_EQ(r.ToString(), "allreduce count=1000 float32 sum nranks=8");
  r = {Collective::kReduce, 4, 7, DataType::kBfloat16, ReduceOp::kMax, 2, true};
  EXPECT_EQ(r.ToString(), "reduce count=7 bfloat16 max root=2 in-place nranks=4");
  r = {Collective::kSend, 2, 3, DataType::kInt8, ReduceOp::kSum, 1, false};
  EXPECT_EQ(r.ToString(), "send count=3 int8 peer=1 nranks=2");
  r = {Collective::kAllGather, 3, 5, DataType::kUint64, ReduceOp::kProd, 0, false};
  EXPECT_EQ(r.ToString(), "allgather count=5 uint64 nranks=3");  // no op for a non-reduction
}

TEST(PlanTest, SliceOverlap) {
  EXPECT_TRUE(Out(0, 4).Overlaps(Out(3, 2)));
  EXPECT_FALSE(Out(0, 4).Overlaps(Out(4, 2)));  // adjacent
  EXPECT_FALSE(Out(0, 4).Overlaps(In(0, 4)));   // different buffers
  EXPECT_FALSE(Out(2, 0).Overlaps(Out(0, 4)));  // empty
  EXPECT_EQ(Out(3, 5).end(), 8u);
}

TEST(PlanTest, ConflictsNeedAWriter) {
  const Step send_a = Step::Send(1, Out(0, 4));
  const Step send_b = Step::Send(2, Out(2, 4));
  EXPECT_FALSE(send_a.ConflictsWith(send_b));  // two readers
  const Step recv = Step::Recv(1, Out(2, 2));
  EXPECT_TRUE(send_a.ConflictsWith(recv));  // read vs write
  EXPECT_TRUE(recv.ConflictsWith(send_a));
  EXPECT_FALSE(recv.ConflictsWith(Step::Send(1, Out(4, 2))));
  EXPECT_TRUE(recv.ConflictsWith(Step::Recv(2, Out(3, 1))));  // write vs write
  const Step reduce = Step::Reduce({In(0, 2), Scr(0, 2)}, Out(0, 2));
  EXPECT_TRUE(reduce.ConflictsWith(Step::Recv(1, Scr(1, 1))));   // writes a source
  EXPECT_FALSE(reduce.ConflictsWith(Step::Send(1, In(0, 2))));   // both read the input
  EXPECT_TRUE(reduce.ConflictsWith(Step::Send(1, Out(1, 1))));   // reads what it writes
  EXPECT_FALSE(Step::Copy(In(0, 2), Out(0, 2)).ConflictsWith(Step::Copy(In(0, 2), Out(2, 2))));
}

TEST(PlanTest, StepCountAndCount) {
  RankPlan p;
  p.channels = {{Step::Send(1, In(0, 3)), Step::Recv(1, Out(0, 5))}, {}, {Step::Copy(In(0, 1), Out(1, 1))}};
  p.epilogue = {Step::Scale(Out(0, 1), Scr(0, 1))};
  EXPECT_EQ(p.step_count(), 4u);
  EXPECT_EQ(p.channels[0][0].count(), 3u);
  EXPECT_EQ(p.channels[0][1].count(), 5u);
}

// A valid plan for a 4-rank AllReduce of 8 elements, to be broken one way at a time.
class ValidateTest : public testing::Test {
 protected:
  CollectiveRequest req_{Collective::kAllReduce, 4, 8, DataType::kFloat32, ReduceOp::kSum, 0, false};

  static RankPlan Good() {
    RankPlan p;
    p.rank = 1;
    p.scratch_count = 4;
    p.divisor = 4;
    p.channels = {{Step::Send(2, In(0, 4)), Step::RecvReduce(0, In(4, 4), Out(4, 4)), Step::Recv(0, Scr(0, 4)),
                   Step::Reduce({Out(4, 4), Scr(0, 4)}, Out(4, 4)), Step::Copy(In(0, 4), Out(0, 4))},
                  {Step::Send(3, In(0, 0)), Step::Recv(3, Out(0, 0))}};  // zero-element messages are fine
    p.epilogue = {Step::Scale(Out(0, 4), Scr(0, 4)), Step::Copy(Scr(0, 4), Out(0, 4))};
    return p;
  }

  // ValidateRankPlan on Good() changed by `change`: an error containing every `parts`.
  template <typename F>
  void ExpectBad(F change, std::vector<std::string> parts, uint64_t max_step = 0) {
    RankPlan p = Good();
    change(p);
    const Status s = ValidateRankPlan(req_, p, max_step);
    ASSERT_FALSE(s.ok()) << parts[0];
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    for (const std::string& part : parts)
      EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
  }
};

TEST_F(ValidateTest, AcceptsAGoodPlan) {
  EXPECT_TRUE(ValidateRankPlan(req_, Good(), 0).ok());
  EXPECT_TRUE(ValidateRankPlan(req_, Good(), 4).ok());
  EXPECT_TRUE(ValidateRankPlan(req_, RankPlan{}, 1).ok());
}

TEST_F(ValidateTest, SlicesOutsideTheirBuffers) {
  ExpectBad([](RankPlan& p) { p.channels[0][0] = Step::Send(2, In(6, 4)); },
            {"rank 1", "channel 0 step 0 (send)", "source in[6+4] lies outside the in buffer of 8 elements"});
  ExpectBad([](RankPlan& p) { p.channels[0][4] = Step::Copy(In(0, 4), Out(8, 4)); },
            {"channel 0 step 4 (copy)", "destination out[8+4] lies outside the out buffer of 8 elements"});
  ExpectBad([](RankPlan& p) { p.scratch_count = 3; },
            {"channel 0 step 2 (recv)", "scratch[0+4]", "scratch buffer of 3"});
  // Offset + count overflowing must not wrap into range.
  ExpectBad([](RankPlan& p) { p.channels[0][0] = Step::Send(2, In(~uint64_t{0}, 2)); }, {"lies outside"});
  ExpectBad([](RankPlan& p) { p.channels[0][0] = Step::Send(2, {static_cast<BufferKind>(5), 0, 1}); },
            {"source names no buffer"});
}

TEST_F(ValidateTest, PeersAndStepShapes) {
  ExpectBad([](RankPlan& p) { p.channels[0][0].peer = 4; }, {"peer 4 out of range"});
  ExpectBad([](RankPlan& p) { p.channels[0][0].peer = -1; }, {"peer -1 out of range"});
  ExpectBad([](RankPlan& p) { p.channels[0][1].peer = 1; }, {"step 1 (recv-reduce)", "a transfer to the rank itself"});
  ExpectBad([](RankPlan& p) { p.channels[0][4].peer = 2; }, {"step 4 (copy)", "a local step with a peer"});
  ExpectBad([](RankPlan& p) { p.channels[0][0].srcs.clear(); }, {"0 sources where 1 expected"});
  ExpectBad([](RankPlan& p) { p.channels[0][2].srcs = {In(0, 4)}; }, {"step 2 (recv)", "1 sources where 0 expected"});
  ExpectBad([](RankPlan& p) { p.channels[0][3].srcs.pop_back(); }, {"a reduce with fewer than 2 sources"});
  ExpectBad([](RankPlan& p) { p.channels[0][4] = Step::Copy(In(0, 3), Out(0, 4)); },
            {"source in[0+3] and destination out[0+4] differ in count"});
}

TEST_F(ValidateTest, DestinationsOverlappingSources) {
  ExpectBad([](RankPlan& p) { p.channels[0][4] = Step::Copy(Out(0, 4), Out(2, 4)); },
            {"destination out[2+4] overlaps source out[0+4]"});
  // A reduction may update one of its sources in place, but only exactly that slice.
  ExpectBad([](RankPlan& p) { p.channels[0][1] = Step::RecvReduce(0, Out(3, 4), Out(4, 4)); },
            {"overlaps source out[3+4]"});
  ExpectBad([](RankPlan& p) { p.channels[0][3] = Step::Reduce({Out(0, 4), Out(2, 4)}, Out(0, 4)); },
            {"destination out[0+4] overlaps source out[2+4]"});
  ExpectBad([](RankPlan& p) { p.epilogue[0] = Step::Scale(Out(0, 4), Out(2, 4)); },
            {"epilogue step 0 (scale)", "destination out[2+4] overlaps source out[0+4]"});
}

TEST_F(ValidateTest, EmptyAndOversizedSteps) {
  ExpectBad([](RankPlan& p) { p.channels[0][4] = Step::Copy(In(0, 0), Out(0, 0)); },
            {"step 4 (copy)", "an empty step"});
  ExpectBad([](RankPlan& p) { p.channels[0][1] = Step::RecvReduce(0, In(4, 0), Out(4, 0)); }, {"an empty step"});
  ExpectBad([](RankPlan&) {}, {"channel 0 step 0 (send)", "4 elements, more than the chunk of 3"}, 3);
  ExpectBad([](RankPlan& p) { p.divisor = 0; }, {"epilogue step 0 (scale)", "a scale step with divisor 0"});
}

TEST_F(ValidateTest, NamesTheRequest) {
  ExpectBad([](RankPlan& p) { p.channels[1][0].peer = 9; },
            {"plan for allreduce count=8 float32 sum nranks=4 rank 1: channel 1 step 0 (send): peer 9 out of range"});
}

// The dumps are for people: runs of spaces are not part of the format.
std::string Squeeze(const std::string& s) {
  std::string out;
  for (char c : s)
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out.push_back(c);
  return out;
}

TEST(PlanTest, RankPlanToString) {
  RankPlan p;
  p.rank = 2;
  p.scratch_count = 50;
  p.divisor = 4;
  p.channels = {{Step::RecvReduce(1, In(100, 50), Out(100, 50)), Step::Send(3, Out(100, 50))},
                {Step::Reduce({In(0, 2), Scr(0, 2)}, Out(0, 2))}};
  p.epilogue = {Step::Scale(Out(0, 2), Scr(2, 2))};
  EXPECT_EQ(Squeeze(RankPlanToString(p)),
            Squeeze("rank 2: 4 steps, scratch 50 elements\n"
            "  c0 #0 recv-reduce peer=1 out[100+50] <- in[100+50]\n"
            "  c0 #1 send peer=3 out[100+50]\n"
            "  c1 #0 reduce out[0+2] <- in[0+2], scratch[0+2]\n"
            "  epilogue #0 scale scratch[2+2] <- out[0+2] / 4\n"));
}

TEST(PlanTest, PlanToString) {
  Plan plan;
  plan.request = {Collective::kBroadcast, 2, 4, DataType::kInt32, ReduceOp::kSum, 1, false};
  plan.algorithm = Algorithm::kTree;
  plan.chunk_count = 4;
  plan.channels = 1;
  plan.ranks.resize(2);
  plan.ranks[0].rank = 0;
  plan.ranks[0].channels = {{Step::Recv(1, Out(0, 4))}};
  plan.ranks[1].rank = 1;
  plan.ranks[1].channels = {{Step::Copy(In(0, 4), Out(0, 4)), Step::Send(0, In(0, 4))}};
  EXPECT_EQ(Squeeze(PlanToString(plan)),
            Squeeze("plan: broadcast count=4 int32 root=1 nranks=2 algorithm=tree chunk=4 elements channels=1\n"
            "rank 0: 1 steps, scratch 0 elements\n"
            "  c0 #0 recv peer=1 out[0+4]\n"
            "rank 1: 2 steps, scratch 0 elements\n"
            "  c0 #0 copy out[0+4] <- in[0+4]\n"
            "  c0 #1 send peer=0 in[0+4]\n"));
}

}  // namespace
}  // namespace kizuna::collectives
