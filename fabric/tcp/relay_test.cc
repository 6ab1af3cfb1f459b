// Connections forwarded through ranks in between (relay.h; README.md, "Forwarding"): four ranks'
// tcp fabrics on the loopback interface in this process.
#include "fabric/tcp/relay.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/tcp/fabric.h"
#include "fabric/tcp/tcp_testing.h"

namespace kizuna::fabric::tcp {
namespace {

using namespace std::chrono_literals;
using namespace testing;  // tcp_testing.h

// Four ranks' fabrics on the loopback interface; rank 0 listens, and the ranks that relay accept on
// their own listen comms (as their transport does for its peers) from a thread of their own.
class TcpRelay : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.timeout_s = 20;
    config_.fabric = {"tcp:lo"};
    for (int r = 0; r < 4; ++r) {
      auto f = LoopbackFabric(config_, r, 4, 2);
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
