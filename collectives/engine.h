// The collective engine's one entry: what the public API (runtime/communicator.h, the C API)
// calls. An Engine is one rank's state in one communicator: its connections (transport/), the
// shape every rank agreed on (plan/topology.h), the plans it has built (a cache keyed by PlanKey),
// and its executor (executor/). The API validates arguments and hands the engine calls it can
// trust; the engine chooses the algorithm (cost/selector.h, with the fallback to the next
// candidate when building one answers kNotSupported), builds or finds the plan, and runs the
// operation: on the calling thread when it can (executor's TryInline, TryInlineGroup), else
// through the executor's thread. docs/ARCHITECTURE.md follows one AllReduce through it.
//
// Threading: every method may be called from any thread; Launch runs one operation at a time per
// engine (a call lock), as NCCL runs one call at a time per communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/cost/selector.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"
#include "runtime/core/version.h"
#include "runtime/device/device.h"

namespace kizuna::fabric {
class FabricRegistry;
}
namespace kizuna::collectives::tuner {
class TunerPlugin;
}

namespace kizuna::collectives {

class Executor;
class SameProcessGroup;
class Transport;
struct OperationMember;

struct EngineOptions {
  // The configuration; must outlive the engine.
  const Config* config = nullptr;
  // CommOptions' fields of the same names (runtime/communicator.h says what each does).
  size_t staging_bytes = 0;
  std::string host_id;  // "" = HostId()
  bool direct_access = true;
  bool force_host_staging = false;
  Version version = kVersion;
};

// One collective call, its arguments already validated by the API.
struct EngineCall {
  CollectiveRequest request;
  const void* input = nullptr;
  void* output = nullptr;
  device::Stream* stream = nullptr;
  std::optional<Algorithm> algorithm;  // the caller's choice for this call (CallOptions)
  bool balance = true;                 // PlanOptions::balance
};

// What a plan is built for: a cached plan serves exactly the calls with an equal key.
struct PlanKey {
  Collective collective = Collective::kAllReduce;
  uint64_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  bool in_place = false;
  std::optional<Algorithm> forced;  // the call's own choice, if any
  uint64_t chunk_count = 0;
  int channels = 1;
  bool deterministic = false;
  bool balance = false;
  bool grouped = false;  // one of several calls of a group (fused runs alone)
  bool operator==(const PlanKey&) const = default;
  auto operator<=>(const PlanKey&) const = default;
};

class Engine {
 public:
  // Collective over `bootstrap`: every rank's engine is created together. Loads the INA layout
  // (KIZUNA_INA_LAYOUT), agrees with the other ranks on the fabrics they all have and connects
  // (transport), sets up the same-host group where ranks of one host share buffers, agrees on the
  // shape, and starts the executor. `same_process`: the group of CreateLocal's ranks when they
  // address each other's memory; null otherwise.
  static Result<std::unique_ptr<Engine>> Create(std::shared_ptr<bootstrap::Bootstrap> bootstrap,
                                                device::Device& device, const EngineOptions& options,
                                                std::shared_ptr<SameProcessGroup> same_process = nullptr);
  // Finishes the queued operations (bounded by their deadlines), then closes the connections.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  // The communicator's ranks: in an INA job the workers only (the aggregation devices follow).
  int size() const { return size_; }
  // In an INA job, this rank is an aggregation device: it serves operations and makes no calls.
  bool aggregation_device() const { return aggregation_device_; }
  const CommTopology& topology() const { return shape_; }
  // This rank's connections, for logs and tools (Transport::description).
  std::string DescribeConnections() const;
  // The peers this rank has a connection with so far, either way (Transport::connected_peers).
  std::vector<int> ConnectedPeers() const;
  // The fabric that reaches peer q ("" for none, or this rank).
  std::string FabricOf(int q) const;

