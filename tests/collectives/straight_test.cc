// The straight path (collectives/executor/straight.cc): a small collective whose every transfer
// travels inside an operation header runs its steps in order on one thread, without staging
// slots or streams. Results checked against the expected values, the path confirmed by the flight
// record, failures named as on the staged path, and a rank on either path meeting a peer on the
// other.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

// Algorithms whose plans send to and receive from each peer at most once at 2 and 4 ranks (a
// chain, for Broadcast and Reduce: receives before sends).
constexpr const char* kAlgos = "allreduce:rd;allgather:pairwise;barrier:rd;broadcast:ring;reduce:ring";

bool Mentions(const Status& s, const std::string& text) { return s.ToString().find(text) != std::string::npos; }

// n ranks as threads, each over direct links with a configuration of its own: `traced` ranks
// record a trace (KIZUNA_TRACE_FILE), which keeps them on the staged path.
class Ranks {
 public:
  Ranks(int n, double timeout_s, const std::vector<int>& traced = {}) {
    for (int r = 0; r < n; ++r) {
      auto c = std::make_unique<Config>(WorldConfig(n));
      c->algo = kAlgos;
      c->timeout_s = timeout_s;
      if (std::find(traced.begin(), traced.end(), r) != traced.end())
        c->trace_file = ::testing::TempDir() + "/kz-straight-trace-%r.json";
      configs_.push_back(std::move(c));
    }
    auto backend = host_emulated::CreateHostEmulatedBackend(*configs_[0]);
    if (!backend.ok()) {
      status_ = backend.status();
      return;
    }
    backend_ = std::move(*backend);
    auto created = CreateByThreads(
        n, [&](int r) { return backend_->device(r); },
        [&](int r) {
          CommOptions options;
          options.config = configs_[static_cast<size_t>(r)].get();
          return options;
        });
    for (int r = 0; r < n; ++r) {
      if (!created[r].ok()) {
        status_ = created[r].status().WithContext(fmt::format("rank {}", r));
        return;
      }
      comms_.push_back(std::move(*created[r]));
      auto s = comms_.back()->device().CreateStream();
      if (!s.ok()) {
        status_ = s.status();
        return;
      }
      streams_.push_back(std::move(*s));
      io_.push_back(std::make_unique<DeviceIo>(comms_.back()->device(), *streams_.back()));
    }
  }

  int size() const { return static_cast<int>(comms_.size()); }
  const Status& status() const { return status_; }
  Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }
  device::Stream& stream(int r) { return *streams_[static_cast<size_t>(r)]; }
  DeviceIo& io(int r) { return *io_[static_cast<size_t>(r)]; }
  // The last `k` flight records of rank r: whether each ran straight, oldest first.
  std::vector<bool> LastStraight(int r, size_t k) {
    const auto records = nlohmann::json::parse(comm(r).FlightRecord())["records"];
    std::vector<bool> out;
    for (size_t i = records.size() >= k ? records.size() - k : 0; i < records.size(); ++i)
      out.push_back(records[i]["straight"].get<bool>());
    return out;
  }
  Status SyncAll() {
    for (int r = 0; r < size(); ++r) KZ_RETURN_IF_ERROR(stream(r).Synchronize(Deadline::AfterSeconds(60)));
    for (int r = 0; r < size(); ++r) KZ_RETURN_IF_ERROR(comm(r).AsyncError());
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Config>> configs_;  // outlive the backend and the communicators
  std::unique_ptr<device::Backend> backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
  std::vector<std::unique_ptr<DeviceIo>> io_;
  Status status_;
};

