// In-network aggregation (docs/ALGORITHMS.md): AllReduce over the communicator's INA layout
// (collectives/ina/layout.h, CommTopology::ina). The layout's parts run at once, part i on its share
// of the vector (ina::SplitCount: in proportion to the parts' bandwidths), each on channels of
// its own:
//
//   trees (full tree, partial tree, line)  one channel. Chunk by chunk, every node receives the
//       chunk from each of its children and reduces it into its own (a worker: its input, in its
//       output; an aggregation device: in a scratch slot), sends the sum to its parent, receives
//       the finished chunk back and passes it on to its children. The root turns the sum around.
//       Each cable carries the part's bytes once in each direction, whatever the depth.
//   rings  one channel: a ring allreduce (reduce-scatter then allgather) in ring order, each
//       worker sending only to the next (a simplex circuit: one port per worker).
//
// Aggregation devices are ranks nranks..nranks+M-1 of the plan (Plan::aggregators): their plans
// hold only receives, reductions and sends on scratch. Their memory is bounded: kScratchSlots
// chunks per child, going up and coming down, reused round-robin, whatever the message size. A
// worker reduces into its output (the finished chunk from above overwrites it).
//
// Window of 2 (plan.h): every transfer of a tree gets a time — chunk k's way up from a node of
// height h at k + h + 1, its way down to a node of depth d at k + H + d (H: the root's height) —
// that both of its ends compute alike, and every node lists its steps in the order of those times
// (receives before sends at equal times; a node's reduction between its receives and its send).
// So the ranks list their transfers in one global order, each transfer's inputs come from
// transfers earlier in it, and by induction over that order every transfer is eventually started
// at both ends. Rings follow common.h's phases. The simulator checks every layout the tests plan
// (hand-made ones and 225 of the planner's).
#include <algorithm>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"
#include "collectives/ina/layout.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "ina";

// A plan rank of a node: workers are ranks, aggregation devices follow them.
int RankOf(const ina::Layout& layout, const ina::Node& node) {
  return node.aggregator() ? layout.workers + node.index : node.index;
}

// One step of a tree node's part for chunk k, at the time it can happen (TreeSchedule).
struct TreeEvent {
  // `what` other than a child's index j >= 0 (a receive from child j).
  enum : int { kReduceStep = -1, kSendUp = -2, kReceiveDown = -3, kSendDown = -4 };
  double time;
  int order;  // 0: receive or local, 1: send
  uint64_t k;
  // j >= 0: receive from child j; kReduceStep: the reduction (a root's copy); kSendUp; kReceiveDown;
  // kSendDown: to every child
  int what;
};

// The order of the steps of plan rank `rank` (whose children in `part` are `children`) for
// `chunks` chunks: each at the time it can happen in a steady pipeline, counted in transfers of
// one chunk (t). Chunk k leaves a node of height h (hops above its deepest leaf) at k + h + 1,
// reaches the root (of height tree_height) at k + tree_height, and arrives at a node of depth d
// (hops below the root) at k + tree_height + d. Steps start in order, and a step that needs an
// earlier one's data waits for it, so a step listed before its time would hold up everything
// after it (a relay would wait for each chunk's round trip before taking the next one up: a third
// of the cables' speed, measured). Both ends of a transfer give it the same time, so every rank
// lists its transfers in one global order (the window-of-2 argument of the file comment); at
// equal times receives come before sends.
std::vector<TreeEvent> TreeSchedule(int rank, uint64_t chunks, const std::vector<int>& children,
                                    const ina::Layout& layout, const ina::Part& part) {
  std::map<int, int> parent_of, height, depth;
  std::map<int, std::vector<int>> kids;
  for (const ina::TreeEdge& e : part.edges) {
    parent_of[RankOf(layout, e.child)] = RankOf(layout, e.parent);
    kids[RankOf(layout, e.parent)].push_back(RankOf(layout, e.child));
  }
  const int root_rank = RankOf(layout, part.root);
  const bool root = root_rank == rank;
  std::function<int(int)> height_of = [&](int v) {
    if (auto it = height.find(v); it != height.end()) return it->second;
    int h = 0;
    for (int child : kids[v]) h = std::max(h, height_of(child) + 1);
    return height[v] = h;
  };
  const int tree_height = height_of(root_rank);
  std::function<int(int)> depth_of = [&](int v) {
    if (v == root_rank) return 0;
    if (auto it = depth.find(v); it != depth.end()) return it->second;
    return depth[v] = depth_of(parent_of[v]) + 1;
  };
  const int my_height = height_of(rank), my_depth = depth_of(rank);
  const uint64_t nchildren = children.size();
  std::vector<TreeEvent> events;
  for (uint64_t k = 0; k < chunks; ++k) {
    const double base = static_cast<double>(k);
    for (uint64_t j = 0; j < nchildren; ++j)
      events.push_back({base + height_of(children[j]) + 1, 0, k, static_cast<int>(j)});
    events.push_back({base + my_height + 0.5, 0, k, TreeEvent::kReduceStep});
    if (!root) {
      events.push_back({base + my_height + 1, 1, k, TreeEvent::kSendUp});
      events.push_back({base + tree_height + my_depth, 0, k, TreeEvent::kReceiveDown});
    }
    if (nchildren > 0) events.push_back({base + tree_height + my_depth + 1, 1, k, TreeEvent::kSendDown});
  }
  std::stable_sort(events.begin(), events.end(), [](const TreeEvent& a, const TreeEvent& x) {
    if (a.time != x.time) return a.time < x.time;
    if (a.order != x.order) return a.order < x.order;
    return a.k < x.k;
  });
  return events;
}


