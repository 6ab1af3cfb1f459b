// Communicators with a tuner plugin (KIZUNA_TUNER_PLUGIN, collectives/tuner) loaded through the
// configuration: the example plugin (ring from 1 MiB) changes the engine's choice for the sizes it
// claims and not for others, and the collectives it chose run with exact results; a plugin the
// loader refuses fails creation naming the path and why; a plugin's nonsense answers leave the
// model's choice; KIZUNA_ALGO and the call's own option still win; ranks with different plugins
// refuse each other. Ranks are threads of this process on emulated devices (CreateLocal).
//
//   tuner_test --example_plugin=PATH [test plugin paths...] [gtest flags]

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/communicator.h"
#include "runtime/core/log_capture.h"
#include "runtime/core/logging.h"

namespace kizuna::test {
namespace {

using collectives::Algorithm;
using collectives::Collective;

std::string g_example;
std::map<std::string, std::string> g_cases;  // case -> path

std::string Case(const std::string& name) {
  auto it = g_cases.find(name);
  return it == g_cases.end() ? "/nonexistent/libtuner_" + name + ".so" : it->second;
}

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

Config TestConfig(int n, const std::string& tuner) {
  Config c;
  c.emulated_devices = n;
  c.timeout_s = 30;
  c.fabric = {"directconnect"};
  c.topology = "full";
  c.tuner_plugin = tuner;
  return c;
}

// n ranks of one process on n emulated devices, a stream and two buffers of `bytes` each.
class Ranks {
 public:
  Ranks(int n, Config config, size_t bytes = 0) : config_(std::move(config)), bytes_(bytes) {
    auto backend = host_emulated::CreateHostEmulatedBackend(config_);
    if (!backend.ok()) {
      status_ = backend.status();
      return;
    }
    backend_ = std::move(*backend);
    std::vector<device::Device*> devices;
    for (int r = 0; r < n; ++r) devices.push_back(backend_->device(r));
    CommOptions options;
    options.config = &config_;
    options.staging_bytes = 2u << 20;
    auto comms = Communicator::CreateLocal(devices, options);
    if (!comms.ok()) {
      status_ = comms.status();
      return;
    }
    comms_ = std::move(*comms);
    for (int r = 0; r < n && bytes > 0; ++r) {
      auto in = devices[r]->Allocate(bytes), out = devices[r]->Allocate(bytes);
      auto stream = devices[r]->CreateStream();
      if (!in.ok() || !out.ok() || !stream.ok()) {
        status_ = !in.ok() ? in.status() : !out.ok() ? out.status() : stream.status();
        return;
      }
      in_.push_back(std::move(*in));
      out_.push_back(std::move(*out));
      streams_.push_back(std::move(*stream));
    }
  }
  ~Ranks() {
    streams_.clear();
    in_.clear();
    out_.clear();
    comms_.clear();
  }

  const Status& status() const { return status_; }
  int size() const { return static_cast<int>(comms_.size()); }
  Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }
  float* in(int r) { return static_cast<float*>(in_[static_cast<size_t>(r)]->data()); }
  float* out(int r) { return static_cast<float*>(out_[static_cast<size_t>(r)]->data()); }

