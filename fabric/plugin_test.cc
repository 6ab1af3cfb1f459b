// The fabric plugin loader (plugin_fabric.h) and the registry's plugin slots, against the example
// plugin (fabric/example_plugin: TCP over 127.0.0.1) and the deliberately broken plugins in
// testdata/: version and table checks with clear errors, the adapter's conversions, and the
// example's transfers, ordering, truncation and failure paths end to end.
//
//   plugin_test --example_plugin=PATH [broken plugin paths...] [gtest flags]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/fabric.h"
#include "fabric/plugin_fabric.h"
#include "fabric/registry.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::fabric {
namespace {

using namespace std::chrono_literals;

std::string g_example;
std::map<std::string, std::string> g_broken;  // defect -> path

#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)               \
  auto tmp = (expr);                                            \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()
#define ASSERT_OK_AND_ASSIGN_CAT2(a, b) a##b
#define ASSERT_OK_AND_ASSIGN_CAT(a, b) ASSERT_OK_AND_ASSIGN_CAT2(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(ASSERT_OK_AND_ASSIGN_CAT(result_, __LINE__), lhs, expr)
#define EXPECT_OK(expr)                                         \
  do {                                                          \
    const Status s_ = (expr);                                   \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.ToString();     \
  } while (0)

Deadline TestDeadline() { return Deadline::After(20s); }

FabricContext Rank(int rank) {
  FabricContext c;
  c.rank = rank;
  c.world_size = 2;
  c.local_rank = rank;
  c.host_id = "plugin_test";
  return c;
}

const Config& TestConfig() {
  static const Config config = [] {
    Config c;
    c.timeout_s = 20;
    return c;
  }();
  return config;
}

std::string Broken(const std::string& defect) {
  auto it = g_broken.find(defect);
  return it == g_broken.end() ? std::string("/nonexistent/libbroken_" + defect + ".so") : it->second;
}

// ---- Loader: version, table and property checks ----

struct BrokenCase {
  std::string defect;
  StatusCode code;
  std::vector<std::string> says;  // substrings the message must contain
};

class BrokenPluginTest : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenPluginTest, IsRefusedNamingTheDefect) {
  const BrokenCase& c = GetParam();
  const std::string path = Broken(c.defect);
  auto r = LoadFabricPlugin(path, TestConfig(), Rank(0));
  ASSERT_FALSE(r.ok()) << c.defect << " loaded";
  EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << "names the path: " << r.status().ToString();
  for (const std::string& s : c.says)
    EXPECT_NE(r.status().message().find(s), std::string::npos) << "should say '" << s << "': " << r.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Defects, BrokenPluginTest,
    ::testing::Values(
        BrokenCase{"api_major_99", StatusCode::kInvalidArgument, {"99.0", "incompatible", "1.0"}},
        BrokenCase{"null_table", StatusCode::kInvalidArgument, {"returned no api table", "1.0"}},
        BrokenCase{"short_table", StatusCode::kInvalidArgument, {"struct_size", "smaller than"}},
        BrokenCase{"missing_function", StatusCode::kInvalidArgument, {"required function 'test' is NULL"}},
        BrokenCase{"bad_name", StatusCode::kInvalidArgument, {"Broken-Test", "[a-z0-9_]"}},
        BrokenCase{"half_write", StatusCode::kInvalidArgument, {"expose set", "iwrite NULL"}},
        BrokenCase{"init_unavailable", StatusCode::kUnavailable, {"init", "deliberately unavailable"}},
        BrokenCase{"no_devices", StatusCode::kUnavailable, {"reports no devices"}},
        BrokenCase{"fd_without_reg_mr_fd", StatusCode::kInvalidArgument, {"KZ_FABRIC_PTR_FD", "reg_mr_fd"}},
        BrokenCase{"zero_max_requests", StatusCode::kInvalidArgument, {"max_requests 0"}},
        BrokenCase{"no_entry_point", StatusCode::kInvalidArgument, {"does not export kzFabricPluginGetApi"}}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) { return info.param.defect; });

