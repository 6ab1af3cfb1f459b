#include "fabric/directconnect/endpoint.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <string>

#include <fmt/format.h>

#include "fabric/directconnect/channel.h"
#include "fabric/directconnect/transfer.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::directconnect {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHandleMagic = 0x4448'5a4b;  // "KZHD"
constexpr uint32_t kHelloMagic = 0x4548'5a4b;   // "KZHE"
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kSocketNameBytes = 48;
// A listener keeps at most this many connections that have not finished their hello; beyond it
// one is dropped (a flood of strangers cannot exhaust descriptors) — the oldest of the process
// with the most, so a flood from one process evicts its own connections, not a peer's.
constexpr size_t kMaxPending = 64;

struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t port;
  uint32_t node;
  uint32_t reserved;
  uint64_t topology;  // Topology::Fingerprint()
  uint64_t host;      // DirectConnectFabric::host_fingerprint()
  uint8_t token[kTokenBytes];
  char socket_name[kSocketNameBytes];  // abstract-namespace name, NUL-padded
};
static_assert(sizeof(WireHandle) <= kHandleMaxBytes);

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint8_t token[kTokenBytes];
  uint64_t topology;
  uint32_t from_node, from_port;
  uint32_t to_node, to_port;
  uint64_t nonce;
  int32_t pid;
  uint32_t reserved2;
};
constexpr int kHelloFds = 3;  // channel segment, sender's wakeup, receiver's wakeup

std::string Hex(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

socklen_t AbstractAddress(std::string_view name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  addr->sun_path[0] = '\0';
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

Status WaitFd(int fd, short events, Deadline deadline, std::string_view what) {
  while (true) {
    if (deadline.Expired()) return Timeout(fmt::format("{}: deadline passed", what));
    pollfd p{fd, events, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms + 1, 1, 1 << 30)));
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return FromErrno(errno, "poll");
  }
}

std::string PortLabel(const Topology& t, int node, int port) { return t.PortName(PortRef{node, port}); }

// ---- The listening side ----

class DcListenComm final : public ListenComm {
 public:
  DcListenComm(DirectConnectFabric& fabric, int port, FabricDeviceProperties properties, Handle handle,
               UniqueFd socket, const uint8_t* token)
      : ListenComm(std::move(properties), handle), fabric_(fabric), port_(port), socket_(std::move(socket)) {
    std::memcpy(token_, token, kTokenBytes);
  }

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override;
  Status DoWaitAcceptable(Deadline deadline) override;

 private:
  struct Pending {
    UniqueFd socket;
    Clock::time_point since;
    Hello hello{};
    size_t got = 0;
    UniqueFd fds[kHelloFds];
    pid_t pid = 0;  // the connecting process (SO_PEERCRED)
  };
  // true when the hello is complete; kRemoteError when the peer hung up first.
  Result<bool> ReadHello(Pending& p);
  // Takes a connection as far as it goes now: its hello read and verified into ready_, refused,
  // or kept pending (true when it is still pending).
  bool Advance(Pending& p, Clock::time_point now);
  // Makes room for one more pending connection (kMaxPending).
  void EvictOne();
  // ok, or why the connection is refused (its text goes back to the peer).
  Status Verify(const Pending& p) const;
  void Reject(Pending& p, const Status& why);
  std::string Where() const { return PortLabel(fabric_.topology(), fabric_.node(), port_); }

  DirectConnectFabric& fabric_;
  int port_;
  UniqueFd socket_;
  uint8_t token_[kTokenBytes];
  std::deque<Pending> pending_;
  std::deque<Pending> ready_;  // verified hellos, to be accepted in order
};

Result<bool> DcListenComm::ReadHello(Pending& p) {
  while (p.got < sizeof(Hello)) {
    iovec iov{reinterpret_cast<uint8_t*>(&p.hello) + p.got, sizeof(Hello) - p.got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kHelloFds)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(p.socket.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      if (errno == EINTR) continue;
      return RemoteError(fmt::format("reading the hello: {}", std::strerror(errno)));
    }
    if (n == 0) return RemoteError("the connecting side hung up before its hello was complete");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
        // Keep the first three; close anything beyond (a stranger's extra fds must not leak).
        for (UniqueFd& slot : p.fds) {
          if (!slot.valid()) {
            slot.Reset(fd);
            fd = -1;
            break;
          }
        }
        if (fd >= 0) ::close(fd);
      }
    }
    p.got += static_cast<size_t>(n);
  }
  return true;
}

