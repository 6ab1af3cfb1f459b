// Topology files and generators: a full description parses into the right nodes, ports and links;
// every kind of bad file is rejected naming the file and line (and column for syntax errors); the
// generators produce consistent port maps; the JSON writer round-trips.

#include "fabric/directconnect/topology.h"

#include <pthread.h>

#include <chrono>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace kizuna::fabric::directconnect {
namespace {

constexpr char kFull[] = R"({
  "name": "mixed",
  "shaping": true,
  "defaults": {"bandwidth_gbps": 100, "latency_us": 1.5},
  "nodes": [
    {"name": "w1", "kind": "worker", "rank": 1, "ports": 2},
    {"name": "w0", "rank": 0, "ports": 2},
    {"name": "agg", "kind": "aggregator", "ports": 4}
  ],
  "links": [
    {"a": "w0:0", "b": "w1:1"},
    {"a": "w0:1", "b": "agg:3", "bandwidth_gbps": 400},
    {"a": "agg:0", "b": "w1:0", "latency_us": 0.25}
  ]
})";

TEST(Topology, AFullDescriptionParses) {
  auto t = ParseTopology(kFull, "mixed.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->name, "mixed");
  EXPECT_TRUE(t->shaping);
  ASSERT_EQ(t->nodes.size(), 3u);
  EXPECT_EQ(t->worker_count(), 2);
  EXPECT_EQ(t->WorkerForRank(0), 1);
  EXPECT_EQ(t->WorkerForRank(1), 0);
  EXPECT_EQ(t->WorkerForRank(2), -1);
  const int agg = t->FindNode("agg");
  ASSERT_EQ(agg, 2);
  EXPECT_EQ(t->nodes[agg].kind, NodeKind::kAggregator);
  EXPECT_EQ(t->nodes[agg].rank, -1);
  EXPECT_EQ(t->nodes[agg].line, 8);
  // w0:1 <-> agg:3 with its own bandwidth and the default latency.
  const TopologyLink* l = t->LinkAt(PortRef{1, 1});
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->bandwidth_gbps, 400);
  EXPECT_EQ(l->latency_us, 1.5);
  EXPECT_EQ(l->line, 12);
  ASSERT_TRUE(t->PeerOf(PortRef{1, 1}).has_value());
  EXPECT_EQ(*t->PeerOf(PortRef{1, 1}), (PortRef{agg, 3}));
  EXPECT_EQ(*t->PeerOf(PortRef{agg, 3}), (PortRef{1, 1}));
  EXPECT_EQ(t->LinkAt(PortRef{agg, 0})->latency_us, 0.25);
  EXPECT_EQ(t->LinkAt(PortRef{agg, 1}), nullptr) << "an unconnected port";
  EXPECT_FALSE(t->PeerOf(PortRef{agg, 2}).has_value());
  EXPECT_EQ(t->LinkAt(PortRef{agg, 4}), nullptr) << "a port beyond the node's";
  EXPECT_EQ(t->PortName(PortRef{agg, 3}), "agg:3");
}

TEST(Topology, RanksFollowTheOrderOfNodesWhenNoneIsGiven) {
  auto t = ParseTopology(R"({"nodes": [{"name": "a", "ports": 1}, {"name": "x", "kind": "aggregator", "ports": 1},
                                       {"name": "b", "ports": 1}],
                             "links": [{"a": "a:0", "b": "b:0"}]})",
                         "t.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->nodes[0].rank, 0);
  EXPECT_EQ(t->nodes[2].rank, 1);
  EXPECT_EQ(t->nodes[1].rank, -1);
}

struct BadCase {
  const char* what;
  const char* text;
  const char* expect;  // a substring of the error message
};

