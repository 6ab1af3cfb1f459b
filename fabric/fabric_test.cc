// The fabric interface's own behaviour, with no backend: the non-virtual wrappers' checks (ranges,
// ownership, limits, kNotSupported defaults), the deadline loops of Wait / Accept / Connect, opaque
// blobs, and the registry (statuses, selection by KIZUNA_FABRIC, the plugin seam). The fabric
// under test is a loopback defined here: messages are matched and copied when both sides have
// posted.

#include "fabric/fabric.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/registry.h"

namespace kizuna::fabric {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- A loopback fabric ----

struct LoopRequest : Request {
  LoopRequest(RequestKind kind, int tag, size_t size, void* data) : Request(kind, tag, size), data(data) {}
  void* data;
  bool done = false;
  size_t length = 0;
  Status error;
};

struct LoopRegistration : Registration {
  explicit LoopRegistration(const MemoryDescriptor& m) : Registration(m) {}
};

// The shared state of one connection (single-threaded tests: no lock).
struct Wire {
  bool connected = false, accepted = false;
  std::deque<LoopRequest*> sends, recvs;

  // Pairs sends and receives of the same tag, each in posting order.
  void Match() {
    for (auto s = sends.begin(); s != sends.end();) {
      auto r = std::find_if(recvs.begin(), recvs.end(), [&](LoopRequest* x) { return x->tag() == (*s)->tag(); });
      if (r == recvs.end()) {
        ++s;
        continue;
      }
      if ((*s)->size() > (*r)->size()) {
        (*s)->error = (*r)->error = InvalidArgument(fmt::format("{} bytes into {}", (*s)->size(), (*r)->size()));
      } else {
        if ((*s)->size() > 0) std::memcpy((*r)->data, (*s)->data, (*s)->size());
        (*r)->length = (*s)->length = (*s)->size();
      }
      (*s)->done = (*r)->done = true;
      recvs.erase(r);
      s = sends.erase(s);
    }
  }
  void Forget(LoopRequest* r) {
    std::erase(sends, r);
    std::erase(recvs, r);
  }
};

std::map<uint64_t, std::weak_ptr<Wire>>& Wires() {
  static std::map<uint64_t, std::weak_ptr<Wire>> wires;
  return wires;
}

template <typename Base>
class LoopComm : public Base {
 public:
  LoopComm(std::shared_ptr<Wire> wire, const FabricDeviceProperties& p) : Base("loop", p), wire_(std::move(wire)) {}
  ~LoopComm() override {
    for (LoopRequest* r : mine_) wire_->Forget(r);
  }

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& m) override {
    return std::unique_ptr<Registration>(std::make_unique<LoopRegistration>(m));
  }
  Status DoDeregister(Registration&) override { return Status::Ok(); }
  Result<Completion> DoTest(Request& request) override {
    auto& r = static_cast<LoopRequest&>(request);
    if (!r.done) return Completion{};
    std::erase(mine_, &r);
    if (!r.error.ok()) return r.error;
    return Completion{true, r.length};
  }
  Status DoWaitForProgress(Deadline deadline) override {
    // Nothing else progresses a loopback in a single-threaded test: sleep a little.
    std::this_thread::sleep_until(std::min(deadline.when(), Clock::now() + 1ms));
    return Status::Ok();
  }
  std::unique_ptr<Request> Post(RequestKind kind, int tag, size_t size, void* data) {
    auto r = std::make_unique<LoopRequest>(kind, tag, size, data);
    mine_.push_back(r.get());
    (kind == RequestKind::kSend ? wire_->sends : wire_->recvs).push_back(r.get());
    wire_->Match();
    return r;
  }

  std::shared_ptr<Wire> wire_;
  std::vector<LoopRequest*> mine_;
};

class LoopSend : public LoopComm<SendComm> {
 public:
  using LoopComm::LoopComm;

 protected:
  Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag, Registration*) override {
    return Post(RequestKind::kSend, tag, size, const_cast<void*>(data));
  }
};

class LoopRecv : public LoopComm<RecvComm> {
 public:
  using LoopComm::LoopComm;

 protected:
  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration*) override {
    return Post(RequestKind::kRecv, tag, capacity, data);
  }
};

Handle HandleFor(uint64_t id) {
  Handle h;
  h.size = 8;
  std::memcpy(h.data.data(), &id, 8);
  return h;
}

