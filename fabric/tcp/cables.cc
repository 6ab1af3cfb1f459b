#include "fabric/tcp/cables.h"

#include <sys/stat.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fabric/directconnect/topology.h"

namespace kizuna::fabric::tcp {
namespace {

using directconnect::PortRef;
using directconnect::Topology;

// A node's rank: its own (workers), else the one the job gave its name (aggregation devices run
// as ranks of their own), else -1.
int RankOf(const Topology& t, int node, const FabricContext& context) {
  const auto& n = t.nodes[static_cast<size_t>(node)];
  if (n.rank >= 0) return n.rank;
  const auto it = context.node_ranks.find(n.name);
  return it == context.node_ranks.end() ? -1 : it->second;
}

const std::string* HostOf(int rank, const FabricContext& context) {
  if (rank < 0 || static_cast<size_t>(rank) >= context.rank_hosts.size()) return nullptr;
  return &context.rank_hosts[static_cast<size_t>(rank)];
}

// The node's ports whose cable ends at a rank on another host, in port order: its tcp devices.
std::vector<int> CrossHostPorts(const Topology& t, int node, const FabricContext& context) {
  std::vector<int> out;
  const std::string* host = HostOf(RankOf(t, node, context), context);
  if (host == nullptr) return out;
  for (int port = 0; port < t.nodes[static_cast<size_t>(node)].ports; ++port) {
    const auto peer = t.PeerOf(PortRef{node, port});
    if (!peer) continue;
    const std::string* other = HostOf(RankOf(t, peer->node, context), context);
    if (other != nullptr && *other != *host) out.push_back(port);
  }
  return out;
}

// The node's cross-host ports grouped by the rank at their other end, in order of each group's first
// port: the node's tcp devices.
std::vector<std::vector<int>> Bundles(const Topology& t, int node, const FabricContext& context) {
  std::vector<std::vector<int>> out;
  std::vector<int> to;
  for (int port : CrossHostPorts(t, node, context)) {
    const int rank = RankOf(t, t.PeerOf(PortRef{node, port})->node, context);
    const auto at = std::find(to.begin(), to.end(), rank);
    if (at == to.end()) {
      to.push_back(rank);
      out.push_back({port});
    } else {
      out[static_cast<size_t>(at - to.begin())].push_back(port);
    }
  }
  return out;
}

// Where `port` is in `bundles`: {bundle, place in it}.
std::pair<int, int> PlaceOf(const std::vector<std::vector<int>>& bundles, int port) {
  for (size_t b = 0; b < bundles.size(); ++b)
    for (size_t i = 0; i < bundles[b].size(); ++i)
      if (bundles[b][i] == port) return {static_cast<int>(b), static_cast<int>(i)};
  return {-1, -1};
}

// The topology the setting names where it describes cables this fabric may carry: a file, or a
// generator with its shape ("torus2d:2x2", "ring:6"). Shapeless generators ("full", "ring") span
// the world's ranks of one host, which directconnect serves alone.
Result<std::optional<Topology>> TopologyOf(const std::string& value) {
  struct stat st {};
  if (::stat(value.c_str(), &st) == 0 || value.find('/') != std::string::npos || value.ends_with(".json")) {
    KZ_ASSIGN_OR_RETURN(Topology t, directconnect::LoadTopology(value, "KIZUNA_TOPOLOGY file"));
    return std::optional<Topology>(std::move(t));
  }
  const size_t colon = value.find(':');
  if (colon == std::string::npos) return std::optional<Topology>();
  auto t = directconnect::GenerateNamed(value.substr(0, colon), value.substr(colon + 1), {});
  if (!t.ok()) return std::optional<Topology>();  // directconnect names what is wrong with it
  return std::optional<Topology>(std::move(*t));
}

}  // namespace

Result<std::vector<CablePort>> CablePorts(const Config& config, const FabricContext& context) {
  std::vector<CablePort> out;
  if (config.topology.empty() || context.rank_hosts.empty()) return out;
  KZ_ASSIGN_OR_RETURN(std::optional<Topology> topology, TopologyOf(config.topology));
  if (!topology) return out;
  const Topology& t = *topology;
  const int me = context.node.empty() ? t.WorkerForRank(context.rank) : t.FindNode(context.node);
  if (me < 0) return out;
  const std::vector<std::vector<int>> mine = Bundles(t, me, context);
  for (int port : CrossHostPorts(t, me, context)) {
    const PortRef peer = *t.PeerOf(PortRef{me, port});
    const auto [bundle, cable] = PlaceOf(mine, port);
    const auto [peer_bundle, peer_cable] = PlaceOf(Bundles(t, peer.node, context), peer.port);
    const auto* link = t.LinkAt(PortRef{me, port});
    CablePort c;
    c.node = t.nodes[static_cast<size_t>(me)].name;
    c.port = port;
    c.interface = t.nodes[static_cast<size_t>(me)].InterfaceOf(port);
    c.peer = LinkPeer{t.nodes[static_cast<size_t>(peer.node)].name, RankOf(t, peer.node, context), peer_bundle};
    c.bundle = bundle;
    c.cable = cable;
    c.peer_cable = peer_cable;
    c.bandwidth_gbps = link->bandwidth_gbps;
    c.latency_us = link->latency_us;
    c.topology = t.Describe();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace kizuna::fabric::tcp
