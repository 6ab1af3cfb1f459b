// A whole plan (every rank's steps, as the engine's builders make them) run in simulated time on a
// modelled network: the plan's own matching and ordering (plan.h: each channel in order, a window
// of started steps, overlapping steps wait), every transfer a flow along its route, the flows that
// share a link sharing it fairly (max-min, recomputed whenever a flow starts or ends), each rank's
// device doing its copies and reductions one after another at the cost model's device terms.
#pragma once

#include <string>

#include "collectives/cost/model.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/core/status.h"
#include "tools/sim/network.h"

namespace kizuna::sim {

struct DeviceModel {
  double copy_gbps = 0, reduce_gbps = 0, launch_us = 0;  // 0: the cost model's defaults
  // The executor's own work per message (CostConstants::message_overhead_us) and per step.
  double message_us = -1, step_us = -1;  // < 0: the cost model's constants
  int window = 4;                        // started steps per channel (the executor's default)
  // How flows share a link: fairly (max-min, as TCP's flows do), or one after another in the
  // order they started (a port that sends its transfers in turn, as the direct-connect fabric's
  // link shaper paces them).
  bool fifo = false;
};

struct TimedResult {
  double seconds = 0;
  uint64_t flows = 0;
  std::string bottleneck;      // the link busiest over the run, or a rank's device where one was busier
  double bottleneck_busy = 0;  // its bytes / (bandwidth x the run's time), or busy time / the run's, 0..1
  double network_bytes = 0;    // bytes over all links (a byte counts once per link it crosses)
};

// Runs `plan` (every rank; no host level, no aggregation devices) on `net`. kInvalidArgument for
// a plan the network cannot carry (a pair with no route) or that never completes.
Result<TimedResult> RunTimed(const collectives::Plan& plan, const Network& net, const DeviceModel& device,
                             const collectives::CostConstants& k);

}  // namespace kizuna::sim
