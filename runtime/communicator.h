// Communicators and collectives: kizuna's public C++ API (the C API in kizuna.h wraps it).
//
// A Communicator is one rank of a group of ranks, each driving one device (NCCL's ncclComm_t).
// Create one per rank from a UniqueId (ncclCommInitRank), from the launcher's environment, for N
// local devices in one process (ncclCommInitAll), or by splitting another (ncclCommSplit).
//
// Collectives follow NCCL's semantics (counts in elements of `type`; see collectives/plan/plan.h for
// the buffer sizes of each):
//   AllReduce(send, recv, count)          every rank gets the reduction of all ranks' send
//   ReduceScatter(send, recv, recvcount)  rank r gets the reduction of part r of all sends
//   AllGather(send, recv, sendcount)      recv = every rank's send, in rank order
//   Broadcast(send, recv, count, root)    recv = root's send
//   Reduce(send, recv, count, op, root)   root's recv = the reduction
//   AllToAll(send, recv, count)           recv part j = rank j's send part r
//   Send / Recv(count, peer)              point to point; pair them in a group to avoid deadlock
//   Barrier()                             returns (on the stream) once every rank has called it
// In place: AllReduce, Broadcast, Reduce with send == recv; ReduceScatter with send + rank *
// recvcount == recv; AllGather with send == recv + rank * sendcount (element offsets). Any other
// overlap of send and recv is rejected. AllToAll is out of place only.
//
// Every call validates its arguments (nothing is enqueued on bad input: kInvalidArgument naming
// the argument), picks an algorithm (cost model, KIZUNA_ALGO, or CallOptions), enqueues the
// operation behind `stream`'s current work and returns at once. The operation runs when the
// stream reaches it; the stream's later work sees the results (wait on the stream, or record an
// event after the call). Buffers must stay valid until then. Every rank must call the same
// collectives in the same order with matching arguments; a rank that does not gets an error
// naming both calls and both ranks (mismatch detection), never a hang or a silent wrong result.
//
// Errors while an operation runs (a peer that went away, a mismatch, a timeout after
// KIZUNA_TIMEOUT) make the communicator unusable: AsyncError() reports the first, every later call
// returns kAborted, and the other ranks are told. Abort() stops everything promptly.
//
// Groups (thread-local, like ncclGroupStart/End): calls between GroupStart and GroupEnd are
// validated at once and run together as one operation per communicator at GroupEnd, so that,
// e.g., a Send and a Recv between two ranks cannot deadlock. Groups nest (only the outermost End
// launches). All calls of one communicator in a group must use the same stream. A group holding
// one fused call on each communicator of an in-process group, on idle streams, whose memory the
// CPU works on, runs whole on the calling thread before GroupEnd returns (one thread driving
// several devices: no hand-off to the executors' threads).
//
// Threading: a communicator's calls may come from any thread, one at a time (as with NCCL).
// Different communicators are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collectives/engine.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/config.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/core/version.h"
#include "runtime/device/device.h"

