#include "collectives/plan/topology.h"

#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/plan/rings.h"

namespace kizuna::collectives {
namespace {

RankDesc Rank(const std::string& host, int cpus) {
  RankDesc r;
  r.host_id = host;
  r.device = "host_emulated:" + host;
  r.copy_gbps = 28.5;
  r.reduce_gbps = 43.25;
  r.launch_us = 4.2;
  r.host_cpus = cpus;
  r.host_compute = true;
  return r;
}

LinkDesc Link(double gbps, bool staged) {
  LinkDesc l;
  l.reachable = true;
  l.latency_us = 1.5;
  l.gbps = gbps;
  l.staged = staged;
  return l;
}

TEST(Shape, SerializeRoundTrips) {
  CommTopology s = CommTopology::Uniform(3, Rank("a", 2), Link(25, true));
  s.ranks[2] = Rank("b", 16);
  s.link(0, 2) = Link(12.5, false);
  s.link(1, 2).paced = true;
  s.link(2, 0).hops = 3;
  s.link(0, 1).cables = 2;
  s.direct = true;
  s.direct_inline_bytes = 16 << 10;
  Result<CommTopology> back = CommTopology::Deserialize(s.Serialize());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->Serialize(), s.Serialize());
  EXPECT_EQ(back->ranks[2].host_id, "b");
  EXPECT_EQ(back->ranks[2].host_cpus, 16);
  EXPECT_FALSE(back->link(0, 2).staged);
  EXPECT_EQ(back->link(0, 2).gbps, 12.5);
  EXPECT_TRUE(back->link(1, 2).paced);
  EXPECT_FALSE(back->link(0, 2).paced);
  EXPECT_EQ(back->link(2, 0).hops, 3);
  EXPECT_EQ(back->link(0, 2).hops, 1);
  EXPECT_EQ(back->link(0, 1).cables, 2);
  EXPECT_EQ(back->link(1, 0).cables, 1);
  EXPECT_TRUE(back->direct);
  EXPECT_EQ(back->direct_inline_bytes, 16u << 10);
}

// A shape that repeats every 2 ranks keeps 2 rows: the link from a to b is the link from a - 2k
// to b - 2k (modulo the ranks), and it reads, validates and serializes as the full shape would.
TEST(Shape, PeriodicShapesKeepOnePeriodOfRows) {
  CommTopology periodic = CommTopology::Uniform(6, 2, Rank("a", 2), Link(25, true));
  EXPECT_EQ(periodic.links.size(), 12u);
  EXPECT_EQ(periodic.link_rows(), 2);
  periodic.link(0, 1) = Link(400, false);  // within a pair of ranks: fast
  periodic.link(1, 0) = Link(400, false);
  periodic.link(1, 4) = Link(5, true);  // and so 3 -> 0 and 5 -> 2
  CommTopology full = CommTopology::Uniform(6, Rank("a", 2), Link(25, true));
  for (int a = 0; a < 6; a += 2) {
    full.link(a, a + 1) = full.link(a + 1, a) = Link(400, false);
    full.link(a + 1, (a + 4) % 6) = Link(5, true);
  }
  for (int a = 0; a < 6; ++a)
    for (int b = 0; b < 6; ++b) {
      EXPECT_EQ(periodic.link(a, b).gbps, full.link(a, b).gbps) << a << "->" << b;
      EXPECT_EQ(periodic.link(a, b).reachable, full.link(a, b).reachable) << a << "->" << b;
    }
  EXPECT_TRUE(periodic.Validate().ok());
  EXPECT_TRUE(periodic.FullyConnected());
  EXPECT_EQ(periodic.Serialize(), full.Serialize());
  periodic.link(1, 0).reachable = false;
  EXPECT_FALSE(periodic.FullyConnected());  // 3 -> 2 and 5 -> 4 as well
  periodic.link_period = 4;                 // 4 does not divide 6
  EXPECT_NE(periodic.Validate().message().find("link period of 4 for 6 ranks"), std::string::npos);
}

TEST(Shape, DeserializeRefusesTruncatedAndTrailingBytes) {
  const std::vector<uint8_t> bytes = CommTopology::Uniform(2, Rank("a", 2), Link(25, true)).Serialize();
  for (size_t cut : {size_t{0}, size_t{5}, bytes.size() / 2, bytes.size() - 1}) {
    const std::vector<uint8_t> shorter(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut));
    EXPECT_FALSE(CommTopology::Deserialize(shorter).ok()) << cut << " bytes";
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  Result<CommTopology> r = CommTopology::Deserialize(longer);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos) << r.status().ToString();
}

