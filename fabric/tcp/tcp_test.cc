// The tcp fabric's own tests (README.md, "Tests"): handles, interface selection and frames as pure
// functions; then two ranks' fabrics on the loopback interface in this process, for what the
// conformance suite does not look at: eager messages that arrive before their receive (held and
// counted as staged), messages cut over several streams, a receive too small for a message that
// waited for its post, the eager credit, a hello without the secret, one thread's wait moving
// another comm's send, and waits that sleep; and connections forwarded through ranks in between.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/tcp/endpoint.h"
#include "fabric/tcp/fabric.h"
#include "fabric/tcp/link.h"
#include "fabric/tcp/relay.h"
#include "fabric/tcp/transfer.h"

// Assertions that print the whole Status (as the conformance suites' helpers do).
#define KZ_EXPECT_OK(expr)                                   \
  switch (0)                                                 \
  case 0:                                                    \
  default:                                                   \
    if (const ::kizuna::Status kz_s_ = (expr); kz_s_.ok()) { \
    } else                                                   \
      ADD_FAILURE() << #expr << " -> " << kz_s_.ToString() << ": "
#define KZ_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  KZ_ASSERT_OK_AND_ASSIGN_IMPL_(KZ_CONCAT_(kz_test_result_, __LINE__), lhs, expr)
#define KZ_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                  \
  auto tmp = (expr);                                                   \
  ASSERT_TRUE(tmp.ok()) << #expr << " -> " << tmp.status().ToString(); \
  lhs = std::move(tmp).value()

namespace kizuna::fabric::tcp {
namespace {

using namespace std::chrono_literals;

Interface V4(const std::string& name, const char* address, bool loopback = false) {
  Interface i;
  i.name = name;
  i.loopback = loopback;
  auto* in = reinterpret_cast<sockaddr_in*>(&i.address);
  in->sin_family = AF_INET;
  ::inet_pton(AF_INET, address, &in->sin_addr);
  return i;
}

Interface V6(const std::string& name, const char* address) {
  Interface i;
  i.name = name;
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&i.address);
  in6->sin6_family = AF_INET6;
  ::inet_pton(AF_INET6, address, &in6->sin6_addr);
  return i;
}

std::vector<std::string> Names(const std::vector<Interface>& v) {
  std::vector<std::string> out;
  for (const Interface& i : v) out.push_back(i.name);
  return out;
}

TEST(Tcp, InterfacesLeaveLoopbackOutWhenAnotherIsThere) {
  const std::vector<Interface> all = {V4("lo", "127.0.0.1", true), V6("eth0", "fe80::1"), V4("eth0", "10.0.0.2"),
                                      V6("eth1", "fd00::5")};
  std::vector<std::string> missing;
  const std::vector<Interface> chosen = SelectInterfaces(all, {}, &missing);
  EXPECT_EQ(Names(chosen), (std::vector<std::string>{"eth0", "eth1"}));
  EXPECT_EQ(chosen[0].address.ss_family, AF_INET) << "IPv4 first";
  EXPECT_EQ(chosen[1].address.ss_family, AF_INET6) << "a routable IPv6 address where there is no IPv4 one";
  EXPECT_TRUE(missing.empty());
  // Alone, loopback is taken; a link-local address alone is not.
  EXPECT_EQ(Names(SelectInterfaces({V4("lo", "127.0.0.1", true)}, {}, nullptr)), std::vector<std::string>{"lo"});
  EXPECT_TRUE(SelectInterfaces({V6("eth0", "fe80::1")}, {}, nullptr).empty());
}

TEST(Tcp, KizunaFabricNamesInterfacesInOrder) {
  const std::vector<std::string> wanted = InterfacesFromConfig({"ofi:shm", "tcp:lo", "tcp", "tcp:eth9", "tcp:eth0"});
  EXPECT_EQ(wanted, (std::vector<std::string>{"lo", "eth9", "eth0"}));
  std::vector<std::string> missing;
  const std::vector<Interface> chosen =
      SelectInterfaces({V4("eth0", "10.0.0.2"), V4("lo", "127.0.0.1", true)}, wanted, &missing);
  EXPECT_EQ(Names(chosen), (std::vector<std::string>{"lo", "eth0"}));
  EXPECT_EQ(missing, std::vector<std::string>{"eth9"});
}

// Interfaces named, none of them here: an error naming them, what the host has, and what to do
// (not "unavailable", which would leave the fabric out without a word).
TEST(Tcp, NamedInterfacesThatDoNotExistAreAnError) {
  Config config;
  config.fabric = {"tcp:eth9", "tcp:ib7"};
  FabricContext ctx;
  ctx.world_size = 2;
  auto f = TcpFabric::CreateWith(config, ctx, {V4("eth0", "10.0.0.2"), V4("lo", "127.0.0.1", true)}, 1);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().ToString();
  for (const char* part : {"eth9, ib7", "it has: eth0, lo", "name one it has"})
    EXPECT_NE(f.status().message().find(part), std::string::npos) << part << " missing: " << f.status().ToString();
}

// Cables to other hosts (KIZUNA_TOPOLOGY; README.md, "Cables"): the rank's cabled ports become
// point-to-point devices on their interfaces, each naming the other end and the other end's device;
// nothing else is a device unless KIZUNA_FABRIC names it; a port whose interface is missing is an
// error naming it; a topology whose cables stay inside one host leaves the fabric as it was.
TEST(Tcp, CablesToOtherHostsArePointToPointDevices) {
  const std::string file = ::testing::TempDir() + "/ring4.json";
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"name": "ring-4", "nodes": [
      {"name": "w0", "rank": 0, "ports": 2}, {"name": "w1", "rank": 1, "ports": 2, "interfaces": ["enp1", "enp2"]},
      {"name": "w2", "rank": 2, "ports": 2}, {"name": "w3", "rank": 3, "ports": 2}],
     "links": [{"a": "w0:0", "b": "w1:1", "bandwidth_gbps": 10}, {"a": "w1:0", "b": "w2:1"},
               {"a": "w2:0", "b": "w3:1"}, {"a": "w3:0", "b": "w0:1"}]})",
               f);
    std::fclose(f);
  }
  Config config;
  config.topology = file;
  FabricContext ctx;
  ctx.rank = 1;
  ctx.world_size = 4;
  ctx.rank_hosts = {"A", "B", "C", "D"};
  ctx.host_id = "B";
  const std::vector<Interface> all = {V4("eth0", "10.0.0.2"), V4("enp1", "10.78.0.5"), V4("enp2", "10.78.0.2")};
  auto f = TcpFabric::CreateWith(config, ctx, all, 1);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ((*f)->device_count(), 2);
  const FabricDeviceProperties to2 = *(*f)->properties(0);
  EXPECT_EQ(to2.name, "w1:port0:enp1");
  EXPECT_TRUE(to2.point_to_point);
  ASSERT_TRUE(to2.link_peer.has_value());
  EXPECT_EQ(to2.link_peer->rank, 2);
  EXPECT_EQ(to2.link_peer->port, 1);  // w2's port 1 is its second cabled port
  const FabricDeviceProperties to0 = *(*f)->properties(1);
  EXPECT_EQ(to0.name, "w1:port1:enp2");
  EXPECT_EQ(to0.link_peer->rank, 0);
  EXPECT_EQ(to0.link_peer->port, 0);
  EXPECT_EQ(to0.speed_gbps, 10);  // the file's bandwidth
  // A switched interface too, where KIZUNA_FABRIC names it.
  config.fabric = {"tcp:eth0"};
  auto with = TcpFabric::CreateWith(config, ctx, all, 1);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  ASSERT_EQ((*with)->device_count(), 3);
  EXPECT_FALSE((*with)->properties(2)->point_to_point);
  config.fabric = {};
  // A port's interface that this host lacks.
  auto missing = TcpFabric::CreateWith(config, ctx, {V4("eth0", "10.0.0.2"), V4("enp1", "10.78.0.5")}, 1);
  ASSERT_FALSE(missing.ok());
  for (const char* part : {"w1's port 1", "'enp2'", "it has: eth0, enp1"})
    EXPECT_NE(missing.status().message().find(part), std::string::npos) << part << ": " << missing.status().ToString();
  // Every rank on one host: the cables are shared memory's (directconnect), not this fabric's.
  ctx.rank_hosts = {"B", "B", "B", "B"};
  auto local = TcpFabric::CreateWith(config, ctx, all, 1);
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ((*local)->device_count(), 3);
  EXPECT_FALSE((*local)->properties(0)->point_to_point);
}

