// Listen / connect / accept on direct links: a port reaches only its link's far end (errors name
// the topology), handles from another topology or host are refused, and strangers — a wrong
// secret, garbage, silence, another user's process — never become a comm while the rightful
// peer still gets through.

#include "fabric/directconnect/endpoint.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "fabric/directconnect/test_util.h"

namespace kizuna::fabric::directconnect {
namespace {

using namespace std::chrono_literals;
using testing::Soon;
using testing::World;

Topology Ring3() {
  auto t = GenerateRing(3, {100, 1});
  EXPECT_TRUE(t.ok());
  t->source = "ring3.json";
  return *t;
}

// Connects a raw Unix socket to the listener behind `handle` (what a stranger can do).
UniqueFd RawConnect(const Handle& handle) {
  auto info = ParseHandle(handle);
  EXPECT_TRUE(info.ok());
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, info->socket_name.data(), info->socket_name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + info->socket_name.size());
  EXPECT_EQ(::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
  return s;
}

TEST(DirectConnectEndpoint, PropertiesDescribeTheLinks) {
  World w(Ring3());
  EXPECT_EQ(w[0].device_count(), 2);
  auto p0 = w[0].properties(0);
  ASSERT_TRUE(p0.ok());
  EXPECT_EQ(p0->name, "w0:port0");
  EXPECT_TRUE(p0->point_to_point);
  ASSERT_TRUE(p0->link_peer.has_value());
  EXPECT_EQ(p0->link_peer->node, "w1");
  EXPECT_EQ(p0->link_peer->rank, 1);
  EXPECT_EQ(p0->link_peer->port, 1);
  EXPECT_EQ(p0->speed_gbps, 100);
  EXPECT_EQ(p0->latency_us, 1);
  EXPECT_TRUE(p0->write_immediate);
  EXPECT_EQ(p0->ptr_support, kPtrHost | kPtrDevice | kPtrFd);
}

TEST(DirectConnectEndpoint, APortReachesOnlyItsLinksFarEnd) {
  World w(Ring3());
  // Ring of 3: w0:0-w1:1, w1:0-w2:1, w2:0-w0:1. w0 listens on port 0 (its link goes to w1:1).
  auto listen = w[0].Listen(0);
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  auto wrong = w[2].Connect(0, (*listen)->handle());  // w2:0 is linked to w0:1, not w0:0
  ASSERT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  const std::string m = wrong.status().message();
  EXPECT_NE(m.find("port 0 of node w2 is linked to w0:1"), std::string::npos) << m;
  EXPECT_NE(m.find("'ring-3' (ring3.json)"), std::string::npos) << "names the topology: " << m;
  EXPECT_NE(m.find("w0:0"), std::string::npos) << "names the listener: " << m;
  EXPECT_EQ(w[2].Connect(1, (*listen)->handle()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w[1].Connect(0, (*listen)->handle()).status().code(), StatusCode::kInvalidArgument);
  auto right = w[1].Connect(1, (*listen)->handle(), Soon());
  EXPECT_TRUE(right.ok()) << right.status().ToString();
}

TEST(DirectConnectEndpoint, UnconnectedPortsCannotListenOrConnect) {
  auto t = GenerateTorus({1, 2}, {});  // x has size 1: ports 0 and 1 are unconnected
  ASSERT_TRUE(t.ok());
  World w(*t);
  auto p = w[0].properties(0);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->point_to_point);
  EXPECT_FALSE(p->link_peer.has_value());
  auto l = w[0].Listen(0);
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("has no link"), std::string::npos) << l.status().message();
  auto good = w[1].Listen(2);
  ASSERT_TRUE(good.ok());
  auto c = w[0].Connect(0, (*good)->handle());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("has no link"), std::string::npos) << c.status().message();
}

TEST(DirectConnectEndpoint, HandlesOfAnotherTopologyOrHostAreRefused) {
  World w(Ring3());
  auto other_topology = GenerateRing(3, {100, 2});  // same shape, other latency
  ASSERT_TRUE(other_topology.ok());
  World v(*other_topology);
  auto listen = v[0].Listen(0);
  ASSERT_TRUE(listen.ok());
  auto c = w[1].Connect(1, (*listen)->handle());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("topology differs"), std::string::npos) << c.status().message();

  auto mine = w[0].Listen(0);
  ASSERT_TRUE(mine.ok());
  auto info = ParseHandle((*mine)->handle());
  ASSERT_TRUE(info.ok());
  info->host ^= 1;
  auto elsewhere = w[1].Connect(1, EncodeHandle(*info));
  EXPECT_EQ(elsewhere.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(elsewhere.status().message().find("another host"), std::string::npos) << elsewhere.status().message();
  info = ParseHandle((*mine)->handle());
  info->node = 77;
  EXPECT_EQ(w[1].Connect(1, EncodeHandle(*info)).status().code(), StatusCode::kInvalidArgument);
}

