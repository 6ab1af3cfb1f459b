// The cost model's tests' shared requests and shapes (model_test.cc, model_host_test.cc).
#pragma once

#include <cstdint>

#include "collectives/cost/model.h"

namespace kizuna::collectives::cost_testing {

constexpr uint64_t kUnlimited = uint64_t{1} << 40;

inline CollectiveRequest Request(Collective c, int nranks, uint64_t count, DataType dtype = DataType::kFloat32) {
  CollectiveRequest r;
  r.collective = c;
  r.nranks = nranks;
  r.count = count;
  r.dtype = dtype;
  return r;
}

inline PlanOptions Options(uint64_t chunk_count = kUnlimited, int channels = 1) {
  PlanOptions o;
  o.chunk_count = chunk_count;
  o.channels = channels;
  return o;
}

// Known speeds, links that need no staging: numbers that are easy to follow by hand.
// Device: copy 20 GB/s, reduce 40 GB/s, launch 2 us. Link: 1 us, 10 GB/s.
inline CommTopology HandShape(int n) {
  return CommTopology::Uniform(n, RankDesc{"host", "dev", 20, 40, 2}, LinkDesc{true, 1, 10, false});
}

// `shape` with every rank's host reporting `cpus` CPUs.
inline CommTopology WithHostCpus(CommTopology shape, int cpus) {
  for (RankDesc& d : shape.ranks) d.host_cpus = cpus;
  return shape;
}

// Everything unknown: the model's defaults apply. Staged links, as the executor runs them.
inline CommTopology DefaultShape(int n) {
  return CommTopology::Uniform(n, RankDesc{"host", "dev", 0, 0, 0}, LinkDesc{true, 0, 0, true});
}

// The constants' software overheads, per message at one rank: message + step.
inline double MessageOverhead(const CostConstants& k) { return (k.message_overhead_us + k.step_overhead_us) * 1e-6; }

}  // namespace kizuna::collectives::cost_testing
