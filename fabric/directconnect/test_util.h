// Helpers for the directconnect tests: fabrics of a topology for several ranks in one process,
// connections between them, sealed memfd regions.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/directconnect/fabric.h"
#include "fabric/directconnect/topology.h"
#include "runtime/core/config.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::directconnect::testing {

inline Deadline Soon() { return Deadline::AfterSeconds(20); }

// One fabric per worker of `topology`, in rank order.
struct World {
  Config config;
  std::vector<std::unique_ptr<DirectConnectFabric>> ranks;

  explicit World(const Topology& topology) {
    config.timeout_s = 20;
    for (int r = 0; r < topology.worker_count(); ++r) {
      FabricContext ctx;
      ctx.rank = r;
      ctx.world_size = topology.worker_count();
      auto f = DirectConnectFabric::CreateWithTopology(config, ctx, topology, topology.WorkerForRank(r));
      EXPECT_TRUE(f.ok()) << f.status().ToString();
      ranks.push_back(f.ok() ? std::move(f).value() : nullptr);
    }
  }
  DirectConnectFabric& operator[](int r) { return *ranks[static_cast<size_t>(r)]; }
};

struct Pair {
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// `from` connects on `from_port` to `to` listening on the far end of that port's link.
inline Pair Connect(DirectConnectFabric& from, int from_port, DirectConnectFabric& to) {
  Pair p;
  auto peer = from.topology().PeerOf(PortRef{from.node(), from_port});
  EXPECT_TRUE(peer.has_value());
  if (!peer.has_value()) return p;
  auto listen = to.Listen(peer->port);
  EXPECT_TRUE(listen.ok()) << listen.status().ToString();
  if (!listen.ok()) return p;
  p.listen = std::move(listen).value();
  auto send = from.Connect(from_port, p.listen->handle(), Soon());
  EXPECT_TRUE(send.ok()) << send.status().ToString();
  if (!send.ok()) return p;
  p.send = std::move(send).value();
  auto recv = p.listen->Accept(Soon());
  EXPECT_TRUE(recv.ok()) << recv.status().ToString();
  if (recv.ok()) p.recv = std::move(recv).value();
  return p;
}

// A memfd region, mapped here; sealed against shrinking unless `sealed` is false.
struct MemfdRegion {
  UniqueFd fd;
  uint8_t* data = nullptr;
  size_t size = 0;

  MemfdRegion(size_t bytes, bool sealed) : size(bytes) {
    fd = UniqueFd(::memfd_create("kizuna-dc-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
    if (sealed) {
      EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    EXPECT_NE(p, MAP_FAILED);
    data = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~MemfdRegion() {
    if (data != nullptr) ::munmap(data, size);
  }
  MemoryDescriptor descriptor() const {
    return MemoryDescriptor{MemoryType::kDevice, data, size, /*host_accessible=*/true, fd.get(), 0};
  }
};

inline void Fill(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 7);
}
inline bool Check(const uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != static_cast<uint8_t>((i * 2654435761u + seed) >> 7)) return false;
  return true;
}

// Runs both sides of a transfer on two threads.
inline void Both(const std::function<void()>& a, const std::function<void()>& b) {
  std::thread t(b);
  a();
  t.join();
}

}  // namespace kizuna::fabric::directconnect::testing
