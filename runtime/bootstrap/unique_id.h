// The rendezvous id of a kizuna job (ncclUniqueId's counterpart): where the root listens and the
// job's secret.
//
// Printable as one token, `kz1:HOST:PORT:SECRET`, e.g.
//   kz1:127.0.0.1:29501:0123456789abcdef0123456789abcdef
//   kz1:[fd00::2]:29501:0123456789abcdef0123456789abcdef      (IPv6 literals in brackets)
//   kz1:node-17.cluster:29501:0123456789abcdef0123456789abcdef
// SECRET is 128 bits from getrandom(), 32 lower-case hex digits. Anyone who has the text can join
// the job, so treat it like a password: kizuna never logs it (Redacted() replaces the secret).
//
// Like NCCL: rank 0 calls GetUniqueId() and the application distributes ToString() to every rank
// (MPI_Bcast, a torch store, a file); each rank parses it and creates its Bootstrap. Without an
// application doing that, launch_env.h obtains the id from KIZUNA_UNIQUE_ID or
// KIZUNA_UNIQUE_ID_FILE (kizuna-run sets KIZUNA_UNIQUE_ID).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "runtime/core/config.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::bootstrap {

// A TCP endpoint: an IPv4 literal, an IPv6 literal (stored without brackets) or a host name, and a
// port. Port 0 appears only in a request for "any free port" (CreateUniqueId).
struct HostPort {
  std::string host;
  uint16_t port = 0;

  // "10.0.0.1:29501", "[fd00::2]:29501", "node-17:29501".
  std::string ToString() const;
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

// Parses "host:port" or "[ipv6]:port" (port 1..65535). `what` names the text's origin in errors
// ("KIZUNA_ROOT").
Result<HostPort> ParseHostPort(std::string_view text, std::string_view what);

// Checks a host field: an IPv4 or IPv6 literal, or a host name of letters, digits, '-', '_' and
// '.' (at most 253 characters, labels of at most 63).
Status ValidateHost(std::string_view host, std::string_view what);

// True for 127.0.0.0/8, ::1, ::ffff:127.x.y.z and "localhost".
bool IsLoopbackHost(std::string_view host);

using Secret = std::array<uint8_t, 16>;

// 128 random bits from getrandom() (blocks only until the kernel's pool is initialised at boot).
Result<Secret> RandomSecret();

struct UniqueId {
  HostPort root;  // where rank 0 listens; port is never 0
  Secret secret{};

  // The printable form (contains the secret).
  std::string ToString() const;
  // The printable form with the secret replaced by "****", for logs and error messages.
  std::string Redacted() const;

  // Parses ToString()'s form; surrounding whitespace is ignored. Errors are kInvalidArgument and
  // say which part is wrong (prefix, host, port, secret), without repeating the secret.
  static Result<UniqueId> Parse(std::string_view text);

  friend bool operator==(const UniqueId&, const UniqueId&) = default;
};

// A fresh id for a root that will listen at `root`. The listening socket is opened now, so the port
// is known to be free and stays reserved: port 0 picks an ephemeral port (filled into the id), and a
// rank-0 TCP Bootstrap created later in this process with this id adopts the socket (a Bootstrap in
// another process binds the port itself). The root listens on `root.host` when it is a loopback
// address, otherwise on every address of that family (authentication, not the bind address, keeps
// strangers out). A host name is resolved here.
Result<UniqueId> CreateUniqueId(const HostPort& root);

// ncclGetUniqueId's counterpart; call it on rank 0 only. The root address is, in order:
// KIZUNA_ROOT (host:port); MASTER_ADDR:(MASTER_PORT+1) under torchrun (never MASTER_PORT itself,
// where torchrun's store listens); otherwise the first non-loopback IPv4 address of this host
// (then a global IPv6 one, then 127.0.0.1) with an ephemeral port. `env` holds the process
// environment (launch_env.h: ProcessEnvironment()).
Result<UniqueId> GetUniqueId(const Config& config, const std::map<std::string, std::string>& env);
// The same, from GlobalConfig() and the process environment.
Result<UniqueId> GetUniqueId();

namespace internal {
// The socket CreateUniqueId reserved for `port`, if this process holds one (taken: a second call
// returns an invalid fd).
UniqueFd TakeReservedListener(uint16_t port);
}  // namespace internal

}  // namespace kizuna::bootstrap
