// HostEmulatedFaultInjection: host_emulated only. Fault injection is a property of that backend's
// factory (Config::emu_fail_alloc / emu_fail_stream_op), so these tests build their own instance
// instead of using the registry's. That instance is always host-accessible, also when the run
// sets KIZUNA_EMU_OPAQUE=1: the tests check that failed work wrote nothing with plain CPU reads,
// and staging those bytes through host memory would add stream operations and allocations to
// the very numbering the faults are placed by. Opaque memory is covered by the other groups.
//
// Not parameterized over the registry; PrintCapabilities (conformance_main.cc) lists it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/core/config.h"
#include "runtime/core/dtype.h"
#include "tests/conformance/device/device_conformance.h"

namespace kizuna::device::conformance {
namespace {

class HostEmulatedFaultInjection : public ::testing::Test {
 protected:
  // Config first: the backend keeps a reference to it.
  void Start(std::optional<uint64_t> fail_alloc, std::optional<uint64_t> fail_stream_op,
             std::optional<double> reduce_gbps = std::nullopt) {
    config_ = World().config();
    config_.emulated_devices = 2;
    config_.emu_fail_alloc = fail_alloc;
    config_.emu_fail_stream_op = fail_stream_op;
    config_.emu_reduce_gbps = reduce_gbps;
    config_.emu_opaque = false;  // see the top of this file
    auto b = host_emulated::CreateHostEmulatedBackend(config_);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    ASSERT_EQ(backend_->device_count(), 2);
  }
  Device& device(int i) { return *backend_->device(i); }

  Config config_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(HostEmulatedFaultInjection, AllocationFailureSurfacesFromAllocate) {
  ASSERT_NO_FATAL_FAILURE(Start(/*fail_alloc=*/3, std::nullopt));
  // Allocations are numbered from 1 across the backend's devices, empty ones included.
  KZ_ASSERT_OK_AND_ASSIGN(auto first, device(0).Allocate(64));
  KZ_ASSERT_OK_AND_ASSIGN(auto second, device(1).Allocate(0));
  auto third = device(0).Allocate(64);
  ASSERT_FALSE(third.ok()) << "allocation #3 should have failed";
  EXPECT_EQ(third.status().code(), StatusCode::kOutOfMemory) << third.status().ToString();
  EXPECT_NE(third.status().message().find("injected"), std::string::npos) << third.status().ToString();
  KZ_ASSERT_OK_AND_ASSIGN(auto fourth, device(0).Allocate(64));
  EXPECT_EQ(fourth->size(), 64u);
}

TEST_F(HostEmulatedFaultInjection, StreamFailureIsStickyAndReachesEventsAndCallbacks) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/2));
  constexpr size_t kBytes = 4096;
  KZ_ASSERT_OK_AND_ASSIGN(auto buffer, device(0).Allocate(6 * kBytes));
  uint8_t* p = At(*buffer);  // host-accessible: see the top of this file
  FillPattern(p, 6 * kBytes, 81);
  std::vector<uint8_t> before(p, p + 6 * kBytes);
  KZ_ASSERT_OK_AND_ASSIGN(auto healthy_event, device(0).CreateEvent());
  KZ_ASSERT_OK_AND_ASSIGN(auto failed_event, device(0).CreateEvent());
  std::atomic<int> callback_code{-1};
  std::atomic<int> waiter_code{-1};
  // Streams after everything their work touches: destroyed (drained) first, even on an early return.
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());

  KZ_ASSERT_OK(stream->Copy(p + kBytes, p, kBytes));  // operation #1: runs
  KZ_ASSERT_OK(stream->Record(*healthy_event));
  KZ_ASSERT_OK(stream->Copy(p + 3 * kBytes, p + 2 * kBytes, kBytes));  // #2: fails
  KZ_ASSERT_OK(stream->Record(*failed_event));
  KZ_ASSERT_OK(stream->EnqueueHostCallback(  // #3: runs, and is told why the stream stopped
      [&](const Status& s) { callback_code.store(static_cast<int>(s.code())); }));
  KZ_ASSERT_OK(stream->Copy(p + 5 * kBytes, p + 4 * kBytes, kBytes));  // #4: skipped

  const Status sync = stream->Synchronize(TestDeadline());
  EXPECT_EQ(sync.code(), StatusCode::kInternal) << sync.ToString();
  EXPECT_NE(sync.message().find("injected"), std::string::npos) << sync.ToString();
  auto q = stream->Query();
  EXPECT_FALSE(q.ok()) << "Query must report the sticky error";
  EXPECT_EQ(callback_code.load(), static_cast<int>(StatusCode::kInternal)) << "the callback saw the wrong status";

  EXPECT_TRUE(BytesEqual(p + kBytes, p, kBytes)) << "operation #1 (before the fault) did not run";
  EXPECT_TRUE(BytesEqual(p + 3 * kBytes, before.data() + 3 * kBytes, kBytes)) << "the failed copy wrote";
  EXPECT_TRUE(BytesEqual(p + 5 * kBytes, before.data() + 5 * kBytes, kBytes)) << "work after the fault ran";

  // An event recorded before the fault is fine; one recorded after it carries the error.
  auto hq = healthy_event->Query();
  KZ_ASSERT_OK(hq.status());
  EXPECT_TRUE(*hq);
  KZ_EXPECT_OK(healthy_event->Synchronize(TestDeadline()));
  EXPECT_FALSE(failed_event->Query().ok());
  KZ_EXPECT_CODE(failed_event->Synchronize(TestDeadline()), StatusCode::kInternal);

  // Another stream that waits on the failed event inherits the error, also across devices ...
  // (The exact code: "not ok" would also accept a waiter that hung until kTimeout with its
  // callback never run.)
  KZ_ASSERT_OK_AND_ASSIGN(auto waiter, device(1).CreateStream());
  KZ_ASSERT_OK(waiter->Wait(*failed_event));
  KZ_ASSERT_OK(waiter->EnqueueHostCallback([&](const Status& s) { waiter_code.store(static_cast<int>(s.code())); }));
  KZ_EXPECT_CODE(waiter->Synchronize(TestDeadline()), StatusCode::kInternal);
  EXPECT_EQ(waiter_code.load(), static_cast<int>(StatusCode::kInternal))
      << "the waiter's callback saw the wrong status";

  // ... while an independent stream keeps working.
  KZ_ASSERT_OK_AND_ASSIGN(auto independent, device(0).CreateStream());
  KZ_ASSERT_OK(independent->Copy(p + 5 * kBytes, p + 4 * kBytes, kBytes));
  KZ_EXPECT_OK(independent->Synchronize(TestDeadline()));
  EXPECT_TRUE(BytesEqual(p + 5 * kBytes, p + 4 * kBytes, kBytes));
}

