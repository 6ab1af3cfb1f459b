// Helpers shared by the algorithm files: splitting counts into parts, channels and chunks, rank
// arithmetic, link checks, and a small builder that maps the input onto the output for in-place
// requests and drops empty steps.
//
// Why every plan here completes with a window of 2 (plan.h's contract). Each algorithm orders a
// rank's transfers by a schedule of phases that every rank computes identically:
//  - a transfer's send and its receive belong to the same phase, and phases are ordered the same
//    way on every rank;
//  - in one phase a rank has at most one send and one receive, on disjoint slices (trees go
//    further: one transfer per phase, so they would complete even with a window of 1);
//  - a local step sits between phases and reads or writes only what earlier phases produced.
// Induction over phases: when every transfer of the earlier phases has completed, nothing older
// is in flight on any rank but local steps, which need no other rank to complete, so each rank
// can start both of its transfers of the next phase (the window holds two), and a transfer
// completes once both of its ends have started. Empty pieces are dropped on both ends alike (both compute the same
// counts), which removes a transfer from a phase without reordering the rest.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/shares.h"
#include "collectives/plan/topology.h"
#include "runtime/core/status.h"

namespace kizuna::collectives::algo {

// Scratch slots per stream of chunks (reduction accumulators, received contributions). Two are
// what the window of 2 needs (a slot is rewritten only after the step reading it completed);
// four let an executor with a deeper window keep more chunks in flight, for four chunks of memory.
inline constexpr uint64_t kScratchSlots = 4;

// A range of element indices (of some buffer's index space).
struct Range {
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t end() const { return offset + count; }
};

// Part i of `parts` nearly equal, contiguous parts of `whole`: the first whole.count % parts parts
// have one element more. Parts may be empty when parts > whole.count.
inline Range SplitEven(Range whole, uint64_t parts, uint64_t i) {
  const uint64_t base = whole.count / parts, extra = whole.count % parts;
  return {whole.offset + i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// Part i of contiguous parts of `whole` in proportion to `weights` (all finite and > 0), as
// WeightedBounds cuts them (shares.h): equal weights give exactly SplitEven's parts. A pure
// function of its inputs: every rank computes the same parts from the same shape.
inline Range SplitWeighted(Range whole, const std::vector<double>& weights, size_t i) {
  const std::vector<uint64_t> bounds = WeightedBounds(whole.count, weights);
  return {whole.offset + bounds[i], bounds[i + 1] - bounds[i]};
}

// Per rank, how much reduction work it should take (shares.h): its device's reduce speed when
// options.balance is on and every rank's speed is known, otherwise equal weights.
inline std::vector<double> ReduceWeights(const CommTopology& shape, const PlanOptions& options) {
  return collectives::ReduceWeights(shape, options.balance);
}

// Number of chunks of at most `chunk` elements that cover n elements.
inline uint64_t PieceCount(uint64_t n, uint64_t chunk) { return n == 0 ? 0 : (n - 1) / chunk + 1; }

// Chunk k of r (empty past its end). Computed without overflow for chunk = UINT64_MAX.
inline Range Piece(Range r, uint64_t chunk, uint64_t k) {
  if (k >= PieceCount(r.count, chunk)) return {r.end(), 0};
  const uint64_t off = k * chunk;
  return {r.offset + off, std::min(chunk, r.count - off)};
}

inline int Mod(int64_t a, int p) { return static_cast<int>(((a % p) + p) % p); }

// The distance (1..p-1) of round i of a pairwise exchange (rank r sends to r+d, receives from r-d)
// on channel c of `channels`. Each channel starts its rounds at its own offset, so that a rank's
// channels talk to different peers at a time: where every pair has its own link (a direct-connect
// mesh), they use different links instead of queueing on one. Every rank's round i on a channel
// has one distance, so sends and receives still meet.
inline int PairwiseDistance(int i, int p, int channel, int channels) {
  return 1 + static_cast<int>((static_cast<int64_t>(i) + static_cast<int64_t>(channel) * (p - 1) / channels) % (p - 1));
}
inline int FloorPow2(int p) {
  int q = 1;
  while (q <= p / 2) q *= 2;
  return q;
}
// Smallest k with 2^k >= p (0 for p = 1).
inline int CeilLog2(int p) {
  int k = 0;
  while ((int64_t{1} << k) < p) ++k;
  return k;
}

// Channels worth using for `elements` elements: never more than requested, never an empty one.
inline int ChannelsFor(const PlanOptions& options, uint64_t elements) {
  return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(options.channels), std::max<uint64_t>(elements, 1)));
}

// kNotSupported unless `from` reaches `to`; `why` says what needs the link.
inline Status RequireLink(const CommTopology& shape, int from, int to, std::string_view algorithm, std::string_view why) {
  if (from == to || shape.Reachable(from, to)) return Status::Ok();
  return NotSupported(fmt::format("{}: rank {} cannot reach rank {} ({})", algorithm, from, to, why));
}

// kNotSupported unless every rank reaches every other.
inline Status RequireFullyConnected(const CommTopology& shape, std::string_view algorithm, std::string_view why) {
  for (int a = 0; a < shape.link_rows(); ++a)  // a periodic shape's other rows repeat these
    for (int b = 0; b < shape.nranks; ++b) KZ_RETURN_IF_ERROR(RequireLink(shape, a, b, algorithm, why));
  return Status::Ok();
}

// The fold that recursive halving-doubling and recursive doubling use for a rank count p that
// is not a power of two: with p' the largest power of two <= p and rem = p - p', the ranks
// 0..2*rem-1 pair up (2i, 2i+1); the even one hands its data to the odd one before and gets the
// result back after, and the odd ones with the ranks >= 2*rem form p' "active" ranks.
struct Fold {
  explicit Fold(int p) : pp(FloorPow2(p)), rem(p - FloorPow2(p)) {}
  int pp;   // active ranks
  int rem;  // folded pairs
  // Active index of rank r, or -1 for an even rank of a folded pair.
  int Active(int r) const { return r < 2 * rem ? (r % 2 == 1 ? r / 2 : -1) : r - rem; }
  int RankOf(int a) const { return a < rem ? 2 * a + 1 : a + rem; }
  // The ranks whose data active rank a carries: FirstRank(a)..LastRank(a) (two for a folded pair).
  int FirstRank(int a) const { return a < rem ? 2 * a : a + rem; }
  int LastRank(int a) const { return a < rem ? 2 * a + 1 : a + rem; }
  bool Folded(int r) const { return r < 2 * rem; }
};

// kNotSupported unless the links the fold and the hypercube exchanges between active ranks use
// are there (both ways).
inline Status RequireFoldedHypercube(const CommTopology& shape, std::string_view algorithm) {
  const Fold f(shape.nranks);
  for (int i = 0; i < f.rem; ++i) {
    KZ_RETURN_IF_ERROR(RequireLink(shape, 2 * i, 2 * i + 1, algorithm, "a folded pair of the non-power-of-two fold"));
    KZ_RETURN_IF_ERROR(RequireLink(shape, 2 * i + 1, 2 * i, algorithm, "a folded pair of the non-power-of-two fold"));
  }
  for (int a = 0; a < f.pp; ++a)
    for (int m = 1; m < f.pp; m *= 2)
      KZ_RETURN_IF_ERROR(RequireLink(shape, f.RankOf(a), f.RankOf(a ^ m), algorithm, "a hypercube exchange"));
  return Status::Ok();
}

inline Status NotImplemented(Algorithm a, const CollectiveRequest& request) {
  return NotSupported(fmt::format("{} does not implement {}", AlgorithmName(a), CollectiveName(request.collective)));
}

// One rank's plan under construction.
class Builder {
 public:
  Builder(const CollectiveRequest& request, const PlanOptions& options, int rank, int channels)
      : req(request), chunk(options.chunk_count), rank(rank), p(request.nranks) {
    plan.rank = rank;
    plan.channels.resize(static_cast<size_t>(channels));
  }

