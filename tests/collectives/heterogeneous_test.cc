// Communicators whose ranks' devices differ in speed (one emulated backend, throttles scaled per
// device: KIZUNA_EMU_SPEED_FACTORS): the shape reports each rank's speeds, the algorithms that split
// work by speed give exact results, and where the model predicts the even split faster it runs.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/log_capture.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

// `n` ranks of one process on one emulated backend whose devices copy and reduce at 40 GB/s times
// `factors` (KIZUNA_EMU_SPEED_FACTORS; devices beyond the list at 40), a stream each.
struct UnlikeDevices {
  Config config;
  std::unique_ptr<device::Backend> backend;
  std::vector<device::Device*> devices;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<device::Stream>> streams;  // destroyed before the communicators

  UnlikeDevices(int n, std::vector<double> factors) : config(WorldConfig(n)) {
    config.emu_reduce_gbps = config.emu_copy_gbps = 40;
    config.emu_speed_factors = std::move(factors);
    auto b = host_emulated::CreateHostEmulatedBackend(config);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return;
    backend = std::move(*b);
    for (int r = 0; r < n; ++r) devices.push_back(backend->device(r));
    CommOptions options;
    options.config = &config;
    options.staging_bytes = 2u << 20;
    auto c = Communicator::CreateLocal(devices, options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return;
    for (device::Device* d : devices) {
      auto st = d->CreateStream();
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      if (!st.ok()) return;
      streams.push_back(std::move(*st));
    }
    comms = std::move(*c);
  }
  bool ok() const { return !comms.empty(); }

  // `count` floats on rank r's device, element i = fill(i); null (a failed expectation) if the
  // allocation fails.
  std::unique_ptr<device::Buffer> Floats(int r, size_t count, const std::function<float(size_t)>& fill) {
    auto b = devices[static_cast<size_t>(r)]->Allocate(count * sizeof(float));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    for (size_t i = 0; i < count; ++i) static_cast<float*>((*b)->data())[i] = fill(i);
    return std::move(*b);
  }
  // Every rank's stream done.
  void Synchronize() {
    for (auto& st : streams) ASSERT_TRUE(st->Synchronize(Deadline::AfterSeconds(60)).ok());
  }
};

// Ranks on devices of different speeds in one communicator (one emulated backend, device 2's
// throttles a quarter of the others': KIZUNA_EMU_SPEED_FACTORS): the shape reports each rank's
// speed, and the algorithms that split work by speed (pairwise parts, the tree halves, fused
// parts) still produce exact results, ReduceScatter and AllGather's fused parts included.
TEST(Heterogeneous, DevicesOfUnlikeSpeedInOneCommunicator) {
  UnlikeDevices w(4, {1, 1, 0.25});
  ASSERT_TRUE(w.ok());
  const collectives::CommTopology& shape = w.comms[0]->topology();
  EXPECT_EQ(shape.ranks[0].reduce_gbps, 40);
  EXPECT_EQ(shape.ranks[2].reduce_gbps, 10);
  EXPECT_EQ(shape.ranks[3].copy_gbps, 40) << "devices beyond the factors' list keep the backend's speed";
  EXPECT_TRUE(shape.direct) << "one backend's devices address each other's memory";
  const size_t count = 100000;  // 4 blocks of 25000
  const size_t block = count / 4;
  auto input = [](int r, size_t i) { return static_cast<float>((r + i) % 5); };
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < 4; ++r) {
    in.push_back(w.Floats(r, count, [&](size_t i) { return input(r, i); }));
    out.push_back(w.Floats(r, count, [](size_t) { return 0.0f; }));
    ASSERT_TRUE(in.back() && out.back());
  }
  struct Case {
    Collective coll;
    Algorithm algo;
  };
  for (const Case& c :
       {Case{Collective::kAllReduce, Algorithm::kPairwise}, Case{Collective::kAllReduce, Algorithm::kTree},
        Case{Collective::kAllReduce, Algorithm::kRing}, Case{Collective::kAllReduce, Algorithm::kFused},
        Case{Collective::kReduceScatter, Algorithm::kFused}, Case{Collective::kAllGather, Algorithm::kFused}}) {
    CallOptions call;
    call.algorithm = c.algo;
    for (int r = 0; r < 4; ++r) {
      Status s;
      if (c.coll == Collective::kAllReduce)
        s = w.comms[r]->AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                  *w.streams[r], call);
      else if (c.coll == Collective::kReduceScatter)
        s = w.comms[r]->ReduceScatter(in[r]->data(), out[r]->data(), block, DataType::kFloat32, ReduceOp::kSum,
                                      *w.streams[r], call);
      else
        s = w.comms[r]->AllGather(in[r]->data(), out[r]->data(), block, DataType::kFloat32, *w.streams[r], call);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    w.Synchronize();
    const std::string what = fmt::format("{} via {}", CollectiveName(c.coll), collectives::AlgorithmName(c.algo));
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(w.comms[r]->AsyncError().ok()) << what << ": " << w.comms[r]->AsyncError().ToString();
      const size_t n = c.coll == Collective::kReduceScatter ? block : count;
      for (size_t i = 0; i < n; i += 101) {
        float want = 0;
        if (c.coll == Collective::kAllGather) {
          want = input(static_cast<int>(i / block), i % block);
        } else {
          const size_t at = c.coll == Collective::kReduceScatter ? r * block + i : i;
          for (int q = 0; q < 4; ++q) want += input(q, at);
        }
        ASSERT_EQ(static_cast<float*>(out[r]->data())[i], want) << what << ": rank " << r << " element " << i;
      }
    }
  }
}

// Where the model predicts the even split faster than the split by speed, the even one runs: 4
// ranks, one of them on a device 4x slower, the double binary tree forced, 64 KiB: its split by
// speed (the slow rank on the first tree's leaves, the trees' shares by their streaming rates) is
// predicted slower than the even trees there. The INFO line says so, results exact.
TEST(Heterogeneous, TheEvenSplitRunsWhereThePredictionFavoursIt) {
  UnlikeDevices w(4, {1, 1, 1, 0.25});
  ASSERT_TRUE(w.ok());
  const size_t count = 1 << 14;
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 4; ++r) {
    buf.push_back(w.Floats(r, count, [r](size_t) { return static_cast<float>(r + 1); }));
    ASSERT_TRUE(buf.back());
  }
  kizuna::testing::LogCapture log(LogLevel::kInfo, kLogTune | kLogColl);
  CallOptions call;
  call.algorithm = collectives::Algorithm::kTree;
  for (int r = 0; r < 4; ++r)
    ASSERT_TRUE(
        w.comms[r]
            ->AllReduce(buf[r]->data(), buf[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, *w.streams[r], call)
            .ok());
  w.Synchronize();
  const std::string text = log.Text();
  EXPECT_NE(text.find("split evenly by tree, predicted "), std::string::npos) << text;
  EXPECT_EQ(text.find("the trees carry"), std::string::npos) << text;
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(static_cast<float*>(buf[r]->data())[i], 10.0f) << "rank " << r;
}

}  // namespace
}  // namespace kizuna::test
