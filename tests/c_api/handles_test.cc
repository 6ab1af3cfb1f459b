// The C API's handles (kizuna.h, "Handles"): a destroyed communicator or stream, a double
// destroy, another kind's handle, a stray value, freed memory: each is refused with
// kzInvalidArgument and a message saying which, never dereferenced; a destroy racing with calls
// on another thread finishes them safely; a lookup costs nanoseconds.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/kizuna.h"

namespace {

constexpr size_t kCount = 256;

testing::AssertionResult Refused(kzResult_t r, const std::string& text) {
  const std::string last = kzGetLastError();
  if (r != kzInvalidArgument)
    return testing::AssertionFailure() << "returned " << kzGetErrorString(r) << " (last error '" << last << "')";
  if (last.find(text) == std::string::npos)
    return testing::AssertionFailure() << "last error '" << last << "' does not say '" << text << "'";
  return testing::AssertionSuccess();
}

// One rank on one emulated device, with a stream and a buffer.
struct OneRank {
  kzComm_t comm = nullptr;
  kzDevice_t device = nullptr;
  kzStream_t stream = nullptr;
  float* buf = nullptr;

  explicit OneRank(int device_index = 0) {
    const int devlist[1] = {device_index};
    EXPECT_EQ(kzCommInitAll(&comm, 1, devlist), kzSuccess) << kzGetLastError();
    EXPECT_EQ(kzCommDevice(comm, &device), kzSuccess) << kzGetLastError();
    EXPECT_EQ(kzStreamCreate(device, &stream), kzSuccess) << kzGetLastError();
    EXPECT_EQ(kzMalloc(device, kCount * sizeof(float), reinterpret_cast<void**>(&buf)), kzSuccess) << kzGetLastError();
  }
  // Whatever the test left live; refusals of what it already destroyed are expected.
  ~OneRank() {
    kzFree(device, buf);
    kzStreamDestroy(stream);
    kzCommDestroy(comm);
  }
};

// Every call that takes a communicator, given `comm`: each must return kzInvalidArgument saying
// `text`.
void ExpectEveryCommCallRefused(kzComm_t comm, kzStream_t stream, float* buf, const std::string& text) {
  int n = 0;
  kzDevice_t d = nullptr;
  kzResult_t async = kzSuccess;
  kzComm_t split = nullptr;
  EXPECT_TRUE(Refused(kzCommCount(comm, &n), text)) << "kzCommCount";
  EXPECT_TRUE(Refused(kzCommUserRank(comm, &n), text)) << "kzCommUserRank";
  EXPECT_TRUE(Refused(kzCommDevice(comm, &d), text)) << "kzCommDevice";
  EXPECT_TRUE(Refused(kzCommGetAsyncError(comm, &async), text)) << "kzCommGetAsyncError";
  EXPECT_TRUE(Refused(kzCommSplit(comm, 0, 0, &split), text)) << "kzCommSplit";
  EXPECT_TRUE(Refused(kzCommShrink(comm, nullptr, 0, &split, nullptr, KZ_SHRINK_ABORT), text)) << "kzCommShrink";
  EXPECT_TRUE(Refused(kzCommRevoke(comm, 0), text)) << "kzCommRevoke";
  EXPECT_TRUE(Refused(kzCommReweigh(comm), text)) << "kzCommReweigh";
  EXPECT_TRUE(Refused(kzAllReduce(buf, buf, kCount, kzFloat32, kzSum, comm, stream), text)) << "kzAllReduce";
  EXPECT_TRUE(Refused(kzBroadcast(buf, buf, kCount, kzFloat32, 0, comm, stream), text)) << "kzBroadcast";
  EXPECT_TRUE(Refused(kzReduce(buf, buf, kCount, kzFloat32, kzSum, 0, comm, stream), text)) << "kzReduce";
  EXPECT_TRUE(Refused(kzAllGather(buf, buf, kCount, kzFloat32, comm, stream), text)) << "kzAllGather";
  EXPECT_TRUE(Refused(kzReduceScatter(buf, buf, kCount, kzFloat32, kzSum, comm, stream), text)) << "kzReduceScatter";
  EXPECT_TRUE(Refused(kzAllToAll(buf, buf, kCount, kzFloat32, comm, stream), text)) << "kzAllToAll";
  EXPECT_TRUE(Refused(kzSend(buf, kCount, kzFloat32, 0, comm, stream), text)) << "kzSend";
  EXPECT_TRUE(Refused(kzRecv(buf, kCount, kzFloat32, 0, comm, stream), text)) << "kzRecv";
  EXPECT_TRUE(Refused(kzBarrier(comm, stream), text)) << "kzBarrier";
  EXPECT_TRUE(Refused(kzCommAbort(comm), text)) << "kzCommAbort";
  EXPECT_TRUE(Refused(kzCommDestroy(comm), text)) << "kzCommDestroy";
}

// kzFree of a buffer an AllReduce still waits to use (its peer has not called yet) waits for it,
// as cudaFree would: the operation completes on intact memory.
TEST(CApiHandles, FreeDuringAnOperationWaitsForIt) {
  const int devlist[2] = {0, 1};
  kzComm_t comms[2] = {};
  ASSERT_EQ(kzCommInitAll(comms, 2, devlist), kzSuccess) << kzGetLastError();
  kzDevice_t devices[2] = {};
  kzStream_t streams[2] = {};
  float* bufs[2] = {};
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(kzCommDevice(comms[r], &devices[r]), kzSuccess) << kzGetLastError();
    ASSERT_EQ(kzStreamCreate(devices[r], &streams[r]), kzSuccess) << kzGetLastError();
    ASSERT_EQ(kzMalloc(devices[r], 1 << 20, reinterpret_cast<void**>(&bufs[r])), kzSuccess) << kzGetLastError();
  }
  const size_t count = (1 << 20) / sizeof(float);
  for (int r = 0; r < 2; ++r) {
    std::vector<float> values(count, static_cast<float>(r + 1));
    std::memcpy(bufs[r], values.data(), values.size() * sizeof(float));  // emulated memory the CPU reaches
  }
  ASSERT_EQ(kzAllReduce(bufs[0], bufs[0], count, kzFloat32, kzSum, comms[0], streams[0]), kzSuccess);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(kzAllReduce(bufs[1], bufs[1], count, kzFloat32, kzSum, comms[1], streams[1]), kzSuccess);
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(kzFree(devices[0], bufs[0]), kzSuccess) << kzGetLastError();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  late.join();
  EXPECT_GT(waited, 0.2) << "kzFree did not wait for the AllReduce that uses the buffer";
  ASSERT_EQ(kzStreamSynchronize(streams[1]), kzSuccess) << kzGetLastError();
  EXPECT_EQ(bufs[1][0], 3.0f);
  EXPECT_EQ(bufs[1][count - 1], 3.0f);
  EXPECT_EQ(kzFree(devices[1], bufs[1]), kzSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(kzStreamDestroy(streams[r]), kzSuccess);
    EXPECT_EQ(kzCommDestroy(comms[r]), kzSuccess);
  }
}

