// The engine's algorithm choice for a row, and the cost model's predicted times, as read from
// Communicator::ExplainChoice — the same selection the communicator makes for a call of that
// collective, count and type (the cost model, KIZUNA_ALGO, the staging chunk size).
//
// ExplainChoice answers with collectives::SelectionToString's line:
//   "allreduce count=1024 float32 sum nranks=4: rd (predicted 22.8 us) chosen by the model;
//    ring 66.1 us, tree 54.4 us, p2p not supported (p2p does not implement allreduce), ..."
// ParseChoice turns it back into data. Times carry the three significant digits FormatSeconds
// prints.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/status.h"

namespace kizuna::bench {

struct AlgorithmChoice {
  struct Candidate {
    collectives::Algorithm algorithm = collectives::Algorithm::kRing;
    bool supported = false;
    std::optional<double> predicted_s;  // supported with a finite prediction
  };
  collectives::Algorithm chosen = collectives::Algorithm::kRing;
  std::vector<Candidate> candidates;  // every algorithm the line names, in Algorithm order
  std::string line;                   // as ExplainChoice said it

  const Candidate* Find(collectives::Algorithm a) const;
  // The supported algorithms, in Algorithm order (what --algo all sweeps).
  std::vector<collectives::Algorithm> Supported() const;
  // What the engine runs when the call forces `forced`: `forced` when it is supported, else the
  // model's own choice (the cheapest supported prediction, ties in Algorithm order), as the
  // selector falls back. nullopt: nothing is supported.
  std::optional<collectives::Algorithm> Used(std::optional<collectives::Algorithm> forced) const;
};

// kInternal naming the line when it does not have the form above.
Result<AlgorithmChoice> ParseChoice(std::string_view line);

}  // namespace kizuna::bench
