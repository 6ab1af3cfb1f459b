// The transport's connections, made on demand (transport.h): Connect to a peer when a plan first
// sends to it, Poll to accept the peers' connections and hand each to the peer its first message
// names, the buffers registered on each comm as it is made, and the count of connected peers.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/transport/internal.h"
#include "collectives/transport/transport.h"
#include "runtime/core/logging.h"
#include "runtime/core/wire.h"

namespace kizuna::collectives {

using transport_internal::RankList;

namespace {

using Clock = std::chrono::steady_clock;

// A connection's first message: magic "KZTI" | version (u32) | the connecting rank (i32) | the
// communicator's size (i32).
constexpr uint8_t kIdentifyMagic[4] = {'K', 'Z', 'T', 'I'};
constexpr uint32_t kIdentifyVersion = 1;
constexpr size_t kIdentifyBytes = 16;
// An accepted connection that does not say who made it within this long is dropped (a peer sends
// it right after connecting).
constexpr auto kIdentifyTimeout = std::chrono::seconds(60);

}  // namespace

struct Transport::Arrival {
  std::unique_ptr<fabric::RecvComm> comm;
  int listen = -1;
  std::vector<uint8_t> buffer = std::vector<uint8_t>(kIdentifyBytes);
  fabric::Registration* registration = nullptr;
  fabric::Request* request = nullptr;
  Clock::time_point since = Clock::now();
};

Transport::Transport() = default;

Transport::~Transport() {
  const std::vector<int> connected = connected_peers();
  if (nranks_ > 1)
    KZ_INFO(kLogColl, "{}: connected {} of {} peer(s){}{}", where_, connected.size(), nranks_ - 1,
            connected.empty() ? std::string() : fmt::format(" ({})", RankList(connected)),
            connected_back_ == 0
                ? std::string()
                : fmt::format("; sent to {} of them over the connection the peer made (both ways on one)",
                              connected_back_));
  // Comms first: their registrations (and any mapping of the staging fd a fabric keeps) must go
  // before the memory they describe.
  arrivals_.clear();
  peers_.clear();
  listens_.clear();
  how_.reset();
  p2p_.reset();
  staging_.reset();
  retired_.clear();
}

bool Transport::reachable(int q) const {
  return q >= 0 && q < nranks_ && q != rank_ && !routes_.empty() && routes_[static_cast<size_t>(q)].fabric >= 0;
}

std::string_view Transport::FabricOf(int q) const {
  if (q < 0 || q >= nranks_) return "";
  const Route& r = routes_[static_cast<size_t>(q)];
  return r.fabric < 0 ? std::string_view() : fabrics_[static_cast<size_t>(r.fabric)]->name();
}

std::string Transport::Named(int q) const {
  const Route& r = routes_[static_cast<size_t>(q)];
  if (r.fabric < 0) return fmt::format("rank {}", q);
  return fmt::format("rank {} ({})", q, fabrics_[static_cast<size_t>(r.fabric)]->name());
}

Transport::Peer& Transport::EnsurePeer(int q) {
  std::unique_ptr<Peer>& p = peers_[static_cast<size_t>(q)];
  if (p == nullptr) {
    p = std::make_unique<Peer>();
    p->rank = q;
    p->fabric = fabrics_[static_cast<size_t>(routes_[static_cast<size_t>(q)].fabric)];
  }
  return *p;
}

void Transport::MarkConnected(int q) {
  std::lock_guard lock(mu_);
  auto at = std::lower_bound(connected_.begin(), connected_.end(), q);
  if (at == connected_.end() || *at != q) connected_.insert(at, q);
}

std::vector<int> Transport::connected_peers() const {
  std::lock_guard lock(mu_);
  return connected_;
}

std::string Transport::description() const {
  std::lock_guard lock(mu_);
  if (nranks_ == 1) return host_staging_ ? fmt::format("{}; staging {}", groups_, staging_text_) : groups_;
  return fmt::format("{}; staging {}", groups_, staging_text_);
}

// Control buffers: host memory, which every fabric registers; the staging buffer the way decided.
Status Transport::RegisterBuffers(Peer& p, bool send) {
  fabric::Comm& comm = send ? static_cast<fabric::Comm&>(*p.send) : static_cast<fabric::Comm&>(*p.recv);
  std::vector<uint8_t>& control = send ? p.control_out : p.control_in;
  control.assign(control_bytes_, 0);
  auto reg = comm.Register(fabric::MemoryDescriptor::Host(control.data(), control.size()));
  if (!reg.ok())
    return reg.status().WithContext(
        fmt::format("{}: registering the control buffer {} rank {}", where_, send ? "to" : "from", p.rank));
  (send ? p.send_control : p.recv_control) = *reg;
  KZ_ASSIGN_OR_RETURN(fabric::Registration * staging, RegisterStaging(comm, p.rank));
  (send ? p.send_staging : p.recv_staging) = staging;
  if (p2p_ != nullptr) {
    KZ_ASSIGN_OR_RETURN(fabric::Registration * p2p, RegisterStaging(comm, p.rank, /*p2p=*/true));
    (send ? p.send_p2p : p.recv_p2p) = p2p;
  }
  return Status::Ok();
}

Result<bool> Transport::Connect(int q, bool peer_connects) {
  if (!reachable(q))
    return InvalidArgument(fmt::format("{}: no fabric reaches rank {}{}", where_, q,
                                       q == rank_ ? " (this rank itself)" : ""));
  const auto at = static_cast<size_t>(q);
  Peer* existing = peers_[at].get();
  if (existing != nullptr && existing->send != nullptr) return true;
  if (closed_) return Aborted(fmt::format("{}: closed after a failure; no connection to rank {}", where_, q));
  const Route& route = routes_[at];
  fabric::Fabric& fab = *fabrics_[static_cast<size_t>(route.fabric)];
  const fabric::Handle& handle = offers_[static_cast<size_t>(route.offer)];
  auto failed = [&](const Status& s) {
    auto props = fab.properties(route.connect_dev);
    return s.WithContext(
        fmt::format("{}: connecting to rank {} from {} {}", where_, q, fab.name(), props.ok() ? props->name : "?"));
  };
  std::unique_ptr<fabric::SendComm> comm;
  if (existing != nullptr && existing->recv != nullptr && !one_way_[at]) {
    // Over the peer's connection (Fabric::ConnectBack).
    auto back = fab.ConnectBack(route.connect_dev, handle, *existing->recv);
    if (back.ok() && *back == nullptr) return false;
    if (back.ok()) {
      comm = std::move(back).value();
      ++connected_back_;
    } else if (back.status().code() == StatusCode::kNotSupported) {
      one_way_[at] = true;
    } else {
      return failed(back.status());
    }
  } else if (peer_connects && q < rank_ && !one_way_[at] && fab.ConnectsBack(route.connect_dev)) {
    // The lower rank connects; this one sends over that connection once it is here (Poll).
    const auto now = Clock::now();
    if (awaiting_since_[at] == Clock::time_point()) awaiting_since_[at] = now;
    if (now - awaiting_since_[at] < kAwaitPeer) return false;
    KZ_INFO(kLogColl, "{}: rank {} did not connect within {} s; connecting to it", where_, q, kAwaitPeer.count());
    one_way_[at] = true;
  }
  if (comm == nullptr) {
    auto send = fab.Connect(route.connect_dev, handle);
    if (!send.ok()) return failed(send.status());
    if (*send == nullptr) return false;
    comm = std::move(send).value();
  }
  Peer& p = EnsurePeer(q);
  p.send = std::move(comm);
  if (Status s = RegisterBuffers(p, /*send=*/true); !s.ok()) {
    p.send.reset();
    return s;
  }
  // The first message says who connected: the listen comm serves other peers too.
  std::vector<uint8_t> identity(std::begin(kIdentifyMagic), std::end(kIdentifyMagic));
  wire::PutU32(identity, kIdentifyVersion);
  wire::PutI32(identity, rank_);
  wire::PutI32(identity, nranks_);
  p.identity = std::move(identity);
  KZ_ASSIGN_OR_RETURN(p.send_identity,
                      p.send->Register(fabric::MemoryDescriptor::Host(p.identity.data(), p.identity.size())));
  KZ_ASSIGN_OR_RETURN(p.identify, p.send->Send(p.identity.data(), p.identity.size(), kIdentifyTag, p.send_identity));
  // A fresh comm has room for one send; should it not, Poll posts it.
  identifying_.push_back(q);
  MarkConnected(q);
  KZ_TRACE(kLogColl, "{}: connected to rank {}: {}", where_, q, p.send->label());
  return true;
}

Result<bool> Transport::Identify(Arrival& a, bool& got_peer) {
  const Listen& listen = listens_[static_cast<size_t>(a.listen)];
  const std::string on = fmt::format("{} {}", fabrics_[static_cast<size_t>(listen.fabric)]->name(),
                                     listen.comm->properties().name);
  if (a.request == nullptr) {
    KZ_ASSIGN_OR_RETURN(a.registration,
                        a.comm->Register(fabric::MemoryDescriptor::Host(a.buffer.data(), a.buffer.size())));
    KZ_ASSIGN_OR_RETURN(a.request, a.comm->Recv(a.buffer.data(), a.buffer.size(), kIdentifyTag, a.registration));
    if (a.request == nullptr) return false;  // busy: try again
  }
  auto c = a.comm->Test(a.request);
  if (!c.ok()) {
    KZ_INFO(kLogColl, "{}: a connection on {} ended before it said who made it: {}", where_, on, c.status().message());
    return true;
  }
  if (!c->done) {
    if (Clock::now() - a.since < kIdentifyTimeout) return false;
    KZ_WARN(kLogColl, "{}: dropped a connection on {} that did not say who made it within {} s", where_, on,
            std::chrono::duration_cast<std::chrono::seconds>(kIdentifyTimeout).count());
    return true;
  }
  a.request = nullptr;
  wire::Reader in(std::span<const uint8_t>(a.buffer.data(), c->size));
  const bool magic = std::ranges::equal(in.Take(sizeof kIdentifyMagic), kIdentifyMagic);
  const uint32_t version = in.U32();
  const int q = in.I32();
  const int n = in.I32();
  std::string wrong;
  if (!in.ok() || !magic || version != kIdentifyVersion)
    wrong = "its first message is not a kizuna transport's (another version?)";
  else if (n != nranks_)
    wrong = fmt::format("it comes from a communicator of {} ranks, this one has {}", n, nranks_);
  else if (!reachable(q))
    wrong = fmt::format("it says it is rank {}, which does not connect to this rank", q);
  else if (routes_[static_cast<size_t>(q)].listen != a.listen)
    wrong = fmt::format("it says it is rank {}, whose connections arrive on another device", q);
  else if (peers_[static_cast<size_t>(q)] != nullptr && peers_[static_cast<size_t>(q)]->recv != nullptr)
    wrong = fmt::format("it says it is rank {}, which is connected already", q);
  if (!wrong.empty()) {
    KZ_WARN(kLogColl, "{}: dropped a connection on {} ({}): {}", where_, on, a.comm->label(), wrong);
    return true;
  }
  if (Status s = a.comm->Deregister(a.registration); !s.ok())
    return s.WithContext(fmt::format("{}: the connection from rank {}", where_, q));
  a.registration = nullptr;
  Peer& p = EnsurePeer(q);
  p.recv = std::move(a.comm);
  if (Status s = RegisterBuffers(p, /*send=*/false); !s.ok()) {
    p.recv.reset();  // the peer's transfers fail (kRemoteError); this rank reports why
    return s;
  }
  receiving_from_.push_back(q);
  MarkConnected(q);
  got_peer = true;
  KZ_TRACE(kLogColl, "{}: accepted rank {}: {}", where_, q, p.recv->label());
  return true;
}

Result<bool> Transport::Poll(std::span<const int> expecting) {
  // The listen comms the expected peers connect to, then the next few of the others in turn: a rank
  // with a port per peer has a listen comm per peer, and looking at every one on every call would
  // cost each rank time in proportion to the communicator's ranks.
  std::vector<size_t>& look = poll_scratch_;
  look.clear();
  for (int q : expecting)
    if (reachable(q)) look.push_back(static_cast<size_t>(routes_[static_cast<size_t>(q)].listen));
  for (size_t i = 0; i < std::min(kPollEach, listens_.size()); ++i) {
    look.push_back(poll_cursor_ % listens_.size());
    ++poll_cursor_;
  }
  std::sort(look.begin(), look.end());
  look.erase(std::unique(look.begin(), look.end()), look.end());
  for (size_t l : look) {
    while (true) {
      auto recv = listens_[l].comm->Accept();
      if (!recv.ok())
        return recv.status().WithContext(fmt::format("{}: accepting a connection on {} {}", where_,
                                                     fabrics_[static_cast<size_t>(listens_[l].fabric)]->name(),
                                                     listens_[l].comm->properties().name));
      if (*recv == nullptr) break;
      auto a = std::make_unique<Arrival>();
      a->comm = std::move(recv).value();
      a->listen = static_cast<int>(l);
      arrivals_.push_back(std::move(a));
    }
  }
  bool got_peer = false;
  for (auto it = arrivals_.begin(); it != arrivals_.end();) {
    Result<bool> finished = Identify(**it, got_peer);
    if (!finished.ok()) {
      arrivals_.erase(it);
      return finished.status();
    }
    it = *finished ? arrivals_.erase(it) : std::next(it);
  }
  // Identifying messages delivered: their requests released (they count against the comm's
  // requests in flight).
  for (auto it = identifying_.begin(); it != identifying_.end();) {
    Peer& p = *peers_[static_cast<size_t>(*it)];
    if (p.send == nullptr) {
      it = identifying_.erase(it);
      continue;
    }
    if (p.identify == nullptr) {
      KZ_ASSIGN_OR_RETURN(p.identify,
                          p.send->Send(p.identity.data(), p.identity.size(), kIdentifyTag, p.send_identity));
      if (p.identify == nullptr) {
        ++it;
        continue;
      }
    }
    auto c = p.send->Test(p.identify);
    if (!c.ok()) {
      // The peer is gone before it took the message: what the executor's transfers to it will say.
      p.identify = nullptr;
      it = identifying_.erase(it);
      continue;
    }
    if (!c->done) {
      ++it;
      continue;
    }
    p.identify = nullptr;
    it = identifying_.erase(it);
  }
  return got_peer;
}

Status Transport::WaitConnected(std::span<const int> to, std::span<const int> from, Deadline deadline) {
  constexpr auto kMinSleep = std::chrono::microseconds(20);
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  auto sleep = kMinSleep;
  for (;;) {
    bool progressed = false;
    std::vector<int> no_send, no_recv;
    for (int q : to) KZ_RETURN_IF_ERROR(Connect(q, std::find(from.begin(), from.end(), q) != from.end()).status());
    KZ_ASSIGN_OR_RETURN(progressed, Poll(from));
    // A connection is there when the peer has taken its first message: on a fabric whose sends
    // move as the sender progresses (directconnect's), the message waits for this rank, which
    // stops progressing its comms when it returns.
    for (int q : to) {
      const Peer* p = peers_[static_cast<size_t>(q)].get();
      const bool identifying = std::find(identifying_.begin(), identifying_.end(), q) != identifying_.end();
      if (p == nullptr || p->send == nullptr || identifying) no_send.push_back(q);
    }
    for (int q : from)
      if (peers_[static_cast<size_t>(q)] == nullptr || peers_[static_cast<size_t>(q)]->recv == nullptr)
        no_recv.push_back(q);
    if (no_send.empty() && no_recv.empty()) return Status::Ok();
    if (deadline.Expired()) {
      std::string missing;
      if (!no_send.empty()) missing += fmt::format("no connection to {}", RankList(no_send));
      if (!no_recv.empty())
        missing += fmt::format("{}no connection from {}", missing.empty() ? "" : ", ", RankList(no_recv));
      std::vector<std::string> fabrics;
      for (int q : no_send.empty() ? no_recv : no_send) {
        const std::string name = fabrics_[static_cast<size_t>(routes_[static_cast<size_t>(q)].fabric)]->name();
        if (std::find(fabrics.begin(), fabrics.end(), name) == fabrics.end()) fabrics.push_back(name);
      }
      return Timeout(fmt::format("{}: {} by the deadline (over {})", where_, missing,
                                 transport_internal::NameList(fabrics)));
    }
    if (progressed) {
      sleep = kMinSleep;
      continue;
    }
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(sleep, deadline.Remaining()));
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

void Transport::Close() {
  arrivals_.clear();
  identifying_.clear();
  receiving_from_.clear();
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    p->identify = nullptr;
    p->send.reset();
    p->recv.reset();
    p->send_staging = p->recv_staging = p->send_p2p = p->recv_p2p = nullptr;
    p->send_control = p->recv_control = p->send_identity = nullptr;
  }
  listens_.clear();
  closed_ = true;
}

Status Transport::ConnectAll(Deadline deadline) {
  std::vector<int> all;
  for (int q = 0; q < nranks_; ++q)
    if (reachable(q)) all.push_back(q);
  return WaitConnected(all, all, deadline);
}

}  // namespace kizuna::collectives
