#include "collectives/ina/layout.h"

#include <pthread.h>

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "collectives/ina/planner.h"
#include "collectives/ina/test_layouts.h"

namespace kizuna::collectives::ina {
namespace {

using testing::Mixed;
using testing::Planned;

int IndexOf(const Layout& l, PartKind kind) {
  for (size_t i = 0; i < l.parts.size(); ++i)
    if (l.parts[i].kind == kind) return static_cast<int>(i);
  return -1;
}

// Validate's message, which must name `want`.
void ExpectRejected(const Layout& l, const std::string& want) {
  const Status s = Validate(l);
  ASSERT_FALSE(s.ok()) << "accepted; wanted: " << want;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
}

TEST(InaLayout, Names) {
  EXPECT_EQ(Node::Worker(3).Name(), "w3");
  EXPECT_EQ(Node::Aggregator(1).Name(), "a1");
  EXPECT_EQ(PartKindName(PartKind::kFullTree), "full-tree");
  EXPECT_EQ(PartKindName(PartKind::kPartialTree), "partial-tree");
  EXPECT_EQ(PartKindName(PartKind::kLine), "line");
  EXPECT_EQ(PartKindName(PartKind::kRing), "ring");
}

TEST(InaLayout, PlannedLayoutsHaveEveryKind) {
  const Layout a = Planned(16, 4, 8, 8);
  EXPECT_GE(IndexOf(a, PartKind::kPartialTree), 0);
  EXPECT_GE(IndexOf(a, PartKind::kRing), 0);
  EXPECT_DOUBLE_EQ(a.bandwidth(), 4 + 2 * (16.0 / 30));
  EXPECT_EQ(a.aggregators_used(), 4);
  EXPECT_GE(IndexOf(Planned(16, 24, 8, 8), PartKind::kFullTree), 0);
  EXPECT_GE(IndexOf(Planned(6, 1, 3, 4), PartKind::kLine), 0);
  EXPECT_TRUE(Validate(a).ok());
  const Layout m = Mixed();
  for (PartKind k : {PartKind::kFullTree, PartKind::kPartialTree, PartKind::kLine, PartKind::kRing})
    EXPECT_GE(IndexOf(m, k), 0) << PartKindName(k);
  EXPECT_TRUE(Validate(m).ok()) << Validate(m).ToString();
}

// Kept whole: a list of broken layouts, one block each next to the error it must name.
TEST(InaLayout, ValidateRejectsBrokenLayoutsNamingTheProblem) {
  const Layout base = Planned(16, 4, 8, 8);
  const int tree = IndexOf(base, PartKind::kPartialTree), ring = IndexOf(base, PartKind::kRing);
  const std::string tree_name = "part " + std::to_string(tree) + " (partial-tree)";
  {
    Layout l = base;  // a port used twice, across parts
    const TreeEdge& e = l.parts[static_cast<size_t>(tree)].edges.back();
    Part& r = l.parts[static_cast<size_t>(ring)];
    const size_t at = static_cast<size_t>(std::find(r.ring.begin(), r.ring.end(), e.child.index) - r.ring.begin());
    ASSERT_LT(at, r.ring.size());
    r.ring_ports[at] = e.child_port;
    ExpectRejected(l, "is already used by part");
    ExpectRejected(l, "ring[" + std::to_string(at) + "]: port w");
  }
  {
    Layout l = base;  // two cables on one port within a tree
    auto& edges = l.parts[static_cast<size_t>(tree)].edges;
    TreeEdge& last = edges.back();
    for (TreeEdge& e : edges)
      if (&e != &last && e.parent.aggregator()) {
        last.parent = e.parent;
        last.parent_port = e.parent_port;
        break;
      }
    ExpectRejected(l, "carries two cables of this part");
  }
  {
    Layout l = base;  // a worker missing from a tree
    l.parts[static_cast<size_t>(tree)].edges.pop_back();
    l.parts[static_cast<size_t>(tree)].worker_ports -= 1;
    ExpectRejected(l, tree_name + ": worker ");
    ExpectRejected(l, "is missing from the tree");
  }
  {
    Layout l = base;  // a cycle: two chain workers each other's parent
    auto& edges = l.parts[static_cast<size_t>(tree)].edges;
    size_t j = 0;
    while (edges[j].parent.aggregator()) ++j;  // a worker below a worker
    const Node parent = edges[j].parent;
    for (TreeEdge& e : edges)
      if (e.child == parent) e.parent = edges[j].child;
    ExpectRejected(l, "is on a cycle");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].edges[0].child = l.parts[static_cast<size_t>(tree)].edges[1].child;
    ExpectRejected(l, "appears twice");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].root = Node::Aggregator(9);
    ExpectRejected(l, "root a9 does not exist");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].edges[0].parent_port = 8;
    ExpectRejected(l, "is beyond a");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].aggregators = 2;
    ExpectRejected(l, "declares 2 aggregation device(s) but its tree has 1");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].worker_ports += 1;
    ExpectRejected(l, "worker ports but its cables use");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].bandwidth = 0;
    ExpectRejected(l, "bandwidth 0 must be positive");
  }
  {
    Layout l = base;  // an aggregation device in two parts
    const int other = tree == 0 ? 1 : 0;
    ASSERT_EQ(l.parts[static_cast<size_t>(other)].kind, PartKind::kPartialTree);
    const int dev = l.parts[static_cast<size_t>(tree)].root.index;
    Part& p = l.parts[static_cast<size_t>(other)];
    const Node old = p.root;
    p.root = Node::Aggregator(dev);
    for (TreeEdge& e : p.edges) {
      if (e.parent == old) e.parent = p.root, e.parent_port = 8 - 1 - e.parent_port;
    }
    ExpectRejected(l, "is already used by part");
  }
  {
    Layout l = base;
    Part& r = l.parts[static_cast<size_t>(ring)];
    r.ring[1] = r.ring[0];
    ExpectRejected(l, "appears twice");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(ring)].ring.pop_back();
    ExpectRejected(l, "the ring holds 15 workers, the layout 16");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(ring)].ring_ports.pop_back();
    ExpectRejected(l, "16 workers but 15 ring ports (one per worker)");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(ring)].ring_ports[3] = 8;
    ExpectRejected(l, "is beyond w");
  }
  {
    Layout l = base;  // the bidirectional ring's figure, twice the share it can carry
    l.parts[static_cast<size_t>(ring)].bandwidth = 16.0 / 15;
    ExpectRejected(l, "a unidirectional ring of 16 workers has N/(2(N-1)) = 0.5333");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(ring)].worker_ports = 32;
    ExpectRejected(l, "declares 32 worker ports but its circuits use 16");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(ring)].edges.push_back({});
    ExpectRejected(l, "a ring has no tree edges");
  }
  {
    Layout l = base;
    l.parts[static_cast<size_t>(tree)].ring_ports = {0};
    ExpectRejected(l, "a tree has no ring order or ring ports");
  }
  {
    Layout l = base;  // a worker port is two ports of the topology file, which allows 1024
    l.worker_ports = 513;
    ExpectRejected(l, "513 ports per worker: expected 1..512");
  }
  {
    Layout l = base;
    l.parts.clear();
    ExpectRejected(l, "no parts");
  }
  {
    Layout l = base;
    l.workers = 0;
    ExpectRejected(l, "0 workers");
  }
  {
    Layout l = base;
    l.aggregators = 0;  // the trees' devices no longer exist
    ExpectRejected(l, "does not exist");
  }
}

