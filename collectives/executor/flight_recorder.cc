#include "collectives/executor/flight_recorder.h"

#include <nlohmann/json.hpp>

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

}  // namespace

double FlightRecorder::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - made_).count();
}

uint64_t FlightRecorder::Begin(uint64_t seq, const CollectiveRequest& request, Algorithm algorithm, int members,
                               RunPath path, bool straight) {
  const double now = Now();
  std::lock_guard lock(mu_);
  const uint64_t ticket = next_++;
  OperationRecord& r = ring_[ticket % kCapacity];
  r.seq = seq;
  r.request = request;
  r.algorithm = algorithm;
  r.members = members;
  r.path = path;
  r.straight = straight;
  r.start_s = now;
  r.end_s = 0;
  r.status = Status::Ok();
  r.waiting.clear();
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

void FlightRecorder::Straight(uint64_t ticket) {
  std::lock_guard lock(mu_);
  if (ticket >= next_ || ticket + kCapacity < next_) return;  // none yet, or overwritten since
  ring_[ticket % kCapacity].straight = true;
}

void FlightRecorder::Waiting(uint64_t ticket, std::string what) {
  std::lock_guard lock(mu_);
  if (ticket >= next_ || ticket + kCapacity < next_) return;  // none yet, or overwritten since
  ring_[ticket % kCapacity].waiting = std::move(what);
}

std::vector<OperationRecord> FlightRecorder::Snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<OperationRecord> out;
  const uint64_t first = next_ > kCapacity ? next_ - kCapacity : 0;
  for (uint64_t t = first; t < next_; ++t) out.push_back(ring_[t % kCapacity]);
  return out;
}

std::string FlightRecorder::ToJson(int rank) const {
  nlohmann::ordered_json records = nlohmann::ordered_json::array();
  for (const OperationRecord& r : Snapshot()) {
    records.push_back({{"seq", r.seq},
                       {"call", r.request.ToString()},
                       {"algorithm", AlgorithmName(r.algorithm)},
                       {"members", r.members},
                       {"path", PathName(r.path)},
                       {"straight", r.straight},
                       {"start_s", r.start_s},
                       {"end_s", r.end_s},
                       {"state", r.end_s == 0    ? "running"
                                 : r.status.ok() ? "ok"
                                                 : "failed"},
                       {"error", r.status.ok() ? std::string() : r.status.ToString()},
                       {"waiting", r.end_s == 0 ? r.waiting : std::string()}});
  }
  const nlohmann::ordered_json out = {{"rank", rank}, {"now_s", Now()}, {"records", std::move(records)}};
  return out.dump() + "\n";
}

}  // namespace kizuna::collectives
