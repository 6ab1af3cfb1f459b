// Logging with levels and subsystems, in the habit NCCL users know (NCCL_DEBUG=INFO):
//
//   KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT,DEVICE ./app
//   myhost:12345:12350 [rank 3] kizuna INFO DEVICE emulated device 0: 16.0 GiB, memfd-backed ...
//
// Each line names host, pid, thread id, the rank when the thread has one (SetLogRank), the level
// and the subsystem, and is written with one write() so lines of concurrent processes do not
// interleave. Thread-safe. The level check is one relaxed atomic load when a level is disabled.
#pragma once

#include <atomic>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "runtime/core/config.h"

namespace kizuna {

// Applies level, subsystems and file from a Config (GlobalConfig() calls this). Until it is called
// the settings come from the environment, read on the first log call.
void ConfigureLogging(const Config& config);

// The rank printed on this thread's lines; -1 (default) prints none.
void SetLogRank(int rank);

// A file name pattern expanded: %h the host name, %p the process id, %r `rank` (where given, else
// left as it is), %% a percent sign (KIZUNA_DEBUG_FILE, KIZUNA_DUMP_ON_TIMEOUT).
std::string ExpandPathPattern(const std::string& pattern, int rank = -1);
int LogRank();

namespace log_internal {
extern std::atomic<uint32_t> g_level;  // 0xff: not yet configured
extern std::atomic<uint32_t> g_subsys;
bool EnabledSlow(LogLevel level, LogSubsys subsys);
inline bool Enabled(LogLevel level, LogSubsys subsys) {
  uint32_t l = g_level.load(std::memory_order_relaxed);
  if (l == 0xff) return EnabledSlow(level, subsys);
  return static_cast<uint32_t>(level) <= l && (g_subsys.load(std::memory_order_relaxed) & subsys) != 0;
}
void Write(LogLevel level, LogSubsys subsys, std::string_view message);
}  // namespace log_internal

inline bool LogEnabled(LogLevel level, LogSubsys subsys) { return log_internal::Enabled(level, subsys); }

template <typename... Args>
void Log(LogLevel level, LogSubsys subsys, fmt::format_string<Args...> format, Args&&... args) {
  if (!log_internal::Enabled(level, subsys)) return;
  log_internal::Write(level, subsys, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kizuna

#define KZ_WARN(subsys, ...) ::kizuna::Log(::kizuna::LogLevel::kWarn, subsys, __VA_ARGS__)
#define KZ_INFO(subsys, ...) ::kizuna::Log(::kizuna::LogLevel::kInfo, subsys, __VA_ARGS__)
#define KZ_TRACE(subsys, ...) ::kizuna::Log(::kizuna::LogLevel::kTrace, subsys, __VA_ARGS__)
