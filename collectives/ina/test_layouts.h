// Layouts for the INA tests (collectives/ina/layout_test.cc, //tests/ina:topology_test): what the
// planner builds for a shape, and one layout with every kind of part at once.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "collectives/ina/layout.h"
#include "collectives/ina/planner.h"

namespace kizuna::collectives::ina::testing {

// Layouts with every kind of part: N=16, D=8, E=8, M=4 gives four one-device partial trees and two
// rings; M=24 gives eight full trees; N=6, D=3, E=4, M=1 a partial tree and a line (slide 20
// of the SWoPP 2024 talk); Mixed() all four kinds at once.
inline Layout Planned(int workers, int aggregators, int worker_ports, int aggregator_ports) {
  auto plan = PlanLayout({workers, aggregators, worker_ports, aggregator_ports});
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? plan->layout : Layout{};
}

// A full tree, a partial tree, a line and two rings on N=16, D=8, E=8 (86 + 16 of the 128 ports).
inline Layout Mixed() {
  const Problem p{16, 4, 8, 8};
  const std::vector<Item> items = EnumerateItems(p);  // full, partial k=2, k=1, line, ring
  Selection s;
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}, size_t{4}})
    s.picks.push_back({items[i], items[i].kind == PartKind::kRing ? 2 : 1});
  for (const Pick& pk : s.picks) {
    s.value += pk.item.value * pk.count;
    s.aggregators += int64_t{pk.item.aggregators} * pk.count;
    s.worker_ports += pk.item.worker_ports * pk.count;
  }
  auto l = BuildLayout(p, s);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? *l : Layout{};
}

}  // namespace kizuna::collectives::ina::testing
