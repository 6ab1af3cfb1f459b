// Deadlines for every blocking wait. There is no "wait forever": the longest
// wait is KIZUNA_TIMEOUT (600 s by default), after which the call returns kTimeout.
#pragma once

#include <time.h>

#include <chrono>

namespace kizuna {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline After(std::chrono::nanoseconds d) { return Deadline(Clock::now() + d); }
  static Deadline AfterSeconds(double s) {
    return After(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s)));
  }
  // The same from the coarse monotonic clock, for a call's hot path: several times cheaper to read
  // (docs/PERFORMANCE.md, "The calling thread's path at 8 bytes"), and it lags the precise clock by at most one scheduler tick (a few ms), so the
  // deadline comes that much early at most. For timeouts of seconds (Linux only).
  static Deadline AfterSecondsCoarse(double s) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    const Clock::time_point now{std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                                           std::chrono::nanoseconds(ts.tv_nsec))};
    return Deadline(now + std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s)));
  }
  static Deadline At(Clock::time_point t) { return Deadline(t); }

  Clock::time_point when() const { return when_; }
  bool Expired() const { return Clock::now() >= when_; }
  std::chrono::nanoseconds Remaining() const {
    auto r = when_ - Clock::now();
    return r.count() > 0 ? std::chrono::duration_cast<std::chrono::nanoseconds>(r) : std::chrono::nanoseconds(0);
  }

 private:
  explicit Deadline(Clock::time_point when) : when_(when) {}
  Clock::time_point when_;
};

}  // namespace kizuna
