// The handshake, message by message and over a socket pair: both sides succeed only with the same
// secret; garbage, another version, silence, a forged proof, replayed or reflected messages, and a
// handshake relayed to a rank it was not meant for are refused; errors never carry the secret.
#include "runtime/bootstrap/auth.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
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

// Runs both sides concurrently: rank 1 connects to rank 0.
std::pair<Status, Result<uint32_t>> RunBothSides(const Secret& client_secret, const Secret& server_secret) {
  Pair p;
  Result<uint32_t> server_result = Internal("not run");
  std::thread server([&] {
    server_result = AuthenticateAsServer(p.server.get(), server_secret, 0, In(5), "the client");
    p.server.Reset();  // a rejecting server closes, as the bootstrap does
  });
  Status client_status = AuthenticateAsClient(p.client.get(), client_secret, Route{1, 0}, In(5), "the server");
  p.client.Reset();
  server.join();
  return {client_status, std::move(server_result)};
}

TEST(Handshake, SameSecretAuthenticatesBothSides) {
  auto [c, s] = RunBothSides(MakeSecret(1), MakeSecret(1));
  EXPECT_TRUE(c.ok()) << c.ToString();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, 1u) << "the server learns who the client is";
}

TEST(Handshake, DifferentSecretsFailBothSides) {
  auto [c, s] = RunBothSides(MakeSecret(1), MakeSecret(2));
  // The client finds out first (the server's MAC) and never proves anything; the server sees it go.
  EXPECT_EQ(c.code(), StatusCode::kRemoteError) << c.ToString();
  EXPECT_TRUE(Contains(c.message(), "the secret of this rank's unique id does not match")) << c.message();
  EXPECT_TRUE(Contains(c.message(), "KIZUNA_UNIQUE_ID")) << c.message();
  EXPECT_EQ(s.status().code(), StatusCode::kRemoteError) << s.status().ToString();
}

