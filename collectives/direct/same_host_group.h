// The ranks of one communicator that share a host but not a process, and whose devices hand an
// allocation to another process (Device::FindAllocation, Device::Import): the cross-process form of
// SameProcessGroup, where their executors meet to run the single-host direct algorithms (fused.cc).
//
// Each rank owns one page of shared memory (a memfd, taken by the others with pidfd_getfd and
// mapped), written only by its owner: the operation it has reached and its buffers (the
// allocation's fd number, serial, size and the buffer's offset in it), the operation it has
// finished, and why it failed. A rank reaching a fused operation publishes its buffers and waits
// for every rank's; it maps each peer allocation the first time it sees it (pidfd_getfd of the
// peer's fd, Device::Import) and keeps the mapping for later operations (applications reuse their
// buffers), does its part of the pass, and waits for every rank to have finished before its
// caller's stream goes on (the others write into its output until then).
//
// Plain host memory (malloc) cannot be mapped by another process: RunStaged copies through two
// allocations of each rank's device instead, each rank reading only its own input and writing only
// its own output.
//
// Small AllReduces skip the mapping and the device: each rank copies its input into its page and
// reduces every rank's copy into its output on the calling thread (RunOneShot).
//
// Waiting spins briefly, then yields, then sleeps on a futex in the page it waits on (the owner
// wakes sleepers when it publishes), so that ranks oversubscribing the cores give them up. Every
// wait has the operation's deadline, sees the communicator's abort flag, notices a peer that
// failed (its page says why) or whose process ended (its pidfd), and names the ranks it waited
// for.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/direct/fused.h"
#include "collectives/plan/plan.h"
#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::collectives {

struct SameHostPage;  // the shared page's layout (same_host_group.cc)

class SameHostGroup {
 public:
  // Every rank's bytes, indexed by rank (the communicator's bootstrap AllGather).
  using AllGather = std::function<Result<std::vector<std::vector<uint8_t>>>(std::span<const uint8_t>)>;

  // Collective: every rank of the communicator calls it, with its own rank. Each creates its page,
  // the ranks allgather (pid, fd), each maps every peer's page, and they allgather whether that
  // worked, so all ranks get a group or all get kNotSupported with the first rank's reason (a
  // kernel without pidfd_getfd, ptrace restrictions, a device that cannot import).
  static Result<std::shared_ptr<SameHostGroup>> Create(int rank, int nranks, device::Device& device,
                                                   const AllGather& allgather);
  ~SameHostGroup();
  SameHostGroup(const SameHostGroup&) = delete;
  SameHostGroup& operator=(const SameHostGroup&) = delete;

  int nranks() const { return nranks_; }
  int rank() const { return rank_; }
  // Where the group is one host's ranks of a communicator across hosts: the communicator's rank of
  // each member, by which errors name them (default: the group's own numbers).
  void set_rank_names(std::vector<int> names) { names_ = std::move(names); }
  int Name(int q) const { return static_cast<size_t>(q) < names_.size() ? names_[static_cast<size_t>(q)] : q; }

