// Point-to-point as pipeline-parallel code uses it: Send / Recv between some ranks while the others
// take no part, groups that differ between ranks, several messages to one peer grouped on one
// side and not on the other, and collectives after all of it. Messages are matched per pair of
// ranks in call order (NCCL's semantics); collectives are counted apart and never see them.
// Each case runs with the algorithm the engine chooses and with ring forced (the staged path).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

class PointToPoint : public ::testing::TestWithParam<std::string> {
 protected:
  Config MakeConfig(int n) const {
    Config c = WorldConfig(n);
    c.algo = GetParam();
    return c;
  }
};

std::vector<float> Pattern(size_t count, float base) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = base + static_cast<float>(i % 1000);
  return v;
}

// Every rank's AllReduce of `count` floats of value r + 1, checked: a collective after
// point-to-point traffic among some ranks runs as on a fresh communicator.
void AllReduceEverywhere(World& w, size_t count) {
  const int n = w.size();
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < n; ++r) {
    buf.push_back(Alloc(w, r, count * 4));
    ASSERT_TRUE(w.Upload(r, buf[r]->data(), std::vector<float>(count, static_cast<float>(r + 1))).ok());
  }
  for (int r = 0; r < n; ++r) {
    Status s = w.comm(r).AllReduce(buf[r]->data(), buf[r]->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                   w.stream(r));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  Status synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << synced.ToString();
  const float want = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    Status error = w.comm(r).AsyncError();
    ASSERT_TRUE(error.ok()) << "rank " << r << ": " << error.ToString();
    auto got = w.Download<float>(r, buf[r]->data(), count);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[0], want) << "rank " << r;
    EXPECT_EQ((*got)[count - 1], want) << "rank " << r;
  }
}

TEST_P(PointToPoint, SomeRanksExchangeThenAllCallACollective) {
  World w(3, MakeConfig(3));
  KZ_ASSERT_WORLD(w);
  const size_t count = 4096;
  auto a = Alloc(w, 0, count * 4), b = Alloc(w, 1, count * 4);
  ASSERT_TRUE(w.Upload(0, a->data(), Pattern(count, 5)).ok());
  // Three messages 0 -> 1, rank 2 idle: its collective count must not fall behind.
  for (int k = 0; k < 3; ++k) {
    ASSERT_TRUE(w.comm(0).Send(a->data(), count, DataType::kFloat32, 1, w.stream(0)).ok());
    ASSERT_TRUE(w.comm(1).Recv(b->data(), count, DataType::kFloat32, 0, w.stream(1)).ok());
  }
  ASSERT_TRUE(w.SyncAll().ok());
  auto got = w.Download<float>(1, b->data(), count);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, Pattern(count, 5));
  AllReduceEverywhere(w, 1000);
  // And the other way between 1 and 2, rank 0 idle, before a large collective (two channels).
  ASSERT_TRUE(w.comm(1).Send(b->data(), count, DataType::kFloat32, 2, w.stream(1)).ok());
  auto c = Alloc(w, 2, count * 4);
  ASSERT_TRUE(w.comm(2).Recv(c->data(), count, DataType::kFloat32, 1, w.stream(2)).ok());
  AllReduceEverywhere(w, 300000);
  got = w.Download<float>(2, c->data(), count);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, Pattern(count, 5));
}

