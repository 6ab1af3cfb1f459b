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
// Only hier:pairwise/ring serves the collectives other than AllReduce; its inter-host level is the
// direct exchange (ReduceScatter, AllGather, AllToAll) or the chain (Broadcast, Reduce) above.
//
// Why these plans complete with a window of 2 (plan.h, common.h's argument): every transfer
// belongs to a phase that both of its ends compute alike, phases are ordered the same way on every
// rank (per chunk: the host level's rounds, the network level, the host level again; within a
// level, rounds then parts in ascending order), and in a phase a rank sends at most once and
// receives at most once. Where a rank owns several parts or blocks (uneven hosts), its transfers
// of one round are numbered by the index the other end computes for them, one per phase.
//
// hier:fused/ring and hier:fused/rd: the AllReduce whose host level runs over mapped memory
// (CommTopology::host_direct). The plan holds the network level alone, on the parts' owners'
// outputs; the executor sums each part over the host into its owner's output before it and copies
// the parts from their owners after it (RankPlan::host_parts, HostPart). Up to kLeaderPartBytes
// per part the parts are fewer than the ranks of the widest host (one part, owned by each host's
// first rank, for a small message: the leader form), so that a small message crosses the network
// once per host and not once per rail. hier:fused/ring also serves ReduceScatter and AllGather:
// the blocks' owners as in the rail form, the host level over mapped memory around the same
// direct exchange between hosts (RankPlan::host_blocks, BuildFusedBlocks).
//
// Not deterministic: the order of additions depends on the host layout, so with
// KIZUNA_DETERMINISTIC the build answers kNotSupported and the engine takes the next algorithm.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {
namespace {

// hier:fused: the least a part carries when there are fewer parts than rails. Below it, a message
// per rail costs more than the bytes it moves between hosts.
constexpr uint64_t kLeaderPartBytes = 64 << 10;

// The ranks of each host, as the shape's host ids group them.
struct Hosts {
  std::vector<std::vector<int>> ranks;  // per host, ascending; hosts ordered by their lowest rank
  std::vector<int> host, local;         // per rank
  int widest = 0;                       // the most ranks on one host: the rail form's part count