// Parallel cables between two ranks (here crossed: w0's port 0 to w1's port 1 and the other way)
// are one device, a bundle: its speed their sum, its connections' streams on each cable in turn,
// from a cable's own address to the far end of that cable; 8 MiB arrive intact.
TEST(Tcp, ParallelCablesAreOneBundle) {
  const std::string file = ::testing::TempDir() + "/bundle.json";
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        R"({"name": "pair", "nodes": [{"name": "w0", "rank": 0, "ports": 2}, {"name": "w1", "rank": 1, "ports": 2}],
     "links": [{"a": "w0:0", "b": "w1:1", "bandwidth_gbps": 10}, {"a": "w0:1", "b": "w1:0", "bandwidth_gbps": 10}]})",
        f);
    std::fclose(f);
  }
  Config config;
  config.topology = file;
  std::unique_ptr<Fabric> fabrics[2];
  const char* addresses[2][2] = {{"127.0.1.1", "127.0.1.2"}, {"127.0.2.1", "127.0.2.2"}};
  for (int r = 0; r < 2; ++r) {
    FabricContext ctx;
    ctx.rank = r;
    ctx.world_size = 2;
    ctx.rank_hosts = {"A", "B"};
    ctx.host_id = ctx.rank_hosts[static_cast<size_t>(r)];
    auto f = TcpFabric::CreateWith(config, ctx, {V4("p0", addresses[r][0]), V4("p1", addresses[r][1])}, 2);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabrics[r] = std::move(f).value();
    ASSERT_EQ(fabrics[r]->device_count(), 1);
    const FabricDeviceProperties p = *fabrics[r]->properties(0);
    EXPECT_EQ(p.name, fmt::format("w{}:port0:p0+port1:p1", r));
    EXPECT_TRUE(p.point_to_point);
    EXPECT_EQ(p.speed_gbps, 20);
    EXPECT_EQ(p.cables, 2);
    ASSERT_TRUE(p.link_peer.has_value());
    EXPECT_EQ(p.link_peer->rank, 1 - r);
    EXPECT_EQ(p.link_peer->port, 0);
  }
  auto listen = fabrics[0]->Listen(0);
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  for (const Deadline d = Deadline::AfterSeconds(10); (send == nullptr || recv == nullptr) && !d.Expired();) {
    if (send == nullptr) {
      auto s = fabrics[1]->Connect(0, (*listen)->handle());
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      send = std::move(s).value();
    }
    if (recv == nullptr) {
      auto r = (*listen)->Accept();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      recv = std::move(r).value();
    }
  }
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);
  // w1's port 0 (127.0.2.1) is cabled to w0's port 1 (127.0.1.2), its port 1 to w0's port 0.
  const std::string& label = send->label();
  EXPECT_NE(label.find("4 streams"), std::string::npos) << label;
  EXPECT_NE(label.find("127.0.2.1:"), std::string::npos) << label;
  EXPECT_NE(label.find("->127.0.1.2:"), std::string::npos) << label;
  EXPECT_NE(label.find("127.0.2.2:"), std::string::npos) << label;
  EXPECT_NE(label.find("->127.0.1.1:"), std::string::npos) << label;
  const size_t size = 8u << 20;
  std::vector<uint8_t> out(size), in(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(i * 13 + i / 4099);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, send->Register(MemoryDescriptor::Host(out.data(), out.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, recv->Recv(in.data(), in.size(), 1, rreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, send->Send(out.data(), size, 1, sreg));
  std::thread t([&] { KZ_EXPECT_OK(send->Wait(s, Deadline::AfterSeconds(10)).status()); });
  KZ_ASSERT_OK_AND_ASSIGN(size_t got, recv->Wait(r, Deadline::AfterSeconds(10)));
  t.join();
  EXPECT_EQ(got, size);
  EXPECT_TRUE(in == out);
}

TEST(Tcp, HandlesRoundTripAndBadOnesAreRefused) {
  WireHandle w;
  w.family = AF_INET;
  w.port = 4242;
  w.address = {127, 0, 0, 1};
  w.secret[3] = 9;
  const Handle h = EncodeHandle(w);
  EXPECT_LE(h.size, kHandleMaxBytes);
  auto back = DecodeHandle(h);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->port, 4242);
  EXPECT_EQ(back->secret, w.secret);
  EXPECT_EQ(DescribeAddress(AddressOf(*back)), "127.0.0.1:4242");
  auto broken = [&](auto change) {
    WireHandle b = w;
    change(b);
    return DecodeHandle(EncodeHandle(b)).status();
  };
  for (const Status& st : {broken([](WireHandle& b) { b.magic = 1; }), broken([](WireHandle& b) { b.version = 9; }),
                           broken([](WireHandle& b) { b.byte_order = 0x0201; }),
                           broken([](WireHandle& b) { b.family = 77; }), broken([](WireHandle& b) { b.port = 0; })})
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  Handle short_one = h;
  short_one.size -= 1;
  EXPECT_EQ(DecodeHandle(short_one).status().code(), StatusCode::kInvalidArgument);
  // A bundle's handle: a further cable's port and address after it.
  WireCable c;
  c.port = 4343;
  c.address = {127, 0, 0, 2};
  const Handle two = EncodeHandle(w, {c});
  EXPECT_EQ(two.size, sizeof(WireHandle) + sizeof(WireCable));
  std::vector<WireCable> more;
  auto back2 = DecodeHandle(two, &more);
  ASSERT_TRUE(back2.ok()) << back2.status().ToString();
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(DescribeAddress(AddressOf(*back2, more[0])), "127.0.0.2:4343");
  c.port = 0;
  EXPECT_EQ(DecodeHandle(EncodeHandle(w, {c}), &more).status().code(), StatusCode::kInvalidArgument);
}

TEST(Tcp, FramesOutsideTheirMessageAreRefused) {
  Frame f{.type = FrameType::kData, .total = 100, .offset = 60, .length = 40};
  EXPECT_TRUE(CheckFrame(f, kMaxMessageBytes).ok());
  f.length = 41;
  EXPECT_EQ(CheckFrame(f, kMaxMessageBytes).code(), StatusCode::kInvalidArgument);
  f = Frame{.type = FrameType::kData, .total = kMaxMessageBytes + 1, .length = 0};
  EXPECT_EQ(CheckFrame(f, kMaxMessageBytes).code(), StatusCode::kInvalidArgument);
  f = Frame{.type = FrameType::kPost, .total = 8, .length = 8};
  EXPECT_EQ(CheckFrame(f, kMaxMessageBytes).code(), StatusCode::kInvalidArgument) << "a post carries no payload";
  f = Frame{.type = static_cast<FrameType>(9)};
  EXPECT_EQ(CheckFrame(f, kMaxMessageBytes).code(), StatusCode::kInvalidArgument);
  f = Frame{};
  f.magic = 1;
  EXPECT_EQ(CheckFrame(f, kMaxMessageBytes).code(), StatusCode::kInvalidArgument);
}

// ---- Two ranks on the loopback interface ----

Deadline Soon() { return Deadline::AfterSeconds(20); }

struct Pair {
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// Connects `from` (its device 0) to `p.listen` by `handle` while the listener accepts, until both
// ends have their comm (each step's failure reported).
void ConnectAndAccept(Fabric& from, const Handle& handle, Pair& p) {
  const Deadline d = Soon();
  while ((p.send == nullptr || p.recv == nullptr) && !d.Expired()) {
    if (p.send == nullptr) {
      auto s = from.Connect(0, handle);
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (!s.ok()) return;
      p.send = std::move(s).value();
    }
    if (p.recv == nullptr) {
      auto r = p.listen->Accept();
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok()) return;
      p.recv = std::move(r).value();
    }
  }
}

class TcpPair : public ::testing::Test {
 protected:
  void Make(int streams) {
    config_.timeout_s = 20;
    config_.fabric = {"tcp:lo"};
    const std::vector<Interface> lo = {V4("lo", "127.0.0.1", true)};
    for (int r = 0; r < 2; ++r) {
      FabricContext ctx;
      ctx.rank = r;
      ctx.world_size = 2;
      auto f = TcpFabric::CreateWith(config_, ctx, lo, streams);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      fabrics_[r] = std::move(f).value();
    }
  }
  // Rank 1 sends to rank 0.
  Pair Connect() {
    Pair p;
    auto l = fabrics_[0]->Listen(0);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return p;
    p.listen = std::move(l).value();
    ConnectAndAccept(*fabrics_[1], p.listen->handle(), p);
    return p;
  }

  Config config_;
  std::unique_ptr<Fabric> fabrics_[2];
};

void Fill(std::vector<uint8_t>& v, uint8_t seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + i / 251);
}

