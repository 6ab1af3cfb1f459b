// The modelled cluster of kizuna-sim: nodes (accelerators, hosts' internal switches, NICs,
// network switches), directed links with bandwidth and latency, and each pair of ranks' route.
//
// Shapes (docs/SIMULATOR.md):
//   switch      every rank on one switch, a link each
//   rails       hosts of P accelerators joined inside by a host switch (NVLink-like), k NICs per
//               host (accelerator i uses NIC i mod k, over PCIe), NIC j of every host on rail
//               switch j, the rail switches joined by a spine without oversubscription
//   rail-only   the same without the spine: traffic between rails crosses a host's switch first
//   full, torus2d, torus3d, ring
//               direct connect: rank to rank cables, no switch; traffic between ranks that share
//               no cable is forwarded by the ranks in between along shortest paths
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::sim {

struct NetworkSpec {
  std::string kind = "switch";
  int ranks = 8;                          // switch, full, ring; the others derive it
  int hosts = 1, per_host = 8, nics = 1;  // rails, rail-only
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

class Network {
 public:
  static Result<Network> Build(const NetworkSpec& spec);

  int ranks() const { return static_cast<int>(rank_node_.size()); }
  const std::vector<Link>& links() const { return links_; }
  const std::string& description() const { return description_; }
  // The links from rank a's node to rank b's, a shortest path (fewest links); equal paths are
  // spread by the pair (a + b picks among the equally short first links).
  // Computed on first use and kept (a plan uses few of the p^2 pairs); not thread-safe.
  const std::vector<int>& Route(int a, int b) const;
  // Sum of the route's latencies, seconds.
  double RouteLatency(int a, int b) const;
  // The route's slowest link (GB/s; 0 when there is no route) and summed latency (seconds),
  // without keeping the route: for the cost model's view of every pair.
  std::pair<double, double> RouteSummary(int a, int b) const;

 private:
  struct Path {
    std::vector<int> links;
    double latency = 0;
  };
  int AddNode(std::string name);
  void Cable(int a, int b, double gbps, double latency_us);  // both directions
  const Path& PathOf(int a, int b) const;
  // Calls hop(link) along a's route to b; false when there is none.
  template <typename Hop>
  bool Walk(int a, int b, Hop&& hop) const;
  // Hops from every node to rank b's node, following links forward (-1: unreachable).
  const std::vector<int>& DistanceTo(int b) const;

  std::vector<std::string> node_names_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_, in_;  // node -> outgoing, incoming links
  std::vector<int> rank_node_;
  mutable std::unordered_map<uint64_t, Path> paths_;            // by a * ranks + b
  mutable std::unordered_map<int, std::vector<int>> distance_;  // by destination rank
  std::string description_;
};

}  // namespace kizuna::sim
