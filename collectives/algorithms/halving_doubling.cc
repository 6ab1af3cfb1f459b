// Recursive halving-doubling (Rabenseifner): log2(p) exchanges with partners at distance p/2,
// p/4, ..., 1 that halve the data each rank is responsible for while reducing it (the
// reduce-scatter), then log2(p) exchanges at distance 1, 2, ..., p/2 that double it again (the
// allgather). 2 log2(p) latencies and 2(p-1)/p of the data per rank for AllReduce.
//
//   AllReduce      the channel's slice cut into p' blocks; halving, then doubling.
//   ReduceScatter  halving over blocks made of the input's parts; each rank ends with its part.
//   AllGather      doubling over blocks made of the output's parts.
//
// Unlike devices (PlanOptions::balance, ReduceWeights): AllReduce's blocks are sized by the reduce
// speed of the active rank that ends with each, so at every halving step a pair splits what it
// holds by the speeds of the two halves of its subcube: with the fast ranks in one half and the
// slow in the other, each fast rank keeps and reduces the larger share, as many times larger as
// its half is faster.
// ReduceScatter and AllGather keep the even split: their blocks are the ranks' own parts.
//
// Rank counts that are not a power of two use the fold (common.h: Fold): with p' the largest
// power of two <= p, ranks 2i and 2i+1 (i < p - p') pair up; the even one sends its data to the
// odd one first (AllReduce, ReduceScatter: to be added; AllGather: to be placed) and receives
// the result from it last. A block of an active rank is then the data of the ranks it stands
// for, so a ReduceScatter still delivers every rank's own part: the odd rank of a pair ends with
// both parts reduced and hands the even one its part.
//
// Where values live: AllReduce works in the output (the rank's input is read on first touch);
// ReduceScatter keeps its running sums in scratch (the parts this rank keeps after its first
// halving step, or all of them at the odd rank of a folded pair) and writes only its own part to
// the output, at the last step.
//
// Deterministic mode: AllReduce sends every rank's contribution to each of the p' blocks straight
// to the block's active rank, which reduces them in rank order (DirectExchange), then runs the
// recursive-doubling allgather and the unfold as above; ReduceScatter is the direct exchange
// alone. Cost: (p-1) messages per rank per chunk instead of log2(p), the owners' scratch, and a
// fully connected shape (kNotSupported otherwise).
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "rhd";

// A chunk of one part (ReduceScatter / AllGather: part j of the collective; AllReduce: block j)
// of the channel: `index` is absolute in the buffer's index space, `rel` relative to the part's
// channel segment.
struct PieceRef {
  int part = 0;
  Range index;
  Range rel;
};

