// The listening side of direct links (endpoint.h): one socket per node shared by its ports'
// ListenComms, the hellos read and verified there, and each connection handed to its listener.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fabric/directconnect/channel.h"
#include "fabric/directconnect/endpoint.h"
#include "fabric/directconnect/endpoint_internal.h"
#include "fabric/directconnect/transfer.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::directconnect {

using namespace endpoint_internal;  // the handshake's wire forms

// ---- The listening side ----
//
// One socket per fabric (this node), shared by the ListenComms of all its ports: a node with a port
// per peer (the "full" topology of a host's ranks) would otherwise hold a listening descriptor per
// peer from the start, whether or not the peer ever connects. The Acceptor owns the socket and the
// secret; each ListenComm is a listener on it, its port and id in its handle, and a hello names
// both: the Acceptor verifies it and queues the connection for that listener. Thread-safe
// (ListenComms of one fabric may be used from different threads).

// A connection taken off the socket, its hello being read.
struct Pending {
  UniqueFd socket;
  Clock::time_point since;
  Hello hello{};
  size_t got = 0;
  UniqueFd fds[kHelloFds];
  pid_t pid = 0;  // the connecting process (SO_PEERCRED)
};

class Acceptor {
 public:
  Acceptor(DirectConnectFabric& fabric, UniqueFd socket, std::string name, const uint8_t* token)
      : fabric_(fabric), socket_(std::move(socket)), name_(std::move(name)) {
    std::memcpy(token_, token, kTokenBytes);
  }

  const std::string& name() const { return name_; }
  const uint8_t* token() const { return token_; }
  uint32_t AddListener(int port) {
    std::lock_guard lock(mu_);
    const uint32_t id = next_id_++;
    listeners_[id].port = port;
    return id;
  }
  // Connections already verified for the listener are closed with it (their peers see the hang-up).
  void RemoveListener(uint32_t id) {
    std::lock_guard lock(mu_);
    listeners_.erase(id);
  }
  // The next verified connection for listener `id`, if one is there; takes new connections off the
  // socket first (at most every kSweepEvery while the listener's queue is empty: a transport polls
  // every port's listener in a row, and one look at the socket serves them all).
  std::optional<Pending> Take(uint32_t id);
  Status WaitAcceptable(uint32_t id, Deadline deadline);
  std::string Where(int port) const { return PortLabel(fabric_.topology(), fabric_.node(), port); }
  std::string PortName(int node, int port) const { return PortLabel(fabric_.topology(), node, port); }
  std::string NodeName() const { return fabric_.topology().nodes[static_cast<size_t>(fabric_.node())].name; }
  // Tells a refused peer why (best effort) and logs it.
  static void Reject(Pending& p, const std::string& where, const Status& why);

 private:
  struct Listener {
    int port = -1;
    std::deque<Pending> ready;  // verified hellos, to be accepted in order
  };
  static constexpr auto kSweepEvery = std::chrono::microseconds(100);

  // Takes pending and new connections as far as they go now. mu_ held.
  void Sweep(Clock::time_point now);
  // Reads p's hello; verified, it goes to its listener's queue, refused, it is dropped (false
  // either way); true while it is still pending. mu_ held.
  bool Advance(Pending& p, Clock::time_point now);
  // Makes room for one more pending connection (MaxPending). mu_ held.
  void EvictOne();
  // A flood of silent strangers cannot exhaust descriptors, and every listener's peer fits.
  size_t MaxPending() const { return std::max<size_t>(kMaxPending, 2 * listeners_.size()); }
  // The listener the hello is for, or why the connection is refused (its text goes back to the peer).
  Result<Listener*> Verify(const Pending& p);

  DirectConnectFabric& fabric_;
  const UniqueFd socket_;
  const std::string name_;
  uint8_t token_[kTokenBytes];
  std::mutex mu_;
  uint32_t next_id_ = 1;                   // guarded by mu_
  std::map<uint32_t, Listener> listeners_;  // guarded by mu_
  std::deque<Pending> pending_;            // guarded by mu_: hellos not complete yet
  Clock::time_point last_sweep_{};         // guarded by mu_
};

