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
    n.description_ = fmt::format(
        "{} hosts of {} accelerators ({} GB/s to the host switch, {} GB/s PCIe), {} NIC(s) each at {} GB/s, "
        "{} {} us per network link",
        s.hosts, s.per_host, s.intra_gbps, s.pcie_gbps, s.nics, s.link_gbps,
        s.kind == "rails" ? "rail switches joined by a spine," : "rail switches, no spine,", s.latency_us);
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
  } else {
    return InvalidArgument(fmt::format(
        "kizuna-sim: unknown network '{}' (switch, full, rails, rail-only, torus2d, torus3d, ring)", s.kind));
  }
  return n;
}

const std::vector<int>& Network::DistanceTo(int b) const {
  auto [it, fresh] = distance_.try_emplace(b);
  if (!fresh) return it->second;
  std::vector<int>& dist = it->second;
  dist.assign(node_names_.size(), -1);
  std::deque<int> queue{rank_node_[static_cast<size_t>(b)]};
  dist[static_cast<size_t>(queue.front())] = 0;
  while (!queue.empty()) {
    const int v = queue.front();
    queue.pop_front();
    for (int l : in_[static_cast<size_t>(v)]) {
      const int u = links_[static_cast<size_t>(l)].from;
      if (dist[static_cast<size_t>(u)] < 0) {
        dist[static_cast<size_t>(u)] = dist[static_cast<size_t>(v)] + 1;
        queue.push_back(u);
      }
    }
  }
  return dist;
}

// From a, the links that bring it one hop closer to b; among several, the pair picks one.
template <typename Hop>
bool Network::Walk(int a, int b, Hop&& hop) const {
  const std::vector<int>& dist = DistanceTo(b);
  const int target = rank_node_[static_cast<size_t>(b)];
  if (a == b || dist[static_cast<size_t>(rank_node_[static_cast<size_t>(a)])] < 0) return false;
  std::vector<int> closer;
  for (int v = rank_node_[static_cast<size_t>(a)]; v != target;) {
    closer.clear();
    for (int l : out_[static_cast<size_t>(v)])
      if (dist[static_cast<size_t>(links_[static_cast<size_t>(l)].to)] == dist[static_cast<size_t>(v)] - 1)
        closer.push_back(l);
    const int l = closer[static_cast<size_t>(a + b) % closer.size()];
    hop(l);
    v = links_[static_cast<size_t>(l)].to;
  }
  return true;
}

const Network::Path& Network::PathOf(int a, int b) const {
  const uint64_t key = static_cast<uint64_t>(a) * rank_node_.size() + static_cast<uint64_t>(b);
  auto [it, fresh] = paths_.try_emplace(key);
  if (!fresh) return it->second;
  Path& path = it->second;
  Walk(a, b, [&](int l) {
    path.links.push_back(l);
    path.latency += links_[static_cast<size_t>(l)].latency_us * 1e-6;
  });
  return path;
}

std::pair<double, double> Network::RouteSummary(int a, int b) const {
  double gbps = 0, latency = 0;
  Walk(a, b, [&](int l) {
    const Link& k = links_[static_cast<size_t>(l)];
    gbps = gbps == 0 ? k.gbps : std::min(gbps, k.gbps);
    latency += k.latency_us * 1e-6;
  });
  return {gbps, latency};
}

const std::vector<int>& Network::Route(int a, int b) const { return PathOf(a, b).links; }

double Network::RouteLatency(int a, int b) const { return PathOf(a, b).latency; }

}  // namespace kizuna::sim
