#include "runtime/core/deadline.h"

#include <chrono>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

using std::chrono::milliseconds;

TEST(DeadlineTest, AfterSecondsLeavesThatLong) {
  const Deadline d = Deadline::AfterSeconds(1.0);
  EXPECT_FALSE(d.Expired());
  EXPECT_GT(d.Remaining(), milliseconds(500));  // room for a busy machine
  EXPECT_LE(d.Remaining(), milliseconds(1000));
  EXPECT_TRUE(Deadline::AfterSeconds(0).Expired());
  EXPECT_EQ(Deadline::AfterSeconds(-1).Remaining().count(), 0);
}

// The coarse clock lags by at most a tick: the deadline is at most that early, never late (taken
// first, it is never after the precise one; the lower bound leaves room for a busy machine).
TEST(DeadlineTest, CoarseIsAtMostATickEarly) {
  const Deadline coarse = Deadline::AfterSecondsCoarse(1.0);
  const Deadline precise = Deadline::AfterSeconds(1.0);
  EXPECT_LE(coarse.when(), precise.when());
  EXPECT_GT(coarse.when(), precise.when() - milliseconds(500));
  EXPECT_FALSE(coarse.Expired());
  EXPECT_TRUE(Deadline::AfterSecondsCoarse(0).Expired());
  EXPECT_TRUE(Deadline::AfterSecondsCoarse(-1).Expired());
}

}  // namespace
}  // namespace kizuna
