// The steps of hierarchical.cc's plans, one channel for one rank at a time (HierarchicalLevel). Not
// a public header: only hierarchical.cc includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "collectives/algorithms/common.h"

namespace kizuna::collectives::algo {

// One channel's steps of a hierarchical plan for one rank: the levels hierarchical.cc's plans are
// built from (its header comment says what each collective does at each level).
class HierarchicalLevel {
 public:
  // `parts`: hier:fused's part count (0: the rail form's, the widest host's rank count). `fused`:
  // hier:fused's blocks, summed or copied by the executor (ReduceScatter's: scratch from host_base).
  HierarchicalLevel(Builder& b, const Hosts& hosts, int c, Range R, int parts = 0, bool fused = false,
                    uint64_t host_base = 0)
      : b_(b),
        hosts_(hosts),
        c_(c),
        R_(R),
        g_(hosts.host[static_cast<size_t>(b.rank)]),
        l_(hosts.local[static_cast<size_t>(b.rank)]),
        P_(hosts.size(g_)),
        H_(hosts.count()),
        M_(parts > 0 ? parts : hosts.widest),
        fused_(fused || parts > 0),
        host_base_(host_base) {}

  // AllReduce split by speed (HierarchicalWeights, plan/shares.h): the parts (hier:fused: as the
  // executor's HostPart cuts them, from the same whole-number weights) and each part's ring over
  // the hosts.
  void Weigh(const HierarchicalShares& shares) {
    shares_ = &shares;
    if (!shares.parts.empty()) part_bounds_ = WeightedBounds(R_.count, shares.parts);
  }

  // hier:fused: the parts this rank owns, already summed over its host in its output (the
  // executor's host level), AllReduced among their owners; avg divided here (BuildFused).
  void NetworkAllReduce(bool doubling) {
    const std::vector<int> mine = PartsOf(l_, P_);
    if (mine.empty()) return;
    const uint64_t rounds = PieceCount(Largest(), b_.chunk);
    uint64_t slot_base = 0, slot_size = 0;
    if (doubling) {
      slot_size = std::min(b_.chunk, Largest());
      slot_base = b_.AllocScratch(kScratchSlots * slot_size);
    }
    for (uint64_t k = 0; k < rounds; ++k)
      for (int j : mine) {
        const Range pc = Piece(Part(j), b_.chunk, k);
        if (pc.count == 0) continue;
        if (doubling)
          DoublingAllReduce(j, pc, Builder::Scratch(slot_base + (k % kScratchSlots) * slot_size, pc.count));
        else
          RingAllReduce(j, pc);
        if (b_.req.op == ReduceOp::kAvg) b_.Scale(c_, Builder::Out(pc), Builder::Out(pc));
      }
  }

  void AllReduce(bool doubling) {
    const uint64_t rounds = PieceCount(Largest(), b_.chunk);
    uint64_t slot_base = 0, slot_size = 0;
    if (doubling) {
      slot_size = std::min(b_.chunk, Largest());
      slot_base = b_.AllocScratch(kScratchSlots * slot_size);
    }
    const std::vector<int> mine = PartsOf(l_, P_);
    for (uint64_t k = 0; k < rounds; ++k) {
      auto piece = [&](int j) { return Piece(Part(j), b_.chunk, k); };
      // Inside the host: each part's contributions to its owner, added into its output (a
      // host of one rank keeps its input, which the network level reads).
      std::vector<char> added(static_cast<size_t>(M_), 0);
      HostReduceScatter(
          mine, piece, [&](int j) { return Builder::Out(piece(j)); }, added);
      // Between hosts: the owners of each part, one per host.
      for (int j : mine) {
        const Range pc = piece(j);
        if (doubling) {
          const Slice slot = Builder::Scratch(slot_base + (k % kScratchSlots) * slot_size, pc.count);
          DoublingAllReduce(j, pc, slot);
        } else {
          RingAllReduce(j, pc);
        }
      }
      // Inside the host: the results from each owner to the other ranks.
      for (int d = 1; d < P_; ++d) {
        const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
        const std::vector<int> recvs = PartsOf(from, P_);
        for (size_t t = 0; t < std::max(mine.size(), recvs.size()); ++t) {
          if (t < mine.size()) b_.Send(c_, hosts_.Rank(g_, to), Builder::Out(piece(mine[t])));
          if (t < recvs.size()) b_.Recv(c_, hosts_.Rank(g_, from), Builder::Out(piece(recvs[t])));
        }
      }
    }
  }

