// A communicator's topology (CommTopology): what every rank knows about all ranks, identically —
// their devices and the links between them. Built at communicator creation from an allgather of
// each rank's row (every rank then has the same bytes), so algorithm support, cost predictions and
// plans come out the same on every rank. Tools and tests build topologies by hand (Uniform).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::collectives {
namespace ina {
struct Layout;  // collectives/ina/layout.h
}
struct PlanFile;  // collectives/plan/plan_file.h

// One rank's device, as the cost model sees it.
struct RankDesc {
  std::string host_id;           // ranks with equal host ids share a host
  std::string device;            // "host_emulated:3" (for logs)
  double copy_gbps = 0;          // device-local copy throughput; 0: unknown (cost model default)
  double reduce_gbps = 0;        // reduce throughput, input bytes / s / 1e9; 0: unknown
  double launch_us = 0;          // cost of one device operation
  int host_cpus = 0;             // CPUs the rank's process may run on; 0: unknown
  bool host_compute = false;     // its copies and reductions run on the host's CPUs and memory
  bool host_memory = false;      // the CPU reaches its device memory (and so whatever staging it uses)
};

// The connection from one rank to another, as the cost model sees it.
struct LinkDesc {
  bool reachable = false;   // a connection exists (direct-connect fabrics reach only linked peers)
  double latency_us = 0;    // one-way latency of a small message; 0: unknown
  double gbps = 0;          // bandwidth per direction, GB/s (bytes); 0: unknown
  bool staged = true;       // bytes go through staging buffers on both ends (an extra device copy each)
  // `gbps` is the pace of a cable of the pair's own (a port cabled to a rank on another host, at
  // the rate its topology gives), which ranks taking turns on their host's CPUs do not stretch;
  // false: the speed of a NIC or a copy, whose bytes the CPUs move (the cost model stretches it).
  bool paced = false;
  // Cables the pair's bytes cross: more than 1 where the ranks in between forward them (hosts
  // that share no cable; fabric::Fabric::Forward). `latency_us` and `gbps` are then the first
  // cable's; the cost model charges latency and wire `hops` times (the bytes load that many
  // cables) and a relay per rank in between, and the shape's structure (rings, tori) is made of
  // pairs one cable apart.
  int hops = 1;
  // Parallel cables the link bundles (FabricDeviceProperties::cables): rings that may each take
  // one of them (DisjointCycles). 1 for anything but a bundle.
  int cables = 1;
};

struct CommTopology {
  int nranks = 1;
  std::vector<RankDesc> ranks;  // nranks entries
  std::vector<LinkDesc> links;  // link_rows() * nranks entries, [from * nranks + to]; the diagonal unused
  // 0: `links` holds every pair. P > 0 (P divides nranks): the shape repeats every P ranks, the link
  // from a to b being the link from a - kP to b - kP (k = a / P, modulo nranks), and `links` holds
  // the first P rows: a cluster of identical hosts of P ranks (kizuna-sim's thousands of ranks),
  // whose pairs would not fit. Writing a link of a periodic shape writes every copy of it.
  int link_period = 0;
  // Every rank can address every other rank's buffers directly in its device operations (the
  // ranks live in one process, on one device or on devices whose memory the others reach): the
  // single-host direct algorithms (fused) apply.
  bool direct = false;
  // With `direct` across processes (collectives/direct/same_host_group.h): AllReduces up to this many bytes
  // run whole on the calling thread through shared pages (SameHostGroup::RunOneShot); 0: never.
  uint64_t direct_inline_bytes = 0;
  // Operations of the executor's plans up to this many bytes run whole on the calling thread
  // (Executor::TryOnCaller: every rank's device computes on the host), without the hand-offs to
  // the executor's and the streams' threads; 0: never. Not serialized: every rank sets it alike.
  uint64_t caller_inline_bytes = 0;
  // Across hosts: the ranks of every host (of two or more) share their buffers through a host
  // group (collectives/direct/same_host_group.h), and the CPU does their host level
  // (hier:fused/*). Not serialized: every rank learns it alike at creation.
  bool host_direct = false;
  // In-network aggregation (collectives/ina/layout.h): the layout of the job's aggregation
  // devices, which are ranks nranks..nranks+ina->aggregators-1 of the transport (not of the
  // communicator); null without any. Not serialized: every rank derives the same layout from the
  // same configuration.
  std::shared_ptr<const ina::Layout> ina;
  // With `ina`: the slowest connection between a worker and an aggregation device (the cost
  // model's aggregation cables); unreachable when none was measured. Not serialized either.
  LinkDesc ina_link;
  // Plan files (plan_file.h, KIZUNA_PLAN_FILE) the communicator loaded and checked: the "file"
  // algorithm runs the first that serves a request. Not serialized: every rank loads the same
  // files (the executor's plan signatures catch ranks whose files differ).
  std::shared_ptr<const std::vector<PlanFile>> plan_files;

