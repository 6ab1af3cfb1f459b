// Failures on the staged path (ring and the other algorithms that move data through staging slots
// and fabric connections), as the fused path reports them: the caller's stream says a collective
// failed, and the culprit is named.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/file.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

Config StagedConfig(int n, double timeout_s) {
  Config c = WorldConfig(n);
  c.algo = "ring";
  c.timeout_s = timeout_s;
  return c;
}

bool Mentions(const Status& s, const std::string& text) { return s.ToString().find(text) != std::string::npos; }

// Two ranks call AllReduces of different sizes: both fail, and each caller's stream says so on
// its next Synchronize (once: the stream stays usable), not only the communicator's AsyncError.
TEST(StagedFailures, SynchronizeReportsAFailedCollective) {
  World w(2, StagedConfig(2, 20));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 2; ++r) buf.push_back(Alloc(w, r, 8000));
  for (int r = 0; r < 2; ++r) {
    const size_t count = r == 0 ? 1000 : 2000;
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(buf[r]->data(), buf[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(r))
                    .ok());
  }
  for (int r = 0; r < 2; ++r) {
    const Status synced = w.stream(r).Synchronize(Deadline::AfterSeconds(30));
    EXPECT_FALSE(synced.ok()) << "rank " << r << ": the stream carried a failed AllReduce";
    EXPECT_TRUE(Mentions(synced, "allreduce")) << synced.ToString();
    EXPECT_FALSE(w.comm(r).AsyncError().ok());
    EXPECT_TRUE(w.stream(r).Synchronize(Deadline::AfterSeconds(30)).ok()) << "reported once";
  }
}

// Waits for every rank's stream (each returns its failure or ok) and says how long it took.
double SyncAllSeconds(World& w, std::vector<Status>* out) {
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < w.size(); ++r) out->push_back(w.stream(r).Synchronize(Deadline::AfterSeconds(120)));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// After a mismatch every rank's error names it — not "the sending side closed the connection"
// on the ranks that were only told to stop.
TEST(StagedFailures, EveryRankNamesAMismatch) {
  World w(4, StagedConfig(4, 30));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 4; ++r) buf.push_back(Alloc(w, r, 8000));
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(buf[r]->data(), buf[r]->data(), r == 0 ? 1000 : 2000, DataType::kFloat32,
                               ReduceOp::kSum, w.stream(r))
                    .ok());
  std::vector<Status> synced;
  EXPECT_LT(SyncAllSeconds(w, &synced), 15);
  for (int r = 0; r < 4; ++r) {
    const Status error = w.comm(r).AsyncError();
    EXPECT_TRUE(Mentions(error, "mismatch")) << "rank " << r << ": " << error.ToString();
  }
}

// One rank calls an extra AllReduce where the others call a Barrier: the ranks it does not
// exchange data with still learn of it (they ask their peers where they are when stalled), well
// before the deadline.
TEST(StagedFailures, ExtraCallOnOneRankIsNamedBeforeTheDeadline) {
  World w(3, StagedConfig(3, 30));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 3; ++r) buf.push_back(Alloc(w, r, 4000));
  ASSERT_TRUE(
      w.comm(1).AllReduce(buf[1]->data(), buf[1]->data(), 1000, DataType::kFloat32, ReduceOp::kSum, w.stream(1)).ok());
  // Rank 1's may be refused already: its AllReduce may have failed by now.
  for (int r = 0; r < 3; ++r) (void)w.comm(r).Barrier(w.stream(r));
  std::vector<Status> synced;
  EXPECT_LT(SyncAllSeconds(w, &synced), 15);
  for (int r = 0; r < 3; ++r) {
    const Status error = w.comm(r).AsyncError();
    EXPECT_TRUE(Mentions(error, "mismatch")) << "rank " << r << ": " << error.ToString();
    EXPECT_TRUE(Mentions(error, "barrier") && Mentions(error, "allreduce")) << "rank " << r << ": " << error.ToString();
  }
}

