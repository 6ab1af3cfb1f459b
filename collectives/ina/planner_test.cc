#include "collectives/ina/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kizuna::collectives::ina {
namespace {

// The optimum's order, independent of the planner's code: more value, fewer devices, fewer ports.
struct Totals {
  int64_t value = 0, aggregators = 0, ports = 0;
  bool operator==(const Totals&) const = default;
  bool BetterThan(const Totals& o) const {
    if (value != o.value) return value > o.value;
    if (aggregators != o.aggregators) return aggregators < o.aggregators;
    return ports < o.ports;
  }
};

Totals Recount(const Selection& s) {
  Totals t;
  for (const Pick& p : s.picks) {
    EXPECT_GT(p.count, 0);
    t.value += p.item.value * p.count;
    t.aggregators += int64_t{p.item.aggregators} * p.count;
    t.ports += p.item.worker_ports * p.count;
  }
  EXPECT_EQ(t.value, s.value);
  EXPECT_EQ(t.aggregators, s.aggregators);
  EXPECT_EQ(t.ports, s.worker_ports);
  return t;
}

// Every multiset of items within the limits, by recursion over the items.
Totals BruteForce(const std::vector<Item>& items, int64_t aggregators, int64_t ports) {
  Totals best;
  std::function<void(size_t, Totals)> walk = [&](size_t i, Totals t) {
    if (i == items.size()) {
      if (t.BetterThan(best)) best = t;
      return;
    }
    for (Totals u = t; u.aggregators <= aggregators && u.ports <= ports;) {
      walk(i + 1, u);
      u.value += items[i].value;
      u.aggregators += items[i].aggregators;
      u.ports += items[i].worker_ports;
    }
  };
  walk(0, Totals{});
  return best;
}

std::string Name(const Problem& p) {
  return "N=" + std::to_string(p.workers) + " M=" + std::to_string(p.aggregators) + " D=" +
         std::to_string(p.worker_ports) + " E=" + std::to_string(p.aggregator_ports);
}

double Ratio(const Problem& p, double bandwidth) { return bandwidth / RingBandwidth(p); }

TEST(InaPlanner, ItemsFollowTheModelTable) {
  const Problem p{16, 4, 8, 8};
  EXPECT_EQ(FullTreeAggregators(16, 8), 3);  // docs/ALGORITHMS.md: 3 for N=16, E=8
  EXPECT_EQ(FullTreeAggregators(128, 4), 63);
  EXPECT_EQ(FullTreeAggregators(8, 8), 1);
  EXPECT_EQ(FullTreeAggregators(9, 8), 2);
  EXPECT_EQ(FullTreeAggregators(2, 3), 1);
  const std::vector<Item> items = EnumerateItems(p);
  // Values are bandwidth x 2(N-1): 30 for a tree-like part (1), 16 for a ring (16/30).
  const std::vector<Item> want = {
      {PartKind::kFullTree, 3, 16, 30},   {PartKind::kPartialTree, 2, 32 - 14, 30},
      {PartKind::kPartialTree, 1, 32 - 8, 30}, {PartKind::kLine, 0, 30, 30},
      {PartKind::kRing, 0, 16, 16},
  };
  EXPECT_EQ(items, want);
  Selection ring;
  ring.value = 16;
  EXPECT_DOUBLE_EQ(ring.bandwidth(16), 16.0 / 30);
  EXPECT_DOUBLE_EQ(RingBandwidth(p), 8 * 16.0 / 30);
}

TEST(InaPlanner, DpAndClosedFormMatchBruteForce) {
  int cases = 0;
  for (int n = 2; n <= 12; ++n)
    for (int d = 1; d <= 4; ++d)
      for (int e = 3; e <= 6; ++e)
        for (int m = 0; m <= 6; ++m) {
          const Problem p{n, m, d, e};
          const std::vector<Item> items = EnumerateItems(p);
          const int64_t ports = int64_t{n} * d;
          const Totals want = BruteForce(items, m, ports);
          const Selection dp = SolveDp(items, m, ports);
          ASSERT_EQ(Recount(dp), want) << Name(p);
          const Selection closed = SolveClosedForm(p);
          ASSERT_EQ(Recount(closed), want) << Name(p);
          ASSERT_EQ(Recount(Canonical(p, dp)), want) << Name(p);
          ++cases;
        }
  EXPECT_EQ(cases, 11 * 4 * 4 * 7);
}

TEST(InaPlanner, DpHandlesAnyItems) {
  // Items outside the model: dominated ones, a duplicate, one too large, ports with a common gcd.
  const std::vector<Item> items = {
      {PartKind::kRing, 0, 6, 5}, {PartKind::kRing, 0, 6, 5},  {PartKind::kLine, 0, 9, 5},
      {PartKind::kFullTree, 2, 3, 4}, {PartKind::kPartialTree, 1, 12, 9}, {PartKind::kFullTree, 50, 3, 99},
  };
  for (int m = 0; m <= 7; ++m)
    for (int ports = 0; ports <= 40; ++ports) {
      DpStats st;
      const Selection s = SolveDp(items, m, ports, &st);
      ASSERT_EQ(Recount(s), BruteForce(items, m, ports)) << "M=" << m << " P=" << ports;
      for (const Pick& pk : s.picks) EXPECT_NE(pk.item.worker_ports, 9) << "the dominated line was chosen";
    }
  DpStats st;
  SolveDp(items, 7, 36, &st);
  EXPECT_EQ(st.items, 3);  // the duplicate ring, the dominated line and the device hog are dropped
  EXPECT_EQ(st.gcd, 3);
  EXPECT_EQ(st.columns, 36 / 3 + 1);
  EXPECT_EQ(st.rows, std::min<int64_t>(7, (36 / 3) * 2) + 1);
}

TEST(InaPlanner, ClosedFormMatchesDpOnLargerShapes) {
  int cases = 0;
  for (int n : {13, 16, 17, 32, 33, 64, 100})
    for (int d : {1, 2, 3, 5, 8, 16})
      for (int e : {3, 4, 8, 16}) {
        const int t = FullTreeAggregators(n, e);
        for (int m = 0; m <= d * t + 1; m += 1 + d * t / 24) {
          const Problem p{n, m, d, e};
          const std::vector<Item> items = EnumerateItems(p);
          if (DpSize(items, m, int64_t{n} * d).work() > 20'000'000) continue;  // keeps the test small
          ASSERT_EQ(Recount(SolveClosedForm(p)), Recount(SolveDp(items, m, int64_t{n} * d))) << Name(p);
          ++cases;
        }
      }
  EXPECT_GT(cases, 1500);
}

TEST(InaPlanner, UpperBoundIsTheLpOverAllItemsAndBoundsThePlan) {
  for (int n : {2, 3, 6, 16, 32, 64})
    for (int d : {1, 2, 3, 8})
      for (int e : {3, 4, 8, 16})
        for (int m : {0, 1, 2, 3, 5, 8, 15, 40, 200}) {
          const Problem p{n, m, d, e};
          const double all = LpValue(EnumerateItems(p), m, double(n) * d) / (2.0 * (n - 1));
          const double ub = UpperBound(p);
          ASSERT_NEAR(ub, all, 1e-9 * all) << Name(p);
          const Selection s = SolveClosedForm(p);
          EXPECT_LE(s.bandwidth(n), ub * (1 + 1e-12)) << Name(p);
          EXPECT_GE(s.bandwidth(n), BaselineOf(p).bandwidth * (1 - 1e-12)) << Name(p);
        }
  // Without devices the bound is the rings' (a line has the same bandwidth per port).
  EXPECT_NEAR(Ratio({16, 0, 8, 8}, UpperBound({16, 0, 8, 8})), 1.0, 1e-12);
}

TEST(InaPlanner, BaselineFirstGainsAtFifteenDevicesAsTheSeedSays) {
  // docs/ALGORITHMS.md: N=16, D=8, E=8: 4 trees (12 devices) = 4 < 8*16/30, 5 trees (15) = 5.
  for (int m = 0; m <= 14; ++m) {
    const Problem p{16, m, 8, 8};
    const Baseline b = BaselineOf(p);
    EXPECT_EQ(b.rings, 8) << m;
    EXPECT_EQ(b.trees, 0) << m;
    EXPECT_DOUBLE_EQ(Ratio(p, b.bandwidth), 1.0) << m;
  }
  const Problem p15{16, 15, 8, 8};
  EXPECT_EQ(BaselineOf(p15).trees, 5);
  EXPECT_DOUBLE_EQ(Ratio(p15, BaselineOf(p15).bandwidth), 5.0 / (8 * 16.0 / 30));
  EXPECT_DOUBLE_EQ(Ratio(p15, BaselineOf(p15).bandwidth), 1.171875);
  EXPECT_EQ(BaselineOf({16, 24, 8, 8}).trees, 8);
  EXPECT_EQ(BaselineOf({16, 99, 8, 8}).trees, 8);  // at most D trees
  // Odd D is no special case: one ring per port.
  EXPECT_EQ(BaselineOf({16, 0, 3, 8}).rings, 3);
  EXPECT_DOUBLE_EQ(Ratio({16, 0, 3, 8}, BaselineOf({16, 0, 3, 8}).bandwidth), 1.0);
  // Two workers: a ring and a tree are equally fast (2/2 = 1 per port); the rings win the tie.
  EXPECT_EQ(BaselineOf({2, 8, 4, 3}).rings, 4);
}

TEST(InaPlanner, PartialInaGainsLongBeforeTheBaseline) {
  // N=16, D=8, E=8: eight rings fill all 128 ports (value 8 x 16 = 128, in units of b/30). One
  // device cannot beat them: a one-device partial tree (24 ports) and six rings make 30 + 96 = 126.
  for (int m = 0; m <= 1; ++m) {
    auto plan = PlanLayout({16, m, 8, 8});
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_DOUBLE_EQ(Ratio(plan->problem, plan->bandwidth), 1.0) << m;
    EXPECT_EQ(plan->selection.picks.size(), 1u);
    EXPECT_EQ(plan->selection.picks[0].item.kind, PartKind::kRing);
    EXPECT_EQ(plan->selection.picks[0].count, 8);
  }
  // M=2: two one-device partial trees (24 ports each) and five rings: 2 + 5 x 16/30 = 4.667,
  // 1.094 x the rings' 4.267.
  auto two = PlanLayout({16, 2, 8, 8});
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->selection.picks.size(), 2u);
  EXPECT_EQ(two->selection.picks[0].item, (Item{PartKind::kPartialTree, 1, 24, 30}));
  EXPECT_EQ(two->selection.picks[0].count, 2);
  EXPECT_EQ(two->selection.picks[1].item.kind, PartKind::kRing);
  EXPECT_EQ(two->selection.picks[1].count, 5);
  EXPECT_NEAR(two->bandwidth, 2 + 5 * 16.0 / 30, 1e-12);
  EXPECT_DOUBLE_EQ(Ratio(two->problem, two->bandwidth), 140.0 / 128);
  // M=3: a full tree (16 ports) and seven rings: 4.733, 1.109.
  auto three = PlanLayout({16, 3, 8, 8});
  ASSERT_TRUE(three.ok());
  ASSERT_EQ(three->selection.picks.size(), 2u);
  EXPECT_EQ(three->selection.picks[0].item.kind, PartKind::kFullTree);
  EXPECT_EQ(three->selection.picks[1].count, 7);
  EXPECT_DOUBLE_EQ(Ratio(three->problem, three->bandwidth), 142.0 / 128);
  for (int m = 2; m <= 24; ++m) {
    auto plan = PlanLayout({16, m, 8, 8});
    ASSERT_TRUE(plan.ok());
    EXPECT_GT(Ratio(plan->problem, plan->bandwidth), 1.0) << m;
    EXPECT_GE(plan->bandwidth, BaselineOf(plan->problem).bandwidth) << m;
  }
}

