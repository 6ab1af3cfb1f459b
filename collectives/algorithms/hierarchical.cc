// Hierarchical plans: two levels, the ranks of each host first, then the hosts (docs/ALGORITHMS.md,
// "Hierarchical"). Hosts are the shape's host ids; local rank i of every host forms rail i.
//
// The rail form. With M ranks on the widest host, the data is cut into M parts; on host h, part j
// belongs to its local rank j mod P_h (P_h ranks on the host), so with equal hosts local rank i
// owns part i and talks across hosts only with the local ranks i of the other hosts (its rail,
// over its own NIC), and uneven hosts (3 + 5 ranks) still give every part one owner per host.
//
//   AllReduce      inside each host, every rank sends its contribution to each part straight to
//                  the part's owner, which adds them (a direct reduce-scatter); between hosts, the
//                  owners of each part AllReduce it (hier:pairwise/ring: a ring over the hosts;
//                  hier:pairwise/rd: recursive doubling, for small messages); inside each host
//                  the owners send the results to every other rank (a direct allgather). Each byte
//                  crosses the network once per direction per host, where a flat ring over every
//                  rank sends it 2(p-1)/p times through every host's links.
//   ReduceScatter  block b (rank b's result) belongs on host h to local rank (b's local index)
//                  mod P_h; inside each host its contributions go to that owner, then the owners
//                  on the other hosts send their partial sums straight to rank b, which adds them.
//   AllGather      the reverse: rank b's block goes straight to its owner on every other host,
//                  and inside each host every rank sends the blocks it holds to the others.
//   Broadcast      the root hands each part to its owner on the root's host, the part's owners
//                  pass it along a chain of hosts (pipelined by chunk), and inside each host the
//                  owners send it to the other ranks.
//   Reduce         the reverse: each host reduces each part at its owner, a chain of hosts ending
//                  at the root's host adds the partial sums, and the owners on the root's host
//                  send the result to the root.
//   AllToAll       rank d of another host gets one message from this host, with the blocks of
//                  every rank here: local rank (d's local index) mod P_h gathers them from its
//                  local peers and sends them on, so a pair of hosts exchanges P messages where a
//                  flat exchange sends P x P; the blocks for local peers go to them directly.
// Of these, hier:pairwise/rd serves AllReduce alone. Why the plans complete with a window of 2
// (plan.h, common.h's argument): every transfer belongs to a phase that both of its ends compute
// alike, phases are ordered alike on every rank (per chunk: the host level's rounds, the network
// level, the host level again; within a level, rounds then parts in ascending order), and in a
// phase a rank sends and receives at most once (a rank owning several parts or blocks, on uneven
// hosts, numbers its transfers of a round by the index the other end computes for them).
//
// hier:fused/ring and hier:fused/rd: the AllReduce whose host level runs over mapped memory
// (CommTopology::host_direct). The plan holds the network level alone, on the parts' owners'
// outputs; the executor sums each part over the host into its owner's output before it and copies
// the parts from their owners after it (RankPlan::host_parts, HostPart). Up to kHostLeaderPartBytes
// per part the parts are fewer than the ranks of the widest host (one part, owned by each host's
// first rank, for a small message: the leader form), so that a small message crosses the network
// once per host and not once per rail. hier:fused/ring also serves ReduceScatter and AllGather
// (BuildFusedBlocks).
//
// Not deterministic: the order of additions depends on the host layout, so with
// KIZUNA_DETERMINISTIC the build answers kNotSupported and the engine takes the next algorithm.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithms/hierarchical_level.h"
#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {
namespace {

class Hierarchical final : public AlgorithmImpl {
 public:
  explicit Hierarchical(Algorithm id) : id_(id) {}
  Algorithm id() const override { return id_; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    const bool ring = id_ == Algorithm::kHierRing;
    if (IsHostFused(id_)) return SupportsFused(request, shape);
    switch (request.collective) {
      case Collective::kAllReduce: break;
      case Collective::kReduceScatter:
      case Collective::kAllGather:
      case Collective::kBroadcast:
      case Collective::kReduce:
        if (ring) break;
        return NotImplemented(id_, request);
      case Collective::kAllToAll:
        if (request.in_place)
          return NotSupported(fmt::format("{}: AllToAll in place is not supported", AlgorithmName(id_)));
        if (ring) break;
        [[fallthrough]];
      default: return NotImplemented(id_, request);
    }
    const Hosts hosts(shape);
    if (hosts.count() < 2)
      return NotSupported(fmt::format("{} serves {} across hosts; all {} ranks are on one host", AlgorithmName(id_),
                                      CollectiveName(request.collective), shape.nranks));
    const std::string_view name = AlgorithmName(id_);
    for (int r = 0; r < shape.nranks; ++r) {
      const int h = hosts.host[static_cast<size_t>(r)], i = hosts.local[static_cast<size_t>(r)];
      for (int l = 0; l < hosts.size(h); ++l)
        KZ_RETURN_IF_ERROR(RequireLink(shape, r, hosts.Rank(h, l), name, "the ranks of a host exchange directly"));
      // The parts the rank owns (j = i mod P_h, i itself among them) and their owners elsewhere.
      for (int g = 0; g < hosts.count(); ++g)
        for (int j = i; j < hosts.widest && g != h; j += hosts.size(h))
          KZ_RETURN_IF_ERROR(
              RequireLink(shape, r, hosts.Owner(g, j), name, "a rank reaches its rail's ranks on the other hosts"));
    }
    return Status::Ok();
  }

