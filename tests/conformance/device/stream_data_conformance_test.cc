// Streams and events seen in the data: DataConformance (host_accessible or host_memory) ordering
// checked on data (long dependent chains, of reduces and copies and of reduces and scales, with
// host callbacks checking intermediate values; cross-stream dependencies, concurrent streams);
// HostAccessConformance (host_accessible): the CPU loading and storing device memory directly,
// from the test and from host callbacks; and MultiDeviceConformance (host_accessible or
// host_memory, and multi_device): copies and events across two devices. What the groups check and
// need: README.md.

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

// ---- DataConformance: ordering checked on the data ----

// 1,000 dependent operations on one stream: x <- 3x + 1 (mod 2^64) as a reduce of {x, x, x, one}
// into y followed by a copy of y back into x. The map is a bijection, so any reordering, skipped or
// repeated operation changes the final value; host callbacks every 100 operations check the value
// at that point and their own order.
TEST_P(DataConformance, StreamOrderingOverALongDependentChain) {
  constexpr size_t kCount = 257;
  constexpr size_t kBytes = kCount * sizeof(uint64_t);
  constexpr int kSteps = 500;  // two operations each
  constexpr int kCheckEvery = 50;
  auto buffer = MustAllocate(3 * kBytes);
  KZ_ASSERT_NOT_NULL(buffer);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*buffer));
  // Device addresses of x, y and the ones; host_x is x as the CPU sees it (after a download).
  auto* x = static_cast<uint64_t*>(buffer->data());
  uint64_t* y = x + kCount;
  uint64_t* one = x + 2 * kCount;
  auto* host_x = reinterpret_cast<uint64_t*>(view.host());
  for (size_t i = 0; i < kCount; ++i) {
    host_x[i] = i * 0x9e3779b97f4a7c15ull;
    host_x[2 * kCount + i] = 1;
  }
  KZ_ASSERT_OK(view.Upload());
  // expected[s][i]: the value of x after s steps.
  std::vector<std::vector<uint64_t>> expected(kSteps + 1, std::vector<uint64_t>(kCount));
  for (size_t i = 0; i < kCount; ++i) expected[0][i] = host_x[i];
  for (int s = 1; s <= kSteps; ++s)
    for (size_t i = 0; i < kCount; ++i) expected[s][i] = 3 * expected[s - 1][i] + 1;

  std::mutex mu;
  std::vector<int> seen_steps;  // guarded by mu
  std::atomic<int> wrong_values{0}, not_ok{0};
  const void* srcs[] = {x, x, x, one};
  // Created after everything its work and callbacks touch, so it is destroyed (drained) first.
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  for (int s = 1; s <= kSteps; ++s) {
    KZ_ASSERT_OK(stream->Reduce(y, srcs, kCount, DataType::kUint64, ReduceOp::kSum));
    KZ_ASSERT_OK(stream->Copy(x, y, kBytes));
    if (s % kCheckEvery == 0) {
      // The callback reads x at this point of the stream: directly, or the copy enqueued here.
      KZ_ASSERT_OK(view.EnqueueDownload(*stream, 0, kBytes));
      KZ_ASSERT_OK(stream->EnqueueHostCallback([&, s](const Status& st) {
        if (!st.ok()) not_ok.fetch_add(1);
        if (std::memcmp(host_x, expected[s].data(), kBytes) != 0) wrong_values.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        seen_steps.push_back(s);
      }));
    }
  }
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(view.Equals(0, expected[kSteps].data(), kBytes));
  EXPECT_EQ(wrong_values.load(), 0) << "a host callback saw work after it, or missed work before it";
  EXPECT_EQ(not_ok.load(), 0);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen_steps.size(), static_cast<size_t>(kSteps / kCheckEvery));
  for (size_t i = 0; i < seen_steps.size(); ++i) EXPECT_EQ(seen_steps[i], static_cast<int>(i + 1) * kCheckEvery);
}

