// The cost model's internals (cost_model.h): the shared helpers and the Model class that walks an
// algorithm's stages. Internal to the cost model: only cost_model.cc (resolving the inputs,
// costing a stage, the entry points) and cost_model_algorithms.cc (each algorithm's stages)
// include it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/cost/model.h"
#include "collectives/cost/model_host.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/rings.h"
#include "collectives/plan/topology.h"

namespace kizuna::collectives::cost_internal {

constexpr double kInf = std::numeric_limits<double>::infinity();

// std::isfinite only inspects the bits: no dependence on the floating-point environment.
inline bool Known(double v) { return std::isfinite(v) && v > 0; }

inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

inline int FloorLog2(uint64_t v) {
  int l = 0;
  while (v > 1) {
    v >>= 1;
    ++l;
  }
  return l;
}

inline bool Serves(Algorithm a, Collective c) {
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
    case Algorithm::kHierRd:
      return c == Collective::kAllReduce;
    case Algorithm::kHierFusedRing:
      return c == Collective::kAllReduce || c == Collective::kBarrier || c == Collective::kReduceScatter ||
             c == Collective::kAllGather;
    case Algorithm::kHierFusedRd:
      return c == Collective::kAllReduce || c == Collective::kBarrier;
    case Algorithm::kHierRing:
      return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kAllGather ||
             c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kAllToAll;
    case Algorithm::kFile: return !IsPointToPoint(c) && c != Collective::kBarrier;
    case Algorithm::kTorus: return c == Collective::kAllReduce || c == Collective::kAllToAll;
    case Algorithm::kCycles: return c == Collective::kAllReduce;
  }
  return false;
}

struct Hop {
  int from;
  int to;
  bool reduce;       // the receiver reduces the message into its data
  double scale = 1;  // this hop's message is the stage's bytes times this (parts sized by speed)
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
  Model(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options, const CostConstants& k)
      : req_(request), shape_(shape), opt_(options), k_(k), p_(request.nranks) {}

  Prediction Run(Algorithm algorithm);

 private:
  // ---- Inputs, resolved ----
  bool Resolve();
  // A forwarded pair's (LinkDesc::hops): each cable's, and each relay's.
  double Latency(const LinkDesc& l) const {
    const int hops = std::max(l.hops, 1);
    return ((Known(l.latency_us) ? l.latency_us : k_.unknown_link_latency_us) * hops + (hops - 1) * k_.relay_us) * 1e-6;
  }
  // A forwarded pair's bytes load each cable of its path (LinkDesc::hops).
  double WirePerByte(const LinkDesc& l) const {
    return static_cast<double>(std::max(l.hops, 1)) / ((Known(l.gbps) ? l.gbps : k_.unknown_link_gbps) * 1e9);
  }

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
  // `scale`: per rank, a factor on its elements (parts sized by speed); null: 1 for every rank.
  void Local(std::string_view label, LocalKind kind, int inputs, uint64_t elems, const std::vector<int>& ranks,
             const std::vector<double>* scale = nullptr);
  void Fail(std::string note) {
    if (!failed_) note_ = std::move(note);
    failed_ = true;
  }

