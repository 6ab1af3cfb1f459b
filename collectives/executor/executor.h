// The executor: one thread per communicator (NCCL's proxy thread) that runs operations — a
// collective call, or a group of calls fused by GroupStart/GroupEnd — by driving their plans'
// steps over the transport's fabric connections and the device's streams (docs/ARCHITECTURE.md).
//
// How one operation flows (a small one over a network may instead run whole on the caller's
// thread: TryOnCaller; a fused one between processes: TryInline):
//  1. Submit (on the caller's thread, returns at once) queues the operation and enqueues on the
//     caller's stream a host callback that (a) tells the executor the stream has reached the
//     call — the inputs are ready; a stream with nothing queued has, and gets no callback — and
//     (b) holds the stream until the operation is done, so later work on the stream sees the
//     results (NCCL's semantics; a device with stream memory
//     operations could do this without holding a host thread, later).
//  2. The executor takes operations in submission order. For each: it sends an operation header
//     (sequence number and signature) to every peer it will send data to, and checks the header
//     of every peer it receives from before consuming that peer's data; a rank at another
//     operation, or at the same sequence number with another signature, fails the operation
//     with an error naming both signatures and both ranks (mismatch detection).
//  3. Steps run as plan.h specifies: each channel in order, with a window of started steps;
//     sends copy their source into a staging slot on the channel's device stream, then post a
//     fabric send from the slot; receives land in a staging slot, then a device copy or reduce
//     moves them to their destination; local steps are device operations. Tags keep channels
//     and group members apart on the shared connections.
//  4. When every step has completed (device work included), the operation is done: the held
//     stream continues. On failure the held stream continues too, told of the failure first
//     (Stream::ReportFailure): its next Synchronize returns it, once, besides the communicator's
//     AsyncError (NCCL has only ncclCommGetAsyncError; a caller waiting on the stream would take
//     untouched outputs for results).
//
// Failures are sticky: after one operation fails, every queued and later operation fails with
// that error (kAborted wrapping it), and the executor closes its connections so that peers waiting
// on this rank fail promptly with kRemoteError instead of waiting for their timeout. Before
// closing, it tells every peer why (a control message), so their errors name the first cause.
//
// Deadlines: an operation that has not completed KIZUNA_TIMEOUT after its inputs were ready fails
// with kTimeout naming the peers it still waits on and the steps.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "collectives/direct/same_host_group.h"
#include "collectives/direct/same_process_group.h"
#include "collectives/executor/flight_recorder.h"
#include "collectives/executor/trace.h"
#include "collectives/plan/plan.h"
#include "collectives/transport/transport.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace kizuna::collectives {

// One collective of an operation: its plan (this rank's part) and the caller's buffers.
// What every rank's plan of one operation must agree on, hashed (the operation header's signature
// is made of these): cache it in Plan::signature when the plan is kept for many calls.
uint64_t PlanSignature(const Plan& plan);

struct OperationMember {
  std::shared_ptr<const Plan> plan;  // ranks[0] is this rank's RankPlan
  const void* input = nullptr;       // device addresses, per plan.h's buffer table
  void* output = nullptr;
};

