#include "collectives/plan/shares.h"

#include <algorithm>

#include <fmt/format.h>

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

std::string DescribeFusedParts(const CollectiveRequest& request, const CommTopology& shape,
                               const std::vector<uint64_t>& bounds) {
  const auto n = static_cast<size_t>(request.nranks);
  if (bounds.size() != n + 1 || shape.ranks.size() != n || bounds.back() == 0) return "";
  const bool reduce = IsReduction(request.collective);
  auto percent = [&](size_t r) { return 100.0 * static_cast<double>(bounds[r + 1] - bounds[r]) / bounds.back(); };
  auto speed = [&](size_t r) { return reduce ? shape.ranks[r].reduce_gbps : shape.ranks[r].copy_gbps; };
  std::string out = fmt::format("parts by each device's {} speed:", reduce ? "reduce" : "copy");
  for (size_t first = 0; first < n;) {
    size_t last = first;
    while (last + 1 < n && speed(last + 1) == speed(first)) ++last;
    // Ranks of one speed have parts a remainder's element apart: their mean.
    double sum = 0;
    for (size_t r = first; r <= last; ++r) sum += percent(r);
    out += first == last
               ? fmt::format(" rank {} {:.1f}%", first, sum)
               : fmt::format(" ranks {}-{} {:.1f}% each", first, last, sum / static_cast<double>(last - first + 1));
    out += fmt::format(" ({:g} GB/s){}", speed(first), last + 1 < n ? "," : "");
    first = last + 1;
  }
  return out;
}

}  // namespace kizuna::collectives