// What every rank does at creation: encode its row, then decode every rank's into one shape.
TEST(Shape, RankRowsBuildTheSameShapeOnEveryRank) {
  const int n = 3;
  std::vector<std::vector<uint8_t>> rows;
  for (int r = 0; r < n; ++r) {
    std::vector<LinkDesc> row(n);
    for (int q = 0; q < n; ++q)
      if (q != r) row[static_cast<size_t>(q)] = Link(10.0 * (r + 1) + q, q == 0);
    const LinkDesc extra[1] = {Link(100 + r, false)};
    std::vector<LinkDesc> with_extra = row;
    with_extra.push_back(extra[0]);
    rows.push_back(EncodeRankRow(Rank(r < 2 ? "a" : "b", 2 + r), with_extra));
  }
  CommTopology shape;
  shape.nranks = n;
  shape.ranks.resize(n);
  shape.links.resize(n * n);
  std::vector<LinkDesc> extras(n);
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(DecodeRankRow(rows[static_cast<size_t>(r)], r, shape, std::span(&extras[static_cast<size_t>(r)], 1)).ok());
  EXPECT_TRUE(shape.Validate().ok());
  EXPECT_EQ(shape.host_count(), 2);
  EXPECT_EQ(shape.ranks[2].host_cpus, 4);
  EXPECT_EQ(shape.link(1, 2).gbps, 22);
  EXPECT_TRUE(shape.link(2, 0).staged);
  EXPECT_FALSE(shape.link(0, 0).reachable);
  EXPECT_EQ(extras[2].gbps, 102);
}

TEST(Shape, MalformedRankRowNamesTheRank) {
  std::vector<LinkDesc> row(2);
  row[1] = Link(25, true);
  std::vector<uint8_t> bytes = EncodeRankRow(Rank("a", 2), row);
  CommTopology shape;
  shape.nranks = 2;
  shape.ranks.resize(2);
  shape.links.resize(4);
  bytes.pop_back();
  Status s = DecodeRankRow(bytes, 1, shape);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
  // A row with links the decoder does not expect (an INA job's extra cable) is malformed too.
  bytes = EncodeRankRow(Rank("a", 2), row);
  bytes.push_back(0);
  EXPECT_FALSE(DecodeRankRow(bytes, 0, shape).ok());
}

}  // namespace
}  // namespace kizuna::collectives

namespace kizuna::collectives {
namespace {

// A shape whose only links are the given pairs, both ways.
CommTopology Linked(int n, const std::vector<std::pair<int, int>>& pairs) {
  CommTopology t = CommTopology::Uniform(n, RankDesc{"host", "emu:"}, LinkDesc{});
  for (auto [a, b] : pairs) t.link(a, b).reachable = t.link(b, a).reachable = true;
  return t;
}

TEST(RingOrderTest, RankOrderWhereItGoesRoundElseACycleOverTheLinks) {
  EXPECT_EQ(RingOrder(CommTopology::Uniform(4, RankDesc{"host", "emu:"}, LinkDesc{true})),
            (std::vector<int>{0, 1, 2, 3}));
  // A 2 x 2 torus: 1 and 2 are diagonal.
  EXPECT_EQ(RingOrder(Linked(4, {{0, 1}, {2, 3}, {0, 2}, {1, 3}})), (std::vector<int>{0, 1, 3, 2}));
  // Hosts cabled in a ring out of rank order.
  const CommTopology shuffled = Linked(5, {{0, 3}, {3, 1}, {1, 4}, {4, 2}, {2, 0}});
  const std::vector<int> order = RingOrder(shuffled);
  ASSERT_EQ(order.size(), 5u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_TRUE(shuffled.Reachable(order[i], order[(i + 1) % 5]));
  EXPECT_FALSE(IsRankOrder(order));
  // A line has no cycle.
  EXPECT_TRUE(RingOrder(Linked(3, {{0, 1}, {1, 2}})).empty());
}

}  // namespace
}  // namespace kizuna::collectives
