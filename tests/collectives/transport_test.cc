// The transport: N ranks as threads of one process over in-process bootstraps, each with its own
// emulated device and its own fabrics from the registry (directconnect on a generated topology,
// ofi over tcp;ofi_rxm, or both, a pair taking the first that serves it), exchanging bytes between
// staging buffers and control buffers; ring reachability; the registry's list of every available
// fabric; deadlines when a peer never shows up or never answers. Creation connects nobody: pairs
// connect when asked (ConnectAll, WaitConnected: what the executor does on first use), and only
// those pairs.
#include "collectives/transport/transport.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/core/config.h"
#include "runtime/core/logging.h"
#include "runtime/core/status.h"
#include "tests/collectives/transport_world.h"

namespace kizuna::collectives {
namespace {

using namespace transport_testing;  // NOLINT(build/namespaces): this test's world

class DirectConnectFull : public ::testing::TestWithParam<int> {};

TEST_P(DirectConnectFull, EveryPairExchangesStagingBytesInOneCopy) {
  World w(GetParam(), "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  ExchangeOnEveryRank(w, /*single_copy=*/true);
}

INSTANTIATE_TEST_SUITE_P(Sizes, DirectConnectFull, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(Ofi, ThreeRanksOverTcp) {
  World w(3, "ofi", "", {"ofi:tcp"});
  if (w.status.code() == StatusCode::kUnavailable) GTEST_SKIP() << "ofi is not available here: " << w.status.ToString();
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  ExchangeOnEveryRank(w, /*single_copy=*/false);
}

// A rank with a peer over a network (ofi: a switched device) grows its staging to
// network_staging_bytes, for the executor's larger network chunks; direct links alone do not.
TEST(Ofi, NetworkPeersGrowTheStaging) {
  constexpr size_t kNetworkBytes = 4u << 20;
  for (const std::string fabric_name : {"ofi", "directconnect"}) {
    World w(2, fabric_name, fabric_name == "ofi" ? "" : "full", {"ofi:tcp"});
    if (w.status.code() == StatusCode::kUnavailable)
      GTEST_SKIP() << fabric_name << " is not available here: " << w.status.ToString();
    ASSERT_TRUE(w.status.ok()) << w.status.ToString();
    const bool network = fabric_name == "ofi";
    // Each rank closes its transport as soon as it has one: it has no connections yet.
    OnEveryRank(2, [&](int r) {
      TransportOptions options{kStagingBytes, 256};
      options.network_staging_bytes = kNetworkBytes;
      auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), options, Soon());
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      EXPECT_EQ((*created)->network(), network) << fabric_name;
      EXPECT_EQ((*created)->staging_bytes(), network ? kNetworkBytes : kStagingBytes) << fabric_name;
    });
  }
}

TEST(TwoFabrics, NeighboursOverDirectLinksEveryOtherPairOverOfi) {
  // Directconnect first, on a ring: each rank's two neighbours are served by their direct links;
  // the rank across the ring has no link, so the pair takes the next fabric that serves both ends.
  World w(4, std::vector<std::string>{"directconnect", "ofi"}, "ring:4", {"ofi:tcp"});
  if (w.status.code() == StatusCode::kUnavailable) GTEST_SKIP() << "ofi is not available here: " << w.status.ToString();
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  auto check = [](Transport& t) {
    const int r = t.rank(), next = (r + 1) % 4, prev = (r + 3) % 4, across = (r + 2) % 4;
    for (int q : {next, prev}) {
      ASSERT_NE(t.peer(q), nullptr);
      ASSERT_NE(t.peer(q)->fabric, nullptr);
      EXPECT_EQ(t.peer(q)->fabric->name(), "directconnect") << "rank " << r << " to rank " << q;
    }
    ASSERT_NE(t.peer(across), nullptr);
    ASSERT_NE(t.peer(across)->fabric, nullptr);
    EXPECT_EQ(t.peer(across)->fabric->name(), "ofi") << "rank " << r << " to rank " << across;
    EXPECT_NE(t.peer(across)->send->label().find("ofi"), std::string::npos) << t.peer(across)->send->label();
    const std::string d = t.description();
    EXPECT_NE(d.find(fmt::format("directconnect: ranks {}, {} (", std::min(next, prev), std::max(next, prev))),
              std::string::npos)
        << d;
    EXPECT_NE(d.find(fmt::format("ofi: rank {} (", across)), std::string::npos) << d;
    EXPECT_EQ(d.find("unreachable"), std::string::npos) << d;
  };
  ExchangeOnEveryRank(w, /*single_copy=*/false, AllLinked, check);
}

TEST(TwoFabrics, TheFirstFabricThatServesAPairWins) {
  // Ofi first: it reaches every peer, so the direct links are never used.
  World w(3, std::vector<std::string>{"ofi", "directconnect"}, "full", {"ofi:tcp"});
  if (w.status.code() == StatusCode::kUnavailable) GTEST_SKIP() << "ofi is not available here: " << w.status.ToString();
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  ExchangeOnEveryRank(w, /*single_copy=*/false, AllLinked, [](Transport& t) {
    for (int q = 0; q < 3; ++q) {
      if (q == t.rank()) continue;
      ASSERT_NE(t.peer(q), nullptr);
      EXPECT_EQ(t.peer(q)->fabric->name(), "ofi");
    }
    EXPECT_EQ(t.description().find("directconnect"), std::string::npos) << t.description();
  });
}

TEST(FabricRegistry, SelectAllListsTheAvailableFabricsInPreferenceOrder) {
  auto names_of = [](const std::vector<fabric::Fabric*>& fabrics) {
    std::vector<std::string> names;
    for (const fabric::Fabric* f : fabrics) names.push_back(f->name());
    return names;
  };
  fabric::FabricContext ctx;
  ctx.rank = 0;
  ctx.world_size = 2;
  // KIZUNA_FABRIC's order; "ofi:tcp" and "ofi:shm" both name ofi, listed once; unknown names skipped.
  Config listed;
  listed.topology = "full";
  listed.fabric = {"ofi:tcp", "nowhere", "directconnect", "ofi:shm"};
  auto reg = fabric::FabricRegistry::Create(listed, ctx);
  const bool ofi = reg->Find("ofi") != nullptr;
  auto all = reg->SelectAll();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(names_of(*all), ofi ? (std::vector<std::string>{"ofi", "directconnect"})
                                : (std::vector<std::string>{"directconnect"}));

  // No list: every available fabric, direct ones (directconnect: point-to-point ports) first, then
  // the others in registration order, whatever order the linker gave the registrations.
  Config unlisted;
  unlisted.topology = "full";
  auto reg2 = fabric::FabricRegistry::Create(unlisted, ctx);
  std::vector<std::string> expected = {"directconnect"};
  for (const fabric::FabricRegistration& r : fabric::RegisteredFabrics())
    if (r.name != "directconnect" && reg2->Find(r.name) != nullptr) expected.push_back(r.name);
  auto all2 = reg2->SelectAll();
  ASSERT_TRUE(all2.ok()) << all2.status().ToString();
  EXPECT_EQ(names_of(*all2), expected);

  // Nothing usable: unavailable, naming each candidate.
  Config none;
  none.fabric = {"nowhere", "directconnect"};  // directconnect without a topology is unavailable
  auto reg3 = fabric::FabricRegistry::Create(none, ctx);
  auto all3 = reg3->SelectAll();
  EXPECT_EQ(all3.status().code(), StatusCode::kUnavailable) << all3.status().ToString();
  EXPECT_NE(all3.status().message().find("nowhere: not linked in"), std::string::npos) << all3.status().message();
  EXPECT_NE(all3.status().message().find("KIZUNA_TOPOLOGY"), std::string::npos) << all3.status().message();
}

TEST(DirectConnectRing, OnlyNeighboursArePeers) {
  World w(4, "directconnect", "ring:4");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(4, [&](int r) {
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Transport& t = **created;
    const int next = (r + 1) % 4, prev = (r + 3) % 4, across = (r + 2) % 4;
    EXPECT_TRUE(t.reachable(next));
    EXPECT_TRUE(t.reachable(prev));
    EXPECT_FALSE(t.reachable(across));
    EXPECT_FALSE(t.reachable(r));
    ASSERT_TRUE(t.ConnectAll(Soon()).ok());
    EXPECT_EQ(t.connected_peers(), (std::vector<int>{std::min(next, prev), std::max(next, prev)}));
    EXPECT_EQ(t.peer(across), nullptr);
    EXPECT_EQ(t.peer(r), nullptr);
    ASSERT_EQ(t.link_row().size(), 4u);
    EXPECT_TRUE(t.link_row()[static_cast<size_t>(next)].reachable);
    EXPECT_TRUE(t.link_row()[static_cast<size_t>(prev)].reachable);
    EXPECT_FALSE(t.link_row()[static_cast<size_t>(across)].reachable);
    EXPECT_FALSE(t.link_row()[static_cast<size_t>(r)].reachable);
    EXPECT_TRUE(t.link_row()[static_cast<size_t>(next)].staged);
    EXPECT_EQ(t.link_row()[static_cast<size_t>(next)].gbps, 0.0);  // generated links: unknown speed
    // Port 0 goes to the next rank, port 1 to the previous one.
    EXPECT_NE(t.peer(next)->send->label().find(fmt::format("w{}:0->w{}:1", r, next)), std::string::npos)
        << t.peer(next)->send->label();
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
}

TEST(DirectConnectTorus, TwoLinksBetweenAPairServeOneDirectionEach) {
  // In a 2x2 torus each pair of x-neighbours is cabled twice: the transport listens on the first
  // link, and the peer must connect over exactly the far end of that link.
  World w(4, "directconnect", "torus2d:2x2");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  // rank = x + 2y: the diagonal pairs (0, 3) and (1, 2) are not linked.
  // Rank 0 listens for rank 1 on its port 0 (cabled to w1's port 1), so rank 1 connects from its
  // port 1; rank 1 listens on its port 0 (cabled to w0's port 1), so rank 0 connects from port 1.
  auto uses_both_links = [](Transport& t) {
    if (t.rank() != 0) return;
    EXPECT_EQ(t.peer(1)->send->label(), "directconnect w0:1->w1:0");
    EXPECT_EQ(t.peer(1)->recv->label(), "directconnect w0:0<-w1:1");
  };
  ExchangeOnEveryRank(w, /*single_copy=*/true, [](int a, int b) { return a + b != 3; }, uses_both_links);
}

// Creation connects nobody; a pair connects when asked — here each rank to the next around the
// ring — and only that pair: the rank across the ring stays unconnected, though every pair is
// linked and the description (from the fabric devices) lists every peer.
TEST(Transport, CreationConnectsNobodyAndAPairConnectsWhenAsked) {
  World w(4, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(4, [&](int r) {
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Transport& t = **created;
    const int next = (r + 1) % 4, prev = (r + 3) % 4, across = (r + 2) % 4;
    EXPECT_TRUE(t.connected_peers().empty());
    for (int q = 0; q < 4; ++q) EXPECT_EQ(t.reachable(q), q != r) << "rank " << q;
    EXPECT_NE(t.description().find(fmt::format("directconnect: ranks {}", r == 0 ? "1, 2, 3" : "")), std::string::npos)
        << t.description();
    EXPECT_TRUE(t.link_row()[static_cast<size_t>(across)].reachable);
    const int to[] = {next}, from[] = {prev};
    Status connected = t.WaitConnected(to, from, Soon());
    ASSERT_TRUE(connected.ok()) << connected.ToString();
    EXPECT_EQ(t.connected_peers(), (std::vector<int>{std::min(next, prev), std::max(next, prev)}));
    EXPECT_EQ(t.peer(across), nullptr);
    ASSERT_NE(t.peer(next), nullptr);
    EXPECT_NE(t.peer(next)->send, nullptr);
    EXPECT_EQ(t.peer(next)->recv, nullptr);
    ASSERT_NE(t.peer(prev), nullptr);
    EXPECT_NE(t.peer(prev)->recv, nullptr);
    EXPECT_EQ(t.peer(prev)->send, nullptr);
    // Bytes around the ring, staging buffer to staging buffer.
    const size_t slot = kStagingBytes / 2;
    auto* base = static_cast<uint8_t*>(t.staging().data());
    for (size_t i = 0; i < slot; ++i) base[i] = PatternByte(r, next, i);
    auto recv = t.peer(prev)->recv->Recv(base + slot, slot, 7, t.peer(prev)->recv_staging);
    auto send = t.peer(next)->send->Send(base, slot, 7, t.peer(next)->send_staging);
    ASSERT_TRUE(recv.ok() && send.ok()) << recv.status().ToString() << send.status().ToString();
    Status s = WaitAll({t.peer(prev)->recv.get(), t.peer(next)->send.get()}, {*recv, *send}, Soon());
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < slot; ++i) ASSERT_EQ(base[slot + i], PatternByte(prev, r, i)) << "byte " << i;
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
}

// Waiting for a peer that never connects ends at the deadline, naming the peer and the fabric.
TEST(Transport, WaitingForAPeerThatNeverConnectsNamesIt) {
  World w(2, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(2, [&](int r) {
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    if (r == 0) {
      const int from[] = {1};
      const auto t0 = Clock::now();
      Status s = (*created)->WaitConnected({}, from, Deadline::AfterSeconds(1));
      EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
      EXPECT_NE(s.message().find("no connection from rank 1"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("directconnect"), std::string::npos) << s.message();
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
    }
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
}

// The open descriptors of this process.
size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// What a rank holds from creation does not grow with the ranks: 32 ranks linked to one another
// (31 ports each) create their transports with a listening socket each, not one per port and
// peer, and a ring of connections then costs a few descriptors per rank.
TEST(Transport, DescriptorsFollowTheConnectionsNotTheRanks) {
  constexpr int kRanks = 32;
  World w(kRanks, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  std::vector<std::unique_ptr<Transport>> t(kRanks);
  const size_t before = OpenDescriptors();
  OnEveryRank(kRanks, [&](int r) {
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    t[static_cast<size_t>(r)] = std::move(created).value();
  });
  const size_t created = OpenDescriptors();
  EXPECT_LE(created - before, size_t{2} * kRanks) << "descriptors per rank after creation";
  OnEveryRank(kRanks, [&](int r) {
    const int to[] = {(r + 1) % kRanks}, from[] = {(r + kRanks - 1) % kRanks};
    Status s = t[static_cast<size_t>(r)]->WaitConnected(to, from, Soon());
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
  const size_t ring = OpenDescriptors();
  std::printf("%d ranks: %zu descriptors after creation, %zu with a ring of connections\n", kRanks,
              created - before, ring - before);
  EXPECT_LE(ring - created, size_t{16} * kRanks) << "descriptors per rank for a ring of connections";
  t.clear();
}

TEST(Transport, LinkSpeedIsConvertedToBytes) {
  // A 2-rank ring written as a file, at 100 Gb/s and 3 us: LinkDesc wants GB/s.
  const std::string path = ::testing::TempDir() + "/transport-ring2.json";
  {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"name": "ring-2", "defaults": {"bandwidth_gbps": 100, "latency_us": 3},
"nodes": [{"name": "w0", "rank": 0, "ports": 1}, {"name": "w1", "rank": 1, "ports": 1}],
"links": [{"a": "w0:0", "b": "w1:0"}]})",
               f);
    std::fclose(f);
  }
  World w(2, "directconnect", path);
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(2, [&](int r) {
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    const LinkDesc& link = (*created)->link_row()[static_cast<size_t>(1 - r)];
    EXPECT_TRUE(link.reachable);
    EXPECT_DOUBLE_EQ(link.gbps, 12.5);
    EXPECT_DOUBLE_EQ(link.latency_us, 3.0);
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
}

TEST(Transport, ControlBuffersCarrySmallHostMessages) {
  World w(3, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(3, [&](int r) {
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 128}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Transport& t = **created;
    const int to = (r + 1) % 3, from = (r + 2) % 3;
    const int to_list[] = {to}, from_list[] = {from};
    ASSERT_TRUE(t.WaitConnected(to_list, from_list, Soon()).ok());
    Transport::Peer* out = t.peer(to);
    Transport::Peer* in = t.peer(from);
    ASSERT_TRUE(out != nullptr && in != nullptr);
    ASSERT_EQ(out->control_out.size(), 128u);
    ASSERT_EQ(in->control_in.size(), 128u);
    const std::string msg = fmt::format("header from rank {} to rank {}", r, to);
    std::memcpy(out->control_out.data(), msg.data(), msg.size());
    auto recv = in->recv->Recv(in->control_in.data(), in->control_in.size(), 1, in->recv_control);
    ASSERT_TRUE(recv.ok()) << recv.status().ToString();
    auto send = out->send->Send(out->control_out.data(), msg.size(), 1, out->send_control);
    ASSERT_TRUE(send.ok()) << send.status().ToString();
    ASSERT_TRUE(*recv != nullptr && *send != nullptr);
    Status s = WaitAll({in->recv.get(), out->send.get()}, {*recv, *send}, Soon());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(in->control_in.data())),
              fmt::format("header from rank {} to rank {}", from, r));
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
}

TEST(Transport, APeerThatNeverShowsUpIsATimeoutNamingIt) {
  World w(3, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  // Rank 2 exists (its bootstrap lives) but never calls Create.
  OnEveryRank(2, [&](int r) {
    const auto t0 = Clock::now();
    auto created = CreateOver(w.fabric(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256},
                                     Deadline::AfterSeconds(2));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), StatusCode::kTimeout) << created.status().ToString();
    EXPECT_NE(created.status().message().find("rank 2"), std::string::npos) << created.status().message();
    EXPECT_NE(created.status().message().find("directconnect"), std::string::npos) << created.status().message();
    EXPECT_LT(seconds, 3.0);
  });
}

TEST(Transport, AMalformedRecordFromAPeerIsRefusedNamingIt) {
  World w(2, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(2, [&](int r) {
    if (r == 1) {
      // Rank 1 takes part in the exchange with bytes that are not a connection record.
      const std::vector<uint8_t> garbage = {'n', 'o', 't', ' ', 'a', ' ', 'r', 'e', 'c', 'o', 'r', 'd'};
      EXPECT_TRUE(w.boot(1).AllGather(garbage, Soon()).ok());
      return;
    }
    auto created = CreateOver(w.fabric(0), w.boot(0), w.device(0), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << created.status().ToString();
    EXPECT_NE(created.status().message().find("malformed connection record from rank 1"), std::string::npos)
        << created.status().message();
  });
}

// A fabric whose connections never complete: Connect is always "in progress", Accept finds no one.
class StuckListen : public fabric::ListenComm {
 public:
  StuckListen(fabric::FabricDeviceProperties p, fabric::Handle h) : ListenComm(std::move(p), h) {}

 protected:
  Result<std::unique_ptr<fabric::RecvComm>> DoAccept() override { return std::unique_ptr<fabric::RecvComm>(); }
  Status DoWaitAcceptable(Deadline deadline) override {
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(deadline.Remaining(), std::chrono::milliseconds(1)));
    return Status::Ok();
  }
};

class StuckFabric : public fabric::Fabric {
 public:
  StuckFabric(const Config* config, fabric::FabricContext ctx) : Fabric("stuck", config, std::move(ctx)) {
    fabric::FabricDeviceProperties p;
    p.fabric = "stuck";
    p.name = "stuck0";
    devices_.push_back(p);
  }

 protected:
  Result<std::unique_ptr<fabric::ListenComm>> DoListen(int dev) override {
    auto h = fabric::Handle::FromBytes(std::vector<uint8_t>{1, 2, 3, 4});
    if (!h.ok()) return h.status();
    return std::unique_ptr<fabric::ListenComm>(new StuckListen(devices_[static_cast<size_t>(dev)], *h));
  }
  Result<std::unique_ptr<fabric::SendComm>> DoConnect(int, const fabric::Handle&) override {
    return std::unique_ptr<fabric::SendComm>();
  }
};

TEST(Transport, ConnectionsThatNeverCompleteAreATimeoutNamingThePeers) {
  World w(2, "directconnect", "full");  // for the bootstraps and devices only
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(2, [&](int r) {
    fabric::FabricContext ctx;
    ctx.rank = r;
    ctx.world_size = 2;
    StuckFabric stuck(&w.config, ctx);
    // Creation connects nobody, so it does not notice.
    auto created = CreateOver(stuck, w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    const auto t0 = Clock::now();
    Status connected = (*created)->ConnectAll(Deadline::AfterSeconds(1));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_FALSE(connected.ok());
    EXPECT_EQ(connected.code(), StatusCode::kTimeout) << connected.ToString();
    const std::string other = fmt::format("rank {}", 1 - r);
    EXPECT_NE(connected.message().find("no connection to " + other), std::string::npos) << connected.message();
    EXPECT_NE(connected.message().find("no connection from " + other), std::string::npos) << connected.message();
    EXPECT_NE(connected.message().find("stuck"), std::string::npos) << connected.message();
    EXPECT_LT(seconds, 2.0);
  });
}

TEST(Transport, RanksThatPassDifferentFabricListsAreRefusedNamingBoth) {
  World w(2, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  OnEveryRank(2, [&](int r) {
    // Rank 0 offers a second fabric that rank 1 does not pass.
    StuckFabric stuck(&w.config, w.Context(r));
    std::vector<fabric::Fabric*> list = {&w.fabric(r)};
    if (r == 0) list.push_back(&stuck);
    auto created = Transport::Create(list, w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_FALSE(created.ok());
    EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << created.status().ToString();
    EXPECT_NE(created.status().message().find("[directconnect, stuck]"), std::string::npos)
        << created.status().message();
    EXPECT_NE(created.status().message().find("[directconnect]"), std::string::npos) << created.status().message();
  });
}

TEST(Transport, BadArgumentsAreRefused) {
  World w(2, "directconnect", "full");
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  // The fabric of rank 1 with the bootstrap of rank 0.
  auto wrong = CreateOver(w.fabric(1), w.boot(0), w.device(0), TransportOptions{}, Soon());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument) << wrong.status().ToString();
  auto empty = CreateOver(w.fabric(0), w.boot(0), w.device(0), TransportOptions{0, 256}, Soon());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument) << empty.status().ToString();
  // No fabric, a null one, one fabric twice.
  auto none = Transport::Create({}, w.boot(0), w.device(0), TransportOptions{}, Soon());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().ToString();
  fabric::Fabric* const with_null[] = {&w.fabric(0), nullptr};
  auto null = Transport::Create(with_null, w.boot(0), w.device(0), TransportOptions{}, Soon());
  EXPECT_EQ(null.status().code(), StatusCode::kInvalidArgument) << null.status().ToString();
  EXPECT_NE(null.status().message().find("null"), std::string::npos) << null.status().message();
  fabric::Fabric* const twice[] = {&w.fabric(0), &w.fabric(0)};
  auto dup = Transport::Create(twice, w.boot(0), w.device(0), TransportOptions{}, Soon());
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument) << dup.status().ToString();
  EXPECT_NE(dup.status().message().find("listed twice"), std::string::npos) << dup.status().message();
}

TEST(Transport, OneRankHasNoPeers) {
  World w(1, "ofi", "", {"ofi:tcp"});
  if (w.status.code() == StatusCode::kUnavailable) GTEST_SKIP() << "ofi is not available here: " << w.status.ToString();
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  auto created = CreateOver(w.fabric(0), w.boot(0), w.device(0), TransportOptions{kStagingBytes, 256}, Soon());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ((*created)->peer(0), nullptr);
  EXPECT_EQ((*created)->staging_bytes(), kStagingBytes);
  EXPECT_FALSE((*created)->link_row()[0].reachable);
}

}  // namespace
}  // namespace kizuna::collectives
