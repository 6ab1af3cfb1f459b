#include "fabric/roce/endpoint.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "fabric/roce/transfer.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::roce {
namespace {

constexpr uint32_t kHandleMagic = 0x48525a4b;   // "KZRH"
constexpr uint32_t kHelloMagic = 0x4f525a4b;    // "KZRO"
constexpr uint32_t kWelcomeMagic = 0x57525a4b;  // "KZRW"
constexpr char kReady = 'R';
constexpr auto kMaxBlock = std::chrono::milliseconds(100);

struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint8_t family;  // 4 or 6
  uint8_t reserved0;
  uint16_t port;
  uint16_t reserved1;
  uint32_t scope_id;
  int32_t rank;
  uint8_t address[16];
  uint8_t secret[kSecretBytes];
  uint8_t gid[16];
};
static_assert(sizeof(WireHandle) <= kHandleMaxBytes);

struct WireQp {
  uint32_t qpn;
  uint32_t psn;
  uint8_t gid[16];
  uint8_t mtu;
  uint8_t reserved[3];
};

struct WireHello {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int32_t rank;
  uint32_t reserved1;
  uint64_t nonce;
  uint8_t secret[kSecretBytes];
  WireQp qp;
};

struct WireWelcome {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int32_t rank;
  uint32_t reserved1;
  uint64_t nonce;
  WireQp qp;
};

WireQp ToWire(const QpInfo& q) {
  WireQp w{};
  w.qpn = q.qpn;
  w.psn = q.psn;
  std::memcpy(w.gid, q.gid.data(), 16);
  w.mtu = q.mtu;
  return w;
}

QpInfo FromWire(const WireQp& w) {
  QpInfo q;
  q.qpn = w.qpn;
  q.psn = w.psn & 0xffffff;
  std::memcpy(q.gid.data(), w.gid, 16);
  q.mtu = w.mtu;
  return q;
}

bool SameSecret(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

// The socket address for a handle's address and port.
socklen_t ToSockaddr(const HandleInfo& h, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  if (!h.ipv6) {
    auto* sin = reinterpret_cast<sockaddr_in*>(out);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(h.port);
    std::memcpy(&sin->sin_addr, h.address, 4);
    return sizeof(sockaddr_in);
  }
  auto* sin6 = reinterpret_cast<sockaddr_in6*>(out);
  sin6->sin6_family = AF_INET6;
  sin6->sin6_port = htons(h.port);
  sin6->sin6_scope_id = h.scope_id;
  std::memcpy(&sin6->sin6_addr, h.address, 16);
  return sizeof(sockaddr_in6);
}

std::string AddressText(const HandleInfo& h) {
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(h.ipv6 ? AF_INET6 : AF_INET, h.address, text, sizeof(text));
  return h.ipv6 ? fmt::format("[{}]:{}", text, h.port) : fmt::format("{}:{}", text, h.port);
}

// Sends all of `bytes` on a non-blocking socket, waiting for room at most until `deadline`.
Status SendAll(int fd, const void* bytes, size_t n, Deadline deadline) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      p += sent;
      n -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (deadline.Expired()) return Timeout("handshake socket: no room to send by the deadline");
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, 10);
      continue;
    }
    return FromErrno(errno, "send(handshake)");
  }
  return Status::Ok();
}

std::string SendLabel(const RoceDevice& d, int me, int peer) {
  return fmt::format("roce:{} rank{}->rank{}", d.name(), me, peer);
}

// ---- The listening side ----

class RoceListenComm : public ListenComm {
 public:
  RoceListenComm(FabricDeviceProperties properties, Handle handle, std::shared_ptr<RoceDevice> device, int my_rank,
                 UniqueFd socket, const uint8_t* secret)
      : ListenComm(std::move(properties), handle), device_(std::move(device)), my_rank_(my_rank),
        socket_(std::move(socket)) {
    std::memcpy(secret_, secret, kSecretBytes);
  }

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override;
  Status DoWaitAcceptable(Deadline deadline) override;