  Status SupportsFused(const CollectiveRequest& request, const CommTopology& shape) const {
    const bool blocks =
        request.collective == Collective::kReduceScatter || request.collective == Collective::kAllGather;
    if (request.collective != Collective::kAllReduce && request.collective != Collective::kBarrier &&
        !(blocks && id_ == Algorithm::kHierFusedRing))
      return NotImplemented(id_, request);
    const Hosts hosts(shape);
    if (hosts.count() < 2)
      return NotSupported(fmt::format("{} serves {} across hosts; all {} ranks are on one host", AlgorithmName(id_),
                                      CollectiveName(request.collective), shape.nranks));
    if (!shape.host_direct)
      return NotSupported(fmt::format("{}: the ranks of a host do not share their buffers (no host group, or memory "
                                      "the CPU does not reach)",
                                      AlgorithmName(id_)));
    // The blocks' direct exchange: rank (h, i) and rank (g, k) of another host exchange where
    // k = i mod P_g (i's block to its owner on g) or i = k mod P_h (k's block to its owner on h).
    const uint32_t parts = blocks ? static_cast<uint32_t>(hosts.widest) : Parts(request, hosts);
    for (int r = 0; r < shape.nranks; ++r) {
      const int h = hosts.host[static_cast<size_t>(r)], i = hosts.local[static_cast<size_t>(r)];
      for (int g = 0; g < hosts.count(); ++g)
        for (int j = i; j < static_cast<int>(parts) && g != h; j += hosts.size(h))
          KZ_RETURN_IF_ERROR(RequireLink(shape, r, hosts.Owner(g, j), AlgorithmName(id_),
                                         "a rank reaches its rail's ranks on the other hosts"));
    }
    return Status::Ok();
  }

  // hier:fused's part count (HostFusedParts, plan.h).
  static uint32_t Parts(const CollectiveRequest& request, const Hosts& hosts) {
    return HostFusedParts(request, hosts.widest);
  }

