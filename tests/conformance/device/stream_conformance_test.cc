// Streams and events: DeviceConformance (every backend) semantics observed through host callbacks
// (completion, event query and re-record, timeouts, cross-stream waits, callback order, draining
// destructors, events of another backend). Ordering checked on data, direct CPU access and two
// devices: stream_data_conformance_test.cc. What the groups check and need: README.md.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/dtype.h"
#include "tests/conformance/device/device_conformance.h"

namespace kizuna::device::conformance {
namespace {

using namespace std::chrono_literals;

// A short deadline for waits that are expected to time out.
Deadline Short() { return Deadline::After(30ms); }

// The negative checks below ("B has not run past its wait yet") never sleep and then look: the
// work that must not run early is held behind a gate (or a hold) that only the test opens, the
// test waits for that work's own completion (an event, the stream) with Short() and expects
// kTimeout, so a stream that runs ahead is seen the moment it does, and the work records what it
// saw when it ran (the data it read, or whether the test had released it yet), so running ahead at
// any moment before the release fails the test, however late the test looks.

// ---- DeviceConformance: streams and events through host callbacks ----

TEST_P(DeviceConformance, EmptyStreamIsComplete) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  EXPECT_EQ(&stream->device(), &device());
  auto q = stream->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
  KZ_EXPECT_OK(stream->Synchronize(Short()));
  // Several streams and events per device.
  std::vector<std::unique_ptr<Event>> events;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 8; ++i) {
    streams.push_back(MustCreateStream());
    events.push_back(MustCreateEvent());
    KZ_ASSERT_NOT_NULL(streams.back());
    KZ_ASSERT_NOT_NULL(events.back());
  }
}

TEST_P(DeviceConformance, UnrecordedEventIsComplete) {
  auto event = MustCreateEvent();
  KZ_ASSERT_NOT_NULL(event);
  EXPECT_EQ(&event->device(), &device());
  auto q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q) << "an event that was never recorded counts as complete";
  KZ_EXPECT_OK(event->Synchronize(Short()));
  // Waiting on it delays nothing.
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(stream->Wait(*event));
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, EventQueryBeforeAndAfterCompletion) {
  auto event = MustCreateEvent();
  auto gate = std::make_shared<Gate>();
  auto stream = MustCreateStream();
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_OK(EnqueueGate(*stream, gate));
  KZ_ASSERT_OK(stream->Record(*event));
  ASSERT_TRUE(gate->WaitReached(TestDeadline())) << "the gate callback never ran";

  auto q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_FALSE(*q) << "the event captured work that is still held";
  auto sq = stream->Query();
  KZ_ASSERT_OK(sq.status());
  EXPECT_FALSE(*sq);
  // The timeout paths: both waits give up at their deadline with kTimeout.
  KZ_EXPECT_CODE(event->Synchronize(Short()), StatusCode::kTimeout);
  KZ_EXPECT_CODE(stream->Synchronize(Short()), StatusCode::kTimeout);

  gate->Open();
  KZ_ASSERT_OK(event->Synchronize(TestDeadline()));
  q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
  sq = stream->Query();
  KZ_ASSERT_OK(sq.status());
  EXPECT_TRUE(*sq);
}

TEST_P(DeviceConformance, EventReRecordCapturesNewWork) {
  auto event = MustCreateEvent();
  auto gate = std::make_shared<Gate>();
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(event->Synchronize(TestDeadline()));

  // Re-recorded on another stream behind held work: pending again, complete once released.
  KZ_ASSERT_OK(EnqueueGate(*b, gate));
  KZ_ASSERT_OK(b->Record(*event));
  auto q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_FALSE(*q) << "re-recording must capture the new stream's pending work";
  gate->Open();
  KZ_ASSERT_OK(event->Synchronize(TestDeadline()));
  q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);

  // And once more on the first stream, many times in a row.
  for (int i = 0; i < 100; ++i) KZ_ASSERT_OK(a->Record(*event));
  KZ_EXPECT_OK(event->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, CrossStreamWaitOrdersWork) {
  auto event = MustCreateEvent();
  auto gate = std::make_shared<Gate>();
  auto a_done = std::make_shared<std::atomic<bool>>(false);
  auto b_ran = std::make_shared<std::atomic<bool>>(false);
  auto b_saw_a_done = std::make_shared<std::atomic<bool>>(false);
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);

  KZ_ASSERT_OK(EnqueueGate(*a, gate));
  KZ_ASSERT_OK(a->EnqueueHostCallback([a_done](const Status&) { a_done->store(true); }));
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(b->Wait(*event));
  KZ_ASSERT_OK(b->EnqueueHostCallback([a_done, b_ran, b_saw_a_done](const Status& s) {
    b_saw_a_done->store(a_done->load() && s.ok());
    b_ran->store(true);
  }));

  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  // A stream B that ignored its Wait would finish while A is held: waiting for it must time out.
  KZ_EXPECT_CODE(b->Synchronize(Short()), StatusCode::kTimeout);
  EXPECT_FALSE(b_ran->load()) << "stream B ran past its Wait on an event that had not completed";
  auto qb = b->Query();
  KZ_ASSERT_OK(qb.status());
  EXPECT_FALSE(*qb);

  gate->Open();
  KZ_ASSERT_OK(b->Synchronize(TestDeadline()));
  EXPECT_TRUE(b_ran->load());
  EXPECT_TRUE(b_saw_a_done->load()) << "stream B's work ran before the work its event captured";
  KZ_EXPECT_OK(a->Synchronize(TestDeadline()));
}