TEST_F(HostEmulatedFaultInjection, FailedHostCallbackStopsTheStream) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/1));
  KZ_ASSERT_OK_AND_ASSIGN(auto event, device(0).CreateEvent());
  std::atomic<int> first_code{-1}, second_code{-1};
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());  // after what its callbacks touch
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) { first_code.store(static_cast<int>(s.code())); }));
  KZ_ASSERT_OK(stream->Record(*event));
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) { second_code.store(static_cast<int>(s.code())); }));
  KZ_EXPECT_CODE(stream->Synchronize(TestDeadline()), StatusCode::kInternal);
  EXPECT_EQ(first_code.load(), static_cast<int>(StatusCode::kInternal)) << "the failed callback itself";
  EXPECT_EQ(second_code.load(), static_cast<int>(StatusCode::kInternal)) << "a callback after the failure";
  KZ_EXPECT_CODE(event->Synchronize(TestDeadline()), StatusCode::kInternal);
}

TEST_F(HostEmulatedFaultInjection, FailedReduceLeavesItsOutputAlone) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/1));
  constexpr size_t kCount = 1000;
  KZ_ASSERT_OK_AND_ASSIGN(auto buffer, device(0).Allocate(3 * kCount * sizeof(float)));
  auto* f = static_cast<float*>(buffer->data());
  FillPattern(f, 3 * kCount * sizeof(float), 91);
  const void* srcs[] = {f, f + kCount};
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());  // after the buffer it reduces in
  KZ_ASSERT_OK(stream->Reduce(f + 2 * kCount, srcs, kCount, DataType::kFloat32, ReduceOp::kSum));
  KZ_EXPECT_CODE(stream->Synchronize(TestDeadline()), StatusCode::kInternal);
  EXPECT_TRUE(HasPattern(f, 3 * kCount * sizeof(float), 91));
  auto q = stream->Query();
  EXPECT_FALSE(q.ok());
}

