// One connection's socket: accepting strangers (bounded in number and time), connecting with
// retries, queueing and sending frames, and reading the unit the protocol expects next.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap::tcp {

Conn* TcpBootstrap::NewConn(Conn::Role role) {
  conns_.push_back(std::make_unique<Conn>());
  Conn* c = conns_.back().get();
  c->role = role;
  return c;
}

void TcpBootstrap::RemoveDead() {
  std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
}

void TcpBootstrap::Close(Conn& c, std::string reason) {
  if (c.phase == Conn::Phase::kClosed) return;
  c.phase = Conn::Phase::kClosed;
  c.closed_reason = std::move(reason);
  c.fd.Reset();
  c.out.clear();
  c.later.clear();
  KZ_TRACE(kLogBootstrap, "{}: connection with {} closed: {}", Me(), c.address, c.closed_reason);
}

void TcpBootstrap::Reject(Conn& c, std::string_view reason) {
  WarnRejected(c.address, reason);
  Close(c, std::string(reason));
  c.dead = true;
}

// Strangers decide how often a connection is rejected, so these warnings are rate-limited (a burst,
// then about one a second) and the next one shown counts those that were not; all of them are
// logged at TRACE.
void TcpBootstrap::WarnRejected(std::string_view address, std::string_view reason) {
  Clock::time_point now = Clock::now();
  if (reject_log_.last != Clock::time_point{}) {
    double refill = std::chrono::duration<double>(now - reject_log_.last).count() * kRejectWarningsPerSecond;
    reject_log_.tokens = std::min<double>(kRejectWarningBurst, reject_log_.tokens + refill);
  }
  reject_log_.last = now;
  if (reject_log_.tokens < 1) {
    ++reject_log_.hidden;
    KZ_TRACE(kLogBootstrap, "{}: rejected a connection from {}: {}; nothing it sent was used", Me(), address, reason);
    return;
  }
  reject_log_.tokens -= 1;
  std::string hidden = reject_log_.hidden == 0
                           ? std::string()
                           : fmt::format(" ({} more rejected connections not shown)", reject_log_.hidden);
  reject_log_.hidden = 0;
  KZ_WARN(kLogBootstrap, "{}: rejected a connection from {}: {}; nothing it sent was used{}", Me(), address, reason,
          hidden);
}

// Frames wait in `later` until a client connection has authenticated: the handshake goes first.
static std::deque<OutChunk>& FrameQueue(Conn& c) {
  bool before_auth = c.phase == Conn::Phase::kConnecting || c.phase == Conn::Phase::kAwaitServerHello;
  return before_auth ? c.later : c.out;
}

void TcpBootstrap::QueueFrame(Conn& c, FrameType type, uint32_t tag, std::span<const uint8_t> payload) {
  std::deque<OutChunk>& q = FrameQueue(c);
  Bytes frame = FrameHeader(type, tag, payload.size());
  if (payload.size() <= 64 * 1024) {  // one buffer, one send()
    frame.insert(frame.end(), payload.begin(), payload.end());
    q.push_back({std::make_shared<const Bytes>(std::move(frame)), 0});
    return;
  }
  q.push_back({std::make_shared<const Bytes>(std::move(frame)), 0});
  q.push_back({std::make_shared<const Bytes>(payload.begin(), payload.end()), 0});
}

void TcpBootstrap::QueueShared(Conn& c, FrameType type, uint32_t tag, std::shared_ptr<const Bytes> payload) {
  std::deque<OutChunk>& q = FrameQueue(c);
  q.push_back({std::make_shared<const Bytes>(FrameHeader(type, tag, payload->size())), 0});
  if (!payload->empty()) q.push_back({std::move(payload), 0});
}

