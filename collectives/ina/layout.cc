#include "collectives/ina/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/core/file.h"
#include "runtime/core/json.h"

namespace kizuna::collectives::ina {
namespace {

using Json = nlohmann::json;

std::string PartName(size_t i, const Part& p) { return fmt::format("part {} ({})", i, PartKindName(p.kind)); }

std::string PortName(const Node& n, int port) { return fmt::format("{}:{}", n.Name(), port); }

// A worker's port p is two ports of the topology file (layout.h, TopologyJson): 2p for its duplex
// cable or a ring's transmit side, 2p+1 for a ring's receive side. So a worker has at most half a
// topology node's ports.
constexpr int kMaxWorkerPorts = kMaxPortsPerNode / 2;
std::string TopologyPort(const Node& n, int port, bool receive = false) {
  return n.aggregator() ? PortName(n, port) : PortName(n, 2 * port + (receive ? 1 : 0));
}

// Which part holds each port, across all parts: a port carries one cable.
class PortMap {
 public:
  explicit PortMap(const Layout& l)
      : layout_(l),
        worker_(static_cast<size_t>(l.workers) * static_cast<size_t>(l.worker_ports), -1),
        aggregator_(static_cast<size_t>(l.aggregators) * static_cast<size_t>(l.aggregator_ports), -1) {}

  bool InRange(const Node& n) const {
    return n.index >= 0 && n.index < (n.aggregator() ? layout_.aggregators : layout_.workers);
  }

  Status Claim(const Node& n, int port, int part) {
    const int ports = n.aggregator() ? layout_.aggregator_ports : layout_.worker_ports;
    if (port < 0 || port >= ports)
      return InvalidArgument(fmt::format("port {} is beyond {}'s {} port(s) (0..{})", PortName(n, port), n.Name(),
                                         ports, ports - 1));
    const size_t at = static_cast<size_t>(n.index) * static_cast<size_t>(ports) + static_cast<size_t>(port);
    int& owner = n.aggregator() ? aggregator_[at] : worker_[at];
    if (owner == part)
      return InvalidArgument(fmt::format("port {} carries two cables of this part", PortName(n, port)));
    if (owner >= 0) return InvalidArgument(fmt::format("port {} is already used by part {}", PortName(n, port), owner));
    owner = part;
    return Status::Ok();
  }

 private:
  const Layout& layout_;
  std::vector<int> worker_, aggregator_;
};

// Per-part scratch, reused across parts: where each node sits in the tree being checked.
struct TreeScratch {
  static constexpr int kAbsent = -2, kRoot = -1;
  std::vector<int> worker_pos, aggregator_pos;  // kAbsent, kRoot, or the edge whose child it is
  std::vector<int> children_w, children_a;
  std::vector<uint8_t> state_w, state_a;  // 0 unknown, 1 on the current walk, 2 reaches the root