TEST(DirectConnectEndpoint, AWrongSecretIsRejectedAndTheRightfulPeerStillConnects) {
  World w(Ring3());
  auto listen = w[0].Listen(0);
  ASSERT_TRUE(listen.ok());
  auto info = ParseHandle((*listen)->handle());
  ASSERT_TRUE(info.ok());
  info->token[3] ^= 0x40;
  // Connecting does not wait for the listener, so the forger gets a comm; the listener never
  // accepts it, and the forger learns why on its first transfer.
  auto forged = w[1].Connect(1, EncodeHandle(*info), Soon());
  ASSERT_TRUE(forged.ok()) << forged.status().ToString();
  auto none = (*listen)->Accept();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr) << "a connection with the wrong secret was accepted";
  uint64_t word = 1;
  auto reg = (*forged)->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(reg.ok());
  auto s = (*forged)->Send(&word, 8, 0, *reg);
  if (s.ok() && *s != nullptr) {
    auto done = (*forged)->Wait(*s, Soon());
    EXPECT_EQ(done.status().code(), StatusCode::kRemoteError);
    EXPECT_NE(done.status().message().find("authentication failed"), std::string::npos) << done.status().message();
  } else {
    EXPECT_EQ(s.status().code(), StatusCode::kRemoteError);
  }
  auto rightful = w[1].Connect(1, (*listen)->handle(), Soon());
  ASSERT_TRUE(rightful.ok());
  auto accepted = (*listen)->Accept(Soon());
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_NE(*accepted, nullptr);
}

