// ProcessConformance: rank 1 runs as a second process (this binary with --fabric-child; its side
// is process_child.cc). Rank 0 listens and sends its handle over a socketpair; the child connects,
// listens in turn, and the two exchange messages both ways. The kill test checks that a peer
// dying mid-transfer fails the survivor's requests with kRemoteError, promptly.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/unique_fd.h"
#include "tests/conformance/fabric/fabric_conformance.h"

extern char** environ;

namespace kizuna::fabric::conformance {
namespace {

using namespace std::chrono_literals;

// A child that was killed cannot clean up after itself: libfabric's shm provider leaves its
// segments in /dev/shm, named "<pid>:<n>:<m>" (16 MiB each). The test killed the child, so the
// test removes what it left.
void RemoveShmLeftBy(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent* e = ::readdir(dir)) {
    if (std::string_view(e->d_name).starts_with(prefix)) ::unlinkat(::dirfd(dir), e->d_name, 0);
  }
  ::closedir(dir);
}

// A child process, killed and reaped if the test ends without waiting for it.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      RemoveShmLeftBy(pid_);
    }
  }

  Status Spawn(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int err = ::posix_spawn(&pid_, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
    if (err != 0) {
      pid_ = -1;
      return FromErrno(err, "posix_spawn");
    }
    return Status::Ok();
  }

  void Kill() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
  }

  // The wait status; kTimeout (and the child killed) at the deadline.
  Result<int> Wait(Deadline deadline) {
    if (pid_ <= 0) return InvalidArgument("no child to wait for");
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        if (WIFSIGNALED(status)) RemoveShmLeftBy(pid_);
        pid_ = -1;
        return status;
      }
      if (r < 0 && errno != EINTR) return FromErrno(errno, "waitpid");
      if (deadline.Expired()) {
        ::kill(pid_, SIGKILL);
        return Timeout("the child did not exit in time; killed");
      }
      if (pidfd.valid()) {
        pollfd p{pidfd.get(), POLLIN, 0};
        ::poll(&p, 1, 100);
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

// Rank 0's side of a session with the child: both connections set up.
struct Session {
  ChildProcess child;
  UniqueFd ctl;
  std::unique_ptr<ListenComm> listen;
  std::unique_ptr<RecvComm> recv;  // child -> parent
  std::unique_ptr<SendComm> send;  // parent -> child
};

// Starts the child in `scenario` and sets up both connections.
Status StartSession(Fabric& fabric, const std::string& name, const std::string& scenario, Session& s,
                    Deadline deadline) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return FromErrno(errno, "socketpair");
  s.ctl = UniqueFd(sv[0]);
  UniqueFd child_end(sv[1]);
  if (::fcntl(child_end.get(), F_SETFD, 0) != 0) return FromErrno(errno, "fcntl");  // inherited by the child
  const Options& o = World().options();
  KZ_RETURN_IF_ERROR(s.child.Spawn({"fabric_conformance_child",
                                    fmt::format("{}{}:{}:{}", kChildFlag, name, scenario, child_end.get()),
                                    "--topology=" + o.topology_path, fmt::format("--max-bytes={}", o.max_bytes)}));
  child_end.Reset();

  // Rank 0 listens on a device whose link reaches rank 1; the child connects from the far end.
  int listen_dev = 0;
  for (int d = 0; d < fabric.device_count(); ++d) {
    KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, fabric.properties(d));
    if (!p.point_to_point || (p.link_peer.has_value() && p.link_peer->rank == 1)) {
      listen_dev = d;
      break;
    }
  }
  KZ_ASSIGN_OR_RETURN(s.listen, fabric.Listen(listen_dev));
  KZ_RETURN_IF_ERROR(
      SendLine(s.ctl.get(), fmt::format("handle {} {}", listen_dev, s.listen->handle().ToHex()), deadline));
  KZ_ASSIGN_OR_RETURN(s.recv, s.listen->Accept(deadline));
  KZ_ASSIGN_OR_RETURN(std::string line, ReceiveLine(s.ctl.get(), deadline));
  if (!line.starts_with("handle ")) return Internal(fmt::format("the child said \"{}\"", line));
  const size_t space = line.find(' ', 7);
  if (space == std::string::npos) return Internal(fmt::format("malformed handle line \"{}\"", line));
  const int child_dev = std::atoi(line.substr(7, space - 7).c_str());
  KZ_ASSIGN_OR_RETURN(Handle h, Handle::FromHex(line.substr(space + 1)));
  int dev = 0;
  for (int d = 0; d < fabric.device_count(); ++d) {
    KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, fabric.properties(d));
    if (!p.point_to_point || (p.link_peer.has_value() && p.link_peer->rank == 1 && p.link_peer->port == child_dev)) {
      dev = d;
      break;
    }
  }
  KZ_ASSIGN_OR_RETURN(s.send, fabric.Connect(dev, h, deadline));
  return Status::Ok();
}