  // Runs or queues `calls` (one or several calls of one group, on one stream) as one operation.
  // Not on an aggregation device (the API refuses its calls).
  Status Launch(std::span<EngineCall> calls);
  // One call on each of `engines` (`calls[i]` for engines[i]): together every rank of an
  // in-process group, run by this thread at once when they can (Executor::TryInlineGroup).
  // false: launch them one by one. Locks every engine's call lock, in one order.
  static Result<bool> LaunchTogether(std::span<Engine* const> engines,
                                     std::span<std::vector<EngineCall>* const> calls);
  // Plain host memory is accepted (Executor::TakesHostMemory).
  bool TakesHostMemory() const;
  // The algorithm and predicted times chosen for a request, as logged at INFO; `balance`: a call's
  // CallOptions::balance (work split by speed, or evenly).
  Result<std::string> ExplainChoice(Collective collective, size_t count, DataType type, bool balance = true) const;
  // What the cost model predicts for `algorithm` serving the request on this shape with
  // `constants` (kizuna-tune fits them), planned as a call would be.
  Prediction PredictWith(Collective collective, size_t count, DataType type, Algorithm algorithm,
                         const CostConstants& constants) const;
  // Collective over the bootstrap, between calls (engine_reweigh.cc): each rank measures its
  // device's copy and reduce speeds on a stream of its own and the ranks exchange them; later
  // plans split work by them (the plan cache is emptied). Speeds within 15 % of their mean are
  // taken as equal, so that a probe's noise does not unbalance devices that are alike.
  Status Reweigh(Deadline deadline);
  // An aggregation device's life (Executor::WaitServing); kInvalidArgument on a worker.
  Status ServeAggregation(uint64_t* served);
  void Abort(std::string_view why);
  Status AsyncError() const;
  int InFlight() const;
  // Buffers registered for zero-copy (Executor::Register); a one-rank engine keeps none.
  uint64_t Register(const void* buffer, size_t bytes);
  Status Deregister(uint64_t handle);
  uint64_t registered_transfers() const;
  // The flight recorder's JSON (FlightRecorder::ToJson); a one-rank engine records nothing.
  std::string FlightRecord() const;

 private:
  struct Prepared {
    device::Stream* stream = nullptr;
    bool host_memory = false;  // plain host memory: it must run inline (Executor::TryInline)
    size_t slot_bytes = 0;
  };
  class Builder;  // Create's steps (engine_create.cc)
  Engine();
  // Launch, call_mu_ held.
  Status LaunchLocked(std::span<EngineCall> calls);
  // Launch's first half: the operation's members into members_ (plans chosen), and where it goes.
  Status Prepare(std::span<EngineCall> calls, Prepared* out);
  // The plan for one call, from the cache or built; the pointer stays valid until the next call.
  Result<const std::shared_ptr<const Plan>*> PlanFor(const EngineCall& call, size_t slot_bytes, int channels,
                                                     bool grouped);
  // The model's ranking, with per_call / KIZUNA_ALGO applied, then the tuner plugin where neither
  // named an algorithm; `grouped`: fused is not a candidate.
  Result<Selection> Select(const CollectiveRequest& request, const PlanOptions& options,
                           std::optional<Algorithm> per_call, bool grouped) const;
  // The plan options of ExplainChoice and PredictWith: those of a call of `request` alone (its
  // channels and chunk, the configuration's mode).
  PlanOptions ChoiceOptions(const CollectiveRequest& request) const;
  // Builds the selection's choice, falling back to the next supported candidate by predicted time
  // when building answers kNotSupported (what only building can tell: a deterministic plan on
  // links that are not all there, a point-to-point peer out of reach).
  Result<Plan> BuildWithFallback(const CollectiveRequest& request, const PlanOptions& options, Selection& selection);

  int rank_ = 0;
  int size_ = 1;
  bool aggregation_device_ = false;
  const Config* config_ = nullptr;
  std::shared_ptr<bootstrap::Bootstrap> bootstrap_;
  device::Device* device_ = nullptr;
  Config fabric_config_;  // the configuration the fabrics see (outlives them)
  std::unique_ptr<fabric::FabricRegistry> fabrics_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Executor> executor_;
  uint64_t single_rank_regions_ = 0;  // Register's handles where there is no executor
  CommTopology shape_;
  AlgoOverrides overrides_;  // KIZUNA_ALGO, parsed at creation
  std::unique_ptr<tuner::TunerPlugin> tuner_;  // KIZUNA_TUNER_PLUGIN, loaded at creation; null: none
  CostConstants cost_;  // the cost model's constants: the defaults, or KIZUNA_COST_FILE's for this size

  std::mutex call_mu_;  // one operation at a time (Launch)
  // The plan cache. The plan of the last lookup is checked before the map: a loop repeating one
  // call finds it without the map's lock and key comparisons (call_mu_ guards these two).
  std::mutex plans_mu_;
  std::map<PlanKey, std::shared_ptr<const Plan>> plans_;  // guarded by plans_mu_
  PlanKey last_key_;
  std::shared_ptr<const Plan> last_plan_;
  // Launch's members, kept between calls (guarded by call_mu_) so that a call run inline
  // allocates nothing.
  std::vector<OperationMember> members_;
};

}  // namespace kizuna::collectives
