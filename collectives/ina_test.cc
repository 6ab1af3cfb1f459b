// The INA algorithm (algorithms/ina.cc) on hand-made layouts of every part kind and on mixes of
// them: whole plans (workers and aggregation devices) through the simulator, which checks
// matching, deadlock freedom with a window of 2 and races, and every worker's output against the
// reduction computed here. Values are small integers, so every dtype and op is exact whatever the
// reduction order (trees reduce in tree order, not rank order).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/cost/model.h"
#include "collectives/cost/selector.h"
#include "collectives/ina/layout.h"
#include "collectives/ina/planner.h"
#include "collectives/algorithms/simulate.h"
#include "runtime/core/half.h"

namespace kizuna::collectives {
namespace {

using ina::Layout;
using ina::Node;
using ina::Part;
using ina::PartKind;

// Ports are numbered per node in the order cables are added (the plan does not use them; the
// layout's validation does).
struct Ports {
  std::vector<int> worker, aggregator;
  int Next(const Node& n) { return (n.aggregator() ? aggregator : worker)[static_cast<size_t>(n.index)]++; }
};

void AddEdge(Part& part, Ports& ports, Node child, Node parent) {
  part.edges.push_back({child, ports.Next(child), parent, ports.Next(parent)});
}

Part Tree(PartKind kind, Ports& ports, Node root, const std::vector<std::pair<Node, Node>>& child_parent, int aggs) {
  Part p;
  p.kind = kind;
  p.bandwidth = 1;
  p.aggregators = aggs;
  p.root = root;
  for (const auto& [c, par] : child_parent) AddEdge(p, ports, c, par);
  for (const auto& e : p.edges) p.worker_ports += (e.child.aggregator() ? 0 : 1) + (e.parent.aggregator() ? 0 : 1);
  return p;
}

Part Ring(Ports& ports, std::vector<int> order) {
  Part p;
  p.kind = PartKind::kRing;
  const int n = static_cast<int>(order.size());
  p.bandwidth = static_cast<double>(n) / (2.0 * (n - 1));
  p.ring = order;
  for (int w : order) p.ring_ports.push_back(ports.Next(Node::Worker(w)));
  p.worker_ports = n;
  return p;
}

struct Named {
  std::string name;
  std::shared_ptr<const Layout> layout;
};

// Layouts: a full tree on one device; a two-level full tree; a partial tree with chains; a line;
// a ring; and a mix of a tree, a ring and a line sharing the workers' ports.
std::vector<Named> Layouts() {
  std::vector<Named> out;
  auto make = [&](std::string name, int n, int m, int d, int e, auto build) {
    auto L = std::make_shared<Layout>();
    L->workers = n;
    L->aggregators = m;
    L->worker_ports = d;
    L->aggregator_ports = e;
    Ports ports{std::vector<int>(static_cast<size_t>(n)), std::vector<int>(static_cast<size_t>(m))};
    build(*L, ports);
    const Status v = ina::Validate(*L);
    EXPECT_TRUE(v.ok()) << name << ": " << v.ToString();
    out.push_back({std::move(name), std::move(L)});
  };
  const Node a0 = Node::Aggregator(0), a1 = Node::Aggregator(1);
  auto W = [](int i) { return Node::Worker(i); };
  make("full-tree-4", 4, 1, 1, 4, [&](Layout& L, Ports& p) {
    L.parts.push_back(Tree(PartKind::kFullTree, p, a0, {{W(0), a0}, {W(1), a0}, {W(2), a0}, {W(3), a0}}, 1));
  });
  make("full-tree-2-levels", 6, 2, 1, 4, [&](Layout& L, Ports& p) {
    L.parts.push_back(Tree(PartKind::kFullTree, p, a0,
                           {{a1, a0}, {W(0), a0}, {W(1), a0}, {W(2), a0}, {W(3), a1}, {W(4), a1}, {W(5), a1}}, 2));
  });
  make("partial-tree-chains", 6, 1, 2, 4, [&](Layout& L, Ports& p) {
    L.parts.push_back(Tree(PartKind::kPartialTree, p, a0,
                           {{W(0), a0}, {W(1), a0}, {W(2), a0}, {W(3), a0}, {W(4), W(0)}, {W(5), W(4)}}, 1));
  });
  make("line-5", 5, 0, 2, 4, [&](Layout& L, Ports& p) {
    L.parts.push_back(Tree(PartKind::kLine, p, W(2), {{W(1), W(2)}, {W(0), W(1)}, {W(3), W(2)}, {W(4), W(3)}}, 0));
  });
  make("ring-4", 4, 0, 1, 4, [&](Layout& L, Ports& p) { L.parts.push_back(Ring(p, {0, 2, 1, 3})); });
  make("mix-tree-ring-line", 4, 1, 4, 4, [&](Layout& L, Ports& p) {
    L.parts.push_back(Tree(PartKind::kFullTree, p, a0, {{W(0), a0}, {W(1), a0}, {W(2), a0}, {W(3), a0}}, 1));
    L.parts.push_back(Ring(p, {0, 1, 2, 3}));
    L.parts.push_back(Tree(PartKind::kLine, p, W(1), {{W(0), W(1)}, {W(2), W(1)}, {W(3), W(2)}}, 0));
  });
  return out;
}

CommTopology ShapeFor(const Named& n) {
  RankDesc rank;
  rank.host_id = "h";
  LinkDesc link;
  link.reachable = true;
  CommTopology s = CommTopology::Uniform(n.layout->workers, rank, link);
  s.ina = n.layout;
  return s;
}

double ValueOf(int rank, uint64_t i) { return static_cast<double>((rank * 7 + i * 3) % 5); }

void Put(DataType t, uint8_t* p, double v) {
  switch (t) {
    case DataType::kInt32: { const int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
    case DataType::kFloat32: { const float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case DataType::kBfloat16: {
      const uint16_t x = FloatToBfloat16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    default: { const double x = v; std::memcpy(p, &x, 8); break; }  // float64
  }
}
double Get(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DataType::kFloat32: { float x; std::memcpy(&x, p, 4); return x; }
    case DataType::kBfloat16: { uint16_t x; std::memcpy(&x, p, 2); return Bfloat16ToFloat(x); }
    default: { double x; std::memcpy(&x, p, 8); return x; }
  }
}

double Expect(ReduceOp op, int n, uint64_t i) {
  double acc = ValueOf(0, i);
  for (int r = 1; r < n; ++r) {
    const double v = ValueOf(r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

// Builds every rank's plan, simulates it with a window of 2 and checks every worker's output.
void Check(const Named& n, uint64_t count, DataType dtype, ReduceOp op, bool in_place, uint64_t chunk) {
  const std::string what = fmt::format("{} count={} {} {} {} chunk={}", n.name, count, DataTypeName(dtype),
                                       ReduceOpName(op), in_place ? "in-place" : "out-of-place", chunk);
  const int p = n.layout->workers;
  CollectiveRequest req{Collective::kAllReduce, p, count, dtype, op, 0, in_place};
  PlanOptions po;
  po.chunk_count = chunk;
  Result<Plan> plan = BuildPlan(Algorithm::kIna, req, ShapeFor(n), po, -1);
  ASSERT_TRUE(plan.ok()) << what << ": " << plan.status().ToString();
  ASSERT_EQ(plan->ranks.size(), static_cast<size_t>(p + n.layout->aggregators)) << what;
  const size_t es = DataTypeSize(dtype);
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(p)), out(static_cast<size_t>(p));
  std::vector<SimRankBuffers> bufs(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& i_ = in[static_cast<size_t>(r)];
    auto& o_ = out[static_cast<size_t>(r)];
    i_.resize(count * es);
    o_.assign(count * es, 0xEE);
    for (uint64_t i = 0; i < count; ++i) Put(dtype, (in_place ? o_ : i_).data() + i * es, ValueOf(r, i));
    bufs[static_cast<size_t>(r)] = {in_place ? o_.data() : i_.data(), o_.data()};
  }
  SimOptions sim;
  sim.window = 2;
  Result<SimStats> ran = SimulatePlan(*plan, bufs, sim);
  ASSERT_TRUE(ran.ok()) << what << ": " << ran.status().ToString();
  for (int r = 0; r < p; ++r)
    for (uint64_t i = 0; i < count; ++i) {
      const double want = Expect(op, p, i);
      const double got = Get(dtype, out[static_cast<size_t>(r)].data() + i * es);
      const double tol =
          op == ReduceOp::kAvg && dtype == DataType::kBfloat16 ? 0.02 : (op == ReduceOp::kAvg ? 1e-6 : 0);
      if (std::fabs(got - want) > tol) {
        FAIL() << what << ": rank " << r << " element " << i << " is " << got << ", expected " << want;
      }
    }
}

TEST(InaAlgorithm, EveryLayoutSizeDtypeAndOp) {
  for (const Named& n : Layouts())
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1003}})
      for (DataType t : {DataType::kFloat32, DataType::kInt32, DataType::kBfloat16, DataType::kFloat64})
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
          if (op == ReduceOp::kAvg && t == DataType::kInt32) continue;
          Check(n, count, t, op, false, 64);
          if (HasFatalFailure()) return;
        }
}

TEST(InaAlgorithm, EveryPlannedLayoutOfSmallShapes) {
  // What the planner builds (every part kind, chains, multi-level trees, rings in searched
  // orders), simulated whole with a window of 2.
  int layouts = 0;
  for (int n : {2, 3, 5, 6, 9})
    for (int m : {0, 1, 2, 3, 6})
      for (int d : {1, 2, 3})
        for (int e : {3, 4, 6}) {
          Result<ina::LayoutPlan> planned = ina::PlanLayout({n, m, d, e});
          ASSERT_TRUE(planned.ok()) << planned.status().ToString();
          const Named named{fmt::format("planned N={} M={} D={} E={}", n, m, d, e),
                            std::make_shared<const Layout>(planned->layout)};
          Check(named, 517, DataType::kInt32, ReduceOp::kSum, false, 16);
          if (HasFatalFailure()) return;
          ++layouts;
        }
  EXPECT_EQ(layouts, 225);
}

TEST(InaAlgorithm, InPlaceAndManyChunks) {
  for (const Named& n : Layouts()) {
    Check(n, 100003, DataType::kFloat32, ReduceOp::kSum, true, 1000);
    Check(n, 4099, DataType::kInt32, ReduceOp::kMax, false, 3);  // many tiny chunks: scratch slots reused
    if (HasFatalFailure()) return;
  }
}

TEST(InaAlgorithm, AggregationDevicesHaveBoundedScratch) {
  const Named n = Layouts()[1];  // two-level tree: a0 and a1 are ranks 6 and 7
  CollectiveRequest req{Collective::kAllReduce, 6, 1 << 20, DataType::kFloat32, ReduceOp::kSum, 0, false};
  PlanOptions po;
  po.chunk_count = 1024;
  Result<Plan> plan = BuildPlan(Algorithm::kIna, req, ShapeFor(n), po, 7);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->aggregators, 2);
  // A few chunks per child, going up and coming down (4 slots deep): (children + 2) x 4 chunks at
  // most, whatever the message size.
  const uint64_t children = 3;
  EXPECT_LE(plan->ranks[0].scratch_count, (children + 2) * 4u * 1024u);
  EXPECT_GT(plan->ranks[0].step_count(), 1000u);
}

TEST(InaAlgorithm, RefusesWhatItCannotServe) {
  const Named n = Layouts()[0];
  CommTopology shape = ShapeFor(n);
  CollectiveRequest bcast{Collective::kBroadcast, 4, 10, DataType::kFloat32, ReduceOp::kSum, 0, false};
  EXPECT_EQ(GetAlgorithm(Algorithm::kIna).Supports(bcast, shape).code(), StatusCode::kNotSupported);
  CollectiveRequest ar{Collective::kAllReduce, 4, 10, DataType::kFloat32, ReduceOp::kSum, 0, false};
  shape.ina = nullptr;
  const Status none = GetAlgorithm(Algorithm::kIna).Supports(ar, shape);
  EXPECT_EQ(none.code(), StatusCode::kNotSupported);
  EXPECT_NE(none.message().find("no aggregation devices"), std::string::npos) << none.ToString();
  // A layout for another number of workers.
  CommTopology five = CommTopology::Uniform(5, RankDesc{}, LinkDesc{true, 0, 0, true});
  five.ina = n.layout;
  CollectiveRequest ar5 = ar;
  ar5.nranks = 5;
  EXPECT_NE(GetAlgorithm(Algorithm::kIna).Supports(ar5, five).message().find("4 workers"), std::string::npos);
  // Deterministic mode reduces in rank order; aggregation devices cannot.
  PlanOptions det;
  det.deterministic = true;
  EXPECT_EQ(BuildPlan(Algorithm::kIna, ar, ShapeFor(n), det, 0).status().code(), StatusCode::kNotSupported);
}

TEST(InaAlgorithm, CostModelPredictsWhereALayoutExists) {
  for (const Named& n : Layouts()) {
    CollectiveRequest req{Collective::kAllReduce, n.layout->workers, 1 << 20, DataType::kFloat32, ReduceOp::kSum, 0,
                          false};
    PlanOptions po;
    po.chunk_count = 1 << 16;
    const Prediction with = Predict(Algorithm::kIna, req, ShapeFor(n), po, CostConstants{});
    EXPECT_TRUE(with.finite()) << n.name << ": " << with.note;
    CommTopology bare = ShapeFor(n);
    bare.ina = nullptr;
    EXPECT_FALSE(Predict(Algorithm::kIna, req, bare, po, CostConstants{}).finite()) << n.name;
  }
}

TEST(InaAlgorithm, TheModelChoosesInaWhereItWins) {
  // Six workers with 3 ports on 0.1 Gb/s links: three full trees through six devices move each
  // byte once each way, the ring algorithms twice; for large messages the model picks ina, for an
  // 8-byte one (one chunk through two levels of devices) something else, and without devices ina
  // is not a candidate.
  auto planned = ina::PlanLayout({6, 6, 3, 4});
  ASSERT_TRUE(planned.ok());
  RankDesc rank;
  rank.host_id = "h";
  LinkDesc link{true, 1.0, 0.0125, true};
  CommTopology shape = CommTopology::Uniform(6, rank, link);
  shape.ina = std::make_shared<const Layout>(planned->layout);
  shape.ina_link = link;
  auto supports = [](Algorithm a, const CollectiveRequest& r, const CommTopology& s) {
    return GetAlgorithm(a).Supports(r, s);
  };
  PlanOptions po;
  po.chunk_count = 1 << 15;
  CollectiveRequest big{Collective::kAllReduce, 6, 16u << 20, DataType::kFloat32, ReduceOp::kSum, 0, false};
  Result<Selection> sel = SelectAlgorithm(big, shape, po, CostConstants{}, AlgoOverrides{}, std::nullopt, supports);
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  EXPECT_EQ(sel->chosen, Algorithm::kIna) << SelectionToString(*sel);
  CollectiveRequest tiny = big;
  tiny.count = 2;
  sel = SelectAlgorithm(tiny, shape, po, CostConstants{}, AlgoOverrides{}, std::nullopt, supports);
  ASSERT_TRUE(sel.ok());
  EXPECT_NE(sel->chosen, Algorithm::kIna) << SelectionToString(*sel);
  shape.ina = nullptr;
  sel = SelectAlgorithm(big, shape, po, CostConstants{}, AlgoOverrides{}, std::nullopt, supports);
  ASSERT_TRUE(sel.ok());
  EXPECT_NE(sel->chosen, Algorithm::kIna);
  EXPECT_FALSE(sel->candidate(Algorithm::kIna).supported()) << SelectionToString(*sel);
}

}  // namespace
}  // namespace kizuna::collectives