TEST(Topology, BadFilesNameTheLineAndTheProblem) {
  const BadCase cases[] = {
      {"syntax error", "{\n  \"nodes\": [\n    {\"name\": \"w0\" \"ports\": 1}\n  ]\n}\n", "t.json:3:19: invalid JSON"},
      {"truncated file", "{\n  \"nodes\": [\n", "t.json:3:"},
      {"not an object", "[1, 2]", "t.json:1: the topology must be a JSON object"},
      {"unknown top-level key", "{\n  \"nodes\": [{\"name\": \"w0\", \"ports\": 1}],\n  \"link\": []\n}",
       "t.json:3: unknown key \"link\""},
      {"no nodes", "{\"nodes\": []}", "\"nodes\" must be a non-empty array"},
      {"port used twice",
       "{\n\"nodes\": [{\"name\": \"w0\", \"ports\": 2}, {\"name\": \"w1\", \"ports\": 2}],\n\"links\": [\n"
       "  {\"a\": \"w0:0\", \"b\": \"w1:0\"},\n  {\"a\": \"w0:1\", \"b\": \"w1:0\"}\n]}",
       "t.json:5: link w0:1 - w1:0: port w1:0 is already used by link w0:0 - w1:0 (line 4)"},
      {"link to a missing node",
       "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1}],\n \"links\": [\n {\"a\": \"w0:0\", \"b\": \"w9:0\"}]}",
       "t.json:3: link {\"a\":\"w0:0\",\"b\":\"w9:0\"}: node 'w9' is not in \"nodes\""},
      {"port beyond the node's ports",
       "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1},\n {\"name\": \"w1\", \"ports\": 2}],\n \"links\": [\n"
       "  {\"a\": \"w0:0\", \"b\": \"w1:2\"}]}",
       "t.json:4: link w0:0 - w1:2: port 2 is beyond node 'w1's 2 port(s) (0..1)"},
      {"self link", "{\"nodes\": [{\"name\": \"w0\", \"ports\": 2}], \"links\": [{\"a\": \"w0:0\", \"b\": \"w0:1\"}]}",
       "connects node 'w0' to itself"},
      {"duplicate rank",
       "{\"nodes\": [\n{\"name\": \"w0\", \"rank\": 0, \"ports\": 1},\n{\"name\": \"w1\", \"rank\": 0, \"ports\": 1}]}",
       "t.json:3: worker 'w1': rank 0 is already worker 'w0's"},
      {"some ranks missing",
       "{\"nodes\": [\n{\"name\": \"w0\", \"rank\": 0, \"ports\": 1},\n{\"name\": \"w1\", \"ports\": 1}]}",
       "t.json:3: worker 'w1' has no rank"},
      {"rank out of range", "{\"nodes\": [\n{\"name\": \"w0\", \"rank\": 5, \"ports\": 1}]}", "rank 5 out of range"},
      {"aggregator with a rank", "{\"nodes\": [\n{\"name\": \"a\", \"kind\": \"aggregator\", \"rank\": 0, \"ports\": 1}]}",
       "t.json:2: node 'a': an aggregator has no rank"},
      {"bad kind", "{\"nodes\": [{\"name\": \"w0\", \"kind\": \"switch\", \"ports\": 1}]}", "kind \"switch\""},
      {"duplicate node", "{\"nodes\": [\n{\"name\": \"w0\", \"ports\": 1},\n{\"name\": \"w0\", \"ports\": 1}]}",
       "t.json:3: node 'w0' is described twice (first at line 2)"},
      {"zero ports", "{\"nodes\": [{\"name\": \"w0\", \"ports\": 0}]}", "outside [1, 1024]"},
      {"ports not an integer", "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1.5}]}", "must be an integer"},
      {"huge ports", "{\"nodes\": [{\"name\": \"w0\", \"ports\": 18446744073709551615}]}", "outside [1, 1024]"},
      {"negative bandwidth",
       "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1}, {\"name\": \"w1\", \"ports\": 1}],\n \"links\": [\n"
       "{\"a\": \"w0:0\", \"b\": \"w1:0\", \"bandwidth_gbps\": -1}]}",
       "t.json:3: links[0]: bandwidth_gbps must be finite and >= 0"},
      {"unknown link key",
       "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1}, {\"name\": \"w1\", \"ports\": 1}],\n \"links\": [\n"
       "{\"a\": \"w0:0\", \"b\": \"w1:0\", \"bandwith_gbps\": 1}]}",
       "t.json:3: links[0]: unknown key \"bandwith_gbps\""},
      {"malformed port name",
       "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1}], \"links\": [{\"a\": \"w0\", \"b\": \"w0:x\"}]}",
       "is not of the form node:port"},
      {"shaping not a boolean", "{\"shaping\": \"yes\", \"nodes\": [{\"name\": \"w0\", \"ports\": 1}]}",
       "\"shaping\" must be true or false"},
  };
  for (const BadCase& c : cases) {
    auto t = ParseTopology(c.text, "t.json");
    ASSERT_FALSE(t.ok()) << c.what << ": accepted";
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << c.what << ": message \"" << t.status().message() << "\" lacks \"" << c.expect << "\"";
  }
}

TEST(Topology, AMissingFileIsNamed) {
  auto t = LoadTopology("/nonexistent/kizuna/topology.json");
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("/nonexistent/kizuna/topology.json"), std::string::npos);
}

// /dev/zero never ends: read whole, it grew a rank to ~12 GB until the OOM killer ended it.
TEST(Topology, AnEndlessFileIsRefusedAtTheCap) {
  auto t = LoadTopology("/dev/zero", "KIZUNA_TOPOLOGY file");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.status().message(), "KIZUNA_TOPOLOGY file /dev/zero: larger than 16 MiB");
}

// Runs `f` on a thread with a small stack, as a rank's threads may have: recursion per level of a
// file's nesting overflows it.
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

