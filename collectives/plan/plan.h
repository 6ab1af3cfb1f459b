// Plans: what one rank does for one collective, as data (docs/ARCHITECTURE.md, docs/ALGORITHMS.md).
//
// An algorithm (collectives/algorithms/<name>.cc) turns a CollectiveRequest into a RankPlan for
// each rank: channels of steps (send / receive / receive-and-reduce / copy / reduce) on slices of
// three buffers. Plans are printable (PlanToString, kizuna-plan --dump, KIZUNA_DEBUG=TRACE),
// cached per request, simulated on host memory without any fabric (simulate.h), and executed by
// the executor over fabric connections and device streams (executor.h). The same plan runs on
// emulated and real devices.
//
// Buffers and element counts follow NCCL (counts are elements of the request's dtype):
//   collective      input (sendbuff)          output (recvbuff)         in place when
//   AllReduce       count                     count                     input == output
//   ReduceScatter   nranks * count            count (this rank's part)  input + rank*count == output
//   AllGather       count                     nranks * count            input == output + rank*count
//   Broadcast       count (read at root)      count                     input == output
//   Reduce          count                     count (written at root)   input == output
//   AllToAll        nranks * count            nranks * count            (not supported in place)
//   Send            count to rank `root`      -
//   Recv            -                         count from rank `root`
//   Barrier         -                         -
// ReduceScatter puts the reduction of every rank's input[r*count, (r+1)*count) in rank r's output;
// AllToAll puts rank j's input[r*count, (r+1)*count) in rank r's output[j*count, (j+1)*count).
//
// Execution semantics (the contract between algorithms, the simulator and the executor):
//  - A rank runs its channels independently; within a channel, steps are started in order, and
//    step i starts once every earlier step of its channel whose slices overlap step i's slices
//    (one writes what the other reads or writes) has completed. Non-overlapping steps may be in
//    flight together (a send and the next receive), up to a window of started, incomplete steps.
//  - Matching: the k-th send from rank a to rank b on channel c is received by b's k-th receiving
//    step (kRecv or kRecvReduce) from a on channel c; the two must have the same count. A send
//    completes when the matching receive has started (rendezvous: assume no buffering).
//  - Plans must complete (no deadlock) with a window of 2 started, incomplete steps per channel;
//    the executor's window is at least that. The simulator checks it.
//  - The epilogue runs after every channel of the rank has completed.
//  - Reductions use the request's op, except kAvg: algorithms reduce with kSum and the plan's
//    epilogue divides the rank's results by nranks (kScale); see BuildPlan in algorithm.h. A plan
//    whose every result is one kReduce over all nranks contributions (RankPlan::averages) divides
//    in that step instead (Step::average), with no epilogue.
//  - Every slice lies inside its buffer (input/output sizes from the table above, scratch from
//    RankPlan::scratch_count); a step's destination overlaps none of its sources, except that a
//    reduction's (or a scale's) destination may be exactly one of its sources.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

// Values are part of the C API (kz_coll_t... not exposed yet) and of plan dumps: append only.
enum class Collective : uint8_t {
  kAllReduce = 0,
  kReduceScatter = 1,
  kAllGather = 2,
  kBroadcast = 3,
  kReduce = 4,
  kAllToAll = 5,
  kSend = 6,
  kRecv = 7,
  kBarrier = 8,
};
inline constexpr int kNumCollectives = 9;
std::string_view CollectiveName(Collective c);  // "allreduce", "reducescatter", ...
// Accepts the names above, case-insensitively, and the NCCL-style "AllReduce" spellings.
std::optional<Collective> ParseCollective(std::string_view name);
bool IsReduction(Collective c);  // AllReduce, ReduceScatter, Reduce
bool HasRoot(Collective c);      // Broadcast, Reduce, Send, Recv (the peer)
// Send and Recv: matched per pair of ranks in call order, never counted with the collectives.
inline bool IsPointToPoint(Collective c) { return c == Collective::kSend || c == Collective::kRecv; }

