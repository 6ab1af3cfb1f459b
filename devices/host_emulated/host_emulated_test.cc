// Behaviour specific to the emulated backend: fault injection, memory budget, throttles, pointer
// checks, event waits across devices, timeouts, stream teardown, memfd export. The generic
// dtype x op semantics are the device conformance suite's job (tests/conformance/device/).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/device/exported_memory.h"
#include "runtime/device/registry.h"

namespace kizuna::host_emulated {
namespace {

using device::Backend;
using device::Buffer;
using device::Device;
using device::Event;
using device::ExportedMemory;
using device::Stream;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

testing::AssertionResult HasCode(const Status& s, StatusCode code) {
  if (s.code() == code) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "expected " << StatusCodeName(code) << ", got " << s.ToString();
}

testing::AssertionResult Mentions(const Status& s, const std::string& text) {
  if (s.message().find(text) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << s.ToString() << "' does not mention '" << text << "'";
}

double MillisecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Holds a host callback (and so its stream) until opened. Its own wait is bounded so that a
// failing test can never hang.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A backend built from the test's own Config (which must outlive it: hence one object).
class Emu {
 public:
  explicit Emu(Config config) : config_(std::move(config)) {
    auto r = CreateHostEmulatedBackend(config_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) backend_ = std::move(r).value();
  }
  Device& dev(int i) { return *backend_->device(i); }
  Backend& backend() { return *backend_; }

  std::unique_ptr<Buffer> Alloc(int device, size_t bytes) {
    auto r = dev(device).Allocate(bytes);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<Stream> NewStream(int device) {
    auto r = dev(device).CreateStream();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<Event> NewEvent(int device) {
    auto r = dev(device).CreateEvent();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

 private:
  Config config_;
  std::unique_ptr<Backend> backend_;
};

Config SmallConfig() {
  Config c;
  c.emulated_devices = 2;
  c.timeout_s = 10;
  return c;
}

uint8_t* Bytes(const std::unique_ptr<Buffer>& b) { return static_cast<uint8_t*>(b->data()); }

// ---- Registration and properties ----

TEST(HostEmulatedBackend, IsRegisteredAsBuiltIn) {
  bool found = false;
  for (const auto& reg : device::RegisteredDeviceBackends()) {
    if (reg.name != "host_emulated") continue;
    found = true;
    EXPECT_FALSE(reg.needs_hardware);
  }
  EXPECT_TRUE(found) << "the registration in backend.cc was dropped by the linker";
}

TEST(HostEmulatedBackend, ZeroDevicesIsUnavailable) {
  const Config config = ParseConfig({{"KIZUNA_EMULATED_DEVICES", "0"}}).config;
  auto r = CreateHostEmulatedBackend(config);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(HasCode(r.status(), StatusCode::kUnavailable));
  EXPECT_TRUE(Mentions(r.status(), "disabled by KIZUNA_EMULATED_DEVICES=0"));

  // The registry records it as unavailable (a skip, not a failure).
  auto registry = device::DeviceRegistry::Create(config);
  EXPECT_EQ(registry->Find("host_emulated"), nullptr);
  bool slot_found = false;
  for (const auto& slot : registry->backends()) {
    if (slot.name != "host_emulated") continue;
    slot_found = true;
    EXPECT_TRUE(HasCode(slot.status, StatusCode::kUnavailable));
  }
  EXPECT_TRUE(slot_found);

  Config negative;
  negative.emulated_devices = -1;
  EXPECT_TRUE(HasCode(CreateHostEmulatedBackend(negative).status(), StatusCode::kInvalidArgument));
}

TEST(HostEmulatedBackend, PropertiesAndHostWideUuids) {
  Config c;
  c.emulated_devices = 3;
  c.emu_mem_bytes = 1 << 20;
  c.emu_copy_gbps = 2.5;
  c.emu_reduce_gbps = 1.5;
  c.emu_launch_us = 7;
  Emu a(c), b(c);
  ASSERT_EQ(a.backend().device_count(), 3);
  EXPECT_EQ(a.backend().name(), "host_emulated");
  EXPECT_EQ(a.backend().device(3), nullptr);
  EXPECT_EQ(a.backend().device(-1), nullptr);
  std::set<std::string> uuids;
  for (int i = 0; i < 3; ++i) {
    const auto& p = a.dev(i).properties();
    EXPECT_EQ(p.backend, "host_emulated");
    EXPECT_EQ(p.index, i);
    EXPECT_EQ(p.name, "emulated accelerator " + std::to_string(i));
    EXPECT_EQ(p.uuid.rfind("emu-", 0), 0u) << p.uuid;
    EXPECT_EQ(p.uuid.substr(p.uuid.size() - 2), "-" + std::to_string(i)) << p.uuid;
    // Another instance (as in another process on this host) sees the same device identity.
    EXPECT_EQ(p.uuid, b.dev(i).properties().uuid);
    uuids.insert(p.uuid);
    EXPECT_EQ(p.memory_bytes, uint64_t{1} << 20);
    EXPECT_DOUBLE_EQ(p.copy_gbps, 2.5);
    EXPECT_DOUBLE_EQ(p.reduce_gbps, 1.5);
    EXPECT_DOUBLE_EQ(p.launch_latency_us, 7);
    EXPECT_TRUE(p.host_accessible);
    EXPECT_TRUE(p.export_fd);
    EXPECT_FALSE(p.export_opaque);
    EXPECT_EQ(a.dev(i).label(), "host_emulated:" + std::to_string(i));
  }
  EXPECT_EQ(uuids.size(), 3u);

  Emu unthrottled(SmallConfig());
  const auto& p = unthrottled.dev(0).properties();
  EXPECT_GT(p.memory_bytes, uint64_t{0});  // the host's physical memory
  EXPECT_EQ(p.copy_gbps, 0);
  EXPECT_EQ(p.reduce_gbps, 0);
  EXPECT_EQ(p.launch_latency_us, 0);
}

// ---- Memory ----

TEST(HostEmulatedMemory, ZeroByteAllocation) {
  Emu emu(SmallConfig());
  auto empty = emu.Alloc(0, 0);
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_FALSE(empty->imported());
  EXPECT_TRUE(HasCode(emu.dev(0).Export(*empty).status(), StatusCode::kInvalidArgument));
  auto stream = emu.NewStream(0);
  EXPECT_TRUE(stream->Copy(empty->data(), empty->data(), 0).ok());  // nothing to do
  EXPECT_TRUE(stream->Synchronize().ok());
}

TEST(HostEmulatedMemory, BudgetExhaustionIsOutOfMemory) {
  Config c = SmallConfig();
  c.emu_mem_bytes = 1 << 20;
  Emu emu(c);
  auto full = emu.Alloc(0, 1 << 20);
  ASSERT_NE(full, nullptr);

  auto over = emu.dev(0).Allocate(1);
  ASSERT_FALSE(over.ok());
  EXPECT_TRUE(HasCode(over.status(), StatusCode::kOutOfMemory));
  EXPECT_TRUE(Mentions(over.status(), "host_emulated:0"));
  EXPECT_TRUE(Mentions(over.status(), "1 bytes requested"));
  EXPECT_TRUE(Mentions(over.status(), "0 of 1048576 bytes free"));

  // The budget is per device.
  auto other = emu.Alloc(1, 1 << 20);
  EXPECT_NE(other, nullptr);

  // A request no host could satisfy is an error value, not a crash.
  auto huge = emu.dev(1).Allocate(SIZE_MAX);
  EXPECT_TRUE(HasCode(huge.status(), StatusCode::kOutOfMemory));

  // Freeing returns the bytes.
  full.reset();
  auto again = emu.Alloc(0, 1 << 19);
  EXPECT_NE(again, nullptr);
  auto rest = emu.Alloc(0, 1 << 19);
  EXPECT_NE(rest, nullptr);
  EXPECT_TRUE(HasCode(emu.dev(0).Allocate(1).status(), StatusCode::kOutOfMemory));
}

TEST(HostEmulatedMemory, InjectedAllocationFailureHitsOnlyTheKth) {
  Config c = SmallConfig();
  c.emu_fail_alloc = 3;
  Emu emu(c);
  // Numbered across the backend's devices: 0, 1, 0 (fails), 1, 0.
  const int devices[] = {0, 1, 0, 1, 0};
  for (int n = 1; n <= 5; ++n) {
    auto r = emu.dev(devices[n - 1]).Allocate(4096);
    if (n == 3) {
      ASSERT_FALSE(r.ok());
      EXPECT_TRUE(HasCode(r.status(), StatusCode::kOutOfMemory));
      EXPECT_TRUE(Mentions(r.status(), "injected fault: allocation #3"));
    } else {
      EXPECT_TRUE(r.ok()) << "allocation #" << n << ": " << r.status().ToString();
    }
  }
}

TEST(HostEmulatedMemory, AddressableOnlyForThisBackendsLiveMemory) {
  Emu emu(SmallConfig());
  Emu stranger(SmallConfig());
  auto a = emu.Alloc(0, 4096);
  auto b = emu.Alloc(1, 4096);
  auto foreign = stranger.Alloc(0, 4096);
  const Device& d0 = emu.dev(0);
  EXPECT_TRUE(d0.Addressable(a->data(), 4096));
  EXPECT_TRUE(d0.Addressable(Bytes(a) + 4095, 1));
  EXPECT_FALSE(d0.Addressable(a->data(), 4097));
  EXPECT_FALSE(d0.Addressable(Bytes(a) - 1, 2));
  EXPECT_TRUE(d0.Addressable(b->data(), 4096));  // a peer device of the same backend
  EXPECT_FALSE(d0.Addressable(foreign->data(), 4096));
  std::vector<uint8_t> host(4096);
  EXPECT_FALSE(d0.Addressable(host.data(), host.size()));
  void* freed = a->data();
  a.reset();
  EXPECT_FALSE(d0.Addressable(freed, 1));
}

TEST(HostEmulatedMemory, ExportImportWithUnalignedOffset) {
  Config c = SmallConfig();
  c.emu_mem_bytes = 3 * 4096 + 17;
  Emu emu(c);
  auto buf = emu.Alloc(0, 3 * 4096 + 17);
  for (size_t i = 0; i < buf->size(); ++i) Bytes(buf)[i] = static_cast<uint8_t>(i * 7);

  auto exported = emu.dev(0).Export(*buf, 4096 + 100, 5000);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->kind, device::ExportKind::kFd);
  EXPECT_EQ(exported->offset, 4096u + 100);
  EXPECT_EQ(exported->size, 5000u);
  EXPECT_EQ(exported->device_uuid, emu.dev(0).properties().uuid);

  // Imported on the same (full) device: imports do not count against the budget.
  auto imported = emu.dev(0).Import(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  std::unique_ptr<Buffer> view = std::move(imported).value();
  exported = Result<ExportedMemory>(Internal("dropped"));  // the view keeps its own mapping
  EXPECT_TRUE(view->imported());
  EXPECT_EQ(view->size(), 5000u);
  EXPECT_EQ(Bytes(view)[0], Bytes(buf)[4096 + 100]);
  EXPECT_EQ(Bytes(view)[4999], Bytes(buf)[4096 + 100 + 4999]);
  Bytes(view)[10] = 0xEE;  // the same pages
  EXPECT_EQ(Bytes(buf)[4096 + 110], 0xEE);

  // The imported range is usable in stream operations, and only that range.
  EXPECT_TRUE(emu.dev(1).Addressable(view->data(), 5000));
  EXPECT_FALSE(emu.dev(1).Addressable(view->data(), 5001));
  auto stream = emu.NewStream(1);
  ASSERT_TRUE(stream->Copy(view->data(), Bytes(buf) + 0, 64).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(Bytes(buf) + 4096 + 100, Bytes(buf), 64), 0);
  void* mapped = view->data();
  view.reset();
  EXPECT_FALSE(emu.dev(1).Addressable(mapped, 1));
}

TEST(HostEmulatedMemory, ImportRejectsBadExports) {
  Emu emu(SmallConfig());
  auto buf = emu.Alloc(0, 8192);
  auto good = emu.dev(0).Export(*buf);
  ASSERT_TRUE(good.ok());

  // The memfd is sealed: an importer cannot shrink it under the exporter.
  EXPECT_NE(ftruncate(good->fd.get(), 4096), 0);

  ExportedMemory too_long;
  too_long.fd = UniqueFd(dup(good->fd.get()));
  too_long.backend = "host_emulated";
  too_long.offset = 4096;
  too_long.size = 8192;
  auto r = emu.dev(1).Import(too_long);
  EXPECT_TRUE(HasCode(r.status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(Mentions(r.status(), "exceeds"));

  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd pipe_write(pipe_fds[1]);
  ExportedMemory not_memory;
  not_memory.fd = UniqueFd(pipe_fds[0]);
  not_memory.backend = "host_emulated";
  not_memory.size = 4096;
  EXPECT_TRUE(HasCode(emu.dev(1).Import(not_memory).status(), StatusCode::kInvalidArgument));

  ExportedMemory opaque;
  opaque.kind = device::ExportKind::kOpaque;
  opaque.opaque = {1, 2, 3};
  opaque.backend = "host_emulated";
  opaque.size = 4096;
  EXPECT_TRUE(HasCode(emu.dev(1).Import(opaque).status(), StatusCode::kInvalidArgument));
}

TEST(HostEmulatedMemory, ExportIsSharedWithAnotherProcess) {
  Emu emu(SmallConfig());
  auto buf = emu.Alloc(0, 2 * 4096);
  std::memset(buf->data(), 0, buf->size());
  auto exported = emu.dev(0).Export(*buf, 4096, 4096);
  ASSERT_TRUE(exported.ok());
  const int fd = exported->fd.get();

  // The child only makes system calls (the parent has threads): map the fd, write, exit.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4096);
    if (p == MAP_FAILED) _exit(1);
    static_cast<uint8_t*>(p)[5] = 0xAB;
    _exit(0);
  }
  int wstatus = 0;
  pid_t done = 0;
  for (int i = 0; i < 10000 && done == 0; ++i) {
    done = waitpid(child, &wstatus, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_EQ(done, child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  EXPECT_EQ(Bytes(buf)[4096 + 5], 0xAB);

  // And through the device layer's fd passing (SCM_RIGHTS), as another process would receive it.
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd tx(sv[0]), rx(sv[1]);
  ASSERT_TRUE(device::SendExportedMemory(tx.get(), *exported, Deadline::AfterSeconds(5)).ok());
  auto received = device::ReceiveExportedMemory(rx.get(), Deadline::AfterSeconds(5));
  ASSERT_TRUE(received.ok()) << received.status().ToString();
  auto imported = emu.dev(1).Import(*received);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  EXPECT_EQ(static_cast<uint8_t*>((*imported)->data())[5], 0xAB);
}

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

}  // namespace
}  // namespace kizuna::host_emulated

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
