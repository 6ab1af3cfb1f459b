// The topology generators (topology.h): rings, tori, fully connected sets and optical-circuit
// switched layouts, and the named forms the command-line tools take.
#include <cmath>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fabric/directconnect/topology.h"
#include "fabric/directconnect/topology_internal.h"

namespace kizuna::fabric::directconnect {
namespace {

Status CheckLinkParams(LinkParams link) {
  if (!std::isfinite(link.bandwidth_gbps) || link.bandwidth_gbps < 0 || !std::isfinite(link.latency_us) ||
      link.latency_us < 0)
    return InvalidArgument(fmt::format("link bandwidth {} Gb/s and latency {} us must be finite and >= 0",
                                       link.bandwidth_gbps, link.latency_us));
  return Status::Ok();
}

void AddWorkers(Topology& t, int n, int ports) {
  for (int i = 0; i < n; ++i)
    t.nodes.push_back(TopologyNode{fmt::format("w{}", i), NodeKind::kWorker, i, ports, 0, {}});
}

void AddLink(Topology& t, PortRef a, PortRef b, LinkParams link) {
  t.links.push_back(TopologyLink{a, b, link.bandwidth_gbps, link.latency_us, 0});
}

Result<int> ParsePositive(std::string_view s, std::string_view what) {
  if (s.empty() || s.size() > 6) return InvalidArgument(fmt::format("{} \"{}\" is not a positive integer", what, s));
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return InvalidArgument(fmt::format("{} \"{}\" is not a positive integer", what, s));
    v = v * 10 + (c - '0');
  }
  if (v <= 0) return InvalidArgument(fmt::format("{} \"{}\" is not a positive integer", what, s));
  return v;
}

}  // namespace

// ---- Generators ----

Result<Topology> GenerateRing(int n, LinkParams link) {
  KZ_RETURN_IF_ERROR(CheckLinkParams(link));
  if (n < 2 || n > kMaxTopologyNodes) return InvalidArgument(fmt::format("ring of {} workers: need 2..{}", n, kMaxTopologyNodes));
  Topology t;
  t.name = fmt::format("ring-{}", n);
  AddWorkers(t, n, 2);
  for (int i = 0; i < n; ++i) AddLink(t, PortRef{i, 0}, PortRef{(i + 1) % n, 1}, link);
  KZ_RETURN_IF_ERROR(t.Finalize());
  return t;
}

Result<Topology> GenerateTorus(const std::vector<int>& dims, LinkParams link) {
  KZ_RETURN_IF_ERROR(CheckLinkParams(link));
  if (dims.empty() || dims.size() > 3) return InvalidArgument(fmt::format("a torus has 1 to 3 dimensions, not {}", dims.size()));
  int64_t total = 1;
  std::string shape;
  for (int d : dims) {
    if (d < 1) return InvalidArgument(fmt::format("torus dimension {} must be >= 1", d));
    total *= d;
    if (total > kMaxTopologyNodes) return InvalidArgument(fmt::format("torus of more than {} workers", kMaxTopologyNodes));
    shape += (shape.empty() ? "" : "x") + std::to_string(d);
  }
  if (total < 2) return InvalidArgument("a torus needs at least 2 workers");
  const int n = static_cast<int>(total);
  const int nd = static_cast<int>(dims.size());
  Topology t;
  t.name = fmt::format("torus{}d-{}", nd, shape);
  AddWorkers(t, n, 2 * nd);
  for (int r = 0; r < n; ++r) {
    int stride = 1;
    for (int d = 0; d < nd; ++d) {
      const int size = dims[d];
      const int coord = (r / stride) % size;
      if (size > 1) {
        const int next = r + (((coord + 1) % size) - coord) * stride;
        AddLink(t, PortRef{r, 2 * d}, PortRef{next, 2 * d + 1}, link);
      }
      stride *= size;
    }
  }
  KZ_RETURN_IF_ERROR(t.Finalize());
  return t;
}

Result<Topology> GenerateFullyConnected(int n, LinkParams link) {
  KZ_RETURN_IF_ERROR(CheckLinkParams(link));
  if (n < 2 || n > kMaxPortsPerNode + 1)
    return InvalidArgument(fmt::format("fully connected topology of {} workers: need 2..{}", n, kMaxPortsPerNode + 1));
  Topology t;
  t.name = fmt::format("full-{}", n);
  AddWorkers(t, n, n - 1);
  auto port_to = [](int from, int to) { return to < from ? to : to - 1; };
  for (int i = 0; i < n; ++i)
    for (int k = i + 1; k < n; ++k) AddLink(t, PortRef{i, port_to(i, k)}, PortRef{k, port_to(k, i)}, link);
  KZ_RETURN_IF_ERROR(t.Finalize());
  return t;
}

