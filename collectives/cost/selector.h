// Algorithm selection: which algorithm serves one request on one communicator
// (docs/ALGORITHMS.md), in the manner of UCC's score map with fallbacks.
//
// Every algorithm is a candidate. Each says whether it can serve the request on the shape
// (SupportsFn: kNotSupported with a reason, or ok), and the cost model predicts the time of those
// that can. The choice is, in order:
//   1. the per-call option (a forced algorithm given with the call),
//   2. KIZUNA_ALGO's entry for this collective ("allreduce:ring;allgather:rhd"),
//   3. KIZUNA_ALGO's single name for every collective ("ring"),
//   4. otherwise the cheapest supported candidate (ties broken by Algorithm order).
// A forced algorithm that cannot serve the request falls back to 4, and the selection says why
// ("KIZUNA_ALGO=tree cannot serve reducescatter: ...; using ring"). When no candidate can serve
// the request, selection fails with kNotSupported listing each candidate's reason.
// Between 3 and 4 the engine asks a tuner plugin where one is loaded (KIZUNA_TUNER_PLUGIN,
// collectives/tuner/README.md): when neither the call nor KIZUNA_ALGO names an algorithm for the
// collective, the plugin's valid answer replaces the model's choice (Selection::tuned).
//
// Every rank must choose the same algorithm: selection is a pure function of its arguments (no
// clocks, no randomness, no global state; the cost model is deterministic, see cost_model.h), and
// every rank holds the same shape and the same configuration.
//
// Equivalents: NCCL_ALGO (NCCL), UCC_TL_*_TUNE (UCC's score-map overrides).
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "collectives/cost/model.h"
#include "collectives/plan/topology.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

// KIZUNA_ALGO (Config::algo), parsed. Forms (docs/ALGORITHMS.md, "Names and overrides"):
//   ""                              no override: the cost model chooses
//   "ring"                          that algorithm for every collective
//   "allreduce:ring;allgather:rhd"  per collective (names as ParseCollective accepts them;
//                                   "sendrecv" sets both send and recv)
//   "ring;allgather:rhd"            both: the single name for every collective not listed
//   "hier", "allreduce:hier"        the model's pick among the hierarchical algorithms
//   "allreduce:hier:pairwise/rd"    a hierarchical algorithm by name (its name has a colon)
// Names as ParseAlgorithm accepts them, case-insensitively; spaces around items are ignored, and
// so are empty items ("ring;"). The names of algorithms kizuna does not implement yet (oneshot,
// twoshot) are accepted with a warning, and the model chooses instead.
struct AlgoOverrides {
  std::string text;                                                      // as given, for messages
  std::optional<Algorithm> all;                                          // the single name
  std::array<std::optional<Algorithm>, kNumCollectives> per_collective;  // by Collective value
  // "hier" (the model picks among the hierarchical algorithms), for every collective not listed,
  // and per collective.
  bool all_hier = false;
  std::array<bool, kNumCollectives> hier{};
  std::array<std::string, kNumCollectives> items;  // the item that listed each collective; empty: not listed
  std::vector<std::string> warnings;               // one per name accepted but not available; the caller logs them

  // The override for `c`: its own entry when it is listed (none for a name not available yet),
  // else the single name, or none.
  std::optional<Algorithm> For(Collective c) const;
  // The item that forced `c`'s algorithm: "KIZUNA_ALGO=allreduce:ring" or "KIZUNA_ALGO=ring".
  std::string Source(Collective c) const;
  // True when "hier" applies to `c`: its own entry, or the single name.
  bool HierFor(Collective c) const;
  bool empty() const;
};

// kInvalidArgument naming the bad item: an unknown algorithm or collective name, an item with an
// empty side ("allreduce:", ":ring") or more than one colon, a collective listed twice, two
// single names.
Result<AlgoOverrides> ParseAlgoOverrides(std::string_view text);

// Whether an algorithm can serve a request on a shape: ok, or kNotSupported with the reason.
// The engine passes GetAlgorithm(a).Supports; tests pass fakes.
using SupportsFn = std::function<Status(Algorithm, const CollectiveRequest&, const CommTopology&)>;

struct Candidate {
  Algorithm algorithm = Algorithm::kRing;
  Status support;         // ok, or why the algorithm cannot serve the request
  Prediction prediction;  // when supported; infinite (with a note) when the model cannot predict

  bool supported() const { return support.ok(); }
  double seconds() const { return prediction.seconds; }
};

struct Selection {
  CollectiveRequest request;
  Algorithm chosen = Algorithm::kRing;
  // True when the chosen algorithm was forced (per-call option or KIZUNA_ALGO) and used; false
  // when the model chose, including after a forced algorithm could not serve the request.
  bool forced = false;
  std::optional<Algorithm> requested;  // the forced algorithm, whether used or not
  // "chosen by the model", "forced by KIZUNA_ALGO=ring", "forced by the call's algorithm
  // option (tree)", "KIZUNA_ALGO=tree cannot serve reducescatter: <why>; using ring".
  std::string reason;
  std::vector<Candidate> candidates;  // every algorithm, in Algorithm order
  // A tuner plugin chose (collectives/tuner; `reason` names it), with the plan options it asked
  // for, if any: the largest step in elements, and the channels (none: the engine's own).
  bool tuned = false;
  std::optional<uint64_t> chunk_count;
  std::optional<int> channels;

  const Candidate& candidate(Algorithm a) const { return candidates[static_cast<size_t>(a)]; }
};

// Chooses as the header comment says. kInvalidArgument when the shape is malformed
// (CommTopology::Validate) or describes another number of ranks than the request; kNotSupported when
// no candidate can serve the request, listing every candidate's reason. A supported candidate
// whose prediction is infinite is still a valid choice, after every finite one.
Result<Selection> SelectAlgorithm(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                                  const CostConstants& constants, const AlgoOverrides& overrides,
                                  std::optional<Algorithm> per_call, const SupportsFn& supports);

// One line for the INFO log: "allreduce count=262144 float32 sum nranks=8: ring (predicted
// 1.20 ms) chosen by the model; tree 1.50 ms, rhd 1.30 ms, rd not supported (...)".
std::string SelectionToString(const Selection& selection);

}  // namespace kizuna::collectives
