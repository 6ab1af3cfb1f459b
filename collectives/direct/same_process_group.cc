#include "collectives/direct/same_process_group.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace kizuna::collectives {

SameProcessGroup::SameProcessGroup(int nranks) : nranks_(nranks) {}

void SameProcessGroup::Fail(const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (!failure_.ok()) return;
    failure_ = why;
  }
  cv_.notify_all();
}

Status SameProcessGroup::WaitLocked(std::unique_lock<std::mutex>& lock, uint64_t seq, bool finish, Deadline deadline,
                               const std::atomic<bool>& abort) {
  const char* what = finish ? "finish" : "arrive at";
  while (true) {
    if (!failure_.ok()) return Aborted(fmt::format("another rank of this process failed: {}", failure_.ToString()));
    Slot& s = slots_[seq];
    if ((finish ? s.nfinished : s.npublished) == nranks_) return Status::Ok();
    if (abort.load()) return Aborted("the communicator was aborted");
    if (deadline.Expired()) {
      std::string missing;
      const std::vector<char>& seen = finish ? s.finished : s.published;
      for (int r = 0; r < nranks_; ++r)
        if (!seen[static_cast<size_t>(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      return Timeout(fmt::format("operation {}: rank(s) {} of this process did not {} the fused collective by the "
                                 "deadline",
                                 seq, missing, what));
    }
    // Bounded slices so that an abort flag set without a notification is seen.
    cv_.wait_for(lock, std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(10), deadline.Remaining()));
  }
}

SameProcessGroup::Slot& SameProcessGroup::SlotFor(uint64_t seq) {
  Slot& s = slots_[seq];
  if (s.entries.empty()) {
    s.entries.resize(static_cast<size_t>(nranks_));
    s.published.assign(static_cast<size_t>(nranks_), 0);
    s.finished.assign(static_cast<size_t>(nranks_), 0);
    s.events.assign(static_cast<size_t>(nranks_), nullptr);
  }
  return s;
}

int SameProcessGroup::PublishLocked(uint64_t seq, int rank, const Entry& entry) {
  Slot& s = SlotFor(seq);
  if (!s.published[static_cast<size_t>(rank)]) {
    s.entries[static_cast<size_t>(rank)] = entry;
    s.published[static_cast<size_t>(rank)] = 1;
    s.any_direct = s.any_direct || entry.direct;
    ++s.npublished;
    cv_.notify_all();
  }
  for (int q = 0; q < nranks_; ++q)
    if (s.published[static_cast<size_t>(q)] && s.entries[static_cast<size_t>(q)].signature != entry.signature)
      return q;
  return -1;
}

void SameProcessGroup::Publish(uint64_t seq, int rank, uint64_t signature, std::string call) {
  std::lock_guard lock(mu_);
  PublishLocked(seq, rank, Entry{nullptr, nullptr, signature, false, std::move(call)});
  // Nobody waits on an operation that no rank runs fused: forget it once every rank has been.
  Slot& s = slots_[seq];
  if (s.npublished == nranks_ && !s.any_direct) slots_.erase(seq);
}

Result<std::vector<SameProcessGroup::Entry>> SameProcessGroup::Exchange(uint64_t seq, int rank, const Entry& entry,
                                                              Deadline deadline, const std::atomic<bool>& abort) {
  std::unique_lock lock(mu_);
  while (true) {
    const int other = PublishLocked(seq, rank, entry);
    if (other >= 0)
      return InvalidArgument(fmt::format("collective mismatch between ranks: rank {} is at operation {}: {}; rank {} "
                                         "is at operation {}: {}",
                                         rank, seq, entry.call, other, seq,
                                         slots_[seq].entries[static_cast<size_t>(other)].call));
    if (slots_[seq].npublished == nranks_) break;
    // Wait a slice for more ranks (each one's arrival is checked against this rank's signature).
    if (!failure_.ok()) return Aborted(fmt::format("another rank of this process failed: {}", failure_.ToString()));
    if (abort.load()) return Aborted("the communicator was aborted");
    if (deadline.Expired()) return WaitLocked(lock, seq, /*finish=*/false, deadline, abort);  // names the missing
    cv_.wait_for(lock, std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(10), deadline.Remaining()));
  }
  return slots_[seq].entries;
}

Result<std::vector<device::Event*>> SameProcessGroup::Finish(uint64_t seq, int rank, device::Event* done,
                                                             Deadline deadline, const std::atomic<bool>& abort) {
  std::unique_lock lock(mu_);
  Slot& s = slots_[seq];
  if (s.finished.empty()) return Internal(fmt::format("operation {}: finish before exchange", seq));
  if (!s.finished[static_cast<size_t>(rank)]) {
    s.finished[static_cast<size_t>(rank)] = 1;
    s.events[static_cast<size_t>(rank)] = done;
    if (++s.nfinished == nranks_) cv_.notify_all();
  }
  KZ_RETURN_IF_ERROR(WaitLocked(lock, seq, /*finish=*/true, deadline, abort));
  std::vector<device::Event*> events = slots_[seq].events;
  // The last rank to leave forgets the operation.
  if (++slots_[seq].departed == nranks_) slots_.erase(seq);
  return events;
}

}  // namespace kizuna::collectives
