// Pairwise direct exchange: every rank talks to every other one, in nranks-1 rounds where rank r
// sends to r+k and receives from r-k (so every rank sends and receives once per round and no
// link carries two messages at once); each channel starts its rounds at its own k
// (PairwiseDistance), so that a rank's channels use different links at a time.
//
//   AllToAll       copy the own block, then block (r+k) to r+k and block (r-k) from r-k
//   AllGather      copy the own part, then the input to r+k and part (r-k) from r-k
//   ReduceScatter  part j to rank j (DirectExchange), one kReduce of every rank's part in rank
//                  order at its owner
//   AllReduce      that ReduceScatter over nranks parts of the vector, then the direct allgather
//   Barrier        a zero-element message to every peer and from every peer
//
// Every reduction is already one kReduce in rank order, so deterministic mode changes nothing
// and costs nothing here. Needs every link (a fully connected shape); AllToAll is not supported
// in place (a block would be overwritten before it is sent).
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"

namespace kizuna::collectives::algo {

DirectExchange::DirectExchange(Builder& b, int channel, std::vector<OwnedPart> parts)
    : b_(b), channel_(channel), parts_(std::move(parts)), part_of_(static_cast<size_t>(b.p), -1) {
  average_ = IsReduction(b.req.collective) && b.req.op == ReduceOp::kAvg;
  if (average_) b.plan.averages = true;
  for (size_t i = 0; i < parts_.size(); ++i) {
    part_of_[static_cast<size_t>(parts_[i].owner)] = static_cast<int>(i);
    rounds_ = std::max(rounds_, PieceCount(parts_[i].contribution.count, b.chunk));
  }
  const int mine = part_of_[static_cast<size_t>(b.rank)];
  if (mine >= 0 && b.p > 1) {
    const uint64_t n = parts_[static_cast<size_t>(mine)].contribution.count;
    slot_ = std::min(b.chunk, n);
    sets_ = std::min(kScratchSlots, PieceCount(n, b.chunk));
    base_ = b.AllocScratch(sets_ * static_cast<uint64_t>(b.p - 1) * slot_);
  }
}

void DirectExchange::Reduce(uint64_t k) {
  const int r = b_.rank, p = b_.p;
  const int mine = part_of_[static_cast<size_t>(r)];
  // Where contributor q's chunk k of this rank's part lands.
  auto slot = [&](int q, uint64_t count) {
    const uint64_t index = static_cast<uint64_t>(q < r ? q : q - 1);
    return Builder::Scratch(base_ + ((k % sets_) * static_cast<uint64_t>(p - 1) + index) * slot_, count);
  };
  Range own;  // chunk k of this rank's part, relative to the part
  if (mine >= 0) own = Piece({0, parts_[static_cast<size_t>(mine)].contribution.count}, b_.chunk, k);
  for (int i = 0; i + 1 < p; ++i) {
    const int d = PairwiseDistance(i, p, channel_, b_.channels());
    const int to = Mod(r + d, p), from = Mod(r - d, p);
    if (const int j = part_of_[static_cast<size_t>(to)]; j >= 0) {
      const Range whole = parts_[static_cast<size_t>(j)].contribution;
      const Range pc = Piece(whole, b_.chunk, k);
      b_.Send(channel_, to, b_.In(pc));
    }
    if (mine >= 0 && own.count > 0) b_.Recv(channel_, from, slot(from, own.count));
  }
  if (mine < 0 || own.count == 0) return;
  const OwnedPart& part = parts_[static_cast<size_t>(mine)];
  std::vector<Slice> srcs;
  srcs.reserve(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q)
    srcs.push_back(q == r ? b_.In(part.contribution.offset + own.offset, own.count) : slot(q, own.count));
  if (average_) b_.ReduceAverage(channel_, std::move(srcs), Builder::Sub(part.result, own));
  else b_.Reduce(channel_, std::move(srcs), Builder::Sub(part.result, own));
}

void DirectExchange::AllGather(uint64_t k) {
  const int r = b_.rank, p = b_.p;
  const int mine = part_of_[static_cast<size_t>(r)];
  for (int i = 0; i + 1 < p; ++i) {
    const int d = PairwiseDistance(i, p, channel_, b_.channels());
    const int to = Mod(r + d, p), from = Mod(r - d, p);
    if (mine >= 0) {
      const OwnedPart& part = parts_[static_cast<size_t>(mine)];
      b_.Send(channel_, to, Builder::Sub(part.result, Piece({0, part.contribution.count}, b_.chunk, k)));
    }
    if (const int j = part_of_[static_cast<size_t>(from)]; j >= 0) {
      const OwnedPart& part = parts_[static_cast<size_t>(j)];
      b_.Recv(channel_, from, Builder::Sub(part.result, Piece({0, part.contribution.count}, b_.chunk, k)));
    }
  }
}

namespace {

constexpr std::string_view kName = "pairwise";

class Pairwise final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kPairwise; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    switch (request.collective) {
      case Collective::kAllToAll:
        if (request.in_place)
          return NotSupported(
              "pairwise: alltoall in place is not supported (a block would be overwritten before it is sent)");
        break;
      case Collective::kAllGather:
      case Collective::kReduceScatter:
      case Collective::kAllReduce:
      case Collective::kBarrier:
        break;
      default:
        return NotImplemented(id(), request);
    }
    return RequireFullyConnected(shape, kName, "every rank exchanges with every other rank");
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    const CollectiveRequest& q = request;
    const std::vector<double> weights = PairwiseWeights(shape, options.balance);
    if (q.collective == Collective::kBarrier) {
      Builder b(q, options, rank, 1);
      for (int d = 1; d < q.nranks; ++d) {
        b.SendToken(0, Mod(rank + d, q.nranks));
        b.RecvToken(0, Mod(rank - d, q.nranks));
      }
      return std::move(b.plan);
    }
    Builder b(q, options, rank, ChannelsFor(options, q.count));
    for (int c = 0; c < b.channels(); ++c)
      BuildChannel(b, c, SplitEven({0, q.count}, static_cast<uint64_t>(b.channels()), static_cast<uint64_t>(c)),
                   weights);
    return std::move(b.plan);
  }

