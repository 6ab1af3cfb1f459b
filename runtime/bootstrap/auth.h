// The bootstrap handshake: every TCP connection between ranks proves, in both directions, that
// both ends know the job's secret (UniqueId::secret) before anything else is read from it.
//
// Mutual challenge-response with HMAC-SHA256 (OpenSSL libcrypto) over fresh nonces from both
// sides; the secret never crosses the wire. Three fixed-size messages:
//
//   client -> server  ClientHello  "KZB1", version, client nonce Nc (32 random bytes)     40 bytes
//   server -> client  ServerHello  "KZB1", version, server nonce Ns,
//                                  HMAC(secret, "kizuna-bootstrap-v1 server" | Nc | Ns)  72 bytes
//   client -> server  ClientProof  HMAC(secret, "kizuna-bootstrap-v1 client" | Nc | Ns)  32 bytes
//
// The client checks the server's MAC before it proves itself; the server checks the client's MAC
// before it reads anything else. The direction labels keep a MAC of one side from being replayed
// as the other's, and the nonces keep a recorded exchange from being replayed later. MACs are
// compared in constant time (CRYPTO_memcmp). A peer reading only these fixed sizes cannot be made
// to allocate or parse anything else by a stranger.
//
// Scope: this authenticates; it does not encrypt or protect the bytes that follow (as NCCL's
// bootstrap does not). An attacker who can rewrite traffic on the path could still interfere.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/deadline.h"
#include "runtime/status.h"

namespace kizuna::bootstrap {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kClientHelloBytes = 8 + kNonceBytes;
inline constexpr size_t kServerHelloBytes = 8 + kNonceBytes + kMacBytes;
inline constexpr size_t kClientProofBytes = kMacBytes;

using ClientHello = std::array<uint8_t, kClientHelloBytes>;
using ServerHello = std::array<uint8_t, kServerHelloBytes>;
using ClientProof = std::array<uint8_t, kClientProofBytes>;

// The connecting side. Start() draws the nonce; the object is used for one connection.
class ClientHandshake {
 public:
  static Result<ClientHandshake> Start(const Secret& secret);

  const ClientHello& hello() const { return hello_; }

  // Checks the server's reply: kInvalidArgument when it does not speak this protocol (magic,
  // version), kRemoteError when its MAC is wrong (it does not know the secret: another job, a
  // stale id). On success returns the proof to send.
  Result<ClientProof> OnServerHello(const ServerHello& reply) const;

 private:
  ClientHandshake() = default;
  Secret secret_{};
  std::array<uint8_t, kNonceBytes> nonce_{};
  ClientHello hello_{};
};

// The accepting side. Start() draws the nonce; the object is used for one connection.
class ServerHandshake {
 public:
  static Result<ServerHandshake> Start(const Secret& secret);

  // Checks the client's hello (magic, version): kInvalidArgument for anything else (garbage, a
  // port scanner's probe, another protocol). On success returns the reply to send.
  Result<ServerHello> OnClientHello(const ClientHello& hello);

  // Checks the client's proof: kRemoteError when the MAC is wrong. Only valid after
  // OnClientHello succeeded.
  Status OnClientProof(const ClientProof& proof) const;

 private:
  ServerHandshake() = default;
  Secret secret_{};
  std::array<uint8_t, kNonceBytes> nonce_{};
  std::array<uint8_t, kNonceBytes> client_nonce_{};
  bool got_hello_ = false;
};

// The whole exchange on a connected stream socket (blocking or not), each side in one call, every
// read of a fixed size and bounded by `deadline` (kTimeout when the peer stays silent, kRemoteError
// when it closes). `peer` names the other end in error messages.
Status AuthenticateAsClient(int fd, const Secret& secret, Deadline deadline, std::string_view peer);
Status AuthenticateAsServer(int fd, const Secret& secret, Deadline deadline, std::string_view peer);

}  // namespace kizuna::bootstrap
