// The ranks of one communicator that are threads of one process (CreateLocal) and address each
// other's buffers directly (CommTopology::direct): where their executors meet to run the single-host
// direct algorithms (fused.h), which need every rank's buffer addresses and a common finish.
// same_host_group.h is the same for ranks that are processes of one host.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace kizuna::collectives {

// Shared by the ranks' executors; thread-safe.
class SameProcessGroup {
 public:
  explicit SameProcessGroup(int nranks);
  int nranks() const { return nranks_; }

  struct Entry {
    const void* input = nullptr;
    void* output = nullptr;
    uint64_t signature = 0;  // the operation's header signature (every rank's must be equal)
    bool direct = false;     // a fused operation (it exchanges and finishes); else only published
    std::string call;        // the call, for the mismatch message ("allreduce count=64 ...")
  };
  // Publishes `rank`'s entry for operation `seq` and waits until every rank has published its
  // own; returns them indexed by rank. kInvalidArgument as soon as a rank published another
  // signature for `seq` (ranks called different collectives: the mismatch is named at once, not
  // at the deadline), kTimeout at the deadline naming the ranks that never came, kAborted when
  // `abort` is set, the group's failure when another rank failed.
  Result<std::vector<Entry>> Exchange(uint64_t seq, int rank, const Entry& entry, Deadline deadline,
                                      const std::atomic<bool>& abort);
  // Every operation that is not fused publishes its signature too, without waiting, so that a
  // rank waiting in Exchange sees a mismatch at once.
  void Publish(uint64_t seq, int rank, uint64_t signature, std::string call);
  // Publishes the event that completes `rank`'s device work of operation `seq` (null: the work
  // is done already, the CPU did it on the publishing thread) and waits until every rank has
  // published its own (host bookkeeping only: nobody waits for a device here); returns them
  // indexed by rank. Each rank then waits on the others' events (its stream, or its thread when
  // it did its part on the CPU) before it releases its caller's stream, so no rank proceeds
  // while another still writes into its output. Same errors as Exchange.
  Result<std::vector<device::Event*>> Finish(uint64_t seq, int rank, device::Event* done,
                                                   Deadline deadline, const std::atomic<bool>& abort);
  // A rank failed: every wait, now and later, fails with `why`.
  void Fail(const Status& why);

 private:
  struct Slot {
    std::vector<Entry> entries;
    std::vector<char> published, finished;
    std::vector<device::Event*> events;  // Finish: each rank's completion event
    int npublished = 0, nfinished = 0, departed = 0;
    bool any_direct = false;
  };
  Slot& SlotFor(uint64_t seq);  // mu_ held
  // Records `entry`; the first rank whose signature differs from it, or -1. mu_ held.
  int PublishLocked(uint64_t seq, int rank, const Entry& entry);
  Status WaitLocked(std::unique_lock<std::mutex>& lock, uint64_t seq, bool finish, Deadline deadline,
                    const std::atomic<bool>& abort);

  const int nranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Slot> slots_;  // guarded by mu_
  Status failure_;                  // guarded by mu_
};

}  // namespace kizuna::collectives