 private:
  static void BuildChannel(Builder& b, int c, Range R, const std::vector<double>& weights) {
    const int r = b.rank, p = b.p;
    const uint64_t n = b.req.count;
    // Block / part j of this channel: elements [j*count + R.offset, +R.count).
    auto seg = [&](int j) { return Range{static_cast<uint64_t>(j) * n + R.offset, R.count}; };
    const uint64_t pieces = PieceCount(R.count, b.chunk);
    switch (b.req.collective) {
      case Collective::kAllToAll:
        for (uint64_t k = 0; k < pieces; ++k) {
          const Range rel = Piece({0, R.count}, b.chunk, k);
          b.Copy(c, Builder::Sub(b.In(seg(r)), rel), Builder::Sub(Builder::Out(seg(r)), rel));
        }
        for (int i = 0; i + 1 < p; ++i) {
          const int d = PairwiseDistance(i, p, c, b.channels());
          const int to = Mod(r + d, p), from = Mod(r - d, p);
          for (uint64_t k = 0; k < pieces; ++k) {
            const Range rel = Piece({0, R.count}, b.chunk, k);
            b.Send(c, to, Builder::Sub(b.In(seg(to)), rel));
            b.Recv(c, from, Builder::Sub(Builder::Out(seg(from)), rel));
          }
        }
        return;
      case Collective::kAllGather:
        for (uint64_t k = 0; k < pieces; ++k) {
          const Range rel = Piece({0, R.count}, b.chunk, k);
          b.Copy(c, Builder::Sub(b.In(R), rel), Builder::Sub(Builder::Out(seg(r)), rel));
        }
        for (int i = 0; i + 1 < p; ++i) {
          const int d = PairwiseDistance(i, p, c, b.channels());
          const int to = Mod(r + d, p), from = Mod(r - d, p);
          for (uint64_t k = 0; k < pieces; ++k) {
            const Range rel = Piece({0, R.count}, b.chunk, k);
            b.Send(c, to, Builder::Sub(b.In(R), rel));
            b.Recv(c, from, Builder::Sub(Builder::Out(seg(from)), rel));
          }
        }
        return;
      case Collective::kReduceScatter: {
        std::vector<OwnedPart> parts;
        for (int j = 0; j < p; ++j) parts.push_back({j, seg(j), Builder::Out(R)});
        DirectExchange x(b, c, std::move(parts));
        for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
        return;
      }
      case Collective::kAllReduce: {
        // Part j is reduced by rank j (p inputs of it): with balance, sized so that every rank's
        // reductions and copies take one time (PairwiseWeights), so a slow device does less
        // (ReduceScatter's parts are the API's and cannot move).
        std::vector<OwnedPart> parts;
        const std::vector<uint64_t> bounds = WeightedBounds(R.count, weights);  // SplitWeighted's, cut once
        for (int j = 0; j < p; ++j) {
          const Range part{R.offset + bounds[static_cast<size_t>(j)],
                           bounds[static_cast<size_t>(j) + 1] - bounds[static_cast<size_t>(j)]};
          parts.push_back({j, part, Builder::Out(part)});
        }
        DirectExchange x(b, c, std::move(parts));
        for (uint64_t k = 0; k < x.rounds(); ++k) {
          x.Reduce(k);
          x.AllGather(k);
        }
        return;
      }
      default:
        return;  // Supports admitted nothing else
    }
  }
};

}  // namespace

const AlgorithmImpl& PairwiseAlgorithm() {
  static const Pairwise impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
