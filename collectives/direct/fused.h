// Fused one-pass collectives, the single-host direct algorithm (docs/ALGORITHMS.md): when every
// rank addresses every other rank's buffers directly (CommTopology::direct: the ranks are threads of
// one process on devices that reach each other's memory, same_process_group.h, or processes of one
// host that map each other's allocations, same_host_group.h), each rank does its share in one pass
// over the others' buffers.
//  - AllReduce: rank r reduces slice r of every rank's input and writes the result into slice r of
//    every rank's output, in one device operation (Stream::ReduceMulti). Each byte of every input
//    is read once and each byte of every output written once: the minimum traffic, 2 x count x
//    size per rank, with no staging, no fabric and no pipeline.
//  - Reduce: slice r of every input reduced into the root's output.
//  - ReduceScatter: block r of every input reduced into rank r's output.
//  - AllGather: rank r copies its input into block r of every output (pushed: read once for all).
//  - Broadcast: rank r copies slice r of the root's input into every output.
//  - Barrier: nothing moves; the rendezvous around the part is the barrier.
// Those are the even parts. Where the devices differ in speed, the plan sizes the parts by speed
// instead (RankPlan::fused_bounds): rank r then takes elements [b_r, b_r+1) of the vector, or of
// every rank's block laid end to end for ReduceScatter and AllGather, whose part may then cover
// pieces of several blocks (each reduced into, or copied from, that block's owner).
// In place, a copy onto itself is skipped. avg is reduced as avg in the same pass (sum, then one
// division by nranks, rounded once): the plan's epilogue is not used.
//
// The work is not a sequence of transfers, so the plan carries no steps (algorithms/fused.cc
// builds it: the algorithm's name only). The executor runs it (executor/direct.cc): the ranks
// exchange their buffer addresses through their group, each does its part with the functions
// below, and none proceeds before every rank's part is done (two rendezvous per operation).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>

#include "collectives/plan/plan.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"

namespace kizuna::collectives {

// Rank r's slice of `count` elements split evenly over n ranks (the first count % n ranks take one
// more): every rank computes the same partition.
inline std::pair<uint64_t, uint64_t> FusedSlice(uint64_t count, int n, int r) {
  const auto un = static_cast<uint64_t>(n), ur = static_cast<uint64_t>(r);
  const uint64_t base = count / un, extra = count % un;
  return {ur * base + std::min(ur, extra), base + (ur < extra ? 1 : 0)};
}

// Enqueues rank `rank`'s part of the fused operation `req` on `stream`, given every rank's buffers
// (indexed by rank, as this rank's device addresses them). `bounds`: the plan's
// RankPlan::fused_bounds (parts sized by speed), or empty for the even split above.
Status EnqueueFusedPart(const CollectiveRequest& req, int rank, std::span<const uint64_t> bounds,
                        std::span<const void* const> inputs, std::span<void* const> outputs, device::Stream& stream);
// The same part done by the calling thread on memory the CPU reaches (host_reduce.h's kernels).
Status RunFusedPartOnCpu(const CollectiveRequest& req, int rank, std::span<const uint64_t> bounds,
                         std::span<const void* const> inputs, std::span<void* const> outputs);
// The bytes of this rank's input and output that a fused operation touches (the root's buffer
// alone matters for Broadcast's input and Reduce's output).
std::pair<uint64_t, uint64_t> FusedBytes(const CollectiveRequest& req, int rank);
// A device whose streams are the host's CPUs over memory the CPU reaches (the emulated device,
// unthrottled: a throttled one paces its streams' work; without injected faults, which only the
// streams meet): a rank's part may run on any thread, as the stream's thread would run it.
bool CpuDoesParts(const device::DeviceProperties& props);

}  // namespace kizuna::collectives
