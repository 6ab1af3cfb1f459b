// The executor's containers. PeerSet: ranks kept sorted and once each, in place up to kInline and
// beyond it after a spill, copies independent of their source. FifoQueue: first in, first out, its
// consumed entries dropped when it runs empty or once kMaxConsumed pile up.
#include "collectives/executor/containers.h"

#include <vector>

#include <gtest/gtest.h>

namespace kizuna::collectives::executor_internal {
namespace {

std::vector<int> Items(const PeerSet& s) { return {s.begin(), s.end()}; }

TEST(PeerSet, KeepsRanksSortedAndOnce) {
  PeerSet s;
  EXPECT_TRUE(s.empty());
  EXPECT_TRUE(s.insert(5));
  EXPECT_TRUE(s.insert(1));
  EXPECT_TRUE(s.insert(3));
  EXPECT_FALSE(s.insert(3));
  EXPECT_EQ(Items(s), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(s.count(3), 1u);
  EXPECT_EQ(s.count(4), 0u);
  EXPECT_EQ(s.size(), 3u);
}

TEST(PeerSet, GrowsPastItsInlineRoom) {
  PeerSet s;
  std::vector<int> want;
  for (int r = 40; r >= 0; r -= 2) {
    EXPECT_TRUE(s.insert(r));
    EXPECT_FALSE(s.insert(r));
  }
  for (int r = 0; r <= 40; r += 2) want.push_back(r);
  ASSERT_GT(want.size(), PeerSet::kInline);
  EXPECT_EQ(Items(s), want);
  EXPECT_EQ(s.count(40), 1u);
  EXPECT_EQ(s.count(41), 0u);
}

TEST(PeerSet, CopiesAreIndependent) {
  for (int n : {3, 12}) {  // in place and spilled
    PeerSet a;
    for (int r = 0; r < n; ++r) a.insert(r * 3);
    PeerSet b = a;
    b.insert(1);
    EXPECT_EQ(a.size(), static_cast<size_t>(n));
    EXPECT_EQ(a.count(1), 0u);
    EXPECT_EQ(b.count(1), 1u);
    PeerSet c;
    c.insert(100);
    c = a;
    EXPECT_EQ(Items(c), Items(a));
  }
}

TEST(PeerSet, InsertsARange) {
  PeerSet a, b;
  for (int r : {7, 2, 9}) a.insert(r);
  b.insert(2);
  b.insert(a.begin(), a.end());
  EXPECT_EQ(Items(b), (std::vector<int>{2, 7, 9}));
}

TEST(FifoQueue, FirstInFirstOut) {
  FifoQueue<int> q;
  EXPECT_TRUE(q.empty());
  for (int i = 0; i < 3; ++i) q.push_back(i);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.front(), 0);
  q.pop_front();
  EXPECT_EQ(q.front(), 1);
  EXPECT_EQ(std::vector<int>(q.begin(), q.end()), (std::vector<int>{1, 2}));
  q.pop_front();
  q.pop_front();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.held(), 0u);  // emptied: nothing consumed is kept
}

TEST(FifoQueue, AQueueThatNeverRunsEmptyStaysBounded) {
  FifoQueue<int> q;
  q.push_back(0);
  for (int i = 1; i < 10000; ++i) {
    q.push_back(i);  // one ahead, always
    ASSERT_EQ(q.front(), i - 1);
    q.pop_front();
    ASSERT_EQ(q.size(), 1u);
    ASSERT_LE(q.held(), FifoQueue<int>::kMaxConsumed + 1);
  }
  EXPECT_EQ(q.front(), 9999);
}

}  // namespace
}  // namespace kizuna::collectives::executor_internal
