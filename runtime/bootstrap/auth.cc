#include "runtime/bootstrap/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "runtime/bootstrap/socket.h"

namespace kizuna::bootstrap {
namespace {

constexpr uint8_t kMagic[4] = {'K', 'Z', 'B', '1'};
// Version 2 binds the ranks at both ends into the MACs (version 1 did not).
constexpr uint16_t kVersion = 2;
constexpr std::string_view kServerLabel = "kizuna-bootstrap-v2 server";
constexpr std::string_view kClientLabel = "kizuna-bootstrap-v2 client";
static_assert(kServerLabel.size() == kClientLabel.size(), "the MAC input has one layout for both directions");

Status RandomBytes(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(out + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return FromErrno(errno, "getrandom");
    }
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

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

void PutU32(uint8_t* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t GetU32(const uint8_t* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{in[i]} << (8 * i);
  return v;
}

void PutHeader(uint8_t* out) {
  std::memcpy(out, kMagic, 4);
  out[4] = static_cast<uint8_t>(kVersion & 0xff);
  out[5] = static_cast<uint8_t>(kVersion >> 8);
  out[6] = 0;
  out[7] = 0;
}

Status CheckHeader(const uint8_t* in, std::string_view what) {
  if (std::memcmp(in, kMagic, 4) != 0)
    return InvalidArgument(fmt::format("{} does not start with the kizuna bootstrap magic (not a kizuna rank)", what));
  uint16_t version = static_cast<uint16_t>(in[4] | in[5] << 8);
  if (version != kVersion)
    return InvalidArgument(fmt::format("{} has protocol version {} (this build speaks {})", what, version, kVersion));
  return Status::Ok();
}

}  // namespace

Result<ClientHandshake> ClientHandshake::Start(const Secret& secret, Route route) {
  ClientHandshake h;
  h.secret_ = secret;
  PutHeader(h.hello_.data());
  PutU32(h.hello_.data() + 8, route.from);
  PutU32(h.hello_.data() + 12, route.to);
  KZ_RETURN_IF_ERROR(RandomBytes(h.hello_.data() + 16, kClientNonceBytes));
  return h;
}

Result<ClientProof> ClientHandshake::OnServerHello(const ServerHello& reply) const {
  KZ_RETURN_IF_ERROR(CheckHeader(reply.data(), "the server's hello"));
  std::array<uint8_t, kServerNonceBytes> server_nonce;
  std::memcpy(server_nonce.data(), reply.data() + 8, kServerNonceBytes);
  // The MAC over this client's own hello: a server that saw a different one (another rank's
  // address, another nonce) cannot have produced it.
  KZ_ASSIGN_OR_RETURN(auto expected, Mac(secret_, kServerLabel, hello_, server_nonce));
  if (CRYPTO_memcmp(expected.data(), reply.data() + 8 + kServerNonceBytes, kMacBytes) != 0)
    return RemoteError("the peer failed authentication: it does not know this job's secret (another job, or a "
                       "stale unique id?)");
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
  KZ_RETURN_IF_ERROR(CheckHeader(hello.data(), "the client's hello"));
  uint32_t to = GetU32(hello.data() + 12);
  if (to != self_)
    return InvalidArgument(fmt::format("the client's hello is addressed to rank {}, not to this rank ({}): a "
                                       "handshake meant for another rank",
                                       to, self_));
  hello_ = hello;
  client_rank_ = GetU32(hello.data() + 8);
  got_hello_ = true;
  KZ_ASSIGN_OR_RETURN(auto mac, Mac(secret_, kServerLabel, hello_, nonce_));
  ServerHello out;
  PutHeader(out.data());
  std::memcpy(out.data() + 8, nonce_.data(), kServerNonceBytes);
  std::memcpy(out.data() + 8 + kServerNonceBytes, mac.data(), kMacBytes);
  return out;
}

Status ServerHandshake::OnClientProof(const ClientProof& proof) const {
  if (!got_hello_) return Internal("ServerHandshake::OnClientProof before OnClientHello");
  KZ_ASSIGN_OR_RETURN(auto expected, Mac(secret_, kClientLabel, hello_, nonce_));
  if (CRYPTO_memcmp(expected.data(), proof.data(), kMacBytes) != 0)
    return RemoteError("the client failed authentication: it does not know this job's secret (another job, or a "
                       "stale unique id?)");
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
