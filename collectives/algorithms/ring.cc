// Ring: every rank sends only to rank+1 and receives only from rank-1. Where the shape lacks a
// link r -> r+1, the ring goes round in the order of a cycle over the links it has (RingOrder,
// plan/rings.h: a torus of cables, hosts cabled out of rank order), and "rank r+1" below is the
// next rank in that order; parts are then even (RingWeights assumes rank order).
//
//   AllReduce      reduce-scatter then allgather around the ring: the channel's slice is cut into
//                  nranks parts; per round of chunks, nranks-1 steps "send part r-s, receive and
//                  reduce part r-s-1", after which rank r holds part r+1 reduced, then nranks-1
//                  steps passing the reduced parts on. 2(p-1) messages of n/p per rank. Rank r
//                  reduces every part but part r and copies every part but two: devices of
//                  unlike speed get parts sized so that the slow ranks and the ranks after them
//                  own large ones (RingWeights, shares.h), where that pays; even parts otherwise.
//   ReduceScatter  the same reduce-scatter on the input's nranks parts, shifted so that rank r
//                  ends with part r; the running partial sums live in scratch slots.
//   AllGather      the allgather half: rank r's input goes around the ring.
//   Broadcast      a pipelined chain from the root: root, root+1, ..., root-1, chunk by chunk.
//   Reduce         a pipelined chain ending at the root: root+1 sends, every next rank adds its
//                  input (in scratch slots) and passes on, the root adds into its output.
//   Barrier        nranks-1 rounds of a one-element token to rank+1, each after the last one
//                  arrived from rank-1 (Builder::ChainedTokens): the last has passed every rank.
//                  For shapes with no other way round (a ring of cables); others do it in log p.
//
// Deterministic mode (reductions): the ring's reduction order depends on the rank, so instead
// every rank sends its contribution to each part straight to the part's owner, which reduces all
// of them in rank order (DirectExchange), and for AllReduce the ring allgather then distributes
// the reduced parts; Reduce gathers everything at the root. Cost: (p-1) messages per rank and
// part per round instead of one, the owner's scratch for (p-1) chunks per slot, and a fully
// connected shape (kNotSupported otherwise).
#include <algorithm>
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"
#include "collectives/plan/rings.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "ring";

