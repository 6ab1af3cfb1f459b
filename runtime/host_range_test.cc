#include "runtime/host_range.h"

#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

TEST(HostRange, HeapStackAndFreshMappingsPass) {
  std::vector<float> heap(1000);
  EXPECT_TRUE(CheckHostRange(heap.data(), heap.size() * 4, true, "heap").ok());
  int on_stack[16] = {};
  EXPECT_TRUE(CheckHostRange(on_stack, sizeof on_stack, true, "stack").ok());
  // Mapped after the first check read the mappings: found on the second look.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* fresh = mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  EXPECT_TRUE(CheckHostRange(fresh, 4 * page, true, "fresh").ok());
  // Kept mapped: an address unmapped and mapped again differently is the one case the cached
  // mappings cannot tell (host_range.h), and the next test must not get this one back.
}

TEST(HostRange, WildReadOnlyAndOverrunningRangesAreRefused) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* region = static_cast<char*>(mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  ASSERT_EQ(munmap(region + 2 * page, page), 0);         // a hole after two pages
  ASSERT_EQ(mprotect(region + page, page, PROT_READ), 0);  // the second page read-only
  // The first page: fine to read and write.
  EXPECT_TRUE(CheckHostRange(region, page, true, "first").ok());
  // Read-only: may be read (a send buffer), not written (a receive buffer).
  EXPECT_TRUE(CheckHostRange(region + page, page, false, "second").ok());
  const Status ro = CheckHostRange(region + page, page, true, "recv");
  EXPECT_EQ(ro.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ro.ToString().find("read-only"), std::string::npos) << ro.ToString();
  // Running off the end into the hole: too small a buffer.
  const Status over = CheckHostRange(region + page / 2, 2 * page, false, "send");
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.ToString().find("not mapped"), std::string::npos) << over.ToString();
  // Wild: the hole itself, and an address no process maps.
  EXPECT_FALSE(CheckHostRange(region + 2 * page, 16, false, "hole").ok());
  EXPECT_FALSE(CheckHostRange(reinterpret_cast<void*>(0x10), 16, false, "wild").ok());
  EXPECT_FALSE(CheckHostRange(reinterpret_cast<void*>(~uintptr_t{0} - 8), 64, false, "wraps").ok());
  munmap(region, 2 * page);
}

}  // namespace
}  // namespace kizuna
