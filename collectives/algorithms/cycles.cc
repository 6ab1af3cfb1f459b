// Cycles: AllReduce as rings both ways round cycles through every rank that share no cable
// (DisjointCycles, plan/rings.h), so that every port of a torus carries data both ways for the
// whole operation.
//
//   AllReduce  with two or more channels asked for, 2 per cycle: channel c runs the ring's
//              reduce-scatter and then its allgather over its slice round cycle c / 2, the +1 way
//              (c even) or the -1 way (c odd); with one, the first cycle one way.
//
// Why beside the torus algorithm: the torus's channels take the dimensions one after another, so
// on a torus whose dimensions differ (2 x 4) one dimension's cables idle while the other's work:
// 71 % of what the ports allow, where two cycles through every rank keep every cable busy (87-91 %;
// docs/PERFORMANCE.md, "Cables between hosts"). Per rank and channel of n elements both move
// 2 n (1 - 1/p); a cycle takes p - 1 steps a phase, the torus sum(d_i - 1): the model chooses.
//
// Deterministic mode runs the ring's ordered plan (ring.cc).
#include <algorithm>
#include <vector>

#include "collectives/algorithms/impl.h"
#include "collectives/plan/rings.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "cycles";

class CyclesImpl final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kCycles; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    if (request.collective != Collective::kAllReduce) return NotImplemented(id(), request);
    if (shape.nranks == 1 || DisjointCycles(shape).size() == 2) return Status::Ok();
    return NotSupported(
        fmt::format("{}: {} needs two cycles through every rank that share no cable; the links hold "
                    "no two cycles",
                    kName, CollectiveName(request.collective)));
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    if (options.deterministic) return RingAlgorithm().Build(request, shape, options, rank);
    const int want = options.channels >= 2 ? 4 : 1;
    Builder b(request, options, rank, ChannelsFor(PlanOptions{1, want}, request.count));
    if (b.p == 1) {
      b.CopyChunked(0, b.In({0, request.count}), Builder::Out({0, request.count}));
      return std::move(b.plan);
    }
    const std::vector<std::vector<int>> cycles = DisjointCycles(shape);
    if (cycles.size() != 2) return NotSupported(fmt::format("{}: no two cycles", kName));
    for (int c = 0; c < b.channels(); ++c) {
      const std::vector<int>& cycle = cycles[static_cast<size_t>(c / 2)];
      const int at = static_cast<int>(std::find(cycle.begin(), cycle.end(), rank) - cycle.begin());
      const int direction = c % 2 == 0 ? 1 : -1;
      Line line;
      for (int j = 0; j < b.p; ++j) line.ranks.push_back(cycle[static_cast<size_t>(Mod(direction * j, b.p))]);
      line.me = Mod(direction * at, b.p);
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      LineReduceScatter(b, c, line, R, /*first=*/true);
      LineAllGather(b, c, line, R);
    }
    return std::move(b.plan);
  }
};

}  // namespace

const AlgorithmImpl& CyclesAlgorithm() {
  static const CyclesImpl impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