TEST_F(TcpPair, AnEagerMessageBeforeItsReceiveIsHeldAndCountedAsStaged) {
  Make(2);
  Pair p = Connect();
  ASSERT_NE(p.recv, nullptr);
  std::vector<uint8_t> out(1000), in(1000, 0);
  Fill(out, 3);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, p.send->Register(MemoryDescriptor::Host(out.data(), out.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, p.recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, p.send->Send(out.data(), out.size(), 7, sreg));
  ASSERT_NE(s, nullptr);
  // The message is in the receiver's socket before any receive is posted; a test of another
  // receive reads it into the fabric's own buffer.
  std::this_thread::sleep_for(20ms);
  KZ_ASSERT_OK_AND_ASSIGN(Request * other, p.recv->Recv(in.data(), 8, 8, rreg));
  KZ_ASSERT_OK_AND_ASSIGN(Completion c, p.recv->Test(other));
  EXPECT_FALSE(c.done);
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(in.data(), in.size(), 7, rreg));
  KZ_ASSERT_OK_AND_ASSIGN(size_t got, p.recv->Wait(r, Soon()));
  EXPECT_EQ(got, out.size());
  EXPECT_EQ(in, out);
  EXPECT_EQ(p.recv->stats().staged_bytes, out.size()) << "held in the fabric's buffer, then copied";
  KZ_EXPECT_OK(p.send->Wait(s, Soon()).status());
}

