// transport_test.cc's world: N ranks as threads of one process over in-process bootstraps, each
// with its own emulated device and fabrics, and the helpers that drive them (a transport over one
// fabric, a thread per rank, a byte pattern per pair of ranks, every pair exchanging staging
// bytes). Only transport_test.cc includes it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/transport/transport.h"
#include "devices/host_emulated/backend.h"
#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::collectives::transport_testing {

using Clock = std::chrono::steady_clock;

inline constexpr size_t kStagingBytes = size_t{1} << 20;

inline Deadline Soon() { return Deadline::AfterSeconds(20); }

// N ranks' bootstraps, devices and fabrics (one or more per rank, in preference order); the
// Config and backend outlive every fabric and transport made from them.
struct World {
  Config config;
  std::unique_ptr<device::Backend> backend;
  std::vector<std::unique_ptr<bootstrap::Bootstrap>> bootstraps;
  std::vector<std::vector<std::unique_ptr<fabric::Fabric>>> fabrics;  // [rank][preference]
  Status status;  // why a fabric could not be created, when one could not

  World(int n, const std::string& fabric_name, const std::string& topology,
        std::vector<std::string> fabric_pref = {})
      : World(n, std::vector<std::string>{fabric_name}, topology, std::move(fabric_pref)) {}
  World(int n, const std::vector<std::string>& fabric_names, const std::string& topology,
        std::vector<std::string> fabric_pref) {
    config.timeout_s = 20;
    config.emulated_devices = n;
    config.topology = topology;
    config.fabric = std::move(fabric_pref);
    auto b = host_emulated::CreateHostEmulatedBackend(config);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) {
      status = b.status();
      return;
    }
    backend = std::move(b).value();
    auto boots = bootstrap::CreateInProcessBootstraps(n);
    EXPECT_TRUE(boots.ok()) << boots.status().ToString();
    if (!boots.ok()) {
      status = boots.status();
      return;
    }
    bootstraps = std::move(boots).value();
    fabrics.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (const std::string& name : fabric_names) {
        auto f = fabric::CreateFabric(name, config, Context(r));
        if (!f.ok()) {
          status = f.status();
          return;
        }
        fabrics[static_cast<size_t>(r)].push_back(std::move(f).value());
      }
    }
  }
  fabric::FabricContext Context(int r) {
    fabric::FabricContext ctx;
    ctx.rank = r;
    ctx.world_size = size();
    ctx.local_rank = r;
    ctx.host_id = "transport-test";
    ctx.device_uuids = {device(r).properties().uuid};
    return ctx;
  }
  int size() const { return static_cast<int>(bootstraps.size()); }
  device::Device& device(int r) { return *backend->device(r); }
  fabric::Fabric& fabric(int r) { return *fabrics[static_cast<size_t>(r)][0]; }
  // Rank r's fabrics, in preference order, as Transport::Create takes them.
  std::vector<fabric::Fabric*> list(int r) {
    std::vector<fabric::Fabric*> out;
    for (const auto& f : fabrics[static_cast<size_t>(r)]) out.push_back(f.get());
    return out;
  }
  bootstrap::Bootstrap& boot(int r) { return *bootstraps[static_cast<size_t>(r)]; }
};

// The transport over one fabric.
inline Result<std::unique_ptr<Transport>> CreateOver(fabric::Fabric& fabric, bootstrap::Bootstrap& boot,
                                              device::Device& device, const TransportOptions& options,
                                              Deadline deadline) {
  fabric::Fabric* const one[] = {&fabric};
  return Transport::Create(one, boot, device, options, deadline);
}

// Runs fn(rank) on one thread per rank and joins them all.
inline void OnEveryRank(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&fn, r] {
      SetLogRank(r);
      fn(r);
    });
  for (std::thread& t : threads) t.join();
}

// A pattern distinct per (sender, receiver).
inline uint8_t PatternByte(int from, int to, size_t i) {
  return static_cast<uint8_t>((i * 131 + static_cast<size_t>(from) * 7 + static_cast<size_t>(to) * 29 + (i >> 9)) ^
                              0x5a);
}

// Tests `requests` (all posted by this thread) round-robin until every one is done; sleeps a
// little between rounds that changed nothing. `comms[i]` owns `requests[i]`.
inline Status WaitAll(std::vector<fabric::Comm*> comms, std::vector<fabric::Request*> requests, Deadline deadline) {
  auto sleep = std::chrono::microseconds(20);
  size_t left = requests.size();
  while (left > 0) {
    bool progressed = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == nullptr) continue;
      auto c = comms[i]->Test(requests[i]);
      if (!c.ok()) return c.status().WithContext(comms[i]->label());
      if (c->done) {
        requests[i] = nullptr;
        --left;
        progressed = true;
      }
    }
    if (left == 0) break;
    if (deadline.Expired()) return Timeout(fmt::format("{} request(s) not done by the deadline", left));
    if (!progressed) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min<std::chrono::microseconds>(sleep * 2, std::chrono::milliseconds(1));
    } else {
      sleep = std::chrono::microseconds(20);
    }
  }
  return Status::Ok();
}

