// Torus: AllReduce along the dimensions of a torus the links contain (FindTorus, plan/rings.h: a
// 2D or 3D torus in rank order, else the ring as a torus of one dimension), every port busy.
//
//   AllReduce  each channel's slice is reduce-scattered along the lines of one dimension (the
//              ranks that differ only in that coordinate: a ring of d ranks), which leaves each
//              rank 1/d of the slice reduced over its line; that part is reduce-scattered along
//              the next dimension, and so on, until each rank holds 1/p of the slice reduced over
//              every rank; then allgathers retrace the dimensions in reverse. On a line of d
//              ranks a stage is the ring's: d-1 steps "send part m-s, receive and reduce part
//              m-s-1" (reduce-scatter) or "send part m+1-s, receive part m-s" (allgather).
//
// Channels: with two or more asked for, 2k for a torus of k dimensions. Channel c goes round its
// lines in direction +1 (c even) or -1 (c odd) and takes the dimensions in order from dimension
// (c / 2) mod k: at any time the channels send over different ports (+x, -x, +y, -y, ...), so
// every cable of the torus carries data both ways at once. A ring of cables (one dimension) is
// the ring both ways round; the ring algorithm sends one way.
//
// Per rank and channel of n elements over a torus d_1 x ... x d_k, the reduce-scatters move
// n (1 - 1/p) elements, as the ring does, but over k·2 ports instead of one, in sum(d_i - 1)
// steps instead of p - 1 (the allgathers the same again).
//
// Deterministic mode runs the ring's ordered plan (ring.cc), which needs every pair linked.
//
//   AllToAll   store and forward, dimension by dimension: in phase i every block moves along
//              dimension i to its destination's coordinate, the shorter way round its line, one
//              cable a substep; a block bound further is kept in the forwarding rank's scratch
//              until its next hop. So ranks that share no cable exchange through the ranks in
//              between, along a shortest path (dimension order). Every rank computes where every
//              block is, so sender and receiver list a substep's transfers alike. One channel:
//              a block may arrive one way and leave the other, and a channel's steps are ordered
//              only among themselves. Each substep pairs a send with a receive, every rank alike
//              (the torus looks the same from every place), which is what completes with a window
//              of 2 (common.h).
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"
#include "collectives/plan/rings.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "torus";

Line LineOf(const Torus& t, int place, int dim, int direction) {
  Line line;
  const int d = t.dims[static_cast<size_t>(dim)];
  const int coord = t.Coordinate(place, dim);
  const int origin = t.Move(place, dim, -coord);
  for (int j = 0; j < d; ++j) line.ranks.push_back(t.rank(t.Move(origin, dim, direction * j)));
  line.me = Mod(direction * coord, d);
  return line;
}