// kzCommRevoke and kzCommShrink: bad arguments are refused naming them; rank 2 revokes, and ranks
// 0 and 1 shrink it away and sum exactly.
TEST(CApiHandles, RevokeAndShrink) {
  const int devlist[3] = {0, 1, 0};  // the test's two emulated devices
  kzComm_t comms[3] = {};
  ASSERT_EQ(kzCommInitAll(comms, 3, devlist), kzSuccess) << kzGetLastError();
  kzComm_t shrunk[2] = {};
  const int lost[1] = {2};
  EXPECT_TRUE(Refused(kzCommShrink(comms[0], lost, 1, nullptr, nullptr, KZ_SHRINK_ABORT), "newcomm is NULL"));
  EXPECT_TRUE(Refused(kzCommShrink(comms[0], lost, -1, &shrunk[0], nullptr, KZ_SHRINK_ABORT), "exclude_count is -1"));
  EXPECT_TRUE(
      Refused(kzCommShrink(comms[0], nullptr, 1, &shrunk[0], nullptr, KZ_SHRINK_ABORT), "exclude_ranks is NULL"));
  EXPECT_TRUE(Refused(kzCommShrink(comms[0], lost, 1, &shrunk[0], nullptr, 7), "flags is 7"));
  kzConfig_t config = KZ_CONFIG_INITIALIZER;
  config.blocking = 0;
  EXPECT_TRUE(Refused(kzCommShrink(comms[0], lost, 1, &shrunk[0], &config, KZ_SHRINK_ABORT), "blocking"));
  EXPECT_TRUE(Refused(kzCommRevoke(comms[0], 1), "flags is 1"));
  const int self[1] = {0};
  EXPECT_TRUE(Refused(kzCommShrink(comms[0], self, 1, &shrunk[0], nullptr, KZ_SHRINK_ABORT), "excludes itself"));
  ASSERT_EQ(kzCommRevoke(comms[2], 0), kzSuccess) << kzGetLastError();
  std::vector<std::thread> threads;
  kzResult_t results[2] = {kzInternalError, kzInternalError};
  for (int r = 0; r < 2; ++r)
    threads.emplace_back(
        [&, r] { results[r] = kzCommShrink(comms[r], lost, 1, &shrunk[r], nullptr, KZ_SHRINK_ABORT); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(results[r], kzSuccess) << "rank " << r;
  kzStream_t streams[2] = {};
  kzDevice_t devices[2] = {};
  float* bufs[2] = {};
  for (int r = 0; r < 2; ++r) {
    int n = 0, rank = -1;
    EXPECT_EQ(kzCommCount(shrunk[r], &n), kzSuccess);
    EXPECT_EQ(kzCommUserRank(shrunk[r], &rank), kzSuccess);
    EXPECT_EQ(n, 2);
    EXPECT_EQ(rank, r);
    ASSERT_EQ(kzCommDevice(shrunk[r], &devices[r]), kzSuccess) << kzGetLastError();
    ASSERT_EQ(kzStreamCreate(devices[r], &streams[r]), kzSuccess) << kzGetLastError();
    ASSERT_EQ(kzMalloc(devices[r], kCount * sizeof(float), reinterpret_cast<void**>(&bufs[r])), kzSuccess);
    for (size_t k = 0; k < kCount; ++k) bufs[r][k] = static_cast<float>(r + 1);  // memory the CPU reaches
  }
  for (int r = 0; r < 2; ++r)
    ASSERT_EQ(kzAllReduce(bufs[r], bufs[r], kCount, kzFloat32, kzSum, shrunk[r], streams[r]), kzSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(kzStreamSynchronize(streams[r]), kzSuccess) << kzGetLastError();
    EXPECT_EQ(bufs[r][0], 3.0f);
    EXPECT_EQ(bufs[r][kCount - 1], 3.0f);
    EXPECT_EQ(kzFree(devices[r], bufs[r]), kzSuccess);
    EXPECT_EQ(kzStreamDestroy(streams[r]), kzSuccess);
    EXPECT_EQ(kzCommDestroy(shrunk[r]), kzSuccess);
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(kzCommDestroy(comms[r]), kzSuccess);
}

TEST(CApiHandles, DestroyedCommunicatorIsRefusedByEveryCallAndDestroyTwiceToo) {
  OneRank r;
  ASSERT_EQ(kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, r.stream), kzSuccess) << kzGetLastError();
  ASSERT_EQ(kzStreamSynchronize(r.stream), kzSuccess) << kzGetLastError();
  ASSERT_EQ(kzCommDestroy(r.comm), kzSuccess) << kzGetLastError();
  ExpectEveryCommCallRefused(r.comm, r.stream, r.buf, "communicator handle");
  EXPECT_TRUE(Refused(kzCommDestroy(r.comm), "was destroyed"));
  // The stream and the memory are untouched by the refusals.
  EXPECT_EQ(kzStreamSynchronize(r.stream), kzSuccess) << kzGetLastError();
}

TEST(CApiHandles, AbortedCommunicatorIsRefusedLikeADestroyedOne) {
  OneRank r;
  ASSERT_EQ(kzCommAbort(r.comm), kzSuccess) << kzGetLastError();
  EXPECT_TRUE(Refused(kzCommAbort(r.comm), "was destroyed"));
  ExpectEveryCommCallRefused(r.comm, r.stream, r.buf, "was destroyed");
}

TEST(CApiHandles, DestroyedStreamIsRefusedAndDestroyTwiceToo) {
  OneRank r;
  ASSERT_EQ(kzStreamDestroy(r.stream), kzSuccess) << kzGetLastError();
  EXPECT_TRUE(Refused(kzStreamSynchronize(r.stream), "stream handle"));
  EXPECT_TRUE(Refused(kzStreamSynchronize(r.stream), "was destroyed"));
  EXPECT_TRUE(Refused(kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, r.stream), "was destroyed"));
  EXPECT_TRUE(Refused(kzBarrier(r.comm, r.stream), "stream handle"));
  EXPECT_TRUE(Refused(kzStreamDestroy(r.stream), "was destroyed"));
  // The communicator still works on a new stream.
  kzStream_t fresh = nullptr;
  ASSERT_EQ(kzStreamCreate(r.device, &fresh), kzSuccess) << kzGetLastError();
  EXPECT_EQ(kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, fresh), kzSuccess) << kzGetLastError();
  EXPECT_EQ(kzStreamSynchronize(fresh), kzSuccess) << kzGetLastError();
  EXPECT_EQ(kzStreamDestroy(fresh), kzSuccess) << kzGetLastError();
}

