// What the tcp fabric's tests share (README.md, "Tests"): assertions that print the whole Status, an
// IPv4 interface, ranks' fabrics on the loopback interface, and two ranks' comms connected.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/fabric.h"
#include "fabric/tcp/fabric.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/status_testing.h"

namespace kizuna::fabric::tcp::testing {

inline Interface V4(const std::string& name, const char* address, bool loopback = false) {
  Interface i;
  i.name = name;
  i.loopback = loopback;
  auto* in = reinterpret_cast<sockaddr_in*>(&i.address);
  in->sin_family = AF_INET;
  ::inet_pton(AF_INET, address, &in->sin_addr);
  return i;
}

// Rank `rank` of `world_size`'s tcp fabric on the loopback interface, `streams` sockets a connection.
inline Result<std::unique_ptr<Fabric>> LoopbackFabric(const Config& config, int rank, int world_size, int streams) {
  FabricContext ctx;
  ctx.rank = rank;
  ctx.world_size = world_size;
  return TcpFabric::CreateWith(config, ctx, {V4("lo", "127.0.0.1", true)}, streams);
}

inline Deadline Soon() { return Deadline::AfterSeconds(20); }

struct Pair {
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// Connects `from` (its device 0) to `p.listen` by `handle` while the listener accepts, until both
// ends have their comm (each step's failure reported).
inline void ConnectAndAccept(Fabric& from, const Handle& handle, Pair& p) {
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

inline void Fill(std::vector<uint8_t>& v, uint8_t seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + i / 251);
}

}  // namespace kizuna::fabric::tcp::testing
