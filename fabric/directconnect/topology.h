// Direct-connect topologies: nodes (workers, aggregation devices) with a fixed number of ports,
// and point-to-point links between (node, port) pairs, each with a bandwidth and a latency.
//
// The description is JSON (README.md has the full format):
//
//   {
//     "name": "ring-4",
//     "shaping": false,
//     "defaults": {"bandwidth_gbps": 100, "latency_us": 1.5},
//     "nodes": [
//       {"name": "w0", "kind": "worker", "rank": 0, "ports": 2, "interfaces": ["p0", "p1"]},
//       {"name": "a0", "kind": "aggregator", "ports": 8}
//     ],
//     "links": [
//       {"a": "w0:0", "b": "w1:1", "bandwidth_gbps": 200}
//     ]
//   }
//
// Every problem with a file is kInvalidArgument naming the file and the line: a JSON syntax error
// or nesting deeper than 64 levels (runtime/core/json.h) by line:column, a semantic one (a port
// used twice, a link to a missing node, a port index beyond the node's ports, a duplicate rank, an
// unknown key) by the offending entry's line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::fabric::directconnect {

enum class NodeKind : uint8_t { kWorker, kAggregator };
std::string_view NodeKindName(NodeKind kind);

struct TopologyNode {
  std::string name;
  NodeKind kind = NodeKind::kWorker;
  int rank = -1;  // workers: 0 .. worker_count-1; aggregators: -1
  int ports = 0;
  int line = 0;   // where the node is described (0: generated)
  // Where the node is a host of its own and its cables are network links: the interface of each
  // port (the tcp fabric sends over it). Empty: "p<port>", as tools/netns names a cable's ends.
  std::vector<std::string> interfaces;

  std::string InterfaceOf(int port) const;
};

struct PortRef {
  int node = -1;  // index into Topology::nodes
  int port = -1;
  friend bool operator==(const PortRef&, const PortRef&) = default;
};

struct TopologyLink {
  PortRef a, b;
  double bandwidth_gbps = 0;  // per direction; 0: unknown (no bandwidth shaping on this link)
  double latency_us = 0;      // one way; 0: unknown
  int line = 0;
};

// Limits that keep a malformed or hostile file from allocating without bound.
inline constexpr int kMaxTopologyNodes = 1 << 16;
inline constexpr int kMaxPortsPerNode = 1024;

class Topology {
 public:
  std::string name;
  std::string source = "<generated>";  // the file it came from
  bool shaping = false;  // pace transfers to each link's bandwidth and latency (README.md)
  std::vector<TopologyNode> nodes;
  std::vector<TopologyLink> links;

  // Checks the structure (unique names and ranks, ports within range and used once, no
  // self-links, positive bandwidths) and builds the port index. Parsing calls it; generators and
  // hand-built topologies call it too. Errors name the entry (and its line when known).
  Status Finalize();

  int worker_count() const;
  // Index of the node with this name / of the worker with this rank; -1 when none.
  int FindNode(std::string_view node_name) const;
  int WorkerForRank(int rank) const;
  // The link attached to (node, port), or nullptr for an unconnected port. After Finalize.
  const TopologyLink* LinkAt(PortRef ref) const;
  // The other end of (node, port)'s link.
  std::optional<PortRef> PeerOf(PortRef ref) const;
  // "w3:1"
  std::string PortName(PortRef ref) const;
  // "'torus2d-4x4' (/path/t.json)": how errors name the topology.
  std::string Describe() const;
  // A hash of nodes, ports and links (not of names of the file or formatting): ranks whose files
  // describe the same network agree on it.
  uint64_t Fingerprint() const;

 private:
  std::vector<int> port_base_;   // nodes[i]'s ports start at port_base_[i] in port_link_
  std::vector<int> port_link_;   // link index per (node, port), -1 when unconnected
};

// Parses a description; `source` names it in errors ("t.json"). Finalized on success.
Result<Topology> ParseTopology(std::string_view text, std::string_view source);
// Reads and parses a file; kInvalidArgument when it cannot be read (naming the path and errno) or
// is larger than kMaxConfigFileBytes (16 MiB, runtime/core/file.h). `what` starts those errors:
// "KIZUNA_TOPOLOGY file /dev/zero: larger than 16 MiB".
Result<Topology> LoadTopology(const std::string& path, std::string_view what = "topology file");

// The description as JSON in the format ParseTopology reads: one node or link per line, so that
// error lines point at one entry.
std::string TopologyToJson(const Topology& topology);

// ---- Generators ----

struct LinkParams {
  double bandwidth_gbps = 0;  // 0: unknown
  double latency_us = 0;
};

// n workers w0..w{n-1} in a ring; port 0 of wi goes to port 1 of w(i+1 mod n). n >= 2.
Result<Topology> GenerateRing(int n, LinkParams link);
// A torus of dims[0] x dims[1] (x dims[2]) workers; worker rank = x + dims[0] * (y + dims[1] * z).
// Dimension d uses port 2d towards +1 and port 2d+1 towards -1 (wrapping); a dimension of size 1
// leaves its two ports unconnected. 1 to 3 dimensions, each >= 1, at least 2 workers.
Result<Topology> GenerateTorus(const std::vector<int>& dims, LinkParams link);
// n workers, every pair linked once; wi's port j goes to the j-th other worker in rank order. n >= 2.
Result<Topology> GenerateFullyConnected(int n, LinkParams link);

// An optical-circuit-switch configuration: any graph, given as an explicit port map.
struct OcsSpec {
  int workers = 0;
  int worker_ports = 0;
  int aggregators = 0;      // named a0, a1, ...
  int aggregator_ports = 0;
  // Connected port pairs as "node:port" names, e.g. {"w0:0", "a0:3"}.
  std::vector<std::pair<std::string, std::string>> pairs;
};
Result<Topology> GenerateOcs(const OcsSpec& spec, LinkParams link);
// Parses "w0:0=w1:1,w1:0=a0:2" into OcsSpec::pairs (kInvalidArgument naming the bad item).
Result<std::vector<std::pair<std::string, std::string>>> ParsePortMap(std::string_view map);

// The generators by name, for tools: "ring" "8", "torus2d" "4x4", "torus3d" "2x2x2",
// "full" "4" (also "fully_connected"). OCS needs a port map: use GenerateOcs.
Result<Topology> GenerateNamed(std::string_view kind, std::string_view shape, LinkParams link);

}  // namespace kizuna::fabric::directconnect
