// The cost model's stages of the hierarchical plans (collectives/algorithms/hierarchical.cc): the
// rail form's host level (direct rounds between the ranks of each host), its network level (a ring
// or recursive doubling over the hosts per part, a direct exchange for ReduceScatter and AllGather,
// a chain of hosts for Broadcast and Reduce), and the host level again. Each hop is costed on its
// own link (model.h), so the host level's stages pay the links inside hosts and the network
// level's the links between them. With uneven hosts the host level's messages are sized for the
// host with the fewest ranks (the largest share per rank): an upper bound. hier:fused's host level
// is two passes over mapped memory on the CPU (each owner sums its parts over the host's inputs,
// then every rank copies the other parts from their owners), with three rendezvous.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/cost/model_internal.h"
#include "collectives/plan/shares.h"

namespace kizuna::collectives::cost_internal {

void Model::Hierarchical(Algorithm a) {
  const std::vector<std::vector<int>> hosts = shape_.hosts();
  const int H = static_cast<int>(hosts.size());
  if (H < 2) return Fail(fmt::format("{} needs ranks on two hosts or more", AlgorithmName(a)));
  size_t widest = 0, narrowest = hosts[0].size();
  for (const auto& h : hosts) {
    widest = std::max(widest, h.size());
    narrowest = std::min(narrowest, h.size());
  }
  const bool fused = IsHostFused(a);
  // hierarchical.cc's part count: the widest host's ranks, or fewer for hier:fused's small parts.
  const auto M = fused ? static_cast<int>(HostFusedParts(req_, static_cast<int>(widest))) : static_cast<int>(widest);
  const uint64_t count = req_.count, P = narrowest, p = static_cast<uint64_t>(p_);
  auto size = [&](int h) { return static_cast<int>(hosts[static_cast<size_t>(h)].size()); };
  auto rank = [&](int h, int l) { return hosts[static_cast<size_t>(h)][static_cast<size_t>(l)]; };
  auto owner = [&](int h, int j) { return rank(h, j % size(h)); };
  auto wrap = [&](int h) { return ((h % H) + H) % H; };

  // Split by speed (HierarchicalWeights, AllReduce): the parts' shares, and per part its ring's.
  const HierarchicalShares weights = req_.collective == Collective::kAllReduce
                                         ? HierarchicalWeights(shape_, hosts, M, opt_.balance, fused)
                                         : HierarchicalShares{};
  std::vector<double> part_share(static_cast<size_t>(M), 1.0 / M);
  if (!weights.parts.empty()) part_share = Shares(weights.parts);
  // A host rank's parts' share of the data, over the even share the host level's messages assume
  // (1 / P of it): the factor on its messages where the parts are sized by speed.
  auto owned_scale = [&](int h, int l) {
    if (weights.parts.empty()) return 1.0;
    double share = 0;
    for (int j = l; j < M; j += size(h)) share += part_share[static_cast<size_t>(j)];
    return share * static_cast<double>(P);
  };
  // Rounds d = 1..M-1: every rank of a host sends `elems` elements to local rank + d. hier:fused
  // instead: the CPU's pass over mapped memory (`reduce`: an owner reads its parts of P inputs).
  auto host_rounds = [&](std::string_view label, uint64_t elems, bool reduce) {
    if (fused) {
      const double part = static_cast<double>(CeilDiv(count, static_cast<uint64_t>(M))) * elem_;
      const double widest_host = static_cast<double>(widest);
      // Copied bytes (a byte read or written is half a copied byte) on the busiest rank: its parts
      // read from every local input and written, or every other part read and written.
      double owned = static_cast<double>(CeilDiv(static_cast<uint64_t>(M), P)) * part;
      if (!weights.parts.empty()) {  // parts sized by speed: the rank whose parts hold the most
        owned = 0;
        for (int h = 0; h < H; ++h)
          for (int l = 0; l < size(h); ++l)
            owned = std::max(owned, owned_scale(h, l) / static_cast<double>(P) * static_cast<double>(count) * elem_);
      }
      double copied = reduce ? owned * (widest_host + 1) / 2 : static_cast<double>(count) * elem_;
      // Rendezvous: AllReduce three in all, half counted on each side of the network level;
      // ReduceScatter two (its blocks' sums, then the network level done); AllGather three.
      double rendezvous = 1.5;
      const double block = static_cast<double>(count) * elem_;
      if (req_.collective == Collective::kReduceScatter) {
        // The rank's own block and those it owns of the other hosts' ranks, each read from every
        // local input.
        copied = static_cast<double>(CeilDiv(p, P)) * block * (widest_host + 1) / 2;
        rendezvous = 2;
      } else if (req_.collective == Collective::kAllGather) {
        copied = static_cast<double>(p - CeilDiv(p, P)) * block;  // the blocks other ranks hold
        rendezvous = 3;
      }
      StageCost c;
      // The executor's pass runs on the CPU, whatever the device's own pace (cpu_copy_).
      double copy = 0;
      for (int r = 0; r < p_; ++r) copy = std::max(copy, cpu_copy_[static_cast<size_t>(r)]);
      c.alpha = rendezvous * k_.oneshot_us * 1e-6;
      c.gamma = copied * copy;
      return Add(reduce ? "host sum over mapped memory" : "host copy over mapped memory", c, 1);
    }
    const Split s = SplitElems(elems);
    for (int d = 1; d < M && !failed_; ++d) {
      std::vector<Hop> hops;
      for (int h = 0; h < H; ++h)
        if (d < size(h))
          for (int l = 0; l < size(h); ++l) {
            // The reduce-scatter sends the receiver's parts, the allgather the sender's.
            const int to = (l + d) % size(h);
            hops.push_back({rank(h, l), rank(h, to), reduce, owned_scale(h, reduce ? to : l)});
          }
      if (!hops.empty()) Stage(label, hops, s.bytes, s.chunks, s.channels);
    }
  };
  // Every part's owner to its owner on the host `step` further on. `skip` > 0: the ring over the
  // hosts split by speed, where the hop from host h carries every sub-part but host h+skip's
  // (reduce-scatter: 1, allgather: 2), over the even split's (H-1) of H.
  auto part_hops = [&](int step, bool reduce, int skip = 0) {
    std::vector<Hop> hops;
    for (int j = 0; j < M; ++j)
      for (int h = 0; h < H; ++h) {
        double scale = part_share[static_cast<size_t>(j)] * M;
        if (skip > 0 && !weights.network.empty()) {
          const std::vector<double> sub = Shares(weights.network[static_cast<size_t>(j)]);
          scale *= (1 - sub[static_cast<size_t>(wrap(h + skip))]) * H / (H - 1);
        }
        hops.push_back({owner(h, j), owner(wrap(h + step), j), reduce, scale});
      }
    return hops;
  };
  // Every rank to the ranks of the host `e` further on whose blocks it owns (and back: `gather`).
  auto block_hops = [&](int e, bool reduce) {
    std::vector<Hop> hops;
    for (int g = 0; g < H; ++g)
      for (int l = 0; l < size(g); ++l)
        for (int i = l; i < size(wrap(g + e)); i += size(g))
          hops.push_back(reduce ? Hop{rank(g, l), rank(wrap(g + e), i), true}
                                : Hop{rank(wrap(g + e), i), rank(g, l), false});
    return hops;
  };

  const uint64_t part = CeilDiv(count, static_cast<uint64_t>(M));
  switch (req_.collective) {
    case Collective::kAllReduce: {
      host_rounds("host reduce-scatter", CeilDiv(count, P), true);
      const Split s = SplitElems(part);
      if (a == Algorithm::kHierRing || a == Algorithm::kHierFusedRing) {
        if (weights.network.empty()) {
          Stage("network reduce-scatter", part_hops(1, true, 1), s.bytes / H, s.chunks * (H - 1), s.channels);
          Stage("network allgather", part_hops(1, false, 2), s.bytes / H, s.chunks * (H - 1), s.channels);
        } else {
          // Uneven sub-parts load a host in one phase and its neighbour in the other, while the
          // pieces' rings overlap both phases: one stage per step carrying both, each host at its
          // busiest over the two.
          std::vector<Hop> both = part_hops(1, true, 1);
          for (const Hop& h : part_hops(1, false, 2)) both.push_back(h);
          Stage("network ring", both, s.bytes / H, s.chunks * (H - 1), s.channels);
        }
      } else {
        const int pp = 1 << FloorLog2(static_cast<uint64_t>(H)), rem = H - pp;
        auto real = [&](int nr) { return nr < rem ? 2 * nr + 1 : nr + rem; };
        std::vector<Hop> fold;
        for (int i = 0; i < rem; ++i)
          for (int j = 0; j < M; ++j) fold.push_back({owner(2 * i, j), owner(2 * i + 1, j), true});
        if (!fold.empty()) Stage("network fold", fold, s.bytes, s.chunks, s.channels);
        for (int m = 1; m < pp && !failed_; m *= 2) {
          std::vector<Hop> hops;
          for (int nr = 0; nr < pp; ++nr)
            for (int j = 0; j < M; ++j) hops.push_back({owner(real(nr), j), owner(real(nr ^ m), j), true});
          Stage("network doubling", hops, s.bytes, s.chunks, s.channels);
        }
        for (Hop& h : fold) h = {h.to, h.from, false};
        if (!fold.empty()) Stage("network unfold", fold, s.bytes, s.chunks, s.channels);
      }
      return host_rounds("host allgather", CeilDiv(count, P), false);
    }
    case Collective::kReduceScatter: {
      host_rounds("host reduce-scatter", CeilDiv(p, P) * count, true);
      const Split s = SplitElems(count);
      for (int e = 1; e < H && !failed_; ++e)
        Stage("network reduce-scatter", block_hops(e, true), s.bytes, s.chunks, s.channels);
      return;
    }
    case Collective::kAllGather: {
      const Split s = SplitElems(count);
      for (int e = 1; e < H && !failed_; ++e)
        Stage("network allgather", block_hops(e, false), s.bytes, s.chunks, s.channels);
      return host_rounds("host allgather", CeilDiv(p, P) * count, false);
    }
    case Collective::kBarrier: {
      // hier:fused: the host meets, the hosts' first ranks disseminate tokens, the host meets again.
      host_rounds("host meeting", 0, true);
      for (int m = 1; m < H && !failed_; m *= 2) {
        std::vector<Hop> hops;
        for (int h = 0; h < H; ++h) hops.push_back({rank(h, 0), rank(wrap(h + m), 0), false});
        Stage("network dissemination", hops, 0, 1, 1);
      }
      return;
    }
    case Collective::kAllToAll: {
      // Inside the host each rank sends a peer its own block and the blocks the peer forwards
      // ((p - P) / P of them); between hosts one message per destination with P blocks.
      host_rounds("host exchange", (CeilDiv(p - P, P) + 1) * count, false);
      const Split s = SplitElems(count * P);
      for (int e = 1; e < H && !failed_; ++e)
        Stage("network exchange", block_hops(e, false), s.bytes, s.chunks, s.channels);
      return;
    }
    case Collective::kBroadcast:
    case Collective::kReduce: {
      const bool reduce = req_.collective == Collective::kReduce;
      const int root = req_.root;
      int root_host = 0;
      for (int h = 0; h < H; ++h)
        if (std::find(hosts[static_cast<size_t>(h)].begin(), hosts[static_cast<size_t>(h)].end(), root) !=
            hosts[static_cast<size_t>(h)].end())
          root_host = h;
      const Split s = SplitElems(part);
      std::vector<Hop> scatter, chain;
      for (int j = 0; j < M; ++j) {
        if (owner(root_host, j) != root)
          scatter.push_back(reduce ? Hop{owner(root_host, j), root, false} : Hop{root, owner(root_host, j), false});
        for (int e = 1; e < H; ++e) {
          const int from = reduce ? wrap(root_host + e) : wrap(root_host + e - 1);
          chain.push_back({owner(from, j), owner(wrap(from + 1), j), reduce});
        }
      }
      if (reduce) host_rounds("host reduce-scatter", CeilDiv(count, P), true);
      if (!reduce && !scatter.empty()) Stage("host scatter", scatter, s.bytes, s.chunks, s.channels);
      Pipeline(reduce ? "network chain reduce" : "network chain", chain, s, H - 1);
      if (reduce && !scatter.empty()) Stage("host gather", scatter, s.bytes, s.chunks, s.channels);
      if (!reduce) host_rounds("host allgather", CeilDiv(count, P), false);
      return;
    }
    default: return;
  }
}

}  // namespace kizuna::collectives::cost_internal