namespace kizuna {

namespace device {
class DeviceRegistry;
}
namespace status {
class Registration;
}

struct CommOptions {
  // The configuration to use; nullptr: the process's (GlobalConfig()). Must outlive the
  // communicator.
  const Config* config = nullptr;
  // Staging memory per rank on its device for the engine's transfers; 0: 8 MiB, or 16 MiB when
  // some peer is reached over a network fabric (TransportOptions::network_staging_bytes).
  size_t staging_bytes = 0;
  // The host this rank runs on, as ranks compare it: ranks of one host are linked directly
  // (directconnect), ranks of different hosts through a network fabric.
  std::string host_id;  // "" = HostId(); tests that pretend ranks are on different hosts set it
  // Let ranks that address each other's memory (ranks of one process, CreateLocal) or share it
  // (ranks of one host in several processes) use the single-host direct algorithms (fused).
  // false forces every transfer through the transport (for comparisons).
  bool direct_access = true;
  // Stage every transfer through host memory from Device::AllocateHost, even where a fabric could
  // reach the device's memory (the path taken for GPU memory a fabric cannot register; tests).
  bool force_host_staging = false;
  // The version this rank announces when the communicator forms (the library's; tests pretend
  // another build's). Ranks of different majors refuse each other.
  Version version = kVersion;
};

struct CallOptions {
  // Use this algorithm when it can serve the call (else the model's choice, logged), over
  // KIZUNA_ALGO.
  std::optional<collectives::Algorithm> algorithm;
  // Split work by the ranks' reported speeds where the algorithm allows (PlanOptions::balance);
  // false forces the even split, for comparisons.
  bool balance = true;
};

// Split's color for ranks that join no new communicator (NCCL_SPLIT_NOCOLOR).
inline constexpr int kSplitNoColor = -1;

// Shrink's treatment of the operations still in flight (NCCL_SHRINK_DEFAULT, NCCL_SHRINK_ABORT).
enum class ShrinkMode {
  kDefault,  // none may be in flight (kInvalidArgument otherwise); the communicator stays usable
  kAbort,    // revoke them first (Revoke): the way on after a rank was lost
};

class Communicator {
 public:
  // ncclCommInitRank: rank `rank` of `size` ranks that share `id` (from bootstrap::GetUniqueId on
  // one rank, distributed by the application). Collective: every rank must call it.
  static Result<std::unique_ptr<Communicator>> Create(const bootstrap::UniqueId& id, int rank, int size,
                                                      device::Device& device, const CommOptions& options = {});
  // Over an existing bootstrap (in-process ranks, a parent's split). Collective.
  static Result<std::unique_ptr<Communicator>> Create(std::shared_ptr<bootstrap::Bootstrap> bootstrap,
                                                      device::Device& device, const CommOptions& options = {});
  // Rank, size and rendezvous from the launcher (kizuna-run, torchrun, mpirun, srun: see
  // runtime/bootstrap/launch_env.h); the device from the device registry: KIZUNA_DEVICE, else
  // local rank modulo the first available backend's device count. The communicator owns the
  // registry it created.
  static Result<std::unique_ptr<Communicator>> CreateFromEnvironment(const CommOptions& options = {});
  // ncclCommInitAll: one communicator per device, ranks 0..n-1 in the order given, as threads of
  // this process over an in-memory bootstrap.
  static Result<std::vector<std::unique_ptr<Communicator>>> CreateLocal(std::span<device::Device* const> devices,
                                                                       const CommOptions& options = {});

  // Waits for queued operations (bounded by KIZUNA_TIMEOUT each), then releases everything
  // (ncclCommDestroy). Use Abort first to give up on operations that cannot finish.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return engine_->rank(); }
  int size() const { return engine_->size(); }
  device::Device& device() const { return *device_; }
  // What every rank knows about every rank's device and links (the cost model's inputs).
  const collectives::CommTopology& topology() const { return engine_->topology(); }
  // This rank's connections: which fabric serves which peers, over which devices, and how the
  // staging memory is registered — "directconnect: rank 1 (device w0:port0); ofi: ranks 2, 3
  // (device tcp;ofi_rxm:lo); staging by fd (device export)" (collectives/transport/transport.h). Every
  // available fabric that all ranks have is used, in KIZUNA_FABRIC's order (else direct fabrics
  // first, then registration order: FabricRegistry::SelectAll); each pair of ranks uses the first
  // that connects the two.
  std::string DescribeConnections() const;
  // The ranks this rank has opened a connection to, or accepted one from, so far, in rank order.
  // Connections are made when an operation first needs them (the ring's neighbours, a tree's parent
  // and children, a point-to-point peer), not at creation, so this grows with the peers the
  // algorithms used; the fused algorithms between ranks of one host use none.
  std::vector<int> ConnectedPeers() const;
  // The fabric that reaches `peer` ("directconnect", "tcp"); "" for none, or this rank.
  std::string FabricOf(int peer) const;

