#include "collectives/cost_model.h"

#include "collectives/cost_model_host.h"
#include "collectives/cost_model_ina.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace kizuna::collectives {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// std::isfinite only inspects the bits: no dependence on the floating-point environment.
bool Known(double v) { return std::isfinite(v) && v > 0; }

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

int FloorLog2(uint64_t v) {
  int l = 0;
  while (v > 1) {
    v >>= 1;
    ++l;
  }
  return l;
}

// NCCL's ncclGetBtree: the parent of `rank` in the in-order binary tree over 0..n-1 rooted at 0
// (root 0 has one child, the largest power of two below n; -1 for the root).
int BtreeParent(int n, int rank) {
  if (rank == 0) return -1;
  int bit = 1;
  while (bit < n && (bit & rank) == 0) bit <<= 1;
  int up = (rank ^ bit) | (bit << 1);
  if (up >= n) up = rank ^ bit;
  return up;
}

// NCCL's ncclGetDtree: the second tree mirrors the first for an even n and shifts it by one rank
// for an odd n, so that every rank is an inner node in at most one of the two.
int DtreeParent(int n, int tree, int rank) {
  if (tree == 0) return BtreeParent(n, rank);
  if (n % 2 == 1) {
    const int u = BtreeParent(n, (rank - 1 + n) % n);
    return u == -1 ? -1 : (u + 1) % n;
  }
  const int u = BtreeParent(n, n - 1 - rank);
  return u == -1 ? -1 : n - 1 - u;
}

// Depth of the deepest rank of tree `parent` (parent[r] == -1 at the root).
int TreeDepth(const std::vector<int>& parent) {
  int depth = 0;
  for (size_t r = 0; r < parent.size(); ++r) {
    int d = 0;
    for (int at = static_cast<int>(r); parent[static_cast<size_t>(at)] != -1 && d <= static_cast<int>(parent.size());
         at = parent[static_cast<size_t>(at)])
      ++d;
    depth = std::max(depth, d);
  }
  return depth;
}

bool Serves(Algorithm a, Collective c) {
  switch (a) {
    case Algorithm::kRing:
      return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kAllGather ||
             c == Collective::kBroadcast || c == Collective::kReduce;
    case Algorithm::kTree:
      return c == Collective::kAllReduce || c == Collective::kBroadcast || c == Collective::kReduce;
    case Algorithm::kRhd:
      return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kAllGather;
    case Algorithm::kRd:
      return c == Collective::kAllReduce || c == Collective::kBarrier;
    case Algorithm::kPairwise:
      return c == Collective::kAllToAll || c == Collective::kAllGather || c == Collective::kReduceScatter ||
             c == Collective::kAllReduce || c == Collective::kBarrier;
    case Algorithm::kP2p:
      return c == Collective::kSend || c == Collective::kRecv;
    case Algorithm::kFused:
      return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kAllGather ||
             c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kBarrier;
    case Algorithm::kIna:
      return c == Collective::kAllReduce;
  }
  return false;
}

struct Hop {
  int from;
  int to;
  bool reduce;  // the receiver reduces the message into its data
};

// The cost of one stage (see the header), or why it has none.
struct StageCost {
  double alpha = 0, beta = 0, gamma = 0;
  bool ok = true;
  std::string note;
  double total() const { return alpha + beta + gamma; }
};

// A part of the data, split over channels and chunks as the algorithms split it.
struct Split {
  double chunks = 0;     // per channel (a double: counts times stages must not overflow)
  int channels = 1;      // channels that carry data
  double bytes = 0;      // per chunk, on average
  double max_bytes = 0;  // the largest chunk
};

enum class LocalKind { kCopy, kReduce, kScale };

class Model {
 public:
  Model(const CollectiveRequest& request, const CommShape& shape, const PlanOptions& options, const CostConstants& k)
      : req_(request), shape_(shape), opt_(options), k_(k), p_(request.nranks) {}