  explicit Hosts(const CommTopology& shape) : host(static_cast<size_t>(shape.nranks)), local(host.size()) {
    std::vector<std::string> ids;
    for (int r = 0; r < shape.nranks; ++r) {
      const std::string& id = shape.ranks[static_cast<size_t>(r)].host_id;
      const auto it = std::find(ids.begin(), ids.end(), id);
      const auto h = static_cast<size_t>(it - ids.begin());
      if (it == ids.end()) {
        ids.push_back(id);
        ranks.emplace_back();
      }
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

  // hier:fused's part count (kLeaderPartBytes): every rank computes it alike.
  static uint32_t Parts(const CollectiveRequest& request, const Hosts& hosts) {
    const uint64_t bytes = request.count * DataTypeSize(request.dtype);
    return static_cast<uint32_t>(
        std::clamp<uint64_t>(bytes / kLeaderPartBytes, 1, static_cast<uint64_t>(std::max(hosts.widest, 1))));
  }

  // "host level: direct exchange among the 4 ranks of host 1 (ranks 4-7); network level: ring over
  // 2 hosts, with ranks 1, 5 (rail 1: part 1 of 4)".
  std::string Describe(const CollectiveRequest& request, const CommTopology& shape, int rank) const override {
    const Hosts hosts(shape);
    const int h = hosts.host[static_cast<size_t>(rank)], l = hosts.local[static_cast<size_t>(rank)];
    const bool fused = IsHostFused(id_);
    const bool blocks = request.collective == Collective::kReduceScatter || request.collective == Collective::kAllGather;
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
    if (IsHostFused(id_)) return BuildFused(request, hosts, b);
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      Level level(b, hosts, c, R);
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
  Result<RankPlan> BuildFused(const CollectiveRequest& request, const Hosts& hosts, Builder& b) const {
    const uint32_t parts = Parts(request, hosts);
    b.plan.host_parts = parts;
    b.plan.host_channels = static_cast<uint32_t>(b.channels());
    if (request.collective == Collective::kBarrier) {
      // Each host's first rank, once its host has met (the executor's host level), meets the other
      // hosts' first ranks: dissemination, a token to the host 2^k further on per round; the
      // host's other ranks wait for it at the host level's second meeting.
      const int g = hosts.host[static_cast<size_t>(b.rank)], H = hosts.count();
      if (hosts.local[static_cast<size_t>(b.rank)] == 0)
        for (int k = 0; k < CeilLog2(H); ++k) {
          b.SendToken(0, hosts.Rank(Mod(g + (1 << k), H), 0));
          b.RecvToken(0, hosts.Rank(Mod(g - (1 << k), H), 0));
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
      Level level(b, hosts, c, R, static_cast<int>(parts));
      level.NetworkAllReduce(id_ == Algorithm::kHierFusedRd);
    }
    return std::move(b.plan);
  }

  // hier:fused ReduceScatter and AllGather: the host level's blocks (RankPlan::host_blocks) and
  // the network level's direct exchange of each channel. A rank owns, on its host, its own block
  // and those of the ranks of other hosts whose local index is its own mod P (its host's ranks):
  // ReduceScatter sums each over the host's inputs (its own block into its output, the others
  // into scratch) and sends the others to their ranks; AllGather receives them from their ranks,
  // and every rank copies each block it lacks from the local rank that holds it.
  Result<RankPlan> BuildFusedBlocks(const CollectiveRequest& request, const Hosts& hosts, Builder& b) const {
    b.plan.host_parts = 0;
    b.plan.host_channels = 0;
    const int g = hosts.host[static_cast<size_t>(b.rank)], l = hosts.local[static_cast<size_t>(b.rank)];
    const int P = hosts.size(g);
    const uint64_t count = request.count;
    const bool reduce = request.collective == Collective::kReduceScatter;
    uint64_t base = 0;
    if (reduce) {
      std::vector<int> foreign;
      for (int r = 0; r < request.nranks; ++r)
        if (hosts.host[static_cast<size_t>(r)] != g && hosts.local[static_cast<size_t>(r)] % P == l) foreign.push_back(r);
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
      Level level(b, hosts, c, R, 0, /*fused=*/true, base);
      if (reduce)
        level.ReduceScatter();  // avg: BuildPlan's epilogue divides this rank's block, which no other reads
      else
        level.AllGather();
    }
    return std::move(b.plan);
  }

  // One channel's steps for one rank.
  class Level {
   public:
    // `parts`: hier:fused's part count (0: the rail form's, the widest host's rank count).
    // `fused`: hier:fused's ReduceScatter or AllGather, whose host level is the executor's
    // (RankPlan::host_blocks; ReduceScatter's foreign blocks summed in scratch from `host_base`).
    Level(Builder& b, const Hosts& hosts, int c, Range R, int parts = 0, bool fused = false, uint64_t host_base = 0)
        : b_(b),
          hosts_(hosts),
          c_(c),
          R_(R),
          g_(hosts.host[static_cast<size_t>(b.rank)]),
          l_(hosts.local[static_cast<size_t>(b.rank)]),
          P_(hosts.size(g_)),
          H_(hosts.count()),
          M_(parts > 0 ? parts : hosts.widest),
          fused_(fused || parts > 0),
          host_base_(host_base) {}

    // hier:fused: the parts this rank owns, already summed over its host in its output (the
    // executor's host level), AllReduced among their owners; avg divided here (BuildFused).
    void NetworkAllReduce(bool doubling) {
      const std::vector<int> mine = PartsOf(l_, P_);
      if (mine.empty()) return;
      const uint64_t rounds = PieceCount(Part(0).count, b_.chunk);
      uint64_t slot_base = 0, slot_size = 0;
      if (doubling) {
        slot_size = std::min(b_.chunk, Part(0).count);
        slot_base = b_.AllocScratch(kScratchSlots * slot_size);
      }
      for (uint64_t k = 0; k < rounds; ++k)
        for (int j : mine) {
          const Range pc = Piece(Part(j), b_.chunk, k);
          if (pc.count == 0) continue;
          if (doubling)
            DoublingAllReduce(j, pc, Builder::Scratch(slot_base + (k % kScratchSlots) * slot_size, pc.count));
          else
            RingAllReduce(j, pc);
          if (b_.req.op == ReduceOp::kAvg) b_.Scale(c_, Builder::Out(pc), Builder::Out(pc));
        }
    }

    void AllReduce(bool doubling) {
      const uint64_t rounds = PieceCount(Part(0).count, b_.chunk);  // part 0 is the largest
      uint64_t slot_base = 0, slot_size = 0;
      if (doubling) {
        slot_size = std::min(b_.chunk, Part(0).count);
        slot_base = b_.AllocScratch(kScratchSlots * slot_size);
      }
      const std::vector<int> mine = PartsOf(l_, P_);
      for (uint64_t k = 0; k < rounds; ++k) {
        auto piece = [&](int j) { return Piece(Part(j), b_.chunk, k); };
        // Inside the host: each part's contributions to its owner, added into its output (a
        // host of one rank keeps its input, which the network level reads).
        std::vector<char> added(static_cast<size_t>(M_), 0);
        HostReduceScatter(
            mine, piece, [&](int j) { return Builder::Out(piece(j)); }, added);
        // Between hosts: the owners of each part, one per host.
        for (int j : mine) {
          const Range pc = piece(j);
          if (doubling) {
            const Slice slot = Builder::Scratch(slot_base + (k % kScratchSlots) * slot_size, pc.count);
            DoublingAllReduce(j, pc, slot);
          } else {
            RingAllReduce(j, pc);
          }
        }
        // Inside the host: the results from each owner to the other ranks.
        for (int d = 1; d < P_; ++d) {
          const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
          const std::vector<int> recvs = PartsOf(from, P_);
          for (size_t t = 0; t < std::max(mine.size(), recvs.size()); ++t) {
            if (t < mine.size()) b_.Send(c_, hosts_.Rank(g_, to), Builder::Out(piece(mine[t])));
            if (t < recvs.size()) b_.Recv(c_, hosts_.Rank(g_, from), Builder::Out(piece(recvs[t])));
          }
        }
      }
    }

    void ReduceScatter() {
      const uint64_t count = b_.req.count, rounds = PieceCount(R_.count, b_.chunk);
      // The blocks this rank owns besides its own, and a scratch slot set for each.
      std::vector<int> foreign;
      for (int r = 0; r < b_.p; ++r)
        if (r != b_.rank && LocalOf(r) % P_ == l_) foreign.push_back(r);
      // hier:fused: whole blocks, summed by the executor's host level before the steps.
      const uint64_t slot_size = std::min(b_.chunk, R_.count);
      const uint64_t base = fused_ ? host_base_ : b_.AllocScratch(foreign.size() * kScratchSlots * slot_size);
      for (uint64_t k = 0; k < rounds; ++k) {
        const Range pc = Piece(R_, b_.chunk, k);
        auto in = [&](int block) { return b_.In(static_cast<uint64_t>(block) * count + pc.offset, pc.count); };
        auto partial = [&](int block) {
          if (block == b_.rank) return Builder::Out(pc);
          const auto q = static_cast<uint64_t>(std::find(foreign.begin(), foreign.end(), block) - foreign.begin());
          if (fused_) return Builder::Scratch(base + q * count + pc.offset, pc.count);
          return Builder::Scratch(base + (q * kScratchSlots + k % kScratchSlots) * slot_size, pc.count);
        };
        // Inside the host: each block's contributions to its owner.
        for (int d = 1; d < P_ && !fused_; ++d) {
          const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
          const std::vector<int> sends = BlocksOwnedBy(to), recvs = BlocksOwnedBy(l_);
          for (size_t t = 0; t < std::max(sends.size(), recvs.size()); ++t) {
            if (t < sends.size()) b_.Send(c_, hosts_.Rank(g_, to), in(sends[t]));
            if (t < recvs.size())
              b_.RecvReduce(c_, hosts_.Rank(g_, from), d == 1 ? in(recvs[t]) : partial(recvs[t]), partial(recvs[t]));
          }
        }
        // Between hosts: each owner's partial sum straight to the block's rank.
        auto held = [&](int block) { return P_ > 1 ? partial(block) : in(block); };
        Slice mine = held(b_.rank);
        for (int e = 1; e < H_; ++e) {
          const int to_host = (g_ + e) % H_, from_host = (g_ - e + H_) % H_;
          std::vector<int> sends;  // rank b of to_host with b's local index = l_ mod P_, ascending
          for (int i = l_; i < hosts_.size(to_host); i += P_) sends.push_back(hosts_.Rank(to_host, i));
          const size_t my_t = static_cast<size_t>(l_ / hosts_.size(from_host));
          for (size_t t = 0; t < std::max(sends.size(), my_t + 1); ++t) {
            if (t < sends.size()) b_.Send(c_, sends[t], held(sends[t]));
            if (t == my_t) {
              b_.RecvReduce(c_, hosts_.Owner(from_host, l_), mine, Builder::Out(pc));
              mine = Builder::Out(pc);
            }
          }
        }
      }
    }

    void AllGather() {
      const uint64_t count = b_.req.count, rounds = PieceCount(R_.count, b_.chunk);
      // The blocks this rank holds after the network level: its own and those it owns elsewhere.
      std::vector<int> held;
      for (int r = 0; r < b_.p; ++r)
        if (r == b_.rank || (hosts_.host[static_cast<size_t>(r)] != g_ && LocalOf(r) % P_ == l_)) held.push_back(r);
      auto held_by = [&](int l) {
        std::vector<int> v;
        const int r = hosts_.Rank(g_, l);
        for (int o = 0; o < b_.p; ++o)
          if (o == r || (hosts_.host[static_cast<size_t>(o)] != g_ && LocalOf(o) % P_ == l)) v.push_back(o);
        return v;
      };
      for (uint64_t k = 0; k < rounds; ++k) {
        const Range pc = Piece(R_, b_.chunk, k);
        auto out = [&](int block) {
          return Builder::Out({static_cast<uint64_t>(block) * count + pc.offset, pc.count});
        };
        b_.Copy(c_, b_.In(pc), out(b_.rank));
        // Between hosts: the rank's block straight to its owner on every other host.
        for (int e = 1; e < H_; ++e) {
          const int to_host = (g_ + e) % H_, from_host = (g_ - e + H_) % H_;
          std::vector<int> recvs;  // ranks of from_host whose local index = l_ mod P_, ascending
          for (int i = l_; i < hosts_.size(from_host); i += P_) recvs.push_back(hosts_.Rank(from_host, i));
          const size_t my_t = static_cast<size_t>(l_ / hosts_.size(to_host));
          for (size_t t = 0; t < std::max(recvs.size(), my_t + 1); ++t) {
            if (t == my_t) b_.Send(c_, hosts_.Owner(to_host, l_), b_.In(pc));
            if (t < recvs.size()) b_.Recv(c_, recvs[t], out(recvs[t]));
          }
        }
        // Inside the host: every rank's held blocks to the others (hier:fused: the executor's
        // copies afterwards).
        for (int d = 1; d < P_ && !fused_; ++d) {
          const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
          const std::vector<int> recvs = held_by(from);
          for (size_t t = 0; t < std::max(held.size(), recvs.size()); ++t) {
            if (t < held.size()) b_.Send(c_, hosts_.Rank(g_, to), out(held[t]));
            if (t < recvs.size()) b_.Recv(c_, hosts_.Rank(g_, from), out(recvs[t]));
          }
        }
      }
    }

    void AllToAll() {
      // Pieces of each block small enough that a message of one piece of every rank of a host
      // fits a chunk (where the chunk holds one element per rank at least; else a message is
      // split into chunks).
      const auto widest = static_cast<uint64_t>(M_);
      const uint64_t count = b_.req.count, step = std::max<uint64_t>(1, b_.chunk / widest);
      const uint64_t rounds = PieceCount(R_.count, step), chunk = std::min(step, R_.count);
      // The ranks on other hosts whose blocks this rank gathers from its host and sends on.
      const std::vector<int> mine = Destinations(l_);
      const uint64_t bundle_size = chunk * static_cast<uint64_t>(P_);
      const uint64_t gathered = b_.AllocScratch(mine.size() * kScratchSlots * bundle_size);
      const uint64_t arriving = b_.AllocScratch(kScratchSlots * chunk * widest);
      for (uint64_t k = 0; k < rounds; ++k) {
        const Range pc = Piece(R_, step, k);
        auto in = [&](int to) { return b_.In(static_cast<uint64_t>(to) * count + pc.offset, pc.count); };
        auto out = [&](int from) { return Builder::Out({static_cast<uint64_t>(from) * count + pc.offset, pc.count}); };
        // Destination d's blocks from the P_ ranks of this host, in local order, one after another.
        auto bundle = [&](int d) {
          const auto q = static_cast<uint64_t>(std::find(mine.begin(), mine.end(), d) - mine.begin());
          return Builder::Scratch(gathered + (q * kScratchSlots + k % kScratchSlots) * bundle_size,
                                  pc.count * static_cast<uint64_t>(P_));
        };
        auto part = [&](Slice s, int i) { return Builder::Sub(s, {static_cast<uint64_t>(i) * pc.count, pc.count}); };
        b_.Copy(c_, in(b_.rank), out(b_.rank));
        for (int d : mine) b_.Copy(c_, in(d), part(bundle(d), l_));
        // Inside the host: the block for each local peer, and the blocks each peer gathers.
        for (int d = 1; d < P_; ++d) {
          const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
          std::vector<int> sends = {hosts_.Rank(g_, to)}, recvs = {hosts_.Rank(g_, from)};
          for (int dest : Destinations(to)) sends.push_back(dest);
          for (int dest : mine) recvs.push_back(dest);
          for (size_t t = 0; t < std::max(sends.size(), recvs.size()); ++t) {
            if (t < sends.size()) b_.Send(c_, hosts_.Rank(g_, to), in(sends[t]));
            if (t == 0)
              b_.Recv(c_, hosts_.Rank(g_, from), out(hosts_.Rank(g_, from)));
            else if (t < recvs.size())
              b_.Recv(c_, hosts_.Rank(g_, from), part(bundle(recvs[t]), from));
          }
        }
        // Between hosts: one message per destination with its blocks from every rank of this host.
        for (int e = 1; e < H_; ++e) {
          const int to_host = (g_ + e) % H_, from_host = (g_ - e + H_) % H_, from_size = hosts_.size(from_host);
          std::vector<int> sends;
          for (int dest : mine)
            if (hosts_.host[static_cast<size_t>(dest)] == to_host) sends.push_back(dest);
          const size_t my_t = static_cast<size_t>(l_ / from_size);
          const Slice landing = Builder::Scratch(arriving + (k % kScratchSlots) * chunk * widest,
                                                 pc.count * static_cast<uint64_t>(from_size));
          for (size_t t = 0; t < std::max(sends.size(), my_t + 1); ++t) {
            const Slice send = t < sends.size() ? bundle(sends[t]) : Slice{}, recv = t == my_t ? landing : Slice{};
            for (uint64_t m = 0; m < std::max(PieceCount(send.count, b_.chunk), PieceCount(recv.count, b_.chunk));
                 ++m) {
              b_.Send(c_, t < sends.size() ? sends[t] : -1, Builder::Sub(send, Piece({0, send.count}, b_.chunk, m)));
              b_.Recv(c_, hosts_.Owner(from_host, l_), Builder::Sub(recv, Piece({0, recv.count}, b_.chunk, m)));
            }
            if (t == my_t)
              for (int i = 0; i < from_size; ++i) b_.Copy(c_, part(landing, i), out(hosts_.Rank(from_host, i)));
          }
        }
      }
    }

    void Broadcast() {
      const int root = b_.req.root, root_host = hosts_.host[static_cast<size_t>(root)];
      const int pos = (g_ - root_host + H_) % H_;  // this host's place in the chain of hosts
      const bool is_root = b_.rank == root, root_host_rank = g_ == root_host;
      const std::vector<int> mine = PartsOf(l_, P_);
      const uint64_t rounds = PieceCount(Part(0).count, b_.chunk);
      for (uint64_t k = 0; k < rounds; ++k) {
        auto piece = [&](int j) { return Piece(Part(j), b_.chunk, k); };
        if (is_root)
          for (int j = 0; j < M_; ++j) b_.Copy(c_, b_.In(piece(j)), Builder::Out(piece(j)));
        // The root's host: each part to its owner.
        for (int j = 0; j < M_; ++j) {
          const int owner = hosts_.Owner(root_host, j);
          if (owner == root) continue;
          if (is_root) b_.Send(c_, owner, b_.In(piece(j)));
          if (b_.rank == owner) b_.Recv(c_, root, Builder::Out(piece(j)));
        }
        // Between hosts: each part along the chain of its owners.
        for (int j : mine) {
          const int prev = hosts_.Owner((g_ - 1 + H_) % H_, j), next = hosts_.Owner((g_ + 1) % H_, j);
          if (pos > 0) b_.Recv(c_, prev, Builder::Out(piece(j)));
          if (pos + 1 < H_) b_.Send(c_, next, Builder::Out(piece(j)));
        }
        // Inside each host: from the owners to the other ranks (the root has every part).
        for (int d = 1; d < P_; ++d) {
          const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
          const bool send = !(root_host_rank && hosts_.Rank(g_, to) == root);
          const std::vector<int> recvs = is_root ? std::vector<int>{} : PartsOf(from, P_);
          for (size_t t = 0; t < std::max(mine.size(), recvs.size()); ++t) {
            if (send && t < mine.size()) b_.Send(c_, hosts_.Rank(g_, to), Builder::Out(piece(mine[t])));
            if (t < recvs.size()) b_.Recv(c_, hosts_.Rank(g_, from), Builder::Out(piece(recvs[t])));
          }
        }
      }
    }

    void Reduce() {
      const int root = b_.req.root, root_host = hosts_.host[static_cast<size_t>(root)];
      const int pos = (g_ - root_host - 1 + 2 * H_) % H_;  // the chain ends at the root's host
      const bool is_root = b_.rank == root;
      const std::vector<int> mine = PartsOf(l_, P_);
      const uint64_t rounds = PieceCount(Part(0).count, b_.chunk);
      const uint64_t slot_size = std::min(b_.chunk, Part(0).count);
      const uint64_t base = is_root ? 0 : b_.AllocScratch(mine.size() * kScratchSlots * slot_size);
      for (uint64_t k = 0; k < rounds; ++k) {
        auto piece = [&](int j) { return Piece(Part(j), b_.chunk, k); };
        // Where this rank adds up part j: the root's output, scratch elsewhere.
        auto home = [&](int j) {
          if (is_root) return Builder::Out(piece(j));
          const auto q = static_cast<uint64_t>(std::find(mine.begin(), mine.end(), j) - mine.begin());
          return Builder::Scratch(base + (q * kScratchSlots + k % kScratchSlots) * slot_size, piece(j).count);
        };
        std::vector<char> added(static_cast<size_t>(M_), 0);  // part j's sum is in home(j)
        auto cur = [&](int j) { return added[static_cast<size_t>(j)] ? home(j) : b_.In(piece(j)); };
        HostReduceScatter(mine, piece, home, added);
        // Between hosts: a chain of each part's owners ending at the root's host.
        for (int j : mine) {
          const int prev = hosts_.Owner((g_ - 1 + H_) % H_, j), next = hosts_.Owner((g_ + 1) % H_, j);
          if (pos > 0) {
            b_.RecvReduce(c_, prev, cur(j), home(j));
            added[static_cast<size_t>(j)] = 1;
          }
          if (pos + 1 < H_) b_.Send(c_, next, cur(j));
        }
        // The root's host: each part from its owner to the root.
        if (g_ != root_host) continue;
        for (int j = 0; j < M_; ++j) {
          const int owner = hosts_.Owner(root_host, j);
          if (owner == root) {
            if (is_root) b_.Copy(c_, cur(j), Builder::Out(piece(j)));
            continue;
          }
          if (b_.rank == owner) b_.Send(c_, root, cur(j));
          if (is_root) b_.Recv(c_, owner, Builder::Out(piece(j)));
        }
      }
    }

   private:
    Range Part(int j) const { return SplitEven(R_, static_cast<uint64_t>(M_), static_cast<uint64_t>(j)); }
    int LocalOf(int r) const { return hosts_.local[static_cast<size_t>(r)]; }
    // The parts (of M_) that local rank l of a host of `size` ranks owns, ascending.
    std::vector<int> PartsOf(int l, int size) const {
      std::vector<int> v;
      for (int j = l; j < M_; j += size) v.push_back(j);
      return v;
    }
    // The blocks (ranks) that local rank l of this host owns, ascending.
    std::vector<int> BlocksOwnedBy(int l) const {
      std::vector<int> v;
      for (int r = 0; r < b_.p; ++r)
        if (LocalOf(r) % P_ == l) v.push_back(r);
      return v;
    }
    int Member(int h, int j) const { return hosts_.Owner(h, j); }
    // The ranks of the other hosts whose AllToAll blocks local rank l of this host gathers and
    // sends on: those whose local index is l mod P_, ascending.
    std::vector<int> Destinations(int l) const {
      std::vector<int> v;
      for (int r = 0; r < b_.p; ++r)
        if (hosts_.host[static_cast<size_t>(r)] != g_ && LocalOf(r) % P_ == l) v.push_back(r);
      return v;
    }

    // Inside the host: each part's contributions (piece(j) of every rank's input) to its owner,
    // which adds them into home(j) (this rank's parts: `mine`); added[j] says a sum is there.
    template <typename PieceFn, typename HomeFn>
    void HostReduceScatter(const std::vector<int>& mine, PieceFn piece, HomeFn home, std::vector<char>& added) {
      for (int d = 1; d < P_; ++d) {
        const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
        const std::vector<int> sends = PartsOf(to, P_);
        for (size_t t = 0; t < std::max(sends.size(), mine.size()); ++t) {
          if (t < sends.size()) b_.Send(c_, hosts_.Rank(g_, to), b_.In(piece(sends[t])));
          if (t < mine.size()) {
            const int j = mine[t];
            b_.RecvReduce(c_, hosts_.Rank(g_, from), added[static_cast<size_t>(j)] ? home(j) : b_.In(piece(j)),
                          home(j));
            added[static_cast<size_t>(j)] = 1;
          }
        }
      }
    }

    // Part j's piece pc, already summed over this host in the output (or, on a host of one rank,
    // still the input), AllReduced among the part's owners in a ring over the hosts.
    void RingAllReduce(int j, Range pc) {
      auto sub = [&](int s) { return SplitEven(pc, static_cast<uint64_t>(H_), static_cast<uint64_t>(Mod(s, H_))); };
      const int next = Member((g_ + 1) % H_, j), prev = Member((g_ - 1 + H_) % H_, j);
      const bool summed = fused_ || P_ > 1;
      for (int s = 0; s + 1 < H_; ++s) {
        const Range sp = sub(g_ - s), rp = sub(g_ - s - 1);
        b_.Send(c_, next, s == 0 && !summed ? b_.In(sp) : Builder::Out(sp));
        b_.RecvReduce(c_, prev, summed ? Builder::Out(rp) : b_.In(rp), Builder::Out(rp));
      }
      for (int s = 0; s + 1 < H_; ++s) {
        b_.Send(c_, next, Builder::Out(sub(g_ + 1 - s)));
        b_.Recv(c_, prev, Builder::Out(sub(g_ - s)));
      }
    }

    // The same with recursive doubling over the hosts (common.h's Fold for a host count that is
    // not a power of two); `slot` receives the partner's value before it is added.
    void DoublingAllReduce(int j, Range pc, Slice slot) {
      const Fold f(H_);
      const int a = f.Active(g_);
      Slice cur = fused_ || P_ > 1 ? Builder::Out(pc) : b_.In(pc);
      if (f.Folded(g_)) {
        if (a < 0) {
          b_.Send(c_, Member(g_ + 1, j), cur);
        } else {
          b_.RecvReduce(c_, Member(g_ - 1, j), cur, Builder::Out(pc));
          cur = Builder::Out(pc);
        }
      }
      if (a >= 0)
        for (int m = 1; m < f.pp; m *= 2) {
          const int peer = Member(f.RankOf(a ^ m), j);
          b_.Send(c_, peer, cur);
          b_.Recv(c_, peer, slot);
          b_.Reduce(c_, {cur, slot}, Builder::Out(pc));
          cur = Builder::Out(pc);
        }
      if (f.Folded(g_)) {
        if (a >= 0)
          b_.Send(c_, Member(g_ - 1, j), Builder::Out(pc));
        else
          b_.Recv(c_, Member(g_ + 1, j), Builder::Out(pc));
      }
    }

    Builder& b_;
    const Hosts& hosts_;
    const int c_;
    const Range R_;
    const int g_, l_, P_, H_, M_;  // this rank's host, local index, host size; hosts; parts
    const bool fused_;             // hier:fused: the host level is the executor's
    const uint64_t host_base_;     // hier:fused ReduceScatter: its foreign blocks' sums in scratch
  };

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