  void ReduceScatter() {
    const uint64_t count = b_.req.count, rounds = PieceCount(R_.count, b_.chunk);
    // The blocks this rank owns besides its own, and a scratch slot set for each.
    std::vector<int> foreign;
    for (int r = 0; r < b_.p; ++r)
      if (r != b_.rank && LocalOf(r) % P_ == l_) foreign.push_back(r);
    // hier:fused: whole blocks, summed by the executor's host level before the steps.
    const uint64_t slot_size = std::min(b_.chunk, R_.count);
    const uint64_t base = fused_ ? host_base_ : b_.AllocScratch(foreign.size() * kScratchSlots * slot_size);
    for (uint64_t k = 0; k < rounds; ++k) {
      const Range pc = Piece(R_, b_.chunk, k);
      auto in = [&](int block) { return b_.In(static_cast<uint64_t>(block) * count + pc.offset, pc.count); };
      auto partial = [&](int block) {
        if (block == b_.rank) return Builder::Out(pc);
        const auto q = static_cast<uint64_t>(std::find(foreign.begin(), foreign.end(), block) - foreign.begin());
        if (fused_) return Builder::Scratch(base + q * count + pc.offset, pc.count);
        return Builder::Scratch(base + (q * kScratchSlots + k % kScratchSlots) * slot_size, pc.count);
      };
      // Inside the host: each block's contributions to its owner.
      for (int d = 1; d < P_ && !fused_; ++d) {
        const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
        const std::vector<int> sends = BlocksOwnedBy(to), recvs = BlocksOwnedBy(l_);
        for (size_t t = 0; t < std::max(sends.size(), recvs.size()); ++t) {
          if (t < sends.size()) b_.Send(c_, hosts_.Rank(g_, to), in(sends[t]));
          if (t < recvs.size())
            b_.RecvReduce(c_, hosts_.Rank(g_, from), d == 1 ? in(recvs[t]) : partial(recvs[t]), partial(recvs[t]));
        }
      }
      // Between hosts: each owner's partial sum straight to the block's rank.
      auto held = [&](int block) { return P_ > 1 ? partial(block) : in(block); };
      Slice mine = held(b_.rank);
      for (int e = 1; e < H_; ++e) {
        const int to_host = (g_ + e) % H_, from_host = (g_ - e + H_) % H_;
        std::vector<int> sends;  // rank b of to_host with b's local index = l_ mod P_, ascending
        for (int i = l_; i < hosts_.size(to_host); i += P_) sends.push_back(hosts_.Rank(to_host, i));
        const size_t my_t = static_cast<size_t>(l_ / hosts_.size(from_host));
        for (size_t t = 0; t < std::max(sends.size(), my_t + 1); ++t) {
          if (t < sends.size()) b_.Send(c_, sends[t], held(sends[t]));
          if (t == my_t) {
            b_.RecvReduce(c_, hosts_.Owner(from_host, l_), mine, Builder::Out(pc));
            mine = Builder::Out(pc);
          }
        }
      }
    }
  }

