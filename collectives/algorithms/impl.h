// The algorithm implementations, one file each (docs/ALGORITHMS.md), reached through
// AllAlgorithms() in algorithm.h; and the direct exchange that pairwise.cc implements and the
// deterministic mode of every reduction algorithm reuses.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/common.h"
#include "collectives/plan/plan.h"

namespace kizuna::collectives::algo {

const AlgorithmImpl& RingAlgorithm();      // ring.cc
const AlgorithmImpl& TreeAlgorithm();      // tree.cc
const AlgorithmImpl& RhdAlgorithm();       // halving_doubling.cc
const AlgorithmImpl& RdAlgorithm();        // recursive_doubling.cc
const AlgorithmImpl& PairwiseAlgorithm();  // pairwise.cc
const AlgorithmImpl& P2pAlgorithm();       // point_to_point.cc
const AlgorithmImpl& FusedAlgorithm();     // fused.cc
const AlgorithmImpl& InaAlgorithm();       // ina.cc
const AlgorithmImpl& HierRingAlgorithm();  // hierarchical.cc
const AlgorithmImpl& HierRdAlgorithm();    // hierarchical.cc
const AlgorithmImpl& HierFusedRingAlgorithm();  // hierarchical.cc
const AlgorithmImpl& HierFusedRdAlgorithm();    // hierarchical.cc
const AlgorithmImpl& FileAlgorithm();           // from_file.cc
const AlgorithmImpl& TorusAlgorithm();          // torus.cc
const AlgorithmImpl& CyclesAlgorithm();         // cycles.cc

// A ring of ranks one way round (torus.cc's lines, cycles.cc's cycles): ranks[j] at place j of
// the ring, this rank at place `me`.
struct Line {
  std::vector<int> ranks;
  int me = 0;
  int d() const { return static_cast<int>(ranks.size()); }
  int Next() const { return ranks[static_cast<size_t>(Mod(me + 1, d()))]; }
  int Prev() const { return ranks[static_cast<size_t>(Mod(me - 1, d()))]; }
};
// The ring's reduce-scatter of Q among `line` on channel c, chunk round by chunk round: the rank
// at place m ends with part m+1 reduced over the line in its output. `first`: add the input (a
// later stage adds what the earlier ones left in the output). torus.cc.
void LineReduceScatter(Builder& b, int c, const Line& line, Range Q, bool first);
// The ring's allgather of Q's parts among `line` on channel c: the rank at place m starts with
// part m+1. torus.cc.
void LineAllGather(Builder& b, int c, const Line& line, Range Q);

// A part of the data that one rank reduces.
struct OwnedPart {
  int owner = -1;
  Range contribution;  // every rank's contribution: its input elements in this range
  Slice result;        // where the reduction goes (contribution.count elements): written by the
                       // owner, and by AllGather on every other rank
};

// The direct exchange (pairwise.cc): every rank sends its contribution to a part straight to
// the part's owner, which reduces all nranks contributions with one kReduce whose sources are in
// rank order 0..nranks-1. That order does not depend on the algorithm, chunk size or channel
// around it, which is what deterministic mode (PlanOptions::deterministic) rests on. Cost: each
// owner receives (nranks-1) contributions of its part and keeps kScratchSlots chunks of each in
// scratch; it needs every (rank, owner) link.
//
// Phases (common.h): for each chunk, nranks-1 exchanges "send to rank+d, receive from rank-d",
// then the owner's reduction (local), then optionally the allgather's nranks-1 exchanges.
//
// For avg the owner's reduction averages (Step::average: the sum divided by nranks, rounded
// once), and the rank's plan is marked RankPlan::averages: an algorithm that makes every result
// of a request with a DirectExchange (deterministic mode, pairwise) needs no dividing epilogue,
// and rounds a float16 / bfloat16 average once, as the fused algorithm does.
class DirectExchange {
 public:
  // At most one part per owner. Reserves the scratch the owner needs.
  DirectExchange(Builder& b, int channel, std::vector<OwnedPart> parts);

  // Chunks of the largest part: call Reduce (and AllGather) for k = 0..rounds()-1.
  uint64_t rounds() const { return rounds_; }
  // Chunk k of every part to its owner, and the owner's ordered reduction of it.
  void Reduce(uint64_t k);
  // Chunk k of every part's result, from its owner to every other rank's `result` slice.
  void AllGather(uint64_t k);

 private:
  Builder& b_;
  int channel_;
  std::vector<OwnedPart> parts_;
  std::vector<int> part_of_;  // rank -> index into parts_, or -1
  uint64_t rounds_ = 0;
  uint64_t slot_ = 0;    // elements per scratch slot
  uint64_t sets_ = 0;    // slot sets, each (nranks-1) slots, used round-robin by chunk
  uint64_t base_ = 0;    // scratch offset
  bool average_ = false;  // an avg request: the owner's reduction divides (Step::average)
};

}  // namespace kizuna::collectives::algo
