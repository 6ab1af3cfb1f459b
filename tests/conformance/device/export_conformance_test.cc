// Export and import: DeviceConformance (every backend) export range checks, or kNotSupported,
// DMA-BUF export or its kNotSupported, and refusal of another backend's memory; ExportConformance
// (host_accessible or host_memory, and export_fd or export_opaque) import in this process and in a
// child process (this binary run with --child-import; the child's side is in conformance_main.cc),
// bytes checked through DeviceBytes on both sides. What the groups check: README.md.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/device/exported_memory.h"
#include "runtime/core/unique_fd.h"
#include "tests/conformance/device/device_conformance.h"

extern char** environ;

namespace kizuna::device::conformance {
namespace {

using namespace std::chrono_literals;

// ---- A child process, always reaped ----

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Kills and reaps a child that was not waited for (a failed assertion must not leave one).
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  Status Spawn(const std::string& path, const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int err = ::posix_spawn(&pid_, path.c_str(), nullptr, nullptr, argv.data(), environ);
    if (err != 0) {
      pid_ = -1;
      return FromErrno(err, "posix_spawn");
    }
    return Status::Ok();
  }

  // The child's wait status; kTimeout (and the child killed) at the deadline.
  Result<int> Wait(Deadline deadline) {
    if (pid_ <= 0) return InvalidArgument("no child to wait for");
    // A pidfd lets us block until the exit with a timeout; without one, poll at 1 ms.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      if (r < 0 && errno != EINTR) return FromErrno(errno, "waitpid");
      if (deadline.Expired()) {
        ::kill(pid_, SIGKILL);
        return Timeout(fmt::format("child {} did not exit in time; killed", pid_));
      }
      if (pidfd.valid()) {
        pollfd p{pidfd.get(), POLLIN, 0};
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms + 1, 1000)));
      } else {
        std::this_thread::sleep_for(1ms);
      }
    }
  }

 private:
  pid_t pid_ = -1;
};

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("wait status {:#x}", status);
}

// ---- DeviceConformance: export range checks and foreign imports ----

TEST_P(DeviceConformance, ExportIsRangeCheckedOrNotSupported) {
  auto buffer = MustAllocate(8192);
  KZ_ASSERT_NOT_NULL(buffer);
  const DeviceProperties& p = device().properties();
  if (!p.export_fd && !p.export_opaque) {
    KZ_EXPECT_CODE(device().Export(*buffer).status(), StatusCode::kNotSupported);
    return;
  }
  KZ_EXPECT_CODE(device().Export(*buffer, 0, 8193).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 8193, 0).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 4096, 4097).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 0, 0).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 0, std::numeric_limits<size_t>::max()).status(),
                 StatusCode::kInvalidArgument);
  if (backend().device_count() > 1) {
    KZ_EXPECT_CODE(device(1).Export(*buffer).status(), StatusCode::kInvalidArgument);
  }
  auto ok = device().Export(*buffer, 4096, 4096);
  KZ_ASSERT_OK(ok.status());
  EXPECT_EQ(ok->backend, backend().name());
  EXPECT_EQ(ok->device_uuid, p.uuid);
  EXPECT_EQ(ok->device_index, p.index);
  EXPECT_EQ(ok->size, 4096u);
  if (ok->kind == ExportKind::kFd) EXPECT_TRUE(ok->fd.valid());
  else EXPECT_FALSE(ok->opaque.empty());
}