// Stream B consumes what stream A produces, ordered only by an event; A is held behind a gate so
// B would visibly run early if the Wait were ignored.
TEST_P(DataConformance, CrossStreamWaitOrdersData) {
  constexpr size_t kBytes = (size_t{1} << 20) + 5;
  auto src = MustAllocate(kBytes);
  auto mid = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(mid);
  KZ_ASSERT_NOT_NULL(dst);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes mid_bytes, DeviceBytes::Create(*mid));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes dst_bytes, DeviceBytes::Create(*dst));
  auto event = MustCreateEvent();
  auto gate = std::make_shared<Gate>();
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_OK(src_bytes.Fill(1));
  KZ_ASSERT_OK(mid_bytes.Fill(2));
  KZ_ASSERT_OK(dst_bytes.Fill(3));
  KZ_ASSERT_OK(EnqueueGate(*a, gate));
  KZ_ASSERT_OK(a->Copy(mid->data(), src->data(), kBytes));
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(b->Wait(*event));
  KZ_ASSERT_OK(b->Copy(dst->data(), mid->data(), kBytes));
  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  // A stream B that ignored its Wait would finish its copy while A is held (and copy mid's old
  // bytes: the final check sees them).
  KZ_EXPECT_CODE(b->Synchronize(Short()), StatusCode::kTimeout);
  EXPECT_TRUE(dst_bytes.HasPattern(3)) << "stream B copied before the event it waits on completed";
  gate->Open();
  KZ_ASSERT_OK(b->Synchronize(TestDeadline()));
  EXPECT_TRUE(dst_bytes.HasPattern(1));
  KZ_EXPECT_OK(a->Synchronize(TestDeadline()));
}

// A scale is ordered like any other operation: 80 steps of x <- (x + x + x) / 2 on int64 (a reduce
// into y, then a scale of y back into x; truncation toward zero, negative values included). Doing
// either half out of order, twice or not at all changes the values; host callbacks check them
// every 10 steps. A backend without the (optional) scale operation skips, saying so.
TEST_P(DataConformance, ScaleIsOrderedInADependentChain) {
  constexpr size_t kCount = 257;
  constexpr size_t kBytes = kCount * sizeof(int64_t);
  constexpr int kSteps = 80;  // |x| grows by 1.5 per step: 5500 * 1.5^80 stays well inside int64
  constexpr int kCheckEvery = 10;
  auto buffer = MustAllocate(2 * kBytes);
  KZ_ASSERT_NOT_NULL(buffer);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*buffer));
  auto* x = static_cast<int64_t*>(buffer->data());  // device addresses
  int64_t* y = x + kCount;
  auto* host_x = reinterpret_cast<int64_t*>(view.host());
  for (size_t i = 0; i < kCount; ++i) host_x[i] = static_cast<int64_t>(i) * 37 - 4001;
  KZ_ASSERT_OK(view.Upload(0, kBytes));
  std::vector<std::vector<int64_t>> expected(kSteps + 1, std::vector<int64_t>(host_x, host_x + kCount));
  for (int s = 1; s <= kSteps; ++s)
    for (size_t i = 0; i < kCount; ++i) expected[s][i] = (3 * expected[s - 1][i]) / 2;

  std::atomic<int> wrong_values{0}, not_ok{0}, checks{0};
  const void* srcs[] = {x, x, x};
  auto stream = MustCreateStream();  // after everything its work and callbacks touch
  KZ_ASSERT_NOT_NULL(stream);
  for (int s = 1; s <= kSteps; ++s) {
    KZ_ASSERT_OK(stream->Reduce(y, srcs, kCount, DataType::kInt64, ReduceOp::kSum));
    const Status scaled = stream->Scale(x, y, kCount, DataType::kInt64, 2);
    if (s == 1 && scaled.code() == StatusCode::kNotSupported)
      GTEST_SKIP() << "the backend has no scale operation (optional): " << scaled.ToString();
    KZ_ASSERT_OK(scaled);
    if (s % kCheckEvery == 0) {
      KZ_ASSERT_OK(view.EnqueueDownload(*stream, 0, kBytes));
      KZ_ASSERT_OK(stream->EnqueueHostCallback([&, s](const Status& st) {
        if (!st.ok()) not_ok.fetch_add(1);
        if (std::memcmp(host_x, expected[s].data(), kBytes) != 0) wrong_values.fetch_add(1);
        checks.fetch_add(1);
      }));
    }
  }
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(view.Equals(0, expected[kSteps].data(), kBytes));
  EXPECT_EQ(wrong_values.load(), 0) << "a host callback saw a scale after it, or missed one before it";
  EXPECT_EQ(not_ok.load(), 0);
  EXPECT_EQ(checks.load(), kSteps / kCheckEvery);
}

