// The descriptions of limits that errors about refused memory and shared-memory space carry.
#include "runtime/core/resources.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Resources, ApproxByteSize) {
  EXPECT_EQ(ApproxByteSize(0), "0 bytes");
  EXPECT_EQ(ApproxByteSize(1023), "1023 bytes");
  EXPECT_EQ(ApproxByteSize(65536), "64.0 KiB");
  EXPECT_EQ(ApproxByteSize(uint64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(ApproxByteSize(uint64_t{1} << 40), "1.0 TiB");
}

TEST(Resources, SpaceOfATmpfs) {
  auto s = SpaceOf("/dev/shm");
  if (!s.ok()) GTEST_SKIP() << s.status().ToString();
  EXPECT_GT(s->size_bytes, 0u);
  EXPECT_LE(s->free_bytes, s->size_bytes);
  EXPECT_TRUE(Contains(DescribeSpace("/dev/shm"), "/dev/shm has ")) << DescribeSpace("/dev/shm");
}

TEST(Resources, SpaceOfAMissingPathSaysWhy) {
  const std::string d = DescribeSpace("/no/such/kizuna/dir");
  EXPECT_TRUE(Contains(d, "/no/such/kizuna/dir")) << d;
  EXPECT_TRUE(Contains(d, "No such file")) << d;
}

TEST(Resources, MemoryLimitsNameTheHostAndTheirSources) {
  const std::string d = DescribeMemoryLimits();
  EXPECT_TRUE(Contains(d, "available of")) << d;
  EXPECT_TRUE(Contains(d, "/proc/meminfo")) << d;
  if (auto cg = CgroupMemory()) {
    EXPECT_TRUE(Contains(d, cg->file)) << d;
    EXPECT_GT(cg->limit_bytes, 0u);
  }
}

// ulimit -v and ulimit -f as a child process sets them (the test's own limits stay).
TEST(Resources, ProcessLimitsAreNamed) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit as{uint64_t{64} << 30, uint64_t{64} << 30}, fsize{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_AS, &as) != 0 || ::setrlimit(RLIMIT_FSIZE, &fsize) != 0) _exit(2);
    const std::string d = DescribeMemoryLimits();
    const bool ok = Contains(d, "limited to 64.0 GiB (ulimit -v)") && FileSizeLimit() == uint64_t{1} << 20;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace kizuna
