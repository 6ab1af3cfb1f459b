// Direct-connect transfers beyond the conformance suite: which path a message takes (staged
// through the ring, copied straight into the receiver's mapped region, or pulled from the
// sender's), the fallback when a region cannot be mapped safely, link shaping, waits that sleep,
// and a randomized mix of sizes and tags.

#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/directconnect/test_util.h"

namespace kizuna::fabric::directconnect {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::Both;
using testing::Check;
using testing::Fill;
using testing::MemfdRegion;
using testing::Soon;
using testing::World;

Topology Ring2(bool shaping = false, double gbps = 100, double latency_us = 1) {
  auto t = GenerateRing(2, {gbps, latency_us});
  EXPECT_TRUE(t.ok());
  t->shaping = shaping;
  return *t;
}

// Moves one message of `size` bytes from `src` to `dst` (already registered) on both threads.
void Transfer(testing::Pair& p, void* src, Registration* sreg, void* dst, Registration* rreg, size_t size) {
  Both(
      [&] {
        auto r = p.recv->Recv(dst, size, 0, rreg);
        ASSERT_TRUE(r.ok() && *r != nullptr) << r.status().ToString();
        auto got = p.recv->Wait(*r, Soon());
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_EQ(*got, size);
      },
      [&] {
        auto s = p.send->Send(src, size, 0, sreg);
        ASSERT_TRUE(s.ok() && *s != nullptr) << s.status().ToString();
        auto sent = p.send->Wait(*s, Soon());
        ASSERT_TRUE(sent.ok()) << sent.status().ToString();
      });
}

struct PathCase {
  const char* name;
  bool send_fd, recv_fd;
  bool staged;
};

TEST(DirectConnectTransfer, ThePathFollowsTheRegistrations) {
  constexpr size_t kSize = (3 << 20) + 17;  // several ring chunks when staged
  const PathCase cases[] = {
      {"host to host: staged", false, false, true},
      {"into an fd region: direct", false, true, false},
      {"from an fd region: pulled", true, false, false},
      {"fd to fd: direct", true, true, false},
  };
  World w(Ring2());
  for (const PathCase& c : cases) {
    SCOPED_TRACE(c.name);
    testing::Pair p = testing::Connect(w[1], 0, w[0]);
    ASSERT_NE(p.recv, nullptr);
    MemfdRegion src_fd(kSize, true), dst_fd(kSize, true);
    std::vector<uint8_t> src_host(kSize), dst_host(kSize);
    uint8_t* src = c.send_fd ? src_fd.data : src_host.data();
    uint8_t* dst = c.recv_fd ? dst_fd.data : dst_host.data();
    auto sreg = p.send->Register(c.send_fd ? src_fd.descriptor() : MemoryDescriptor::Host(src, kSize));
    auto rreg = p.recv->Register(c.recv_fd ? dst_fd.descriptor() : MemoryDescriptor::Host(dst, kSize));
    ASSERT_TRUE(sreg.ok() && rreg.ok());
    Fill(src, kSize, 5);
    Transfer(p, src, *sreg, dst, *rreg, kSize);
    EXPECT_TRUE(Check(dst, kSize, 5));
    EXPECT_EQ(p.send->stats().staged_bytes, c.staged ? kSize : 0);
    EXPECT_EQ(p.recv->stats().staged_bytes, c.staged ? kSize : 0);
    EXPECT_EQ(p.recv->stats().bytes, kSize);
    EXPECT_EQ(p.send->stats().messages, 1u);
  }
}

TEST(DirectConnectTransfer, RegionsThatCannotBeMappedSafelyAreStaged) {
  // A memfd the owner could shrink is not mapped by the peer (an access past a shrunk end would
  // be SIGBUS): the receiver's region forces staging instead of a direct copy, the sender's a
  // refused pull, then staging.
  constexpr size_t kSize = (1 << 20) + 3;
  World w(Ring2());
  for (bool unsealed_at_receiver : {true, false}) {
    SCOPED_TRACE(unsealed_at_receiver ? "unsealed receive region" : "unsealed send region");
    testing::Pair p = testing::Connect(w[1], 0, w[0]);
    ASSERT_NE(p.recv, nullptr);
    MemfdRegion unsealed(kSize, false);
    std::vector<uint8_t> host(kSize);
    uint8_t* src = unsealed_at_receiver ? host.data() : unsealed.data;
    uint8_t* dst = unsealed_at_receiver ? unsealed.data : host.data();
    auto sreg = p.send->Register(unsealed_at_receiver ? MemoryDescriptor::Host(src, kSize) : unsealed.descriptor());
    auto rreg = p.recv->Register(unsealed_at_receiver ? unsealed.descriptor() : MemoryDescriptor::Host(dst, kSize));
    ASSERT_TRUE(sreg.ok() && rreg.ok());
    for (int round = 0; round < 2; ++round) {
      Fill(src, kSize, 11 + round);
      Transfer(p, src, *sreg, dst, *rreg, kSize);
      EXPECT_TRUE(Check(dst, kSize, 11 + round)) << "round " << round;
    }
    EXPECT_EQ(p.recv->stats().staged_bytes, 2 * kSize);
  }
}

TEST(DirectConnectTransfer, ShapingPacesTransfersToTheLinksBandwidthAndLatency) {
  // 1 Gb/s and 2 ms: 1 MB occupies the link for 8 ms and arrives 2 ms after it has left.
  World w(Ring2(/*shaping=*/true, /*gbps=*/1, /*latency_us=*/2000));
  testing::Pair p = testing::Connect(w[1], 0, w[0]);
  ASSERT_NE(p.recv, nullptr);
  constexpr size_t kSize = 1000000;
  std::vector<uint8_t> src(kSize), dst(2 * kSize);
  auto sreg = p.send->Register(MemoryDescriptor::Host(src.data(), kSize));
  auto rreg = p.recv->Register(MemoryDescriptor::Host(dst.data(), 2 * kSize));
  ASSERT_TRUE(sreg.ok() && rreg.ok());
  auto r1 = p.recv->Recv(dst.data(), kSize, 0, *rreg);
  auto r2 = p.recv->Recv(dst.data() + kSize, kSize, 0, *rreg);
  ASSERT_TRUE(r1.ok() && r2.ok());
  const auto start = Clock::now();
  auto s1 = p.send->Send(src.data(), kSize, 0, *sreg);
  auto s2 = p.send->Send(src.data(), kSize, 0, *sreg);
  ASSERT_TRUE(s1.ok() && s2.ok());
  Clock::duration sent1{}, sent2{}, got1{}, got2{};
  Both(
      [&] {
        ASSERT_TRUE(p.recv->Wait(*r1, Soon()).ok());
        got1 = Clock::now() - start;
        ASSERT_TRUE(p.recv->Wait(*r2, Soon()).ok());
        got2 = Clock::now() - start;
      },
      [&] {
        ASSERT_TRUE(p.send->Wait(*s1, Soon()).ok());
        sent1 = Clock::now() - start;
        ASSERT_TRUE(p.send->Wait(*s2, Soon()).ok());
        sent2 = Clock::now() - start;
      });
  EXPECT_GE(sent1, 8ms);
  EXPECT_GE(got1, 10ms);
  EXPECT_GE(sent2, 16ms) << "the second message waits for the link";
  EXPECT_GE(got2, 18ms);
  EXPECT_LT(got2, 2s);
}

TEST(DirectConnectTransfer, WaitingSleepsInsteadOfSpinning) {
  World w(Ring2());
  testing::Pair p = testing::Connect(w[1], 0, w[0]);
  ASSERT_NE(p.recv, nullptr);
  uint64_t word = 0;
  auto rreg = p.recv->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(rreg.ok());
  auto r = p.recv->Recv(&word, 8, 0, *rreg);
  ASSERT_TRUE(r.ok());
  rusage before{}, after{};
  ::getrusage(RUSAGE_THREAD, &before);
  EXPECT_EQ(p.recv->Wait(*r, Deadline::After(300ms)).status().code(), StatusCode::kTimeout);
  ::getrusage(RUSAGE_THREAD, &after);
  const double cpu = static_cast<double>(after.ru_utime.tv_sec - before.ru_utime.tv_sec + after.ru_stime.tv_sec -
                                         before.ru_stime.tv_sec) +
                     static_cast<double>(after.ru_utime.tv_usec - before.ru_utime.tv_usec + after.ru_stime.tv_usec -
                                         before.ru_stime.tv_usec) *
                         1e-6;
  EXPECT_LT(cpu, 0.05) << "a 300 ms wait used " << cpu << " s of CPU";
}

TEST(DirectConnectTransfer, AWriteIntoAWithdrawnRegionFailsPromptly) {
  World w(Ring2());
  testing::Pair p = testing::Connect(w[1], 0, w[0]);
  ASSERT_NE(p.recv, nullptr);
  MemfdRegion region(4096, true);
  uint64_t word = 7;
  auto rreg = p.recv->Register(region.descriptor());
  auto sreg = p.send->Register(MemoryDescriptor::Host(&word, 8));
  ASSERT_TRUE(rreg.ok() && sreg.ok());
  auto key = p.recv->Expose(*rreg);
  ASSERT_TRUE(key.ok());
  ASSERT_TRUE(p.recv->Deregister(*rreg).ok());
  const auto start = Clock::now();
  auto wr = p.send->Write(&word, 8, *sreg, *key, 0, 1u);
  Status s = wr.ok() && *wr != nullptr ? p.send->Wait(*wr, Soon()).status() : wr.status();
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
  EXPECT_NE(s.message().find("withdrew"), std::string::npos) << s.message();
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(DirectConnectTransfer, ARandomMixOfSizesAndTags) {
  World w(Ring2());
  testing::Pair p = testing::Connect(w[1], 0, w[0]);
  ASSERT_NE(p.recv, nullptr);
  constexpr int kMessages = 600;
  constexpr size_t kMax = 300 << 10;
  std::mt19937_64 rng(42);
  std::vector<size_t> sizes(kMessages);
  std::vector<int> tags(kMessages);
  for (int i = 0; i < kMessages; ++i) {
    sizes[i] = rng() % 4 == 0 ? rng() % 64 : rng() % kMax;
    tags[i] = static_cast<int>(rng() % 3);
  }
  // Sources: one registered block per message; receives go per tag into matching slots.
  std::vector<uint8_t> src(kMessages * kMax), dst(kMessages * kMax);
  auto sreg = p.send->Register(MemoryDescriptor::Host(src.data(), src.size()));
  auto rreg = p.recv->Register(MemoryDescriptor::Host(dst.data(), dst.size()));
  ASSERT_TRUE(sreg.ok() && rreg.ok());
  for (int i = 0; i < kMessages; ++i) Fill(src.data() + i * kMax, sizes[i], static_cast<uint32_t>(i));
  // The k-th message of a tag lands in the k-th receive of that tag: receives are posted in the
  // same per-tag order as the sends, in windows that stay below the in-flight limit.
  Both(
      [&] {
        std::vector<std::pair<Request*, int>> window;
        for (int i = 0; i < kMessages; ++i) {
          auto r = p.recv->Recv(dst.data() + i * kMax, kMax, tags[i], *rreg);
          ASSERT_TRUE(r.ok() && *r != nullptr);
          window.emplace_back(*r, i);
          if (window.size() == 40 || i + 1 == kMessages) {
            for (auto& [req, k] : window) {
              auto got = p.recv->Wait(req, Soon());
              ASSERT_TRUE(got.ok()) << got.status().ToString();
              ASSERT_EQ(*got, sizes[k]) << "message " << k;
              ASSERT_TRUE(Check(dst.data() + k * kMax, sizes[k], static_cast<uint32_t>(k))) << "message " << k;
            }
            window.clear();
          }
        }
      },
      [&] {
        std::vector<Request*> window;
        for (int i = 0; i < kMessages; ++i) {
          auto s = p.send->Send(src.data() + i * kMax, sizes[i], tags[i], *sreg);
          ASSERT_TRUE(s.ok() && *s != nullptr);
          window.push_back(*s);
          if (window.size() == 50 || i + 1 == kMessages) {
            for (Request* req : window) ASSERT_TRUE(p.send->Wait(req, Soon()).ok());
            window.clear();
          }
        }
      });
}

}  // namespace
}  // namespace kizuna::fabric::directconnect