Result<Topology> GenerateOcs(const OcsSpec& spec, LinkParams link) {
  KZ_RETURN_IF_ERROR(CheckLinkParams(link));
  if (spec.workers < 1 || spec.workers + spec.aggregators > kMaxTopologyNodes || spec.aggregators < 0)
    return InvalidArgument(fmt::format("OCS topology of {} workers and {} aggregators", spec.workers, spec.aggregators));
  if (spec.worker_ports < 1 || (spec.aggregators > 0 && spec.aggregator_ports < 1))
    return InvalidArgument("OCS topology: every node needs at least one port");
  Topology t;
  t.name = fmt::format("ocs-{}w-{}a", spec.workers, spec.aggregators);
  AddWorkers(t, spec.workers, spec.worker_ports);
  for (int i = 0; i < spec.aggregators; ++i)
    t.nodes.push_back(TopologyNode{fmt::format("a{}", i), NodeKind::kAggregator, -1, spec.aggregator_ports, 0, {}});
  for (const auto& [a, b] : spec.pairs) {
    PortRef ends[2];
    const std::string* names[2] = {&a, &b};
    for (int e = 0; e < 2; ++e) {
      auto split = internal::SplitPortName(*names[e]);
      if (!split.ok()) return split.status().WithContext(fmt::format("OCS port map entry {}={}", a, b));
      const int node = t.FindNode(split->first);
      if (node < 0)
        return InvalidArgument(fmt::format("OCS port map entry {}={}: no node '{}' (workers w0..w{}{})", a, b,
                                           split->first, spec.workers - 1,
                                           spec.aggregators > 0 ? fmt::format(", aggregators a0..a{}", spec.aggregators - 1)
                                                                : std::string()));
      ends[e] = PortRef{node, split->second};
    }
    AddLink(t, ends[0], ends[1], link);
  }
  KZ_RETURN_IF_ERROR(t.Finalize());
  return t;
}

Result<std::vector<std::pair<std::string, std::string>>> ParsePortMap(std::string_view map) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  while (start <= map.size()) {
    size_t end = map.find(',', start);
    if (end == std::string_view::npos) end = map.size();
    std::string_view item = map.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) {
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
        return InvalidArgument(fmt::format("port map item \"{}\" is not of the form node:port=node:port", item));
      out.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    start = end + 1;
  }
  if (out.empty()) return InvalidArgument("the port map is empty");
  return out;
}

Result<Topology> GenerateNamed(std::string_view kind, std::string_view shape, LinkParams link) {
  if (kind == "ring") {
    KZ_ASSIGN_OR_RETURN(int n, ParsePositive(shape, "ring size"));
    return GenerateRing(n, link);
  }
  if (kind == "full" || kind == "fully_connected") {
    KZ_ASSIGN_OR_RETURN(int n, ParsePositive(shape, "worker count"));
    return GenerateFullyConnected(n, link);
  }
  if (kind == "torus1d" || kind == "torus2d" || kind == "torus3d") {
    const size_t want = static_cast<size_t>(kind[5] - '0');
    std::vector<int> dims;
    size_t start = 0;
    while (start <= shape.size()) {
      size_t x = shape.find('x', start);
      if (x == std::string_view::npos) x = shape.size();
      KZ_ASSIGN_OR_RETURN(int d, ParsePositive(shape.substr(start, x - start), "torus dimension"));
      dims.push_back(d);
      start = x + 1;
    }
    if (dims.size() != want)
      return InvalidArgument(fmt::format("{} needs {} dimensions (like {}), got \"{}\"", kind, want,
                                         want == 1 ? "8" : want == 2 ? "4x4" : "2x2x2", shape));
    return GenerateTorus(dims, link);
  }
  if (kind == "ocs")
    return InvalidArgument("an OCS topology needs an explicit port map (GenerateOcs; kizuna-topo --generate ocs --map ...)");
  return InvalidArgument(fmt::format("unknown topology generator \"{}\" (ring, torus1d, torus2d, torus3d, full, ocs)", kind));
}

}  // namespace kizuna::fabric::directconnect
