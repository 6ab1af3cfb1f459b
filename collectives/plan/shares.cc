#include "collectives/plan/shares.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>

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
  // The remainder, an element each, to the first parts that have a weight.
  for (size_t j = 0; given < count; j = (j + 1) % parts)
    if (weights[j] > 0) ++size[j], ++given;
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

std::vector<double> PairwiseWeights(const CommTopology& shape, bool balance) {
  const auto p = static_cast<size_t>(shape.nranks);
  const std::vector<double> even(p, 1.0);
  if (!balance || shape.ranks.size() != p || p < 2 || !UnlikeSpeeds(shape) ||
      std::any_of(shape.ranks.begin(), shape.ranks.end(), [](const RankDesc& d) { return !(d.reduce_gbps > 0); }))
    return even;
  std::vector<double> floor(p), slope(p);
  for (size_t r = 0; r < p; ++r) {
    const RankDesc& d = shape.ranks[r];
    bool staged = false;
    for (size_t q = 0; q < p; ++q)
      staged = staged || (q != r && shape.link(static_cast<int>(r), static_cast<int>(q)).staged);
    const double beta = staged && d.copy_gbps > 0 ? 1 / d.copy_gbps : 0.0, rho = 1 / d.reduce_gbps;
    floor[r] = 2 * beta;
    slope[r] = (2.0 * static_cast<double>(p) - 4) * beta + static_cast<double>(p) * rho;
  }
  // The time T where sum_r max(0, (T - floor_r) / slope_r) = 1: bisection.
  auto owned = [&](double t) {
    double sum = 0;
    for (size_t r = 0; r < p; ++r) sum += std::max(0.0, (t - floor[r]) / slope[r]);
    return sum;
  };
  double lo = 0, hi = *std::max_element(floor.begin(), floor.end()) + *std::max_element(slope.begin(), slope.end());
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (owned(mid) < 1 ? lo : hi) = mid;
  }
  std::vector<double> w;
  for (size_t r = 0; r < p; ++r) w.push_back(std::max(0.0, (hi - floor[r]) / slope[r]));
  return w;
}

namespace {

// The projection of y onto the simplex {s >= 0, sum s = 1}: s_i = max(0, y_i - t) for the t that
// makes them sum to 1.
std::vector<double> OntoSimplex(const std::vector<double>& y) {
  std::vector<double> u(y);
  std::sort(u.begin(), u.end(), std::greater<>());
  double sum = 0, t = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    sum += u[i];
    const double ti = (sum - 1) / static_cast<double>(i + 1);
    if (u[i] - ti > 0) t = ti;
  }
  std::vector<double> s;
  for (double x : y) s.push_back(std::max(0.0, x - t));
  return s;
}

