// The order the ring algorithms pass data in: rank order where every rank reaches the next one,
// else a cycle through every rank over the links the shape has, as on a torus of cables (2 x 2:
// 0 -> 1 -> 3 -> 2 -> 0) or on hosts cabled in a ring out of rank order. The ring's plans and the
// cost model's ring hops both follow it.
#pragma once

#include <vector>

#include "collectives/plan/topology.h"

namespace kizuna::collectives {

// At most this many steps of the search for a cycle: an unlucky shape fails fast rather than
// searching exponentially long.
inline constexpr int kRingSearchSteps = 1 << 20;

// order[i]: the rank at place i of the ring (order[0] == 0); rank order when r -> r+1 is
// reachable for every r, else the first cycle through every rank over reachable links that a
// depth-first search from rank 0 finds, taking first the neighbours with the fewest unvisited
// neighbours of their own (Warnsdorff), then the lower rank; empty where it finds none.
std::vector<int> RingOrder(const CommTopology& shape);

// Whether `order` is rank order.
bool IsRankOrder(const std::vector<int>& order);

// A torus the shape's links contain: dims[0] x dims[1] (x dims[2]) places, place
// x + dims[0] * (y + dims[1] * z) held by rank order[place], every place linked both ways to the
// places one step away in each dimension (wrapping). The torus algorithm's lines.
struct Torus {
  std::vector<int> dims;   // each >= 2; empty: none
  std::vector<int> order;  // place -> rank

  int rank(int place) const { return order[static_cast<size_t>(place)]; }
  // The place one holding `place` holds after moving `step` places along dimension `dim`.
  int Move(int place, int dim, int step) const;
  // This place's coordinate along `dim`.
  int Coordinate(int place, int dim) const;
};

// The torus of most dimensions (3, then 2, each factor >= 2; the most even factors first) whose
// links the shape has in rank order, as kizuna-topo's generators number a torus's workers; else
// the ring (RingOrder) as a torus of one dimension; dims empty where there is neither.
Torus FindTorus(const CommTopology& shape);

// Up to `want` cycles through every rank over the shape's links that share no cable, for rings
// that keep every port busy (the cycles algorithm): on a 2 x 4 torus, such as 0 1 3 2 4 5 7 6 and
// 0 2 3 5 4 6 7 1. A link serves as many cycles as it bundles cables: LinkDesc::cables where the
// shape counts them, else its speed over the slowest link's, rounded (1 where some link's speed is
// unknown). Both ends of a link must reach each other; forwarded pairs (LinkDesc::hops) are no
// links. A depth-first search as RingOrder's, which backs off from a first cycle that leaves no
// room for the next; at most kRingSearchSteps steps in all. Empty where it finds fewer than `want`
// (always for fewer than 3 ranks, and where every rank reaches every other directly: a switch's
// links, or a full mesh's).
std::vector<std::vector<int>> DisjointCycles(const CommTopology& shape, int want = 2);

}  // namespace kizuna::collectives