// ExportDmaBuf: kNotSupported unless the device says export_dmabuf; when it does, a real DMA-BUF
// fd (what an RDMA NIC registers) describing the range. The range is a whole 2 MiB buffer and a
// page-aligned window of it, since backends may require page alignment.
TEST_P(DeviceConformance, ExportDmaBufOrNotSupported) {
  constexpr size_t kBytes = size_t{2} << 20;
  auto buffer = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(buffer);
  const DeviceProperties& p = device().properties();
  // The range checks come first, whatever the support.
  KZ_EXPECT_CODE(device().ExportDmaBuf(*buffer, 0, kBytes + 1).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().ExportDmaBuf(*buffer, 0, 0).status(), StatusCode::kInvalidArgument);
  if (!p.export_dmabuf) {
    KZ_EXPECT_CODE(device().ExportDmaBuf(*buffer, 0, kBytes).status(), StatusCode::kNotSupported);
    return;
  }
  struct Range {
    size_t offset, size;
  };
  for (const Range& r : {Range{0, kBytes}, Range{size_t{1} << 20, 64 << 10}}) {
    SCOPED_TRACE(fmt::format("range [{}, +{})", r.offset, r.size));
    auto exported = device().ExportDmaBuf(*buffer, r.offset, r.size);
    KZ_ASSERT_OK(exported.status());
    EXPECT_EQ(exported->kind, ExportKind::kFd);
    EXPECT_TRUE(exported->dmabuf) << "a DMA-BUF export must say so";
    ASSERT_TRUE(exported->fd.valid());
    EXPECT_EQ(exported->size, r.size);
    EXPECT_EQ(exported->backend, backend().name());
    EXPECT_EQ(exported->device_uuid, p.uuid);
    EXPECT_EQ(exported->device_index, p.index);
    struct stat st {};
    EXPECT_EQ(::fstat(exported->fd.get(), &st), 0) << "fstat on the DMA-BUF fd: " << std::strerror(errno);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), exported->offset + exported->size)
        << "the DMA-BUF object is smaller than the range it carries";
  }
}

TEST_P(DeviceConformance, ImportFromAnotherBackendIsNotSupported) {
  // A well-formed fd export that names another backend.
  ExportedMemory foreign;
  foreign.kind = ExportKind::kFd;
  foreign.fd = UniqueFd(::memfd_create("kz-conformance-foreign", MFD_CLOEXEC));
  ASSERT_TRUE(foreign.fd.valid()) << "memfd_create: " << std::strerror(errno);
  ASSERT_EQ(::ftruncate(foreign.fd.get(), 4096), 0);
  foreign.size = 4096;
  foreign.backend = std::string(backend().name()) + "_elsewhere";
  foreign.device_uuid = "not-a-device-of-this-backend";
  KZ_EXPECT_CODE(device().Import(foreign).status(), StatusCode::kNotSupported);

  // Real exports of every other backend that exports.
  for (const BackendUnderTest& other : World().backends()) {
    if (!other.available() || other.name == under_test().name) continue;
    if (!other.Has(Tag::kExportFd) && !other.Has(Tag::kExportOpaque)) continue;
    SCOPED_TRACE("memory exported by " + other.name);
    Device* od = other.slot->backend->device(0);
    auto ob = od->Allocate(4096);
    KZ_ASSERT_OK(ob.status());
    auto exported = od->Export(**ob);
    KZ_ASSERT_OK(exported.status());
    KZ_EXPECT_CODE(device().Import(*exported).status(), StatusCode::kNotSupported);
  }
}

// ---- ExportConformance: import in this process and in another ----

TEST_P(ExportConformance, ImportInTheSameProcess) {
  constexpr size_t kBytes = 65536 + 13;
  struct Range {
    size_t offset, size;
  };
  // Whole buffer, a page-aligned window, and an odd window not starting on a page.
  const Range ranges[] = {{0, kBytes}, {4096, 8192}, {4096 + 7, 1003}};
  std::vector<int> importers = {0};
  if (backend().device_count() > 1) importers.push_back(1);
  std::vector<uint8_t> expect(kBytes);
  FillPattern(expect.data(), kBytes, 61);
  for (int importer : importers) {
    for (const Range& r : ranges) {
      SCOPED_TRACE(fmt::format("range [{}, +{}) imported on device {}", r.offset, r.size, importer));
      Device& target = device(importer);
      auto buffer = MustAllocate(kBytes);
      KZ_ASSERT_NOT_NULL(buffer);
      KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes buffer_bytes, DeviceBytes::Create(*buffer));
      KZ_ASSERT_OK(buffer_bytes.Fill(61));
      std::unique_ptr<Buffer> imported;
      {
        auto exported = device().Export(*buffer, r.offset, r.size);
        KZ_ASSERT_OK(exported.status());
        EXPECT_EQ(exported->size, r.size);
        auto im = target.Import(*exported);
        KZ_ASSERT_OK(im.status());
        imported = std::move(im).value();
      }  // the ExportedMemory is gone; the import keeps its own reference
      ASSERT_EQ(imported->size(), r.size);
      EXPECT_TRUE(imported->imported());
      EXPECT_EQ(&imported->device(), &target);
      KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes imported_bytes, DeviceBytes::Create(*imported));
      EXPECT_TRUE(imported_bytes.Equals(0, expect.data() + r.offset, r.size)) << "import shows other bytes";

      // Writes through the import (a stream copy on the importing device) land in the original.
      auto staging = MustAllocate(target, r.size);
      KZ_ASSERT_NOT_NULL(staging);
      KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes staging_bytes, DeviceBytes::Create(*staging));
      // After the buffers its copy uses (the import, its original, the staging): destroyed first.
      auto stream = MustCreateStream(target);
      KZ_ASSERT_NOT_NULL(stream);
      KZ_ASSERT_OK(staging_bytes.Fill(62));
      KZ_ASSERT_OK(stream->Copy(imported->data(), staging->data(), r.size));
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
      KZ_ASSERT_OK(buffer_bytes.Download());
      const uint8_t* got = buffer_bytes.host();
      EXPECT_TRUE(HasPattern(got + r.offset, r.size, 62));
      EXPECT_TRUE(BytesEqual(got, expect.data(), r.offset)) << "bytes before the exported range";
      EXPECT_TRUE(BytesEqual(got + r.offset + r.size, expect.data() + r.offset + r.size, kBytes - r.offset - r.size))
          << "bytes after the exported range";
      // Imported memory is not exported again.
      KZ_EXPECT_CODE(target.Export(*imported).status(), StatusCode::kNotSupported);
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    }
  }
}