  const CollectiveRequest& req;
  const uint64_t chunk;
  const int rank;
  const int p;
  RankPlan plan;

  int channels() const { return static_cast<int>(plan.channels.size()); }

  // Input elements [offset, +count) of this rank. In place, the input is (part of) the output
  // (plan.h's table), so the slice is named in the output: step conflicts are computed per
  // buffer kind, and an input slice would hide that a later write to the output overwrites it.
  Slice In(uint64_t offset, uint64_t count) const {
    if (!req.in_place) return {BufferKind::kInput, offset, count};
    const uint64_t own = static_cast<uint64_t>(rank) * req.count;
    switch (req.collective) {
      case Collective::kAllReduce:
      case Collective::kBroadcast:
      case Collective::kReduce:
        return {BufferKind::kOutput, offset, count};
      case Collective::kReduceScatter:  // only this rank's part lies in the output
        if (offset >= own && offset - own < req.count) return {BufferKind::kOutput, offset - own, count};
        return {BufferKind::kInput, offset, count};
      case Collective::kAllGather:
        return {BufferKind::kOutput, own + offset, count};
      default:
        return {BufferKind::kInput, offset, count};
    }
  }
  Slice In(Range r) const { return In(r.offset, r.count); }
  static Slice Out(Range r) { return {BufferKind::kOutput, r.offset, r.count}; }
  static Slice Scratch(uint64_t offset, uint64_t count) { return {BufferKind::kScratch, offset, count}; }

  // Reserves n scratch elements; returns their offset.
  uint64_t AllocScratch(uint64_t n) {
    const uint64_t at = plan.scratch_count;
    plan.scratch_count += n;
    return at;
  }