TEST(PluginLoaderTest, FilesThatAreNotPluginsAreRefused) {
  auto missing = LoadFabricPlugin("/nonexistent/libnothing.so", TestConfig(), Rank(0));
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("dlopen failed"), std::string::npos) << missing.status().ToString();
  // The broken plugins' C source sits beside them: a file, but no shared object.
  auto source = LoadFabricPlugin(Broken("source"), TestConfig(), Rank(0));
  EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument) << source.status().ToString();
  EXPECT_EQ(LoadFabricPlugin("", TestConfig(), Rank(0)).status().code(), StatusCode::kInvalidArgument);
}

// ---- The example plugin through the adapter ----

class ExamplePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(g_example.empty()) << "pass --example_plugin=PATH";
    ASSERT_OK_AND_ASSIGN(a_, LoadFabricPlugin(g_example, TestConfig(), Rank(0)));
    ASSERT_OK_AND_ASSIGN(b_, LoadFabricPlugin(g_example, TestConfig(), Rank(1)));
  }

  struct Connection {
    std::unique_ptr<ListenComm> listen;
    std::unique_ptr<SendComm> send;  // on b_
    std::unique_ptr<RecvComm> recv;  // on a_
  };

  // b_ connects to a listener of a_; both sides progress on this thread (non-blocking calls).
  Result<Connection> Connect() {
    Connection c;
    KZ_ASSIGN_OR_RETURN(c.listen, a_->Listen(0));
    const Deadline deadline = TestDeadline();
    while (c.send == nullptr || c.recv == nullptr) {
      if (c.send == nullptr) {
        KZ_ASSIGN_OR_RETURN(c.send, b_->Connect(0, c.listen->handle()));
      }
      if (c.recv == nullptr) {
        KZ_ASSIGN_OR_RETURN(c.recv, c.listen->Accept());
      }
      if (deadline.Expired()) return Timeout("test connection not established");
      if (c.send == nullptr || c.recv == nullptr) std::this_thread::sleep_for(100us);
    }
    return c;
  }

  std::unique_ptr<Fabric> a_, b_;
};

// Runs two blocking waits at once, one per side (a rendezvous needs both to progress).
template <typename F, typename G>
void RunBoth(F f, G g) {
  std::thread t(f);
  g();
  t.join();
}

TEST_F(ExamplePluginTest, DescribesItsDevice) {
  EXPECT_EQ(a_->name(), "example_tcp");
  ASSERT_EQ(a_->device_count(), 1);
  ASSERT_OK_AND_ASSIGN(FabricDeviceProperties p, a_->properties(0));
  EXPECT_EQ(p.fabric, "example_tcp");
  EXPECT_EQ(p.index, 0);
  EXPECT_EQ(p.name, "lo:127.0.0.1");
  EXPECT_EQ(p.ptr_support, static_cast<uint32_t>(kPtrHost));
  EXPECT_EQ(p.max_requests, 32);
  EXPECT_EQ(p.max_message_bytes, uint64_t{1} << 32);
  EXPECT_FALSE(p.write_immediate);
  EXPECT_FALSE(p.needs_flush);
  EXPECT_EQ(a_->properties(1).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ExamplePluginTest, MessagesArriveIntactAndCountAsStaged) {
  ASSERT_OK_AND_ASSIGN(Connection c, Connect());
  EXPECT_NE(c.send->label().find("example_tcp:lo:127.0.0.1:send#"), std::string::npos) << c.send->label();
  const size_t kMax = size_t{8} << 20;
  std::vector<uint8_t> out(kMax), in(kMax);
  for (size_t i = 0; i < kMax; ++i) out[i] = static_cast<uint8_t>(i * 131 + 7);
  ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(out.data(), kMax)));
  ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(in.data(), kMax)));
  uint64_t total = 0;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{65537}, kMax}) {
    std::fill(in.begin(), in.end(), 0);
    ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(in.data(), kMax, 3, rreg));
    ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(out.data(), size, 3, size == 0 ? nullptr : sreg));
    Result<size_t> got = Internal("not run"), sent = Internal("not run");
    RunBoth([&] { got = c.recv->Wait(r, TestDeadline()); }, [&] { sent = c.send->Wait(s, TestDeadline()); });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    EXPECT_EQ(*got, size);
    EXPECT_EQ(*sent, size);
    EXPECT_EQ(std::memcmp(in.data(), out.data(), size), 0) << size << " bytes";
    total += size;
  }
  EXPECT_EQ(c.recv->stats().messages, 5u);
  EXPECT_EQ(c.recv->stats().bytes, total);
  EXPECT_EQ(c.recv->stats().staged_bytes, total) << "socket payloads pass through kernel buffers";
  EXPECT_EQ(c.send->stats().bytes, total);
  EXPECT_OK(c.send->Deregister(sreg));
  EXPECT_OK(c.recv->Deregister(rreg));
}

