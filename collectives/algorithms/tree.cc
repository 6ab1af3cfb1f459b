// Double binary tree (NCCL's): two binary trees over the ranks, built so that most leaves of one
// are inner nodes of the other, each carrying half of every channel's slice, pipelined in chunks.
//
//   AllReduce  per tree: reduce up (a node adds its children's chunks to its input, in its
//              output, and passes the sum to its parent), then broadcast the root's result down.
//              O(log p) depth; every rank sends and receives about n per tree half.
//   Broadcast  both trees rooted at the requested root (ranks rotated so the root is the trees'
//              root 0), the root feeding half of the data into each.
//   Reduce     both trees rooted at the root, reducing up; inner nodes keep running sums in
//              scratch slots, the root adds into its output.
//
// Heterogeneity: the two trees need not carry half each. When the shape reports every link and
// reduce speed, each tree's share is proportional to its streaming rate (TreeWeights), so a slow
// device or link that is an inner node or edge of one tree moves data to the other. AllReduce also
// places the slower half of the ranks on the first tree's leaves (AllReduceLabels), which makes
// them the second tree's inner nodes: the first tree streams at the fast ranks' pace and carries
// most of the data, where otherwise both trees would have slow inner nodes and split evenly.
//
// Tree shape, placement and shares: collectives/plan/trees.h.
//
// Ordering: every transfer gets a key (phase, direction, tree, child rank) that both of its ends
// compute alike, and each rank issues its transfers sorted by key, so all ranks follow one global
// order: the plans complete even with a window of 1. Chunk k moves up from depth d at phase
// k + D - d and down into depth d at phase k + D + d - 1 (D the tree's depth), so it flows up
// and down the tree while later chunks follow.
//
// Deterministic mode: AllReduce sends every rank's contribution to each half straight to that
// tree's root, which reduces them in rank order (DirectExchange), then the tree broadcasts the
// result down as above; Reduce gathers everything at the root and reduces it there in rank
// order. Cost: each tree's root receives (p-1) x n/2 (every rank's half) where the reduction
// tree has it receive at most 2 x n/2, and a fully connected shape is needed (kNotSupported
// otherwise).
#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/algorithms/impl.h"
#include "collectives/plan/trees.h"

namespace kizuna::collectives::algo {
namespace {

constexpr std::string_view kName = "tree";

// Orders a rank's transfers: (phase, direction 0 up / 1 down, tree, the edge's child rank).
using Key = std::tuple<uint64_t, int, int, int>;

class Keyed {
 public:
  void Add(Key key, Step step) {
    if (step.count() > 0) steps_.emplace_back(key, std::move(step));
  }
  void EmitTo(Builder& b, int c) {
    std::sort(steps_.begin(), steps_.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (auto& [key, step] : steps_) b.steps(c).push_back(std::move(step));
    steps_.clear();
  }

 private:
  std::vector<std::pair<Key, Step>> steps_;
};

class TreeAlgo final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kTree; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    int root = 0;
    switch (request.collective) {
      case Collective::kAllReduce:
        root = -1;
        break;
      case Collective::kBroadcast:
      case Collective::kReduce:
        root = request.root;
        break;
      default:
        return NotImplemented(id(), request);
    }
    for (const Tree& t : MakeTrees(shape.nranks, root))
      for (int r = 0; r < shape.nranks; ++r)
        if (const int up = t.parent[static_cast<size_t>(r)]; up >= 0) {
          KZ_RETURN_IF_ERROR(RequireLink(shape, r, up, kName, "a tree edge, child to parent"));
          KZ_RETURN_IF_ERROR(RequireLink(shape, up, r, kName, "a tree edge, parent to child"));
        }
    return Status::Ok();
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    const bool ordered = options.deterministic && IsReduction(request.collective) && request.nranks > 1;
    if (ordered)
      KZ_RETURN_IF_ERROR(RequireFullyConnected(
          shape, kName, "deterministic mode sends every contribution straight to the rank that reduces it"));
    const bool rooted = request.collective != Collective::kAllReduce;
    const std::vector<Tree> trees = rooted ? MakeTrees(request.nranks, request.root)
                                           : MakeTrees(request.nranks, -1, AllReduceLabels(shape, options.balance));
    const std::vector<double> weights = TreeWeights(trees, shape, options.balance, request.collective);
    Builder b(request, options, rank, ChannelsFor(options, request.count));
    // With two or more channels each tree gets channels of its own (tree t of slice s on channel
    // 2s + t), so the trees stream independently, each at its own pace: that is what lets an
    // uneven split pay off when one tree is slower. With one channel both trees share it, in
    // one global order.
    const bool separate = b.channels() >= 2;
    const int slices = separate ? b.channels() / 2 : b.channels();
    for (int s = 0; s < slices; ++s) {
      const Range R = SplitEven({0, request.count}, static_cast<uint64_t>(slices), static_cast<uint64_t>(s));
      const int c0 = separate ? 2 * s : s;
      const int channel_of[2] = {c0, separate ? c0 + 1 : c0};
      if (b.p == 1) {
        b.CopyChunked(c0, b.In(R), Builder::Out(R));
        continue;
      }
      const Range half[2] = {SplitWeighted(R, weights, 0), SplitWeighted(R, weights, 1)};
      Keyed keyed[2];
      Keyed& k1 = separate ? keyed[1] : keyed[0];
      Keyed* of_tree[2] = {&keyed[0], &k1};
      switch (request.collective) {
        case Collective::kAllReduce:
          if (ordered) {
            if (separate) {
              for (int t = 0; t < 2; ++t) {
                DirectExchange x(b, channel_of[t], {OwnedPart{trees[t].root, half[t], Builder::Out(half[t])}});
                for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
              }
            } else {
              DirectExchange x(b, c0,
                               {OwnedPart{trees[0].root, half[0], Builder::Out(half[0])},
                                OwnedPart{trees[1].root, half[1], Builder::Out(half[1])}});
              for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
            }
            for (int t = 0; t < 2; ++t) Down(b, trees[t], t, half[t], /*root_from_input=*/false, *of_tree[t]);
          } else {
            for (int t = 0; t < 2; ++t) {
              Up(b, trees[t], t, half[t], /*sum_in_output=*/true, *of_tree[t]);
              Down(b, trees[t], t, half[t], /*root_from_input=*/false, *of_tree[t]);
            }
          }
          break;
        case Collective::kBroadcast:
          for (int t = 0; t < 2; ++t) {
            if (rank == request.root) b.CopyChunked(channel_of[t], b.In(half[t]), Builder::Out(half[t]));
            Down(b, trees[t], t, half[t], /*root_from_input=*/true, *of_tree[t]);
          }
          break;
        case Collective::kReduce:
          if (ordered) {
            DirectExchange x(b, c0, {OwnedPart{request.root, R, Builder::Out(R)}});
            for (uint64_t k = 0; k < x.rounds(); ++k) x.Reduce(k);
          } else {
            for (int t = 0; t < 2; ++t) Up(b, trees[t], t, half[t], /*sum_in_output=*/false, *of_tree[t]);
          }
          break;
        default:
          break;  // Supports admitted nothing else
      }
      keyed[0].EmitTo(b, channel_of[0]);
      if (separate) keyed[1].EmitTo(b, channel_of[1]);
    }
    return std::move(b.plan);
  }

