// Algorithm selection without any transport or device: KIZUNA_ALGO parsing, forced choices and
// their fallbacks, the model's choice, failures, and determinism. Algorithms' Supports are faked.
#include "collectives/cost/selector.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace kizuna::collectives {
namespace {

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

CollectiveRequest Request(Collective c, int nranks, uint64_t count) {
  CollectiveRequest r;
  r.collective = c;
  r.nranks = nranks;
  r.count = count;
  return r;
}

CommTopology Shape(int n) { return CommTopology::Uniform(n, RankDesc{"host", "dev", 0, 0, 0}, LinkDesc{true, 0, 0, true}); }

PlanOptions Options() {
  PlanOptions o;
  o.chunk_count = 262144;
  return o;
}

// What algorithm.h says the algorithms serve, with reachability: the ring needs r -> r+1, fused
// direct access, the others every pair.
Status AlgorithmLikeSupports(Algorithm a, const CollectiveRequest& r, const CommTopology& s) {
  static const std::vector<std::vector<Collective>> serves = {
      {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather, Collective::kBroadcast,
       Collective::kReduce},
      {Collective::kAllReduce, Collective::kBroadcast, Collective::kReduce},
      {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather},
      {Collective::kAllReduce, Collective::kBarrier},
      {Collective::kAllToAll, Collective::kAllGather, Collective::kReduceScatter, Collective::kAllReduce,
       Collective::kBarrier},
      {Collective::kSend, Collective::kRecv},
      {Collective::kAllReduce},
      {Collective::kAllReduce},
      {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather, Collective::kBroadcast,
       Collective::kReduce, Collective::kAllToAll},
      {Collective::kAllReduce},
      {Collective::kAllReduce, Collective::kBarrier},
      {Collective::kAllReduce, Collective::kBarrier},
      {},  // file: only with a plan file loaded
      {Collective::kAllReduce, Collective::kAllToAll},
      {Collective::kAllReduce},
  };
  if (IsHierarchical(a) && s.host_count() < 2) return NotSupported("hierarchical plans need two hosts");
  if (IsHostFused(a) && !s.host_direct) return NotSupported("hier:fused needs the host groups");
  if (a == Algorithm::kFused && !s.direct) return NotSupported("fused needs ranks that address each other directly");
  if (a == Algorithm::kIna && !s.ina) return NotSupported("ina needs aggregation devices");
  bool ok = false;
  for (Collective c : serves[static_cast<size_t>(a)]) ok = ok || c == r.collective;
  if (!ok)
    return NotSupported(std::string(AlgorithmName(a)) + " does not implement " +
                        std::string(CollectiveName(r.collective)));
  if (a == Algorithm::kRing) {
    for (int q = 0; q < s.nranks; ++q)
      if (s.nranks > 1 && !s.Reachable(q, (q + 1) % s.nranks)) return NotSupported("ring: a ring hop is unreachable");
    return Status::Ok();
  }
  if (!s.FullyConnected()) return NotSupported(std::string(AlgorithmName(a)) + " needs every pair linked");
  return Status::Ok();
}

Result<Selection> Select(const CollectiveRequest& r, const CommTopology& s, const AlgoOverrides& o,
                         std::optional<Algorithm> per_call = std::nullopt,
                         const SupportsFn& f = AlgorithmLikeSupports) {
  return SelectAlgorithm(r, s, Options(), CostConstants{}, o, per_call, f);
}

AlgoOverrides Parse(std::string_view text) {
  auto o = ParseAlgoOverrides(text);
  EXPECT_TRUE(o.ok()) << o.status().ToString();
  return o.ok() ? *o : AlgoOverrides{};
}

// ---- KIZUNA_ALGO ----

TEST(AlgoOverridesTest, Empty) {
  for (const char* text : {"", "  ", ";", " ; ;"}) {
    const AlgoOverrides o = Parse(text);
    EXPECT_TRUE(o.empty()) << text;
    EXPECT_TRUE(o.warnings.empty());
    EXPECT_FALSE(o.For(Collective::kAllReduce));
  }
}

TEST(AlgoOverridesTest, OneNameForEveryCollective) {
  const AlgoOverrides o = Parse(" RING ");
  for (int c = 0; c < kNumCollectives; ++c) EXPECT_EQ(o.For(static_cast<Collective>(c)), Algorithm::kRing);
  EXPECT_EQ(o.Source(Collective::kBarrier), "KIZUNA_ALGO=ring");
  EXPECT_EQ(Parse("dbt").For(Collective::kAllReduce), Algorithm::kTree);  // ParseAlgorithm's aliases
  EXPECT_EQ(Parse("Pairwise;").For(Collective::kAllToAll), Algorithm::kPairwise);
}

TEST(AlgoOverridesTest, PerCollective) {
  const AlgoOverrides o = Parse("allreduce:ring; AllGather : rhd;sendrecv:p2p");
  EXPECT_EQ(o.For(Collective::kAllReduce), Algorithm::kRing);
  EXPECT_EQ(o.For(Collective::kAllGather), Algorithm::kRhd);
  EXPECT_EQ(o.For(Collective::kSend), Algorithm::kP2p);
  EXPECT_EQ(o.For(Collective::kRecv), Algorithm::kP2p);
  EXPECT_FALSE(o.For(Collective::kBroadcast));
  EXPECT_EQ(o.Source(Collective::kAllGather), "KIZUNA_ALGO=AllGather : rhd");
  EXPECT_FALSE(o.empty());

  // A single name covers the collectives not listed.
  const AlgoOverrides mixed = Parse("tree;reducescatter:rhd");
  EXPECT_EQ(mixed.For(Collective::kReduceScatter), Algorithm::kRhd);
  EXPECT_EQ(mixed.For(Collective::kBroadcast), Algorithm::kTree);
}

TEST(AlgoOverridesTest, NamesNotAvailableYetWarnAndLeaveTheChoiceToTheModel) {
  const AlgoOverrides o = Parse("twoshot");
  EXPECT_TRUE(o.empty());
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_TRUE(Contains(o.warnings[0], "'twoshot' is not available yet")) << o.warnings[0];

  const AlgoOverrides mixed = Parse("ring;allreduce:twoshot;allgather:ONESHOT;broadcast:fused;reduce:oneshot");
  EXPECT_EQ(mixed.warnings.size(), 3u);
  // fused exists: listed for broadcast it is that collective's override (Supports then says no).
  EXPECT_EQ(mixed.For(Collective::kBroadcast), Algorithm::kFused);
  // allreduce is listed (with a name not available): the model chooses, not the single name.
  EXPECT_FALSE(mixed.For(Collective::kAllReduce));
  EXPECT_FALSE(mixed.For(Collective::kReduce));
  EXPECT_EQ(mixed.For(Collective::kReduceScatter), Algorithm::kRing);
}

TEST(AlgoOverridesTest, BadItemsAreNamed) {
  struct Case {
    const char* text;
    const char* item;
    const char* why;
  };
  for (const Case& c : std::vector<Case>{
           {"nope", "'nope'", "unknown algorithm 'nope'"},
           {"allreduce:nope", "'allreduce:nope'", "unknown algorithm 'nope'"},
           {"ring;allgathr:rhd", "'allgathr:rhd'", "unknown collective 'allgathr'"},
           {"allreduce:", "'allreduce:'", "no algorithm after ':'"},
           {":ring", "':ring'", "no collective before ':'"},
           {"allreduce:ring:tree", "'allreduce:ring:tree'", "unknown algorithm 'ring:tree'"},
           {"allreduce:ring;allreduce:tree", "'allreduce:tree'", "allreduce is listed twice"},
           {"sendrecv:p2p;recv:p2p", "'recv:p2p'", "recv is listed twice"},
           {"ring;tree", "'tree'", "a second algorithm for every collective"},
           {"ring;ina", "'ina'", "a second algorithm for every collective"},
       }) {
    auto o = ParseAlgoOverrides(c.text);
    ASSERT_FALSE(o.ok()) << c.text;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    const std::string m = o.status().message();
    EXPECT_TRUE(Contains(m, std::string("KIZUNA_ALGO='") + c.text + "'")) << m;
    EXPECT_TRUE(Contains(m, c.item)) << m;
    EXPECT_TRUE(Contains(m, c.why)) << m;
  }
  // The message lists what is accepted.
  const std::string m = ParseAlgoOverrides("nope").status().message();
  EXPECT_TRUE(Contains(m, "ring, tree, rhd, rd, pairwise, p2p")) << m;
}

// ---- Selection ----

// Two hosts of four ranks: fast links inside a host, a slow network between them.
CommTopology TwoHosts() {
  CommTopology s = CommTopology::Uniform(8, RankDesc{"a", "dev", 20, 40, 2}, LinkDesc{true, 1, 20, true});
  for (int r = 4; r < 8; ++r) s.ranks[static_cast<size_t>(r)].host_id = "b";
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b)
      if (a != b && a / 4 != b / 4) s.link(a, b) = LinkDesc{true, 50, 1, true};
  return s;
}