namespace {

// true when the hello is complete; kRemoteError when the peer hung up first, or when the kernel
// could not hand over the hello's descriptors.
Result<bool> ReadHello(Pending& p) {
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
    // The kernel drops descriptors it cannot install in this process (the open-file limit
    // reached, or a cgroup's) and says so only with this flag: the channel is lost, and the
    // reason is here, not in the peer's hello.
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      rlimit limit{};
      ::getrlimit(RLIMIT_NOFILE, &limit);
      return RemoteError(fmt::format("the hello's channel descriptors were dropped by the kernel (MSG_CTRUNC): this "
                                     "process cannot take more descriptors (open-file limit {})",
                                     static_cast<uint64_t>(limit.rlim_cur)));
    }
    p.got += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Result<Acceptor::Listener*> Acceptor::Verify(const Pending& p) {
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
  if (h.topology != fabric_.topology_fingerprint())
    return RemoteError(fmt::format("the connecting rank uses a different topology than {} (every rank must load the "
                                   "same topology file)",
                                   t.Describe()));
  if (h.to_node != static_cast<uint32_t>(fabric_.node())) return RemoteError("the hello names another node");
  auto it = listeners_.find(h.listener);
  if (it == listeners_.end() || it->second.port != static_cast<int>(h.to_port))
    return RemoteError(fmt::format("nobody listens for this connection on {} any more (its ListenComm was closed)",
                                   Where(static_cast<int>(h.to_port))));
  const int port = it->second.port;
  const std::optional<PortRef> peer = t.PeerOf(PortRef{fabric_.node(), port});
  if (!peer.has_value() || peer->node != static_cast<int>(h.from_node) || peer->port != static_cast<int>(h.from_port))
    return RemoteError(fmt::format("{} is not linked to node #{} port {} in topology {}", Where(port), h.from_node,
                                   h.from_port, t.Describe()));
  for (const UniqueFd& fd : p.fds)
    if (!fd.valid()) return RemoteError("the hello came without its channel descriptors");
  return &it->second;
}

void Acceptor::Reject(Pending& p, const std::string& where, const Status& why) {
  KZ_WARN(kLogFabric, "directconnect {}: rejected a connection: {}", where, why.message());
  // Best effort and brief: the peer may be a stranger that never reads.
  SendSocketMessage(p.socket.get(), SocketMessageType::kReject, 0, why.message(),
                    Deadline::After(std::chrono::milliseconds(100)))
      .IgnoreError();
}

bool Acceptor::Advance(Pending& p, Clock::time_point now) {
  Result<bool> complete = ReadHello(p);
  if (!complete.ok()) {
    // Descriptors lost to the limit are this process's trouble, worth a warning; a peer that
    // hung up mid-hello is not.
    if (complete.status().message().find("MSG_CTRUNC") != std::string_view::npos)
      Reject(p, fmt::format("node {}", NodeName()), complete.status());
    else
      KZ_INFO(kLogFabric, "directconnect node {}: dropped a connection: {}", NodeName(), complete.status().message());
    return false;
  }
  if (!*complete) {
    if (now - p.since <= kHelloTimeout) return true;
    KZ_WARN(kLogFabric, "directconnect node {}: dropped a connection that sent no hello within {} s", NodeName(),
            std::chrono::duration_cast<std::chrono::seconds>(kHelloTimeout).count());
    return false;
  }
  Result<Listener*> to = Verify(p);
  if (!to.ok()) {
    Reject(p, Where(static_cast<int>(p.hello.to_port)), to.status());
    return false;
  }
  (*to)->ready.push_back(std::move(p));
  return false;
}

void Acceptor::EvictOne() {
  std::map<pid_t, size_t> per_process;
  for (const Pending& p : pending_) ++per_process[p.pid];
  const pid_t most = std::max_element(per_process.begin(), per_process.end(), [](const auto& a, const auto& b) {
                       return a.second < b.second;
                     })->first;
  auto victim = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.pid == most; });
  KZ_WARN(kLogFabric,
          "directconnect node {}: {} connections without a hello ({} from pid {}); dropping that process's oldest",
          NodeName(), pending_.size(), per_process[most], most);
  pending_.erase(victim);
}

void Acceptor::Sweep(Clock::time_point now) {
  last_sweep_ = now;
  // Connections already pending first: their hellos may have completed since.
  for (auto it = pending_.begin(); it != pending_.end();) it = Advance(*it, now) ? std::next(it) : pending_.erase(it);
  // New ones: a peer sends its hello as it connects, so it is usually there to read at once —
  // verified before any flood of silent connections queued behind it can push it out.
  while (true) {
    const int fd = ::accept4(socket_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        KZ_WARN(kLogFabric, "directconnect: accept4 on {}: {}", name_, std::strerror(errno));
      break;
    }
    Pending p{UniqueFd(fd), now, {}, 0, {}, 0};
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) p.pid = cred.pid;
    if (!Advance(p, now)) continue;
    if (pending_.size() >= MaxPending()) EvictOne();
    pending_.push_back(std::move(p));
  }
}

std::optional<Pending> Acceptor::Take(uint32_t id) {
  std::lock_guard lock(mu_);
  auto it = listeners_.find(id);
  if (it == listeners_.end()) return std::nullopt;
  if (it->second.ready.empty()) {
    const Clock::time_point now = Clock::now();
    if (now - last_sweep_ < kSweepEvery && pending_.empty()) return std::nullopt;
    Sweep(now);
  }
  if (it->second.ready.empty()) return std::nullopt;
  Pending p = std::move(it->second.ready.front());
  it->second.ready.pop_front();
  return p;
}

