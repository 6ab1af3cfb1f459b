#include "fabric/tcp/endpoint.h"

#include <arpa/inet.h>
#include <linux/pkt_sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fabric/tcp/relay.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::tcp {
namespace {

using Clock = std::chrono::steady_clock;

// A receiving end's sockets send only posts (and the kernel's acknowledgements): small frames a
// sender waits for before it writes a large message. At interactive priority they leave before
// bulk data queued on the same interface (another connection's, going the other way): a
// priority-banded queue (pfifo_fast, the default qdisc) takes them first. Without that, a cable
// used both ways held each post behind up to tcp_limit_output_bytes (4 MiB) of the other
// direction's data, and a ring going both ways round 4 hosts on 0.5 Gb/s cables reached 82 % of
// what they allow instead of 96 % (fabric/tcp/README.md). Best effort: a kernel that refuses
// leaves the default priority.
void PostsFirst(int fd) {
  const int interactive = TC_PRIO_INTERACTIVE;
  ::setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &interactive, sizeof interactive);
}

// Constant time: how long the comparison takes says nothing about where a guess went wrong.
bool SameSecret(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

std::string LocalAndPeer(int fd, const char* arrow) {
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof local, pl = sizeof peer;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll);
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl);
  return fmt::format("{}{}{}", DescribeAddress(local), arrow, DescribeAddress(peer));
}

// A connection's label: its first stream's ends, and those of the first stream on every other pair
// of addresses (a bundle's further cables).
std::string StreamsLabel(const std::vector<UniqueFd>& fds, const char* arrow) {
  std::string label;
  std::vector<std::pair<std::string, std::string>> seen;
  for (const UniqueFd& fd : fds) {
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &ll);
    ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &pl);
    auto host = [](sockaddr_storage a) {
      if (a.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&a)->sin_port = 0;
      if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&a)->sin6_port = 0;
      return DescribeAddress(a);
    };
    const std::pair<std::string, std::string> ends{host(local), host(peer)};
    if (std::find(seen.begin(), seen.end(), ends) != seen.end()) continue;
    seen.push_back(ends);
    label += (label.empty() ? "" : ", ") + LocalAndPeer(fd.get(), arrow);
  }
  return label;
}

Status PollFor(std::vector<pollfd>& fds, Deadline deadline) {
  const auto limit = std::min<std::chrono::nanoseconds>(deadline.Remaining(), kMaxBlock);
  if (limit.count() <= 0) return Status::Ok();
  timespec ts{static_cast<time_t>(limit.count() / 1000000000), static_cast<long>(limit.count() % 1000000000)};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) < 0 && errno != EINTR) return FromErrno(errno, "tcp: ppoll");
  return Status::Ok();
}

}  // namespace

