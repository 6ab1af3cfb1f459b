// The communicator's behaviour around the collectives: argument checks (nothing enqueued on bad
// input), mismatch detection, timeouts, Abort, Split, deterministic mode, ranks on two hosts
// over two fabrics; the World's choice of backend (groups: group_test.cc). Tests over a World run on
// KIZUNA_TEST_BACKEND's devices when it is set (world.h) and move bytes with Upload / Download;
// the ones that build emulated backends of their own (speeds, two hosts) stay on the emulated
// accelerator.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/core/log_capture.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using Clock = std::chrono::steady_clock;

::testing::AssertionResult HasCode(const Status& s, StatusCode code) {
  if (s.code() == code) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "expected " << StatusCodeName(code) << ", got " << s.ToString();
}

::testing::AssertionResult Mentions(const Status& s, const std::string& text) {
  if (s.message().find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << s.ToString() << "' does not mention '" << text << "'";
}

TEST(Communicator, RejectsBadArgumentsWithoutEnqueueing) {
  World w(2, WorldConfig(2));
  KZ_ASSERT_WORLD(w);
  auto buf = Alloc(w, 0, 4096);
  Communicator& c = w.comm(0);
  device::Stream& s = w.stream(0);
  EXPECT_TRUE(HasCode(c.AllReduce(nullptr, buf->data(), 4, DataType::kFloat32, ReduceOp::kSum, s),
                      StatusCode::kInvalidArgument));
  EXPECT_TRUE(Mentions(c.AllReduce(buf->data(), buf->data(), 4, static_cast<DataType>(42), ReduceOp::kSum, s),
                       "data type"));
  EXPECT_TRUE(Mentions(c.AllReduce(buf->data(), buf->data(), 4, DataType::kFloat32, static_cast<ReduceOp>(9), s),
                       "reduction op"));
  EXPECT_TRUE(Mentions(c.Broadcast(buf->data(), buf->data(), 4, DataType::kFloat32, 2, s), "root 2"));
  EXPECT_TRUE(Mentions(c.Send(buf->data(), 4, DataType::kFloat32, 5, s), "peer 5"));
  // Partial overlap of send and receive.
  auto* p = static_cast<uint8_t*>(buf->data());
  EXPECT_TRUE(Mentions(c.AllReduce(p, p + 4, 16, DataType::kFloat32, ReduceOp::kSum, s), "overlap"));
  // AllToAll in place.
  EXPECT_TRUE(HasCode(c.AllToAll(p, p, 4, DataType::kFloat32, s), StatusCode::kInvalidArgument));
  // A stream of another device (where the world has two: other backends may put every rank on
  // one device).
  if (&w.device(0) != &w.device(1)) {
    EXPECT_TRUE(Mentions(c.AllReduce(p, p, 4, DataType::kFloat32, ReduceOp::kSum, w.stream(1)), "stream belongs"));
  }
  // Host memory that is not the device's: refused where the backend tells its allocations apart
  // (host_emulated does). A backend that cannot tell accepts it and must then run it: rank 1
  // joins with a matching call, so the ranks stay in step.
  std::vector<float> host(16, 1.0f);
  Status st = c.AllReduce(host.data(), host.data(), 16, DataType::kFloat32, ReduceOp::kSum, s);
  if (!st.ok()) {
    EXPECT_TRUE(Mentions(st, "not memory of"));
  } else {
    auto other = Alloc(w, 1, 64);
    ASSERT_TRUE(w.Upload(1, other->data(), std::vector<float>(16, 2.0f)).ok());
    ASSERT_TRUE(w.comm(1).AllReduce(other->data(), other->data(), 16, DataType::kFloat32, ReduceOp::kSum,
                                    w.stream(1)).ok());
    ASSERT_TRUE(w.SyncAll().ok()) << w.SyncAll().ToString();
    EXPECT_EQ(host[15], 3.0f);
  }
  // Nothing was enqueued: a matching pair of calls now still works on both ranks.
  auto b0 = Alloc(w, 0, 64), b1 = Alloc(w, 1, 64);
  std::vector<float> v0(16, 0.0f), v1(16, 0.0f);
  v0[0] = 1;
  v1[0] = 2;
  ASSERT_TRUE(w.Upload(0, b0->data(), v0).ok());
  ASSERT_TRUE(w.Upload(1, b1->data(), v1).ok());
  ASSERT_TRUE(w.comm(0).AllReduce(b0->data(), b0->data(), 16, DataType::kFloat32, ReduceOp::kSum, w.stream(0)).ok());
  ASSERT_TRUE(w.comm(1).AllReduce(b1->data(), b1->data(), 16, DataType::kFloat32, ReduceOp::kSum, w.stream(1)).ok());
  ASSERT_TRUE(w.SyncAll().ok());
  for (int r = 0; r < 2; ++r) {
    auto got = w.Download<float>(r, (r == 0 ? b0 : b1)->data(), 16);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ((*got)[0], 3) << "rank " << r;
  }
}

// Rank 0 reduces 100 elements, rank 1 200, one call each or both in one group of this thread
// (which then does not run them together: Executor::TryInlineGroup leaves mismatches to the
// executors).
void CheckMismatchIsNamed(bool grouped) {
  Config config = WorldConfig(2);
  config.timeout_s = 10;
  World w(2, config);
  KZ_ASSERT_WORLD(w);
  auto b0 = Alloc(w, 0, 4096), b1 = Alloc(w, 1, 4096);
  const auto start = Clock::now();
  if (grouped) {
    ASSERT_TRUE(Communicator::GroupStart().ok());
  }
  ASSERT_TRUE(w.comm(0).AllReduce(b0->data(), b0->data(), 100, DataType::kFloat32, ReduceOp::kSum, w.stream(0)).ok());
  ASSERT_TRUE(w.comm(1).AllReduce(b1->data(), b1->data(), 200, DataType::kFloat32, ReduceOp::kSum, w.stream(1)).ok());
  Status s = grouped ? Communicator::GroupEnd() : Status::Ok();
  if (s.ok()) s = w.SyncAll();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0) << "detected by the headers, not a timeout";
  ASSERT_FALSE(s.ok());
  Status e0 = w.comm(0).AsyncError(), e1 = w.comm(1).AsyncError();
  // At least one rank names the mismatch with both counts; the other learns of it.
  const std::string both = e0.ToString() + " | " + e1.ToString();
  EXPECT_NE(both.find("mismatch"), std::string::npos) << both;
  EXPECT_NE(both.find("count=100"), std::string::npos) << both;
  EXPECT_NE(both.find("count=200"), std::string::npos) << both;
  // The communicator is now unusable, saying why.
  EXPECT_TRUE(HasCode(w.comm(0).AllReduce(b0->data(), b0->data(), 1, DataType::kFloat32, ReduceOp::kSum, w.stream(0)),
                      StatusCode::kAborted));
}