TEST(Handshake, GarbageIsRefusedWithoutReadingMore) {
  Pair p;
  std::string junk(kClientHelloBytes + 100, 'x');
  ASSERT_EQ(write(p.client.get(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  Status s = AuthenticateAsServer(p.server.get(), MakeSecret(1), 0, In(5), "a stranger").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "magic")) << s.message();
  // Exactly the hello's size was read; the rest is still in the socket, untouched.
  char rest[200];
  ssize_t n = recv(p.server.get(), rest, sizeof(rest), MSG_DONTWAIT);
  EXPECT_EQ(n, 100);
}

TEST(Handshake, AnotherVersionIsRefused) {
  auto h = ClientHandshake::Start(MakeSecret(1), Route{1, 0});
  ASSERT_TRUE(h.ok());
  for (uint8_t version : {9, 1}) {  // a future one, and the one before route binding
    ClientHello hello = h->hello();
    hello[4] = version;
    auto server = ServerHandshake::Start(MakeSecret(1), 0);
    ASSERT_TRUE(server.ok());
    auto reply = server->OnClientHello(hello);
    EXPECT_EQ(reply.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(reply.status().message(), fmt::format("version {} (this build speaks 2)", version)))
        << reply.status().message();
  }
}

TEST(Handshake, SilenceTimesOut) {
  Pair p;
  auto start = std::chrono::steady_clock::now();
  Status s = AuthenticateAsServer(p.server.get(), MakeSecret(1), 0, In(0.2), "a silent peer").status();
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST(Handshake, PeerClosingIsARemoteError) {
  Pair p;
  p.client.Reset();
  Status s = AuthenticateAsServer(p.server.get(), MakeSecret(1), 0, In(5), "a peer").status();
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
}

TEST(Handshake, ForgedProofIsRefused) {
  auto client = ClientHandshake::Start(MakeSecret(1), Route{1, 0});
  auto server = ServerHandshake::Start(MakeSecret(2), 0);
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
  auto c1 = ClientHandshake::Start(secret, Route{1, 0});
  auto s1 = ServerHandshake::Start(secret, 0);
  ASSERT_TRUE(c1.ok() && s1.ok());
  auto reply1 = s1->OnClientHello(c1->hello());
  ASSERT_TRUE(reply1.ok());
  auto proof1 = c1->OnServerHello(*reply1);
  ASSERT_TRUE(proof1.ok());
  EXPECT_TRUE(s1->OnClientProof(*proof1).ok());

  // A recorded server reply does not convince another client (its nonce differs).
  auto c2 = ClientHandshake::Start(secret, Route{1, 0});
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->OnServerHello(*reply1).status().code(), StatusCode::kRemoteError);

  // A recorded proof does not convince another server (its nonce differs).
  auto s2 = ServerHandshake::Start(secret, 0);
  ASSERT_TRUE(s2.ok());
  ASSERT_TRUE(s2->OnClientHello(c1->hello()).ok());
  EXPECT_EQ(s2->OnClientProof(*proof1).code(), StatusCode::kRemoteError);

  // The server's own MAC reflected back as a client proof is refused (direction labels).
  ClientProof reflected;
  std::memcpy(reflected.data(), reply1->data() + 8 + kServerNonceBytes, kMacBytes);
  EXPECT_EQ(s1->OnClientProof(reflected).code(), StatusCode::kRemoteError);

  // Fresh nonces every time.
  EXPECT_NE(c1->hello(), c2->hello());
}

// A party without the secret that receives a connection meant for rank 2 (say, on the port of a
// rank that has left) relays it to another rank, or back to the sender's own listener, to end up
// with an authenticated connection there. The hello names its destination: as it is, the other
// rank refuses it; rewritten, the MAC no longer matches what the sender checks, so the sender never
// proves anything.
TEST(Handshake, AHandshakeRelayedToAnotherRankFails) {
  const Secret secret = MakeSecret(5);
  auto sender = ClientHandshake::Start(secret, Route{1, 2});
  ASSERT_TRUE(sender.ok());
  for (uint32_t elsewhere : {3u, 1u}) {  // another rank; the sender itself
    auto other = ServerHandshake::Start(secret, elsewhere);
    ASSERT_TRUE(other.ok());
    auto refused = other->OnClientHello(sender->hello());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << elsewhere;
    EXPECT_TRUE(Contains(refused.status().message(), "addressed to rank 2")) << refused.status().message();

    ClientHello rewritten = sender->hello();
    for (int i = 0; i < 4; ++i) rewritten[12 + i] = static_cast<uint8_t>(elsewhere >> (8 * i));
    auto reply = other->OnClientHello(rewritten);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    auto proof = sender->OnServerHello(*reply);
    EXPECT_EQ(proof.status().code(), StatusCode::kRemoteError) << elsewhere;
  }
  // Nor can the claimed sender be rewritten: the server's MAC then covers another hello.
  auto rank2 = ServerHandshake::Start(secret, 2);
  ASSERT_TRUE(rank2.ok());
  ClientHello as_rank0 = sender->hello();
  for (int i = 0; i < 4; ++i) as_rank0[8 + i] = 0;
  auto reply = rank2->OnClientHello(as_rank0);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(sender->OnServerHello(*reply).status().code(), StatusCode::kRemoteError);
  // The honest route works, and the server learns the sender.
  auto honest = ServerHandshake::Start(secret, 2);
  ASSERT_TRUE(honest.ok());
  auto good = honest->OnClientHello(sender->hello());
  ASSERT_TRUE(good.ok());
  auto proof = sender->OnServerHello(*good);
  ASSERT_TRUE(proof.ok());
  EXPECT_TRUE(honest->OnClientProof(*proof).ok());
  EXPECT_EQ(honest->client_rank(), 1u);
}

// Whatever fails, the message names neither the secret nor a MAC.
TEST(Handshake, ErrorsNeverCarryTheSecret) {
  const Secret secret = MakeSecret(9);
  std::string hex;
  for (uint8_t b : secret) hex += fmt::format("{:02x}", b);
  const std::string raw(secret.begin(), secret.end());
  std::vector<Status> errors;
  auto client = ClientHandshake::Start(secret, Route{1, 0});
  auto server = ServerHandshake::Start(MakeSecret(10), 0);
  ASSERT_TRUE(client.ok() && server.ok());
  auto reply = server->OnClientHello(client->hello());
  ASSERT_TRUE(reply.ok());
  errors.push_back(client->OnServerHello(*reply).status());  // wrong MAC
  auto honest = ServerHandshake::Start(secret, 0);
  ASSERT_TRUE(honest.ok());
  auto good = honest->OnClientHello(client->hello());
  ASSERT_TRUE(good.ok());
  errors.push_back(honest->OnClientProof(ClientProof{}));  // forged proof
  ClientHello bad = client->hello();
  bad[0] = 'X';
  errors.push_back(honest->OnClientHello(bad).status());  // garbage
  auto elsewhere = ServerHandshake::Start(secret, 7);
  ASSERT_TRUE(elsewhere.ok());
  errors.push_back(elsewhere->OnClientHello(client->hello()).status());  // another rank's
  ServerHello garbled = *good;
  garbled[5] = 3;
  errors.push_back(client->OnServerHello(garbled).status());  // another version
  for (const Status& e : errors) {
    EXPECT_FALSE(e.ok());
    EXPECT_FALSE(Contains(e.message(), hex.substr(0, 8))) << e.message();
    EXPECT_FALSE(Contains(e.message(), raw)) << e.message();
    std::string mac_hex;
    for (size_t i = 0; i < 4; ++i) mac_hex += fmt::format("{:02x}", (*good)[8 + kServerNonceBytes + i]);
    EXPECT_FALSE(Contains(e.message(), mac_hex)) << e.message();
  }
}

}  // namespace
}  // namespace kizuna::bootstrap