struct ExecutorOptions {
  double timeout_s = 600;  // per operation, from its inputs being ready
  std::string dump_on_timeout;  // Config::dump_on_timeout
  std::string trace_file;       // Config::trace_file (trace.h)
  int window = 4;          // started steps per channel (>= 2, plan.h)
  // Point-to-point's staging for every channel that can be active at once (P2pStagingBytes): the
  // chunk is cut from it (p2p_chunk_bytes). The transport's region for point-to-point grows to the
  // slots an operation's transfers use (Transport::ReserveP2p), not to this.
  size_t p2p_staging_bytes = 0;
  // The largest point-to-point chunk (KIZUNA_CHUNK_BYTES; 0: the default chunk).
  size_t chunk_bytes = 0;
  // The in-process group for the direct algorithms, and this rank's place in it; null when the
  // communicator's ranks do not address each other's memory (CommTopology::direct is false).
  std::shared_ptr<SameProcessGroup> same_process;
  // The same for ranks of one host in several processes (direct/same_host_group.h); null unless every rank
  // of the communicator is on this host and their devices share allocations across processes.
  std::shared_ptr<SameHostGroup> same_host;
  // Across hosts: the group of this rank's host (collectives/direct/same_host_group.h), for
  // hier:fused's host level (RunHostFused); null where CommTopology::host_direct is false.
  std::shared_ptr<SameHostGroup> host_group;
  int rank = 0;
  // Per rank of the communicator (RankDesc::host_memory): the CPU reaches its memory. A small
  // transfer between two such ranks travels inside the operation header (Run::Setup).
  std::vector<bool> host_memory;
  // The machine's ranks take all its CPUs (or more): an operation's CPU work (steps on the CPU,
  // hier:fused's host level) stays on the thread that runs it (ScopedSerialHostWork) instead of
  // spreading over oneTBB's threads, whose CPUs the other ranks and their network stacks need
  // (2 namespace hosts of one rank on 2 CPUs, busbw in alternate runs: 1 MiB AllReduce 1.53-1.79
  // GB/s against 1.24-1.91 spread, 64 MiB 1.04-1.28 against 0.90-1.12). Set by the engine across
  // hosts only.
  bool serial_host_work = false;
  // An aggregation device of an INA job (algorithms/ina.cc): it makes no calls of its own. Set,
  // the executor runs an operation whenever one of its peers' operation headers arrives, with the
  // plan this returns for the request the header describes, until the job ends (every peer has
  // closed its connections: kUnavailable) or an operation fails. Submit is not used.
  std::function<Result<std::shared_ptr<const Plan>>(const CollectiveRequest& request, Algorithm algorithm,
                                                    uint64_t chunk_count, int channels)>
      serve;
  // Serve: the job's workers are ranks 0..workers-1 (the other aggregation devices follow them);
  // the job has ended when every worker has closed its connections.
  int workers = 0;
};

namespace executor_internal {
struct ControlMessage;  // internal.h
}

class Executor {
 public:
  // Starts the executor thread. `transport` and `device` must outlive the executor.
  static Result<std::unique_ptr<Executor>> Create(Transport* transport, device::Device* device,
                                                  const ExecutorOptions& options);
  // Finishes the queued operations (bounded by their deadlines), then stops the thread and
  // releases the device resources. Never throws, never hangs past the deadlines.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The staging slot size (bytes) for an operation whose collective members have
  // `total_channels` channels in all: the staging buffer split into
  // total_channels x window slots, at most `chunk_bytes` (0: the default chunk), a multiple of 64.
  // Plans submitted with it must have no step larger.
  size_t slot_bytes_for(int total_channels, size_t chunk_bytes) const;
  // Point-to-point's part of the staging buffer for `nranks` ranks and a collective staging of
  // `staging_bytes` (ExecutorOptions::p2p_staging_bytes): large enough that every point-to-point
  // channel that can be active at once gets its slots.
  static size_t P2pStagingBytes(int nranks, size_t staging_bytes);
  // The chunk of every Send and Recv (bytes): a function of the communicator's configuration
  // alone — never of the other calls in a group, which differ between the two ranks of a transfer
  // — so that the sender's messages are the receiver's. At most ExecutorOptions::chunk_bytes.
  size_t p2p_chunk_bytes() const;