 private:
  struct Incoming {
    UniqueFd fd;
    std::array<uint8_t, sizeof(WireHello)> buf{};
    size_t got = 0;
  };
  // Reads what has arrived; true when the hello is complete, false while incomplete; an error
  // when the connection broke.
  Result<bool> ReadHello(Incoming& in);
  Result<std::unique_ptr<RecvComm>> Welcome(Incoming& in);

  std::shared_ptr<RoceDevice> device_;
  int my_rank_;
  UniqueFd socket_;
  uint8_t secret_[kSecretBytes];
  std::vector<Incoming> incoming_;
};

Result<bool> RoceListenComm::ReadHello(Incoming& in) {
  while (in.got < in.buf.size()) {
    const ssize_t n = ::recv(in.fd.get(), in.buf.data() + in.got, in.buf.size() - in.got, MSG_DONTWAIT);
    if (n > 0) {
      in.got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    return RemoteError(n == 0 ? std::string("closed before its hello was complete") : std::strerror(errno));
  }
  return true;
}

Result<std::unique_ptr<RecvComm>> RoceListenComm::Welcome(Incoming& in) {
  WireHello hello;
  std::memcpy(&hello, in.buf.data(), sizeof(hello));
  if (hello.magic != kHelloMagic || hello.version != kProtocolVersion) {
    KZ_WARN(kLogFabric, "roce {}: dropped a connection attempt that is not a roce hello (magic {:#x}, version {})",
            device_->name(), hello.magic, hello.version);
    return std::unique_ptr<RecvComm>();
  }
  if (!SameSecret(hello.secret, secret_)) {
    KZ_WARN(kLogFabric, "roce {}: dropped a connection attempt claiming rank {}: authentication failed (wrong "
                        "secret)", device_->name(), hello.rank);
    return std::unique_ptr<RecvComm>();
  }
  const std::string label = SendLabel(*device_, hello.rank, my_rank_);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Link> link, Link::Create(device_, label, hello.rank));
  KZ_RETURN_IF_ERROR(link->Connect(FromWire(hello.qp)));
  WireWelcome welcome{};
  welcome.magic = kWelcomeMagic;
  welcome.version = kProtocolVersion;
  welcome.rank = my_rank_;
  welcome.nonce = hello.nonce;
  welcome.qp = ToWire(link->local());
  KZ_RETURN_IF_ERROR(SendAll(in.fd.get(), &welcome, sizeof(welcome), Deadline::AfterSeconds(1)));
  link->AdoptSocket(std::move(in.fd), /*ready=*/false);
  return std::unique_ptr<RecvComm>(new RoceRecvComm(label, device_->properties(), std::move(link), hello.nonce));
}

Result<std::unique_ptr<RecvComm>> RoceListenComm::DoAccept() {
  while (true) {
    const int fd = ::accept4(socket_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return FromErrno(errno, fmt::format("accept on roce {}", device_->name()));
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    incoming_.push_back(Incoming{UniqueFd(fd)});
  }
  for (size_t i = 0; i < incoming_.size(); ++i) {
    Result<bool> complete = ReadHello(incoming_[i]);
    if (complete.ok() && !*complete) continue;
    Incoming in = std::move(incoming_[i]);
    incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
    if (!complete.ok()) {
      KZ_INFO(kLogFabric, "roce {}: a connection attempt went away: {}", device_->name(), complete.status().message());
      continue;
    }
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<RecvComm> comm, Welcome(in));
    if (comm != nullptr) return comm;
  }
  return std::unique_ptr<RecvComm>();
}

Status RoceListenComm::DoWaitAcceptable(Deadline deadline) {
  // A complete hello left for the next Accept (it returns one comm per call): nothing to wait for.
  for (const Incoming& in : incoming_)
    if (in.got == in.buf.size()) return Status::Ok();
  std::vector<pollfd> fds{{socket_.get(), POLLIN, 0}};
  for (const Incoming& in : incoming_) fds.push_back({in.fd.get(), POLLIN, 0});
  const auto block = std::min<std::chrono::nanoseconds>(deadline.Remaining(), kMaxBlock);
  const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(block).count());
  if (::poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) return FromErrno(errno, "poll(roce listener)");
  return Status::Ok();
}

}  // namespace