// A scale is a numbered stream operation like a copy or a reduce: the injected fault hits it, it
// writes nothing, and the stream's later work (another scale included) is skipped.
TEST_F(HostEmulatedFaultInjection, FailedScaleIsStickyAndLeavesItsOutputAlone) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/2));
  constexpr size_t kCount = 1000;
  KZ_ASSERT_OK_AND_ASSIGN(auto buffer, device(0).Allocate(4 * kCount * sizeof(int32_t)));
  auto* v = static_cast<int32_t*>(buffer->data());
  for (size_t i = 0; i < kCount; ++i) v[i] = -static_cast<int32_t>(i) * 7;
  FillPattern(v + kCount, 3 * kCount * sizeof(int32_t), 93);
  KZ_ASSERT_OK_AND_ASSIGN(auto after, device(0).CreateEvent());
  std::atomic<int> callback_code{-1};
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());  // after what its work touches
  KZ_ASSERT_OK(stream->Scale(v + kCount, v, kCount, DataType::kInt32, 2));      // #1: runs
  KZ_ASSERT_OK(stream->Scale(v + 2 * kCount, v, kCount, DataType::kInt32, 3));  // #2: fails
  KZ_ASSERT_OK(stream->Scale(v + 3 * kCount, v, kCount, DataType::kInt32, 4));  // #3: skipped
  KZ_ASSERT_OK(stream->Record(*after));
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) { callback_code.store(static_cast<int>(s.code())); }));
  const Status sync = stream->Synchronize(TestDeadline());
  EXPECT_EQ(sync.code(), StatusCode::kInternal) << sync.ToString();
  EXPECT_NE(sync.message().find("injected fault: stream operation #2 failed (scale"), std::string::npos)
      << sync.ToString();
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(v[kCount + i], v[i] / 2) << "scale #1 (before the fault), " << i;
  std::vector<uint8_t> untouched(2 * kCount * sizeof(int32_t));
  for (size_t i = 0; i < untouched.size(); ++i) untouched[i] = PatternByte(93, kCount * sizeof(int32_t) + i);
  EXPECT_TRUE(BytesEqual(v + 2 * kCount, untouched.data(), untouched.size())) << "the failed or skipped scale wrote";
  KZ_EXPECT_CODE(after->Synchronize(TestDeadline()), StatusCode::kInternal);
  EXPECT_EQ(callback_code.load(), static_cast<int>(StatusCode::kInternal));
  EXPECT_FALSE(stream->Query().ok());
}

// KIZUNA_EMU_REDUCE_GBPS throttles a scale like a reduce (bytes of input read): 4 MiB at
// 0.1 GB/s occupy the device for at least 42 ms. (The device timeline is shared host-wide, so
// other users of the device can only make it longer.)
TEST_F(HostEmulatedFaultInjection, ScaleIsThrottledByTheReduceRate) {
  constexpr double kGbps = 0.1;
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, std::nullopt, kGbps));
  constexpr size_t kCount = size_t{1} << 20;
  constexpr size_t kBytes = kCount * sizeof(float);
  KZ_ASSERT_OK_AND_ASSIGN(auto buffer, device(0).Allocate(kBytes));
  auto* f = static_cast<float*>(buffer->data());
  for (size_t i = 0; i < kCount; ++i) f[i] = static_cast<float>(i);
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());
  const auto start = std::chrono::steady_clock::now();
  KZ_ASSERT_OK(stream->Scale(f, f, kCount, DataType::kFloat32, 4));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  const auto took = std::chrono::steady_clock::now() - start;
  const auto floor = std::chrono::duration<double>(static_cast<double>(kBytes) / (kGbps * 1e9));
  EXPECT_GE(took, floor) << "a scale of " << kBytes << " bytes finished faster than " << kGbps << " GB/s";
  EXPECT_EQ(f[kCount - 1], static_cast<float>(kCount - 1) / 4.0f);
}

}  // namespace
}  // namespace kizuna::device::conformance
