// Buffers registered for zero-copy (Communicator::Register, ncclCommRegister): four ranks that say
// they are on two hosts, directconnect inside a host and ofi (tcp;ofi_rxm on the loopback
// interface, a fabric whose registration is not cheap) between them. Registered buffers go over
// ofi as they are (registered_transfers counts them), results exact; after Deregister the same
// calls are staged again; bad handles and arguments are refused.
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/registry.h"
#include "tests/collectives/world.h"

namespace kizuna {
namespace {

TEST(Registration, RegisteredBuffersGoStraightOverAFabricWhoseRegistrationCostsSomething) {
  ASSERT_EQ(::setenv("FI_TCP_IFACE", "lo", 1), 0);
  const int n = 4;
  Config config;
  config.emulated_devices = n;
  config.timeout_s = 30;
  config.fabric = {"directconnect", "ofi"};
  {
    fabric::FabricContext ctx;
    ctx.world_size = n;
    auto f = fabric::CreateFabric("ofi", config, ctx);
    if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << "ofi: " << f.status().ToString();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
  }
  auto backend = host_emulated::CreateHostEmulatedBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  auto created = test::CreateByThreads(
      n, [&](int r) { return (*backend)->device(r); },
      [&](int r) {
        CommOptions options;
        options.config = &config;
        options.staging_bytes = 2u << 20;
        options.host_id = r < 2 ? "hostA" : "hostB";
        return options;
      });
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<device::Stream>> streams;
  std::vector<std::unique_ptr<device::Buffer>> bufs;
  const size_t count = 1 << 18;  // 1 MiB of floats: steps far above the direct path's 16 KiB
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(created[r].ok()) << "rank " << r << ": " << created[r].status().ToString();
    comms.push_back(std::move(*created[r]));
    auto s = (*backend)->device(r)->CreateStream();
    ASSERT_TRUE(s.ok());
    streams.push_back(std::move(*s));
    auto b = (*backend)->device(r)->Allocate(count * sizeof(float));
    ASSERT_TRUE(b.ok());
    bufs.push_back(std::move(*b));
  }
  auto run = [&](int round) {
    for (int r = 0; r < n; ++r) {
      auto* f = static_cast<float*>(bufs[r]->data());
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(r + round + (i % 5));
    }
    CallOptions ring;
    ring.algorithm = collectives::Algorithm::kRing;
    std::vector<std::thread> calls;
    std::vector<Status> results(n);
    for (int r = 0; r < n; ++r)
      calls.emplace_back([&, r] {
        void* d = bufs[r]->data();
        results[r] = comms[r]->AllReduce(d, d, count, DataType::kFloat32, ReduceOp::kSum, *streams[r], ring);
        if (results[r].ok()) results[r] = streams[r]->Synchronize();
      });
    for (auto& t : calls) t.join();
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
      const auto* f = static_cast<const float*>(bufs[r]->data());
      for (size_t i : {size_t{0}, count / 3, count - 1})
        ASSERT_EQ(f[i], static_cast<float>(6 + 4 * round + 4 * (i % 5))) << "rank " << r << " element " << i;
    }
  };

  // Unregistered: ofi stages (its registration is not cheap).
  run(0);
  for (int r = 0; r < n; ++r) EXPECT_EQ(comms[r]->registered_transfers(), 0u) << "rank " << r;

  std::vector<uint64_t> handles;
  for (int r = 0; r < n; ++r) {
    auto h = comms[r]->Register(bufs[r]->data(), bufs[r]->size());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    handles.push_back(*h);
  }
  run(1);
  std::vector<uint64_t> after(n);
  for (int r = 0; r < n; ++r) {
    after[r] = comms[r]->registered_transfers();
    // The ring's steps between the hosts (rank 1 -> 2 and 3 -> 0) went from and into the buffers.
    EXPECT_GT(after[r], 0u) << "rank " << r << ": no transfer went through its registered buffer";
  }
  for (int r = 0; r < n; ++r) ASSERT_TRUE(comms[r]->Deregister(handles[r]).ok());
  run(2);
  for (int r = 0; r < n; ++r) EXPECT_EQ(comms[r]->registered_transfers(), after[r]) << "rank " << r;

  // Refusals.
  EXPECT_EQ(comms[0]->Deregister(handles[0]).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Deregister(987654).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Register(nullptr, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Register(bufs[0]->data(), 0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kizuna
