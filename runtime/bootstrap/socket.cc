#include "runtime/bootstrap/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace kizuna::bootstrap::net {

std::string Address::Host() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof(buf));
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof(buf));
  } else {
    return "?";
  }
  return buf;
}

uint16_t Address::Port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

std::string Address::ToString() const {
  if (family() == AF_INET6) return fmt::format("[{}]:{}", Host(), Port());
  if (family() == AF_INET) return fmt::format("{}:{}", Host(), Port());
  return "?";
}

Result<std::vector<Address>> Resolve(const HostPort& hp, std::string_view what) {
  std::vector<Address> out;
  // Literals first: no resolver involved, so no DNS wait.
  Address a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (inet_pton(AF_INET, hp.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(hp.port);
    a.length = sizeof(sockaddr_in);
    out.push_back(a);
    return out;
  }
  if (inet_pton(AF_INET6, hp.host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(hp.port);
    a.length = sizeof(sockaddr_in6);
    out.push_back(a);
    return out;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(hp.port);
  int rc = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return Unavailable(fmt::format("{}: cannot resolve host '{}': {}", what, hp.host,
                                   rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc)));
  }
  for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
    if (p->ai_family != AF_INET && p->ai_family != AF_INET6) continue;
    Address r;
    std::memcpy(&r.storage, p->ai_addr, p->ai_addrlen);
    r.length = p->ai_addrlen;
    out.push_back(r);
  }
  freeaddrinfo(res);
  if (out.empty()) return Unavailable(fmt::format("{}: host '{}' has no IPv4 or IPv6 address", what, hp.host));
  return out;
}

Address LocalAddress(int fd) {
  Address a;
  a.length = sizeof(a.storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0) a = Address();
  return a;
}

Address PeerAddress(int fd) {
  Address a;
  a.length = sizeof(a.storage);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0) a = Address();
  return a;
}

Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return FromErrno(errno, "fcntl(O_NONBLOCK)");
  return Status::Ok();
}

Result<UniqueFd> Listen(const Address& address) {
  UniqueFd fd(socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return FromErrno(errno, "socket");
  int one = 1;
  if (setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
    return FromErrno(errno, "setsockopt(SO_REUSEADDR)");
  if (bind(fd.get(), address.get(), address.length) != 0) {
    int err = errno;
    if (err == EADDRINUSE)
      return Unavailable(fmt::format("cannot listen on {}: the port is in use", address.ToString()));
    if (err == EADDRNOTAVAIL)
      return Unavailable(fmt::format("cannot listen on {}: not an address of this host", address.ToString()));
    return FromErrno(err, fmt::format("bind({})", address.ToString()));
  }
  // A backlog large enough that every rank of a big job can be queued while the root handshakes.
  if (listen(fd.get(), 4096) != 0) return FromErrno(errno, "listen");
  return fd;
}

Result<UniqueFd> ListenForRoot(const HostPort& root) {
  KZ_ASSIGN_OR_RETURN(std::vector<Address> addresses, Resolve(root, "root address"));
  Address bind_to = addresses.front();
  if (!IsLoopbackHost(root.host) && !IsLoopbackHost(bind_to.Host())) {
    // Every address of the family: the name the other ranks use may differ from what this host
    // calls itself (NAT, several interfaces, /etc/hosts mapping the host name to 127.0.1.1).
    Address any;
    if (bind_to.family() == AF_INET6) {
      auto* v6 = reinterpret_cast<sockaddr_in6*>(&any.storage);
      v6->sin6_family = AF_INET6;
      v6->sin6_addr = in6addr_any;
      v6->sin6_port = htons(root.port);
      any.length = sizeof(sockaddr_in6);
    } else {
      auto* v4 = reinterpret_cast<sockaddr_in*>(&any.storage);
      v4->sin_family = AF_INET;
      v4->sin_addr.s_addr = htonl(INADDR_ANY);
      v4->sin_port = htons(root.port);
      any.length = sizeof(sockaddr_in);
    }
    bind_to = any;
  }
  return Listen(bind_to);
}

int PollTimeoutMs(Deadline deadline) {
  auto ns = deadline.Remaining().count();
  if (ns <= 0) return 0;
  int64_t ms = (ns + 999'999) / 1'000'000;
  return static_cast<int>(std::min<int64_t>(ms, 1'000'000'000));
}

Status WaitReady(int fd, short events, Deadline deadline, std::string_view what) {
  while (true) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, PollTimeoutMs(deadline));
    if (r > 0) return Status::Ok();  // ready, or an error / hang-up the next call reports
    if (r < 0 && errno != EINTR) return FromErrno(errno, "poll");
    if (r == 0 && deadline.Expired()) return Timeout(fmt::format("{}: deadline passed", what));
  }
}

Status ReadExact(int fd, void* data, size_t length, Deadline deadline, std::string_view what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < length) {
    ssize_t n = recv(fd, p + got, length - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return RemoteError(fmt::format("{}: the peer closed the connection", what));
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      if (errno == ECONNRESET) return RemoteError(fmt::format("{}: the peer reset the connection", what));
      return FromErrno(errno, "recv");
    }
    KZ_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, what));
  }
  return Status::Ok();
}

Status WriteAll(int fd, const void* data, size_t length, Deadline deadline, std::string_view what) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < length) {
    ssize_t n = send(fd, p + done, length - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KZ_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, what));
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
      return RemoteError(fmt::format("{}: the peer closed the connection", what));
    return FromErrno(errno, "send");
  }
  return Status::Ok();
}

}  // namespace kizuna::bootstrap::net
