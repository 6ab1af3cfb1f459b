// A rank's trace (KIZUNA_TRACE_FILE): every collective it runs and, on the staged path, each of
// its steps — the transfer (send, receive: from its post to its completion), the work on what
// arrived (reduce, copy) and the time a step waited to be posted (wait) — as Chrome trace /
// Perfetto JSON ("X" events, microseconds). `kizuna-trace merge` lines the ranks' files up on one
// timeline with the clock offsets measured when the communicator formed (otherData).
//
// Events are kept in memory and the file is written when the executor goes (the communicator is
// destroyed), or when kMaxEvents are held (the file then holds the first ones and says how many
// were dropped). Off (no Tracer at all) unless the variable is set: the staged path then reads no
// clock for it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::collectives {

class Tracer {
 public:
  static constexpr size_t kMaxEvents = size_t{1} << 20;

  // `pattern` with %r (rank), %p (pid), %h (host) expanded; null when it is empty.
  static std::unique_ptr<Tracer> Open(const std::string& pattern, int rank);
  ~Tracer();  // writes the file
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // The trace's clock: CLOCK_MONOTONIC in microseconds (one clock for every process of a machine).
  static uint64_t NowUs();

  // This rank's clock minus rank 0's (microseconds), measured at creation; kizuna-trace merge
  // subtracts it. `measured`: false where it could not be measured (assumed 0).
  void SetClockOffset(double offset_us, double rtt_us, bool measured);

  // One event: `name` ("send to 3", "allreduce 4096 float32"), `cat` (collective, send, recv,
  // reduce, copy, wait, fused), on timeline `tid` (the channel; 0 for whole operations), for
  // operation `seq`.
  void Complete(std::string name, std::string_view cat, uint64_t start_us, uint64_t end_us, int tid, uint64_t seq);

  const std::string& path() const { return path_; }
  // Writes what is held now (also done by the destructor); errors are logged once.
  Status Write();

 private:
  struct Event {
    std::string name;
    std::string_view cat;  // one of the literals above
    uint64_t start_us = 0, dur_us = 0;
    int tid = 0;
    uint64_t seq = 0;
  };
  Tracer(std::string path, int rank) : path_(std::move(path)), rank_(rank) {}

  const std::string path_;
  const int rank_;
  std::mutex mu_;
  std::vector<Event> events_;  // mu_
  uint64_t dropped_ = 0;       // mu_
  double offset_us_ = 0, rtt_us_ = 0;
  bool offset_measured_ = false;
  bool write_failed_ = false;
};

}  // namespace kizuna::collectives