TEST(CApiHandles, AReusedSlotStillRefusesTheOldHandle) {
  kzComm_t old = nullptr;
  {
    OneRank first;
    old = first.comm;
  }                // destroyed
  OneRank second;  // may take the same slot, with a new generation
  int n = 0;
  EXPECT_TRUE(Refused(kzCommCount(old, &n), "was destroyed"));
  EXPECT_TRUE(Refused(kzCommDestroy(old), "was destroyed"));
  ASSERT_EQ(kzCommCount(second.comm, &n), kzSuccess) << kzGetLastError();
  EXPECT_EQ(n, 1);
  EXPECT_EQ(kzAllReduce(second.buf, second.buf, kCount, kzFloat32, kzSum, second.comm, second.stream), kzSuccess)
      << kzGetLastError();
  EXPECT_EQ(kzStreamSynchronize(second.stream), kzSuccess) << kzGetLastError();
}

TEST(CApiHandles, ValuesThatAreNotHandlesAreRefusedWithoutBeingDereferenced) {
  OneRank r;
  int not_a_handle = 7;
  int n = 0;
  const std::vector<kzComm_t> bogus = {
      reinterpret_cast<kzComm_t>(&not_a_handle),          // a real address
      reinterpret_cast<kzComm_t>(uintptr_t{0xdeadbeef}),  // garbage
      reinterpret_cast<kzComm_t>(uintptr_t{0x10}),        // a small integer
      // A communicator's kind byte, with a slot far beyond any made, and with a generation
      // never issued for slot 0.
      reinterpret_cast<kzComm_t>((uintptr_t{1} << 32) | (uintptr_t{0xfffff0} << 8) |
                                 (reinterpret_cast<uintptr_t>(r.comm) & 0xff)),
      reinterpret_cast<kzComm_t>((uintptr_t{0xfffffff0} << 32) | (reinterpret_cast<uintptr_t>(r.comm) & 0xff)),
  };
  for (kzComm_t c : bogus) {
    SCOPED_TRACE(reinterpret_cast<uintptr_t>(c));
    ExpectEveryCommCallRefused(c, r.stream, r.buf, "is not a communicator");
  }
  // Another kind's handle, each way round.
  EXPECT_TRUE(Refused(kzCommCount(reinterpret_cast<kzComm_t>(r.stream), &n), "it is a stream handle"));
  EXPECT_TRUE(Refused(kzStreamSynchronize(reinterpret_cast<kzStream_t>(r.comm)), "is not a stream handle"));
  EXPECT_TRUE(Refused(kzStreamDestroy(reinterpret_cast<kzStream_t>(&not_a_handle)), "is not a stream handle"));
  EXPECT_TRUE(
      Refused(kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, reinterpret_cast<kzStream_t>(r.device)),
              "it is a device handle"));
  // Devices.
  void* p = nullptr;
  kzStream_t s = nullptr;
  const kzDevice_t bad_device = reinterpret_cast<kzDevice_t>(&not_a_handle);
  EXPECT_TRUE(Refused(kzMalloc(bad_device, 64, &p), "is not a device handle"));
  EXPECT_TRUE(Refused(kzStreamCreate(bad_device, &s), "is not a device handle"));
  EXPECT_TRUE(Refused(kzFree(bad_device, r.buf), "is not a device handle"));
  EXPECT_STREQ(kzDeviceName(bad_device), "(not a device)");
  EXPECT_STRNE(kzDeviceName(r.device), "(not a device)");
  // NULL: refused, except by the destroys.
  EXPECT_TRUE(Refused(kzCommCount(nullptr, &n), "comm is NULL"));
  EXPECT_TRUE(Refused(kzStreamSynchronize(nullptr), "stream is NULL"));
  EXPECT_EQ(kzCommDestroy(nullptr), kzSuccess);
  EXPECT_EQ(kzStreamDestroy(nullptr), kzSuccess);
  // Everything real still works.
  EXPECT_EQ(kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, r.stream), kzSuccess) << kzGetLastError();
  EXPECT_EQ(kzStreamSynchronize(r.stream), kzSuccess) << kzGetLastError();
}