  // Every rank's buffers for one operation, as addresses this rank's device takes.
  struct Buffers {
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
  };
  // Publishes this rank's buffers for operation `seq` ([input, + input_bytes) and [output, +
  // output_bytes), either may be empty) with the operation's signature and call, and waits until
  // every rank has published its own. kInvalidArgument naming both calls when a rank published
  // another signature or is at another operation; kTimeout at the deadline naming the ranks that
  // never came; kAborted when `abort` is set or a rank failed (with its reason); kRemoteError
  // when a rank's process ended.
  Result<Buffers> Exchange(uint64_t seq, uint64_t signature, const CollectiveRequest& request, const void* input,
                           uint64_t input_bytes, const void* output, uint64_t output_bytes, Deadline deadline,
                           const std::atomic<bool>& abort);
  // This rank's device work for `seq` is complete; waits until every rank's is. Errors as
  // Exchange.
  Status Finish(uint64_t seq, Deadline deadline, const std::atomic<bool>& abort);
  // A small AllReduce whole, on the calling thread, through the pages (no mapping, no device
  // stream): the CPU copies [input, + count) into this rank's slot, waits until every rank's slot
  // holds operation `seq`, and reduces all slots into `output` in rank order (the result does not
  // depend on who computes it). Two slots alternate, so no second rendezvous is needed: a rank
  // can only overwrite a slot once every rank has arrived at the operation after the one that
  // used it. For host-addressable buffers of at most kInlineBytes; errors as Exchange. A Barrier
  // is the rendezvous alone.
  static constexpr size_t kInlineBytes = 16 << 10;
  // One-shot operations up to this size (and Barriers) travel in one cache line with their
  // operation number: a peer that sees the number has the data (one transfer between cores).
  static constexpr size_t kLineBytes = 48;
  // Whether an operation goes through RunOneShot (every rank decides alike: the request and the
  // group's properties only): AllReduces up to kInlineBytes, and Barriers, when every rank's CPU
  // reaches its device memory. The others go through Exchange.
  bool UsesOneShot(const CollectiveRequest& request) const {
    return one_shot_ && (request.collective == Collective::kBarrier ||
                         (request.collective == Collective::kAllReduce &&
                          request.count * DataTypeSize(request.dtype) <= kInlineBytes));
  }
  size_t one_shot_bytes() const { return one_shot_ ? kInlineBytes : 0; }
  // Every rank's device memory is host accessible: the CPU may do the fused parts itself.
  bool host_accessible() const { return one_shot_; }
  // Every rank is in a process of its own. Only then may a call block its thread until the other
  // ranks have called too (Executor::TryInline): a thread that drives several ranks in turn
  // would wait for itself.
  bool one_rank_per_process() const { return one_rank_per_process_; }
  // The ranks outnumber the CPUs their processes may run on (the waits then sleep): each rank's
  // CPU work should stay on its own thread, since more threads would only contend.
  bool oversubscribed() const { return !spin_; }
  // The machine's ranks outnumber its CPUs though this group's do not (ranks of several
  // namespace or container hosts on one kernel): its waits yield and sleep as an oversubscribed
  // group's do. Every member must call it alike, before the group's first operation (the engine
  // does, from the shape every rank agreed on).
  void SetOversubscribed() { spin_ = false; }
  // The CPUs the ranks may run on together (the union of their affinities; 0 when unknown): with
  // every rank bound to a CPU of its own, each process sees one, the host offers them all.
  int cpus() const { return cpus_; }
  Status RunOneShot(uint64_t seq, uint64_t signature, const CollectiveRequest& request, const void* input, void* output,
                 Deadline deadline, const std::atomic<bool>& abort);
  // Rank `root` hands its `data` (request.count elements, at most kInlineBytes) to the group's
  // other ranks, which copy it into their `data`, on the calling thread through the pages: each
  // other rank says it has arrived, the root writes once every rank has (so no rank still reads a
  // slot that this operation reuses) and goes on; the others wait for the root alone. For
  // hier:fused's leader form after a RunOneShot of the host's inputs (executor/host_level.cc).
  // Errors as Exchange.
  Status RunShare(uint64_t seq, uint64_t signature, const CollectiveRequest& request, int root, void* data,
                  Deadline deadline, const std::atomic<bool>& abort);
  // A fused operation whole, on the calling thread, over plain host memory of this process
  // (malloc), which no other process can map: only its owner reads its input and writes its
  // output, and the ranks meet in two allocations of each rank's device that the others map, the
  // stage and the result. For an AllReduce, each rank copies the slices of its input that others
  // reduce into its stage; after the rendezvous it reduces its own slice (its input and every
  // other rank's stage) into its output and its result; after the second it copies every other
  // rank's result slice into its output: 4 bytes of memory traffic per byte (the mapped pass: 2;
  // a copy in and out around it: 6). ReduceScatter, AllGather, Broadcast and Reduce follow the
  // same pattern. Every rank must pass host memory (Executor::TakesHostMemory); a rank whose
  // buffers are device memory meets it as a mismatch naming both. Errors as Exchange.
  Status RunStaged(uint64_t seq, uint64_t signature, const CollectiveRequest& request, const void* input, void* output,
                Deadline deadline, const std::atomic<bool>& abort);
  // This rank failed: every other rank's wait, now and later, fails with `why`.
  void Fail(const Status& why);

