// KIZUNA_TOPOLOGY as a generator spec ("full", "ring:4", "torus2d:2x2"): the factory builds the
// topology instead of reading a file; "full" links only the ranks of one host when the hosts of the
// ranks are known; a file of the same name still wins; bad specs name the value and the accepted
// forms.
#include <unistd.h>

#include <climits>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/directconnect/fabric.h"
#include "fabric/directconnect/topology.h"
#include "fabric/fabric.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::directconnect {
namespace {

FabricContext RankOf(int rank, int world_size) {
  FabricContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  ctx.local_rank = rank;
  return ctx;
}

Result<std::unique_ptr<Fabric>> CreateWith(const std::string& topology, const FabricContext& ctx) {
  static Config* config = new Config();  // fabrics keep a pointer to it; it outlives them all
  config->timeout_s = 10;
  config->topology = topology;
  return DirectConnectFabric::Create(*config, ctx);
}

// link_peer.rank of every port, in port order (-1 for an unconnected port).
std::vector<int> PeerRanks(const Fabric& fabric) {
  std::vector<int> ranks;
  for (int d = 0; d < fabric.device_count(); ++d) {
    auto p = fabric.properties(d);
    EXPECT_TRUE(p.ok());
    if (!p.ok()) continue;
    EXPECT_TRUE(p->point_to_point);
    EXPECT_EQ(p->speed_gbps, 0.0);  // generated links have unknown bandwidth and latency
    EXPECT_EQ(p->latency_us, 0.0);
    ranks.push_back(p->link_peer ? p->link_peer->rank : -1);
  }
  return ranks;
}

TEST(GeneratedTopology, FullSpansTheWorldSize) {
  auto f = CreateWith("full", RankOf(1, 4));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->device_count(), 3);
  EXPECT_EQ(PeerRanks(**f), (std::vector<int>{0, 2, 3}));
  auto* dc = static_cast<DirectConnectFabric*>(f->get());
  EXPECT_FALSE(dc->topology().shaping);
  EXPECT_EQ(dc->topology().worker_count(), 4);
  EXPECT_NE(dc->topology().Describe().find("KIZUNA_TOPOLOGY=full"), std::string::npos) << dc->topology().Describe();

  // An explicit size wins over the world size.
  auto eight = CreateWith("full:8", RankOf(1, 4));
  ASSERT_TRUE(eight.ok()) << eight.status().ToString();
  EXPECT_EQ(PeerRanks(**eight), (std::vector<int>{0, 2, 3, 4, 5, 6, 7}));
}

FabricContext OnHosts(int rank, std::vector<std::string> rank_hosts) {
  FabricContext ctx = RankOf(rank, static_cast<int>(rank_hosts.size()));
  ctx.host_id = rank_hosts[static_cast<size_t>(rank)];
  ctx.rank_hosts = std::move(rank_hosts);
  return ctx;
}

TEST(GeneratedTopology, FullLinksOnlyTheRanksOfOneHost) {
  // Ranks 0, 1 on host A, 2, 3 on host B: one clique per host, ranks keep their numbers.
  const std::vector<std::string> hosts = {"A", "A", "B", "B"};
  auto r0 = CreateWith("full", OnHosts(0, hosts));
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  EXPECT_EQ(PeerRanks(**r0), (std::vector<int>{1}));
  EXPECT_EQ((*r0)->properties(0)->link_peer->port, 0);
  auto r2 = CreateWith("full", OnHosts(2, hosts));
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(PeerRanks(**r2), (std::vector<int>{3}));
  EXPECT_EQ((*r2)->properties(0)->name, "w2:port0");
  auto* dc = static_cast<DirectConnectFabric*>(r2->get());
  EXPECT_EQ(dc->topology().worker_count(), 4);
  EXPECT_EQ(dc->topology().links.size(), 2u);
  EXPECT_NE(dc->topology().Describe().find("KIZUNA_TOPOLOGY=full"), std::string::npos) << dc->topology().Describe();

  // Hosts interleaved: a host's ranks in rank order, port j to the j-th other rank of the host.
  const std::vector<std::string> mixed = {"A", "B", "A", "B", "A"};
  auto r2m = CreateWith("full", OnHosts(2, mixed));
  ASSERT_TRUE(r2m.ok()) << r2m.status().ToString();
  EXPECT_EQ(PeerRanks(**r2m), (std::vector<int>{0, 4}));
  auto r3m = CreateWith("full", OnHosts(3, mixed));
  ASSERT_TRUE(r3m.ok()) << r3m.status().ToString();
  EXPECT_EQ(PeerRanks(**r3m), (std::vector<int>{1}));
}

