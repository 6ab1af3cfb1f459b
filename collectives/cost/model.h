// The cost model: how long each algorithm takes for one request on one communicator shape
// (docs/ALGORITHMS.md), as α-β-γ formulas composed along the algorithm's structure from the
// topology's devices and links, with every constant named and justified (constants.cc).
//
// The model in one page. An algorithm runs as a sequence of *stages*. In a stage a set of hops
// (from -> to, one message of b bytes each, optionally reduced into the receiver's data) run
// concurrently on every channel. A stage costs
//
//   max over its hops of   latency(from, to) + launches      (α: overlaps across channels)
// + max over ranks r of    channels × ( cpu_r + max(wire_out_r, wire_in_r) + staging_r + reduce_r )
//
// with, for rank r and the hops it takes part in:
//   cpu_r      = (message_overhead + step_overhead) per message it sends or receives: the
//                executor is one thread per communicator, so channels' messages serialize on it;
//   wire_out_r = Σ b / link bandwidth over the hops it sends (wire_in_r: receives); a rank's
//                concurrent transfers share its bandwidth (a NIC, or the host's memory), except
//                in the torus's plans, where each link is a cable of its own (the largest link's
//                sum counts);
//   staging_r  = Σ b / staging copy speed for every message it packs or unpacks through a
//                staging buffer (LinkDesc::staged: one copy at each end);
//   reduce_r   = Σ 2·b / reduce speed for every message it reduces into its data (2 inputs);
//   launches   = one device operation per staging copy and per reduction (RankDesc::launch_us).
// Ranks that share a host share its CPUs and, for devices that compute on the host, its memory
// (cost_model_host.h): a stage with more of a host's ranks than it has CPUs takes that many times
// longer per rank (but for the wire time of cables at their own pace, LinkDesc::paced, which the
// CPUs' turns do not stretch: the larger of that and the stretched rest) plus a wake-up per thread
// beyond the CPUs, and never less than the host's memory traffic over the host's memory bandwidth.
// The α, β and γ terms are reported apart (Prediction): α = latency + launches + cpu, β = wire +
// staging + local copies (bytes moved), γ = reductions and the avg epilogue (arithmetic).
//
// Chunking and pipelining: data is split over PlanOptions::channels channels and each channel's
// share into k chunks of at most PlanOptions::chunk_count elements. A pipelined algorithm of depth
// d (a chain or a tree) costs (d + k − 1) stages: d − 1 to fill the pipeline at the largest
// chunk's size, then one per chunk; a ring costs k·(p − 1) stages per phase (each step needs the
// previous step's result); a round-based algorithm (rd, rhd, pairwise) costs k stages per round.
// Local work (copies, the deterministic ordered reduce, the avg epilogue) costs one device
// operation per chunk. Every prediction grows (weakly) with the count. A tree's pipelining
// overhead is structural, not a factor: its fill (2d − 1 stages for AllReduce) is paid at the
// chunk size, and a steady-state stage carries one chunk over every edge of both trees in both
// directions, so an inner rank sends 4 chunks and receives 4 per stage where a ring rank sends
// and receives one.
//
// Heterogeneity: every stage is as slow as its slowest hop and its slowest rank, so a ring pays
// for its slowest link in every step while rhd pays for a slow pair only in the rounds that use it.
//
// Determinism: every rank must predict the same numbers from the same shape. The model uses only
// integer arithmetic and IEEE +, −, ×, / on doubles in a fixed order (no libm calls; the file is
// compiled with -ffp-contract=off so no fused multiply-add changes a rounding).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

// Every constant of the model. A default-constructed CostConstants holds the defaults of the
// table in constants.cc (CostConstantTable()), the one place each value and the reason for it are
// written: measurements on this project's machines where one exists (docs/PERFORMANCE.md, "Where
// the cost model's constants come from"), estimates marked as such otherwise, to be calibrated
// against kizuna-bench (a model that mispredicts is a bug: docs/PERFORMANCE.md tracks the error). Shape values of 0
// ("unknown") are replaced by the unknown_* defaults.
struct CostConstants {
  CostConstants();  // every member from the table

  double unknown_link_latency_us;  // one-way link latency, the fabric's software path included
  double unknown_link_gbps;        // link bandwidth per direction
  double unknown_copy_gbps;        // device copy throughput (bytes copied)
  double unknown_reduce_gbps;      // device reduce throughput (input bytes read; plans reduce 2 inputs)
  double unknown_launch_us;        // one device operation (a kernel launch)
  // The executor's own work per message it sends or receives (operation header, tag matching, slot
  // accounting) beyond the fabric's path, which the link latency includes; serial on its thread.
  double message_overhead_us;
  // The executor's work to schedule one plan step (dependency check, completion), any step.
  double step_overhead_us;
  // A staged message is copied once at each end between the user's buffer and a staging slot in
  // host memory, at min(device copy speed, this).
  double staging_copy_max_gbps;
  // A fused (single-host direct) operation besides its one device pass: two rendezvous of the
  // ranks' executor threads in one process and a stream synchronization.
  double direct_rendezvous_us;
  // A small AllReduce between processes run whole on the calling thread through shared pages
  // (SameHostGroup::RunOneShot, CommTopology::direct_inline_bytes); a Barrier is its rendezvous alone.
  double oneshot_us;
  // Per thread beyond a host's CPUs (RankDesc::host_cpus) and per rendezvous or stage: waking and
  // scheduling it (cost_model_host.h counts the threads).
  double oversubscribed_wake_us;
  // The same for the threads a plan stage hands its work to beyond the ranks' own (the executor's,
  // a device stream's), which wait behind the ranks' spinning windows (docs/OPERABILITY.md, tuning).
  double handoff_wake_us;
  // Per rank in between on a forwarded pair's path (LinkDesc::hops): its fabric's relay thread
  // wakes and passes the bytes on.
  double relay_us;
  // Memory traffic (bytes read + written) per second of all ranks of one host whose devices
  // compute on the host (RankDesc::host_compute: emulated devices), together.
  double host_memory_gbps;
  // A host's last-level cache: where the bytes an operation touches on one machine (every rank's
  // input and output there) fit in it, the device copy, reduce and staging rates and the host's
  // memory rate of host-computing ranks are this many times their measured (memory) rates.
  double host_cache_mib;
  double cache_speedup;
};