// Connections still authenticating hold slots (a file descriptor, a little memory) that strangers
// can take without knowing anything, so there are at most max_pending_connections of them. When
// all are taken, the oldest connection that has not authenticated gives way to the new one rather
// than the new one being refused: strangers that connect and stay silent (slowloris) then keep
// nobody out, since a rank finishes its handshake within a round trip, long before that many newer
// connections arrive. (conns_ keeps creation order, so the first pending one is the oldest.)
void TcpBootstrap::Accept() {
  const size_t limit = static_cast<size_t>(std::max(1, options_.max_pending_connections));
  size_t pending = 0;
  std::deque<Conn*> evictable;  // pending and not authenticated, oldest first
  for (const auto& c : conns_) {
    if (c->role != Conn::Role::kPending || !c->open()) continue;
    ++pending;
    if (c->phase == Conn::Phase::kAwaitClientHello || c->phase == Conn::Phase::kAwaitClientProof)
      evictable.push_back(c.get());
  }
  for (int i = 0; i < 64; ++i) {
    net::Address peer;
    peer.length = sizeof(peer.storage);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer.storage), &peer.length,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection stays queued; try again shortly instead of spinning on poll(). The root
        // holds a connection per rank, so a job larger than `ulimit -n` ends here: the reason (with
        // the limit) goes into the rendezvous timeout, and is warned about once, not every 100 ms.
        const bool first = accept_error_.empty();
        accept_error_ = FromErrno(errno, "accept").message();
        if (first) KZ_WARN(kLogBootstrap, "{}: {}; retrying every 100 ms", Me(), accept_error_);
        listener_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
        KZ_WARN(kLogBootstrap, "{}: accept failed: {}", Me(), std::strerror(errno));
      }
      return;
    }
    UniqueFd owned(fd);
    if (pending >= limit) {
      if (evictable.empty()) {  // all of them have authenticated and are introducing themselves
        WarnRejected(peer.ToString(), fmt::format("{} connections are already authenticating", pending));
        continue;
      }
      Conn* oldest = evictable.front();
      evictable.pop_front();
      --pending;
      Reject(*oldest, fmt::format("it had not authenticated when the limit of {} connections authenticating at "
                                  "once was reached; the oldest gives way to a new one",
                                  limit));
    }
    Result<ServerHandshake> hs = ServerHandshake::Start(id_.secret, static_cast<uint32_t>(rank()));
    if (!hs.ok()) {
      KZ_WARN(kLogBootstrap, "{}: dropped a connection from {}: {}", Me(), peer.ToString(), hs.status().ToString());
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Conn* c = NewConn(Conn::Role::kPending);
    c->fd = std::move(owned);
    c->address = peer.ToString();
    c->phase = Conn::Phase::kAwaitClientHello;
    c->server.emplace(std::move(hs).value());
    c->handshake_deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                           std::max(0.001, options_.handshake_timeout_s)));
    c->Expect(kClientHelloBytes);
    ++pending;
    evictable.push_back(c);
    KZ_TRACE(kLogBootstrap, "{}: accepted a connection from {}", Me(), c->address);
  }
}

void TcpBootstrap::StartConnect(Conn& c) {
  const net::Address& target = c.targets[c.next_target % c.targets.size()];
  c.next_target++;
  c.address = target.ToString();
  c.phase = Conn::Phase::kConnecting;
  c.fd.Reset(socket(target.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!c.fd.valid()) {
    ClientConnectFailed(c, fmt::format("socket: {}", std::strerror(errno)), false);
    return;
  }
  int one = 1;
  setsockopt(c.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(c.fd.get(), target.get(), target.length) == 0 || errno == EINPROGRESS) return;  // POLLOUT tells
  int err = errno;
  ClientConnectFailed(c, std::strerror(err), err == ECONNREFUSED || err == EAGAIN || err == ENETUNREACH ||
                                                 err == EHOSTUNREACH || err == ETIMEDOUT);
}

void TcpBootstrap::FinishConnect(Conn& c) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    ClientConnectFailed(c, std::strerror(err), err == ECONNREFUSED || err == ENETUNREACH || err == EHOSTUNREACH ||
                                                   err == ETIMEDOUT || err == ECONNRESET);
    return;
  }
  // The route names both ends, so the handshake is good only with the rank it is meant for.
  Result<ClientHandshake> hs =
      ClientHandshake::Start(id_.secret, Route{static_cast<uint32_t>(rank()), static_cast<uint32_t>(c.peer)});
  if (!hs.ok()) {
    ClientConnectFailed(c, hs.status().ToString(), false);
    return;
  }
  c.client.emplace(std::move(hs).value());
  c.out.push_back({std::make_shared<const Bytes>(c.client->hello().begin(), c.client->hello().end()), 0});
  c.phase = Conn::Phase::kAwaitServerHello;
  c.Expect(kServerHelloBytes);
}