// Stream B scales what stream A scaled, ordered only by an event; A is held behind a gate so B
// would visibly run early if the Wait were ignored.
TEST_P(DataConformance, CrossStreamWaitOrdersScale) {
  constexpr size_t kCount = (size_t{1} << 18) + 5;
  constexpr size_t kBytes = kCount * sizeof(int32_t);
  auto src = MustAllocate(kBytes);
  auto mid = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(mid);
  KZ_ASSERT_NOT_NULL(dst);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes mid_bytes, DeviceBytes::Create(*mid));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes dst_bytes, DeviceBytes::Create(*dst));
  auto event = MustCreateEvent();
  auto gate = std::make_shared<Gate>();
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);
  auto* in = reinterpret_cast<int32_t*>(src_bytes.host());
  for (size_t i = 0; i < kCount; ++i) in[i] = static_cast<int32_t>(i * 2654435761u);  // both signs
  KZ_ASSERT_OK(src_bytes.Upload());
  KZ_ASSERT_OK(mid_bytes.Fill(12));
  KZ_ASSERT_OK(dst_bytes.Fill(13));
  KZ_ASSERT_OK(EnqueueGate(*a, gate));
  const Status first = a->Scale(mid->data(), src->data(), kCount, DataType::kInt32, 3);
  if (first.code() == StatusCode::kNotSupported)
    GTEST_SKIP() << "the backend has no scale operation (optional): " << first.ToString();
  KZ_ASSERT_OK(first);
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(b->Wait(*event));
  KZ_ASSERT_OK(b->Scale(dst->data(), mid->data(), kCount, DataType::kInt32, 5));
  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  // A stream B that ignored its Wait would finish its scale while A is held (of mid's old values:
  // the final check sees them).
  KZ_EXPECT_CODE(b->Synchronize(Short()), StatusCode::kTimeout);
  EXPECT_TRUE(dst_bytes.HasPattern(13)) << "stream B scaled before the event it waits on completed";
  EXPECT_TRUE(mid_bytes.HasPattern(12)) << "stream A scaled before the gate ahead of it opened";
  gate->Open();
  KZ_ASSERT_OK(b->Synchronize(TestDeadline()));
  KZ_EXPECT_OK(a->Synchronize(TestDeadline()));
  KZ_ASSERT_OK(dst_bytes.Download());
  const auto* out = reinterpret_cast<const int32_t*>(dst_bytes.host());
  size_t wrong = 0;
  for (size_t i = 0; i < kCount; ++i) wrong += out[i] != in[i] / 3 / 5;
  EXPECT_EQ(wrong, 0u) << "of " << kCount << " elements";
}

TEST_P(DataConformance, HostCallbackSeesEarlierWork) {
  constexpr size_t kBytes = (size_t{4} << 20) + 1;
  auto src = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes dst_bytes, DeviceBytes::Create(*dst));
  std::vector<uint8_t> expected(kBytes);
  FillPattern(expected.data(), kBytes, 21);
  std::atomic<int> seen{-1};
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(src_bytes.Fill(21));
  KZ_ASSERT_OK(dst_bytes.Fill(22));
  KZ_ASSERT_OK(stream->Copy(dst->data(), src->data(), kBytes));
  KZ_ASSERT_OK(dst_bytes.EnqueueDownload(*stream, 0, kBytes));  // nothing to do when host-accessible
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) {
    seen.store(s.ok() && std::memcmp(dst_bytes.host(), expected.data(), kBytes) == 0 ? 1 : 0);
  }));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_EQ(seen.load(), 1) << "the callback ran before the work enqueued ahead of it had finished";
}

TEST_P(DataConformance, StreamDestructorFinishesCopies) {
  constexpr size_t kBytes = (size_t{8} << 20) + 3;
  auto src = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes dst_bytes, DeviceBytes::Create(*dst));
  KZ_ASSERT_OK(src_bytes.Fill(31));
  KZ_ASSERT_OK(dst_bytes.Fill(32));
  {
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_OK(stream->Copy(dst->data(), src->data(), kBytes));
  }
  EXPECT_TRUE(dst_bytes.HasPattern(31));
}

