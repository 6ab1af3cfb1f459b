// In-network aggregation (DESIGN.md section 6): AllReduce over the communicator's INA layout
// (collectives/ina/layout.h, CommShape::ina). The layout's parts run at once, part i on its share
// of the vector (ina::SplitCount: in proportion to the parts' bandwidths), each on channels of
// its own:
//
//   trees (full tree, partial tree, line)  one channel. Chunk by chunk, every node receives the
//       chunk from each of its children and reduces it into its own (a worker: its input, in its
//       output; an aggregation device: in a scratch slot), sends the sum to its parent, receives
//       the finished chunk back and passes it on to its children. The root turns the sum around.
//       Each cable carries the part's bytes once in each direction, whatever the depth.
//   rings  two channels: a ring allreduce (reduce-scatter then allgather) on each half of the
//       part, one half in ring order and the other against it, so both directions of every cable
//       work.
//
// Aggregation devices are ranks nranks..nranks+M-1 of the plan (Plan::aggregators): their plans
// hold only receives, reductions and sends on scratch. Their memory is bounded: kScratchSlots
// chunks up and as many down per part, reused round-robin, whatever the message size. A worker
// accumulates in its output (the finished chunk from above overwrites it).
//
// Window of 2 (plan.h): chunks flow in the same order at every node; a node's transfers of chunk k
// wait only on its children's upward transfers of chunk k, on its parent's downward transfer of
// chunk k and on its own earlier steps, so by induction over (chunk, upward before downward,
// distance from the leaves / from the root) every transfer is eventually started at both ends.
// The simulator checks every layout the tests plan.
#include <utility>
#include <vector>

#include "collectives/algorithms/algorithms.h"
#include "collectives/ina/layout.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "ina";

// A plan rank of a node: workers are ranks, aggregation devices follow them.
int RankOf(const ina::Layout& layout, const ina::Node& n) {
  return n.aggregator() ? layout.workers + n.index : n.index;
}

// The channels each part uses, in order: one per tree, two per ring.
int ChannelsOf(const ina::Part& part) { return part.kind == ina::PartKind::kRing ? 2 : 1; }