TEST(Communicator, MismatchNamesBothCallsAndRanks) { CheckMismatchIsNamed(/*grouped=*/false); }

TEST(Communicator, AMismatchInAGroupIsNamed) { CheckMismatchIsNamed(/*grouped=*/true); }

TEST(Communicator, DifferentCollectivesAreAMismatch) {
  World w(3, WorldConfig(3));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Alloc(w, r, 4096));
  for (int r = 0; r < 3; ++r) {
    if (r == 1)
      ASSERT_TRUE(w.comm(r).Broadcast(b[1]->data(), b[1]->data(), 64, DataType::kFloat32, 0, w.stream(r)).ok());
    else
      ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), 64, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
  }
  EXPECT_FALSE(w.SyncAll().ok());
  std::string all;
  for (int r = 0; r < 3; ++r) all += w.comm(r).AsyncError().ToString() + " | ";
  EXPECT_NE(all.find("broadcast"), std::string::npos) << all;
  EXPECT_NE(all.find("allreduce"), std::string::npos) << all;
}

TEST(Communicator, MissingRankTimesOutNamingIt) {
  Config config = WorldConfig(3);
  config.timeout_s = 2;
  World w(3, config);
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Alloc(w, r, 4096));
  const auto start = Clock::now();
  for (int r = 0; r < 2; ++r)  // rank 2 never calls
    ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), 64, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
  for (int r = 0; r < 2; ++r) w.stream(r).Synchronize(Deadline::AfterSeconds(30)).IgnoreError();
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(took, 10.0);
  std::string all = w.comm(0).AsyncError().ToString() + " | " + w.comm(1).AsyncError().ToString();
  EXPECT_NE(all.find("rank"), std::string::npos) << all;
  EXPECT_TRUE(w.comm(0).AsyncError().code() == StatusCode::kTimeout ||
              w.comm(1).AsyncError().code() == StatusCode::kTimeout)
      << all;
  EXPECT_NE(all.find("2"), std::string::npos) << all;
}