// A client connection failed before it was authenticated. The root may simply not be listening
// yet, so that connection retries (with backoff) until the caller's deadline; a peer's listener
// exists from the rendezvous on, so a refused peer connection means the peer is gone.
void TcpBootstrap::ClientConnectFailed(Conn& c, const std::string& why, bool retryable) {
  c.last_error = why;
  c.fd.Reset();
  c.out.clear();
  if (c.role == Conn::Role::kToRoot && retryable) {
    c.phase = Conn::Phase::kConnecting;
    c.retry_at = Clock::now() + c.backoff;
    c.backoff = std::min<std::chrono::milliseconds>(c.backoff * 2, std::chrono::milliseconds(500));
    KZ_TRACE(kLogBootstrap, "{}: root at {} not reachable yet ({}); retrying", Me(), c.address, why);
    return;
  }
  if (c.role == Conn::Role::kToRoot) {
    fatal_ = RemoteError(fmt::format("{}: cannot join the root at {}: {}", Me(), c.address, why));
    Close(c, why);
    return;
  }
  Close(c, fmt::format("cannot connect to rank {} at {}: {} (has it exited?)", c.peer, c.address, why));
}

void TcpBootstrap::Flush(Conn& c) {
  while (!c.out.empty() && c.fd.valid()) {
    OutChunk& chunk = c.out.front();
    ssize_t n = send(c.fd.get(), chunk.data->data() + chunk.offset, chunk.data->size() - chunk.offset,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      chunk.offset += static_cast<size_t>(n);
      if (chunk.offset == chunk.data->size()) c.out.pop_front();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    std::string why = n < 0 ? std::strerror(errno) : "send returned 0";
    if (c.phase == Conn::Phase::kAwaitServerHello || c.phase == Conn::Phase::kConnecting) {
      ClientConnectFailed(c, why, true);
    } else if (c.role == Conn::Role::kPending) {
      Reject(c, fmt::format("send failed: {}", why));
    } else {
      Close(c, fmt::format("the connection broke while sending ({})", why));
    }
    return;
  }
}

void TcpBootstrap::ReadAvailable(Conn& c) {
  // Bounded per wake-up so one busy connection cannot starve the others.
  for (int rounds = 0; rounds < 64 && c.fd.valid() && c.phase != Conn::Phase::kConnecting; ++rounds) {
    ssize_t n = recv(c.fd.get(), c.in.data() + c.in_have, c.in.size() - c.in_have, MSG_DONTWAIT);
    if (n > 0) {
      c.in_have += static_cast<size_t>(n);
      if (c.in_have == c.in.size()) OnUnit(c);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    std::string why = n == 0 ? "closed by the peer" : std::strerror(errno);
    switch (c.role) {
      case Conn::Role::kPending:
        Reject(c, n == 0 ? "it closed the connection before authenticating" : why);
        return;
      case Conn::Role::kToRoot:
        if (c.phase == Conn::Phase::kAwaitServerHello) {
          ClientConnectFailed(c, fmt::format("the root closed the connection during authentication ({})", why), true);
        } else {
          Close(c, fmt::format("rank 0 (the root, at {}) closed the bootstrap connection: its process ended or its "
                               "Bootstrap was destroyed",
                               c.address));
        }
        return;
      case Conn::Role::kFromRank:
      case Conn::Role::kPeerIn:
        Close(c, fmt::format("rank {} (at {}) closed its connection: its process ended or its Bootstrap was destroyed",
                             c.peer, c.address));
        return;
      case Conn::Role::kPeerOut:
        Close(c, fmt::format("rank {} (at {}) closed the connection{}: its process ended or its Bootstrap was "
                             "destroyed",
                             c.peer, c.address,
                             c.phase == Conn::Phase::kAwaitServerHello ? " during authentication" : ""));
        return;
    }
  }
}

}  // namespace kizuna::bootstrap::tcp
