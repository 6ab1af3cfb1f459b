// Groups (GroupStart / GroupEnd): several calls of a communicator fused into one operation,
// Send / Recv pairs that cannot deadlock, and one thread's group of every rank's call run on that
// thread (Executor::TryInlineGroup) where the CPU does the parts, or through the executors where
// it cannot (a busy stream, a partial group, a ring). Tests run on KIZUNA_TEST_BACKEND's devices
// when it is set (world.h).
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

TEST(Communicator, GroupFusesCallsAndPairsSendRecv) {
  World w(4, WorldConfig(4));
  KZ_ASSERT_WORLD(w);
  const int n = 4;
  const size_t count = 1000;
  std::vector<std::unique_ptr<device::Buffer>> a, b, c;
  for (int r = 0; r < n; ++r) {
    a.push_back(Alloc(w, r, count * 4));
    b.push_back(Alloc(w, r, count * 4));
    c.push_back(Alloc(w, r, count * 4 * n));
    ASSERT_TRUE(w.Upload(r, a[r]->data(), std::vector<float>(count, static_cast<float>(r + 1))).ok());
    ASSERT_TRUE(w.Upload(r, b[r]->data(), std::vector<int32_t>(count, r * 10)).ok());
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(Communicator::GroupStart().ok());
    ASSERT_TRUE(
        w.comm(r).AllReduce(a[r]->data(), a[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
    ASSERT_TRUE(w.comm(r).AllGather(b[r]->data(), c[r]->data(), count, DataType::kInt32, w.stream(r)).ok());
    ASSERT_TRUE(Communicator::GroupEnd().ok());
  }
  ASSERT_TRUE(w.SyncAll().ok()) << w.SyncAll().ToString();
  for (int r = 0; r < n; ++r) {
    auto sum = w.Download<float>(r, a[r]->data(), count);
    auto gathered = w.Download<int32_t>(r, c[r]->data(), count * n);
    ASSERT_TRUE(sum.ok() && gathered.ok());
    EXPECT_EQ((*sum)[count - 1], 10.0f);
    for (int q = 0; q < n; ++q) EXPECT_EQ((*gathered)[q * count + 5], q * 10);
  }
  // Send/Recv both ways between 0 and 1 in one group (without the group, each rank's send would
  // wait for a receive the other has not posted).
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(w.comm(r).Send(a[r]->data(), count, DataType::kFloat32, 1 - r, w.stream(r)).ok());
    ASSERT_TRUE(w.comm(r).Recv(b[r]->data(), count, DataType::kFloat32, 1 - r, w.stream(r)).ok());
  }
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(w.stream(r).Synchronize(Deadline::AfterSeconds(30)).ok());
  auto received = w.Download<float>(0, b[0]->data(), count);
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  EXPECT_EQ((*received)[3], 10.0f);
}

// Whether the CPU does a fused operation's parts on these devices (Executor::TryInlineGroup's
// condition): then a group of every rank's call runs on the calling thread.
bool CpuDoesParts(World& w) {
  for (int r = 0; r < w.size(); ++r) {
    const device::DeviceProperties& p = w.device(r).properties();
    if (!p.host_compute || !p.host_accessible || p.copy_gbps > 0 || p.reduce_gbps > 0 || p.launch_latency_us > 0)
      return false;
  }
  return true;
}

// Every fused collective as a group of all ranks' calls from one thread, interleaved with calls
// one by one, a ring in a group and a group of some ranks, each checked.
// Kept whole: the test's cases in the order they run on the same buffers, each checked after it.
void GroupsOfEveryRank(World& w) {
  const int n = w.size();
  const size_t count = 1000;
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(Alloc(w, r, count * 4 * n));
    out.push_back(Alloc(w, r, count * 4 * n));
    std::vector<float> v(count * n);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(r + 1) + static_cast<float>(i % 7);
    ASSERT_TRUE(w.Upload(r, in[r]->data(), v).ok());
  }
  auto run = [&](auto call) {
    EXPECT_TRUE(Communicator::GroupStart().ok());
    for (int r = 0; r < n; ++r) EXPECT_TRUE(call(r).ok()) << "rank " << r;
    return Communicator::GroupEnd();
  };
  // Sums of (r + 1) + i % 7 over the ranks.
  auto sum = [&](size_t i) { return 10.0f + static_cast<float>(n * (i % 7)); };
  ASSERT_TRUE(run([&](int r) {
                return w.comm(r).AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                           w.stream(r));
              }).ok());
  // Done on this thread before GroupEnd returned: the outputs hold the sums before any stream is
  // synchronized. (Checked first, asserted after the synchronization: a failing check must not
  // free buffers an executor still writes.)
  std::string early;
  if (CpuDoesParts(w)) {
    for (int r = 0; r < n && early.empty(); ++r) {
      const auto* o = static_cast<const float*>(out[r]->data());
      for (size_t i = 0; i < count && early.empty(); ++i)
        if (o[i] != sum(i)) early = fmt::format("rank {} element {}: {} before synchronizing", r, i, o[i]);
    }
  }
  ASSERT_TRUE(w.SyncAll().ok());
  EXPECT_EQ(early, "");
  // The executors' operations stay numbered alike: calls one by one, then groups again, each
  // collective checked.
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(w.comm(r).AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kMax,
                                    w.stream(r)).ok());
  // Element i of every rank's output, after the streams.
  auto expect_everywhere = [&](size_t i, float value) {
    ASSERT_TRUE(w.SyncAll().ok());
    for (int r = 0; r < n; ++r) {
      auto got = w.Download<float>(r, out[r]->data(), count);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ((*got)[i], value) << "rank " << r << " element " << i;
    }
  };
  expect_everywhere(6, 4.0f + 6.0f);
  ASSERT_TRUE(run([&](int r) {
                return w.comm(r).ReduceScatter(in[r]->data(), out[r]->data(), count, DataType::kFloat32,
                                               ReduceOp::kSum, w.stream(r));
              }).ok());
  ASSERT_TRUE(w.SyncAll().ok());
  for (int r = 0; r < n; ++r) {
    auto got = w.Download<float>(r, out[r]->data(), count);
    ASSERT_TRUE(got.ok());
    for (size_t i = 0; i < count; ++i) ASSERT_EQ((*got)[i], sum(r * count + i)) << "rank " << r << " element " << i;
  }
  ASSERT_TRUE(run([&](int r) {
                return w.comm(r).AllGather(in[r]->data(), out[r]->data(), count, DataType::kFloat32, w.stream(r));
              }).ok());
  ASSERT_TRUE(w.SyncAll().ok());
  for (int r = 0; r < n; ++r) {
    auto got = w.Download<float>(r, out[r]->data(), count * n);
    ASSERT_TRUE(got.ok());
    for (int q = 0; q < n; ++q) EXPECT_EQ((*got)[q * count + 3], static_cast<float>(q + 1) + 3.0f) << r << "/" << q;
  }
  // A ring in a group takes the executors, as do groups of some ranks only.
  CallOptions ring;
  ring.algorithm = collectives::Algorithm::kRing;
  ASSERT_TRUE(run([&](int r) {
                return w.comm(r).AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                           w.stream(r), ring);
              }).ok());
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (int r = 0; r < 2; ++r)
    ASSERT_TRUE(w.comm(r).Broadcast(in[r]->data(), out[r]->data(), count, DataType::kFloat32, 2, w.stream(r)).ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  for (int r = 2; r < n; ++r)
    ASSERT_TRUE(w.comm(r).Broadcast(in[r]->data(), out[r]->data(), count, DataType::kFloat32, 2, w.stream(r)).ok());
  expect_everywhere(5, 3.0f + 5.0f);
  ASSERT_TRUE(run([&](int r) {
                return w.comm(r).Reduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, 1,
                                        w.stream(r));
              }).ok());
  ASSERT_TRUE(w.SyncAll().ok());
  auto reduced = w.Download<float>(1, out[1]->data(), count);
  ASSERT_TRUE(reduced.ok());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ((*reduced)[i], sum(i)) << i;
}

