// The loader's and the factory's unavailable paths (what this build machine, with libibverbs but
// no RDMA device, exercises), and — where an RDMA device exists (the Soft-RoCE VM) — a live
// connection between two fabrics of one process.
#include "fabric/roce/fabric.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "fabric/registry.h"
#include "fabric/roce/loader.h"

namespace kizuna::fabric::roce {
namespace {

// The environment's KIZUNA_IB_* settings apply (the Soft-RoCE VM runs this binary with them).
Config TestConfig() {
  Config c = ParseConfig(KizunaEnvironment()).config;
  c.timeout_s = 30;
  return c;
}

FabricContext Rank(int r) {
  FabricContext ctx;
  ctx.rank = r;
  ctx.world_size = 2;
  ctx.host_id = "test-host";
  return ctx;
}

TEST(RoceLoader, MissingLibraryIsUnavailableWithTheReason) {
  auto lib = IbVerbs::Open("libibverbs-kizuna-missing.so.1");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(lib.status().message().find("libibverbs-kizuna-missing.so.1 not found"), std::string::npos)
      << lib.status().message();
  const Config config = TestConfig();
  auto f = RoceFabric::CreateWith(config, Rank(0), lib);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(f.status().message().find("not found"), std::string::npos) << f.status().message();
}

TEST(RoceLoader, ALibraryThatIsNotLibibverbsIsUnavailable) {
  auto lib = IbVerbs::Open("libc.so.6");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(lib.status().message().find("lacks ibv_get_device_list"), std::string::npos) << lib.status().message();
}

TEST(RoceLoader, InstalledLibraryResolvesEverySymbol) {
  auto lib = IbVerbs::Default();
  if (!lib.ok()) GTEST_SKIP() << lib.status().message();
  EXPECT_NE((*lib)->wc_status_str, nullptr);
  EXPECT_EQ((*lib)->WcStatus(IBV_WC_RETRY_EXC_ERR), "transport retry counter exceeded");
  EXPECT_EQ((*lib)->WcStatus(IBV_WC_SUCCESS), "success");
}

TEST(RoceFabricFactory, IsRegisteredAsNeedingHardware) {
  bool found = false;
  for (const FabricRegistration& r : RegisteredFabrics())
    if (r.name == "roce") {
      found = true;
      EXPECT_TRUE(r.needs_hardware);
    }
  EXPECT_TRUE(found);
}

TEST(RoceFabricFactory, NoDeviceIsUnavailableWithTheReason) {
  const Config config = TestConfig();
  auto f = CreateFabric("roce", config, Rank(0));
  if (f.ok()) GTEST_SKIP() << "this machine has an RDMA device (" << (*f)->properties(0)->name << ")";
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().ToString();
  const std::string m = f.status().message();
  EXPECT_TRUE(m.find("no RDMA device") != std::string::npos || m.find("not found") != std::string::npos ||
              m.find("no usable RoCE port") != std::string::npos)
      << m;
}

TEST(RoceFabricFactory, MalformedHcaListIsAnError) {
  Config config = TestConfig();
  config.ib_hca = "mlx5_0:first";
  config.ib_gid_index.reset();
  auto f = CreateFabric("roce", config, Rank(0));
  ASSERT_FALSE(f.ok());
  if (f.status().code() == StatusCode::kUnavailable && f.status().message().find("not found") != std::string::npos)
    GTEST_SKIP() << f.status().message();
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
  EXPECT_NE(f.status().message().find("KIZUNA_IB_HCA"), std::string::npos);
}

TEST(RoceFabricFactory, HcaNamingNoDeviceIsAnErrorWhereDevicesExist) {
  Config config = TestConfig();
  config.ib_hca = "kizuna_no_such_hca0";
  config.ib_gid_index.reset();
  auto f = CreateFabric("roce", config, Rank(0));
  ASSERT_FALSE(f.ok());
  // Either way the error names the setting: no device at all (this build machine), or not that one.
  EXPECT_NE(f.status().message().find("kizuna_no_such_hca0"), std::string::npos) << f.status().message();
  EXPECT_NE(f.status().message().find("KIZUNA_IB_HCA"), std::string::npos) << f.status().message();
  if (f.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << f.status().message();
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
}

// Which devices and ports KIZUNA_IB_HCA selects, and a name that is not here (no device needed).
TEST(RoceFabricFactory, HcaCandidatesFollowTheListOrRefuseAMissingDevice) {
  const std::vector<std::string> here = {"mlx5_0", "mlx5_1", "rxe0"};
  auto all = HcaCandidates({}, here);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[2].device, 2);
  EXPECT_FALSE((*all)[2].port.has_value());
  auto listed = HcaCandidates({{"rxe0", 1}, {"mlx5_0", std::nullopt}}, here);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].device, 2);
  EXPECT_EQ((*listed)[0].port, 1);
  EXPECT_EQ((*listed)[1].device, 0);
  auto missing = HcaCandidates({{"mlx5_0", std::nullopt}, {"mlx5_9", std::nullopt}}, here);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("KIZUNA_IB_HCA names 'mlx5_9', which is not an RDMA device here "
                                            "(devices: mlx5_0, mlx5_1, rxe0)"),
            std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("unset KIZUNA_IB_HCA"), std::string::npos) << missing.status().message();
}