Status Acceptor::WaitAcceptable(uint32_t id, Deadline deadline) {
  std::vector<pollfd> fds;
  bool pending = false;
  {
    std::lock_guard lock(mu_);
    auto it = listeners_.find(id);
    if (it != listeners_.end() && !it->second.ready.empty()) return Status::Ok();
    fds.push_back(pollfd{socket_.get(), POLLIN, 0});
    for (const Pending& p : pending_) fds.push_back(pollfd{p.socket.get(), POLLIN, 0});
    pending = !pending_.empty();
  }
  // Wake at least every second while connections are pending, to drop the ones that time out.
  auto wait = deadline.Remaining();
  if (pending) wait = std::min<std::chrono::nanoseconds>(wait, std::chrono::seconds(1));
  const auto ns = wait.count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) < 0 && errno != EINTR) return FromErrno(errno, "ppoll");
  return Status::Ok();
}

namespace {

class DcListenComm final : public ListenComm {
 public:
  DcListenComm(FabricDeviceProperties properties, Handle handle, std::shared_ptr<Acceptor> acceptor, int port,
               uint32_t id, double io_timeout_s)
      : ListenComm(std::move(properties), handle),
        acceptor_(std::move(acceptor)),
        port_(port),
        id_(id),
        io_timeout_s_(io_timeout_s) {}
  ~DcListenComm() override { acceptor_->RemoveListener(id_); }

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override;
  Status DoWaitAcceptable(Deadline deadline) override { return acceptor_->WaitAcceptable(id_, deadline); }

 private:
  const std::shared_ptr<Acceptor> acceptor_;
  const int port_;
  const uint32_t id_;
  const double io_timeout_s_;
};

Result<std::unique_ptr<RecvComm>> DcListenComm::DoAccept() {
  std::optional<Pending> p = acceptor_->Take(id_);
  if (!p) return std::unique_ptr<RecvComm>();
  const std::string where = acceptor_->Where(port_);
  auto channel = Channel::Attach(std::move(p->fds[0]), std::move(p->fds[1]), std::move(p->fds[2]));
  if (!channel.ok()) {
    Acceptor::Reject(*p, where, channel.status());
    return std::unique_ptr<RecvComm>();
  }
  ConnectionParts parts;
  parts.channel = std::move(channel).value();
  parts.socket = std::move(p->socket);
  parts.nonce = p->hello.nonce;
  parts.label = fmt::format("directconnect {}<-{}", where,
                            acceptor_->PortName(static_cast<int>(p->hello.from_node),
                                                static_cast<int>(p->hello.from_port)));
  parts.properties = properties();
  parts.io_timeout_s = io_timeout_s_;
  return std::unique_ptr<RecvComm>(std::make_unique<DcRecvComm>(std::move(parts)));
}

// The node's listening socket, made on the first Listen and shared until the last ListenComm goes.
Result<std::shared_ptr<Acceptor>> MakeAcceptor(DirectConnectFabric& fabric) {
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
  // Every peer of the node may connect at once (the kernel caps it at net.core.somaxconn; a
  // connect that finds the queue full is retried).
  if (::listen(sock.get(), SOMAXCONN) != 0) return FromErrno(errno, "listen");
  return std::make_shared<Acceptor>(fabric, std::move(sock), name, token);
}

}  // namespace

Result<std::unique_ptr<ListenComm>> ListenOnPort(DirectConnectFabric& fabric, int port) {
  const Topology& t = fabric.topology();
  const PortRef me{fabric.node(), port};
  if (!t.PeerOf(me).has_value())
    return InvalidArgument(fmt::format("directconnect: port {} of node {} has no link in topology {}: nothing can "
                                       "connect to it",
                                       port, t.nodes[me.node].name, t.Describe()));
  std::shared_ptr<Acceptor> acceptor;
  {
    std::lock_guard lock(fabric.acceptor_mu_);
    acceptor = fabric.acceptor_.lock();
    if (acceptor == nullptr) {
      KZ_ASSIGN_OR_RETURN(acceptor, MakeAcceptor(fabric));
      fabric.acceptor_ = acceptor;
    }
  }
  HandleInfo info;
  info.version = kProtocolVersion;
  info.node = fabric.node();
  info.port = port;
  info.listener = acceptor->AddListener(port);
  info.topology = fabric.topology_fingerprint();
  info.host = fabric.host_fingerprint();
  std::memcpy(info.token, acceptor->token(), kTokenBytes);
  info.socket_name = acceptor->name();
  const Handle handle = EncodeHandle(info);
  auto props = fabric.properties(port);
  if (!props.ok()) {
    acceptor->RemoveListener(info.listener);
    return props.status();
  }
  return std::unique_ptr<ListenComm>(std::make_unique<DcListenComm>(std::move(props).value(), handle, acceptor, port,
                                                                    info.listener, fabric.io_timeout_s()));
}

}  // namespace kizuna::fabric::directconnect
