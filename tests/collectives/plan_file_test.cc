// Communicators that run plan files (KIZUNA_PLAN_FILE, docs/PLAN_FILES.md): the example plans of
// examples/plans give exact results through the executor on emulated devices, named per call or
// through KIZUNA_ALGO, pipelined in passes where a unit outgrows a chunk; a file that does not
// compute the collective stops the communicator's creation, naming where.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/log_capture.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

constexpr int kRanks = 8;

Config PlanConfig(std::vector<std::string> files) {
  Config c = WorldConfig(kRanks);
  c.plan_files = std::move(files);
  return c;
}

// AllReduce of `count` floats over every rank with `call`, each rank's input r + 1 + (i % 7),
// checked element by element; in place or not.
void AllReduceChecked(World& w, size_t count, const CallOptions& call, bool in_place) {
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < w.size(); ++r) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(r + 1 + static_cast<int>(i % 7));
    auto a = w.Allocate(r, count * sizeof(float));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(w.Upload(r, (*a)->data(), v).ok());
    in.push_back(std::move(*a));
    if (!in_place) {
      auto b = w.Allocate(r, count * sizeof(float));
      ASSERT_TRUE(b.ok());
      out.push_back(std::move(*b));
    }
  }
  for (int r = 0; r < w.size(); ++r) {
    void* dst = in_place ? in[static_cast<size_t>(r)]->data() : out[static_cast<size_t>(r)]->data();
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(in[static_cast<size_t>(r)]->data(), dst, count, DataType::kFloat32, ReduceOp::kSum,
                               w.stream(r), call)
                    .ok());
  }
  for (int r = 0; r < w.size(); ++r) ASSERT_TRUE(w.stream(r).Synchronize(Deadline::AfterSeconds(60)).ok());
  for (int r = 0; r < w.size(); ++r) {
    const void* result = in_place ? in[static_cast<size_t>(r)]->data() : out[static_cast<size_t>(r)]->data();
    auto got = w.Download<float>(r, result, count);
    ASSERT_TRUE(got.ok());
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(kRanks * (kRanks + 1) / 2 + kRanks * static_cast<int>(i % 7));
      ASSERT_EQ((*got)[i], want) << "rank " << r << " element " << i;
    }
  }
}

TEST(PlanFiles, TheExamplePlansRunThroughTheExecutor) {
  for (const char* name : {"torus2d_4x2", "ocs_pairs_8"}) {
    SCOPED_TRACE(name);
    World w(kRanks, PlanConfig({fmt::format("examples/plans/{}.json", name)}));
    ASSERT_TRUE(w.status().ok()) << w.status().ToString();
    kizuna::testing::LogCapture log(LogLevel::kInfo, kLogTune | kLogColl);
    CallOptions call;
    call.algorithm = collectives::Algorithm::kFile;
    // 8 units of 5 elements; then units of 300,000 elements, more than a chunk (2 MiB of staging):
    // the plan runs in passes.
    AllReduceChecked(w, 40, call, false);
    AllReduceChecked(w, 8 * 300000, call, false);
    AllReduceChecked(w, 8 * 1000, call, true);
    const std::string text = log.Text();
    EXPECT_NE(text.find("allreduce count=2400000 float32 sum nranks=8: file (predicted"), std::string::npos) << text;
  }
}

// Rings both ways round two cycles that share no cable (a 2 x 4 torus's): four channels of 8
// units each, 32 in all; out of place, in passes, and in place.
TEST(PlanFiles, TheTwoCyclePlanRunsThroughTheExecutor) {
  World w(kRanks, PlanConfig({"examples/plans/hamilton_2x4.json"}));
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  CallOptions call;
  call.algorithm = collectives::Algorithm::kFile;
  AllReduceChecked(w, 32 * 5, call, false);
  AllReduceChecked(w, 32 * 75000, call, false);
  AllReduceChecked(w, 32 * 250, call, true);
}

// Through KIZUNA_ALGO, as any algorithm; a count the file's units do not divide falls back to the
// model's choice and still gives the sum.
TEST(PlanFiles, KizunaAlgoNamesTheFileAndOtherCountsFallBack) {
  Config c = PlanConfig({"examples/plans/torus2d_4x2.json"});
  c.algo = "allreduce:file";
  World w(kRanks, c);
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  kizuna::testing::LogCapture log(LogLevel::kInfo, kLogTune);
  AllReduceChecked(w, 800, CallOptions{}, false);
  AllReduceChecked(w, 801, CallOptions{}, false);  // 8 units do not divide 801
  const std::string text = log.Text();
  EXPECT_NE(text.find("allreduce count=800 float32 sum nranks=8: file (predicted"), std::string::npos) << text;
  EXPECT_EQ(text.find("allreduce count=801 float32 sum nranks=8: file (predicted"), std::string::npos) << text;
  EXPECT_NE(text.find("units do not divide the count 801"), std::string::npos) << text;
}

// A file that computes something else stops the communicator at creation, naming the rank and
// where its result goes wrong; a file for another number of ranks is left out.
TEST(PlanFiles, AWrongFileStopsCreationAndOneForOtherRanksIsLeftOut) {
  const std::string dir = ::testing::TempDir();
  std::ifstream in("examples/plans/ocs_pairs_8.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string reduce = "\"recv-reduce\"";
  const size_t at = text.find(reduce);
  ASSERT_NE(at, std::string::npos);
  // Rank 0's first exchange keeps the peer's half without adding its own.
  std::string wrong = text;
  wrong.replace(at, reduce.size(), "\"recv\"");
  const size_t src = wrong.find("\"src\"", at);
  const size_t src_end = wrong.find('"', wrong.find('"', src + 6) + 1);
  wrong.erase(wrong.rfind(',', src), src_end + 1 - wrong.rfind(',', src));
  const std::string path = dir + "/wrong_plan.json";
  std::ofstream(path) << wrong;
  World bad(kRanks, PlanConfig({path}));
  ASSERT_FALSE(bad.status().ok());
  EXPECT_NE(bad.status().message().find("KIZUNA_PLAN_FILE"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("rank 0's output is wrong at unit"), std::string::npos)
      << bad.status().ToString();
  World four(4, PlanConfig({"examples/plans/ocs_pairs_8.json"}));
  EXPECT_TRUE(four.status().ok()) << four.status().ToString();
}

}  // namespace
}  // namespace kizuna::test
