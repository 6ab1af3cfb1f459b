// The throttle's shared segment (pacer.h) when /dev/shm cannot hold it: its pages are reserved when
// it is attached, so a full /dev/shm is a clear fallback to per-process timelines (a WARN naming
// the segment, its size and /dev/shm), never a SIGBUS at the first throttled operation.

#include "devices/host_emulated/pacer.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace kizuna::host_emulated::test {
namespace {

constexpr int kLastSlot = 1023;  // the segment's last page: touched only by that device's slot

// This process gets a mount namespace of its own with a full 4 KiB tmpfs on /dev/shm; "" or why
// not. Only mounts of this namespace change: "/" is made private first.
std::string MountFullShm() {
  if (::unshare(CLONE_NEWNS) != 0) return std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("mount --make-rprivate /: ") + std::strerror(errno);
  if (::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=4k,mode=1777") != 0)
    return std::string("mount tmpfs on /dev/shm: ") + std::strerror(errno);
  // Fill its one page.
  const int fd = ::open("/dev/shm/filler", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return std::string("open /dev/shm/filler: ") + std::strerror(errno);
  const int err = ::posix_fallocate(fd, 0, 4096);
  ::close(fd);
  if (err != 0) return std::string("filling /dev/shm: ") + std::strerror(err);
  return "";
}

// Whether this process may mount a tmpfs in a namespace of its own (root, or CAP_SYS_ADMIN); a
// child tries, so that this process's mounts never change.
std::string CanMountPrivately() {
  const pid_t pid = ::fork();
  if (pid == 0) _exit(MountFullShm().empty() ? 0 : 1);
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return "fork failed";
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "this process may not mount a tmpfs in a mount namespace of its own (needs root or CAP_SYS_ADMIN)";
  return "";
}

// Runs in the death test's child: a throttled reservation on a full /dev/shm. Exits 0 when it fell
// back to the per-process timeline with the reason; a SIGBUS kills it instead.
void ReserveOnFullShm() {
  const std::string why = MountFullShm();
  if (!why.empty()) {
    std::fprintf(stderr, "%s\n", why.c_str());
    std::exit(2);
  }
  DevicePacer pacer("pacer-full-shm-" + std::to_string(::getpid()), kLastSlot);
  const auto end = pacer.Reserve(std::chrono::milliseconds(1));
  const bool timed = end > Deadline::Clock::now();
  const std::string error = pacer.shared_error();
  std::fprintf(stderr, "segment '%s', error '%s'\n", pacer.segment_name().c_str(), error.c_str());
  // The segment, its size, the cause, /dev/shm's own size, and what to do.
  const bool ok =
      timed && pacer.segment_name().empty() && error.find("/dev/shm/kizuna-emu-") != std::string::npos &&
      error.find("65536 bytes") != std::string::npos && error.find("No space left") != std::string::npos &&
      error.find("/dev/shm is full or too small (/dev/shm has 4.0 KiB, 0 bytes free)") != std::string::npos &&
      error.find("--shm-size") != std::string::npos && error.find("KIZUNA_EMU_COPY_GBPS") != std::string::npos;
  std::exit(ok ? 0 : 1);
}

TEST(HostEmulatedPacer, FullDevShmFallsBackToAPerProcessTimelineWithoutSigbus) {
  const std::string why = CanMountPrivately();
  if (!why.empty()) GTEST_SKIP() << why;
  EXPECT_EXIT(ReserveOnFullShm(), testing::ExitedWithCode(0), "throttles are per process");
}

TEST(HostEmulatedPacer, TheSegmentsPagesAreReservedWhenAttached) {
  const std::string identity = "pacer-reserved-" + std::to_string(::getpid());
  DevicePacer pacer(identity, 0);
  pacer.Reserve(std::chrono::microseconds(1));
  ASSERT_FALSE(pacer.segment_name().empty()) << pacer.shared_error();
  EXPECT_EQ(pacer.shared_error(), "");
  const std::string path = "/dev/shm" + pacer.segment_name();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  EXPECT_EQ(st.st_size, 65536);
  // Every page has its memory now: the first touch of any slot cannot fault.
  EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, 65536) << path << " has " << st.st_blocks << " blocks";
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace kizuna::host_emulated::test
