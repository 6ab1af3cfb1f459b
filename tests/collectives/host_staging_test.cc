// Staging through host memory (collectives/transport/transport.h): the transport's fallback for fabrics
// that cannot reach a device's memory, and the executor running every collective through it.
//  - forced (TransportOptions::force_host_staging) on ordinary and on opaque emulated devices:
//    transports and executors built here directly, since the communicator does not expose the
//    option; every served collective x algorithm is exact, through multi-chunk pipelines;
//  - chosen on its own: opaque emulated devices over a fabric that registers host memory only (the
//    example fabric plugin), through communicators, also where other comms of the rank had
//    registered the device's memory already (they move to host memory too: one staging buffer);
//  - not chosen where a fabric reaches the device's memory: opaque devices over direct links
//    register staging by fd (a memfd maps whether or not the CPU may dereference the device's
//    addresses).
// Usage: host_staging_test --fabric_plugin=<path to libkz_example_fabric.so>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/executor/executor.h"
#include "collectives/transport/transport.h"
#include "devices/host_emulated/backend.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/core/logging.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using collectives::CollectiveRequest;
using collectives::StagingPath;
using collectives::Transport;
using collectives::TransportOptions;

std::string g_fabric_plugin;

// Runs fn(rank) on one thread per rank and joins them all.
void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&fn, r] {
      SetLogRank(r);
      fn(r);
    });
  for (std::thread& t : threads) t.join();
}

// n ranks of the engine without a communicator: per rank an emulated device, a directconnect
// fabric ("full" links), a transport with the given options, an executor and a stream; plans
// built here for a uniform shape. What lets a test choose TransportOptions.
class Engine {
 public:
  Engine(int n, Config config, const TransportOptions& options) : config_(std::move(config)) {
    config_.emulated_devices = n;
    config_.topology = "full";
    auto backend = host_emulated::CreateHostEmulatedBackend(config_);
    if (!backend.ok()) {
      status_ = backend.status();
      return;
    }
    backend_ = std::move(backend).value();
    auto boots = bootstrap::CreateInProcessBootstraps(n);
    if (!boots.ok()) {
      status_ = boots.status();
      return;
    }
    boots_ = std::move(boots).value();
    for (int r = 0; r < n; ++r) {
      fabric::FabricContext ctx;
      ctx.rank = r;
      ctx.world_size = n;
      ctx.local_rank = r;
      ctx.host_id = "host-staging-test";
      ctx.device_uuids = {backend_->device(r)->properties().uuid};
      auto f = fabric::CreateFabric("directconnect", config_, ctx);
      if (!f.ok()) {
        status_ = f.status();
        return;
      }
      fabrics_.push_back(std::move(f).value());
    }
    std::vector<Result<std::unique_ptr<Transport>>> created;
    for (int r = 0; r < n; ++r) created.emplace_back(Internal("not run"));
    OnEveryRank(n, [&](int r) {
      fabric::Fabric* const one[] = {fabrics_[static_cast<size_t>(r)].get()};
      created[static_cast<size_t>(r)] = Transport::Create(one, *boots_[static_cast<size_t>(r)], *backend_->device(r),
                                                          options, Deadline::AfterSeconds(config_.timeout_s));
    });
    for (int r = 0; r < n; ++r) {
      auto& t = created[static_cast<size_t>(r)];
      if (!t.ok()) {
        status_ = t.status().WithContext(fmt::format("rank {}", r));
        return;
      }
      transports_.push_back(std::move(t).value());
    }
    collectives::ExecutorOptions eopts;
    eopts.timeout_s = config_.timeout_s;
    for (int r = 0; r < n; ++r) {
      auto ex = collectives::Executor::Create(transports_[static_cast<size_t>(r)].get(), backend_->device(r), eopts);
      auto stream = backend_->device(r)->CreateStream();
      if (!ex.ok() || !stream.ok()) {
        status_ = !ex.ok() ? ex.status() : stream.status();
        return;
      }
      executors_.push_back(std::move(ex).value());
      streams_.push_back(std::move(stream).value());
      io_.push_back(std::make_unique<DeviceIo>(*backend_->device(r), *streams_.back()));
    }
    collectives::RankDesc rank;
    rank.host_id = "host-staging-test";
    shape_ = collectives::CommTopology::Uniform(n, rank, collectives::LinkDesc{true, 0, 0, true});
  }
  ~Engine() {
    io_.clear();
    executors_.clear();  // finishes queued operations, then stops
    streams_.clear();
    transports_.clear();
    fabrics_.clear();
  }

