// The double binary tree's geometry (NCCL's btree and dtree), which the tree algorithm builds its
// plans on and the cost model predicts them on: the two trees over the ranks, where AllReduce puts
// ranks of unlike speed, and how much of the data each tree carries.
//
// Tree shape: NCCL's btree over labels 0..n-1 (root 0 with a single child, the largest power of
// two below n; other nodes' parent found from their lowest set bit; odd labels are leaves).
// AllReduce's second tree is the first mirrored (n even) or shifted by one (n odd), as in NCCL;
// the rooted trees (Broadcast, Reduce) keep the root at label 0 and mirror (odd) or shift (even)
// the other ranks' labels, so the second tree's leaves are again mostly the first one's inner
// nodes.
#pragma once

#include <vector>

#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"

namespace kizuna::collectives {

// NCCL's btree: the parent of `label` among labels 0..n-1 (-1 for the root, label 0).
int BtreeParent(int n, int label);

struct Tree {
  std::vector<int> parent;                 // per rank; -1 at the root
  std::vector<std::vector<int>> children;  // per rank, ascending
  std::vector<int> depth;                  // per rank; 0 at the root
  int root = 0;
  int height = 0;  // the largest depth
};

// The btree with rank r at label label_of[r].
Tree MakeTree(const std::vector<int>& label_of);

// AllReduce's placement of ranks on the first tree's labels (label_of[r]): the identity, or, with
// `balance`, every reduce speed known and unequal and every pair of ranks linked, the slowest
// floor(n / 2) reducers on the odd labels, which are the first tree's leaves (a leaf reduces
// nothing), in rank order, and the others on the even labels. The second tree (mirrored or
// shifted) then has them inner, and TreeWeights gives the first, fast tree most of the data.
std::vector<int> AllReduceLabels(const CommTopology& shape, bool balance);

// The two trees: AllReduce (root < 0) as NCCL builds them, the first with rank r at labels[r]
// (AllReduceLabels; empty: the identity); Broadcast / Reduce both rooted at `root`.
std::vector<Tree> MakeTrees(int n, int root, const std::vector<int>& labels = {});

// How much of the data each of the two trees carries: with `balance` and every speed known, in
// proportion to the trees' streaming rates — a pipelined tree streams at the pace of its slowest
// stage: its slowest edge (both directions in AllReduce: reduce up, broadcast down), or the node
// whose reductions (one chunk per child) take longest — so a slow link or device inside one tree
// shifts data to the other; otherwise half each.
std::vector<double> TreeWeights(const std::vector<Tree>& trees, const CommTopology& shape, bool balance,
                                Collective collective);

}  // namespace kizuna::collectives