  void AllGather() {
    const uint64_t count = b_.req.count, rounds = PieceCount(R_.count, b_.chunk);
    // The blocks this rank holds after the network level: its own and those it owns elsewhere.
    std::vector<int> held;
    for (int r = 0; r < b_.p; ++r)
      if (r == b_.rank || (hosts_.host[static_cast<size_t>(r)] != g_ && LocalOf(r) % P_ == l_)) held.push_back(r);
    auto held_by = [&](int l) {
      std::vector<int> v;
      const int r = hosts_.Rank(g_, l);
      for (int o = 0; o < b_.p; ++o)
        if (o == r || (hosts_.host[static_cast<size_t>(o)] != g_ && LocalOf(o) % P_ == l)) v.push_back(o);
      return v;
    };
    for (uint64_t k = 0; k < rounds; ++k) {
      const Range pc = Piece(R_, b_.chunk, k);
      auto out = [&](int block) {
        return Builder::Out({static_cast<uint64_t>(block) * count + pc.offset, pc.count});
      };
      b_.Copy(c_, b_.In(pc), out(b_.rank));
      // Between hosts: the rank's block straight to its owner on every other host.
      for (int e = 1; e < H_; ++e) {
        const int to_host = (g_ + e) % H_, from_host = (g_ - e + H_) % H_;
        std::vector<int> recvs;  // ranks of from_host whose local index = l_ mod P_, ascending
        for (int i = l_; i < hosts_.size(from_host); i += P_) recvs.push_back(hosts_.Rank(from_host, i));
        const size_t my_t = static_cast<size_t>(l_ / hosts_.size(to_host));
        for (size_t t = 0; t < std::max(recvs.size(), my_t + 1); ++t) {
          if (t == my_t) b_.Send(c_, hosts_.Owner(to_host, l_), b_.In(pc));
          if (t < recvs.size()) b_.Recv(c_, recvs[t], out(recvs[t]));
        }
      }
      // Inside the host: every rank's held blocks to the others (hier:fused: the executor's
      // copies afterwards).
      for (int d = 1; d < P_ && !fused_; ++d) {
        const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
        const std::vector<int> recvs = held_by(from);
        for (size_t t = 0; t < std::max(held.size(), recvs.size()); ++t) {
          if (t < held.size()) b_.Send(c_, hosts_.Rank(g_, to), out(held[t]));
          if (t < recvs.size()) b_.Recv(c_, hosts_.Rank(g_, from), out(recvs[t]));
        }
      }
    }
  }

  void AllToAll() {
    // Pieces of each block small enough that a message of one piece of every rank of a host
    // fits a chunk (where the chunk holds one element per rank at least; else a message is
    // split into chunks).
    const auto widest = static_cast<uint64_t>(M_);
    const uint64_t count = b_.req.count, step = std::max<uint64_t>(1, b_.chunk / widest);
    const uint64_t rounds = PieceCount(R_.count, step), chunk = std::min(step, R_.count);
    // The ranks on other hosts whose blocks this rank gathers from its host and sends on.
    const std::vector<int> mine = Destinations(l_);
    const uint64_t bundle_size = chunk * static_cast<uint64_t>(P_);
    const uint64_t gathered = b_.AllocScratch(mine.size() * kScratchSlots * bundle_size);
    const uint64_t arriving = b_.AllocScratch(kScratchSlots * chunk * widest);
    for (uint64_t k = 0; k < rounds; ++k) {
      const Range pc = Piece(R_, step, k);
      auto in = [&](int to) { return b_.In(static_cast<uint64_t>(to) * count + pc.offset, pc.count); };
      auto out = [&](int from) { return Builder::Out({static_cast<uint64_t>(from) * count + pc.offset, pc.count}); };
      // Destination d's blocks from the P_ ranks of this host, in local order, one after another.
      auto bundle = [&](int d) {
        const auto q = static_cast<uint64_t>(std::find(mine.begin(), mine.end(), d) - mine.begin());
        return Builder::Scratch(gathered + (q * kScratchSlots + k % kScratchSlots) * bundle_size,
                                pc.count * static_cast<uint64_t>(P_));
      };
      auto part = [&](Slice s, int i) { return Builder::Sub(s, {static_cast<uint64_t>(i) * pc.count, pc.count}); };
      b_.Copy(c_, in(b_.rank), out(b_.rank));
      for (int d : mine) b_.Copy(c_, in(d), part(bundle(d), l_));
      // Inside the host: the block for each local peer, and the blocks each peer gathers.
      for (int d = 1; d < P_; ++d) {
        const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
        std::vector<int> sends = {hosts_.Rank(g_, to)}, recvs = {hosts_.Rank(g_, from)};
        for (int dest : Destinations(to)) sends.push_back(dest);
        for (int dest : mine) recvs.push_back(dest);
        for (size_t t = 0; t < std::max(sends.size(), recvs.size()); ++t) {
          if (t < sends.size()) b_.Send(c_, hosts_.Rank(g_, to), in(sends[t]));
          if (t == 0)
            b_.Recv(c_, hosts_.Rank(g_, from), out(hosts_.Rank(g_, from)));
          else if (t < recvs.size())
            b_.Recv(c_, hosts_.Rank(g_, from), part(bundle(recvs[t]), from));
        }
      }
      // Between hosts: one message per destination with its blocks from every rank of this host.
      for (int e = 1; e < H_; ++e) {
        const int to_host = (g_ + e) % H_, from_host = (g_ - e + H_) % H_, from_size = hosts_.size(from_host);
        std::vector<int> sends;
        for (int dest : mine)
          if (hosts_.host[static_cast<size_t>(dest)] == to_host) sends.push_back(dest);
        const size_t my_t = static_cast<size_t>(l_ / from_size);
        const Slice landing = Builder::Scratch(arriving + (k % kScratchSlots) * chunk * widest,
                                               pc.count * static_cast<uint64_t>(from_size));
        for (size_t t = 0; t < std::max(sends.size(), my_t + 1); ++t) {
          const Slice send = t < sends.size() ? bundle(sends[t]) : Slice{}, recv = t == my_t ? landing : Slice{};
          for (uint64_t m = 0; m < std::max(PieceCount(send.count, b_.chunk), PieceCount(recv.count, b_.chunk));
               ++m) {
            b_.Send(c_, t < sends.size() ? sends[t] : -1, Builder::Sub(send, Piece({0, send.count}, b_.chunk, m)));
            b_.Recv(c_, hosts_.Owner(from_host, l_), Builder::Sub(recv, Piece({0, recv.count}, b_.chunk, m)));
          }
          if (t == my_t)
            for (int i = 0; i < from_size; ++i) b_.Copy(c_, part(landing, i), out(hosts_.Rank(from_host, i)));
        }
      }
    }
  }