socklen_t LengthOf(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

Result<UniqueFd> NewSocket(int family) {
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return FromErrno(errno, "tcp: socket");
  return fd;
}

// Small messages leave at once: no Nagle delay behind a frame that is not acknowledged yet.
Status NoDelay(int fd) {
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    return FromErrno(errno, "tcp: setsockopt(TCP_NODELAY)");
  return Status::Ok();
}

// ---- Handles ----

Handle EncodeHandle(const WireHandle& h, const std::vector<WireCable>& more) {
  Handle out;
  out.size = static_cast<uint32_t>(sizeof h + more.size() * sizeof(WireCable));
  std::memcpy(out.data.data(), &h, sizeof h);
  for (size_t i = 0; i < more.size(); ++i)
    std::memcpy(out.data.data() + sizeof h + i * sizeof(WireCable), &more[i], sizeof(WireCable));
  return out;
}

Result<WireHandle> DecodeHandle(const Handle& handle, std::vector<WireCable>* more) {
  WireHandle h;
  if (handle.size < sizeof h || handle.size > Handle::kMax || (handle.size - sizeof h) % sizeof(WireCable) != 0)
    return InvalidArgument(
        fmt::format("tcp: a handle of {} bytes is not a tcp handle ({} bytes, and {} per further "
                    "cable of a bundle)",
                    handle.size, sizeof h, sizeof(WireCable)));
  std::memcpy(&h, handle.data.data(), sizeof h);
  if (more != nullptr) {
    more->resize((handle.size - sizeof h) / sizeof(WireCable));
    for (size_t i = 0; i < more->size(); ++i)
      std::memcpy(&(*more)[i], handle.data.data() + sizeof h + i * sizeof(WireCable), sizeof(WireCable));
    for (const WireCable& c : *more)
      if (c.port == 0) return InvalidArgument("tcp: the handle names port 0 for a cable of its bundle");
  }
  if (h.magic != kHandleMagic) return InvalidArgument("tcp: the handle is not a handle of the tcp fabric");
  if (h.byte_order != kByteOrderMark) return InvalidArgument("tcp: the handle comes from a host of another byte order");
  if (h.version != kProtocolVersion)
    return InvalidArgument(
        fmt::format("tcp: the handle is of protocol version {} (this build speaks {})", h.version, kProtocolVersion));
  if (h.family != AF_INET && h.family != AF_INET6)
    return InvalidArgument(fmt::format("tcp: the handle names address family {}", h.family));
  if (h.port == 0) return InvalidArgument("tcp: the handle names port 0");
  return h;
}

sockaddr_storage AddressOf(const WireHandle& h, const WireCable& c) {
  WireHandle w = h;
  w.port = c.port;
  w.address = c.address;
  return AddressOf(w);
}

sockaddr_storage AddressOf(const WireHandle& h) {
  sockaddr_storage a{};
  if (h.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    in->sin_family = AF_INET;
    in->sin_port = htons(h.port);
    std::memcpy(&in->sin_addr, h.address.data(), 4);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(h.port);
    std::memcpy(&in6->sin6_addr, h.address.data(), 16);
  }
  return a;
}

std::string DescribeAddress(const sockaddr_storage& a) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return fmt::format("{}:{}", text, ntohs(in->sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return fmt::format("[{}]:{}", text, ntohs(in6->sin6_port));
  }
  return "?";
}

// ---- Listening and accepting ----

Result<std::unique_ptr<TcpListenComm>> TcpListenComm::Create(const DeviceAddress& device, Hub& hub, Relays* relays) {
  const int family = device.address.ss_family;
  WireHandle w;
  w.family = static_cast<uint16_t>(family);
  std::vector<WireCable> more;
  std::vector<UniqueFd> fds;
  std::string where;
  for (int i = 0; i < device.cables(); ++i) {  // a socket on each cable of a bundle
    const sockaddr_storage& address = i == 0 ? device.address : device.more[static_cast<size_t>(i - 1)];
    KZ_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket(family));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), LengthOf(address)) != 0)
      return FromErrno(errno, fmt::format("tcp: bind to {}", DescribeAddress(address)));
    if (::listen(fd.get(), 128) != 0) return FromErrno(errno, "tcp: listen");
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0)
      return FromErrno(errno, "tcp: getsockname");
    WireCable c;
    if (family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&bound);
      c.port = ntohs(in->sin_port);
      std::memcpy(c.address.data(), &in->sin_addr, 4);
    } else {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&bound);
      c.port = ntohs(in6->sin6_port);
      std::memcpy(c.address.data(), &in6->sin6_addr, 16);
    }
    if (i == 0) {
      w.port = c.port;
      w.address = c.address;
    } else {
      more.push_back(c);
    }
    where += (where.empty() ? "" : ", ") + DescribeAddress(bound);
    fds.push_back(std::move(fd));
  }
  KZ_RETURN_IF_ERROR(RandomBytes(w.secret.data(), w.secret.size()));
  KZ_INFO(kLogFabric, "tcp: listening on {} ({})", where, device.properties.name);
  return std::unique_ptr<TcpListenComm>(
      new TcpListenComm(device.properties, EncodeHandle(w, more), w, std::move(fds), hub, relays));
}

