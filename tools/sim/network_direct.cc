// Direct-connect networks given cable by cable (network.h: DirectSpec, Network::Direct), and the
// cables of an INA layout (LayoutCables). Kept apart from network.cc's generated shapes: these
// networks have no regular structure (no symmetries) and may hold aggregation devices, which are
// ranks of the plan after the workers.
#include <algorithm>
#include <map>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "collectives/ina/layout.h"
#include "fabric/directconnect/topology.h"
#include "tools/sim/network.h"

namespace kizuna::sim {
namespace {

std::string NodeName(const DirectSpec& s, int rank) {
  return rank < s.workers ? fmt::format("w{}", rank) : fmt::format("a{}", rank - s.workers);
}

std::string EndName(const DirectSpec& s, int rank, int port) {
  return port < 0 ? NodeName(s, rank) : fmt::format("{}:{}", NodeName(s, rank), port);
}

}  // namespace

void Network::OneWay(int from, int to, double gbps, double latency_us, std::string name) {
  out_[static_cast<size_t>(from)].push_back(static_cast<int>(links_.size()));
  in_[static_cast<size_t>(to)].push_back(static_cast<int>(links_.size()));
  links_.push_back({from, to, gbps, latency_us, std::move(name)});
}

Result<Network> Network::Direct(const DirectSpec& s) {
  // The topology file's limits (a node per worker and per device, 65536 in all).
  if (s.workers < 1 || s.devices < 0 || s.workers + s.devices < 2 || s.workers + s.devices > 65536)
    return InvalidArgument(fmt::format("kizuna-sim: {}: {} workers and {} devices: 2 to 65536 nodes, a worker or more",
                                       s.name, s.workers, s.devices));
  if (!(s.link_gbps > 0) || !(s.latency_us >= 0))
    return InvalidArgument(
        fmt::format("kizuna-sim: {}: bandwidths must be positive and latencies not negative", s.name));
  const int nodes = s.workers + s.devices;
  Network n;
  for (int r = 0; r < nodes; ++r) n.rank_node_.push_back(n.AddNode(NodeName(s, r)));
  // A port's sides, each carrying one cable: (rank, port, 0 transmit / 1 receive).
  std::unordered_set<uint64_t> taken;
  auto claim = [&](int rank, int port, int side) {
    if (port < 0) return true;
    return taken.insert((static_cast<uint64_t>(rank) << 32 | static_cast<uint64_t>(port)) * 2 + side).second;
  };
  // Bundles by (from, to), in the order their first cable comes.
  struct Bundle {
    double gbps = 0, latency_us = 0;
    int cables = 0;
    std::string name;
  };
  std::map<std::pair<int, int>, size_t> bundle_at;
  std::vector<std::pair<std::pair<int, int>, Bundle>> bundles;
  int simplex = 0;
  for (size_t i = 0; i < s.cables.size(); ++i) {
    const DirectCable& c = s.cables[i];
    const std::string what = fmt::format("kizuna-sim: {}: cable {}", s.name, i);
    if (c.a < 0 || c.a >= nodes || c.b < 0 || c.b >= nodes)
      return InvalidArgument(fmt::format("{}: ranks {} and {}: the network has {}", what, c.a, c.b, nodes));
    if (c.a == c.b) return InvalidArgument(fmt::format("{}: from {} to itself", what, NodeName(s, c.a)));
    if (!(c.gbps >= 0)) return InvalidArgument(fmt::format("{}: bandwidth {} GB/s", what, c.gbps));
    const double gbps = c.gbps > 0 ? c.gbps : s.link_gbps;
    const double latency = c.latency_us >= 0 ? c.latency_us : s.latency_us;
    const std::string a = EndName(s, c.a, c.a_port), b = EndName(s, c.b, c.b_port);
    if (!claim(c.a, c.a_port, 0) || !claim(c.b, c.b_port, 1) ||
        (!c.one_way && (!claim(c.b, c.b_port, 0) || !claim(c.a, c.a_port, 1))))
      return InvalidArgument(
          fmt::format("{} ({} {} {}): a port side that another cable uses", what, a, c.one_way ? "->" : "-", b));
    simplex += c.one_way ? 1 : 0;
    std::vector<std::pair<int, int>> directions{{c.a, c.b}};
    if (!c.one_way) directions.emplace_back(c.b, c.a);
    for (auto [from, to] : directions) {
      std::string name = from == c.a ? fmt::format("{}->{}", a, b) : fmt::format("{}->{}", b, a);
      if (!s.bundle) {
        n.OneWay(from, to, gbps, latency, std::move(name));
        continue;
      }
      auto [it, fresh] = bundle_at.try_emplace({from, to}, bundles.size());
      if (fresh) bundles.push_back({{from, to}, Bundle{0, 0, 0, std::move(name)}});
      Bundle& k = bundles[it->second].second;
      k.gbps += gbps;
      k.latency_us = std::max(k.latency_us, latency);
      ++k.cables;
    }
  }
  for (auto& [ends, k] : bundles) {
    if (k.cables > 1)
      k.name = fmt::format("{}->{} ({} cables)", NodeName(s, ends.first), NodeName(s, ends.second), k.cables);
    n.OneWay(ends.first, ends.second, k.gbps, k.latency_us, std::move(k.name));
  }
  n.description_ = fmt::format(
      "{}: {} workers and {} devices, {} cables ({} of them simplex circuits){}, {} GB/s and {} us each unless "
      "given",
      s.name, s.workers, s.devices, s.cables.size(), simplex, s.bundle ? ", parallel ones bundled" : "", s.link_gbps,
      s.latency_us);
  return n;
}

Result<DirectSpec> LayoutCables(const collectives::ina::Layout& layout, double gbps, double latency_us) {
  namespace ina = collectives::ina;
  KZ_RETURN_IF_ERROR(ina::Validate(layout).WithContext("kizuna-sim: the layout's cables"));
  DirectSpec s;
  s.name = fmt::format("ina-{}w-{}a", layout.workers, layout.aggregators);  // TopologyJson's name
  s.workers = layout.workers;
  s.devices = layout.aggregators;
  s.link_gbps = gbps;
  s.latency_us = latency_us;
  auto rank = [&](const ina::Node& v) { return v.aggregator() ? layout.workers + v.index : v.index; };
  for (const ina::Part& part : layout.parts) {
    if (part.kind == ina::PartKind::kRing) {
      // The ring's simplex circuits: each worker's port transmits to the next one's port.
      const size_t n = part.ring.size();
      for (size_t i = 0; i < n; ++i) {
        const size_t j = (i + 1) % n;
        s.cables.push_back({part.ring[i], part.ring[j], part.ring_ports[i], part.ring_ports[j], true});
      }
      continue;
    }
    // A tree's (or a line's) duplex cables, reduced over going up and broadcast over coming down.
    for (const ina::TreeEdge& e : part.edges)
      s.cables.push_back({rank(e.child), rank(e.parent), e.child_port, e.parent_port, false});
  }
  return s;
}

Result<DirectSpec> TopologyCables(const fabric::directconnect::Topology& topology, double gbps, double latency_us) {
  namespace dc = fabric::directconnect;
  DirectSpec s;
  s.name = topology.name.empty() ? "direct" : topology.name;
  s.workers = topology.worker_count();
  s.link_gbps = gbps;
  s.latency_us = latency_us;
  std::vector<int> rank(topology.nodes.size(), -1);
  for (size_t i = 0; i < topology.nodes.size(); ++i) {
    const dc::TopologyNode& node = topology.nodes[i];
    rank[i] = node.kind == dc::NodeKind::kWorker ? node.rank : s.workers + s.devices++;
  }
  for (const dc::TopologyLink& l : topology.links) {
    DirectCable c;
    c.a = rank[static_cast<size_t>(l.a.node)];
    c.b = rank[static_cast<size_t>(l.b.node)];
    c.a_port = l.a.port;
    c.b_port = l.b.port;
    c.gbps = l.bandwidth_gbps / 8;  // the file's gigabits per second (the fabric's shaper), here bytes
    c.latency_us = l.latency_us > 0 ? l.latency_us : -1;
    s.cables.push_back(c);
  }
  return s;
}

}  // namespace kizuna::sim
