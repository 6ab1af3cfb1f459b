// The tuner plugin loader (tuner_plugin.h) against the example plugin (example_plugin/: ring from
// 1 MiB) and the test plugins in testdata/: version and table checks with clear errors, every kind
// of bad answer refused in favour of the model's choice (warned once per kind, counted), a valid
// answer applied field by field, which calls the plugin decides, and the ranks' agreement.
// Selections are made by hand here, so that the model's choice is known; communicators with a
// plugin loaded are //tests/tuner's.
//
//   tuner_plugin_test --example_plugin=PATH [test plugin paths...] [gtest flags]

#include "collectives/tuner/tuner_plugin.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/core/log_capture.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives::tuner {
namespace {

std::string g_example;
std::map<std::string, std::string> g_cases;  // case -> path ("source": the C file)

std::string Case(const std::string& name) {
  auto it = g_cases.find(name);
  return it == g_cases.end() ? "/nonexistent/libtuner_" + name + ".so" : it->second;
}

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

CommTopology Shape(int n, int hosts = 1) {
  CommTopology s = CommTopology::Uniform(n, RankDesc{"host", "dev", 0, 0, 0}, LinkDesc{true, 0, 0, true});
  for (int r = 0; r < n; ++r) s.ranks[static_cast<size_t>(r)].host_id = "host" + std::to_string(r % hosts);
  return s;
}

PlanOptions Options(uint64_t chunk_count = 262144, int channels = 1) {
  PlanOptions o;
  o.chunk_count = chunk_count;
  o.channels = channels;
  return o;
}

// The model's selection as SelectAlgorithm would leave it when nothing is forced: every algorithm a
// candidate, those in `supported` able to serve the call, `model` the cheapest of them.
Selection ModelSelection(Collective c, uint64_t count, Algorithm model, const std::set<Algorithm>& supported,
                         DataType dtype = DataType::kFloat32) {
  Selection sel;
  sel.request.collective = c;
  sel.request.nranks = 4;
  sel.request.count = count;
  sel.request.dtype = dtype;
  for (int i = 0; i < kNumAlgorithms; ++i) {
    Candidate cand;
    cand.algorithm = static_cast<Algorithm>(i);
    if (supported.count(cand.algorithm)) {
      cand.prediction.seconds = cand.algorithm == model ? 1e-3 : 2e-3 + 1e-4 * i;
    } else {
      cand.support = NotSupported(std::string(AlgorithmName(cand.algorithm)) + " is not served in this test");
    }
    sel.candidates.push_back(std::move(cand));
  }
  sel.chosen = model;
  sel.reason = "chosen by the model";
  return sel;
}

const std::set<Algorithm> kAllReduceAlgorithms = {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kRd};

std::unique_ptr<TunerPlugin> LoadAndInit(const std::string& path, int rank = 0, const CommTopology& shape = Shape(4)) {
  auto loaded = TunerPlugin::Load(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (!loaded.ok()) return nullptr;
  Status s = (*loaded)->Init(rank, shape);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return s.ok() ? std::move(*loaded) : nullptr;
}

int CountLines(const std::string& text, std::string_view part) {
  int n = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) n += Contains(line, part) ? 1 : 0;
  return n;
}

// ---- The example plugin ----

TEST(ExampleTunerTest, ChoosesRingFromOneMiBAndKeepsTheModelsChoiceBelow) {
  ASSERT_FALSE(g_example.empty()) << "pass --example_plugin=PATH";
  auto plugin = LoadAndInit(g_example);
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name(), "example_ring");
  EXPECT_EQ(plugin->identity(), "example_ring 1.0.0");

  // 1 MiB of float32: ring, and chunks cut from the engine's 1 MiB to 256 KiB.
  Selection big = ModelSelection(Collective::kAllReduce, 262144, Algorithm::kTree, kAllReduceAlgorithms);
  plugin->Choose(big, Options());
  EXPECT_EQ(big.chosen, Algorithm::kRing);
  EXPECT_TRUE(big.tuned);
  EXPECT_EQ(big.chunk_count, uint64_t{65536});
  EXPECT_FALSE(big.channels.has_value());
  EXPECT_EQ(big.reason, "chosen by tuner plugin example_ring 1.0.0 (over the model's tree, chunk 256 KiB)");
  EXPECT_TRUE(Contains(SelectionToString(big),
                       "allreduce count=262144 float32 sum nranks=4: ring (predicted 2 ms) "
                       "chosen by tuner plugin example_ring 1.0.0"))
      << SelectionToString(big);

