// The fused one-pass collectives' entry in the algorithm table: when they apply, and their plan
// (no steps: the executor runs them directly). What each rank does: collectives/direct/fused.h.
#include <utility>

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

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology&, const PlanOptions& options,
                         int rank) const override {
    Builder b(request, options, rank, 0);
    return std::move(b.plan);
  }
};

}  // namespace

const AlgorithmImpl& FusedAlgorithm() {
  static const Fused impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