  const Status& status() const { return status_; }
  int size() const { return static_cast<int>(transports_.size()); }
  Transport& transport(int r) { return *transports_[static_cast<size_t>(r)]; }
  device::Device& device(int r) { return *backend_->device(r); }
  DeviceIo& io(int r) { return *io_[static_cast<size_t>(r)]; }

  // Queues rank r's part of `request` with `algorithm` behind its stream, as a communicator would
  // (one channel, slots from the executor's staging split).
  Status Submit(int r, collectives::Algorithm algorithm, const CollectiveRequest& request, const void* input,
                void* output) {
    collectives::Executor& ex = *executors_[static_cast<size_t>(r)];
    const size_t slot = ex.slot_bytes_for(1, 0);
    collectives::PlanOptions popts;
    popts.chunk_count = std::max<uint64_t>(1, slot / DataTypeSize(request.dtype));
    KZ_ASSIGN_OR_RETURN(collectives::Plan plan, collectives::BuildPlan(algorithm, request, shape_, popts, r));
    std::vector<collectives::OperationMember> members;
    members.push_back({std::make_shared<const collectives::Plan>(std::move(plan)), input, output});
    return ex.Submit(std::move(members), *streams_[static_cast<size_t>(r)], slot);
  }

  // Every rank's stream, then every executor's error.
  Status SyncAll() {
    Status first;
    for (int r = 0; r < size(); ++r) {
      Status s = streams_[static_cast<size_t>(r)]->Synchronize(Deadline::AfterSeconds(60));
      if (!s.ok() && first.ok()) first = s.WithContext(fmt::format("rank {} stream", r));
    }
    for (int r = 0; r < size(); ++r) {
      Status s = executors_[static_cast<size_t>(r)]->AsyncError();
      if (!s.ok() && first.ok()) first = s.WithContext(fmt::format("rank {}", r));
    }
    return first;
  }

  // The algorithms that serve `request` on this engine's shape.
  std::vector<collectives::Algorithm> Serving(const CollectiveRequest& request) const {
    std::vector<collectives::Algorithm> out;
    for (const collectives::AlgorithmImpl* a : collectives::AllAlgorithms())
      if (a->Supports(request, shape_).ok()) out.push_back(a->id());
    return out;
  }

 private:
  Config config_;
  Status status_;
  std::unique_ptr<device::Backend> backend_;
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots_;
  std::vector<std::unique_ptr<fabric::Fabric>> fabrics_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<collectives::Executor>> executors_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
  std::vector<std::unique_ptr<DeviceIo>> io_;
  collectives::CommTopology shape_;
};

// Element j of rank r's output, for inputs InputValue(op, q, i) (reductions) or
// InputValue(kSum, q, i) (the others).
double Expected(const CollectiveRequest& req, int r, uint64_t j) {
  const int n = req.nranks;
  const uint64_t count = req.count;
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce:
      return Reduced(req.op, n, j, req.dtype);
    case Collective::kReduceScatter:
      return Reduced(req.op, n, static_cast<uint64_t>(r) * count + j, req.dtype);
    case Collective::kAllGather:
      return static_cast<double>(InputValue(ReduceOp::kSum, static_cast<int>(j / count), j % count));
    case Collective::kBroadcast:
      return static_cast<double>(InputValue(ReduceOp::kSum, req.root, j));
    case Collective::kAllToAll:
      return static_cast<double>(
          InputValue(ReduceOp::kSum, static_cast<int>(j / count), static_cast<uint64_t>(r) * count + j % count));
    default:
      return 0;
  }
}

