// Batches of cases on one world, each batch in processes of its own: for the in-process modes
// (threads, one-thread) one child process that holds every rank (`--local-worker`), for
// processes a job of one rank per process under kizuna-run (`--worker`). The children print one
// line per case ("@crosscheck K fail TEXT", "@crosscheck K done ok|failed|broken|skipped HASH") and
// this process reads them, compares what the ranks report, and hands each case's outcome on.
//
// A process per batch keeps a world's leaks and crashes to its batch: a case that crashes its
// process, or a kizuna error (the world is then unusable), is reported like any failure, and the
// batch goes on from the next case in a new child, with a fresh world. `--in-process` runs the
// in-process modes' batches in this process instead (for a debugger).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tools/crosscheck/cases.h"

namespace kizuna::crosscheck {

struct Outcome {
  bool passed = false;
  bool skipped = false;  // the world cannot be made here (libfabric unavailable): not counted
  std::vector<std::string> failures;
};

// Called once per case, in index order; false stops the batch (a limit was reached).
using CaseSink = std::function<bool(const Case&, const Outcome&)>;

struct BatchContext {
  const Options* options = nullptr;
  uint64_t seed = 0;
  uint64_t batch = 0;
  WorldSpec world;
  uint64_t first = 0;  // cases [first, last)
  uint64_t last = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;  // start no case after it
  std::string kizuna_run;                                         // processes: the launcher
  std::string self;                                               // this program, for the children
  std::string* note = nullptr;                                    // why cases were skipped
};

// The batch in this process (the in-process modes' child, or --in-process).
void RunBatchInProcess(const BatchContext& ctx, const CaseSink& sink);
// The batch in child processes, as the world's mode says.
void RunBatchInChildren(const BatchContext& ctx, const CaseSink& sink);

// A child's work: every rank of the batch's world in this process (`--local-worker`), or one
// rank of a kizuna-run job (`--worker`). Exit status 0; 3 after a kizuna error in a job.
int LocalWorkerMain(const BatchContext& ctx);
int ProcessWorkerMain(const BatchContext& ctx);

}  // namespace kizuna::crosscheck