TEST(InaPlanner, SeedSlideTwentyFigures) {
  // Slide 20 of the SWoPP 2024 talk: 6 workers, 3 ports, 4-port devices (T = 2); times against "3 Ring", the
  // three one-port rings: 3 x 6/10 = 1.8.
  const double ring = RingBandwidth({6, 0, 3, 4});
  EXPECT_DOUBLE_EQ(ring, 1.8);
  struct Want {
    int m;
    double bandwidth, time;  // time relative to the rings'
    std::vector<std::pair<PartKind, int>> parts;
  };
  const Want wants[] = {
      {0, 1.8, 1.0, {{PartKind::kRing, 3}}},
      {1, 2.0, 0.90, {{PartKind::kPartialTree, 1}, {PartKind::kLine, 1}}},  // 8 + 10 ports
      {2, 2.2, 0.82, {{PartKind::kFullTree, 1}, {PartKind::kRing, 2}}},     // 6 + 12 ports
      {6, 3.0, 0.60, {{PartKind::kFullTree, 3}}},
  };
  for (const Want& w : wants) {
    auto plan = PlanLayout({6, w.m, 3, 4});
    ASSERT_TRUE(plan.ok()) << w.m;
    EXPECT_NEAR(plan->bandwidth, w.bandwidth, 1e-12) << w.m;
    EXPECT_NEAR(ring / plan->bandwidth, w.time, 0.005) << w.m;  // the talk gives two decimals
    EXPECT_NEAR(Ratio(plan->problem, plan->bandwidth), w.bandwidth / 1.8, 1e-12) << w.m;
    std::vector<std::pair<PartKind, int>> got;
    for (const Pick& pk : plan->selection.picks) got.push_back({pk.item.kind, pk.count});
    EXPECT_EQ(got, w.parts) << w.m;
    EXPECT_EQ(plan->max_ports, 3) << w.m;  // every port of every worker in use
    EXPECT_EQ(plan->min_ports, 3) << w.m;
  }
  EXPECT_NEAR(2.0 / 1.8, 1.111, 1e-3);
  EXPECT_NEAR(2.2 / 1.8, 1.222, 1e-3);
  EXPECT_NEAR(3.0 / 1.8, 1.667, 1e-3);
}

