// The INA layout's topology file (collectives/ina/layout.h, TopologyJson) read by the
// direct-connect fabric's own parser: every cable a link, ports mapped as layout.h says. It lives
// here, with the end-to-end tests, because collectives/ must not depend on a fabric backend.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "collectives/ina/layout.h"
#include "collectives/ina/planner.h"
#include "collectives/ina/test_layouts.h"
#include "fabric/directconnect/topology.h"

namespace kizuna::collectives::ina {
namespace {

using testing::Mixed;
using testing::Planned;

TEST(InaTopology, TopologyJsonIsADirectConnectTopology) {
  for (const Layout& l :
       {Planned(16, 4, 8, 8), Planned(16, 24, 8, 8), Planned(6, 1, 3, 4), Planned(5, 3, 4, 3), Mixed()}) {
    const std::string text = TopologyJson(l, 100, 1.5, true);
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    size_t cables = 0;
    for (const Part& p : l.parts) cables += p.kind == PartKind::kRing ? p.ring.size() : p.edges.size();
    EXPECT_EQ(j["nodes"].size(), static_cast<size_t>(l.workers + l.aggregators));
    EXPECT_EQ(j["links"].size(), cables);
    EXPECT_EQ(j["shaping"], true);
    EXPECT_EQ(j["defaults"]["bandwidth_gbps"], 100);
    // The direct-connect fabric's own parser accepts it: ports in range, each used once.
    auto topo = fabric::directconnect::ParseTopology(text, "ina.json");
    ASSERT_TRUE(topo.ok()) << topo.status().ToString() << "\n" << text;
    EXPECT_EQ(topo->worker_count(), l.workers);
    EXPECT_EQ(topo->links.size(), cables);
    EXPECT_TRUE(topo->shaping);
    for (const auto& link : topo->links) {
      EXPECT_EQ(link.bandwidth_gbps, 100);
      EXPECT_EQ(link.latency_us, 1.5);
    }
    EXPECT_EQ(topo->nodes[static_cast<size_t>(topo->WorkerForRank(3))].name, "w3");
    // The port map of layout.h: a worker has 2D ports; its port p is 2p for a duplex cable or a
    // ring's transmit side and 2p+1 for a ring's receive side; a device's ports are its own.
    using fabric::directconnect::PortRef;
    auto ref = [&](const Node& n, int port) {
      return PortRef{topo->FindNode(n.Name()), port};
    };
    for (const Node& w : {Node::Worker(0), Node::Worker(l.workers - 1)})
      EXPECT_EQ(topo->nodes[static_cast<size_t>(ref(w, 0).node)].ports, 2 * l.worker_ports);
    for (const Part& p : l.parts) {
      for (size_t i = 0; i < p.ring.size(); ++i) {
        const size_t next = (i + 1) % p.ring.size();
        const auto peer = topo->PeerOf(ref(Node::Worker(p.ring[i]), 2 * p.ring_ports[i]));
        ASSERT_TRUE(peer.has_value());
        EXPECT_EQ(*peer, ref(Node::Worker(p.ring[next]), 2 * p.ring_ports[next] + 1));
      }
      for (const TreeEdge& e : p.edges) {
        auto port = [&](const Node& n, int q) { return ref(n, n.aggregator() ? q : 2 * q); };
        const auto peer = topo->PeerOf(port(e.child, e.child_port));
        ASSERT_TRUE(peer.has_value());
        EXPECT_EQ(*peer, port(e.parent, e.parent_port));
      }
    }
  }
  // Unknown speeds: no defaults at all.
  const std::string plain = TopologyJson(Planned(8, 0, 2, 8), 0, 0, false);
  EXPECT_EQ(plain.find("defaults"), std::string::npos);
  EXPECT_TRUE(fabric::directconnect::ParseTopology(plain, "plain.json").ok());
}

}  // namespace
}  // namespace kizuna::collectives::ina
