#include "collectives/cost/model_host.h"

#include <algorithm>
#include <map>
#include <string>

#include "runtime/core/host_id.h"

namespace kizuna::collectives::cost_internal {

HostSharing::HostSharing(const CommTopology& shape, const CostConstants& k, double operation_bytes, bool collective)
    : wake_s_(k.oversubscribed_wake_us * 1e-6),
      handoff_s_(k.handoff_wake_us * 1e-6),
      memory_s_per_byte_(1.0 / (k.host_memory_gbps * 1e9)),
      cache_speedup_(std::max(1.0, k.cache_speedup)) {
  std::map<std::string, int> index;
  const auto n = static_cast<size_t>(shape.nranks);
  host_.resize(n);
  compute_.resize(n);
  rank_joined_.assign(n, 0);
  for (size_t r = 0; r < n && r < shape.ranks.size(); ++r) {
    const RankDesc& d = shape.ranks[r];
    // Per machine, not per host name: namespace or container hosts on one kernel share its CPUs
    // and memory.
    const auto [it, added] = index.emplace(MachineOf(d.host_id), static_cast<int>(cpus_.size()));
    if (added) cpus_.push_back(0);
    host_[r] = it->second;
    compute_[r] = d.host_compute ? 1 : 0;
    int& cpus = cpus_[static_cast<size_t>(it->second)];
    cpus = std::max(cpus, d.host_cpus);
  }
  waiting_.assign(cpus_.size(), 0);
  if (collective)
    for (size_t r = 0; r < n && r < shape.ranks.size(); ++r) ++waiting_[static_cast<size_t>(host_[r])];
  std::vector<double> bytes(cpus_.size(), 0);
  for (size_t r = 0; r < n && r < shape.ranks.size(); ++r)
    if (compute_[r]) bytes[static_cast<size_t>(host_[r])] += operation_bytes;
  cached_.resize(cpus_.size());
  for (size_t h = 0; h < cpus_.size(); ++h) cached_[h] = bytes[h] > 0 && bytes[h] <= k.host_cache_mib * (1 << 20);
  last_stage_.assign(n, 1);  // every rank starts running: its call is the operation's first stage
  rejoined_.assign(cpus_.size(), 0);
  active_.assign(cpus_.size(), 0);
  threads_.assign(cpus_.size(), 0);
  traffic_.assign(cpus_.size(), 0);
}

bool HostSharing::Cached(int rank) const {
  const auto r = static_cast<size_t>(rank);
  return compute_[r] && cached_[static_cast<size_t>(host_[r])];
}

void HostSharing::Join(int rank, bool executor) {
  const auto r = static_cast<size_t>(rank);
  if (rank_joined_[r]) return;
  rank_joined_[r] = 1;
  joined_.push_back(rank);
  const auto h = static_cast<size_t>(host_[r]);
  threads_[h] += executor && compute_[r] ? 2 : 1;
  if (!last_stage_[r]) ++rejoined_[h];
  if (active_[h]++ == 0 && traffic_[h] == 0) hosts_touched_.push_back(static_cast<int>(h));
}

void HostSharing::Traffic(int rank, double bytes) {
  const auto r = static_cast<size_t>(rank);
  if (!compute_[r] || bytes <= 0) return;
  const auto h = static_cast<size_t>(host_[r]);
  if (active_[h] == 0 && traffic_[h] == 0) hosts_touched_.push_back(static_cast<int>(h));
  traffic_[h] += bytes;
}

HostSharing::Extra HostSharing::End(int critical, bool waits) {
  Extra e;
  for (int hi : hosts_touched_) {
    const auto h = static_cast<size_t>(hi);
    const int cpus = cpus_[h];
    double wake = 0;
    if (cpus > 0 && threads_[h] > cpus) {
      const int beyond = threads_[h] - cpus;
      const int ranks = std::min(beyond, std::max(0, active_[h] - cpus));
      wake = wake_s_ * ranks + handoff_s_ * static_cast<double>(beyond - ranks);
    }
    // On a host whose ranks in the operation outnumber its CPUs, a rank that sat the last stage
    // out has given its CPU away and fallen asleep: it is woken before this stage can go on.
    if (waits && cpus > 0 && waiting_[h] > cpus) wake += wake_s_ * rejoined_[h];
    e.wake_s = std::max(e.wake_s, wake);
    rejoined_[h] = 0;
    if (cpus > 0 && active_[h] > cpus && critical >= 0 && host_[static_cast<size_t>(critical)] == hi)
      e.slowdown = static_cast<double>(active_[h]) / static_cast<double>(cpus);
    e.memory_s = std::max(e.memory_s, traffic_[h] * memory_s_per_byte_ / (cached_[h] ? cache_speedup_ : 1.0));
    active_[h] = 0;
    threads_[h] = 0;
    traffic_[h] = 0;
  }
  hosts_touched_.clear();
  if (waits && !joined_.empty())
    for (size_t r = 0; r < last_stage_.size(); ++r) last_stage_[r] = rank_joined_[r];
  for (int r : joined_) rank_joined_[static_cast<size_t>(r)] = 0;
  joined_.clear();
  return e;
}

}  // namespace kizuna::collectives::cost_internal