 private:
  // Reduce up tree t over `data`: a node adds its children's chunks (in ascending child order)
  // to its input, into its output when sum_in_output (AllReduce) or scratch slots (Reduce; the
  // root always sums into its output), and sends the sum to its parent; a leaf sends its input.
  static void Up(Builder& b, const Tree& t, int tree, Range data, bool sum_in_output, Keyed& keyed) {
    const size_t r = static_cast<size_t>(b.rank);
    const int parent = t.parent[r];
    const std::vector<int>& children = t.children[r];
    const uint64_t D = static_cast<uint64_t>(t.height), d = static_cast<uint64_t>(t.depth[r]);
    const uint64_t pieces = PieceCount(data.count, b.chunk);
    const bool scratch = !sum_in_output && parent >= 0 && !children.empty();
    const uint64_t slots = scratch ? std::min(kScratchSlots, pieces) : 0;
    const uint64_t slot_size = std::min(b.chunk, data.count);
    const uint64_t base = b.AllocScratch(slots * slot_size);
    for (uint64_t k = 0; k < pieces; ++k) {
      const Range pc = Piece(data, b.chunk, k);
      const Slice sum = scratch ? Builder::Scratch(base + (k % slots) * slot_size, pc.count) : Builder::Out(pc);
      bool first = true;
      for (int child : children) {
        keyed.Add({k + D - d - 1, 0, tree, child}, Step::RecvReduce(child, first ? b.In(pc) : sum, sum));
        first = false;
      }
      if (parent >= 0)
        keyed.Add({k + D - d, 0, tree, b.rank}, Step::Send(parent, children.empty() ? b.In(pc) : sum));
    }
  }

  // Broadcast down tree t over `data`: the root sends its input (Broadcast) or its output (the
  // AllReduce sum), every other node receives into its output and passes the chunk on.
  static void Down(Builder& b, const Tree& t, int tree, Range data, bool root_from_input, Keyed& keyed) {
    const size_t r = static_cast<size_t>(b.rank);
    const int parent = t.parent[r];
    // Phases start after the reduction's (AllReduce); a Broadcast has none before, and an offset
    // shared by all ranks changes no order.
    const uint64_t D = static_cast<uint64_t>(t.height), d = static_cast<uint64_t>(t.depth[r]);
    for (uint64_t k = 0; k < PieceCount(data.count, b.chunk); ++k) {
      const Range pc = Piece(data, b.chunk, k);
      if (parent >= 0) keyed.Add({k + D + d - 1, 1, tree, b.rank}, Step::Recv(parent, Builder::Out(pc)));
      const Slice src = parent < 0 && root_from_input ? b.In(pc) : Builder::Out(pc);
      for (int child : t.children[r]) keyed.Add({k + D + d, 1, tree, child}, Step::Send(child, src));
    }
  }
};

}  // namespace

const AlgorithmImpl& TreeAlgorithm() {
  static const TreeAlgo impl;
  return impl;
}

}  // namespace kizuna::collectives::algo