// The parts RingShares returns for rates that are not all alike.
std::vector<double> SolveRingShares(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace

std::vector<double> RingWeights(const CommTopology& shape, bool balance) {
  const auto p = static_cast<size_t>(shape.nranks);
  if (!balance || shape.ranks.size() != p || p < 2) return std::vector<double>(p, 1.0);
  std::vector<double> a, b;
  for (size_t r = 0; r < p; ++r) {
    const RankDesc& d = shape.ranks[r];
    if (!(d.reduce_gbps > 0) || !(d.copy_gbps > 0)) return std::vector<double>(p, 1.0);
    a.push_back(2 / d.reduce_gbps);
    b.push_back(1 / d.copy_gbps);
  }
  return RingShares(a, b);
}

HierarchicalShares HierarchicalWeights(const CommTopology& shape, const std::vector<std::vector<int>>& hosts, int parts,
                                       bool balance, bool fused) {
  HierarchicalShares out;
  const auto p = static_cast<size_t>(shape.nranks);
  if (!balance || shape.ranks.size() != p || hosts.size() < 2 || parts < 1) return out;
  for (const RankDesc& d : shape.ranks)
    if (!(d.reduce_gbps > 0) || !(d.copy_gbps > 0)) return out;
  auto owner = [&](size_t h, int j) { return hosts[h][static_cast<size_t>(j) % hosts[h].size()]; };
  // Parts an owner on host h holds: j, j + P_h, ... below `parts`.
  auto owned = [&](size_t h, int j) {
    const int size = static_cast<int>(hosts[h].size()), first = j % size;
    return static_cast<double>((parts - first + size - 1) / size);
  };
  std::vector<double> weights;
  for (int j = 0; j < parts; ++j) {
    double w = 0;
    std::vector<double> a, b;
    for (size_t h = 0; h < hosts.size(); ++h) {
      const RankDesc& d = shape.ranks[static_cast<size_t>(owner(h, j))];
      const double per_part = d.reduce_gbps / owned(h, j);
      w = h == 0 ? per_part : std::min(w, per_part);
      a.push_back(owned(h, j) * 2 / d.reduce_gbps);
      b.push_back(owned(h, j) / d.copy_gbps);
    }
    weights.push_back(w);
    if (fused) out.network.push_back(RingShares(a, b));
  }
  // Whole numbers (RankPlan::host_part_weights), the fastest 2^20.
  const double most = *std::max_element(weights.begin(), weights.end());
  for (double& w : weights) w = std::max(1.0, std::round(w / most * (1 << 20)));
  if (!std::all_of(weights.begin(), weights.end(), [&](double x) { return x == weights[0]; }))
    out.parts = std::move(weights);
  if (std::all_of(out.network.begin(), out.network.end(), [](const std::vector<double>& w) {
        return std::all_of(w.begin(), w.end(), [&](double x) { return x == w[0]; });
      }))
    out.network.clear();
  return out;
}

std::vector<double> RingShares(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t p = a.size();
  const std::vector<double> even(p, 1.0);
  if (p < 2 || b.size() != p) return even;
  if (std::all_of(a.begin(), a.end(), [&](double x) { return x == a[0]; }) &&
      std::all_of(b.begin(), b.end(), [&](double x) { return x == b[0]; }))
    return even;
  // Every rank's plan asks with the same rates (a simulation builds them all, one after another):
  // the last answer is kept.
  static std::mutex mu;
  static std::vector<double> last_a, last_b, last_shares;
  {
    std::lock_guard lock(mu);
    if (a == last_a && b == last_b) return last_shares;
  }
  std::vector<double> shares = SolveRingShares(a, b);
  std::lock_guard lock(mu);
  last_a = a, last_b = b, last_shares = shares;
  return shares;
}

namespace {

std::vector<double> SolveRingShares(const std::vector<double>& a, const std::vector<double>& b) {
  constexpr double kRingMinGain = 1.15;
  const size_t p = a.size();
  const std::vector<double> even(p, 1.0);
  // With part j a fraction s_j of the data, rank r reduces every part but its own and sends every
  // part but r+1 while reducing, then sends every part but r+2 and receives every part but r+1
  // while gathering (ring.cc), each at its device's rate. Uneven parts run the reduce-scatter to
  // its end before the allgather, so the ring takes the slowest rank's time in each:
  //   max_r a_r (1 - s_r) + b_r (1 - s_{r+1})  +  max_r b_r ((1 - s_{r+1}) + (1 - s_{r+2})).
  // Minimized over the simplex by projected subgradient steps (the gradient of each phase's
  // slowest rank, shrinking steps), keeping the best point: the slow ranks and the ranks after
  // them come to own large parts, which spares the slow ranks' reductions and copies.
  auto time = [&](const std::vector<double>& s, size_t* rs_worst, size_t* ag_worst) {
    double rs = -1, ag = -1;
    for (size_t r = 0; r < p; ++r) {
      const double one = 1 - s[(r + 1) % p], two = 1 - s[(r + 2) % p];
      if (const double w = a[r] * (1 - s[r]) + b[r] * one; w > rs) rs = w, *rs_worst = r;
      if (const double w = b[r] * (one + two); w > ag) ag = w, *ag_worst = r;
    }
    return rs + ag;
  };
  std::vector<double> s(p, 1.0 / static_cast<double>(p)), best = s;
  size_t rw = 0, aw = 0;
  const double even_time = time(s, &rw, &aw);
  double best_time = even_time;
  // Iterations: enough for a few percent at a few dozen ranks; bounded work at thousands.
  const int iterations = static_cast<int>(std::clamp<size_t>(400000 / p, 200, 4000));
  std::vector<double> g(p, 0.0);
  for (int t = 0; t < iterations; ++t) {
    std::fill(g.begin(), g.end(), 0.0);
    g[rw] += a[rw];
    g[(rw + 1) % p] += b[rw];
    g[(aw + 1) % p] += b[aw];
    g[(aw + 2) % p] += b[aw];
    double norm = 0;
    for (double x : g) norm += x * x;
    const double step = 0.5 / static_cast<double>(p) / std::sqrt((t + 1.0) * norm);
    for (size_t i = 0; i < p; ++i) s[i] += step * g[i];
    s = OntoSimplex(s);
    if (const double now = time(s, &rw, &aw); now < best_time) best_time = now, best = s;
  }
  // The count leaves out what uneven parts cost besides: the longer pipelines of the large parts
  // and the reduce-scatter no longer overlapping the allgather. Measured (docs/PERFORMANCE.md,
  // "Heterogeneous devices"), splits come within 5-10 % of the count's gain; one that promises
  // less than kRingMinGain is not taken.
  return best_time * kRingMinGain < even_time ? best : even;
}

}  // namespace

bool UnlikeSpeeds(const CommTopology& shape) {
  return std::any_of(shape.ranks.begin(), shape.ranks.end(), [&](const RankDesc& d) {
    return d.reduce_gbps != shape.ranks[0].reduce_gbps || d.copy_gbps != shape.ranks[0].copy_gbps;
  });
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
    // Ranks of one speed and share (as printed) together; their parts may be a remainder's element
    // apart: their mean.
    while (last + 1 < n && speeds[last + 1] == speeds[first] && std::abs(shares[last + 1] - shares[first]) < 5e-4)
      ++last;
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
    case Algorithm::kRing: {
      const std::vector<double> ring = RingWeights(shape, balance);
      if (!all_reduce || !unequal(ring)) return "";
      return DescribeShares("parts sized so that the slow ranks reduce and copy least", Shares(ring), reduce_speeds);
    }
    case Algorithm::kPairwise: {
      const std::vector<double> parts = PairwiseWeights(shape, balance);
      if (!all_reduce || !unequal(parts)) return "";
      return DescribeShares("parts sized so that every rank's reductions and copies take one time", Shares(parts),
                            reduce_speeds);
    }
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
    case Algorithm::kHierRing:
    case Algorithm::kHierRd:
    case Algorithm::kHierFusedRing:
    case Algorithm::kHierFusedRd: {
      if (!all_reduce) return "";
      const std::vector<std::vector<int>> hosts = shape.hosts();
      size_t widest = 0;
      for (const auto& h : hosts) widest = std::max(widest, h.size());
      const bool fused = IsHostFused(algorithm);
      const int parts =
          fused ? static_cast<int>(HostFusedParts(request, static_cast<int>(widest))) : static_cast<int>(widest);
      const HierarchicalShares w = HierarchicalWeights(shape, hosts, parts, balance, fused);
      auto percent = [](const std::vector<double>& weights) {
        std::vector<std::string> out;
        for (double x : Shares(weights)) out.push_back(fmt::format("{:.1f}%", 100 * x));
        return fmt::format("{}", fmt::join(out, ", "));
      };
      std::string out;
      if (!w.parts.empty())
        out = fmt::format("the host level's parts by their owners' slowest reduce speed: {}", percent(w.parts));
      if (!w.network.empty() && algorithm == Algorithm::kHierFusedRing)
        out += fmt::format(
            "{}each part's ring over the hosts split so that slower hosts reduce less: part 0's hosts own {}",
            out.empty() ? "" : "; ", percent(w.network[0]));
      return out;
    }
    default: return "";
  }
}

}  // namespace kizuna::collectives
