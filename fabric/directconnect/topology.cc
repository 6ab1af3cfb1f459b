#include "fabric/directconnect/topology.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fabric/directconnect/topology_internal.h"
#include "runtime/core/file.h"
#include "runtime/core/json.h"

namespace kizuna::fabric::directconnect {
namespace {

using Json = nlohmann::json;

// ---- Where things are in the text ----
//
// nlohmann's DOM keeps no source positions, so once the text has parsed, a small scanner (which
// may assume valid JSON) records where each top-level key and each element of the "nodes" and
// "links" arrays starts. Semantic errors then name the entry's line.
struct SourcePositions {
  std::map<std::string, size_t> top_keys;
  std::vector<size_t> nodes;
  std::vector<size_t> links;
};

SourcePositions ScanPositions(std::string_view t) {
  SourcePositions p;
  std::vector<char> stack;
  std::string key;                       // the last key seen in the top-level object
  std::vector<size_t>* elements = nullptr;  // the array of interest, while inside it
  bool expect_element = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (expect_element) {
      expect_element = false;
      if (c != ']' && elements != nullptr) elements->push_back(i);
    }
    if (c == '"') {
      const size_t start = i;
      size_t j = i + 1;
      while (j < t.size() && t[j] != '"') j += t[j] == '\\' ? 2 : 1;
      const std::string_view s = t.substr(start + 1, std::min(j, t.size()) - start - 1);
      i = j;
      if (stack.size() == 1 && stack[0] == '{') {
        size_t k = j + 1;
        while (k < t.size() && (t[k] == ' ' || t[k] == '\t' || t[k] == '\n' || t[k] == '\r')) ++k;
        if (k < t.size() && t[k] == ':') {
          key = std::string(s);
          p.top_keys.emplace(key, start);
        }
      }
      continue;
    }
    if (c == '{' || c == '[') {
      stack.push_back(c);
      if (c == '[' && stack.size() == 2 && stack[0] == '{' && (key == "nodes" || key == "links")) {
        elements = key == "nodes" ? &p.nodes : &p.links;
        expect_element = true;
      }
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
      if (stack.size() < 2) elements = nullptr;
    } else if (c == ',' && elements != nullptr && stack.size() == 2) {
      expect_element = true;
    }
  }
  return p;
}

// Errors at an entry: "t.json:14: node 'w0': ...", or without a line for generated topologies.
Status EntryError(std::string_view source, int line, std::string_view message) {
  if (line > 0) return InvalidArgument(fmt::format("{}:{}: {}", source, line, message));
  return InvalidArgument(fmt::format("{}: {}", source, message));
}

// A value in an error message: short, and never printed deeper than a few levels (ParseJson has
// refused deeper files already; this keeps a message's size bounded too).
std::string Compact(const Json& j) { return JsonExcerpt(j, 120); }

std::string_view TypeName(const Json& j) { return j.type_name(); }

Result<int64_t> GetInteger(const Json& j, std::string_view what, int64_t lo, int64_t hi) {
  bool in_range = false;
  int64_t v = 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(hi);
    v = in_range ? static_cast<int64_t>(u) : hi;
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
    in_range = true;
  } else {
    return InvalidArgument(fmt::format("{} must be an integer, not {} {}", what, TypeName(j), Compact(j)));
  }
  if (!in_range || v < lo || v > hi)
    return InvalidArgument(fmt::format("{} is {}, outside [{}, {}]", what, Compact(j), lo, hi));
  return v;
}

Result<double> GetNonNegative(const Json& j, std::string_view what) {
  if (!j.is_number()) return InvalidArgument(fmt::format("{} must be a number, not {} {}", what, TypeName(j), Compact(j)));
  const double v = j.get<double>();
  if (!std::isfinite(v) || v < 0) return InvalidArgument(fmt::format("{} must be finite and >= 0, not {}", what, Compact(j)));
  return v;
}

Status CheckKeys(const Json& object, std::initializer_list<std::string_view> allowed, std::string_view what) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      std::string list;
      for (std::string_view a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return InvalidArgument(fmt::format("{}: unknown key {} (known: {})", what, Compact(Json(it.key())), list));
    }
  }
  return Status::Ok();
}


struct Defaults {
  double bandwidth_gbps = 0;
  double latency_us = 0;
};