// Stream::EnqueueHold: later work waits until the release, earlier work does not; several
// streams held at once go on independently (a backend that holds with blocking host callbacks on
// one thread would serialize them: the engine holds every rank's stream of a process); a release
// enqueued on another stream; destroying an unreleased hold releases it.
TEST_P(DeviceConformance, HoldsStopLaterWorkUntilReleased) {
  constexpr int kStreams = 3;
  std::vector<std::unique_ptr<Event>> before, after;
  for (int i = 0; i < kStreams; ++i) {
    before.push_back(MustCreateEvent());
    after.push_back(MustCreateEvent());
    KZ_ASSERT_NOT_NULL(before.back());
    KZ_ASSERT_NOT_NULL(after.back());
  }
  // released[i]: set by the test just before it releases stream i; early[i]: the work behind that
  // hold ran before it (recorded by the work itself, whenever it runs).
  auto released = std::make_shared<std::array<std::atomic<bool>, kStreams>>();
  auto early = std::make_shared<std::array<std::atomic<bool>, kStreams>>();
  std::vector<std::unique_ptr<StreamHold>> holds;
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(MustCreateStream());
    KZ_ASSERT_NOT_NULL(streams.back());
  }
  for (int i = 0; i < kStreams; ++i) {
    KZ_ASSERT_OK(streams[i]->Record(*before[i]));
    KZ_ASSERT_OK_AND_ASSIGN(auto hold, streams[i]->EnqueueHold());
    ASSERT_NE(hold, nullptr);
    holds.push_back(std::move(hold));
    KZ_ASSERT_OK(streams[i]->EnqueueHostCallback([released, early, i](const Status&) {
      if (!(*released)[i].load()) (*early)[i].store(true);
    }));
    KZ_ASSERT_OK(streams[i]->Record(*after[i]));
  }
  for (int i = 0; i < kStreams; ++i) KZ_EXPECT_OK(before[i]->Synchronize(TestDeadline())) << "stream " << i;
  // A hold that does not hold would let the work behind it finish: waiting for it must time out.
  for (int i = 0; i < kStreams; ++i) {
    KZ_EXPECT_CODE(after[i]->Synchronize(Short()), StatusCode::kTimeout) << " (stream " << i << ")";
    auto done = after[i]->Query();
    KZ_ASSERT_OK(done.status());
    EXPECT_FALSE(*done) << "stream " << i << " ran past its hold before the release";
  }
  // Released in reverse order: each stream goes on by itself.
  for (int i = kStreams - 1; i >= 0; --i) {
    (*released)[i].store(true);
    holds[i]->Release();
    holds[i]->Release();  // idempotent
    KZ_EXPECT_OK(after[i]->Synchronize(TestDeadline())) << "stream " << i << " after its release";
  }
  for (int i = 0; i < kStreams; ++i)
    EXPECT_FALSE((*early)[i].load()) << "stream " << i << " ran the work behind its hold before the release";
  // A release enqueued on another stream lets the held stream go on once that stream gets there.
  {
    auto opened = std::make_shared<std::atomic<bool>>(false);      // set by the test before it opens the gate
    auto went_early = std::make_shared<std::atomic<bool>>(false);  // the held work ran before that
    auto gate = std::make_shared<Gate>();
    auto releaser = MustCreateStream();
    OpenOnExit opener(gate);
    KZ_ASSERT_NOT_NULL(releaser);
    KZ_ASSERT_OK_AND_ASSIGN(auto hold, streams[1]->EnqueueHold());
    KZ_ASSERT_OK(streams[1]->EnqueueHostCallback([opened, went_early](const Status&) {
      if (!opened->load()) went_early->store(true);
    }));
    KZ_ASSERT_OK(streams[1]->Record(*after[1]));
    KZ_ASSERT_OK(EnqueueGate(*releaser, gate));
    KZ_ASSERT_OK(releaser->EnqueueRelease(std::move(hold)));
    ASSERT_TRUE(gate->WaitReached(TestDeadline()));
    KZ_EXPECT_CODE(after[1]->Synchronize(Short()), StatusCode::kTimeout);
    auto done = after[1]->Query();
    KZ_ASSERT_OK(done.status());
    EXPECT_FALSE(*done) << "the held stream went on before the releasing stream reached the release";
    opened->store(true);
    gate->Open();
    KZ_EXPECT_OK(after[1]->Synchronize(TestDeadline()));
    KZ_EXPECT_OK(releaser->Synchronize(TestDeadline()));
    EXPECT_FALSE(went_early->load()) << "the held stream went on before the releasing stream reached the release";
  }
  // A hold destroyed unreleased lets the stream go on.
  {
    KZ_ASSERT_OK_AND_ASSIGN(auto hold, streams[0]->EnqueueHold());
    KZ_ASSERT_OK(streams[0]->Record(*after[0]));
  }
  KZ_EXPECT_OK(after[0]->Synchronize(TestDeadline()));
  for (auto& s : streams) KZ_EXPECT_OK(s->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, HostCallbacksRunInOrderWithOkStatus) {
  constexpr int kCallbacks = 1000;
  std::mutex mu;
  std::vector<int> order;  // guarded by mu
  std::atomic<int> not_ok{0};
  auto stream = MustCreateStream();  // after what its callbacks touch: destroyed (drained) first
  KZ_ASSERT_NOT_NULL(stream);
  for (int i = 0; i < kCallbacks; ++i) {
    KZ_ASSERT_OK(stream->EnqueueHostCallback([&, i](const Status& s) {
      if (!s.ok()) not_ok.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    }));
  }
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), static_cast<size_t>(kCallbacks));
  for (int i = 0; i < kCallbacks; ++i) ASSERT_EQ(order[i], i) << "callbacks ran out of order";
  EXPECT_EQ(not_ok.load(), 0) << "callbacks on a healthy stream must see an ok status";
}

