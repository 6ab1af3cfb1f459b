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
  const std::vector<int>& Route(int a, int b) const;
  // Sum of the route's latencies, seconds.
  double RouteLatency(int a, int b) const;

 private:
  int AddNode(std::string name);
  void Cable(int a, int b, double gbps, double latency_us);  // both directions
  void ComputeRoutes();

  std::vector<std::string> node_names_;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;  // node -> outgoing links
  std::vector<int> rank_node_;
  std::vector<std::vector<int>> routes_;  // [a * ranks + b]
  std::vector<double> route_latency_;
  std::string description_;
};

}  // namespace kizuna::sim