TEST_F(TcpPair, LargeMessagesAcrossSeveralStreamsArriveIntact) {
  Make(3);
  Pair p = Connect();
  ASSERT_NE(p.recv, nullptr);
  // Stream 0 for the small messages and the posts, three for the large ones.
  EXPECT_NE(p.send->label().find("4 streams"), std::string::npos) << p.send->label();
  const size_t max = (8u << 20) + 12345;
  std::vector<uint8_t> out(max), in(max + 64);
  Fill(out, 11);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, p.send->Register(MemoryDescriptor::Host(out.data(), out.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, p.recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
  for (size_t size : {size_t{kStripeBytes} - 1, size_t{kStripeBytes}, size_t{kStripeBytes} + 1, size_t{3} << 20, max}) {
    std::fill(in.begin(), in.end(), 0xee);
    KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(in.data(), in.size(), 1, rreg));
    KZ_ASSERT_OK_AND_ASSIGN(Request * s, p.send->Send(out.data(), size, 1, sreg));
    std::thread t([&] { KZ_EXPECT_OK(p.send->Wait(s, Soon()).status()); });
    KZ_ASSERT_OK_AND_ASSIGN(size_t got, p.recv->Wait(r, Soon()));
    t.join();
    ASSERT_EQ(got, size);
    ASSERT_EQ(std::memcmp(in.data(), out.data(), size), 0) << size << " bytes";
    ASSERT_EQ(in[size], 0xee) << "a byte past the message was written";
  }
  EXPECT_EQ(p.recv->stats().staged_bytes, 0u) << "posted receives take their messages directly";
}

TEST_F(TcpPair, AReceiveTooSmallForAMessageThatWaitedForItsPostFailsBothSides) {
  Make(2);
  Pair p = Connect();
  ASSERT_NE(p.recv, nullptr);
  const size_t big = kEagerBytes + 1;  // waits for its post
  std::vector<uint8_t> out(big), in(big);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, p.send->Register(MemoryDescriptor::Host(out.data(), out.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, p.recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, p.send->Send(out.data(), big, 2, sreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(in.data(), 1000, 2, rreg));
  Status sent;
  std::thread t([&] { sent = p.send->Wait(s, Soon()).status(); });
  Status got = p.recv->Wait(r, Soon()).status();
  t.join();
  for (const Status* st : {&sent, &got}) {
    EXPECT_EQ(st->code(), StatusCode::kInvalidArgument) << st->ToString();
    EXPECT_NE(st->message().find(std::to_string(big)), std::string::npos) << st->message();
    EXPECT_NE(st->message().find("1000"), std::string::npos) << st->message();
  }
  // The next pair of the same tag matches.
  Fill(out, 5);
  KZ_ASSERT_OK_AND_ASSIGN(Request * r2, p.recv->Recv(in.data(), 100, 2, rreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s2, p.send->Send(out.data(), 100, 2, sreg));
  KZ_EXPECT_OK(p.recv->Wait(r2, Soon()).status());
  KZ_EXPECT_OK(p.send->Wait(s2, Soon()).status());
  EXPECT_EQ(std::memcmp(in.data(), out.data(), 100), 0);
}

TEST_F(TcpPair, EagerSendsBeyondTheCreditWaitForTheirPosts) {
  Make(1);
  Pair p = Connect();
  ASSERT_NE(p.recv, nullptr);
  const int n = static_cast<int>(2 * kEagerCredit / kEagerBytes);
  std::vector<uint8_t> out(n * kEagerBytes), in(n * kEagerBytes, 0);
  Fill(out, 1);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, p.send->Register(MemoryDescriptor::Host(out.data(), out.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, p.recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
  std::vector<Request*> sends;
  for (int i = 0; i < n; ++i) {
    KZ_ASSERT_OK_AND_ASSIGN(Request * s, p.send->Send(out.data() + i * kEagerBytes, kEagerBytes, 3, sreg));
    sends.push_back(s);
  }
  std::this_thread::sleep_for(20ms);
  // The receiver reads what came before any receive of that tag (a test of another receive):
  // only what the credit allows, which it holds.
  uint64_t word = 0;
  KZ_ASSERT_OK_AND_ASSIGN(Registration * wreg, p.recv->Register(MemoryDescriptor::Host(&word, 8)));
  KZ_ASSERT_OK_AND_ASSIGN(Request * other, p.recv->Recv(&word, 8, 4, wreg));
  KZ_ASSERT_OK_AND_ASSIGN(Completion c, p.recv->Test(other));
  EXPECT_FALSE(c.done);
  std::vector<Request*> recvs;
  for (int i = 0; i < n; ++i) {
    KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(in.data() + i * kEagerBytes, kEagerBytes, 3, rreg));
    recvs.push_back(r);
  }
  std::thread t([&] {
    for (Request* s : sends) KZ_EXPECT_OK(p.send->Wait(s, Soon()).status());
  });
  for (Request* r : recvs) KZ_EXPECT_OK(p.recv->Wait(r, Soon()).status());
  t.join();
  EXPECT_EQ(in, out);
  EXPECT_EQ(p.recv->stats().staged_bytes, kEagerCredit) << "the credit's worth came early, and no more";
}

// The sockets this process has open.
int OpenSockets() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    int type = 0;
    socklen_t len = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0) ++n;
  }
  return n;
}

// Rank 1 connected to rank 0; rank 0 connects back over that connection (README.md, "Both
// directions"): two sockets more (its large messages' streams), not a connection of three.
// Messages of every kind cross both ways at once, intact; a receive rank 1 posts before rank 0's
// comm is there reaches it; either direction's comm may go while the other goes on.
TEST_F(TcpPair, BothDirectionsShareOneConnection) {
  Make(2);
  Pair p = Connect();
  ASSERT_NE(p.recv, nullptr);
  EXPECT_NE(p.send->label().find("3 streams"), std::string::npos) << p.send->label();
  auto l1 = fabrics_[1]->Listen(0);
  ASSERT_TRUE(l1.ok()) << l1.status().ToString();
  const int before = OpenSockets();
  // Another fabric's connection cannot be turned around.
  auto other = fabrics_[1]->ConnectBack(0, (*l1)->handle(), *p.recv);
  EXPECT_EQ(other.status().code(), StatusCode::kNotSupported) << other.status().ToString();

  const size_t medium = kEagerBytes + 1, large = (8u << 20) + 4321;
  std::vector<uint8_t> out0(large), in1(large + 8), out1(large), in0(large + 8);
  Fill(out0, 5);
  Fill(out1, 9);
  std::unique_ptr<SendComm> back;  // rank 0 -> rank 1
  std::unique_ptr<RecvComm> back_recv;
  Request* early = nullptr;
  Registration* in1_reg = nullptr;
  for (const Deadline d = Soon(); (back == nullptr || back_recv == nullptr) && !d.Expired();) {
    if (back_recv == nullptr) {
      auto r = (*l1)->Accept();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      back_recv = std::move(r).value();
      if (back_recv != nullptr) {
        // Posted before rank 0's comm exists: its post waits at rank 0 for the comm.
        KZ_ASSERT_OK_AND_ASSIGN(in1_reg, back_recv->Register(MemoryDescriptor::Host(in1.data(), in1.size())));
        KZ_ASSERT_OK_AND_ASSIGN(early, back_recv->Recv(in1.data(), in1.size(), 1, in1_reg));
      }
    }
    if (back == nullptr) {
      auto s = fabrics_[0]->ConnectBack(0, (*l1)->handle(), *p.recv);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      back = std::move(s).value();
    }
  }
  ASSERT_NE(back, nullptr);
  ASSERT_NE(back_recv, nullptr);
  EXPECT_NE(back->label().find("2 streams, the small messages on the connection from it"), std::string::npos)
      << back->label();
  EXPECT_EQ(OpenSockets() - before, 4) << "two sockets each side: stream 0 is the first connection's";

  KZ_ASSERT_OK_AND_ASSIGN(Registration * out0_reg, back->Register(MemoryDescriptor::Host(out0.data(), out0.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * out1_reg, p.send->Register(MemoryDescriptor::Host(out1.data(), out1.size())));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * in0_reg, p.recv->Register(MemoryDescriptor::Host(in0.data(), in0.size())));
  // The early receive takes a medium message (it waits for that post); then each size both ways.
  KZ_ASSERT_OK_AND_ASSIGN(Request * first, back->Send(out0.data(), medium, 1, out0_reg));
  std::thread rank0([&] { KZ_EXPECT_OK(back->Wait(first, Soon()).status()); });
  KZ_ASSERT_OK_AND_ASSIGN(size_t got, back_recv->Wait(early, Soon()));
  rank0.join();
  EXPECT_EQ(got, medium);
  EXPECT_EQ(std::memcmp(in1.data(), out0.data(), medium), 0);
  for (size_t size : {size_t{8}, medium, size_t{kStripeBytes} + 1, large}) {
    std::fill(in0.begin(), in0.end(), 0xee);
    std::fill(in1.begin(), in1.end(), 0xee);
    KZ_ASSERT_OK_AND_ASSIGN(Request * r0, p.recv->Recv(in0.data(), in0.size(), 2, in0_reg));
    KZ_ASSERT_OK_AND_ASSIGN(Request * r1, back_recv->Recv(in1.data(), in1.size(), 2, in1_reg));
    KZ_ASSERT_OK_AND_ASSIGN(Request * s0, back->Send(out0.data(), size, 2, out0_reg));
    KZ_ASSERT_OK_AND_ASSIGN(Request * s1, p.send->Send(out1.data(), size, 2, out1_reg));
    std::thread rank1([&] {
      KZ_EXPECT_OK(p.send->Wait(s1, Soon()).status());
      auto g = back_recv->Wait(r1, Soon());
      KZ_EXPECT_OK(g.status());
      if (g.ok()) {
        EXPECT_EQ(*g, size);
      }
    });
    KZ_EXPECT_OK(back->Wait(s0, Soon()).status());
    KZ_ASSERT_OK_AND_ASSIGN(size_t got0, p.recv->Wait(r0, Soon()));
    rank1.join();
    EXPECT_EQ(got0, size);
    EXPECT_EQ(std::memcmp(in0.data(), out1.data(), size), 0) << size << " bytes, rank 1 to rank 0";
    EXPECT_EQ(std::memcmp(in1.data(), out0.data(), size), 0) << size << " bytes, rank 0 to rank 1";
    EXPECT_EQ(in0[size], 0xee);
    EXPECT_EQ(in1[size], 0xee);
  }
  // Rank 0's way back goes; rank 1's connection to it still carries messages.
  back.reset();
  back_recv.reset();
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(in0.data(), in0.size(), 3, in0_reg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, p.send->Send(out1.data(), 100, 3, out1_reg));
  KZ_ASSERT_OK_AND_ASSIGN(size_t last, p.recv->Wait(r, Soon()));
  EXPECT_EQ(last, 100u);
  KZ_EXPECT_OK(p.send->Wait(s, Soon()).status());
}

TEST_F(TcpPair, AHelloWithoutTheSecretIsNeverAccepted) {
  Make(1);
  auto l = fabrics_[0]->Listen(0);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Handle forged = (*l)->handle();
  forged.data[offsetof(WireHandle, secret)] ^= 0x5a;
  // The listener reads the hello (in its Accept) and closes the socket: the connecting side fails
  // naming the handshake; no comm comes out of either side.
  std::unique_ptr<SendComm> send;
  Status failed;
  const Deadline d = Deadline::After(5s);
  while (failed.ok() && send == nullptr && !d.Expired()) {
    auto a = (*l)->Accept();
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(*a, nullptr) << "a connection without the secret was accepted";
    auto s = fabrics_[1]->Connect(0, forged);
    if (!s.ok())
      failed = s.status();
    else
      send = std::move(s).value();
  }
  EXPECT_EQ(send, nullptr);
  EXPECT_EQ(failed.code(), StatusCode::kRemoteError) << failed.ToString();
  EXPECT_NE(failed.message().find("handshake"), std::string::npos) << failed.message();
}

TEST_F(TcpPair, AWaitOnOneCommMovesAnotherCommsSend) {
  Make(2);
  Pair a = Connect();  // rank 1 -> rank 0: the send under test
  ASSERT_NE(a.recv, nullptr);
  const size_t size = kEagerBytes * 2;  // waits for its post
  std::vector<uint8_t> out(size), in(size, 0), idle(8);
  Fill(out, 9);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, a.send->Register(MemoryDescriptor::Host(out.data(), size)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, a.recv->Register(MemoryDescriptor::Host(in.data(), size)));
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, a.send->Send(out.data(), size, 1, sreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, a.recv->Recv(in.data(), size, 1, rreg));
  // Rank 1's thread waits on a receive of another comm of its fabric (from rank 0, nothing
  // coming): the wait takes the post from rank 0 and writes the message without a test of `s`.
  auto back = fabrics_[1]->Listen(0);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  std::unique_ptr<SendComm> back_send;
  std::unique_ptr<RecvComm> back_recv;
  const Deadline d = Soon();
  while ((back_send == nullptr || back_recv == nullptr) && !d.Expired()) {
    if (back_send == nullptr) {
      KZ_ASSERT_OK_AND_ASSIGN(back_send, fabrics_[0]->Connect(0, (*back)->handle()));
    }
    if (back_recv == nullptr) {
      KZ_ASSERT_OK_AND_ASSIGN(back_recv, (*back)->Accept());
    }
  }
  ASSERT_NE(back_recv, nullptr);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * ireg, back_recv->Register(MemoryDescriptor::Host(idle.data(), 8)));
  KZ_ASSERT_OK_AND_ASSIGN(Request * nothing, back_recv->Recv(idle.data(), 8, 1, ireg));
  EXPECT_EQ(back_recv->Wait(nothing, Deadline::After(200ms)).status().code(), StatusCode::kTimeout);
  // Rank 0 reads what arrived meanwhile: the whole message, which its sockets' buffers hold.
  KZ_ASSERT_OK_AND_ASSIGN(size_t got, a.recv->Wait(r, Deadline::After(2s)));
  EXPECT_EQ(got, size);
  EXPECT_EQ(in, out);
  KZ_EXPECT_OK(a.send->Wait(s, Soon()).status());
}

TEST_F(TcpPair, WaitsSleep) {
  Make(1);
  Pair p = Connect();
  ASSERT_NE(p.recv, nullptr);
  uint64_t word = 0;
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, p.recv->Register(MemoryDescriptor::Host(&word, 8)));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(&word, 8, 1, rreg));
  rusage before{}, after{};
  ::getrusage(RUSAGE_THREAD, &before);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(p.recv->Wait(r, Deadline::After(300ms)).status().code(), StatusCode::kTimeout);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::getrusage(RUSAGE_THREAD, &after);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  const double cpu =
      seconds(after.ru_utime) - seconds(before.ru_utime) + seconds(after.ru_stime) - seconds(before.ru_stime);
  EXPECT_GE(wall, 0.3);
  EXPECT_LT(cpu, wall / 4) << "a wait that finds nothing must block, not spin (cpu " << cpu << " s of " << wall
                           << " s)";
}

