#include "runtime/device/exported_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include <gtest/gtest.h>

namespace kizuna::device {
namespace {

using std::chrono::milliseconds;

int OpenFdCount() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd)
    if (fcntl(fd, F_GETFD) != -1) ++n;
  return n;
}

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.Reset(fds[0]);
    b.Reset(fds[1]);
  }
  UniqueFd a, b;
};

TEST(ExportedMemoryTest, FdTravelsWithItsDescriptor) {
  UniqueFd mem(memfd_create("kz-test", MFD_CLOEXEC));
  ASSERT_TRUE(mem.valid());
  const size_t size = 2 * 4096;
  ASSERT_EQ(ftruncate(mem.get(), size), 0);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, mem.get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, size);

  ExportedMemory e;
  e.kind = ExportKind::kFd;
  e.fd.Reset(dup(mem.get()));
  e.offset = 4096;
  e.size = 100;
  e.backend = "host_emulated";
  e.device_uuid = "emu-host-3";
  e.device_index = 3;
  SocketPair s;
  ASSERT_TRUE(SendExportedMemory(s.a.get(), e, Deadline::After(milliseconds(2000))).ok());
  auto r = ReceiveExportedMemory(s.b.get(), Deadline::After(milliseconds(2000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, ExportKind::kFd);
  EXPECT_EQ(r->offset, 4096u);
  EXPECT_EQ(r->size, 100u);
  EXPECT_EQ(r->backend, "host_emulated");
  EXPECT_EQ(r->device_uuid, "emu-host-3");
  EXPECT_EQ(r->device_index, 3);
  ASSERT_TRUE(r->fd.valid());
  EXPECT_NE(r->fd.get(), e.fd.get());
  // The received fd names the same pages: a write through it is seen through the original mapping.
  void* q = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd.get(), 0);
  ASSERT_NE(q, MAP_FAILED);
  EXPECT_EQ(static_cast<unsigned char*>(q)[4096], 0x5a);
  static_cast<unsigned char*>(q)[4097] = 0x11;
  EXPECT_EQ(static_cast<unsigned char*>(p)[4097], 0x11);
  munmap(q, size);
  munmap(p, size);
}

TEST(ExportedMemoryTest, OpaqueHandleRoundTrips) {
  ExportedMemory e;
  e.kind = ExportKind::kOpaque;
  e.opaque = {1, 2, 3, 4, 250};
  e.size = 64;
  e.backend = "cuda";
  SocketPair s;
  ASSERT_TRUE(SendExportedMemory(s.a.get(), e, Deadline::After(milliseconds(2000))).ok());
  auto r = ReceiveExportedMemory(s.b.get(), Deadline::After(milliseconds(2000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kind, ExportKind::kOpaque);
  EXPECT_EQ(r->opaque, e.opaque);
  EXPECT_FALSE(r->fd.valid());
}

TEST(ExportedMemoryTest, ErrorsAreReportedNotHung) {
  {
    SocketPair s;  // nothing sent: the deadline ends the wait
    auto start = std::chrono::steady_clock::now();
    auto r = ReceiveExportedMemory(s.b.get(), Deadline::After(milliseconds(50)));
    EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
  {
    SocketPair s;  // peer goes away
    s.a.Reset();
    EXPECT_EQ(ReceiveExportedMemory(s.b.get(), Deadline::After(milliseconds(2000))).status().code(),
              StatusCode::kRemoteError);
  }
  {
    SocketPair s;  // garbage instead of a descriptor
    char junk[64] = "definitely not an exported-memory message..................";
    ASSERT_EQ(write(s.a.get(), junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
    auto r = ReceiveExportedMemory(s.b.get(), Deadline::After(milliseconds(2000)));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("bad magic"), std::string::npos) << r.status().message();
  }
  {
    // Two descriptors in one message (a malformed or hostile sender): refused, and neither leaks.
    SocketPair s;
    UniqueFd f1(memfd_create("kz-a", MFD_CLOEXEC)), f2(memfd_create("kz-b", MFD_CLOEXEC));
    char byte = 'x';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {f1.get(), f2.get()};
    std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
    ASSERT_EQ(sendmsg(s.a.get(), &msg, 0), 1);
    const int before = OpenFdCount();
    auto r = ReceiveExportedMemory(s.b.get(), Deadline::After(milliseconds(2000)));
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("unexpected file descriptor"), std::string::npos) << r.status().message();
    EXPECT_EQ(OpenFdCount(), before);
  }
  {
    ExportedMemory no_fd;  // kind fd without an fd
    SocketPair s;
    EXPECT_EQ(SendExportedMemory(s.a.get(), no_fd, Deadline::After(milliseconds(100))).code(),
              StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kizuna::device
