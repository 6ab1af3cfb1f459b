// Emulated allocations past a process limit (memory.cc): ulimit -f, which applies to the memfd of
// every allocation and would otherwise end the process with SIGXFSZ, and ulimit -v, which the
// mapping counts against. Each is an error naming the limit and what to do. The limits are set in
// a child (a death test), so that this process keeps its own.

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>

#include <gtest/gtest.h>

#include "devices/host_emulated/test_util.h"

namespace kizuna::host_emulated::test {
namespace {

// Allocates `bytes` on an emulated device after `limit` is set to `value`; exits 0 when the
// allocation failed with kOutOfMemory and a message holding every one of `expected`.
void AllocateUnder(int limit, rlim_t value, size_t bytes, std::initializer_list<const char*> expected) {
  Emu emu(SmallConfig());
  rlimit l{value, value};
  if (::setrlimit(limit, &l) != 0) {
    std::fprintf(stderr, "setrlimit failed\n");
    std::exit(2);
  }
  auto r = emu.dev(0).Allocate(bytes);
  if (r.ok()) {
    std::fprintf(stderr, "the allocation of %zu bytes succeeded\n", bytes);
    std::exit(3);
  }
  std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
  bool ok = r.status().code() == StatusCode::kOutOfMemory;
  for (const char* e : expected) ok = ok && r.status().message().find(e) != std::string::npos;
  std::exit(ok ? 0 : 1);
}

// This process's address space now, from /proc/self/statm (pages).
rlim_t AddressSpaceBytes() {
  std::ifstream in("/proc/self/statm");
  unsigned long pages = 0;
  in >> pages;
  return static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
}

TEST(HostEmulatedMemoryLimitsDeathTest, FileSizeLimitIsNamedNotSigxfsz) {
  EXPECT_EXIT(AllocateUnder(RLIMIT_FSIZE, 1 << 20, 4 << 20, {"4194304 bytes", "1048576 bytes (ulimit -f)"}),
              testing::ExitedWithCode(0), "ulimit -f");
}

TEST(HostEmulatedMemoryLimitsDeathTest, AddressSpaceLimitIsNamed) {
  // Room for the stream threads and the test's own allocations, not for 256 MiB more.
  const rlim_t limit = AddressSpaceBytes() + (rlim_t{64} << 20);
  EXPECT_EXIT(AllocateUnder(RLIMIT_AS, limit, size_t{256} << 20, {"268435456 bytes", "(ulimit -v)"}),
              testing::ExitedWithCode(0), "ulimit -v");
}

}  // namespace
}  // namespace kizuna::host_emulated::test
