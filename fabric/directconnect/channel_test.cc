// The shared-memory channel: records across the ring's wrap, a full ring, wakeups and their
// timeouts (without burning CPU), closing, and the validation of what the peer put in shared memory.

#include "fabric/directconnect/channel.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace kizuna::fabric::directconnect {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

UniqueFd Dup(int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); }

// Both ends of one channel, in this process (the receiving end maps the sender's segment).
struct Pair {
  std::unique_ptr<Channel> sender, receiver;
};

Pair MakePair(ChannelSizes sizes = {4096, 4096}) {
  Pair p;
  auto s = Channel::Create(sizes);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return p;
  p.sender = std::move(s).value();
  auto r = Channel::Attach(Dup(p.sender->segment_fd()), Dup(p.sender->wake_fd(Side::kSender)),
                           Dup(p.sender->wake_fd(Side::kReceiver)));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) p.receiver = std::move(r).value();
  return p;
}

double ThreadCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

TEST(Channel, RecordsCrossTheRingsEndIntact) {
  Pair p = MakePair();
  ASSERT_NE(p.receiver, nullptr);
  EXPECT_EQ(p.sender->max_payload(), 1024u);
  // Payload sizes that are not multiples of 8, so records start at every alignment of the wrap.
  std::vector<uint8_t> out(1024), in(1024);
  for (int round = 0; round < 200; ++round) {
    const size_t n = static_cast<size_t>((round * 131) % 1000 + 1);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(round + i * 7);
    RecordHeader h;
    h.type = 9;
    h.id = static_cast<uint64_t>(round);
    h.arg[3] = 0xabcdef;
    auto pushed = p.sender->TryPush(h, out.data(), n);
    ASSERT_TRUE(pushed.ok() && *pushed) << "round " << round;
    auto rec = p.receiver->Peek();
    ASSERT_TRUE(rec.ok() && rec->has_value()) << "round " << round;
    EXPECT_EQ((*rec)->type, 9);
    EXPECT_EQ((*rec)->id, static_cast<uint64_t>(round));
    EXPECT_EQ((*rec)->arg[3], 0xabcdefu);
    ASSERT_EQ((*rec)->payload_bytes, n);
    p.receiver->ReadPayload(0, in.data(), n);
    ASSERT_EQ(std::memcmp(in.data(), out.data(), n), 0) << "round " << round;
    p.receiver->Pop();
    auto empty = p.receiver->Peek();
    ASSERT_TRUE(empty.ok() && !empty->has_value());
  }
}

TEST(Channel, AFullRingRefusesUntilTheConsumerPops) {
  Pair p = MakePair();
  ASSERT_NE(p.receiver, nullptr);
  std::vector<uint8_t> payload(1000);
  int pushed = 0;
  while (true) {
    auto r = p.sender->TryPush(RecordHeader{}, payload.data(), payload.size());
    ASSERT_TRUE(r.ok());
    if (!*r) break;
    ++pushed;
    ASSERT_LT(pushed, 100) << "a 4 KiB ring took 100 records of 1 KiB";
  }
  EXPECT_EQ(pushed, 3);  // 3 x (48 + 1000) bytes fit in 4096, a fourth does not
  auto rec = p.receiver->Peek();
  ASSERT_TRUE(rec.ok() && rec->has_value());
  p.receiver->Pop();
  auto again = p.sender->TryPush(RecordHeader{}, payload.data(), payload.size());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again);
  EXPECT_FALSE(p.sender->TryPush(RecordHeader{}, payload.data(), p.sender->max_payload() + 1).ok());
}

TEST(Channel, WaitWakesOnAPushAndSleepsOtherwise) {
  Pair p = MakePair();
  ASSERT_NE(p.receiver, nullptr);
  // Nothing arrives: the wait ends at the deadline, having slept rather than spun.
  const uint64_t seen = p.receiver->events();
  const double cpu0 = ThreadCpuSeconds();
  const auto start = Clock::now();
  auto w = p.receiver->Wait(seen, Deadline::After(200ms), -1, std::nullopt);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_LT(ThreadCpuSeconds() - cpu0, 0.05) << "a 200 ms wait burned CPU";
  // A push from another thread wakes it long before the deadline.
  const uint64_t seen2 = p.receiver->events();
  std::thread producer([&] {
    std::this_thread::sleep_for(50ms);
    auto r = p.sender->TryPush(RecordHeader{}, nullptr, 0);
    EXPECT_TRUE(r.ok() && *r);
  });
  const auto start2 = Clock::now();
  auto w2 = p.receiver->Wait(seen2, Deadline::After(10s), -1, std::nullopt);
  producer.join();
  ASSERT_TRUE(w2.ok());
  EXPECT_LT(Clock::now() - start2, 5s);
  EXPECT_NE(p.receiver->events(), seen2);
  // wake_at ends a wait early.
  const auto start3 = Clock::now();
  ASSERT_TRUE(p.receiver->Wait(p.receiver->events(), Deadline::After(10s), -1, Clock::now() + 30ms).ok());
  EXPECT_LT(Clock::now() - start3, 5s);
}

