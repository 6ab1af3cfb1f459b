// Fused one-pass collectives (DESIGN.md section 6, single-host direct algorithms): when every rank
// addresses every other rank's buffers directly (CommShape::direct: the ranks live in one process
// on devices that reach each other's memory, or in several processes of one host that map each
// other's allocations, collectives/host_group.h), each rank does its share in one pass over the
// others' buffers. AllReduce: rank r reduces slice r of every rank's input and writes the result
// into slice r of every rank's output, in one device operation (Stream::ReduceMulti); each byte of
// every input is read once and each byte of every output written once: the minimum traffic,
// 2 x count x size per rank, with no staging, no fabric and no pipeline. Reduce: slice r of every
// input reduced into the root's output. ReduceScatter: block r of every input reduced into rank
// r's output. AllGather: rank r copies its input into block r of every output. Broadcast: rank r
// copies slice r of the root's input into every output. In place, a copy onto itself is skipped.
// Barrier: nothing moves; the rendezvous is the barrier.
//
// The work is not a sequence of transfers, so the plan carries no steps: it names the algorithm,
// and the executor runs it directly (executor_direct.cc) after the ranks have exchanged their
// buffer addresses and before any of them proceeds (two in-process rendezvous per operation).
// Slices are even (executor_direct.cc), so every rank computes the same partition. avg is reduced as avg in the
// same pass (sum, then one division by nranks, rounded once): the plan's epilogue is not used.
#include <utility>

#include "collectives/algorithms/algorithms.h"

namespace kizuna::collectives::algo {
namespace {

class Fused final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kFused; }

  Status Supports(const CollectiveRequest& request, const CommShape& shape) const override {
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

  Result<RankPlan> Build(const CollectiveRequest& request, const CommShape&, const PlanOptions& options,
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