  Prediction Run(Algorithm algorithm);

 private:
  // ---- Inputs, resolved ----
  bool Resolve();
  double Latency(const LinkDesc& l) const {
    return (Known(l.latency_us) ? l.latency_us : k_.unknown_link_latency_us) * 1e-6;
  }
  double WirePerByte(const LinkDesc& l) const { return 1.0 / ((Known(l.gbps) ? l.gbps : k_.unknown_link_gbps) * 1e9); }

  Split SplitElems(uint64_t elems) const {
    if (elems == 0) return {};
    const uint64_t channels = std::min<uint64_t>(static_cast<uint64_t>(opt_.channels), elems);
    const uint64_t per = CeilDiv(elems, channels);
    const uint64_t chunks = CeilDiv(per, opt_.chunk_count);
    return {static_cast<double>(chunks), static_cast<int>(channels),
            static_cast<double>(per) * elem_ / static_cast<double>(chunks),
            static_cast<double>(std::min(per, opt_.chunk_count)) * elem_};
  }

  // ---- Accumulation ----
  StageCost Cost(const std::vector<Hop>& hops, double bytes, int channels);
  void Add(std::string_view label, const StageCost& cost, double repeat);
  // `repeat` stages of `hops`, each hop moving `bytes` on each of `channels` channels.
  void Stage(std::string_view label, const std::vector<Hop>& hops, double bytes, double repeat, int channels) {
    if (repeat <= 0 || failed_) return;
    Add(label, Cost(hops, bytes, channels), repeat);
  }
  // A pipeline of `depth` stages carrying s.chunks chunks: the first chunk fills it (depth - 1
  // stages at the largest chunk's size), then one stage per chunk, which together move all the
  // data. Linear in the bytes per stage, so this is (depth + k - 1) stages with the fill paid at
  // the chunk size, and it never decreases when the data grows.
  void Pipeline(std::string_view label, const std::vector<Hop>& hops, const Split& s, double depth) {
    if (s.chunks == 0 || failed_) return;
    const StageCost fill = Cost(hops, s.max_bytes, s.channels);
    Add(label, fill, depth - 1);
    Add(label, Cost(hops, s.bytes, s.channels), s.chunks);
  }
  // Local device work on `rank` (or every rank when rank < 0) over `elems` elements, chunked.
  void Local(std::string_view label, LocalKind kind, int inputs, uint64_t elems, int rank);
  void Local(std::string_view label, LocalKind kind, int inputs, uint64_t elems, const std::vector<int>& ranks);
  void Fail(std::string note) {
    if (!failed_) note_ = std::move(note);
    failed_ = true;
  }

  // ---- Structures ----
  std::vector<Hop> RingHops(bool reduce) const;
  std::vector<Hop> ChainHops(int first, bool reduce) const;
  void DirectRounds(std::string_view label, uint64_t elems, const std::vector<char>* owners = nullptr);
  void RingReduceScatter(uint64_t part_elems);
  void RingAllGather(uint64_t part_elems);
  void TreeAllReduce();
  void Fused();
  void InaAllReduce();  // cost_model_ina.cc
  void TreeRooted(bool reduce);
  int Real(int nr) const { return nr < rem_ ? 2 * nr + 1 : nr + rem_; }  // rhd/rd fold numbering
  void Fold(std::string_view label, uint64_t parts, uint64_t elems, bool reduce);
  void Unfold(std::string_view label, uint64_t parts, uint64_t elems);
  void HypercubeRounds(std::string_view label, bool halving, uint64_t count);
  void OrderedTreeAllReduce();
  void PointToPoint(bool send);

  void Body(Algorithm a);
  void Deterministic(Algorithm a);

  const CollectiveRequest& req_;
  const CommShape& shape_;
  const PlanOptions& opt_;
  const CostConstants& k_;
  const int p_;
  double elem_ = 0;
  int p2_ = 1, rem_ = 0;  // largest power of two <= p, and p - p2

