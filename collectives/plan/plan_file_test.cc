#include "collectives/plan/plan_file.h"

#include <string>

#include <gtest/gtest.h>

namespace kizuna::collectives {
namespace {

// Two ranks, two units: each keeps the sum of one unit and sends it back.
constexpr const char* kTwoRanks = R"({
  "format": "kizuna-plan 1", "name": "pair", "collective": "allreduce", "nranks": 2, "units": 2,
  "ranks": [
    {"rank": 0, "channels": [[
      {"step": "send", "peer": 1, "src": "in[1+1]"},
      {"step": "recv-reduce", "peer": 1, "dst": "out[0+1]", "src": "in[0+1]"},
      {"step": "send", "peer": 1, "src": "out[0+1]"},
      {"step": "recv", "peer": 1, "dst": "out[1+1]"}]]},
    {"rank": 1, "channels": [[
      {"step": "send", "peer": 0, "src": "in[0+1]"},
      {"step": "recv-reduce", "peer": 0, "dst": "out[1+1]", "src": "in[1+1]"},
      {"step": "send", "peer": 0, "src": "out[1+1]"},
      {"step": "recv", "peer": 0, "dst": "out[0+1]"}]]}
  ]})";

CollectiveRequest AllReduce(uint64_t count, int nranks = 2) {
  CollectiveRequest r;
  r.nranks = nranks;
  r.count = count;
  return r;
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(PlanFile, ParsesAndScalesUnitsToTheCount) {
  auto f = ParsePlanFile(kTwoRanks, "pair.json");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->name, "pair");
  EXPECT_EQ(f->nranks, 2);
  EXPECT_EQ(f->units, 2u);
  ASSERT_EQ(f->ranks[1].channels[0].size(), 4u);
  ASSERT_TRUE(PlanFileServes(*f, AllReduce(8)).ok());
  auto rp = InstantiatePlanFile(*f, AllReduce(8), 0, 1 << 20);
  ASSERT_TRUE(rp.ok());
  EXPECT_EQ(rp->channels[0][0], Step::Send(1, Slice{BufferKind::kInput, 4, 4}));
  EXPECT_EQ(rp->channels[0][3], Step::Recv(1, Slice{BufferKind::kOutput, 4, 4}));
}

// A unit larger than a chunk: the plan runs in passes, each on its share of every unit.
TEST(PlanFile, UnitsLargerThanAChunkRunInPasses) {
  auto f = ParsePlanFile(kTwoRanks, "pair.json");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(PlanFilePasses(*f, AllReduce(8), 2), 2u);   // units of 4, steps of 1 unit, chunks of 2
  EXPECT_EQ(PlanFilePasses(*f, AllReduce(24), 5), 3u);  // units of 12: 12 / 3 = 4 <= 5
  EXPECT_EQ(PlanFilePasses(*f, AllReduce(8), 1 << 20), 1u);
  auto rp = InstantiatePlanFile(*f, AllReduce(8), 0, 2);
  ASSERT_TRUE(rp.ok());
  ASSERT_EQ(rp->channels[0].size(), 8u);
  // Pass 1 covers the buffer's second half, its units laid out in it: unit 0 at 4, unit 1 at 6.
  EXPECT_EQ(rp->channels[0][4], Step::Send(1, Slice{BufferKind::kInput, 6, 2}));
  EXPECT_EQ(rp->channels[0][7], Step::Recv(1, Slice{BufferKind::kOutput, 6, 2}));
  EXPECT_EQ(rp->channels[0][5].srcs[0], (Slice{BufferKind::kInput, 4, 2}));
}

TEST(PlanFile, ServesOnlyItsCollectiveRanksAndCounts) {
  auto f = ParsePlanFile(kTwoRanks, "pair.json");
  ASSERT_TRUE(f.ok());
  CollectiveRequest gather = AllReduce(8);
  gather.collective = Collective::kAllGather;
  EXPECT_NE(PlanFileServes(*f, gather).message().find("it is a allreduce plan, not allgather"), std::string::npos);
  EXPECT_NE(PlanFileServes(*f, AllReduce(8, 3)).message().find("for 2 ranks, the communicator has 3"),
            std::string::npos);
  EXPECT_NE(PlanFileServes(*f, AllReduce(7)).message().find("2 units do not divide the count 7"), std::string::npos);
  CollectiveRequest in_place = AllReduce(8);
  in_place.in_place = true;
  EXPECT_NE(PlanFileServes(*f, in_place).message().find("not for in-place buffers"), std::string::npos);
  auto only_in = ParsePlanFile(Replace(kTwoRanks, "\"units\": 2,", "\"units\": 2, \"placement\": \"in\","), "in.json");
  ASSERT_TRUE(only_in.ok()) << only_in.status().ToString();
  EXPECT_TRUE(PlanFileServes(*only_in, in_place).ok());
  EXPECT_NE(PlanFileServes(*only_in, AllReduce(8)).message().find("for in-place buffers only"), std::string::npos);
}

