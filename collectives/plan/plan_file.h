// Plans from files: custom schedules, as MSCCL, TACCL and MSCCL++ users write them, in the format
// `kizuna-plan --dump --json` prints (docs/PLAN_FILES.md).
//
// A plan file holds every rank's channels of steps for one collective on one number of ranks. Its
// slices count in *units*: the request's count (plan.h's table) split into `units` equal parts, so
// one file serves every count that `units` divides (a dump has units = its count). A rank's slice
// "in[2+1]" is unit 2 of its input, one unit long; the buffers hold plan.h's element counts in
// units (ReduceScatter's input: nranks x units).
//
//   {
//     "format": "kizuna-plan 1",
//     "name": "torus2d-2x2",
//     "collective": "allreduce",
//     "nranks": 4,
//     "units": 4,
//     "placement": "both",          (optional: "out" (the default), "in" or "both")
//     "ranks": [
//       {"rank": 0, "scratch": 0, "channels": [[
//         {"step": "send", "peer": 1, "src": "in[0+2]"},
//         {"step": "recv-reduce", "peer": 1, "dst": "out[2+2]", "src": "in[2+2]"},
//         {"step": "reduce", "dst": "out[0+1]", "srcs": ["in[0+1]", "scratch[0+1]"]},
//         ...]]},
//       ...]
//   }
//
// Steps are plan.h's: send, recv, recv-reduce, copy, reduce (optionally "average": true); their
// semantics, matching and the deadlock rule are plan.h's. A slice stays inside its buffer and,
// in the buffers of one block per rank (ReduceScatter's input, AllGather's output, AllToAll's
// both), inside one block. Errors name the file, the rank, the channel and the step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

inline constexpr std::string_view kPlanFileFormat = "kizuna-plan 1";

struct PlanFile {
  std::string name;    // the file's "name", else its base name without .json
  std::string source;  // where it was read from, for messages
  Collective collective = Collective::kAllReduce;
  int nranks = 0;
  uint64_t units = 1;
  // The buffers the plan is written for (plan.h's table): separate ("out"), in place ("in"),
  // or either ("both"). A dump says what it was built for.
  bool out_of_place = true, in_place = false;
  // Steps as plan.h has them, slices in units.
  std::vector<RankPlan> ranks;  // nranks entries, rank r at index r; scratch_count in units
};

// Parses a plan file's text (`source` names it in errors: kInvalidArgument "p.json: rank 2,
// channel 0, step 3: peer 7 is not a rank (the plan has 4)").
Result<PlanFile> ParsePlanFile(std::string_view text, std::string_view source);
Result<PlanFile> LoadPlanFile(const std::string& path);

// ok, or kNotSupported naming why the file does not serve `request` (another collective or
// number of ranks, a count that `units` does not divide, a placement the file is not for).
Status PlanFileServes(const PlanFile& file, const CollectiveRequest& request);
// Rank `rank`'s steps for `request`, slices in elements, no step above `chunk_count` elements
// (the executor's staging slots hold one chunk); call after PlanFileServes said ok.
//
// Pipelining: a unit is count / units elements, often more than a chunk. The plan then runs in P
// passes (P the smallest divisor of count / units that brings the file's largest step within a
// chunk), pass k doing the whole file on the k-th 1/P of every block of every buffer, its units
// laid out in it in order: a file's steps move and reduce whole units element by element, so the
// passes are independent plans of count / P elements each, one after another on each channel. kNotSupported when even
// one element per unit leaves a step above a chunk.
Result<RankPlan> InstantiatePlanFile(const PlanFile& file, const CollectiveRequest& request, int rank,
                                     uint64_t chunk_count);
// The passes InstantiatePlanFile cuts `request` into (0 when it cannot).
uint64_t PlanFilePasses(const PlanFile& file, const CollectiveRequest& request, uint64_t chunk_count);

// Every rank of `plan` in the file format, units = the request's count (the dump of kizuna-plan).
// Only plans of steps: kInvalidArgument for a plan whose work is not all in its steps (fused,
// hierarchical plans with a host level, INA plans with aggregation devices).
Result<std::string> PlanToJson(const Plan& plan, std::string_view name);

// The plan files a communicator loaded (KIZUNA_PLAN_FILE), in the order given.
using PlanFiles = std::vector<PlanFile>;

}  // namespace kizuna::collectives