  // Per rank, resolved: seconds per byte, seconds.
  std::vector<double> copy_, staging_, reduce_, launch_;
  std::optional<cost_internal::HostSharing> host_;  // ranks sharing a host's CPUs and memory
  // Per-stage scratch, reset after each stage.
  std::vector<double> cpu_, wout_, win_, stage_, red_;
  std::vector<char> touched_mark_;
  std::vector<int> touched_;

  Prediction pred_;
  std::vector<std::pair<std::string, double>> phases_;
  bool failed_ = false;
  std::string note_;
};

bool Model::Resolve() {
  if (p_ < 1) {
    Fail(fmt::format("{} ranks", p_));
    return false;
  }
  if (shape_.nranks != p_ || shape_.ranks.size() != static_cast<size_t>(p_) ||
      shape_.links.size() != static_cast<size_t>(p_) * static_cast<size_t>(p_)) {
    Fail(fmt::format("the shape describes {} ranks ({} rank and {} link entries), the request {}", shape_.nranks,
                     shape_.ranks.size(), shape_.links.size(), p_));
    return false;
  }
  elem_ = static_cast<double>(DataTypeSize(req_.dtype));
  if (elem_ == 0) {
    Fail("invalid dtype");
    return false;
  }
  if (opt_.chunk_count < 1 || opt_.channels < 1) {
    Fail(fmt::format("invalid plan options (chunk_count {}, channels {})", opt_.chunk_count, opt_.channels));
    return false;
  }
  if (HasRoot(req_.collective) && (req_.root < 0 || req_.root >= p_)) {
    Fail(fmt::format("root {} out of range for {} ranks", req_.root, p_));
    return false;
  }
  p2_ = 1 << FloorLog2(static_cast<uint64_t>(p_));
  rem_ = p_ - p2_;
  const auto n = static_cast<size_t>(p_);
  copy_.resize(n);
  staging_.resize(n);
  reduce_.resize(n);
  launch_.resize(n);
  for (size_t r = 0; r < n; ++r) {
    const RankDesc& d = shape_.ranks[r];
    const double copy = Known(d.copy_gbps) ? d.copy_gbps : k_.unknown_copy_gbps;
    copy_[r] = 1.0 / (copy * 1e9);
    staging_[r] = 1.0 / (std::min(copy, k_.staging_copy_max_gbps) * 1e9);
    reduce_[r] = 1.0 / ((Known(d.reduce_gbps) ? d.reduce_gbps : k_.unknown_reduce_gbps) * 1e9);
    launch_[r] = (Known(d.launch_us) ? d.launch_us : k_.unknown_launch_us) * 1e-6;
  }
  host_.emplace(shape_, k_);
  cpu_.assign(n, 0);
  wout_.assign(n, 0);
  win_.assign(n, 0);
  stage_.assign(n, 0);
  red_.assign(n, 0);
  touched_mark_.assign(n, 0);
  return true;
}