class Rhd final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kRhd; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    switch (request.collective) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter:
      case Collective::kAllGather:
        break;
      default:
        return NotImplemented(id(), request);
    }
    return RequireFoldedHypercube(shape, kName);
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    const bool ordered = options.deterministic && IsReduction(request.collective) && request.nranks > 1;
    if (ordered)
      KZ_RETURN_IF_ERROR(RequireFullyConnected(
          shape, kName, "deterministic mode sends every contribution straight to the rank that reduces it"));
    Builder b(request, options, rank, ChannelsFor(options, request.count));
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      if (b.p == 1) {
        b.CopyChunked(c, b.In(R), Builder::Out(R));
        continue;
      }
      Channel ch(b, c, R, ReduceWeights(shape, options));
      switch (request.collective) {
        case Collective::kAllReduce:
          ordered ? ch.OrderedAllReduce() : ch.AllReduce();
          break;
        case Collective::kReduceScatter:
          ordered ? ch.OrderedReduceScatter() : ch.ReduceScatter();
          break;
        case Collective::kAllGather:
          ch.AllGather();
          break;
        default:
          break;  // Supports admitted nothing else
      }
    }
    return std::move(b.plan);
  }

 private:
  class Channel {
   public:
    // `weights`: each rank's share of the reduction (ReduceWeights): AllReduce's blocks are sized by
    // their active ranks' weights.
    Channel(Builder& b, int c, Range R, const std::vector<double>& weights)
        : b_(b), c_(c), R_(R), f_(b.p), a_(f_.Active(b.rank)) {
      std::vector<double> active(static_cast<size_t>(f_.pp));
      for (int a = 0; a < f_.pp; ++a) active[static_cast<size_t>(a)] = weights[static_cast<size_t>(f_.RankOf(a))];
      blocks_ = WeightedBounds(R_.count, active);
    }

    void AllReduce() {
      const int r = b_.rank;
      std::vector<bool> touched(static_cast<size_t>(f_.pp), f_.Folded(r) && a_ >= 0);
      auto cur = [&](const PieceRef& x) {
        return touched[static_cast<size_t>(x.part)] ? Builder::Out(x.index) : b_.In(x.index);
      };
      ForEachPiece(R_, [&](Range pc) {
        if (f_.Folded(r) && a_ < 0) b_.Send(c_, r + 1, b_.In(pc));
        if (f_.Folded(r) && a_ >= 0) b_.RecvReduce(c_, r - 1, b_.In(pc), Builder::Out(pc));
      });
      if (a_ >= 0) {
        int lo = 0;
        for (int m = f_.pp / 2; m >= 1; m /= 2) {
          const int keep = (a_ & m) ? lo + m : lo, give = (a_ & m) ? lo : lo + m;
          const std::vector<PieceRef> out = BlockPieces(give, m), in = BlockPieces(keep, m);
          Interleave(f_.RankOf(a_ ^ m), out.size(), in.size(), [&](size_t i) { return cur(out[i]); },
                     [&](int peer, size_t i) { b_.RecvReduce(c_, peer, cur(in[i]), Builder::Out(in[i].index)); });
          for (int j = keep; j < keep + m; ++j) touched[static_cast<size_t>(j)] = true;
          lo = keep;
        }
        Doubling();
      }
      Unfold([&](int peer, bool send) {
        ForEachPiece(
            R_, [&](Range pc) { send ? b_.Send(c_, peer, Builder::Out(pc)) : b_.Recv(c_, peer, Builder::Out(pc)); });
      });
    }

    void OrderedAllReduce() {
      std::vector<OwnedPart> parts;
      for (int a = 0; a < f_.pp; ++a) parts.push_back({f_.RankOf(a), Block(a), Builder::Out(Block(a))});
      DirectExchange x(b_, c_, std::move(parts));
      for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
      if (a_ >= 0) Doubling();
      Unfold([&](int peer, bool send) {
        ForEachPiece(
            R_, [&](Range pc) { send ? b_.Send(c_, peer, Builder::Out(pc)) : b_.Recv(c_, peer, Builder::Out(pc)); });
      });
    }

    void ReduceScatter() {
      const int r = b_.rank;
      // The parts whose running sums this rank keeps in scratch: [wlo, whi).
      int wlo = 0, whi = 0;
      if (f_.Folded(r) && a_ >= 0) {
        whi = b_.p;  // the fold adds the pair's whole inputs
      } else if (a_ >= 0 && f_.pp >= 4) {
        const int m = f_.pp / 2, keep = (a_ & m) ? m : 0;
        wlo = f_.FirstRank(keep);
        whi = f_.LastRank(keep + m - 1) + 1;
      }
      const uint64_t base = b_.AllocScratch(static_cast<uint64_t>(whi - wlo) * R_.count);
      auto work = [&](int j, Range rel) {
        return Builder::Scratch(base + static_cast<uint64_t>(j - wlo) * R_.count + rel.offset, rel.count);
      };
      std::vector<bool> touched(static_cast<size_t>(b_.p), f_.Folded(r) && a_ >= 0);
      auto cur = [&](const PieceRef& x) {
        return touched[static_cast<size_t>(x.part)] ? work(x.part, x.rel) : b_.In(x.index);
      };
      // Fold: the even rank of a pair sends every part, the odd one adds them into scratch.
      if (f_.Folded(r)) {
        for (int j = 0; j < b_.p; ++j)
          for (const PieceRef& x : PartPieces(j)) {
            if (a_ < 0) b_.Send(c_, r + 1, b_.In(x.index));
            else b_.RecvReduce(c_, r - 1, b_.In(x.index), work(j, x.rel));
          }
      }
      if (a_ >= 0) {
        int lo = 0;
        for (int m = f_.pp / 2; m >= 1; m /= 2) {
          const int keep = (a_ & m) ? lo + m : lo, give = (a_ & m) ? lo : lo + m;
          const std::vector<PieceRef> out = BlockPieces(give, m), in = BlockPieces(keep, m);
          const bool last = m == 1;
          Interleave(f_.RankOf(a_ ^ m), out.size(), in.size(), [&](size_t i) { return cur(out[i]); },
                     [&](int peer, size_t i) {
                       const PieceRef& x = in[i];
                       const Slice dst =
                           last && x.part == r ? Builder::Sub(Builder::Out(R_), x.rel) : work(x.part, x.rel);
                       b_.RecvReduce(c_, peer, cur(x), dst);
                     });
          for (int j = f_.FirstRank(keep); j <= f_.LastRank(keep + m - 1); ++j) touched[static_cast<size_t>(j)] = true;
          lo = keep;
        }
      }
      // Unfold: the odd rank of a pair hands the even one its part.
      Unfold([&](int peer, bool send) {
        for (const PieceRef& x : PartPieces(send ? peer : r))
          send ? b_.Send(c_, peer, work(peer, x.rel)) : b_.Recv(c_, peer, Builder::Sub(Builder::Out(R_), x.rel));
      });
    }

    void OrderedReduceScatter() {
      std::vector<OwnedPart> parts;
      for (int j = 0; j < b_.p; ++j) parts.push_back({j, Seg(j), Builder::Out(R_)});
      DirectExchange x(b_, c_, std::move(parts));
      for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
    }

    void AllGather() {
      const int r = b_.rank;
      ForEachPiece({0, R_.count}, [&](Range rel) {
        b_.Copy(c_, Builder::Sub(b_.In(R_), rel), Builder::Sub(Builder::Out(Seg(r)), rel));
      });
      // Fold: the even rank of a pair places its input at the odd one.
      if (f_.Folded(r))
        ForEachPiece({0, R_.count}, [&](Range rel) {
          if (a_ < 0) b_.Send(c_, r + 1, Builder::Sub(b_.In(R_), rel));
          else b_.Recv(c_, r - 1, Builder::Sub(Builder::Out(Seg(r - 1)), rel));
        });
      if (a_ >= 0) Doubling();
      // Unfold: every part but the even rank's own.
      Unfold([&](int peer, bool send) {
        const int even = send ? peer : r;
        for (int j = 0; j < b_.p; ++j)
          if (j != even)
            for (const PieceRef& x : PartPieces(j))
              send ? b_.Send(c_, peer, Builder::Out(x.index)) : b_.Recv(c_, peer, Builder::Out(x.index));
      });
    }

   private:
    bool PartsAreBlocks() const { return b_.req.collective == Collective::kAllReduce; }
    // AllReduce block a of the channel's slice: the final sum of active rank a, sized by its weight.
    Range Block(int a) const {
      const auto i = static_cast<size_t>(a);
      return {R_.offset + blocks_[i], blocks_[i + 1] - blocks_[i]};
    }
    // ReduceScatter / AllGather: part j's segment of this channel (input resp. output index space).
    Range Seg(int j) const { return {static_cast<uint64_t>(j) * b_.req.count + R_.offset, R_.count}; }

    template <typename F>
    void ForEachPiece(Range range, F&& f) const {
      for (uint64_t k = 0; k < PieceCount(range.count, b_.chunk); ++k) f(Piece(range, b_.chunk, k));
    }

    std::vector<PieceRef> PartPieces(int j) const {
      std::vector<PieceRef> v;
      const Range seg = PartsAreBlocks() ? Block(j) : Seg(j);
      ForEachPiece({0, seg.count}, [&](Range rel) { v.push_back({j, {seg.offset + rel.offset, rel.count}, rel}); });
      return v;
    }

    // Chunks of the data of active blocks [lo, lo+m), in order.
    std::vector<PieceRef> BlockPieces(int lo, int m) const {
      std::vector<PieceRef> v;
      for (int a = lo; a < lo + m; ++a) {
        const int first = PartsAreBlocks() ? a : f_.FirstRank(a), last = PartsAreBlocks() ? a : f_.LastRank(a);
        for (int j = first; j <= last; ++j)
          for (PieceRef& x : PartPieces(j)) v.push_back(x);
      }
      return v;
    }

    // One exchange with `peer`: send i then receive i, for i = 0.. (phases of common.h). Both
    // ends build their lists from the same blocks, so one's sends are the other's receives.
    template <typename Src, typename RecvFn>
    void Interleave(int peer, size_t sends, size_t recvs, Src&& src, RecvFn&& recv) {
      for (size_t i = 0; i < std::max(sends, recvs); ++i) {
        if (i < sends) b_.Send(c_, peer, src(i));
        if (i < recvs) recv(peer, i);
      }
    }

    // Recursive-doubling allgather among the active ranks, in the output.
    void Doubling() {
      for (int m = 1; m < f_.pp; m *= 2) {
        const int mine = a_ & ~(m - 1), theirs = (a_ ^ m) & ~(m - 1);
        const std::vector<PieceRef> out = BlockPieces(mine, m), in = BlockPieces(theirs, m);
        Interleave(f_.RankOf(a_ ^ m), out.size(), in.size(), [&](size_t i) { return Builder::Out(out[i].index); },
                   [&](int peer, size_t i) { b_.Recv(c_, peer, Builder::Out(in[i].index)); });
      }
    }

    // The last phase of the fold: f(peer, true) at the odd rank of a pair, f(peer, false) at the
    // even one.
    template <typename F>
    void Unfold(F&& f) {
      const int r = b_.rank;
      if (!f_.Folded(r)) return;
      if (a_ >= 0) f(r - 1, true);
      else f(r + 1, false);
    }

    Builder& b_;
    const int c_;
    const Range R_;
    const Fold f_;
    const int a_;
    std::vector<uint64_t> blocks_;  // AllReduce: block a is [blocks_[a], blocks_[a + 1]) of R_
  };
};

}  // namespace

const AlgorithmImpl& RhdAlgorithm() {
  static const Rhd impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