TEST_F(ExamplePluginTest, SameTagInPostingOrderAndTagsAreIndependent) {
  ASSERT_OK_AND_ASSIGN(Connection c, Connect());
  uint64_t out[3] = {11, 22, 33}, in[3] = {0, 0, 0};
  ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(out, sizeof out)));
  ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(in, sizeof in)));
  // Tag 1 twice, then tag 2; only tag 2's receive is posted at first.
  ASSERT_OK_AND_ASSIGN(Request * s0, c.send->Send(&out[0], 8, 1, sreg));
  ASSERT_OK_AND_ASSIGN(Request * s1, c.send->Send(&out[1], 8, 1, sreg));
  ASSERT_OK_AND_ASSIGN(Request * s2, c.send->Send(&out[2], 8, 2, sreg));
  ASSERT_OK_AND_ASSIGN(Request * r2, c.recv->Recv(&in[2], 8, 2, rreg));
  RunBoth([&] { EXPECT_TRUE(c.recv->Wait(r2, TestDeadline()).ok()); },
          [&] { EXPECT_TRUE(c.send->Wait(s2, TestDeadline()).ok()) << "tag 2 waited for tag 1"; });
  EXPECT_EQ(in[2], 33u);
  ASSERT_OK_AND_ASSIGN(Request * r0, c.recv->Recv(&in[0], 8, 1, rreg));
  ASSERT_OK_AND_ASSIGN(Request * r1, c.recv->Recv(&in[1], 8, 1, rreg));
  RunBoth(
      [&] {
        EXPECT_TRUE(c.recv->Wait(r0, TestDeadline()).ok());
        EXPECT_TRUE(c.recv->Wait(r1, TestDeadline()).ok());
      },
      [&] {
        EXPECT_TRUE(c.send->Wait(s0, TestDeadline()).ok());
        EXPECT_TRUE(c.send->Wait(s1, TestDeadline()).ok());
      });
  EXPECT_EQ(in[0], 11u);
  EXPECT_EQ(in[1], 22u);
}

TEST_F(ExamplePluginTest, TooLongAMessageFailsBothSidesNamingTheSizesAndTheConnectionSurvives) {
  ASSERT_OK_AND_ASSIGN(Connection c, Connect());
  std::vector<uint8_t> out(300, 5), in(300, 0);
  ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(out.data(), out.size())));
  ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
  ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(in.data(), 100, 6, rreg));
  ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(out.data(), 200, 6, sreg));
  Status rs, ss;
  RunBoth([&] { rs = c.recv->Wait(r, TestDeadline()).status(); },
          [&] { ss = c.send->Wait(s, TestDeadline()).status(); });
  for (const Status* st : {&rs, &ss}) {
    EXPECT_EQ(st->code(), StatusCode::kInvalidArgument) << st->ToString();
    EXPECT_NE(st->message().find("200"), std::string::npos) << st->ToString();
    EXPECT_NE(st->message().find("100"), std::string::npos) << st->ToString();
    EXPECT_NE(st->message().find("KZ_FABRIC_ERR_INVALID_ARGUMENT"), std::string::npos)
        << "the plugin's code is named: " << st->ToString();
  }
  ASSERT_OK_AND_ASSIGN(Request * r2, c.recv->Recv(in.data(), 100, 6, rreg));
  ASSERT_OK_AND_ASSIGN(Request * s2, c.send->Send(out.data(), 100, 6, sreg));
  RunBoth([&] { EXPECT_TRUE(c.recv->Wait(r2, TestDeadline()).ok()); },
          [&] { EXPECT_TRUE(c.send->Wait(s2, TestDeadline()).ok()); });
  EXPECT_EQ(in[99], 5);
}