TEST_P(DeviceConformance, EmptyHostCallbackIsInvalid) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_EXPECT_CODE(stream->EnqueueHostCallback(HostCallback()), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

// The stream is destroyed while its queue is held behind a gate that only the test opens, so the
// queued work cannot have finished by itself before the destructor returns: what ran by then is
// counted when it returns. The gate opens once the destructor returns (too early: the count says
// so) or after Short(), from another thread, since a correct destructor blocks the test's.
TEST_P(DeviceConformance, StreamDestructorDrainsQueuedWork) {
  auto ran = std::make_shared<std::atomic<int>>(0);
  auto gate = std::make_shared<Gate>();
  auto returned = std::make_shared<Gate>();  // opened when the destructor has returned
  auto stream = MustCreateStream();
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(EnqueueGate(*stream, gate));
  for (int i = 0; i < 3; ++i) KZ_ASSERT_OK(stream->EnqueueHostCallback([ran](const Status&) { ran->fetch_add(1); }));
  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  std::thread open_later([gate, returned] {
    returned->WaitOpen(Short());
    gate->Open();
  });
  stream.reset();
  const int ran_when_destroyed = ran->load();
  returned->Open();
  open_later.join();
  EXPECT_EQ(ran_when_destroyed, 3) << "destroying a stream must first finish its queued work";
}

TEST_P(DeviceConformance, EventsDoNotCrossBackends) {
  const BackendUnderTest* other = nullptr;
  for (const BackendUnderTest& b : World().backends())
    if (b.available() && b.name != under_test().name && b.slot->backend->device_count() > 0) other = &b;
  if (other == nullptr) GTEST_SKIP() << "no second available backend in this run";
  auto mine = MustCreateEvent();
  auto theirs = other->slot->backend->device(0)->CreateEvent();
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(mine);
  KZ_ASSERT_OK(theirs.status());
  KZ_EXPECT_CODE(stream->Record(**theirs), StatusCode::kNotSupported);
  KZ_EXPECT_CODE(stream->Wait(**theirs), StatusCode::kNotSupported);
  KZ_EXPECT_OK(stream->Record(*mine));
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

}  // namespace
}  // namespace kizuna::device::conformance
