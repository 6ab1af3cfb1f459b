// In-network aggregation layouts (docs/ALGORITHMS.md): which sub-topologies an INA AllReduce runs
// on, how their cables join workers and aggregation devices, and what share of the data each
// carries. The planner (planner.h) produces a Layout; the INA algorithm (algorithms/ina.cc) turns
// one into plans; directconnect runs it on the topology TopologyJson writes (the optical circuit
// switch's port map). Pure data: every rank computes the same Layout from the same inputs.
//
// The model (per port, README.md; NTT's SWoPP 2024 talk's): a worker has D ports, an aggregation
// device E, each with bandwidth b per direction. The optical circuit switch joins ports by
// circuits; a duplex cable joins two ports both ways, and a simplex circuit joins one port's
// transmit side to another port's receive side (so one port can send to one peer and receive from
// another). Bandwidths below are in units of b.
//   full tree     aggregators as a tree (root E children, inner E-1), every worker on one port of
//                 an aggregator; ceil((N-2)/(E-2)) aggregators, N worker ports, bandwidth 1
//   partial tree  k aggregators as a tree with c = k(E-2)+2 free ports (< N); c chains of workers
//                 hang off them (the first worker of a chain on an aggregator port, the rest
//                 one behind the other); 2N - c worker ports, bandwidth 1
//   line          the workers as one chain rooted at a worker in its middle (no aggregator);
//                 2N - 2 worker ports, bandwidth 1
//   ring          a unidirectional ring on one port per worker, by simplex circuits: each worker's
//                 port sends to the next worker's port and receives from the previous one's; a
//                 ring allreduce; N worker ports, bandwidth N / (2(N - 1))
// Trees and lines use duplex cables: they reduce towards the root as data streams in and
// broadcast the result back down the same cables (each carries the part's bytes once each way).
// D rings alone (D parallel rings, bandwidth D·N/(2(N-1))) are the reference every planner ratio
// is given against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::collectives::ina {

// Limits that Validate and FromJson enforce, so that a malformed or hostile file cannot allocate
// without bound: node counts as a topology file's (kMaxTopologyNodes), ports per node as its
// kMaxPortsPerNode, and all ports of the job together.
inline constexpr int kMaxWorkers = 65536;
inline constexpr int kMaxAggregators = 65536;
// Workers and aggregation devices together: each is a node of the layout's topology file.
inline constexpr int kMaxNodes = 65536;
inline constexpr int kMaxPortsPerNode = 1024;
inline constexpr int64_t kMaxLayoutPorts = int64_t{1} << 24;

// A node: worker `index` (the communicator's rank) or aggregation device `index`.
struct Node {
  enum class Kind : uint8_t { kWorker = 0, kAggregator = 1 };
  Kind kind = Kind::kWorker;
  int index = 0;

  static Node Worker(int i) { return {Kind::kWorker, i}; }
  static Node Aggregator(int i) { return {Kind::kAggregator, i}; }
  bool aggregator() const { return kind == Kind::kAggregator; }
  std::string Name() const;  // "w3", "a1" (the directconnect node names)
  friend bool operator==(const Node&, const Node&) = default;
};

enum class PartKind : uint8_t { kFullTree = 0, kPartialTree = 1, kLine = 2, kRing = 3 };
std::string_view PartKindName(PartKind k);  // "full-tree", "partial-tree", "line", "ring"

// A tree's cable between a node and its parent: child's port `child_port` to parent's port
// `parent_port`.
struct TreeEdge {
  Node child;
  int child_port = 0;
  Node parent;
  int parent_port = 0;
  friend bool operator==(const TreeEdge&, const TreeEdge&) = default;
};

struct Part {
  PartKind kind = PartKind::kRing;
  double bandwidth = 0;   // algorithm bandwidth in units of b (the table above)
  int aggregators = 0;    // aggregation devices it uses
  int worker_ports = 0;   // ports it uses, summed over all workers
  // Trees (full tree, partial tree, line): the root (an aggregator, or a worker for a line) and
  // one edge per other node of the tree, every worker of the job in it exactly once. Children of
  // a node are its edges' children in the order the edges appear.
  Node root;
  std::vector<TreeEdge> edges;
  // Ring: every worker once, in ring order, and each one's port: ring[i]'s port ring_ports[i]
  // transmits to ring[i+1 mod n]'s port ring_ports[i+1 mod n] (a simplex circuit) and receives from
  // ring[i-1 mod n]'s.
  std::vector<int> ring;
  std::vector<int> ring_ports;
};

struct Layout {
  int workers = 0;           // N
  int aggregators = 0;       // M, available (parts may use fewer)
  int worker_ports = 0;      // D
  int aggregator_ports = 0;  // E
  std::vector<Part> parts;   // run concurrently, each on its share of the data

  double bandwidth() const;      // the sum of the parts' bandwidths (they add up)
  int aggregators_used() const;  // the sum of the parts' aggregators
};

// Checks a layout: counts positive, every tree spans every worker once and is a tree, every ring
// holds every worker once, every port within its node's range and used by one cable only (across
// all parts), every aggregator index below `aggregators`, bandwidths positive. kInvalidArgument
// naming the part and the problem.
Status Validate(const Layout& layout);

// The elements [offset, offset + count) of part i, for a buffer of `count` elements split in
// proportion to the parts' bandwidths (largest remainder; the counts add up to `count`; every
// part's offset a multiple of `align` elements except where count runs out). Deterministic.
struct PartRange {
  uint64_t offset = 0;
  uint64_t count = 0;
};
std::vector<PartRange> SplitCount(const Layout& layout, uint64_t count, uint64_t align);

// The directconnect topology file of the layout (fabric/directconnect/README.md), whose links are
// duplex and take one per port: nodes w0..w(N-1) (ranks 0..N-1) with 2D ports and a0..a(M-1) with
// E ports. Worker port p is directconnect ports 2p (its duplex cable, or the transmit side of a
// simplex circuit) and 2p+1 (the receive side of a simplex circuit): a duplex cable from worker
// port p to device port q is the link wI:2p - aJ:q (wI:2p - wJ:2q between workers), a simplex
// circuit from wI's port p to wJ's port q is the link wI:2p - wJ:2q+1. Links get
// `bandwidth_gbps` and `latency_us` (0: unknown) and `shaping` as given.
std::string TopologyJson(const Layout& layout, double bandwidth_gbps, double latency_us, bool shaping);

// The layout as JSON and back (kizuna-plan --layout, KIZUNA_INA_LAYOUT); FromJson validates.
// Errors name `what` and the place: a JSON syntax error or nesting deeper than 64 levels by
// line:column (runtime/core/json.h), a bad value by its key's path ("parts[2].edges[5].child").
std::string ToJson(const Layout& layout);
Result<Layout> FromJson(const std::string& text, const std::string& what);

// KIZUNA_INA_LAYOUT's file, read and validated (FromJson names the problem, prefixed with the
// path). A file larger than kMaxConfigFileBytes (16 MiB, runtime/core/file.h), or a device or FIFO
// that never ends, is refused: "KIZUNA_INA_LAYOUT file /dev/zero: larger than 16 MiB".
Result<Layout> LoadLayoutFile(const std::string& path);
// The layout's cables as a directconnect topology file (TopologyJson, no shaping) in $TMPDIR (else
// /tmp); returns its path. The caller removes it once the fabrics have read it. Every rank writes
// the same content, so their topology fingerprints agree.
Result<std::string> WriteTopologyFile(const Layout& layout);

}  // namespace kizuna::collectives::ina
