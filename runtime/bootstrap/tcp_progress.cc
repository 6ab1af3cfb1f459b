// The poll loop that drives every connection of a Bootstrap, the handshake state machine (auth.h)
// on each connection, and the dispatch of what arrives once a connection is authenticated.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap::tcp {

// A complete unit (handshake message, frame header or payload) is in c.in.
void TcpBootstrap::OnUnit(Conn& c) {
  switch (c.phase) {
    case Conn::Phase::kAwaitServerHello: return OnServerHello(c);
    case Conn::Phase::kAwaitClientHello: {
      ClientHello hello;
      std::memcpy(hello.data(), c.in.data(), hello.size());
      Result<ServerHello> reply = c.server->OnClientHello(hello);
      if (!reply.ok()) {
        Reject(c, reply.status().message());
        return;
      }
      c.out.push_back({std::make_shared<const Bytes>(reply->begin(), reply->end()), 0});
      c.phase = Conn::Phase::kAwaitClientProof;
      c.Expect(kClientProofBytes);
      return;
    }
    case Conn::Phase::kAwaitClientProof: {
      ClientProof proof;
      std::memcpy(proof.data(), c.in.data(), proof.size());
      Status s = c.server->OnClientProof(proof);
      if (!s.ok()) {
        Reject(c, s.message());
        return;
      }
      c.phase = Conn::Phase::kAwaitIntro;
      c.Expect(kFrameHeaderBytes);
      c.in_payload = false;
      return;
    }
    case Conn::Phase::kAwaitIntro:
    case Conn::Phase::kEstablished: return OnFrameUnit(c);
    case Conn::Phase::kConnecting:
    case Conn::Phase::kClosed: return;
  }
}

// The client side of the handshake: the server's hello in, this side's proof out.
void TcpBootstrap::OnServerHello(Conn& c) {
  ServerHello reply;
  std::memcpy(reply.data(), c.in.data(), reply.size());
  Result<ClientProof> proof = c.client->OnServerHello(reply);
  if (!proof.ok()) {
    // A MAC that does not match means the two ends hold different secrets: the root refused this rank.
    const bool refused = proof.status().code() == StatusCode::kRemoteError;
    std::string why =
        fmt::format("{} at {}{}: {}",
                    c.role == Conn::Role::kToRoot ? std::string("the root") : fmt::format("rank {}", c.peer), c.address,
                    refused ? " refused this rank" : "", proof.status().message());
    KZ_WARN(kLogBootstrap, "{}: {}", Me(), why);
    if (c.role == Conn::Role::kToRoot) fatal_ = Status(proof.status().code(), why);
    Close(c, why);
    return;
  }
  c.out.push_back({std::make_shared<const Bytes>(proof->begin(), proof->end()), 0});
  c.phase = Conn::Phase::kEstablished;
  c.Expect(kFrameHeaderBytes);
  c.in_payload = false;
  OnClientAuthenticated(c);
  while (!c.later.empty()) {
    c.out.push_back(std::move(c.later.front()));
    c.later.pop_front();
  }
}

// A frame's header or, when it announced one, its payload (an authenticated connection).
void TcpBootstrap::OnFrameUnit(Conn& c) {
  if (c.in_payload) {
    Bytes payload = std::move(c.in);
    c.in_payload = false;
    c.Expect(kFrameHeaderBytes);
    if (c.phase == Conn::Phase::kAwaitIntro) OnIntro(c, std::move(payload));
    else OnFrame(c, std::move(payload));
    return;
  }
  wire::Reader r(c.in);
  const uint32_t magic = r.U32();
  const uint32_t type = r.U32();
  const uint32_t tag = r.U32();
  r.U32();  // reserved
  const uint64_t length = r.U64();
  std::string bad;
  if (magic != kFrameMagic) bad = "a frame without the frame magic";
  else if (type < 1 || type > 7) bad = fmt::format("a frame of unknown type {}", type);
  else if (c.phase == Conn::Phase::kAwaitIntro && type != static_cast<uint32_t>(FrameType::kJoin) &&
           type != static_cast<uint32_t>(FrameType::kPeerHello))
    bad = fmt::format("a frame of type {} before introducing itself", type);
  else if (length > MaxPayload(static_cast<FrameType>(type), size()))
    bad = fmt::format("a frame of type {} with {} bytes (limit {})", type, length,
                      MaxPayload(static_cast<FrameType>(type), size()));
  if (!bad.empty()) {
    if (c.role == Conn::Role::kPending) {
      Reject(c, fmt::format("authenticated, then sent {}", bad));
    } else {
      std::string why = fmt::format("rank {} (at {}) sent {}", c.peer, c.address, bad);
      KZ_WARN(kLogBootstrap, "{}: {}", Me(), why);
      if (c.role == Conn::Role::kToRoot) fatal_ = Internal(why);
      Close(c, why);
    }
    return;
  }
  c.frame_type = static_cast<FrameType>(type);
  c.frame_tag = tag;
  if (length == 0) {
    c.Expect(kFrameHeaderBytes);
    if (c.phase == Conn::Phase::kAwaitIntro) OnIntro(c, {});
    else OnFrame(c, {});
    return;
  }
  c.in_payload = true;
  c.Expect(static_cast<size_t>(length));
}