// The case that hung: rank 0's group sends 1 MiB to 1; rank 1's group receives it and sends 16 B
// to 2; rank 2's group receives those. Each transfer's chunks and channels must depend on that
// transfer alone, not on what else its rank's group holds.
TEST_P(PointToPoint, GroupsThatDifferBetweenRanks) {
  World w(3, MakeConfig(3));
  KZ_ASSERT_WORLD(w);
  const size_t big = (1 << 20) / 4, small = 4;
  auto src = Alloc(w, 0, big * 4), mid = Alloc(w, 1, big * 4), fwd = Alloc(w, 1, small * 4),
       dst = Alloc(w, 2, small * 4);
  ASSERT_TRUE(w.Upload(0, src->data(), Pattern(big, 1)).ok());
  ASSERT_TRUE(w.Upload(1, fwd->data(), Pattern(small, 7)).ok());
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(Communicator::GroupStart().ok());
    ASSERT_TRUE(w.comm(0).Send(src->data(), big, DataType::kFloat32, 1, w.stream(0)).ok());
    ASSERT_TRUE(Communicator::GroupEnd().ok());
    ASSERT_TRUE(Communicator::GroupStart().ok());
    ASSERT_TRUE(w.comm(1).Recv(mid->data(), big, DataType::kFloat32, 0, w.stream(1)).ok());
    ASSERT_TRUE(w.comm(1).Send(fwd->data(), small, DataType::kFloat32, 2, w.stream(1)).ok());
    ASSERT_TRUE(Communicator::GroupEnd().ok());
    ASSERT_TRUE(Communicator::GroupStart().ok());
    ASSERT_TRUE(w.comm(2).Recv(dst->data(), small, DataType::kFloat32, 1, w.stream(2)).ok());
    ASSERT_TRUE(Communicator::GroupEnd().ok());
    Status synced = w.SyncAll();
    ASSERT_TRUE(synced.ok()) << synced.ToString();
    for (int r = 0; r < 3; ++r) ASSERT_TRUE(w.comm(r).AsyncError().ok()) << w.comm(r).AsyncError().ToString();
    auto got = w.Download<float>(1, mid->data(), big);
    auto got_small = w.Download<float>(2, dst->data(), small);
    ASSERT_TRUE(got.ok() && got_small.ok());
    EXPECT_EQ(*got, Pattern(big, 1));
    EXPECT_EQ(*got_small, Pattern(small, 7));
  }
  AllReduceEverywhere(w, 5000);
}

// Several messages to one peer in one group on the sender, one by one on the receiver (and the
// other way round), of sizes that take one and two channels: matched in call order.
TEST_P(PointToPoint, GroupedOnOneSideOnly) {
  World w(2, MakeConfig(2));
  KZ_ASSERT_WORLD(w);
  const std::vector<size_t> counts = {10, 300000, 64, 200000};
  std::vector<std::unique_ptr<device::Buffer>> out, in;
  for (size_t k = 0; k < counts.size(); ++k) {
    out.push_back(Alloc(w, 0, counts[k] * 4));
    in.push_back(Alloc(w, 1, counts[k] * 4));
    ASSERT_TRUE(w.Upload(0, out[k]->data(), Pattern(counts[k], static_cast<float>(k * 100))).ok());
  }
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (size_t k = 0; k < counts.size(); ++k)
    ASSERT_TRUE(w.comm(0).Send(out[k]->data(), counts[k], DataType::kFloat32, 1, w.stream(0)).ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  for (size_t k = 0; k < counts.size(); ++k)
    ASSERT_TRUE(w.comm(1).Recv(in[k]->data(), counts[k], DataType::kFloat32, 0, w.stream(1)).ok());
  Status synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << synced.ToString();
  for (size_t k = 0; k < counts.size(); ++k) {
    auto got = w.Download<float>(1, in[k]->data(), counts[k]);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, Pattern(counts[k], static_cast<float>(k * 100))) << "message " << k;
  }
  // The receiver groups, the sender does not.
  for (size_t k = 0; k < counts.size(); ++k)
    ASSERT_TRUE(w.comm(1).Send(in[k]->data(), counts[k], DataType::kFloat32, 0, w.stream(1)).ok());
  ASSERT_TRUE(Communicator::GroupStart().ok());
  for (size_t k = 0; k < counts.size(); ++k)
    ASSERT_TRUE(w.comm(0).Recv(out[k]->data(), counts[k], DataType::kFloat32, 1, w.stream(0)).ok());
  ASSERT_TRUE(Communicator::GroupEnd().ok());
  synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << synced.ToString();
  for (size_t k = 0; k < counts.size(); ++k) {
    auto got = w.Download<float>(0, out[k]->data(), counts[k]);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(*got, Pattern(counts[k], static_cast<float>(k * 100))) << "message " << k;
  }
  AllReduceEverywhere(w, 1000);
}

