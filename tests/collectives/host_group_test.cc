// SameHostGroup (collectives/direct/same_host_group.h) in one process: which devices it takes, and that the memory it
// stops using is freed only where no operation of the group holds a stream (ReleaseRetired). The protocol between
// processes is tested by tests/collectives/process_test.sh.
#include "collectives/direct/same_host_group.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/core/config.h"
#include "tests/collectives/world.h"

namespace kizuna::collectives {
namespace {

// One rank's AllGather: its own bytes back.
SameHostGroup::AllGather Alone() {
  return [](std::span<const uint8_t> bytes) -> Result<std::vector<std::vector<uint8_t>>> {
    return std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(bytes.begin(), bytes.end())};
  };
}

// An emulated device that cannot name the allocation behind an address (the device layer's
// default FindAllocation), as a backend whose exports are not per-allocation files.
class Unnamed final : public device::Device {
 public:
  Unnamed(device::Device& inner, const Config* config) : Device(inner.properties(), config), inner_(inner) {}

 protected:
  Result<std::unique_ptr<device::Buffer>> DoAllocate(size_t bytes) override { return inner_.Allocate(bytes); }
  Result<std::unique_ptr<device::Stream>> DoCreateStream() override { return inner_.CreateStream(); }
  Result<std::unique_ptr<device::Event>> DoCreateEvent() override { return inner_.CreateEvent(); }

 private:
  device::Device& inner_;
};

class HostGroupTest : public testing::Test {
 protected:
  void SetUp() override {
    config_.emulated_devices = 1;
    config_.timeout_s = 10;
    auto b = host_emulated::CreateHostEmulatedBackend(config_);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(*b);
  }
  device::Device& device() { return *backend_->device(0); }

  Config config_;
  std::unique_ptr<device::Backend> backend_;
};

TEST_F(HostGroupTest, AnEmulatedDeviceFormsAGroup) {
  auto g = SameHostGroup::Create(0, 1, device(), Alone());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ((*g)->nranks(), 1);
  EXPECT_EQ((*g)->cached_imports(), 0u);
  EXPECT_EQ((*g)->retired(), 0u);
}

TEST_F(HostGroupTest, ADeviceThatCannotNameAllocationsIsNotSupported) {
  // Every fused call would fail when it publishes its buffers: the group is declined at once,
  // so the engine never plans a fused collective through it.
  Unnamed unnamed(device(), &config_);
  auto g = SameHostGroup::Create(0, 1, unnamed, Alone());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kNotSupported) << g.status().ToString();
  EXPECT_NE(g.status().message().find("cannot name the allocation"), std::string::npos) << g.status().ToString();
}

// Two ranks of one group in this process, one thread each, meeting through an AllGather of their
// own, as ranks of two processes would through the bootstrap.
class TwoRanks {
 public:
  explicit TwoRanks(device::Device& device) {
    std::thread other([&] { Create(1, device); });
    Create(0, device);
    other.join();
  }
  SameHostGroup* group(int r) { return groups_[r].get(); }
  Status status(int r) const { return status_[r]; }

 private:
  void Create(int r, device::Device& device) {
    auto g =
        SameHostGroup::Create(r, 2, device, [this, r](std::span<const uint8_t> bytes) { return Gather(r, bytes); });
    if (g.ok()) groups_[r] = std::move(*g);
    status_[r] = g.status();
  }
  Result<std::vector<std::vector<uint8_t>>> Gather(int r, std::span<const uint8_t> bytes) {
    std::unique_lock lock(mu_);
    const int round = rounds_[r]++;
    auto& got = gathered_[round];
    got.resize(2);
    got[static_cast<size_t>(r)].assign(bytes.begin(), bytes.end());
    ++arrived_[round];
    cv_.notify_all();
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_[round] == 2; }))
      return Timeout("the other rank did not gather");
    return got;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  int rounds_[2] = {0, 0};
  std::map<int, int> arrived_;
  std::map<int, std::vector<std::vector<uint8_t>>> gathered_;
  std::shared_ptr<SameHostGroup> groups_[2];
  Status status_[2];
};

