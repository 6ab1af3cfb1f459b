// Fuzz target: INA layouts (collectives/ina/layout.h), the JSON a rank reads from
// KIZUNA_INA_LAYOUT and kizuna-aggd reads for its job.
//
// Asserted: a refusal is kInvalidArgument with a proportionate message; an accepted layout
// validates, survives ToJson and a second FromJson unchanged, splits any count into aligned ranges
// that add up, and its topology file (TopologyJson, what the direct-connect fabric then reads)
// parses with that fabric's parser and has the layout's workers.
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/ina/layout.h"
#include "fabric/directconnect/topology.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kizuna::collectives::ina;
  const std::string text(kizuna::fuzz::AsText(data, size));
  kizuna::Result<Layout> l = FromJson(text, "fuzz.json");
  if (!l.ok()) {
    KZ_FUZZ_CHECK_REFUSAL(l.status(), size);
    return 0;
  }
  const kizuna::Status valid = Validate(*l);
  KZ_FUZZ_CHECK(valid.ok(), "FromJson accepted a layout Validate refuses: " + valid.ToString());

  const std::string json = ToJson(*l);
  kizuna::Result<Layout> again = FromJson(json, "round-trip.json");
  KZ_FUZZ_CHECK(again.ok(), "ToJson's output does not parse: " + again.status().ToString());
  KZ_FUZZ_CHECK(ToJson(*again) == json, "the round trip changed the layout");

  for (const uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, (uint64_t{1} << 40) + 7, ~uint64_t{0}}) {
    for (const uint64_t align : {uint64_t{1}, uint64_t{64}}) {
      const auto ranges = SplitCount(*l, count, align);
      KZ_FUZZ_CHECK(ranges.size() == l->parts.size(), "SplitCount: one range per part");
      uint64_t offset = 0;
      for (const PartRange& r : ranges) {
        KZ_FUZZ_CHECK(r.offset == offset, "SplitCount: ranges are not contiguous");
        KZ_FUZZ_CHECK(r.count <= count - offset, "SplitCount: ranges exceed the count");
        KZ_FUZZ_CHECK(r.offset % align == 0 || r.offset == count, "SplitCount: an unaligned offset");
        offset += r.count;
      }
      KZ_FUZZ_CHECK(offset == count, "SplitCount: the ranges do not add up to the count");
    }
  }

  const std::string topology = TopologyJson(*l, 100, 1, false);
  auto t = kizuna::fabric::directconnect::ParseTopology(topology, "layout-topology.json");
  KZ_FUZZ_CHECK(t.ok(), "the layout's topology file does not parse: " + t.status().ToString());
  KZ_FUZZ_CHECK(t->worker_count() == l->workers, "the layout's topology file has other workers");
  return 0;
}