  const LinkDesc& link(int from, int to) const { return links[LinkIndex(from, to)]; }
  LinkDesc& link(int from, int to) { return links[LinkIndex(from, to)]; }
  // Rows of `links`: nranks, or link_period; every rank's links are those of one of these rows.
  int link_rows() const { return link_period > 0 ? link_period : nranks; }
  bool Reachable(int from, int to) const { return from != to && link(from, to).reachable; }
  // Reachable over a link of the pair's own, not forwarded by ranks in between (LinkDesc::hops).
  bool Adjacent(int from, int to) const { return Reachable(from, to) && link(from, to).hops <= 1; }
  // True when every ordered pair of distinct ranks is adjacent (no pair forwarded).
  bool FullyConnected() const;
  // Number of distinct host ids.
  int host_count() const;
  // The ranks of each host, ascending; hosts in the order of their lowest rank (the hierarchical
  // plans' host numbering).
  std::vector<std::vector<int>> hosts() const;

  // n ranks on one host, every pair linked with `link`, every device described by `rank`.
  static CommTopology Uniform(int n, const RankDesc& rank, const LinkDesc& link);
  // The same repeating every `period` ranks (link_period; `period` divides n).
  static CommTopology Uniform(int n, int period, const RankDesc& rank, const LinkDesc& link);
  // kInvalidArgument when the vectors do not have nranks / link_rows() * nranks entries, the
  // period does not divide nranks, or a value is negative or not finite.
  Status Validate() const;

  // A stable serialization (for tests and tools that compare or store shapes); a periodic shape's
  // every pair is written, and read back as an ordinary shape.
  std::vector<uint8_t> Serialize() const;
  static Result<CommTopology> Deserialize(const std::vector<uint8_t>& bytes);

 private:
  size_t LinkIndex(int from, int to) const {
    if (link_period <= 0) return static_cast<size_t>(from) * static_cast<size_t>(nranks) + static_cast<size_t>(to);
    const int row = from % link_period;  // b - (a - row), modulo nranks
    const int col = ((to - from + row) % nranks + nranks) % nranks;
    return static_cast<size_t>(row) * static_cast<size_t>(nranks) + static_cast<size_t>(col);
  }
};

// How the ranks agree on a shape at creation: each allgathers its row (its device, its links to
// every rank, then `extra` links: an INA job's cable to the aggregation devices), and every rank
// decodes every row into the same shape. The encoding is runtime/core/wire.h's.
std::vector<uint8_t> EncodeRankRow(const RankDesc& me, std::span<const LinkDesc> row);
// Fills rank `rank`'s entry and link row of `shape` (sized for shape.nranks) from its bytes, then
// `extra`; kInvalidArgument naming the rank when the bytes are not one such row.
Status DecodeRankRow(std::span<const uint8_t> bytes, int rank, CommTopology& shape, std::span<LinkDesc> extra = {});

}  // namespace kizuna::collectives