TEST(AlgoOverridesTest, HierarchicalNames) {
  AlgoOverrides o = Parse("hier");
  EXPECT_TRUE(o.all_hier);
  EXPECT_FALSE(o.all);
  EXPECT_TRUE(o.HierFor(Collective::kAllGather));
  EXPECT_TRUE(o.warnings.empty());
  o = Parse("allreduce:hier:pairwise/rd;hier:pairwise/ring");
  EXPECT_EQ(o.For(Collective::kAllReduce), Algorithm::kHierRd);
  EXPECT_EQ(o.For(Collective::kBroadcast), Algorithm::kHierRing);
  EXPECT_FALSE(o.HierFor(Collective::kAllReduce));
  o = Parse("ring;allreduce:hier");
  EXPECT_TRUE(o.HierFor(Collective::kAllReduce));
  EXPECT_FALSE(o.HierFor(Collective::kAllGather));
  EXPECT_EQ(o.Source(Collective::kAllReduce), "KIZUNA_ALGO=allreduce:hier");
  EXPECT_EQ(ParseAlgoOverrides("hier:nope/ring").status().code(), StatusCode::kInvalidArgument);
}

TEST(SelectorTest, HierPicksAmongTheHierarchicalAlgorithms) {
  const AlgoOverrides o = Parse("hier");
  auto big = Select(Request(Collective::kAllReduce, 8, 1u << 24), TwoHosts(), o);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_TRUE(IsHierarchical(big->chosen)) << SelectionToString(*big);
  EXPECT_TRUE(big->forced);
  EXPECT_NE(big->reason.find("KIZUNA_ALGO=hier"), std::string::npos) << big->reason;
  // On one host no hierarchical algorithm serves: the model's choice, and why.
  auto one = Select(Request(Collective::kAllReduce, 8, 1u << 24), Shape(8), o);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_FALSE(IsHierarchical(one->chosen));
  EXPECT_FALSE(one->forced);
  EXPECT_NE(one->reason.find("two hosts"), std::string::npos) << one->reason;
  // AllGather: only hier:pairwise/ring serves it.
  auto gather = Select(Request(Collective::kAllGather, 8, 4096), TwoHosts(), o);
  ASSERT_TRUE(gather.ok());
  EXPECT_EQ(gather->chosen, Algorithm::kHierRing);
}

