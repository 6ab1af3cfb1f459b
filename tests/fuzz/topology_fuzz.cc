// Fuzz target: direct-connect topology files (fabric/directconnect/topology.h), the text a rank
// reads from KIZUNA_TOPOLOGY and kizuna-topo --check reads; the same bytes as a port map
// (kizuna-topo --map) and, when short, as a generator spec ("torus2d:4x4", KIZUNA_TOPOLOGY's other
// form).
//
// Asserted: a refusal is kInvalidArgument with a proportionate message; an accepted topology is
// consistent (ranks 0..W-1 once each, every link's ends within their nodes and attached to it) and
// survives TopologyToJson and a second parse with the same fingerprint.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fabric/directconnect/topology.h"
#include "tests/fuzz/fuzz_check.h"

namespace kizuna::fabric::directconnect {
namespace {

void CheckConsistent(const Topology& t, std::string_view what) {
  const std::string where(what);
  KZ_FUZZ_CHECK(!t.nodes.empty() && t.nodes.size() <= static_cast<size_t>(kMaxTopologyNodes), where);
  const int workers = t.worker_count();
  std::vector<bool> seen(static_cast<size_t>(workers), false);
  for (const TopologyNode& n : t.nodes) {
    KZ_FUZZ_CHECK(n.ports >= 1 && n.ports <= kMaxPortsPerNode, where + ": node " + n.name);
    if (n.kind == NodeKind::kAggregator) {
      KZ_FUZZ_CHECK(n.rank == -1, where + ": aggregator " + n.name + " has a rank");
      continue;
    }
    KZ_FUZZ_CHECK(n.rank >= 0 && n.rank < workers, where + ": worker " + n.name + " rank out of range");
    KZ_FUZZ_CHECK(!seen[static_cast<size_t>(n.rank)], where + ": rank given twice");
    seen[static_cast<size_t>(n.rank)] = true;
  }
  KZ_FUZZ_CHECK(workers == 0 || (t.WorkerForRank(0) >= 0 && t.WorkerForRank(workers - 1) >= 0),
                where + ": WorkerForRank");
  for (const TopologyLink& l : t.links) {
    KZ_FUZZ_CHECK(t.LinkAt(l.a) == &l && t.LinkAt(l.b) == &l, where + ": a link is not attached to its ports");
    KZ_FUZZ_CHECK(t.PeerOf(l.a) == l.b && t.PeerOf(l.b) == l.a, where + ": PeerOf disagrees with the link");
    KZ_FUZZ_CHECK(l.a.node != l.b.node, where + ": a self link");
  }
}

void CheckRoundTrip(const Topology& t) {
  const std::string json = TopologyToJson(t);
  Result<Topology> again = ParseTopology(json, "round-trip.json");
  KZ_FUZZ_CHECK(again.ok(), "TopologyToJson's output does not parse: " + again.status().ToString());
  KZ_FUZZ_CHECK(again->Fingerprint() == t.Fingerprint(), "the round trip changed the topology");
}

}  // namespace
}  // namespace kizuna::fabric::directconnect

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kizuna::fabric::directconnect;
  const std::string_view text = kizuna::fuzz::AsText(data, size);

  kizuna::Result<Topology> t = ParseTopology(text, "fuzz.json");
  if (t.ok()) {
    CheckConsistent(*t, "parsed");
    CheckRoundTrip(*t);
  } else {
    KZ_FUZZ_CHECK_REFUSAL(t.status(), size);
  }

  auto pairs = ParsePortMap(text);
  if (pairs.ok()) {
    for (const auto& [a, b] : *pairs) KZ_FUZZ_CHECK(!a.empty() && !b.empty(), "an empty port name in a port map");
  } else {
    KZ_FUZZ_CHECK_REFUSAL(pairs.status(), size);
  }

  // A generator spec, as KIZUNA_TOPOLOGY takes it: "kind:shape".
  const size_t colon = text.find(':');
  if (size <= 64 && colon != std::string_view::npos) {
    auto g = GenerateNamed(text.substr(0, colon), text.substr(colon + 1), LinkParams{});
    if (g.ok()) {
      CheckConsistent(*g, "generated");
      if (g->nodes.size() <= 64) CheckRoundTrip(*g);
    } else {
      KZ_FUZZ_CHECK_REFUSAL(g.status(), size);
    }
  }
  return 0;
}
