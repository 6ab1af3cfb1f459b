#include "runtime/bootstrap/auth.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "runtime/bootstrap/socket.h"
#include "runtime/core/random.h"
#include "runtime/core/wire.h"

namespace kizuna::bootstrap {
namespace {

constexpr uint8_t kMagic[4] = {'K', 'Z', 'B', '1'};
// Version 2 binds the ranks at both ends into the MACs (version 1 did not).
constexpr uint16_t kVersion = 2;
constexpr std::string_view kServerLabel = "kizuna-bootstrap-v2 server";
constexpr std::string_view kClientLabel = "kizuna-bootstrap-v2 client";
static_assert(kServerLabel.size() == kClientLabel.size(), "the MAC input has one layout for both directions");

// HMAC-SHA256(secret, label | client hello | server nonce). The hello carries the client nonce and
// the route, so both are covered.
Result<std::array<uint8_t, kMacBytes>> Mac(const Secret& secret, std::string_view label, const ClientHello& hello,
                                          const std::array<uint8_t, kServerNonceBytes>& server_nonce) {
  uint8_t message[kServerLabel.size() + kClientHelloBytes + kServerNonceBytes];
  std::memcpy(message, label.data(), label.size());
  std::memcpy(message + label.size(), hello.data(), kClientHelloBytes);
  std::memcpy(message + label.size() + kClientHelloBytes, server_nonce.data(), kServerNonceBytes);
  std::array<uint8_t, kMacBytes> mac{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message, sizeof(message), mac.data(),
           &length) == nullptr ||
      length != kMacBytes) {
    return Internal("HMAC-SHA256 (libcrypto) failed");
  }
  return mac;
}

// The 8 bytes both hellos start with: the magic, the version (u16) and a zero u16.
constexpr size_t kHeaderBytes = 8;
static_assert(kClientHelloBytes == kHeaderBytes + 8 + kClientNonceBytes);
static_assert(kServerHelloBytes == kHeaderBytes + kServerNonceBytes + kMacBytes);

void PutHeader(wire::Bytes& out) {
  out.insert(out.end(), std::begin(kMagic), std::end(kMagic));
  wire::PutU16(out, kVersion);
  wire::PutU16(out, 0);
}

// Reads the header off `in` (a whole fixed-size message, so no read falls short).
Status CheckHeader(wire::Reader& in, std::string_view what) {
  if (!std::ranges::equal(in.Take(sizeof kMagic), kMagic))
    return InvalidArgument(fmt::format("{} does not start with the kizuna bootstrap magic (not a kizuna rank)", what));
  const uint16_t version = in.U16();
  in.U16();
  if (version != kVersion)
    return InvalidArgument(fmt::format("{} has protocol version {} (this build speaks {})", what, version, kVersion));
  return Status::Ok();
}

}  // namespace

Result<ClientHandshake> ClientHandshake::Start(const Secret& secret, Route route) {
  ClientHandshake h;
  h.secret_ = secret;
  wire::Bytes fixed;
  PutHeader(fixed);
  wire::PutU32(fixed, route.from);
  wire::PutU32(fixed, route.to);
  std::copy(fixed.begin(), fixed.end(), h.hello_.begin());
  KZ_RETURN_IF_ERROR(RandomBytes(h.hello_.data() + fixed.size(), kClientNonceBytes));
  return h;
}

Result<ClientProof> ClientHandshake::OnServerHello(const ServerHello& reply) const {
  wire::Reader in(reply);
  KZ_RETURN_IF_ERROR(CheckHeader(in, "the server's hello"));
  std::array<uint8_t, kServerNonceBytes> server_nonce;
  std::ranges::copy(in.Take(kServerNonceBytes), server_nonce.begin());
  const std::span<const uint8_t> mac = in.Take(kMacBytes);
  // The MAC over this client's own hello: a server that saw a different one (another rank's
  // address, another nonce) cannot have produced it.
  KZ_ASSIGN_OR_RETURN(auto expected, Mac(secret_, kServerLabel, hello_, server_nonce));
  if (CRYPTO_memcmp(expected.data(), mac.data(), kMacBytes) != 0)
    return RemoteError(
        "authentication failed: the secret of this rank's unique id does not match the peer's (a "
        "unique id of another job, or a stale KIZUNA_UNIQUE_ID / KIZUNA_UNIQUE_ID_FILE?); give every "
        "rank the unique id of the same job");
  KZ_ASSIGN_OR_RETURN(auto proof, Mac(secret_, kClientLabel, hello_, server_nonce));
  ClientProof out;
  std::memcpy(out.data(), proof.data(), kMacBytes);
  return out;
}