// Ports per worker as the layout uses them.
std::vector<std::vector<int>> PortsOf(const Layout& l) {
  std::vector<std::vector<int>> ports(static_cast<size_t>(l.workers));
  for (const Part& part : l.parts) {
    for (const TreeEdge& e : part.edges) {
      if (!e.child.aggregator()) ports[static_cast<size_t>(e.child.index)].push_back(e.child_port);
      if (!e.parent.aggregator()) ports[static_cast<size_t>(e.parent.index)].push_back(e.parent_port);
    }
    for (size_t i = 0; i < part.ring.size(); ++i)
      ports[static_cast<size_t>(part.ring[i])].push_back(part.ring_ports[i]);
  }
  return ports;
}

TEST(InaPlanner, LayoutsBalancePortsConserveBandwidthAndValidate) {
  int plans = 0;
  for (int n : {2, 3, 4, 5, 7, 8, 16, 31, 64})
    for (int d : {1, 2, 3, 4, 7, 8})
      for (int e : {3, 4, 5, 8, 16})
        for (int m : {0, 1, 2, 3, 4, 7, 12, 30, 100}) {
          const Problem p{n, m, d, e};
          auto plan = PlanLayout(p);
          ASSERT_TRUE(plan.ok()) << Name(p) << ": " << plan.status().ToString();  // a ring always fits
          ++plans;
          const Layout& l = plan->layout;
          ASSERT_TRUE(Validate(l).ok()) << Name(p) << ": " << Validate(l).ToString();
          // Conservation: the plan's bandwidth is the sum of its parts'.
          double sum = 0;
          for (const Part& part : l.parts) sum += part.bandwidth;
          EXPECT_DOUBLE_EQ(plan->bandwidth, sum) << Name(p);
          EXPECT_NEAR(plan->bandwidth, plan->selection.bandwidth(n), 1e-12) << Name(p);
          EXPECT_EQ(l.aggregators_used(), plan->selection.aggregators) << Name(p);
          EXPECT_LE(l.aggregators_used(), m);
          // Balance: max - min <= 1, max <= D, every port 0..D-1 at most once.
          const auto ports = PortsOf(l);
          size_t lo = ports[0].size(), hi = 0, total = 0;
          for (const auto& w : ports) {
            lo = std::min(lo, w.size()), hi = std::max(hi, w.size()), total += w.size();
            std::vector<int> sorted = w;
            std::sort(sorted.begin(), sorted.end());
            for (size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], static_cast<int>(i)) << Name(p);
          }
          EXPECT_LE(hi - lo, 1u) << Name(p);
          EXPECT_LE(hi, static_cast<size_t>(d)) << Name(p);
          EXPECT_EQ(static_cast<int64_t>(total), plan->selection.worker_ports) << Name(p);
          EXPECT_EQ(plan->min_ports, static_cast<int>(lo));
          EXPECT_EQ(plan->max_ports, static_cast<int>(hi));
          // Every part spans every worker; aggregation devices are numbered from 0 in part order.
          int next_device = 0;
          for (const Part& part : l.parts) {
            std::vector<int> devices;
            for (const TreeEdge& e : part.edges)
              for (const Node& x : {e.child, e.parent})
                if (x.aggregator()) devices.push_back(x.index);
            if (part.root.aggregator() && part.kind != PartKind::kRing) devices.push_back(part.root.index);
            std::sort(devices.begin(), devices.end());
            devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
            for (int dev : devices) EXPECT_EQ(dev, next_device++) << Name(p);
          }
          // Shares: counts add up, proportional within one element, equal predicted times.
          for (uint64_t count : {0ull, 1ull, 7ull, 1000003ull}) {
            const auto ranges = SplitCount(l, count, 1);
            uint64_t at = 0;
            for (size_t i = 0; i < ranges.size(); ++i) {
              EXPECT_EQ(ranges[i].offset, at);
              at += ranges[i].count;
              const double exact = double(count) * l.parts[i].bandwidth / plan->bandwidth;
              EXPECT_LE(std::abs(double(ranges[i].count) - exact), 1.0 + 1e-9) << Name(p) << " count " << count;
              EXPECT_LE(std::abs(ranges[i].count / l.parts[i].bandwidth - count / plan->bandwidth),
                        1.0 / l.parts[i].bandwidth + 1e-9);
            }
            EXPECT_EQ(at, count);
          }
        }
  EXPECT_EQ(plans, 9 * 6 * 5 * 9);
}