class LoopListen : public ListenComm {
 public:
  LoopListen(const FabricDeviceProperties& p, uint64_t id, std::shared_ptr<Wire> wire)
      : ListenComm(p, HandleFor(id)), wire_(std::move(wire)) {}

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override {
    if (!wire_->connected || wire_->accepted) return std::unique_ptr<RecvComm>();
    wire_->accepted = true;
    return std::unique_ptr<RecvComm>(std::make_unique<LoopRecv>(wire_, properties()));
  }
  Status DoWaitAcceptable(Deadline deadline) override {
    std::this_thread::sleep_until(std::min(deadline.when(), Clock::now() + 1ms));
    return Status::Ok();
  }

 private:
  std::shared_ptr<Wire> wire_;
};

// Knobs of the loopback, set by each test.
FabricDeviceProperties g_props;
int g_connect_in_progress = 0;  // how many Connect calls answer "in progress" first

class LoopFabric : public Fabric {
 public:
  LoopFabric(const Config* config, const FabricContext& ctx) : Fabric("loop", config, ctx) { devices_ = {g_props}; }

 protected:
  Result<std::unique_ptr<ListenComm>> DoListen(int dev) override {
    static uint64_t next = 1;
    auto wire = std::make_shared<Wire>();
    Wires()[next] = wire;
    return std::unique_ptr<ListenComm>(std::make_unique<LoopListen>(devices_[dev], next++, wire));
  }
  Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) override {
    if (handle.size != 8) return InvalidArgument("not a loop handle");
    uint64_t id;
    std::memcpy(&id, handle.data.data(), 8);
    auto it = Wires().find(id);
    std::shared_ptr<Wire> wire = it == Wires().end() ? nullptr : it->second.lock();
    if (wire == nullptr) return RemoteError("no listener");
    if (g_connect_in_progress > 0) {
      --g_connect_in_progress;
      return std::unique_ptr<SendComm>();
    }
    wire->connected = true;
    return std::unique_ptr<SendComm>(std::make_unique<LoopSend>(wire, devices_[dev]));
  }
};

Result<std::unique_ptr<Fabric>> CreateLoop(const Config& config, const FabricContext& ctx) {
  return std::unique_ptr<Fabric>(std::make_unique<LoopFabric>(&config, ctx));
}
Result<std::unique_ptr<Fabric>> CreateAbsent(const Config&, const FabricContext&) {
  return Unavailable("no such NIC in this test");
}
Result<std::unique_ptr<Fabric>> CreateBroken(const Config&, const FabricContext&) {
  return Internal("the broken fabric broke");
}

KZ_REGISTER_FABRIC(loop, &CreateLoop, false);
KZ_REGISTER_FABRIC(absent, &CreateAbsent, true);
KZ_REGISTER_FABRIC(broken, &CreateBroken, false);

FabricDeviceProperties DefaultProps() {
  FabricDeviceProperties p;
  p.fabric = "loop";
  p.name = "loop0";
  p.max_requests = 4;
  p.max_message_bytes = 1 << 20;
  p.ptr_support = kPtrHost | kPtrFd;
  return p;
}

class LoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_props = DefaultProps();
    g_connect_in_progress = 0;
  }
  // A connected pair on a fresh loop fabric.
  void ConnectPair() {
    auto f = CreateFabric("loop", config_, FabricContext{});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    fabric_ = std::move(f).value();
    auto l = fabric_->Listen(0);
    ASSERT_TRUE(l.ok());
    listen_ = std::move(l).value();
    auto s = fabric_->Connect(0, listen_->handle(), Deadline::After(5s));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    send_ = std::move(s).value();
    auto r = listen_->Accept(Deadline::After(5s));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    recv_ = std::move(r).value();
  }

  Config config_;
  std::unique_ptr<Fabric> fabric_;
  std::unique_ptr<ListenComm> listen_;
  std::unique_ptr<SendComm> send_;
  std::unique_ptr<RecvComm> recv_;
};

// ---- Blobs ----