TEST(Communicator, OneThreadRunsAGroupOfEveryRankBeforeReturning) {
  World w(4, WorldConfig(4));
  KZ_ASSERT_WORLD(w);
  GroupsOfEveryRank(w);
}

// Memory the CPU cannot reach (as a GPU's). 4 ranks on one device (the GPU machine's shape): the
// calling thread enqueues every rank's part on the ranks' streams. Over 4 devices the ranks share
// buffers as separate processes do (SameHostGroup), and groups go through the executors.
TEST(Communicator, OneThreadEnqueuesAGroupOfEveryRankOnOpaqueDevices) {
  for (int devices : {4, 1}) {
    SCOPED_TRACE(fmt::format("{} device(s)", devices));
    Config config = WorldConfig(devices);
    config.emu_opaque = true;
    World w(4, config, devices);
    KZ_ASSERT_WORLD(w);
    GroupsOfEveryRank(w);
  }
}

TEST(Communicator, OnDevicesAGroupGoesOnTheStreamsWithoutTheExecutors) {
  const int n = 4;
  const size_t count = 4096;
  Config config = WorldConfig(1);
  config.emu_opaque = true;
  World w(n, config, 1);  // one device: opaque memory is shared directly only there (a GPU's ranks)
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < n; ++r) {
    b.push_back(Alloc(w, r, count * 4));
    ASSERT_TRUE(w.Upload(r, b[r]->data(), std::vector<float>(count, 1.0f)).ok());
  }
  // Rank 0's stream is held by a callback, then writes 100s into its input: the group's parts
  // must wait for that, and the calling thread must not.
  auto host = w.device(0).AllocateHost(count * 4);
  ASSERT_TRUE(host.ok());
  std::vector<float> hundreds(count, 100.0f);
  std::memcpy((*host)->data(), hundreds.data(), count * 4);
  auto open = std::make_shared<std::atomic<bool>>(false);
  ASSERT_TRUE(w.stream(0).EnqueueHostCallback([open](const Status&) {
    for (int i = 0; i < 10000 && !open->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }).ok());
  ASSERT_TRUE(w.stream(0).Copy(b[0]->data(), (*host)->data(), count * 4).ok());
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                    w.stream(r)).ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  // No executor took the operation (through them, rank 0's would wait for its stream now).
  for (int r = 0; r < n; ++r) EXPECT_EQ(w.comm(r).InFlight(), 0) << "rank " << r;
  open->store(true);
  ASSERT_TRUE(w.SyncAll().ok());
  for (int r = 0; r < n; ++r) {
    auto got = w.Download<float>(r, b[r]->data(), count);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0], 103.0f) << "rank " << r;
    EXPECT_EQ((*got)[count - 1], 103.0f) << "rank " << r;
  }
}