StageCost Model::Cost(const std::vector<Hop>& hops, double bytes, int channels) {
  StageCost c;
  double latency = 0;
  const double message = (k_.message_overhead_us + k_.step_overhead_us) * 1e-6;
  auto touch = [&](int r) {
    if (!touched_mark_[static_cast<size_t>(r)]) {
      touched_mark_[static_cast<size_t>(r)] = 1;
      touched_.push_back(r);
    }
  };
  for (const Hop& h : hops) {
    if (!shape_.Reachable(h.from, h.to)) {
      c.ok = false;
      c.note = fmt::format("it would use link {}->{}, which is unreachable", h.from, h.to);
      break;
    }
    const auto from = static_cast<size_t>(h.from), to = static_cast<size_t>(h.to);
    const LinkDesc& l = shape_.link(h.from, h.to);
    // Empty messages (barriers) need no device work: no staging copy, nothing to reduce.
    const bool data = bytes > 0;
    latency = std::max(latency, Latency(l) + (data && l.staged ? launch_[from] : 0.0) +
                                    (data && (l.staged || h.reduce) ? launch_[to] : 0.0));
    touch(h.from);
    touch(h.to);
    host_->Join(h.from, /*executor=*/true);
    host_->Join(h.to, /*executor=*/true);
    cpu_[from] += message;
    cpu_[to] += message;
    if (data) {
      const double wire = bytes * WirePerByte(l);
      wout_[from] += wire;
      win_[to] += wire;
      // Memory traffic of each channel's message: read at the sender, written at the receiver,
      // each staging copy a read and a write, a reduction two reads and a write.
      const double traffic = bytes * static_cast<double>(channels);
      host_->Traffic(h.from, traffic * (l.staged ? 3 : 1));
      host_->Traffic(h.to, traffic * ((l.staged && !h.reduce ? 3 : 1) + (h.reduce ? 3 : 0)));
      if (l.staged) stage_[from] += bytes * staging_[from];
      if (h.reduce)
        red_[to] += 2.0 * bytes * reduce_[to];
      else if (l.staged)
        stage_[to] += bytes * staging_[to];
    }
  }
  // The critical rank: the largest per-rank time, the lowest rank on a tie.
  int worst = -1;
  double worst_time = -1;
  for (int r : touched_) {
    const auto i = static_cast<size_t>(r);
    const double t = cpu_[i] + std::max(wout_[i], win_[i]) + stage_[i] + red_[i];
    if (t > worst_time || (t == worst_time && r < worst)) {
      worst = r;
      worst_time = t;
    }
  }
  const cost_internal::HostSharing::Extra host = host_->End(worst);
  if (c.ok && worst >= 0) {
    const auto i = static_cast<size_t>(worst);
    const double ch = static_cast<double>(channels) * host.slowdown;
    c.alpha = latency + host.wake_s + ch * cpu_[i];
    c.beta = ch * (std::max(wout_[i], win_[i]) + stage_[i]);
    c.gamma = ch * red_[i];
    c.beta += std::max(0.0, host.memory_s - c.beta - c.gamma);
  }
  for (int r : touched_) {
    const auto i = static_cast<size_t>(r);
    cpu_[i] = wout_[i] = win_[i] = stage_[i] = red_[i] = 0;
    touched_mark_[i] = 0;
  }
  touched_.clear();
  return c;
}

void Model::Add(std::string_view label, const StageCost& cost, double repeat) {
  if (failed_ || repeat <= 0) return;
  if (!cost.ok) return Fail(cost.note);
  pred_.alpha_s += repeat * cost.alpha;
  pred_.beta_s += repeat * cost.beta;
  pred_.gamma_s += repeat * cost.gamma;
  pred_.stages += repeat;
  if (!phases_.empty() && phases_.back().first == label)
    phases_.back().second += repeat;
  else
    phases_.emplace_back(std::string(label), repeat);
}

void Model::Local(std::string_view label, LocalKind kind, int inputs, uint64_t elems, int rank) {
  std::vector<int> ranks;
  for (int r = rank < 0 ? 0 : rank; r < (rank < 0 ? p_ : rank + 1); ++r) ranks.push_back(r);
  Local(label, kind, inputs, elems, ranks);
}

