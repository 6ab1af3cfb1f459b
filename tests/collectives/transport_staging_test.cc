// How the transport registers its staging buffer when a connection refuses what the fabric
// device's properties promised (transport.h, step 2): the decision is made at creation from the
// properties, and a refusal that only registering shows — CUDA memory over libfabric 1.17 or
// direct links, whose fds cannot be mapped — moves the staging to host memory when it comes from
// the rank's first connection, and is an error naming the fabric and the peer after another
// connection registered the device's memory. A wrapper fabric over directconnect plays the
// refusing fabric: it promises fds and device pointers, and refuses device memory when registering.
// The devices are opaque emulated ones (their memory is not host accessible, as a GPU's).
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/transport/transport.h"
#include "devices/host_emulated/backend.h"
#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/core/config.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {
namespace {

using fabric::Handle;
using fabric::MemoryDescriptor;
using fabric::Registration;
using fabric::Request;

Deadline Soon() { return Deadline::AfterSeconds(20); }

// ---- A fabric that refuses device memory when registering, over directconnect ----

class WrappedRegistration : public Registration {
 public:
  WrappedRegistration(const MemoryDescriptor& memory, Registration* inner) : Registration(memory), inner(inner) {}
  Registration* const inner;
};

class WrappedRequest : public Request {
 public:
  WrappedRequest(fabric::RequestKind kind, int tag, size_t size, Request* inner)
      : Request(kind, tag, size), inner(inner) {}
  Request* const inner;
};

// A short sleep, never past the deadline: the wrapped comms have no wait primitive of their own.
void Nap(Deadline deadline) {
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(deadline.Remaining(), std::chrono::microseconds(50)));
}

Registration* Inner(Registration* r) { return r != nullptr ? static_cast<WrappedRegistration*>(r)->inner : nullptr; }

// What both wrapped comms do: refuse device memory, pass everything else to the inner comm.
template <typename Base, typename InnerComm>
class Refusing : public Base {
 public:
  explicit Refusing(std::unique_ptr<InnerComm> inner)
      : Base("refusing " + inner->label(), inner->properties()), inner_(std::move(inner)) {}

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override {
    if (memory.type == fabric::MemoryType::kDevice) return NotSupported("this fabric cannot map the device's memory");
    KZ_ASSIGN_OR_RETURN(Registration * r, inner_->Register(memory));
    return std::unique_ptr<Registration>(new WrappedRegistration(memory, r));
  }
  Status DoDeregister(Registration& r) override { return inner_->Deregister(Inner(&r)); }
  Result<fabric::Completion> DoTest(Request& request) override {
    return inner_->Test(static_cast<WrappedRequest&>(request).inner);
  }
  Status DoWaitForProgress(Deadline deadline) override {
    Nap(deadline);
    return Status::Ok();
  }
  Result<std::unique_ptr<Request>> Wrap(Result<Request*> posted, fabric::RequestKind kind, int tag, size_t size) {
    KZ_ASSIGN_OR_RETURN(Request * r, posted);
    if (r == nullptr) return std::unique_ptr<Request>();
    return std::unique_ptr<Request>(new WrappedRequest(kind, tag, size, r));
  }
  std::unique_ptr<InnerComm> inner_;
};

class RefusingSend final : public Refusing<fabric::SendComm, fabric::SendComm> {
 public:
  using Refusing::Refusing;

 protected:
  Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag, Registration* r) override {
    return Wrap(inner_->Send(data, size, tag, Inner(r)), fabric::RequestKind::kSend, tag, size);
  }
};

class RefusingRecv final : public Refusing<fabric::RecvComm, fabric::RecvComm> {
 public:
  using Refusing::Refusing;

 protected:
  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration* r) override {
    return Wrap(inner_->Recv(data, capacity, tag, Inner(r)), fabric::RequestKind::kRecv, tag, capacity);
  }
};

class RefusingListen final : public fabric::ListenComm {
 public:
  explicit RefusingListen(std::unique_ptr<fabric::ListenComm> inner)
      : ListenComm(inner->properties(), inner->handle()), inner_(std::move(inner)) {}

