// The emulated backend's streams and events (stream.h): stream fault injection and sticky errors,
// pointer checks, throttles, ordering, event waits across devices, timeouts, stream teardown, and
// opaque mode (copies, reduces and scales between device and host memory through translated
// addresses; memory freed under queued work).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "devices/host_emulated/pacer.h"

#include "devices/host_emulated/test_util.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated::test {
namespace {

// ---- Streams: errors and fault injection ----

TEST(HostEmulatedStream, InjectedFaultIsStickyAndReachesEventsAndCallbacks) {
  Config c = SmallConfig();
  c.emu_fail_stream_op = 2;
  Emu emu(c);
  auto src = emu.Alloc(0, 4096);
  auto dst = emu.Alloc(0, 4096);
  std::memset(src->data(), 1, 4096);
  std::memset(dst->data(), 0, 4096);
  auto stream = emu.NewStream(0);
  auto event = emu.NewEvent(0);

  ASSERT_TRUE(stream->Copy(Bytes(dst), Bytes(src), 1024).ok());                // #1
  ASSERT_TRUE(stream->Copy(Bytes(dst) + 1024, Bytes(src) + 1024, 1024).ok());  // #2: fails
  ASSERT_TRUE(stream->Record(*event).ok());
  auto seen = std::make_shared<Status>();
  ASSERT_TRUE(stream->EnqueueHostCallback([seen](const Status& s) { *seen = s; }).ok());  // #3
  ASSERT_TRUE(stream->Copy(Bytes(dst) + 2048, Bytes(src) + 2048, 1024).ok());           // #4: skipped

  const Status sync = stream->Synchronize();
  EXPECT_TRUE(HasCode(sync, StatusCode::kInternal));
  EXPECT_TRUE(Mentions(sync, "injected fault: stream operation #2 failed"));
  EXPECT_EQ(*seen, sync);
  EXPECT_EQ(event->Synchronize(), sync);
  EXPECT_EQ(event->Query().status(), sync);
  EXPECT_EQ(stream->Query().status(), sync);
  EXPECT_EQ(Bytes(dst)[0], 1);     // before the fault: done
  EXPECT_EQ(Bytes(dst)[1024], 0);  // the faulted copy
  EXPECT_EQ(Bytes(dst)[2048], 0);  // after it: skipped

  // The stream stays in error; enqueueing still succeeds (errors surface asynchronously).
  ASSERT_TRUE(stream->Copy(Bytes(dst) + 3072, Bytes(src) + 3072, 1024).ok());
  EXPECT_EQ(stream->Synchronize(), sync);
  EXPECT_EQ(Bytes(dst)[3072], 0);

  // Other streams are unaffected.
  auto healthy = emu.NewStream(0);
  ASSERT_TRUE(healthy->Copy(Bytes(dst) + 3072, Bytes(src) + 3072, 1024).ok());
  EXPECT_TRUE(healthy->Synchronize().ok());
  EXPECT_EQ(Bytes(dst)[3072], 1);
}

TEST(HostEmulatedStream, InjectedFaultOnAHostCallback) {
  Config c = SmallConfig();
  c.emu_fail_stream_op = 1;
  Emu emu(c);
  auto stream = emu.NewStream(1);
  auto seen = std::make_shared<Status>();
  ASSERT_TRUE(stream->EnqueueHostCallback([seen](const Status& s) { *seen = s; }).ok());
  const Status sync = stream->Synchronize();
  EXPECT_TRUE(Mentions(sync, "injected fault: stream operation #1 failed"));
  EXPECT_EQ(*seen, sync);
}

TEST(HostEmulatedStream, NonDevicePointerIsRejectedAndNothingIsEnqueued) {
  Config c = SmallConfig();
  c.emu_fail_stream_op = 1;  // proves below that the rejected calls were not counted
  Emu emu(c);
  auto buf = emu.Alloc(0, 4096);
  auto stream = emu.NewStream(0);
  void* host = std::malloc(4096);
  ASSERT_NE(host, nullptr);

  EXPECT_TRUE(HasCode(stream->Copy(buf->data(), host, 4096), StatusCode::kInvalidArgument));
  EXPECT_TRUE(HasCode(stream->Copy(host, buf->data(), 4096), StatusCode::kInvalidArgument));
  EXPECT_TRUE(HasCode(stream->Copy(buf->data(), buf->data(), 4097), StatusCode::kInvalidArgument));
  const void* srcs[] = {buf->data(), host};
  EXPECT_TRUE(HasCode(stream->Reduce(buf->data(), srcs, 16, DataType::kFloat32, ReduceOp::kSum),
                      StatusCode::kInvalidArgument));
  auto idle = stream->Query();
  ASSERT_TRUE(idle.ok());
  EXPECT_TRUE(*idle);
  std::free(host);

  // The first operation actually enqueued is #1.
  auto other = emu.Alloc(0, 4096);
  ASSERT_TRUE(stream->Copy(other->data(), buf->data(), 4096).ok());
  EXPECT_TRUE(Mentions(stream->Synchronize(), "stream operation #1 failed"));
}

// ---- Streams: throttles ----

TEST(HostEmulatedStream, CopyThrottleSlowsACopy) {
  Config c = SmallConfig();
  c.emu_copy_gbps = 1.0;
  Emu emu(c);
  const size_t bytes = 8 << 20;  // 8.39 ms at 1 GB/s
  auto a = emu.Alloc(0, bytes);
  auto b = emu.Alloc(0, bytes);
  std::memset(a->data(), 3, bytes);
  auto stream = emu.NewStream(0);
  const auto t0 = Clock::now();
  ASSERT_TRUE(stream->Copy(b->data(), a->data(), bytes).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_GE(MillisecondsSince(t0), 8.3);
  EXPECT_EQ(Bytes(b)[bytes - 1], 3);
}

TEST(HostEmulatedStream, ReduceThrottleCountsInputBytes) {
  Config c = SmallConfig();
  c.emu_reduce_gbps = 1.0;
  Emu emu(c);
  const size_t count = 1 << 20;  // two float inputs: 8 MiB read, 8.39 ms at 1 GB/s
  auto x = emu.Alloc(0, count * 4);
  auto y = emu.Alloc(0, count * 4);
  auto out = emu.Alloc(0, count * 4);
  auto* xf = static_cast<float*>(x->data());
  auto* yf = static_cast<float*>(y->data());
  for (size_t i = 0; i < count; ++i) {
    xf[i] = 1.5f;
    yf[i] = static_cast<float>(i % 100);
  }
  auto stream = emu.NewStream(0);
  const void* srcs[] = {x->data(), y->data()};
  const auto t0 = Clock::now();
  ASSERT_TRUE(stream->Reduce(out->data(), srcs, count, DataType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_GE(MillisecondsSince(t0), 8.3);
  const auto* of = static_cast<const float*>(out->data());
  EXPECT_EQ(of[0], 1.5f);
  EXPECT_EQ(of[count - 1], 1.5f + static_cast<float>((count - 1) % 100));
}

TEST(HostEmulatedStream, ThrottleIsSharedByEveryInstanceOfADevice) {
  // Two backend instances share nothing in the process, exactly like two processes: device 0's
  // throttle must still be one timeline (README.md: emulated devices are host-wide), so two
  // concurrent 8 MiB copies at 1 GB/s take twice as long as one.
  Config c = SmallConfig();
  c.emu_copy_gbps = 1.0;
  Emu first(c), second(c);
  const size_t bytes = 8 << 20;  // 8.39 ms at 1 GB/s
  auto a1 = first.Alloc(0, bytes), b1 = first.Alloc(0, bytes);
  auto a2 = second.Alloc(0, bytes), b2 = second.Alloc(0, bytes);
  auto s1 = first.NewStream(0);
  auto s2 = second.NewStream(0);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s1->Copy(b1->data(), a1->data(), bytes).ok());
  ASSERT_TRUE(s2->Copy(b2->data(), a2->data(), bytes).ok());
  ASSERT_TRUE(s1->Synchronize().ok());
  ASSERT_TRUE(s2->Synchronize().ok());
  EXPECT_GE(MillisecondsSince(t0), 2 * 8.3);
}

TEST(HostEmulatedPacer, TimelineLivesInSharedMemory) {
  const std::string identity = "pacer-test-" + std::to_string(::getpid());
  DevicePacer p1(identity, 5), p2(identity, 5), other_device(identity, 6);
  const auto end1 = p1.Reserve(std::chrono::seconds(1));
  const auto end2 = p2.Reserve(std::chrono::milliseconds(1));
  EXPECT_GE(end2 - end1, std::chrono::milliseconds(1));  // queued behind p1's second
  EXPECT_LT(other_device.Reserve(std::chrono::milliseconds(1)), end1);  // another device: its own
  ASSERT_FALSE(p1.segment_name().empty());
  EXPECT_NE(p1.segment_name().find(identity), std::string::npos);
  // The timeline is in /dev/shm, where another process maps the same slot.
  const std::string path = "/dev/shm" + p1.segment_name();
  EXPECT_EQ(::access(path.c_str(), R_OK | W_OK), 0) << path;
  ::unlink(path.c_str());
}

TEST(HostEmulatedStream, LaunchLatencyDelaysEachOperation) {
  Config c = SmallConfig();
  c.emu_launch_us = 2000;
  Emu emu(c);
  auto stream = emu.NewStream(0);
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(stream->EnqueueHostCallback([](const Status&) {}).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_GE(MillisecondsSince(t0), 10.0);
}

// ---- Streams: ordering, events, timeouts ----

TEST(HostEmulatedStream, ThousandOperationsRunInOrder) {
  Emu emu(SmallConfig());
  auto src = emu.Alloc(0, sizeof(int64_t));
  auto dst = emu.Alloc(0, sizeof(int64_t));
  auto* s = static_cast<int64_t*>(src->data());
  auto* d = static_cast<int64_t*>(dst->data());
  *d = -1;
  auto stream = emu.NewStream(0);
  auto order = std::make_shared<std::vector<int>>();
  auto mismatches = std::make_shared<int>(0);
  // 333 x (write source, copy, check destination) + 1 = 1,000 operations.
  for (int i = 0; i < 333; ++i) {
    ASSERT_TRUE(stream->EnqueueHostCallback([s, i, order](const Status&) {
      *s = i;
      order->push_back(i);
    }).ok());
    ASSERT_TRUE(stream->Copy(d, s, sizeof(int64_t)).ok());
    ASSERT_TRUE(stream->EnqueueHostCallback([d, i, mismatches](const Status&) {
      if (*d != i) ++*mismatches;
    }).ok());
  }
  ASSERT_TRUE(stream->EnqueueHostCallback([order](const Status&) { order->push_back(-1); }).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(*mismatches, 0);
  ASSERT_EQ(order->size(), 334u);
  for (int i = 0; i < 333; ++i) ASSERT_EQ((*order)[static_cast<size_t>(i)], i);
  EXPECT_EQ(order->back(), -1);
}

TEST(HostEmulatedStream, CrossDeviceEventWaitOrdersWork) {
  Emu emu(SmallConfig());
  const size_t bytes = 64 << 10;
  auto a0 = emu.Alloc(0, bytes);
  auto b0 = emu.Alloc(0, bytes);
  auto c1 = emu.Alloc(1, bytes);
  std::memset(a0->data(), 7, bytes);
  std::memset(b0->data(), 0, bytes);
  std::memset(c1->data(), 0, bytes);
  auto s0 = emu.NewStream(0);
  auto s1 = emu.NewStream(1);
  auto e0 = emu.NewEvent(0);
  auto gate = std::make_shared<Gate>();

  ASSERT_TRUE(s0->EnqueueHostCallback([gate](const Status&) { gate->Wait(); }).ok());
  ASSERT_TRUE(s0->Copy(b0->data(), a0->data(), bytes).ok());
  ASSERT_TRUE(s0->Record(*e0).ok());
  ASSERT_TRUE(s1->Wait(*e0).ok());
  ASSERT_TRUE(s1->Copy(c1->data(), b0->data(), bytes).ok());  // peer read of device 0's memory

  std::this_thread::sleep_for(milliseconds(20));
  auto q = s1->Query();
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(*q) << "device 1's stream ran past its wait";
  EXPECT_EQ(Bytes(c1)[0], 0);
  EXPECT_FALSE(*e0->Query());

  gate->Open();
  ASSERT_TRUE(s1->Synchronize().ok());
  EXPECT_EQ(Bytes(c1)[0], 7);
  EXPECT_EQ(Bytes(c1)[bytes - 1], 7);
  EXPECT_TRUE(*e0->Query());
}

TEST(HostEmulatedStream, WaitOnEventThatNeverCompletesTimesOut) {
  Config c = SmallConfig();
  c.timeout_s = 0.2;
  Emu emu(c);
  auto buf = emu.Alloc(1, 4096);
  std::memset(buf->data(), 0, 4096);
  auto blocked = emu.NewStream(0);
  auto waiter = emu.NewStream(1);
  auto event = emu.NewEvent(0);
  auto gate = std::make_shared<Gate>();
  ASSERT_TRUE(blocked->EnqueueHostCallback([gate](const Status&) { gate->Wait(); }).ok());
  ASSERT_TRUE(blocked->Record(*event).ok());

  // Synchronize itself gives up at its own deadline.
  const Status early = blocked->Synchronize(Deadline::After(milliseconds(30)));
  EXPECT_TRUE(HasCode(early, StatusCode::kTimeout));
  EXPECT_TRUE(Mentions(early, "unfinished"));

  const auto t0 = Clock::now();
  ASSERT_TRUE(waiter->Wait(*event).ok());
  ASSERT_TRUE(waiter->Copy(Bytes(buf) + 2048, buf->data(), 16).ok());  // skipped after the timeout
  const Status sync = waiter->Synchronize(Deadline::AfterSeconds(5));
  EXPECT_GE(MillisecondsSince(t0), 190.0);
  EXPECT_TRUE(HasCode(sync, StatusCode::kTimeout));
  EXPECT_TRUE(Mentions(sync, "host_emulated:0 event #1"));
  EXPECT_TRUE(Mentions(sync, "timed out"));
  EXPECT_TRUE(HasCode(waiter->Query().status(), StatusCode::kTimeout));  // sticky

  gate->Open();
  EXPECT_TRUE(blocked->Synchronize(Deadline::AfterSeconds(5)).ok());
  EXPECT_TRUE(event->Synchronize(Deadline::AfterSeconds(5)).ok());
}

TEST(HostEmulatedStream, EventSemantics) {
  Emu emu(SmallConfig());
  auto never = emu.NewEvent(0);
  auto q = never->Query();
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(*q);  // never recorded: complete
  EXPECT_TRUE(never->Synchronize().ok());
  auto s = emu.NewStream(0);
  EXPECT_TRUE(s->Wait(*never).ok());  // no wait at all
  EXPECT_TRUE(s->Synchronize().ok());

  // Re-recording captures new work; a Wait enqueued earlier keeps what it captured.
  auto blocked = emu.NewStream(0);
  auto waiter = emu.NewStream(1);
  auto free_stream = emu.NewStream(1);
  auto event = emu.NewEvent(0);
  auto gate = std::make_shared<Gate>();
  ASSERT_TRUE(blocked->EnqueueHostCallback([gate](const Status&) { gate->Wait(); }).ok());
  ASSERT_TRUE(blocked->Record(*event).ok());
  EXPECT_FALSE(*event->Query());
  ASSERT_TRUE(waiter->Wait(*event).ok());
  ASSERT_TRUE(free_stream->Record(*event).ok());
  EXPECT_TRUE(event->Synchronize(Deadline::AfterSeconds(5)).ok());
  EXPECT_TRUE(*event->Query());
  std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(*waiter->Query());  // still waiting for the first recording
  gate->Open();
  EXPECT_TRUE(waiter->Synchronize(Deadline::AfterSeconds(5)).ok());
}

TEST(HostEmulatedStream, WaitingOnAFailedEventPropagatesTheError) {
  Config c = SmallConfig();
  c.emu_fail_stream_op = 1;
  Emu emu(c);
  auto buf = emu.Alloc(0, 4096);
  auto s0 = emu.NewStream(0);
  auto s1 = emu.NewStream(1);
  auto event = emu.NewEvent(0);
  ASSERT_TRUE(s0->Copy(Bytes(buf) + 2048, buf->data(), 16).ok());  // #1: fails
  ASSERT_TRUE(s0->Record(*event).ok());
  ASSERT_TRUE(s1->Wait(*event).ok());
  const Status sync = s1->Synchronize();
  EXPECT_TRUE(HasCode(sync, StatusCode::kInternal));
  EXPECT_TRUE(Mentions(sync, "whose work failed"));
  EXPECT_TRUE(Mentions(sync, "stream operation #1 failed"));
}

TEST(HostEmulatedStream, SynchronizeFromItsOwnCallbackIsRejected) {
  Emu emu(SmallConfig());
  auto stream = emu.NewStream(0);
  auto seen = std::make_shared<Status>();
  Stream* raw = stream.get();
  ASSERT_TRUE(stream->EnqueueHostCallback([raw, seen](const Status&) { *seen = raw->Synchronize(); }).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_TRUE(HasCode(*seen, StatusCode::kInvalidArgument));
}

// ---- Holds (native to the stream: no host callback) ----

// A hold on an idle stream parks at once: the stream is busy until the release, a Synchronize in
// another thread returns only after it (woken by the releasing thread), work after the hold runs
// after it, and a second release changes nothing.
TEST(HostEmulatedStream, HoldOnAnIdleStreamCompletesOnRelease) {
  Emu emu(SmallConfig());
  auto src = emu.Alloc(0, 4096);
  auto dst = emu.Alloc(0, 4096);
  std::memset(src->data(), 7, 4096);
  std::memset(dst->data(), 0, 4096);
  auto stream = emu.NewStream(0);
  ASSERT_TRUE(stream->Synchronize().ok());
  auto hold = stream->EnqueueHold();
  ASSERT_TRUE(hold.ok()) << hold.status().ToString();
  auto busy = stream->Query();
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(*busy) << "an unreleased hold counts as queued work";
  std::atomic<bool> synced{false};
  Status sync_status;
  std::thread waiter([&] {
    sync_status = stream->Synchronize();
    synced.store(true);
  });
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(synced.load()) << "Synchronize returned while the stream was held";
  (*hold)->Release();
  waiter.join();
  EXPECT_TRUE(sync_status.ok()) << sync_status.ToString();
  (*hold)->Release();  // idempotent
  ASSERT_TRUE(stream->Copy(Bytes(dst), Bytes(src), 4096).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(Bytes(dst)[4095], 7);
}

// Work queued behind a parked hold waits for the release, whichever way the hold parked (on an
// idle stream, or reached behind earlier work); a hold dropped unreleased lets the stream go on.
TEST(HostEmulatedStream, WorkBehindAHoldWaitsForTheRelease) {
  Emu emu(SmallConfig());
  auto src = emu.Alloc(0, 1 << 20);
  auto dst = emu.Alloc(0, 1 << 20);
  std::memset(src->data(), 3, 1 << 20);
  auto stream = emu.NewStream(0);
  for (const bool behind_work : {false, true}) {
    std::memset(dst->data(), 0, 1 << 20);
    ASSERT_TRUE(stream->Synchronize().ok());
    if (behind_work) {
      ASSERT_TRUE(stream->Copy(Bytes(dst), Bytes(src), 1 << 19).ok());
    }
    auto hold = stream->EnqueueHold();
    ASSERT_TRUE(hold.ok());
    ASSERT_TRUE(stream->Copy(Bytes(dst) + (1 << 19), Bytes(src) + (1 << 19), 1 << 19).ok());
    if (behind_work) {
      // The copy before the hold runs: waited for (a loaded machine may take its time), not slept on.
      const Deadline deadline = Deadline::AfterSeconds(10);
      while (static_cast<volatile uint8_t*>(Bytes(dst))[(1 << 19) - 1] != 3 && !deadline.Expired())
        std::this_thread::sleep_for(milliseconds(1));
      EXPECT_EQ(Bytes(dst)[(1 << 19) - 1], 3) << "the copy before the hold waited for it";
    }
    std::this_thread::sleep_for(milliseconds(30));  // time for the copy behind the hold to run, were it not held
    EXPECT_EQ(Bytes(dst)[(1 << 20) - 1], 0) << "the copy behind the hold ran before the release";
    auto released = std::move(*hold);
    released.reset();  // dropped unreleased: released
    ASSERT_TRUE(stream->Synchronize().ok());
    EXPECT_EQ(Bytes(dst)[(1 << 20) - 1], 3);
  }
}

// ---- Stream teardown ----

TEST(HostEmulatedStream, DestructionWaitsForQueuedWork) {
  Emu emu(SmallConfig());
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto stream = emu.NewStream(0);
  ASSERT_TRUE(stream->EnqueueHostCallback([done](const Status&) {
    std::this_thread::sleep_for(milliseconds(30));
    done->store(true);
  }).ok());
  stream.reset();
  EXPECT_TRUE(done->load());
}

TEST(HostEmulatedStream, DestructionAbortsWorkThatNeverFinishes) {
  Config c = SmallConfig();
  c.timeout_s = 0.2;
  Emu emu(c);
  auto stream = emu.NewStream(0);
  auto event = emu.NewEvent(0);
  auto gate = std::make_shared<Gate>();
  auto seen = std::make_shared<Status>();
  ASSERT_TRUE(stream->EnqueueHostCallback([gate](const Status&) { gate->Wait(); }).ok());
  ASSERT_TRUE(stream->Record(*event).ok());
  ASSERT_TRUE(stream->EnqueueHostCallback([seen](const Status& s) { *seen = s; }).ok());

  const auto t0 = Clock::now();
  stream.reset();  // bounded: waits 0.2 s for the work, aborts it, waits 0.2 s for the worker
  EXPECT_LT(MillisecondsSince(t0), 5000.0);
  EXPECT_TRUE(HasCode(*seen, StatusCode::kAborted));
  EXPECT_TRUE(HasCode(event->Query().status(), StatusCode::kAborted));
  gate->Open();  // lets the left-behind worker finish on its own state
}

// ---- Opaque mode: the worker translates device addresses ----

TEST(HostEmulatedOpaque, CopiesMoveBytesBetweenDeviceAndHostMemory) {
  Emu emu(OpaqueConfig());
  for (size_t n : {size_t{1}, size_t{4095}, size_t{65537}, (size_t{1} << 20) + 7}) {
    SCOPED_TRACE(n);
    auto in = emu.AllocHost(0, n + 3);
    auto d0 = emu.Alloc(0, n + 5);
    auto d1 = emu.Alloc(1, n + 5);
    auto out = emu.AllocHost(1, n + 3);
    auto s0 = emu.NewStream(0);
    auto s1 = emu.NewStream(1);
    auto moved = emu.NewEvent(0);
    for (size_t i = 0; i < n + 3; ++i) Bytes(in)[i] = static_cast<uint8_t>(i * 13 + n);
    std::memset(out->data(), 0, n + 3);
    // host -> device 0 -> device 1 (a peer copy) on device 0's stream, then device 1 -> host on
    // device 1's stream, ordered by an event; odd offsets throughout.
    ASSERT_TRUE(s0->Copy(Bytes(d0) + 5, Bytes(in) + 3, n).ok());
    ASSERT_TRUE(s0->Copy(Bytes(d1) + 1, Bytes(d0) + 5, n).ok());
    ASSERT_TRUE(s0->Record(*moved).ok());
    ASSERT_TRUE(s1->Wait(*moved).ok());
    ASSERT_TRUE(s1->Copy(Bytes(out) + 2, Bytes(d1) + 1, n).ok());
    ASSERT_TRUE(s1->Synchronize().ok());
    EXPECT_EQ(std::memcmp(Bytes(out) + 2, Bytes(in) + 3, n), 0);
    EXPECT_EQ(Bytes(out)[0], 0);
    EXPECT_EQ(Bytes(out)[1], 0);
    EXPECT_EQ(Bytes(out)[n + 2], 0);
  }
}

TEST(HostEmulatedOpaque, ReduceAndScaleTakeDeviceAndHostMemory) {
  Emu emu(OpaqueConfig());
  constexpr size_t kCount = 1031;
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  auto a = emu.AllocHost(0, kBytes);
  auto b = emu.Alloc(0, kBytes);
  auto sum = emu.Alloc(0, kBytes);
  auto out = emu.AllocHost(0, 2 * kBytes);
  auto stream = emu.NewStream(0);
  auto* av = static_cast<int32_t*>(a->data());
  auto* ov = static_cast<int32_t*>(out->data());
  for (size_t i = 0; i < kCount; ++i) {
    av[i] = static_cast<int32_t>(i) - 500;
    ov[i] = 3 * av[i];  // staged for b
  }
  ASSERT_TRUE(stream->Copy(b->data(), out->data(), kBytes).ok());
  // A host input and a device input into device memory, halved in place on the device, then back;
  // and a reduce whose output is host memory.
  const void* mixed[] = {a->data(), b->data()};
  ASSERT_TRUE(stream->Reduce(sum->data(), mixed, kCount, DataType::kInt32, ReduceOp::kSum).ok());
  ASSERT_TRUE(stream->Scale(sum->data(), sum->data(), kCount, DataType::kInt32, 2).ok());
  ASSERT_TRUE(stream->Copy(out->data(), sum->data(), kBytes).ok());
  const void* device_only[] = {b->data(), sum->data()};
  ASSERT_TRUE(stream->Reduce(ov + kCount, device_only, kCount, DataType::kInt32, ReduceOp::kMax).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) {
    const int32_t x = av[i];
    wrong += ov[i] != (x + 3 * x) / 2;
    wrong += ov[kCount + i] != std::max(3 * x, (x + 3 * x) / 2);
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(HostEmulatedOpaque, MemoryFreedUnderQueuedWorkIsAnIllegalAddress) {
  // Against the contract (free only after synchronizing), but it must surface as the stream's
  // error, never as a write into whatever is mapped at the address later.
  Emu emu(OpaqueConfig());
  auto host = emu.AllocHost(0, 4096);
  auto device = emu.Alloc(0, 4096);
  auto gate = std::make_shared<Gate>();
  auto stream = emu.NewStream(0);
  ASSERT_TRUE(stream->EnqueueHostCallback([gate](const Status&) { gate->Wait(); }).ok());
  ASSERT_TRUE(stream->Copy(host->data(), device->data(), 4096).ok());
  device.reset();
  gate->Open();
  const Status sync = stream->Synchronize();
  EXPECT_TRUE(HasCode(sync, StatusCode::kInternal));
  EXPECT_TRUE(Mentions(sync, "illegal address"));
  EXPECT_TRUE(Mentions(sync, "source"));
}

// ---- KIZUNA_EMU_SYNC_FREE: a free waits for the device's streams, as cudaFree does ----

Config SyncFreeConfig() {
  Config c = OpaqueConfig();
  c.emu_sync_free = true;
  c.timeout_s = 0.3;
  return c;
}

TEST(HostEmulatedSyncFree, AFreeWaitsForWorkQueuedBeforeIt) {
  // The same free as MemoryFreedUnderQueuedWorkIsAnIllegalAddress: here it waits for the copy.
  Emu emu(SyncFreeConfig());
  auto host = emu.AllocHost(0, 4096);
  auto device = emu.Alloc(0, 4096);
  auto stream = emu.NewStream(0);
  // Another device's stream, busy until after the free: waiting for it would time the free out
  // and fail that stream.
  auto other = emu.NewStream(1);
  auto gate = std::make_shared<Gate>();
  ASSERT_TRUE(other->EnqueueHostCallback([gate](const Status&) { gate->Wait(); }).ok());
  std::memset(Bytes(host), 7, 4096);
  ASSERT_TRUE(stream->Copy(device->data(), host->data(), 4096).ok());
  ASSERT_TRUE(stream->EnqueueHostCallback([](const Status&) { std::this_thread::sleep_for(milliseconds(50)); }).ok());
  ASSERT_TRUE(stream->Copy(host->data(), device->data(), 4096).ok());
  const auto t0 = Clock::now();
  device.reset();
  EXPECT_GE(MillisecondsSince(t0), 40.0) << "the free did not wait for the stream";
  EXPECT_TRUE(stream->Query().ok() && *stream->Query()) << "work queued before the free is unfinished";
  EXPECT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(Bytes(host)[4095], 7);
  gate->Open();
  const Status other_sync = other->Synchronize();
  EXPECT_TRUE(other_sync.ok()) << "the free waited for another device's stream: " << other_sync.ToString();
}

TEST(HostEmulatedSyncFree, AFreeBehindAHeldStreamFailsTheStreamNamingTheFree) {
  // What hangs on a GPU: freeing memory while a stream waits for the freeing thread.
  Emu emu(SyncFreeConfig());
  auto stream = emu.NewStream(0);
  auto device = emu.Alloc(0, 4096);
  auto hold = stream->EnqueueHold();
  ASSERT_TRUE(hold.ok()) << hold.status().ToString();
  const auto t0 = Clock::now();
  device.reset();
  EXPECT_GE(MillisecondsSince(t0), 250.0) << "the free did not wait for the held stream";
  (*hold)->Release();
  const Status sync = stream->Synchronize();
  EXPECT_TRUE(HasCode(sync, StatusCode::kTimeout));
  EXPECT_TRUE(Mentions(sync, "KIZUNA_EMU_SYNC_FREE"));
  EXPECT_TRUE(Mentions(sync, "a free"));
}

TEST(HostEmulatedSyncFree, AFreeInAHostCallbackDoesNotWaitForItsOwnStream) {
  Emu emu(SyncFreeConfig());
  auto stream = emu.NewStream(0);
  std::shared_ptr<Buffer> device = emu.Alloc(0, 4096);
  ASSERT_TRUE(stream->EnqueueHostCallback([device](const Status&) mutable { device.reset(); }).ok());
  device.reset();  // the callback holds the last reference
  const Status sync = stream->Synchronize();
  EXPECT_TRUE(sync.ok()) << sync.ToString();
}

}  // namespace
}  // namespace kizuna::host_emulated::test