TEST_F(ExamplePluginTest, TheRequestLimitAnswersBusy) {
  ASSERT_OK_AND_ASSIGN(Connection c, Connect());
  uint64_t word = 1;
  ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(&word, 8)));
  std::vector<Request*> posted;
  for (int i = 0; i < 32; ++i) {
    ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(&word, 8, i, sreg));
    ASSERT_NE(s, nullptr) << "post " << i;
    posted.push_back(s);
  }
  ASSERT_OK_AND_ASSIGN(Request * busy, c.send->Send(&word, 8, 99, sreg));
  EXPECT_EQ(busy, nullptr);
  // Closing with requests in flight abandons them; the peer's receives fail.
  uint64_t in = 0;
  ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(&in, 8)));
  ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(&in, 8, 1000, rreg));
  c.send.reset();
  auto failed = c.recv->Wait(r, Deadline::After(5s));
  EXPECT_EQ(failed.status().code(), StatusCode::kRemoteError) << failed.status().ToString();
}

TEST_F(ExamplePluginTest, WaitsHonourTheirDeadlines) {
  ASSERT_OK_AND_ASSIGN(Connection c, Connect());
  uint64_t in = 0;
  ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(&in, 8)));
  ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(&in, 8, 1, rreg));
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(c.recv->Wait(r, Deadline::After(50ms)).status().code(), StatusCode::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  EXPECT_EQ(c.recv->requests_in_flight(), 1) << "a timed-out request stays live";
  ASSERT_OK_AND_ASSIGN(auto listen, a_->Listen(0));
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(listen->Accept(Deadline::After(50ms)).status().code(), StatusCode::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(ExamplePluginTest, BadHandlesStrangersAndClosedListenersAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto listen, a_->Listen(0));
  ASSERT_OK_AND_ASSIGN(auto other, a_->Listen(0));
  EXPECT_FALSE(listen->handle() == other->handle());
  Handle truncated = listen->handle();
  truncated.size /= 2;
  EXPECT_EQ(b_->Connect(0, truncated).status().code(), StatusCode::kInvalidArgument);
  Handle garbage = listen->handle();
  garbage.data[0] ^= 0xff;
  EXPECT_EQ(b_->Connect(0, garbage).status().code(), StatusCode::kInvalidArgument);

  // The right address with the wrong token: the listener drops it, the connector fails in time.
  Handle stranger = listen->handle();
  stranger.data[stranger.size - 1] ^= 0x5a;
  const Deadline deadline = Deadline::After(5s);
  Result<std::unique_ptr<SendComm>> attempt = std::unique_ptr<SendComm>();
  while (attempt.ok() && *attempt == nullptr && !deadline.Expired()) {
    ASSERT_OK_AND_ASSIGN(auto accepted, listen->Accept());
    EXPECT_EQ(accepted, nullptr) << "a connection without the token was accepted";
    attempt = b_->Connect(0, stranger);
    std::this_thread::sleep_for(200us);
  }
  EXPECT_EQ(attempt.status().code(), StatusCode::kRemoteError) << attempt.status().ToString();

  Handle closed = other->handle();
  other.reset();
  const auto start = std::chrono::steady_clock::now();
  auto r = b_->Connect(0, closed, Deadline::After(2s));
  EXPECT_FALSE(r.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST_F(ExamplePluginTest, APeerClosingFailsTheSurvivorsRequests) {
  ASSERT_OK_AND_ASSIGN(Connection c, Connect());
  const size_t size = size_t{64} << 20;
  std::vector<uint8_t> out(size, 1), in(size);
  ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(out.data(), size)));
  ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(in.data(), size)));
  ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(in.data(), size, 1, rreg));
  ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(out.data(), size, 1, sreg));
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(Completion sc, c.send->Test(s));
    ASSERT_OK_AND_ASSIGN(Completion rc, c.recv->Test(r));
    ASSERT_FALSE(sc.done || rc.done) << "64 MiB moved in three tests";
  }
  c.recv.reset();
  const auto start = std::chrono::steady_clock::now();
  auto sent = c.send->Wait(s, Deadline::After(10s));
  EXPECT_EQ(sent.status().code(), StatusCode::kRemoteError) << sent.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  auto later = c.send->Send(out.data(), 8, 1, sreg);
  EXPECT_EQ(later.status().code(), StatusCode::kRemoteError) << "a post on a broken connection is refused";
}