TEST(CApiHandles, FreeOfFreedForeignOrOtherDevicesMemoryIsRefused) {
  int ndev = 0;
  ASSERT_EQ(kzDeviceCount(&ndev), kzSuccess) << kzGetLastError();
  ASSERT_GE(ndev, 2) << "KIZUNA_EMULATED_DEVICES (BUILD) gives two devices";
  kzDevice_t d0 = nullptr, d1 = nullptr;
  ASSERT_EQ(kzDeviceGet(0, &d0), kzSuccess);
  ASSERT_EQ(kzDeviceGet(1, &d1), kzSuccess);
  void* p = nullptr;
  ASSERT_EQ(kzMalloc(d0, 4096, &p), kzSuccess) << kzGetLastError();
  EXPECT_TRUE(Refused(kzFree(d1, p), "not on"));
  EXPECT_EQ(kzFree(d0, p), kzSuccess) << kzGetLastError();
  EXPECT_TRUE(Refused(kzFree(d0, p), "freed already"));
  int on_the_stack = 0;
  EXPECT_TRUE(Refused(kzFree(d0, &on_the_stack), "is not memory of kzMalloc"));
  EXPECT_EQ(kzFree(d0, nullptr), kzSuccess);
}

// kzCommInitFromEnv's communicator owns its device (it made the device registry): its streams and
// memory keep the device after the communicator's handle is destroyed, and once they are gone the
// device's handle is refused, saying why.
TEST(CApiHandles, AnEnvironmentCommunicatorsDeviceLivesWhileItsStreamsAndMemoryDo) {
  kzComm_t comm = nullptr;
  if (kzCommInitFromEnv(&comm) != kzSuccess)
    GTEST_SKIP() << "no communicator from the environment: " << kzGetLastError();
  kzDevice_t device = nullptr;
  kzStream_t stream = nullptr;
  void* p = nullptr;
  ASSERT_EQ(kzCommDevice(comm, &device), kzSuccess) << kzGetLastError();
  ASSERT_EQ(kzStreamCreate(device, &stream), kzSuccess) << kzGetLastError();
  ASSERT_EQ(kzMalloc(device, 4096, &p), kzSuccess) << kzGetLastError();
  ASSERT_EQ(kzCommDestroy(comm), kzSuccess) << kzGetLastError();
  int n = 0;
  EXPECT_TRUE(Refused(kzCommCount(comm, &n), "was destroyed"));
  EXPECT_STRNE(kzDeviceName(device), "(not a device)");
  EXPECT_EQ(kzStreamSynchronize(stream), kzSuccess) << kzGetLastError();
  EXPECT_EQ(kzStreamDestroy(stream), kzSuccess) << kzGetLastError();
  EXPECT_EQ(kzFree(device, p), kzSuccess) << kzGetLastError();
  EXPECT_TRUE(Refused(kzMalloc(device, 4096, &p), "belonged to a communicator of kzCommInitFromEnv"));
  EXPECT_STREQ(kzDeviceName(device), "(not a device)");
}