TEST(GeneratedTopology, ARankAloneOnItsHostHasOneUnconnectedPort) {
  // A node needs at least one port; the lone rank's port has no cable and serves no one.
  const std::vector<std::string> hosts = {"A", "A", "B"};
  auto lone = CreateWith("full", OnHosts(2, hosts));
  ASSERT_TRUE(lone.ok()) << lone.status().ToString();
  EXPECT_EQ(PeerRanks(**lone), (std::vector<int>{-1}));
  auto r1 = CreateWith("full", OnHosts(1, hosts));
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(PeerRanks(**r1), (std::vector<int>{0}));
  // Every rank on its own host: still a valid topology, with no links at all.
  auto apart = CreateWith("full", OnHosts(0, {"A", "B"}));
  ASSERT_TRUE(apart.ok()) << apart.status().ToString();
  EXPECT_EQ(PeerRanks(**apart), (std::vector<int>{-1}));
}

TEST(GeneratedTopology, FullOnOneKnownHostIsTheFullTopology) {
  auto known = CreateWith("full", OnHosts(1, {"A", "A", "A", "A"}));
  auto unknown = CreateWith("full", RankOf(1, 4));
  ASSERT_TRUE(known.ok() && unknown.ok());
  EXPECT_EQ(PeerRanks(**known), PeerRanks(**unknown));
  EXPECT_EQ(static_cast<DirectConnectFabric*>(known->get())->topology().Fingerprint(),
            static_cast<DirectConnectFabric*>(unknown->get())->topology().Fingerprint());
  // An explicit size ignores the hosts in its shape, and its cables to another host are a
  // network fabric's to carry (fabric/tcp, "Cables"): here those ports stay unconnected.
  auto sized = CreateWith("full:4", OnHosts(0, {"A", "A", "B", "B"}));
  ASSERT_TRUE(sized.ok()) << sized.status().ToString();
  EXPECT_EQ(PeerRanks(**sized), (std::vector<int>{1, -1, -1}));
  EXPECT_EQ((*sized)->device_count(), 3);
}

TEST(GeneratedTopology, HostsThatDoNotMatchTheWorldAreRefused) {
  FabricContext ctx = RankOf(0, 4);
  ctx.rank_hosts = {"A", "A", "B"};
  auto f = CreateWith("full", ctx);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
  EXPECT_NE(f.status().message().find("hosts of 3 ranks, the world has 4"), std::string::npos) << f.status().message();
  ctx.rank_hosts = {"A", "", "B", "B"};
  auto empty = CreateWith("full", ctx);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument) << empty.status().ToString();
  EXPECT_NE(empty.status().message().find("rank 1 an empty host id"), std::string::npos) << empty.status().message();
}

TEST(GeneratedTopology, Ring) {
  // Port 0 of wi goes to w(i+1), port 1 to w(i-1).
  auto f = CreateWith("ring:4", RankOf(1, 4));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PeerRanks(**f), (std::vector<int>{2, 0}));
  auto by_world = CreateWith("ring", RankOf(0, 5));
  ASSERT_TRUE(by_world.ok()) << by_world.status().ToString();
  EXPECT_EQ(PeerRanks(**by_world), (std::vector<int>{1, 4}));
}

TEST(GeneratedTopology, Torus) {
  // 2x2: rank = x + 2y. Rank 0 = (0,0): ports 0/1 (x +1/-1) reach rank 1, ports 2/3 (y) rank 2.
  auto f = CreateWith("torus2d:2x2", RankOf(0, 4));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(PeerRanks(**f), (std::vector<int>{1, 1, 2, 2}));
  auto r3 = CreateWith("torus2d:2x2", RankOf(3, 4));
  ASSERT_TRUE(r3.ok()) << r3.status().ToString();
  EXPECT_EQ(PeerRanks(**r3), (std::vector<int>{2, 2, 1, 1}));
  auto cube = CreateWith("torus3d:2x2x2", RankOf(7, 8));
  ASSERT_TRUE(cube.ok()) << cube.status().ToString();
  EXPECT_EQ((*cube)->device_count(), 6);
}