// The slowest of `ranks` doing the work at the same time.
void Model::Local(std::string_view label, LocalKind kind, int inputs, uint64_t elems, const std::vector<int>& ranks) {
  const Split s = SplitElems(elems);
  if (s.chunks == 0 || failed_) return;
  const double ch = static_cast<double>(s.channels);
  StageCost worst;
  double worst_time = -1;
  int critical = -1;
  for (int r : ranks) {
    const auto i = static_cast<size_t>(r);
    StageCost c;
    c.alpha = launch_[i] + ch * k_.step_overhead_us * 1e-6;
    if (kind == LocalKind::kCopy)
      c.beta = ch * s.bytes * copy_[i];
    else if (kind == LocalKind::kScale)  // one input read, one output written: a copy's traffic
      c.gamma = ch * s.bytes * copy_[i];
    else
      c.gamma = ch * static_cast<double>(inputs) * s.bytes * reduce_[i];
    host_->Join(r);
    host_->Traffic(r, ch * s.bytes * (kind == LocalKind::kReduce ? static_cast<double>(inputs) + 1 : 2));
    if (c.total() > worst_time) {
      worst = c;
      worst_time = c.total();
      critical = r;
    }
  }
  const cost_internal::HostSharing::Extra host = host_->End(critical);
  worst.beta *= host.slowdown;
  worst.gamma *= host.slowdown;
  worst.beta += std::max(0.0, host.memory_s - worst.beta - worst.gamma);
  Add(label, worst, s.chunks);
}

std::vector<Hop> Model::RingHops(bool reduce) const {
  std::vector<Hop> hops;
  hops.reserve(static_cast<size_t>(p_));
  for (int r = 0; r < p_; ++r) hops.push_back({r, (r + 1) % p_, reduce});
  return hops;
}

// The p-1 hops of a chain along the ring: from the root onwards (broadcast), or from root+1
// onwards ending at the root (reduce).
std::vector<Hop> Model::ChainHops(int first, bool reduce) const {
  std::vector<Hop> hops;
  for (int i = 0; i + 1 < p_; ++i) hops.push_back({(first + i) % p_, (first + i + 1) % p_, reduce});
  return hops;
}

// p-1 rounds: in round j every rank sends `elems` elements to rank + j (pairwise exchange), or
// only to the ranks marked in `owners` (the direct exchange of deterministic mode, which brings
// every contribution to a part's owner). A round's chunks are independent, so a round costs one
// stage per chunk.
void Model::DirectRounds(std::string_view label, uint64_t elems, const std::vector<char>* owners) {
  const Split s = SplitElems(elems);
  if (s.chunks == 0) return;
  std::vector<Hop> hops;
  for (int j = 1; j < p_ && !failed_; ++j) {
    hops.clear();
    for (int r = 0; r < p_; ++r)
      if (owners == nullptr || (*owners)[static_cast<size_t>((r + j) % p_)]) hops.push_back({r, (r + j) % p_, false});
    Stage(label, hops, s.bytes, s.chunks, s.channels);
  }
}

void Model::RingReduceScatter(uint64_t part_elems) {
  const Split s = SplitElems(part_elems);
  Stage("reduce-scatter", RingHops(true), s.bytes, s.chunks * (p_ - 1), s.channels);
}

void Model::RingAllGather(uint64_t part_elems) {
  const Split s = SplitElems(part_elems);
  Stage("allgather", RingHops(false), s.bytes, s.chunks * (p_ - 1), s.channels);
}

// Both trees, each half the data, reduce up and broadcast down pipelined. Filling the pipeline
// takes d stages going up (every upward edge of both trees busy) and d - 1 coming down; in the
// steady state a stage carries one chunk over every edge of both trees in both directions.
void Model::TreeAllReduce() {
  const Split s = SplitElems(CeilDiv(req_.count, 2));
  if (s.chunks == 0) return;
  std::vector<Hop> hops, up_hops, down_hops;
  int depth = 0;
  for (int t = 0; t < 2; ++t) {
    std::vector<int> parent(static_cast<size_t>(p_));
    for (int r = 0; r < p_; ++r) parent[static_cast<size_t>(r)] = DtreeParent(p_, t, r);
    depth = std::max(depth, TreeDepth(parent));
    for (int r = 0; r < p_; ++r) {
      const int up = parent[static_cast<size_t>(r)];
      if (up < 0) continue;
      up_hops.push_back({r, up, true});
      down_hops.push_back({up, r, false});
    }
  }
  hops = up_hops;
  hops.insert(hops.end(), down_hops.begin(), down_hops.end());
  Add("tree reduce+broadcast", Cost(up_hops, s.max_bytes, s.channels), depth);
  Add("tree reduce+broadcast", Cost(down_hops, s.max_bytes, s.channels), depth - 1);
  Add("tree reduce+broadcast", Cost(hops, s.bytes, s.channels), s.chunks);
}

