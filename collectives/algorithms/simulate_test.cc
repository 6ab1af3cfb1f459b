// The plan simulator's own checks (simulate.h): deadlocks named step by step, the window a ring
// needs, mismatched counts, unmatched sends and receives, races in memory, plans it cannot run.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "collectives/algorithms/simulate.h"

namespace kizuna::collectives {
namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

void ExpectStatus(const Status& s, StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(part), std::string::npos) << "'" << part << "' not in: " << s.ToString();
}

// A two-rank AllReduce-shaped plan (2 elements) from hand-written steps.
Plan HandPlan(std::vector<std::vector<Step>> rank0, std::vector<std::vector<Step>> rank1, bool in_place = false) {
  Plan plan;
  plan.request = {Collective::kAllReduce, 2, 2, DataType::kFloat32, ReduceOp::kSum, 0, in_place};
  plan.chunk_count = 2;
  plan.ranks.resize(2);
  plan.ranks[0].rank = 0;
  plan.ranks[0].channels = std::move(rank0);
  plan.ranks[1].rank = 1;
  plan.ranks[1].channels = std::move(rank1);
  return plan;
}

Status RunHand(const Plan& plan, int window = 2) {
  static float in[2][2] = {{1, 2}, {3, 4}}, out[2][2];
  std::vector<SimRankBuffers> buffers = {{in[0], plan.request.in_place ? in[0] : out[0]},
                                         {in[1], plan.request.in_place ? in[1] : out[1]}};
  SimOptions options;
  options.window = window;
  return SimulatePlan(plan, buffers, options).status();
}

Slice In(uint64_t off, uint64_t n) { return {BufferKind::kInput, off, n}; }
Slice Out(uint64_t off, uint64_t n) { return {BufferKind::kOutput, off, n}; }

TEST(SimulatorTest, ReportsADeadlockNamingEveryStuckStep) {
  // Both ranks post two receives before their sends: with a window of 2 neither send starts.
  auto recv_first = [](int peer) {
    return std::vector<std::vector<Step>>{{Step::Recv(peer, Out(0, 1)), Step::Recv(peer, Out(1, 1)),
                                           Step::Send(peer, In(0, 1)), Step::Send(peer, In(1, 1))}};
  };
  const Plan plan = HandPlan(recv_first(1), recv_first(0));
  const Status s = RunHand(plan, 2);
  ExpectStatus(s, StatusCode::kInternal, "deadlock");
  for (const char* part :
       {"rank 0 channel 0:", "rank 1 channel 0:", "step 0 (recv from rank 1, 1 elements) waits",
        "step 1 (recv from rank 0, 1 elements) waits", "step 2 (send to rank 0, 1 elements) not started"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " not in " << s.message();
  // With a window of 3 the first send starts, and everything completes.
  EXPECT_TRUE(RunHand(plan, 3).ok());
}

TEST(SimulatorTest, ARingNeedsAWindowOfTwo) {
  // Every rank sends before it receives: rendezvous sends with a window of 1 wait forever.
  const CollectiveRequest req{Collective::kAllReduce, 3, 9, DataType::kInt32, ReduceOp::kSum, 0, false};
  PlanOptions whole;  // one chunk per part
  whole.chunk_count = kUnlimited;
  Result<Plan> plan =
      BuildPlan(Algorithm::kRing, req, CommTopology::Uniform(3, RankDesc{"host", "emu:"}, LinkDesc{true}), whole, -1);
  ASSERT_TRUE(plan.ok());
  std::vector<std::vector<int32_t>> in(3, std::vector<int32_t>(9, 1)), out(3, std::vector<int32_t>(9));
  std::vector<SimRankBuffers> buffers;
  for (int r = 0; r < 3; ++r)
    buffers.push_back({in[static_cast<size_t>(r)].data(), out[static_cast<size_t>(r)].data()});
  SimOptions options;
  options.window = 1;
  ExpectStatus(SimulatePlan(*plan, buffers, options).status(), StatusCode::kInternal, "deadlock");
  options.window = 2;
  Result<SimStats> ok = SimulatePlan(*plan, buffers, options);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(out[2], std::vector<int32_t>(9, 3));
  // 2(p-1) messages per rank of n/p elements each.
  EXPECT_EQ(ok->messages, 12u);
  EXPECT_EQ(ok->bytes_sent, 12u * 3 * sizeof(int32_t));
}

TEST(SimulatorTest, ReportsMismatchedCounts) {
  const Plan plan = HandPlan({{Step::Send(1, In(0, 2))}}, {{Step::Recv(0, Out(0, 1))}});
  const Status s = RunHand(plan);
  ExpectStatus(s, StatusCode::kInternal, "rank 0 channel 0 step 0 (send to rank 1, 2 elements)");
  ExpectStatus(s, StatusCode::kInternal, "rank 1 channel 0 step 0 (recv from rank 0, 1 elements)");
  ExpectStatus(s, StatusCode::kInternal, "counts differ");
}

TEST(SimulatorTest, ReportsUnmatchedSendsAndReceives) {
  ExpectStatus(RunHand(HandPlan({{Step::Send(1, In(0, 2))}}, {{}})), StatusCode::kInternal,
               "rank 0 channel 0 step 0 (send to rank 1, 2 elements) has no matching receive");
  ExpectStatus(RunHand(HandPlan({{}}, {{Step::Send(0, In(0, 1)), Step::RecvReduce(0, In(0, 1), Out(0, 1))}})),
               StatusCode::kInternal,
               "rank 1 channel 0 step 1 (recv-reduce from rank 0, 1 elements) has no matching send");
  // The same steps on different channels do not match either.
  ExpectStatus(RunHand(HandPlan({{Step::Send(1, In(0, 2))}}, {{}, {Step::Recv(0, Out(0, 2))}})),
               StatusCode::kInternal, "no matching");
}

TEST(SimulatorTest, ReportsRacesThatSliceConflictsCannotSee) {
  // In place the input is the output: a copy from one onto the other overlaps in memory.
  ExpectStatus(RunHand(HandPlan({{Step::Copy(In(0, 2), Out(0, 2))}}, {{}}, /*in_place=*/true)), StatusCode::kInternal,
               "overlaps source 0 in memory");
  // Two channels receiving into the same output at once.
  const Plan plan = HandPlan({{Step::Recv(1, Out(0, 2))}, {Step::Recv(1, Out(1, 1))}},
                             {{Step::Send(0, In(0, 2))}, {Step::Send(0, In(0, 1))}});
  ExpectStatus(RunHand(plan), StatusCode::kInternal, "races with rank 0 channel 0 step 0");
}

TEST(SimulatorTest, RejectsPlansItCannotRun) {
  // A plan that fails ValidateRankPlan.
  ExpectStatus(RunHand(HandPlan({{Step::Send(1, In(1, 2))}}, {{Step::Recv(0, Out(0, 2))}})), StatusCode::kInternal,
               "outside");
  // Not every rank present.
  Plan missing = HandPlan({{}}, {{}});
  missing.ranks.pop_back();
  ExpectStatus(RunHand(missing), StatusCode::kInvalidArgument, "holds 1 ranks");
  ExpectStatus(RunHand(HandPlan({{}}, {{}}), 0), StatusCode::kInvalidArgument, "window 0");
  std::vector<SimRankBuffers> none(2);
  ExpectStatus(SimulatePlan(HandPlan({{}}, {{}}), none, {}).status(), StatusCode::kInvalidArgument, "no input buffer");
}

}  // namespace
}  // namespace kizuna::collectives