  void Broadcast() {
    const int root = b_.req.root, root_host = hosts_.host[static_cast<size_t>(root)];
    const int pos = (g_ - root_host + H_) % H_;  // this host's place in the chain of hosts
    const bool is_root = b_.rank == root, root_host_rank = g_ == root_host;
    const std::vector<int> mine = PartsOf(l_, P_);
    const uint64_t rounds = PieceCount(Part(0).count, b_.chunk);
    for (uint64_t k = 0; k < rounds; ++k) {
      auto piece = [&](int j) { return Piece(Part(j), b_.chunk, k); };
      if (is_root)
        for (int j = 0; j < M_; ++j) b_.Copy(c_, b_.In(piece(j)), Builder::Out(piece(j)));
      // The root's host: each part to its owner.
      for (int j = 0; j < M_; ++j) {
        const int owner = hosts_.Owner(root_host, j);
        if (owner == root) continue;
        if (is_root) b_.Send(c_, owner, b_.In(piece(j)));
        if (b_.rank == owner) b_.Recv(c_, root, Builder::Out(piece(j)));
      }
      // Between hosts: each part along the chain of its owners.
      for (int j : mine) {
        const int prev = hosts_.Owner((g_ - 1 + H_) % H_, j), next = hosts_.Owner((g_ + 1) % H_, j);
        if (pos > 0) b_.Recv(c_, prev, Builder::Out(piece(j)));
        if (pos + 1 < H_) b_.Send(c_, next, Builder::Out(piece(j)));
      }
      // Inside each host: from the owners to the other ranks (the root has every part).
      for (int d = 1; d < P_; ++d) {
        const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
        const bool send = !(root_host_rank && hosts_.Rank(g_, to) == root);
        const std::vector<int> recvs = is_root ? std::vector<int>{} : PartsOf(from, P_);
        for (size_t t = 0; t < std::max(mine.size(), recvs.size()); ++t) {
          if (send && t < mine.size()) b_.Send(c_, hosts_.Rank(g_, to), Builder::Out(piece(mine[t])));
          if (t < recvs.size()) b_.Recv(c_, hosts_.Rank(g_, from), Builder::Out(piece(recvs[t])));
        }
      }
    }
  }