class Ring final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kRing; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    switch (request.collective) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter:
      case Collective::kAllGather:
      case Collective::kBroadcast:
      case Collective::kReduce:
      case Collective::kBarrier:
        break;
      default:
        return NotImplemented(id(), request);
    }
    if (!RingOrder(shape).empty()) return Status::Ok();
    for (int r = 0; r < shape.nranks; ++r)  // names the first missing link of rank order
      KZ_RETURN_IF_ERROR(RequireLink(shape, r, (r + 1) % shape.nranks, kName,
                                     "each rank sends to the next one, and no other cycle through every rank exists"));
    return Status::Ok();
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    const bool ordered = options.deterministic && IsReduction(request.collective) && request.nranks > 1;
    if (ordered)
      KZ_RETURN_IF_ERROR(RequireFullyConnected(
          shape, kName, "deterministic mode sends every contribution straight to the rank that reduces it"));
    const RingView ring(shape, rank);
    if (ring.order.empty()) return NotSupported(fmt::format("{}: no cycle through every rank", kName));
    if (request.collective == Collective::kBarrier) {
      Builder b(request, options, rank, 1);
      b.ChainedTokens(0, std::vector<std::pair<int, int>>(static_cast<size_t>(b.p - 1), {ring.Next(), ring.Prev()}));
      return std::move(b.plan);
    }
    Builder b(request, options, rank, ChannelsFor(options, request.count));
    const std::vector<double> weights = RingWeights(shape, options.balance);  // AllReduce's parts
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      if (b.p == 1) {
        b.CopyChunked(c, b.In(R), Builder::Out(R));  // every collective is a copy on one rank
        continue;
      }
      switch (request.collective) {
        case Collective::kAllReduce:
          ordered ? OrderedAllReduce(b, ring, c, R) : AllReduce(b, ring, c, R, weights);
          break;
        case Collective::kReduceScatter: ordered ? OrderedReduceScatter(b, c, R) : ReduceScatter(b, ring, c, R); break;
        case Collective::kAllGather: AllGather(b, ring, c, R); break;
        case Collective::kBroadcast: Broadcast(b, ring, c, R); break;
        case Collective::kReduce: ordered ? OrderedReduce(b, c, R) : Reduce(b, ring, c, R); break;
        default:
          break;  // Supports admitted nothing else
      }
    }
    return std::move(b.plan);
  }

 private:
  // The ring's order (RingOrder) seen from one rank: its place, and the ranks at other places.
  struct RingView {
    std::vector<int> order;
    int p = 0, me = 0;  // ranks, this rank's place
    RingView(const CommTopology& shape, int rank) : order(RingOrder(shape)), p(shape.nranks) {
      for (int i = 0; i < static_cast<int>(order.size()); ++i)
        if (order[static_cast<size_t>(i)] == rank) me = i;
    }
    int At(int place) const { return order[static_cast<size_t>(Mod(place, p))]; }  // the rank there
    int PlaceOf(int rank) const {
      return static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
    }
    int Next() const { return At(me + 1); }
    int Prev() const { return At(me - 1); }
  };

  // The channel's slice R of an AllReduce vector cut into p parts, and each part into rounds of
  // chunks: evenly, or (`weights`, RingWeights) sized so that the slow ranks do less. Uneven parts
  // are each cut into the largest part's number of rounds, so that every round carries every part
  // in proportion and each rank's work is spread evenly over the rounds.
  struct Parts {
    std::vector<Range> part;
    uint64_t rounds = 0;
    bool even = true;
    uint64_t chunk = 0;

    Parts(const Builder& b, Range R, const std::vector<double>* weights) : chunk(b.chunk) {
      even = weights == nullptr ||
             std::all_of(weights->begin(), weights->end(), [&](double w) { return w == (*weights)[0]; });
      const std::vector<uint64_t> bounds = even ? std::vector<uint64_t>{} : WeightedBounds(R.count, *weights);
      for (int j = 0; j < b.p; ++j)
        part.push_back(even ? SplitEven(R, static_cast<uint64_t>(b.p), static_cast<uint64_t>(j))
                            : Range{R.offset + bounds[j], bounds[j + 1] - bounds[j]});
      for (const Range& x : part) rounds = std::max(rounds, PieceCount(x.count, chunk));
    }
    // Round k's piece of part j.
    Range Piece(int j, uint64_t k) const {
      return even ? algo::Piece(part[static_cast<size_t>(j)], chunk, k)
                  : SplitEven(part[static_cast<size_t>(j)], rounds, k);
    }
  };

  // Allgather half of AllReduce, round k of every part: rank r starts with part r+shift reduced
  // in its output.
  static void AllGatherParts(Builder& b, const RingView& ring, int c, const Parts& parts, uint64_t k, int shift) {
    const int r = ring.me;
    for (int s = 0; s + 1 < b.p; ++s) {
      const Range sp = parts.Piece(Mod(r + shift - s, b.p), k);
      const Range rp = parts.Piece(Mod(r + shift - s - 1, b.p), k);
      b.Send(c, ring.Next(), Builder::Out(sp));
      b.Recv(c, ring.Prev(), Builder::Out(rp));
    }
  }

  static void AllReduce(Builder& b, const RingView& ring, int c, Range R, const std::vector<double>& weights) {
    const Parts parts(b, R, IsRankOrder(ring.order) ? &weights : nullptr);
    // Even parts: each round of chunks reduce-scatters and then allgathers, every rank busy at
    // every step. Uneven parts: a round's allgather waits for its reduce-scatter to reach the
    // ring's far end, which the largest parts make long; all reduce-scatter rounds first lets
    // them stream down the ring instead.
    for (uint64_t k = 0; k < parts.rounds; ++k) {
      ReduceScatterParts(b, ring, c, parts, k);
      if (parts.even) AllGatherParts(b, ring, c, parts, k, 1);
    }
    if (!parts.even)
      for (uint64_t k = 0; k < parts.rounds; ++k) AllGatherParts(b, ring, c, parts, k, 1);
  }

  // Reduce-scatter half of AllReduce, round k of every part: at step s, part r-s leaves (the
  // rank's own input at s = 0, its running sum after) and part r-s-1 arrives to be added to the
  // rank's input in the output. Rank r ends with part r+1 reduced.
  static void ReduceScatterParts(Builder& b, const RingView& ring, int c, const Parts& parts, uint64_t k) {
    const int r = ring.me;
    for (int s = 0; s + 1 < b.p; ++s) {
      const Range sp = parts.Piece(Mod(r - s, b.p), k);
      const Range rp = parts.Piece(Mod(r - s - 1, b.p), k);
      b.Send(c, ring.Next(), s == 0 ? b.In(sp) : Builder::Out(sp));
      b.RecvReduce(c, ring.Prev(), b.In(rp), Builder::Out(rp));
    }
  }

  // Deterministic mode needs every link, so the ring is in rank order: part j is rank j's.
  static void OrderedAllReduce(Builder& b, const RingView& ring, int c, Range R) {
    // Part j's owner reduces all of it here: even parts.
    const Parts even(b, R, nullptr);
    std::vector<OwnedPart> parts;
    for (int j = 0; j < b.p; ++j) parts.push_back({j, even.part[j], Builder::Out(even.part[j])});
    DirectExchange x(b, c, std::move(parts));
    for (uint64_t k = 0; k < x.rounds(); ++k) {
      x.Reduce(k);
      AllGatherParts(b, ring, c, even, k, 0);
    }
  }

  // Rank r's output is block r (the API's layout): the block of the rank s places back in the ring.
  static void ReduceScatter(Builder& b, const RingView& ring, int c, Range R) {
    const int r = ring.me, p = b.p;
    const uint64_t n = b.req.count;
    auto seg = [&](int j) { return Range{static_cast<uint64_t>(j) * n + R.offset, R.count}; };
    const uint64_t rounds = PieceCount(R.count, b.chunk);
    // Steps 0..p-3 of each round leave a running sum that step s+1 sends: scratch slots, used
    // round-robin (accumulator g = k*(p-2) + s); the last step adds into the output.
    const uint64_t per_round = static_cast<uint64_t>(p - 2);
    const uint64_t slots = std::min(kScratchSlots, rounds * per_round);
    const uint64_t slot_size = std::min(b.chunk, R.count);
    const uint64_t base = b.AllocScratch(slots * slot_size);
    auto acc = [&](uint64_t g, uint64_t count) { return Builder::Scratch(base + (g % slots) * slot_size, count); };
    for (uint64_t k = 0; k < rounds; ++k) {
      const Range rel = Piece({0, R.count}, b.chunk, k);
      for (int s = 0; s + 1 < p; ++s) {
        const uint64_t g = k * per_round + static_cast<uint64_t>(s);
        const Slice src = s == 0 ? Builder::Sub(b.In(seg(ring.At(r - 1))), rel) : acc(g - 1, rel.count);
        const Slice dst = s + 2 == p ? Builder::Sub(Builder::Out(R), rel) : acc(g, rel.count);
        b.Send(c, ring.Next(), src);
        b.RecvReduce(c, ring.Prev(), Builder::Sub(b.In(seg(ring.At(r - s - 2))), rel), dst);
      }
    }
  }

  static void OrderedReduceScatter(Builder& b, int c, Range R) {
    const uint64_t n = b.req.count;
    std::vector<OwnedPart> parts;
    for (int j = 0; j < b.p; ++j)
      parts.push_back({j, Range{static_cast<uint64_t>(j) * n + R.offset, R.count}, Builder::Out(R)});
    DirectExchange x(b, c, std::move(parts));
    for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
  }

  static void AllGather(Builder& b, const RingView& ring, int c, Range R) {
    const int r = ring.me, p = b.p;
    const uint64_t n = b.req.count;
    auto seg = [&](int j) { return Range{static_cast<uint64_t>(j) * n + R.offset, R.count}; };
    for (uint64_t k = 0; k < PieceCount(R.count, b.chunk); ++k) {
      const Range rel = Piece({0, R.count}, b.chunk, k);
      b.Copy(c, Builder::Sub(b.In(R), rel), Builder::Sub(Builder::Out(seg(b.rank)), rel));
      for (int s = 0; s + 1 < p; ++s) {
        b.Send(c, ring.Next(),
               s == 0 ? Builder::Sub(b.In(R), rel) : Builder::Sub(Builder::Out(seg(ring.At(r - s))), rel));
        b.Recv(c, ring.Prev(), Builder::Sub(Builder::Out(seg(ring.At(r - s - 1))), rel));
      }
    }
  }

  // Chain position i: the root is 0; chunk k crosses the link into position i in phase k+i-1.
  static void Broadcast(Builder& b, const RingView& ring, int c, Range R) {
    const int i = Mod(ring.me - ring.PlaceOf(b.req.root), b.p);
    for (uint64_t k = 0; k < PieceCount(R.count, b.chunk); ++k) {
      const Range pc = Piece(R, b.chunk, k);
      if (i == 0) b.Copy(c, b.In(pc), Builder::Out(pc));
      if (i > 0) b.Recv(c, ring.Prev(), Builder::Out(pc));
      if (i + 1 < b.p) b.Send(c, ring.Next(), i == 0 ? b.In(pc) : Builder::Out(pc));
    }
  }

  // Chain position i: root+1 is 0, the root is p-1.
  static void Reduce(Builder& b, const RingView& ring, int c, Range R) {
    const int i = Mod(ring.me - ring.PlaceOf(b.req.root) - 1, b.p);
    const uint64_t pieces = PieceCount(R.count, b.chunk);
    const bool middle = i > 0 && i + 1 < b.p;
    const uint64_t slots = middle ? std::min(kScratchSlots, pieces) : 0;
    const uint64_t slot_size = std::min(b.chunk, R.count);
    const uint64_t base = b.AllocScratch(slots * slot_size);
    for (uint64_t k = 0; k < pieces; ++k) {
      const Range pc = Piece(R, b.chunk, k);
      if (i == 0) {
        b.Send(c, ring.Next(), b.In(pc));
      } else if (middle) {
        const Slice acc = Builder::Scratch(base + (k % slots) * slot_size, pc.count);
        b.RecvReduce(c, ring.Prev(), b.In(pc), acc);
        b.Send(c, ring.Next(), acc);
      } else {
        b.RecvReduce(c, ring.Prev(), b.In(pc), Builder::Out(pc));
      }
    }
  }

  static void OrderedReduce(Builder& b, int c, Range R) {
    DirectExchange x(b, c, {OwnedPart{b.req.root, R, Builder::Out(R)}});
    for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
  }
};

}  // namespace

const AlgorithmImpl& RingAlgorithm() {
  static const Ring impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
