// The pieces of an emulated stream that are data rather than machinery (stream.cc runs them):
// the work a stream queues (copies, reduces, scales, event records and waits, host callbacks,
// holds), the completion state an event captures, and the brief spin every wait starts with.
// Internal to the backend.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated::stream_internal {

using Clock = Deadline::Clock;
using device::HostCallback;
using std::chrono::nanoseconds;

// How long a waiter polls before it blocks: long enough to catch work that finishes "right away"
// without a futex round trip, short enough to cost nothing on an oversubscribed machine (the CI
// machines run 8 ranks on 2 cores).
inline constexpr nanoseconds kSpin = std::chrono::microseconds(5);
// Throttle delays longer than this sleep; shorter ones spin. A timed sleep overshoots by roughly
// the kernel's default timer slack (50 us), so sleeping for less would be mostly overshoot.
inline constexpr nanoseconds kSleepThreshold = std::chrono::microseconds(50);
// Longest modelled delay: keeps absurd throttle settings (1e-12 GB/s) from overflowing a clock.
inline constexpr double kMaxDelaySeconds = 1e6;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Polls `ready` for up to kSpin; true when it became true.
template <typename Pred>
inline bool SpinBriefly(Pred&& ready) {
  if (ready()) return true;  // before reading the clock: the common case costs no clock read
  const Clock::time_point end = Clock::now() + kSpin;
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    CpuRelax();
    if (i % 32 == 0 && Clock::now() >= end) return ready();
  }
}

inline nanoseconds ToNanos(double seconds) {
  seconds = std::clamp(seconds, 0.0, kMaxDelaySeconds);
  return std::chrono::duration_cast<nanoseconds>(std::chrono::duration<double>(seconds));
}

// ---- Events ----

// The completion of the work one Record captured. Shared by the event (until it is recorded
// again), the recording stream's queue and every stream or thread waiting for it.
struct EventState {
  explicit EventState(std::string label_in) : label(std::move(label_in)) {}

  const std::string label;
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
  Status status;  // written once, under mu, before `done` is set; read only after seeing `done`

  void Complete(Status s) {
    {
      std::lock_guard lock(mu);
      status = std::move(s);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }

  // Waits until the work completed (true), the deadline passed or *interrupt became true (false).
  bool WaitUntil(Clock::time_point deadline, const std::atomic<bool>* interrupt) {
    auto ready = [this] { return done.load(std::memory_order_acquire); };
    if (SpinBriefly(ready)) return true;
    std::unique_lock lock(mu);
    cv.wait_until(lock, deadline,
                  [&] { return ready() || (interrupt != nullptr && interrupt->load(std::memory_order_acquire)); });
    return ready();
  }
};

class EmuEvent final : public device::Event {
 public:
  EmuEvent(device::Device* device, std::string label) : Event(device), label_(std::move(label)) {}

  const std::string& label() const { return label_; }

  // The completion captured by the last Record; null when never recorded.
  std::shared_ptr<EventState> Captured() const {
    std::lock_guard lock(mu_);
    return state_;
  }

  // A fresh completion for a new Record: waits enqueued earlier keep the one they captured.
  std::shared_ptr<EventState> Rearm() {
    auto state = std::make_shared<EventState>(label_);
    std::lock_guard lock(mu_);
    state_ = state;
    return state;
  }

 protected:
  Result<bool> DoQuery() override {
    const std::shared_ptr<EventState> state = Captured();
    if (state == nullptr) return true;
    if (!state->done.load(std::memory_order_acquire)) return false;
    if (!state->status.ok()) return state->status;
    return true;
  }

  Status DoSynchronize(Deadline deadline) override {
    const std::shared_ptr<EventState> state = Captured();
    if (state == nullptr) return Status::Ok();
    if (!state->WaitUntil(deadline.when(), nullptr))
      return Timeout(fmt::format("{}: the recorded work is not complete at the deadline", label_));
    return state->status;
  }

 private:
  const std::string label_;
  mutable std::mutex mu_;
  std::shared_ptr<EventState> state_;  // guarded by mu_
};

// ---- Operations ----

struct CopyWork {
  void* dst;
  const void* src;
  size_t bytes;
};
struct ReduceWork {
  void* dst;
  std::vector<const void*> srcs;  // copied: the caller's span may die once the enqueue returns
  size_t count;
  DataType type;
  ReduceOp op;
  std::vector<void*> more_dsts = {};  // ReduceMulti: the other outputs, written in the same pass
};
struct ScaleWork {
  void* dst;
  const void* src;
  size_t count;
  DataType type;
  uint32_t divisor;
};
struct RecordWork {
  std::shared_ptr<EventState> event;
};
struct WaitWork {
  std::shared_ptr<EventState> event;
};
struct CallbackWork {
  HostCallback fn;
};
// A hold (Stream::EnqueueHold): the stream stops here until the gate opens. Its state is guarded
// by the StreamCore's mutex.
struct GateState {
  bool open = false;
};
struct GateWork {
  std::shared_ptr<GateState> gate;
};

struct Op {
  std::variant<CopyWork, ReduceWork, ScaleWork, RecordWork, WaitWork, CallbackWork, GateWork> work;
  uint64_t number = 0;        // backend-wide number of a copy / reduce / scale / callback; 0 otherwise
  bool inject_fault = false;  // this is the operation KIZUNA_EMU_FAIL_STREAM_OP names
};

inline std::string_view OpName(const Op& op) {
  struct Namer {
    std::string_view operator()(const CopyWork&) const { return "copy"; }
    std::string_view operator()(const ReduceWork&) const { return "reduce"; }
    std::string_view operator()(const ScaleWork&) const { return "scale"; }
    std::string_view operator()(const RecordWork&) const { return "event record"; }
    std::string_view operator()(const WaitWork&) const { return "event wait"; }
    std::string_view operator()(const CallbackWork&) const { return "host callback"; }
    std::string_view operator()(const GateWork&) const { return "hold"; }
  };
  return std::visit(Namer{}, op.work);
}

}  // namespace kizuna::host_emulated::stream_internal
