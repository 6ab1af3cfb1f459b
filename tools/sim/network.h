// The modelled cluster of kizuna-sim: nodes (accelerators, hosts' internal switches, NICs,
// network switches), directed links with bandwidth and latency, and each pair of ranks' route.
//
// Shapes (docs/SIMULATOR.md):
//   switch      every rank on one switch, a link each
//   rails       hosts of P accelerators joined inside by a host switch (NVLink-like), k NICs per
//               host (accelerator i uses NIC i mod k, over PCIe), NIC j of every host on rail
//               switch j, the rail switches joined by a spine without oversubscription
//   rail-only   the same without the spine: traffic between rails crosses a host's switch first
//   fat-tree    hosts as in rails, all k NICs of a host on one leaf switch with the NICs of the
//               leaf's other hosts, every leaf cabled to every spine; the uplinks carry the leaf's
//               host-facing bandwidth divided by the oversubscription
//   full, torus2d, torus3d, ring
//               direct connect: rank to rank cables, no switch; traffic between ranks that share
//               no cable is forwarded by the ranks in between along shortest paths
//   direct      (Network::Direct, network_direct.cc) any direct-connect network given cable by
//               cable, with aggregation devices as ranks after the workers: an optical circuit
//               switch's port map, such as an INA layout's (LayoutCables)
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/core/status.h"
#include "tools/sim/symmetry.h"

namespace kizuna::collectives::ina {
struct Layout;  // collectives/ina/layout.h
}
namespace kizuna::fabric::directconnect {
class Topology;  // fabric/directconnect/topology.h
}

namespace kizuna::sim {

struct NetworkSpec {
  std::string kind = "switch";
  int ranks = 8;                          // switch, full, ring; the others derive it
  int hosts = 1, per_host = 8, nics = 1;  // rails, rail-only, fat-tree
  int leaf_hosts = 4;                     // fat-tree: hosts on a leaf switch
  int spines = 0;                         // fat-tree: spine switches (0: as many as NICs per host)
  double oversubscription = 1;            // fat-tree: a leaf's host-facing bandwidth / its uplinks'
  std::vector<int> dims;                  // torus2d (2), torus3d (3)
  double link_gbps = 25;                  // network links (GB/s per direction)
  double latency_us = 2;                  // per network link
  double intra_gbps = 400;                // rails: accelerator to its host switch
  double pcie_gbps = 50;                  // rails: accelerator to its NIC
  double intra_latency_us = 0.5;
};

struct Link {
  int from = 0, to = 0;  // nodes
  double gbps = 0, latency_us = 0;
  std::string name;  // "r3->sw", "h0.nic1->rail1", ...
};

// A direct-connect network cable by cable (Network::Direct). Its ranks are the workers 0..W-1,
// then the devices W..W+D-1 (an INA plan's aggregation devices, Plan::aggregators), named w<i>
// and a<j> as in the direct-connect topology file. A port's transmit and receive sides are
// separate: a duplex cable joins two ports both ways, a simplex circuit one port's transmit side
// to another's receive side (an optical circuit switch can do either; layout.h).
struct DirectCable {
  int a = 0, b = 0;              // ranks
  int a_port = -1, b_port = -1;  // its ports (names; a port side carries one cable); -1: not given
  bool one_way = false;          // a simplex circuit from a to b
  double gbps = 0;               // per direction; 0: DirectSpec::link_gbps
  double latency_us = -1;        // < 0: DirectSpec::latency_us
};
struct DirectSpec {
  std::string name = "direct";
  int workers = 0, devices = 0;
  double link_gbps = 25, latency_us = 2;
  std::vector<DirectCable> cables;
  // Parallel cables from one node to another (same direction) as one link of their summed
  // bandwidth and their largest latency. A route takes one link per pair, so without bundling a
  // pair's flows all take one of its cables; bundled, they share all of them, as the flows of a
  // transport that stripes a pair's channels over its ports would.
  bool bundle = false;
};
// The cables of an INA layout, exactly the links of its topology file (ina::TopologyJson, which
// the engine hands the direct-connect fabric): a tree's edge a duplex cable between the two
// ports, a ring's hop a simplex circuit from one worker's port to the next one's; every cable at
// `gbps` and `latency_us`. kInvalidArgument for a layout that does not validate.
Result<DirectSpec> LayoutCables(const collectives::ina::Layout& layout, double gbps, double latency_us);
// The cables of a direct-connect topology file (fabric/directconnect/topology.h: `kizuna-topo
// --generate`'s rings, tori and OCS port maps, or a hand-written one), each link a duplex cable
// between its two ports, at the link's bandwidth (the file's Gb/s as GB/s) and latency where the
// file gives them and at `gbps` (GB/s) and `latency_us` where it does not; workers by rank, then
// the aggregation devices.
Result<DirectSpec> TopologyCables(const fabric::directconnect::Topology& topology, double gbps, double latency_us);

class Network {
 public:
  static Result<Network> Build(const NetworkSpec& spec);
  // A direct-connect network from its cables (network_direct.cc). kInvalidArgument naming the
  // cable: a rank out of range, a cable from a node to itself, a port side used twice, a
  // bandwidth not positive or a latency negative.
  static Result<Network> Direct(const DirectSpec& spec);

