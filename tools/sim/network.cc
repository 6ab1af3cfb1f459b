#include "tools/sim/network.h"

#include <algorithm>
#include <deque>

#include <fmt/format.h>

namespace kizuna::sim {

int Network::AddNode(std::string name) {
  node_names_.push_back(std::move(name));
  out_.emplace_back();
  in_.emplace_back();
  return static_cast<int>(node_names_.size()) - 1;
}

void Network::Cable(int a, int b, double gbps, double latency_us) {
  for (auto [x, y] : {std::pair(a, b), std::pair(b, a)}) {
    out_[static_cast<size_t>(x)].push_back(static_cast<int>(links_.size()));
    in_[static_cast<size_t>(y)].push_back(static_cast<int>(links_.size()));
    links_.push_back({x, y, gbps, latency_us,
                      fmt::format("{}->{}", node_names_[static_cast<size_t>(x)], node_names_[static_cast<size_t>(y)])});
  }
}

Result<Network> Network::Build(const NetworkSpec& s) {
  Network n;
  if (s.link_gbps <= 0 || s.latency_us < 0 || s.intra_gbps <= 0 || s.pcie_gbps <= 0)
    return InvalidArgument("kizuna-sim: bandwidths must be positive and latencies not negative");
  if (s.kind == "switch" || s.kind == "ring" || s.kind == "full") {
    if (s.ranks < 2 || s.ranks > 65536) return InvalidArgument("kizuna-sim: --ranks must be 2 to 65536");
    for (int r = 0; r < s.ranks; ++r) n.rank_node_.push_back(n.AddNode(fmt::format("r{}", r)));
    if (s.kind == "switch") {
      const int sw = n.AddNode("sw");
      for (int r = 0; r < s.ranks; ++r) n.Cable(r, sw, s.link_gbps, s.latency_us);
      n.description_ =
          fmt::format("{} ranks on one switch, {} GB/s and {} us per link", s.ranks, s.link_gbps, s.latency_us);
    } else if (s.kind == "full") {
      for (int a = 0; a < s.ranks; ++a)
        for (int b = a + 1; b < s.ranks; ++b) n.Cable(a, b, s.link_gbps, s.latency_us);
      n.description_ = fmt::format("{} ranks, a cable between every pair, {} GB/s and {} us each", s.ranks, s.link_gbps,
                                   s.latency_us);
    } else {
      for (int r = 0; r < s.ranks; ++r) n.Cable(r, (r + 1) % s.ranks, s.link_gbps, s.latency_us);
      n.description_ =
          fmt::format("a ring of {} ranks, {} GB/s and {} us per cable", s.ranks, s.link_gbps, s.latency_us);
    }
    std::vector<int> block(n.node_names_.size(), -1);  // each rank its own block; the switch fixed
    for (int r = 0; r < s.ranks; ++r) block[static_cast<size_t>(r)] = r;
    n.SetBlocks(block);
    n.symmetries_.emplace_back(RankGroup::Op::kAdd, 1, std::vector<int>{s.ranks});
    if (s.kind != "ring" && (s.ranks & (s.ranks - 1)) == 0)
      n.symmetries_.emplace_back(RankGroup::Op::kXor, 1, std::vector<int>{s.ranks});
  } else if (s.kind == "rails" || s.kind == "rail-only") {
    if (s.hosts < 1 || s.per_host < 1 || s.nics < 1 || s.nics > s.per_host || s.hosts * s.per_host < 2)
      return InvalidArgument("kizuna-sim: rails need --hosts, --per-host and --nics (1 to per-host), 2 ranks or more");
    const int ranks = s.hosts * s.per_host;
    for (int r = 0; r < ranks; ++r)
      n.rank_node_.push_back(n.AddNode(fmt::format("h{}.a{}", r / s.per_host, r % s.per_host)));
    std::vector<int> rail_sw;
    for (int j = 0; j < s.nics; ++j) rail_sw.push_back(n.AddNode(fmt::format("rail{}", j)));
    for (int h = 0; h < s.hosts; ++h) {
      const int hsw = n.AddNode(fmt::format("h{}.sw", h));
      std::vector<int> nic;
      for (int j = 0; j < s.nics; ++j) {
        nic.push_back(n.AddNode(fmt::format("h{}.nic{}", h, j)));
        n.Cable(nic.back(), rail_sw[static_cast<size_t>(j)], s.link_gbps, s.latency_us);
      }
      for (int i = 0; i < s.per_host; ++i) {
        const int a = h * s.per_host + i;
        if (s.per_host > 1) n.Cable(a, hsw, s.intra_gbps, s.intra_latency_us);
        n.Cable(a, nic[static_cast<size_t>(i % s.nics)], s.pcie_gbps, s.intra_latency_us);
      }
    }
    if (s.kind == "rails" && s.nics > 1) {
      const int spine = n.AddNode("spine");
      for (int j = 0; j < s.nics; ++j)
        n.Cable(rail_sw[static_cast<size_t>(j)], spine, s.link_gbps * s.hosts, s.latency_us);
    }
    // Every host's nodes (its accelerators, switch and NICs) a block; rail switches and spine fixed.
    std::vector<int> block(n.node_names_.size(), -1);
    for (size_t v = 0; v < block.size(); ++v) {
      const std::string& name = n.node_names_[v];
      if (name[0] == 'h') block[v] = std::stoi(name.substr(1, name.find('.') - 1));
    }
    n.SetBlocks(block);
    n.symmetries_.emplace_back(RankGroup::Op::kAdd, s.per_host, std::vector<int>{s.hosts});
    if (s.hosts > 1 && (s.hosts & (s.hosts - 1)) == 0)
      n.symmetries_.emplace_back(RankGroup::Op::kXor, s.per_host, std::vector<int>{s.hosts});
    n.description_ = fmt::format(
        "{} hosts of {} accelerators ({} GB/s to the host switch, {} GB/s PCIe), {} NIC(s) each at {} GB/s, "
        "{} {} us per network link",
        s.hosts, s.per_host, s.intra_gbps, s.pcie_gbps, s.nics, s.link_gbps,
        s.kind == "rails" ? "rail switches joined by a spine," : "rail switches, no spine,", s.latency_us);
  } else if (s.kind == "fat-tree") {
    const int spines = s.spines > 0 ? s.spines : s.nics;
    if (s.hosts < 1 || s.per_host < 1 || s.nics < 1 || s.nics > s.per_host || s.hosts * s.per_host < 2 ||
        s.leaf_hosts < 1 || s.hosts % s.leaf_hosts != 0 || spines < 1 || !(s.oversubscription >= 1))
      return InvalidArgument(
          "kizuna-sim: a fat tree needs --hosts, --per-host, --nics (1 to per-host), --leaf-hosts dividing --hosts, "
          "--spines >= 1 and --oversubscription >= 1");
    const int ranks = s.hosts * s.per_host, leaves = s.hosts / s.leaf_hosts;
    for (int r = 0; r < ranks; ++r)
      n.rank_node_.push_back(n.AddNode(fmt::format("h{}.a{}", r / s.per_host, r % s.per_host)));
    std::vector<int> block(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) block[static_cast<size_t>(r)] = r / s.per_host / s.leaf_hosts;
    std::vector<int> spine;
    for (int j = 0; j < spines; ++j) {
      spine.push_back(n.AddNode(fmt::format("spine{}", j)));
      block.push_back(-1);
    }
    // Each leaf's uplinks together carry its hosts' NIC bandwidth over the oversubscription.
    const double uplink = s.link_gbps * s.nics * s.leaf_hosts / s.oversubscription / spines;
    for (int leaf = 0; leaf < leaves; ++leaf) {
      const int sw = n.AddNode(fmt::format("leaf{}", leaf));
      block.push_back(leaf);
      for (int j = 0; j < spines; ++j) n.Cable(sw, spine[static_cast<size_t>(j)], uplink, s.latency_us);
      for (int h = leaf * s.leaf_hosts; h < (leaf + 1) * s.leaf_hosts; ++h) {
        const int hsw = n.AddNode(fmt::format("h{}.sw", h));
        block.push_back(leaf);
        std::vector<int> nic;
        for (int j = 0; j < s.nics; ++j) {
          nic.push_back(n.AddNode(fmt::format("h{}.nic{}", h, j)));
          block.push_back(leaf);
          n.Cable(nic.back(), sw, s.link_gbps, s.latency_us);
        }
        for (int i = 0; i < s.per_host; ++i) {
          const int a = h * s.per_host + i;
          if (s.per_host > 1) n.Cable(a, hsw, s.intra_gbps, s.intra_latency_us);
          n.Cable(a, nic[static_cast<size_t>(i % s.nics)], s.pcie_gbps, s.intra_latency_us);
        }
      }
    }
    // Whole leaves shifted map the tree onto itself (a leaf's hosts in order, the spines fixed).
    n.SetBlocks(block);
    n.symmetries_.emplace_back(RankGroup::Op::kAdd, s.per_host * s.leaf_hosts, std::vector<int>{leaves});
    if (leaves > 1 && (leaves & (leaves - 1)) == 0)
      n.symmetries_.emplace_back(RankGroup::Op::kXor, s.per_host * s.leaf_hosts, std::vector<int>{leaves});
    n.description_ = fmt::format(
        "{} hosts of {} accelerators ({} GB/s to the host switch, {} GB/s PCIe), {} NIC(s) each at {} GB/s, {} hosts "
        "a leaf, {} leaves on {} spines at {}:1 ({} GB/s a leaf's uplink), {} us per network link",
        s.hosts, s.per_host, s.intra_gbps, s.pcie_gbps, s.nics, s.link_gbps, s.leaf_hosts, leaves, spines,
        s.oversubscription, uplink, s.latency_us);
  } else if (s.kind == "torus2d" || s.kind == "torus3d") {
    const size_t want = s.kind == "torus2d" ? 2 : 3;
    if (s.dims.size() != want) return InvalidArgument(fmt::format("kizuna-sim: {} needs {} dimensions", s.kind, want));
    int ranks = 1;
    for (int d : s.dims) {
      if (d < 1 || d > 1024) return InvalidArgument("kizuna-sim: torus dimensions must be 1 to 1024");
      ranks *= d;
    }
    if (ranks < 2 || ranks > 65536) return InvalidArgument("kizuna-sim: a torus of 2 to 65536 ranks");
    for (int r = 0; r < ranks; ++r) n.rank_node_.push_back(n.AddNode(fmt::format("r{}", r)));
    // Rank r = x + X (y + Y z); a cable to the next rank along each dimension (wrapping), one
    // cable where a dimension has 2 (both neighbours are the same rank), none where it has 1.
    std::vector<int> stride(s.dims.size(), 1);
    for (size_t d = 1; d < s.dims.size(); ++d) stride[d] = stride[d - 1] * s.dims[d - 1];
    for (int r = 0; r < ranks; ++r)
      for (size_t d = 0; d < s.dims.size(); ++d) {
        const int len = s.dims[d], c = (r / stride[d]) % len;
        if (len < 2 || (len == 2 && c == 1)) continue;
        const int next = r + (((c + 1) % len) - c) * stride[d];
        n.Cable(r, next, s.link_gbps, s.latency_us);
      }
    std::string shape;
    for (int d : s.dims) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    n.description_ =
        fmt::format("a {} torus of {} ranks, {} GB/s and {} us per cable", shape, ranks, s.link_gbps, s.latency_us);
    std::vector<int> block(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) block[static_cast<size_t>(r)] = r;
    n.SetBlocks(block);
    n.torus_dims_ = s.dims;
    n.symmetries_.emplace_back(RankGroup::Op::kAdd, 1, s.dims);
  } else {
    return InvalidArgument(fmt::format(
        "kizuna-sim: unknown network '{}' (switch, full, rails, rail-only, fat-tree, torus2d, torus3d, ring, direct)",
        s.kind));
  }
  return n;
}

void Network::SetBlocks(const std::vector<int>& node_block) {
  node_block_ = node_block;
  node_local_.assign(node_block.size(), 0);
  for (size_t v = 0; v < node_block.size(); ++v) {
    const int b = node_block[v];
    if (b < 0) continue;
    if (block_nodes_.size() <= static_cast<size_t>(b)) block_nodes_.resize(static_cast<size_t>(b) + 1);
    node_local_[v] = static_cast<int>(block_nodes_[static_cast<size_t>(b)].size());
    block_nodes_[static_cast<size_t>(b)].push_back(static_cast<int>(v));
  }
  for (size_t l = 0; l < links_.size(); ++l)
    link_at_[static_cast<uint64_t>(links_[l].from) * node_names_.size() + static_cast<uint64_t>(links_[l].to)] =
        static_cast<int>(l);
}

int Network::NodeImage(const RankGroup& g, int e, int v) const {
  const int b = node_block_[static_cast<size_t>(v)];
  if (b < 0) return v;
  return block_nodes_[static_cast<size_t>(g.ApplyBlock(e, b))]
                     [static_cast<size_t>(node_local_[static_cast<size_t>(v)])];
}

int Network::LinkImage(const RankGroup& g, int e, int l) const {
  const Link& k = links_[static_cast<size_t>(l)];
  const uint64_t key = static_cast<uint64_t>(NodeImage(g, e, k.from)) * node_names_.size() +
                       static_cast<uint64_t>(NodeImage(g, e, k.to));
  return link_at_.at(key);
}

Network::Orbits Network::LinkOrbits(const RankGroup& g) const {
  // Union-find over the generators' images: an orbit is a component.
  std::vector<int> parent(links_.size());
  for (size_t l = 0; l < parent.size(); ++l) parent[l] = static_cast<int>(l);
  auto find = [&](int x) {
    while (parent[static_cast<size_t>(x)] != x)
      x = parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    return x;
  };
  for (int e : g.Generators())
    for (size_t l = 0; l < links_.size(); ++l) {
      const int a = find(static_cast<int>(l)), b = find(LinkImage(g, e, static_cast<int>(l)));
      if (a != b) parent[static_cast<size_t>(std::max(a, b))] = std::min(a, b);
    }
  Orbits o;
  o.canon.resize(links_.size());
  o.size.assign(links_.size(), 0);
  for (size_t l = 0; l < links_.size(); ++l) ++o.size[static_cast<size_t>(o.canon[l] = find(static_cast<int>(l)))];
  for (size_t l = 0; l < links_.size(); ++l) o.size[l] = o.size[static_cast<size_t>(o.canon[l])];
  return o;
}

const std::vector<int>& Network::DistanceFrom(int a) const {
  auto [it, fresh] = distance_.try_emplace(a);
  if (!fresh) return it->second;
  std::vector<int>& dist = it->second;
  dist.assign(node_names_.size(), -1);
  std::deque<int> queue{rank_node_[static_cast<size_t>(a)]};
  dist[static_cast<size_t>(queue.front())] = 0;
  while (!queue.empty()) {
    const int v = queue.front();
    queue.pop_front();
    for (int l : out_[static_cast<size_t>(v)]) {
      const int u = links_[static_cast<size_t>(l)].to;
      if (dist[static_cast<size_t>(u)] < 0) {
        dist[static_cast<size_t>(u)] = dist[static_cast<size_t>(v)] + 1;
        queue.push_back(u);
      }
    }
  }
  return dist;
}

// A torus routes dimension by dimension (x, then y, then z), each the short way round (a pair
// exactly half way round picks its way by a + b): the dimension-order routing of direct-connect
// tori, one path per pair whatever the ties. Other networks: back from b, the links that come
// from a node one hop nearer a; among several, the pair picks one. Distances are kept per
// source: a symmetric run's sources are one host's ranks, whatever the destinations.
bool Network::Links(int a, int b, std::vector<int>* out) const {
  out->clear();
  if (a == b) return false;
  if (!torus_dims_.empty()) {
    int at = a, stride = 1;
    for (int len : torus_dims_) {
      const int from = (at / stride) % len, to = (b / stride) % len;
      const int ahead = ((to - from) % len + len) % len, behind = len - ahead;
      const int step = ahead < behind || (ahead == behind && (a + b) % 2 == 0) ? 1 : len - 1;
      for (int c = from; c != to; c = (c + step) % len) {
        const int next = at + (((c + step) % len) - c) * stride;
        out->push_back(link_at_.at(static_cast<uint64_t>(rank_node_[static_cast<size_t>(at)]) * node_names_.size() +
                                   static_cast<uint64_t>(rank_node_[static_cast<size_t>(next)])));
        at = next;
      }
      stride *= len;
    }
    return true;
  }
  const std::vector<int>& dist = DistanceFrom(a);
  const int source = rank_node_[static_cast<size_t>(a)];
  if (dist[static_cast<size_t>(rank_node_[static_cast<size_t>(b)])] < 0) return false;
  std::vector<int> nearer;
  for (int v = rank_node_[static_cast<size_t>(b)]; v != source;) {
    nearer.clear();
    for (int l : in_[static_cast<size_t>(v)])
      if (dist[static_cast<size_t>(links_[static_cast<size_t>(l)].from)] == dist[static_cast<size_t>(v)] - 1)
        nearer.push_back(l);
    const int l = nearer[static_cast<size_t>(a + b) % nearer.size()];
    out->push_back(l);
    v = links_[static_cast<size_t>(l)].from;
  }
  std::reverse(out->begin(), out->end());
  return true;
}

const Network::Path& Network::PathOf(int a, int b) const {
  const uint64_t key = static_cast<uint64_t>(a) * rank_node_.size() + static_cast<uint64_t>(b);
  auto [it, fresh] = paths_.try_emplace(key);
  if (!fresh) return it->second;
  Path& path = it->second;
  Links(a, b, &path.links);
  for (int l : path.links) path.latency += links_[static_cast<size_t>(l)].latency_us * 1e-6;
  return path;
}

std::pair<double, double> Network::RouteSummary(int a, int b) const {
  std::vector<int> links;
  double gbps = 0, latency = 0;
  Links(a, b, &links);
  for (int l : links) {
    const Link& k = links_[static_cast<size_t>(l)];
    gbps = gbps == 0 ? k.gbps : std::min(gbps, k.gbps);
    latency += k.latency_us * 1e-6;
  }
  return {gbps, latency};
}

const std::vector<int>& Network::Route(int a, int b) const { return PathOf(a, b).links; }

double Network::RouteLatency(int a, int b) const { return PathOf(a, b).latency; }

}  // namespace kizuna::sim