// Sends every echo size to the child and checks what comes back, then the child's verdict.
void RunEcho(Fabric& fabric, const std::string& name, bool fd_memory, uint64_t max) {
  const Deadline deadline = Deadline::AfterSeconds(kChildTimeoutSeconds);
  Session s;
  Status started = StartSession(fabric, name, fd_memory ? "echo-fd" : "echo", s, deadline);
  ASSERT_TRUE(started.ok()) << started.ToString();

  const size_t bytes = std::max<uint64_t>(max, 1);
  HostBuffer out_host(fd_memory ? 0 : bytes), in_host(fd_memory ? 0 : bytes);
  std::unique_ptr<device::Buffer> out_dev, in_dev;
  device::ExportedMemory out_export, in_export;
  MemoryDescriptor out_mem, in_mem;
  if (fd_memory) {
    device::Device* d = World().emulated_device();
    ASSERT_NE(d, nullptr);
    KZ_ASSERT_OK_AND_ASSIGN(out_dev, d->Allocate(bytes));
    KZ_ASSERT_OK_AND_ASSIGN(in_dev, d->Allocate(bytes));
    KZ_ASSERT_OK_AND_ASSIGN(out_export, d->Export(*out_dev));
    KZ_ASSERT_OK_AND_ASSIGN(in_export, d->Export(*in_dev));
    out_mem = MemoryDescriptor::FromExport(out_dev->data(), out_export, true);
    in_mem = MemoryDescriptor::FromExport(in_dev->data(), in_export, true);
  } else {
    ASSERT_TRUE(out_host.ok() && in_host.ok());
    out_mem = MemoryDescriptor::Host(out_host.data(), bytes);
    in_mem = MemoryDescriptor::Host(in_host.data(), bytes);
  }
  auto* out = static_cast<uint8_t*>(out_mem.data);
  auto* in = static_cast<uint8_t*>(in_mem.data);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, s.send->Register(out_mem));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, s.recv->Register(in_mem));
  for (uint64_t size : EchoSizes(max)) {
    FillPattern(out, size, size);
    KZ_ASSERT_OK_AND_ASSIGN(Request * r, s.recv->Recv(in, size, 1, size > 0 ? rreg : nullptr));
    KZ_ASSERT_OK_AND_ASSIGN(Request * w, s.send->Send(out, size, 1, size > 0 ? sreg : nullptr));
    ASSERT_NE(r, nullptr);
    ASSERT_NE(w, nullptr);
    KZ_ASSERT_OK_AND_ASSIGN(size_t sent, s.send->Wait(w, deadline));
    EXPECT_EQ(sent, size);
    auto got = s.recv->Wait(r, deadline);
    if (!got.ok()) {
      // Say how the child ended: an echo that never came back is the child's story.
      auto status = s.child.Wait(Deadline::AfterSeconds(2));
      FAIL() << "the " << size << "-byte echo: " << got.status().ToString() << "; the child "
             << (status.ok() ? DescribeWaitStatus(*status) : status.status().ToString());
    }
    ASSERT_EQ(*got, size);
    ASSERT_TRUE(HasPattern(in, size, size)) << "the " << size << "-byte echo came back corrupted";
  }
  KZ_ASSERT_OK_AND_ASSIGN(std::string verdict, ReceiveLine(s.ctl.get(), deadline));
  EXPECT_EQ(verdict, "ok");
  KZ_ASSERT_OK_AND_ASSIGN(int status, s.child.Wait(deadline));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status);
  if (fd_memory) {
    EXPECT_EQ(s.send->stats().staged_bytes, 0u) << "fd-registered sends went through a staging buffer";
    EXPECT_EQ(s.recv->stats().staged_bytes, 0u) << "fd-registered receives went through a staging buffer";
  }
}