// With a slow network between two hosts, the model prefers the hierarchical AllReduce for large
// messages: each byte crosses the network once instead of a flat ring's 2(p-1)/p per rank.
TEST(SelectorTest, TheModelPrefersTheHierarchyAcrossASlowNetwork) {
  auto s = Select(Request(Collective::kAllReduce, 8, 1u << 24), TwoHosts(), AlgoOverrides{});
  ASSERT_TRUE(s.ok());
  // Over two hosts the ring and recursive doubling between them move the same bytes.
  EXPECT_TRUE(IsHierarchical(s->chosen)) << SelectionToString(*s);
  EXPECT_LT(s->candidate(Algorithm::kHierRing).seconds(), 0.6 * s->candidate(Algorithm::kRing).seconds());
}

TEST(SelectorTest, TheModelChoosesTheCheapestSupported) {
  for (uint64_t count : {uint64_t{2}, uint64_t{4096}, uint64_t{1} << 24}) {
    const CollectiveRequest r = Request(Collective::kAllReduce, 8, count);
    auto s = Select(r, Shape(8), AlgoOverrides{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(s->forced);
    EXPECT_FALSE(s->requested);
    EXPECT_EQ(s->reason, "chosen by the model");
    ASSERT_EQ(s->candidates.size(), static_cast<size_t>(kNumAlgorithms));
    Algorithm best = Algorithm::kP2p;
    double best_s = std::numeric_limits<double>::infinity();
    for (int a = 0; a < kNumAlgorithms; ++a) {
      const Candidate& c = s->candidates[static_cast<size_t>(a)];
      EXPECT_EQ(c.algorithm, static_cast<Algorithm>(a));
      if (!c.supported()) continue;
      EXPECT_EQ(c.seconds(), PredictSeconds(c.algorithm, r, Shape(8), Options(), CostConstants{}));
      if (c.seconds() < best_s) {
        best_s = c.seconds();
        best = c.algorithm;
      }
    }
    EXPECT_EQ(s->chosen, best) << SelectionToString(*s);
    EXPECT_FALSE(s->candidate(Algorithm::kP2p).supported());
  }
  // Small: rd; large: not rd.
  EXPECT_EQ(Select(Request(Collective::kAllReduce, 8, 2), Shape(8), {})->chosen, Algorithm::kRd);
  EXPECT_NE(Select(Request(Collective::kAllReduce, 8, 1 << 24), Shape(8), {})->chosen, Algorithm::kRd);
}

TEST(SelectorTest, TheShapeDecidesWhatIsSupported) {
  // Neighbours only: only the ring can run an AllReduce, whatever the size.
  CommTopology ring = Shape(8);
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) ring.link(a, b).reachable = a != b && ((a + 1) % 8 == b || (b + 1) % 8 == a);
  auto s = Select(Request(Collective::kAllReduce, 8, 2), ring, {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chosen, Algorithm::kRing);
  EXPECT_EQ(s->candidate(Algorithm::kRd).support.message(), "rd needs every pair linked");
}

TEST(SelectorTest, ForcedByTheEnvironment) {
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, 2);  // the model would pick rd
  auto s = Select(r, Shape(8), Parse("ring"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chosen, Algorithm::kRing);
  EXPECT_TRUE(s->forced);
  EXPECT_EQ(s->requested, Algorithm::kRing);
  EXPECT_EQ(s->reason, "forced by KIZUNA_ALGO=ring");

  // The collective's own entry beats the single name.
  s = Select(r, Shape(8), Parse("ring;allreduce:tree"));
  EXPECT_EQ(s->chosen, Algorithm::kTree);
  EXPECT_EQ(s->reason, "forced by KIZUNA_ALGO=allreduce:tree");
  // Another collective's entry does not apply.
  s = Select(r, Shape(8), Parse("allgather:ring"));
  EXPECT_EQ(s->chosen, Algorithm::kRd);
  EXPECT_FALSE(s->forced);
}

TEST(SelectorTest, PerCallBeatsTheEnvironment) {
  const CollectiveRequest r = Request(Collective::kAllReduce, 8, 2);
  auto s = Select(r, Shape(8), Parse("allreduce:ring"), Algorithm::kPairwise);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chosen, Algorithm::kPairwise);
  EXPECT_TRUE(s->forced);
  EXPECT_EQ(s->reason, "forced by the call's algorithm option (pairwise)");
}

TEST(SelectorTest, ForcedButNotSupportedFallsBackAndSaysWhy) {
  const CollectiveRequest r = Request(Collective::kReduceScatter, 8, 1 << 20);
  auto s = Select(r, Shape(8), Parse("tree"));
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->forced);
  EXPECT_EQ(s->requested, Algorithm::kTree);
  auto model = Select(r, Shape(8), {});
  EXPECT_EQ(s->chosen, model->chosen);
  EXPECT_EQ(s->reason, "KIZUNA_ALGO=tree cannot serve reducescatter: tree does not implement reducescatter; using " +
                           std::string(AlgorithmName(model->chosen)));

  // Per call, the same.
  s = Select(r, Shape(8), {}, Algorithm::kP2p);
  EXPECT_FALSE(s->forced);
  EXPECT_TRUE(Contains(s->reason, "the call's algorithm option (p2p) cannot serve reducescatter")) << s->reason;
  // A forced algorithm the shape cannot run falls back too.
  CommTopology missing = Shape(4);
  missing.link(0, 2).reachable = false;
  s = Select(Request(Collective::kAllReduce, 4, 100), missing, Parse("rd"));
  EXPECT_EQ(s->chosen, Algorithm::kRing);
  EXPECT_EQ(s->reason, "KIZUNA_ALGO=rd cannot serve allreduce: rd needs every pair linked; using ring");
}