TEST(OpaqueBlob, HexRoundTripsAndRejectsBadText) {
  const uint8_t bytes[] = {0x00, 0x7f, 0xff, 0x10};
  auto h = Handle::FromBytes(bytes);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->ToHex(), "007fff10");
  auto back = Handle::FromHex("007FFF10");
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == *h);
  EXPECT_EQ(Handle::FromHex("0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Handle::FromHex("0g").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoteKey::FromHex(std::string(130, '1')).status().code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> big(kHandleMaxBytes + 1);
  EXPECT_EQ(Handle::FromBytes(big).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Handle::FromHex("").ok());
}

// ---- Registry ----

TEST(FabricRegistry, RecordsEveryFabricWithItsStatus) {
  Config config;
  config.fabric_plugins = {"/opt/vendor/libkz_fabric_x.so"};
  auto reg = FabricRegistry::Create(config, FabricContext{});
  std::map<std::string, StatusCode> codes;
  for (const FabricSlot& s : reg->fabrics()) codes[s.name] = s.status.code();
  EXPECT_EQ(codes["loop"], StatusCode::kOk);
  EXPECT_EQ(codes["absent"], StatusCode::kUnavailable);
  EXPECT_EQ(codes["broken"], StatusCode::kInternal);
  EXPECT_EQ(codes["/opt/vendor/libkz_fabric_x.so"], StatusCode::kInvalidArgument) << "a plugin that cannot be loaded";
  EXPECT_NE(reg->Find("loop"), nullptr);
  EXPECT_EQ(reg->Find("absent"), nullptr);
  for (const FabricSlot& s : reg->fabrics()) {
    if (s.name == "absent") {
      EXPECT_TRUE(s.needs_hardware);
    }
  }
}

TEST(FabricRegistry, SelectsByPreferenceOrFirstAvailable) {
  Config config;
  {
    auto reg = FabricRegistry::Create(config, FabricContext{});
    auto f = reg->Select();
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->name(), "loop");
  }
  config.fabric = {"absent", "loop"};
  {
    auto reg = FabricRegistry::Create(config, FabricContext{});
    auto f = reg->Select();
    ASSERT_TRUE(f.ok());
    EXPECT_EQ((*f)->name(), "loop");
  }
  config.fabric = {"absent", "nowhere"};
  {
    auto reg = FabricRegistry::Create(config, FabricContext{});
    auto f = reg->Select();
    EXPECT_EQ(f.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(f.status().message().find("no such NIC in this test"), std::string::npos) << f.status().message();
    EXPECT_NE(f.status().message().find("nowhere: not linked in"), std::string::npos) << f.status().message();
  }
  auto unknown = CreateFabric("nowhere", config, FabricContext{});
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("loop"), std::string::npos) << "lists the registered fabrics";
}

// ---- The wrappers ----