TEST(InaPlanner, CanonicalSpreadsDevicesEvenly) {
  const Problem p{64, 7, 4, 8};  // T = 11
  const Selection s = SolveClosedForm(p);
  const Selection c = Canonical(p, s);
  EXPECT_EQ(Recount(c), Recount(s));
  int lo = 1 << 30, hi = -1;
  for (const Pick& pk : c.picks)
    if (pk.item.kind == PartKind::kPartialTree || pk.item.kind == PartKind::kLine)
      lo = std::min(lo, pk.item.aggregators), hi = std::max(hi, pk.item.aggregators);
  EXPECT_LE(hi - lo, 1);
  // Canonical order: full trees, partial trees by devices (descending), lines, rings.
  for (size_t i = 1; i < c.picks.size(); ++i) {
    const Item& a = c.picks[i - 1].item;
    const Item& b = c.picks[i].item;
    EXPECT_TRUE(a.kind < b.kind || (a.kind == b.kind && a.aggregators > b.aggregators));
  }
}

TEST(InaPlanner, TreesHaveTheModelsShape) {
  // E = 5: a device adds 3 free ports. N=20, M=4, D=8: four one-device partial trees and a ring
  // (T = 6); N=12, M=2, D=5: two one-device partial trees and a line (T = 4).
  int lines = 0, partials = 0;
  for (const Problem& p : {Problem{20, 4, 8, 5}, Problem{12, 2, 5, 5}}) {
    auto plan = PlanLayout(p, Solver::kClosedForm);
    ASSERT_TRUE(plan.ok());
    for (const Part& part : plan->layout.parts) {
      if (part.kind == PartKind::kLine) {
        // Rooted in the middle: two arms of 5 and 6 workers.
        ++lines;
        EXPECT_FALSE(part.root.aggregator());
        int at_root = 0;
        for (const TreeEdge& e : part.edges) at_root += e.parent == part.root;
        EXPECT_EQ(at_root, 2);
        EXPECT_EQ(part.worker_ports, 2 * p.workers - 2);
      }
      if (part.kind == PartKind::kPartialTree) {
        ++partials;
        const int chains = part.aggregators * 3 + 2;
        EXPECT_EQ(part.worker_ports, 2 * p.workers - chains);
        int heads = 0;
        for (const TreeEdge& e : part.edges) heads += !e.child.aggregator() && e.parent.aggregator();
        EXPECT_EQ(heads, chains);
      }
    }
  }
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(partials, 4 + 2);
}