  // ---- Structures ----
  // The ring's order (RingOrder), found once; empty where the shape has no cycle.
  const std::vector<int>& Ring() const;
  // `scale`: per rank r, a factor on the hop from r to the next rank's bytes; null: 1 for every hop.
  std::vector<Hop> RingHops(bool reduce, const std::vector<double>* scale = nullptr) const;
  std::vector<Hop> RankOrderHops(bool reduce, const std::vector<double>* scale) const;
  // The p-1 hops of a chain along the ring: from the root on (broadcast), or from the rank after
  // it on, ending at the root (reduce).
  std::vector<Hop> ChainHops(int root, bool reduce) const;
  // `part_scale`: per rank, a factor on the elements of its part (parts sized by speed); a hop
  // carries the receiver's part (`by_sender` false: the exchange that gathers each part at its
  // owner) or the sender's (true: the allgather that spreads each owner's part).
  void DirectRounds(std::string_view label, uint64_t elems, const std::vector<char>* owners = nullptr,
                    const std::vector<double>* part_scale = nullptr, bool by_sender = false);
  void RingReduceScatter(uint64_t part_elems, const std::vector<double>* scale = nullptr);
  void RingAllGather(uint64_t part_elems, const std::vector<double>* scale = nullptr);
  void RingAllReduce();
  // The torus the shape's cables form (FindTorus), or nullopt after Fail: none, or a fully
  // connected shape, whose links may share a NIC (the torus is costed link by link).
  std::optional<Torus> CabledTorus();
  void TorusAllReduce();
  void CyclesAllReduce();
  void TorusAllToAll();
  void TreeAllReduce();
  void Fused();
  void InaAllReduce();  // cost_model_ina.cc
  void Hierarchical(Algorithm a);  // model_hierarchical.cc
  void TreeRooted(bool reduce);
  int Real(int nr) const { return nr < rem_ ? 2 * nr + 1 : nr + rem_; }  // rhd/rd fold numbering
  void Fold(std::string_view label, uint64_t parts, uint64_t elems, bool reduce);
  void Unfold(std::string_view label, uint64_t parts, uint64_t elems);
  // `block_shares`: AllReduce's blocks sized by speed (each active rank's share of the data); null
  // or empty: even blocks.
  void HypercubeRounds(std::string_view label, bool halving, uint64_t count,
                       const std::vector<double>* block_shares = nullptr);
  void OrderedTreeAllReduce();
  void PointToPoint(bool send);
  void FilePlan();  // model_file.cc

  void Body(Algorithm a);
  void Deterministic(Algorithm a);

  const CollectiveRequest& req_;
  const CommTopology& shape_;
  mutable std::vector<int> ring_;  // Ring()'s
  const PlanOptions& opt_;
  const CostConstants& k_;
  const int p_;
  double elem_ = 0;
  int p2_ = 1, rem_ = 0;  // largest power of two <= p, and p - p2

  // Per rank, resolved: seconds per byte, seconds.
  std::vector<double> copy_, staging_, reduce_, launch_;
  // The same work at the CPUs' rates, which ranks beyond the CPUs stretch (HostSharing::slowdown):
  // equal to the above except for a device that computes on the host at a pace of its own
  // (known speeds and RankDesc::host_compute: a throttled emulated device), whose pace is a floor.
  std::vector<double> cpu_copy_, cpu_staging_, cpu_reduce_;
  std::optional<HostSharing> host_;  // ranks sharing a host's CPUs and memory
  // The operation runs on the calling threads (CommTopology::caller_inline_bytes): its stages
  // pass through no executor or stream thread.
  bool on_caller_ = false;
  // A plan step's device launch: none where the calling thread does the step's copies and
  // reductions itself (2 processes, 8-byte ring: 4 us measured, 19 us predicted with launches).
  double StepLaunch(size_t rank) const { return on_caller_ ? 0.0 : launch_[rank]; }
  // Per-stage scratch, reset after each stage.
  std::vector<double> cpu_, wout_, win_, stage_, red_, stage_cpu_, red_cpu_;
  std::vector<double> pout_, pin_;  // wire time on paced links (LinkDesc::paced), which slowdown leaves
  std::vector<char> touched_mark_;
  std::vector<int> touched_;

  Prediction pred_;
  std::vector<std::pair<std::string, double>> phases_;
  bool failed_ = false;
  std::string note_;
  // Each link is a cable of its own (the torus's ports): a rank's sends over different links go
  // side by side, each at its link's speed, instead of sharing one wire. Set by the algorithms
  // whose hops are laid out port by port.
  bool per_link_ = false;
};

}  // namespace kizuna::collectives::cost_internal
