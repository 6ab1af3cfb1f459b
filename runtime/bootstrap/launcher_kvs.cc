#include "runtime/bootstrap/launcher_kvs.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

namespace kizuna::bootstrap {

std::unique_ptr<LauncherKvs> OpenPmix(const Environment& env, Status* why);  // pmix.cc

namespace {

// Hydra counts a process that initialised PMI and exits without finalizing as failed, and kills
// the job's other processes: PMI-1 sessions are finalized at exit (not at once, so that a program
// that initialises MPI afterwards still finds the channel open; its own finalize comes first).
std::atomic<int> g_finalize_fd{-1};

void FinalizePmi1() {
  const int fd = g_finalize_fd.exchange(-1);
  if (fd < 0) return;
  static const char kFinalize[] = "cmd=finalize\n";
  if (::write(fd, kFinalize, sizeof kFinalize - 1) != static_cast<ssize_t>(sizeof kFinalize - 1)) return;
  // The acknowledgement, up to 2 s: the launcher then counts this exit as normal.
  char buf[64];
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 2000) > 0) (void)!::read(fd, buf, sizeof buf);
}

void FinalizeAtExit(int fd) {
  static std::once_flag once;
  g_finalize_fd.store(fd);
  std::call_once(once, [] { std::atexit(FinalizePmi1); });
}

// A line's "name=value" fields ("cmd=get_result rc=0 value=x" -> cmd, rc, value).
std::map<std::string, std::string> Fields(std::string_view line) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t end = line.find(' ', i);
    if (end == std::string_view::npos) end = line.size();
    const std::string_view field = line.substr(i, end - i);
    const size_t eq = field.find('=');
    if (eq != std::string_view::npos) out[std::string(field.substr(0, eq))] = std::string(field.substr(eq + 1));
    i = end;
  }
  return out;
}

// PMI-1's wire protocol (MPICH's simple PMI): one command per line, one answer line each.
class Pmi1 final : public LauncherKvs {
 public:
  Pmi1(int fd, bool finalize_at_exit) : fd_(fd), finalize_at_exit_(finalize_at_exit) {}

  std::string Describe() const override { return fmt::format("PMI-1 (PMI_FD {})", fd_); }

  Result<std::string> Share(int rank, std::string_view key, std::string_view value, Deadline deadline) override {
    KZ_ASSIGN_OR_RETURN(auto init, Ask("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init", deadline));
    if (init["rc"] != "0") return Refused("init", init);
    KZ_ASSIGN_OR_RETURN(auto name, Ask("cmd=get_my_kvsname", "my_kvsname", deadline));
    const std::string kvs = name["kvsname"];
    if (kvs.empty()) return RemoteError(fmt::format("{}: get_my_kvsname gave no name", Describe()));
    if (rank == 0) {
      KZ_ASSIGN_OR_RETURN(auto put, Ask(fmt::format("cmd=put kvsname={} key={} value={}", kvs, key, value),
                                        "put_result", deadline));
      if (put["rc"] != "0") return Refused("put", put);
    }
    KZ_ASSIGN_OR_RETURN(auto barrier, Ask("cmd=barrier_in", "barrier_out", deadline));
    (void)barrier;
    if (finalize_at_exit_) FinalizeAtExit(fd_);
    if (rank == 0) return std::string(value);
    KZ_ASSIGN_OR_RETURN(auto got, Ask(fmt::format("cmd=get kvsname={} key={}", kvs, key), "get_result", deadline));
    if (got["rc"] != "0") return Refused("get", got);
    return got["value"];
  }

 private:
  Status Refused(std::string_view what, std::map<std::string, std::string>& answer) const {
    return RemoteError(fmt::format("{}: the launcher refused {}: rc={} {}", Describe(), what, answer["rc"],
                                   answer["msg"]));
  }

  // Sends `command`, reads one line, which must be the answer `expect` (cmd=<expect>).
  Result<std::map<std::string, std::string>> Ask(const std::string& command, std::string_view expect,
                                                 Deadline deadline) {
    const std::string line = command + "\n";
    size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t k = ::write(fd_, line.data() + sent, line.size() - sent);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return FromErrno(errno, fmt::format("{}: sending '{}'", Describe(), command.substr(0, 40)));
      sent += static_cast<size_t>(k);
    }
    std::string answer;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
      if (left <= 0)
        return Timeout(fmt::format("{}: no answer to '{}' (did every rank start? the fence waits for all)", Describe(),
                                   command.substr(0, 40)));
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
      if (ready < 0 && errno != EINTR) return FromErrno(errno, fmt::format("{}: poll", Describe()));
      if (ready <= 0) continue;
      char c;
      const ssize_t k = ::read(fd_, &c, 1);  // byte by byte: never past this answer's line
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (k <= 0) return RemoteError(fmt::format("{}: the launcher closed the connection", Describe()));
      if (c == '\n') break;
      if (answer.size() > 4096) return RemoteError(fmt::format("{}: an answer longer than 4 KiB", Describe()));
      answer.push_back(c);
    }
    auto fields = Fields(answer);
    if (fields["cmd"] != expect)
      return RemoteError(fmt::format("{}: expected cmd={}, got '{}'", Describe(), expect, answer.substr(0, 200)));
    return fields;
  }

  int fd_;
  bool finalize_at_exit_;
};

}  // namespace

std::unique_ptr<LauncherKvs> Pmi1OverFd(int fd, bool finalize_at_exit) {
  return std::make_unique<Pmi1>(fd, finalize_at_exit);
}

Result<std::unique_ptr<LauncherKvs>> OpenLauncherKvs(const Environment& env) {
  if (const auto it = env.find("PMI_FD"); it != env.end()) {
    char* end = nullptr;
    const long fd = std::strtol(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || fd < 0 || fd > 65535)
      return InvalidArgument(fmt::format("PMI_FD '{}' is not a file descriptor", it->second));
    return Pmi1OverFd(static_cast<int>(fd), /*finalize_at_exit=*/true);
  }
  if (env.count("PMIX_RANK") != 0 && env.count("PMIX_NAMESPACE") != 0) {
    Status why;
    std::unique_ptr<LauncherKvs> pmix = OpenPmix(env, &why);
    if (pmix == nullptr) return why;
    return pmix;
  }
  return std::unique_ptr<LauncherKvs>();
}

}  // namespace kizuna::bootstrap
