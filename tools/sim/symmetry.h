// Symmetry of a simulated run: when the network and every rank's plan look the same from every
// host (or every rank of a torus), one block of ranks is simulated and stands for all of them.
//
// A RankGroup relabels blocks of `unit` consecutive ranks (a rails cluster's hosts, a torus's ranks):
// rank r is local index r % unit of block r / unit, and group element e moves block b to b + e
// (coordinate-wise, modulo the dimensions) or to b XOR e. The group acts freely on ranks, so the
// orbit of a flow from block 0 has exactly order() members, one from each block. A run is
// symmetric when the network is mapped onto itself (Network::Symmetries) and the plan is too:
// the plan of rank g(r) is the plan of r with every peer q replaced by g(q) (PlanIsInvariant).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/status.h"

namespace kizuna::sim {

class RankGroup {
 public:
  enum class Op { kAdd, kXor };
  // kAdd: blocks indexed mixed-radix by `dims` (first dimension fastest); kXor: dims = {blocks},
  // a power of two.
  RankGroup(Op op, int unit, std::vector<int> dims);

  Op op() const { return op_; }
  int unit() const { return unit_; }
  int blocks() const { return blocks_; }
  int order() const { return blocks_; }  // one element per block (a free, transitive action on blocks)
  int ranks() const { return unit_ * blocks_; }
  std::string Describe() const;  // "hosts shifted (256 blocks of 8 ranks)", ...

  // Element e applied to block b / rank r; the element that undoes e.
  int ApplyBlock(int e, int b) const;
  int Apply(int e, int r) const { return ApplyBlock(e, r / unit_) * unit_ + r % unit_; }
  int Inverse(int e) const;
  // The element taking block 0 to block b (for rank r: to r's block): r == Apply(ElementTo(b), r % unit).
  int ElementTo(int b) const { return b; }  // both actions move block 0 to the block of the same index
  // Elements that generate the group (one step along each dimension, or each bit).
  std::vector<int> Generators() const;

 private:
  Op op_;
  int unit_, blocks_;
  std::vector<int> dims_;
};

// Whether a plan commutes with the group: the plan of rank g(r) is r's with every peer q replaced
// by g(q) (kinds, counts and mapped peers agree step by step in every channel). Checked for every
// rank of block 0 under every generator and under `samples` further elements spread over the
// group: checking every rank would cost what the symmetry saves, and a plan that commutes on these
// ranks and not on others would be one whose ranks differ by more than their position.
// CheckedRanks lists the ranks PlanIsInvariant looks at (block 0's first); `plan_of` gives each.
std::vector<int> CheckedRanks(const RankGroup& group, int samples = 4);
bool PlanIsInvariant(const RankGroup& group, const std::function<const collectives::RankPlan&(int rank)>& plan_of,
                     int samples = 4);

}  // namespace kizuna::sim