// Runs one AllReduce of `count` floats with `algorithm` on every rank of `w` and checks the sums.
void AllReduceChecked(World& w, Algorithm algorithm, size_t count) {
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < w.size(); ++r) {
    b.push_back(Alloc(w, r, count * 4));
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(InputValue(ReduceOp::kSum, r, i));
    ASSERT_TRUE(w.Upload(r, b[r]->data(), values).ok());
  }
  CallOptions call;
  call.algorithm = algorithm;
  for (int r = 0; r < w.size(); ++r)
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(r), call)
                    .ok());
  const Status synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << collectives::AlgorithmName(algorithm) << ": " << synced.ToString();
  for (int r = 0; r < w.size(); ++r) {
    auto got = w.Download<float>(r, b[r]->data(), count);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t i = 0; i < count; i += 37)
      ASSERT_EQ((*got)[i], Reduced(ReduceOp::kSum, w.size(), i, DataType::kFloat32))
          << collectives::AlgorithmName(algorithm) << " rank " << r << " element " << i;
  }
}

// Connections are made when an operation first needs them, not at creation: ring AllReduces on 16
// ranks connect each rank to its two neighbours and to nobody else; recursive halving-doubling
// then connects the partners it exchanges with too, and still not every rank.
TEST(Communicator, ConnectionsFollowThePeersThePlansUse) {
  constexpr int kRanks = 16;
  World w(kRanks, WorldConfig(8));
  KZ_ASSERT_WORLD(w);
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(w.comm(r).ConnectedPeers().empty()) << "rank " << r;
  for (int i = 0; i < 2; ++i) AllReduceChecked(w, Algorithm::kRing, 16 * 1000 + 7);
  std::vector<std::vector<int>> ring(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    const int prev = (r + kRanks - 1) % kRanks, next = (r + 1) % kRanks;
    ring[r] = {std::min(prev, next), std::max(prev, next)};
    EXPECT_EQ(w.comm(r).ConnectedPeers(), ring[r]) << "rank " << r;
  }
  AllReduceChecked(w, Algorithm::kRhd, 16 * 1000 + 7);
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<int> now = w.comm(r).ConnectedPeers();
    EXPECT_GT(now.size(), ring[r].size()) << "rank " << r;
    EXPECT_LT(now.size(), static_cast<size_t>(kRanks - 1)) << "rank " << r;
    EXPECT_TRUE(std::includes(now.begin(), now.end(), ring[r].begin(), ring[r].end())) << "rank " << r;
  }
}

