// The partial in-network-aggregation planner (docs/ALGORITHMS.md; NTT's SWoPP 2024 talk):
// which sub-topologies an INA AllReduce should run on, given N workers with D ports each and M
// aggregation devices with E ports each, in a direct-connect (optical circuit switched) network.
//
// The method is the talk's: enumerate sub-topologies whose AllReduce is known (layout.h's table:
// full tree, partial tree with k aggregation devices, line, ring), each an item with a bandwidth,
// a number of aggregation devices and a number of worker ports; since parts on disjoint ports run
// in parallel and their bandwidths add up, choose the multiset of items that maximizes the total
// bandwidth with at most M devices and at most N·D worker ports: a two-dimensional unbounded
// knapsack. Worker ports can be balanced (BuildLayout) so that the total is the only port
// constraint: no worker needs more than D ports. README.md has the derivations; the ring is
// the talk's, one port per worker (N/(2(N−1))), which its slide-20 figures require.
//
// Everything here is exact integer arithmetic on one model and deterministic: every rank computes
// the same plan from the same inputs. Bandwidths are in units of b, one port's bandwidth per
// direction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/ina/layout.h"
#include "runtime/core/status.h"

namespace kizuna::collectives::ina {

// What is available.
struct Problem {
  int workers = 0;           // N, 2..kMaxWorkers
  int aggregators = 0;       // M, 0..kMaxAggregators
  int worker_ports = 0;      // D, 1..kMaxPlannerPorts
  int aggregator_ports = 0;  // E, 3..kMaxPortsPerNode (a tree's device needs a parent and two children)
};

// Each worker's reduce speed (any unit; finite, > 0), or empty: all alike. Given to BuildLayout,
// the layout's reducing roles (the inner workers of lines and chains, which add a child's sums to
// their own) go to the fastest workers that port balance allows and the chain ends (which only
// send and receive) to the slowest; the selection does not depend on them. kInvalidArgument
// naming the worker for a bad speed, or a count other than N.
using WorkerSpeeds = std::vector<double>;
Status CheckWorkerSpeeds(const Problem& p, const WorkerSpeeds& speeds);

// A part uses at least N worker ports, so a plan has at most D parts; 64 ports per worker keeps a
// layout of 65536 workers within kMaxLayoutPorts.
inline constexpr int kMaxPlannerPorts = 64;

// kInvalidArgument naming the value out of range (also when N·D + M·E exceeds kMaxLayoutPorts:
// the layout lists every device available).
Status CheckProblem(const Problem& p);

// T = ⌈(N−2)/(E−2)⌉ (at least 1): the devices of a full tree, the root with E children and the
// others with E−1 (docs/ALGORITHMS.md; the talk's (N−1)/(E−2) approximates it).
int FullTreeAggregators(int workers, int aggregator_ports);

// One sub-topology: a knapsack item. Its bandwidth is value / (2(N − 1)) in units of b, so that
// every comparison is exact: trees and lines have value 2(N − 1) (bandwidth 1), a ring N
// (N/(2(N−1))).
struct Item {
  PartKind kind = PartKind::kRing;
  int aggregators = 0;       // T for a full tree, k for a partial tree, 0 for a line or a ring
  int64_t worker_ports = 0;  // N, 2N − (k(E−2) + 2), 2N − 2, N
  int64_t value = 0;
  double bandwidth(int workers) const { return static_cast<double>(value) / (2.0 * (workers - 1)); }
  friend bool operator==(const Item&, const Item&) = default;
};

// Every item of the problem, whether it fits M or not, in the canonical order: the full tree,
// partial trees from k = T−1 down to 1, the line, the ring.
std::vector<Item> EnumerateItems(const Problem& p);

// A multiset of items and its totals.
struct Pick {
  Item item;
  int count = 0;
};
struct Selection {
  std::vector<Pick> picks;  // canonical order (EnumerateItems'), counts > 0
  int64_t value = 0;        // sum of value × count
  int64_t aggregators = 0;
  int64_t worker_ports = 0;
  int parts() const;
  double bandwidth(int workers) const { return static_cast<double>(value) / (2.0 * (workers - 1)); }
};

// How a selection was found.
enum class Solver : uint8_t {
  kAuto = 0,        // the DP when its table is small (kDpAutoWork), the closed form otherwise
  kDp = 1,          // the talk's dynamic programming, any items
  kClosedForm = 2,  // the exact shortcut for this model's items
};
std::string_view SolverName(Solver s);  // "auto", "dp", "closed-form"
inline constexpr int64_t kDpAutoWork = 200'000'000;  // cells × items: ~0.07 s at -O2 (3·10⁹ a second)
inline constexpr int64_t kDpMaxCells = int64_t{1} << 25;  // 128 MiB of table: beyond, kDp is refused

// The talk's method for any items: dynamic programming over (aggregation devices used 0..M,
// worker ports used 0..P) maximizing the value, ties broken towards fewer devices, then fewer
// ports, then EnumerateItems' order. Speed-ups, none of which changes the answer: items that
// cannot fit or that another item dominates (no more devices, no more ports, no less value) are
// dropped; port weights and P are divided by their gcd; at most ⌊P / fewest ports⌋ items fit, so
// devices beyond that many of the largest item are never used.
struct DpStats {
  int items = 0;        // after dropping
  int64_t rows = 0;     // device budgets 0..M'
  int64_t columns = 0;  // port budgets 0..P/gcd
  int64_t gcd = 0;
  int64_t work() const { return rows * columns * items; }
};
Selection SolveDp(const std::vector<Item>& items, int64_t aggregators, int64_t worker_ports, DpStats* stats = nullptr);
DpStats DpSize(const std::vector<Item>& items, int64_t aggregators, int64_t worker_ports);

// The exact shortcut for this model: every tree-like item has value 2(N − 1) and the ports of a
// partial tree fall by E − 2 per device (a line being k = 0), so a multiset is determined by the
// number of full trees f, of other tree-like parts q, their devices a (0 <= a <= q(T−1)) and of
// rings r. For each (f, q) the most rings that fit win, then the fewest devices: O(D²). The same
// optimum (value, devices, ports) as SolveDp; the test checks it.
Selection SolveClosedForm(const Problem& p);

// The same multiset totals, in the planner's canonical form: partial-tree devices spread as evenly
// as possible over the tree-like parts that are not full trees (a line is k = 0), so the deepest
// part is as shallow as it can be; the totals do not change.
Selection Canonical(const Problem& p, const Selection& s);

// The reference: D parallel rings, one port per worker each, D·N/(2(N−1)) (every "relative to
// ring" ratio divides by it).
double RingBandwidth(const Problem& p);

// The talk's baseline, the aggregation tree protocol: k = min(D, ⌊M/T⌋) full trees used alone
// (bandwidth k), or the D rings (D·N/(2(N−1))) when those are at least as fast.
struct Baseline {
  int trees = 0;
  int rings = 0;  // D when the rings win
  double bandwidth = 0;
};
Baseline BaselineOf(const Problem& p);

// The upper bound: the LP relaxation of the same knapsack (items usable fractionally, M and N·D
// as the only limits), so no plan can exceed it. Two constraints: an optimum mixes at most two
// items; every partial tree is a convex combination of the line and the partial tree with T−1
// devices (ports are affine in k), so four items suffice. The talk's bound is computed from the
// aggregation volume with devices of unlimited ports; this is the fractional version of our model.
double UpperBound(const Problem& p);
// The LP over any items (every single item and every pair), value units.
double LpValue(const std::vector<Item>& items, double aggregators, double worker_ports);

// The concrete layout of a selection: aggregation devices numbered 0.. in part order, every
// worker's ports 0..D−1 used at most once, worker ports balanced (max − min <= 1 port); among
// workers of equal ports used, the fastest (`speeds`, WorkerSpeeds) take the reducing roles. A ring
// visits the workers with a stride coprime to N, chosen so that it cables as few pairs of workers
// as possible that earlier parts already cable (planner.cc, LayoutBuilder::AddRing).
Result<Layout> BuildLayout(const Problem& p, const Selection& s, const WorkerSpeeds& speeds = {});

// The planner's answer.
struct LayoutPlan {
  Problem problem;
  Selection selection;  // canonical
  Solver solver = Solver::kAuto;  // the one that ran
  DpStats dp;                     // when the DP ran
  Layout layout;
  double bandwidth = 0;  // of the layout
  double ring = 0;       // RingBandwidth
  Baseline baseline;
  double upper_bound = 0;
  int min_ports = 0, max_ports = 0;  // ports used per worker
};

// Solves, canonicalizes, builds and validates; kInvalidArgument for a bad problem. Every valid
// problem has a plan: a ring fits in N of the N·D worker ports.
Result<LayoutPlan> PlanLayout(const Problem& p, Solver solver = Solver::kAuto, const WorkerSpeeds& speeds = {});

// The table of NTT's 2024 talk on collectives (8 workers, 4 ports each, the same data time for every row) as
// closed forms: the data time of an AllReduce of L bytes over D parallel channels, 2(N−1)/N·L/D
// (in units of L·b, b seconds per byte per port), and the transfer steps of each algorithm.
struct StepsRow {
  std::string topology;
  std::string algorithm;
  int steps = 0;            // -1: not defined for this N
  double transfer_time = 0;  // × L·b
  std::string how;          // where the count comes from
};
std::vector<StepsRow> Seed002Table(int workers, int worker_ports);

}  // namespace kizuna::collectives::ina