// A rank that never calls: the others time out naming it, and what it last called.
TEST(StagedFailures, ARankThatNeverCallsIsNamed) {
  World w(3, StagedConfig(3, 3));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 3; ++r) buf.push_back(Alloc(w, r, 4000));
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(
        w.comm(r).AllReduce(buf[r]->data(), buf[r]->data(), 1000, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
  for (int r = 0; r < 2; ++r) {
    const Status synced = w.stream(r).Synchronize(Deadline::AfterSeconds(60));
    EXPECT_FALSE(synced.ok());
    const Status error = w.comm(r).AsyncError();
    EXPECT_TRUE(Mentions(error, "rank 2 has not called operation 1")) << "rank " << r << ": " << error.ToString();
  }
}

// A slow but healthy job: every operation takes a good part of the deadline and the queue far
// more than it. Nothing fails: deadlines are for operations (and streams) that stop moving.
TEST(StagedFailures, SlowButMovingRanksDoNotTimeOut) {
  Config c = StagedConfig(3, 2);
  c.emu_copy_gbps = 0.01;  // 10 MB/s: an AllReduce of 1 MB takes a few hundred ms
  World w(3, c);
  KZ_ASSERT_WORLD(w);
  const size_t count = 250000;
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 3; ++r) {
    buf.push_back(Alloc(w, r, count * 4));
    ASSERT_TRUE(w.Upload(r, buf[r]->data(), std::vector<float>(count, 1.0f)).ok());
  }
  const int calls = 10;
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < calls; ++k)
    for (int r = 0; r < 3; ++r)
      ASSERT_TRUE(w.comm(r)
                      .AllReduce(buf[r]->data(), buf[r]->data(), count, DataType::kFloat32, ReduceOp::kMax, w.stream(r))
                      .ok());
  for (int r = 0; r < 3; ++r) {
    const Status synced = w.stream(r).Synchronize();  // the configured deadline, 2 s without progress
    EXPECT_TRUE(synced.ok()) << "rank " << r << ": " << synced.ToString();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GT(took, 2.0) << "the queue must outlast the deadline for the test to mean anything";
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(w.comm(r).AsyncError().ok()) << w.comm(r).AsyncError().ToString();
}

// The flight recorder: every rank keeps its last operations (Communicator::FlightRecord); when
// one times out (rank 2 never calls the third AllReduce), the ranks that waited write theirs to
// KIZUNA_DUMP_ON_TIMEOUT's file: the two that finished, and the third, failed with the timeout.
TEST(StagedFailures, ATimeoutDumpsTheFlightRecorder) {
  Config config = StagedConfig(3, 2);
  const std::string pattern = ::testing::TempDir() + "/kz-flight-%r.json";
  config.dump_on_timeout = pattern;
  for (int r = 0; r < 3; ++r) std::remove((::testing::TempDir() + fmt::format("/kz-flight-{}.json", r)).c_str());
  World w(3, config);
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < 3; ++r) b.push_back(Alloc(w, r, 1 << 16));
  for (int round = 0; round < 2; ++round) {
    for (int r = 0; r < 3; ++r)
      ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), 1000, DataType::kFloat32, ReduceOp::kSum,
                                      w.stream(r)).ok());
    ASSERT_TRUE(w.SyncAll().ok());
  }
  const std::string before = w.comm(2).FlightRecord();
  EXPECT_NE(before.find("\"rank\":2"), std::string::npos) << before;
  EXPECT_NE(before.find("allreduce count=1000 float32 sum"), std::string::npos) << before;
  EXPECT_NE(before.find("\"algorithm\":\"ring\""), std::string::npos) << before;
  size_t oks = 0;
  for (size_t at = before.find("\"state\":\"ok\""); at != std::string::npos;
       at = before.find("\"state\":\"ok\"", at + 1))
    ++oks;
  EXPECT_EQ(oks, 2u) << before;

  for (int r = 0; r < 2; ++r)  // rank 2 never calls
    ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), 1000, DataType::kFloat32, ReduceOp::kSum,
                                    w.stream(r)).ok());
  for (int r = 0; r < 2; ++r) w.stream(r).Synchronize(Deadline::AfterSeconds(30)).IgnoreError();
  int dumped = 0;
  for (int r = 0; r < 2; ++r) {
    auto text = ReadFileCapped(::testing::TempDir() + fmt::format("/kz-flight-{}.json", r), 1 << 20);
    if (!text.ok()) continue;  // a rank whose error came from its peer, not from its own deadline
    ++dumped;
    EXPECT_NE(text->find(fmt::format("\"rank\":{}", r)), std::string::npos) << *text;
    EXPECT_NE(text->find("\"state\":\"failed\""), std::string::npos) << *text;
    EXPECT_NE(text->find("\"state\":\"ok\""), std::string::npos) << *text;
    EXPECT_NE(text->find("\"seq\":3"), std::string::npos) << *text;
  }
  EXPECT_GE(dumped, 1) << "no rank wrote " << pattern;
}

}  // namespace
}  // namespace kizuna::test