// Runs `req` (out of place) with `algorithm` on every rank of `e` and checks every output element.
testing::AssertionResult RunAndCheck(Engine& e, collectives::Algorithm algorithm, const CollectiveRequest& req) {
  const int n = e.size();
  const size_t elem = DataTypeSize(req.dtype);
  const std::string what =
      fmt::format("{} via {} on {} ranks", req.ToString(), collectives::AlgorithmName(algorithm), n);
  const ReduceOp value_op = collectives::IsReduction(req.collective) ? req.op : ReduceOp::kSum;
  const uint64_t in_count = std::max<uint64_t>(req.input_count(), 1);
  const uint64_t out_count = std::max<uint64_t>(req.output_count(), 1);
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < n; ++r) {
    auto a = e.device(r).Allocate(in_count * elem);
    auto b = e.device(r).Allocate(out_count * elem);
    if (!a.ok() || !b.ok()) return testing::AssertionFailure() << what << ": allocation failed";
    std::vector<uint8_t> image(in_count * elem);
    for (uint64_t i = 0; i < req.input_count(); ++i)
      StoreValue(image.data(), i, req.dtype, static_cast<double>(InputValue(value_op, r, i)));
    std::vector<uint8_t> sentinel(out_count * elem);
    for (uint64_t j = 0; j < out_count; ++j) StoreValue(sentinel.data(), j, req.dtype, 99);
    Status s = e.io(r).Upload((*a)->data(), image.data(), image.size());
    if (s.ok()) s = e.io(r).Upload((*b)->data(), sentinel.data(), sentinel.size());
    if (!s.ok()) return testing::AssertionFailure() << what << ": rank " << r << ": " << s.ToString();
    in.push_back(std::move(a).value());
    out.push_back(std::move(b).value());
  }
  for (int r = 0; r < n; ++r) {
    Status s = e.Submit(r, algorithm, req, in[static_cast<size_t>(r)]->data(), out[static_cast<size_t>(r)]->data());
    if (!s.ok()) return testing::AssertionFailure() << what << ": rank " << r << ": " << s.ToString();
  }
  if (Status s = e.SyncAll(); !s.ok()) return testing::AssertionFailure() << what << ": " << s.ToString();
  for (int r = 0; r < n; ++r) {
    if (req.collective == Collective::kReduce && r != req.root) continue;
    std::vector<uint8_t> got(out_count * elem);
    Status s = e.io(r).Download(got.data(), out[static_cast<size_t>(r)]->data(), got.size());
    if (!s.ok()) return testing::AssertionFailure() << what << ": rank " << r << ": " << s.ToString();
    for (uint64_t j = 0; j < req.output_count(); ++j) {
      const double want = Expected(req, r, j);
      const double have = LoadValue(got.data(), j, req.dtype);
      if (!Matches(have, want, req.dtype, req.op))
        return testing::AssertionFailure() << what << ": rank " << r << " element " << j << ": got " << have
                                           << ", expected " << want;
    }
  }
  return testing::AssertionSuccess();
}

// Every collective that moves data, with every algorithm that serves it, through host staging:
// 100,003 float32 elements cut into many chunks by a small staging buffer, and a small bfloat16
// average (the scale epilogue) and an int32 max.
void EveryCollectiveThroughHostStaging(Engine& e) {
  constexpr Collective kData[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                                  Collective::kBroadcast, Collective::kReduce,        Collective::kAllToAll};
  int k = 0;
  for (Collective coll : kData) {
    CollectiveRequest req;
    req.collective = coll;
    req.nranks = e.size();
    req.count = 100003;
    if (coll == Collective::kAllGather || coll == Collective::kReduceScatter || coll == Collective::kAllToAll)
      req.count = 100003 / static_cast<uint64_t>(e.size());
    req.root = e.size() - 1;
    const auto algorithms = e.Serving(req);
    ASSERT_FALSE(algorithms.empty()) << req.ToString();
    for (collectives::Algorithm algo : algorithms) {
      ASSERT_TRUE(RunAndCheck(e, algo, req));
      if (collectives::IsReduction(coll)) {
        CollectiveRequest small = req;
        small.count = 1003;
        small.dtype = k % 2 == 0 ? DataType::kBfloat16 : DataType::kInt32;
        small.op = k % 2 == 0 ? ReduceOp::kAvg : ReduceOp::kMax;
        ++k;
        ASSERT_TRUE(RunAndCheck(e, algo, small));
      }
    }
  }
}

// Staging 256 KiB: slots of 64 KiB, so 100,003 float32 elements take several chunks per step.
TransportOptions SmallStaging(bool force_host) {
  TransportOptions options;
  options.staging_bytes = 256u << 10;
  options.force_host_staging = force_host;
  return options;
}

Config TestConfig(bool opaque) {
  Config c;
  c.timeout_s = 30;
  c.emu_opaque = opaque;
  return c;
}

void ExpectForcedHostStaging(Engine& e) {
  for (int r = 0; r < e.size(); ++r) {
    Transport& t = e.transport(r);
    EXPECT_TRUE(t.host_staging()) << "rank " << r;
    EXPECT_EQ(t.staging_paths(), std::vector<StagingPath>{StagingPath::kHostMemory}) << "rank " << r;
    EXPECT_NE(t.description().find("staging through host memory (forced by TransportOptions::force_host_staging)"),
              std::string::npos)
        << "rank " << r << ": " << t.description();
    EXPECT_EQ(t.staging_bytes(), 256u << 10);
  }
}