TEST(Channel, AnExtraFdEndsTheWait) {
  Pair p = MakePair();
  ASSERT_NE(p.receiver, nullptr);
  UniqueFd efd(::eventfd(0, EFD_CLOEXEC));
  std::thread t([&] {
    std::this_thread::sleep_for(30ms);
    const uint64_t one = 1;
    EXPECT_EQ(::write(efd.get(), &one, 8), 8);
  });
  auto w = p.receiver->Wait(p.receiver->events(), Deadline::After(10s), efd.get(), std::nullopt);
  t.join();
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->extra_ready);
}

TEST(Channel, ClosingIsSeenByThePeer) {
  Pair p = MakePair();
  ASSERT_NE(p.receiver, nullptr);
  EXPECT_FALSE(p.receiver->peer_closed());
  const uint64_t seen = p.receiver->events();
  p.sender->Close();
  EXPECT_TRUE(p.receiver->peer_closed());
  EXPECT_NE(p.receiver->events(), seen) << "closing must wake the peer";
  EXPECT_FALSE(p.sender->peer_closed());
}

TEST(Channel, ACorruptRecordIsReportedNotFollowed) {
  Pair p = MakePair();
  ASSERT_NE(p.receiver, nullptr);
  ASSERT_TRUE(p.sender->TryPush(RecordHeader{}, "abc", 3).ok());
  // The peer rewrites the published record's length to run past what it published. The forward
  // ring starts right after the segment's one-page header; payload_bytes is at byte 4 of a record.
  void* map = ::mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, p.sender->segment_fd(), 0);
  ASSERT_NE(map, MAP_FAILED);
  const uint32_t huge = 1u << 30;
  std::memcpy(static_cast<uint8_t*>(map) + 4096 + 4, &huge, 4);
  auto rec = p.receiver->Peek();
  EXPECT_EQ(rec.status().code(), StatusCode::kRemoteError) << rec.status().ToString();
  EXPECT_NE(rec.status().message().find("corrupt channel"), std::string::npos);
  ::munmap(map, 3 * 4096);
}

TEST(Channel, AttachRefusesWhatIsNotAValidSegment) {
  auto s = Channel::Create({4096, 4096});
  ASSERT_TRUE(s.ok());
  Channel& sender = **s;
  // Not eventfds where the wakeups belong.
  UniqueFd not_an_eventfd(::memfd_create("x", MFD_CLOEXEC));
  auto r1 = Channel::Attach(Dup(sender.segment_fd()), std::move(not_an_eventfd), Dup(sender.wake_fd(Side::kReceiver)));
  EXPECT_EQ(r1.status().code(), StatusCode::kRemoteError) << r1.status().ToString();
  // A memfd that is not sealed against shrinking.
  UniqueFd unsealed(::memfd_create("y", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), 3 * 4096), 0);
  auto r2 = Channel::Attach(std::move(unsealed), Dup(sender.wake_fd(Side::kSender)), Dup(sender.wake_fd(Side::kReceiver)));
  EXPECT_EQ(r2.status().code(), StatusCode::kRemoteError) << r2.status().ToString();
  // A sealed memfd without the channel's header.
  UniqueFd blank(::memfd_create("z", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(blank.get(), 3 * 4096), 0);
  ASSERT_EQ(::fcntl(blank.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto r3 = Channel::Attach(std::move(blank), Dup(sender.wake_fd(Side::kSender)), Dup(sender.wake_fd(Side::kReceiver)));
  EXPECT_EQ(r3.status().code(), StatusCode::kRemoteError) << r3.status().ToString();
  EXPECT_NE(r3.status().message().find("magic"), std::string::npos) << r3.status().message();
  // Bad sizes at creation.
  EXPECT_EQ(Channel::Create({4095, 4096}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Channel::Create({4096, 1ull << 40}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kizuna::fabric::directconnect
