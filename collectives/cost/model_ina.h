// The cost model's INA term (model.h, docs/ALGORITHMS.md): the stages an INA AllReduce
// (algorithms/ina.cc) takes on the communicator's layout. Internal to the cost model: only
// cost_model_algorithms.cc and cost_model_ina.cc include it.
#pragma once

#include <string>
#include <vector>

#include "collectives/cost/model.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/core/status.h"

namespace kizuna::collectives::cost_internal {

// What the model has resolved for the ranks (seconds per byte, seconds), worst over the workers:
// aggregation devices are taken to be as fast as the slowest worker and their cables as fast as
// the slowest link between workers (the topology file gives every cable the same defaults).
struct InaResolved {
  double elem = 0;            // bytes per element
  double latency_s = 0;       // one way, per hop
  double wire_per_byte = 0;   // per cable and direction
  double staging_per_byte = 0;
  double reduce_per_byte = 0;  // per input byte
  double launch_s = 0;
};

struct InaStage {
  std::string label;
  double alpha = 0, beta = 0, gamma = 0;  // one stage
  double repeat = 0;
};

// The stages, or kNotSupported naming why there are none (no layout, a layout for other ranks).
Result<std::vector<InaStage>> InaStages(const CollectiveRequest& request, const CommTopology& shape,
                                        const PlanOptions& options, const CostConstants& k, const InaResolved& r);

}  // namespace kizuna::collectives::cost_internal
