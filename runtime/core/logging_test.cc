#include "runtime/core/logging.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(LoggingTest, LevelsSubsystemsAndLineFormat) {
  std::string pattern = ::testing::TempDir() + "/kz-log-%h-%p.txt";
  Config c;
  c.debug = LogLevel::kInfo;
  c.debug_subsys = kLogDevice | kLogInit;
  c.debug_file = pattern;
  ConfigureLogging(c);
  EXPECT_TRUE(LogEnabled(LogLevel::kInfo, kLogDevice));
  EXPECT_FALSE(LogEnabled(LogLevel::kTrace, kLogDevice));
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo, kLogFabric));
  std::thread([] {
    SetLogRank(3);
    KZ_INFO(kLogDevice, "allocated {} bytes", 4096);
  }).join();
  KZ_INFO(kLogFabric, "filtered out by subsystem");
  KZ_TRACE(kLogDevice, "filtered out by level");
  KZ_WARN(kLogInit, "no rank here");
  ConfigureLogging(Config{});  // back to stderr, closes the file

  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string path = ::testing::TempDir() + "/kz-log-" + host + "-" + std::to_string(getpid()) + ".txt";
  std::string text = ReadFile(path);
  std::string prefix = std::string(host) + ":" + std::to_string(getpid()) + ":";
  EXPECT_NE(text.find(prefix), std::string::npos) << text;
  EXPECT_NE(text.find(" [rank 3] kizuna INFO DEVICE allocated 4096 bytes\n"), std::string::npos) << text;
  EXPECT_NE(text.find(" kizuna WARN INIT no rank here\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("filtered out"), std::string::npos) << text;
  std::remove(path.c_str());
}

TEST(LoggingTest, DefaultIsWarnOnly) {
  ConfigureLogging(Config{});
  EXPECT_TRUE(LogEnabled(LogLevel::kWarn, kLogColl));
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo, kLogColl));
}

}  // namespace
}  // namespace kizuna
