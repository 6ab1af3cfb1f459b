// The emulated backend's memory (memory.h): empty allocations, the per-device budget, allocation
// fault injection, Device::Addressable, memfd export and import (unaligned windows, bad exports,
// sharing with another process), and opaque mode (device addresses the CPU cannot dereference,
// host memory from AllocateHost, export and import between two backend instances).

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "devices/host_emulated/test_util.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/device/exported_memory.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::host_emulated::test {
namespace {

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

  // An unsealed memory file could be truncated under the importer (SIGBUS on the next copy).
  UniqueFd unsealed(memfd_create("kz-unsealed", MFD_CLOEXEC));
  ASSERT_TRUE(unsealed.valid());
  ASSERT_EQ(ftruncate(unsealed.get(), 8192), 0);
  ExportedMemory unsealed_export;
  unsealed_export.fd = std::move(unsealed);
  unsealed_export.backend = "host_emulated";
  unsealed_export.size = 4096;
  auto u = emu.dev(1).Import(unsealed_export);
  EXPECT_TRUE(HasCode(u.status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(Mentions(u.status(), "F_SEAL_SHRINK"));

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

TEST(HostEmulatedMemory, AllocateHostIsDeviceMemoryWhenHostAccessible) {
  Config c = SmallConfig();
  c.emu_mem_bytes = 1 << 20;
  Emu emu(c);
  auto host = emu.AllocHost(0, 1 << 20);
  ASSERT_NE(host, nullptr);
  Bytes(host)[0] = 1;  // the CPU reaches it, as all memory of a host-accessible device
  Bytes(host)[(1 << 20) - 1] = 2;
  EXPECT_TRUE(emu.dev(0).Addressable(host->data(), 1 << 20));
  // Ordinary device memory (Device's default): it took the device's budget.
  EXPECT_TRUE(HasCode(emu.dev(0).Allocate(1).status(), StatusCode::kOutOfMemory));
  EXPECT_TRUE(emu.dev(0).Export(*host).ok());
}

// ---- Opaque mode ----

// Death tests first (GoogleTest runs *DeathTest suites before the others): a CPU access to a
// device address must fault at once, which is what makes opaque mode a real check.
TEST(HostEmulatedOpaqueDeathTest, CpuAccessToDeviceMemoryFaults) {
  Emu emu(OpaqueConfig());
  auto buf = emu.Alloc(0, 3 * 4096 + 5);
  ASSERT_NE(buf, nullptr);
  auto* device_bytes = static_cast<volatile uint8_t*>(buf->data());
  // SIGSEGV exactly: dying of anything else (an abort in the setup) would prove nothing.
  EXPECT_EXIT(device_bytes[0] = 1, testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT(static_cast<void>(device_bytes[3 * 4096 + 4]), testing::KilledBySignal(SIGSEGV), "");

  // An import gets a device address of its own, just as untouchable.
  auto exported = emu.dev(0).Export(*buf, 4096 + 3, 100);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  auto imported = emu.dev(1).Import(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  auto* imported_bytes = static_cast<volatile uint8_t*>((*imported)->data());
  EXPECT_EXIT(static_cast<void>(imported_bytes[0]), testing::KilledBySignal(SIGSEGV), "");

  // Host memory is the CPU's.
  auto host = emu.AllocHost(0, 4096);
  ASSERT_NE(host, nullptr);
  std::memset(host->data(), 0x5A, 4096);
  EXPECT_EQ(Bytes(host)[4095], 0x5A);
}

TEST(HostEmulatedOpaque, AddressableAnswersForDeviceAndHostMemory) {
  Emu emu(OpaqueConfig());
  Emu stranger(OpaqueConfig());
  auto device = emu.Alloc(0, 4096);
  auto host = emu.AllocHost(1, 4096);
  auto foreign = stranger.AllocHost(0, 4096);
  ASSERT_NE(device, nullptr);
  ASSERT_NE(host, nullptr);
  ASSERT_NE(foreign, nullptr);
  EXPECT_FALSE(host->imported());
  for (int d = 0; d < 2; ++d) {
    SCOPED_TRACE(d);
    const Device& dev = emu.dev(d);
    EXPECT_TRUE(dev.Addressable(device->data(), 4096));
    EXPECT_TRUE(dev.Addressable(Bytes(device) + 4095, 1));
    EXPECT_FALSE(dev.Addressable(device->data(), 4097));
    EXPECT_FALSE(dev.Addressable(Bytes(device) - 1, 2));
    EXPECT_TRUE(dev.Addressable(host->data(), 4096));  // host memory of any device of the instance
    EXPECT_FALSE(dev.Addressable(host->data(), 4097));
    EXPECT_FALSE(dev.Addressable(foreign->data(), 4096));  // another instance's
  }
  std::vector<uint8_t> plain(4096);
  EXPECT_FALSE(emu.dev(0).Addressable(plain.data(), plain.size()));
  void* freed_device = device->data();
  void* freed_host = host->data();
  device.reset();
  host.reset();
  EXPECT_FALSE(emu.dev(0).Addressable(freed_device, 1));
  EXPECT_FALSE(emu.dev(0).Addressable(freed_host, 1));
}

TEST(HostEmulatedOpaque, HostMemoryIsOutsideTheBudgetButNumberedForFaults) {
  Config c = OpaqueConfig();
  c.emu_mem_bytes = 1 << 20;
  c.emu_fail_alloc = 3;
  Emu emu(c);
  auto full = emu.Alloc(0, 1 << 20);        // #1: the whole budget
  auto host = emu.AllocHost(0, 2 << 20);    // #2: more than the budget, and fine
  ASSERT_NE(full, nullptr);
  ASSERT_NE(host, nullptr);
  auto injected = emu.dev(0).AllocateHost(64);  // #3
  EXPECT_TRUE(HasCode(injected.status(), StatusCode::kOutOfMemory));
  EXPECT_TRUE(Mentions(injected.status(), "injected fault: allocation #3 (host allocation of 64 bytes"));
  auto empty = emu.AllocHost(0, 0);  // #4
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_TRUE(HasCode(emu.dev(0).Allocate(1).status(), StatusCode::kOutOfMemory));  // the device is full
  host.reset();
  EXPECT_TRUE(HasCode(emu.dev(0).Allocate(1).status(), StatusCode::kOutOfMemory))
      << "freeing host memory gave device memory back";
}

TEST(HostEmulatedOpaque, ExportImportBetweenTwoBackendInstances) {
  // Two instances share nothing, like two processes: the importer maps the exporter's memfd and
  // gets a device address of its own.
  Emu exporter(OpaqueConfig());
  Emu importer(OpaqueConfig());
  constexpr size_t kBytes = 3 * 4096 + 17, kOffset = 4096 + 100, kWindow = 5000;
  auto device = exporter.Alloc(0, kBytes);
  auto staging = exporter.AllocHost(0, kBytes);
  auto window = importer.AllocHost(1, kWindow);
  ASSERT_NE(device, nullptr);
  ASSERT_NE(staging, nullptr);
  ASSERT_NE(window, nullptr);
  for (size_t i = 0; i < kBytes; ++i) Bytes(staging)[i] = static_cast<uint8_t>(i * 7);
  const std::vector<uint8_t> original(Bytes(staging), Bytes(staging) + kBytes);
  auto up = exporter.NewStream(0);
  ASSERT_TRUE(up->Copy(device->data(), staging->data(), kBytes).ok());
  ASSERT_TRUE(up->Synchronize().ok());

  auto exported = exporter.dev(0).Export(*device, kOffset, kWindow);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  auto imported = importer.dev(1).Import(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  std::unique_ptr<Buffer> view = std::move(imported).value();
  EXPECT_TRUE(view->imported());
  EXPECT_EQ(view->size(), kWindow);
  EXPECT_TRUE(importer.dev(0).Addressable(view->data(), kWindow));
  EXPECT_FALSE(importer.dev(0).Addressable(view->data(), kWindow + 1));
  EXPECT_FALSE(exporter.dev(0).Addressable(view->data(), 1)) << "the importer's address is its own";

  // The importer reads the window through a stream, then writes its own bytes back.
  auto stream = importer.NewStream(1);
  ASSERT_TRUE(stream->Copy(window->data(), view->data(), kWindow).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(window->data(), original.data() + kOffset, kWindow), 0);
  std::memset(window->data(), 0xEE, kWindow);
  ASSERT_TRUE(stream->Copy(view->data(), window->data(), kWindow).ok());
  ASSERT_TRUE(stream->Synchronize().ok());

  // The exporter sees them in the window, and nothing else changed.
  ASSERT_TRUE(up->Copy(staging->data(), device->data(), kBytes).ok());
  ASSERT_TRUE(up->Synchronize().ok());
  std::vector<uint8_t> expected = original;
  std::memset(expected.data() + kOffset, 0xEE, kWindow);
  EXPECT_EQ(std::memcmp(staging->data(), expected.data(), kBytes), 0);

  // Host memory exports too (it is a memfd); imported, it is opaque device memory like any import.
  auto host_export = exporter.dev(0).Export(*staging, 0, 4096);
  ASSERT_TRUE(host_export.ok()) << host_export.status().ToString();
  auto host_import = importer.dev(0).Import(*host_export);
  ASSERT_TRUE(host_import.ok()) << host_import.status().ToString();
  ASSERT_TRUE(stream->Copy(window->data(), (*host_import)->data(), 4096).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(window->data(), expected.data(), 4096), 0);

  void* mapped = view->data();
  view.reset();
  EXPECT_FALSE(importer.dev(1).Addressable(mapped, 1));
}

}  // namespace
}  // namespace kizuna::host_emulated::test
