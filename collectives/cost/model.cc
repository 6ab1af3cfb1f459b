#include "collectives/cost/model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "collectives/cost/model_internal.h"

namespace kizuna::collectives {
namespace cost_internal {

bool Model::Resolve() {
  if (p_ < 1) {
    Fail(fmt::format("{} ranks", p_));
    return false;
  }
  if (shape_.nranks != p_ || shape_.ranks.size() != static_cast<size_t>(p_) ||
      shape_.links.size() != static_cast<size_t>(shape_.link_rows()) * static_cast<size_t>(p_)) {
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
  cpu_copy_.resize(n);
  cpu_staging_.resize(n);
  cpu_reduce_.resize(n);
  host_.emplace(shape_, k_, static_cast<double>(req_.input_count() + req_.output_count()) * elem_,
                !IsPointToPoint(req_.collective));
  for (size_t r = 0; r < n; ++r) {
    const RankDesc& d = shape_.ranks[r];
    // The CPUs' rates (the machine's defaults, faster where the operation fits the cache) for a
    // device that computes on them; a device's own speed (known) is its rate, and where it also
    // computes on the host's CPUs (a throttled emulated device) it only bounds them from below.
    const double speedup = host_->Cached(static_cast<int>(r)) ? std::max(1.0, k_.cache_speedup) : 1.0;
    const double cpu_copy = 1.0 / (k_.unknown_copy_gbps * 1e9) / speedup;
    const double cpu_staging = 1.0 / (std::min(k_.unknown_copy_gbps, k_.staging_copy_max_gbps) * 1e9) / speedup;
    const double cpu_reduce = 1.0 / (k_.unknown_reduce_gbps * 1e9) / speedup;
    const bool paced_copy = d.host_compute && Known(d.copy_gbps);
    const bool paced_reduce = d.host_compute && Known(d.reduce_gbps);
    const double copy = Known(d.copy_gbps) ? d.copy_gbps : k_.unknown_copy_gbps;
    const double device_speedup = paced_copy ? 1.0 : speedup;
    copy_[r] = 1.0 / (copy * 1e9) / device_speedup;
    staging_[r] = 1.0 / (std::min(copy, k_.staging_copy_max_gbps) * 1e9) / device_speedup;
    reduce_[r] =
        1.0 / ((Known(d.reduce_gbps) ? d.reduce_gbps : k_.unknown_reduce_gbps) * 1e9) / (paced_reduce ? 1.0 : speedup);
    launch_[r] = (Known(d.launch_us) ? d.launch_us : k_.unknown_launch_us) * 1e-6;
    cpu_copy_[r] = paced_copy ? cpu_copy : copy_[r];
    cpu_staging_[r] = paced_copy ? cpu_staging : staging_[r];
    cpu_reduce_[r] = paced_reduce ? cpu_reduce : reduce_[r];
  }
  on_caller_ = shape_.caller_inline_bytes > 0 &&
               static_cast<double>(std::max(req_.input_count(), req_.output_count())) * elem_ <=
                   static_cast<double>(shape_.caller_inline_bytes);
  cpu_.assign(n, 0);
  wout_.assign(n, 0);
  win_.assign(n, 0);
  pout_.assign(n, 0);
  pin_.assign(n, 0);
  stage_.assign(n, 0);
  red_.assign(n, 0);
  stage_cpu_.assign(n, 0);
  red_cpu_.assign(n, 0);
  touched_mark_.assign(n, 0);
  return true;
}

StageCost Model::Cost(const std::vector<Hop>& hops, double stage_bytes, int channels) {
  StageCost c;
  double latency = 0;
  const double message = (k_.message_overhead_us + k_.step_overhead_us) * 1e-6;
  std::map<std::pair<int, int>, double> link_wire;  // per_link_: each link's wire time
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
    const double bytes = stage_bytes * h.scale;
    const bool data = bytes > 0;
    latency = std::max(latency, Latency(l) + (data && l.staged ? StepLaunch(from) : 0.0) +
                                    (data && (l.staged || h.reduce) ? StepLaunch(to) : 0.0));
    touch(h.from);
    touch(h.to);
    host_->Join(h.from, /*executor=*/!on_caller_);
    host_->Join(h.to, /*executor=*/!on_caller_);
    cpu_[from] += message;
    cpu_[to] += message;
    if (data) {
      const double wire = bytes * WirePerByte(l);
      if (per_link_) {
        link_wire[{h.from, h.to}] += wire;
      } else {
        (l.paced ? pout_ : wout_)[from] += wire;
        (l.paced ? pin_ : win_)[to] += wire;
      }
      // Memory traffic of each channel's message: read at the sender, written at the receiver,
      // each staging copy a read and a write, a reduction two reads and a write.
      const double traffic = bytes * static_cast<double>(channels);
      host_->Traffic(h.from, traffic * (l.staged ? 3 : 1));
      host_->Traffic(h.to, traffic * ((l.staged && !h.reduce ? 3 : 1) + (h.reduce ? 3 : 0)));
      if (l.staged) {
        stage_[from] += bytes * staging_[from];
        stage_cpu_[from] += bytes * cpu_staging_[from];
      }
      if (h.reduce) {
        red_[to] += 2.0 * bytes * reduce_[to];
        red_cpu_[to] += 2.0 * bytes * cpu_reduce_[to];
      } else if (l.staged) {
        stage_[to] += bytes * staging_[to];
        stage_cpu_[to] += bytes * cpu_staging_[to];
      }
    }
  }
  for (const auto& [link, wire] : link_wire) {
    const bool paced = shape_.link(link.first, link.second).paced;
    double& out = (paced ? pout_ : wout_)[static_cast<size_t>(link.first)];
    double& in = (paced ? pin_ : win_)[static_cast<size_t>(link.second)];
    out = std::max(out, wire);
    in = std::max(in, wire);
  }
  // A rank's wire time: its paced cables' own, or its other links' stretched by the CPUs' turns.
  auto wire_of = [&](size_t i, double slow) {
    return std::max(std::max(pout_[i], pin_[i]), slow * std::max(wout_[i], win_[i]));
  };
  // The critical rank: the largest per-rank time, the lowest rank on a tie.
  int worst = -1;
  double worst_time = -1;
  for (int r : touched_) {
    const auto i = static_cast<size_t>(r);
    const double t = cpu_[i] + wire_of(i, 1) + stage_[i] + red_[i];
    if (t > worst_time || (t == worst_time && r < worst)) {
      worst = r;
      worst_time = t;
    }
  }
  const cost_internal::HostSharing::Extra host = host_->End(worst);
  if (c.ok && worst >= 0) {
    const auto i = static_cast<size_t>(worst);
    // Ranks beyond the CPUs stretch the CPUs' work; a device's own pace (a throttle) is a floor.
    const double ch = static_cast<double>(channels), slow = host.slowdown;
    c.alpha = latency + host.wake_s + ch * slow * cpu_[i];
    c.beta = ch * (wire_of(i, slow) + std::max(stage_[i], slow * stage_cpu_[i]));
    c.gamma = ch * std::max(red_[i], slow * red_cpu_[i]);
    c.beta += std::max(0.0, host.memory_s - c.beta - c.gamma);
  }
  for (int r : touched_) {
    const auto i = static_cast<size_t>(r);
    cpu_[i] = wout_[i] = win_[i] = pout_[i] = pin_[i] = stage_[i] = red_[i] = stage_cpu_[i] = red_cpu_[i] = 0;
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
void Model::Local(std::string_view label, LocalKind kind, int inputs, uint64_t elems, const std::vector<int>& ranks,
                  const std::vector<double>* scale) {
  const Split s = SplitElems(elems);
  if (s.chunks == 0 || failed_) return;
  const double ch = static_cast<double>(s.channels);
  StageCost worst, worst_cpu;
  double worst_time = -1;
  int critical = -1;
  for (int r : ranks) {
    const auto i = static_cast<size_t>(r);
    const double bytes = s.bytes * (scale != nullptr ? (*scale)[i] : 1.0);
    StageCost c, cpu;  // at the device's pace, and the CPUs' work for the same bytes
    c.alpha = StepLaunch(i) + ch * k_.step_overhead_us * 1e-6;
    if (kind == LocalKind::kCopy) {
      c.beta = ch * bytes * copy_[i];
      cpu.beta = ch * bytes * cpu_copy_[i];
    } else if (kind == LocalKind::kScale) {  // one input read, one output written: a copy's traffic
      c.gamma = ch * bytes * copy_[i];
      cpu.gamma = ch * bytes * cpu_copy_[i];
    } else {
      c.gamma = ch * static_cast<double>(inputs) * bytes * reduce_[i];
      cpu.gamma = ch * static_cast<double>(inputs) * bytes * cpu_reduce_[i];
    }
    host_->Join(r);
    host_->Traffic(r, ch * bytes * (kind == LocalKind::kReduce ? static_cast<double>(inputs) + 1 : 2));
    if (c.total() > worst_time) {
      worst = c;
      worst_cpu = cpu;
      worst_time = c.total();
      critical = r;
    }
  }
  const cost_internal::HostSharing::Extra host = host_->End(critical, /*waits=*/false);
  worst.beta = std::max(worst.beta, worst_cpu.beta * host.slowdown);
  worst.gamma = std::max(worst.gamma, worst_cpu.gamma * host.slowdown);
  worst.beta += std::max(0.0, host.memory_s - worst.beta - worst.gamma);
  Add(label, worst, s.chunks);
}

const std::vector<int>& Model::Ring() const {
  if (ring_.empty()) ring_ = RingOrder(shape_);
  return ring_;
}

// The ring's hops in its order (RingOrder: rank order where the shape allows).
std::vector<Hop> Model::RingHops(bool reduce, const std::vector<double>* scale) const {
  const std::vector<int>& order = Ring();
  if (order.empty()) return RankOrderHops(reduce, scale);  // no cycle: the missing link fails the stage
  std::vector<Hop> hops;
  hops.reserve(static_cast<size_t>(p_));
  for (int i = 0; i < p_; ++i) {
    const int r = order[static_cast<size_t>(i)];
    hops.push_back({r, order[static_cast<size_t>((i + 1) % p_)], reduce,
                    scale != nullptr ? (*scale)[static_cast<size_t>(r)] : 1.0});
  }
  return hops;
}

std::vector<Hop> Model::RankOrderHops(bool reduce, const std::vector<double>* scale) const {
  std::vector<Hop> hops;
  for (int r = 0; r < p_; ++r)
    hops.push_back({r, (r + 1) % p_, reduce, scale != nullptr ? (*scale)[static_cast<size_t>(r)] : 1.0});
  return hops;
}

std::vector<Hop> Model::ChainHops(int root, bool reduce) const {
  std::vector<int> order = Ring();
  if (order.empty())
    for (int r = 0; r < p_; ++r) order.push_back(r);
  const int at = static_cast<int>(std::find(order.begin(), order.end(), root) - order.begin()) + (reduce ? 1 : 0);
  std::vector<Hop> hops;
  for (int i = 0; i + 1 < p_; ++i)
    hops.push_back({order[static_cast<size_t>((at + i) % p_)], order[static_cast<size_t>((at + i + 1) % p_)], reduce});
  return hops;
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
    // Local copies the algorithms make of the rank's own data (fused's pass writes it with the
    // rest: no copy of its own).
    const bool fused = a == Algorithm::kFused;
    if (c == Collective::kAllToAll || (c == Collective::kAllGather && !req_.in_place && p_ > 1 && !fused))
      Local("own block copy", LocalKind::kCopy, 1, req_.count, -1);
    if (c == Collective::kBroadcast && !req_.in_place && p_ > 1 && !fused)
      Local("root copy", LocalKind::kCopy, 1, req_.count, req_.root);
    if (p_ == 1) {
      if (!req_.in_place && c != Collective::kAllToAll && req_.output_count() > 0)
        Local("copy", LocalKind::kCopy, 1, req_.output_count(), -1);
    } else if (opt_.deterministic && IsReduction(c) && a != Algorithm::kFused) {  // fused: rank order already
      Deterministic(a);
    } else {
      Body(a);
    }
    // Fused divides in its pass; pairwise and every deterministic plan in their one reduce over all
    // ranks (Step::average): no epilogue to count.
    const bool divides_in_reduce =
        a == Algorithm::kFused || (p_ > 1 && (a == Algorithm::kPairwise || (opt_.deterministic && IsReduction(c))));
    if (req_.op == ReduceOp::kAvg && IsReduction(c) && !divides_in_reduce)
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

}  // namespace cost_internal

using cost_internal::kInf;
using cost_internal::Model;

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

Prediction Predict(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                   const PlanOptions& options, const CostConstants& constants) {
  return Model(request, shape, options, constants).Run(algorithm);
}

double PredictSeconds(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                      const PlanOptions& options, const CostConstants& constants) {
  return Predict(algorithm, request, shape, options, constants).seconds;
}

std::string ExplainPrediction(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                              const PlanOptions& options, const CostConstants& constants) {
  return fmt::format("{}: {}", AlgorithmName(algorithm),
                     Predict(algorithm, request, shape, options, constants).ToString());
}

}  // namespace kizuna::collectives
