// The "file" algorithm's check (from_file.cc): a plan file (collectives/plan/plan_file.h) is run
// whole in the simulator before a communicator takes it.
#pragma once

#include "collectives/plan/plan_file.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

// Runs every rank of `file` in the simulator (simulate.h) on random float32 inputs, at one and
// at four elements per unit, whole and cut into passes, in each placement the file is for, and
// compares every rank's output with the reference (reference.h).
// kInvalidArgument naming the file and the rank, channel and step of a deadlock or a mismatched
// transfer, or the rank and element of a wrong result.
Status CheckPlanFile(const PlanFile& file);

}  // namespace kizuna::collectives
