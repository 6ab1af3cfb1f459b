// The cost model's stages per algorithm (cost_model.h): each algorithm's structure as the
// stages its plan takes (algorithms/), costed by Model::Cost (cost_model.cc).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/cost/model_ina.h"
#include "collectives/cost/model_internal.h"
#include "collectives/plan/shares.h"
#include "collectives/plan/trees.h"

namespace kizuna::collectives::cost_internal {

// p-1 rounds: in round j every rank sends `elems` elements to rank + j (pairwise exchange), or
// only to the ranks marked in `owners` (the direct exchange of deterministic mode, which brings
// every contribution to a part's owner). A round's chunks are independent, so a round costs one
// stage per chunk.
void Model::DirectRounds(std::string_view label, uint64_t elems, const std::vector<char>* owners,
                         const std::vector<double>* part_scale, bool by_sender) {
  const Split s = SplitElems(elems);
  if (s.chunks == 0) return;
  std::vector<Hop> hops;
  // Parts sized by speed: a round's busiest hop is not the next round's (the fast rank's large
  // part goes to one slow rank, then to the next), and the rounds overlap (every step of a round
  // has its own peer), so each rank takes the sum over the rounds: one stage of all of them.
  const bool uneven = part_scale != nullptr && std::any_of(part_scale->begin(), part_scale->end(),
                                                           [&](double x) { return x != (*part_scale)[0]; });
  if (uneven) {
    for (int j = 1; j < p_; ++j)
      for (int r = 0; r < p_; ++r) {
        const int to = (r + j) % p_;
        if (owners != nullptr && !(*owners)[static_cast<size_t>(to)]) continue;
        hops.push_back({r, to, false, (*part_scale)[static_cast<size_t>(by_sender ? r : to)]});
      }
    return Stage(label, hops, s.bytes, s.chunks, s.channels);
  }
  for (int j = 1; j < p_ && !failed_; ++j) {
    hops.clear();
    for (int r = 0; r < p_; ++r) {
      const int to = (r + j) % p_;
      if (owners != nullptr && !(*owners)[static_cast<size_t>(to)]) continue;
      const double scale = part_scale != nullptr ? (*part_scale)[static_cast<size_t>(by_sender ? r : to)] : 1.0;
      hops.push_back({r, to, false, scale});
    }
    Stage(label, hops, s.bytes, s.chunks, s.channels);
  }
}

void Model::RingReduceScatter(uint64_t part_elems, const std::vector<double>* scale) {
  const Split s = SplitElems(part_elems);
  Stage("reduce-scatter", RingHops(true, scale), s.bytes, s.chunks * (p_ - 1), s.channels);
}

void Model::RingAllGather(uint64_t part_elems, const std::vector<double>* scale) {
  const Split s = SplitElems(part_elems);
  Stage("allgather", RingHops(false, scale), s.bytes, s.chunks * (p_ - 1), s.channels);
}

// AllReduce around the ring. Parts sized by speed (RingWeights): over the reduce-scatter the hop
// r -> r+1 carries every part but part r+1 (rank r sends all but the one it ends with, rank r+1
// reduces all but its own), over the allgather every part but part r+2; as factors on the even
// parts' (p-1) of p, each phase's stages carry every hop's share of them. The reduce-scatter then
// runs to its end before the allgather (ring.cc), as the two stages here.
void Model::RingAllReduce() {
  const uint64_t part = CeilDiv(req_.count, static_cast<uint64_t>(p_));
  // A ring out of rank order has even parts (ring.cc).
  const std::vector<double> shares =
      Shares(IsRankOrder(Ring()) ? RingWeights(shape_, opt_.balance) : std::vector<double>(p_, 1.0));
  if (std::all_of(shares.begin(), shares.end(), [&](double x) { return x == shares[0]; })) {
    RingReduceScatter(part);
    return RingAllGather(part);
  }
  const double even = static_cast<double>(p_ - 1) / static_cast<double>(p_);
  std::vector<double> rs, ag;
  for (int r = 0; r < p_; ++r) {
    rs.push_back((1 - shares[static_cast<size_t>((r + 1) % p_)]) / even);
    ag.push_back((1 - shares[static_cast<size_t>((r + 2) % p_)]) / even);
  }
  RingReduceScatter(part, &rs);
  RingAllGather(part, &ag);
}

std::optional<Torus> Model::CabledTorus() {
  if (p_ > 1 && shape_.FullyConnected()) {
    Fail("every rank reaches every other: the links may be one NIC's, not cables of their own");
    return std::nullopt;
  }
  Torus t = FindTorus(shape_);
  if (t.dims.empty()) {
    Fail("the links contain no torus and no cycle through every rank");
    return std::nullopt;
  }
  return t;
}

// torus.cc: per channel, reduce-scatters along the dimensions in the channel's order, then
// allgathers back. Stage i of every channel at once: channel c's line along its i-th dimension, in
// its direction, each hop a cable of its own (per_link_). Channels whose lines differ in length
// take different step counts: the stage takes the most, each hop carrying its channel's bytes
// spread over them.
// Only where some pair has no link: a shape in which every rank reaches every other may be a
// switched network, whose links share each rank's NIC, and nothing in it tells cables from a switch
// (the torus would be costed as if each link had a wire of its own). KIZUNA_ALGO=torus still runs it.
void Model::TorusAllReduce() {
  const std::optional<Torus> cabled = CabledTorus();
  if (!cabled) return;
  const Torus& t = *cabled;
  const int k = static_cast<int>(t.dims.size());
  const uint64_t channels =
      std::min<uint64_t>(opt_.channels >= 2 ? 2 * static_cast<uint64_t>(k) : 1, std::max<uint64_t>(req_.count, 1));
  const uint64_t per_channel = CeilDiv(req_.count, channels);
  per_link_ = true;
  for (int phase = 0; phase < 2 && !failed_; ++phase) {
    const bool reduce = phase == 0;
    for (int s = 0; s < k && !failed_; ++s) {
      const int i = reduce ? s : k - 1 - s;  // the allgathers retrace the dimensions
      std::vector<double> steps(channels), bytes(channels);
      std::vector<int> dim(channels);
      double most = 0, largest = 0;
      for (uint64_t c = 0; c < channels; ++c) {
        uint64_t held = per_channel;
        for (int j = 0; j < i; ++j) held = CeilDiv(held, static_cast<uint64_t>(t.dims[(c / 2 + j) % k]));
        dim[c] = static_cast<int>((c / 2 + static_cast<uint64_t>(i)) % static_cast<uint64_t>(k));
        const uint64_t d = static_cast<uint64_t>(t.dims[static_cast<size_t>(dim[c])]);
        const uint64_t part = CeilDiv(held, d);
        const double chunks = static_cast<double>(CeilDiv(part, opt_.chunk_count));
        steps[c] = chunks * static_cast<double>(d - 1);
        bytes[c] = static_cast<double>(part) * elem_ / std::max(chunks, 1.0);
        most = std::max(most, steps[c]);
        largest = std::max(largest, bytes[c]);
      }
      if (most == 0) continue;
      std::vector<Hop> hops;
      for (uint64_t c = 0; c < channels; ++c)
        for (int place = 0; place < p_; ++place)
          hops.push_back({t.rank(place), t.rank(t.Move(place, dim[c], c % 2 == 0 ? 1 : -1)), reduce,
                          steps[c] * bytes[c] / (most * largest)});
      Stage(reduce ? "line reduce-scatter" : "line allgather", hops, largest, most, 1);
    }
  }
  per_link_ = false;
}

// cycles.cc: every channel a ring round its cycle, its way, all at once; each hop a cable of its own
// (per_link_), two cycles sharing a bundle's link adding up on it. As the torus, only where some
// pair has no link.
void Model::CyclesAllReduce() {
  if (p_ > 1 && shape_.FullyConnected())
    return Fail("every rank reaches every other: the links may be one NIC's, not cables of their own");
  const std::vector<std::vector<int>> cycles = DisjointCycles(shape_);
  if (cycles.size() != 2) return Fail("the links hold no two cycles through every rank that share no cable");
  const uint64_t channels = std::min<uint64_t>(opt_.channels >= 2 ? 4 : 1, std::max<uint64_t>(req_.count, 1));
  // Each channel's ring: parts of its slice, a chunk of a part a step.
  const uint64_t part = CeilDiv(CeilDiv(req_.count, channels), static_cast<uint64_t>(p_));
  const double chunks = static_cast<double>(std::max<uint64_t>(CeilDiv(part, opt_.chunk_count), 1));
  const double bytes = static_cast<double>(part) * elem_ / chunks;
  std::vector<Hop> hops;
  for (uint64_t c = 0; c < channels; ++c) {
    const std::vector<int>& cycle = cycles[c / 2];
    for (int i = 0; i < p_; ++i) {
      const int next = ((i + (c % 2 == 0 ? 1 : -1)) % p_ + p_) % p_;
      hops.push_back({cycle[static_cast<size_t>(i)], cycle[static_cast<size_t>(next)], true, 1.0});
    }
  }
  per_link_ = true;
  Stage("cycle reduce-scatter", hops, bytes, chunks * (p_ - 1), 1);
  for (Hop& h : hops) h.reduce = false;
  Stage("cycle allgather", hops, bytes, chunks * (p_ - 1), 1);
  per_link_ = false;
}

// torus.cc's AllToAll: phase i moves every block along dimension i, one cable a substep. At the
// start of phase i a place holds A = d_0 ... d_{i-1} sources' blocks for each of the d_i
// coordinates of dimension i times B = d_{i+1} ... destinations; in substep s those going s or
// more hops one way cross a cable that way, every place at once, one transfer per chunk of a
// block (one channel).
void Model::TorusAllToAll() {
  const std::optional<Torus> cabled = CabledTorus();
  if (!cabled) return;
  const Torus& t = *cabled;
  const int k = static_cast<int>(t.dims.size());
  const uint64_t pieces = CeilDiv(req_.count, opt_.chunk_count);
  const double piece = static_cast<double>(std::min(req_.count, opt_.chunk_count)) * elem_;
  per_link_ = true;
  double before = 1;
  for (int i = 0; i < k && !failed_; ++i) {
    const int d = t.dims[static_cast<size_t>(i)];
    double after = 1;
    for (int j = i + 1; j < k; ++j) after *= t.dims[static_cast<size_t>(j)];
    for (int s = 1; s <= d / 2 && !failed_; ++s)
      for (int direction : {1, -1}) {
        const int ways = direction > 0 ? d / 2 - s + 1 : std::max(0, d - s - d / 2);  // coordinates that far
        const double blocks = before * after * ways;
        if (blocks == 0) continue;
        std::vector<Hop> hops;
        for (int place = 0; place < p_; ++place)
          hops.push_back({t.rank(place), t.rank(t.Move(place, i, direction)), false});
        Stage("forward along a line", hops, piece, blocks * static_cast<double>(pieces), 1);
      }
    before *= d;
  }
  per_link_ = false;
}

// Both trees (collectives/plan/trees.h: placed and shared as the plan does; half the data each
// when the speeds are equal or unknown), reduce up and broadcast down pipelined. Filling the
// pipeline takes d stages going up (every upward edge of both trees busy) and d - 1 coming down;
// in the steady state a stage carries one chunk over every edge of both trees in both directions.
void Model::TreeAllReduce() {
  const Split s = SplitElems(CeilDiv(req_.count, 2));
  if (s.chunks == 0) return;
  const std::vector<Tree> trees = MakeTrees(p_, -1, AllReduceLabels(shape_, opt_.balance));
  const std::vector<double> share = Shares(TreeWeights(trees, shape_, opt_.balance, Collective::kAllReduce));
  std::vector<Hop> hops, up_hops, down_hops;
  int depth = 0;
  for (size_t t = 0; t < trees.size(); ++t) {
    depth = std::max(depth, trees[t].height);
    const double scale = 2 * share[t];  // the stage's bytes are half the data's chunk
    for (int r = 0; r < p_; ++r) {
      const int up = trees[t].parent[static_cast<size_t>(r)];
      if (up < 0) continue;
      up_hops.push_back({r, up, true, scale});
      down_hops.push_back({up, r, false, scale});
    }
  }
  hops = up_hops;
  hops.insert(hops.end(), down_hops.begin(), down_hops.end());
  Add("tree reduce+broadcast", Cost(up_hops, s.max_bytes, s.channels), depth);
  Add("tree reduce+broadcast", Cost(down_hops, s.max_bytes, s.channels), depth - 1);
  Add("tree reduce+broadcast", Cost(hops, s.bytes, s.channels), s.chunks);
}

// Broadcast (down) or Reduce (up) over two trees both rooted at the root (trees.h), each carrying
// its share of the data.
void Model::TreeRooted(bool reduce) {
  const Split s = SplitElems(CeilDiv(req_.count, 2));
  if (s.chunks == 0) return;
  const std::vector<Tree> trees = MakeTrees(p_, req_.root);
  const std::vector<double> share = Shares(TreeWeights(trees, shape_, opt_.balance, req_.collective));
  std::vector<Hop> hops;
  int depth = 0;
  for (size_t t = 0; t < trees.size(); ++t) {
    depth = std::max(depth, trees[t].height);
    for (int r = 0; r < p_; ++r) {
      const int up = trees[t].parent[static_cast<size_t>(r)];
      if (up >= 0) hops.push_back(reduce ? Hop{r, up, true, 2 * share[t]} : Hop{up, r, false, 2 * share[t]});
    }
  }
  Pipeline(reduce ? "tree reduce" : "tree broadcast", hops, s, depth);
}

// Non-powers of two: the first 2·rem ranks pair up; the even one of each pair hands its data to
// the odd one (which takes part in the power-of-two rounds) and gets the result back.
// `parts` parts of `elems` elements each, every part chunked on its own (as rhd and rd send them).
void Model::Fold(std::string_view label, uint64_t parts, uint64_t elems, bool reduce) {
  if (rem_ == 0) return;
  const Split s = SplitElems(elems);
  std::vector<Hop> hops;
  for (int i = 0; i < rem_; ++i) hops.push_back({2 * i, 2 * i + 1, reduce});
  Stage(label, hops, s.bytes, static_cast<double>(parts) * s.chunks, s.channels);
}

void Model::Unfold(std::string_view label, uint64_t parts, uint64_t elems) {
  if (rem_ == 0) return;
  const Split s = SplitElems(elems);
  std::vector<Hop> hops;
  for (int i = 0; i < rem_; ++i) hops.push_back({2 * i + 1, 2 * i, false});
  Stage(label, hops, s.bytes, static_cast<double>(parts) * s.chunks, s.channels);
}

// Recursive halving (partners at distance p2/2, ..., 1, reducing what they receive) or doubling
// (distances 1, ..., p2/2) over the p2 active ranks. rhd sends the blocks of a round one by one,
// each chunked on its own: the round at distance m moves m blocks (halving: the half it gives
// away; doubling: what it has gathered). AllReduce's blocks are the vector's p2 blocks;
// ReduceScatter's and AllGather's are the parts of the ranks an active rank stands for (p/p2 on
// average, `count` elements each).
void Model::HypercubeRounds(std::string_view label, bool halving, uint64_t count,
                            const std::vector<double>* block_shares) {
  const bool blocks_are_parts = req_.collective != Collective::kAllReduce;
  const uint64_t block = blocks_are_parts ? count : CeilDiv(count, static_cast<uint64_t>(p2_));
  const Split s = SplitElems(block);
  if (s.chunks == 0) return;
  const bool weighted = !blocks_are_parts && block_shares != nullptr && !block_shares->empty();
  // The blocks active rank nr sends in a round at distance `mask`: halving, the half of its
  // group that its partner keeps; doubling, the blocks it holds. As a factor on even blocks.
  auto sent = [&](int nr, int mask) {
    if (!weighted) return 1.0;
    const int first = halving ? ((nr ^ mask) & ~(mask - 1)) : (nr & ~(mask - 1));
    double share = 0;
    for (int b = first; b < first + mask; ++b) share += (*block_shares)[static_cast<size_t>(b)];
    return share * static_cast<double>(p2_) / static_cast<double>(mask);
  };
  std::vector<Hop> hops(static_cast<size_t>(p2_));
  for (int i = 0; i < FloorLog2(static_cast<uint64_t>(p2_)) && !failed_; ++i) {
    const int mask = halving ? p2_ >> (i + 1) : 1 << i;
    for (int nr = 0; nr < p2_; ++nr)
      hops[static_cast<size_t>(nr)] = {Real(nr), Real(nr ^ mask), halving, sent(nr, mask)};
    // Messages per round: a part per block, p/p2 on average when blocks stand for folded pairs;
    // AllReduce's blocks are empty (and not sent) past the channel's element count.
    const uint64_t parts =
        blocks_are_parts ? CeilDiv(static_cast<uint64_t>(mask) * static_cast<uint64_t>(p_), static_cast<uint64_t>(p2_))
                         : std::min(static_cast<uint64_t>(mask), CeilDiv(count, static_cast<uint64_t>(s.channels)));
    Stage(label, hops, s.bytes, static_cast<double>(parts) * s.chunks, s.channels);
  }
}

// Send / Recv: the request does not say which rank calls, so the slowest reachable peer of
// `root` counts (every rank predicts the same).
void Model::PointToPoint(bool send) {
  const Split s = SplitElems(req_.count);
  StageCost worst;
  bool any = false;
  for (int r = 0; r < p_; ++r) {
    if (r == req_.root) continue;
    const Hop h = send ? Hop{r, req_.root, false} : Hop{req_.root, r, false};
    if (!shape_.Reachable(h.from, h.to)) continue;
    const StageCost c = Cost({h}, s.bytes, s.channels);
    if (!any || c.total() > worst.total()) worst = c;
    any = true;
  }
  if (!any)
    return Fail(fmt::format("no rank can reach {} rank {}", send ? "the destination" : "from the source", req_.root));
  Add(send ? "send" : "recv", worst, s.chunks == 0 ? 1 : s.chunks);
}

// One short case per algorithm, kept in one switch so that their stage structures read side by side.
void Model::Body(Algorithm a) {
  const uint64_t count = req_.count;
  const auto p = static_cast<uint64_t>(p_);
  switch (a) {
    case Algorithm::kRing:
      switch (req_.collective) {
        case Collective::kAllReduce: return RingAllReduce();
        case Collective::kReduceScatter:
          return RingReduceScatter(count);
        case Collective::kAllGather:
          return RingAllGather(count);
        case Collective::kBroadcast: {
          const Split s = SplitElems(count);
          return Pipeline("chain broadcast", ChainHops(req_.root, false), s, p_ - 1);
        }
        case Collective::kReduce: {
          const Split s = SplitElems(count);
          return Pipeline("chain reduce", ChainHops(req_.root, true), s, p_ - 1);
        }
        case Collective::kBarrier: {  // p - 1 rounds of a token to the next rank
          std::vector<Hop> hops;
          for (int r = 0; r < p_; ++r) hops.push_back({r, (r + 1) % p_, false});
          for (int k = 1; k < p_ && !failed_; ++k) Stage("token round", hops, 0, 1, 1);
          return;
        }
        default:
          return;
      }
    case Algorithm::kTree:
      if (req_.collective == Collective::kAllReduce) return TreeAllReduce();
      return TreeRooted(req_.collective == Collective::kReduce);
    case Algorithm::kRhd:
      switch (req_.collective) {
        case Collective::kAllReduce: {
          // Blocks sized by the speed of the active rank that ends with each (halving_doubling.cc).
          const std::vector<double> weights = ReduceWeights(shape_, opt_.balance);
          std::vector<double> active;
          for (int nr = 0; nr < p2_; ++nr) active.push_back(weights[static_cast<size_t>(Real(nr))]);
          const std::vector<double> shares = Shares(active);
          Fold("fold", 1, count, true);
          HypercubeRounds("halving", true, count, &shares);
          HypercubeRounds("doubling", false, count, &shares);
          return Unfold("unfold", 1, count);
        }
        case Collective::kReduceScatter:  // the fold hands over every part, the unfold one
          Fold("fold", p, count, true);
          HypercubeRounds("halving", true, count);
          return Unfold("unfold", 1, count);
        case Collective::kAllGather:  // the fold hands over one part, the unfold all others
          Fold("fold", 1, count, false);
          HypercubeRounds("doubling", false, count);
          return Unfold("unfold", p - 1, count);
        default:
          return;
      }
    case Algorithm::kRd:
      if (req_.collective == Collective::kBarrier) {
        for (int dist = 1; dist < p_ && !failed_; dist *= 2) {
          std::vector<Hop> hops;
          for (int r = 0; r < p_; ++r) hops.push_back({r, (r + dist) % p_, false});
          Stage("dissemination", hops, 0, 1, 1);
        }
        return;
      } else {
        // Every round exchanges and adds the whole vector.
        const Split s = SplitElems(count);
        Fold("fold", 1, count, true);
        std::vector<Hop> hops(static_cast<size_t>(p2_));
        for (int mask = 1; mask < p2_ && !failed_; mask *= 2) {
          for (int nr = 0; nr < p2_; ++nr) hops[static_cast<size_t>(nr)] = {Real(nr), Real(nr ^ mask), true};
          Stage("doubling", hops, s.bytes, s.chunks, s.channels);
        }
        return Unfold("unfold", 1, count);
      }
    case Algorithm::kPairwise:
      switch (req_.collective) {
        case Collective::kAllToAll:
        case Collective::kAllGather:
          return DirectRounds(req_.collective == Collective::kAllToAll ? "exchange" : "direct allgather", count);
        case Collective::kReduceScatter:
          DirectRounds("exchange", count);
          return Local("ordered reduce", LocalKind::kReduce, p_, count, -1);
        case Collective::kAllReduce: {
          // Part j sized by PairwiseWeights (pairwise.cc): p x its share of the even part.
          std::vector<double> scale = Shares(PairwiseWeights(shape_, opt_.balance));
          for (double& x : scale) x *= p;
          std::vector<int> all(static_cast<size_t>(p_));
          for (int r = 0; r < p_; ++r) all[static_cast<size_t>(r)] = r;
          DirectRounds("exchange", CeilDiv(count, p), nullptr, &scale, /*by_sender=*/false);
          Local("ordered reduce", LocalKind::kReduce, p_, CeilDiv(count, p), all, &scale);
          return DirectRounds("direct allgather", CeilDiv(count, p), nullptr, &scale, /*by_sender=*/true);
        }
        case Collective::kBarrier: {
          std::vector<Hop> hops;
          for (int a2 = 0; a2 < p_; ++a2)
            for (int b = 0; b < p_; ++b)
              if (a2 != b) hops.push_back({a2, b, false});
          return Stage("all pairs", hops, 0, 1, 1);
        }
        default:
          return;
      }
    case Algorithm::kP2p:
      return PointToPoint(req_.collective == Collective::kSend);
    case Algorithm::kFused:
      return Fused();
    case Algorithm::kIna:
      return InaAllReduce();
    case Algorithm::kHierRing:
    case Algorithm::kHierRd:
    case Algorithm::kHierFusedRing:
    case Algorithm::kHierFusedRd:
      return Hierarchical(a);
    case Algorithm::kFile: return FilePlan();
    case Algorithm::kTorus: return req_.collective == Collective::kAllToAll ? TorusAllToAll() : TorusAllReduce();
    case Algorithm::kCycles: return CyclesAllReduce();
  }
}

// fused.cc: one device operation per rank over every rank's buffers, counted as copy traffic (a
// copy moves each byte read and written, so a byte read or a byte written is half a copied byte).
// Per rank, with slice = count / p: AllReduce reads p slices and writes p (p x slice copied
// bytes); Reduce reads p slices and writes one, Broadcast reads one and writes p ((p + 1) / 2 x
// slice); ReduceScatter reads p blocks and writes one ((p + 1) / 2 x count); AllGather reads its
// block and writes it into p outputs ((p + 1) / 2 x count). Ranks that share a device share its
// memory system, so a device's ranks take that many times as long. Those are the even parts;
// where the plan sizes them by speed (shares.h), rank r's bytes are its share times p times
// those. Two rendezvous and a stream synchronization per operation (direct_rendezvous_us), one
// launch.
void Model::Fused() {
  const auto p = static_cast<double>(p_);
  const double slice = static_cast<double>(CeilDiv(req_.count, static_cast<uint64_t>(p_)));
  const double count = static_cast<double>(req_.count);
  double copied = 0;
  const char* what = "";
  switch (req_.collective) {
    case Collective::kAllReduce:
      copied = p * slice, what = "one-pass reduce into every output";
      break;
    case Collective::kReduce:
      copied = (p + 1) / 2 * slice, what = "one-pass reduce into the root's output";
      break;
    case Collective::kBroadcast:
      copied = (p + 1) / 2 * slice, what = "one-pass copy of the root's slices into every output";
      break;
    case Collective::kReduceScatter:
      copied = (p + 1) / 2 * count, what = "one-pass reduce of every input's block";
      break;
    case Collective::kAllGather:
      copied = (p + 1) / 2 * count, what = "one-pass copy of this rank's block into every output";
      break;
    case Collective::kBarrier:
      what = "rendezvous";
      break;
    default:
      copied = p * count, what = "one-pass copy of every input";
      break;
  }
  const double traffic_bytes = copied * elem_;
  // Every rank takes part (the host term: cost_model_host.h).
  for (int r = 0; r < p_; ++r) host_->Join(r);
  // Small AllReduces between processes run on the calling thread through the shared pages: each
  // rank copies its input in and reads every rank's copy (no launch, no stream, one rendezvous).
  // A barrier there is that rendezvous alone.
  if ((req_.collective == Collective::kAllReduce || req_.collective == Collective::kBarrier) &&
      shape_.direct_inline_bytes > 0 && count * elem_ <= static_cast<double>(shape_.direct_inline_bytes)) {
    StageCost c;
    double copy = 0;
    for (int r = 0; r < p_; ++r) {
      copy = std::max(copy, copy_[static_cast<size_t>(r)]);
      host_->Traffic(r, (p + 1) * count * elem_);
    }
    const HostSharing::Extra host = host_->End(0);
    c.alpha = k_.oneshot_us * 1e-6 + host.wake_s;
    c.gamma = std::max(host.slowdown * (p + 1) / 2 * count * elem_ * copy, host.memory_s);
    Add("one-shot through shared pages on the calling thread", c, 1);
    return;
  }
  // Each rank's part: the even slice, or in proportion to its speed (shares.h, as the plan cuts it).
  const std::vector<double> weights = FusedWeights(req_, shape_, opt_.balance);
  double weight_sum = 0;
  for (double w : weights) weight_sum += w;
  const bool reduction = IsReduction(req_.collective);
  // Bytes a rank's device reads (reductions: p inputs of its part) or copies (AllGather,
  // Broadcast: its part into p outputs) per unit of its share: what an emulated device's throttle
  // paces.
  const double device_bytes_per_share = static_cast<double>(FusedWorkCount(req_)) * elem_ * p;
  StageCost worst;
  int critical = 0;
  std::vector<double> cpu_s(static_cast<size_t>(p_)), device_s(static_cast<size_t>(p_));
  for (int r = 0; r < p_; ++r) {
    const auto ur = static_cast<size_t>(r);
    const RankDesc& d = shape_.ranks[ur];
    int sharing = 0;
    for (int q = 0; q < p_; ++q)
      if (shape_.ranks[static_cast<size_t>(q)].host_id == d.host_id &&
          shape_.ranks[static_cast<size_t>(q)].device == d.device)
        ++sharing;
    const double share = weights[ur] / weight_sum;  // 1 / p when even
    const double rank_traffic = traffic_bytes * share * p;
    host_->Traffic(r, 2 * rank_traffic);  // a copied byte is read once and written once
    StageCost c;
    // Between processes whose memory the CPU reaches, the calling thread does the part itself
    // (Executor::TryInline): two rendezvous through the shared pages, no launch.
    c.alpha = shape_.direct_inline_bytes > 0 ? 2 * k_.oneshot_us * 1e-6 : launch_[ur] + k_.direct_rendezvous_us * 1e-6;
    // A device that computes on the host's CPUs at a speed of its own (a throttled emulated
    // device) takes the longer of its speed's time and the CPUs' time for the bytes, which the
    // ranks sharing the CPUs stretch; any other device its reported speed's time.
    const double speed = reduction ? d.reduce_gbps : d.copy_gbps;
    const bool paced = d.host_compute && Known(speed);
    if (paced) device_s[ur] = static_cast<double>(sharing) * device_bytes_per_share * share / (speed * 1e9);
    cpu_s[ur] = static_cast<double>(sharing) * rank_traffic * (paced ? cpu_copy_[ur] : copy_[ur]);
    c.gamma = std::max(cpu_s[ur], device_s[ur]);
    if (c.total() > worst.total()) worst = c, critical = r;
  }
  // Two rendezvous, each waiting for every rank beyond the CPUs to be scheduled.
  const HostSharing::Extra host = host_->End(critical);
  worst.alpha += 2 * host.wake_s;
  double gamma = 0;
  for (size_t r = 0; r < cpu_s.size(); ++r) gamma = std::max(gamma, std::max(cpu_s[r] * host.slowdown, device_s[r]));
  worst.gamma = std::max(gamma, host.memory_s);
  Add(what, worst, 1);
}

// ina.cc, through the layout's parts (cost_model_ina.cc): the slowest worker stands for the
// aggregation devices, the slowest link (between workers, or a worker's to a device:
// CommTopology::ina_link) for every cable.
void Model::InaAllReduce() {
  cost_internal::InaResolved r;
  r.elem = elem_;
  r.latency_s = 0;
  r.wire_per_byte = 0;
  for (int a = 0; a < p_; ++a) {
    const auto i = static_cast<size_t>(a);
    r.staging_per_byte = std::max(r.staging_per_byte, staging_[i]);
    r.reduce_per_byte = std::max(r.reduce_per_byte, reduce_[i]);
    r.launch_s = std::max(r.launch_s, launch_[i]);
    for (int b = 0; b < p_; ++b)
      if (shape_.Reachable(a, b)) {
        r.latency_s = std::max(r.latency_s, Latency(shape_.link(a, b)));
        r.wire_per_byte = std::max(r.wire_per_byte, WirePerByte(shape_.link(a, b)));
      }
  }
  if (shape_.ina_link.reachable) {  // the cables to the aggregation devices, measured at creation
    r.latency_s = std::max(r.latency_s, Latency(shape_.ina_link));
    r.wire_per_byte = std::max(r.wire_per_byte, WirePerByte(shape_.ina_link));
  }
  if (r.latency_s == 0) r.latency_s = k_.unknown_link_latency_us * 1e-6;
  if (r.wire_per_byte == 0) r.wire_per_byte = 1.0 / (k_.unknown_link_gbps * 1e9);
  Result<std::vector<cost_internal::InaStage>> stages = cost_internal::InaStages(req_, shape_, opt_, k_, r);
  if (!stages.ok()) return Fail(stages.status().message());
  for (const cost_internal::InaStage& st : *stages) {
    StageCost c;
    c.alpha = st.alpha;
    c.beta = st.beta;
    c.gamma = st.gamma;
    Add(st.label, c, st.repeat);
  }
}

// KIZUNA_DETERMINISTIC (algorithm.h and the algorithms' files): every part's raw contributions go
// straight to its owner (the direct exchange), which reduces them in rank order in one operation,
// then the algorithm distributes the results.
void Model::Deterministic(Algorithm a) {
  if (IsHierarchical(a)) return Fail(fmt::format("{} is not deterministic (it adds in host order)", AlgorithmName(a)));
  if (a == Algorithm::kFile) return Fail("a plan file reduces in its own order, not rank order");
  const uint64_t count = req_.count;
  const auto p = static_cast<uint64_t>(p_);
  std::vector<char> owners(static_cast<size_t>(p_), 0);
  std::vector<int> owner_list;
  auto own = [&](int r) {
    if (!owners[static_cast<size_t>(r)]) owner_list.push_back(r);
    owners[static_cast<size_t>(r)] = 1;
  };
  switch (req_.collective) {
    case Collective::kReduceScatter:  // every rank owns its part
      DirectRounds("exchange", count);
      return Local("ordered reduce", LocalKind::kReduce, p_, count, -1);
    case Collective::kReduce:  // the root owns everything
      own(req_.root);
      DirectRounds("gather", count, &owners);
      return Local("ordered reduce", LocalKind::kReduce, p_, count, req_.root);
    case Collective::kAllReduce:
      if (a == Algorithm::kTree) return OrderedTreeAllReduce();
      if (a == Algorithm::kRhd) {  // the p2 active ranks own a block each, then double and unfold
        for (int nr = 0; nr < p2_; ++nr) own(Real(nr));
        const uint64_t block = CeilDiv(count, static_cast<uint64_t>(p2_));
        DirectRounds("exchange", block, &owners);
        Local("ordered reduce", LocalKind::kReduce, p_, block, owner_list);
        HypercubeRounds("doubling", false, count);
        return Unfold("unfold", 1, count);
      } else {
        const uint64_t part = CeilDiv(count, p);
        DirectRounds("exchange", part);
        Local("ordered reduce", LocalKind::kReduce, p_, part, -1);
        if (a == Algorithm::kRing) return RingAllGather(part);
        return DirectRounds("direct allgather", part);  // rd, pairwise
      }
    default:
      return;
  }
}

// Deterministic tree AllReduce: each tree's root owns its half; the contributions go straight to
// it, it reduces them in rank order, and the tree broadcasts the result down, pipelined.
void Model::OrderedTreeAllReduce() {
  const uint64_t half = CeilDiv(req_.count, 2);
  const std::vector<Tree> trees = MakeTrees(p_, -1, AllReduceLabels(shape_, opt_.balance));
  const std::vector<double> share = Shares(TreeWeights(trees, shape_, opt_.balance, Collective::kAllReduce));
  std::vector<char> owners(static_cast<size_t>(p_), 0);
  std::vector<double> part_scale(static_cast<size_t>(p_), 1.0);  // a root's part: its tree's share
  std::vector<int> roots;
  std::vector<Hop> down;
  int depth = 0;
  for (size_t t = 0; t < trees.size(); ++t) {
    depth = std::max(depth, trees[t].height);
    for (int r = 0; r < p_; ++r) {
      const int up = trees[t].parent[static_cast<size_t>(r)];
      if (up >= 0) down.push_back({up, r, false, 2 * share[t]});
    }
    const auto root = static_cast<size_t>(trees[t].root);
    if (!owners[root]) roots.push_back(trees[t].root);
    owners[root] = 1;
    part_scale[root] = 2 * share[t];
  }
  DirectRounds("exchange", half, &owners, &part_scale, /*by_sender=*/false);
  Local("ordered reduce", LocalKind::kReduce, p_, half, roots, &part_scale);
  Pipeline("tree broadcast", down, SplitElems(half), depth);
}

}  // namespace kizuna::collectives::cost_internal