// The client side finished authenticating: introduce this rank.
void TcpBootstrap::OnClientAuthenticated(Conn& c) {
  if (c.role == Conn::Role::kPeerOut) return SendPeerHello(c);
  SendJoin(c);
}

// The first frame of an authenticated incoming connection: who it is.
void TcpBootstrap::OnIntro(Conn& c, Bytes payload) {
  if (c.frame_type == FrameType::kPeerHello) return OnPeerHello(c, std::move(payload));
  if (c.frame_type != FrameType::kJoin || !is_root())
    return Reject(c, fmt::format("unexpected first frame (type {})", static_cast<uint32_t>(c.frame_type)));
  OnJoin(c, std::move(payload));
}

void TcpBootstrap::OnFrame(Conn& c, Bytes payload) {
  switch (c.role) {
    case Conn::Role::kFromRank:
      if (c.frame_type == FrameType::kGather) {
        gather_in_[c.peer].emplace_back(c.frame_tag, std::move(payload));
        return;
      }
      break;
    case Conn::Role::kToRoot:
      if (c.frame_type == FrameType::kWelcome && !welcomed_) return OnWelcome(c, std::move(payload));
      if (c.frame_type == FrameType::kGatherResult) {
        results_.emplace_back(c.frame_tag, std::move(payload));
        return;
      }
      if (c.frame_type == FrameType::kAbort) return OnAbort(std::move(payload));
      break;
    case Conn::Role::kPeerIn:
      if (c.frame_type == FrameType::kData) {
        mailbox_[{c.peer, c.frame_tag}].push_back(std::move(payload));
        return;
      }
      break;
    case Conn::Role::kPeerOut:
    case Conn::Role::kPending: break;
  }
  std::string why = fmt::format("rank {} (at {}) sent an unexpected frame (type {})", c.peer, c.address,
                                static_cast<uint32_t>(c.frame_type));
  KZ_WARN(kLogBootstrap, "{}: {}", Me(), why);
  if (c.role == Conn::Role::kToRoot) fatal_ = Internal(why);
  Close(c, why);
}

// ---- the poll loop --------------------------------------------------------------------------

Status TcpBootstrap::Progress(Deadline deadline, const std::function<bool()>& done,
                              const std::function<Status()>& on_timeout) {
  std::vector<pollfd> fds;
  std::vector<Conn*> who;
  // At least one pass even with an expired deadline, so bytes that already arrived are seen.
  bool first = true;
  while (true) {
    RemoveDead();
    if (!fatal_.ok()) return fatal_;
    if (!job_error_.ok()) return job_error_;
    if (done()) return Status::Ok();
    Clock::time_point now = Clock::now();
    if (!first && now >= deadline.when()) return on_timeout();
    first = false;

    Clock::time_point wake = deadline.when();
    for (const auto& owned : conns_) {
      Conn& c = *owned;
      if (c.role == Conn::Role::kPending && c.open()) {
        if (now >= c.handshake_deadline) {
          Reject(c, fmt::format("it did not authenticate within {} s", options_.handshake_timeout_s));
          continue;
        }
        wake = std::min(wake, c.handshake_deadline);
      }
      if (c.phase == Conn::Phase::kConnecting && !c.fd.valid() && c.role == Conn::Role::kToRoot) {
        if (now >= c.retry_at) StartConnect(c);
        else wake = std::min(wake, c.retry_at);
      }
    }
    if (!fatal_.ok()) return fatal_;

    fds.clear();
    who.clear();
    if (listener_.valid() && now >= listener_paused_until_) {
      fds.push_back({listener_.get(), POLLIN, 0});
      who.push_back(nullptr);
    } else if (listener_.valid()) {
      wake = std::min(wake, listener_paused_until_);
    }
    for (const auto& owned : conns_) {
      Conn& c = *owned;
      if (!c.fd.valid() || !c.open()) continue;
      short events = 0;
      if (c.phase == Conn::Phase::kConnecting) events = POLLOUT;
      else events = static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT));
      fds.push_back({c.fd.get(), events, 0});
      who.push_back(&c);
    }
    int r = poll(fds.data(), fds.size(), net::PollTimeoutMs(Deadline::At(wake)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return FromErrno(errno, "poll");
    }
    if (r == 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn* c = who[i];
      if (c == nullptr) {
        Accept();
        continue;
      }
      if (!c->fd.valid() || c->fd.get() != fds[i].fd) continue;  // closed (or retried) meanwhile
      if (c->phase == Conn::Phase::kConnecting) {
        FinishConnect(*c);
        if (c->phase != Conn::Phase::kConnecting) Flush(*c);
        continue;
      }
      if (fds[i].revents & POLLOUT) Flush(*c);
      if (c->fd.valid() && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) ReadAvailable(*c);
    }
  }
}

}  // namespace kizuna::bootstrap::tcp