// A Barrier returns on no rank before every rank has called it, however many of its steps the
// executor's window starts at once: rank 7 calls 300 ms after the others. Each algorithm that
// serves Barrier on 8 ranks, forced by KIZUNA_ALGO.
TEST(Communicator, BarrierWaitsForTheLastRank) {
  for (const char* algo : {"barrier:rd", "barrier:pairwise", "barrier:ring"}) {
    Config config = WorldConfig(8);
    config.algo = algo;
    World w(8, config);
    KZ_ASSERT_WORLD(w);
    std::vector<double> returned(8, 0);
    const auto start = Clock::now();
    std::vector<std::thread> ranks;
    for (int r = 0; r < 8; ++r)
      ranks.emplace_back([&, r] {
        if (r == 7) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const Status called = w.comm(r).Barrier(w.stream(r));
        const Status synced = w.stream(r).Synchronize(Deadline::AfterSeconds(30));
        EXPECT_TRUE(called.ok() && synced.ok()) << algo << " rank " << r << ": " << called.ToString() << " "
                                                << synced.ToString();
        returned[static_cast<size_t>(r)] = std::chrono::duration<double>(Clock::now() - start).count();
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < 8; ++r) EXPECT_GE(returned[static_cast<size_t>(r)], 0.29) << algo << " rank " << r;
  }
}

TEST(Communicator, AbortReleasesWaitingStreamsPromptly) {
  Config config = WorldConfig(2);
  config.timeout_s = 60;
  World w(2, config);
  KZ_ASSERT_WORLD(w);
  auto b0 = Alloc(w, 0, 4096);
  ASSERT_TRUE(w.comm(0).AllReduce(b0->data(), b0->data(), 64, DataType::kFloat32, ReduceOp::kSum, w.stream(0)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = Clock::now();
  w.comm(0).Abort();
  // Released promptly, saying that the AllReduce it carried did not happen.
  EXPECT_TRUE(HasCode(w.stream(0).Synchronize(Deadline::AfterSeconds(10)), StatusCode::kAborted));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 3.0);
  EXPECT_TRUE(HasCode(w.comm(0).AsyncError(), StatusCode::kAborted));
  // The peer that is told fails promptly too when it arrives.
  auto b1 = Alloc(w, 1, 4096);
  ASSERT_TRUE(w.comm(1).AllReduce(b1->data(), b1->data(), 64, DataType::kFloat32, ReduceOp::kSum, w.stream(1)).ok());
  EXPECT_FALSE(w.stream(1).Synchronize(Deadline::AfterSeconds(20)).ok());
  EXPECT_FALSE(w.comm(1).AsyncError().ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
}

TEST(Communicator, AbortWhileIdleTellsThePeers) {
  Config config = WorldConfig(2);
  config.timeout_s = 60;
  World w(2, config);
  KZ_ASSERT_WORLD(w);
  w.comm(0).Abort();  // no operation running
  auto b1 = Alloc(w, 1, 4096);
  const auto start = Clock::now();
  ASSERT_TRUE(w.comm(1).AllReduce(b1->data(), b1->data(), 64, DataType::kFloat32, ReduceOp::kSum, w.stream(1)).ok());
  EXPECT_FALSE(w.stream(1).Synchronize(Deadline::AfterSeconds(30)).ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0) << "the peer waited for its timeout";
  EXPECT_FALSE(w.comm(1).AsyncError().ok());
}

TEST(Communicator, SplitMakesWorkingSubCommunicators) {
  World w(5, WorldConfig(5));
  KZ_ASSERT_WORLD(w);
  // Colors: even ranks 0, odd ranks 1, rank 4 none. Keys reverse the order.
  std::vector<Result<std::unique_ptr<Communicator>>> subs;
  for (int r = 0; r < 5; ++r) subs.emplace_back(Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 5; ++r)
    threads.emplace_back([&, r] { subs[r] = w.comm(r).Split(r == 4 ? kSplitNoColor : r % 2, 10 - r); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 5; ++r) ASSERT_TRUE(subs[r].ok()) << subs[r].status().ToString();
  EXPECT_EQ(*subs[4], nullptr);
  // Even: ranks 0, 2 -> keys 10, 8 -> new order 2, 0.
  EXPECT_EQ((*subs[2])->rank(), 0);
  EXPECT_EQ((*subs[0])->rank(), 1);
  EXPECT_EQ((*subs[0])->size(), 2);
  EXPECT_EQ((*subs[1])->size(), 2);
  // An AllReduce on the odd communicator.
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < 5; ++r) {
    b.push_back(Alloc(w, r, 64));
    ASSERT_TRUE(w.Upload(r, b[r]->data(), std::vector<float>{static_cast<float>(r)}).ok());
  }
  for (int r : {1, 3})
    ASSERT_TRUE((*subs[r])->AllReduce(b[r]->data(), b[r]->data(), 1, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
  for (int r : {1, 3}) ASSERT_TRUE(w.stream(r).Synchronize(Deadline::AfterSeconds(30)).ok());
  for (int r : {1, 3}) {
    auto got = w.Download<float>(r, b[r]->data(), 1);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ((*got)[0], 4.0f) << "rank " << r;
  }
}

// Devices of two instances of one backend (an application's own beside another) keep their memory
// apart: the ranks do not share one in-process group (whose parts would hand each device the
// other instance's memory: before, fused failed so at run time); they meet as ranks of one host,
// mapping each other's buffers, and fused runs there as the model's choice or forced.
TEST(Communicator, TwoInstancesOfABackendMeetAsRanksOfOneHost) {
  Config config = WorldConfig(2);
  config.emu_reduce_gbps = config.emu_copy_gbps = 100;  // parts on the devices' streams, which check memory
  auto a = host_emulated::CreateHostEmulatedBackend(config), b = host_emulated::CreateHostEmulatedBackend(config);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<device::Device*> devices = {(*a)->device(0), (*b)->device(1)};
  CommOptions options;
  options.config = &config;
  options.staging_bytes = 1u << 20;
  auto comms = Communicator::CreateLocal(devices, options);
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  std::vector<std::unique_ptr<device::Buffer>> bufs;
  std::vector<std::unique_ptr<device::Stream>> streams;
  for (int r = 0; r < 2; ++r) {
    auto buf = devices[r]->Allocate(4096 * 4);
    auto st = devices[r]->CreateStream();
    ASSERT_TRUE(buf.ok() && st.ok());
    std::fill_n(static_cast<float*>((*buf)->data()), 4096, static_cast<float>(r + 1));
    bufs.push_back(std::move(*buf));
    streams.push_back(std::move(*st));
  }
  float want = 3;  // 1 + 2, then doubled by each later call
  for (const std::optional<Algorithm> algo : {std::optional<Algorithm>(), std::optional(Algorithm::kFused)}) {
    CallOptions call;
    call.algorithm = algo;
    for (int r = 0; r < 2; ++r)
      ASSERT_TRUE(
          (*comms)[r]
              ->AllReduce(bufs[r]->data(), bufs[r]->data(), 4096, DataType::kFloat32, ReduceOp::kSum, *streams[r], call)
              .ok());
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(streams[r]->Synchronize(Deadline::AfterSeconds(60)).ok());
      ASSERT_TRUE((*comms)[r]->AsyncError().ok()) << (*comms)[r]->AsyncError().ToString();
      EXPECT_EQ(static_cast<float*>(bufs[r]->data())[4095], want) << (algo ? "fused" : "the model's choice");
    }
    want *= 2;
  }
  streams.clear();
  bufs.clear();
  comms->clear();
}

// Fused collectives between in-process ranks take two paths on the emulated device: unthrottled,
// each rank does its part on its executor's thread; throttled (its streams pace the work), through
// its stream, the ranks finishing on each other's events. Both give exact results in every
// rank's output, over sizes whose outputs are stored non-temporally, several rounds in a row.
TEST(Communicator, FusedRunsOnTheThreadOrThroughTheStream) {
  for (const bool paced : {false, true}) {
    Config config = WorldConfig(4);
    if (paced) config.emu_copy_gbps = config.emu_reduce_gbps = 20;
    auto backend = host_emulated::CreateHostEmulatedBackend(config);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    std::vector<device::Device*> devices;
    for (int r = 0; r < 4; ++r) devices.push_back((*backend)->device(r));
    CommOptions options;
    options.config = &config;
    options.staging_bytes = 2u << 20;
    auto comms = Communicator::CreateLocal(devices, options);
    ASSERT_TRUE(comms.ok()) << comms.status().ToString();
    const size_t count = 1000003;  // 4 MB per rank's output
    std::vector<std::unique_ptr<device::Buffer>> in, out;
    std::vector<std::unique_ptr<device::Stream>> streams;
    for (int r = 0; r < 4; ++r) {
      auto a = devices[r]->Allocate(count * 4), b = devices[r]->Allocate(count * 4);
      auto st = devices[r]->CreateStream();
      ASSERT_TRUE(a.ok() && b.ok() && st.ok());
      for (size_t i = 0; i < count; ++i) static_cast<float*>((*a)->data())[i] = static_cast<float>((r * 7 + i) % 11);
      in.push_back(std::move(*a));
      out.push_back(std::move(*b));
      streams.push_back(std::move(*st));
    }
    CallOptions call;
    call.algorithm = Algorithm::kFused;
    for (int round = 0; round < 3; ++round) {
      const std::string where = fmt::format("{}, round {}", paced ? "paced" : "unthrottled", round);
      for (int r = 0; r < 4; ++r) std::memset(out[r]->data(), 0xff, count * 4);
      for (int r = 0; r < 4; ++r)
        ASSERT_TRUE((*comms)[r]->AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                           *streams[r], call).ok());
      for (int r = 0; r < 4; ++r) ASSERT_TRUE(streams[r]->Synchronize(Deadline::AfterSeconds(60)).ok());
      for (int r = 0; r < 4; ++r) {
        ASSERT_TRUE((*comms)[r]->AsyncError().ok()) << (*comms)[r]->AsyncError().ToString();
        for (size_t i = 0; i < count; i += 97) {
          float want = 0;
          for (int q = 0; q < 4; ++q) want += static_cast<float>((q * 7 + i) % 11);
          ASSERT_EQ(static_cast<float*>(out[r]->data())[i], want) << where << " rank " << r << " element " << i;
        }
      }
      const int root = round + 1;
      for (int r = 0; r < 4; ++r)
        ASSERT_TRUE((*comms)[r]->Broadcast(in[r]->data(), out[r]->data(), count, DataType::kFloat32, root,
                                           *streams[r], call).ok());
      for (int r = 0; r < 4; ++r) ASSERT_TRUE(streams[r]->Synchronize(Deadline::AfterSeconds(60)).ok());
      for (int r = 0; r < 4; ++r)
        ASSERT_EQ(std::memcmp(out[r]->data(), in[static_cast<size_t>(root)]->data(), count * 4), 0)
            << where << ": broadcast from " << root << ", rank " << r;
    }
    streams.clear();
    in.clear();
    out.clear();
    comms->clear();
  }
}

// KIZUNA_DETERMINISTIC=1: random float32 and float16 inputs give bitwise identical AllReduce and
// ReduceScatter results for every algorithm and chunk size.
TEST(Communicator, DeterministicModeIsBitwiseStable) {
  const int n = 5;
  const size_t count = 3001;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
  for (auto& v : inputs)
    for (float& x : v) x = dist(rng);
  std::vector<std::vector<uint8_t>> reference;
  for (uint64_t chunk : {uint64_t{0}, uint64_t{256}}) {
    Config config = WorldConfig(n);
    config.deterministic = true;
    if (chunk) config.chunk_bytes = chunk;
    World w(n, config);
    KZ_ASSERT_WORLD(w);
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kRd, Algorithm::kPairwise}) {
      std::vector<std::unique_ptr<device::Buffer>> b;
      CallOptions options;
      options.algorithm = algo;
      for (int r = 0; r < n; ++r) {
        b.push_back(Alloc(w, r, count * 4));
        ASSERT_TRUE(w.Upload(r, b[r]->data(), inputs[r]).ok());
      }
      for (int r = 0; r < n; ++r)
        ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                        w.stream(r), options)
                        .ok());
      ASSERT_TRUE(w.SyncAll().ok());
      for (int r = 0; r < n; ++r) {
        auto downloaded = w.Download<uint8_t>(r, b[r]->data(), count * 4);
        ASSERT_TRUE(downloaded.ok()) << downloaded.status().ToString();
        const std::vector<uint8_t>& got = *downloaded;
        if (reference.empty()) {
          // The reference: every element reduced in rank order, in float32.
          std::vector<float> want(count);
          for (size_t i = 0; i < count; ++i) {
            float acc = inputs[0][i];
            for (int q = 1; q < n; ++q) acc += inputs[q][i];
            want[i] = acc;
          }
          reference.emplace_back(reinterpret_cast<uint8_t*>(want.data()),
                                 reinterpret_cast<uint8_t*>(want.data()) + count * 4);
        }
        EXPECT_EQ(got, reference[0]) << "algorithm " << collectives::AlgorithmName(algo) << " chunk " << chunk
                                     << " rank " << r;
      }
    }
  }
}

