#include "collectives/plan/shares.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/plan/trees.h"

namespace kizuna::collectives {

std::vector<uint64_t> WeightedBounds(uint64_t count, const std::vector<double>& weights) {
  const size_t parts = weights.size();
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<uint64_t> size(parts);
  uint64_t given = 0;
  for (size_t j = 0; j < parts; ++j) {
    const double share = static_cast<double>(count) * (weights[j] / sum);
    size[j] = std::min<uint64_t>(static_cast<uint64_t>(share), count - given);
    given += size[j];
  }
  for (size_t j = 0; given < count; j = (j + 1) % parts, ++given) ++size[j];
  std::vector<uint64_t> bounds(parts + 1, 0);
  for (size_t j = 0; j < parts; ++j) bounds[j + 1] = bounds[j] + size[j];
  return bounds;
}

std::vector<double> ReduceWeights(const CommTopology& shape, bool balance) {
  std::vector<double> w(static_cast<size_t>(shape.nranks), 1.0);
  if (!balance || shape.ranks.size() != w.size()) return w;
  for (const RankDesc& r : shape.ranks)
    if (!(r.reduce_gbps > 0)) return w;
  for (size_t i = 0; i < w.size(); ++i) w[i] = shape.ranks[i].reduce_gbps;
  return w;
}

std::vector<double> Shares(const std::vector<double>& weights) {
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<double> out(weights);
  for (double& x : out) x /= sum;
  return out;
}

std::vector<double> FusedWeights(const CollectiveRequest& request, const CommTopology& shape, bool balance) {
  const auto n = static_cast<size_t>(shape.nranks);
  std::vector<double> w(n, 1.0);
  if (!balance || request.collective == Collective::kBarrier || shape.ranks.size() != n) return w;
  const bool reduce = IsReduction(request.collective);
  for (size_t r = 0; r < n; ++r) {
    const RankDesc& d = shape.ranks[r];
    const double gbps = reduce ? d.reduce_gbps : d.copy_gbps;
    if (!(gbps > 0)) return std::vector<double>(n, 1.0);
    // Ranks on one device share its throughput.
    const auto sharing = std::count_if(shape.ranks.begin(), shape.ranks.end(), [&](const RankDesc& o) {
      return o.host_id == d.host_id && o.device == d.device;
    });
    w[r] = gbps / static_cast<double>(std::max<std::ptrdiff_t>(sharing, 1));
  }
  return w;
}

std::vector<uint64_t> FusedBounds(const CollectiveRequest& request, const CommTopology& shape, bool balance) {
  const std::vector<double> w = FusedWeights(request, shape, balance);
  if (std::all_of(w.begin(), w.end(), [&](double x) { return x == w[0]; })) return {};
  return WeightedBounds(FusedWorkCount(request), w);
}

std::string DescribeShares(std::string_view what, const std::vector<double>& shares,
                           const std::vector<double>& speeds) {
  const size_t n = shares.size();
  if (n == 0 || speeds.size() != n) return "";
  std::string out(what);
  out += ":";
  for (size_t first = 0; first < n;) {
    size_t last = first;
    while (last + 1 < n && speeds[last + 1] == speeds[first]) ++last;
    // Ranks of one speed have parts a remainder's element apart: their mean.
    double sum = 0;
    for (size_t r = first; r <= last; ++r) sum += 100.0 * shares[r];
    out += first == last
               ? fmt::format(" rank {} {:.1f}%", first, sum)
               : fmt::format(" ranks {}-{} {:.1f}% each", first, last, sum / static_cast<double>(last - first + 1));
    out += fmt::format(" ({:g} GB/s){}", speeds[first], last + 1 < n ? "," : "");
    first = last + 1;
  }
  return out;
}

std::string DescribeSplit(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                          bool balance, const std::vector<uint64_t>& fused_bounds) {
  const auto n = static_cast<size_t>(request.nranks);
  if (shape.ranks.size() != n || n < 2) return "";
  const bool reduce = IsReduction(request.collective);
  std::vector<double> reduce_speeds, copy_speeds;
  for (const RankDesc& d : shape.ranks) {
    reduce_speeds.push_back(d.reduce_gbps);
    copy_speeds.push_back(d.copy_gbps);
  }
  auto unequal = [](const std::vector<double>& w) {
    return !std::all_of(w.begin(), w.end(), [&](double x) { return x == w[0]; });
  };
  const bool all_reduce = request.collective == Collective::kAllReduce;
  const std::vector<double> weights = ReduceWeights(shape, balance);
  switch (algorithm) {
    case Algorithm::kFused: {
      if (fused_bounds.size() != n + 1 || fused_bounds.back() == 0) return "";
      std::vector<double> shares;
      for (size_t r = 0; r < n; ++r)
        shares.push_back(static_cast<double>(fused_bounds[r + 1] - fused_bounds[r]) /
                         static_cast<double>(fused_bounds.back()));
      return DescribeShares(reduce ? "parts by each device's reduce speed" : "parts by each device's copy speed",
                            shares, reduce ? reduce_speeds : copy_speeds);
    }
    case Algorithm::kPairwise:
      if (!all_reduce || !unequal(weights)) return "";
      return DescribeShares("parts by each device's reduce speed", Shares(weights), reduce_speeds);
    case Algorithm::kRhd:
      // Power-of-two counts: each rank ends with a block (a fold's even ranks hand theirs over).
      if (!all_reduce || !unequal(weights) || (n & (n - 1)) != 0) return "";
      return DescribeShares("blocks by each device's reduce speed", Shares(weights), reduce_speeds);
    case Algorithm::kTree: {
      if (!all_reduce) return "";
      const std::vector<int> labels = AllReduceLabels(shape, balance);
      const std::vector<double> trees =
          Shares(TreeWeights(MakeTrees(request.nranks, -1, labels), shape, balance, request.collective));
      if (trees[0] == trees[1]) return "";
      std::vector<int> leaves;
      bool placed = false;  // not the identity: the slower ranks moved onto the first tree's leaves
      for (size_t r = 0; r < n; ++r) {
        if (labels[r] % 2 == 1) leaves.push_back(static_cast<int>(r));
        placed = placed || labels[r] != static_cast<int>(r);
      }
      return fmt::format(
          "the trees carry {:.1f}% and {:.1f}% of the data, by their streaming rates{}", 100 * trees[0], 100 * trees[1],
          placed ? fmt::format("; the slower ranks {} on the first tree's leaves", fmt::join(leaves, ", ")) : "");
    }
    default: return "";
  }
}

}  // namespace kizuna::collectives