// ---- Handles ----

Handle EncodeHandle(const HandleInfo& info) {
  WireHandle w{};
  w.magic = kHandleMagic;
  w.version = kProtocolVersion;
  w.family = info.ipv6 ? 6 : 4;
  w.port = info.port;
  w.scope_id = info.scope_id;
  w.rank = info.rank;
  std::memcpy(w.address, info.address, 16);
  std::memcpy(w.secret, info.secret, kSecretBytes);
  std::memcpy(w.gid, info.gid.data(), 16);
  Handle h;
  h.size = sizeof(w);
  std::memcpy(h.data.data(), &w, sizeof(w));
  return h;
}

Result<HandleInfo> ParseHandle(const Handle& handle) {
  if (handle.size != sizeof(WireHandle))
    return InvalidArgument(fmt::format("roce: a handle of {} bytes is not a roce handle ({} bytes)", handle.size,
                                       sizeof(WireHandle)));
  WireHandle w;
  std::memcpy(&w, handle.data.data(), sizeof(w));
  if (w.magic != kHandleMagic) return InvalidArgument("roce: the handle is not a roce handle (bad magic)");
  if (w.version != kProtocolVersion)
    return InvalidArgument(fmt::format("roce: handle of protocol version {}, this build speaks {}", w.version,
                                       kProtocolVersion));
  if (w.family != 4 && w.family != 6)
    return InvalidArgument(fmt::format("roce: handle with address family {}", static_cast<int>(w.family)));
  if (w.port == 0) return InvalidArgument("roce: handle with port 0");
  HandleInfo info;
  info.ipv6 = w.family == 6;
  info.port = w.port;
  info.scope_id = w.scope_id;
  info.rank = w.rank;
  std::memcpy(info.address, w.address, 16);
  std::memcpy(info.secret, w.secret, kSecretBytes);
  std::memcpy(info.gid.data(), w.gid, 16);
  return info;
}

// ---- Listen ----