// Algorithms, by the names KIZUNA_ALGO uses (docs/ALGORITHMS.md). Append only.
enum class Algorithm : uint8_t {
  kRing = 0,      // ring.cc: AllReduce, ReduceScatter, AllGather, Broadcast, Reduce
  kTree = 1,      // tree.cc: double binary tree; AllReduce, Broadcast, Reduce
  kRhd = 2,       // halving_doubling.cc: recursive halving-doubling; AllReduce, ReduceScatter, AllGather
  kRd = 3,        // recursive_doubling.cc: recursive doubling, small AllReduce; dissemination Barrier
  kPairwise = 4,  // pairwise.cc: direct exchange; AllToAll, AllGather, ReduceScatter, Barrier
  kP2p = 5,       // point_to_point.cc: Send, Recv
  // fused.cc: single-host direct AllReduce. Every rank reads its slice of every rank's input and
  // writes the result into that slice of every rank's output, in one device pass over directly
  // addressed memory (CommTopology::direct); the minimum traffic, 2 x the bytes of each rank.
  kFused = 6,
  // ina.cc: in-network aggregation, AllReduce only. Runs the communicator's INA layout
  // (collectives/ina/layout.h; CommTopology::ina): trees through aggregation devices, partial trees,
  // lines and rings at once, each on its share of the data. The aggregation devices are ranks
  // nranks..nranks+aggregators-1 of the plan (Plan::aggregators), with plans of their own.
  kIna = 7,
  // hierarchical.cc: two levels, the ranks of each host, then the hosts (local rank i of every host
  // forms rail i and carries 1/P of the data between hosts). Inside a host the ranks exchange
  // directly (pairwise); between hosts the parts' owners run a ring (kHierRing: AllReduce,
  // ReduceScatter, AllGather, Broadcast, Reduce) or recursive doubling (kHierRd: AllReduce, small
  // messages). Named "hier:INNER/OUTER"; KIZUNA_ALGO=hier lets the model pick among them.
  kHierRing = 8,
  kHierRd = 9,
  // The same AllReduce with the host level over mapped memory (CommTopology::host_direct): the
  // plan holds only the network level; the executor runs the host level through the host's group
  // (collectives/direct/same_host_group.h): each rank sums its parts over every local rank's
  // input into its output before the network level, and copies the other parts from their
  // owners' outputs after it (RankPlan::host_parts). "hier:fused/ring", "hier:fused/rd".
  // hier:fused/ring also serves ReduceScatter (each rank sums the blocks it owns over the host's
  // inputs, then the network level's direct exchange) and AllGather (the direct exchange, then
  // each rank copies the blocks it lacks from the local rank that holds them): RankPlan::host_blocks.
  kHierFusedRing = 10,
  kHierFusedRd = 11,
  // from_file.cc: a schedule from a plan file (plan_file.h; KIZUNA_PLAN_FILE), the first of the
  // communicator's files that serves the request.
  kFile = 12,
  // torus.cc: AllReduce along each dimension of a torus the links contain (plan/rings.h's
  // FindTorus; a ring is a torus of one dimension), both directions of every line at once.
  kTorus = 13,
  // cycles.cc: AllReduce as rings both ways round two cycles through every rank that share no
  // cable (plan/rings.h's DisjointCycles: a 2D torus's), every port busy throughout.
  kCycles = 14,
};
inline constexpr int kNumAlgorithms = 15;
// "ring", "tree", "rhd", "rd", "pairwise", "p2p", "fused", "ina", "hier:pairwise/ring", "hier:pairwise/rd",
// "hier:fused/ring", "hier:fused/rd", "file", "torus", "cycles"
std::string_view AlgorithmName(Algorithm a);
std::optional<Algorithm> ParseAlgorithm(std::string_view name);
// The hierarchical algorithms (two levels: hosts, then ranks of a host).
inline bool IsHierarchical(Algorithm a) {
  return a == Algorithm::kHierRing || a == Algorithm::kHierRd || a == Algorithm::kHierFusedRing ||
         a == Algorithm::kHierFusedRd;
}
// Those whose host level the executor runs over mapped memory (RankPlan::host_parts).
inline bool IsHostFused(Algorithm a) { return a == Algorithm::kHierFusedRing || a == Algorithm::kHierFusedRd; }

struct CollectiveRequest {
  Collective collective = Collective::kAllReduce;
  int nranks = 1;
  uint64_t count = 0;  // elements, per the table above
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // reductions only
  int root = 0;                  // Broadcast / Reduce root; Send / Recv: the peer
  bool in_place = false;

  // Elements of each buffer, per the table above (0 where the collective has none).
  uint64_t input_count() const;
  uint64_t output_count() const;
  // "allreduce count=1000 float32 sum" (+ " root=2", " in-place"): how logs and errors name it.
  std::string ToString() const;
};

enum class BufferKind : uint8_t { kInput = 0, kOutput = 1, kScratch = 2 };
std::string_view BufferKindName(BufferKind b);  // "in", "out", "scratch"

// A range of elements of one buffer.
struct Slice {
  BufferKind buffer = BufferKind::kInput;
  uint64_t offset = 0;  // elements
  uint64_t count = 0;   // elements

