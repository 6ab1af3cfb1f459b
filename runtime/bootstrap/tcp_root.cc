// Rank 0's side: it checks every Join and sends the address table (the rendezvous), gathers every
// collective (a star, so it can name a rank that is missing or went away), and tells every rank
// when the job has failed.
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap::tcp {

Status TcpBootstrap::FailJob(Status status, Conn* also) {
  job_error_ = Status::Ok();
  job_error_conn_ = nullptr;
  if (is_root()) {
    Bytes msg;
    wire::PutU32(msg, static_cast<uint32_t>(status.code()));
    wire::PutString(msg, std::string_view(status.message()).substr(0, kMaxAbortBytes - 64));
    std::vector<Conn*> targets;
    for (Conn* c : rank_conn_)
      if (c != nullptr && c->open()) targets.push_back(c);
    if (also != nullptr && also->open()) targets.push_back(also);
    // Behind whatever is queued: cutting a frame short would leave the rank unable to parse this.
    for (Conn* c : targets) QueueFrame(*c, FrameType::kAbort, 0, msg);
    // Best effort: a rank that is not reading must not hold the root for long.
    Status flushed = Progress(
        Deadline::After(std::chrono::seconds(1)),
        [&] {
          for (Conn* c : targets)
            if (c->open() && !c->out.empty()) return false;
          return true;
        },
        [] { return Status::Ok(); });
    flushed.IgnoreError();
  }
  KZ_WARN(kLogBootstrap, "{}: {}", Me(), status.ToString());
  (rendezvous_done_ ? collective_failed_ : fatal_) = status;
  return status;
}

// A rank introduces itself: its rank, the size it was given, where it listens for peers.
void TcpBootstrap::OnJoin(Conn& c, Bytes payload) {
  wire::Reader r(payload);
  const int64_t jrank = r.I32();
  const int64_t jsize = r.I32();
  const uint16_t port = r.U16();
  std::string host = r.String(kMaxHostBytes);
  std::string hostname = r.String(kMaxHostBytes);
  if (!r.AtEnd() || port == 0 || ValidateHost(host, "peer address").code() != StatusCode::kOk)
    return Reject(c, "malformed join message");
  // The handshake named both ends; the introduction must agree with it.
  if (jrank != static_cast<int32_t>(c.server->client_rank()))
    return Reject(c, fmt::format("a join as rank {} on a connection that authenticated as rank {}", jrank,
                                 static_cast<int32_t>(c.server->client_rank())));
  if (rendezvous_done_)
    return Reject(c, fmt::format("a late join as rank {}: every rank has already joined", jrank));
  // From here the sender knows the secret: it is part of this job, so a mismatch is the job's
  // misconfiguration, and every rank is told.
  Status bad;
  if (jsize != size()) {
    bad = InvalidArgument(fmt::format("rank {} (at {}, host {}) was started with size {}, but the root has size {}: "
                                      "every rank must be given the same size",
                                      jrank, c.address, hostname, jsize, size()));
  } else if (jrank < 1 || jrank >= size()) {
    bad = InvalidArgument(fmt::format("a rank at {} (host {}) says it is rank {}, outside 1..{} (rank 0 is the root)",
                                      c.address, hostname, jrank, size() - 1));
  } else if (rank_conn_[jrank] != nullptr) {
    bad = InvalidArgument(fmt::format("rank {} joined twice: from {} and from {} (host {}); every rank must have a "
                                      "distinct rank number",
                                      jrank, rank_conn_[jrank]->address, c.address, hostname));
  }
  if (!bad.ok()) {
    // Reported by the poll loop to the root's caller, which tells every rank (FailJob): not from
    // here, inside the loop.
    if (job_error_.ok()) {
      job_error_ = bad;
      job_error_conn_ = &c;
    }
    return;
  }
  c.role = Conn::Role::kFromRank;
  c.peer = static_cast<int>(jrank);
  c.phase = Conn::Phase::kEstablished;
  rank_conn_[jrank] = &c;
  peers_[jrank] = HostPort{host, port};
  ++joined_;
  KZ_TRACE(kLogBootstrap, "{}: rank {} joined from {} (host {}, listening at {}) [{}/{}]", Me(), jrank, c.address,
           hostname, peers_[jrank].ToString(), joined_ + 1, size());
}
Status TcpBootstrap::StartRoot(Deadline deadline) {
  Clock::time_point start = Clock::now();
  listener_ = internal::TakeReservedListener(id_.root.port);
  if (!listener_.valid()) {
    Result<UniqueFd> l = net::ListenForRoot(id_.root);
    if (!l.ok()) return l.status().WithContext(fmt::format("{}: root of {}", Me(), id_.Redacted()));
    listener_ = std::move(l).value();
  }
  peers_[0] = id_.root;
  listen_text_ = net::LocalAddress(listener_.get()).ToString();
  KZ_INFO(kLogBootstrap, "{}: root of {} listening on {}, waiting for {} other rank{}", Me(), id_.Redacted(),
          listen_text_, size() - 1, size() == 2 ? "" : "s");
  Deadline wait = RootWaitDeadline(deadline);
  Status s = Progress(
      wait, [&] { return joined_ == size() - 1; },
      [&] {
        std::vector<int> missing;
        for (int r = 1; r < size(); ++r)
          if (rank_conn_[r] == nullptr) missing.push_back(r);
        return Timeout(
            fmt::format("rendezvous at {}: {} never joined within {:.1f} s ({} of {} ranks joined){}",
                        id_.root.ToString(), PluralRanks(missing), SecondsSince(start), joined_ + 1, size(),
                        accept_error_.empty() ? "" : "; the root could not take their connections: " + accept_error_));
      });
  if (s.ok()) {
    // A rank that joined and then went away before the table was sent.
    for (int r = 1; r < size(); ++r)
      if (!rank_conn_[r]->open())
        s = RemoteError(fmt::format("rendezvous: {}", rank_conn_[r]->closed_reason));
  }
  if (!s.ok()) return fatal_.ok() ? FailJob(s, job_error_conn_) : s;

  rendezvous_done_ = true;
  Bytes table;
  wire::PutI32(table, size());
  for (const HostPort& p : peers_) {
    wire::PutU16(table, p.port);
    wire::PutString(table, p.host);
  }
  auto shared = std::make_shared<const Bytes>(std::move(table));
  for (int r = 1; r < size(); ++r) QueueShared(*rank_conn_[r], FrameType::kWelcome, 0, shared);
  s = Progress(
      deadline,
      [&] {
        for (int r = 1; r < size(); ++r)
          if (rank_conn_[r]->open() && !rank_conn_[r]->out.empty()) return false;
        return true;
      },
      [&] {
        return Timeout("rendezvous: sending the address table to every rank did not finish before the deadline");
      });
  for (int r = 1; s.ok() && r < size(); ++r)
    if (!rank_conn_[r]->open()) s = RemoteError(fmt::format("rendezvous: {}", rank_conn_[r]->closed_reason));
  if (!s.ok()) return fatal_.ok() ? FailJob(s) : s;
  KZ_INFO(kLogBootstrap, "{}: all {} ranks joined the root at {} in {:.1f} ms", Me(), size(), listen_text_,
          SecondsSince(start) * 1e3);
  return Status::Ok();
}
Result<std::vector<Bytes>> TcpBootstrap::RootCollective(uint32_t kind, std::span<const uint8_t> mine,
                                                        Deadline deadline) {
  std::string_view op = KindName(kind);
  Clock::time_point start = Clock::now();
  auto have = [&](int r) { return !gather_in_[r].empty(); };
  Status s = Progress(
      RootWaitDeadline(deadline),
      [&] {
        for (int r = 1; r < size(); ++r)
          if (!have(r) && rank_conn_[r]->open()) return false;
        return true;
      },
      [&] {
        std::vector<int> missing;
        for (int r = 1; r < size(); ++r)
          if (!have(r)) missing.push_back(r);
        return Timeout(fmt::format("{}: {} did not call {} within {:.1f} s (or are stuck)", op, PluralRanks(missing),
                                   op, SecondsSince(start)));
      });
  for (int r = 1; s.ok() && r < size(); ++r)
    if (!have(r)) s = RemoteError(fmt::format("{}: {}", op, rank_conn_[r]->closed_reason));
  for (int r = 1; s.ok() && r < size(); ++r) {
    if (gather_in_[r].front().first != kind)
      s = InvalidArgument(fmt::format("collective mismatch: rank 0 called {} while rank {} called {}", op, r,
                                      KindName(gather_in_[r].front().first)));
  }
  if (!s.ok()) return collective_failed_.ok() ? FailJob(s) : s;

  std::vector<Bytes> out(size());
  out[0].assign(mine.begin(), mine.end());
  for (int r = 1; r < size(); ++r) {
    out[r] = std::move(gather_in_[r].front().second);
    gather_in_[r].pop_front();
  }
  auto payload = std::make_shared<Bytes>();
  if (kind == kKindAllGather) {
    size_t total = 0;
    for (const Bytes& b : out) total += b.size();
    if (total > kMaxAllGatherBytes)
      return FailJob(InvalidArgument(fmt::format("AllGather: {} bytes in all exceed the limit of {} bytes", total,
                                                 kMaxAllGatherBytes)));
    payload->reserve(4 + 8 * out.size() + total);
    wire::PutU32(*payload, static_cast<uint32_t>(size()));
    for (const Bytes& b : out) wire::PutU64(*payload, b.size());
    for (const Bytes& b : out) payload->insert(payload->end(), b.begin(), b.end());
  }
  std::shared_ptr<const Bytes> shared = std::move(payload);
  for (int r = 1; r < size(); ++r) QueueShared(*rank_conn_[r], FrameType::kGatherResult, kind, shared);
  s = Progress(
      deadline,
      [&] {
        for (int r = 1; r < size(); ++r)
          if (rank_conn_[r]->open() && !rank_conn_[r]->out.empty()) return false;
        return true;
      },
      [&] {
        std::vector<int> slow;
        for (int r = 1; r < size(); ++r)
          if (!rank_conn_[r]->out.empty()) slow.push_back(r);
        return Timeout(fmt::format("{}: {} did not take the result within {:.1f} s", op, PluralRanks(slow),
                                   SecondsSince(start)));
      });
  for (int r = 1; s.ok() && r < size(); ++r)
    if (!rank_conn_[r]->open()) s = RemoteError(fmt::format("{}: {}", op, rank_conn_[r]->closed_reason));
  if (!s.ok()) return collective_failed_.ok() ? FailJob(s) : s;
  if (kind == kKindBarrier) out.clear();
  return out;
}

}  // namespace kizuna::bootstrap::tcp