Status ParseNode(const Json& j, size_t index, int line, std::string_view source, Topology& topo) {
  const std::string what = fmt::format("nodes[{}]", index);
  if (!j.is_object()) return EntryError(source, line, fmt::format("{} must be an object, not {}", what, Compact(j)));
  if (Status s = CheckKeys(j, {"name", "kind", "rank", "ports", "interfaces"}, what); !s.ok())
    return EntryError(source, line, s.message());
  TopologyNode node;
  node.line = line;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty())
    return EntryError(source, line, fmt::format("{} needs a non-empty string \"name\"", what));
  node.name = name->get<std::string>();
  const std::string label = fmt::format("node '{}'", node.name);
  if (auto kind = j.find("kind"); kind != j.end()) {
    if (!kind->is_string()) return EntryError(source, line, fmt::format("{}: \"kind\" must be a string", label));
    const std::string k = kind->get<std::string>();
    if (k == "worker") node.kind = NodeKind::kWorker;
    else if (k == "aggregator") node.kind = NodeKind::kAggregator;
    else
      return EntryError(source, line,
                        fmt::format("{}: kind {} is neither \"worker\" nor \"aggregator\"", label, Compact(*kind)));
  }
  auto ports = j.find("ports");
  if (ports == j.end()) return EntryError(source, line, fmt::format("{} needs \"ports\"", label));
  auto p = GetInteger(*ports, fmt::format("{}: ports", label), 1, kMaxPortsPerNode);
  if (!p.ok()) return EntryError(source, line, p.status().message());
  node.ports = static_cast<int>(*p);
  if (auto rank = j.find("rank"); rank != j.end()) {
    if (node.kind != NodeKind::kWorker)
      return EntryError(source, line, fmt::format("{}: an aggregator has no rank", label));
    auto r = GetInteger(*rank, fmt::format("{}: rank", label), 0, kMaxTopologyNodes - 1);
    if (!r.ok()) return EntryError(source, line, r.status().message());
    node.rank = static_cast<int>(*r);
  }
  if (auto interfaces = j.find("interfaces"); interfaces != j.end()) {
    if (!interfaces->is_array() || interfaces->size() != static_cast<size_t>(node.ports))
      return EntryError(source, line,
                        fmt::format("{}: \"interfaces\" must list one interface name per port ({})", label,
                                    node.ports));
    for (const Json& i : *interfaces) {
      // An interface name as the kernel takes it: 1-15 characters, no '/', ':' or blank.
      if (!i.is_string() || i.get<std::string>().empty() || i.get<std::string>().size() > 15 ||
          i.get<std::string>().find_first_of("/: \t") != std::string::npos)
        return EntryError(source, line, fmt::format("{}: {} is not an interface name", label, Compact(i)));
      node.interfaces.push_back(i.get<std::string>());
    }
  }
  topo.nodes.push_back(std::move(node));
  return Status::Ok();
}

// Node names to their index in Topology::nodes, so that a file's links find their ends in constant
// time (a linear search per link made a large file's parse quadratic: minutes for 16 MiB).
using NodeNames = std::unordered_map<std::string_view, int>;