Result<ServerHandshake> ServerHandshake::Start(const Secret& secret, uint32_t self) {
  ServerHandshake h;
  h.secret_ = secret;
  h.self_ = self;
  KZ_RETURN_IF_ERROR(RandomBytes(h.nonce_.data(), h.nonce_.size()));
  return h;
}

Result<ServerHello> ServerHandshake::OnClientHello(const ClientHello& hello) {
  wire::Reader in(hello);
  KZ_RETURN_IF_ERROR(CheckHeader(in, "the client's hello"));
  const uint32_t from = in.U32();
  const uint32_t to = in.U32();
  if (to != self_)
    return InvalidArgument(fmt::format("the client's hello is addressed to rank {}, not to this rank ({}): a "
                                       "handshake meant for another rank",
                                       to, self_));
  hello_ = hello;
  client_rank_ = from;
  got_hello_ = true;
  KZ_ASSIGN_OR_RETURN(auto mac, Mac(secret_, kServerLabel, hello_, nonce_));
  wire::Bytes reply;
  PutHeader(reply);
  reply.insert(reply.end(), nonce_.begin(), nonce_.end());
  reply.insert(reply.end(), mac.begin(), mac.end());
  ServerHello out;
  std::copy(reply.begin(), reply.end(), out.begin());
  return out;
}

Status ServerHandshake::OnClientProof(const ClientProof& proof) const {
  if (!got_hello_) return Internal("ServerHandshake::OnClientProof before OnClientHello");
  KZ_ASSIGN_OR_RETURN(auto expected, Mac(secret_, kClientLabel, hello_, nonce_));
  if (CRYPTO_memcmp(expected.data(), proof.data(), kMacBytes) != 0)
    return RemoteError(
        "the client failed authentication: it does not know this job's secret (a rank of another "
        "job, or one given a stale KIZUNA_UNIQUE_ID / KIZUNA_UNIQUE_ID_FILE?)");
  return Status::Ok();
}

Status AuthenticateAsClient(int fd, const Secret& secret, Route route, Deadline deadline, std::string_view peer) {
  std::string what = fmt::format("authenticating to {}", peer);
  KZ_ASSIGN_OR_RETURN(ClientHandshake h, ClientHandshake::Start(secret, route));
  KZ_RETURN_IF_ERROR(net::WriteAll(fd, h.hello().data(), h.hello().size(), deadline, what));
  ServerHello reply;
  KZ_RETURN_IF_ERROR(net::ReadExact(fd, reply.data(), reply.size(), deadline, what));
  Result<ClientProof> proof = h.OnServerHello(reply);
  if (!proof.ok()) return proof.status().WithContext(what);
  return net::WriteAll(fd, proof->data(), proof->size(), deadline, what);
}

Result<uint32_t> AuthenticateAsServer(int fd, const Secret& secret, uint32_t self, Deadline deadline,
                                      std::string_view peer) {
  std::string what = fmt::format("authenticating {}", peer);
  KZ_ASSIGN_OR_RETURN(ServerHandshake h, ServerHandshake::Start(secret, self));
  ClientHello hello;
  KZ_RETURN_IF_ERROR(net::ReadExact(fd, hello.data(), hello.size(), deadline, what));
  Result<ServerHello> reply = h.OnClientHello(hello);
  if (!reply.ok()) return reply.status().WithContext(what);
  KZ_RETURN_IF_ERROR(net::WriteAll(fd, reply->data(), reply->size(), deadline, what));
  ClientProof proof;
  KZ_RETURN_IF_ERROR(net::ReadExact(fd, proof.data(), proof.size(), deadline, what));
  KZ_RETURN_IF_ERROR(h.OnClientProof(proof).WithContext(what));
  return h.client_rank();
}

}  // namespace kizuna::bootstrap