class Ina final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kIna; }

  Status Supports(const CollectiveRequest& request, const CommShape& shape) const override {
    if (request.collective != Collective::kAllReduce) return NotImplemented(id(), request);
    if (!shape.ina)
      return NotSupported("ina: no aggregation layout for this allreduce: the communicator has no aggregation devices "
                          "(KIZUNA_INA_LAYOUT names them)");
    const ina::Layout& L = *shape.ina;
    if (L.workers != shape.nranks)
      return NotSupported(fmt::format("ina: the layout is for {} workers, the communicator has {} ranks", L.workers,
                                      shape.nranks));
    if (L.parts.empty()) return NotSupported("ina: the layout has no parts");
    // Worker-to-worker cables (rings, chains) need the pair reachable; aggregation devices are
    // reached through the transport's extra ranks.
    for (const ina::Part& part : L.parts) {
      if (part.kind == ina::PartKind::kRing) {
        const size_t n = part.ring.size();
        for (size_t i = 0; i < n && n > 1; ++i) {
          const int a = part.ring[i], b = part.ring[(i + 1) % n];
          KZ_RETURN_IF_ERROR(RequireLink(shape, a, b, kName, "a ring of the layout"));
          KZ_RETURN_IF_ERROR(RequireLink(shape, b, a, kName, "a ring of the layout"));
        }
        continue;
      }
      for (const ina::TreeEdge& e : part.edges)
        if (!e.child.aggregator() && !e.parent.aggregator()) {
          KZ_RETURN_IF_ERROR(RequireLink(shape, e.child.index, e.parent.index, kName, "a chain of the layout"));
          KZ_RETURN_IF_ERROR(RequireLink(shape, e.parent.index, e.child.index, kName, "a chain of the layout"));
        }
    }
    return Status::Ok();
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommShape& shape, const PlanOptions& options,
                         int rank) const override {
    KZ_RETURN_IF_ERROR(Supports(request, shape));
    if (options.deterministic)
      return NotSupported("ina: aggregation devices reduce in tree order, not rank order (KIZUNA_DETERMINISTIC)");
    const ina::Layout& L = *shape.ina;
    int channels = 0;
    for (const ina::Part& part : L.parts) channels += ChannelsOf(part);
    Builder b(request, options, rank, channels);
    const std::vector<ina::PartRange> shares = ina::SplitCount(L, request.count, 1);
    int c = 0;
    for (size_t i = 0; i < L.parts.size(); ++i) {
      const ina::Part& part = L.parts[i];
      const Range R{shares[i].offset, shares[i].count};
      if (request.nranks == 1) {
        if (rank == 0) b.CopyChunked(c, b.In(R), Builder::Out(R));
      } else if (part.kind == ina::PartKind::kRing) {
        const Range fwd = SplitEven(R, 2, 0), bwd = SplitEven(R, 2, 1);
        if (rank < request.nranks) {
          RingAllReduce(b, c, fwd, part.ring, false);
          RingAllReduce(b, c + 1, bwd, part.ring, true);
        }
      } else {
        TreeAllReduce(b, c, R, L, part);
      }
      c += ChannelsOf(part);
    }
    return std::move(b.plan);
  }

 private:
  // Reduce up the tree and broadcast down it, chunk by chunk (the file comment).
  static void TreeAllReduce(Builder& b, int c, Range R, const ina::Layout& L, const ina::Part& part) {
    const bool self_aggregator = b.rank >= b.p;
    int parent = -1;
    std::vector<int> children;
    for (const ina::TreeEdge& e : part.edges) {
      if (RankOf(L, e.child) == b.rank) parent = RankOf(L, e.parent);
      if (RankOf(L, e.parent) == b.rank) children.push_back(RankOf(L, e.child));
    }
    const bool root = RankOf(L, part.root) == b.rank;
    if (!root && parent < 0) return;  // an aggregation device this part does not use
    const uint64_t chunks = PieceCount(R.count, b.chunk);
    uint64_t up = 0, down = 0;
    if (self_aggregator && chunks > 0) {
      const uint64_t slot = std::min(b.chunk, R.count);
      up = b.AllocScratch(kScratchSlots * slot);
      down = root ? up : b.AllocScratch(kScratchSlots * slot);
    }
    for (uint64_t k = 0; k < chunks; ++k) {
      const Range pc = Piece(R, b.chunk, k);
      const uint64_t slot_at = (k % kScratchSlots) * std::min(b.chunk, R.count);
      Slice acc, result;
      if (self_aggregator) {
        acc = Builder::Scratch(up + slot_at, pc.count);
        result = root ? acc : Builder::Scratch(down + slot_at, pc.count);
        for (size_t j = 0; j < children.size(); ++j) {
          if (j == 0) b.Recv(c, children[j], acc);
          else b.RecvReduce(c, children[j], acc, acc);
        }
      } else {
        acc = b.In(pc);
        result = Builder::Out(pc);
        for (int child : children) {
          b.RecvReduce(c, child, acc, result);
          acc = result;
        }
      }
      if (root) {
        if (!(acc == result)) b.Copy(c, acc, result);  // a root without children: only for 1 node
      } else {
        b.Send(c, parent, acc);
        b.Recv(c, parent, result);
      }
      for (int child : children) b.Send(c, child, result);
    }
  }

  // A ring allreduce of R among `order` (every worker once), in order or against it.
  static void RingAllReduce(Builder& b, int c, Range R, const std::vector<int>& order, bool reverse) {
    const int n = static_cast<int>(order.size());
    int pos = 0;
    while (order[static_cast<size_t>(pos)] != b.rank) ++pos;
    auto at = [&](int i) { return order[static_cast<size_t>(Mod(reverse ? -i : i, n))]; };
    const int me = reverse ? Mod(-pos, n) : pos;  // this rank's place in the direction walked
    const int next = at(me + 1), prev = at(me - 1);
    auto part = [&](int j) { return SplitEven(R, static_cast<uint64_t>(n), static_cast<uint64_t>(Mod(j, n))); };
    const uint64_t rounds = PieceCount(part(0).count, b.chunk);
    for (uint64_t k = 0; k < rounds; ++k) {
      for (int s = 0; s + 1 < n; ++s) {  // reduce-scatter: part me-s leaves, part me-s-1 arrives
        const Range sp = Piece(part(me - s), b.chunk, k), rp = Piece(part(me - s - 1), b.chunk, k);
        b.Send(c, next, s == 0 ? b.In(sp) : Builder::Out(sp));
        b.RecvReduce(c, prev, b.In(rp), Builder::Out(rp));
      }
      for (int s = 0; s + 1 < n; ++s) {  // allgather: this rank starts with part me+1 finished
        const Range sp = Piece(part(me + 1 - s), b.chunk, k), rp = Piece(part(me - s), b.chunk, k);
        b.Send(c, next, Builder::Out(sp));
        b.Recv(c, prev, Builder::Out(rp));
      }
    }
  }
};

}  // namespace

const AlgorithmImpl& InaAlgorithm() {
  static const Ina impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