  int& pos(const Node& n) { return n.aggregator() ? aggregator_pos[n.index] : worker_pos[n.index]; }
  int& children(const Node& n) { return n.aggregator() ? children_a[n.index] : children_w[n.index]; }
  uint8_t& state(const Node& n) { return n.aggregator() ? state_a[n.index] : state_w[n.index]; }
  void Reset(const Layout& l) {
    worker_pos.assign(static_cast<size_t>(l.workers), kAbsent);
    aggregator_pos.assign(static_cast<size_t>(l.aggregators), kAbsent);
    children_w.assign(static_cast<size_t>(l.workers), 0);
    children_a.assign(static_cast<size_t>(l.aggregators), 0);
    state_w.assign(static_cast<size_t>(l.workers), 0);
    state_a.assign(static_cast<size_t>(l.aggregators), 0);
  }
};

// CheckTree's first step: the root and the edges name nodes that exist, each node has at most one
// parent edge, every parent is in the tree, and every worker is. Fills t's positions and child
// counts.
Status CheckEdges(const Layout& l, const Part& part, const PortMap& ports, TreeScratch& t) {
  if (!ports.InRange(part.root)) return InvalidArgument(fmt::format("root {} does not exist", part.root.Name()));
  if (part.kind == PartKind::kLine ? part.root.aggregator() : !part.root.aggregator())
    return InvalidArgument(fmt::format("root {}: a {}'s root is {}", part.root.Name(), PartKindName(part.kind),
                                       part.kind == PartKind::kLine ? "a worker" : "an aggregation device"));
  t.pos(part.root) = TreeScratch::kRoot;
  for (size_t j = 0; j < part.edges.size(); ++j) {
    const Node& c = part.edges[j].child;
    if (!ports.InRange(c)) return InvalidArgument(fmt::format("edge {}: child {} does not exist", j, c.Name()));
    int& at = t.pos(c);
    if (at == TreeScratch::kRoot) return InvalidArgument(fmt::format("edge {}: the root {} has a parent", j, c.Name()));
    if (at >= 0) return InvalidArgument(fmt::format("edge {}: {} appears twice (edges {} and {})", j, c.Name(), at, j));
    at = static_cast<int>(j);
  }
  for (size_t j = 0; j < part.edges.size(); ++j) {
    const TreeEdge& e = part.edges[j];
    if (!ports.InRange(e.parent) || t.pos(e.parent) == TreeScratch::kAbsent)
      return InvalidArgument(fmt::format("edge {}: parent {} of {} is not a node of the tree", j, e.parent.Name(),
                                         e.child.Name()));
    if (e.parent == e.child) return InvalidArgument(fmt::format("edge {}: connects {} to itself", j, e.child.Name()));
    ++t.children(e.parent);
  }
  for (int w = 0; w < l.workers; ++w)
    if (t.worker_pos[static_cast<size_t>(w)] == TreeScratch::kAbsent)
      return InvalidArgument(fmt::format("worker {} is missing from the tree", Node::Worker(w).Name()));
  return Status::Ok();
}

// CheckTree's second step. Every node has one parent edge, so the edges form a tree exactly when
// every walk up the parents reaches the root; a walk that meets itself is a cycle.
Status CheckReachesRoot(const Part& part, TreeScratch& t) {
  t.state(part.root) = 2;
  std::vector<Node> walk;
  for (const TreeEdge& start : part.edges) {
    walk.clear();
    Node n = start.child;
    while (t.state(n) == 0) {
      t.state(n) = 1;
      walk.push_back(n);
      n = part.edges[static_cast<size_t>(t.pos(n))].parent;
    }
    if (t.state(n) == 1)
      return InvalidArgument(fmt::format("{} is on a cycle (its parents never reach the root {})", n.Name(),
                                         part.root.Name()));
    for (const Node& m : walk) t.state(m) = 2;
  }
  return Status::Ok();
}

// CheckTree's third step, per node: the shapes of layout.h's table. Counts the aggregation devices
// in `aggregators` and claims each for part `pi` in `aggregator_part`.
Status CheckNode(const Part& part, int pi, TreeScratch& t, const Node& n, std::vector<int>& aggregator_part,
                 int& aggregators) {
  const int pos = t.pos(n);
  const bool has_parent = pos >= 0;
  const int children = t.children(n);
  const Node* parent = has_parent ? &part.edges[static_cast<size_t>(pos)].parent : nullptr;
  if (n.aggregator()) {
    ++aggregators;
    if (part.kind == PartKind::kLine)
      return InvalidArgument(fmt::format("a line has no aggregation device, but {} is in it", n.Name()));
    if (children == 0)
      return InvalidArgument(fmt::format("aggregation device {} has no children (it would reduce nothing)", n.Name()));
    if (part.kind == PartKind::kPartialTree && parent && !parent->aggregator())
      return InvalidArgument(fmt::format("aggregation device {} hangs below worker {}: a partial tree's aggregation "
                                         "devices form its top",
                                         n.Name(), parent->Name()));
    int& owner = aggregator_part[static_cast<size_t>(n.index)];
    if (owner >= 0 && owner != pi)
      return InvalidArgument(fmt::format("aggregation device {} is already used by part {}", n.Name(), owner));
    owner = pi;
  } else if (part.kind == PartKind::kFullTree && (children > 0 || (parent && !parent->aggregator()))) {
    return InvalidArgument(
        fmt::format("worker {} is not a leaf below an aggregation device, as a full tree's workers are", n.Name()));
  } else if (part.kind == PartKind::kPartialTree && children > 1) {
    return InvalidArgument(
        fmt::format("worker {} has {} children: a partial tree's workers form chains", n.Name(), children));
  }
  if (part.kind == PartKind::kLine && children + (has_parent ? 1 : 0) > 2)
    return InvalidArgument(fmt::format("worker {} has {} neighbours: a line is a chain", n.Name(),
                                       children + (has_parent ? 1 : 0)));
  return Status::Ok();
}

Status CheckTree(const Layout& l, const Part& part, int pi, PortMap& ports, TreeScratch& t,
                 std::vector<int>& aggregator_part) {
  t.Reset(l);
  KZ_RETURN_IF_ERROR(CheckEdges(l, part, ports, t));
  KZ_RETURN_IF_ERROR(CheckReachesRoot(part, t));
  // The shapes of layout.h's table, node by node, and the ports each edge's cable takes.
  int aggregators = 0;
  KZ_RETURN_IF_ERROR(CheckNode(part, pi, t, part.root, aggregator_part, aggregators));
  int64_t worker_ports = 0;
  for (size_t j = 0; j < part.edges.size(); ++j) {
    const TreeEdge& e = part.edges[j];
    KZ_RETURN_IF_ERROR(CheckNode(part, pi, t, e.child, aggregator_part, aggregators));
    KZ_RETURN_IF_ERROR(ports.Claim(e.child, e.child_port, pi).WithContext(fmt::format("edge {}", j)));
    KZ_RETURN_IF_ERROR(ports.Claim(e.parent, e.parent_port, pi).WithContext(fmt::format("edge {}", j)));
    worker_ports += (e.child.aggregator() ? 0 : 1) + (e.parent.aggregator() ? 0 : 1);
  }
  if (aggregators != part.aggregators)
    return InvalidArgument(
        fmt::format("declares {} aggregation device(s) but its tree has {}", part.aggregators, aggregators));
  if (worker_ports != part.worker_ports)
    return InvalidArgument(
        fmt::format("declares {} worker ports but its cables use {}", part.worker_ports, worker_ports));
  return Status::Ok();
}

Status CheckRing(const Layout& l, const Part& part, int pi, PortMap& ports) {
  const size_t n = part.ring.size();
  if (l.workers < 2) return InvalidArgument("a ring needs at least 2 workers");
  if (!part.edges.empty()) return InvalidArgument("a ring has no tree edges");
  if (n != static_cast<size_t>(l.workers))
    return InvalidArgument(fmt::format("the ring holds {} workers, the layout {}", n, l.workers));
  if (part.ring_ports.size() != n)
    return InvalidArgument(fmt::format("{} workers but {} ring ports (one per worker)", n, part.ring_ports.size()));
  std::vector<int> at(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const int w = part.ring[i];
    if (w < 0 || w >= l.workers) return InvalidArgument(fmt::format("ring[{}]: worker {} does not exist", i, w));
    if (at[static_cast<size_t>(w)] >= 0)
      return InvalidArgument(fmt::format("ring[{}]: worker w{} appears twice (positions {} and {})", i, w,
                                         at[static_cast<size_t>(w)], i));
    at[static_cast<size_t>(w)] = static_cast<int>(i);
  }
  for (size_t i = 0; i < n; ++i)
    KZ_RETURN_IF_ERROR(
        ports.Claim(Node::Worker(part.ring[i]), part.ring_ports[i], pi).WithContext(fmt::format("ring[{}]", i)));
  if (part.aggregators != 0)
    return InvalidArgument(fmt::format("declares {} aggregation device(s); a ring has none", part.aggregators));
  if (part.worker_ports != static_cast<int>(n))
    return InvalidArgument(fmt::format("declares {} worker ports but its circuits use {}", part.worker_ports, n));
  // The planner splits the data by bandwidth, so a ring declared with another model's figure (the
  // bidirectional ring's N/(N-1), say) would get twice its share. Relative slack for files written
  // with rounded decimals.
  const double want = static_cast<double>(n) / (2.0 * static_cast<double>(n - 1));
  if (std::abs(part.bandwidth - want) > 1e-9 * want)
    return InvalidArgument(fmt::format("bandwidth {}: a unidirectional ring of {} workers has N/(2(N-1)) = {}",
                                       Json(part.bandwidth).dump(), n, Json(want).dump()));
  return Status::Ok();
}

// A decimal index without sign or leading zeros, below 10^9.
std::optional<int> ParseIndex(std::string_view s) {
  if (s.empty() || s.size() > 9 || (s[0] == '0' && s.size() > 1)) return std::nullopt;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

// "w3", "a1".
std::optional<Node> ParseNode(std::string_view s) {
  if (s.empty() || (s[0] != 'w' && s[0] != 'a')) return std::nullopt;
  auto index = ParseIndex(s.substr(1));
  if (!index) return std::nullopt;
  return s[0] == 'w' ? Node::Worker(*index) : Node::Aggregator(*index);
}

// "w3:0".
std::optional<std::pair<Node, int>> ParseNodePort(std::string_view s) {
  const size_t colon = s.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto node = ParseNode(s.substr(0, colon));
  auto port = ParseIndex(s.substr(colon + 1));
  if (!node || !port) return std::nullopt;
  return std::pair<Node, int>{*node, *port};
}

// JSON reading with errors that name the key's path ("parts[2].edges[5].child").
struct Reader {
  std::string what;

  Status Error(const std::string& path, const std::string& message) const {
    return InvalidArgument(fmt::format("{}: {}: {}", what, path, message));
  }
  Status Keys(const Json& j, const std::string& path, std::initializer_list<std::string_view> known) const {
    if (!j.is_object()) return Error(path, "expected an object");
    for (auto it = j.begin(); it != j.end(); ++it)
      if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
        std::string list;
        for (std::string_view k : known) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
        return Error(path, fmt::format("unknown key {} (known: {})", JsonExcerpt(Json(it.key())), list));
      }
    return Status::Ok();
  }
  const Json* Find(const Json& j, std::string_view key) const {
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  Result<int64_t> Int(const Json& j, std::string_view key, const std::string& path, int64_t lo, int64_t hi) const {
    const Json* v = Find(j, key);
    const std::string at = fmt::format("{}.{}", path, key);
    if (!v) return Error(at, "missing");
    if (!v->is_number_integer()) return Error(at, fmt::format("expected an integer, got {}", JsonExcerpt(*v)));
    if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi)
                                : v->get<int64_t>() < lo || v->get<int64_t>() > hi)
      return Error(at, fmt::format("{} is out of range ({}..{})", JsonExcerpt(*v), lo, hi));
    return v->get<int64_t>();
  }
  Result<std::vector<int>> Ints(const Json& j, std::string_view key, const std::string& path) const {
    const Json* v = Find(j, key);
    const std::string at = fmt::format("{}.{}", path, key);
    if (!v || !v->is_array()) return Error(at, "expected an array of integers");
    std::vector<int> out;
    out.reserve(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      // Ranges are Validate's to check, with the part's context; here only what fits an int.
      if (!e.is_number_integer() ||
          (e.is_number_unsigned() ? e.get<uint64_t>() > uint64_t{kMaxLayoutPorts}
                                  : e.get<int64_t>() < -kMaxLayoutPorts || e.get<int64_t>() > kMaxLayoutPorts))
        return Error(fmt::format("{}[{}]", at, i), fmt::format("expected an index, got {}", JsonExcerpt(e)));
      out.push_back(static_cast<int>(e.get<int64_t>()));
    }
    return out;
  }
  Result<std::pair<Node, int>> NodePort(const Json& j, std::string_view key, const std::string& path) const {
    const Json* v = Find(j, key);
    const std::string at = fmt::format("{}.{}", path, key);
    std::optional<std::pair<Node, int>> np;
    if (v && v->is_string()) np = ParseNodePort(v->get<std::string>());
    if (!np)
      return Error(at, fmt::format("expected \"node:port\" such as \"w3:0\" or \"a1:2\", got {}",
                                   v ? JsonExcerpt(*v) : std::string("nothing")));
    return *np;
  }
};

Result<Part> ReadPart(const Reader& r, const Json& j, const std::string& path) {
  // The format's earlier ring (two ports per worker) had these keys: say what replaced them.
  for (std::string_view key : {"next_port", "prev_port"})
    if (j.is_object() && r.Find(j, key))
      return r.Error(fmt::format("{}.{}", path, key),
                     "rings are unidirectional, one port per worker: \"ring_ports\" replaces \"next_port\" and "
                     "\"prev_port\"");
  KZ_RETURN_IF_ERROR(
      r.Keys(j, path, {"kind", "bandwidth", "aggregators", "worker_ports", "root", "edges", "ring", "ring_ports"}));
  Part p;
  const Json* kind = r.Find(j, "kind");
  std::optional<PartKind> k;
  for (PartKind c : {PartKind::kFullTree, PartKind::kPartialTree, PartKind::kLine, PartKind::kRing})
    if (kind && kind->is_string() && kind->get<std::string>() == PartKindName(c)) k = c;
  if (!k)
    return r.Error(path + ".kind", fmt::format("expected full-tree, partial-tree, line or ring, got {}",
                                               kind ? JsonExcerpt(*kind) : std::string("nothing")));
  p.kind = *k;
  const Json* bw = r.Find(j, "bandwidth");
  if (!bw || !bw->is_number()) return r.Error(path + ".bandwidth", "expected a number");
  p.bandwidth = bw->get<double>();
  KZ_ASSIGN_OR_RETURN(int64_t aggregators, r.Int(j, "aggregators", path, 0, kMaxAggregators));
  KZ_ASSIGN_OR_RETURN(int64_t worker_ports, r.Int(j, "worker_ports", path, 0, kMaxLayoutPorts));
  p.aggregators = static_cast<int>(aggregators);
  p.worker_ports = static_cast<int>(worker_ports);
  if (p.kind == PartKind::kRing) {
    for (std::string_view key : {"root", "edges"})
      if (r.Find(j, key)) return r.Error(fmt::format("{}.{}", path, key), "a ring has no tree");
    KZ_ASSIGN_OR_RETURN(p.ring, r.Ints(j, "ring", path));
    KZ_ASSIGN_OR_RETURN(p.ring_ports, r.Ints(j, "ring_ports", path));
    return p;
  }
  for (std::string_view key : {"ring", "ring_ports"})
    if (r.Find(j, key)) return r.Error(fmt::format("{}.{}", path, key), "a tree has no ring");
  const Json* root = r.Find(j, "root");
  std::optional<Node> rn;
  if (root && root->is_string()) rn = ParseNode(root->get<std::string>());
  if (!rn) return r.Error(path + ".root", "expected a node name such as \"a0\" or \"w3\"");
  p.root = *rn;
  const Json* edges = r.Find(j, "edges");
  if (!edges || !edges->is_array()) return r.Error(path + ".edges", "expected an array");
  p.edges.reserve(edges->size());
  for (size_t i = 0; i < edges->size(); ++i) {
    const std::string at = fmt::format("{}.edges[{}]", path, i);
    KZ_RETURN_IF_ERROR(r.Keys((*edges)[i], at, {"child", "parent"}));
    KZ_ASSIGN_OR_RETURN(auto child, r.NodePort((*edges)[i], "child", at));
    KZ_ASSIGN_OR_RETURN(auto parent, r.NodePort((*edges)[i], "parent", at));
    p.edges.push_back(TreeEdge{child.first, child.second, parent.first, parent.second});
  }
  return p;
}

std::string IntList(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", v[i]);
  return out + "]";
}

}  // namespace