  // One element less: the model's choice, untouched.
  Selection small = ModelSelection(Collective::kAllReduce, 262143, Algorithm::kTree, kAllReduceAlgorithms);
  plugin->Choose(small, Options());
  EXPECT_EQ(small.chosen, Algorithm::kTree);
  EXPECT_FALSE(small.tuned);
  EXPECT_FALSE(small.chunk_count.has_value());
  EXPECT_EQ(small.reason, "chosen by the model (tuner plugin " + plugin->identity() + " kept it)");

  // Large, but ring cannot serve it (alltoall): the model's choice.
  Selection a2a = ModelSelection(Collective::kAllToAll, 1 << 22, Algorithm::kPairwise, {Algorithm::kPairwise});
  plugin->Choose(a2a, Options());
  EXPECT_EQ(a2a.chosen, Algorithm::kPairwise);
  EXPECT_FALSE(a2a.tuned);

  // The engine's chunk already at most 256 KiB: ring, the chunk left alone.
  Selection fine = ModelSelection(Collective::kAllGather, 1 << 20, Algorithm::kRhd, kAllReduceAlgorithms);
  plugin->Choose(fine, Options(16384));
  EXPECT_EQ(fine.chosen, Algorithm::kRing);
  EXPECT_FALSE(fine.chunk_count.has_value());
  EXPECT_TRUE(Contains(fine.reason, "over the model's rhd)")) << fine.reason;

  // Byte counts, not element counts: 1 MiB of float64 is 131072 elements.
  Selection f64 =
      ModelSelection(Collective::kAllReduce, 131072, Algorithm::kTree, kAllReduceAlgorithms, DataType::kFloat64);
  plugin->Choose(f64, Options(131072));
  EXPECT_EQ(f64.chosen, Algorithm::kRing);
  EXPECT_EQ(f64.chunk_count, uint64_t{32768});

  for (int k = 0; k < kNumRefusals; ++k) EXPECT_EQ(plugin->refused(static_cast<Refusal>(k)), 0u);
}

TEST(ExampleTunerTest, LogsThroughTheCallbackAndContextsAreIndependent) {
  kizuna::testing::LogCapture log(LogLevel::kInfo, kLogTune | kLogPlugin);
  std::vector<std::unique_ptr<TunerPlugin>> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(LoadAndInit(g_example, r, Shape(3, 3)));
  for (const auto& p : ranks) ASSERT_NE(p, nullptr);
  // Destroyed out of order: each finalizes its own context, the library stays until the last.
  ranks[1].reset();
  Selection sel = ModelSelection(Collective::kAllReduce, 1 << 20, Algorithm::kTree, kAllReduceAlgorithms);
  ranks[2]->Choose(sel, Options());
  EXPECT_EQ(sel.chosen, Algorithm::kRing);
  ranks.clear();
  const std::string text = log.Text();
  // The example logs from rank 0's init only, through kizuna's log (TUNE), named.
  EXPECT_EQ(CountLines(text,
                       "INFO TUNE tuner plugin 'example_ring': ring for calls of 1048576 bytes or more on 3 "
                       "ranks over 3 host(s)"),
            1)
      << text;
  EXPECT_EQ(CountLines(text, "loaded tuner plugin " + g_example), 3) << text;
}

// ---- Tables refused at load, init refused at creation ----

struct LoadCase {
  std::string name;
  std::vector<std::string> says;  // substrings the message must contain
};

void PrintTo(const LoadCase& c, std::ostream* os) { *os << c.name; }

class RefusedAtLoadTest : public ::testing::TestWithParam<LoadCase> {};

TEST_P(RefusedAtLoadTest, NamesThePathAndTheDefect) {
  const LoadCase& c = GetParam();
  const std::string path = Case(c.name);
  auto r = TunerPlugin::Load(path);
  ASSERT_FALSE(r.ok()) << c.name << " loaded";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status().message(), "tuner plugin " + path)) << r.status().ToString();
  for (const std::string& s : c.says) EXPECT_TRUE(Contains(r.status().message(), s)) << r.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RefusedAtLoadTest,
    ::testing::Values(LoadCase{"api_major_99",
                               {"plugin api version 99.0 is incompatible with kizuna's tuner plugin api 1.0"}},
                      LoadCase{"null_table", {"returned no api table", "1.0"}},
                      LoadCase{"short_table", {"struct_size", "smaller than"}},
                      LoadCase{"missing_function", {"required function 'get_coll_info' is NULL"}},
                      LoadCase{"bad_name", {"Broken Tuner!", "[a-z0-9_]"}},
                      LoadCase{"no_entry_point", {"does not export kzTunerPluginGetApi"}},
                      LoadCase{"source", {"dlopen failed"}}),
    [](const ::testing::TestParamInfo<LoadCase>& info) { return info.param.name; });

