// The algorithm interface: one implementation per file in collectives/algorithms/, each serving
// every collective it supports (collectives/README.md, docs/ALGORITHMS.md), found through AllAlgorithms().
//
// An algorithm answers two questions: can you serve this request on this communicator
// (Supports: ok, or kNotSupported with the reason, so the selector tries the next candidate:
// runtime/core/status.h's two "no"s), and what does rank r do (Build: a RankPlan, see plan.h for the semantics).
// Costs are not here: the cost model (cost/model.h) predicts every algorithm's time from the
// same shape, as formulas with named constants.
//
// Build is pure: the same inputs give the same plan on every rank and every run.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

class AlgorithmImpl {
 public:
  virtual ~AlgorithmImpl() = default;
  virtual Algorithm id() const = 0;

  // ok, or kNotSupported naming why (a collective it does not implement, a peer pair the shape
  // cannot reach, in-place AllToAll, ...). Requests are already validated (count, dtype, root).
  virtual Status Supports(const CollectiveRequest& request, const CommTopology& shape) const = 0;

  // Rank `rank`'s steps. Called only after Supports said ok; RankPlan::epilogue is left empty.
  // For kAvg the steps sum (the executor reduces with kSum) and BuildPlan adds the epilogue that
  // divides by nranks, unless the plan divides in its reduces of every rank's contribution
  // (Step::average, RankPlan::averages: the direct exchange does, DirectExchange in impl.h).
  virtual Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape,
                                 const PlanOptions& options, int rank) const = 0;

  // What rank `rank`'s plan does at each level, for the INFO log, where the name alone does not
  // say it (the hierarchical algorithms: which ranks meet inside the host, which across hosts);
  // empty otherwise. Called only after Supports said ok.
  virtual std::string Describe(const CollectiveRequest& request, const CommTopology& shape, int rank) const {
    (void)request, (void)shape, (void)rank;
    return {};
  }
};

// Every algorithm, indexed by Algorithm value (AllAlgorithms()[static_cast<int>(a)]->id() == a).
std::span<const AlgorithmImpl* const> AllAlgorithms();
const AlgorithmImpl& GetAlgorithm(Algorithm a);

// The one entry point that builds a plan: Supports, then Build for `rank` (or for every rank
// when rank < 0, for tools and tests), then the avg epilogue, then ValidateRankPlan on every
// rank built. kNotSupported from Supports is passed through; a plan that fails validation is
// kInternal (an algorithm bug).
Result<Plan> BuildPlan(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                       const PlanOptions& options, int rank);
// The same for the ranks listed (Plan::ranks in that order), or every rank when `every_rank`; the
// request and shape are checked once, which is what makes a few ranks of a large communicator
// cheap (the simulator builds one host's plans of thousands of ranks).
Result<Plan> BuildPlan(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                       const PlanOptions& options, std::span<const int> ranks, bool every_rank = false);

}  // namespace kizuna::collectives