  // "host level: direct exchange among the 4 ranks of host 1 (ranks 4-7); network level: ring over
  // 2 hosts, with ranks 1, 5 (rail 1: part 1 of 4)".
  std::string Describe(const CollectiveRequest& request, const CommTopology& shape, int rank) const override {
    const Hosts hosts(shape);
    const int h = hosts.host[static_cast<size_t>(rank)], l = hosts.local[static_cast<size_t>(rank)];
    const bool fused = IsHostFused(id_);
    const bool blocks =
        request.collective == Collective::kReduceScatter || request.collective == Collective::kAllGather;
    const int widest = fused && !blocks ? static_cast<int>(Parts(request, hosts)) : hosts.widest;
    std::vector<int> parts;
    for (int j = l; j < widest; j += hosts.size(h)) parts.push_back(j);
    std::string_view outer =
        id_ == Algorithm::kHierRd || id_ == Algorithm::kHierFusedRd ? "recursive doubling" : "ring";
    if (fused && parts.empty())
      return fmt::format("host level: mapped memory among the {} ranks of host {} ({}); network level: {} over {} "
                         "hosts among the owners of the {} part(s), none of them this rank's",
                         hosts.size(h), h, fmt::join(hosts.ranks[static_cast<size_t>(h)], ", "), outer,
                         hosts.count(), widest);
    std::vector<int> rail;
    for (int g = 0; g < hosts.count(); ++g) rail.push_back(hosts.Owner(g, parts[0]));
    if (request.collective == Collective::kReduceScatter || request.collective == Collective::kAllGather)
      outer = "direct exchange";
    if (request.collective == Collective::kBroadcast || request.collective == Collective::kReduce) outer = "chain";
    return fmt::format(
        "host level: {} among the {} ranks of host {} ({}); network level: {} over {} "
        "hosts, with ranks {} (rail {}: part{} {} of {})",
        fused ? "mapped memory" : "direct exchange", hosts.size(h), h,
        fmt::join(hosts.ranks[static_cast<size_t>(h)], ", "), outer, hosts.count(), fmt::join(rail, ", "), l,
        parts.size() > 1 ? "s" : "", fmt::join(parts, ", "), widest);
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    if (options.deterministic && IsReduction(request.collective))
      return NotSupported(
          fmt::format("{}: deterministic mode needs one order of additions for every layout; a "
                      "hierarchical plan adds in the order of its hosts",
                      AlgorithmName(id_)));
    const Hosts hosts(shape);
    Builder b(request, options, rank, ChannelsFor(options, request.count));
    const bool all_reduce = request.collective == Collective::kAllReduce;
    if (IsHostFused(id_)) {
      const HierarchicalShares shares =
          all_reduce ? HierarchicalWeights(shape, hosts.ranks, static_cast<int>(Parts(request, hosts)), options.balance,
                                           /*fused=*/true)
                     : HierarchicalShares{};
      return BuildFused(request, hosts, shares, b);
    }
    const HierarchicalShares shares =
        all_reduce ? HierarchicalWeights(shape, hosts.ranks, hosts.widest, options.balance, /*fused=*/false)
                   : HierarchicalShares{};
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      HierarchicalLevel level(b, hosts, c, R);
      level.Weigh(shares);
      switch (request.collective) {
        case Collective::kAllReduce: level.AllReduce(id_ == Algorithm::kHierRd); break;
        case Collective::kReduceScatter: level.ReduceScatter(); break;
        case Collective::kAllGather: level.AllGather(); break;
        case Collective::kBroadcast: level.Broadcast(); break;
        case Collective::kReduce: level.Reduce(); break;
        case Collective::kAllToAll: level.AllToAll(); break;
        default: break;  // Supports admitted nothing else
      }
    }
    return std::move(b.plan);
  }