  int ranks() const { return static_cast<int>(rank_node_.size()); }
  const std::vector<Link>& links() const { return links_; }
  const std::string& description() const { return description_; }
  // The links from rank a's node to rank b's, a shortest path (fewest links): on a torus
  // dimension by dimension, elsewhere equal paths spread by the pair (a + b picks among them).
  // Computed on first use and kept (a plan uses few of the p^2 pairs); not thread-safe.
  const std::vector<int>& Route(int a, int b) const;
  // Sum of the route's latencies, seconds.
  double RouteLatency(int a, int b) const;
  // The route's slowest link (GB/s; 0 when there is no route) and summed latency (seconds),
  // without keeping the route: for the cost model's view of every pair.
  std::pair<double, double> RouteSummary(int a, int b) const;

  // The relabellings of blocks of ranks that map this network onto itself, node for node and link
  // for link: a rails cluster's hosts shifted (and XORed when their number is a power of two), a
  // torus's ranks shifted along its dimensions, the ranks of a switch or a full mesh shifted or
  // XORed, a ring's rotated. Simulating one block then stands for all (symmetry.h).
  const std::vector<RankGroup>& Symmetries() const { return symmetries_; }
  // Node v, link l moved by element e of one of Symmetries().
  int NodeImage(const RankGroup& g, int e, int v) const;
  int LinkImage(const RankGroup& g, int e, int l) const;
  // Each link's orbit under g: its smallest member (`canon`) and how many links it has (`size`).
  struct Orbits {
    std::vector<int> canon, size;
  };
  Orbits LinkOrbits(const RankGroup& g) const;

 private:
  struct Path {
    std::vector<int> links;
    double latency = 0;
  };
  int AddNode(std::string name);
  void Cable(int a, int b, double gbps, double latency_us);  // both directions

  // One direction only (Direct's links: a simplex circuit, or a bundle).
  void OneWay(int from, int to, double gbps, double latency_us, std::string name);
  const Path& PathOf(int a, int b) const;
  // a's route to b, in order; false when there is none.
  bool Links(int a, int b, std::vector<int>* out) const;
  // Hops from rank a's node to every node, following links forward (-1: unreachable).
  const std::vector<int>& DistanceFrom(int a) const;

  std::vector<std::string> node_names_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_, in_;  // node -> outgoing, incoming links
  std::vector<int> rank_node_;
  // Symmetry: each node's block (-1: a node no relabelling moves, such as a rail switch) and its
  // index among its block's nodes; each block's nodes; links by (from, to).
  void SetBlocks(const std::vector<int>& node_block);
  std::vector<int> node_block_, node_local_;
  std::vector<std::vector<int>> block_nodes_;
  std::unordered_map<uint64_t, int> link_at_;
  std::vector<RankGroup> symmetries_;
  std::vector<int> torus_dims_;                                 // a torus's: routes go dimension by dimension
  mutable std::unordered_map<uint64_t, Path> paths_;            // by a * ranks + b
  mutable std::unordered_map<int, std::vector<int>> distance_;  // by source rank
  std::string description_;
};

}  // namespace kizuna::sim