std::string Node::Name() const { return fmt::format("{}{}", aggregator() ? 'a' : 'w', index); }

std::string_view PartKindName(PartKind k) {
  switch (k) {
    case PartKind::kFullTree:
      return "full-tree";
    case PartKind::kPartialTree:
      return "partial-tree";
    case PartKind::kLine:
      return "line";
    case PartKind::kRing:
      return "ring";
  }
  return "invalid";
}

double Layout::bandwidth() const {
  double sum = 0;
  for (const Part& p : parts) sum += p.bandwidth;
  return sum;
}

int Layout::aggregators_used() const {
  int sum = 0;
  for (const Part& p : parts) sum += p.aggregators;
  return sum;
}

Status Validate(const Layout& l) {
  if (l.workers < 1 || l.workers > kMaxWorkers)
    return InvalidArgument(fmt::format("layout: {} workers: expected 1..{}", l.workers, kMaxWorkers));
  if (l.worker_ports < 1 || l.worker_ports > kMaxWorkerPorts)
    return InvalidArgument(fmt::format("layout: {} ports per worker: expected 1..{} (each is two ports of the "
                                       "topology file, which allows {})",
                                       l.worker_ports, kMaxWorkerPorts, kMaxPortsPerNode));
  if (l.aggregators < 0 || l.aggregators > kMaxAggregators)
    return InvalidArgument(
        fmt::format("layout: {} aggregation devices: expected 0..{}", l.aggregators, kMaxAggregators));
  // Each worker and each device is a node of the topology file (TopologyJson), whose parser allows
  // kMaxNodes: a layout beyond it would be accepted here and refused when the fabric reads its file.
  if (int64_t{l.workers} + l.aggregators > kMaxNodes)
    return InvalidArgument(fmt::format("layout: {} workers and {} aggregation devices: more than {} nodes together",
                                       l.workers, l.aggregators, kMaxNodes));
  if (l.aggregator_ports < (l.aggregators > 0 ? 1 : 0) || l.aggregator_ports > kMaxPortsPerNode)
    return InvalidArgument(fmt::format("layout: {} ports per aggregation device: expected {}..{}", l.aggregator_ports,
                                       l.aggregators > 0 ? 1 : 0, kMaxPortsPerNode));
  if (int64_t{l.workers} * l.worker_ports + int64_t{l.aggregators} * l.aggregator_ports > kMaxLayoutPorts)
    return InvalidArgument(fmt::format("layout: {} x {} worker ports and {} x {} aggregator ports: more than {} ports",
                                       l.workers, l.worker_ports, l.aggregators, l.aggregator_ports, kMaxLayoutPorts));
  if (l.parts.empty()) return InvalidArgument("layout: no parts (nothing would carry the data)");
  PortMap ports(l);
  TreeScratch scratch;
  std::vector<int> aggregator_part(static_cast<size_t>(l.aggregators), -1);
  for (size_t i = 0; i < l.parts.size(); ++i) {
    const Part& part = l.parts[i];
    const int pi = static_cast<int>(i);
    if (!(part.bandwidth > 0) || !std::isfinite(part.bandwidth))
      return InvalidArgument(
          fmt::format("layout: {}: bandwidth {} must be positive", PartName(i, part), part.bandwidth));
    Status s;
    switch (part.kind) {
      case PartKind::kFullTree:
      case PartKind::kPartialTree:
      case PartKind::kLine:
        s = part.ring.empty() && part.ring_ports.empty()
                ? CheckTree(l, part, pi, ports, scratch, aggregator_part)
                : InvalidArgument("a tree has no ring order or ring ports");
        break;
      case PartKind::kRing:
        s = CheckRing(l, part, pi, ports);
        break;
      default:
        s = InvalidArgument(fmt::format("unknown kind {}", static_cast<int>(part.kind)));
    }
    if (!s.ok()) return InvalidArgument(fmt::format("layout: {}: {}", PartName(i, part), s.message()));
  }
  return Status::Ok();
}

