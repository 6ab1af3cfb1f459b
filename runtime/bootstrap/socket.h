// TCP socket helpers of the bootstrap (internal to runtime/bootstrap): address resolution and
// formatting, listening sockets, and blocking reads/writes with a deadline.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::bootstrap::net {

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  // The numeric host ("10.0.0.1", "fd00::2") and port.
  std::string Host() const;
  uint16_t Port() const;
  // "10.0.0.1:29501" or "[fd00::2]:29501".
  std::string ToString() const;
};

// Resolves a host (literals without DNS; names through getaddrinfo, which the system resolver
// bounds with its own timeouts) to TCP addresses. `what` names the address in errors.
Result<std::vector<Address>> Resolve(const HostPort& hp, std::string_view what);

// The local / remote address of a connected socket ("?" parts when unavailable).
Address LocalAddress(int fd);
Address PeerAddress(int fd);

// A non-blocking, close-on-exec listening socket bound to `address` (SO_REUSEADDR, so a port in
// TIME_WAIT from an earlier run can be reused).
Result<UniqueFd> Listen(const Address& address);

// The root's listening socket for `root`: bound to root.host when it is a loopback address,
// otherwise to the wildcard address of its family; port 0 picks an ephemeral port.
Result<UniqueFd> ListenForRoot(const HostPort& root);

// Waits until `fd` is ready for `events` (POLLIN / POLLOUT); kTimeout naming `what` at the deadline.
Status WaitReady(int fd, short events, Deadline deadline, std::string_view what);

// Reads exactly `length` bytes; kRemoteError when the peer closes first, kTimeout at the deadline.
Status ReadExact(int fd, void* data, size_t length, Deadline deadline, std::string_view what);

// Writes all `length` bytes (MSG_NOSIGNAL: a closed peer is kRemoteError, never SIGPIPE).
Status WriteAll(int fd, const void* data, size_t length, Deadline deadline, std::string_view what);

Status SetNonBlocking(int fd);

// Milliseconds to pass to poll() for a deadline: rounded up, at least 0, at most ~12 days.
int PollTimeoutMs(Deadline deadline);

}  // namespace kizuna::bootstrap::net