  // Emitters. Empty steps are dropped: local ones are never emitted (ValidateRankPlan rejects
  // them), and an empty transfer is dropped by both of its ends, which compute the same count.
  void Send(int c, int peer, Slice src) {
    if (src.count > 0) steps(c).push_back(Step::Send(peer, src));
  }
  void Recv(int c, int peer, Slice dst) {
    if (dst.count > 0) steps(c).push_back(Step::Recv(peer, dst));
  }
  void RecvReduce(int c, int peer, Slice local, Slice dst) {
    if (dst.count > 0) steps(c).push_back(Step::RecvReduce(peer, local, dst));
  }
  // A copy onto itself (an in-place request's input is already its output) is dropped too.
  void Copy(int c, Slice src, Slice dst) {
    if (dst.count > 0 && !(src == dst)) steps(c).push_back(Step::Copy(src, dst));
  }
  // srcs in order; one source is a copy.
  void Reduce(int c, std::vector<Slice> srcs, Slice dst) {
    if (dst.count == 0) return;
    if (srcs.size() == 1) return Copy(c, srcs[0], dst);
    steps(c).push_back(Step::Reduce(std::move(srcs), dst));
  }
  // dst = src / RankPlan::divisor (an avg's division where the algorithm places it itself).
  void Scale(int c, Slice src, Slice dst) {
    if (dst.count > 0) steps(c).push_back(Step::Scale(src, dst));
  }
  // srcs in order, every rank's contribution: their avg, rounded once (Step::average).
  void ReduceAverage(int c, std::vector<Slice> srcs, Slice dst) {
    if (dst.count == 0) return;
    if (srcs.size() == 1) return Copy(c, srcs[0], dst);  // the avg of one rank's contribution
    steps(c).push_back(Step::ReduceAverage(std::move(srcs), dst));
  }
  // Zero-element messages: how barriers synchronize where each rank hears from every other directly.
  void SendToken(int c, int peer) { steps(c).push_back(Step::Send(peer, {BufferKind::kInput, 0, 0})); }
  void RecvToken(int c, int peer) { steps(c).push_back(Step::Recv(peer, {BufferKind::kOutput, 0, 0})); }
  // A barrier's rounds, (to, from) each, where ranks hear from others through a chain: round k's
  // token leaves only after round k-1's arrived. One scratch element a round carries it (round k's
  // send reads what round k-1's receive wrote), because that overlap is what keeps the executor's
  // window from starting every round at once: zero-element steps touch no memory, so nothing
  // would order them, and a rank could leave having heard from a few ranks only.
  void ChainedTokens(int c, const std::vector<std::pair<int, int>>& rounds) {
    const uint64_t base = AllocScratch(rounds.size() + 1);
    for (size_t k = 0; k < rounds.size(); ++k) {
      Send(c, rounds[k].first, Scratch(base + k, 1));
      Recv(c, rounds[k].second, Scratch(base + k + 1, 1));
    }
  }

  // Copies src to dst (equal counts) in chunks.
  void CopyChunked(int c, Slice src, Slice dst) {
    for (uint64_t k = 0; k < PieceCount(dst.count, chunk); ++k) {
      const Range pc = Piece({0, dst.count}, chunk, k);
      Copy(c, Sub(src, pc), Sub(dst, pc));
    }
  }

  // The part of s at `rel` (offsets relative to s).
  static Slice Sub(Slice s, Range rel) { return {s.buffer, s.offset + rel.offset, rel.count}; }

  std::vector<Step>& steps(int c) { return plan.channels[static_cast<size_t>(c)]; }
};

// The ranks of each host, as the shape's host ids group them (the hierarchical plans).
struct Hosts {
  std::vector<std::vector<int>> ranks;  // per host, ascending; hosts ordered by their lowest rank
  std::vector<int> host, local;         // per rank
  int widest = 0;                       // the most ranks on one host: the rail form's part count

  explicit Hosts(const CommTopology& shape) : host(static_cast<size_t>(shape.nranks)), local(host.size()) {
    std::unordered_map<std::string_view, size_t> ids;  // a host's index by its id (thousands of hosts)
    for (int r = 0; r < shape.nranks; ++r) {
      const auto [it, fresh] = ids.try_emplace(shape.ranks[static_cast<size_t>(r)].host_id, ranks.size());
      const size_t h = it->second;
      if (fresh) ranks.emplace_back();
      host[static_cast<size_t>(r)] = static_cast<int>(h);
      local[static_cast<size_t>(r)] = static_cast<int>(ranks[h].size());
      ranks[h].push_back(r);
      widest = std::max(widest, static_cast<int>(ranks[h].size()));
    }
  }
  int count() const { return static_cast<int>(ranks.size()); }
  int size(int h) const { return static_cast<int>(ranks[static_cast<size_t>(h)].size()); }
  int Rank(int h, int l) const { return ranks[static_cast<size_t>(h)][static_cast<size_t>(l)]; }
  // The rank of host h that owns part (or local index) j: local rank j mod P_h.
  int Owner(int h, int j) const { return Rank(h, j % size(h)); }
};

}  // namespace kizuna::collectives::algo