TEST(InaLayout, ValidateChecksEachKindsShape) {
  {
    Layout l = Planned(6, 1, 3, 4);
    const int line = IndexOf(l, PartKind::kLine);
    ASSERT_GE(line, 0);
    Part& p = l.parts[static_cast<size_t>(line)];
    // Hang the last worker on the root as a third neighbour.
    TreeEdge& e = p.edges.back();
    e.parent = p.root;
    ExpectRejected(l, "neighbours: a line is a chain");
  }
  {
    Layout l = Planned(16, 24, 8, 8);
    const int full = IndexOf(l, PartKind::kFullTree);
    Part& p = l.parts[static_cast<size_t>(full)];
    // A worker below a worker.
    TreeEdge& e = p.edges.back();
    for (const TreeEdge& f : p.edges)
      if (!f.child.aggregator() && f.child != e.child) {
        e.parent = f.child;
        break;
      }
    ExpectRejected(l, "is not a leaf below an aggregation device");
  }
  {
    Layout l = Planned(16, 24, 8, 8);
    Part& p = l.parts[static_cast<size_t>(IndexOf(l, PartKind::kFullTree))];
    p.root = Node::Worker(0);
    ExpectRejected(l, "a full-tree's root is an aggregation device");
  }
  {
    Layout l = Planned(16, 24, 8, 8);
    Part& p = l.parts[static_cast<size_t>(IndexOf(l, PartKind::kFullTree))];
    // Move every worker of one device elsewhere: the device reduces nothing.
    const Node leaf = p.edges.back().parent;
    for (TreeEdge& e : p.edges)
      if (e.parent == leaf && !e.child.aggregator()) e.parent = p.root, e.parent_port = 0;
    ExpectRejected(l, "has no children");
  }
}

