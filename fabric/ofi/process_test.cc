// A peer in another process that dies mid-transfer: the survivor's send and receive fail with
// kRemoteError within seconds (same host: the peer's pidfd), over tcp;ofi_rxm and over shm.
// Rank 1 is this test binary again, started with --ofi-child=<provider>:<fd> (main below); the
// two exchange handles as lines on an inherited socketpair.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "fabric/ofi/test_util.h"
#include "runtime/core/unique_fd.h"

extern char** environ;

namespace kizuna::fabric::ofi {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr std::string_view kChildFlag = "--ofi-child=";
constexpr size_t kBig = size_t{64} << 20;

Status WaitFd(int fd, short events, Deadline deadline) {
  while (true) {
    if (deadline.Expired()) return Timeout("control socket: deadline passed");
    pollfd p{fd, events, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms + 1, 1, 1 << 30)));
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR) return FromErrno(errno, "poll");
  }
}

Status SendLine(int fd, const std::string& line, Deadline deadline) {
  const std::string text = line + "\n";
  size_t sent = 0;
  while (sent < text.size()) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline));
    const ssize_t n = ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EINTR && errno != EAGAIN) return FromErrno(errno, "send");
    if (n > 0) sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> ReceiveLine(int fd, Deadline deadline) {
  std::string out;
  while (out.size() < 4096) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline));
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (n == 0) return RemoteError("the other process closed the control socket");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "recv");
    }
    if (c == '\n') return out;
    out += c;
  }
  return InvalidArgument("control line too long");
}

Result<Handle> ParseHandleLine(const std::string& line) {
  if (line.rfind("handle ", 0) != 0) return InvalidArgument(fmt::format("expected a handle, got \"{}\"", line));
  return Handle::FromHex(line.substr(7));
}

// The child: connects to the parent, listens for the parent, starts a large receive, reports
// "ready", then waits to be killed.
Status ChildBody(const std::string& provider, int ctl) {
  const Deadline deadline = Deadline::AfterSeconds(25);
  Config config = testing::ConfigFor(provider);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Fabric> fabric, OfiFabric::Create(config, testing::Rank(1)));
  KZ_ASSIGN_OR_RETURN(std::string line, ReceiveLine(ctl, deadline));
  KZ_ASSIGN_OR_RETURN(Handle parent, ParseHandleLine(line));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<SendComm> send, fabric->Connect(0, parent, deadline));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<ListenComm> listen, fabric->Listen(0));
  KZ_RETURN_IF_ERROR(SendLine(ctl, "handle " + listen->handle().ToHex(), deadline));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<RecvComm> recv, listen->Accept(deadline));
  void* buf = ::mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) return OutOfMemory("64 MiB for the receive");
  KZ_ASSIGN_OR_RETURN(Registration * reg, recv->Register(MemoryDescriptor::Host(buf, kBig)));
  KZ_ASSIGN_OR_RETURN(Request * r, recv->Recv(buf, kBig, 1, reg));
  for (int i = 0; i < 20; ++i) KZ_RETURN_IF_ERROR(recv->Test(r).status());
  KZ_RETURN_IF_ERROR(SendLine(ctl, "ready", deadline));
  (void)ReceiveLine(ctl, deadline);
  return Internal("still alive: the parent was to kill this process");
}

class OfiProcess : public ::testing::TestWithParam<std::string> {};

