// A whole plan (every rank's steps, as the engine's builders make them) run in simulated time on a
// modelled network: the plan's own matching and ordering (plan.h: each channel in order, a window
// of started steps, overlapping steps wait), every transfer a flow along its route, the flows that
// share a link sharing it fairly (max-min, recomputed whenever a flow starts or ends), each rank's
// device doing its copies and reductions one after another at the cost model's device terms.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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
  // Staged transfers (LinkDesc::staged: emulated devices, host-staged fabrics): the sender's
  // device copies a message into the fabric's buffer before it leaves and the receiver's copies
  // it out after it arrives (a reduction reads it where it lands), at the device's copy speed.
  bool staged = false;
  // The CPUs of a host that its ranks' devices share (devices that compute on the host, as the
  // emulated ones do): every copy and reduction of the host's ranks takes one of `host_cpus`,
  // hosts of `ranks_per_host` consecutive ranks. 0: each rank's device its own.
  int host_cpus = 0, ranks_per_host = 0;
  // With host_cpus: the executors' CPU time per message, taken on the hosts' CPUs, where the
  // devices' work and the other ranks' messages queue with it: this much at each end, and at the
  // sender the message's copy at the device's copy speed unless `staged` (a host-memory fabric's
  // direct path: the sender's thread copies into the receiver's buffer). 0: none (message_us
  // alone, a delay that takes no CPU).
  double message_cpu_us = 0;
  // Record each step's span in TimedResult::trace (kizuna-sim --trace).
  bool trace = false;
};

// A step's span in simulated time, named as the executor's trace names it (executor/trace.h):
// "send to 3" and "recv from 1" from the step's start to the message's arrival, "reduce" or
// "copy" for the work on what arrived and for local steps.
struct TracedSpan {
  int rank = 0, channel = 0;
  std::string name;
  std::string_view cat;  // send, recv, reduce, copy
  double start = 0, end = 0;
};

struct TimedResult {
  double seconds = 0;
  uint64_t flows = 0;            // transfers, over every rank
  uint64_t simulated_flows = 0;  // those simulated (a symmetric run: block 0's)
  std::string bottleneck;      // the link busiest over the run, or a rank's device where one was busier
  double bottleneck_busy = 0;  // its bytes / (bandwidth x the run's time), or busy time / the run's, 0..1
  double network_bytes = 0;    // bytes over all links (a byte counts once per link it crosses)
  std::vector<double> finish;  // per simulated rank: when it is done
  std::vector<TracedSpan> trace;  // DeviceModel::trace: every simulated rank's steps, as they end
};

// Runs `plan` (every rank, an INA plan's aggregation devices too: Plan::world(), the network's
// ranks; no host level) on `net`. kInvalidArgument for a plan the network cannot carry (a pair
// with no route) or that never completes.
Result<TimedResult> RunTimed(const collectives::Plan& plan, const Network& net, const DeviceModel& device,
                             const collectives::CostConstants& k);

// The same, simulating block 0 of `group` alone (ranks 0..unit-1: plan.ranks holds just those,
// plan.request.nranks all of them) where the network and the plan are mapped onto themselves by
// the group (Network::Symmetries, PlanIsInvariant). Every other block does what block 0 does at the
// same times, so its flows are block 0's moved by the group, each along the moved route of its
// original; a link carries the flows of every block whose moved routes cross it. Sharing must be
// fair: a FIFO link would serve the copies of a flow in turn, and the blocks would differ.
Result<TimedResult> RunTimedSymmetric(const collectives::Plan& block0, const RankGroup& group, const Network& net,
                                      const DeviceModel& device, const collectives::CostConstants& k);

// Algorithm a's plan for `request` on `shape`, run: with `symmetry`, block 0 alone under the first
// of the network's symmetries that the plan commutes with (*how then describes it; fair sharing
// only), otherwise, or where none does, every rank (*how empty) unless the network has more than
// `max_whole_ranks` (kNotSupported saying so: a plan that differs by host on thousands of ranks
// would be simulated one by one). kNotSupported passed through from the algorithm too.
Result<TimedResult> RunAlgorithm(collectives::Algorithm a, const collectives::CollectiveRequest& request,
                                 const collectives::CommTopology& shape, const collectives::PlanOptions& options,
                                 const Network& net, const DeviceModel& device, const collectives::CostConstants& k,
                                 bool symmetry, std::string* how, int max_whole_ranks = 1 << 30);

}  // namespace kizuna::sim