// A collective grouped with point-to-point on some ranks and alone on the others: the
// collective's plan must not depend on the point-to-point calls beside it.
TEST_P(PointToPoint, CollectiveGroupedWithPointToPointOnSomeRanks) {
  World w(3, MakeConfig(3));
  KZ_ASSERT_WORLD(w);
  const size_t count = 300000, msg = 1000;
  std::vector<std::unique_ptr<device::Buffer>> buf;
  for (int r = 0; r < 3; ++r) {
    buf.push_back(Alloc(w, r, count * 4));
    ASSERT_TRUE(w.Upload(r, buf[r]->data(), std::vector<float>(count, static_cast<float>(r + 1))).ok());
  }
  auto m0 = Alloc(w, 0, msg * 4), m1 = Alloc(w, 1, msg * 4);
  ASSERT_TRUE(w.Upload(0, m0->data(), Pattern(msg, 3)).ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(Communicator::GroupStart().ok());
    ASSERT_TRUE(w.comm(r)
                    .AllReduce(buf[r]->data(), buf[r]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(r))
                    .ok());
    if (r == 0) {
      ASSERT_TRUE(w.comm(0).Send(m0->data(), msg, DataType::kFloat32, 1, w.stream(0)).ok());
    } else {
      ASSERT_TRUE(w.comm(1).Recv(m1->data(), msg, DataType::kFloat32, 0, w.stream(1)).ok());
    }
    ASSERT_TRUE(Communicator::GroupEnd().ok());
  }
  ASSERT_TRUE(w.comm(2)
                  .AllReduce(buf[2]->data(), buf[2]->data(), count, DataType::kFloat32, ReduceOp::kSum, w.stream(2))
                  .ok());
  Status synced = w.SyncAll();
  ASSERT_TRUE(synced.ok()) << synced.ToString();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(w.comm(r).AsyncError().ok()) << w.comm(r).AsyncError().ToString();
    auto got = w.Download<float>(r, buf[r]->data(), count);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ((*got)[count - 1], 6.0f) << "rank " << r;
  }
  auto got = w.Download<float>(1, m1->data(), msg);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, Pattern(msg, 3));
  AllReduceEverywhere(w, 1000);
}

// A receive smaller than the message is an error naming both sides, not a hang or a corruption.
TEST_P(PointToPoint, SizeMismatchIsNamed) {
  Config c = MakeConfig(2);
  c.timeout_s = 10;
  World w(2, c);
  KZ_ASSERT_WORLD(w);
  auto a = Alloc(w, 0, 4096), b = Alloc(w, 1, 4096);
  ASSERT_TRUE(w.comm(0).Send(a->data(), 1000, DataType::kFloat32, 1, w.stream(0)).ok());
  ASSERT_TRUE(w.comm(1).Recv(b->data(), 10, DataType::kFloat32, 0, w.stream(1)).ok());
  (void)w.SyncAll();
  const Status error = w.comm(1).AsyncError();
  ASSERT_FALSE(error.ok());
  EXPECT_NE(error.ToString().find("rank 0"), std::string::npos) << error.ToString();
  EXPECT_NE(error.ToString().find("4000"), std::string::npos) << error.ToString();
}

INSTANTIATE_TEST_SUITE_P(Algorithms, PointToPoint, ::testing::Values("", "ring"),
                         [](const auto& info) { return info.param.empty() ? std::string("chosen") : info.param; });

}  // namespace
}  // namespace kizuna::test