Status DcListenComm::Verify(const Pending& p) const {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(p.socket.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return FromErrno(errno, "SO_PEERCRED");
  if (cred.uid != ::getuid())
    return RemoteError(fmt::format("connection from uid {} (pid {}), not this user's", cred.uid, cred.pid));
  const Hello& h = p.hello;
  if (h.magic != kHelloMagic) return RemoteError("not a directconnect hello");
  if (!ConstantTimeEqual(h.token, token_, kTokenBytes)) return RemoteError("authentication failed (wrong secret)");
  if (h.version != kProtocolVersion)
    return RemoteError(fmt::format("protocol version {}, this side speaks {}", h.version, kProtocolVersion));
  const Topology& t = fabric_.topology();
  if (h.topology != t.Fingerprint())
    return RemoteError(fmt::format("the connecting rank uses a different topology than {} (every rank must load the "
                                   "same topology file)",
                                   t.Describe()));
  if (h.to_node != static_cast<uint32_t>(fabric_.node()) || h.to_port != static_cast<uint32_t>(port_))
    return RemoteError("the hello names another listener");
  const std::optional<PortRef> peer = t.PeerOf(PortRef{fabric_.node(), port_});
  if (!peer.has_value() || peer->node != static_cast<int>(h.from_node) || peer->port != static_cast<int>(h.from_port))
    return RemoteError(fmt::format("{} is not linked to node #{} port {} in topology {}", Where(), h.from_node,
                                   h.from_port, t.Describe()));
  for (const UniqueFd& fd : p.fds)
    if (!fd.valid()) return RemoteError("the hello came without its channel descriptors");
  return Status::Ok();
}

void DcListenComm::Reject(Pending& p, const Status& why) {
  KZ_WARN(kLogFabric, "directconnect {}: rejected a connection: {}", Where(), why.message());
  // Best effort and brief: the peer may be a stranger that never reads.
  SendSocketMessage(p.socket.get(), SocketMessageType::kReject, 0, why.message(),
                    Deadline::After(std::chrono::milliseconds(100)))
      .IgnoreError();
}

bool DcListenComm::Advance(Pending& p, Clock::time_point now) {
  Result<bool> complete = ReadHello(p);
  if (!complete.ok()) {
    KZ_INFO(kLogFabric, "directconnect {}: dropped a connection: {}", Where(), complete.status().message());
    return false;
  }
  if (!*complete) {
    if (now - p.since <= kHelloTimeout) return true;
    KZ_WARN(kLogFabric, "directconnect {}: dropped a connection that sent no hello within {} s", Where(),
            std::chrono::duration_cast<std::chrono::seconds>(kHelloTimeout).count());
    return false;
  }
  if (Status s = Verify(p); !s.ok()) {
    Reject(p, s);
    return false;
  }
  ready_.push_back(std::move(p));
  return false;
}

void DcListenComm::EvictOne() {
  std::map<pid_t, size_t> per_process;
  for (const Pending& p : pending_) ++per_process[p.pid];
  const pid_t most = std::max_element(per_process.begin(), per_process.end(), [](const auto& a, const auto& b) {
                       return a.second < b.second;
                     })->first;
  auto victim = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.pid == most; });
  KZ_WARN(kLogFabric,
          "directconnect {}: {} connections without a hello ({} from pid {}); dropping that process's oldest", Where(),
          pending_.size(), per_process[most], most);
  pending_.erase(victim);
}

