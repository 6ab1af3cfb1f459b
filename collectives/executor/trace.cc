// The tracer, and what the executor's steps become in it (Run::TraceStep).
#include "collectives/executor/trace.h"

#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "collectives/executor/internal.h"
#include "runtime/core/host_id.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {

std::unique_ptr<Tracer> Tracer::Open(const std::string& pattern, int rank) {
  if (pattern.empty()) return nullptr;
  return std::unique_ptr<Tracer>(new Tracer(ExpandPathPattern(pattern, rank), rank));
}

Tracer::~Tracer() { Write().IgnoreError(); }

uint64_t Tracer::NowUs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000u + static_cast<uint64_t>(ts.tv_nsec) / 1000u;
}

void Tracer::SetClockOffset(double offset_us, double rtt_us, bool measured) {
  std::lock_guard lock(mu_);
  offset_us_ = offset_us;
  rtt_us_ = rtt_us;
  offset_measured_ = measured;
}

void Tracer::Complete(std::string name, std::string_view cat, uint64_t start_us, uint64_t end_us, int tid,
                      uint64_t seq) {
  std::lock_guard lock(mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(Event{std::move(name), cat, start_us, end_us > start_us ? end_us - start_us : 0, tid, seq});
}

Status Tracer::Write() {
  nlohmann::ordered_json out;
  {
    std::lock_guard lock(mu_);
    nlohmann::ordered_json events = nlohmann::ordered_json::array();
    // Perfetto names the timelines from these metadata events.
    events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", fmt::format("rank {}", rank_)}}}});
    for (const Event& e : events_) {
      events.push_back({{"name", e.name},
                        {"cat", e.cat},
                        {"ph", "X"},
                        {"ts", e.start_us},
                        {"dur", e.dur_us},
                        {"pid", rank_},
                        {"tid", e.tid},
                        {"args", {{"seq", e.seq}}}});
    }
    out["traceEvents"] = std::move(events);
    out["displayTimeUnit"] = "ns";
    out["otherData"] = {{"kizuna_trace", 1},
                        {"rank", rank_},
                        {"host", HostId()},
                        {"pid", static_cast<int>(getpid())},
                        {"clock", "CLOCK_MONOTONIC, microseconds"},
                        {"clock_offset_us", offset_us_},
                        {"clock_offset_rtt_us", rtt_us_},
                        {"clock_offset_measured", offset_measured_},
                        {"dropped_events", dropped_}};
  }
  const std::string text = out.dump() + "\n";
  // Whole or not at all: a reader never sees half a file.
  const std::string tmp = fmt::format("{}.{}.tmp", path_, getpid());
  bool ok = false;
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = std::fclose(f) == 0 && ok;
  }
  if (ok && std::rename(tmp.c_str(), path_.c_str()) == 0) return Status::Ok();
  const Status s = FromErrno(errno, fmt::format("KIZUNA_TRACE_FILE: writing {}", path_));
  std::remove(tmp.c_str());
  if (!write_failed_) KZ_WARN(kLogColl, "rank {}: {}", rank_, s.ToString());
  write_failed_ = true;
  return s;
}

// What a finished step of the staged path becomes: the time it waited to be posted, its transfer
// (post to completion), and the work on what arrived.
void Executor::Run::TraceStep(const ChannelRun& ch, size_t index, const StepState& st) const {
  Tracer& tracer = *ex_.tracer_;
  const Step& step = (*ch.steps)[index];
  const uint64_t now = Tracer::NowUs(), seq = op_.seq;
  const int tid = 1 + (ch.epilogue ? executor_internal::kMaxChannels : ch.channel);
  const uint64_t posted = st.traced_posted != 0 ? st.traced_posted : st.traced_active;
  if (posted > st.traced_active) tracer.Complete("wait", "wait", st.traced_active, posted, tid, seq);
  const uint64_t arrived = st.traced_arrived != 0 ? st.traced_arrived : now;
  switch (step.kind) {
    case StepKind::kSend:
      tracer.Complete(fmt::format("send to {}", step.peer), "send", posted, arrived, tid, seq);
      break;
    case StepKind::kRecv:
    case StepKind::kRecvReduce:
      tracer.Complete(fmt::format("recv from {}", step.peer), "recv", posted, arrived, tid, seq);
      if (now > arrived)
        tracer.Complete(step.kind == StepKind::kRecv ? "copy" : "reduce",
                        step.kind == StepKind::kRecv ? "copy" : "reduce", arrived, now, tid, seq);
      break;
    case StepKind::kCopy:
    case StepKind::kScale: tracer.Complete("copy", "copy", posted, now, tid, seq); break;
    case StepKind::kReduce: tracer.Complete("reduce", "reduce", posted, now, tid, seq); break;
  }
}

}  // namespace kizuna::collectives