// 75,000 levels of brackets (a 200 KB file) where a node belongs: the error message printed the
// value, recursing once per level, and the rank died of a stack overflow (exit 139). Refused
// before the tree is built, naming where the nesting passes the limit.
TEST(Topology, DeepNestingIsRefusedNotPrinted) {
  for (const char* open : {"[", "{\"a\": "}) {
    std::string text = "{\"nodes\": [\n  ";
    for (int i = 0; i < 75000; ++i) text += open;
    text += "1";
    for (int i = 0; i < 75000; ++i) text += open[0] == '[' ? "]" : "}";
    text += "]}";
    struct Run {
      std::string text;
      Result<Topology> result = Status(StatusCode::kInternal, "not run");
    } run{text};
    OnSmallStack(
        [](void* p) {
          auto* r = static_cast<Run*>(p);
          r->result = ParseTopology(r->text, "deep.json");
        },
        &run);
    ASSERT_FALSE(run.result.ok()) << open;
    EXPECT_EQ(run.result.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(run.result.status().message(),
              "deep.json:2:" + std::to_string(3 + 62 * std::string(open).size()) + ": nesting deeper than 64 levels");
  }
}

// The largest topology a file may hold (65536 nodes, about 9 MB) and a file of 100,000 links
// between two nodes: each entry's line was found by scanning from the start of the text, each link
// end's node by a linear search, so these took minutes. Now linear: well under the limit here.
TEST(Topology, LargeFilesParseInLinearTime) {
  auto ring = GenerateRing(kMaxTopologyNodes, LinkParams{100, 1});
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  const std::string ring_text = TopologyToJson(*ring);
  auto start = std::chrono::steady_clock::now();
  auto parsed = ParseTopology(ring_text, "ring.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->Fingerprint(), ring->Fingerprint());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));

  std::string links =
      "{\"nodes\": [{\"name\": \"w0\", \"ports\": 1}, {\"name\": \"w1\", \"ports\": 1}],\n\"links\": [\n";
  for (int i = 0; i < 100000; ++i) links += "{\"a\": \"w0:0\", \"b\": \"w1:0\"},\n";
  links += "{\"a\": \"w0:0\", \"b\": \"w1:0\"}]}\n";
  start = std::chrono::steady_clock::now();
  auto refused = ParseTopology(links, "links.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("links.json:4: link w0:0 - w1:0: port w0:0 is already used"),
            std::string::npos)
      << refused.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// Every port of every node is linked exactly once and links are symmetric.
void ExpectFullyLinked(const Topology& t) {
  for (size_t n = 0; n < t.nodes.size(); ++n)
    for (int p = 0; p < t.nodes[n].ports; ++p) {
      const PortRef me{static_cast<int>(n), p};
      auto peer = t.PeerOf(me);
      ASSERT_TRUE(peer.has_value()) << t.PortName(me) << " is unconnected";
      ASSERT_EQ(*t.PeerOf(*peer), me) << t.PortName(me);
    }
}

TEST(Topology, RingGenerator) {
  auto t = GenerateRing(5, {100, 2});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->worker_count(), 5);
  EXPECT_EQ(t->links.size(), 5u);
  ExpectFullyLinked(*t);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(*t->PeerOf(PortRef{r, 0}), (PortRef{(r + 1) % 5, 1}));
  auto two = GenerateRing(2, {});
  ASSERT_TRUE(two.ok());
  ExpectFullyLinked(*two);  // two links between the same pair, on distinct ports
  EXPECT_FALSE(GenerateRing(1, {}).ok());
  EXPECT_FALSE(GenerateRing(3, {-1, 0}).ok());
}

TEST(Topology, TorusGenerators) {
  auto t = GenerateTorus({4, 3}, {50, 1});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->worker_count(), 12);
  EXPECT_EQ(t->links.size(), 24u);
  ExpectFullyLinked(*t);
  // Rank = x + 4y; +x is port 0 and reaches the neighbour's port 1; +y is port 2 -> port 3.
  const int r = 1 + 4 * 2;  // (1, 2)
  EXPECT_EQ(*t->PeerOf(PortRef{r, 0}), (PortRef{2 + 4 * 2, 1}));
  EXPECT_EQ(*t->PeerOf(PortRef{r, 1}), (PortRef{0 + 4 * 2, 0}));
  EXPECT_EQ(*t->PeerOf(PortRef{r, 2}), (PortRef{1 + 4 * 0, 3}));  // wraps in y
  EXPECT_EQ(*t->PeerOf(PortRef{r, 3}), (PortRef{1 + 4 * 1, 2}));

  auto cube = GenerateTorus({2, 2, 2}, {});
  ASSERT_TRUE(cube.ok());
  EXPECT_EQ(cube->links.size(), 24u);
  ExpectFullyLinked(*cube);

  auto flat = GenerateTorus({1, 4}, {});  // the x dimension of size 1 leaves its ports unconnected
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->LinkAt(PortRef{0, 0}), nullptr);
  EXPECT_NE(flat->LinkAt(PortRef{0, 2}), nullptr);

  EXPECT_FALSE(GenerateTorus({}, {}).ok());
  EXPECT_FALSE(GenerateTorus({2, 2, 2, 2}, {}).ok());
  EXPECT_FALSE(GenerateTorus({1}, {}).ok());
  EXPECT_FALSE(GenerateTorus({0, 4}, {}).ok());
  EXPECT_FALSE(GenerateTorus({1 << 10, 1 << 10}, {}).ok());
}