Result<std::unique_ptr<RecvComm>> DcListenComm::DoAccept() {
  const auto now = Clock::now();
  // Connections already pending first: their hellos may have completed since.
  for (auto it = pending_.begin(); it != pending_.end();) it = Advance(*it, now) ? std::next(it) : pending_.erase(it);
  // New ones: a peer sends its hello as it connects, so it is usually there to read at once —
  // verified before any flood of silent connections queued behind it can push it out.
  while (ready_.empty()) {
    const int fd = ::accept4(socket_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return FromErrno(errno, "accept4");
    }
    Pending p{UniqueFd(fd), now, {}, 0, {}, 0};
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) p.pid = cred.pid;
    if (!Advance(p, now)) continue;
    if (pending_.size() >= kMaxPending) EvictOne();
    pending_.push_back(std::move(p));
  }
  if (ready_.empty()) return std::unique_ptr<RecvComm>();
  Pending p = std::move(ready_.front());
  ready_.pop_front();
  auto channel = Channel::Attach(std::move(p.fds[0]), std::move(p.fds[1]), std::move(p.fds[2]));
  if (!channel.ok()) {
    Reject(p, channel.status());
    return std::unique_ptr<RecvComm>();
  }
  const Topology& t = fabric_.topology();
  ConnectionParts parts;
  parts.channel = std::move(channel).value();
  parts.socket = std::move(p.socket);
  parts.nonce = p.hello.nonce;
  parts.label = fmt::format("directconnect {}<-{}", Where(),
                            PortLabel(t, static_cast<int>(p.hello.from_node), static_cast<int>(p.hello.from_port)));
  parts.properties = properties();
  parts.io_timeout_s = fabric_.io_timeout_s();
  return std::unique_ptr<RecvComm>(std::make_unique<DcRecvComm>(std::move(parts)));
}

Status DcListenComm::DoWaitAcceptable(Deadline deadline) {
  if (!ready_.empty()) return Status::Ok();
  std::vector<pollfd> fds;
  fds.push_back(pollfd{socket_.get(), POLLIN, 0});
  for (const Pending& p : pending_) fds.push_back(pollfd{p.socket.get(), POLLIN, 0});
  // Wake at least every second while connections are pending, to drop the ones that time out.
  auto wait = deadline.Remaining();
  if (!pending_.empty()) wait = std::min<std::chrono::nanoseconds>(wait, std::chrono::seconds(1));
  const auto ns = wait.count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) < 0 && errno != EINTR) return FromErrno(errno, "ppoll");
  return Status::Ok();
}

}  // namespace

// ---- Socket helpers ----