  // An AllReduce (sum) of `count` float32 on every rank, waited for, checked element by element:
  // small integers, so every order of summation is exact. Empty when right, else what is wrong.
  std::string AllReduce(size_t count, const CallOptions& call = {}) {
    if (count * sizeof(float) > bytes_) return fmt::format("{} elements do not fit the {} bytes", count, bytes_);
    for (int r = 0; r < size(); ++r) {
      for (size_t i = 0; i < count; ++i) in(r)[i] = static_cast<float>((r * 7 + i) % 11);
      std::memset(out(r), 0xff, count * sizeof(float));
    }
    for (int r = 0; r < size(); ++r) {
      Status s = comm(r).AllReduce(in(r), out(r), count, DataType::kFloat32, ReduceOp::kSum,
                                   *streams_[static_cast<size_t>(r)], call);
      if (!s.ok()) return fmt::format("rank {}: {}", r, s.ToString());
    }
    for (int r = 0; r < size(); ++r) {
      Status s = streams_[static_cast<size_t>(r)]->Synchronize(Deadline::AfterSeconds(60));
      if (s.ok()) s = comm(r).AsyncError();
      if (!s.ok()) return fmt::format("rank {}: {}", r, s.ToString());
    }
    for (int r = 0; r < size(); ++r)
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < size(); ++q) want += static_cast<float>((q * 7 + i) % 11);
        if (out(r)[i] != want) return fmt::format("rank {} element {}: {}, want {}", r, i, out(r)[i], want);
      }
    return {};
  }

  // The algorithm of each operation rank r ran, in order (its flight recorder).
  std::vector<std::string> AlgorithmsRun(int r) {
    const std::string json = comm(r).FlightRecord();
    static const std::regex record(R"re("call":"([^"]*)","algorithm":"([^"]*)")re");
    std::vector<std::string> out;
    for (auto it = std::sregex_iterator(json.begin(), json.end(), record); it != std::sregex_iterator(); ++it)
      out.push_back((*it)[2].str());
    return out;
  }

  std::string Explain(size_t count) {
    auto e = comm(0).ExplainChoice(Collective::kAllReduce, count, DataType::kFloat32);
    return e.ok() ? *e : e.status().ToString();
  }

 private:
  Config config_;  // outlives the backend and the communicators (they keep pointers)
  size_t bytes_;
  Status status_;
  std::unique_ptr<device::Backend> backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<device::Buffer>> in_, out_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
};

constexpr size_t kSmall = 4096;            // 16 KiB of float32: below the example's 1 MiB
constexpr size_t kLarge = (1u << 20) / 2;  // 2 MiB of float32: the example's ring

// The model's choices without a plugin, for the test's sizes: what the example must change (large)
// and keep (small). The large one must not be ring already, or the example would change nothing.
std::string ModelChoice(size_t count) {
  Ranks plain(4, TestConfig(4, ""));
  if (!plain.status().ok()) return plain.status().ToString();
  const std::string text = plain.Explain(count);
  const size_t colon = text.find(": "), space = text.find(' ', colon + 2);
  return colon == std::string::npos ? text : text.substr(colon + 2, space - colon - 2);
}

TEST(TunerPlugin, ExampleChoosesRingForLargeCallsAndTheyRunExactly) {
  ASSERT_FALSE(g_example.empty()) << "pass --example_plugin=PATH";
  const std::string model_small = ModelChoice(kSmall), model_large = ModelChoice(kLarge);
  ASSERT_NE(model_large, "ring") << "the model already picks ring at 2 MiB: the test shows nothing";

  Ranks w(4, TestConfig(4, g_example), kLarge * sizeof(float));
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  const std::string large = w.Explain(kLarge), small = w.Explain(kSmall);
  EXPECT_TRUE(Contains(large, ": ring (predicted")) << large;
  // The example's 256 KiB chunk is what the engine cuts a 2 MiB call into anyway (two channels'
  // slots), so the reason names no chunk.
  EXPECT_TRUE(Contains(large, "chosen by tuner plugin example_ring 1.0.0 (over the model's " + model_large + ")"))
      << large;
  EXPECT_TRUE(Contains(small, ": " + model_small + " (predicted")) << small;
  EXPECT_TRUE(Contains(small, "chosen by the model (tuner plugin example_ring 1.0.0 kept it)")) << small;

  EXPECT_EQ(w.AllReduce(kLarge), "");
  EXPECT_EQ(w.AllReduce(kSmall), "");
  EXPECT_EQ(w.AllReduce(kLarge), "");  // the plan kept from the first call
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(w.AlgorithmsRun(r), (std::vector<std::string>{"ring", model_small, "ring"})) << "rank " << r;
}