// Every malformed file is named with what is wrong and where.
TEST(PlanFile, BadFilesNameTheRankChannelAndStep) {
  const std::string good = kTwoRanks;
  const struct {
    std::string text, want;
  } cases[] = {
      {Replace(good, "kizuna-plan 1", "kizuna-plan 9"), "pair.json: \"format\" must be \"kizuna-plan 1\""},
      {Replace(good, "\"allreduce\"", "\"send\""), "\"collective\" must name a collective with data"},
      {Replace(good, "\"units\": 2", "\"units\": 0"), "\"units\" must be a positive whole number"},
      {Replace(good, "\"units\": 2,", "\"units\": 2, \"placement\": \"inside\","),
       "\"placement\" must be \"out\", \"in\" or \"both\" (found \"inside\")"},
      {Replace(good, "\"nranks\": 2", "\"nranks\": 3"), "\"ranks\" must be an array of 3 ranks"},
      {Replace(good, "{\"rank\": 1,", "{\"rank\": 0,"), "rank 0: listed twice"},
      {Replace(good, "\"peer\": 1, \"src\": \"in[1+1]\"", "\"peer\": 5, \"src\": \"in[1+1]\""),
       "rank 0, channel 0, step 0: \"peer\" must be a rank from 0 to 1 (found 5)"},
      {Replace(good, "\"peer\": 1, \"src\": \"in[1+1]\"", "\"peer\": 0, \"src\": \"in[1+1]\""),
       "rank 0, channel 0, step 0: the peer is the rank itself"},
      {Replace(good, "\"step\": \"recv\", \"peer\": 1", "\"step\": \"sendrecv\", \"peer\": 1"),
       "rank 0, channel 0, step 3: \"step\" must be send, recv, recv-reduce, copy or reduce (found \"sendrecv\")"},
      {Replace(good, "\"dst\": \"out[1+1]\"}]]},", "\"dst\": \"out[1+2]\"}]]},"),
       "rank 0, channel 0, step 3: out[1+2] ends at unit 3, past the 2 unit(s) of its buffer"},
      {Replace(good, "\"src\": \"in[0+1]\"}", "\"src\": \"input[0+1]\"}"),
       "rank 0, channel 0, step 1: \"src\" must be a slice such as \"in[0+2]\""},
      {Replace(good, "{\"step\": \"recv\", \"peer\": 1, \"dst\": \"out[1+1]\"}", "{\"step\": \"recv\", \"peer\": 1}"),
       "rank 0, channel 0, step 3: a recv step needs \"dst\""},
      {"{\"format\": \"kizuna-plan 1\",", "pair.json:1:"},
  };
  for (const auto& c : cases) {
    auto f = ParsePlanFile(c.text, "pair.json");
    ASSERT_FALSE(f.ok()) << c.want;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(c.want), std::string::npos) << f.status().message();
  }
}

// ReduceScatter's input has a block per rank: a slice may not run from one into the next.
TEST(PlanFile, SlicesStayInsideOneRanksBlock) {
  std::string text = Replace(kTwoRanks, "\"allreduce\"", "\"reducescatter\"");
  text = Replace(text, "\"src\": \"in[1+1]\"", "\"src\": \"in[1+2]\"");
  auto f = ParsePlanFile(text, "rs.json");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("rank 0, channel 0, step 0: in[1+2] crosses from rank 0's block into the "
                                      "next (2 units each)"),
            std::string::npos)
      << f.status().message();
}

TEST(PlanFile, AMissingFileIsNamed) {
  auto f = LoadPlanFile("/nonexistent/plan.json");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("/nonexistent/plan.json"), std::string::npos) << f.status().message();
}

}  // namespace
}  // namespace kizuna::collectives