  uint64_t end() const { return offset + count; }
  bool Overlaps(const Slice& o) const {
    return buffer == o.buffer && count > 0 && o.count > 0 && offset < o.end() && o.offset < end();
  }
  friend bool operator==(const Slice&, const Slice&) = default;
};

enum class StepKind : uint8_t {
  kSend = 0,        // send srcs[0] to peer
  kRecv = 1,        // receive dst.count elements from peer into dst
  kRecvReduce = 2,  // dst = srcs[0] op (dst.count elements received from peer)
  kCopy = 3,        // dst = srcs[0]
  kReduce = 4,      // dst = srcs[0] op srcs[1] op ... (in this order; one rounding for float16/bfloat16);
                    // with Step::average, that sum divided by srcs.size() before the rounding
  kScale = 5,       // dst = srcs[0] / RankPlan::divisor (the avg epilogue)
};
std::string_view StepKindName(StepKind k);  // "send", "recv", "recv-reduce", "copy", "reduce", "scale"

struct Step {
  StepKind kind = StepKind::kCopy;
  int peer = -1;            // kSend, kRecv, kRecvReduce
  Slice dst;                // unused by kSend
  std::vector<Slice> srcs;  // kSend, kRecvReduce, kCopy, kScale: 1; kReduce: >= 2; kRecv: none
  // kReduce of an avg request whose sources are every rank's contribution (srcs.size() == nranks):
  // the step computes ReduceOp::kAvg of them (dtype.h: the sum divided by nranks in the
  // accumulation type, rounded once), where kSum then a kScale would round a float16 / bfloat16
  // result twice. The single-host fused path rounds once too, so every algorithm agrees bit for bit
  // in deterministic mode.
  bool average = false;

  static Step Send(int peer, Slice src) { return {StepKind::kSend, peer, {}, {src}}; }
  static Step Recv(int peer, Slice dst) { return {StepKind::kRecv, peer, dst, {}}; }
  static Step RecvReduce(int peer, Slice local, Slice dst) { return {StepKind::kRecvReduce, peer, dst, {local}}; }
  static Step Copy(Slice src, Slice dst) { return {StepKind::kCopy, -1, dst, {src}}; }
  static Step Reduce(std::vector<Slice> srcs, Slice dst) { return {StepKind::kReduce, -1, dst, std::move(srcs)}; }
  static Step ReduceAverage(std::vector<Slice> srcs, Slice dst) {
    return {StepKind::kReduce, -1, dst, std::move(srcs), true};
  }
  static Step Scale(Slice src, Slice dst) { return {StepKind::kScale, -1, dst, {src}}; }

  // Elements the step moves or computes (dst.count, or srcs[0].count for a send).
  uint64_t count() const { return kind == StepKind::kSend ? srcs[0].count : dst.count; }
  // True when the two steps touch overlapping slices and at least one of them writes there.
  bool ConflictsWith(const Step& other) const;
  friend bool operator==(const Step&, const Step&) = default;
};

// One rank's part of a plan.
struct RankPlan {
  int rank = 0;
  std::vector<std::vector<Step>> channels;  // channel c's steps, in order; channels may be empty
  std::vector<Step> epilogue;               // after every channel completed
  uint64_t scratch_count = 0;               // elements of scratch the steps use
  uint32_t divisor = 1;                     // for kScale steps
  // An avg request's results come from Step::average reduces (or copies of their results), so
  // BuildPlan adds no dividing epilogue (set by the algorithm on every rank alike).
  bool averages = false;
  // hier:fused: the host level's parts, per channel (HostPart): part j of every channel is summed
  // over the host by local rank j mod P (P ranks on the host) before the steps, and copied from
  // there by the host's other ranks after them. 0 for every other algorithm.
  uint32_t host_parts = 0;
  uint32_t host_channels = 0;
  // hier:fused split by speed: part j's weight (HostPart cuts each channel's slice in proportion;
  // integers, so that every rank cuts alike). Empty: even parts.
  std::vector<uint64_t> host_part_weights;
  // hier:fused ReduceScatter and AllGather: the host level's blocks (block b: elements [b count,
  // (b + 1) count) of the input, ReduceScatter, or of the output, AllGather). ReduceScatter: before
  // the steps, block `block` of every local rank's input summed into `dst` (this rank's output, or
  // scratch that the steps send on). AllGather: after the steps, once every rank of the host has
  // done them, block `block` copied from the output of local rank `from` (ranks of a host
  // numbered in ascending order) into this rank's output.
  struct HostBlock {
    uint32_t block = 0;
    uint32_t from = 0;
    Slice dst;
    friend bool operator==(const HostBlock&, const HostBlock&) = default;
  };
  std::vector<HostBlock> host_blocks;
  // fused (direct/fused.h): where each rank's part of the work begins, nranks + 1 entries, the
  // same on every rank. Rank r does elements [fused_bounds[r], fused_bounds[r + 1]) of the vector
  // (AllReduce, Reduce, Broadcast) or of every rank's block laid end to end (ReduceScatter,
  // AllGather: the part may cover pieces of several blocks). Empty: the even split (FusedSlice).
  std::vector<uint64_t> fused_bounds;