Status SendAll(int sock, const void* data, size_t bytes, Deadline deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(sock, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        KZ_RETURN_IF_ERROR(WaitFd(sock, POLLOUT, deadline, "sending on the connection's socket"));
        continue;
      }
      if (errno == EPIPE || errno == ECONNRESET) return RemoteError("the peer closed the connection's socket");
      return FromErrno(errno, "send");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status RecvAll(int sock, void* data, size_t bytes, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(sock, p, bytes, MSG_DONTWAIT);
    if (n == 0) return RemoteError("the peer closed the connection's socket");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        KZ_RETURN_IF_ERROR(WaitFd(sock, POLLIN, deadline, "receiving on the connection's socket"));
        continue;
      }
      if (errno == ECONNRESET) return RemoteError("the peer reset the connection's socket");
      return FromErrno(errno, "recv");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SendSocketMessage(int sock, SocketMessageType type, uint64_t id, std::string_view text, Deadline deadline) {
  if (text.size() > kMaxRejectText) text = text.substr(0, kMaxRejectText);
  SocketMessage m;
  m.magic = kSocketMessageMagic;
  m.type = static_cast<uint16_t>(type);
  m.length = static_cast<uint32_t>(text.size());
  m.id = id;
  std::string bytes(reinterpret_cast<const char*>(&m), sizeof(m));
  bytes += text;
  return SendAll(sock, bytes.data(), bytes.size(), deadline);
}

// ---- Handles ----

Result<HandleInfo> ParseHandle(const Handle& handle) {
  WireHandle h{};
  if (handle.size != sizeof(WireHandle))
    return InvalidArgument(fmt::format("directconnect: a handle of {} bytes is not a directconnect handle ({} bytes)",
                                       handle.size, sizeof(WireHandle)));
  std::memcpy(&h, handle.data.data(), sizeof(h));
  if (h.magic != kHandleMagic) return InvalidArgument("directconnect: the handle is not a directconnect handle");
  if (h.version != kProtocolVersion)
    return InvalidArgument(fmt::format("directconnect: handle of protocol version {}, this side speaks {}", h.version,
                                       kProtocolVersion));
  HandleInfo info;
  info.version = h.version;
  info.node = static_cast<int>(h.node);
  info.port = h.port;
  info.topology = h.topology;
  info.host = h.host;
  std::memcpy(info.token, h.token, kTokenBytes);
  info.socket_name.assign(h.socket_name, strnlen(h.socket_name, kSocketNameBytes));
  return info;
}

Handle EncodeHandle(const HandleInfo& info) {
  WireHandle h{};
  h.magic = kHandleMagic;
  h.version = info.version;
  h.port = static_cast<uint16_t>(info.port);
  h.node = static_cast<uint32_t>(info.node);
  h.topology = info.topology;
  h.host = info.host;
  std::memcpy(h.token, info.token, kTokenBytes);
  std::memcpy(h.socket_name, info.socket_name.data(), std::min(info.socket_name.size(), kSocketNameBytes - 1));
  Handle handle;
  handle.size = sizeof(h);
  std::memcpy(handle.data.data(), &h, sizeof(h));
  return handle;
}

// ---- Listen ----

Result<std::unique_ptr<ListenComm>> ListenOnPort(DirectConnectFabric& fabric, int port) {
  const Topology& t = fabric.topology();
  const PortRef me{fabric.node(), port};
  if (!t.PeerOf(me).has_value())
    return InvalidArgument(fmt::format("directconnect: port {} of node {} has no link in topology {}: nothing can "
                                       "connect to it",
                                       port, t.nodes[me.node].name, t.Describe()));
  uint8_t token[kTokenBytes], name_bytes[16];
  KZ_RETURN_IF_ERROR(RandomBytes(token, sizeof(token)));
  KZ_RETURN_IF_ERROR(RandomBytes(name_bytes, sizeof(name_bytes)));
  const std::string name = "kizuna-dc-" + Hex(name_bytes, sizeof(name_bytes));
  static_assert(10 + 32 < kSocketNameBytes);

  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return FromErrno(errno, "socket(AF_UNIX)");
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(name, &addr);
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return FromErrno(errno, "bind");
  if (::listen(sock.get(), 128) != 0) return FromErrno(errno, "listen");

  HandleInfo info;
  info.version = kProtocolVersion;
  info.node = fabric.node();
  info.port = port;
  info.topology = t.Fingerprint();
  info.host = fabric.host_fingerprint();
  std::memcpy(info.token, token, sizeof(token));
  info.socket_name = name;
  const Handle handle = EncodeHandle(info);
  KZ_ASSIGN_OR_RETURN(FabricDeviceProperties props, fabric.properties(port));
  return std::unique_ptr<ListenComm>(
      std::make_unique<DcListenComm>(fabric, port, std::move(props), handle, std::move(sock), token));
}

// ---- Connect ----

namespace {

// Whether handle `h`, taken by `port` of this node, names the listener at the far end of that
// port's link in this host's topology; kInvalidArgument naming the mismatch otherwise.
Status CheckTarget(const DirectConnectFabric& fabric, int port, const HandleInfo& h) {
  const Topology& t = fabric.topology();
  if (h.host != fabric.host_fingerprint())
    return InvalidArgument("directconnect: the handle comes from another host; direct-connect links run between "
                           "processes of one host (a link is a shared-memory channel)");
  if (h.topology != t.Fingerprint())
    return InvalidArgument(fmt::format("directconnect: the handle comes from a rank whose topology differs from {} "
                                       "(every rank must load the same topology file)",
                                       t.Describe()));
  const PortRef me{fabric.node(), port};
  const PortRef target{h.node, h.port};
  if (target.node < 0 || static_cast<size_t>(target.node) >= t.nodes.size() ||
      target.port >= t.nodes[target.node].ports)
    return InvalidArgument(fmt::format("directconnect: the handle names node #{} port {}, which topology {} does not "
                                       "have",
                                       h.node, h.port, t.Describe()));
  const std::optional<PortRef> peer = t.PeerOf(me);
  if (!peer.has_value())
    return InvalidArgument(fmt::format("directconnect: port {} of node {} has no link in topology {}", port,
                                       t.nodes[me.node].name, t.Describe()));
  if (!(*peer == target))
    return InvalidArgument(fmt::format("directconnect: port {} of node {} is linked to {} in topology {}, not to the "
                                       "listener at {}: connect on the port whose link reaches it",
                                       port, t.nodes[me.node].name, t.PortName(*peer), t.Describe(),
                                       t.PortName(target)));
  return Status::Ok();
}

// The hello the connecting side sends first: the listener's token, both ends' ports, a fresh
// nonce.
Result<Hello> MakeHello(const DirectConnectFabric& fabric, int port, const HandleInfo& h) {
  Hello hello{};
  hello.magic = kHelloMagic;
  hello.version = kProtocolVersion;
  std::memcpy(hello.token, h.token, kTokenBytes);
  hello.topology = fabric.topology().Fingerprint();
  hello.from_node = static_cast<uint32_t>(fabric.node());
  hello.from_port = static_cast<uint32_t>(port);
  hello.to_node = static_cast<uint32_t>(h.node);
  hello.to_port = static_cast<uint32_t>(h.port);
  KZ_RETURN_IF_ERROR(RandomBytes(&hello.nonce, sizeof(hello.nonce)));
  hello.pid = static_cast<int32_t>(::getpid());
  return hello;
}

// Sends `hello` with the channel's fds (SCM_RIGHTS) on the fresh socket `sock` to the listener at
// `target`, waiting for room until the deadline.
Status SendHello(int sock, Hello hello, const int (&fds)[kHelloFds], const Topology& t, const PortRef& target,
                 Deadline deadline) {
  while (true) {
    iovec iov{&hello, sizeof(hello)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(fds));
    std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof(hello))) return Status::Ok();
    if (n >= 0) return Internal("directconnect: the hello was sent partially");  // a fresh socket has room for it
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      KZ_RETURN_IF_ERROR(WaitFd(sock, POLLOUT, deadline, "sending the hello"));
      continue;
    }
    if (errno == EPIPE || errno == ECONNRESET)
      return RemoteError(fmt::format("directconnect: the listener at {} closed during the handshake",
                                     t.PortName(target)));
    return FromErrno(errno, "sendmsg");
  }
}

}  // namespace