TEST(GeneratedTopology, BadSpecsNameTheValueAndTheForms) {
  for (const char* spec : {"bogus", "ring:0", "ring:abc", "ring:1", "full:", "torus2d", "torus2d:4", "torus3d:2x2",
                           "torus2d:2xx2", "ocs"}) {
    auto f = CreateWith(spec, RankOf(0, 4));
    ASSERT_FALSE(f.ok()) << spec;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << spec << ": " << f.status().ToString();
    EXPECT_NE(f.status().message().find(std::string("\"") + spec + "\""), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find("torus2d:XxY"), std::string::npos) << f.status().message();
  }
  // A value that can only be a path is read as a file, and its error says so.
  auto missing = CreateWith("/nonexistent/topology.json", RankOf(0, 4));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("KIZUNA_TOPOLOGY file /nonexistent/topology.json: cannot open"),
            std::string::npos)
      << missing.status().message();
  // A file that never ends is refused at the cap: read whole, /dev/zero grew a rank to ~12 GB until
  // the OOM killer ended it.
  auto endless = CreateWith("/dev/zero", RankOf(0, 4));
  ASSERT_FALSE(endless.ok());
  EXPECT_EQ(endless.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(endless.status().message(), "KIZUNA_TOPOLOGY file /dev/zero: larger than 16 MiB");
  // A rank beyond an explicitly sized topology is the same error as for a file.
  auto beyond = CreateWith("ring:4", RankOf(5, 6));
  EXPECT_EQ(beyond.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find("rank 5 has no node"), std::string::npos) << beyond.status().message();
  // A world of one rank has nothing to link: the fabric is unavailable here, not misconfigured.
  auto alone = CreateWith("full", RankOf(0, 1));
  EXPECT_EQ(alone.status().code(), StatusCode::kUnavailable) << alone.status().ToString();
}

TEST(GeneratedTopology, AFileOfTheSameNameWins) {
  char cwd[PATH_MAX];
  ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
  const std::string dir = ::testing::TempDir();
  ASSERT_EQ(::chdir(dir.c_str()), 0) << dir;
  {
    auto ring = GenerateRing(4, LinkParams{25, 2});
    ASSERT_TRUE(ring.ok());
    std::ofstream out("full");
    out << TopologyToJson(*ring);
  }
  auto f = CreateWith("full", RankOf(1, 4));
  ::unlink("full");
  ASSERT_EQ(::chdir(cwd), 0);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->device_count(), 2);  // the ring in the file, not the fully connected generator
  EXPECT_EQ((*f)->properties(0)->speed_gbps, 25.0);
}

TEST(GeneratedTopology, RanksOfAGeneratedTopologyConnect) {
  // Every rank generates the same topology independently: their handles must agree on it.
  auto a = CreateWith("full", RankOf(0, 3));
  auto b = CreateWith("full", RankOf(2, 3));
  ASSERT_TRUE(a.ok() && b.ok());
  // Rank 0's port 1 goes to rank 2; rank 2's port 0 goes to rank 0.
  ASSERT_EQ((*a)->properties(1)->link_peer->rank, 2);
  auto listen = (*b)->Listen(0);
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  auto send = (*a)->Connect(1, (*listen)->handle(), Deadline::AfterSeconds(10));
  ASSERT_TRUE(send.ok()) << send.status().ToString();
  auto recv = (*listen)->Accept(Deadline::AfterSeconds(10));
  ASSERT_TRUE(recv.ok()) << recv.status().ToString();
}

TEST(GeneratedTopology, RanksOfAPerHostTopologyConnect) {
  // Ranks 2 and 3 share host B: each generates the per-host topology on its own, and they connect.
  const std::vector<std::string> hosts = {"A", "A", "B", "B"};
  auto a = CreateWith("full", OnHosts(2, hosts));
  auto b = CreateWith("full", OnHosts(3, hosts));
  ASSERT_TRUE(a.ok() && b.ok());
  auto listen = (*b)->Listen(0);
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  auto send = (*a)->Connect(0, (*listen)->handle(), Deadline::AfterSeconds(10));
  ASSERT_TRUE(send.ok()) << send.status().ToString();
  auto recv = (*listen)->Accept(Deadline::AfterSeconds(10));
  ASSERT_TRUE(recv.ok()) << recv.status().ToString();
}

}  // namespace
}  // namespace kizuna::fabric::directconnect
