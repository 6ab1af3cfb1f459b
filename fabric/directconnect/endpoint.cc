#include "fabric/directconnect/endpoint.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "fabric/directconnect/channel.h"
#include "fabric/directconnect/endpoint_internal.h"
#include "fabric/directconnect/transfer.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::directconnect {
namespace {

using namespace endpoint_internal;  // the handshake's wire forms

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
  info.listener = h.listener;
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
  h.listener = info.listener;
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

// ---- Connect ----

namespace {

// Whether handle `h`, taken by `port` of this node, names the listener at the far end of that
// port's link in this host's topology; kInvalidArgument naming the mismatch otherwise.
Status CheckTarget(const DirectConnectFabric& fabric, int port, const HandleInfo& h) {
  const Topology& t = fabric.topology();
  if (h.host != fabric.host_fingerprint())
    return InvalidArgument("directconnect: the handle comes from another host; direct-connect links run between "
                           "processes of one host (a link is a shared-memory channel)");
  if (h.topology != fabric.topology_fingerprint())
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
  hello.topology = fabric.topology_fingerprint();
  hello.from_node = static_cast<uint32_t>(fabric.node());
  hello.from_port = static_cast<uint32_t>(port);
  hello.to_node = static_cast<uint32_t>(h.node);
  hello.to_port = static_cast<uint32_t>(h.port);
  KZ_RETURN_IF_ERROR(RandomBytes(&hello.nonce, sizeof(hello.nonce)));
  hello.pid = static_cast<int32_t>(::getpid());
  hello.listener = h.listener;
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

  // The channel and the hello before the connection: the listener gives a connection kHelloTimeout
  // to send its hello, and the time to make the channel's memory must not count against it (256
  // ranks of one process on 2 busy CPUs had connections dropped for a late hello).
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Channel> channel, Channel::Create(ChannelSizes{}));
  KZ_ASSIGN_OR_RETURN(const Hello hello, MakeHello(fabric, port, h));
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