TEST(SelectorTest, NothingSupportedListsEveryReason) {
  auto s = Select(Request(Collective::kAllReduce, 4, 10), Shape(4), {}, std::nullopt,
                  [](Algorithm a, const CollectiveRequest&, const CommTopology&) {
                    return NotSupported(std::string(AlgorithmName(a)) + " is switched off");
                  });
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotSupported);
  const std::string m = s.status().message();
  EXPECT_TRUE(Contains(m, "no algorithm can serve allreduce count=10")) << m;
  for (int a = 0; a < kNumAlgorithms; ++a)
    EXPECT_TRUE(Contains(m, std::string(AlgorithmName(static_cast<Algorithm>(a))) + ": " +
                                std::string(AlgorithmName(static_cast<Algorithm>(a))) + " is switched off"))
        << m;
  // Forcing changes nothing when nothing can run.
  EXPECT_EQ(Select(Request(Collective::kAllReduce, 4, 10), Shape(4), Parse("ring"), Algorithm::kRing,
                   [](Algorithm, const CollectiveRequest&, const CommTopology&) { return NotSupported("no"); })
                .status()
                .code(),
            StatusCode::kNotSupported);
}

TEST(SelectorTest, TiesGoToTheFirstAlgorithm) {
  // Count 0 costs nothing anywhere.
  auto s = Select(Request(Collective::kAllReduce, 8, 0), Shape(8), {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chosen, Algorithm::kRing);
  s = Select(Request(Collective::kAllReduce, 8, 0), Shape(8), {}, std::nullopt,
             [](Algorithm a, const CollectiveRequest&, const CommTopology&) {
               return a == Algorithm::kRd || a == Algorithm::kPairwise ? Status::Ok() : NotSupported("off");
             });
  EXPECT_EQ(s->chosen, Algorithm::kRd);
}

TEST(SelectorTest, ASupportedAlgorithmWithoutAPredictionComesLast) {
  // A Supports that accepts what the model has no formula for: the finite candidates win; alone,
  // it is still chosen.
  auto everything = [](Algorithm, const CollectiveRequest&, const CommTopology&) { return Status::Ok(); };
  auto s = Select(Request(Collective::kAllToAll, 4, 10), Shape(4), {}, std::nullopt, everything);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chosen, Algorithm::kPairwise);
  EXPECT_FALSE(s->candidate(Algorithm::kRing).prediction.finite());
  EXPECT_TRUE(Contains(SelectionToString(*s), "ring inf")) << SelectionToString(*s);
  auto only_tree = [](Algorithm a, const CollectiveRequest&, const CommTopology&) {
    return a == Algorithm::kTree ? Status::Ok() : NotSupported("off");
  };
  s = Select(Request(Collective::kAllToAll, 4, 10), Shape(4), {}, std::nullopt, only_tree);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chosen, Algorithm::kTree);
}