void TcpListenComm::ReadHellos() {
  const auto now = Clock::now();
  for (size_t i = 0; i < incoming_.size();) {
    Incoming& in = incoming_[i];
    bool drop = false;
    std::string why;
    while (in.got < sizeof in.hello) {
      const ssize_t k =
          ::recv(in.fd.get(), reinterpret_cast<uint8_t*>(&in.hello) + in.got, sizeof in.hello - in.got, MSG_DONTWAIT);
      if (k > 0) {
        in.got += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drop = true;
      why = k == 0 ? "closed before its hello was complete" : std::strerror(errno);
      break;
    }
    if (!drop && in.got < sizeof in.hello && now - in.since > kHelloTimeout) {
      drop = true;
      why = "sent no complete hello within the time allowed";
    }
    if (!drop && in.got == sizeof in.hello && in.hello.magic == kRelayMagic) {
      why = ReadRelay(in);
      if (why.empty() && now - in.since > kHelloTimeout) why = "sent no complete relay hello within the time allowed";
      if (why == "relayed") {
        incoming_.erase(incoming_.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      drop = !why.empty();
    } else if (!drop && in.got == sizeof in.hello) {
      const Hello& h = in.hello;
      if (h.magic != kHelloMagic || h.byte_order != kByteOrderMark || h.version != kProtocolVersion) {
        drop = true;
        why = "sent something that is not a hello of this protocol version";
      } else if (!SameSecret(h.secret, wire_.secret)) {
        drop = true;
        why = "did not know the handle's secret";
      } else if (h.streams < 1 || h.streams > kMaxStreams || h.stream >= h.streams) {
        drop = true;
        why = fmt::format("announced stream {} of {}", h.stream, h.streams);
      } else {
        Gathering& group = gathering_[h.nonce];
        if (group.fds.empty()) {
          group.fds.resize(h.streams);
          group.flags = h.flags;
        }
        if (group.fds.size() != h.streams || group.flags != h.flags || group.fds[h.stream].valid()) {
          drop = true;
          why = "repeated a stream of a connection, or changed its number of streams or its flags";
        } else {
          group.fds[h.stream] = std::move(in.fd);
          incoming_.erase(incoming_.begin() + static_cast<ptrdiff_t>(i));
          continue;
        }
      }
    }
    if (drop) {
      KZ_WARN(kLogFabric, "tcp: {}: an incoming connection {}; it was closed", properties().name, why);
      incoming_.erase(incoming_.begin() + static_cast<ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
}

std::string TcpListenComm::ReadRelay(Incoming& in) {
  RelayHello r;
  std::memcpy(static_cast<void*>(&r), static_cast<const void*>(&in.hello), sizeof r);
  if (r.byte_order != kByteOrderMark || r.version != kProtocolVersion)
    return "sent a relay hello of another protocol version";
  if (!SameSecret(r.secret, wire_.secret)) return "asked to be relayed without the handle's secret";
  if (relays_ == nullptr) return "asked to be relayed, which this listener does not do";
  if (r.onward_size == 0 || r.onward_size > Handle::kMax)
    return fmt::format("asked to be relayed to a handle of {} bytes", r.onward_size);
  in.onward.size = r.onward_size;
  while (in.onward_got < in.onward.size) {
    const ssize_t k =
        ::recv(in.fd.get(), in.onward.data.data() + in.onward_got, in.onward.size - in.onward_got, MSG_DONTWAIT);
    if (k > 0) {
      in.onward_got += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return "";
    return k == 0 ? "closed before its relay hello was complete" : std::strerror(errno);
  }
  const std::string where = fmt::format("{}", LocalAndPeer(in.fd.get(), "<-"));
  if (Status s = relays_->Start(std::move(in.fd), r.out_device, in.onward, where); !s.ok())
    return fmt::format("asked to be relayed, which failed: {}", s.message());
  return "relayed";
}

Result<std::unique_ptr<RecvComm>> TcpListenComm::DoAccept() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const UniqueFd& listening : fds_)
    while (true) {
      UniqueFd fd(::accept4(listening.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) break;
        return FromErrno(errno, fmt::format("tcp: accept on {}", properties().name));
      }
      KZ_RETURN_IF_ERROR(NoDelay(fd.get()));
      PostsFirst(fd.get());
      incoming_.push_back(Incoming{std::move(fd), Hello{}, 0, Clock::now(), Handle{}, 0});
    }
  ReadHellos();
  for (auto it = gathering_.begin(); it != gathering_.end(); ++it) {
    Gathering& group = it->second;
    if (!std::all_of(group.fds.begin(), group.fds.end(), [](const UniqueFd& f) { return f.valid(); })) continue;
    const uint64_t nonce = it->first;
    const uint32_t flags = group.flags;
    std::vector<UniqueFd> fds = std::move(group.fds);
    gathering_.erase(it);
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<RecvComm> comm, Accepted(nonce, flags, std::move(fds)));
    if (comm != nullptr) return comm;
  }
  return std::unique_ptr<RecvComm>();
}

Result<std::unique_ptr<RecvComm>> TcpListenComm::Accepted(uint64_t nonce, uint32_t flags, std::vector<UniqueFd> fds) {
  auto welcome = [&]() -> Status {
    for (size_t s = 0; s < fds.size(); ++s) {
      // A fresh socket's buffer takes 16 bytes at once.
      const Welcome w{kWelcomeMagic, static_cast<uint32_t>(s), nonce};
      if (::send(fds[s].get(), &w, sizeof w, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof w))
        return RemoteError(
            fmt::format("tcp: {}: the connecting side went away during the handshake", properties().name));
    }
    return Status::Ok();
  };
  if ((flags & kHelloBack) == 0) {
    KZ_RETURN_IF_ERROR(welcome());
    const std::string label =
        fmt::format("tcp:{} {} ({} streams)", properties().name, StreamsLabel(fds, "<-"), fds.size());
    const bool two_way = (flags & kHelloTwoWay) != 0 && !properties().point_to_point;
    // The posts go back on the sender's first bulk stream where stream 0 carries this side's
    // messages too (a two-way connection), else on stream 0.
    const int post_stream = two_way && fds.size() > 1 ? 1 : 0;
    auto c = std::make_shared<Connection>(std::move(fds), label, /*sending=*/false, hub_, nonce, two_way);
    return std::unique_ptr<RecvComm>(new TcpRecvComm(label, properties(), std::move(c), post_stream));
  }
  // The way back of a connection this side made: its stream 0 and these sockets. The comm joins
  // the connection before the welcomes go: the peer sends as soon as it has them.
  std::shared_ptr<Connection> c = hub_.FindTwoWay(nonce);
  if (c == nullptr) {
    KZ_WARN(kLogFabric,
            "tcp: {}: the way back of a connection that is gone or never went both ways arrived; it was closed",
            properties().name);
    return std::unique_ptr<RecvComm>();
  }
  const std::string label = fmt::format("tcp:{} {} ({} streams, the small messages on the connection to it)",
                                        properties().name, StreamsLabel(fds, "<-"), fds.size());
  // Its posts go back on the first of these sockets (the peer's first bulk stream).
  int first = 0;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    first = c->link().streams();
  }
  auto comm = std::make_unique<TcpRecvComm>(label, properties(), c, first);
  std::lock_guard<std::mutex> lock(c->mu);
  if (!c->link().broken().ok()) return std::unique_ptr<RecvComm>();  // the sockets close: the peer fails
  // The welcome goes first on each socket, ahead of anything the link could write there (this
  // side only reads them).
  KZ_RETURN_IF_ERROR(welcome());
  c->link().AddStreams(std::move(fds), /*bulk_in=*/true);
  return std::unique_ptr<RecvComm>(std::move(comm));
}

Status TcpListenComm::DoWaitAcceptable(Deadline deadline) {
  std::vector<pollfd> fds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const UniqueFd& listening : fds_) fds.push_back(pollfd{listening.get(), POLLIN, 0});
    for (const Incoming& in : incoming_) fds.push_back(pollfd{in.fd.get(), POLLIN, 0});
  }
  return PollFor(fds, deadline);
}

// ---- Connecting ----

Result<std::shared_ptr<PendingConnect>> PendingConnect::Start(const DeviceAddress& device, const Handle& handle,
                                                              int streams, Hub& hub) {
  if (IsForward(handle)) {
    // Through relays (relay.h): every stream to the first relay, over the cable its handle names
    // first; each starts with the relay hello, then the target's hello.
    KZ_ASSIGN_OR_RETURN(Forwarding f, DecodeForward(handle));
    std::shared_ptr<PendingConnect> p(new PendingConnect(device, hub));
    p->wire_ = f.target;
    p->prefix_ = RelayPrefix(f);
    KZ_RETURN_IF_ERROR(RandomBytes(&p->nonce_, sizeof p->nonce_));
    const sockaddr_storage& local = CableToFirst(device);
    for (int s = 0; s < streams; ++s) {
      p->peers_.push_back(f.first.address);
      KZ_ASSIGN_OR_RETURN(UniqueFd fd, p->Open(local, s));
      p->streams_.push_back(StreamState{std::move(fd), Phase::kConnecting, Welcome{}, 0});
    }
    return p;
  }
  std::vector<WireCable> more;
  KZ_ASSIGN_OR_RETURN(WireHandle w, DecodeHandle(handle, &more));
  if (static_cast<int>(more.size()) + 1 != device.cables())
    return InvalidArgument(
        fmt::format("tcp: {} bundles {} cable(s) to its peer, whose handle lists {} (do both ends "
                    "load the same topology?)",
                    device.properties.name, device.cables(), more.size() + 1));
  std::shared_ptr<PendingConnect> p(new PendingConnect(device, hub));
  p->wire_ = w;
  KZ_RETURN_IF_ERROR(RandomBytes(&p->nonce_, sizeof p->nonce_));
  // Over a switched network the other direction may join this connection (README.md, "Both
  // directions"): stream 0 for the small messages and posts, then `streams` for the large ones.
  if (!device.properties.point_to_point && streams < kMaxStreams) {
    p->flags_ = kHelloTwoWay;
    ++streams;
  }
  for (int s = 0; s < streams; ++s) {
    // Stream s on cable s mod cables, from this end's address to the peer's end of that cable.
    const int cable = s % device.cables();
    const sockaddr_storage& local = cable == 0 ? device.address : device.more[static_cast<size_t>(cable - 1)];
    const int theirs = device.at_peer.empty() ? 0 : device.at_peer[static_cast<size_t>(cable)];
    p->peers_.push_back(theirs == 0 ? AddressOf(w) : AddressOf(w, more[static_cast<size_t>(theirs - 1)]));
    KZ_ASSIGN_OR_RETURN(UniqueFd fd, p->Open(local, s));
    p->streams_.push_back(StreamState{std::move(fd), Phase::kConnecting, Welcome{}, 0});
  }
  return p;
}

Result<std::shared_ptr<PendingConnect>> PendingConnect::StartBack(const DeviceAddress& device, const Handle& handle,
                                                                  int streams, Hub& hub,
                                                                  std::shared_ptr<Connection> back) {
  KZ_ASSIGN_OR_RETURN(WireHandle w, DecodeHandle(handle));
  std::shared_ptr<PendingConnect> p(new PendingConnect(device, hub));
  p->wire_ = w;
  p->nonce_ = back->nonce();
  p->flags_ = kHelloBack;
  p->back_ = std::move(back);
  for (int s = 0; s < streams; ++s) {
    p->peers_.push_back(AddressOf(w));
    KZ_ASSIGN_OR_RETURN(UniqueFd fd, p->Open(device.address, s));
    p->streams_.push_back(StreamState{std::move(fd), Phase::kConnecting, Welcome{}, 0});
  }
  return p;
}

Result<UniqueFd> PendingConnect::Open(const sockaddr_storage& local, int stream) {
  const sockaddr_storage& peer = peers_[static_cast<size_t>(stream)];
  KZ_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket(peer.ss_family));
  KZ_RETURN_IF_ERROR(NoDelay(fd.get()));
  // A cable's port sends from its own address: its interface is the only way to the other end.
  if (device_.properties.point_to_point &&
      ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&local), LengthOf(local)) != 0)
    return FromErrno(errno, fmt::format("tcp: bind to {} ({})", DescribeAddress(local), device_.properties.name));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&peer), LengthOf(peer)) != 0 && errno != EINPROGRESS) {
    if (errno == ECONNREFUSED)
      return RemoteError(
          fmt::format("tcp: connecting to {}: connection refused (the listener is gone)", DescribeAddress(peer)));
    return FromErrno(errno, fmt::format("tcp: connect to {}", DescribeAddress(peer)));
  }
  return fd;
}