// Four ranks that say they run on two hosts (ranks 0, 1 on hostA, 2, 3 on hostB) and no topology:
// pairs inside a host over direct links (directconnect's "full" links the ranks of each host),
// pairs across hosts over `network` — with `fabrics` empty, every available fabric is used and
// the default order puts tcp there (Fabric::default_rank: plain sockets before ofi's tcp;ofi_rxm);
// every algorithm's AllReduce is exact over the mixed connections. Over tcp, the pairs across
// hosts that send both ways (recursive halving-doubling, pairwise) do it on one connection each
// (fabric/tcp/README.md, "Both directions").
// Kept whole: one scenario, set up, run and checked in order.
void RanksOnTwoHosts(const std::string& network, const std::vector<std::string>& fabrics) {
  // The pretend hosts are one machine: libfabric's tcp provider stays on the loopback interface.
  ASSERT_EQ(::setenv("FI_TCP_IFACE", "lo", 1), 0);
  const int n = 4;
  Config config;
  config.emulated_devices = n;
  config.timeout_s = 30;
  config.fabric = fabrics;
  {
    fabric::FabricContext ctx;
    ctx.world_size = n;
    auto f = fabric::CreateFabric(network, config, ctx);
    if (f.status().code() == StatusCode::kUnavailable)
      GTEST_SKIP() << network << " is not available here: " << f.status().ToString();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
  }
  auto backend = host_emulated::CreateHostEmulatedBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto created = CreateByThreads(
      n, [&](int r) { return (*backend)->device(r); },
      [&](int r) {
        CommOptions options;
        options.config = &config;
        options.staging_bytes = 2u << 20;
        options.host_id = r < 2 ? "hostA" : "hostB";
        return options;
      });
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(created[r].ok()) << "rank " << r << ": " << created[r].status().ToString();
    comms.push_back(std::move(*created[r]));
  }

  // Which fabric serves which peers: "directconnect: rank 1 (device w0:port0); ofi: ranks 2, 3 (...".
  for (int r = 0; r < n; ++r) {
    const std::string d = comms[r]->DescribeConnections();
    const int partner = r ^ 1;
    const std::string across = r < 2 ? "ranks 2, 3" : "ranks 0, 1";
    EXPECT_NE(d.find(fmt::format("directconnect: rank {} (", partner)), std::string::npos) << "rank " << r << ": " << d;
    EXPECT_NE(d.find(fmt::format("{}: {} (", network, across)), std::string::npos) << "rank " << r << ": " << d;
    EXPECT_EQ(d.find("unreachable"), std::string::npos) << "rank " << r << ": " << d;
    EXPECT_EQ(comms[r]->topology().host_count(), 2);
  }

  // AllReduce with every algorithm that spans the ranks, for a small and a multi-chunk count (not
  // a multiple of the world size).
  std::vector<std::unique_ptr<device::Stream>> streams;
  for (int r = 0; r < n; ++r) {
    auto s = (*backend)->device(r)->CreateStream();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    streams.push_back(std::move(*s));
  }
  for (size_t count : {size_t{1001}, size_t{300007}}) {
    std::vector<std::unique_ptr<device::Buffer>> bufs;
    for (int r = 0; r < n; ++r) {
      auto b = (*backend)->device(r)->Allocate(count * 4);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      bufs.push_back(std::move(*b));
    }
    for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kPairwise,
                           Algorithm::kHierRing, Algorithm::kHierRd}) {
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          static_cast<float*>(bufs[r]->data())[i] = static_cast<float>(InputValue(ReduceOp::kSum, r, i));
      CallOptions call;
      call.algorithm = algo;
      for (int r = 0; r < n; ++r)
        ASSERT_TRUE(comms[r]->AllReduce(bufs[r]->data(), bufs[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                        *streams[r], call).ok());
      for (int r = 0; r < n; ++r) {
        Status s = streams[r]->Synchronize(Deadline::AfterSeconds(60));
        ASSERT_TRUE(s.ok()) << collectives::AlgorithmName(algo) << " rank " << r << ": " << s.ToString();
        ASSERT_TRUE(comms[r]->AsyncError().ok()) << comms[r]->AsyncError().ToString();
      }
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          ASSERT_EQ(static_cast<float*>(bufs[r]->data())[i], Reduced(ReduceOp::kSum, n, i, DataType::kFloat32))
              << collectives::AlgorithmName(algo) << " count " << count << " rank " << r << " element " << i;
    }
  }
  streams.clear();
  {
    kizuna::testing::LogCapture log(LogLevel::kInfo, kLogColl);
    comms.clear();
    // "connected 3 of 3 peer(s) (ranks 0, 1, 3); sent to 1 of them over the connection the peer made"
    const std::string text = log.Text();
    const bool both_ways = text.find("over the connection the peer made") != std::string::npos;
    EXPECT_EQ(both_ways, network == "tcp") << text;
  }
}