// Fused operations on fresh buffers fill the cache of mapped peer allocations; the mappings it
// evicts wait for ReleaseRetired, which frees them only while no rank of the group counts an
// operation holding its stream (BeginHold .. EndHold), its own included.
TEST_F(HostGroupTest, RetiredMemoryIsKeptWhileARankHoldsItsStream) {
  TwoRanks ranks(device());
  ASSERT_TRUE(ranks.status(0).ok()) << ranks.status(0).ToString();
  ASSERT_TRUE(ranks.status(1).ok()) << ranks.status(1).ToString();
  CollectiveRequest request;
  request.nranks = 2;
  request.count = 16;
  std::atomic<bool> abort{false};
  // 16 mappings per rank are kept (same_host_group.cc): 2 ranks, 2 new allocations of the peer per
  // operation, so 16 operations fill the cache and the 4 after it evict 2 mappings each.
  constexpr uint64_t kOps = 20;
  auto run = [&](int r) -> Status {
    for (uint64_t seq = 1; seq <= kOps; ++seq) {
      KZ_ASSIGN_OR_RETURN(auto in, device().Allocate(64));
      KZ_ASSIGN_OR_RETURN(auto out, device().Allocate(64));
      const Deadline deadline = Deadline::AfterSeconds(10);
      KZ_RETURN_IF_ERROR(
          ranks.group(r)->Exchange(seq, 7, request, in->data(), 64, out->data(), 64, deadline, abort).status());
      KZ_RETURN_IF_ERROR(ranks.group(r)->Finish(seq, deadline, abort));
    }
    return Status::Ok();
  };
  Status other;
  std::thread t([&] { other = run(1); });
  const Status mine = run(0);
  t.join();
  ASSERT_TRUE(mine.ok()) << mine.ToString();
  ASSERT_TRUE(other.ok()) << other.ToString();
  SameHostGroup& g = *ranks.group(0);
  const size_t retired = g.retired();
  EXPECT_EQ(retired, 8u);
  EXPECT_EQ(g.cached_imports(), 32u);

  const Deadline deadline = Deadline::AfterSeconds(10);
  ASSERT_TRUE(ranks.group(1)->BeginHold(kOps + 1, deadline, abort).ok());
  EXPECT_FALSE(g.ReleaseRetired()) << "freed while rank 1 holds its stream";
  EXPECT_EQ(g.retired(), retired);
  ranks.group(1)->EndHold();
  ASSERT_TRUE(g.BeginHold(kOps + 1, deadline, abort).ok());
  EXPECT_FALSE(g.ReleaseRetired()) << "freed while its own rank holds its stream";
  EXPECT_EQ(g.retired(), retired);
  g.EndHold();
  EXPECT_TRUE(g.ReleaseRetired());
  EXPECT_EQ(g.retired(), 0u);
  EXPECT_TRUE(g.ReleaseRetired()) << "nothing left to free";
}

// A wait that waits does its caller's other work meanwhile (set_while_waiting: hier:fused's rank
// writes its fabric's queued output there) until its peer arrives.
TEST_F(HostGroupTest, AWaitDoesTheCallersWorkWhileItWaits) {
  TwoRanks ranks(device());
  ASSERT_TRUE(ranks.status(0).ok()) << ranks.status(0).ToString();
  ASSERT_TRUE(ranks.status(1).ok()) << ranks.status(1).ToString();
  std::atomic<int> calls{0};
  ranks.group(0)->set_while_waiting([&] { ++calls; });
  CollectiveRequest request;
  request.nranks = 2;
  request.count = 16;
  std::atomic<bool> abort{false};
  auto op = [&](int r, uint64_t seq) -> Status {
    KZ_ASSIGN_OR_RETURN(auto in, device().Allocate(64));
    KZ_ASSIGN_OR_RETURN(auto out, device().Allocate(64));
    const Deadline deadline = Deadline::AfterSeconds(10);
    KZ_RETURN_IF_ERROR(
        ranks.group(r)->Exchange(seq, 7, request, in->data(), 64, out->data(), 64, deadline, abort).status());
    return ranks.group(r)->Finish(seq, deadline, abort);
  };
  // Rank 1 arrives 100 ms late: rank 0's wait does the work while it waits.
  Status other;
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    other = op(1, 1);
  });
  const Status mine = op(0, 1);
  late.join();
  ASSERT_TRUE(mine.ok()) << mine.ToString();
  ASSERT_TRUE(other.ok()) << other.ToString();
  EXPECT_GT(calls.load(), 0) << "a wait of 100 ms never did its caller's work";
  ranks.group(0)->set_while_waiting(nullptr);
}