 protected:
  Result<std::unique_ptr<fabric::RecvComm>> DoAccept() override {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<fabric::RecvComm> comm, inner_->Accept());
    if (comm == nullptr) return comm;
    return std::unique_ptr<fabric::RecvComm>(new RefusingRecv(std::move(comm)));
  }
  Status DoWaitAcceptable(Deadline deadline) override {
    Nap(deadline);
    return Status::Ok();
  }

 private:
  std::unique_ptr<fabric::ListenComm> inner_;
};

// Named "refusing"; its devices are the inner fabric's, whose properties promise fds and device
// pointers.
class RefusingFabric final : public fabric::Fabric {
 public:
  RefusingFabric(std::unique_ptr<fabric::Fabric> inner, const Config* config)
      : Fabric("refusing", config, inner->context()), inner_(std::move(inner)) {
    for (int d = 0; d < inner_->device_count(); ++d) {
      auto p = inner_->properties(d);
      EXPECT_TRUE(p.ok());
      p->fabric = "refusing";
      devices_.push_back(*p);
    }
  }

 protected:
  Result<std::unique_ptr<fabric::ListenComm>> DoListen(int dev) override {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<fabric::ListenComm> listen, inner_->Listen(dev));
    return std::unique_ptr<fabric::ListenComm>(new RefusingListen(std::move(listen)));
  }
  Result<std::unique_ptr<fabric::SendComm>> DoConnect(int dev, const Handle& handle) override {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<fabric::SendComm> comm, inner_->Connect(dev, handle));
    if (comm == nullptr) return comm;
    return std::unique_ptr<fabric::SendComm>(new RefusingSend(std::move(comm)));
  }

 private:
  std::unique_ptr<fabric::Fabric> inner_;
};

// n ranks on opaque emulated devices, each with the fabrics `make` builds for it.
struct World {
  Config config;
  Config refusing_config;  // the refusing fabric's inner directconnect: every pair linked
  std::unique_ptr<device::Backend> backend;
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> boots;
  std::vector<std::vector<std::unique_ptr<fabric::Fabric>>> fabrics;

  World(int n, const std::string& direct_topology) {
    config.timeout_s = 20;
    config.emulated_devices = n;
    config.emu_opaque = true;
    config.topology = direct_topology;
    refusing_config = config;
    refusing_config.topology = "full";
    auto b = host_emulated::CreateHostEmulatedBackend(config);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    backend = std::move(b).value();
    auto bs = bootstrap::CreateInProcessBootstraps(n);
    EXPECT_TRUE(bs.ok()) << bs.status().ToString();
    boots = std::move(bs).value();
    fabrics.resize(static_cast<size_t>(n));
  }
  fabric::FabricContext Context(int r) const {
    fabric::FabricContext ctx;
    ctx.rank = r;
    ctx.world_size = static_cast<int>(boots.size());
    ctx.local_rank = r;
    ctx.host_id = "transport-staging-test";
    return ctx;
  }
  // Adds rank r's directconnect (over `config.topology`) or refusing fabric.
  Status Add(int r, bool refusing) {
    const Config& c = refusing ? refusing_config : config;
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<fabric::Fabric> f, fabric::CreateFabric("directconnect", c, Context(r)));
    if (refusing) f = std::make_unique<RefusingFabric>(std::move(f), &refusing_config);
    fabrics[static_cast<size_t>(r)].push_back(std::move(f));
    return Status::Ok();
  }
  std::vector<fabric::Fabric*> list(int r) {
    std::vector<fabric::Fabric*> out;
    for (const auto& f : fabrics[static_cast<size_t>(r)]) out.push_back(f.get());
    return out;
  }
  device::Device& device(int r) { return *backend->device(r); }
};

void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&fn, r] {
      SetLogRank(r);
      fn(r);
    });
  for (std::thread& t : threads) t.join();
}

