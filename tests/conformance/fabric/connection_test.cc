// FabricConformance: devices and properties, listen / connect / accept (non-blocking and with
// deadlines), handles, the wrappers' argument checks, deadlines that expire, and one-sided calls
// on fabrics without them. What the group checks: README.md.

#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/conformance/fabric/fabric_conformance.h"

namespace kizuna::fabric::conformance {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_P(FabricConformance, DevicesDescribeThemselves) {
  Fabric& f = rank0();
  EXPECT_EQ(f.name(), under_test().name);
  for (int d = 0; d < f.device_count(); ++d) {
    KZ_ASSERT_OK_AND_ASSIGN(FabricDeviceProperties p, f.properties(d));
    EXPECT_EQ(p.fabric, f.name());
    EXPECT_EQ(p.index, d);
    EXPECT_FALSE(p.name.empty());
    EXPECT_GE(p.max_requests, 1);
    EXPECT_GE(p.max_message_bytes, uint64_t{1} << 20) << "a fabric must carry at least 1 MiB per message";
    EXPECT_NE(p.ptr_support & kPtrHost, 0u) << "every fabric registers host memory";
    EXPECT_GE(p.speed_gbps, 0);
    EXPECT_GE(p.latency_us, 0);
    if (p.point_to_point && p.link_peer.has_value()) {
      EXPECT_FALSE(p.link_peer->node.empty());
      EXPECT_GE(p.link_peer->port, 0);
    }
  }
  KZ_EXPECT_CODE(f.properties(-1).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(f.properties(f.device_count()).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(f.Listen(f.device_count()).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(f.Listen(-1).status(), StatusCode::kInvalidArgument);
}

TEST_P(FabricConformance, ListenGivesDistinctHandlesWithinTheLimit) {
  KZ_ASSERT_OK_AND_ASSIGN(DevicePair devs, PickDevices(rank0(), 0, rank1(), 1));
  KZ_ASSERT_OK_AND_ASSIGN(auto a, rank0().Listen(devs.listen_dev));
  KZ_ASSERT_OK_AND_ASSIGN(auto b, rank0().Listen(devs.listen_dev));
  EXPECT_GT(a->handle().size, 0u);
  EXPECT_LE(a->handle().size, kHandleMaxBytes);
  EXPECT_FALSE(a->handle() == b->handle()) << "two listeners must not share a handle";
  // Handles travel as text through bootstraps and files.
  KZ_ASSERT_OK_AND_ASSIGN(Handle back, Handle::FromHex(a->handle().ToHex()));
  EXPECT_TRUE(back == a->handle());
  KZ_EXPECT_CODE(Handle::FromHex("abc").status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(Handle::FromHex("zz").status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(Handle::FromHex(std::string(2 * kHandleMaxBytes + 2, 'a')).status(), StatusCode::kInvalidArgument);
}

TEST_P(FabricConformance, AcceptIsNonBlockingAndConnectionsCarryLabels) {
  KZ_ASSERT_OK_AND_ASSIGN(DevicePair devs, PickDevices(rank0(), 0, rank1(), 1));
  KZ_ASSERT_OK_AND_ASSIGN(auto listen, rank0().Listen(devs.listen_dev));
  const auto start = Clock::now();
  KZ_ASSERT_OK_AND_ASSIGN(auto none, listen->Accept());
  EXPECT_EQ(none, nullptr) << "Accept returned a comm nobody connected";
  EXPECT_LT(Clock::now() - start, 1s) << "a non-blocking Accept blocked";
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  ASSERT_NE(c.recv, nullptr);
  EXPECT_FALSE(c.send->label().empty());
  EXPECT_FALSE(c.recv->label().empty());
  EXPECT_EQ(c.send->properties().fabric, under_test().name);
  EXPECT_EQ(c.send->requests_in_flight(), 0);
}

TEST_P(FabricConformance, AcceptDeadlineExpires) {
  KZ_ASSERT_OK_AND_ASSIGN(DevicePair devs, PickDevices(rank0(), 0, rank1(), 1));
  KZ_ASSERT_OK_AND_ASSIGN(auto listen, rank0().Listen(devs.listen_dev));
  const auto start = Clock::now();
  auto r = listen->Accept(Deadline::After(50ms));
  const auto took = Clock::now() - start;
  KZ_EXPECT_CODE(r.status(), StatusCode::kTimeout);
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 5s);
}

TEST_P(FabricConformance, MalformedHandlesAreRejected) {
  KZ_ASSERT_OK_AND_ASSIGN(DevicePair devs, PickDevices(rank0(), 0, rank1(), 1));
  Handle empty;
  KZ_EXPECT_CODE(rank1().Connect(devs.connect_dev, empty).status(), StatusCode::kInvalidArgument);
  Handle garbage;
  garbage.size = kHandleMaxBytes;
  for (size_t i = 0; i < kHandleMaxBytes; ++i) garbage.data[i] = static_cast<uint8_t>(i * 37 + 11);
  KZ_EXPECT_CODE(rank1().Connect(devs.connect_dev, garbage).status(), StatusCode::kInvalidArgument);
  KZ_ASSERT_OK_AND_ASSIGN(auto listen, rank0().Listen(devs.listen_dev));
  Handle truncated = listen->handle();
  truncated.size = truncated.size / 2;
  KZ_EXPECT_CODE(rank1().Connect(devs.connect_dev, truncated).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(rank1().Connect(rank1().device_count(), listen->handle()).status(), StatusCode::kInvalidArgument);
}

TEST_P(FabricConformance, ConnectingToAClosedListenerFailsInTime) {
  KZ_ASSERT_OK_AND_ASSIGN(DevicePair devs, PickDevices(rank0(), 0, rank1(), 1));
  Handle handle;
  {
    KZ_ASSERT_OK_AND_ASSIGN(auto listen, rank0().Listen(devs.listen_dev));
    handle = listen->handle();
  }
  const auto start = Clock::now();
  auto r = rank1().Connect(devs.connect_dev, handle, Deadline::After(2s));
  EXPECT_FALSE(r.ok()) << "connected to a listener that was closed";
  EXPECT_LT(Clock::now() - start, 3s);
}

TEST_P(FabricConformance, ManyConnectionsBetweenTheSameDevices) {
  constexpr int kConnections = 8;
  std::vector<Connection> conns;
  for (int i = 0; i < kConnections; ++i) {
    conns.push_back(MustConnect());
    ASSERT_NE(conns.back().send, nullptr);
  }
  std::vector<uint64_t> out(kConnections), in(kConnections, 0);
  std::vector<Request*> sends(kConnections), recvs(kConnections);
  std::vector<Registration*> sregs(kConnections), rregs(kConnections);
  for (int i = 0; i < kConnections; ++i) {
    out[i] = 0x1000 + i;
    KZ_ASSERT_OK_AND_ASSIGN(sregs[i], conns[i].send->Register(MemoryDescriptor::Host(&out[i], 8)));
    KZ_ASSERT_OK_AND_ASSIGN(rregs[i], conns[i].recv->Register(MemoryDescriptor::Host(&in[i], 8)));
    KZ_ASSERT_OK_AND_ASSIGN(recvs[i], conns[i].recv->Recv(&in[i], 8, 5, rregs[i]));
    KZ_ASSERT_OK_AND_ASSIGN(sends[i], conns[i].send->Send(&out[i], 8, 5, sregs[i]));
  }
  for (int i = kConnections - 1; i >= 0; --i) {
    KZ_EXPECT_OK(conns[i].send->Wait(sends[i], TestDeadline()).status());
    KZ_EXPECT_OK(conns[i].recv->Wait(recvs[i], TestDeadline()).status());
    EXPECT_EQ(in[i], 0x1000u + i) << "connection " << i << " carried another connection's message";
  }
}

TEST_P(FabricConformance, WrappersCheckTheirArguments) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  std::vector<uint8_t> buf(4096), other(4096);
  // Registration.
  KZ_EXPECT_CODE(c.send->Register(MemoryDescriptor::Host(buf.data(), 0)).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Register(MemoryDescriptor::Host(nullptr, 64)).status(), StatusCode::kInvalidArgument);
  MemoryDescriptor wraps = MemoryDescriptor::Host(reinterpret_cast<void*>(UINTPTR_MAX - 10), 64);
  KZ_EXPECT_CODE(c.send->Register(wraps).status(), StatusCode::kInvalidArgument);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(buf.data(), 4096)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(other.data(), 4096)));
  // Ranges.
  KZ_EXPECT_CODE(c.send->Send(buf.data(), 4097, 0, sreg).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Send(buf.data() + 1, 4096, 0, sreg).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Send(other.data(), 16, 0, sreg).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Send(buf.data(), 16, 0, nullptr).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Send(nullptr, 16, 0, sreg).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.recv->Recv(other.data(), 8192, 0, rreg).status(), StatusCode::kInvalidArgument);
  // A registration of another comm.
  KZ_EXPECT_CODE(c.send->Send(other.data(), 16, 0, rreg).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.recv->Recv(buf.data(), 16, 0, sreg).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.send->Deregister(rreg), StatusCode::kInvalidArgument);
  // Requests that are not this comm's.
  int not_a_request = 0;
  KZ_EXPECT_CODE(c.send->Test(reinterpret_cast<Request*>(&not_a_request)).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(c.recv->Test(nullptr).status(), StatusCode::kInvalidArgument);
  // Flush needs a registered range.
  KZ_EXPECT_CODE(c.recv->Flush(other.data(), 16, nullptr, TestDeadline()), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(c.recv->Flush(other.data(), 16, rreg, TestDeadline()));
  // Nothing was posted by the rejected calls.
  EXPECT_EQ(c.send->requests_in_flight(), 0);
  EXPECT_EQ(c.recv->requests_in_flight(), 0);

  // A registration in use cannot be released; once its request is done, it can.
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(other.data(), 16, 3, rreg));
  ASSERT_NE(r, nullptr);
  KZ_EXPECT_CODE(c.recv->Deregister(rreg), StatusCode::kInvalidArgument);
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(buf.data(), 16, 3, sreg));
  ASSERT_NE(s, nullptr);
  KZ_EXPECT_OK(c.send->Wait(s, TestDeadline()).status());
  KZ_EXPECT_OK(c.recv->Wait(r, TestDeadline()).status());
  // A request reported done is gone.
  KZ_EXPECT_CODE(c.recv->Test(r).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(c.recv->Deregister(rreg));
  KZ_EXPECT_CODE(c.recv->Deregister(rreg), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(c.send->Deregister(sreg));
}

TEST_P(FabricConformance, WaitDeadlineExpiresAndTheRequestStaysLive) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  uint64_t out = 0x5eed, in = 0;
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(&out, 8)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(&in, 8)));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, c.recv->Recv(&in, 8, 9, rreg));
  ASSERT_NE(r, nullptr);
  const auto start = Clock::now();
  KZ_EXPECT_CODE(c.recv->Wait(r, Deadline::After(50ms)).status(), StatusCode::kTimeout);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 50ms);
  EXPECT_LT(took, 5s);
  EXPECT_EQ(c.recv->requests_in_flight(), 1) << "a timed-out wait must leave the request live";
  KZ_ASSERT_OK_AND_ASSIGN(Request * s, c.send->Send(&out, 8, 9, sreg));
  ASSERT_NE(s, nullptr);
  KZ_EXPECT_OK(c.send->Wait(s, TestDeadline()).status());
  KZ_ASSERT_OK_AND_ASSIGN(size_t got, c.recv->Wait(r, TestDeadline()));
  EXPECT_EQ(got, 8u);
  EXPECT_EQ(in, 0x5eedu);
}

TEST_P(NoWriteConformance, OneSidedCallsWithoutWriteSupportSayNotSupported) {
  Connection c = MustConnect();
  ASSERT_NE(c.send, nullptr);
  uint64_t word = 0;
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, c.recv->Register(MemoryDescriptor::Host(&word, 8)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, c.send->Register(MemoryDescriptor::Host(&word, 8)));
  KZ_EXPECT_CODE(c.recv->Expose(rreg).status(), StatusCode::kNotSupported);
  KZ_EXPECT_CODE(c.recv->PollImmediate().status(), StatusCode::kNotSupported);
  RemoteKey key;
  key.size = 8;
  KZ_EXPECT_CODE(c.send->Write(&word, 8, sreg, key, 0, 1u).status(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace kizuna::fabric::conformance