// Broadcast (down) or Reduce (up) over two trees both rooted at the root (tree.cc): the first on
// the ranks rotated so that the root is label 0, the second with the other labels mirrored (odd
// p) or shifted (even p), so that the first tree's leaves are mostly the second's inner nodes.
void Model::TreeRooted(bool reduce) {
  const Split s = SplitElems(CeilDiv(req_.count, 2));
  if (s.chunks == 0) return;
  std::vector<Hop> hops;
  int depth = 0;
  for (int t = 0; t < 2; ++t) {
    std::vector<int> label(static_cast<size_t>(p_)), rank_of(static_cast<size_t>(p_));
    for (int r = 0; r < p_; ++r) {
      const int v = (r - req_.root + p_) % p_;
      const int l = t == 0 || v == 0 ? v : (p_ % 2 == 1 ? p_ - v : (v - 2 + (p_ - 1)) % (p_ - 1) + 1);
      label[static_cast<size_t>(r)] = l;
      rank_of[static_cast<size_t>(l)] = r;
    }
    std::vector<int> parent(static_cast<size_t>(p_));
    for (int r = 0; r < p_; ++r) {
      const int up = BtreeParent(p_, label[static_cast<size_t>(r)]);
      parent[static_cast<size_t>(r)] = up < 0 ? -1 : rank_of[static_cast<size_t>(up)];
    }
    depth = std::max(depth, TreeDepth(parent));
    for (int r = 0; r < p_; ++r) {
      const int up = parent[static_cast<size_t>(r)];
      if (up >= 0) hops.push_back(reduce ? Hop{r, up, true} : Hop{up, r, false});
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
void Model::HypercubeRounds(std::string_view label, bool halving, uint64_t count) {
  const bool blocks_are_parts = req_.collective != Collective::kAllReduce;
  const uint64_t block = blocks_are_parts ? count : CeilDiv(count, static_cast<uint64_t>(p2_));
  const Split s = SplitElems(block);
  if (s.chunks == 0) return;
  std::vector<Hop> hops(static_cast<size_t>(p2_));
  for (int i = 0; i < FloorLog2(static_cast<uint64_t>(p2_)) && !failed_; ++i) {
    const int mask = halving ? p2_ >> (i + 1) : 1 << i;
    for (int nr = 0; nr < p2_; ++nr) hops[static_cast<size_t>(nr)] = {Real(nr), Real(nr ^ mask), halving};
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

void Model::Body(Algorithm a) {
  const uint64_t count = req_.count;
  const auto p = static_cast<uint64_t>(p_);
  switch (a) {
    case Algorithm::kRing:
      switch (req_.collective) {
        case Collective::kAllReduce:
          RingReduceScatter(CeilDiv(count, p));
          RingAllGather(CeilDiv(count, p));
          return;
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
          return Pipeline("chain reduce", ChainHops(req_.root + 1, true), s, p_ - 1);
        }
        default:
          return;
      }
    case Algorithm::kTree:
      if (req_.collective == Collective::kAllReduce) return TreeAllReduce();
      return TreeRooted(req_.collective == Collective::kReduce);
    case Algorithm::kRhd:
      switch (req_.collective) {
        case Collective::kAllReduce:
          Fold("fold", 1, count, true);
          HypercubeRounds("halving", true, count);
          HypercubeRounds("doubling", false, count);
          return Unfold("unfold", 1, count);
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
        case Collective::kAllReduce:
          DirectRounds("exchange", CeilDiv(count, p));
          Local("ordered reduce", LocalKind::kReduce, p_, CeilDiv(count, p), -1);
          return DirectRounds("direct allgather", CeilDiv(count, p));
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
  }
}

// fused.cc: one device operation per rank over every rank's buffers, counted as copy traffic (a
// copy moves each byte read and written, so a byte read or a byte written is half a copied byte).
// Per rank, with slice = count / p: AllReduce reads p slices and writes p (p x slice copied
// bytes); Reduce reads p slices and writes one, Broadcast reads one and writes p ((p + 1) / 2 x
// slice); ReduceScatter reads p blocks and writes one ((p + 1) / 2 x count); AllGather copies p
// blocks (p x count). Ranks that share a device share its memory system, so a device's ranks take
// that many times as long. Two rendezvous and a stream synchronization per operation
// (direct_rendezvous_us), one launch.
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
    const cost_internal::HostSharing::Extra host = host_->End(0);
    c.alpha = k_.oneshot_us * 1e-6 + host.wake_s;
    c.gamma = std::max(host.slowdown * (p + 1) / 2 * count * elem_ * copy, host.memory_s);
    Add("one-shot through shared pages on the calling thread", c, 1);
    return;
  }
  StageCost worst;
  int critical = 0;
  for (int r = 0; r < p_; ++r) {
    int sharing = 0;
    for (int q = 0; q < p_; ++q)
      if (shape_.ranks[static_cast<size_t>(q)].host_id == shape_.ranks[static_cast<size_t>(r)].host_id &&
          shape_.ranks[static_cast<size_t>(q)].device == shape_.ranks[static_cast<size_t>(r)].device)
        ++sharing;
    host_->Traffic(r, 2 * traffic_bytes);  // a copied byte is read once and written once
    StageCost c;
    // Between processes whose memory the CPU reaches, the calling thread does the part itself
    // (Executor::TryInline): two rendezvous through the shared pages, no launch.
    c.alpha = shape_.direct_inline_bytes > 0 ? 2 * k_.oneshot_us * 1e-6
                                             : launch_[static_cast<size_t>(r)] + k_.direct_rendezvous_us * 1e-6;
    c.gamma = static_cast<double>(sharing) * traffic_bytes * copy_[static_cast<size_t>(r)];
    if (c.total() > worst.total()) worst = c, critical = r;
  }
  // Two rendezvous, each waiting for every rank beyond the CPUs to be scheduled.
  const cost_internal::HostSharing::Extra host = host_->End(critical);
  worst.alpha += 2 * host.wake_s;
  worst.gamma = std::max(worst.gamma * host.slowdown, host.memory_s);
  Add(what, worst, 1);
}

// ina.cc, through the layout's parts (cost_model_ina.cc): the slowest worker stands for the
// aggregation devices, the slowest link (between workers, or a worker's to a device:
// CommShape::ina_link) for every cable.
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
  std::vector<char> owners(static_cast<size_t>(p_), 0);
  std::vector<int> roots;
  std::vector<Hop> down;
  int depth = 0;
  for (int t = 0; t < 2; ++t) {
    std::vector<int> parent(static_cast<size_t>(p_));
    for (int r = 0; r < p_; ++r) parent[static_cast<size_t>(r)] = DtreeParent(p_, t, r);
    depth = std::max(depth, TreeDepth(parent));
    for (int r = 0; r < p_; ++r) {
      const int up = parent[static_cast<size_t>(r)];
      if (up >= 0) down.push_back({up, r, false});
      if (up < 0 && !owners[static_cast<size_t>(r)]) {
        owners[static_cast<size_t>(r)] = 1;
        roots.push_back(r);
      }
    }
  }
  DirectRounds("exchange", half, &owners);
  Local("ordered reduce", LocalKind::kReduce, p_, half, roots);
  Pipeline("tree broadcast", down, SplitElems(half), depth);
}

Prediction Model::Run(Algorithm a) {
  const auto ai = static_cast<int>(a);
  if (ai < 0 || ai >= kNumAlgorithms) {
    Fail(fmt::format("algorithm {} does not exist", ai));
  } else if (!Serves(a, req_.collective)) {
    Fail(fmt::format("{} does not serve {}", AlgorithmName(a), CollectiveName(req_.collective)));
  } else if (Resolve()) {
    const Collective c = req_.collective;
    const bool send_recv = c == Collective::kSend || c == Collective::kRecv;
    if (send_recv && p_ < 2) Fail(fmt::format("{} needs a peer: the communicator has one rank", CollectiveName(c)));
    // Local copies the algorithms make of the rank's own data.
    if (c == Collective::kAllToAll || (c == Collective::kAllGather && !req_.in_place && p_ > 1))
      Local("own block copy", LocalKind::kCopy, 1, req_.count, -1);
    if (c == Collective::kBroadcast && !req_.in_place && p_ > 1)
      Local("root copy", LocalKind::kCopy, 1, req_.count, req_.root);
    if (p_ == 1) {
      if (!req_.in_place && c != Collective::kAllToAll && req_.output_count() > 0)
        Local("copy", LocalKind::kCopy, 1, req_.output_count(), -1);
    } else if (opt_.deterministic && IsReduction(c) && a != Algorithm::kFused) {  // fused: rank order already
      Deterministic(a);
    } else {
      Body(a);
    }
    if (req_.op == ReduceOp::kAvg && IsReduction(c) && a != Algorithm::kFused)  // fused divides in its pass
      Local("avg epilogue", LocalKind::kScale, 1, req_.count, c == Collective::kReduce ? req_.root : -1);
  }
  if (failed_) {
    Prediction out;
    out.note = note_;
    return out;
  }
  pred_.seconds = pred_.alpha_s + pred_.beta_s + pred_.gamma_s;
  if (!(pred_.seconds < kInf)) {  // NaN or infinite: constants with a zero speed
    Prediction out;
    out.note = "the constants or the shape give an infinite cost (a zero speed?)";
    return out;
  }
  for (size_t i = 0; i < phases_.size(); ++i)
    pred_.structure += fmt::format("{}{} {}", i ? " + " : "", phases_[i].first, phases_[i].second);
  if (phases_.empty()) pred_.structure = "nothing to do";
  return pred_;
}

}  // namespace

std::string FormatSeconds(double seconds) {
  if (!(seconds < kInf)) return "inf";
  if (seconds < 1e-6) return fmt::format("{:.3g} ns", seconds * 1e9);
  if (seconds < 1e-3) return fmt::format("{:.3g} us", seconds * 1e6);
  if (seconds < 1.0) return fmt::format("{:.3g} ms", seconds * 1e3);
  return fmt::format("{:.3g} s", seconds);
}

std::string Prediction::ToString() const {
  if (!finite()) return fmt::format("no prediction: {}", note.empty() ? "unknown" : note);
  return fmt::format("{} (alpha {}, beta {}, gamma {}; {} stages: {})", FormatSeconds(seconds), FormatSeconds(alpha_s),
                     FormatSeconds(beta_s), FormatSeconds(gamma_s), stages, structure);
}

Prediction Predict(Algorithm algorithm, const CollectiveRequest& request, const CommShape& shape,
                   const PlanOptions& options, const CostConstants& constants) {
  return Model(request, shape, options, constants).Run(algorithm);
}

double PredictSeconds(Algorithm algorithm, const CollectiveRequest& request, const CommShape& shape,
                      const PlanOptions& options, const CostConstants& constants) {
  return Predict(algorithm, request, shape, options, constants).seconds;
}

std::string ExplainPrediction(Algorithm algorithm, const CollectiveRequest& request, const CommShape& shape,
                              const PlanOptions& options, const CostConstants& constants) {
  return fmt::format("{}: {}", AlgorithmName(algorithm),
                     Predict(algorithm, request, shape, options, constants).ToString());
}

}  // namespace kizuna::collectives
