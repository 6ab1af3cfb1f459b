// The ranks of one communicator that share a host but not a process, and whose devices hand an
// allocation to another process (Device::FindAllocation, Device::Import): the cross-process form of
// DirectGroup, where their executors meet to run the single-host direct algorithms (fused.cc).
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
// Waiting spins briefly, then yields, then sleeps on a futex in the page it waits on (the owner
// wakes sleepers when it publishes), so that ranks oversubscribing the cores give them up. Every
// wait has the operation's deadline, sees the communicator's abort flag, notices a peer that
// failed (its page says why) or whose process ended (its pidfd), and names the ranks it waited
// for.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/deadline.h"
#include "runtime/device/device.h"
#include "runtime/status.h"
#include "runtime/unique_fd.h"

namespace kizuna::collectives {

struct HostGroupPage;  // the shared page's layout (host_group.cc)

class HostGroup {
 public:
  // Every rank's bytes, indexed by rank (the communicator's bootstrap AllGather).
  using AllGather = std::function<Result<std::vector<std::vector<uint8_t>>>(std::span<const uint8_t>)>;

  // Collective: every rank of the communicator calls it, with its own rank. Each creates its page,
  // the ranks allgather (pid, fd), each maps every peer's page, and they allgather whether that
  // worked, so all ranks get a group or all get kNotSupported with the first rank's reason (a
  // kernel without pidfd_getfd, ptrace restrictions, a device that cannot import).
  static Result<std::shared_ptr<HostGroup>> Create(int rank, int nranks, device::Device& device,
                                                   const AllGather& allgather);
  ~HostGroup();
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;

  int nranks() const { return nranks_; }
  int rank() const { return rank_; }

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
  Result<Buffers> Exchange(uint64_t seq, uint64_t signature, std::string_view call, const void* input,
                           uint64_t input_bytes, const void* output, uint64_t output_bytes, Deadline deadline,
                           const std::atomic<bool>& abort);
  // This rank's device work for `seq` is complete; waits until every rank's is. Errors as
  // Exchange.
  Status Finish(uint64_t seq, Deadline deadline, const std::atomic<bool>& abort);
  // This rank failed: every other rank's wait, now and later, fails with `why`.
  void Fail(const Status& why);

  // Peer allocations mapped so far (for logs and tests).
  size_t cached_imports() const { return imports_.size(); }

 private:
  HostGroup(int rank, int nranks, device::Device& device);

  struct Peer {
    pid_t pid = 0;
    UniqueFd pidfd;
    void* map = nullptr;  // the peer's page (this rank's own page for rank_)
    HostGroupPage* page = nullptr;
  };
  struct Import {
    std::unique_ptr<device::Buffer> buffer;
    uint64_t last_used = 0;  // operation seq
  };
  enum class Phase { kArrive, kFinish };

  HostGroupPage& mine() const { return *peers_[static_cast<size_t>(rank_)].page; }
  // Waits until rank q's page shows `seq` reached in `phase`.
  Status WaitFor(int q, uint64_t seq, Phase phase, Deadline deadline, const std::atomic<bool>& abort);
  // Rings this rank's bell: wakes every rank sleeping on this rank's page.
  void Ring();
  // Where this process reaches rank q's published region (importing it on first use).
  Result<uint8_t*> Resolve(int q, int which, uint64_t seq);
  // Fills this rank's region `which` (0 input, 1 output) of its page.
  Status PublishRegion(int which, const void* ptr, uint64_t bytes);
  void Evict(uint64_t seq);

  const int rank_, nranks_;
  device::Device& device_;
  UniqueFd page_fd_;  // this rank's page
  std::vector<Peer> peers_;
  std::map<std::pair<int, uint64_t>, Import> imports_;  // (rank, serial) -> mapping; executor thread only
};

}  // namespace kizuna::collectives
