// Direct connections between two ranks for Send/Recv: opened by the sender on first use (one per
// pair and direction), authenticated like every connection, then introduced with a PeerHello.
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap::tcp {

// This rank's outgoing connection to `c.peer` is authenticated: say who sends, and to whom.
void TcpBootstrap::SendPeerHello(Conn& c) {
  Bytes hello;
  wire::PutI32(hello, rank());
  wire::PutI32(hello, c.peer);
  QueueFrame(c, FrameType::kPeerHello, 0, hello);
  KZ_TRACE(kLogBootstrap, "{}: connected to rank {} at {}", Me(), c.peer, c.address);
}

// An authenticated incoming connection says it is rank `from` sending to this rank.
void TcpBootstrap::OnPeerHello(Conn& c, Bytes payload) {
  wire::Reader r(payload);
  const int from = r.I32();
  const int to = r.I32();
  if (!r.AtEnd()) return Reject(c, "malformed peer hello");
  // The handshake named both ends; the introduction must agree with it.
  if (static_cast<uint32_t>(from) != c.server->client_rank())
    return Reject(c, fmt::format("a peer hello as rank {} on a connection that authenticated as rank {}", from,
                                 c.server->client_rank()));
  if (to != rank()) return Reject(c, fmt::format("a peer connection meant for rank {} reached rank {}", to, rank()));
  if (from < 0 || from >= size() || from == rank())
    return Reject(
        c, fmt::format("a peer connection from rank {}, which is not a peer in a job of {} ranks", from, size()));
  if (in_conn_[from] != nullptr && in_conn_[from]->open())
    return Reject(c, fmt::format("a second connection claiming to be rank {}", from));
  c.role = Conn::Role::kPeerIn;
  c.peer = from;
  c.phase = Conn::Phase::kEstablished;
  in_conn_[from] = &c;
  KZ_TRACE(kLogBootstrap, "{}: rank {} connected from {}", Me(), from, c.address);
}

Status TcpBootstrap::DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) {
  if (!fatal_.ok()) return fatal_;
  if (peer == rank()) {
    mailbox_[{peer, tag}].emplace_back(bytes.begin(), bytes.end());
    return Status::Ok();
  }
  Conn* c = out_conn_[peer];
  if (c == nullptr) {
    c = NewConn(Conn::Role::kPeerOut);
    c->peer = peer;
    if (peer == 0) {
      c->targets = root_addresses_;
    } else {
      Result<std::vector<net::Address>> a = net::Resolve(peers_[peer], fmt::format("rank {}'s address", peer));
      if (!a.ok()) {
        Close(*c, a.status().message());
        out_conn_[peer] = c;
        return RemoteError(fmt::format("Send to rank {}: {}", peer, a.status().message()));
      }
      c->targets = std::move(a).value();
    }
    out_conn_[peer] = c;
    StartConnect(*c);
  }
  if (!c->open()) return RemoteError(fmt::format("Send to rank {} (tag {}): {}", peer, tag, c->closed_reason));
  Clock::time_point start = Clock::now();
  QueueFrame(*c, FrameType::kData, tag, bytes);
  Status s = Progress(
      deadline, [&] { return !c->open() || (c->phase == Conn::Phase::kEstablished && c->out.empty()); },
      [&] {
        return Timeout(fmt::format("Send to rank {} (tag {}, {} bytes): not taken within {:.1f} s (rank {} is not in "
                                   "a bootstrap call, or is stuck); it may still be delivered during later calls",
                                   peer, tag, bytes.size(), SecondsSince(start), peer));
      });
  if (!s.ok()) return s;
  if (!c->open()) return RemoteError(fmt::format("Send to rank {} (tag {}): {}", peer, tag, c->closed_reason));
  return Status::Ok();
}

Result<Bytes> TcpBootstrap::DoRecv(int peer, uint32_t tag, Deadline deadline) {
  auto take = [&]() -> std::optional<Bytes> {
    auto it = mailbox_.find({peer, tag});
    if (it == mailbox_.end() || it->second.empty()) return std::nullopt;
    Bytes b = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) mailbox_.erase(it);
    return b;
  };
  if (auto b = take()) return std::move(*b);
  if (!fatal_.ok()) return fatal_;
  if (peer == rank())
    return InvalidArgument(fmt::format("Recv from this rank itself (rank {}, tag {}) with no message waiting: send "
                                       "it first",
                                       peer, tag));
  Clock::time_point start = Clock::now();
  auto gone = [&] { return in_conn_[peer] != nullptr && !in_conn_[peer]->open(); };
  Status s = Progress(
      deadline, [&] { return mailbox_.count({peer, tag}) > 0 || gone(); },
      [&] {
        return Timeout(fmt::format("Recv from rank {} (tag {}): nothing arrived within {:.1f} s", peer, tag,
                                   SecondsSince(start)));
      });
  if (!s.ok()) return s;
  if (auto b = take()) return std::move(*b);
  return RemoteError(fmt::format("Recv from rank {} (tag {}): {}", peer, tag, in_conn_[peer]->closed_reason));
}

}  // namespace kizuna::bootstrap::tcp