// Whether ranks a and b are linked; everyone is, unless a test says otherwise.
using Linked = std::function<bool(int, int)>;
inline bool AllLinked(int, int) { return true; }

// Every rank sends slot `to` of its staging buffer to each peer and receives each peer's into
// slot n + from; checks the bytes (and, when `single_copy`, that nothing was staged in between).
// Pairs that are not `linked` must have no connection.
// `inspect`, when given, looks at each rank's transport first.
inline void ExchangeOnEveryRank(World& w, bool single_copy, const Linked& linked = AllLinked,
                         const std::function<void(Transport&)>& inspect = nullptr) {
  const int n = w.size();
  OnEveryRank(n, [&](int r) {
    auto created = Transport::Create(w.list(r), w.boot(r), w.device(r), TransportOptions{kStagingBytes, 256}, Soon());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Transport& t = **created;
    EXPECT_EQ(t.rank(), r);
    EXPECT_EQ(t.nranks(), n);
    EXPECT_TRUE(t.connected_peers().empty()) << "creation connected rank " << t.connected_peers()[0];
    Status connected = t.ConnectAll(Soon());
    ASSERT_TRUE(connected.ok()) << connected.ToString();
    EXPECT_EQ(t.peer(r), nullptr);
    if (inspect) inspect(t);
    const size_t slot = (kStagingBytes / (2 * static_cast<size_t>(n))) & ~size_t{63};
    auto* base = static_cast<uint8_t*>(t.staging().data());
    ASSERT_GE(t.staging().size(), kStagingBytes);

    std::vector<fabric::Comm*> comms;
    std::vector<fabric::Request*> requests;
    // What each connection carried before the exchange: its first message, which names the rank
    // that made it (a few bytes of host memory, through the channel).
    std::vector<fabric::TransferStats> before(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      Transport::Peer* p = t.peer(q);
      if (p != nullptr && p->recv != nullptr) before[static_cast<size_t>(q)] = p->recv->stats();
      if (!linked(r, q)) {
        EXPECT_EQ(p, nullptr) << "rank " << r << " is connected to rank " << q << ", which it has no link to";
        EXPECT_FALSE(t.reachable(q));
        EXPECT_FALSE(t.link_row()[static_cast<size_t>(q)].reachable);
        continue;
      }
      EXPECT_TRUE(t.reachable(q));
      ASSERT_NE(p, nullptr) << "rank " << r << " has no connection to rank " << q;
      ASSERT_TRUE(p->send != nullptr && p->recv != nullptr) << "rank " << r << " to rank " << q;
      EXPECT_EQ(p->rank, q);
      EXPECT_TRUE(t.link_row()[static_cast<size_t>(q)].reachable);
      uint8_t* in = base + (static_cast<size_t>(n) + static_cast<size_t>(q)) * slot;
      std::memset(in, 0, slot);
      auto recv = p->recv->Recv(in, slot, 7, p->recv_staging);
      ASSERT_TRUE(recv.ok()) << recv.status().ToString();
      ASSERT_NE(*recv, nullptr);
      comms.push_back(p->recv.get());
      requests.push_back(*recv);
    }
    EXPECT_FALSE(t.link_row()[static_cast<size_t>(r)].reachable);
    for (int q = 0; q < n; ++q) {
      if (q == r || !linked(r, q)) continue;
      Transport::Peer* p = t.peer(q);
      uint8_t* out = base + static_cast<size_t>(q) * slot;
      for (size_t i = 0; i < slot; ++i) out[i] = PatternByte(r, q, i);
      auto send = p->send->Send(out, slot, 7, p->send_staging);
      ASSERT_TRUE(send.ok()) << send.status().ToString();
      ASSERT_NE(*send, nullptr);
      comms.push_back(p->send.get());
      requests.push_back(*send);
    }
    Status s = WaitAll(comms, requests, Soon());
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int q = 0; q < n; ++q) {
      if (q == r || !linked(r, q)) continue;
      const uint8_t* in = base + (static_cast<size_t>(n) + static_cast<size_t>(q)) * slot;
      for (size_t i = 0; i < slot; ++i)
        ASSERT_EQ(in[i], PatternByte(q, r, i)) << "rank " << r << ": byte " << i << " from rank " << q;
      Transport::Peer* p = t.peer(q);
      const fabric::TransferStats& was = before[static_cast<size_t>(q)];
      EXPECT_EQ(p->recv->stats().bytes - was.bytes, slot);
      if (single_copy) {
        EXPECT_LE(p->send->stats().staged_bytes, 64u) << p->send->label();
        EXPECT_EQ(p->recv->stats().staged_bytes - was.staged_bytes, 0u) << p->recv->label();
      }
    }
    if (single_copy) {
      EXPECT_NE(t.description().find("by fd"), std::string::npos) << t.description();
    }
    // Nobody destroys its comms while a peer may still be reading its staging buffer.
    ASSERT_TRUE(w.boot(r).Barrier(Soon()).ok());
  });
}

}  // namespace kizuna::collectives::transport_testing