// ---- Forwarding through ranks in between (relay.h) ----

// Four ranks' fabrics on the loopback interface; rank 0 listens, and the ranks that relay accept on
// their own listen comms (as their transport does for its peers) from a thread of their own.
class TcpRelay : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.timeout_s = 20;
    config_.fabric = {"tcp:lo"};
    for (int r = 0; r < 4; ++r) {
      FabricContext ctx;
      ctx.rank = r;
      ctx.world_size = 4;
      auto f = TcpFabric::CreateWith(config_, ctx, {V4("lo", "127.0.0.1", true)}, 2);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      fabrics_[r] = std::move(f).value();
    }
  }
  void TearDown() override {
    stop_ = true;
    for (std::thread& t : accepting_) t.join();
  }
  TcpFabric& tcp(int r) { return static_cast<TcpFabric&>(*fabrics_[r]); }
  // A listen comm of rank r whose Accept a thread calls until the test ends; it must yield nothing.
  Handle Relaying(int r) {
    auto l = fabrics_[r]->Listen(0);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return Handle{};
    const Handle h = (*l)->handle();
    accepting_.emplace_back([this, l = std::shared_ptr<ListenComm>(std::move(l).value())] {
      while (!stop_) {
        auto a = l->Accept();
        EXPECT_TRUE(a.ok() && *a == nullptr) << "a relaying listener yielded a comm, or failed";
        std::this_thread::sleep_for(1ms);
      }
    });
    return h;
  }
  // Rank 2 connects to rank 0 through `hops`; rank 0 accepts.
  Pair Connect(const std::vector<Fabric::Hop>& hops) {
    Pair p;
    auto l = fabrics_[0]->Listen(0);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return p;
    p.listen = std::move(l).value();
    auto forward = fabrics_[2]->Forward(hops, p.listen->handle());
    EXPECT_TRUE(forward.ok()) << forward.status().ToString();
    if (!forward.ok()) return p;
    ConnectAndAccept(*fabrics_[2], *forward, p);
    return p;
  }
  // Messages from 1 byte to 8 MiB go over `p` intact.
  void CheckMessages(Pair& p) {
    const size_t max = (8u << 20) + 3;
    std::vector<uint8_t> out(max), in(max);
    Fill(out, 5);
    KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, p.send->Register(MemoryDescriptor::Host(out.data(), out.size())));
    KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, p.recv->Register(MemoryDescriptor::Host(in.data(), in.size())));
    for (size_t size : {size_t{1}, size_t{70000}, max}) {
      std::fill(in.begin(), in.end(), 0);
      KZ_ASSERT_OK_AND_ASSIGN(Request * r, p.recv->Recv(in.data(), in.size(), 3, rreg));
      KZ_ASSERT_OK_AND_ASSIGN(Request * s, p.send->Send(out.data(), size, 3, sreg));
      std::thread t([&] { KZ_EXPECT_OK(p.send->Wait(s, Soon()).status()); });
      KZ_ASSERT_OK_AND_ASSIGN(size_t got, p.recv->Wait(r, Soon()));
      t.join();
      ASSERT_EQ(got, size);
      ASSERT_EQ(std::memcmp(in.data(), out.data(), size), 0) << size << " bytes";
    }
  }

  Config config_;
  std::unique_ptr<Fabric> fabrics_[4];
  std::atomic<bool> stop_{false};
  std::vector<std::thread> accepting_;
};