TEST(InaPlanner, OnePortPerWorkerStillHasARing) {
  // A ring needs one port per worker, so every problem has a plan: D = 1 without a full tree's
  // devices is one ring.
  auto plan = PlanLayout({16, 2, 1, 8});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->layout.parts.size(), 1u);
  EXPECT_EQ(plan->layout.parts[0].kind, PartKind::kRing);
  EXPECT_DOUBLE_EQ(plan->bandwidth, 16.0 / 30);
  EXPECT_EQ(plan->max_ports, 1);
  auto three = PlanLayout({16, 3, 1, 8});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->layout.parts.size(), 1u);
  EXPECT_EQ(three->layout.parts[0].kind, PartKind::kFullTree);
  EXPECT_DOUBLE_EQ(three->bandwidth, 1.0);
}

// How many parts cable each pair of workers, and each ordered pair, over a layout; and how many
// ring circuits join a pair that some other part cables too.
struct PairUse {
  int most_unordered = 0, most_directed = 0, shared_ring_circuits = 0;
};
PairUse CountPairs(const Layout& l) {
  using Pair = std::pair<int, int>;
  std::map<Pair, int> unordered, directed;
  auto key = [](int a, int b) { return Pair{std::min(a, b), std::max(a, b)}; };
  for (const Part& part : l.parts) {
    for (const TreeEdge& e : part.edges)
      if (!e.child.aggregator() && !e.parent.aggregator()) {
        ++unordered[key(e.child.index, e.parent.index)];
        ++directed[{e.child.index, e.parent.index}];
        ++directed[{e.parent.index, e.child.index}];
      }
    for (size_t i = 0; i < part.ring.size(); ++i) {
      const int a = part.ring[i], b = part.ring[(i + 1) % part.ring.size()];
      ++unordered[key(a, b)];
      ++directed[{a, b}];
    }
  }
  PairUse u;
  for (const auto& [k, v] : unordered) u.most_unordered = std::max(u.most_unordered, v);
  for (const auto& [k, v] : directed) u.most_directed = std::max(u.most_directed, v);
  for (const Part& part : l.parts)
    for (size_t i = 0; i < part.ring.size(); ++i)
      u.shared_ring_circuits += unordered[key(part.ring[i], part.ring[(i + 1) % part.ring.size()])] > 1;
  return u;
}