std::vector<PartRange> SplitCount(const Layout& layout, uint64_t count, uint64_t align) {
  const size_t n = layout.parts.size();
  std::vector<PartRange> out(n);
  if (n == 0) return out;
  if (align == 0) align = 1;
  // Whole units of `align` elements go by largest remainder; the tail shorter than a unit goes to
  // the last part, so every offset stays aligned.
  const uint64_t units = count / align;
  // Summed in long double, not as bandwidth() does: the quotas must add up to `units` even for
  // counts near 2^64.
  long double total = 0;
  for (const Part& p : layout.parts) total += p.bandwidth;
  std::vector<uint64_t> share(n, 0);
  std::vector<long double> frac(n, 0);
  uint64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    const long double quota = total > 0 ? static_cast<long double>(units) * layout.parts[i].bandwidth / total
                                        : static_cast<long double>(units) / n;
    const long double whole = std::floor(quota);
    share[i] = std::min<uint64_t>(static_cast<uint64_t>(whole), units - given);
    frac[i] = quota - whole;
    given += share[i];
  }
  // Rounding may leave a few units over: the largest remainders (then the lowest index) take one each.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return frac[a] > frac[b]; });
  for (size_t k = 0; given < units; k = (k + 1) % n, ++given) ++share[order[k]];
  uint64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    out[i].offset = offset;
    out[i].count = share[i] * align + (i + 1 == n ? count % align : 0);
    offset += out[i].count;
  }
  return out;
}