TEST_F(TcpRelay, OneRankInBetweenRelaysBothWays) {
  const Handle via = Relaying(1);
  Pair p = Connect({Fabric::Hop{via, 0}});
  ASSERT_NE(p.recv, nullptr);
  ASSERT_NE(p.send, nullptr);
  CheckMessages(p);
  EXPECT_GE(tcp(1).relays().bytes(), size_t{8} << 20) << "the bytes went through rank 1";
  EXPECT_EQ(tcp(1).relays().active(), 2u) << "both streams relayed";
  EXPECT_EQ(tcp(3).relays().bytes(), 0u);
  // The ends close: the relay lets both sockets go.
  p = Pair{};
  const Deadline d = Deadline::After(5s);
  while (tcp(1).relays().active() != 0 && !d.Expired()) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(tcp(1).relays().active(), 0u);
}

TEST_F(TcpRelay, TwoRanksInBetweenRelayInTurn) {
  const Handle first = Relaying(1), second = Relaying(3);
  Pair p = Connect({Fabric::Hop{first, 0}, Fabric::Hop{second, 0}});
  ASSERT_NE(p.recv, nullptr);
  CheckMessages(p);
  EXPECT_GE(tcp(1).relays().bytes(), size_t{8} << 20);
  EXPECT_GE(tcp(3).relays().bytes(), size_t{8} << 20);
}

