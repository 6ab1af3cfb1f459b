#include "collectives/executor/flight_recorder.h"

#include <fmt/format.h>

namespace kizuna::collectives {
namespace {

std::string_view PathName(RunPath p) {
  switch (p) {
    case RunPath::kExecutor: return "executor";
    case RunPath::kCaller: return "caller";
    case RunPath::kInline: return "inline";
  }
  return "?";
}

// JSON string contents: quotes, backslashes and control characters escaped.
std::string Escaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

double FlightRecorder::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - made_).count();
}

uint64_t FlightRecorder::Begin(uint64_t seq, const CollectiveRequest& request, Algorithm algorithm, int members,
                               RunPath path) {
  const double now = Now();
  std::lock_guard lock(mu_);
  const uint64_t ticket = next_++;
  OperationRecord& r = ring_[ticket % kCapacity];
  r.seq = seq;
  r.request = request;
  r.algorithm = algorithm;
  r.members = members;
  r.path = path;
  r.start_s = now;
  r.end_s = 0;
  r.status = Status::Ok();
  return ticket;
}

void FlightRecorder::End(uint64_t ticket, const Status& status) {
  const double now = Now();
  std::lock_guard lock(mu_);
  if (ticket + kCapacity < next_) return;  // overwritten since: kCapacity later operations started
  OperationRecord& r = ring_[ticket % kCapacity];
  r.end_s = now;
  r.status = status;
}

std::vector<OperationRecord> FlightRecorder::Snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<OperationRecord> out;
  const uint64_t first = next_ > kCapacity ? next_ - kCapacity : 0;
  for (uint64_t t = first; t < next_; ++t) out.push_back(ring_[t % kCapacity]);
  return out;
}

std::string FlightRecorder::ToJson(int rank) const {
  std::string out = fmt::format("{{\"rank\": {}, \"records\": [", rank);
  bool first = true;
  for (const OperationRecord& r : Snapshot()) {
    const char* state = r.end_s == 0 ? "running" : r.status.ok() ? "ok" : "failed";
    out += fmt::format(
        "{}\n  {{\"seq\": {}, \"call\": \"{}\", \"algorithm\": \"{}\", \"members\": {}, \"path\": \"{}\", "
        "\"start_s\": {:.6f}, \"end_s\": {:.6f}, \"state\": \"{}\", \"error\": \"{}\"}}",
        first ? "" : ",", r.seq, Escaped(r.request.ToString()), AlgorithmName(r.algorithm), r.members,
        PathName(r.path), r.start_s, r.end_s, state, r.status.ok() ? "" : Escaped(r.status.ToString()));
    first = false;
  }
  out += "\n]}\n";
  return out;
}

}  // namespace kizuna::collectives
