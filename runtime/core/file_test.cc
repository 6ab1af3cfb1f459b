#include "runtime/core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

using Clock = std::chrono::steady_clock;

bool Contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/kz-file-" + name + "-" + std::to_string(::getpid());
}

std::string WriteFile(const std::string& name, const std::string& content) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(ReadFileCappedTest, ReadsAFileWhole) {
  const std::string path = WriteFile("small", std::string("{\"a\": 1}\n\0tail", 14));
  Result<std::string> text = ReadFileCapped(path, 1024);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, std::string("{\"a\": 1}\n\0tail", 14));
  ::unlink(path.c_str());
}

TEST(ReadFileCappedTest, AFileOfExactlyTheCapIsRead) {
  const std::string path = WriteFile("exact", std::string(4096, 'x'));
  Result<std::string> text = ReadFileCapped(path, 4096);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(text->size(), 4096u);
  ::unlink(path.c_str());
}

TEST(ReadFileCappedTest, ALargerFileIsRefusedNamingTheLimit) {
  const std::string path = WriteFile("large", std::string(4097, 'x'));
  Result<std::string> text = ReadFileCapped(path, 4096, "KIZUNA_TOPOLOGY file");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "KIZUNA_TOPOLOGY file " + path + ": larger than 4 KiB");
  ::unlink(path.c_str());
}

// /dev/zero never ends: reading it whole grew a rank to ~12 GB until the OOM killer ended it.
TEST(ReadFileCappedTest, AnEndlessDeviceIsRefusedAfterTheCap) {
  const auto start = Clock::now();
  Result<std::string> text = ReadFileCapped("/dev/zero", kMaxConfigFileBytes, "KIZUNA_TOPOLOGY file");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(), "KIZUNA_TOPOLOGY file /dev/zero: larger than 16 MiB");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

TEST(ReadFileCappedTest, AFifoThatNeverEndsIsRefused) {
  std::signal(SIGPIPE, SIG_IGN);  // the writer ends on EPIPE once the reader has gone
  const std::string path = TempPath("fifo-endless");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  // A reader of our own first, so that the writer's open does not wait and the writer is there
  // before ReadFileCapped reads (a FIFO without a writer reads as empty).
  const int holder = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(holder, 0);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::thread writer([&] {
    const std::string block(4096, '[');
    while (::write(fd, block.data(), block.size()) > 0) {
    }
  });
  Result<std::string> text = ReadFileCapped(path, 64 << 10, "KIZUNA_INA_LAYOUT file");
  ::close(holder);  // the last reader: the writer's next write fails
  writer.join();
  ::close(fd);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(), "KIZUNA_INA_LAYOUT file " + path + ": larger than 64 KiB");
  ::unlink(path.c_str());
}

TEST(ReadFileCappedTest, AFifoWithoutWriterReadsAsEmptyWithoutWaiting) {
  const std::string path = TempPath("fifo-nobody");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const auto start = Clock::now();
  Result<std::string> text = ReadFileCapped(path, 1024);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  ::unlink(path.c_str());
}

TEST(ReadFileCappedTest, ASilentWriterEndsAtTheDeadline) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string path = "/proc/self/fd/" + std::to_string(fds[0]);
  const auto start = Clock::now();
  Result<std::string> text = ReadFileCapped(path, 1024, "file", 0.2);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(Contains(text.status().message(), "no data within 0.2 s")) << text.status().message();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(ReadFileCappedTest, APipeIsReadUntilItsWriterCloses) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ssize_t n = ::write(fds[1], "hello ", 6);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    n += ::write(fds[1], "world", 5);
    EXPECT_EQ(n, 11);
    ::close(fds[1]);
  });
  Result<std::string> text = ReadFileCapped("/proc/self/fd/" + std::to_string(fds[0]), 1024);
  writer.join();
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "hello world");
  ::close(fds[0]);
}

TEST(ReadFileCappedTest, MissingFilesAndDirectoriesAreNamed) {
  Result<std::string> missing = ReadFileCapped("/nonexistent/kizuna/t.json", 1024, "topology file");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      Contains(missing.status().message(), "topology file /nonexistent/kizuna/t.json: cannot open: No such file"))
      << missing.status().message();
  Result<std::string> dir = ReadFileCapped("/", 1024, "topology file");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.status().message(), "topology file /: is a directory");
}

TEST(ReadFileCappedTest, ByteSizeNames) {
  EXPECT_EQ(ByteSizeName(16 << 20), "16 MiB");
  EXPECT_EQ(ByteSizeName(4096), "4 KiB");
  EXPECT_EQ(ByteSizeName(size_t{2} << 30), "2 GiB");
  EXPECT_EQ(ByteSizeName(1000), "1000 bytes");
  EXPECT_EQ(ByteSizeName(0), "0 bytes");
}

}  // namespace
}  // namespace kizuna