Result<std::unique_ptr<ListenComm>> ListenOn(RoceFabric& fabric, int dev) {
  std::shared_ptr<RoceDevice> device = fabric.device(dev);
  const GidRow& gid = device->gid();
  HandleInfo info;
  info.ipv6 = !IsIpv4MappedGid(gid.gid);
  if (info.ipv6) {
    std::memcpy(info.address, gid.gid.data(), 16);
    if (IsLinkLocalGid(gid.gid) && !gid.netdev.empty()) info.scope_id = ::if_nametoindex(gid.netdev.c_str());
  } else {
    std::memcpy(info.address, gid.gid.data() + 12, 4);
  }
  info.rank = fabric.context().rank;
  info.gid = gid.gid;
  KZ_RETURN_IF_ERROR(RandomBytes(info.secret, kSecretBytes));

  UniqueFd sock(::socket(info.ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return FromErrno(errno, "socket(roce listener)");
  sockaddr_storage addr;
  const socklen_t len = ToSockaddr(info, &addr);
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return FromErrno(errno, fmt::format("bind(roce listener to {}, the GID's address on {})", AddressText(info),
                                        gid.netdev.empty() ? "?" : gid.netdev));
  if (::listen(sock.get(), 128) != 0) return FromErrno(errno, "listen(roce listener)");
  socklen_t got = sizeof(addr);
  if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &got) != 0)
    return FromErrno(errno, "getsockname(roce listener)");
  info.port = ntohs(info.ipv6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                              : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  KZ_TRACE(kLogFabric, "roce {}: listening for handshakes on {}", device->name(), AddressText(info));
  return std::unique_ptr<ListenComm>(new RoceListenComm(device->properties(), EncodeHandle(info), device,
                                                        fabric.context().rank, std::move(sock), info.secret));
}

// ---- Connect ----

Status PendingConnect::Fail(std::string why) const {
  return RemoteError(fmt::format("roce {}: connecting to {}: {}", device_->name(), peer_text_, why));
}

Result<std::shared_ptr<PendingConnect>> PendingConnect::Start(RoceFabric& fabric, int dev, const Handle& handle) {
  KZ_ASSIGN_OR_RETURN(HandleInfo peer, ParseHandle(handle));
  std::shared_ptr<PendingConnect> p(new PendingConnect());
  p->device_ = fabric.device(dev);
  p->my_rank_ = fabric.context().rank;
  p->peer_ = peer;
  p->peer_text_ = fmt::format("{} (rank {})", AddressText(peer), peer.rank);
  KZ_RETURN_IF_ERROR(RandomBytes(&p->nonce_, sizeof(p->nonce_)));
  KZ_ASSIGN_OR_RETURN(p->link_, Link::Create(p->device_, SendLabel(*p->device_, p->my_rank_, peer.rank), peer.rank));

  WireHello hello{};
  hello.magic = kHelloMagic;
  hello.version = kProtocolVersion;
  hello.rank = p->my_rank_;
  hello.nonce = p->nonce_;
  std::memcpy(hello.secret, peer.secret, kSecretBytes);
  hello.qp = ToWire(p->link_->local());
  p->out_.resize(sizeof(hello));
  std::memcpy(p->out_.data(), &hello, sizeof(hello));
  p->in_.resize(sizeof(WireWelcome));

  p->socket_ = UniqueFd(::socket(peer.ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!p->socket_.valid()) return FromErrno(errno, "socket(roce connect)");
  const int one = 1;
  ::setsockopt(p->socket_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_storage addr;
  const socklen_t len = ToSockaddr(peer, &addr);
  if (::connect(p->socket_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS)
    return p->Fail(std::strerror(errno));
  return p;
}

Result<std::unique_ptr<SendComm>> PendingConnect::Poll() {
  const int fd = socket_.get();
  if (state_ == State::kConnecting) {
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, 0) <= 0) return std::unique_ptr<SendComm>();
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == EINPROGRESS || err == EALREADY) return std::unique_ptr<SendComm>();
    if (err != 0) return Fail(std::strerror(err));
    state_ = State::kSending;
  }
  if (state_ == State::kSending) {
    while (out_sent_ < out_.size()) {
      const ssize_t n = ::send(fd, out_.data() + out_sent_, out_.size() - out_sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        out_sent_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::unique_ptr<SendComm>();
      return Fail(std::strerror(errno));
    }
    state_ = State::kReceiving;
  }
  while (in_got_ < in_.size()) {
    const ssize_t n = ::recv(fd, in_.data() + in_got_, in_.size() - in_got_, MSG_DONTWAIT);
    if (n > 0) {
      in_got_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::unique_ptr<SendComm>();
    return Fail(n == 0 ? "the listener closed the connection during the handshake (it refused the handle's secret, "
                         "or went away)"
                       : std::strerror(errno));
  }
  WireWelcome welcome;
  std::memcpy(&welcome, in_.data(), sizeof(welcome));
  if (welcome.magic != kWelcomeMagic || welcome.version != kProtocolVersion || welcome.nonce != nonce_)
    return Fail("the listener's welcome is malformed (not a roce listener of this version)");
  KZ_RETURN_IF_ERROR(link_->Connect(FromWire(welcome.qp)));
  KZ_RETURN_IF_ERROR(SendAll(fd, &kReady, 1, Deadline::AfterSeconds(1)));
  link_->AdoptSocket(std::move(socket_), /*ready=*/true);
  const std::string label = link_->label();
  return std::unique_ptr<SendComm>(new RoceSendComm(label, device_->properties(), std::move(link_), nonce_));
}

Status PendingConnect::Wait(Deadline deadline) {
  if (!socket_.valid()) return Status::Ok();
  pollfd pfd{socket_.get(), static_cast<short>(state_ == State::kReceiving ? POLLIN : POLLOUT), 0};
  const auto block = std::min<std::chrono::nanoseconds>(deadline.Remaining(), kMaxBlock);
  const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(block).count());
  if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) return FromErrno(errno, "poll(roce connect)");
  return Status::Ok();
}

}  // namespace kizuna::fabric::roce
