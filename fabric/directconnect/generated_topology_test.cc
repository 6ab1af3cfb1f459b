// KIZUNA_TOPOLOGY as a generator spec ("full", "ring:4", "torus2d:2x2"): the factory builds the
// topology instead of reading a file; a file of the same name still wins; bad specs name the value
// and the accepted forms.
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
#include "runtime/config.h"
#include "runtime/status.h"

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
  EXPECT_NE(missing.status().message().find("cannot read topology file /nonexistent/topology.json"), std::string::npos)
      << missing.status().message();
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

}  // namespace
}  // namespace kizuna::fabric::directconnect