// hier:fused's leader form through the pages: each round the host's sum (RunOneShot) on both
// ranks, then the root's own value handed to the other (RunShare), alternating roots, one line
// (8 bytes) and the pages' data (4 KiB); the slots the two operations share are reused every
// other round, so a rank that ran ahead would overwrite what the other still reads.
TEST_F(HostGroupTest, ShareHandsTheRootsValueToTheOthers) {
  TwoRanks ranks(device());
  ASSERT_TRUE(ranks.status(0).ok()) << ranks.status(0).ToString();
  ASSERT_TRUE(ranks.status(1).ok()) << ranks.status(1).ToString();
  std::atomic<bool> abort{false};
  auto run = [&](int r) -> Status {
    uint64_t seq = 0;
    for (uint64_t count : {uint64_t{2}, uint64_t{1024}})
      for (int round = 0; round < 200; ++round) {
        CollectiveRequest request;
        request.nranks = 2;
        request.count = count;
        std::vector<int32_t> in(count), sum(count), shared(count);
        for (uint64_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(r * 1000 + round + static_cast<int>(i));
        request.dtype = DataType::kInt32;
        const Deadline deadline = Deadline::AfterSeconds(10);
        KZ_RETURN_IF_ERROR(ranks.group(r)->RunOneShot(++seq, 9, request, in.data(), sum.data(), deadline, abort));
        const int root = round % 2;
        if (r == root) shared = in;
        KZ_RETURN_IF_ERROR(ranks.group(r)->RunShare(++seq, 9, request, root, shared.data(), deadline, abort));
        for (uint64_t i = 0; i < count; ++i) {
          const auto want_sum = static_cast<int32_t>(1000 + 2 * (round + static_cast<int>(i)));
          const auto want_shared = static_cast<int32_t>(root * 1000 + round + static_cast<int>(i));
          if (sum[i] != want_sum || shared[i] != want_shared)
            return Internal(fmt::format("rank {} round {} count {} element {}: sum {} (want {}), shared {} (want {})",
                                        r, round, count, i, sum[i], want_sum, shared[i], want_shared));
        }
      }
    return Status::Ok();
  };
  Status other;
  std::thread t([&] { other = run(1); });
  const Status mine = run(0);
  t.join();
  EXPECT_TRUE(mine.ok()) << mine.ToString();
  EXPECT_TRUE(other.ok()) << other.ToString();
}

// A rank that shares another operation than its root is named a mismatch, not handed its data.
TEST_F(HostGroupTest, ShareNamesAMismatch) {
  TwoRanks ranks(device());
  ASSERT_TRUE(ranks.status(0).ok()) << ranks.status(0).ToString();
  ASSERT_TRUE(ranks.status(1).ok()) << ranks.status(1).ToString();
  std::atomic<bool> abort{false};
  CollectiveRequest request;
  request.nranks = 2;
  request.count = 2;
  int32_t data[2] = {1, 2};
  Status other;
  std::thread t([&] {
    int32_t got[2] = {};
    other = ranks.group(1)->RunShare(1, 8, request, 0, got, Deadline::AfterSeconds(10), abort);
  });
  const Status root = ranks.group(0)->RunShare(1, 9, request, 0, data, Deadline::AfterSeconds(10), abort);
  ranks.group(0)->Fail(root);  // as the executor does: the other rank stops waiting for it
  t.join();
  EXPECT_EQ(root.code(), StatusCode::kInvalidArgument) << root.ToString();
  EXPECT_NE(root.message().find("mismatch"), std::string::npos) << root.ToString();
  EXPECT_EQ(other.code(), StatusCode::kAborted) << other.ToString();
  EXPECT_NE(other.message().find("mismatch"), std::string::npos) << other.ToString();
}

// Ranks of one process on opaque devices form a host group (no in-process group: the CPU cannot
// address the devices' memory across devices). Several ranks share each device, and a free waits
// for every stream of the device, as cudaFree does. Each AllReduce takes fresh buffers, so the
// group's cache of mapped peer allocations fills and evicts: memory the group then frees. The calls
// go from the last rank to the first, three rounds before each wait, so when a rank frees (in its
// call, or on its executor's thread once its operation is done), a rank on its device has usually
// queued an AllReduce already, holding its stream until the operation is done, which needs the
// freeing rank. A free there would wait for that stream (on a GPU: for ever); the group keeps the
// memory instead until no rank holds a stream. While it did not, the calls stopped as soon as the
// cache evicted, until the free's deadline (KIZUNA_TIMEOUT) failed the held stream.
TEST(HostGroupFrees, NoFreeWaitsForAStreamHeldByAnOperationThatNeedsTheFreeingRank) {
  Config config = test::WorldConfig(2);
  config.emu_opaque = true;
  config.emu_sync_free = true;
  config.timeout_s = 5;  // a stuck free fails within this, not the test's own timeout
  constexpr int kRanks = 4;
  test::World w(kRanks, config, /*max_devices=*/2);
  KZ_ASSERT_WORLD(w);
  if (w.device(0).properties().backend != "host_emulated") GTEST_SKIP() << "host_emulated only (sync-free frees)";
  constexpr uint64_t kCount = 300;
  // 16 mappings per rank are kept (same_host_group.cc): each fused round maps 2 buffers of each of 3 peers, so the
  // cache is full after 11 fused rounds and every fused round after them retires mappings.
  constexpr int kRounds = 24, kBurst = 3;
  auto value = [](int r, int round, uint64_t i) { return static_cast<int32_t>(r * 1000 + round * 10 + i % 7); };
  for (int first = 0; first < kRounds; first += kBurst) {
    std::vector<std::unique_ptr<device::Buffer>> in, out;  // [round - first][rank]
    for (int round = first; round < first + kBurst; ++round) {
      for (int r = 0; r < kRanks; ++r) {
        in.push_back(test::Alloc(w, r, kCount * sizeof(int32_t)));
        out.push_back(test::Alloc(w, r, kCount * sizeof(int32_t)));
        ASSERT_TRUE(in.back() && out.back());
        std::vector<int32_t> values(kCount);
        for (uint64_t i = 0; i < kCount; ++i) values[i] = value(r, round, i);
        ASSERT_TRUE(w.Upload(r, in.back()->data(), values).ok());
      }
    }
    for (int round = first; round < first + kBurst; ++round) {
      // Every fourth round over the transport (rd): an operation that is not fused meets the frees too.
      CallOptions options;
      options.algorithm = round % 4 == 3 ? Algorithm::kRd : Algorithm::kFused;
      for (int r = kRanks - 1; r >= 0; --r) {
        const size_t b = static_cast<size_t>((round - first) * kRanks + r);
        Status s = w.comm(r).AllReduce(in[b]->data(), out[b]->data(), kCount, DataType::kInt32, ReduceOp::kSum,
                                       w.stream(r), options);
        ASSERT_TRUE(s.ok()) << "round " << round << ", rank " << r << ": " << s.ToString();
      }
    }
    Status synced = w.SyncAll();
    ASSERT_TRUE(synced.ok()) << "rounds " << first << " to " << first + kBurst - 1 << ": " << synced.ToString();
    for (int round = first; round < first + kBurst; ++round) {
      for (int r = 0; r < kRanks; ++r) {
        const size_t b = static_cast<size_t>((round - first) * kRanks + r);
        auto got = w.Download<int32_t>(r, out[b]->data(), kCount);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        for (uint64_t i = 0; i < kCount; ++i) {
          int32_t want = 0;
          for (int q = 0; q < kRanks; ++q) want += value(q, round, i);
          ASSERT_EQ((*got)[i], want) << "round " << round << ", rank " << r << ", element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kizuna::collectives
