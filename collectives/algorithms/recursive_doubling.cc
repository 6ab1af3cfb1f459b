// Recursive doubling: log2(p) rounds in which partners at distance 1, 2, ..., p/2 exchange their
// whole vectors and both add what they received. The fewest latencies of any AllReduce, at
// n bytes per round, so it is for small messages. Rank counts that are not a power of two use
// the fold (common.h: Fold): the even rank of each of the first pairs sends its input to the odd
// one first and receives the result last.
//
// A round receives into scratch slots and adds one chunk behind the exchange (the value being
// sent must not change before its send completed), so a rank's reduction of chunk k overlaps the
// transfer of chunk k+1.
//
//   AllReduce  as above.
//   Barrier    dissemination: ceil(log2 p) rounds of one-element tokens to rank+2^k and from
//              rank-2^k, each round's after the last one's arrived (Builder::ChainedTokens); after
//              round k every rank has heard, transitively, from 2^(k+1) ranks.
//
// Deterministic mode (AllReduce): every rank sends its contribution to each of p parts straight
// to the part's owner, which reduces all of them in rank order (DirectExchange), then the owners
// send the reduced parts to every rank directly (pairwise allgather). Cost: 2(p-1) messages per
// rank and chunk instead of log2(p), and a fully connected shape (kNotSupported otherwise).
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "rd";

class Rd final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kRd; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    switch (request.collective) {
      case Collective::kAllReduce:
        return RequireFoldedHypercube(shape, kName);
      case Collective::kBarrier:
        for (int k = 0; k < CeilLog2(shape.nranks); ++k)
          for (int r = 0; r < shape.nranks; ++r)
            KZ_RETURN_IF_ERROR(
                RequireLink(shape, r, (r + (1 << k)) % shape.nranks, kName, "a dissemination barrier round"));
        return Status::Ok();
      default:
        return NotImplemented(id(), request);
    }
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    const int p = request.nranks;
    if (request.collective == Collective::kBarrier) {
      Builder b(request, options, rank, 1);
      std::vector<std::pair<int, int>> rounds;
      for (int k = 0; k < CeilLog2(p); ++k) rounds.emplace_back(Mod(rank + (1 << k), p), Mod(rank - (1 << k), p));
      b.ChainedTokens(0, rounds);
      return std::move(b.plan);
    }
    const bool ordered = options.deterministic && p > 1;
    if (ordered)
      KZ_RETURN_IF_ERROR(RequireFullyConnected(
          shape, kName, "deterministic mode sends every contribution straight to the rank that reduces it"));
    Builder b(request, options, rank, ChannelsFor(options, request.count));
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      if (p == 1) {
        b.CopyChunked(c, b.In(R), Builder::Out(R));
      } else if (ordered) {
        std::vector<OwnedPart> parts;
        for (int j = 0; j < p; ++j) {
          const Range part = SplitEven(R, static_cast<uint64_t>(p), static_cast<uint64_t>(j));
          parts.push_back({j, part, Builder::Out(part)});
        }
        DirectExchange x(b, c, std::move(parts));
        for (uint64_t k = 0; k < x.rounds(); ++k) {
          x.Reduce(k);
          x.AllGather(k);
        }
      } else {
        AllReduce(b, c, R);
      }
    }
    return std::move(b.plan);
  }

 private:
  static void AllReduce(Builder& b, int c, Range R) {
    const int r = b.rank;
    const Fold f(b.p);
    const int a = f.Active(r);
    const uint64_t pieces = PieceCount(R.count, b.chunk);
    auto piece = [&](uint64_t k) { return Piece(R, b.chunk, k); };
    if (f.Folded(r))
      for (uint64_t k = 0; k < pieces; ++k) {
        if (a < 0) b.Send(c, r + 1, b.In(piece(k)));
        else b.RecvReduce(c, r - 1, b.In(piece(k)), Builder::Out(piece(k)));
      }
    if (a >= 0) {
      const uint64_t slots = std::min(kScratchSlots, pieces), slot_size = std::min(b.chunk, R.count);
      const uint64_t base = b.AllocScratch(slots * slot_size);
      auto slot = [&](uint64_t k) { return Builder::Scratch(base + (k % slots) * slot_size, piece(k).count); };
      bool touched = f.Folded(r);  // the rank's value is in its output (else still its input)
      for (int m = 1; m < f.pp; m *= 2) {
        const int peer = f.RankOf(a ^ m);
        auto cur = [&](uint64_t k) { return touched ? Builder::Out(piece(k)) : b.In(piece(k)); };
        auto add = [&](uint64_t k) { b.Reduce(c, {cur(k), slot(k)}, Builder::Out(piece(k))); };
        for (uint64_t k = 0; k < pieces; ++k) {
          b.Send(c, peer, cur(k));
          b.Recv(c, peer, slot(k));
          if (k > 0) add(k - 1);  // one chunk behind: between this exchange and the next
        }
        if (pieces > 0) add(pieces - 1);
        touched = true;
      }
    }
    if (f.Folded(r))
      for (uint64_t k = 0; k < pieces; ++k) {
        if (a >= 0) b.Send(c, r - 1, Builder::Out(piece(k)));
        else b.Recv(c, r + 1, Builder::Out(piece(k)));
      }
  }
};

}  // namespace

const AlgorithmImpl& RdAlgorithm() {
  static const Rd impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
