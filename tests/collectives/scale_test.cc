// Communicators of many ranks in one process (threads mode, over direct links between every pair):
// creation connects nobody — each rank exchanges its handles through the bootstrap and listens on
// one socket — so creating, running and destroying a communicator takes time, descriptors and
// memory in proportion to the peers each rank's plans use, not to the ranks. 64 ranks are created;
// 256 ranks are created, run AllReduces (the model's choice, and a tree, whose ranks connect to
// their parents and children only) with checked results, and are destroyed. The times are printed
// (docs/PERFORMANCE.md keeps the figures).
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Many ranks on a few devices, with a deadline for a machine that runs 256 ranks on few cores.
Config ScaleConfig() {
  Config c = WorldConfig(8);
  c.timeout_s = 300;
  return c;
}

// One AllReduce of `count` floats on every rank (`algorithm`, or the model's choice), checked.
void AllReduceChecked(World& w, std::optional<Algorithm> algorithm, size_t count) {
  std::vector<std::unique_ptr<device::Buffer>> b;
  for (int r = 0; r < w.size(); ++r) {
    b.push_back(Alloc(w, r, count * 4));
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<float>(InputValue(ReduceOp::kSum, r, i));
    ASSERT_TRUE(w.Upload(r, b[r]->data(), values).ok());
  }
  CallOptions call;
  call.algorithm = algorithm;
  // One group, as one thread driving several devices calls them (nccl-tests, kizuna-bench): the
  // calls start together at GroupEnd, instead of the first ranks' executors taking the machine's
  // few cores while this thread still makes the others' calls.
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (int r = 0; r < w.size(); ++r)
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(b[r]->data(), b[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(r), call)
                    .ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  const Status synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << synced.ToString();
  for (int r = 0; r < w.size(); ++r) {
    auto got = w.Download<float>(r, b[r]->data(), count);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ((*got)[i], Reduced(ReduceOp::kSum, w.size(), i, DataType::kFloat32))
          << "rank " << r << " element " << i;
  }
}

TEST(Scale, SixtyFourRanksAreCreated) {
  const auto start = Clock::now();
  auto w = std::make_unique<World>(64, ScaleConfig());
  KZ_ASSERT_WORLD(*w);
  const double created = SecondsSince(start);
  for (int r = 0; r < w->size(); ++r) EXPECT_TRUE(w->comm(r).ConnectedPeers().empty()) << "rank " << r;
  const auto gone = Clock::now();
  w.reset();
  std::printf("64 ranks: created in %.2f s, destroyed in %.2f s\n", created, SecondsSince(gone));
  EXPECT_LT(created, 120.0);
}

TEST(Scale, TwoHundredFiftySixRanksCreateRunAnAllReduceAndGo) {
  constexpr int kRanks = 256;
  const auto start = Clock::now();
  auto w = std::make_unique<World>(kRanks, ScaleConfig());
  KZ_ASSERT_WORLD(*w);
  const double created = SecondsSince(start);
  for (int r = 0; r < kRanks; ++r) ASSERT_TRUE(w->comm(r).ConnectedPeers().empty()) << "rank " << r;

  auto run = Clock::now();
  AllReduceChecked(*w, std::nullopt, kRanks * 4 + 3);
  const double chosen = SecondsSince(run);

  // A tree: each rank connects to its parents and children (two trees at most: a few peers).
  run = Clock::now();
  AllReduceChecked(*w, Algorithm::kTree, kRanks * 4 + 3);
  const double tree = SecondsSince(run);
  size_t most = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<int> peers = w->comm(r).ConnectedPeers();
    EXPECT_GE(peers.size(), 1u) << "rank " << r;
    EXPECT_LE(peers.size(), 6u) << "rank " << r;
    most = std::max(most, peers.size());
  }

  const auto gone = Clock::now();
  w.reset();
  std::printf(
      "256 ranks: created in %.2f s; an AllReduce (the model's choice) %.2f s; a tree AllReduce, connections "
      "included, %.2f s (at most %zu peers per rank); destroyed in %.2f s\n",
      created, chosen, tree, most, SecondsSince(gone));
  EXPECT_LT(created, 300.0);
}

}  // namespace
}  // namespace kizuna::test