// One round of five small collectives on every rank, checked: an AllReduce of 2 floats, a
// Barrier, a Broadcast of 3 floats from rank 1, a Reduce of 2 floats to rank 0 and an AllGather of
// 1 float each: kRoundOps operations per rank.
constexpr size_t kRoundOps = 5;
void CheckedRound(Ranks& w, int round) {
  const int n = w.size();
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(w.comm(r).device().Allocate(64).value());
    out.push_back(w.comm(r).device().Allocate(64).value());
  }
  auto value = [&](int r, int i) { return static_cast<float>(round * 100 + r * 10 + i + 1); };
  auto upload = [&](int r, std::vector<float> v) {
    EXPECT_TRUE(w.io(r).Upload(in[r]->data(), v.data(), v.size() * 4).ok());
  };
  auto download = [&](int r, const void* from, size_t count) {
    std::vector<float> v(count);
    EXPECT_TRUE(w.io(r).Download(v.data(), from, count * 4).ok());
    return v;
  };
  for (int r = 0; r < n; ++r) {
    upload(r, {value(r, 0), value(r, 1)});
    ASSERT_TRUE(
        w.comm(r).AllReduce(in[r]->data(), out[r]->data(), 2, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
    ASSERT_TRUE(w.comm(r).Barrier(w.stream(r)).ok());
  }
  const Status synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << synced.ToString();
  for (int r = 0; r < n; ++r) {
    std::vector<float> want(2, 0);
    for (int q = 0; q < n; ++q)
      for (int i = 0; i < 2; ++i) want[i] += value(q, i);
    EXPECT_EQ(download(r, out[r]->data(), 2), want) << "AllReduce, rank " << r;
  }
  for (int r = 0; r < n; ++r) {
    upload(r, {value(r, 0), value(r, 1), value(r, 2)});
    ASSERT_TRUE(w.comm(r).Broadcast(in[r]->data(), out[r]->data(), 3, DataType::kFloat32, 1, w.stream(r)).ok());
  }
  EXPECT_TRUE(w.SyncAll().ok());
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(download(r, out[r]->data(), 3), (std::vector<float>{value(1, 0), value(1, 1), value(1, 2)}))
        << "Broadcast, rank " << r;
  for (int r = 0; r < n; ++r) {
    upload(r, {value(r, 0), value(r, 1)});
    ASSERT_TRUE(
        w.comm(r).Reduce(in[r]->data(), out[r]->data(), 2, DataType::kFloat32, ReduceOp::kMax, 0, w.stream(r)).ok());
  }
  EXPECT_TRUE(w.SyncAll().ok());
  EXPECT_EQ(download(0, out[0]->data(), 2), (std::vector<float>{value(n - 1, 0), value(n - 1, 1)})) << "Reduce";
  for (int r = 0; r < n; ++r) {
    upload(r, {value(r, 0)});
    ASSERT_TRUE(w.comm(r).AllGather(in[r]->data(), out[r]->data(), 1, DataType::kFloat32, w.stream(r)).ok());
  }
  EXPECT_TRUE(w.SyncAll().ok());
  std::vector<float> gathered;
  for (int q = 0; q < n; ++q) gathered.push_back(value(q, 0));
  for (int r = 0; r < n; ++r) EXPECT_EQ(download(r, out[r]->data(), n), gathered) << "AllGather, rank " << r;
}

TEST(Straight, SmallCollectivesRunStraightWithCheckedResults) {
  for (int n : {2, 4}) {
    Ranks w(n, 30);
    ASSERT_TRUE(w.status().ok()) << w.status().ToString();
    CheckedRound(w, 0);  // makes the connections (a first use of a peer goes the staged way)
    for (int round = 1; round <= 3; ++round) {
      CheckedRound(w, round);
      const size_t ops = kRoundOps;
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(w.LastStraight(r, ops), std::vector<bool>(ops, true))
            << n << " ranks, rank " << r << ": " << w.comm(r).FlightRecord();
    }
  }
}

// A rank that records a trace runs the staged path; its peers, straight, meet it all the same.
TEST(Straight, StraightAndStagedRanksMeet) {
  for (int n : {2, 4}) {
    Ranks w(n, 30, {0});
    ASSERT_TRUE(w.status().ok()) << w.status().ToString();
    for (int round = 0; round < 3; ++round) {
      CheckedRound(w, round);
      const size_t ops = kRoundOps;
      if (round == 0) continue;
      EXPECT_EQ(w.LastStraight(0, ops), std::vector<bool>(ops, false)) << n << " ranks: the traced rank";
      for (int r = 1; r < n; ++r) EXPECT_EQ(w.LastStraight(r, ops), std::vector<bool>(ops, true)) << n << " ranks";
    }
    std::remove((::testing::TempDir() + "/kz-straight-trace-0.json").c_str());
  }
}

// Calls that differ (a count, a reduction) fail on every rank naming the mismatch, straight ones
// included, well before the deadline.
TEST(Straight, AMismatchIsNamedOnEveryRank) {
  for (bool other_op : {false, true}) {
    Ranks w(4, 30);
    ASSERT_TRUE(w.status().ok()) << w.status().ToString();
    CheckedRound(w, 0);
    std::vector<std::unique_ptr<device::Buffer>> b;
    for (int r = 0; r < 4; ++r) b.push_back(w.comm(r).device().Allocate(64).value());
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < 4; ++r) {
      const uint64_t count = !other_op && r == 2 ? 3 : 2;
      const ReduceOp op = other_op && r == 2 ? ReduceOp::kMax : ReduceOp::kSum;
      ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, op, w.stream(r)).ok());
    }
    for (int r = 0; r < 4; ++r) w.stream(r).Synchronize(Deadline::AfterSeconds(60)).IgnoreError();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15);
    for (int r = 0; r < 4; ++r) {
      const Status error = w.comm(r).AsyncError();
      EXPECT_TRUE(Mentions(error, "mismatch")) << "rank " << r << ": " << error.ToString();
    }
    // Rank 2's partners at the first step (rank 3) found it on the straight path.
    EXPECT_EQ(w.LastStraight(3, 1), std::vector<bool>{true}) << w.comm(3).FlightRecord();
  }
}

// A rank that never calls: its peer, waiting straight, times out naming it and what it last
// called.
TEST(Straight, ARankThatNeverCallsIsNamed) {
  Ranks w(2, 3);
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  CheckedRound(w, 0);
  auto b = w.comm(0).device().Allocate(64).value();
  ASSERT_TRUE(w.comm(0).AllReduce(b->data(), b->data(), 2, DataType::kFloat32, ReduceOp::kSum, w.stream(0)).ok());
  EXPECT_FALSE(w.stream(0).Synchronize(Deadline::AfterSeconds(60)).ok());
  const Status error = w.comm(0).AsyncError();
  EXPECT_TRUE(Mentions(error, "rank 1 has not called operation 6")) << error.ToString();
  EXPECT_EQ(w.LastStraight(0, 1), std::vector<bool>{true}) << w.comm(0).FlightRecord();
}

}  // namespace
}  // namespace kizuna::test