// One constant as documented: the table behind CostConstants(), CostConstantsToString and
// ParseCostConstants.
struct CostConstantInfo {
  std::string_view name;    // "unknown_link_gbps"
  std::string_view unit;    // "GB/s", "us"
  double value;             // the default
  std::string_view source;  // why that value, in a line (docs/PERFORMANCE.md has the measurements)
  double CostConstants::*field;
};
std::span<const CostConstantInfo> CostConstantTable();

// "unknown_link_latency_us=1.1,unknown_link_gbps=25,..." (every constant, in table order).
std::string CostConstantsToString(const CostConstants& constants);
// Overrides constants from "name=value,name=value" (the form above; empty: no change) on top of
// `base`. kInvalidArgument naming the item for an unknown name, a malformed or negative or
// non-finite value, or a zero speed (a bandwidth or throughput of 0).
Result<CostConstants> ParseCostConstants(std::string_view text, CostConstants base = {});

// A prediction with its terms. seconds = alpha_s + beta_s + gamma_s, or +infinity when the model
// cannot predict (note says why: an unreachable link, a collective the algorithm does not serve,
// a shape that does not match the request).
struct Prediction {
  double seconds = std::numeric_limits<double>::infinity();
  double alpha_s = 0;     // latencies, device launches, executor overheads
  double beta_s = 0;      // bytes over links, staging copies, local copies
  double gamma_s = 0;     // reductions (incl. the deterministic ordered reduce), the avg epilogue
  double stages = 0;      // stages on the critical path, local chunk operations included (a count)
  std::string structure;  // "reduce-scatter 7 x 1 stages + allgather 7 x 1 stages"
  std::string note;       // why seconds is infinite; empty otherwise

  bool finite() const { return seconds < std::numeric_limits<double>::infinity(); }
  // "1.25 ms (alpha 40.1 us, beta 1.1 ms, gamma 120 us; 14 stages: reduce-scatter 7 + ...)" or
  // "no prediction: <note>".
  std::string ToString() const;
};

// The model's prediction for `algorithm` serving `request` on `shape` with `options`. Pure and
// deterministic (see the header comment). Never fails: inputs the model cannot use (the shape's
// rank count differs from the request's, an unreachable hop the algorithm would use, a
// collective the algorithm does not serve, chunk_count or channels < 1, an invalid dtype) give
// +infinity with a note. Where a request does not name the calling rank (Send, Recv), the
// slowest peer's link is used. Shape values that are 0, negative or not finite count as unknown.
//
// Formulas (p ranks, n bytes of the request's count, k chunks per channel; the structures are the
// ones collectives/algorithms/*.cc build; docs/ALGORITHMS.md gives the textbook forms):
//   ring     AllReduce: k(p−1) reduce-scatter + k(p−1) allgather stages of n/p/k bytes;
//            ReduceScatter, AllGather: k(p−1) stages; Broadcast, Reduce: a chain, (p−1)+k−1 stages
//   tree     NCCL's double binary tree, each tree half the data. AllReduce: reduce up and
//            broadcast down pipelined, 2d+k−1 stages (d: the deeper tree's depth); Broadcast,
//            Reduce: both trees rooted at the root, d+k−1 stages
//   rhd      Rabenseifner: log2(p') halving rounds then log2(p') doubling rounds, each block of a
//            round sent on its own; other rank counts fold the first 2(p−p') ranks in pairs
//            before and after (p' the largest power of two <= p)
//   rd       AllReduce: log2(p') rounds exchanging and adding all n (+ the fold); Barrier:
//            ⌈log2 p⌉ dissemination rounds of empty messages
//   pairwise p−1 direct rounds (AllToAll, AllGather); ReduceScatter: direct exchange + one
//            p-input ordered reduce; AllReduce: that on n/p parts + direct allgather; Barrier:
//            one stage of empty messages to and from every peer
//   p2p      Send, Recv: k stages of one hop
//   deterministic (reductions): the direct exchange of every contribution to its part's owner,
//            one p-input ordered reduce there, then the algorithm's distribution: ring: ring
//            allgather; rhd: the active ranks own a block each, then doubling and unfold; tree:
//            each tree's root owns a half, then the tree broadcast; rd, pairwise: direct
//            allgather. ReduceScatter: exchange and reduce; Reduce: p−1 rounds into the root,
//            then its ordered reduce
//   avg      + an epilogue dividing the results (one pass over them at copy speed)
//   local    own-block copies (AllGather out of place, AllToAll), the root's copy (Broadcast out
//            of place), the copy of a 1-rank communicator: one device operation per chunk
Prediction Predict(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                   const PlanOptions& options, const CostConstants& constants);

// Predict(...).seconds.
double PredictSeconds(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                      const PlanOptions& options, const CostConstants& constants);

// "ring: " + Predict(...).ToString(): what logs and kizuna-plan show.
std::string ExplainPrediction(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                              const PlanOptions& options, const CostConstants& constants);

// Three significant digits: "950 ns", "12.3 us", "1.25 ms", "2.5 s"; "inf" for +infinity.
std::string FormatSeconds(double seconds);

}  // namespace kizuna::collectives