Status ParseLink(const Json& j, size_t index, int line, std::string_view source, const Defaults& defaults,
                 const NodeNames& node_names, Topology& topo) {
  const std::string what = fmt::format("links[{}]", index);
  if (!j.is_object()) return EntryError(source, line, fmt::format("{} must be an object, not {}", what, Compact(j)));
  if (Status s = CheckKeys(j, {"a", "b", "bandwidth_gbps", "latency_us"}, what); !s.ok())
    return EntryError(source, line, s.message());
  TopologyLink link;
  link.line = line;
  link.bandwidth_gbps = defaults.bandwidth_gbps;
  link.latency_us = defaults.latency_us;
  PortRef* ends[2] = {&link.a, &link.b};
  const char* names[2] = {"a", "b"};
  for (int e = 0; e < 2; ++e) {
    auto end = j.find(names[e]);
    if (end == j.end() || !end->is_string())
      return EntryError(source, line, fmt::format("{} needs \"{}\": \"node:port\"", what, names[e]));
    auto split = internal::SplitPortName(end->get<std::string>());
    if (!split.ok()) return EntryError(source, line, fmt::format("{}.{}: {}", what, names[e], split.status().message()));
    const auto found = node_names.find(split->first);
    const int node = found == node_names.end() ? -1 : found->second;
    if (node < 0)
      return EntryError(source, line, fmt::format("link {}: node '{}' is not in \"nodes\"", Compact(j), split->first));
    *ends[e] = PortRef{node, split->second};
  }
  if (auto bw = j.find("bandwidth_gbps"); bw != j.end()) {
    auto v = GetNonNegative(*bw, fmt::format("{}: bandwidth_gbps", what));
    if (!v.ok()) return EntryError(source, line, v.status().message());
    link.bandwidth_gbps = *v;
  }
  if (auto lat = j.find("latency_us"); lat != j.end()) {
    auto v = GetNonNegative(*lat, fmt::format("{}: latency_us", what));
    if (!v.ok()) return EntryError(source, line, v.status().message());
    link.latency_us = *v;
  }
  topo.links.push_back(link);
  return Status::Ok();
}

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
template <typename T>
uint64_t FnvValue(uint64_t h, const T& v) {
  return Fnv(h, &v, sizeof(v));
}

// ---- Topology::Finalize's steps ----

// Each node's name (not empty, not used twice), port count and kind; counts the workers, and
// those that were given a rank.
Status CheckNodes(const Topology& t, int& workers, int& with_rank) {
  std::map<std::string_view, const TopologyNode*> names;
  for (const TopologyNode& n : t.nodes) {
    if (n.name.empty()) return EntryError(t.source, n.line, "a node has an empty name");
    if (auto [it, fresh] = names.emplace(n.name, &n); !fresh)
      return EntryError(t.source, n.line,
                        fmt::format("node '{}' is described twice{}", n.name,
                                    it->second->line > 0 ? fmt::format(" (first at line {})", it->second->line) : ""));
    if (n.ports < 1 || n.ports > kMaxPortsPerNode)
      return EntryError(t.source, n.line,
                        fmt::format("node '{}': {} ports, outside [1, {}]", n.name, n.ports, kMaxPortsPerNode));
    if (n.kind == NodeKind::kWorker) {
      ++workers;
      with_rank += n.rank >= 0 ? 1 : 0;
    } else if (n.rank >= 0) {
      return EntryError(t.source, n.line, fmt::format("node '{}': an aggregator has no rank", n.name));
    }
  }
  return Status::Ok();
}

// The workers' ranks: in order of appearance when none was given one, else as given, which every
// worker then must have. Each rank in range, and one worker's.
Status AssignRanks(Topology& t, int workers, int with_rank) {
  if (with_rank == 0) {
    int next = 0;  // ranks in order of appearance
    for (TopologyNode& n : t.nodes)
      if (n.kind == NodeKind::kWorker) n.rank = next++;
  } else if (with_rank != workers) {
    for (const TopologyNode& n : t.nodes)
      if (n.kind == NodeKind::kWorker && n.rank < 0)
        return EntryError(t.source, n.line,
                          fmt::format("worker '{}' has no rank, but other workers have one: give every worker a "
                                      "rank, or none (ranks then follow the order of \"nodes\")",
                                      n.name));
  }
  std::vector<const TopologyNode*> by_rank(static_cast<size_t>(workers), nullptr);
  for (const TopologyNode& n : t.nodes) {
    if (n.kind != NodeKind::kWorker) continue;
    if (n.rank >= workers)
      return EntryError(t.source, n.line,
                        fmt::format("worker '{}': rank {} out of range: there are {} workers (ranks 0..{})", n.name,
                                    n.rank, workers, workers - 1));
    if (by_rank[n.rank] != nullptr)
      return EntryError(t.source, n.line,
                        fmt::format("worker '{}': rank {} is already worker '{}'s", n.name, n.rank,
                                    by_rank[n.rank]->name));
    by_rank[n.rank] = &n;
  }
  return Status::Ok();
}