  // Frees the mappings and buffers this group stopped using (evicted imports, outgrown staging),
  // if no rank of the group holds a stream (BeginHold); else keeps them for a later call, and
  // returns false. They are not freed where they go out of use, during an operation: freeing
  // device memory can wait for every stream of the device (cudaFree does), and the streams of the
  // ranks on this device that called the operation are held until it ends, which needs this rank.
  // Nor while another rank's operation holds its stream: that operation may be one this rank has
  // yet to call, from the thread now freeing. Call it where no operation of this rank is in flight
  // or being started (the executor does so when a call finds it idle, before the call's stream is
  // held, and when its queue empties).
  bool ReleaseRetired();
  // An operation of this rank is about to hold its caller's stream (Executor::Submit): counted
  // until EndHold, so that no rank frees meanwhile (ReleaseRetired). Waits first for frees of
  // other ranks under way (bounded: a free waits only for streams that no operation holds).
  // kTimeout at the deadline, naming the rank still freeing; kAborted as Exchange. On an error
  // nothing is counted.
  Status BeginHold(uint64_t seq, Deadline deadline, const std::atomic<bool>& abort);
  // The stream held since BeginHold is released.
  void EndHold();

  // Called on the waiting thread once a wait inside an operation has lasted kStallReport, with what
  // it waits on ("waiting on rank 2 (to arrive at the fused collective)"): the flight recorder's
  // text. Set while no operation runs (the executor's construction and destruction).
  void set_stall_report(std::function<void(std::string)> report) { stall_report_ = std::move(report); }
  // Called on the waiting thread while a wait waits: after each spin window, or before each sleep
  // where the ranks outnumber the CPUs. The caller's other duties meanwhile: a rank of a
  // hierarchical operation moves its fabric's queued output, which a peer on another host may
  // need before this wait's peer can arrive. Set as set_stall_report is.
  void set_while_waiting(std::function<void()> work) { while_waiting_ = std::move(work); }

  // This rank runs operation `seq` as the executor's plan (not through this group): a peer that
  // runs it on the fused path, waiting here for this rank to arrive, names the mismatch at once.
  void PublishPlanned(uint64_t seq, uint64_t signature, const CollectiveRequest& request);
  // The mismatch, where a peer has arrived at operation `seq` on the fused path while this rank
  // runs it as a plan (`call`: this rank's, "operation S: ...", for the message); else ok.
  Status CheckFusedPeers(uint64_t seq, std::string_view call) const;

  // Peer allocations mapped so far, and buffers waiting for ReleaseRetired (for logs and tests).
  size_t cached_imports() const { return imports_.size(); }
  size_t retired() const;

 private:
  SameHostGroup(int rank, int nranks, device::Device& device);
  // Create's step 1: this rank's page (page_fd_ and its own entry of peers_).
  Status OpenOwnPage();
  // Create's step 2: every peer's page from its allgathered hello (Hello in the .cc), which must
  // name this rank's device `backend`; also learns what the ranks together allow (one_shot_,
  // one_rank_per_process_, spin_, cpus_).
  Status MapPeerPages(const std::vector<std::vector<uint8_t>>& hellos, std::string_view backend);

  struct Peer {
    pid_t pid = 0;
    UniqueFd pidfd;
    void* map = nullptr;  // the peer's page (this rank's own page for rank_)
    SameHostPage* page = nullptr;
  };
  struct Import {
    std::unique_ptr<device::Buffer> buffer;
    uint64_t last_used = 0;  // operation seq
  };
  enum class Phase { kArrive, kFinish };
  // How an operation's data meets (SlotHeader::protocol): every rank must use the same one.
  enum class Protocol : uint32_t { kMapped = 0, kOneShot = 1, kStaged = 2 };

