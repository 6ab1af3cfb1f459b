// Plan files against the simulator and the reference: every algorithm's own plans, dumped as
// files, load back to the same steps and pass the check; files that deadlock, that send a different
// count than the receive takes, or that compute the wrong result are refused, naming where.
#include "collectives/algorithms/from_file.h"

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/algorithms_test_util.h"

namespace kizuna::collectives {
namespace {

using algotest::Full;

// Instantiated at its own count, the file is the plan it came from.
void ExpectSameSteps(const PlanFile& f, const Plan& plan, uint64_t chunk) {
  for (int r = 0; r < f.nranks; ++r) {
    auto rp = InstantiatePlanFile(f, plan.request, r, chunk);
    ASSERT_TRUE(rp.ok()) << rp.status().ToString();
    EXPECT_EQ(rp->channels, plan.ranks[static_cast<size_t>(r)].channels) << "rank " << r;
  }
}

PlanFile Dumped(Algorithm a, Collective c, int n, uint64_t count, bool in_place = false) {
  CollectiveRequest req{c, n, count, DataType::kFloat32, ReduceOp::kSum, 0, in_place};
  PlanOptions options;
  options.chunk_count = 3;  // several chunks per part: the dumps hold pipelined plans
  auto plan = BuildPlan(a, req, Full(n), options, -1);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  auto text = PlanToJson(*plan, "dump");
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  auto f = ParsePlanFile(text.ok() ? *text : "", "dump.json");
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return {};
  ExpectSameSteps(*f, *plan, options.chunk_count);
  return std::move(f).value();
}

TEST(PlanFileCheck, EveryAlgorithmsOwnPlansPassAsFiles) {
  const struct {
    Algorithm a;
    Collective c;
  } cases[] = {
      {Algorithm::kRing, Collective::kAllReduce},    {Algorithm::kRing, Collective::kReduceScatter},
      {Algorithm::kRing, Collective::kAllGather},    {Algorithm::kRing, Collective::kBroadcast},
      {Algorithm::kTree, Collective::kAllReduce},    {Algorithm::kTree, Collective::kReduce},
      {Algorithm::kRhd, Collective::kAllReduce},     {Algorithm::kRd, Collective::kAllReduce},
      {Algorithm::kPairwise, Collective::kAllToAll}, {Algorithm::kPairwise, Collective::kReduceScatter},
  };
  for (const auto& c : cases)
    for (int n : {3, 4}) {
      SCOPED_TRACE(fmt::format("{} {} on {} ranks", AlgorithmName(c.a), CollectiveName(c.c), n));
      const PlanFile f = Dumped(c.a, c.c, n, 12);
      ASSERT_EQ(f.nranks, n);
      const Status s = CheckPlanFile(f);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
}

// Plans built for in-place buffers, dumped (their files say "placement": "in"), pass the check:
// AllGather's input inside its output, ReduceScatter's output inside its input, a Reduce whose
// non-roots keep their buffers.
TEST(PlanFileCheck, InPlacePlansPassInPlace) {
  for (auto [a, c] :
       {std::pair(Algorithm::kRing, Collective::kAllGather), std::pair(Algorithm::kRing, Collective::kReduceScatter),
        std::pair(Algorithm::kRing, Collective::kAllReduce), std::pair(Algorithm::kTree, Collective::kReduce)}) {
    SCOPED_TRACE(fmt::format("{} {}", AlgorithmName(a), CollectiveName(c)));
    const PlanFile f = Dumped(a, c, 4, 8, /*in_place=*/true);
    ASSERT_TRUE(f.in_place);
    ASSERT_FALSE(f.out_of_place);
    const Status s = CheckPlanFile(f);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

// The two-rank exchange of plan_file_test.cc, with one change each.
std::string Pair(const std::string& r0_last, const std::string& r0_first =
                                                 "{\"step\": \"send\", \"peer\": 1, "
                                                 "\"src\": \"in[1+1]\"}") {
  return R"({"format": "kizuna-plan 1", "collective": "allreduce", "nranks": 2, "units": 2, "ranks": [
    {"rank": 0, "channels": [[)" +
         r0_first + R"(,
      {"step": "recv-reduce", "peer": 1, "dst": "out[0+1]", "src": "in[0+1]"},
      {"step": "send", "peer": 1, "src": "out[0+1]"},
      )" +
         r0_last +
         R"(]]},
    {"rank": 1, "channels": [[
      {"step": "send", "peer": 0, "src": "in[0+1]"},
      {"step": "recv-reduce", "peer": 0, "dst": "out[1+1]", "src": "in[1+1]"},
      {"step": "send", "peer": 0, "src": "out[1+1]"},
      {"step": "recv", "peer": 0, "dst": "out[0+1]"}]]}]})";
}

Status Check(const std::string& text) {
  auto f = ParsePlanFile(text, "bad.json");
  if (!f.ok()) return f.status();
  return CheckPlanFile(*f);
}

TEST(PlanFileCheck, TheGoodPairPasses) {
  EXPECT_TRUE(Check(Pair(R"({"step": "recv", "peer": 1, "dst": "out[1+1]"})")).ok());
}

TEST(PlanFileCheck, AWrongResultIsNamedByRankAndUnit) {
  // Rank 0 takes rank 1's part of unit 0 without adding its own.
  std::string text = Pair(R"({"step": "recv", "peer": 1, "dst": "out[1+1]"})");
  const std::string reduce = R"({"step": "recv-reduce", "peer": 1, "dst": "out[0+1]", "src": "in[0+1]"})";
  text.replace(text.find(reduce), reduce.size(), R"({"step": "recv", "peer": 1, "dst": "out[0+1]"})");
  const Status s = Check(text);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad.json: checked at 1 element(s) per unit"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 0's output is wrong at unit 0"), std::string::npos) << s.message();
}

TEST(PlanFileCheck, ADeadlockIsNamedByRankChannelAndStep) {
  // Each rank first waits for two messages from the other, which sends only after its own two:
  // with two steps in flight per channel (plan.h) neither ever sends.
  const std::string rank = R"({"rank": R, "channels": [[
      {"step": "recv", "peer": P, "dst": "out[1+1]"},
      {"step": "recv", "peer": P, "dst": "out[0+1]"},
      {"step": "send", "peer": P, "src": "in[0+1]"},
      {"step": "send", "peer": P, "src": "in[1+1]"}]]})";
  auto of = [&](int r) {
    std::string t = rank;
    t.replace(t.find('R'), 1, std::to_string(r));
    for (size_t at; (at = t.find('P')) != std::string::npos;) t.replace(at, 1, std::to_string(1 - r));
    return t;
  };
  const Status s = Check(R"({"format": "kizuna-plan 1", "collective": "allreduce", "nranks": 2, "units": 2,
                             "ranks": [)" +
                         of(0) + "," + of(1) + "]}");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("deadlock"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 0 channel 0: step 0 (recv from rank 1, 1 elements) waits for rank 1"),
            std::string::npos)
      << s.message();
}

TEST(PlanFileCheck, ATransferWithoutItsMatchIsNamed) {
  // Rank 0 copies where it should receive: rank 1's last send has no receive.
  const Status s = Check(Pair(R"({"step": "copy", "dst": "out[1+1]", "src": "in[1+1]"})"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 channel 0 step 2 (send to rank 0, 1 elements) has no matching receive"),
            std::string::npos)
      << s.message();
}

// The example plans of examples/plans (make_plans.py), in place too.
TEST(PlanFileCheck, TheExamplePlansPass) {
  for (const char* name : {"torus2d_4x2", "ocs_pairs_8", "hamilton_2x4"}) {
    auto f = LoadPlanFile(std::string("examples/plans/") + name + ".json");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_TRUE(f->in_place);
    const Status s = CheckPlanFile(*f);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

}  // namespace
}  // namespace kizuna::collectives
