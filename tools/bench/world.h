// The ranks kizuna-bench drives from this process, their buffers and streams, and the three
// things a row needs from them: the engine's choice, a timed run and a checked run.
//
// Modes:
//   threads  every rank in this process: `ranks` communicators from Communicator::CreateLocal,
//            spread round-robin over the first `devices` devices of the backend (several ranks
//            per device allowed). One thread enqueues every rank's calls (they return at once,
//            as with NCCL's ncclCommInitAll and one thread driving several GPUs).
//   procs    one rank per process, started by a launcher (kizuna-run, torchrun, mpirun, srun:
//            runtime/bootstrap/launch_env.h); the device is local rank modulo `devices`. Times
//            and wrong counts are combined over the processes through the bootstrap (a few bytes
//            per row, between collectives).
//
// Buffers: each rank has a send and a receive buffer of the sweep's largest size, on the device
// (Device::Allocate) or, with host_buffers, plain host memory from the C allocator (what Gloo and
// MPI users pass; only for host-accessible devices that take such memory). Inputs are written and
// outputs read directly when the CPU can reach the buffers; otherwise through host memory from
// Device::AllocateHost and stream copies (GPU memory, KIZUNA_EMU_OPAQUE=1). None of this is timed.
//
// Errors: a call that fails, or a communicator that reports an asynchronous error, aborts every
// communicator of this process (Communicator::Abort tells the peers, so other processes stop
// promptly) and the error is returned; the World is unusable afterwards. Every wait is bounded by
// the configuration's timeout (KIZUNA_TIMEOUT).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/communicator.h"
#include "runtime/core/config.h"
#include "runtime/device/registry.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "tools/bench/choice.h"
#include "tools/bench/sweep.h"

namespace kizuna::bench {

enum class Mode : uint8_t { kThreads, kProcs };

struct WorldOptions {
  Mode mode = Mode::kThreads;
  int ranks = 0;  // threads: the communicator size (0: one per device used); procs: 0 or the world size
  std::string backend = "host_emulated";
  int devices = 0;  // the first `devices` devices of the backend (0: all)
  bool host_buffers = false;
  uint64_t buffer_bytes = 0;       // each send and receive buffer
  const Config* config = nullptr;  // must outlive the World
};

// One call of a row: what to run and where its buffers are.
struct BenchCall {
  BenchColl coll = BenchColl::kAllReduce;
  Geometry geometry;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  bool in_place = false;
  std::optional<collectives::Algorithm> algorithm;  // forced per call; nullopt: the engine chooses
  bool balance = true;                              // CallOptions::balance (--split speed|even)
};

class World {
 public:
  // kInvalidArgument for options that cannot work (an unknown or unavailable backend, more
  // devices than it has, procs mode without a launcher, host buffers on a device that cannot take
  // them, ...), naming the option; other errors as the runtime reports them.
  static Result<std::unique_ptr<World>> Create(const WorldOptions& options);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int nranks() const { return nranks_; }
  // Whether this process prints the results (it holds rank 0).
  bool leader() const { return leader_; }
  Mode mode() const { return mode_; }
  // Ranks held by this process.
  int local_ranks() const { return static_cast<int>(ranks_.size()); }
  // One line per rank of the job, in rank order (nccl-tests' "Using devices" lines, without "#").
  const std::vector<std::string>& device_lines() const { return device_lines_; }
  // How inputs get in and outputs out: "direct" or "staged through AllocateHost".
  std::string data_path() const;

  // The engine's choice and predictions for a call of `coll` with `count` (Geometry::count).
  Result<AlgorithmChoice> Explain(BenchColl coll, uint64_t count, DataType type, bool balance = true) const;
  // Zeroes every buffer (before timing: uninitialised memory may hold NaNs and denormals, which
  // some devices reduce slowly).
  Status Prime();
  // `s` when it is a cause; when it only says that another rank failed (kRemoteError, kAborted),
  // the error of a rank of this process that holds the cause, with its rank in `culprit`.
  Status RootCause(const Status& s, int* culprit) const;
  // `warmup` calls, then `iters` calls back to back: the seconds per call, from before the first
  // enqueue to after every rank's stream synchronized, the largest over the ranks.
  Result<double> Time(const BenchCall& call, int warmup, int iters);
  // `warmup` calls, then `iters` calls each after a barrier: each call's seconds from its enqueue
  // to every rank's stream synchronized, the largest over the ranks, and the median of those (the
  // method of the race's MPI and Gloo programs, bench/README.md).
  Result<double> TimeEach(const BenchCall& call, int warmup, int iters);
  // One call on known inputs (values.h); the wrong output elements, summed over every rank.
  Result<uint64_t> Check(const BenchCall& call);

 private:
  struct Memory;
  struct Rank;
  World() = default;
  Status CreateThreads(const WorldOptions& options, std::vector<device::Device*> devices);
  Status CreateProcs(const WorldOptions& options, std::vector<device::Device*> devices);
  Status AddRank(const WorldOptions& options);
  Status IssueOne(Rank& rank, const BenchCall& call);
  Status Issue(const BenchCall& call);
  Status SyncAll(std::string_view what);
  Status Fail(Status status);
  Status Upload(Rank& rank, void* dst, uint64_t bytes, const std::function<void(uint8_t*)>& fill);
  Result<const uint8_t*> Download(Rank& rank, const void* src, uint64_t bytes);
  Result<std::vector<double>> GatherDoubles(double mine);
  // Every process's `mine` (all of the same length), element by element the largest.
  Result<std::vector<double>> MaxOverProcesses(const std::vector<double>& mine);
  // Every rank meets in a barrier (procs mode; threads mode needs none: one thread issues all).
  Status BarrierAll();

  const Config* config_ = nullptr;
  Mode mode_ = Mode::kThreads;
  int nranks_ = 0;
  bool leader_ = true;
  uint64_t buffer_bytes_ = 0;
  bool cpu_access_ = true;
  bool failed_ = false;
  std::unique_ptr<device::DeviceRegistry> registry_;  // declared first: destroyed last
  std::shared_ptr<bootstrap::Bootstrap> bootstrap_;   // procs mode
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Rank>> ranks_;  // destroyed before the communicators
  std::vector<std::string> device_lines_;
};

}  // namespace kizuna::bench
