// The cost model's host term (cost_model.h): ranks that share a host share its CPUs and, when
// their devices compute on the host (RankDesc::host_compute: emulated devices), its memory.
// Internal to the cost model: only cost_model_internal.h and cost_model_host.cc include it.
//
// A host here is a machine: ranks whose host ids name one kernel (MachineOf in runtime/core/host_id.h:
// namespace or container hosts of one machine share its CPUs and memory).
//
// Per stage, over the host h of each rank that takes part (m_h of them, C_h = the host's CPUs,
// the largest RankDesc::host_cpus among its ranks; 0: unknown, no CPU term):
//   slowdown  = max(1, m_h / C_h) for the critical rank's host: its ranks take turns on the CPUs;
//   wake      = oversubscribed_wake_us × max(0, m_h − C_h) + handoff_wake_us × the rest of
//               max(0, t_h − C_h), with t_h the threads that must run
//               for the stage: each beyond the CPUs is woken and scheduled before the stage can
//               complete. A fused pass runs on each rank's calling thread (t_h = m_h); a plan step
//               of the executor's also passes through the device's stream thread when the device
//               computes on the host (t_h = 2 per such rank: the executor's thread and the
//               stream's), whose wake-ups cost differently (handoff_wake_us); plus, in a
//               collective whose ranks on h outnumber C_h, oversubscribed_wake_us per rank of h
//               that joins this stage after sitting the last one out (its wait gave the CPU away
//               and slept: 3 processes on 2 CPUs, rd's third rank); the largest over the hosts;
//   memory    = the host's memory traffic in the stage (bytes read + written by its host_compute
//               ranks) / host_memory_gbps, the largest over the hosts: a floor under the stage's
//               bandwidth terms, since every such rank's copies share one memory system; ×
//               1 / cache_speedup where the operation's bytes on the host (its host_compute ranks'
//               inputs and outputs) fit in host_cache_mib (Cached).
#pragma once

#include <vector>

#include "collectives/cost/model.h"
#include "collectives/plan/topology.h"

namespace kizuna::collectives::cost_internal {

class HostSharing {
 public:
  // `operation_bytes`: one rank's input and output bytes in the operation; `collective`: every
  // rank takes part in it (not a transfer between two).
  HostSharing(const CommTopology& shape, const CostConstants& k, double operation_bytes, bool collective);

  // The operation's bytes on `rank`'s host fit in its cache, and the rank computes on the host.
  bool Cached(int rank) const;

  // One stage: Join every rank that takes part, add the memory traffic of each, then End.
  // `executor`: the rank takes part through the executor's thread and its device streams (a
  // plan stage), not on its calling thread alone (a fused pass).
  void Join(int rank, bool executor = false);
  // `bytes` of memory traffic on `rank`'s host, counted when its device computes on the host.
  void Traffic(int rank, double bytes);
  struct Extra {
    double slowdown = 1;  // factor on the critical rank's CPU, wire, staging and reduce terms
    double wake_s = 0;    // added to the stage's latency
    double memory_s = 0;  // the stage's bandwidth terms are at least this
  };
  // The stage's extra costs with `critical` the rank whose work sets its time; resets the stage.
  // `waits`: its ranks wait for each other (a transfer stage), not each on its own work alone (a
  // local copy or reduction), which neither wakes a rank that sat out nor counts as taking part.
  Extra End(int critical, bool waits = true);

 private:
  std::vector<int> host_;         // per rank: its host's index
  std::vector<char> compute_;     // per rank: RankDesc::host_compute
  std::vector<int> cpus_;         // per host: CPUs, 0 when unknown
  std::vector<int> active_;       // per host: ranks joined in this stage
  std::vector<int> threads_;      // per host: threads those ranks need scheduled in this stage
  std::vector<double> traffic_;   // per host: bytes in this stage
  std::vector<char> cached_;      // per host: the operation's bytes there fit in its cache
  std::vector<int> waiting_;     // per host: its ranks in the operation (a collective's all, else 0)
  std::vector<int> rejoined_;    // per host: ranks in this stage that sat the last one out
  std::vector<char> last_stage_;  // per rank: it took part in the last stage
  std::vector<char> rank_joined_;
  std::vector<int> joined_;
  std::vector<int> hosts_touched_;
  double wake_s_, handoff_s_;
  double memory_s_per_byte_, cache_speedup_;
};

}  // namespace kizuna::collectives::cost_internal