Result<std::unique_ptr<SendComm>> ConnectOnPort(DirectConnectFabric& fabric, int port, const Handle& handle) {
  const Topology& t = fabric.topology();
  KZ_ASSIGN_OR_RETURN(HandleInfo h, ParseHandle(handle));
  KZ_RETURN_IF_ERROR(CheckTarget(fabric, port, h));
  const PortRef me{fabric.node(), port};
  const PortRef target{h.node, h.port};

  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return FromErrno(errno, "socket(AF_UNIX)");
  sockaddr_un addr;
  const socklen_t len = AbstractAddress(h.socket_name, &addr);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno == EAGAIN || errno == EINTR) return std::unique_ptr<SendComm>();  // the accept queue is full
    if (errno == ECONNREFUSED || errno == ENOENT)
      return RemoteError(fmt::format("directconnect: nobody listens behind the handle for {} any more (its "
                                     "ListenComm was closed)",
                                     t.PortName(target)));
    return FromErrno(errno, "connect");
  }

  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Channel> channel, Channel::Create(ChannelSizes{}));
  KZ_ASSIGN_OR_RETURN(const Hello hello, MakeHello(fabric, port, h));
  const int fds[kHelloFds] = {channel->segment_fd(), channel->wake_fd(Side::kSender),
                              channel->wake_fd(Side::kReceiver)};
  KZ_RETURN_IF_ERROR(SendHello(sock.get(), hello, fds, t, target, Deadline::AfterSeconds(fabric.io_timeout_s())));

  ConnectionParts parts;
  parts.channel = std::move(channel);
  parts.socket = std::move(sock);
  parts.nonce = hello.nonce;
  parts.shaper = fabric.shaper(port);
  parts.label = fmt::format("directconnect {}->{}", t.PortName(me), t.PortName(target));
  KZ_ASSIGN_OR_RETURN(parts.properties, fabric.properties(port));
  parts.io_timeout_s = fabric.io_timeout_s();
  return std::unique_ptr<SendComm>(std::make_unique<DcSendComm>(std::move(parts)));
}

}  // namespace kizuna::fabric::directconnect