TEST(RoceFabricFactory, PortSpeed) {
  EXPECT_EQ(PortSpeedGbps(32, 2), 100.0);   // EDR 4x
  EXPECT_EQ(PortSpeedGbps(64, 2), 200.0);   // HDR 4x
  EXPECT_EQ(PortSpeedGbps(1, 1), 2.5);
  EXPECT_EQ(PortSpeedGbps(0, 2), 0.0);
  EXPECT_EQ(PortSpeedGbps(32, 3), 0.0);
}

// Live: two fabrics (ranks 0 and 1) of this process over the first device.
TEST(RoceLive, SendReceiveAndWriteWithImmediate) {
  const Config config = TestConfig();
  auto f0 = CreateFabric("roce", config, Rank(0));
  if (!f0.ok()) GTEST_SKIP() << f0.status().message();
  auto f1 = CreateFabric("roce", config, Rank(1));
  ASSERT_TRUE(f1.ok()) << f1.status().ToString();
  auto listen = (*f0)->Listen(0);
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  const Deadline deadline = Deadline::AfterSeconds(20);
  std::unique_ptr<RecvComm> recv;
  std::thread acceptor([&] {
    auto r = (*listen)->Accept(deadline);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    recv = std::move(r).value();
  });
  auto send = (*f1)->Connect(0, (*listen)->handle(), deadline);
  acceptor.join();
  ASSERT_TRUE(send.ok()) << send.status().ToString();
  ASSERT_NE(recv, nullptr);

  const size_t n = (1 << 20) + 3;
  std::vector<uint8_t> src(n), dst(n + 16, 0xee);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  auto sreg = (*send)->Register(MemoryDescriptor::Host(src.data(), src.size()));
  auto rreg = recv->Register(MemoryDescriptor::Host(dst.data(), dst.size()));
  ASSERT_TRUE(sreg.ok() && rreg.ok());
  // The registration cache: the same bytes registered again on this device share the region.
  MemoryCache& cache = static_cast<RoceFabric&>(**f1).device(0)->memory();
  const uint64_t regions = cache.registrations();
  auto again = (*send)->Register(MemoryDescriptor::Host(src.data(), src.size()));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(cache.registrations(), regions) << "registered twice instead of hitting the cache";
  EXPECT_EQ(&static_cast<RoceRegistration*>(*again)->region(), &static_cast<RoceRegistration*>(*sreg)->region());
  ASSERT_TRUE((*send)->Deregister(*again).ok());
  auto rq = recv->Recv(dst.data(), dst.size(), 7, *rreg);
  auto sq = (*send)->Send(src.data(), n, 7, *sreg);
  ASSERT_TRUE(rq.ok() && sq.ok() && *rq != nullptr && *sq != nullptr);
  auto got = recv->Wait(*rq, deadline);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, n);
  ASSERT_TRUE((*send)->Wait(*sq, deadline).ok());
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0);
  EXPECT_EQ(dst[n], 0xee);

  auto key = recv->Expose(*rreg);
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto wq = (*send)->Write(src.data(), 4096, *sreg, *key, 100, 0x1234u);
  ASSERT_TRUE(wq.ok() && *wq != nullptr) << wq.status().ToString();
  auto imm = recv->WaitImmediate(deadline);
  ASSERT_TRUE(imm.ok()) << imm.status().ToString();
  EXPECT_EQ(*imm, 0x1234u);
  EXPECT_EQ(std::memcmp(src.data(), dst.data() + 100, 4096), 0);
  ASSERT_TRUE((*send)->Wait(*wq, deadline).ok());

  // The receiver goes away: the sender's next send fails with kRemoteError naming the rank.
  recv.reset();
  auto late = (*send)->Send(src.data(), 16, 8, *sreg);
  if (late.ok() && *late != nullptr) {
    auto r = (*send)->Wait(*late, Deadline::AfterSeconds(5));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kRemoteError) << r.status().ToString();
    EXPECT_NE(r.status().message().find("rank 0"), std::string::npos) << r.status().message();
  } else {
    ASSERT_FALSE(late.ok());
    EXPECT_EQ(late.status().code(), StatusCode::kRemoteError);
  }
}

}  // namespace
}  // namespace kizuna::fabric::roce