std::string TopologyJson(const Layout& layout, double bandwidth_gbps, double latency_us, bool shaping) {
  std::string kinds;
  for (const Part& p : layout.parts) kinds += fmt::format("{}{}", kinds.empty() ? "" : ", ", PartKindName(p.kind));
  std::string out = "{\n";
  out += fmt::format("  \"name\": \"ina-{}w-{}a\",\n", layout.workers, layout.aggregators);
  out += fmt::format(
      "  \"generator\": \"kizuna ina layout: {} workers x {} ports, {} aggregation devices x {} ports; parts: {}; "
      "worker port p is ports 2p (duplex cable, ring transmit) and 2p+1 (ring receive)\",\n",
      layout.workers, layout.worker_ports, layout.aggregators, layout.aggregator_ports, kinds);
  out += fmt::format("  \"shaping\": {},\n", shaping);
  if (bandwidth_gbps > 0 || latency_us > 0)
    out += fmt::format("  \"defaults\": {{\"bandwidth_gbps\": {}, \"latency_us\": {}}},\n", Json(bandwidth_gbps).dump(),
                       Json(latency_us).dump());
  out += "  \"nodes\": [\n";
  const int nodes = layout.workers + layout.aggregators;
  for (int i = 0; i < nodes; ++i) {
    const bool worker = i < layout.workers;
    if (worker)
      out += fmt::format("    {{\"name\": \"w{}\", \"kind\": \"worker\", \"rank\": {}, \"ports\": {}}}", i, i,
                         2 * layout.worker_ports);
    else
      out += fmt::format("    {{\"name\": \"a{}\", \"kind\": \"aggregator\", \"ports\": {}}}", i - layout.workers,
                         layout.aggregator_ports);
    out += i + 1 < nodes ? ",\n" : "\n";
  }
  out += "  ],\n  \"links\": [\n";
  std::vector<std::string> links;
  for (const Part& p : layout.parts) {
    if (p.kind == PartKind::kRing) {
      // One simplex circuit per worker: its port's transmit side to the next one's receive side.
      const size_t n = p.ring.size();
      for (size_t i = 0; i < n && p.ring_ports.size() == n; ++i) {
        const size_t j = (i + 1) % n;
        links.push_back(fmt::format("{{\"a\": \"{}\", \"b\": \"{}\"}}",
                                    TopologyPort(Node::Worker(p.ring[i]), p.ring_ports[i]),
                                    TopologyPort(Node::Worker(p.ring[j]), p.ring_ports[j], /*receive=*/true)));
      }
    } else {
      for (const TreeEdge& e : p.edges)
        links.push_back(fmt::format("{{\"a\": \"{}\", \"b\": \"{}\"}}", TopologyPort(e.child, e.child_port),
                                    TopologyPort(e.parent, e.parent_port)));
    }
  }
  for (size_t i = 0; i < links.size(); ++i) out += "    " + links[i] + (i + 1 < links.size() ? ",\n" : "\n");
  out += "  ]\n}\n";
  return out;
}