TEST(InaPlanner, RingsAvoidPairsOtherPartsCable) {
  // 17 workers (prime): 8 stride classes, so 8 rings never share a pair.
  auto prime = PlanLayout({17, 0, 8, 8});
  ASSERT_TRUE(prime.ok());
  EXPECT_EQ(prime->layout.parts.size(), 8u);
  EXPECT_EQ(CountPairs(prime->layout).most_unordered, 1);
  // 16 workers: 4 classes (strides 1, 3, 5, 7) for 8 rings; the other 4 run them backwards, so no
  // ordered pair is used twice and no pair more than twice. (8 x 16 circuits exceed K16's 120 pairs.)
  auto sixteen = PlanLayout({16, 0, 8, 8});
  ASSERT_TRUE(sixteen.ok());
  EXPECT_EQ(CountPairs(sixteen->layout).most_directed, 1);
  EXPECT_EQ(CountPairs(sixteen->layout).most_unordered, 2);
  std::vector<int> second;
  for (const Part& part : sixteen->layout.parts) second.push_back(part.ring[1]);
  EXPECT_EQ(second, (std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15}));
  // Rings beside chains: four one-device partial trees and a ring that shares no pair with them.
  auto mixed = PlanLayout({31, 4, 8, 8});
  ASSERT_TRUE(mixed->layout.parts.size() == 5u && mixed->layout.parts[4].kind == PartKind::kRing);
  EXPECT_EQ(CountPairs(mixed->layout).shared_ring_circuits, 0);
  // N=16, M=2: two partial trees and five rings; where the strides run out, the orders are
  // searched so that no ordered pair carries two parts.
  auto two = PlanLayout({16, 2, 8, 8});
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(CountPairs(two->layout).most_directed, 1);
  // The talk's small examples, which the demo runs (6 workers, 3 ports): one stride class only,
  // yet no ordered pair carries two parts (M=0: 3 rings; M=1: partial tree + line).
  for (int m : {0, 1, 2}) {
    auto six = PlanLayout({6, m, 3, 4});
    ASSERT_TRUE(six.ok());
    EXPECT_EQ(CountPairs(six->layout).most_directed, 1) << "M=" << m;
    EXPECT_TRUE(Validate(six->layout).ok());
  }
}

