// Two ranks' tcp fabrics on the loopback interface in this process (README.md, "Tests"), for what
// the conformance suite does not look at: eager messages that arrive before their receive (held
// and counted as staged), messages cut over several streams, a receive too small for a message
// that waited for its post, the eager credit, both directions on one connection, a hello without
// the secret, one thread's wait moving another comm's send, and waits that sleep.
#include "fabric/tcp/transfer.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/tcp/endpoint.h"
#include "fabric/tcp/fabric.h"
#include "fabric/tcp/link.h"
#include "fabric/tcp/tcp_testing.h"

namespace kizuna::fabric::tcp {
namespace {

using namespace std::chrono_literals;
using namespace testing;  // tcp_testing.h

class TcpPair : public ::testing::Test {
 protected:
  void Make(int streams) {
    config_.timeout_s = 20;
    config_.fabric = {"tcp:lo"};
    for (int r = 0; r < 2; ++r) {
      auto f = LoopbackFabric(config_, r, 2, streams);
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

}  // namespace
}  // namespace kizuna::fabric::tcp