  // Queues one operation (a group: several members, run concurrently) behind `stream`'s current
  // work, with staging slots of `slot_bytes` (from slot_bytes_for). kAborted (nothing queued)
  // when the executor has failed or been aborted.
  Status Submit(std::vector<OperationMember> members, device::Stream& stream, size_t slot_bytes);
  // A fused operation between processes whose device memory the CPU reaches runs at once on the
  // calling thread when the executor and the caller's stream are idle (a small AllReduce through
  // SameHostGroup::RunOneShot, the rest through the mapped buffers with the CPU doing this rank's part):
  // no hand-off to the executor's or the stream's thread. True when it ran (its error, if it
  // failed, fails the communicator as any operation's would); false: Submit it as usual.
  // `host_memory`: the buffers are plain host memory (TakesHostMemory): the operation must run
  // here, so this waits for the caller's stream and the executor to be idle, and fails when the
  // plan is not fused.
  Result<bool> TryInline(const std::vector<OperationMember>& members, device::Stream& stream,
                         bool host_memory = false);
  // A small collective (up to 4 MiB over a network, else 64 KiB) on memory the CPU reaches, over connections to other
  // processes, runs at once on the calling thread when this executor and the caller's stream are
  // idle: its steps, its messages and its waits, with no hand-off to the executor's thread and
  // back (between hosts that hand-off was most of an 8-byte AllReduce). Only where this process
  // holds no other rank that the caller's thread might have to drive for the call to complete
  // (one executor in the process; no in-process or host group). True when it ran (its error, if
  // it failed, fails the communicator as any operation's would); false: Submit it as usual.
  Result<bool> TryOnCaller(const std::vector<OperationMember>& members, device::Stream& stream, size_t slot_bytes);
  // One thread calling every rank of an in-process group together (GroupStart, one fused call on
  // each rank's communicator, GroupEnd: how one thread drives several devices), every executor
  // idle and the calls matching. When the CPU does the parts (memory it reaches, devices not
  // throttled) and every caller's stream is idle, this thread runs every rank's part itself, in
  // rank order, before returning. When the devices do the parts (GPUs, opaque memory), this
  // thread enqueues every rank's part on that rank's own stream, ordered by events between the
  // streams (each part after every rank's earlier work; each stream's later work after every
  // part), and returns: no executor thread, no held stream, no host wait. `executors[i]` runs
  // `members[i]` (one member) on `streams[i]`. True when it ran (its error, if it failed, fails
  // every executor); false: submit them as usual (the usual path names a mismatch).
  static Result<bool> TryInlineGroup(std::span<Executor* const> executors,
                                     std::span<const std::vector<OperationMember>* const> members,
                                     std::span<device::Stream* const> streams);
  // Calls may pass plain host memory (malloc): the communicator's ranks are processes of one host
  // sharing buffers, and the CPU reaches their device memory, so fused operations run on the
  // calling thread (TryInline) through staging allocations the peers map (SameHostGroup::RunStaged).
  // Operations up to this many bytes may run whole on the calling thread (TryOnCaller); 0 when
  // the device's steps are not the CPU's.
  size_t caller_op_bytes() const;
  bool TakesHostMemory() const {
    return options_.same_host && options_.same_host->host_accessible() &&
           options_.same_host->one_rank_per_process();
  }

  // The caller's buffers registered for zero-copy (Communicator::Register, ncclCommRegister): a
  // transfer from or into one goes direct over any fabric (Run::Direct), the region registered
  // on each connection's comm on first use and kept, not only where registration is cheap.
  // Register returns the region's id. Deregister waits for the operation running now (run_mu_),
  // releases the region's registrations, and later transfers in its bytes are staged again;
  // kInvalidArgument for an id that is not registered.
  uint64_t Register(const void* base, size_t bytes);
  Status Deregister(uint64_t id);
  // Its last operations (FlightRecorder).
  const FlightRecorder& recorder() const { return recorder_; }
  // The trace (KIZUNA_TRACE_FILE), or null.
  Tracer* tracer() const { return tracer_.get(); }
  // Transfers that went direct through a registered region so far (tests).
  uint64_t registered_transfers() const { return registered_transfers_.load(std::memory_order_relaxed); }

  // Fails the current and queued operations with kAborted, releases held streams, closes the
  // connections. Returns promptly (does not wait for peers).
  void Abort(std::string_view why);
  // The first failure, or ok.
  Status AsyncError() const;
  // Operations submitted and not yet finished.
  int pending() const;
  // ExecutorOptions::serve: blocks until the executor stops serving — the job ended (kUnavailable)
  // or failed, or Abort — and returns why; operations served so far in `served`.
  Status WaitServing(uint64_t* served = nullptr);