// The port table: `base[i]`, where node i's ports start in it, and `link_of`, each port's link
// (-1: none). Each link joins two ports that exist and no other link uses, on two nodes, with
// finite figures.
Status MapLinks(const Topology& t, std::vector<int>& base, std::vector<int>& link_of) {
  base.assign(t.nodes.size(), 0);
  int total = 0;
  for (size_t i = 0; i < t.nodes.size(); ++i) {
    base[i] = total;
    total += t.nodes[i].ports;
  }
  link_of.assign(static_cast<size_t>(total), -1);
  for (size_t li = 0; li < t.links.size(); ++li) {
    const TopologyLink& l = t.links[li];
    const PortRef ends[2] = {l.a, l.b};
    for (const PortRef& e : ends) {
      if (e.node < 0 || static_cast<size_t>(e.node) >= t.nodes.size())
        return EntryError(t.source, l.line, fmt::format("link #{}: node index {} does not exist", li, e.node));
      const TopologyNode& n = t.nodes[e.node];
      if (e.port < 0 || e.port >= n.ports)
        return EntryError(t.source, l.line,
                          fmt::format("link {} - {}: port {} is beyond node '{}'s {} port(s) (0..{})", t.PortName(l.a),
                                      t.PortName(l.b), e.port, n.name, n.ports, n.ports - 1));
      int& slot = link_of[base[e.node] + e.port];
      if (slot >= 0) {
        const TopologyLink& other = t.links[slot];
        return EntryError(t.source, l.line,
                          fmt::format("link {} - {}: port {} is already used by link {} - {}{}", t.PortName(l.a),
                                      t.PortName(l.b), t.PortName(e), t.PortName(other.a), t.PortName(other.b),
                                      other.line > 0 ? fmt::format(" (line {})", other.line) : ""));
      }
      slot = static_cast<int>(li);
    }
    if (l.a.node == l.b.node)
      return EntryError(t.source, l.line, fmt::format("link {} - {} connects node '{}' to itself", t.PortName(l.a),
                                                       t.PortName(l.b), t.nodes[l.a.node].name));
    if (!std::isfinite(l.bandwidth_gbps) || l.bandwidth_gbps < 0 || !std::isfinite(l.latency_us) || l.latency_us < 0)
      return EntryError(t.source, l.line, fmt::format("link {} - {}: bandwidth and latency must be finite and >= 0",
                                                       t.PortName(l.a), t.PortName(l.b)));
  }
  return Status::Ok();
}

// ---- ParseTopology's steps ----

// The "defaults" object `d` (at `line`): the figures of links that give none of their own.
Result<Defaults> ParseDefaults(const Json& d, int line, std::string_view source) {
  Defaults defaults;
  if (!d.is_object()) return EntryError(source, line, "\"defaults\" must be an object");
  if (Status s = CheckKeys(d, {"bandwidth_gbps", "latency_us"}, "defaults"); !s.ok())
    return EntryError(source, line, s.message());
  if (auto bw = d.find("bandwidth_gbps"); bw != d.end()) {
    auto v = GetNonNegative(*bw, "defaults.bandwidth_gbps");
    if (!v.ok()) return EntryError(source, line, v.status().message());
    defaults.bandwidth_gbps = *v;
  }
  if (auto lat = d.find("latency_us"); lat != d.end()) {
    auto v = GetNonNegative(*lat, "defaults.latency_us");
    if (!v.ok()) return EntryError(source, line, v.status().message());
    defaults.latency_us = *v;
  }
  return defaults;
}

}  // namespace

namespace internal {

// "w0:3" -> ("w0", 3); the node name may itself contain ':' (the last one separates the port).
Result<std::pair<std::string, int>> SplitPortName(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size())
    return InvalidArgument(fmt::format("\"{}\" is not of the form node:port", s));
  int port = 0;
  for (size_t i = colon + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9' || port > kMaxPortsPerNode)
      return InvalidArgument(fmt::format("\"{}\": port \"{}\" is not a port number", s, s.substr(colon + 1)));
    port = port * 10 + (s[i] - '0');
  }
  return std::pair<std::string, int>(std::string(s.substr(0, colon)), port);
}

}  // namespace internal

std::string_view NodeKindName(NodeKind kind) { return kind == NodeKind::kWorker ? "worker" : "aggregator"; }

// ---- Topology ----

int Topology::worker_count() const {
  int n = 0;
  for (const TopologyNode& node : nodes) n += node.kind == NodeKind::kWorker ? 1 : 0;
  return n;
}

int Topology::FindNode(std::string_view node_name) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].name == node_name) return static_cast<int>(i);
  return -1;
}