TEST(HostStaging, ForcedOnEmulatedDevicesGivesExactResults) {
  Engine e(3, TestConfig(/*opaque=*/false), SmallStaging(/*force_host=*/true));
  ASSERT_TRUE(e.status().ok()) << e.status().ToString();
  ExpectForcedHostStaging(e);
  EveryCollectiveThroughHostStaging(e);
}

TEST(HostStaging, ForcedOnOpaqueDevicesGivesExactResults) {
  Engine e(4, TestConfig(/*opaque=*/true), SmallStaging(/*force_host=*/true));
  ASSERT_TRUE(e.status().ok()) << e.status().ToString();
  ExpectForcedHostStaging(e);
  EveryCollectiveThroughHostStaging(e);
}

// Direct links reach the emulated device's memory by its memfd, opaque or not: no host staging.
TEST(HostStaging, NotChosenWhereTheFabricReachesOpaqueMemoryByFd) {
  Engine e(2, TestConfig(/*opaque=*/true), SmallStaging(/*force_host=*/false));
  ASSERT_TRUE(e.status().ok()) << e.status().ToString();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(e.transport(r).host_staging());
    EXPECT_EQ(e.transport(r).staging_paths(), std::vector<StagingPath>{StagingPath::kFd});
    EXPECT_NE(e.transport(r).description().find("staging by fd (device export)"), std::string::npos)
        << e.transport(r).description();
  }
  CollectiveRequest req;
  req.nranks = 2;
  req.count = 100003;
  ASSERT_TRUE(RunAndCheck(e, collectives::Algorithm::kRing, req));
}

TEST(HostStaging, OneRankForcedUsesHostMemory) {
  Config config = TestConfig(/*opaque=*/false);
  config.emulated_devices = 1;
  auto backend = host_emulated::CreateHostEmulatedBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto t = Transport::CreateSingle(*(*backend)->device(0), SmallStaging(/*force_host=*/true));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)->host_staging());
  EXPECT_TRUE((*t)->staging_paths().empty());
  EXPECT_NE((*t)->description().find("through host memory"), std::string::npos) << (*t)->description();
}

// A fabric that registers host memory only (the example plugin: TCP over loopback) and devices
// whose memory the CPU cannot address: no registration of the device's memory can work, so every
// rank stages through host memory on its own, and says why. Where the emulated device is host
// accessible (opaque mode not available), the same fabric registers its memory by host pointer.
TEST(HostStaging, ChosenWhereTheFabricTakesOnlyHostMemory) {
  ASSERT_FALSE(g_fabric_plugin.empty()) << "pass --fabric_plugin=<path to libkz_example_fabric.so>";
  Config config = WorldConfig(4);
  config.emu_opaque = true;
  config.fabric_plugins = {g_fabric_plugin};
  config.fabric = {"example_tcp"};
  config.topology.clear();
  World w(4, config);
  KZ_ASSERT_WORLD(w);
  for (int r = 0; r < w.size(); ++r) {
    const std::string d = w.comm(r).DescribeConnections();
    EXPECT_NE(d.find("example_tcp: "), std::string::npos) << d;
    if (w.host_accessible(r)) {
      EXPECT_NE(d.find("staging by host pointer"), std::string::npos) << "rank " << r << ": " << d;
    } else {
      EXPECT_NE(d.find(fmt::format("staging through host memory (example_tcp cannot reach {} memory)",
                                   w.device(r).label())),
                std::string::npos)
          << "rank " << r << ": " << d;
    }
  }
  const size_t count = 30011;
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < w.size(); ++r) {
    auto a = w.Allocate(r, count * 4), b = w.Allocate(r, count * 4 * 4);
    ASSERT_TRUE(a.ok() && b.ok());
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(InputValue(ReduceOp::kSum, r, i));
    ASSERT_TRUE(w.Upload(r, (*a)->data(), values).ok());
    in.push_back(std::move(a).value());
    out.push_back(std::move(b).value());
  }
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kPairwise}) {
    CallOptions call;
    call.algorithm = algo;
    for (int r = 0; r < w.size(); ++r)
      ASSERT_TRUE(w.comm(r).AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                      w.stream(r), call).ok());
    ASSERT_TRUE(w.SyncAll().ok()) << collectives::AlgorithmName(algo) << ": " << w.SyncAll().ToString();
    for (int r = 0; r < w.size(); ++r) {
      auto got = w.Download<float>(r, out[r]->data(), count);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ((*got)[i], Reduced(ReduceOp::kSum, w.size(), i, DataType::kFloat32))
            << collectives::AlgorithmName(algo) << " rank " << r << " element " << i;
    }
  }
  for (int r = 0; r < w.size(); ++r)
    ASSERT_TRUE(w.comm(r).AllGather(in[r]->data(), out[r]->data(), count, DataType::kFloat32, w.stream(r)).ok());
  ASSERT_TRUE(w.SyncAll().ok()) << w.SyncAll().ToString();
  for (int r = 0; r < w.size(); ++r) {
    auto got = w.Download<float>(r, out[r]->data(), count * 4);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (int q = 0; q < 4; ++q)
      for (size_t i = 0; i < count; i += 997)
        ASSERT_EQ((*got)[q * count + i], static_cast<float>(InputValue(ReduceOp::kSum, q, i))) << "rank " << r;
  }
}

