// A communicator's flight recorder: its last operations (kCapacity of them), what each was, on
// which path it ran, when it started and ended, and how it ended, so that a job that stopped or
// failed says what it was doing (Communicator::FlightRecord, KIZUNA_DUMP_ON_TIMEOUT). Always on:
// an operation costs one lock and a few words copied at its start and at its end; the text is
// made only when someone reads the record.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

enum class RunPath : uint8_t {
  kExecutor,  // the executor's thread
  kCaller,    // the calling thread (TryOnCaller)
  kInline,    // a fused call on the calling thread (TryInline)
};

struct OperationRecord {
  uint64_t seq = 0;  // 0: a point-to-point group (collectives alone are numbered)
  CollectiveRequest request;
  Algorithm algorithm = Algorithm::kRing;
  int members = 1;  // calls in its group
  RunPath path = RunPath::kExecutor;
  // Its steps ran on the straight path (every transfer inside an operation header, in order on
  // one thread: Executor::Run::ExecuteStraight), not through staging slots and streams.
  bool straight = false;
  double start_s = 0;  // since the recorder was made
  double end_s = 0;    // 0: still running
  Status status;       // how it ended (ok while running)
  // While it runs and has not moved for a while (the staged path's probes): what it waits on,
  // "waiting on rank(s) 2 (channel 0 step 3 (recv from rank 2))".
  std::string waiting;
};

class FlightRecorder {
 public:
  static constexpr size_t kCapacity = 64;

  // An operation starts: its record's ticket, for End.
  uint64_t Begin(uint64_t seq, const CollectiveRequest& request, Algorithm algorithm, int members, RunPath path,
                 bool straight = false);
  void End(uint64_t ticket, const Status& status);
  // Its steps ran straight after all (hier:fused's network level, decided after the host level).
  void Straight(uint64_t ticket);
  // What a running operation waits on (OperationRecord::waiting).
  void Waiting(uint64_t ticket, std::string what);

  // The records kept, oldest first.
  std::vector<OperationRecord> Snapshot() const;
  // The same as JSON: {"rank": R, "now_s": the recorder's clock now, "records": [{"seq", "call",
  // "algorithm", "members", "path", "straight", "start_s", "end_s", "state": "running"|"ok"|"failed", "error",
  // "waiting"}...]}.
  std::string ToJson(int rank) const;

 private:
  double Now() const;

  const std::chrono::steady_clock::time_point made_ = std::chrono::steady_clock::now();
  mutable std::mutex mu_;
  std::array<OperationRecord, kCapacity> ring_;  // mu_
  uint64_t next_ = 0;                            // mu_: tickets handed out so far
};

}  // namespace kizuna::collectives