TEST(Communicator, RanksOnTwoHostsUseDirectLinksInsideAHostAndTcpBetween) { RanksOnTwoHosts("tcp", {}); }

TEST(Communicator, RanksOnTwoHostsUseOfiBetweenWhenKizunaFabricNamesIt) {
  RanksOnTwoHosts("ofi", {"directconnect", "ofi"});
}

// Ranks compare versions before anything else: another minor forms the communicator, another
// major (another ABI) is refused on every rank with both versions named.
TEST(Communicator, RanksOfAnotherMajorVersionAreRefused) {
  const int n = 3;
  Config config;
  config.emulated_devices = n;
  config.timeout_s = 30;
  auto backend = host_emulated::CreateHostEmulatedBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  for (const Version other : {Version{kVersion.major, kVersion.minor + 1, 7}, Version{kVersion.major + 1, 0, 0}}) {
    const bool same_major = other.major == kVersion.major;
    auto created = CreateByThreads(
        n, [&](int r) { return (*backend)->device(r); },
        [&](int r) {
          CommOptions options;
          options.config = &config;
          if (r == 2) options.version = other;
          return options;
        });
    for (int r = 0; r < n; ++r) {
      if (same_major) {
        EXPECT_TRUE(created[r].ok()) << "rank " << r << ": " << created[r].status().ToString();
        continue;
      }
      ASSERT_FALSE(created[r].ok()) << "rank " << r;
      EXPECT_TRUE(HasCode(created[r].status(), StatusCode::kInvalidArgument));
      EXPECT_TRUE(Mentions(created[r].status(), VersionString(kVersion))) << "rank " << r;
      EXPECT_TRUE(Mentions(created[r].status(), VersionString(other))) << "rank " << r;
      EXPECT_TRUE(Mentions(created[r].status(), "different major versions")) << "rank " << r;
    }
  }
}