TEST(InaLayout, SplitCountIsProportionalAndAligned) {
  const Layout l = Planned(16, 4, 8, 8);  // bandwidths 1, 1, 1, 1, 8/15, 8/15
  for (uint64_t count : {0ull, 1ull, 4ull, 5ull, 100ull, 1000003ull, (1ull << 60) + 7}) {
    for (uint64_t align : {0ull, 1ull, 16ull, 1000ull}) {
      const auto r = SplitCount(l, count, align);
      ASSERT_EQ(r.size(), l.parts.size());
      uint64_t at = 0;
      for (size_t i = 0; i < r.size(); ++i) {
        EXPECT_EQ(r[i].offset, at);
        const uint64_t a = align ? align : 1;
        EXPECT_EQ(r[i].offset % a, 0u);
        at += r[i].count;
        long double total = 0;
        for (const Part& p : l.parts) total += p.bandwidth;
        const long double exact = static_cast<long double>(count) * l.parts[i].bandwidth / total;
        EXPECT_LE(std::abs(static_cast<long double>(r[i].count) - exact), static_cast<long double>(2 * a))
            << count << " " << align;
      }
      EXPECT_EQ(at, count);
    }
  }
  // Largest remainder: 5 elements over bandwidths 1, 1, 1, 1, 8/15, 8/15 are quotas 0.987 (four
  // times) and 0.526 (twice): no whole ones, then the five largest remainders one each, the tie
  // between the rings to the lower index.
  const auto five = SplitCount(l, 5, 1);
  ASSERT_EQ(five.size(), 6u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(five[i].count, 1u) << i;
  EXPECT_EQ(five[5].count, 0u);
  const auto same = SplitCount(l, 1000003, 1);
  EXPECT_EQ(SplitCount(l, 1000003, 1)[4].count, same[4].count);  // deterministic
  EXPECT_TRUE(SplitCount(Layout{}, 10, 1).empty());
}

void ExpectSameLayout(const Layout& a, const Layout& b) {
  EXPECT_EQ(a.workers, b.workers);
  EXPECT_EQ(a.aggregators, b.aggregators);
  EXPECT_EQ(a.worker_ports, b.worker_ports);
  EXPECT_EQ(a.aggregator_ports, b.aggregator_ports);
  ASSERT_EQ(a.parts.size(), b.parts.size());
  for (size_t i = 0; i < a.parts.size(); ++i) {
    const Part &x = a.parts[i], &y = b.parts[i];
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.bandwidth, y.bandwidth);  // exactly: the JSON keeps every bit
    EXPECT_EQ(x.aggregators, y.aggregators);
    EXPECT_EQ(x.worker_ports, y.worker_ports);
    if (x.kind != PartKind::kRing) {
      EXPECT_EQ(x.root, y.root);
    }
    EXPECT_EQ(x.edges, y.edges);
    EXPECT_EQ(x.ring, y.ring);
    EXPECT_EQ(x.ring_ports, y.ring_ports);
  }
}

TEST(InaLayout, JsonRoundTrip) {
  for (const Layout& l :
       {Planned(16, 4, 8, 8), Planned(16, 24, 8, 8), Planned(6, 1, 3, 4), Planned(2, 0, 3, 3), Mixed()}) {
    const std::string text = ToJson(l);
    auto back = FromJson(text, "layout.json");
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
    ExpectSameLayout(l, *back);
    EXPECT_EQ(ToJson(*back), text);
  }
}

