// Communicator::Reweigh: the ranks re-measure their devices between calls and later calls split
// their work by what the devices do now. Four emulated devices throttled alike; another stream
// then keeps device 3's throttle busy (as another job sharing it would), the ranks re-measure
// (each from a thread of its own, as CreateLocal's ranks must), and the shape says device 3 is
// slower; results stay exact. With the other job gone, a second measurement finds the devices
// alike again.
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

// Every rank's Reweigh, each on its own thread; ok when all are.
bool ReweighAll(std::vector<std::unique_ptr<Communicator>>& comms) {
  std::vector<Status> got(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) threads.emplace_back([&, r] { got[r] = comms[r]->Reweigh(); });
  for (auto& t : threads) t.join();
  for (const Status& s : got) EXPECT_TRUE(s.ok()) << s.ToString();
  return std::all_of(got.begin(), got.end(), [](const Status& s) { return s.ok(); });
}

TEST(Reweigh, FollowsADeviceSlowedAtRunTime) {
  // Devices 60-63: a throttle's timeline is host-wide per device index, and other tests throttle
  // the first devices at the same time.
  Config config = WorldConfig(64);
  config.emu_copy_gbps = config.emu_reduce_gbps = 1;
  auto backend = host_emulated::CreateHostEmulatedBackend(config);
  ASSERT_TRUE(backend.ok());
  std::vector<device::Device*> devices;
  for (int r = 0; r < 4; ++r) devices.push_back((*backend)->device(60 + r));
  CommOptions options;
  options.config = &config;
  options.staging_bytes = 1u << 20;
  auto comms = Communicator::CreateLocal(devices, options);
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  const collectives::CommTopology& shape = (*comms)[0]->topology();

  // Another job on device 3: 4 MiB copies back to back on a stream of its own.
  std::atomic<bool> busy{true};
  std::thread other([&] {
    auto a = devices[3]->Allocate(4 << 20), b = devices[3]->Allocate(4 << 20);
    auto s = devices[3]->CreateStream();
    if (!a.ok() || !b.ok() || !s.ok()) return;
    while (busy.load()) {
      for (int i = 0; i < 16; ++i) (void)(*s)->Copy((*b)->data(), (*a)->data(), 4 << 20);
      (void)(*s)->Synchronize();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // Measured again (three times at most) where the machine's own load slowed every device as much
  // as the other job slowed device 3 (once in a loaded clean-clone run: 0.50 against 0.46 GB/s).
  auto slower = [&] {
    for (int r = 0; r < 3; ++r)
      if (!(shape.ranks[3].copy_gbps < 0.7 * shape.ranks[static_cast<size_t>(r)].copy_gbps &&
            shape.ranks[3].reduce_gbps < 0.7 * shape.ranks[static_cast<size_t>(r)].reduce_gbps))
        return false;
    return true;
  };
  bool measured = ReweighAll(*comms);
  for (int attempt = 1; measured && attempt < 3 && !slower(); ++attempt) measured = ReweighAll(*comms);
  busy = false;
  other.join();
  ASSERT_TRUE(measured);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LT(shape.ranks[3].reduce_gbps, 0.7 * shape.ranks[static_cast<size_t>(r)].reduce_gbps) << r;
    EXPECT_LT(shape.ranks[3].copy_gbps, 0.7 * shape.ranks[static_cast<size_t>(r)].copy_gbps) << r;
  }
  // Every rank holds the same speeds (they exchanged them), and calls still give exact sums.
  for (const auto& c : *comms) EXPECT_EQ(c->topology().ranks[3].reduce_gbps, shape.ranks[3].reduce_gbps);
  const size_t count = 1 << 16;
  std::vector<std::unique_ptr<device::Buffer>> bufs;
  std::vector<std::unique_ptr<device::Stream>> streams;
  for (int r = 0; r < 4; ++r) {
    auto b = devices[r]->Allocate(count * 4);
    auto st = devices[r]->CreateStream();
    ASSERT_TRUE(b.ok() && st.ok());
    std::fill_n(static_cast<float*>((*b)->data()), count, static_cast<float>(r));
    bufs.push_back(std::move(*b));
    streams.push_back(std::move(*st));
  }
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(
        (*comms)[r]
            ->AllReduce(bufs[r]->data(), bufs[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, *streams[r])
            .ok());
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(streams[r]->Synchronize(Deadline::AfterSeconds(60)).ok());
    ASSERT_TRUE((*comms)[r]->AsyncError().ok()) << (*comms)[r]->AsyncError().ToString();
    for (size_t i = 0; i < count; i += 509) ASSERT_EQ(static_cast<float*>(bufs[r]->data())[i], 6.0f) << r << " " << i;
  }
  // The other job gone: device 3 is as fast as the others again (within the noise allowance the
  // speeds are taken as equal; a busy host may measure wider).
  ASSERT_TRUE(ReweighAll(*comms));
  for (int r = 0; r < 3; ++r)
    EXPECT_GT(shape.ranks[3].reduce_gbps, 0.7 * shape.ranks[static_cast<size_t>(r)].reduce_gbps) << r;
  streams.clear();
  bufs.clear();
  comms->clear();
}

}  // namespace
}  // namespace kizuna::test