TEST(DirectConnectEndpoint, GarbageAndSilentStrangersDoNotBlockAccept) {
  World w(Ring3());
  auto listen = w[0].Listen(0);
  ASSERT_TRUE(listen.ok());
  UniqueFd silent = RawConnect((*listen)->handle());
  UniqueFd noisy = RawConnect((*listen)->handle());
  std::vector<uint8_t> junk(300, 0x41);
  ASSERT_EQ(::send(noisy.get(), junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
  auto none = (*listen)->Accept();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  // The noisy stranger was told and dropped: its socket reads the reason, then EOF.
  char buf[512];
  ssize_t n = ::recv(noisy.get(), buf, sizeof(buf), 0);
  EXPECT_GT(n, 0);
  // The rightful peer is accepted while the silent stranger is still pending.
  auto rightful = w[1].Connect(1, (*listen)->handle(), Soon());
  ASSERT_TRUE(rightful.ok());
  const auto start = std::chrono::steady_clock::now();
  auto accepted = (*listen)->Accept(Soon());
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_NE(*accepted, nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

// A listener not accepted for a while (its rank slow to create its communicator) while a
// stranger opens more silent connections than the listener keeps: the peer that connected first,
// hello and all, is still accepted — it is verified before the flood can push it out.
TEST(DirectConnectEndpoint, AFloodOfSilentConnectionsDoesNotEvictAPeer) {
  World w(Ring3());
  auto listen = w[0].Listen(0);
  ASSERT_TRUE(listen.ok());
  auto rightful = w[1].Connect(1, (*listen)->handle(), Soon());
  ASSERT_TRUE(rightful.ok()) << rightful.status().ToString();
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 100; ++i) flood.push_back(RawConnect((*listen)->handle()));
  auto accepted = (*listen)->Accept(Soon());
  ASSERT_TRUE(accepted.ok()) << accepted.status().ToString();
  EXPECT_NE(*accepted, nullptr) << "the peer's connection was dropped for the flood";
  // And a peer that comes after the flood too.
  auto late = w[1].Connect(1, (*listen)->handle(), Soon());
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  auto accepted_late = (*listen)->Accept(Soon());
  ASSERT_TRUE(accepted_late.ok()) << accepted_late.status().ToString();
  EXPECT_NE(*accepted_late, nullptr);
}

// The open descriptors of this process.
size_t OpenDescriptors() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A node's ports listen on one socket: a node with a port per peer holds one listening descriptor,
// not one per port, and each connection still reaches the ListenComm of its own port.
TEST(DirectConnectEndpoint, ThePortsOfANodeShareOneListeningSocket) {
  World w(Ring3());
  const size_t before = OpenDescriptors();
  auto l0 = w[0].Listen(0);
  auto l1 = w[0].Listen(1);
  ASSERT_TRUE(l0.ok() && l1.ok());
  EXPECT_EQ(OpenDescriptors(), before + 1);
  auto h0 = ParseHandle((*l0)->handle());
  auto h1 = ParseHandle((*l1)->handle());
  ASSERT_TRUE(h0.ok() && h1.ok());
  EXPECT_EQ(h0->socket_name, h1->socket_name);
  EXPECT_NE(h0->listener, h1->listener);
  // w0's port 0 is cabled to w1's port 1, its port 1 to w2's port 0.
  auto from1 = w[1].Connect(1, (*l0)->handle(), Soon());
  auto from2 = w[2].Connect(0, (*l1)->handle(), Soon());
  ASSERT_TRUE(from1.ok() && from2.ok()) << from1.status().ToString() << from2.status().ToString();
  auto got1 = (*l1)->Accept(Soon());
  ASSERT_TRUE(got1.ok()) << got1.status().ToString();
  EXPECT_EQ((*got1)->label(), "directconnect w0:1<-w2:0");
  auto got0 = (*l0)->Accept(Soon());
  ASSERT_TRUE(got0.ok()) << got0.status().ToString();
  EXPECT_EQ((*got0)->label(), "directconnect w0:0<-w1:1");
}

// A port whose ListenComm closed while another port's keeps the socket: the connection is made
// (connecting does not wait for the listener) and refused, saying why, on its first transfer.
TEST(DirectConnectEndpoint, AConnectionToAClosedPortIsRefusedWhileTheNodeStillListens) {
  World w(Ring3());
  auto l1 = w[0].Listen(1);
  ASSERT_TRUE(l1.ok());
  Handle h0;
  {
    auto l0 = w[0].Listen(0);
    ASSERT_TRUE(l0.ok());
    h0 = (*l0)->handle();
  }
  auto late = w[1].Connect(1, h0, Soon());
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  auto none = (*l1)->Accept();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  uint64_t word = 1;
  auto reg = (*late)->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(reg.ok());
  auto s = (*late)->Send(&word, 8, 0, *reg);
  Status failed = s.ok() && *s != nullptr ? (*late)->Wait(*s, Soon()).status() : s.status();
  EXPECT_EQ(failed.code(), StatusCode::kRemoteError) << failed.ToString();
  EXPECT_NE(failed.message().find("nobody listens"), std::string::npos) << failed.message();
}

// The kernel drops the descriptors of a hello it cannot install in the listening process (its
// open-file limit reached) and says so only with MSG_CTRUNC: the connection is refused naming that,
// and the connecting side learns it, instead of a hello "without its channel descriptors".
TEST(DirectConnectEndpoint, AHelloWhoseDescriptorsCannotBeReceivedIsRefusedSayingWhy) {
  World w(Ring3());
  auto listen = w[0].Listen(0);
  ASSERT_TRUE(listen.ok());
  auto conn = w[1].Connect(1, (*listen)->handle(), Soon());
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  // Room for the accepted socket and no more: descriptors are numbered from the lowest free one,
  // so a limit at the second free number admits accept4's and refuses the hello's.
  std::set<int> open;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    open.insert(std::stoi(entry.path().filename().string()));
  int first = 0;
  while (open.count(first) != 0) ++first;
  int second = first + 1;
  while (open.count(second) != 0) ++second;
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(second);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  auto none = (*listen)->Accept();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(*none, nullptr);
  uint64_t word = 1;
  auto reg = (*conn)->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(reg.ok());
  auto s = (*conn)->Send(&word, 8, 0, *reg);
  Status failed = s.ok() && *s != nullptr ? (*conn)->Wait(*s, Soon()).status() : s.status();
  EXPECT_EQ(failed.code(), StatusCode::kRemoteError) << failed.ToString();
  EXPECT_NE(failed.message().find("MSG_CTRUNC"), std::string::npos) << failed.message();
  EXPECT_NE(failed.message().find(fmt::format("open-file limit {}", second)), std::string::npos) << failed.message();
}

TEST(DirectConnectEndpoint, ConnectingToAClosedListenerIsARemoteError) {
  World w(Ring3());
  Handle h;
  {
    auto listen = w[0].Listen(0);
    ASSERT_TRUE(listen.ok());
    h = (*listen)->handle();
  }
  auto c = w[1].Connect(1, h);
  EXPECT_EQ(c.status().code(), StatusCode::kRemoteError);
  EXPECT_NE(c.status().message().find("nobody listens"), std::string::npos) << c.status().message();
}

TEST(DirectConnectEndpoint, TheFactoryExplainsWhatIsMissing) {
  Config config;
  FabricContext ctx;
  auto none = DirectConnectFabric::Create(config, ctx);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("KIZUNA_TOPOLOGY"), std::string::npos);
  config.topology = "/nonexistent/topology.json";
  EXPECT_EQ(DirectConnectFabric::Create(config, ctx).status().code(), StatusCode::kInvalidArgument);
  const std::string path = ::testing::TempDir() + "/ring3.json";
  {
    std::ofstream out(path);
    out << TopologyToJson(Ring3());
  }
  config.topology = path;
  ctx.rank = 3;
  auto missing = DirectConnectFabric::Create(config, ctx);
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("rank 3 has no node"), std::string::npos) << missing.status().message();
  ctx.rank = 2;
  auto ok = DirectConnectFabric::Create(config, ctx);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->device_count(), 2);
  ctx.node = "w9";
  EXPECT_EQ(DirectConnectFabric::Create(config, ctx).status().code(), StatusCode::kInvalidArgument);
  ctx.node = "w1";
  auto by_name = DirectConnectFabric::Create(config, ctx);
  ASSERT_TRUE(by_name.ok());
  EXPECT_EQ((*by_name)->properties(0)->name, "w1:port0");
}

}  // namespace
}  // namespace kizuna::fabric::directconnect
