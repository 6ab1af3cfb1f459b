// The fused one-pass collectives' entry in the algorithm table: when they apply, and their plan
// (no steps: the executor runs them directly). What each rank does: collectives/direct/fused.h.
// With PlanOptions::balance and every rank's speed known, the parts are sized by speed
// (RankPlan::fused_bounds): a device twice as fast takes twice the elements, so every rank's
// part takes about as long and the operation, which ends with its slowest part, ends sooner.
#include <algorithm>
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {
namespace {

class Fused final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kFused; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    switch (request.collective) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter:
      case Collective::kAllGather:
      case Collective::kBroadcast:
      case Collective::kReduce:
      case Collective::kBarrier:
        break;
      default:
        return NotImplemented(id(), request);
    }
    if (!shape.direct)
      return NotSupported("fused needs ranks that address each other's buffers directly (ranks of one process "
                          "on one device, or on devices that reach each other's memory)");
    return Status::Ok();
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    Builder b(request, options, rank, 0);
    b.plan.fused_bounds = FusedBounds(request, shape, options);
    return std::move(b.plan);
  }
};

}  // namespace

std::vector<double> FusedWeights(const CollectiveRequest& request, const CommTopology& shape,
                                 const PlanOptions& options) {
  const auto n = static_cast<size_t>(shape.nranks);
  std::vector<double> w(n, 1.0);
  if (!options.balance || request.collective == Collective::kBarrier || shape.ranks.size() != n) return w;
  const bool reduce = IsReduction(request.collective);
  for (size_t r = 0; r < n; ++r) {
    const RankDesc& d = shape.ranks[r];
    const double gbps = reduce ? d.reduce_gbps : d.copy_gbps;
    if (!(gbps > 0)) return std::vector<double>(n, 1.0);
    // Ranks on one device share its throughput.
    int sharing = 0;
    for (const RankDesc& o : shape.ranks) sharing += o.host_id == d.host_id && o.device == d.device ? 1 : 0;
    w[r] = gbps / std::max(sharing, 1);
  }
  return w;
}

std::vector<uint64_t> FusedBounds(const CollectiveRequest& request, const CommTopology& shape,
                                  const PlanOptions& options) {
  const std::vector<double> w = FusedWeights(request, shape, options);
  if (std::all_of(w.begin(), w.end(), [&](double x) { return x == w[0]; })) return {};
  const uint64_t work = FusedWorkCount(request);
  std::vector<uint64_t> bounds;
  for (size_t r = 0; r < w.size(); ++r) bounds.push_back(SplitWeighted({0, work}, w, r).offset);
  bounds.push_back(work);
  return bounds;
}

const AlgorithmImpl& FusedAlgorithm() {
  static const Fused impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