TEST_P(ProcessConformance, EchoEverySizeWithHostMemory) { RunEcho(rank0(), under_test().name, false, max_bytes()); }

TEST_P(FdProcessConformance, EchoEverySizeWithDeviceMemoryByFdIsSingleCopy) {
  RunEcho(rank0(), under_test().name, true, max_bytes());
}

TEST_P(ProcessConformance, PeerKilledMidTransferFailsTheSurvivor) {
  const Deadline deadline = Deadline::AfterSeconds(kChildTimeoutSeconds);
  Session s;
  Status started = StartSession(rank0(), under_test().name, "die", s, deadline);
  ASSERT_TRUE(started.ok()) << started.ToString();
  const uint64_t size = max_bytes();
  HostBuffer out(size), in(64);
  ASSERT_TRUE(out.ok() && in.ok());
  FillPattern(out.data(), size, 7);
  KZ_ASSERT_OK_AND_ASSIGN(Registration * sreg, s.send->Register(MemoryDescriptor::Host(out.data(), size)));
  KZ_ASSERT_OK_AND_ASSIGN(Registration * rreg, s.recv->Register(MemoryDescriptor::Host(in.data(), 64)));
  KZ_ASSERT_OK_AND_ASSIGN(Request * w, s.send->Send(out.data(), size, 1, sreg));
  KZ_ASSERT_OK_AND_ASSIGN(Request * r, s.recv->Recv(in.data(), 64, 1, rreg));
  ASSERT_NE(w, nullptr);
  ASSERT_NE(r, nullptr);
  // Keep the send moving until the child says it has started receiving, then kill it.
  bool send_done = false;
  while (true) {
    if (!send_done) {
      KZ_ASSERT_OK_AND_ASSIGN(Completion c, s.send->Test(w));
      send_done = c.done;
    }
    pollfd p{s.ctl.get(), POLLIN, 0};
    if (::poll(&p, 1, 1) > 0) break;
    ASSERT_FALSE(deadline.Expired()) << "the child never reported ready";
  }
  KZ_ASSERT_OK_AND_ASSIGN(std::string ready, ReceiveLine(s.ctl.get(), deadline));
  ASSERT_EQ(ready, "ready");
  s.child.Kill();
  KZ_ASSERT_OK_AND_ASSIGN(int status, s.child.Wait(deadline));
  EXPECT_TRUE(WIFSIGNALED(status)) << DescribeWaitStatus(status);

  const auto start = std::chrono::steady_clock::now();
  const Deadline after = Deadline::After(10s);
  if (!send_done) {
    auto sent = s.send->Wait(w, after);
    EXPECT_EQ(sent.status().code(), StatusCode::kRemoteError)
        << "a send to a killed peer: " << (sent.ok() ? "completed" : sent.status().ToString());
  }
  auto got = s.recv->Wait(r, after);
  EXPECT_EQ(got.status().code(), StatusCode::kRemoteError)
      << "a receive from a killed peer: " << (got.ok() ? "completed" : got.status().ToString());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the failure took too long to surface";
}

}  // namespace
}  // namespace kizuna::fabric::conformance