// ---- The registry's plugin slots ----

TEST(PluginRegistryTest, PluginsGetSlotsBesideTheBuiltIns) {
  ASSERT_FALSE(g_example.empty());
  Config config = TestConfig();
  config.fabric_plugins = {g_example, "/nonexistent/libkz_missing_fabric.so", Broken("init_unavailable"), g_example,
                           Broken("impostor")};
  auto registry = FabricRegistry::Create(config, Rank(0));
  const auto& slots = registry->fabrics();
  ASSERT_EQ(slots.size(), 4u) << "this test links no built-in fabric, and a path listed twice loads once";
  EXPECT_EQ(slots[0].name, "example_tcp");
  EXPECT_EQ(slots[0].origin, g_example);
  EXPECT_TRUE(slots[0].status.ok()) << slots[0].status.ToString();
  EXPECT_EQ(slots[1].name, "/nonexistent/libkz_missing_fabric.so");
  EXPECT_EQ(slots[1].status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(slots[1].status.message().find("dlopen failed"), std::string::npos) << slots[1].status.ToString();
  EXPECT_EQ(slots[2].status.code(), StatusCode::kUnavailable);
  // A second library that calls itself example_tcp would make KIZUNA_FABRIC ambiguous.
  EXPECT_EQ(slots[3].origin, Broken("impostor"));
  EXPECT_EQ(slots[3].status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(slots[3].status.message().find("'example_tcp' is already taken"), std::string::npos)
      << slots[3].status.ToString();
  EXPECT_NE(registry->Find("example_tcp"), nullptr);

  config.fabric = {"nothing_here", "example_tcp"};
  auto selected = registry->Select();
  ASSERT_TRUE(selected.ok()) << selected.status().ToString();
  EXPECT_EQ((*selected)->name(), "example_tcp");
}

TEST(PluginRegistryTest, CreateFabricFindsPluginsByName) {
  Config config = TestConfig();
  config.fabric_plugins = {Broken("init_unavailable"), g_example};
  auto fabric = CreateFabric("example_tcp", config, Rank(1));
  ASSERT_TRUE(fabric.ok()) << fabric.status().ToString();
  EXPECT_EQ((*fabric)->name(), "example_tcp");
  EXPECT_EQ((*fabric)->context().rank, 1);
  auto none = CreateFabric("nothing_here", config, Rank(1));
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("example_tcp"), std::string::npos) << none.status().ToString();
}

}  // namespace
}  // namespace kizuna::fabric

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--example_plugin=")) {
      kizuna::fabric::g_example = std::string(arg.substr(17));
    } else if (arg.ends_with(".so") || arg.ends_with(".c")) {
      // .../libbroken_<defect>.so, or the source the broken plugins are built from.
      const std::string path(arg);
      const size_t slash = path.rfind('/');
      std::string base = path.substr(slash == std::string::npos ? 0 : slash + 1);
      if (base.starts_with("libbroken_") && base.ends_with(".so"))
        kizuna::fabric::g_broken[base.substr(10, base.size() - 13)] = path;
      else
        kizuna::fabric::g_broken["source"] = path;
    } else {
      std::fprintf(stderr, "plugin_test: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
