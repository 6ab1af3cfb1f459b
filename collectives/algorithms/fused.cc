// The fused one-pass collectives' entry in the algorithm table: when they apply, and their plan
// (no steps: the executor runs them directly). What each rank does: collectives/direct/fused.h.
// With PlanOptions::balance and every rank's speed known, the parts are sized by speed
// (RankPlan::fused_bounds): a device twice as fast takes twice the elements, so every rank's
// part takes about as long and the operation, which ends with its slowest part, ends sooner.
#include <utility>

#include "collectives/algorithms/impl.h"
#include "collectives/plan/shares.h"

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
    b.plan.fused_bounds = FusedBounds(request, shape, options.balance);
    return std::move(b.plan);
  }
};

}  // namespace

const AlgorithmImpl& FusedAlgorithm() {
  static const Fused impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
