// Runs a whole plan — every rank's steps — on host memory, with no fabric and no device: sends
// are matched to receives as plan.h specifies, bytes move with memcpy, reductions use HostReduce
// (so results are the ones a device following the kernel semantics produces). This is how
// algorithms are checked for correctness, matching and freedom from deadlock without any
// transport, and how plans will be run at thousands of ranks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

// One rank's buffers. For an in-place request the caller makes them alias as plan.h's table says
// (e.g. AllGather: input == output + rank * count * element size). Scratch is allocated by the
// simulator.
struct SimRankBuffers {
  void* input = nullptr;   // request.input_count() elements
  void* output = nullptr;  // request.output_count() elements
};

struct SimOptions {
  // Started, incomplete steps allowed per channel (>= 2; plan.h's contract is that 2 suffices).
  int window = 2;
  // hier:fused plans (RankPlan::host_parts): each rank's host, any ids, for the host level the
  // executor runs around the steps (executor/host_level.cc), which the simulator runs the same
  // way: before the steps each part's owner sums it over its host's inputs into its output, after
  // them every rank copies the other parts from their owners.
  std::vector<int> host_of;
};

struct SimStats {
  uint64_t steps = 0;
  uint64_t messages = 0;
  uint64_t bytes_sent = 0;   // over all ranks
  int rounds = 0;            // scheduling rounds until everything completed (a rough depth)
};

// Runs plan.ranks (which must hold every rank, 0..nranks-1, in order). kInternal naming the
// rank, channel and step for: a deadlock (no step can start or complete), a send and receive
// whose counts differ, a send with no matching receive (or the reverse) at the end, a plan that
// fails ValidateRankPlan.
Result<SimStats> SimulatePlan(const Plan& plan, std::span<const SimRankBuffers> buffers, const SimOptions& options);

}  // namespace kizuna::collectives