// A destroy on one thread while another keeps calling with the handle: the calls in flight finish
// with the object, later ones are refused; nothing crashes.
TEST(CApiHandles, DestroyRacingWithCallsOnAnotherThreadIsSafe) {
  for (int round = 0; round < 8; ++round) {
    OneRank r(round % 2);
    std::atomic<bool> started{false};
    kzResult_t first_refusal = kzSuccess;
    std::string refusal_text;
    int calls = 0;
    std::thread caller([&] {
      for (;;) {
        int n = 0;
        kzResult_t res = kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, r.stream);
        if (res == kzSuccess) res = kzCommCount(r.comm, &n);
        if (res == kzSuccess) res = kzStreamSynchronize(r.stream);
        if (res != kzSuccess) {
          first_refusal = res;
          refusal_text = kzGetLastError();
          return;
        }
        ++calls;
        started = true;
      }
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
    EXPECT_EQ(kzCommDestroy(r.comm), kzSuccess) << kzGetLastError();
    caller.join();
    EXPECT_EQ(first_refusal, kzInvalidArgument) << refusal_text;
    EXPECT_NE(refusal_text.find("was destroyed"), std::string::npos) << refusal_text;
    EXPECT_GT(calls, 0);
  }
}

TEST(CApiHandles, StreamDestroyRacingWithCallsOnAnotherThreadIsSafe) {
  for (int round = 0; round < 8; ++round) {
    OneRank r;
    std::atomic<bool> started{false};
    std::string refusal_text;
    std::thread caller([&] {
      for (;;) {
        kzResult_t res = kzAllReduce(r.buf, r.buf, kCount, kzFloat32, kzSum, r.comm, r.stream);
        if (res == kzSuccess) res = kzStreamSynchronize(r.stream);
        if (res != kzSuccess) {
          refusal_text = kzGetLastError();
          return;
        }
        started = true;
      }
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(200 * round));
    EXPECT_EQ(kzStreamDestroy(r.stream), kzSuccess) << kzGetLastError();
    caller.join();
    EXPECT_NE(refusal_text.find("stream handle"), std::string::npos) << refusal_text;
    EXPECT_NE(refusal_text.find("was destroyed"), std::string::npos) << refusal_text;
  }
}

// Several threads destroy one handle at once: exactly one succeeds.
TEST(CApiHandles, ConcurrentDestroysOfOneHandleSucceedOnce) {
  for (int round = 0; round < 8; ++round) {
    OneRank r;
    std::atomic<int> successes{0}, refusals{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        while (!go) std::this_thread::yield();
        const kzResult_t res = kzCommDestroy(r.comm);
        if (res == kzSuccess) ++successes;
        if (res == kzInvalidArgument && std::string(kzGetLastError()).find("was destroyed") != std::string::npos)
          ++refusals;
      });
    }
    go = true;
    for (auto& t : threads) t.join();
    EXPECT_EQ(successes.load(), 1);
    EXPECT_EQ(refusals.load(), 3);
  }
}

// A call's lookup is an array index and a shared_ptr copy under the slot's lock: kzCommCount, which
// does nothing else, costs well under a microsecond (about 20-60 ns on the build machines).
TEST(CApiHandles, LookupCostsNanoseconds) {
  OneRank r;
  constexpr int kCalls = 200000;
  int n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) ASSERT_EQ(kzCommCount(r.comm, &n), kzSuccess);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kCalls;
  std::printf("kzCommCount: %.1f ns per call\n", ns);
  EXPECT_LT(ns, 1000.0);
}

}  // namespace