TEST(TunerLoaderTest, MissingFilesAndInitErrorsAreRefused) {
  auto missing = TunerPlugin::Load("/nonexistent/libnothing.so");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(missing.status().message(), "tuner plugin /nonexistent/libnothing.so: dlopen failed"))
      << missing.status().ToString();
  EXPECT_EQ(TunerPlugin::Load("").status().code(), StatusCode::kInvalidArgument);

  auto loaded = TunerPlugin::Load(Case("init_error"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Status s = (*loaded)->Init(0, Shape(2));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const std::string& part : {std::string("tuner plugin 'test_tuner'"), Case("init_error"), std::string("init"),
                                  std::string("the test_tuner plugin failed on purpose")})
    EXPECT_TRUE(Contains(s.message(), part)) << s.ToString() << " lacks " << part;
  // Never initialized: no answers asked for, the model's choice stays.
  Selection sel = ModelSelection(Collective::kAllReduce, 1 << 20, Algorithm::kTree, kAllReduceAlgorithms);
  (*loaded)->Choose(sel, Options());
  EXPECT_EQ(sel.chosen, Algorithm::kTree);
}

// ---- Answers refused call by call ----

struct AnswerCase {
  std::string name;
  Refusal kind;
  std::string says;  // in the reason and the warning
};

void PrintTo(const AnswerCase& c, std::ostream* os) { *os << c.name; }

class RefusedAnswerTest : public ::testing::TestWithParam<AnswerCase> {};

TEST_P(RefusedAnswerTest, KeepsTheModelsChoiceWithOneWarning) {
  const AnswerCase& c = GetParam();
  kizuna::testing::LogCapture log(LogLevel::kWarn, kLogTune | kLogPlugin);
  auto plugin = LoadAndInit(Case(c.name));
  ASSERT_NE(plugin, nullptr);
  for (int call = 0; call < 3; ++call) {
    Selection sel = ModelSelection(Collective::kAllReduce, 1 << 20, Algorithm::kTree, kAllReduceAlgorithms);
    plugin->Choose(sel, Options(262144, 2));
    EXPECT_EQ(sel.chosen, Algorithm::kTree);
    EXPECT_FALSE(sel.tuned);
    EXPECT_FALSE(sel.chunk_count.has_value());
    EXPECT_FALSE(sel.channels.has_value());
    EXPECT_TRUE(Contains(sel.reason, "chosen by the model (tuner plugin test_tuner 0.0.1 refused: ")) << sel.reason;
    EXPECT_TRUE(Contains(sel.reason, c.says)) << sel.reason;
  }
  for (int k = 0; k < kNumRefusals; ++k)
    EXPECT_EQ(plugin->refused(static_cast<Refusal>(k)), static_cast<Refusal>(k) == c.kind ? 3u : 0u)
        << RefusalName(static_cast<Refusal>(k));
  const std::string text = log.Text();
  EXPECT_EQ(CountLines(text, "WARN TUNE tuner plugin test_tuner"), 1) << text;
  EXPECT_EQ(CountLines(text, c.says), 1) << text;
  EXPECT_EQ(CountLines(text, Case(c.name)), 1) << text;
  EXPECT_EQ(CountLines(text, "using the model's choice (tree)"), 1) << text;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RefusedAnswerTest,
    ::testing::Values(
        AnswerCase{"error_code", Refusal::kError,
                   "get_coll_info returned KZ_TUNER_ERR_INTERNAL (8): the test_tuner plugin failed on purpose"},
        AnswerCase{"unknown_code", Refusal::kError, "get_coll_info returned unknown result code (77)"},
        AnswerCase{"bad_index", Refusal::kBadIndex, "candidate 15 is out of range (there are 15: 0 to 14)"},
        AnswerCase{"negative_index", Refusal::kBadIndex, "candidate -1 is out of range"},
        AnswerCase{"unknown_name", Refusal::kUnknownName, "algorithm 'warp_drive' is not a candidate's name"},
        AnswerCase{"unsupported", Refusal::kUnsupported, "pairwise cannot serve the call: pairwise is not served"},
        AnswerCase{"chunk_zero", Refusal::kBadChunk, "chunk_bytes 0 is outside [4 (one element), 1073741824]"},
        AnswerCase{"chunk_huge", Refusal::kBadChunk, "chunk_bytes 1099511627776 is outside"},
        AnswerCase{"channels_negative", Refusal::kBadChannels, "channels -3 is outside [1, 16]"},
        AnswerCase{"channels_huge", Refusal::kBadChannels, "channels 1048576 is outside [1, 16]"}),
    [](const ::testing::TestParamInfo<AnswerCase>& info) { return info.param.name; });

// ---- A valid answer that sets every field ----

