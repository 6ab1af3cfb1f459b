// Revoke and Shrink (ncclCommRevoke, ncclCommShrink) between ranks that are threads of this
// process: the survivors of a lost rank make a communicator of their own and go on with exact
// results; a revoked communicator fails its peers at once; bad exclusion lists are refused.
// tests/collectives/survive_test.sh does the same between processes, with ranks killed and frozen.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using Clock = std::chrono::steady_clock;

bool Mentions(const Status& s, const std::string& text) { return s.ToString().find(text) != std::string::npos; }

// Each caller's Shrink(exclude) on its own thread, as the survivors of a job would call it.
std::vector<Result<std::unique_ptr<Communicator>>> ShrinkOn(World& w, const std::vector<int>& callers,
                                                            const std::vector<int>& exclude,
                                                            ShrinkMode mode = ShrinkMode::kAbort) {
  std::vector<Result<std::unique_ptr<Communicator>>> out;
  for (size_t i = 0; i < callers.size(); ++i) out.emplace_back(Internal("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < callers.size(); ++i)
    threads.emplace_back([&, i] { out[i] = w.comm(callers[i]).Shrink(exclude, mode); });
  for (auto& t : threads) t.join();
  return out;
}

// An AllReduce of 10007 floats over `comms` (comms[i] on world rank ranks[i]), rank i giving i + 1
// everywhere: every rank must get the exact sum.
void ExpectSum(World& w, const std::vector<int>& ranks, const std::vector<Communicator*>& comms) {
  constexpr size_t kCount = 10007;
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (size_t i = 0; i < ranks.size(); ++i) {
    b.push_back(Alloc(w, ranks[i], kCount * sizeof(float)));
    ASSERT_NE(b.back(), nullptr);
    ASSERT_TRUE(w.Upload(ranks[i], b[i]->data(), std::vector<float>(kCount, static_cast<float>(i + 1))).ok());
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    ASSERT_TRUE(
        comms[i]
            ->AllReduce(b[i]->data(), b[i]->data(), kCount, DataType::kFloat32, ReduceOp::kSum, w.stream(ranks[i]))
            .ok());
  }
  const float want = static_cast<float>(ranks.size() * (ranks.size() + 1) / 2);
  for (size_t i = 0; i < ranks.size(); ++i) {
    ASSERT_TRUE(w.stream(ranks[i]).Synchronize(Deadline::AfterSeconds(60)).ok()) << "rank " << ranks[i];
    auto got = w.Download<float>(ranks[i], b[i]->data(), kCount);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t k = 0; k < kCount; ++k) ASSERT_EQ((*got)[k], want) << "world rank " << ranks[i] << " element " << k;
  }
}

Config ShrinkConfig(int n) {
  Config c = WorldConfig(n);
  c.timeout_s = 60;
  return c;
}

// Rank `lost` goes away (its communicator aborts, as a process's would close): the others fail
// naming it, shrink without it, and go on with exact results, twice in a row.
void SurviveTheLossOf(int lost) {
  World w(4, ShrinkConfig(4));
  KZ_ASSERT_WORLD(w);
  w.comm(lost).Abort();
  std::vector<int> survivors;
  for (int r = 0; r < 4; ++r)
    if (r != lost) survivors.push_back(r);
  std::vector<std::unique_ptr<device::Buffer>> b;
  const auto start = Clock::now();
  for (int r : survivors) {
    b.push_back(Alloc(w, r, 4096));
    ASSERT_TRUE(
        w.comm(r)
            .AllReduce(b.back()->data(), b.back()->data(), 1000, DataType::kFloat32, ReduceOp::kSum, w.stream(r))
            .ok());
  }
  for (int r : survivors) {
    Status s = w.stream(r).Synchronize(Deadline::AfterSeconds(60));
    EXPECT_FALSE(s.ok()) << "rank " << r;
    EXPECT_TRUE(Mentions(w.comm(r).AsyncError(), fmt::format("rank {}", lost))) << w.comm(r).AsyncError().ToString();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0)
      << "the survivors waited for the timeout";
  auto shrunk = ShrinkOn(w, survivors, {lost});
  std::vector<Communicator*> comms;
  for (size_t i = 0; i < survivors.size(); ++i) {
    ASSERT_TRUE(shrunk[i].ok()) << shrunk[i].status().ToString();
    EXPECT_EQ((*shrunk[i])->size(), 3);
    EXPECT_EQ((*shrunk[i])->rank(), static_cast<int>(i));
    comms.push_back(shrunk[i]->get());
  }
  ExpectSum(w, survivors, comms);
  ExpectSum(w, survivors, comms);
}

TEST(Shrink, SurvivorsOfALostRankGoOn) { SurviveTheLossOf(2); }

// Rank 0 is the parent's first rank (the root of a job's bootstrap): the survivors need it not.
TEST(Shrink, SurvivorsOfALostRankZeroGoOn) { SurviveTheLossOf(0); }

// kDefault with nothing in flight: the parent stays usable beside the child.
TEST(Shrink, DefaultModeLeavesTheParentUsable) {
  World w(4, ShrinkConfig(4));
  KZ_ASSERT_WORLD(w);
  auto shrunk = ShrinkOn(w, {0, 1, 2}, {3}, ShrinkMode::kDefault);
  std::vector<Communicator*> comms;
  for (auto& c : shrunk) {
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    comms.push_back(c->get());
  }
  ExpectSum(w, {0, 1, 2}, comms);
  ExpectSum(w, {0, 1, 2, 3}, {&w.comm(0), &w.comm(1), &w.comm(2), &w.comm(3)});
}

TEST(Shrink, RefusesBadListsAtOnce) {
  World w(4, ShrinkConfig(4));
  KZ_ASSERT_WORLD(w);
  const std::vector<int> out_of_range = {4}, negative = {-1}, twice = {3, 3}, self = {0, 3};
  auto a = w.comm(0).Shrink(out_of_range);
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Mentions(a.status(), "excluded rank 4 is not a rank (size 4)")) << a.status().ToString();
  EXPECT_EQ(w.comm(0).Shrink(negative).status().code(), StatusCode::kInvalidArgument);
  auto b = w.comm(0).Shrink(twice);
  EXPECT_TRUE(Mentions(b.status(), "rank 3 is excluded twice")) << b.status().ToString();
  auto c = w.comm(0).Shrink(self);
  EXPECT_TRUE(Mentions(c.status(), "rank 0 excludes itself")) << c.status().ToString();
  // Nothing was revoked: the communicator still works.
  ExpectSum(w, {0, 1, 2, 3}, {&w.comm(0), &w.comm(1), &w.comm(2), &w.comm(3)});
}

