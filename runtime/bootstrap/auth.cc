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
constexpr uint16_t kVersion = 1;
constexpr std::string_view kServerLabel = "kizuna-bootstrap-v1 server";
constexpr std::string_view kClientLabel = "kizuna-bootstrap-v1 client";

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

// HMAC-SHA256(secret, label | client nonce | server nonce).
Result<std::array<uint8_t, kMacBytes>> Mac(const Secret& secret, std::string_view label,
                                          const std::array<uint8_t, kNonceBytes>& client_nonce,
                                          const std::array<uint8_t, kNonceBytes>& server_nonce) {
  uint8_t message[64 + 2 * kNonceBytes];
  static_assert(sizeof(message) >= kServerLabel.size() + 2 * kNonceBytes);
  std::memcpy(message, label.data(), label.size());
  std::memcpy(message + label.size(), client_nonce.data(), kNonceBytes);
  std::memcpy(message + label.size() + kNonceBytes, server_nonce.data(), kNonceBytes);
  std::array<uint8_t, kMacBytes> mac{};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message, label.size() + 2 * kNonceBytes,
           mac.data(), &length) == nullptr ||
      length != kMacBytes) {
    return Internal("HMAC-SHA256 (libcrypto) failed");
  }
  return mac;
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

Result<ClientHandshake> ClientHandshake::Start(const Secret& secret) {
  ClientHandshake h;
  h.secret_ = secret;
  KZ_RETURN_IF_ERROR(RandomBytes(h.nonce_.data(), h.nonce_.size()));
  PutHeader(h.hello_.data());
  std::memcpy(h.hello_.data() + 8, h.nonce_.data(), kNonceBytes);
  return h;
}

Result<ClientProof> ClientHandshake::OnServerHello(const ServerHello& reply) const {
  KZ_RETURN_IF_ERROR(CheckHeader(reply.data(), "the server's hello"));
  std::array<uint8_t, kNonceBytes> server_nonce;
  std::memcpy(server_nonce.data(), reply.data() + 8, kNonceBytes);
  KZ_ASSIGN_OR_RETURN(auto expected, Mac(secret_, kServerLabel, nonce_, server_nonce));
  if (CRYPTO_memcmp(expected.data(), reply.data() + 8 + kNonceBytes, kMacBytes) != 0)
    return RemoteError("the peer failed authentication: it does not know this job's secret (another job, or a "
                       "stale unique id?)");
  KZ_ASSIGN_OR_RETURN(auto proof, Mac(secret_, kClientLabel, nonce_, server_nonce));
  ClientProof out;
  std::memcpy(out.data(), proof.data(), kMacBytes);
  return out;
}

Result<ServerHandshake> ServerHandshake::Start(const Secret& secret) {
  ServerHandshake h;
  h.secret_ = secret;
  KZ_RETURN_IF_ERROR(RandomBytes(h.nonce_.data(), h.nonce_.size()));
  return h;
}

Result<ServerHello> ServerHandshake::OnClientHello(const ClientHello& hello) {
  KZ_RETURN_IF_ERROR(CheckHeader(hello.data(), "the client's hello"));
  std::memcpy(client_nonce_.data(), hello.data() + 8, kNonceBytes);
  got_hello_ = true;
  KZ_ASSIGN_OR_RETURN(auto mac, Mac(secret_, kServerLabel, client_nonce_, nonce_));
  ServerHello out;
  PutHeader(out.data());
  std::memcpy(out.data() + 8, nonce_.data(), kNonceBytes);
  std::memcpy(out.data() + 8 + kNonceBytes, mac.data(), kMacBytes);
  return out;
}

Status ServerHandshake::OnClientProof(const ClientProof& proof) const {
  if (!got_hello_) return Internal("ServerHandshake::OnClientProof before OnClientHello");
  KZ_ASSIGN_OR_RETURN(auto expected, Mac(secret_, kClientLabel, client_nonce_, nonce_));
  if (CRYPTO_memcmp(expected.data(), proof.data(), kMacBytes) != 0)
    return RemoteError("the client failed authentication: it does not know this job's secret (another job, or a "
                       "stale unique id?)");
  return Status::Ok();
}

Status AuthenticateAsClient(int fd, const Secret& secret, Deadline deadline, std::string_view peer) {
  std::string what = fmt::format("authenticating to {}", peer);
  KZ_ASSIGN_OR_RETURN(ClientHandshake h, ClientHandshake::Start(secret));
  KZ_RETURN_IF_ERROR(net::WriteAll(fd, h.hello().data(), h.hello().size(), deadline, what));
  ServerHello reply;
  KZ_RETURN_IF_ERROR(net::ReadExact(fd, reply.data(), reply.size(), deadline, what));
  Result<ClientProof> proof = h.OnServerHello(reply);
  if (!proof.ok()) return proof.status().WithContext(what);
  return net::WriteAll(fd, proof->data(), proof->size(), deadline, what);
}

Status AuthenticateAsServer(int fd, const Secret& secret, Deadline deadline, std::string_view peer) {
  std::string what = fmt::format("authenticating {}", peer);
  KZ_ASSIGN_OR_RETURN(ServerHandshake h, ServerHandshake::Start(secret));
  ClientHello hello;
  KZ_RETURN_IF_ERROR(net::ReadExact(fd, hello.data(), hello.size(), deadline, what));
  Result<ServerHello> reply = h.OnClientHello(hello);
  if (!reply.ok()) return reply.status().WithContext(what);
  KZ_RETURN_IF_ERROR(net::WriteAll(fd, reply->data(), reply->size(), deadline, what));
  ClientProof proof;
  KZ_RETURN_IF_ERROR(net::ReadExact(fd, proof.data(), proof.size(), deadline, what));
  return h.OnClientProof(proof).WithContext(what);
}

}  // namespace kizuna::bootstrap