TEST_P(DataConformance, ConcurrentStreamsOnOneDevice) {
  constexpr int kStreams = 4;
  constexpr size_t kBytes = (size_t{1} << 20) + 9;
  std::vector<std::unique_ptr<Buffer>> srcs, dsts;
  std::vector<DeviceBytes> dst_bytes;            // after the buffers they view
  std::vector<std::unique_ptr<Stream>> streams;  // declared last: destroyed (drained) first
  for (int s = 0; s < kStreams; ++s) {
    streams.push_back(MustCreateStream());
    srcs.push_back(MustAllocate(kBytes));
    dsts.push_back(MustAllocate(kBytes));
    KZ_ASSERT_NOT_NULL(streams.back());
    KZ_ASSERT_NOT_NULL(srcs.back());
    KZ_ASSERT_NOT_NULL(dsts.back());
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*srcs.back()));
    KZ_ASSERT_OK(src_bytes.Fill(40 + s));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes view, DeviceBytes::Create(*dsts.back()));
    dst_bytes.push_back(std::move(view));
  }
  for (int round = 0; round < 4; ++round)
    for (int s = 0; s < kStreams; ++s) KZ_ASSERT_OK(streams[s]->Copy(dsts[s]->data(), srcs[s]->data(), kBytes));
  for (int s = 0; s < kStreams; ++s) KZ_ASSERT_OK(streams[s]->Synchronize(TestDeadline()));
  for (int s = 0; s < kStreams; ++s) EXPECT_TRUE(dst_bytes[s].HasPattern(40 + s)) << "stream " << s;
}

// ---- HostAccessConformance: the CPU dereferences device memory ----

// Plain CPU stores into device memory are what a stream copy reads; what a stream writes is what
// plain CPU loads see, from the test thread and from a host callback enqueued after the write.
TEST_P(HostAccessConformance, CpuLoadsAndStoresMeetStreamWork) {
  constexpr size_t kBytes = (size_t{1} << 20) + 7;
  auto src = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  std::atomic<int> callback_saw{-1};
  auto stream = MustCreateStream();  // after what its work and callback touch
  KZ_ASSERT_NOT_NULL(stream);
  auto* s = static_cast<uint8_t*>(src->data());
  auto* d = static_cast<uint8_t*>(dst->data());
  for (size_t i = 0; i < kBytes; ++i) s[i] = PatternByte(401, i);  // plain stores
  std::memset(d, 0, kBytes);
  KZ_ASSERT_OK(stream->Copy(d + 3, s + 1, kBytes - 4));
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& st) {
    callback_saw.store(st.ok() && std::memcmp(d + 3, s + 1, kBytes - 4) == 0 && d[0] == 0 ? 1 : 0);
  }));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_EQ(callback_saw.load(), 1) << "a host callback read other bytes than the copy ahead of it wrote";
  EXPECT_TRUE(BytesEqual(d + 3, s + 1, kBytes - 4));  // plain loads
  EXPECT_EQ(d[0], 0);
  EXPECT_EQ(d[kBytes - 1], 0);
}

// A host callback may update device memory that later stream work reads (a host-side producer,
// as the engine's CPU fallbacks are).
TEST_P(HostAccessConformance, HostCallbackWritesAreSeenByLaterWork) {
  constexpr size_t kBytes = 4096 + 3;
  auto a = MustAllocate(kBytes);
  auto b = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  auto* pa = static_cast<uint8_t*>(a->data());
  auto* pb = static_cast<uint8_t*>(b->data());
  std::memset(pa, 0, kBytes);
  std::memset(pb, 0, kBytes);
  auto stream = MustCreateStream();  // after what its work and callback touch
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(stream->EnqueueHostCallback([pa](const Status&) { FillPattern(pa, kBytes, 402); }));
  KZ_ASSERT_OK(stream->Copy(pb, pa, kBytes));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(pb, kBytes, 402)) << "the copy ran before the callback ahead of it";
}

// ---- MultiDeviceConformance: two devices of one backend ----