// KIZUNA_TEST_BACKEND (world.h): the named backend's devices from the registry, round-robin; a
// backend the registry reports unavailable makes the world skip with the registry's reason; a
// name no backend in the binary has is an error naming the ones there are.
TEST(World, BackendFromTheEnvironment) {
  const char* before = std::getenv("KIZUNA_TEST_BACKEND");
  const std::string saved = before != nullptr ? before : "";
  struct Restore {
    bool had;
    std::string value;
    ~Restore() {
      if (had) ::setenv("KIZUNA_TEST_BACKEND", value.c_str(), 1);
      else ::unsetenv("KIZUNA_TEST_BACKEND");
    }
  } restore{before != nullptr, saved};

  ASSERT_EQ(::setenv("KIZUNA_TEST_BACKEND", "host_emulated", 1), 0);
  {
    World w(3, WorldConfig(2));
    ASSERT_TRUE(w.status().ok()) << w.status().ToString();
    EXPECT_TRUE(w.skip_reason().empty());
    EXPECT_EQ(w.device(0).properties().backend, "host_emulated");
    EXPECT_EQ(&w.device(2), &w.device(0)) << "3 ranks on 2 devices: round-robin";
    EXPECT_NE(&w.device(1), &w.device(0));
  }
  {
    Config config = WorldConfig(2);
    config.emulated_devices = 0;  // the backend reports itself unavailable
    World w(2, config);
    EXPECT_NE(w.skip_reason().find("KIZUNA_TEST_BACKEND=host_emulated: unavailable"), std::string::npos)
        << w.skip_reason();
    EXPECT_NE(w.skip_reason().find("KIZUNA_EMULATED_DEVICES=0"), std::string::npos) << w.skip_reason();
  }
  ASSERT_EQ(::setenv("KIZUNA_TEST_BACKEND", "no_such_backend", 1), 0);
  {
    World w(2, WorldConfig(2));
    EXPECT_TRUE(w.skip_reason().empty());
    EXPECT_TRUE(HasCode(w.status(), StatusCode::kInvalidArgument));
    EXPECT_TRUE(Mentions(w.status(), "no backend of that name in this binary (backends: "));
  }
}

}  // namespace
}  // namespace kizuna::test