TEST(Topology, FullyConnectedGenerator) {
  auto t = GenerateFullyConnected(5, {});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->links.size(), 10u);
  ExpectFullyLinked(*t);
  for (int i = 0; i < 5; ++i) {
    std::set<int> peers;
    for (int p = 0; p < 4; ++p) peers.insert(t->PeerOf(PortRef{i, p})->node);
    EXPECT_EQ(peers.size(), 4u) << "node " << i << " must reach every other node once";
    EXPECT_EQ(peers.count(i), 0u);
  }
}

TEST(Topology, OcsGeneratorFromAPortMap) {
  OcsSpec spec;
  spec.workers = 3;
  spec.worker_ports = 2;
  spec.aggregators = 1;
  spec.aggregator_ports = 3;
  auto pairs = ParsePortMap("w0:0=a0:0, w1:0=a0:1,w2:0=a0:2 ,w0:1=w2:1");
  ASSERT_TRUE(pairs.ok()) << pairs.status().ToString();
  spec.pairs = *pairs;
  auto t = GenerateOcs(spec, {25, 3});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->worker_count(), 3);
  EXPECT_EQ(t->nodes[3].kind, NodeKind::kAggregator);
  EXPECT_EQ(*t->PeerOf(PortRef{1, 0}), (PortRef{3, 1}));
  EXPECT_EQ(t->LinkAt(PortRef{1, 1}), nullptr);

  spec.pairs.push_back({"w1:1", "w9:0"});
  EXPECT_NE(GenerateOcs(spec, {}).status().message().find("no node 'w9'"), std::string::npos);
  spec.pairs.back() = {"w1:1", "a0:0"};
  EXPECT_NE(GenerateOcs(spec, {}).status().message().find("already used"), std::string::npos);
  EXPECT_FALSE(ParsePortMap("").ok());
  EXPECT_FALSE(ParsePortMap("w0:0-w1:1").ok());
  EXPECT_FALSE(ParsePortMap("=w1:1").ok());
}

TEST(Topology, GeneratorsByName) {
  EXPECT_TRUE(GenerateNamed("ring", "4", {}).ok());
  EXPECT_TRUE(GenerateNamed("torus2d", "4x4", {}).ok());
  EXPECT_TRUE(GenerateNamed("torus3d", "2x2x3", {}).ok());
  EXPECT_TRUE(GenerateNamed("full", "3", {}).ok());
  EXPECT_NE(GenerateNamed("torus2d", "4", {}).status().message().find("2 dimensions"), std::string::npos);
  EXPECT_FALSE(GenerateNamed("torus2d", "4xx4", {}).ok());
  EXPECT_FALSE(GenerateNamed("ring", "-3", {}).ok());
  EXPECT_FALSE(GenerateNamed("ring", "99999999999", {}).ok());
  EXPECT_FALSE(GenerateNamed("ocs", "", {}).ok());
  EXPECT_NE(GenerateNamed("mesh", "4", {}).status().message().find("unknown topology generator"), std::string::npos);
}

TEST(Topology, TheJsonWriterRoundTrips) {
  auto t = GenerateTorus({3, 2}, {200, 0.5});
  ASSERT_TRUE(t.ok());
  t->shaping = true;
  const std::string text = TopologyToJson(*t);
  auto back = ParseTopology(text, "round.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(back->Fingerprint(), t->Fingerprint());
  EXPECT_EQ(back->name, t->name);
  EXPECT_TRUE(back->shaping);
  // One entry per line: each link's line is its own.
  std::set<int> lines;
  for (const TopologyLink& l : back->links) lines.insert(l.line);
  EXPECT_EQ(lines.size(), back->links.size());
  // The fingerprint follows the structure, not the formatting.
  auto t2 = GenerateTorus({3, 2}, {200, 0.5});
  EXPECT_NE(t2->Fingerprint(), t->Fingerprint()) << "shaping differs";
  t2->shaping = true;
  EXPECT_EQ(t2->Fingerprint(), t->Fingerprint());
  auto t3 = GenerateTorus({2, 3}, {200, 0.5});
  t3->shaping = true;
  EXPECT_NE(t3->Fingerprint(), t->Fingerprint());
}

}  // namespace
}  // namespace kizuna::fabric::directconnect
