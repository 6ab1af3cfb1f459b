// The side of every rank but 0: it joins the root (introducing itself and where it listens for
// peers), takes the address table, and runs the collectives through the root.
#include <netinet/in.h>
#include <unistd.h>

#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap::tcp {

Status TcpBootstrap::StartNonRoot(Deadline deadline) {
  Clock::time_point start = Clock::now();
  root_conn_ = NewConn(Conn::Role::kToRoot);
  root_conn_->peer = 0;
  root_conn_->targets = root_addresses_;
  StartConnect(*root_conn_);
  Status s = Progress(
      deadline, [&] { return welcomed_ || !root_conn_->open(); },
      [&] {
        if (root_conn_->phase == Conn::Phase::kConnecting || root_conn_->phase == Conn::Phase::kAwaitServerHello)
          return Timeout(fmt::format("{}: could not reach the root at {} within {:.1f} s (last error: {}); is rank 0 "
                                     "running with the same unique id?",
                                     Me(), id_.root.ToString(), SecondsSince(start),
                                     root_conn_->last_error.empty() ? "none" : root_conn_->last_error));
        return Timeout(fmt::format("{}: joined the root at {}, but the rendezvous did not complete within {:.1f} s "
                                   "(the root waits for all {} ranks)",
                                   Me(), id_.root.ToString(), SecondsSince(start), size()));
      });
  if (s.ok() && !welcomed_) s = RemoteError(fmt::format("{}: rendezvous: {}", Me(), root_conn_->closed_reason));
  if (!s.ok()) {
    fatal_ = s;
    return s;
  }
  rendezvous_done_ = true;
  KZ_INFO(kLogBootstrap, "{}: joined the root at {} in {:.1f} ms; listening for peers at {}", Me(),
          id_.root.ToString(), SecondsSince(start) * 1e3, listen_text_);
  return Status::Ok();
}

// The connection to the root is authenticated: listen for peers on the address this host uses to
// reach the root, which is the one most likely reachable by the other ranks too, and join.
void TcpBootstrap::SendJoin(Conn& c) {
  net::Address local = net::LocalAddress(c.fd.get());
  net::Address bind_to = local;
  if (bind_to.family() == AF_INET) reinterpret_cast<sockaddr_in*>(&bind_to.storage)->sin_port = 0;
  else if (bind_to.family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&bind_to.storage)->sin6_port = 0;
  Result<UniqueFd> listener = net::Listen(bind_to);
  if (!listener.ok()) {
    fatal_ = listener.status().WithContext(fmt::format("{}: listening for peers", Me()));
    Close(c, fatal_.message());
    return;
  }
  listener_ = std::move(listener).value();
  net::Address bound = net::LocalAddress(listener_.get());
  listen_text_ = bound.ToString();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  Bytes join;
  wire::PutI32(join, rank());
  wire::PutI32(join, size());
  wire::PutU16(join, bound.Port());
  wire::PutString(join, bound.Host());
  wire::PutString(join, std::string_view(host).substr(0, kMaxHostBytes));
  QueueFrame(c, FrameType::kJoin, 0, join);
}

// The root's table of where every rank listens for peers.
void TcpBootstrap::OnWelcome(Conn& c, Bytes payload) {
  wire::Reader r(payload);
  const int n = r.I32();
  std::vector<HostPort> table;
  for (int i = 0; i < n && r.ok() && n == size(); ++i) {
    const uint16_t port = r.U16();
    std::string host = r.String(kMaxHostBytes);
    table.push_back(HostPort{host, port});
  }
  if (n != size() || !r.AtEnd()) {
    fatal_ = Internal(fmt::format("{}: malformed welcome from the root at {} ({} ranks)", Me(), c.address, n));
    Close(c, fatal_.message());
    return;
  }
  peers_ = std::move(table);
  welcomed_ = true;
}

// The root says the job failed: every later call returns this.
void TcpBootstrap::OnAbort(Bytes payload) {
  wire::Reader r(payload);
  auto code = static_cast<StatusCode>(r.U32());
  const std::string message = r.String(kMaxAbortBytes);
  if (!r.ok() || code == StatusCode::kOk || static_cast<uint32_t>(code) > static_cast<uint32_t>(StatusCode::kInternal))
    code = StatusCode::kRemoteError;
  Status& failed = rendezvous_done_ ? collective_failed_ : fatal_;
  failed = Status(code, fmt::format("rank 0 (the root) reports: {}", message));
  KZ_WARN(kLogBootstrap, "{}: {}", Me(), failed.ToString());
}

Result<std::vector<Bytes>> TcpBootstrap::Collective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline) {
  if (!fatal_.ok()) return fatal_;
  if (!collective_failed_.ok()) return collective_failed_;
  std::string_view op = KindName(kind);
  if (size() == 1) {
    std::vector<Bytes> out;
    if (kind == kKindAllGather) out.emplace_back(mine.begin(), mine.end());
    return out;
  }
  if (is_root()) return RootCollective(kind, mine, deadline);

  Clock::time_point start = Clock::now();
  if (!root_conn_->open()) return RemoteError(fmt::format("{}: {}", op, root_conn_->closed_reason));
  QueueFrame(*root_conn_, FrameType::kGather, kind, mine);
  Status s = Progress(
      deadline, [&] { return !results_.empty() || !root_conn_->open() || !collective_failed_.ok(); },
      [&] {
        return Timeout(fmt::format("{}: no answer from the root (rank 0 at {}) within {:.1f} s; the root names the "
                                   "missing ranks in its own log",
                                   op, id_.root.ToString(), SecondsSince(start)));
      });
  if (s.ok() && results_.empty()) {
    s = collective_failed_.ok() ? RemoteError(fmt::format("{}: {}", op, root_conn_->closed_reason))
                                : collective_failed_;
  }
  if (!s.ok()) {
    collective_failed_ = s;
    return s;
  }
  auto [got_kind, payload] = std::move(results_.front());
  results_.pop_front();
  if (got_kind != kind) {
    collective_failed_ = InvalidArgument(
        fmt::format("{}: the root answered a {} (ranks called different collectives)", op, KindName(got_kind)));
    return collective_failed_;
  }
  std::vector<Bytes> out;
  if (kind == kKindBarrier) return out;
  wire::Reader r(payload);
  const uint32_t n = r.U32();
  std::vector<uint64_t> lengths;
  for (uint32_t i = 0; i < n && r.ok() && n == static_cast<uint32_t>(size()); ++i) lengths.push_back(r.U64());
  for (uint32_t i = 0; i < n && r.ok() && lengths.size() == n; ++i) {
    auto part = r.Take(lengths[i]);
    out.emplace_back(part.begin(), part.end());
  }
  if (n != static_cast<uint32_t>(size()) || !r.AtEnd()) {
    collective_failed_ =
        Internal(fmt::format("{}: malformed result from the root ({} entries for {} ranks)", op, n, size()));
    return collective_failed_;
  }
  return out;
}

}  // namespace kizuna::bootstrap::tcp