// Survivors that disagree on whom to exclude all fail (none waits for its deadline), naming the
// two lists.
TEST(Shrink, DifferentListsFailEveryCaller) {
  World w(4, ShrinkConfig(4));
  KZ_ASSERT_WORLD(w);
  std::vector<Result<std::unique_ptr<Communicator>>> out;
  for (int i = 0; i < 3; ++i) out.emplace_back(Internal("not run"));
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      // Ranks 0 and 1 exclude rank 3, rank 2 excludes ranks 1 and 3: its group is ranks 0 and 2.
      const std::vector<int> exclude = r == 2 ? std::vector<int>{1, 3} : std::vector<int>{3};
      out[r] = w.comm(r).Shrink(exclude);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(out[r].ok()) << "rank " << r;
  EXPECT_TRUE(Mentions(out[0].status(), "excludes 3 and rank 2 excludes 1, 3")) << out[0].status().ToString();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0);
}

// Revoke: the peers blocked in an AllReduce fail at once, naming the revocation; later calls on the
// revoked communicator are refused; a Shrink that excludes nobody makes a fresh one of every rank.
TEST(Revoke, FailsThePeersAtOnceAndShrinkStartsAfresh) {
  World w(4, ShrinkConfig(4));
  KZ_ASSERT_WORLD(w);
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < 4; ++r) b.push_back(Alloc(w, r, 4096));
  const auto start = Clock::now();
  for (int r = 1; r < 4; ++r) {
    ASSERT_TRUE(
        w.comm(r).AllReduce(b[r]->data(), b[r]->data(), 1000, DataType::kFloat32, ReduceOp::kSum, w.stream(r)).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them wait for rank 0
  w.comm(0).Revoke();
  for (int r = 1; r < 4; ++r) {
    EXPECT_FALSE(w.stream(r).Synchronize(Deadline::AfterSeconds(60)).ok()) << "rank " << r;
    EXPECT_TRUE(Mentions(w.comm(r).AsyncError(), "revoked")) << w.comm(r).AsyncError().ToString();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0) << "the peers waited for the timeout";
  Status later = w.comm(0).AllReduce(b[0]->data(), b[0]->data(), 1000, DataType::kFloat32, ReduceOp::kSum, w.stream(0));
  if (later.ok()) later = w.stream(0).Synchronize(Deadline::AfterSeconds(60));
  EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
  auto fresh = ShrinkOn(w, {0, 1, 2, 3}, {});
  std::vector<Communicator*> comms;
  for (auto& c : fresh) {
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    comms.push_back(c->get());
  }
  ExpectSum(w, {0, 1, 2, 3}, comms);
}

}  // namespace
}  // namespace kizuna::test