TEST(TunerAnswerTest, IndexChunkAndChannelsAreApplied) {
  auto plugin = LoadAndInit(Case("rhd_4_channels"));
  ASSERT_NE(plugin, nullptr);
  Selection sel = ModelSelection(Collective::kAllReduce, 1 << 20, Algorithm::kRing, kAllReduceAlgorithms);
  plugin->Choose(sel, Options(262144, 2));
  EXPECT_EQ(sel.chosen, Algorithm::kRhd);
  EXPECT_TRUE(sel.tuned);
  EXPECT_EQ(sel.chunk_count, uint64_t{16384});  // 64 KiB of float32
  EXPECT_EQ(sel.channels, 4);
  EXPECT_TRUE(Contains(sel.reason, "(over the model's ring, chunk 64 KiB, 4 channels)")) << sel.reason;

  // Where rhd cannot serve the call the plugin keeps the candidate: the channels still change.
  Selection bcast =
      ModelSelection(Collective::kBroadcast, 1 << 20, Algorithm::kTree, {Algorithm::kRing, Algorithm::kTree});
  plugin->Choose(bcast, Options(8192, 1));
  EXPECT_EQ(bcast.chosen, Algorithm::kTree);
  EXPECT_TRUE(bcast.tuned);
  EXPECT_FALSE(bcast.chunk_count.has_value());  // 32 KiB: below the plugin's 64 KiB
  EXPECT_EQ(bcast.channels, 4);
  EXPECT_TRUE(Contains(bcast.reason, "(as the model did, 4 channels)")) << bcast.reason;
  for (int k = 0; k < kNumRefusals; ++k) EXPECT_EQ(plugin->refused(static_cast<Refusal>(k)), 0u);
}

// ---- Which calls the plugin decides; the ranks' agreement ----

TEST(TunerOrderTest, TheCallAndKizunaAlgoWinOverThePlugin) {
  auto overrides = [](std::string_view text) {
    auto o = ParseAlgoOverrides(text);
    EXPECT_TRUE(o.ok()) << o.status().ToString();
    return o.ok() ? *o : AlgoOverrides{};
  };
  EXPECT_TRUE(PluginDecides(Collective::kAllReduce, false, overrides("")));
  EXPECT_FALSE(PluginDecides(Collective::kAllReduce, true, overrides("")));
  EXPECT_FALSE(PluginDecides(Collective::kAllReduce, false, overrides("tree")));
  EXPECT_FALSE(PluginDecides(Collective::kAllReduce, false, overrides("hier")));
  EXPECT_FALSE(PluginDecides(Collective::kAllReduce, false, overrides("allreduce:hier:pairwise/ring")));
  EXPECT_FALSE(PluginDecides(Collective::kAllGather, false, overrides("allgather:ring")));
  EXPECT_TRUE(PluginDecides(Collective::kAllReduce, false, overrides("allgather:ring")));
  EXPECT_TRUE(PluginDecides(Collective::kBarrier, false, overrides("allgather:ring")));
  EXPECT_FALSE(PluginDecides(Collective::kSend, false, overrides("")));
  EXPECT_FALSE(PluginDecides(Collective::kRecv, false, overrides("")));
}

TEST(TunerAgreementTest, RanksWithAnotherPluginOrNoneAreNamed) {
  EXPECT_TRUE(CheckSameTuner("", 0, "", 1).ok());
  EXPECT_TRUE(CheckSameTuner("example_ring 1.0.0", 0, "example_ring 1.0.0", 3).ok());
  const Status other = CheckSameTuner("example_ring 1.0.0", 0, "example_ring 1.0.1", 2);
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(other.message(),
                       "rank 2 has tuner plugin example_ring 1.0.1 and this rank (rank 0) tuner "
                       "plugin example_ring 1.0.0"))
      << other.ToString();
  const Status none = CheckSameTuner("", 1, "example_ring 1.0.0", 0);
  EXPECT_TRUE(Contains(none.message(),
                       "rank 0 has tuner plugin example_ring 1.0.0 and this rank (rank 1) no tuner "
                       "plugin"))
      << none.ToString();
  EXPECT_TRUE(Contains(none.message(), "KIZUNA_TUNER_PLUGIN")) << none.ToString();
}

}  // namespace
}  // namespace kizuna::collectives::tuner

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--example_plugin=")) {
      kizuna::collectives::tuner::g_example = std::string(arg.substr(17));
    } else if (arg.ends_with(".so") || arg.ends_with(".c")) {
      // .../libtuner_<case>.so, or the source the test plugins are built from.
      const std::string path(arg);
      const size_t slash = path.rfind('/');
      const std::string base = path.substr(slash == std::string::npos ? 0 : slash + 1);
      if (base.starts_with("libtuner_") && base.ends_with(".so"))
        kizuna::collectives::tuner::g_cases[base.substr(9, base.size() - 12)] = path;
      else
        kizuna::collectives::tuner::g_cases["source"] = path;
    } else {
      std::fprintf(stderr, "tuner_plugin_test: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