int Topology::WorkerForRank(int rank) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].kind == NodeKind::kWorker && nodes[i].rank == rank) return static_cast<int>(i);
  return -1;
}

const TopologyLink* Topology::LinkAt(PortRef ref) const {
  if (ref.node < 0 || static_cast<size_t>(ref.node) >= nodes.size() || port_base_.size() != nodes.size()) return nullptr;
  if (ref.port < 0 || ref.port >= nodes[ref.node].ports) return nullptr;
  const int link = port_link_[port_base_[ref.node] + ref.port];
  return link < 0 ? nullptr : &links[link];
}

std::optional<PortRef> Topology::PeerOf(PortRef ref) const {
  const TopologyLink* link = LinkAt(ref);
  if (link == nullptr) return std::nullopt;
  return link->a == ref ? link->b : link->a;
}

std::string Topology::PortName(PortRef ref) const {
  if (ref.node < 0 || static_cast<size_t>(ref.node) >= nodes.size()) return fmt::format("node#{}:{}", ref.node, ref.port);
  return fmt::format("{}:{}", nodes[ref.node].name, ref.port);
}

std::string Topology::Describe() const {
  return fmt::format("'{}' ({})", name.empty() ? std::string("unnamed") : name, source);
}

uint64_t Topology::Fingerprint() const {
  uint64_t h = 0xcbf29ce484222325ull;
  h = FnvValue(h, nodes.size());
  for (const TopologyNode& n : nodes) {
    h = Fnv(h, n.name.data(), n.name.size());
    h = FnvValue(h, static_cast<int>(n.kind));
    h = FnvValue(h, n.rank);
    h = FnvValue(h, n.ports);
  }
  h = FnvValue(h, links.size());
  for (const TopologyLink& l : links) {
    h = FnvValue(h, l.a.node);
    h = FnvValue(h, l.a.port);
    h = FnvValue(h, l.b.node);
    h = FnvValue(h, l.b.port);
    h = FnvValue(h, l.bandwidth_gbps);
    h = FnvValue(h, l.latency_us);
  }
  h = FnvValue(h, shaping);
  return h;
}

Status Topology::Finalize() {
  port_base_.clear();
  port_link_.clear();
  if (nodes.empty()) return EntryError(source, 0, "the topology has no nodes");
  if (nodes.size() > static_cast<size_t>(kMaxTopologyNodes))
    return EntryError(source, 0, fmt::format("{} nodes exceed the limit of {}", nodes.size(), kMaxTopologyNodes));
  int workers = 0, with_rank = 0;
  KZ_RETURN_IF_ERROR(CheckNodes(*this, workers, with_rank));
  KZ_RETURN_IF_ERROR(AssignRanks(*this, workers, with_rank));
  std::vector<int> base, link_of;
  KZ_RETURN_IF_ERROR(MapLinks(*this, base, link_of));
  port_base_ = std::move(base);
  port_link_ = std::move(link_of);
  return Status::Ok();
}

// ---- Parsing ----