std::string ToJson(const Layout& layout) {
  std::string out = "{\n";
  out +=
      fmt::format("  \"workers\": {},\n  \"aggregators\": {},\n  \"worker_ports\": {},\n  \"aggregator_ports\": {},\n",
                  layout.workers, layout.aggregators, layout.worker_ports, layout.aggregator_ports);
  out += "  \"parts\": [";
  for (size_t i = 0; i < layout.parts.size(); ++i) {
    const Part& p = layout.parts[i];
    out += fmt::format("{}\n    {{\"kind\": \"{}\", \"bandwidth\": {}, \"aggregators\": {}, \"worker_ports\": {}",
                       i ? "," : "", PartKindName(p.kind), Json(p.bandwidth).dump(), p.aggregators, p.worker_ports);
    if (p.kind == PartKind::kRing) {
      out += fmt::format(",\n     \"ring\": {},\n     \"ring_ports\": {}}}", IntList(p.ring), IntList(p.ring_ports));
      continue;
    }
    out += fmt::format(", \"root\": \"{}\", \"edges\": [", p.root.Name());
    for (size_t j = 0; j < p.edges.size(); ++j) {
      const TreeEdge& e = p.edges[j];
      out += fmt::format("{}\n      {{\"child\": \"{}\", \"parent\": \"{}\"}}", j ? "," : "",
                         PortName(e.child, e.child_port), PortName(e.parent, e.parent_port));
    }
    out += "]}";
  }
  out += "\n  ]\n}\n";
  return out;
}