// Worker speeds: among workers of equal ports used, the fastest take the reducing roles (a chain's
// inner workers). 6 workers with 3 ports, 1 device with 4: a partial tree (4 chains, 2 of them two
// workers long) and a line. Workers 0 and 1 slow: the partial tree's chain heads (which reduce
// their child's sums) are the fast ones and the slow ones are its leaves; port balance then puts
// the slow ones inside the line, whose 4 inner workers are the 4 with a port left.
TEST(InaPlanner, FastWorkersTakeTheReducingRoles) {
  auto children = [](const Part& part, int worker) {
    int n = 0;
    for (const TreeEdge& e : part.edges) n += !e.parent.aggregator() && e.parent.index == worker ? 1 : 0;
    return n;
  };
  auto even = PlanLayout({6, 1, 3, 4});
  auto by_speed = PlanLayout({6, 1, 3, 4}, Solver::kAuto, {1, 1, 4, 4, 4, 4});
  ASSERT_TRUE(even.ok() && by_speed.ok());
  ASSERT_EQ(by_speed->layout.parts[0].kind, PartKind::kPartialTree);
  EXPECT_EQ(children(even->layout.parts[0], 0) + children(even->layout.parts[0], 1), 2) << "ties: lower index";
  EXPECT_EQ(children(by_speed->layout.parts[0], 0) + children(by_speed->layout.parts[0], 1), 0);
  EXPECT_TRUE(Validate(by_speed->layout).ok());
  EXPECT_EQ(by_speed->selection.value, even->selection.value);
  EXPECT_EQ(by_speed->selection.aggregators, even->selection.aggregators);
  // Bad speeds are refused by name.
  EXPECT_NE(PlanLayout({6, 1, 3, 4}, Solver::kAuto, {1, 2}).status().message().find("2 worker speeds for 6 workers"),
            std::string::npos);
  EXPECT_NE(PlanLayout({6, 1, 3, 4}, Solver::kAuto, {1, 1, 0, 1, 1, 1}).status().message().find("worker 2's speed 0"),
            std::string::npos);
}

