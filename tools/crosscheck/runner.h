// Running a case on communicators and checking it: the ranks this process drives (all of them in
// the in-process modes, one in a worker process), their buffers with guards, the calls issued as
// the mode says, and every check of the output against the reference (reference.h).
//
// A case's buffers are allocated for the case: [guard | offset | buffer | guard] on the rank's
// device (or in plain host memory), filled through a stream copy where the CPU cannot reach the
// device's memory. After each run: the guards are intact, an out-of-place input is unchanged, and
// the output is what the reference says; the AllReduce outputs of all ranks are identical bytes;
// with Case::compare_runs, every run's outputs equal the first run's bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"
#include "tools/crosscheck/cases.h"

namespace kizuna::crosscheck {

// One rank driven by this process.
struct RankHandle {
  int rank = 0;
  Communicator* comm = nullptr;
  device::Stream* stream = nullptr;
  std::unique_ptr<device::Buffer> bounce;  // host memory through which opaque device memory is reached
};

class Ranks {
 public:
  virtual ~Ranks() = default;
  virtual int nranks() const = 0;
  virtual std::vector<RankHandle*> local() = 0;
  // Stops every local communicator's operations (a failed or stuck case); the world is unusable after.
  virtual void AbortAll() = 0;
};

// Every rank in this process: communicators from Communicator::CreateLocal over emulated devices
// configured as `spec` says.
class LocalWorld : public Ranks {
 public:
  static Result<std::unique_ptr<LocalWorld>> Create(const WorldSpec& spec, double timeout_s);
  ~LocalWorld() override;

  int nranks() const override { return static_cast<int>(handles_.size()); }
  std::vector<RankHandle*> local() override;
  void AbortAll() override;

 private:
  LocalWorld() = default;
  Config config_;  // outlives the backend and the communicators (they keep pointers)
  std::unique_ptr<device::Backend> backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
  std::vector<std::unique_ptr<RankHandle>> handles_;
};

// This process's rank of a job started by kizuna-run (Communicator::CreateFromEnvironment).
class ProcessRank : public Ranks {
 public:
  static Result<std::unique_ptr<ProcessRank>> Create(const WorldSpec& spec, double timeout_s);
  ~ProcessRank() override;

  int nranks() const override { return comm_->size(); }
  std::vector<RankHandle*> local() override { return {&handle_}; }
  void AbortAll() override { comm_->Abort(); }

 private:
  ProcessRank() = default;
  Config config_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<device::Stream> stream_;
  RankHandle handle_;
};

// A throttled world's emulated devices (WorldSpec::throttled).
inline constexpr double kThrottleLaunchUs = 20;
inline constexpr double kThrottleGbps = 20;

// The configuration a world of `spec` runs with.
Config WorldConfig(const WorldSpec& spec, double timeout_s);

struct CaseResult {
  std::vector<std::string> failures;  // empty: passed
  bool broken = false;                // kizuna reported an error: the world is unusable
  bool stuck = false;                 // a call did not return, even after Abort: the process cannot go on
  // Per local rank: a hash of its AllReduce output (first run), compared across processes.
  std::vector<std::pair<int, uint64_t>> hashes;
};

// Runs `c` on `ranks` (every rank of the case's world or one of them) and checks what the local
// ranks hold. Each run's calls must finish within timeout_s + 30 seconds. `corrupt`: the
// reference takes rank 0's first input element with its top bit flipped (the driver's own check).
CaseResult RunCase(Ranks& ranks, const Case& c, double timeout_s, bool corrupt = false);

// Runs `work` on its own thread and waits up to `seconds` for it: true when it finished. A work
// that does not finish is left running (its thread detached), so it must own what it uses, or the
// caller must end the process.
bool FinishesWithin(double seconds, std::function<void()> work);

// FNV-1a over bytes: what processes compare instead of their outputs.
uint64_t HashBytes(const uint8_t* data, size_t bytes);

}  // namespace kizuna::crosscheck
