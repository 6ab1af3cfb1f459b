// How work is shared among ranks of unlike speed: contiguous parts in proportion to weights, and
// the fused algorithm's weights and parts (RankPlan::fused_bounds), which the algorithm builds
// and the cost model predicts from the same shape. Pure functions: every rank computes the same
// parts from the same shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"

namespace kizuna::collectives {

// The bounds of weights.size() contiguous parts of `count` elements in proportion to `weights`
// (finite, >= 0, one at least > 0), weights.size() + 1 entries from 0 to count: part j gets
// floor(count * w_j / sum) elements and the remainder goes one element each to the first parts of
// nonzero weight, so equal weights give the even split (the first count % parts parts one element
// longer) and a part of weight 0 is empty.
std::vector<uint64_t> WeightedBounds(uint64_t count, const std::vector<double>& weights);

// Per rank, its share of reduction work: its device's reduce speed with `balance` and every rank's
// speed known, otherwise equal weights (pairwise's parts, rhd's blocks).
std::vector<double> ReduceWeights(const CommTopology& shape, bool balance);
// Pairwise AllReduce: each rank's weight for the part it owns. Rank r receives every rank's
// contribution to its part, reduces the p inputs, and sends the result to every other rank; it
// also sends its contributions to the other parts and receives their results. With s_r its part's
// fraction, ρ_r its seconds per byte reduced and β_r per byte of a staging copy (its device's copy
// speed where its links are staged, else 0), its time is 2β_r + s_r ((2p − 4)β_r + pρ_r), and
// the parts are sized for every rank that owns one to take the same time (ranks whose copies alone
// take longer own none). With no copy to count, that is the reduce speed. Equal weights where the
// speeds are equal or unknown, or with `balance` off.
std::vector<double> PairwiseWeights(const CommTopology& shape, bool balance);

// Ring AllReduce: the fraction of the data each rank's part holds. Rank r reduces every part but
// its own and copies every part but the next two ranks' (ring.cc), so with `balance` and every
// rank's speeds known the parts are sized for the slowest rank to finish soonest: a slow rank and
// the two after it own large parts, fast ones may own none (weight 0). Equal weights where the
// speeds are equal or unknown, or where sizing gains less than 15 % by that count (RingShares).
std::vector<double> RingWeights(const CommTopology& shape, bool balance);
// The same for any ring of n members (the hierarchical plans' rings over the hosts): a[i] member
// i's seconds per GB reduced (two operands read), b[i] per GB it copies. The devices' work alone:
// the links' speeds are left out (with them, a slow link made the parts uneven where the cost
// model predicts the even ring faster). Equal weights where every member is alike.
std::vector<double> RingShares(const std::vector<double>& a, const std::vector<double>& b);

// The hierarchical AllReduce's split by speed (algorithms/hierarchical.cc): `parts` parts, part j
// owned on host h (`hosts`: each host's ranks, hosts in the plan's order) by its local rank
// j mod P_h, which shares its device among the parts it owns. With `balance` and every rank's
// speeds known:
//  - `parts`: each part in proportion to the slowest of its owners' reduce speeds per part owned
//    (whole numbers, the fastest 2^20: RankPlan::host_part_weights), since the owners of every
//    part reduce it at once, over their host's inputs (the rail form) and between hosts; empty
//    where they are even;
//  - `network` (hier:fused, `fused`): per part, its ring over the hosts' owners sized by
//    RingShares (each owner's rates divided among the parts it owns): a host whose devices are
//    slower, or fewer for the same parts, reduces less of each part between hosts; empty where
//    even. The rail form keeps these rings even: its host level's steps run between each piece's
//    ring and the next, and a split ring there measured slower than the even one
//    (docs/PERFORMANCE.md, "Heterogeneous devices").
struct HierarchicalShares {
  std::vector<double> parts;
  std::vector<std::vector<double>> network;
};
HierarchicalShares HierarchicalWeights(const CommTopology& shape, const std::vector<std::vector<int>>& hosts, int parts,
                                       bool balance, bool fused);
// Whether some rank's device reports another reduce or copy speed than rank 0's.
bool UnlikeSpeeds(const CommTopology& shape);
// The weights as fractions of their sum.
std::vector<double> Shares(const std::vector<double>& weights);

// fused: each rank's weight for its part. With `balance` and every rank's speed known, its
// device's reduce speed (reductions) or copy speed (AllGather, Broadcast), divided among the ranks
// that share the device (one host id and device name); equal weights otherwise (and for Barrier).
std::vector<double> FusedWeights(const CollectiveRequest& request, const CommTopology& shape, bool balance);
// RankPlan::fused_bounds from those weights over FusedWorkCount(request) elements: empty when the
// weights are equal (the even split, FusedSlice).
std::vector<uint64_t> FusedBounds(const CollectiveRequest& request, const CommTopology& shape, bool balance);
// For the INFO log: `what`, then each rank's share (fractions of 1) and speed, ranks in a row of
// one speed together: "parts by each device's reduce speed: ranks 0-3 20.0% each (0.4 GB/s),
// ranks 4-7 5.0% each (0.1 GB/s)".
std::string DescribeShares(std::string_view what, const std::vector<double>& shares, const std::vector<double>& speeds);
// How a plan of `algorithm` splits the work by speed, for the INFO plan line: fused's parts
// (`fused_bounds`, RankPlan::fused_bounds), pairwise's parts and rhd's blocks, the trees' shares
// and placement; "" where the split is even.
std::string DescribeSplit(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                          bool balance, const std::vector<uint64_t>& fused_bounds);

}  // namespace kizuna::collectives