  std::vector<int> names_;  // set_rank_names
  std::function<void(std::string)> stall_report_;
  std::function<void()> while_waiting_;
  SameHostPage& mine() const { return *peers_[static_cast<size_t>(rank_)].page; }
  // Waits until rank q's page shows `seq` reached in `phase` (kArrive: in `slot`).
  Status WaitFor(int q, uint64_t seq, Phase phase, int slot, Deadline deadline, const std::atomic<bool>& abort);
  // Waits until `reached()`, spinning, yielding or sleeping on rank q's bell (`what` it waits for
  // rank q to do, for the errors: "arrive at the fused collective"). `inside`: rank q is known to
  // be inside this operation (it arrived, and works: a hierarchical operation's leader on the
  // network level), so its own failure may name the culprit; see Stalled.
  template <typename Reached>
  Status Wait(int q, uint64_t seq, const char* what, Reached reached, Deadline deadline, const std::atomic<bool>& abort,
              bool inside = false);
  // Publishes this rank's slot for operation `seq` (the regions or data written before), then
  // waits until every rank has arrived there with the same signature and protocol.
  Status Meet(uint64_t seq, uint64_t signature, const CollectiveRequest& request, Protocol protocol, Deadline deadline,
              const std::atomic<bool>& abort);
  // Why a wait for rank q should end now (it failed or its process ended, the communicator was
  // aborted, the deadline passed — and, for a peer `inside` the operation, a grace after it in which
  // the peer's own failure, naming the rank it waits on, is taken instead), or ok to go on waiting.
  Status Stalled(int q, uint64_t seq, const char* what, Deadline deadline, const std::atomic<bool>& abort,
                 bool inside) const;
  // Rings this rank's bell: wakes every rank sleeping on this rank's page.
  void Ring();
  // Where this process reaches rank q's published region (importing it on first use).
  Result<uint8_t*> Resolve(int q, int which, uint64_t seq);
  // Fills this rank's region `which` (0 input, 1 output) of its page.
  Status PublishRegion(int which, const void* ptr, uint64_t bytes);
  void Evict(uint64_t seq);
  // Keeps a buffer no longer used until ReleaseRetired.
  void Retire(std::unique_ptr<device::Buffer> buffer);
  // The mismatch error when rank q's slot does not hold operation `seq` as this rank calls it.
  Status Mismatch(int q, uint64_t seq, const CollectiveRequest& request, Protocol protocol, int slot) const;

  const int rank_, nranks_;
  device::Device& device_;
  UniqueFd page_fd_;  // this rank's page
  std::vector<Peer> peers_;
  std::map<std::pair<int, uint64_t>, Import> imports_;  // (rank, serial) -> mapping; executor thread only
  // Host-group operations so far (Exchange and RunOneShot): their parity picks the slot. Touched by
  // one thread at a time (the executor's, or the caller's when the executor is idle).
  uint64_t ops_ = 0;
  // RunStaged's allocations (stage, result), grown on demand.
  std::unique_ptr<device::Buffer> staging_[2];
  // Retire, ReleaseRetired: the executor's thread and the caller's may both release.
  mutable std::mutex retired_mu_;
  std::vector<std::unique_ptr<device::Buffer>> retired_;  // guarded by retired_mu_
  bool one_shot_ = true;              // every rank's device memory is host accessible
  bool one_rank_per_process_ = true;  // no two ranks share a pid
  // The ranks' processes may run on at least as many CPUs as there are ranks: waits spin
  // (yielding between windows) and never sleep, so publishing rings no bell. Otherwise they spin
  // briefly, yield, then sleep.
  bool spin_ = false;
  int cpus_ = 0;  // cpus()
};

}  // namespace kizuna::collectives