// A valid answer that sets every field (rhd, 4 channels, 64 KiB chunks): more channels than the
// engine sized its staging for, so it sizes the slots again; the results stay exact.
TEST(TunerPlugin, ChannelsAndChunkOfAPluginAreHonoured) {
  kizuna::testing::LogCapture log(LogLevel::kInfo, kLogColl | kLogTune);
  Ranks w(4, TestConfig(4, Case("rhd_4_channels")), (kLarge + 3) * sizeof(float));
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  const std::string large = w.Explain(kLarge);
  EXPECT_TRUE(Contains(large, ": rhd (predicted") && Contains(large, "chosen by tuner plugin test_tuner 0.0.1"))
      << large;
  EXPECT_EQ(w.AllReduce(kLarge), "");
  EXPECT_EQ(w.AllReduce(kLarge + 3), "");
  for (int r = 0; r < 4; ++r) EXPECT_EQ(w.AlgorithmsRun(r), (std::vector<std::string>{"rhd", "rhd"})) << "rank " << r;
  // The plans every rank ran: the plugin's channels and chunk (64 KiB: 16384 float32).
  const std::string text = log.Text();
  for (int r = 0; r < 4; ++r)
    for (size_t count : {kLarge, kLarge + 3})
      EXPECT_TRUE(Contains(text, fmt::format("rank {} plan: allreduce count={} float32 sum nranks=4 via rhd, chunk "
                                             "16384 elements, 4 channel(s)",
                                             r, count)))
          << "rank " << r << ", count " << count << ":\n"
          << text;
}

TEST(TunerPlugin, KizunaAlgoAndTheCallsOptionWinOverThePlugin) {
  Config config = TestConfig(4, g_example);
  config.algo = "allreduce:tree";
  Ranks w(4, config, kLarge * sizeof(float));
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  const std::string large = w.Explain(kLarge);
  EXPECT_TRUE(Contains(large, ": tree (predicted") && Contains(large, "forced by KIZUNA_ALGO=allreduce:tree")) << large;
  EXPECT_FALSE(Contains(large, "tuner plugin")) << large;
  EXPECT_EQ(w.AllReduce(kLarge), "");
  CallOptions call;
  call.algorithm = Algorithm::kRhd;
  EXPECT_EQ(w.AllReduce(kLarge, call), "");
  for (int r = 0; r < 4; ++r) EXPECT_EQ(w.AlgorithmsRun(r), (std::vector<std::string>{"tree", "rhd"})) << "rank " << r;

  // KIZUNA_ALGO for another collective leaves AllReduce to the plugin.
  config.algo = "allgather:pairwise";
  Ranks other(4, config, kLarge * sizeof(float));
  ASSERT_TRUE(other.status().ok()) << other.status().ToString();
  EXPECT_TRUE(Contains(other.Explain(kLarge), "chosen by tuner plugin example_ring")) << other.Explain(kLarge);
  call.algorithm = Algorithm::kTree;  // the call's own choice still wins there
  EXPECT_EQ(other.AllReduce(kLarge, call), "");
  EXPECT_EQ(other.AllReduce(kLarge), "");
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(other.AlgorithmsRun(r), (std::vector<std::string>{"tree", "ring"})) << "rank " << r;
}

// Nonsense answers: the model's choice runs, exactly, and the selection says what was refused.
TEST(TunerPlugin, NonsenseAnswersLeaveTheModelsChoice) {
  const std::string model_large = ModelChoice(kLarge);
  for (const char* name : {"error_code", "bad_index", "unknown_name", "unsupported", "chunk_zero", "channels_huge"}) {
    Ranks w(4, TestConfig(4, Case(name)), kLarge * sizeof(float));
    ASSERT_TRUE(w.status().ok()) << name << ": " << w.status().ToString();
    const std::string large = w.Explain(kLarge);
    EXPECT_TRUE(Contains(large, ": " + model_large + " (predicted") &&
                Contains(large, "chosen by the model (tuner plugin test_tuner 0.0.1 refused: "))
        << name << ": " << large;
    EXPECT_EQ(w.AllReduce(kLarge), "") << name;
    EXPECT_EQ(w.AllReduce(kSmall), "") << name;
    EXPECT_EQ(w.AlgorithmsRun(0).front(), model_large) << name;
  }
}