TEST(InaLayout, FromJsonNamesWhatIsWrong) {
  const std::string good = ToJson(Planned(16, 4, 8, 8));
  auto expect = [](const std::string& text, const std::string& want) {
    auto r = FromJson(text, "my.json");
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  expect("{", "my.json:1:2: invalid JSON: ");
  expect("[]", "my.json: layout: expected an object");
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  expect(edit("\"workers\": 16", "\"workers\": 16, \"extra\": 1"), "unknown key \"extra\"");
  expect(edit("\"workers\": 16", "\"workers\": \"16\""), "layout.workers: expected an integer");
  expect(edit("\"workers\": 16", "\"workers\": 99999999"), "layout.workers: 99999999 is out of range");
  expect(edit("\"kind\": \"partial-tree\"", "\"kind\": \"bush\""), "parts[0].kind: expected full-tree");
  expect(edit("\"child\": \"w", "\"child\": \"x"), "parts[0].edges[");
  expect(edit("\"child\": \"w", "\"child\": \"x"), "expected \"node:port\"");
  expect(edit("\"root\": \"a0\"", "\"root\": \"a00\""), "parts[0].root: expected a node name");
  expect(edit("\"root\": \"a0\"", "\"root\": \"a1\""), "my.json: layout: part 0 (partial-tree): ");
  expect(edit("\"ring\": [", "\"root\": \"w0\", \"ring\": ["), "a ring has no tree");
  expect(edit("\"ring_ports\"", "\"next_port\""), "\"ring_ports\" replaces \"next_port\" and \"prev_port\"");
  expect(edit("\"ring_ports\": [", "\"ring_ports\": [-1, "), "my.json: layout: part 4 (ring): ");
  expect(edit("\"ring_ports\": [", "\"ring_ports\": [\"0\", "), "parts[4].ring_ports[0]: expected an index");
  expect(edit("\"bandwidth\": 0.5333333333333333", "\"bandwidth\": 1.0666666666666667"),
         "a unidirectional ring of 16 workers");
}

// Runs `f(arg)` on a thread with a small stack, as a rank's threads may have: recursion per level of
// a file's nesting overflows it.
void OnSmallStack(void (*f)(void*), void* arg) {
  struct Call {
    void (*f)(void*);
    void* arg;
  } call{f, arg};
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 256 << 10), 0);
  pthread_t thread;
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* p) -> void* {
                  auto* c = static_cast<Call*>(p);
                  c->f(c->arg);
                  return nullptr;
                },
                &call),
            0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

// 75,000 levels of brackets where a number belongs: the error message printed the value, recursing
// once per level, and overflowed the stack. Refused before a tree is built, naming the place.
TEST(InaLayout, DeepNestingIsRefusedNotPrinted) {
  for (const std::string key : {"workers", "kind"}) {
    std::string text = key == "workers" ? "{\"workers\": " : "{\"parts\": [{\"kind\": ";
    const size_t column = text.size() + 1 + (key == "workers" ? 63 : 61);
    text += std::string(75000, '[') + std::string(75000, ']') + (key == "workers" ? "}" : "}]}");
    struct Run {
      std::string text;
      Result<Layout> result = Status(StatusCode::kInternal, "not run");
    } run{text};
    OnSmallStack(
        [](void* p) {
          auto* r = static_cast<Run*>(p);
          r->result = FromJson(r->text, "deep.json");
        },
        &run);
    ASSERT_FALSE(run.result.ok()) << key;
    EXPECT_EQ(run.result.status().message(),
              "deep.json:1:" + std::to_string(column) + ": nesting deeper than 64 levels");
  }
}

// 3 workers and 65536 aggregation devices passed Validate, each count within its own limit, but
// the topology file written for them has 65539 nodes, which the direct-connect fabric refuses: the
// job failed later, at a generated file, instead of at its layout.
TEST(InaLayout, WorkersAndDevicesTogetherStayWithinATopologysNodes) {
  Layout l = Planned(16, 4, 8, 8);
  l.aggregators = kMaxNodes - l.workers;
  EXPECT_TRUE(Validate(l).ok()) << Validate(l).ToString();
  l.aggregators += 1;
  const Status s = Validate(l);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "layout: 16 workers and 65521 aggregation devices: more than 65536 nodes together");
}

// /dev/zero never ends: read whole, it grew a rank to ~12 GB until the OOM killer ended it.
TEST(InaLayout, AnEndlessFileIsRefusedAtTheCap) {
  auto l = LoadLayoutFile("/dev/zero");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l.status().message(), "KIZUNA_INA_LAYOUT file /dev/zero: larger than 16 MiB");
  auto missing = LoadLayoutFile("/nonexistent/kizuna/layout.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("KIZUNA_INA_LAYOUT file /nonexistent/kizuna/layout.json: cannot open"),
            std::string::npos)
      << missing.status().message();
}

}  // namespace
}  // namespace kizuna::collectives::ina