// A relay hello without the relaying listener's secret is refused like a hello without it: the
// connecting side fails naming the handshake, nothing is relayed.
TEST_F(TcpRelay, ARelayHelloWithoutTheSecretIsRefused) {
  Handle via = Relaying(1);
  via.data[offsetof(WireHandle, secret)] ^= 0x5a;
  auto l = fabrics_[0]->Listen(0);
  ASSERT_TRUE(l.ok());
  KZ_ASSERT_OK_AND_ASSIGN(Handle forward, fabrics_[2]->Forward(std::vector<Fabric::Hop>{{via, 0}}, (*l)->handle()));
  Status failed;
  const Deadline d = Deadline::After(5s);
  while (failed.ok() && !d.Expired()) {
    auto s = fabrics_[2]->Connect(0, forward);
    if (!s.ok()) failed = s.status();
    ASSERT_TRUE(!s.ok() || *s == nullptr) << "connected without the relay's secret";
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(failed.code(), StatusCode::kRemoteError) << failed.ToString();
  EXPECT_NE(failed.message().find("handshake"), std::string::npos) << failed.message();
  EXPECT_EQ(tcp(1).relays().bytes(), 0u);
}

// A path longer than a handle holds is refused at once, naming the limit.
TEST_F(TcpRelay, APathLongerThanAHandleHoldsIsRefused) {
  const Handle via = Relaying(1);
  auto l = fabrics_[0]->Listen(0);
  ASSERT_TRUE(l.ok());
  auto forward = fabrics_[2]->Forward(std::vector<Fabric::Hop>(4, Fabric::Hop{via, 0}), (*l)->handle());
  ASSERT_FALSE(forward.ok());
  EXPECT_EQ(forward.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(forward.status().message().find("at most 3 relays"), std::string::npos) << forward.status().ToString();
}

}  // namespace
}  // namespace kizuna::fabric::tcp