// A plugin the loader refuses, or a path with no library, fails creation on every rank naming the
// path and the reason.
TEST(TunerPlugin, UnusablePluginsFailCreation) {
  struct Bad {
    std::string path;
    std::string says;
  };
  for (const Bad& bad : {Bad{Case("api_major_99"),
                             "plugin api version 99.0 is incompatible with kizuna's tuner "
                             "plugin api 1.0"},
                         Bad{Case("missing_function"), "required function 'get_coll_info' is NULL"},
                         Bad{Case("init_error"), "the test_tuner plugin failed on purpose"},
                         Bad{"/nonexistent/libno_tuner.so", "dlopen failed"}}) {
    Ranks w(3, TestConfig(3, bad.path));
    ASSERT_FALSE(w.status().ok()) << bad.path;
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().ToString();
    EXPECT_TRUE(Contains(w.status().message(), bad.path)) << w.status().ToString();
    EXPECT_TRUE(Contains(w.status().message(), bad.says)) << w.status().ToString();
  }
}

// Ranks with another plugin, or none, refuse each other at creation, every rank naming both.
TEST(TunerPlugin, RanksWithDifferentPluginsRefuseEachOther) {
  const int n = 3;
  std::vector<Config> configs = {TestConfig(n, g_example), TestConfig(n, g_example), TestConfig(n, "")};
  auto backend = host_emulated::CreateHostEmulatedBackend(configs[0]);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  for (const std::string& other : {std::string(), Case("rhd_4_channels")}) {
    configs[2].tuner_plugin = other;
    auto boots = bootstrap::CreateInProcessBootstraps(n);
    ASSERT_TRUE(boots.ok()) << boots.status().ToString();
    std::vector<Result<std::unique_ptr<Communicator>>> created;
    for (int r = 0; r < n; ++r) created.emplace_back(Internal("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        CommOptions options;
        options.config = &configs[static_cast<size_t>(r)];
        created[static_cast<size_t>(r)] =
            Communicator::Create(std::shared_ptr<bootstrap::Bootstrap>(std::move((*boots)[static_cast<size_t>(r)])),
                                 *(*backend)->device(r), options);
      });
    for (auto& t : threads) t.join();
    const std::string theirs = other.empty() ? "no tuner plugin" : "tuner plugin test_tuner 0.0.1";
    for (int r = 0; r < n; ++r) {
      ASSERT_FALSE(created[static_cast<size_t>(r)].ok()) << "rank " << r;
      const Status& s = created[static_cast<size_t>(r)].status();
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      EXPECT_TRUE(Contains(s.message(), "tuner plugin example_ring 1.0.0")) << "rank " << r << ": " << s.ToString();
      EXPECT_TRUE(Contains(s.message(), theirs)) << "rank " << r << ": " << s.ToString();
      EXPECT_TRUE(Contains(s.message(), "every rank must load the same tuner plugin")) << s.ToString();
    }
  }
}

}  // namespace
}  // namespace kizuna::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--example_plugin=")) {
      kizuna::test::g_example = std::string(arg.substr(17));
    } else if (arg.ends_with(".so")) {
      const std::string path(arg);
      const size_t slash = path.rfind('/');
      const std::string base = path.substr(slash == std::string::npos ? 0 : slash + 1);
      if (base.starts_with("libtuner_")) kizuna::test::g_cases[base.substr(9, base.size() - 12)] = path;
    } else if (!arg.ends_with(".c")) {
      std::fprintf(stderr, "tuner_test: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