TEST(InaPlanner, BadProblemsAreRefusedByName) {
  EXPECT_NE(CheckProblem({1, 0, 8, 8}).message().find("1 workers: expected 2.."), std::string::npos);
  EXPECT_NE(CheckProblem({8, -1, 8, 8}).message().find("-1 aggregation devices"), std::string::npos);
  EXPECT_NE(CheckProblem({8, 0, 0, 8}).message().find("0 ports per worker"), std::string::npos);
  EXPECT_NE(CheckProblem({8, 0, 65, 8}).message().find("65 ports per worker"), std::string::npos);
  EXPECT_NE(CheckProblem({8, 0, 8, 2}).message().find("2 ports per aggregation device: expected 3.."),
            std::string::npos);
  EXPECT_NE(CheckProblem({8, 65536, 8, 1024}).message().find("more than"), std::string::npos);
  EXPECT_EQ(PlanLayout({8, 0, 8, 2}).status().code(), StatusCode::kInvalidArgument);
}

TEST(InaPlanner, Seed002Table) {
  const auto rows = Seed002Table(8, 4);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].steps, 14);
  EXPECT_EQ(rows[1].steps, 7);
  EXPECT_EQ(rows[2].steps, 3);
  for (const StepsRow& r : rows) EXPECT_DOUBLE_EQ(r.transfer_time, 0.4375);
  EXPECT_EQ(Seed002Table(6, 4)[2].steps, -1);  // no hypercube of 6
  EXPECT_EQ(Seed002Table(7, 4)[1].steps, 7);   // odd N: one half is longer
}

TEST(InaPlanner, PlansTwoThousandWorkers) {
  // The planning-time target's shapes; their timing is in docs/INA_PLANNER.md. D = 8, E = 8,
  // T = 341: eight rings fill the 16384 ports; to beat them takes a full tree (341 devices, and
  // seven rings: 1.1249) or four partial trees of 85 devices and a ring (340: 1.1245).
  const Problem p64{2048, 64, 8, 8}, p512{2048, 512, 8, 8};
  for (const Problem& p : {p64, p512}) {
    auto plan = PlanLayout(p);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->solver, p.aggregators == 64 ? Solver::kDp : Solver::kClosedForm);
    EXPECT_LE(plan->bandwidth, plan->upper_bound * (1 + 1e-12));
    EXPECT_EQ(plan->max_ports, 8);
    EXPECT_EQ(plan->min_ports, 8);
    EXPECT_EQ(Recount(SolveClosedForm(p)), Recount(plan->selection));
    if (p.aggregators == 64) {
      EXPECT_DOUBLE_EQ(plan->bandwidth, plan->ring);
    } else {
      ASSERT_EQ(plan->selection.picks.size(), 2u);
      EXPECT_EQ(plan->selection.picks[0].item.kind, PartKind::kFullTree);
      EXPECT_EQ(plan->selection.picks[1].count, 7);
      EXPECT_DOUBLE_EQ(Ratio(p, plan->bandwidth), (4094.0 + 7 * 2048) / (8 * 2048));
    }
  }
  EXPECT_DOUBLE_EQ(Ratio({2048, 339, 8, 8}, PlanLayout({2048, 339, 8, 8})->bandwidth), 1.0);
  EXPECT_DOUBLE_EQ(Ratio({2048, 340, 8, 8}, PlanLayout({2048, 340, 8, 8})->bandwidth),
                   (4 * 4094.0 + 2048) / (8 * 2048));
}

TEST(InaPlanner, ForcedDpRefusesHugeTables) {
  auto plan = PlanLayout({65536, 60000, 64, 3}, Solver::kDp);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("the DP's table would have"), std::string::npos);
}

TEST(InaPlanner, Deterministic) {
  auto a = PlanLayout({48, 9, 6, 6});
  auto b = PlanLayout({48, 9, 6, 6});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ToJson(a->layout), ToJson(b->layout));
}

}  // namespace
}  // namespace kizuna::collectives::ina