Status PendingConnect::Advance(StreamState& s, int index) {
  if (s.phase == Phase::kConnecting) {
    pollfd pfd{s.fd.get(), POLLOUT, 0};
    if (::poll(&pfd, 1, 0) <= 0) return Status::Ok();
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(s.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == ECONNREFUSED)
      return RemoteError(fmt::format("tcp: connecting to {}: connection refused (the listener is gone)",
                                     DescribeAddress(peers_[static_cast<size_t>(index)])));
    if (err != 0)
      return FromErrno(err, fmt::format("tcp: connect to {}", DescribeAddress(peers_[static_cast<size_t>(index)])));
    Hello h;
    h.secret = wire_.secret;
    h.nonce = nonce_;
    h.stream = static_cast<uint16_t>(index);
    h.streams = static_cast<uint16_t>(streams_.size());
    h.flags = flags_;
    // Through relays, the relay hello first (a fresh socket's buffer takes both at once).
    std::vector<uint8_t> out = prefix_;
    out.resize(prefix_.size() + sizeof h);
    std::memcpy(out.data() + prefix_.size(), &h, sizeof h);
    const ssize_t k = ::send(s.fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k != static_cast<ssize_t>(out.size()))
      return RemoteError(fmt::format("tcp: {}: the listener went away during the handshake",
                                     DescribeAddress(peers_[static_cast<size_t>(index)])));
    s.phase = Phase::kHelloSent;
  }
  if (s.phase == Phase::kHelloSent) {
    while (s.got < sizeof s.welcome) {
      const ssize_t k =
          ::recv(s.fd.get(), reinterpret_cast<uint8_t*>(&s.welcome) + s.got, sizeof s.welcome - s.got, MSG_DONTWAIT);
      if (k > 0) {
        s.got += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Ok();
      return RemoteError(
          fmt::format("tcp: {} closed the connection during the handshake (a handle of a listener "
                      "that was closed, or one whose secret did not match{})",
                      DescribeAddress(peers_[static_cast<size_t>(index)]),
                      prefix_.empty() ? "" : "; or a relaying rank that could not go on: its log says why"));
    }
    if (s.welcome.magic != kWelcomeMagic || s.welcome.nonce != nonce_ ||
        s.welcome.stream != static_cast<uint32_t>(index))
      return RemoteError(fmt::format("tcp: {} answered the hello with something that is not its welcome",
                                     DescribeAddress(peers_[static_cast<size_t>(index)])));
    s.phase = Phase::kWelcomed;
  }
  return Status::Ok();
}

Result<std::unique_ptr<SendComm>> PendingConnect::Poll() {
  bool all = true;
  for (size_t i = 0; i < streams_.size(); ++i) {
    KZ_RETURN_IF_ERROR(Advance(streams_[i], static_cast<int>(i)));
    all = all && streams_[i].phase == Phase::kWelcomed;
  }
  if (!all) return std::unique_ptr<SendComm>();
  std::vector<UniqueFd> fds;
  for (StreamState& s : streams_) fds.push_back(std::move(s.fd));
  const int n = static_cast<int>(fds.size());
  if (back_ != nullptr) {
    // The way back: these sockets join the peer's connection, for this side's large messages.
    const std::string label = fmt::format("tcp:{} {} ({} streams, the small messages on the connection from it)",
                                          device_.properties.name, StreamsLabel(fds, "->"), n);
    std::vector<int> bulk;
    {
      std::lock_guard<std::mutex> lock(back_->mu);
      KZ_RETURN_IF_ERROR(back_->link().broken());
      for (int i = 0; i < n; ++i) bulk.push_back(back_->link().streams() + i);
      back_->link().AddStreams(std::move(fds), /*bulk_in=*/false);
    }
    return std::unique_ptr<SendComm>(new TcpSendComm(label, device_.properties, back_, std::move(bulk)));
  }
  const std::string label = fmt::format("tcp:{} {} ({} streams)", device_.properties.name, StreamsLabel(fds, "->"), n);
  const bool two_way = (flags_ & kHelloTwoWay) != 0;
  // Stream 0 of a two-way connection carries this side's posts: at the priority of a receiving
  // end's sockets (PostsFirst).
  if (two_way) PostsFirst(fds[0].get());
  auto c = std::make_shared<Connection>(std::move(fds), label, /*sending=*/true, hub_, nonce_, two_way);
  if (two_way) hub_.AddTwoWay(nonce_, c);
  std::vector<int> bulk;
  for (int i = two_way ? 1 : 0; i < n; ++i) bulk.push_back(i);
  return std::unique_ptr<SendComm>(new TcpSendComm(label, device_.properties, std::move(c), std::move(bulk)));
}

Status PendingConnect::Wait(Deadline deadline) {
  std::vector<pollfd> fds;
  for (const StreamState& s : streams_) {
    if (s.phase == Phase::kConnecting) fds.push_back(pollfd{s.fd.get(), POLLOUT, 0});
    if (s.phase == Phase::kHelloSent) fds.push_back(pollfd{s.fd.get(), POLLIN, 0});
  }
  if (fds.empty()) return Status::Ok();
  return PollFor(fds, deadline);
}

}  // namespace kizuna::fabric::tcp
