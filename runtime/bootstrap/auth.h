// The bootstrap handshake: every TCP connection between ranks proves, in both directions, that
// both ends know the job's secret (UniqueId::secret) before anything else is read from it.
//
// Mutual challenge-response with HMAC-SHA256 (OpenSSL libcrypto) over fresh nonces from both
// sides; the secret never crosses the wire. Three fixed-size messages (integers little-endian):
//
//   client -> server  ClientHello  "KZB1", version 2, 0, from rank, to rank,
//                                  client nonce Nc (24 random bytes)                       40 bytes
//   server -> client  ServerHello  "KZB1", version 2, 0, server nonce Ns (32 random bytes),
//                                  HMAC(secret, "kizuna-bootstrap-v2 server" | ClientHello | Ns)
//                                                                                          72 bytes
//   client -> server  ClientProof  HMAC(secret, "kizuna-bootstrap-v2 client" | ClientHello | Ns)
//                                                                                          32 bytes
//
// The client checks the server's MAC before it proves itself; the server checks the client's MAC
// before it reads anything else. What the handshake rules out, for a party without the secret:
//   - replay: a recorded exchange fails, the other side's nonce is fresh every time;
//   - reflection of a message: the direction labels keep a server's MAC from passing as a client's
//     proof (or the reverse);
//   - relaying a whole handshake to another endpoint (a party that receives a connection meant for
//     rank B, e.g. on the port of a rank that has left, passes it on to rank C or back to the
//     sender's own listener, to end up holding an authenticated connection): the hello names the
//     ranks at both ends and both MACs cover it, the server accepts only hellos addressed to
//     itself, and a rewritten address breaks the MAC the client checks;
//   - guessing: MACs are compared in constant time (CRYPTO_memcmp); errors never contain the
//     secret or a MAC.
// A peer reading only these fixed sizes cannot be made to allocate or parse anything else by a
// stranger. The client nonce is 24 bytes (192 bits, ample for uniqueness) so that the hello keeps
// the size it had in version 1, and a build of either version names the other's version instead of
// waiting for bytes that never come.
//
// Scope: this authenticates; it does not encrypt or protect the bytes that follow (as NCCL's
// bootstrap does not). An attacker who can rewrite traffic on the path between the two intended
// ends could still interfere.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {

inline constexpr size_t kClientNonceBytes = 24;
inline constexpr size_t kServerNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kClientHelloBytes = 8 + 8 + kClientNonceBytes;
inline constexpr size_t kServerHelloBytes = 8 + kServerNonceBytes + kMacBytes;
inline constexpr size_t kClientProofBytes = kMacBytes;

using ClientHello = std::array<uint8_t, kClientHelloBytes>;
using ServerHello = std::array<uint8_t, kServerHelloBytes>;
using ClientProof = std::array<uint8_t, kClientProofBytes>;

// The ranks at the two ends of a connection: rank `from` connects to rank `to`.
struct Route {
  uint32_t from = 0;
  uint32_t to = 0;
};

// The connecting side. Start() draws the nonce; the object is used for one connection.
class ClientHandshake {
 public:
  static Result<ClientHandshake> Start(const Secret& secret, Route route);

  const ClientHello& hello() const { return hello_; }

  // Checks the server's reply: kInvalidArgument when it does not speak this protocol (magic,
  // version), kRemoteError when its MAC is wrong (it does not know the secret: another job, a
  // stale id). On success returns the proof to send.
  Result<ClientProof> OnServerHello(const ServerHello& reply) const;

 private:
  ClientHandshake() = default;
  Secret secret_{};
  ClientHello hello_{};
};

// The accepting side, rank `self`. Start() draws the nonce; the object is used for one connection.
class ServerHandshake {
 public:
  static Result<ServerHandshake> Start(const Secret& secret, uint32_t self);

  // Checks the client's hello: kInvalidArgument when it does not speak this protocol (garbage, a
  // port scanner's probe, another protocol or version) or is addressed to another rank. On
  // success returns the reply to send.
  Result<ServerHello> OnClientHello(const ClientHello& hello);

  // Checks the client's proof: kRemoteError when the MAC is wrong. Only valid after
  // OnClientHello succeeded.
  Status OnClientProof(const ClientProof& proof) const;

  // The rank the client says it is (its hello's `from`); authenticated once OnClientProof succeeded.
  uint32_t client_rank() const { return client_rank_; }

 private:
  ServerHandshake() = default;
  Secret secret_{};
  uint32_t self_ = 0;
  std::array<uint8_t, kServerNonceBytes> nonce_{};
  ClientHello hello_{};
  uint32_t client_rank_ = 0;
  bool got_hello_ = false;
};

// The whole exchange on a connected stream socket (blocking or not), each side in one call, every
// read of a fixed size and bounded by `deadline` (kTimeout when the peer stays silent, kRemoteError
// when it closes). `peer` names the other end in error messages. The server side returns the
// client's (authenticated) rank.
Status AuthenticateAsClient(int fd, const Secret& secret, Route route, Deadline deadline, std::string_view peer);
Result<uint32_t> AuthenticateAsServer(int fd, const Secret& secret, uint32_t self, Deadline deadline,
                                      std::string_view peer);

}  // namespace kizuna::bootstrap
