// Failures on the staged path (ring and the other algorithms that move data through staging slots
// and fabric connections), as the fused path reports them: the caller's stream says a collective
// failed, and the culprit is named.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

Config StagedConfig(int n, double timeout_s) {
  Config c = WorldConfig(n);
  c.algo = "ring";
  c.timeout_s = timeout_s;
  return c;
}

bool Mentions(const Status& s, const std::string& text) { return s.ToString().find(text) != std::string::npos; }

// Two ranks call AllReduces of different sizes: both fail, and each caller's stream says so on
// its next Synchronize (once: the stream stays usable), not only the communicator's AsyncError.
TEST(StagedFailures, SynchronizeReportsAFailedCollective) {
  World w(2, StagedConfig(2, 20));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 2; ++r) buf.push_back(Alloc(w, r, 8000));
  for (int r = 0; r < 2; ++r) {
    const size_t count = r == 0 ? 1000 : 2000;
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(buf[r]->data(), buf[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(r))
                    .ok());
  }
  for (int r = 0; r < 2; ++r) {
    const Status synced = w.stream(r).Synchronize(Deadline::AfterSeconds(30));
    EXPECT_FALSE(synced.ok()) << "rank " << r << ": the stream carried a failed AllReduce";
    EXPECT_TRUE(Mentions(synced, "allreduce")) << synced.ToString();
    EXPECT_FALSE(w.comm(r).AsyncError().ok());
    EXPECT_TRUE(w.stream(r).Synchronize(Deadline::AfterSeconds(30)).ok()) << "reported once";
  }
}

}  // namespace
}  // namespace kizuna::test