TEST(SelectorTest, BadInputs) {
  const CollectiveRequest r = Request(Collective::kAllReduce, 4, 10);
  auto s = Select(r, Shape(5), {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status().message(), "the shape describes 5 ranks")) << s.status().message();

  CommTopology broken = Shape(4);
  broken.ranks[2].reduce_gbps = -1;
  s = Select(r, broken, {});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status().message(), "rank 2")) << s.status().message();

  s = SelectAlgorithm(r, Shape(4), Options(), CostConstants{}, {}, std::nullopt, SupportsFn{});
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);

  // A per-call value outside the enum (a C caller's garbage) is named, not indexed.
  s = Select(r, Shape(4), {}, static_cast<Algorithm>(42));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s.status().message(), "algorithm 42, which does not exist")) << s.status().message();
}

TEST(SelectorTest, SameInputsSameChoice) {
  // Every rank runs this with the same shape (deserialized from the same bytes).
  CommTopology shape = Shape(7);
  shape.ranks[2].reduce_gbps = 9;
  shape.link(3, 4).gbps = 4;
  const CommTopology copy = *CommTopology::Deserialize(shape.Serialize());
  const AlgoOverrides o = Parse("allgather:rhd");
  for (int c = 0; c < kNumCollectives; ++c)
    for (uint64_t count = 1; count < (uint64_t{1} << 26); count *= 5) {
      CollectiveRequest r = Request(static_cast<Collective>(c), 7, count);
      r.root = 3;
      auto a = Select(r, shape, o);
      auto b = Select(r, copy, o);
      ASSERT_EQ(a.ok(), b.ok());
      if (!a.ok()) continue;
      EXPECT_EQ(a->chosen, b->chosen);
      EXPECT_EQ(SelectionToString(*a), SelectionToString(*b));
    }
}