  void Reduce() {
    const int root = b_.req.root, root_host = hosts_.host[static_cast<size_t>(root)];
    const int pos = (g_ - root_host - 1 + 2 * H_) % H_;  // the chain ends at the root's host
    const bool is_root = b_.rank == root;
    const std::vector<int> mine = PartsOf(l_, P_);
    const uint64_t rounds = PieceCount(Part(0).count, b_.chunk);
    const uint64_t slot_size = std::min(b_.chunk, Part(0).count);
    const uint64_t base = is_root ? 0 : b_.AllocScratch(mine.size() * kScratchSlots * slot_size);
    for (uint64_t k = 0; k < rounds; ++k) {
      auto piece = [&](int j) { return Piece(Part(j), b_.chunk, k); };
      // Where this rank adds up part j: the root's output, scratch elsewhere.
      auto home = [&](int j) {
        if (is_root) return Builder::Out(piece(j));
        const auto q = static_cast<uint64_t>(std::find(mine.begin(), mine.end(), j) - mine.begin());
        return Builder::Scratch(base + (q * kScratchSlots + k % kScratchSlots) * slot_size, piece(j).count);
      };
      std::vector<char> added(static_cast<size_t>(M_), 0);  // part j's sum is in home(j)
      auto cur = [&](int j) { return added[static_cast<size_t>(j)] ? home(j) : b_.In(piece(j)); };
      HostReduceScatter(mine, piece, home, added);
      // Between hosts: a chain of each part's owners ending at the root's host.
      for (int j : mine) {
        const int prev = hosts_.Owner((g_ - 1 + H_) % H_, j), next = hosts_.Owner((g_ + 1) % H_, j);
        if (pos > 0) {
          b_.RecvReduce(c_, prev, cur(j), home(j));
          added[static_cast<size_t>(j)] = 1;
        }
        if (pos + 1 < H_) b_.Send(c_, next, cur(j));
      }
      // The root's host: each part from its owner to the root.
      if (g_ != root_host) continue;
      for (int j = 0; j < M_; ++j) {
        const int owner = hosts_.Owner(root_host, j);
        if (owner == root) {
          if (is_root) b_.Copy(c_, cur(j), Builder::Out(piece(j)));
          continue;
        }
        if (b_.rank == owner) b_.Send(c_, root, cur(j));
        if (is_root) b_.Recv(c_, owner, Builder::Out(piece(j)));
      }
    }
  }

 private:
  Range Part(int j) const {
    if (part_bounds_.empty()) return SplitEven(R_, static_cast<uint64_t>(M_), static_cast<uint64_t>(j));
    const auto i = static_cast<size_t>(j);
    return {R_.offset + part_bounds_[i], part_bounds_[i + 1] - part_bounds_[i]};
  }
  uint64_t Largest() const {
    uint64_t most = 0;
    for (int j = 0; j < M_; ++j) most = std::max(most, Part(j).count);
    return most;
  }
  int LocalOf(int r) const { return hosts_.local[static_cast<size_t>(r)]; }
  // The parts (of M_) that local rank l of a host of `size` ranks owns, ascending.
  std::vector<int> PartsOf(int l, int size) const {
    std::vector<int> v;
    for (int j = l; j < M_; j += size) v.push_back(j);
    return v;
  }
  // The blocks (ranks) that local rank l of this host owns, ascending.
  std::vector<int> BlocksOwnedBy(int l) const {
    std::vector<int> v;
    for (int r = 0; r < b_.p; ++r)
      if (LocalOf(r) % P_ == l) v.push_back(r);
    return v;
  }
  int Member(int h, int j) const { return hosts_.Owner(h, j); }
  // The ranks of the other hosts whose AllToAll blocks local rank l of this host gathers and
  // sends on: those whose local index is l mod P_, ascending.
  std::vector<int> Destinations(int l) const {
    std::vector<int> v;
    for (int r = 0; r < b_.p; ++r)
      if (hosts_.host[static_cast<size_t>(r)] != g_ && LocalOf(r) % P_ == l) v.push_back(r);
    return v;
  }