TEST_F(LoopTest, DevicesAndListenAreRangeChecked) {
  ConnectPair();
  EXPECT_EQ(fabric_->device_count(), 1);
  EXPECT_EQ(fabric_->properties(1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fabric_->Listen(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fabric_->Connect(3, listen_->handle()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fabric_->Connect(0, Handle{}).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoopTest, PostsAreCheckedLimitedAndMatched) {
  ConnectPair();
  std::vector<uint8_t> out(2 << 20, 7), in(2 << 20);
  auto sreg = send_->Register(MemoryDescriptor::Host(out.data(), out.size()));
  auto rreg = recv_->Register(MemoryDescriptor::Host(in.data(), in.size()));
  ASSERT_TRUE(sreg.ok() && rreg.ok());
  // Beyond max_message_bytes.
  EXPECT_EQ(send_->Send(out.data(), (1 << 20) + 1, 0, *sreg).status().code(), StatusCode::kInvalidArgument);
  // The in-flight limit answers busy without calling the backend.
  std::vector<Request*> recvs;
  for (int i = 0; i < 4; ++i) {
    auto r = recv_->Recv(in.data() + i * 16, 16, i, *rreg);
    ASSERT_TRUE(r.ok() && *r != nullptr);
    recvs.push_back(*r);
  }
  auto busy = recv_->Recv(in.data(), 16, 9, *rreg);
  ASSERT_TRUE(busy.ok());
  EXPECT_EQ(*busy, nullptr);
  EXPECT_EQ(recv_->requests_in_flight(), 4);
  // A registration in use cannot be released.
  EXPECT_EQ(recv_->Deregister(*rreg).code(), StatusCode::kInvalidArgument);
  for (int i = 3; i >= 0; --i) {
    auto s = send_->Send(out.data(), 16, i, *sreg);
    ASSERT_TRUE(s.ok() && *s != nullptr);
    auto sent = send_->Wait(*s, Deadline::After(1s));
    ASSERT_TRUE(sent.ok()) << sent.status().ToString();
    EXPECT_EQ(*sent, 16u);
  }
  for (Request* r : recvs) {
    auto got = recv_->Wait(r, Deadline::After(1s));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, 16u);
  }
  EXPECT_EQ(recv_->Test(recvs[0]).status().code(), StatusCode::kInvalidArgument) << "a released request";
  EXPECT_TRUE(recv_->Deregister(*rreg).ok());
  // A zero-byte message needs no registration.
  auto z = recv_->Recv(nullptr, 0, 5, nullptr);
  auto zs = send_->Send(nullptr, 0, 5, nullptr);
  ASSERT_TRUE(z.ok() && zs.ok());
  auto zero = recv_->Wait(*z, Deadline::After(1s));
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ(*zero, 0u);
}

TEST_F(LoopTest, WaitTimesOutAndLeavesTheRequestLive) {
  ConnectPair();
  uint64_t word = 0;
  auto rreg = recv_->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(rreg.ok());
  auto r = recv_->Recv(&word, 8, 0, *rreg);
  ASSERT_TRUE(r.ok());
  const auto start = Clock::now();
  EXPECT_EQ(recv_->Wait(*r, Deadline::After(20ms)).status().code(), StatusCode::kTimeout);
  EXPECT_GE(Clock::now() - start, 20ms);
  EXPECT_EQ(recv_->requests_in_flight(), 1);
  auto test = recv_->Test(*r);
  ASSERT_TRUE(test.ok());
  EXPECT_FALSE(test->done);
}

TEST_F(LoopTest, RegistrationFollowsPointerSupport) {
  ConnectPair();
  uint64_t word = 0;
  MemoryDescriptor device{MemoryType::kDevice, &word, 8, true, -1, 0};
  auto r = send_->Register(device);
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("register it by fd"), std::string::npos) << r.status().message();
  g_props.ptr_support = kPtrHost;
  ConnectPair();
  MemoryDescriptor by_fd{MemoryType::kDevice, &word, 8, true, 0, 0};
  EXPECT_EQ(send_->Register(by_fd).status().code(), StatusCode::kNotSupported);
  MemoryDescriptor lying{MemoryType::kHost, &word, 8, false, -1, 0};
  EXPECT_EQ(send_->Register(lying).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(LoopTest, OneSidedCallsDefaultToNotSupported) {
  g_props.write_immediate = true;  // advertised, but the loopback implements none of it
  ConnectPair();
  uint64_t word = 0;
  auto rreg = recv_->Register(MemoryDescriptor::Host(&word, 8));
  auto sreg = send_->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(rreg.ok() && sreg.ok());
  EXPECT_EQ(recv_->Expose(*rreg).status().code(), StatusCode::kNotSupported);
  EXPECT_EQ(recv_->PollImmediate().status().code(), StatusCode::kNotSupported);
  RemoteKey key;
  key.size = 4;
  EXPECT_EQ(send_->Write(&word, 8, *sreg, key, 0, 1u).status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(recv_->Flush(&word, 8, *rreg, Deadline::After(1s)).ok()) << "flush is a no-op by default";
  g_props.write_immediate = false;
  ConnectPair();
  auto reg2 = send_->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(reg2.ok());
  auto w = send_->Write(&word, 8, *reg2, key, 0, std::nullopt);
  EXPECT_EQ(w.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(w.status().message().find("no one-sided write"), std::string::npos);
}

TEST_F(LoopTest, ConnectAndAcceptLoopUntilTheirDeadlines) {
  ConnectPair();
  // Connect answers "in progress" three times, then connects: the deadline loop retries.
  auto l = fabric_->Listen(0);
  ASSERT_TRUE(l.ok());
  g_connect_in_progress = 3;
  auto first = fabric_->Connect(0, (*l)->handle());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, nullptr);
  auto s = fabric_->Connect(0, (*l)->handle(), Deadline::After(5s));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_NE(*s, nullptr);
  EXPECT_EQ(g_connect_in_progress, 0);
  // A connection that never completes times out.
  auto l2 = fabric_->Listen(0);
  ASSERT_TRUE(l2.ok());
  g_connect_in_progress = 1 << 30;
  const auto start = Clock::now();
  EXPECT_EQ(fabric_->Connect(0, (*l2)->handle(), Deadline::After(30ms)).status().code(), StatusCode::kTimeout);
  EXPECT_LT(Clock::now() - start, 2s);
  // Accept with nobody connecting.
  EXPECT_EQ((*l2)->Accept(Deadline::After(20ms)).status().code(), StatusCode::kTimeout);
}

}  // namespace
}  // namespace kizuna::fabric