// Ranks may place their buffers differently (a Broadcast's root alone decides whether it runs in
// place): the choice must not depend on it. Uneven hosts (2 + 3 + 1) on one machine of 2 CPUs,
// where a local copy on the root alone once made the hierarchy and the tree trade places.
TEST(SelectorTest, InPlaceOrNotTheSameChoice) {
  CommTopology shape = CommTopology::Uniform(6, RankDesc{"host", "dev", 0, 0, 0}, LinkDesc{true, 0, 0, true});
  const int host_of[6] = {0, 0, 1, 1, 1, 2};
  for (int r = 0; r < 6; ++r) {
    shape.ranks[static_cast<size_t>(r)].host_id = "h" + std::to_string(host_of[r]) + ":b00710";
    shape.ranks[static_cast<size_t>(r)].host_cpus = 2;
    shape.ranks[static_cast<size_t>(r)].host_compute = true;
  }
  for (int a = 0; a < 6; ++a)
    for (int b = 0; b < 6; ++b)
      if (host_of[a] != host_of[b]) shape.link(a, b) = LinkDesc{true, 20, 1, false};
  for (Collective c : {Collective::kBroadcast, Collective::kAllGather, Collective::kAllReduce, Collective::kReduce})
    for (uint64_t count = 1; count < (uint64_t{1} << 24); count *= 4) {
      CollectiveRequest r = Request(c, 6, count);
      auto out = Select(r, shape, AlgoOverrides{});
      r.in_place = true;
      auto in = Select(r, shape, AlgoOverrides{});
      ASSERT_TRUE(out.ok() && in.ok()) << CollectiveName(c) << " " << count;
      EXPECT_EQ(out->chosen, in->chosen) << CollectiveName(c) << " " << count << ": " << SelectionToString(*out)
                                         << " / " << SelectionToString(*in);
    }
}

TEST(SelectorTest, OneLineForTheLog) {
  auto s = Select(Request(Collective::kAllReduce, 8, 2), Shape(8), {});
  ASSERT_TRUE(s.ok());
  const std::string line = SelectionToString(*s);
  EXPECT_EQ(line.find("allreduce count=2 float32 sum nranks=8: rd (predicted "), 0u) << line;
  EXPECT_TRUE(Contains(line, ") chosen by the model; ring ")) << line;
  EXPECT_TRUE(Contains(line, ", p2p not supported (p2p does not implement allreduce)")) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);

  s = Select(Request(Collective::kReduceScatter, 8, 2), Shape(8), Parse("tree"));
  EXPECT_TRUE(Contains(SelectionToString(*s), "KIZUNA_ALGO=tree cannot serve reducescatter")) << SelectionToString(*s);
}

}  // namespace
}  // namespace kizuna::collectives