  // Inside the host: each part's contributions (piece(j) of every rank's input) to its owner,
  // which adds them into home(j) (this rank's parts: `mine`); added[j] says a sum is there.
  template <typename PieceFn, typename HomeFn>
  void HostReduceScatter(const std::vector<int>& mine, PieceFn piece, HomeFn home, std::vector<char>& added) {
    for (int d = 1; d < P_; ++d) {
      const int to = (l_ + d) % P_, from = (l_ - d + P_) % P_;
      const std::vector<int> sends = PartsOf(to, P_);
      for (size_t t = 0; t < std::max(sends.size(), mine.size()); ++t) {
        if (t < sends.size()) b_.Send(c_, hosts_.Rank(g_, to), b_.In(piece(sends[t])));
        if (t < mine.size()) {
          const int j = mine[t];
          b_.RecvReduce(c_, hosts_.Rank(g_, from), added[static_cast<size_t>(j)] ? home(j) : b_.In(piece(j)),
                        home(j));
          added[static_cast<size_t>(j)] = 1;
        }
      }
    }
  }

  // Part j's piece pc, already summed over this host in the output (or, on a host of one rank,
  // still the input), AllReduced among the part's owners in a ring over the hosts.
  // Split by speed (Weigh), host g's sub-part is its share of the piece.
  void RingAllReduce(int j, Range pc) {
    const bool weighed = shares_ != nullptr && !shares_->network.empty();
    const std::vector<uint64_t> bounds =
        weighed ? WeightedBounds(pc.count, shares_->network[static_cast<size_t>(j)]) : std::vector<uint64_t>{};
    auto sub = [&](int s) {
      if (!weighed) return SplitEven(pc, static_cast<uint64_t>(H_), static_cast<uint64_t>(Mod(s, H_)));
      const auto i = static_cast<size_t>(Mod(s, H_));
      return Range{pc.offset + bounds[i], bounds[i + 1] - bounds[i]};
    };
    const int next = Member((g_ + 1) % H_, j), prev = Member((g_ - 1 + H_) % H_, j);
    const bool summed = fused_ || P_ > 1;
    for (int s = 0; s + 1 < H_; ++s) {
      const Range sp = sub(g_ - s), rp = sub(g_ - s - 1);
      b_.Send(c_, next, s == 0 && !summed ? b_.In(sp) : Builder::Out(sp));
      b_.RecvReduce(c_, prev, summed ? Builder::Out(rp) : b_.In(rp), Builder::Out(rp));
    }
    for (int s = 0; s + 1 < H_; ++s) {
      b_.Send(c_, next, Builder::Out(sub(g_ + 1 - s)));
      b_.Recv(c_, prev, Builder::Out(sub(g_ - s)));
    }
  }

  // The same with recursive doubling over the hosts (common.h's Fold for a host count that is
  // not a power of two); `slot` receives the partner's value before it is added.
  void DoublingAllReduce(int j, Range pc, Slice slot) {
    const Fold f(H_);
    const int a = f.Active(g_);
    Slice cur = fused_ || P_ > 1 ? Builder::Out(pc) : b_.In(pc);
    if (f.Folded(g_)) {
      if (a < 0) {
        b_.Send(c_, Member(g_ + 1, j), cur);
      } else {
        b_.RecvReduce(c_, Member(g_ - 1, j), cur, Builder::Out(pc));
        cur = Builder::Out(pc);
      }
    }
    if (a >= 0)
      for (int m = 1; m < f.pp; m *= 2) {
        const int peer = Member(f.RankOf(a ^ m), j);
        b_.Send(c_, peer, cur);
        b_.Recv(c_, peer, slot);
        b_.Reduce(c_, {cur, slot}, Builder::Out(pc));
        cur = Builder::Out(pc);
      }
    if (f.Folded(g_)) {
      if (a >= 0)
        b_.Send(c_, Member(g_ - 1, j), Builder::Out(pc));
      else
        b_.Recv(c_, Member(g_ + 1, j), Builder::Out(pc));
    }
  }

  Builder& b_;
  const Hosts& hosts_;
  const int c_;
  const Range R_;
  const int g_, l_, P_, H_, M_;  // this rank's host, local index, host size; hosts; parts
  const bool fused_;             // hier:fused: the host level is the executor's
  const uint64_t host_base_;     // hier:fused ReduceScatter: its foreign blocks' sums in scratch
  const HierarchicalShares* shares_ = nullptr;  // Weigh
  std::vector<uint64_t> part_bounds_;           // Weigh: the parts' bounds in R_; empty: even
};

}  // namespace kizuna::collectives::algo