// The parent exports a window of a buffer, hands it to a child process (this binary, run with
// --child-import) over a Unix socket, and both check each other's bytes. The child's side is in
// conformance_main.cc.
TEST_P(ExportConformance, ImportInAChildProcess) {
  constexpr size_t kBytes = (size_t{1} << 20) + 4096 + 29;
  constexpr size_t kOffset = 4096 + 7;
  constexpr size_t kSize = (size_t{1} << 20) + 11;
  auto buffer = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(buffer);
  KZ_ASSERT_OK_AND_ASSIGN(DeviceBytes bytes, DeviceBytes::Create(*buffer));
  uint8_t* p = bytes.host();
  FillPattern(p, kBytes, 71);
  for (size_t i = 0; i < kSize; ++i) p[kOffset + i] = ParentByte(i);
  KZ_ASSERT_OK(bytes.Upload());
  std::vector<uint8_t> outside(p, p + kBytes);

  auto exported = device().Export(*buffer, kOffset, kSize);
  KZ_ASSERT_OK(exported.status());

  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0) << std::strerror(errno);
  UniqueFd parent_end(sv[0]), child_end(sv[1]);
  // Only the child's end survives the exec.
  ASSERT_EQ(::fcntl(child_end.get(), F_SETFD, 0), 0) << std::strerror(errno);

  std::vector<std::string> args = {"device_conformance_test",
                                   fmt::format("{}{}:{}:{}", kChildImportFlag, under_test().name,
                                               device().properties().index, child_end.get())};
  for (const std::string& plugin : CommandLinePlugins()) args.push_back("--plugin=" + plugin);
  ChildProcess child;
  KZ_ASSERT_OK(child.Spawn("/proc/self/exe", args));
  child_end.Reset();  // the child's death now shows as end-of-file on our end

  const Deadline deadline = Deadline::AfterSeconds(kChildTimeoutSeconds + 5);
  KZ_ASSERT_OK(SendExportedMemory(parent_end.get(), *exported, deadline));
  auto report = ReceiveReport(parent_end.get(), 4096, deadline);
  auto waited = child.Wait(deadline);
  KZ_ASSERT_OK(report.status());
  EXPECT_EQ(*report, kChildOk) << "the child reported: " << (report->empty() ? "(nothing)" : *report);
  KZ_ASSERT_OK(waited.status());
  EXPECT_TRUE(WIFEXITED(*waited) && WEXITSTATUS(*waited) == 0) << "child: " << DescribeWaitStatus(*waited);

  // The child's writes are visible here; bytes outside the exported window are untouched.
  KZ_ASSERT_OK(bytes.Download());
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < kSize; ++i)
    if (p[kOffset + i] != ChildByte(i) && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "bytes of the child's pattern missing; first at " << first;
  EXPECT_TRUE(BytesEqual(p, outside.data(), kOffset));
  EXPECT_TRUE(BytesEqual(p + kOffset + kSize, outside.data() + kOffset + kSize, kBytes - kOffset - kSize));
}

}  // namespace
}  // namespace kizuna::device::conformance