  Status AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, device::Stream& stream,
                   const CallOptions& options = {});
  Status ReduceScatter(const void* send, void* recv, size_t recvcount, DataType type, ReduceOp op,
                       device::Stream& stream, const CallOptions& options = {});
  Status AllGather(const void* send, void* recv, size_t sendcount, DataType type, device::Stream& stream,
                   const CallOptions& options = {});
  Status Broadcast(const void* send, void* recv, size_t count, DataType type, int root, device::Stream& stream,
                   const CallOptions& options = {});
  Status Reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
                device::Stream& stream, const CallOptions& options = {});
  Status AllToAll(const void* send, void* recv, size_t count, DataType type, device::Stream& stream,
                  const CallOptions& options = {});
  Status Send(const void* send, size_t count, DataType type, int peer, device::Stream& stream);
  Status Recv(void* recv, size_t count, DataType type, int peer, device::Stream& stream);
  Status Barrier(device::Stream& stream);

  // Thread-local groups; see above. GroupEnd returns the first launch error.
  static Status GroupStart();
  static Status GroupEnd();

  // ncclCommSplit: collective over this communicator. Ranks with the same color form a new
  // communicator on the same devices, ordered by (key, rank); color kSplitNoColor gives nullptr.
  Result<std::unique_ptr<Communicator>> Split(int color, int key);

  // ncclCommShrink: a new communicator of this one's ranks but `exclude` (ranks of this
  // communicator, say those lost), in the same order, on the same devices, usable at once.
  // Collective over the remaining ranks only: each calls it with the same `exclude` (a rank whose
  // list differs fails every rank's call, naming both lists); the excluded ranks do not call it,
  // and need not be alive — nor need this communicator's rank 0. kAbort first revokes this
  // communicator's operations (the usual case: one of them failed naming a lost rank); kDefault
  // needs none in flight and leaves this communicator usable. kInvalidArgument for a rank out of
  // range or listed twice, or for excluding the calling rank.
  Result<std::unique_ptr<Communicator>> Shrink(std::span<const int> exclude, ShrinkMode mode = ShrinkMode::kAbort);
  // ncclCommRevoke: fails queued and running operations with kAborted ("revoked"), refuses later
  // calls and tells the peers, so that ranks blocked on this one fail at once; returns promptly.
  // The communicator stays valid for Shrink and destruction (Abort's effect, with Shrink after).
  void Revoke();
  // Collective, between calls: every rank measures its device's copy and reduce speeds (a short
  // probe on a stream of its own) and the ranks exchange them; later calls split their work by
  // the measured speeds (CallOptions::balance), as when another job came to share one device.
  // Returns when every rank has called it (KIZUNA_TIMEOUT); kNotSupported in a job with
  // in-network aggregation devices (they make no calls). The ranks of one process
  // (CreateLocal) each call it from a thread of their own. KIZUNA_REWEIGH_CALLS=N does it before
  // every N-th collective call of communicators made through a unique id (a process per rank).
  Status Reweigh();
  // Fails queued and running operations with kAborted, releases held streams, tells the peers.
  // Returns promptly. The communicator is then unusable (destroy it).
  void Abort();
  // The first error of an operation, or ok (ncclCommGetAsyncError).
  Status AsyncError() const;
  // Operations this rank's executor thread has taken and not finished. Calls that ran on the
  // calling thread, or that went onto the streams alone (a group of every in-process rank's fused
  // call on devices), never count.
  int InFlight() const;

  // In-network aggregation (KIZUNA_INA_LAYOUT, collectives/ina/layout.h): the ranks after the
  // layout's workers are its aggregation devices. They are not ranks of the communicator (size()
  // counts the workers) and make no calls: true here, they run ServeAggregation instead.
  bool aggregation_device() const { return engine_->aggregation_device(); }
  // Calls may pass plain host memory (malloc), as MPI and Gloo users do: true when the ranks are
  // processes of one host sharing buffers (one rank each) and the CPU reaches their devices'
  // memory. Such calls run fused on the calling thread (they return when done); AllReduce,
  // ReduceScatter, AllGather, Broadcast and Reduce only.
  bool TakesHostMemory() const;
  // ncclCommRegister: `buffer`'s [buffer, buffer + bytes) is the caller's for as long as it is
  // registered, and transfers from and into it go straight over any fabric that reaches it
  // (registered with the fabric once per connection, on first use), where unregistered memory
  // is staged unless the fabric registers memory cheaply. Memory the CPU reaches (host memory,
  // the emulated device's). The handle goes to Deregister, which waits for the operation running
  // now; the caller must not deregister a buffer that queued operations still use (as in NCCL).
  Result<uint64_t> Register(const void* buffer, size_t bytes);
  Status Deregister(uint64_t handle);
  // Transfers that went through registered buffers so far (for tests and the curious).
  uint64_t registered_transfers() const;
  // The flight recorder: this rank's last 64 operations as JSON ({"rank", "now_s", "records":
  // [{"seq", "call", "algorithm", "members", "path", "start_s", "end_s", "state", "error",
  // "waiting"}]}), running ones included with what a stalled one waits on, so that a job that
  // stopped or failed says what each rank was doing. The same goes to the file
  // KIZUNA_DUMP_ON_TIMEOUT names when an operation times out, and to kizuna-status.
  std::string FlightRecord() const;
  // An aggregation device's life: runs the INA operations the workers start, as their headers
  // arrive, until the job ends (kUnavailable: every worker closed its connections) or fails (a
  // worker died mid-operation, an abort), and returns why; `served` counts the operations.
  // kInvalidArgument on a worker.
  Status ServeAggregation(uint64_t* served = nullptr);

  // The algorithm and predicted times the engine chooses for a request on this communicator,
  // as logged at INFO (tools and tests); `balance` as CallOptions::balance (true without it).
  Result<std::string> ExplainChoice(collectives::Collective collective, size_t count, DataType type) const;
  Result<std::string> ExplainChoice(collectives::Collective collective, size_t count, DataType type,
                                    bool balance) const;
  // What the cost model predicts for `algorithm` serving such a request on this communicator with
  // `constants` instead of its own (kizuna-tune fits the constants to measured calls).
  collectives::Prediction PredictWith(collectives::Collective collective, size_t count, DataType type,
                                      collectives::Algorithm algorithm,
                                      const collectives::CostConstants& constants) const;

 private:
  Communicator() = default;
  // `same_process`: the in-process group of CreateLocal when its ranks address each other's
  // memory (the single-host direct algorithms then apply); null otherwise.
  static Result<std::unique_ptr<Communicator>> Init(
      std::shared_ptr<bootstrap::Bootstrap> bootstrap, device::Device& device, const CommOptions& options,
      std::shared_ptr<collectives::SameProcessGroup> same_process = nullptr);
  // A validated call: launched now, or kept for GroupEnd.
  Status Enqueue(collectives::EngineCall call);
  friend struct GroupState;

  const Config* config_ = nullptr;
  CommOptions options_;
  std::unique_ptr<device::DeviceRegistry> owned_devices_;  // CreateFromEnvironment only
  device::Device* device_ = nullptr;
  std::shared_ptr<bootstrap::Bootstrap> bootstrap_;  // Split's rendezvous
  std::unique_ptr<collectives::Engine> engine_;
  uint32_t splits_ = 0;  // splits made from this communicator (tags for their bootstraps)
  // KIZUNA_REWEIGH_CALLS: collective calls launched so far, and whether it applies (ranks that
  // met through a unique id, each a process of its own).
  uint64_t calls_ = 0;
  bool auto_reweigh_ = false;
  // kizuna-status reaches this communicator while held (runtime/job_status.h); dropped first.
  std::unique_ptr<status::Registration> status_;
};

}  // namespace kizuna