 private:
  struct Operation;
  class Run;
  class GroupCall;  // TryInlineGroup's steps (direct.cc)
  Executor(Transport* transport, device::Device* device, const ExecutorOptions& options);
  void Loop();
  // ExecutorOptions::serve's loop (executor_serve.cc).
  void Serve();
  // Serve's step for one operation: runs the one whose header is first in rank `from`'s inbox.
  Status ServeOne(int from);
  // Takes the connections peers made to this rank (Transport::Poll, first those of `expecting`; at
  // most every kAcceptEvery unless `accept_now`), every control message that arrived into the inbox, and reposts the
  // receives (one per connected peer); a peer whose control connection ended is recorded in `gone`;
  // probes are answered (once this rank has a connection to the prober) and answers kept
  // (ControlState::state). True when anything arrived, or a peer connected.
  Result<bool> ReceiveControl(bool accept_now = false, std::span<const int> expecting = {});
  // Blocks until the control message from `peer` arrives (then the next ReceiveControl takes it)
  // or `deadline` passes.
  void WaitControl(int peer, Deadline deadline);
  // run_mu_, inside a host group's wait of hier:fused (RunHostFused, host_waits_move_fabric_):
  // writes what the connections still hold queued, a receive's post or an operation header that
  // a full socket left behind. This rank's operation is done with the network, but a peer on
  // another host may still wait for that output, and this wait's own peer for that peer; the
  // messages that come meanwhile go to the inbox (ReceiveControl).
  void MoveFabricWhileWaiting();
  // run_mu_: the control messages sent whose sends completed leave the pending lists (a Test of
  // one not done writes what its connection holds queued); a failed one is the error.
  Status ReapControlSends();
  // Sends one control message to `peer` if a control slot is free (waiting for one until
  // `deadline` when `wait`); false when none was, or when the connection to the peer is not made
  // yet (this starts it: Transport::Connect).
  // `sent`, when given: the send's request, which stays in the pending list until it completes.
  Result<bool> SendControl(int peer, const executor_internal::ControlMessage& m, bool wait, Deadline deadline,
                           fabric::Request** sent = nullptr);
  // SendControl's work; its errors do not name the peer yet.
  Result<bool> SendControlTo(int peer, const executor_internal::ControlMessage& m, bool wait, Deadline deadline,
                             fabric::Request** sent);
  // This rank's answer to a probe: the running operation, or idle after the last one.
  executor_internal::ControlMessage State() const;
  // A better reason than `symptom` for the failure of the operation with header `mine`, if one
  // arrived (or arrives within a short grace): a peer's abort notice (kRemoteError naming the rank
  // that failed first) or a peer's header for the same operation with another call (the
  // mismatch); else `symptom`.
  Status ExplainFailure(const Status& symptom, const executor_internal::ControlMessage& mine);
  // The operation header every rank computes for the same members (Submit, Serve).
  static Status FillHeader(Operation& op, int* total_channels);
  // An operation of `members` with its header and staging slots (Submit, TryOnCaller); not numbered.
  Result<std::shared_ptr<Operation>> NewOperation(std::vector<OperationMember> members, size_t slot_bytes);
  // Its header and slots, for op.members (NewOperation, and TryOnCaller's reused operation).
  Status InitOperation(Operation& op, size_t slot_bytes);
  // Runs `op` on this thread, which holds run_mu_ (Loop, TryOnCaller: `path`); a failure fails
  // the communicator and tells the peers; a timeout writes the flight recorder where
  // KIZUNA_DUMP_ON_TIMEOUT says.
  Status RunOperation(Operation& op, RunPath path = RunPath::kExecutor);
  // The flight recorder into the file options_.dump_on_timeout names (after a timeout).
  void DumpRecorder();
  // A fused member (fused.cc), run through the direct group (executor_direct.cc).
  Status RunDirect(Operation& op, Deadline deadline);
  Status RunHostDirect(Operation& op, Deadline deadline);  // through the host group
  // hier:fused (host_level.cc): the host level over the host group's mapped buffers around the
  // plan's network steps.
  Status RunHostFused(Operation& op);
  Status RunNetworkLevel(Operation& op, Deadline deadline);  // its network steps
  // `op`'s steps (`run`) as the operation running now (running_): on the straight path where
  // `straight` (Run::Straight), else through Run::Execute.
  Status RunSteps(const Operation& op, Run& run, bool straight, Deadline deadline);
  // The scratch buffer holds at least `bytes` (grown, never shrunk).
  Status EnsureScratch(size_t bytes);
  // A plan's scratch in bytes, rounded up as EnsureScratch lays members out.
  static size_t ScratchBytes(const Plan& plan);
  Status DirectStream();                                    // streams_[0] exists after it
  void Fail(const Status& status);
  void FinishOperation(Operation& op, const Status& status);
  // `tell` false: close without the abort notice (an aggregation device whose job ended normally).
  void TellPeersAndClose(const Status& status, bool tell = true);