class TorusImpl final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kTorus; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    if (request.collective != Collective::kAllReduce && request.collective != Collective::kAllToAll)
      return NotImplemented(id(), request);
    if (request.collective == Collective::kAllToAll && request.in_place)
      return NotSupported(fmt::format("{}: alltoall in place is not supported", kName));
    if (shape.nranks == 1 || !FindTorus(shape).dims.empty()) return Status::Ok();
    return NotSupported(fmt::format("{}: the links contain no torus and no cycle through every rank", kName));
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    // The lines reduce in an order of their own: deterministic mode takes the ring's plan, which
    // brings every contribution to its part's owner and reduces them in rank order.
    if (options.deterministic && request.collective == Collective::kAllReduce)
      return RingAlgorithm().Build(request, shape, options, rank);
    const Torus t = FindTorus(shape);
    if (request.collective == Collective::kAllToAll) {
      Builder b(request, options, rank, 1);
      if (b.p > 1 && t.dims.empty()) return NotSupported(fmt::format("{}: no torus", kName));
      AllToAll(b, t);
      return std::move(b.plan);
    }
    const int k = static_cast<int>(t.dims.size());
    const int want = options.channels >= 2 ? 2 * std::max(k, 1) : 1;
    Builder b(request, options, rank, ChannelsFor(PlanOptions{1, want}, request.count));
    if (b.p == 1) {
      b.CopyChunked(0, b.In({0, request.count}), Builder::Out({0, request.count}));
      return std::move(b.plan);
    }
    if (k == 0) return NotSupported(fmt::format("{}: no torus", kName));
    const int place = static_cast<int>(std::find(t.order.begin(), t.order.end(), rank) - t.order.begin());
    for (int c = 0; c < b.channels(); ++c) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c));
      const int direction = c % 2 == 0 ? 1 : -1;
      std::vector<Line> lines;
      std::vector<Range> held = {R};  // held[i]: the range stage i works on
      for (int i = 0; i < k; ++i) {
        lines.push_back(LineOf(t, place, (c / 2 + i) % k, direction));
        const Line& line = lines.back();
        LineReduceScatter(b, c, line, held.back(), i == 0);
        held.push_back(
            SplitEven(held.back(), static_cast<uint64_t>(line.d()), static_cast<uint64_t>(Mod(line.me + 1, line.d()))));
      }
      for (int i = k - 1; i >= 0; --i) LineAllGather(b, c, lines[static_cast<size_t>(i)], held[static_cast<size_t>(i)]);
    }
    return std::move(b.plan);
  }

 private:
  // Where the blocks of an AllToAll are, per phase (the header comment): block (P, D) carries
  // place P's input for place D. At the start of phase i, place q holds the blocks whose source
  // agrees with q in coordinates i.. and whose destination agrees with q in coordinates ..i-1,
  // but for its own (D = q), in (P, D) order.
  static std::vector<std::pair<int, int>> Held(const Torus& t, int q, int i) {
    const int p = static_cast<int>(t.order.size()), k = static_cast<int>(t.dims.size());
    auto agree = [&](int a, int from, int to) {
      for (int j = from; j < to; ++j)
        if (t.Coordinate(a, j) != t.Coordinate(q, j)) return false;
      return true;
    };
    std::vector<std::pair<int, int>> held;
    for (int P = 0; P < p; ++P)
      if (agree(P, i, k))
        for (int D = 0; D < p; ++D)
          if (D != q && agree(D, 0, i)) held.emplace_back(P, D);
    return held;
  }

  // Hops a block at place q takes along dimension i towards D: positive the +1 way, negative the
  // -1 way (the shorter; +1 on a tie), 0 where it is there.
  static int Hops(const Torus& t, int q, int D, int i) {
    const int d = t.dims[static_cast<size_t>(i)];
    const int ahead = Mod(t.Coordinate(D, i) - t.Coordinate(q, i), d);
    return ahead <= d / 2 ? ahead : ahead - d;
  }

  static void AllToAll(Builder& b, const Torus& t) {
    const uint64_t n = b.req.count;
    const int me = b.p == 1 ? 0 : static_cast<int>(std::find(t.order.begin(), t.order.end(), b.rank) - t.order.begin());
    auto rank_of = [&](int place) { return b.p == 1 ? 0 : t.rank(place); };
    auto block = [&](int rank) { return Range{static_cast<uint64_t>(rank) * n, n}; };
    b.CopyChunked(0, b.In(block(b.rank)), Builder::Out(block(b.rank)));
    if (b.p == 1 || n == 0) return;
    std::map<std::pair<int, int>, Slice> at;  // where this rank keeps each block it holds
    for (int D = 0; D < b.p; ++D)
      if (D != me) at[{me, D}] = b.In(block(rank_of(D)));
    const uint64_t pieces = PieceCount(n, b.chunk);
    for (int i = 0; i < static_cast<int>(t.dims.size()); ++i) {
      const int d = t.dims[static_cast<size_t>(i)];
      for (int s = 1; s <= d / 2; ++s)
        for (int direction : {1, -1}) {
          // Substep s: the blocks that left place o = me - (s-1) steps back at the phase's start
          // and go at least s hops this way pass from this rank on; those of o - 1 arrive.
          auto moving = [&](int o) {
            std::vector<std::pair<int, int>> out;
            for (const auto& [P, D] : Held(t, o, i)) {
              const int h = Hops(t, o, D, i);
              if (h * direction >= s) out.emplace_back(P, D);
            }
            return out;
          };
          const std::vector<std::pair<int, int>> sent = moving(t.Move(me, i, -direction * (s - 1)));
          const std::vector<std::pair<int, int>> got = moving(t.Move(me, i, -direction * s));
          const int next = rank_of(t.Move(me, i, direction)), prev = rank_of(t.Move(me, i, -direction));
          std::vector<Slice> into;
          for (const auto& [P, D] : got) {
            const Slice dst = D == me ? Builder::Out(block(rank_of(P))) : Builder::Scratch(b.AllocScratch(n), n);
            into.push_back(dst);
          }
          for (size_t j = 0; j < std::max(sent.size(), got.size()); ++j)
            for (uint64_t k = 0; k < pieces; ++k) {
              const Range piece = Piece({0, n}, b.chunk, k);
              if (j < sent.size()) b.Send(0, next, Builder::Sub(at.at(sent[j]), piece));
              if (j < got.size()) b.Recv(0, prev, Builder::Sub(into[j], piece));
            }
          for (const auto& [P, D] : sent) at.erase({P, D});
          for (size_t j = 0; j < got.size(); ++j)
            if (got[j].second != me) at[got[j]] = into[j];
        }
    }
  }
};

}  // namespace

// The ring's reduce-scatter of Q among the line, chunk round by chunk round: the rank at place m
// ends with part m+1 reduced over the line in its output. The first stage adds the input; later
// ones add what the earlier stages left in the output.
void LineReduceScatter(Builder& b, int c, const Line& line, Range Q, bool first) {
  const int d = line.d(), m = line.me;
  auto part = [&](int j) { return SplitEven(Q, static_cast<uint64_t>(d), static_cast<uint64_t>(Mod(j, d))); };
  const uint64_t rounds = PieceCount(part(0).count, b.chunk);
  for (uint64_t r = 0; r < rounds; ++r)
    for (int s = 0; s + 1 < d; ++s) {
      const Range sp = Piece(part(m - s), b.chunk, r), rp = Piece(part(m - s - 1), b.chunk, r);
      b.Send(c, line.Next(), first && s == 0 ? b.In(sp) : Builder::Out(sp));
      b.RecvReduce(c, line.Prev(), first ? b.In(rp) : Builder::Out(rp), Builder::Out(rp));
    }
}

// The ring's allgather of Q's parts among the line: the rank at place m starts with part m+1.
void LineAllGather(Builder& b, int c, const Line& line, Range Q) {
  const int d = line.d(), m = line.me;
  auto part = [&](int j) { return SplitEven(Q, static_cast<uint64_t>(d), static_cast<uint64_t>(Mod(j, d))); };
  const uint64_t rounds = PieceCount(part(0).count, b.chunk);
  for (uint64_t r = 0; r < rounds; ++r)
    for (int s = 0; s + 1 < d; ++s) {
      b.Send(c, line.Next(), Builder::Out(Piece(part(m + 1 - s), b.chunk, r)));
      b.Recv(c, line.Prev(), Builder::Out(Piece(part(m - s), b.chunk, r)));
    }
}
const AlgorithmImpl& TorusAlgorithm() {
  static const TorusImpl impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
