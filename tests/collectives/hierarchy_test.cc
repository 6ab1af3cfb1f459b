// Hierarchical plans over real connections: ranks of one process that say they run on two or
// three hosts (CommOptions::host_id), connected as such hosts would be (direct links inside a
// host, ofi between hosts), run every collective the hierarchical algorithms serve, forced and
// as the model chooses, with every element checked. The simulated matrix over larger shapes is
// collectives/algorithms:hierarchical_test; namespace hosts are tests/cluster.
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using collectives::Algorithm;
using collectives::Collective;

// Small integers: every sum is exact in float32, whatever the order.
float Value(int rank, size_t i) { return static_cast<float>((rank * 3 + static_cast<int>(i % 1009)) % 7); }

class Hosts {
 public:
  // sizes[h] ranks on host h, ranks dealt out in blocks (host 0 gets ranks 0..sizes[0]-1, ...).
  explicit Hosts(const std::vector<int>& sizes) {
    for (size_t h = 0; h < sizes.size(); ++h)
      for (int i = 0; i < sizes[h]; ++i) host_of_.push_back(fmt::format("host{}", h));
    n_ = static_cast<int>(host_of_.size());
    config_.emulated_devices = n_;
    config_.timeout_s = 60;
    config_.fabric = {"directconnect", "ofi"};  // direct links inside a host, ofi between
    fabric::FabricContext ctx;
    ctx.world_size = n_;
    auto ofi = fabric::CreateFabric("ofi", config_, ctx);
    if (ofi.status().code() == StatusCode::kUnavailable) {
      skip_ = "ofi is not available here: " + ofi.status().ToString();
      return;
    }
    auto backend = host_emulated::CreateHostEmulatedBackend(config_);
    if (!backend.ok()) {
      status_ = backend.status();
      return;
    }
    backend_ = std::move(*backend);
    auto boots = bootstrap::CreateInProcessBootstraps(n_);
    if (!boots.ok()) {
      status_ = boots.status();
      return;
    }
    std::vector<Result<std::unique_ptr<Communicator>>> created;
    for (int r = 0; r < n_; ++r) created.emplace_back(Internal("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r)
      threads.emplace_back([&, r] {
        CommOptions options;
        options.config = &config_;
        options.staging_bytes = 2u << 20;
        options.host_id = host_of_[static_cast<size_t>(r)];
        created[static_cast<size_t>(r)] =
            Communicator::Create(std::shared_ptr<bootstrap::Bootstrap>(std::move((*boots)[static_cast<size_t>(r)])),
                                 *backend_->device(r), options);
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n_; ++r) {
      if (!created[static_cast<size_t>(r)].ok()) {
        status_ = created[static_cast<size_t>(r)].status().WithContext(fmt::format("rank {}", r));
        return;
      }
      comms_.push_back(std::move(*created[static_cast<size_t>(r)]));
      auto s = backend_->device(r)->CreateStream();
      if (!s.ok()) {
        status_ = s.status();
        return;
      }
      streams_.push_back(std::move(*s));
    }
  }
  ~Hosts() {
    streams_.clear();
    comms_.clear();
  }

  int n() const { return n_; }
  const Status& status() const { return status_; }
  const std::string& skip() const { return skip_; }
  Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }
  device::Stream& stream(int r) { return *streams_[static_cast<size_t>(r)]; }
  float* Allocate(int r, size_t count) {
    auto b = backend_->device(r)->Allocate(std::max<size_t>(count, 1) * sizeof(float));
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    buffers_.push_back(std::move(*b));
    return static_cast<float*>(buffers_.back()->data());
  }
  void FreeBuffers() { buffers_.clear(); }
  Status Finish() {
    for (int r = 0; r < n_; ++r) {
      KZ_RETURN_IF_ERROR(stream(r).Synchronize(Deadline::AfterSeconds(60)).WithContext(fmt::format("rank {}", r)));
      KZ_RETURN_IF_ERROR(comm(r).AsyncError());
    }
    return Status::Ok();
  }

 private:
  int n_ = 0;
  Config config_;
  std::vector<std::string> host_of_;
  Status status_;
  std::string skip_;
  std::unique_ptr<device::Backend> backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
  std::vector<std::unique_ptr<device::Buffer>> buffers_;
};

// One collective on every rank with `algo` (none: the model's choice), checked element by element.
void RunAndCheck(Hosts& w, Collective coll, std::optional<Algorithm> algo, size_t count, int root) {
  const int n = w.n();
  const std::string what = fmt::format("{} {} count {} root {}", collectives::CollectiveName(coll),
                                       algo ? std::string(collectives::AlgorithmName(*algo)) : "(model)", count, root);
  const bool all_to_all = coll == Collective::kAllToAll;
  const size_t in_count = coll == Collective::kReduceScatter || all_to_all ? count * n : count;
  const size_t out_count = coll == Collective::kAllGather || all_to_all ? count * n : count;
  std::vector<float*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    in[r] = w.Allocate(r, in_count);
    out[r] = w.Allocate(r, out_count);
    for (size_t i = 0; i < in_count; ++i) in[r][i] = Value(r, i);
    for (size_t i = 0; i < out_count; ++i) out[r][i] = -1;
  }
  CallOptions call;
  call.algorithm = algo;
  for (int r = 0; r < n; ++r) {
    Status s;
    switch (coll) {
      case Collective::kAllReduce:
        s = w.comm(r).AllReduce(in[r], out[r], count, DataType::kFloat32, ReduceOp::kSum, w.stream(r), call);
        break;
      case Collective::kReduceScatter:
        s = w.comm(r).ReduceScatter(in[r], out[r], count, DataType::kFloat32, ReduceOp::kSum, w.stream(r), call);
        break;
      case Collective::kAllGather:
        s = w.comm(r).AllGather(in[r], out[r], count, DataType::kFloat32, w.stream(r), call);
        break;
      case Collective::kBroadcast:
        s = w.comm(r).Broadcast(in[r], out[r], count, DataType::kFloat32, root, w.stream(r), call);
        break;
      case Collective::kReduce:
        s = w.comm(r).Reduce(in[r], out[r], count, DataType::kFloat32, ReduceOp::kSum, root, w.stream(r), call);
        break;
      case Collective::kAllToAll:
        s = w.comm(r).AllToAll(in[r], out[r], count, DataType::kFloat32, w.stream(r), call);
        break;
      default: FAIL() << what;
    }
    ASSERT_TRUE(s.ok()) << what << " rank " << r << ": " << s.ToString();
  }
  const Status done = w.Finish();
  ASSERT_TRUE(done.ok()) << what << ": " << done.ToString();
  for (int r = 0; r < n; ++r) {
    if (coll == Collective::kReduce && r != root) continue;
    for (size_t i = 0; i < out_count; ++i) {
      float want = 0;
      switch (coll) {
        case Collective::kAllReduce:
        case Collective::kReduce:
          for (int s = 0; s < n; ++s) want += Value(s, i);
          break;
        case Collective::kReduceScatter:
          for (int s = 0; s < n; ++s) want += Value(s, r * count + i);
          break;
        case Collective::kAllGather: want = Value(static_cast<int>(i / count), i % count); break;
        case Collective::kAllToAll: want = Value(static_cast<int>(i / count), r * count + i % count); break;
        default: want = Value(root, i);
      }
      ASSERT_EQ(out[r][i], want) << what << " rank " << r << " element " << i;
    }
  }
  w.FreeBuffers();
}

class HierarchyTest : public testing::TestWithParam<std::vector<int>> {
 protected:
  void SetUp() override {
    // The pretend hosts are one machine: libfabric's tcp provider stays on the loopback interface.
    ASSERT_EQ(::setenv("FI_TCP_IFACE", "lo", 1), 0);
  }
};

TEST_P(HierarchyTest, EveryCollectiveExact) {
  Hosts w(GetParam());
  if (!w.skip().empty()) GTEST_SKIP() << w.skip();
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  ASSERT_EQ(w.comm(0).topology().host_count(), static_cast<int>(GetParam().size()));
  for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                          Collective::kBroadcast, Collective::kReduce, Collective::kAllToAll})
    for (size_t count : {size_t{1}, size_t{1000}, size_t{300007}}) {
      const int root = static_cast<int>(count % static_cast<size_t>(w.n()));
      RunAndCheck(w, coll, Algorithm::kHierRing, count, root);
      if (coll == Collective::kAllReduce) RunAndCheck(w, coll, Algorithm::kHierRd, count, root);
      RunAndCheck(w, coll, std::nullopt, count, root);
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchyTest, testing::Values(std::vector<int>{2, 2}, std::vector<int>{1, 2, 1}),
                         [](const auto& info) { return fmt::format("{}", fmt::join(info.param, "_")); });

}  // namespace
}  // namespace kizuna::test