class Ina final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kIna; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    if (request.collective != Collective::kAllReduce) return NotImplemented(id(), request);
    if (!shape.ina)
      return NotSupported("ina: no aggregation layout for this allreduce: the communicator has no aggregation devices "
                          "(KIZUNA_INA_LAYOUT names them)");
    const ina::Layout& layout = *shape.ina;
    if (layout.workers != shape.nranks)
      return NotSupported(fmt::format("ina: the layout is for {} workers, the communicator has {} ranks",
                                      layout.workers, shape.nranks));
    if (layout.parts.empty()) return NotSupported("ina: the layout has no parts");
    // Worker-to-worker cables (rings, chains) need the pair reachable; aggregation devices are
    // reached through the transport's extra ranks.
    for (const ina::Part& part : layout.parts) {
      if (part.kind == ina::PartKind::kRing) {
        const size_t n = part.ring.size();
        for (size_t i = 0; i < n && n > 1; ++i)
          KZ_RETURN_IF_ERROR(RequireLink(shape, part.ring[i], part.ring[(i + 1) % n], kName, "a ring of the layout"));
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

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    KZ_RETURN_IF_ERROR(Supports(request, shape));
    if (options.deterministic)
      return NotSupported("ina: aggregation devices reduce in tree order, not rank order (KIZUNA_DETERMINISTIC)");
    const ina::Layout& layout = *shape.ina;
    // One channel per part: parts run at once, each on its own tag.
    Builder b(request, options, rank, static_cast<int>(layout.parts.size()));
    const std::vector<ina::PartRange> shares = ina::SplitCount(layout, request.count, 1);
    for (size_t i = 0; i < layout.parts.size(); ++i) {
      const ina::Part& part = layout.parts[i];
      const Range range{shares[i].offset, shares[i].count};
      const int channel = static_cast<int>(i);
      if (request.nranks == 1) {
        if (rank == 0) b.CopyChunked(channel, b.In(range), Builder::Out(range));
      } else if (part.kind == ina::PartKind::kRing) {
        if (rank < request.nranks) RingAllReduce(b, channel, range, part.ring);
      } else {
        TreeAllReduce(b, channel, range, layout, part);
      }
    }
    return std::move(b.plan);
  }

 private:
  // Reduce up the tree and broadcast down it, chunk by chunk (the file comment). A node receives
  // its children's chunks into slots of their own, all at once (so the children's transfers
  // overlap instead of waiting for each other's reduction), then reduces them with its own in
  // one step.
  static void TreeAllReduce(Builder& b, int channel, Range range, const ina::Layout& layout, const ina::Part& part) {
    const bool self_aggregator = b.rank >= b.p;
    int parent = -1;
    std::vector<int> children;
    for (const ina::TreeEdge& e : part.edges) {
      if (RankOf(layout, e.child) == b.rank) parent = RankOf(layout, e.parent);
      if (RankOf(layout, e.parent) == b.rank) children.push_back(RankOf(layout, e.child));
    }
    const bool root = RankOf(layout, part.root) == b.rank;
    if (!root && parent < 0) return;  // an aggregation device this part does not use
    const uint64_t chunks = PieceCount(range.count, b.chunk);
    if (chunks == 0) return;
    const uint64_t slot = std::min(b.chunk, range.count);
    const uint64_t nchildren = children.size();
    // Scratch, kScratchSlots chunks deep: one slot per child, and on a device the sum going up
    // and the result coming down (the root's sum is its result).
    const uint64_t from_children = nchildren > 0 ? b.AllocScratch(kScratchSlots * nchildren * slot) : 0;
    uint64_t up = 0, down = 0;
    if (self_aggregator && nchildren > 1) up = b.AllocScratch(kScratchSlots * slot);
    if (self_aggregator && !root) down = b.AllocScratch(kScratchSlots * slot);
    // Where chunk k's sum and result live.
    auto acc_of = [&](uint64_t k, const Range& pc) {
      const uint64_t depth = k % kScratchSlots;
      if (!self_aggregator) return nchildren > 0 ? Builder::Out(pc) : b.In(pc);
      return nchildren == 1 ? Builder::Scratch(from_children + depth * nchildren * slot, pc.count)
                    : Builder::Scratch(up + depth * slot, pc.count);
    };
    auto result_of = [&](uint64_t k, const Range& pc) {
      if (!self_aggregator) return Builder::Out(pc);
      return root ? acc_of(k, pc) : Builder::Scratch(down + (k % kScratchSlots) * slot, pc.count);
    };
    for (const TreeEvent& ev : TreeSchedule(b.rank, chunks, children, layout, part)) {
      const Range pc = Piece(range, b.chunk, ev.k);
      const uint64_t at = ev.k % kScratchSlots;
      if (ev.what >= 0) {
        b.Recv(channel, children[static_cast<size_t>(ev.what)],
               Builder::Scratch(from_children + (at * nchildren + static_cast<uint64_t>(ev.what)) * slot, pc.count));
      } else if (ev.what == TreeEvent::kReduceStep) {
        std::vector<Slice> received;
        for (uint64_t j = 0; j < nchildren; ++j)
          received.push_back(Builder::Scratch(from_children + (at * nchildren + j) * slot, pc.count));
        const Slice acc = acc_of(ev.k, pc);
        if (self_aggregator) {
          if (nchildren > 1) b.Reduce(channel, received, acc);
        } else if (nchildren > 0) {
          std::vector<Slice> srcs{b.In(pc)};
          srcs.insert(srcs.end(), received.begin(), received.end());
          b.Reduce(channel, std::move(srcs), acc);
        }
        if (root && !(acc == result_of(ev.k, pc))) b.Copy(channel, acc, result_of(ev.k, pc));  // 1 node: a copy
      } else if (ev.what == TreeEvent::kSendUp) {
        b.Send(channel, parent, acc_of(ev.k, pc));
      } else if (ev.what == TreeEvent::kReceiveDown) {
        b.Recv(channel, parent, result_of(ev.k, pc));
      } else {
        for (int child : children) b.Send(channel, child, result_of(ev.k, pc));
      }
    }
  }

  // A ring allreduce of `range` among `order` (every worker once): each sends to the next in order.
  static void RingAllReduce(Builder& b, int channel, Range range, const std::vector<int>& order) {
    const int n = static_cast<int>(order.size());
    int me = 0;
    while (order[static_cast<size_t>(me)] != b.rank) ++me;
    const int next = order[static_cast<size_t>(Mod(me + 1, n))], prev = order[static_cast<size_t>(Mod(me - 1, n))];
    auto part = [&](int j) { return SplitEven(range, static_cast<uint64_t>(n), static_cast<uint64_t>(Mod(j, n))); };
    const uint64_t rounds = PieceCount(part(0).count, b.chunk);
    for (uint64_t k = 0; k < rounds; ++k) {
      for (int s = 0; s + 1 < n; ++s) {  // reduce-scatter: part me-s leaves, part me-s-1 arrives
        const Range sp = Piece(part(me - s), b.chunk, k), rp = Piece(part(me - s - 1), b.chunk, k);
        b.Send(channel, next, s == 0 ? b.In(sp) : Builder::Out(sp));
        b.RecvReduce(channel, prev, b.In(rp), Builder::Out(rp));
      }
      for (int s = 0; s + 1 < n; ++s) {  // allgather: this rank starts with part me+1 finished
        const Range sp = Piece(part(me + 1 - s), b.chunk, k), rp = Piece(part(me - s), b.chunk, k);
        b.Send(channel, next, Builder::Out(sp));
        b.Recv(channel, prev, Builder::Out(rp));
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