  Transport* const transport_;
  device::Device* const device_;
  const ExecutorOptions options_;

  std::vector<std::unique_ptr<device::Stream>> streams_;  // one per channel, grown on demand
  std::unique_ptr<device::Buffer> scratch_;               // grown on demand
  std::unique_ptr<device::Event> direct_done_;            // RunDirect: this rank's part is done
  std::vector<std::unique_ptr<device::Buffer>> retired_scratch_;  // outgrown, freed with the executor
  // TryInlineGroup on devices: where this rank's caller stream reached the call, and where its
  // part was done (created on first use, by the thread that groups the calls).
  std::unique_ptr<device::Event> group_ready_, group_done_;
  bool group_on_streams_logged_ = false;
  bool on_caller_logged_ = false;  // run_mu_: TryOnCaller said so once at INFO
  std::unique_ptr<Operation> caller_op_;  // run_mu_: TryOnCaller's operation, made once and reused
  bool straight_logged_ = false;   // run_mu_: RunOperation said once at INFO that one ran straight
  bool direct_logged_ = false;     // run_mu_: Run::Post said once at INFO that transfers go direct

  // Registered regions (Register): [base, base + bytes) by id.
  struct Region {
    uint64_t id = 0;
    uintptr_t base = 0;
    size_t bytes = 0;
  };
  // The region holding [p, p + bytes), if any.
  std::optional<Region> RegionOf(const void* p, size_t bytes) const;
  // run_mu_: the region's registration on `comm`, made on first use.
  Result<fabric::Registration*> RegionRegistration(fabric::Comm& comm, const Region& region);
  // run_mu_: releases every registration of region `id` (0: of every region).
  void ReleaseRegions(uint64_t id);
  mutable std::mutex regions_mu_;
  std::vector<Region> regions_;  // regions_mu_
  uint64_t next_region_ = 1;     // regions_mu_
  std::map<std::pair<fabric::Comm*, uint64_t>, fabric::Registration*> region_regs_;  // run_mu_
  std::atomic<uint64_t> registered_transfers_{0};
  FlightRecorder recorder_;
  std::unique_ptr<Tracer> tracer_;  // KIZUNA_TRACE_FILE; null when off
  // The flight recorder's ticket of the operation RunOperation runs (its runs say there what they
  // wait on when they stall); under run_mu_.
  uint64_t record_ticket_ = ~uint64_t{0};

  // Held by the thread that uses the connections, the control state and the members below marked
  // "run_mu_": the executor's thread, or a caller's running an operation itself (TryOnCaller).
  // Taken before mu_, never while holding it.
  std::mutex run_mu_;
  // Executors alive in this process (TryOnCaller runs only where this one is alone).
  static std::atomic<int> live_executors_;
  // Control traffic (operation headers, abort notices): run_mu_.
  struct ControlState;
  std::unique_ptr<ControlState> control_;
  std::atomic<bool> closed_{false};  // set under run_mu_: the connections were closed after a failure
  Run* running_ = nullptr;  // run_mu_: the operation running now (State)
  // Set by the run_mu_ holder for RunHostFused: the host group's waits call MoveFabricWhileWaiting
  // (a fused operation inline, TryInline, runs without run_mu_ and leaves the fabric alone).
  std::atomic<bool> host_waits_move_fabric_{false};
  uint64_t last_seq_ = 0;   // run_mu_: the last numbered operation it ran
  uint64_t stream_wait_seq_ = 0;  // run_mu_: waiting for the caller's stream to reach it

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Operation>> queue_;  // guarded by mu_
  Status error_;                                   // guarded by mu_; first failure
  bool stopping_ = false;                          // guarded by mu_
  std::atomic<bool> abort_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> failing_{false};  // set with error_ (under mu_): AsyncError reads it without mu_
  uint64_t next_seq_ = 1;  // guarded by mu_
  uint64_t served_ = 0;    // guarded by mu_: operations run by Serve
  int pending_ = 0;        // guarded by mu_: taken from the queue, not finished
  std::thread thread_;
};

}  // namespace kizuna::collectives