// A device fault in one rank's part, enqueued by the grouping thread: every rank's stream reports
// it (each waits for every part), and nothing hangs.
TEST(Communicator, OnDevicesAFaultInOneRanksGroupedPartReachesEveryStream) {
  const int n = 4;
  const size_t count = 1024;
  Config config = WorldConfig(1);
  config.emu_opaque = true;
  // Stream operations are numbered as enqueued: the 4 uploads are #1-#4, then the parts #5-#8 in
  // rank order; #6 is rank 1's part.
  config.emu_fail_stream_op = 6;
  World w(n, config, 1);
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < n; ++r) {
    b.push_back(Alloc(w, r, count * 4));
    ASSERT_TRUE(w.Upload(r, b[r]->data(), std::vector<float>(count, 1.0f)).ok());
  }
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                    w.stream(r)).ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  for (int r = 0; r < n; ++r) {
    const Status s = w.stream(r).Synchronize(Deadline::AfterSeconds(30));
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_NE(s.message().find("stream operation #6 failed"), std::string::npos) << "rank " << r << ": "
                                                                                 << s.ToString();
  }
}

TEST(Communicator, AGroupOnABusyStreamWaitsForIt) {
  const int n = 2;
  const size_t count = 256;
  World w(n, WorldConfig(n));
  KZ_ASSERT_WORLD(w);
  if (!w.host_accessible(0)) GTEST_SKIP() << "the callback writes rank 0's input directly";
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < n; ++r) {
    b.push_back(Alloc(w, r, count * 4));
    ASSERT_TRUE(w.Upload(r, b[r]->data(), std::vector<float>(count, 1.0f)).ok());
  }
  // Rank 0's stream writes its input only after a while: the group must not run before.
  float* input0 = static_cast<float*>(b[0]->data());
  ASSERT_TRUE(w.stream(0).EnqueueHostCallback([input0, count](const Status&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = 0; i < count; ++i) input0[i] = 100.0f;
  }).ok());
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(w.comm(r).AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                    w.stream(r)).ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  ASSERT_TRUE(w.SyncAll().ok());
  for (int r = 0; r < n; ++r) {
    auto got = w.Download<float>(r, b[r]->data(), count);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[count - 1], 101.0f) << "rank " << r;
  }
}

}  // namespace
}  // namespace kizuna::test
