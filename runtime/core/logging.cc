#include "runtime/core/logging.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

namespace kizuna {
namespace log_internal {
std::atomic<uint32_t> g_level{0xff};
std::atomic<uint32_t> g_subsys{kLogAll};
}  // namespace log_internal

namespace {

std::mutex g_mu;  // guards g_fd and g_host
int g_fd = STDERR_FILENO;
std::string g_host;
thread_local int t_rank = -1;

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string ExpandPath(const std::string& pattern, const std::string& host, int rank = -1) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'h') { out += host; ++i; continue; }
      if (c == 'p') { out += std::to_string(getpid()); ++i; continue; }
      if (c == 'r' && rank >= 0) { out += std::to_string(rank); ++i; continue; }
      if (c == '%') { out += '%'; ++i; continue; }
    }
    out += pattern[i];
  }
  return out;
}

void ApplyLocked(const Config& config) {
  if (g_host.empty()) g_host = HostName();
  if (g_fd != STDERR_FILENO) {
    close(g_fd);
    g_fd = STDERR_FILENO;
  }
  if (!config.debug_file.empty()) {
    std::string path = ExpandPath(config.debug_file, g_host);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      g_fd = fd;
    } else {
      int err = errno;
      std::string line = fmt::format("kizuna WARN ENV cannot open KIZUNA_DEBUG_FILE '{}': {}; logging to stderr\n",
                                     path, std::strerror(err));
      (void)!write(STDERR_FILENO, line.data(), line.size());
    }
  }
  log_internal::g_subsys.store(config.debug_subsys, std::memory_order_relaxed);
  log_internal::g_level.store(static_cast<uint32_t>(config.debug), std::memory_order_release);
}

}  // namespace

void ConfigureLogging(const Config& config) {
  std::lock_guard<std::mutex> lock(g_mu);
  ApplyLocked(config);
}

void SetLogRank(int rank) { t_rank = rank; }
int LogRank() { return t_rank; }

namespace log_internal {

bool EnabledSlow(LogLevel level, LogSubsys subsys) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_level.load(std::memory_order_acquire) == 0xff) {
      // Configure from the environment without logging its warnings (GlobalConfig does that).
      ApplyLocked(ParseConfig(KizunaEnvironment()).config);
    }
  }
  return Enabled(level, subsys);
}

void Write(LogLevel level, LogSubsys subsys, std::string_view message) {
  static constexpr std::string_view kLevel[] = {"NONE", "WARN", "INFO", "TRACE"};
  long tid = syscall(SYS_gettid);
  std::string rank = t_rank >= 0 ? fmt::format(" [rank {}]", t_rank) : std::string();
  // The write happens under the lock: ConfigureLogging may close the old fd, and its number could
  // be reused (by a memfd, a socket) between reading g_fd and writing to it.
  std::lock_guard<std::mutex> lock(g_mu);
  std::string line = fmt::format("{}:{}:{}{} kizuna {} {} {}\n", g_host, getpid(), tid, rank,
                                 kLevel[static_cast<int>(level)], LogSubsysName(subsys), message);
  // One write per line: concurrent processes appending to one file or terminal do not interleave.
  (void)!write(g_fd, line.data(), line.size());
}

}  // namespace log_internal
std::string ExpandPathPattern(const std::string& pattern, int rank) { return ExpandPath(pattern, HostName(), rank); }

}  // namespace kizuna