Result<Layout> FromJson(const std::string& text, const std::string& what) {
  KZ_ASSIGN_OR_RETURN(const Json j, ParseJson(text, what));
  const Reader r{what};
  KZ_RETURN_IF_ERROR(r.Keys(j, "layout", {"workers", "aggregators", "worker_ports", "aggregator_ports", "parts"}));
  Layout l;
  KZ_ASSIGN_OR_RETURN(int64_t workers, r.Int(j, "workers", "layout", 1, kMaxWorkers));
  KZ_ASSIGN_OR_RETURN(int64_t aggregators, r.Int(j, "aggregators", "layout", 0, kMaxAggregators));
  KZ_ASSIGN_OR_RETURN(int64_t worker_ports, r.Int(j, "worker_ports", "layout", 1, kMaxWorkerPorts));
  KZ_ASSIGN_OR_RETURN(int64_t aggregator_ports, r.Int(j, "aggregator_ports", "layout", 0, kMaxPortsPerNode));
  l.workers = static_cast<int>(workers);
  l.aggregators = static_cast<int>(aggregators);
  l.worker_ports = static_cast<int>(worker_ports);
  l.aggregator_ports = static_cast<int>(aggregator_ports);
  const Json* parts = r.Find(j, "parts");
  if (!parts || !parts->is_array()) return r.Error("layout.parts", "expected an array");
  for (size_t i = 0; i < parts->size(); ++i) {
    KZ_ASSIGN_OR_RETURN(Part p, ReadPart(r, (*parts)[i], fmt::format("parts[{}]", i)));
    l.parts.push_back(std::move(p));
  }
  if (Status s = Validate(l); !s.ok()) return InvalidArgument(fmt::format("{}: {}", what, s.message()));
  return l;
}

Result<Layout> LoadLayoutFile(const std::string& path) {
  KZ_ASSIGN_OR_RETURN(const std::string text, ReadFileCapped(path, kMaxConfigFileBytes, "KIZUNA_INA_LAYOUT file"));
  return FromJson(text, path);
}

Result<std::string> WriteTopologyFile(const Layout& layout) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/kizuna-ina-topology-XXXXXX", tmp != nullptr && *tmp != 0 ? tmp : "/tmp");
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return FromErrno(errno, "mkstemp " + path);
  const std::string json = TopologyJson(layout, 0, 0, false);
  const ssize_t n = ::write(fd, json.data(), json.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(json.size())) {
    ::unlink(path.c_str());
    return FromErrno(n < 0 ? err : EIO, "write " + path);
  }
  return path;
}

}  // namespace kizuna::collectives::ina
