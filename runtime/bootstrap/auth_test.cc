// The handshake, message by message and over a socket pair: both sides succeed only with the same
// secret; garbage, another version, silence, a forged proof and replayed messages are refused.
#include "runtime/bootstrap/auth.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/bootstrap/test_util.h"

namespace kizuna::bootstrap {
namespace {

using testing::Contains;
using testing::In;

Secret MakeSecret(uint8_t seed) {
  Secret s;
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(seed * 31 + i);
  return s;
}

struct Pair {
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    client.Reset(fds[0]);
    server.Reset(fds[1]);
  }
  UniqueFd client, server;
};

// Runs both sides concurrently.
std::pair<Status, Status> RunBothSides(const Secret& client_secret, const Secret& server_secret) {
  Pair p;
  Status server_status;
  std::thread server([&] {
    server_status = AuthenticateAsServer(p.server.get(), server_secret, In(5), "the client");
    p.server.Reset();  // a rejecting server closes, as the bootstrap does
  });
  Status client_status = AuthenticateAsClient(p.client.get(), client_secret, In(5), "the server");
  p.client.Reset();
  server.join();
  return {client_status, server_status};
}

TEST(Handshake, SameSecretAuthenticatesBothSides) {
  auto [c, s] = RunBothSides(MakeSecret(1), MakeSecret(1));
  EXPECT_TRUE(c.ok()) << c.ToString();
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(Handshake, DifferentSecretsFailBothSides) {
  auto [c, s] = RunBothSides(MakeSecret(1), MakeSecret(2));
  // The client finds out first (the server's MAC) and never proves anything; the server sees it go.
  EXPECT_EQ(c.code(), StatusCode::kRemoteError) << c.ToString();
  EXPECT_TRUE(Contains(c.message(), "does not know this job's secret")) << c.message();
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
}

TEST(Handshake, GarbageIsRefusedWithoutReadingMore) {
  Pair p;
  std::string junk(kClientHelloBytes + 100, 'x');
  ASSERT_EQ(write(p.client.get(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  Status s = AuthenticateAsServer(p.server.get(), MakeSecret(1), In(5), "a stranger");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "magic")) << s.message();
  // Exactly the hello's size was read; the rest is still in the socket, untouched.
  char rest[200];
  ssize_t n = recv(p.server.get(), rest, sizeof(rest), MSG_DONTWAIT);
  EXPECT_EQ(n, 100);
}

TEST(Handshake, AnotherVersionIsRefused) {
  auto h = ClientHandshake::Start(MakeSecret(1));
  ASSERT_TRUE(h.ok());
  ClientHello hello = h->hello();
  hello[4] = 9;  // version 9
  auto server = ServerHandshake::Start(MakeSecret(1));
  ASSERT_TRUE(server.ok());
  auto reply = server->OnClientHello(hello);
  EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(reply.status().message(), "version 9")) << reply.status().message();
}

TEST(Handshake, SilenceTimesOut) {
  Pair p;
  auto start = std::chrono::steady_clock::now();
  Status s = AuthenticateAsServer(p.server.get(), MakeSecret(1), In(0.2), "a silent peer");
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST(Handshake, PeerClosingIsARemoteError) {
  Pair p;
  p.client.Reset();
  Status s = AuthenticateAsServer(p.server.get(), MakeSecret(1), In(5), "a peer");
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
}

TEST(Handshake, ForgedProofIsRefused) {
  auto client = ClientHandshake::Start(MakeSecret(1));
  auto server = ServerHandshake::Start(MakeSecret(2));
  ASSERT_TRUE(client.ok() && server.ok());
  ASSERT_TRUE(server->OnClientHello(client->hello()).ok());
  ClientProof forged{};
  Status s = server->OnClientProof(forged);
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_TRUE(Contains(s.message(), "failed authentication")) << s.message();
}

TEST(Handshake, MessagesAreBoundToTheirNoncesAndDirection) {
  const Secret secret = MakeSecret(7);
  // An honest exchange.
  auto c1 = ClientHandshake::Start(secret);
  auto s1 = ServerHandshake::Start(secret);
  ASSERT_TRUE(c1.ok() && s1.ok());
  auto reply1 = s1->OnClientHello(c1->hello());
  ASSERT_TRUE(reply1.ok());
  auto proof1 = c1->OnServerHello(*reply1);
  ASSERT_TRUE(proof1.ok());
  EXPECT_TRUE(s1->OnClientProof(*proof1).ok());

  // A recorded server reply does not convince another client (its nonce differs).
  auto c2 = ClientHandshake::Start(secret);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->OnServerHello(*reply1).status().code(), StatusCode::kRemoteError);

  // A recorded proof does not convince another server (its nonce differs).
  auto s2 = ServerHandshake::Start(secret);
  ASSERT_TRUE(s2.ok());
  ASSERT_TRUE(s2->OnClientHello(c1->hello()).ok());
  EXPECT_EQ(s2->OnClientProof(*proof1).code(), StatusCode::kRemoteError);

  // The server's own MAC reflected back as a client proof is refused (direction labels).
  ClientProof reflected;
  std::memcpy(reflected.data(), reply1->data() + 8 + kNonceBytes, kMacBytes);
  EXPECT_EQ(s1->OnClientProof(reflected).code(), StatusCode::kRemoteError);

  // Fresh nonces every time.
  EXPECT_NE(c1->hello(), c2->hello());
}

}  // namespace
}  // namespace kizuna::bootstrap