  size_t step_count() const;
};

// The elements a fused plan's parts cut (RankPlan::fused_bounds): the vector's count, or every
// rank's block laid end to end (nranks x count) for ReduceScatter and AllGather.
uint64_t FusedWorkCount(const CollectiveRequest& request);

// hier:fused AllReduce's part count: one part per kHostLeaderPartBytes of the message, at least
// one and at most the widest host's ranks (one part, owned by each host's first rank, for a small
// message: it then crosses the network once per host and not once per rail). Every rank computes
// it alike.
inline constexpr uint64_t kHostLeaderPartBytes = 64 << 10;
uint32_t HostFusedParts(const CollectiveRequest& request, int widest_host);

// hier:fused's part j of channel c of `count` elements, cut into `channels` then `parts` even
// ranges (the first ones one element longer where they do not divide): {offset, count}.
// With `weights` (RankPlan::host_part_weights), the parts of each channel's slice in proportion
// to them (shares.h's WeightedBounds).
std::pair<uint64_t, uint64_t> HostPart(uint64_t count, uint32_t channels, uint32_t parts, uint32_t c, uint32_t j,
                                       const std::vector<uint64_t>& weights = {});

// How to cut a request into steps; part of a plan cache key.
struct PlanOptions {
  // The largest step, in elements (>= 1). Larger transfers are split into chunks of at most this
  // many elements so that they pipeline; the executor's staging slots hold one chunk.
  uint64_t chunk_count = 1;
  // Channels to spread the work over (>= 1): independent step sequences that run concurrently,
  // each over its own tag. An algorithm may use fewer (a tiny message needs one).
  int channels = 1;
  // KIZUNA_DETERMINISTIC: every element's reduction is srcs in rank order 0, 1, ..., nranks-1,
  // as one kReduce over all ranks' contributions (so one rounding for float16/bfloat16, avg's
  // division included: Step::average), whatever the algorithm, chunk size or placement: results
  // are bitwise identical across all of them and the fused algorithm.
  bool deterministic = false;
  // Heterogeneity: where an algorithm can split work unevenly (the double binary tree's two
  // halves, pairwise AllReduce's parts), split it in proportion to the capability the shape
  // reports (link and reduce speeds), so faster ranks and links carry more. Equal or unknown
  // speeds give the even split. false: always the even split (for comparisons).
  bool balance = true;
};

// What a plan was built from and for, and every rank's steps (or only the one rank's, when built
// for execution: `ranks` then holds exactly that rank).
struct Plan {
  CollectiveRequest request;
  Algorithm algorithm = Algorithm::kRing;
  uint64_t chunk_count = 0;  // the largest step, in elements (from PlanOptions)
  int channels = 1;
  // Ranks beyond the request's: the aggregation devices of an INA plan (Algorithm::kIna), ranks
  // nranks..nranks+aggregators-1, which have no input or output buffer (scratch only).
  int aggregators = 0;
  std::vector<RankPlan> ranks;
  // The executor's signature of this plan (executor_internal::MemberSignature), stored once when
  // a plan is cached so that calls need not hash it again; 0: not stored, computed per call.
  uint64_t signature = 0;

  int world() const { return request.nranks + aggregators; }
};

// Per-rank checks that need no other rank: slices inside their buffers, source/destination
// overlap rules, step shapes (srcs counts, peer in range and not the rank itself, counts equal
// between sources and destination), and no step larger than `max_step_count` (0: no limit).
// kInternal naming the channel, step and problem: a plan that fails is an algorithm bug.
// `aggregators`: Plan::aggregators (peers may be below nranks + aggregators; a rank at or beyond
// nranks is an aggregation device and has no input or output buffer).
Status ValidateRankPlan(const CollectiveRequest& request, const RankPlan& plan, uint64_t max_step_count,
                        int aggregators = 0);

// One line per step: "c0 #3 recv-reduce peer=2 out[100+50] <- in[100+50]".
std::string RankPlanToString(const RankPlan& plan);
// The header (request, algorithm, chunk, channels) and every rank held.
std::string PlanToString(const Plan& plan);

}  // namespace kizuna::collectives
