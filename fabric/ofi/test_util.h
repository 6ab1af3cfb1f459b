// Helpers for the ofi tests: two ranks' fabrics on one provider in one process, connections
// between them, byte patterns, two threads.
//
// Providers are chosen through the typed Config (KIZUNA_FABRIC's "ofi:<provider>" form), so the
// tests need no environment beyond what BUILD sets: FI_TCP_IFACE=lo keeps tcp on 127.0.0.1.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/fabric.h"
#include "fabric/ofi/fabric.h"
#include "runtime/core/config.h"

namespace kizuna::fabric::ofi::testing {

inline Deadline Soon() { return Deadline::AfterSeconds(20); }

inline Config ConfigFor(const std::string& provider) {
  Config c;
  c.timeout_s = 20;
  c.fabric = {"ofi:" + provider};
  return c;
}

inline FabricContext Rank(int r) {
  FabricContext c;
  c.rank = r;
  c.world_size = 2;
  c.local_rank = r;
  c.host_id = "ofi-test";
  return c;
}

// Two ranks' fabrics on one provider; `status` says why not when the provider is not here.
struct World {
  Config config;
  Status status;
  std::unique_ptr<Fabric> ranks[2];

  explicit World(const std::string& provider) : config(ConfigFor(provider)) {
    for (int r = 0; r < 2; ++r) {
      auto f = OfiFabric::Create(config, Rank(r));
      if (!f.ok()) {
        status = f.status();
        return;
      }
      ranks[r] = std::move(f).value();
    }
  }
  Fabric& operator[](int r) { return *ranks[r]; }
};

struct Pair {
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// `from` connects to `to` (device 0 on both), driving both non-blocking calls on this thread.
inline Result<Pair> Connect(Fabric& from, Fabric& to, Deadline deadline = Soon()) {
  Pair p;
  KZ_ASSIGN_OR_RETURN(p.listen, to.Listen(0));
  auto backoff = std::chrono::microseconds(20);
  while (p.send == nullptr || p.recv == nullptr) {
    bool advanced = false;
    if (p.send == nullptr) {
      KZ_ASSIGN_OR_RETURN(p.send, from.Connect(0, p.listen->handle()));
      advanced = advanced || p.send != nullptr;
    }
    if (p.recv == nullptr) {
      KZ_ASSIGN_OR_RETURN(p.recv, p.listen->Accept());
      advanced = advanced || p.recv != nullptr;
    }
    if (p.send != nullptr && p.recv != nullptr) break;
    if (deadline.Expired()) return Timeout("connect / accept did not complete by the deadline");
    if (!advanced) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min<std::chrono::microseconds>(backoff * 2, std::chrono::milliseconds(5));
    }
  }
  return p;
}

inline void Fill(uint8_t* p, size_t n, uint32_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x);
  }
}

inline ::testing::AssertionResult Check(const uint8_t* p, size_t n, uint32_t seed) {
  std::vector<uint8_t> expect(n);
  Fill(expect.data(), n, seed);
  for (size_t i = 0; i < n; ++i)
    if (p[i] != expect[i])
      return ::testing::AssertionFailure() << "byte " << i << " of " << n << " is " << int{p[i]} << ", expected "
                                           << int{expect[i]};
  return ::testing::AssertionSuccess();
}

// Runs both sides on two threads.
inline void Both(const std::function<void()>& a, const std::function<void()>& b) {
  std::thread t(b);
  a();
  t.join();
}

}  // namespace kizuna::fabric::ofi::testing