TEST_P(OfiProcess, APeerKilledMidTransferFailsTheSurvivorPromptly) {
  testing::World w(GetParam());
  if (!w.status.ok()) GTEST_SKIP() << GetParam() << " is not available here: " << w.status.message();
  const Deadline deadline = Deadline::AfterSeconds(25);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd ctl(sv[0]), child_end(sv[1]);
  ASSERT_EQ(::fcntl(child_end.get(), F_SETFD, 0), 0);  // inherited by the child
  const std::string flag = fmt::format("{}{}:{}", kChildFlag, GetParam(), child_end.get());
  char* argv[] = {const_cast<char*>("ofi_test_child"), const_cast<char*>(flag.c_str()), nullptr};
  pid_t pid = -1;
  ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, environ), 0);
  child_end.Reset();
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGKILL);
      int st;
      ::waitpid(pid, &st, 0);
      // The killed child cannot clean up: the shm provider's segments are named "<pid>:<n>:<m>".
      const std::string prefix = std::to_string(pid) + ":";
      if (DIR* dir = ::opendir("/dev/shm")) {
        while (dirent* e = ::readdir(dir))
          if (std::string_view(e->d_name).starts_with(prefix)) ::unlinkat(::dirfd(dir), e->d_name, 0);
        ::closedir(dir);
      }
    }
  } reaper{pid};

  Fabric& fabric = w[0];
  auto listen = fabric.Listen(0);
  ASSERT_TRUE(listen.ok()) << listen.status().ToString();
  ASSERT_TRUE(SendLine(ctl.get(), "handle " + (*listen)->handle().ToHex(), deadline).ok());
  auto recv = (*listen)->Accept(deadline);
  ASSERT_TRUE(recv.ok()) << recv.status().ToString();
  auto line = ReceiveLine(ctl.get(), deadline);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  auto child_handle = ParseHandleLine(*line);
  ASSERT_TRUE(child_handle.ok()) << child_handle.status().ToString();
  auto send = fabric.Connect(0, *child_handle, deadline);
  ASSERT_TRUE(send.ok()) << send.status().ToString();

  testing::Pair p{std::move(listen).value(), std::move(send).value(), std::move(recv).value()};
  void* out = ::mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(out, MAP_FAILED);
  uint64_t in = 0;
  auto sreg = p.send->Register(MemoryDescriptor::Host(out, kBig));
  auto rreg = p.recv->Register(MemoryDescriptor::Host(&in, 8));
  ASSERT_TRUE(sreg.ok() && rreg.ok());
  auto s = p.send->Send(out, kBig, 1, *sreg);
  auto r = p.recv->Recv(&in, 8, 1, *rreg);
  ASSERT_TRUE(s.ok() && r.ok());
  bool send_done = false;
  while (true) {
    if (!send_done) {
      auto c = p.send->Test(*s);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      send_done = c->done;
    }
    pollfd pf{ctl.get(), POLLIN, 0};
    if (::poll(&pf, 1, 1) > 0) break;
    ASSERT_FALSE(deadline.Expired()) << "the child never reported ready";
  }
  auto ready = ReceiveLine(ctl.get(), deadline);
  ASSERT_TRUE(ready.ok() && *ready == "ready") << (ready.ok() ? *ready : ready.status().ToString());
  ::kill(pid, SIGKILL);

  const auto start = Clock::now();
  if (!send_done) {
    auto sent = p.send->Wait(*s, Deadline::After(10s));
    EXPECT_EQ(sent.status().code(), StatusCode::kRemoteError) << (sent.ok() ? "completed" : sent.status().ToString());
  }
  auto got = p.recv->Wait(*r, Deadline::After(10s));
  EXPECT_EQ(got.status().code(), StatusCode::kRemoteError) << (got.ok() ? "completed" : got.status().ToString());
  EXPECT_LT(Clock::now() - start, 5s);
  ::munmap(out, kBig);
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiProcess, ::testing::Values("tcp;ofi_rxm", "shm"), [](const auto& info) {
  return info.param == "shm" ? std::string("shm") : std::string("tcp");
});

}  // namespace

// --ofi-child=<provider>:<fd>: this process is rank 1 of OfiProcess; it runs no tests.
int RunChildIfAsked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a.rfind(kChildFlag, 0) != 0) continue;
    const std::string spec(a.substr(kChildFlag.size()));
    const size_t colon = spec.rfind(':');
    if (colon == std::string::npos) return 2;
    UniqueFd ctl(std::atoi(spec.c_str() + colon + 1));
    const Status s = ChildBody(spec.substr(0, colon), ctl.get());
    std::fprintf(stderr, "ofi test child: %s\n", s.ToString().c_str());
    return 1;
  }
  return -1;
}

}  // namespace kizuna::fabric::ofi

int main(int argc, char** argv) {
  if (const int rc = kizuna::fabric::ofi::RunChildIfAsked(argc, argv); rc >= 0) return rc;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