// Two fabrics: direct links between ring neighbours (which reach opaque memory by its memfd) and
// the host-only plugin across the ring (which cannot). Staging is one buffer per rank, so the
// registrations already made on the direct links are withdrawn and every comm stages through
// host memory; transfers over both fabrics stay exact.
TEST(HostStaging, OneFabricThatCannotReachTheMemoryMovesEveryCommToHostMemory) {
  ASSERT_FALSE(g_fabric_plugin.empty()) << "pass --fabric_plugin=<path to libkz_example_fabric.so>";
  Config config = WorldConfig(4);
  config.emu_opaque = true;
  config.fabric_plugins = {g_fabric_plugin};
  config.fabric = {"directconnect", "example_tcp"};
  config.topology = "ring:4";
  World w(4, config);
  KZ_ASSERT_WORLD(w);
  for (int r = 0; r < w.size(); ++r) {
    const std::string d = w.comm(r).DescribeConnections();
    const int next = (r + 1) % 4, prev = (r + 3) % 4, across = (r + 2) % 4;
    EXPECT_NE(d.find(fmt::format("directconnect: ranks {}, {} (", std::min(next, prev), std::max(next, prev))),
              std::string::npos)
        << d;
    EXPECT_NE(d.find(fmt::format("example_tcp: rank {} (", across)), std::string::npos) << d;
    if (w.host_accessible(r)) {
      EXPECT_NE(d.find("staging by fd (device export) and by host pointer"), std::string::npos) << d;
    } else {
      EXPECT_NE(d.find(fmt::format("staging through host memory (example_tcp cannot reach {} memory)",
                                   w.device(r).label())),
                std::string::npos)
          << "rank " << r << ": " << d;
    }
  }
  const size_t count = 70001;
  std::vector<std::unique_ptr<device::Buffer>> bufs;
  for (int r = 0; r < w.size(); ++r) {
    auto b = w.Allocate(r, count * 8);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    bufs.push_back(std::move(b).value());
  }
  for (Algorithm algo : {Algorithm::kRing, Algorithm::kPairwise, Algorithm::kRhd}) {
    for (int r = 0; r < w.size(); ++r) {
      std::vector<double> values(count);
      for (size_t i = 0; i < count; ++i) values[i] = static_cast<double>(InputValue(ReduceOp::kMax, r, i));
      ASSERT_TRUE(w.Upload(r, bufs[r]->data(), values).ok());
    }
    CallOptions call;
    call.algorithm = algo;
    for (int r = 0; r < w.size(); ++r)
      ASSERT_TRUE(w.comm(r).AllReduce(bufs[r]->data(), bufs[r]->data(), count, DataType::kFloat64, ReduceOp::kMax,
                                      w.stream(r), call).ok());
    ASSERT_TRUE(w.SyncAll().ok()) << collectives::AlgorithmName(algo) << ": " << w.SyncAll().ToString();
    for (int r = 0; r < w.size(); ++r) {
      auto got = w.Download<double>(r, bufs[r]->data(), count);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ((*got)[i], Reduced(ReduceOp::kMax, w.size(), i, DataType::kFloat64))
            << collectives::AlgorithmName(algo) << " rank " << r << " element " << i;
    }
  }
}

}  // namespace
}  // namespace kizuna::test

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--fabric_plugin=", 16) == 0) kizuna::test::g_fabric_plugin = argv[i] + 16;
  return RUN_ALL_TESTS();
}
