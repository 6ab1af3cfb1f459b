// Tests: the log lines of a scope, in a file (KIZUNA_DEBUG_FILE) read back by Text(). Logging
// returns to its default (stderr, WARN) when the scope ends.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/core/logging.h"

namespace kizuna::testing {

class LogCapture {
 public:
  // Lines of `subsystems` (a LogSubsys mask) up to `level`.
  LogCapture(LogLevel level, uint32_t subsystems) {
    path_ =
        ::testing::TempDir() + "/log-capture-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++) + ".log";
    Config c;
    c.debug = level;
    c.debug_subsys = subsystems;
    c.debug_file = path_;
    ConfigureLogging(c);
  }
  ~LogCapture() {
    ConfigureLogging(Config{});
    std::remove(path_.c_str());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // What was logged so far (the file is closed first).
  std::string Text() {
    ConfigureLogging(Config{});
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

}  // namespace kizuna::testing