Result<Topology> ParseTopology(std::string_view text, std::string_view source) {
  KZ_ASSIGN_OR_RETURN(const Json j, ParseJson(text, source));
  const SourcePositions pos = ScanPositions(text);
  const LineIndex lines(text);
  auto key_line = [&](const std::string& key) {
    auto it = pos.top_keys.find(key);
    return it == pos.top_keys.end() ? 0 : lines.LineAt(it->second);
  };

  Topology topo;
  topo.source = std::string(source);
  if (!j.is_object()) return EntryError(source, 1, fmt::format("the topology must be a JSON object, not {}", TypeName(j)));
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "name" && k != "shaping" && k != "defaults" && k != "nodes" && k != "links" && k != "generator")
      return EntryError(source, key_line(k),
                        fmt::format("unknown key {} (known: name, shaping, defaults, nodes, links, generator)",
                                    Compact(Json(k))));
  }
  if (auto name = j.find("name"); name != j.end()) {
    if (!name->is_string()) return EntryError(source, key_line("name"), "\"name\" must be a string");
    topo.name = name->get<std::string>();
  }
  if (auto generator = j.find("generator"); generator != j.end() && !generator->is_string())
    return EntryError(source, key_line("generator"), "\"generator\" must be a string");
  if (auto shaping = j.find("shaping"); shaping != j.end()) {
    if (!shaping->is_boolean()) return EntryError(source, key_line("shaping"), "\"shaping\" must be true or false");
    topo.shaping = shaping->get<bool>();
  }
  Defaults defaults;
  if (auto d = j.find("defaults"); d != j.end()) {
    KZ_ASSIGN_OR_RETURN(defaults, ParseDefaults(*d, key_line("defaults"), source));
  }

  auto nodes = j.find("nodes");
  if (nodes == j.end() || !nodes->is_array() || nodes->empty())
    return EntryError(source, key_line("nodes"), "\"nodes\" must be a non-empty array");
  if (nodes->size() > static_cast<size_t>(kMaxTopologyNodes))
    return EntryError(source, key_line("nodes"),
                      fmt::format("{} nodes exceed the limit of {}", nodes->size(), kMaxTopologyNodes));
  topo.nodes.reserve(nodes->size());  // NodeNames points into the nodes' names: no reallocation
  NodeNames names;
  for (size_t i = 0; i < nodes->size(); ++i) {
    const int line = i < pos.nodes.size() ? lines.LineAt(pos.nodes[i]) : 0;
    KZ_RETURN_IF_ERROR(ParseNode((*nodes)[i], i, line, source, topo));
    const TopologyNode& n = topo.nodes.back();
    if (auto [it, fresh] = names.emplace(n.name, static_cast<int>(i)); !fresh)
      return EntryError(source, line,
                        fmt::format("node '{}' is described twice (first at line {})", n.name,
                                    topo.nodes[static_cast<size_t>(it->second)].line));
  }
  if (auto links = j.find("links"); links != j.end()) {
    if (!links->is_array()) return EntryError(source, key_line("links"), "\"links\" must be an array");
    for (size_t i = 0; i < links->size(); ++i) {
      const int line = i < pos.links.size() ? lines.LineAt(pos.links[i]) : 0;
      KZ_RETURN_IF_ERROR(ParseLink((*links)[i], i, line, source, defaults, names, topo));
    }
  }
  KZ_RETURN_IF_ERROR(topo.Finalize());
  return topo;
}

Result<Topology> LoadTopology(const std::string& path, std::string_view what) {
  KZ_ASSIGN_OR_RETURN(const std::string text, ReadFileCapped(path, kMaxConfigFileBytes, what));
  return ParseTopology(text, path);
}

std::string TopologyNode::InterfaceOf(int port) const {
  return static_cast<size_t>(port) < interfaces.size() ? interfaces[static_cast<size_t>(port)]
                                                       : fmt::format("p{}", port);
}

std::string TopologyToJson(const Topology& t) {
  using Ordered = nlohmann::ordered_json;
  auto dump = [](const Ordered& j) { return j.dump(-1, ' ', false, Ordered::error_handler_t::replace); };
  std::string out = "{\n";
  out += fmt::format("  \"name\": {},\n", dump(Ordered(t.name)));
  out += fmt::format("  \"shaping\": {},\n", t.shaping ? "true" : "false");
  out += "  \"nodes\": [\n";
  for (size_t i = 0; i < t.nodes.size(); ++i) {
    const TopologyNode& n = t.nodes[i];
    Ordered j;
    j["name"] = n.name;
    j["kind"] = std::string(NodeKindName(n.kind));
    if (n.kind == NodeKind::kWorker) j["rank"] = n.rank;
    j["ports"] = n.ports;
    if (!n.interfaces.empty()) j["interfaces"] = n.interfaces;
    out += "    " + dump(j) + (i + 1 < t.nodes.size() ? ",\n" : "\n");
  }
  out += "  ],\n  \"links\": [\n";
  for (size_t i = 0; i < t.links.size(); ++i) {
    const TopologyLink& l = t.links[i];
    Ordered j;
    j["a"] = t.PortName(l.a);
    j["b"] = t.PortName(l.b);
    j["bandwidth_gbps"] = l.bandwidth_gbps;
    j["latency_us"] = l.latency_us;
    out += "    " + dump(j) + (i + 1 < t.links.size() ? ",\n" : "\n");
  }
  out += "  ]\n}\n";
  return out;
}

}  // namespace kizuna::fabric::directconnect