TEST_P(MultiDeviceConformance, CopyBetweenDevices) {
  Device& d0 = device(0);
  Device& d1 = device(1);
  for (size_t size : kOddSizes) {
    const size_t total = size + kMaxOffset + 64;
    auto b0 = MustAllocate(d0, total);
    auto b1 = MustAllocate(d1, total);
    KZ_ASSERT_NOT_NULL(b0);
    KZ_ASSERT_NOT_NULL(b1);
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes v0, DeviceBytes::Create(*b0));
    KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes v1, DeviceBytes::Create(*b1));
    // Streams per size, after the buffers they copy between: destroyed (drained) before them.
    auto s0 = MustCreateStream(d0);
    auto s1 = MustCreateStream(d1);
    KZ_ASSERT_NOT_NULL(s0);
    KZ_ASSERT_NOT_NULL(s1);
    std::vector<uint8_t> source(total), before(total);
    FillPattern(source.data(), total, size + 1);
    FillPattern(before.data(), total, 9);
    for (const OffsetPair& o : kOffsetPairs) {
      // Device 0 -> 1 on device 0's stream, 1 -> 0 on device 1's stream, and 0 -> 1 driven by the
      // destination's stream.
      struct Leg {
        Stream* stream;
        Buffer* from;
        DeviceBytes* from_bytes;
        Buffer* to;
        DeviceBytes* to_bytes;
        const char* what;
      };
      const Leg legs[] = {{s0.get(), b0.get(), &v0, b1.get(), &v1, "0 -> 1 on device 0's stream"},
                          {s1.get(), b1.get(), &v1, b0.get(), &v0, "1 -> 0 on device 1's stream"},
                          {s1.get(), b0.get(), &v0, b1.get(), &v1, "0 -> 1 on device 1's stream"}};
      for (const Leg& leg : legs) {
        SCOPED_TRACE(fmt::format("{} bytes {}, offsets {} -> {}", size, leg.what, o.src, o.dst));
        KZ_ASSERT_OK(leg.from_bytes->Fill(size + 1));
        KZ_ASSERT_OK(leg.to_bytes->Fill(9));
        KZ_ASSERT_OK(leg.stream->Copy(At(*leg.to, o.dst), At(*leg.from, o.src), size));
        KZ_ASSERT_OK(leg.stream->Synchronize(TestDeadline()));
        KZ_ASSERT_OK(leg.to_bytes->Download());
        const uint8_t* got = leg.to_bytes->host();
        EXPECT_TRUE(BytesEqual(got + o.dst, source.data() + o.src, size));
        EXPECT_TRUE(BytesEqual(got, before.data(), o.dst));
        EXPECT_TRUE(BytesEqual(got + o.dst + size, before.data() + o.dst + size, total - o.dst - size));
      }
    }
  }
}

TEST_P(MultiDeviceConformance, EventOrdersStreamsOfTwoDevices) {
  constexpr size_t kBytes = (size_t{1} << 20) + 17;
  Device& d0 = device(0);
  Device& d1 = device(1);
  auto src = MustAllocate(d0, kBytes);
  auto dst = MustAllocate(d1, kBytes);
  auto staging = MustAllocate(d0, kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  KZ_ASSERT_NOT_NULL(staging);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes src_bytes, DeviceBytes::Create(*src));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes dst_bytes, DeviceBytes::Create(*dst));
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes staging_bytes, DeviceBytes::Create(*staging));
  auto event = MustCreateEvent(d0);
  auto gate = std::make_shared<Gate>();
  auto s0 = MustCreateStream(d0);
  auto s1 = MustCreateStream(d1);
  OpenOnExit opener(gate);
  KZ_ASSERT_NOT_NULL(s0);
  KZ_ASSERT_NOT_NULL(s1);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_OK(src_bytes.Fill(51));
  KZ_ASSERT_OK(staging_bytes.Fill(52));
  KZ_ASSERT_OK(dst_bytes.Fill(53));
  KZ_ASSERT_OK(EnqueueGate(*s0, gate));
  KZ_ASSERT_OK(s0->Copy(staging->data(), src->data(), kBytes));
  KZ_ASSERT_OK(s0->Record(*event));
  KZ_ASSERT_OK(s1->Wait(*event));  // an event of device 0 waited on by device 1's stream
  KZ_ASSERT_OK(s1->Copy(dst->data(), staging->data(), kBytes));
  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  // A device 1 stream that ignored its Wait would finish its copy while device 0's is held (of
  // the staging buffer's old bytes: the final check sees them).
  KZ_EXPECT_CODE(s1->Synchronize(Short()), StatusCode::kTimeout);
  EXPECT_TRUE(dst_bytes.HasPattern(53)) << "device 1's stream ran past its wait";
  gate->Open();
  KZ_ASSERT_OK(s1->Synchronize(TestDeadline()));
  EXPECT_TRUE(dst_bytes.HasPattern(51));
  KZ_EXPECT_OK(s0->Synchronize(TestDeadline()));
}

}  // namespace
}  // namespace kizuna::device::conformance