// The first connection refuses the device's memory that the properties promised: the staging moves
// to host memory, for that connection and the later ones, and bytes still arrive.
TEST(TransportStaging, TheFirstConnectionsRefusalMovesStagingToHostMemory) {
  World w(2, "full");
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(w.Add(r, /*refusing=*/true).ok());
  OnEveryRank(2, [&](int r) {
    auto created = Transport::Create(w.list(r), *w.boots[static_cast<size_t>(r)], w.device(r),
                                     TransportOptions{1u << 20, 1024}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Transport& t = **created;
    // Decided from the properties: fds promised, the device exports one.
    EXPECT_FALSE(t.host_staging());
    EXPECT_NE(t.description().find("staging by fd (device export)"), std::string::npos) << t.description();
    Status connected = t.ConnectAll(Soon());
    ASSERT_TRUE(connected.ok()) << connected.ToString();
    EXPECT_TRUE(t.host_staging());
    EXPECT_EQ(t.staging_paths(), std::vector<StagingPath>{StagingPath::kHostMemory});
    EXPECT_NE(t.description().find(fmt::format("staging through host memory (refusing cannot reach {} memory)",
                                               w.device(r).label())),
              std::string::npos)
        << t.description();
    // Bytes from staging to staging (host memory now: the CPU writes and reads it).
    const int q = 1 - r;
    auto* base = static_cast<uint8_t*>(t.staging().data());
    for (size_t i = 0; i < 4096; ++i) base[i] = static_cast<uint8_t>(i * 7 + r);
    Transport::Peer* p = t.peer(q);
    ASSERT_NE(p, nullptr);
    auto recv = p->recv->Recv(base + 4096, 4096, 7, p->recv_staging);
    auto send = p->send->Send(base, 4096, 7, p->send_staging);
    ASSERT_TRUE(recv.ok() && send.ok() && *recv != nullptr && *send != nullptr);
    ASSERT_TRUE(p->send->Wait(*send, Soon()).ok());
    ASSERT_TRUE(p->recv->Wait(*recv, Soon()).ok());
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(base[4096 + i], static_cast<uint8_t>(i * 7 + q)) << "byte " << i;
    ASSERT_TRUE(w.boots[static_cast<size_t>(r)]->Barrier(Soon()).ok());
  });
}

// Direct links between ring neighbours register the device's memory by fd; the pair across the
// ring takes the refusing fabric. Once a neighbour's connection has registered the device's
// memory, the staging cannot move: the refusal is an error naming the fabric, the peer and why.
TEST(TransportStaging, ALaterConnectionsRefusalIsAnErrorNamingTheFabricAndThePeer) {
  World w(4, "ring:4");
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(w.Add(r, /*refusing=*/false).ok());
    ASSERT_TRUE(w.Add(r, /*refusing=*/true).ok());
  }
  OnEveryRank(4, [&](int r) {
    auto created = Transport::Create(w.list(r), *w.boots[static_cast<size_t>(r)], w.device(r),
                                     TransportOptions{1u << 20, 1024}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Transport& t = **created;
    const int next = (r + 1) % 4, prev = (r + 3) % 4, across = (r + 2) % 4;
    ASSERT_EQ(t.peer(next), nullptr);
    const int to[] = {next}, from[] = {prev};
    Status ring = t.WaitConnected(to, from, Soon());
    ASSERT_TRUE(ring.ok()) << ring.ToString();
    EXPECT_FALSE(t.host_staging());
    Status refused;
    for (int i = 0; i < 100 && refused.ok(); ++i) {
      auto c = t.Connect(across);
      if (!c.ok()) refused = c.status();
      if (c.ok() && *c) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(refused.code(), StatusCode::kNotSupported) << refused.ToString();
    EXPECT_NE(refused.message().find(fmt::format("refusing cannot reach {} memory", w.device(r).label())),
              std::string::npos)
        << refused.message();
    EXPECT_NE(refused.message().find(fmt::format("for rank {}", across)), std::string::npos) << refused.message();
    EXPECT_NE(refused.message().find("registered the staging buffer in the device's memory already"),
              std::string::npos)
        << refused.message();
    ASSERT_TRUE(w.boots[static_cast<size_t>(r)]->Barrier(Soon()).ok());
  });
}

}  // namespace
}  // namespace kizuna::collectives