 private:
  // hier:fused: the network level of each channel's parts; the host level is the executor's.
  Result<RankPlan> BuildFused(const CollectiveRequest& request, const Hosts& hosts, const HierarchicalShares& shares,
                              Builder& b) const {
    const uint32_t parts = Parts(request, hosts);
    b.plan.host_parts = parts;
    for (double w : shares.parts) b.plan.host_part_weights.push_back(static_cast<uint64_t>(w));
    b.plan.host_channels = static_cast<uint32_t>(b.channels());
    if (request.collective == Collective::kBarrier) {
      // Each host's first rank, once its host has met (the executor's host level), meets the other
      // hosts' first ranks: dissemination, a token to the host 2^k further on per round; the
      // host's other ranks wait for it at the host level's second meeting.
      const int g = hosts.host[static_cast<size_t>(b.rank)], H = hosts.count();
      if (hosts.local[static_cast<size_t>(b.rank)] == 0) {
        std::vector<std::pair<int, int>> rounds;
        for (int k = 0; k < CeilLog2(H); ++k)
          rounds.emplace_back(hosts.Rank(Mod(g + (1 << k), H), 0), hosts.Rank(Mod(g - (1 << k), H), 0));
        b.ChainedTokens(0, rounds);
      }
      return std::move(b.plan);
    }
    if (request.collective == Collective::kReduceScatter || request.collective == Collective::kAllGather)
      return BuildFusedBlocks(request, hosts, b);
    if (request.op == ReduceOp::kAvg) {
      // Each owner divides its parts after the network level: an epilogue over the whole output
      // would write, in place, parts of the input that the host's other ranks are still summing.
      b.plan.averages = true;
      b.plan.divisor = static_cast<uint32_t>(request.nranks);
    }
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      HierarchicalLevel level(b, hosts, c, R, static_cast<int>(parts));
      level.Weigh(shares);
      level.NetworkAllReduce(id_ == Algorithm::kHierFusedRd);
    }
    return std::move(b.plan);
  }

  // hier:fused ReduceScatter and AllGather: the host level's blocks (RankPlan::host_blocks), then
  // each channel's direct exchange. A rank owns its block and those of other hosts' ranks whose
  // local index is its own mod P (its host's ranks): ReduceScatter sums each over the host's
  // inputs (its own into its output, the others into scratch, sent to their ranks); AllGather
  // receives them from their ranks, and each rank copies the blocks it lacks from their holders.
  Result<RankPlan> BuildFusedBlocks(const CollectiveRequest& request, const Hosts& hosts, Builder& b) const {
    b.plan.host_parts = b.plan.host_channels = 0;  // BuildFused set them for the parts of an AllReduce
    const int g = hosts.host[static_cast<size_t>(b.rank)], l = hosts.local[static_cast<size_t>(b.rank)];
    const int P = hosts.size(g);
    const uint64_t count = request.count;
    const bool reduce = request.collective == Collective::kReduceScatter;
    uint64_t base = 0;
    if (reduce) {
      std::vector<int> foreign;
      for (int r = 0; r < request.nranks; ++r)
        if (hosts.host[static_cast<size_t>(r)] != g && hosts.local[static_cast<size_t>(r)] % P == l)
          foreign.push_back(r);
      base = b.AllocScratch(foreign.size() * count);
      if (P > 1) {
        b.plan.host_blocks.push_back({static_cast<uint32_t>(b.rank), 0, Builder::Out({0, count})});
        for (size_t q = 0; q < foreign.size(); ++q)
          b.plan.host_blocks.push_back(
              {static_cast<uint32_t>(foreign[q]), 0, Builder::Scratch(base + q * count, count)});
      }
    } else {
      for (int o = 0; o < request.nranks; ++o) {
        const int h = hosts.host[static_cast<size_t>(o)], i = hosts.local[static_cast<size_t>(o)];
        const int from = h == g ? i : i % P;  // o itself, or the owner its block came to
        if (from != l)
          b.plan.host_blocks.push_back({static_cast<uint32_t>(o), static_cast<uint32_t>(from),
                                        Builder::Out({static_cast<uint64_t>(o) * count, count})});
      }
    }
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      // avg: BuildPlan's epilogue divides this rank's block, which no other rank reads.
      HierarchicalLevel level(b, hosts, c, R, 0, /*fused=*/true, base);
      reduce ? level.ReduceScatter() : level.AllGather();
    }
    return std::move(b.plan);
  }


  Algorithm id_;
};

}  // namespace

const AlgorithmImpl& HierRingAlgorithm() {
  static const Hierarchical impl(Algorithm::kHierRing);
  return impl;
}

const AlgorithmImpl& HierRdAlgorithm() {
  static const Hierarchical impl(Algorithm::kHierRd);
  return impl;
}

const AlgorithmImpl& HierFusedRingAlgorithm() {
  static const Hierarchical impl(Algorithm::kHierFusedRing);
  return impl;
}

const AlgorithmImpl& HierFusedRdAlgorithm() {
  static const Hierarchical impl(Algorithm::kHierFusedRd);
  return impl;
}

}  // namespace kizuna::collectives::algo
