// The throttled memory timeline of an emulated device, shared host-wide (README.md: emulated
// devices are host-wide, so ranks in different processes that use device i also share its
// throttle).
//
// An operation that moves `duration` worth of bytes at the throttled rate occupies the device from
// max(now, end of the previous occupation) for that long. The end of the occupation lives in a
// small POSIX shared-memory segment, one 64-byte slot per device index, named after the user and
// the running kernel (host name + boot id), so every process of that user on this boot sees the
// same timeline; CLOCK_MONOTONIC (steady_clock) is the same clock in all of them. The segment is
// created on the first throttled operation only, so unthrottled use leaves nothing in /dev/shm, and
// its memory is reserved then (posix_fallocate): a full /dev/shm is an error at that point, not a
// SIGBUS at a later touch. When it cannot be created or reserved, the device falls back to a
// per-process timeline and says why (WARN: the segment, its size, the error).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/core/deadline.h"

namespace kizuna::host_emulated {

class SharedTimelines;

class DevicePacer {
 public:
  // `host_identity`: what makes the segment host-wide (see backend.cc's HostIdentity);
  // `device_index`: the slot.
  DevicePacer(std::string host_identity, int device_index);
  ~DevicePacer();

  // Reserves the next `duration` of the device; returns when the reservation ends. Thread- and
  // process-safe.
  Deadline::Clock::time_point Reserve(std::chrono::nanoseconds duration);

  // The longest piece of an operation's time reserved at once (Occupy): the granularity at which
  // streams sharing a device take turns. Each piece wakes the stream's thread once.
  static constexpr std::chrono::nanoseconds kSlice = std::chrono::milliseconds(4);

  // One operation's `duration` on the device: runs `work` (the operation itself, returning its
  // Status), then `sleep_until` the reserved time has passed. The time is reserved in slices of
  // at most kSlice, the next one halfway through the current: streams that use one device at once
  // (another job on the same accelerator) then take turns slice by slice, each at its share of the
  // device, as a GPU shares itself between contexts, where one reservation per operation would
  // hold a large operation back by at most one of the other's. Alone, the slices are back to back.
  // Work that runs past the first slice counts as the operation's device time: alone, an
  // operation takes the longer of its work and `duration`.
  template <typename Work, typename SleepUntil>
  auto Occupy(std::chrono::nanoseconds duration, Work&& work, SleepUntil&& sleep_until) {
    using Clock = Deadline::Clock;
    std::chrono::nanoseconds left = duration, slice{0};
    auto reserve = [&] {
      slice = std::min(left, kSlice);
      left -= slice;
      return Reserve(slice);
    };
    Clock::time_point end = reserve();
    auto result = work();
    if (const Clock::time_point now = Clock::now(); now > end)
      left -= std::min(left, std::chrono::duration_cast<std::chrono::nanoseconds>(now - end));
    while (left.count() > 0) {
      sleep_until(end - slice / 2);
      end = reserve();
    }
    sleep_until(end);
    return result;
  }

  // The shared-memory name of the timeline ("" until the first Reserve, or when per-process).
  std::string segment_name() const;
  // Why the timeline is per process ("" until the first Reserve, or when it is shared): the
  // segment, its size and the error, e.g. a full /dev/shm.
  std::string shared_error() const;

 private:
  std::atomic<int64_t>* Slot();

  const std::string host_identity_;
  const int device_index_;
  std::once_flag attach_once_;
  std::shared_ptr<SharedTimelines> shared_;  // set once by attach_once_
  std::string shared_error_;                 // set once by attach_once_
  std::atomic<int64_t> local_{0};            // the per-process fallback
  std::atomic<int64_t>* slot_ = nullptr;     // set once by attach_once_
};

}  // namespace kizuna::host_emulated
