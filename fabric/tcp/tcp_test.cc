// The tcp fabric's own tests of its pure parts (README.md, "Tests"): interface selection, the
// cables of a direct-connect topology as point-to-point devices, handles and frames. Two ranks'
// connections are in transfer_test.cc, forwarded ones in relay_test.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/tcp/endpoint.h"
#include "fabric/tcp/fabric.h"
#include "fabric/tcp/link.h"
#include "fabric/tcp/tcp_testing.h"

namespace kizuna::fabric::tcp {
namespace {

using testing::V4;

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

}  // namespace
}  // namespace kizuna::fabric::tcp
