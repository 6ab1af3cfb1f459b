#include "collectives/plan/plan.h"

#include <algorithm>
#include <array>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/plan/shares.h"

namespace kizuna::collectives {
namespace {

constexpr std::array<std::string_view, kNumCollectives> kCollectiveNames = {
    "allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "send", "recv", "barrier"};
constexpr std::array<std::string_view, kNumAlgorithms> kAlgorithmNames = {"ring",
                                                                          "tree",
                                                                          "rhd",
                                                                          "rd",
                                                                          "pairwise",
                                                                          "p2p",
                                                                          "fused",
                                                                          "ina",
                                                                          "hier:pairwise/ring",
                                                                          "hier:pairwise/rd",
                                                                          "hier:fused/ring",
                                                                          "hier:fused/rd",
                                                                          "file",
                                                                          "torus",
                                                                          "cycles"};

std::string Lower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '_' || c == '-') continue;  // "all_reduce", "all-gather"
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
  }
  return out;
}

std::string SliceString(const Slice& s) {
  return fmt::format("{}[{}+{}]", BufferKindName(s.buffer), s.offset, s.count);
}

}  // namespace

std::string_view CollectiveName(Collective c) {
  auto i = static_cast<size_t>(c);
  return i < kCollectiveNames.size() ? kCollectiveNames[i] : "invalid";
}

std::optional<Collective> ParseCollective(std::string_view name) {
  const std::string n = Lower(name);
  for (size_t i = 0; i < kCollectiveNames.size(); ++i)
    if (n == kCollectiveNames[i]) return static_cast<Collective>(i);
  if (n == "sendrecv") return Collective::kSend;
  return std::nullopt;
}

bool IsReduction(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

bool HasRoot(Collective c) {
  return c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kSend || c == Collective::kRecv;
}

std::string_view AlgorithmName(Algorithm a) {
  auto i = static_cast<size_t>(a);
  return i < kAlgorithmNames.size() ? kAlgorithmNames[i] : "invalid";
}

std::optional<Algorithm> ParseAlgorithm(std::string_view name) {
  const std::string n = Lower(name);
  for (size_t i = 0; i < kAlgorithmNames.size(); ++i)
    if (n == kAlgorithmNames[i]) return static_cast<Algorithm>(i);
  if (n == "doublebinarytree" || n == "dbt") return Algorithm::kTree;
  if (n == "halvingdoubling" || n == "rabenseifner") return Algorithm::kRhd;
  if (n == "recursivedoubling") return Algorithm::kRd;
  if (n == "direct") return Algorithm::kPairwise;
  if (n == "onepass") return Algorithm::kFused;
  // `pina`, partial INA, is the same algorithm: the layout decides (docs/ALGORITHMS.md).
  if (n == "pina" || n == "innetwork") return Algorithm::kIna;
  // The inner level's other names (direct) and the default inner level (pairwise) left out.
  if (n == "hier:direct/ring" || n == "hier:ring" || n == "hier:/ring") return Algorithm::kHierRing;
  if (n == "hier:direct/rd" || n == "hier:rd" || n == "hier:/rd") return Algorithm::kHierRd;
  return std::nullopt;
}

uint32_t HostFusedParts(const CollectiveRequest& request, int widest_host) {
  const uint64_t bytes = request.count * DataTypeSize(request.dtype);
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(bytes / kHostLeaderPartBytes, 1, static_cast<uint64_t>(std::max(widest_host, 1))));
}

std::pair<uint64_t, uint64_t> HostPart(uint64_t count, uint32_t channels, uint32_t parts, uint32_t c, uint32_t j,
                                       const std::vector<uint64_t>& weights) {
  // algorithms/common.h's SplitEven, twice: the plan's channels, then the parts of each.
  auto split = [](uint64_t offset, uint64_t n, uint64_t k, uint64_t i) -> std::pair<uint64_t, uint64_t> {
    const uint64_t base = n / k, extra = n % k;
    return {offset + i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
  };
  const auto [o, n] = split(0, count, std::max<uint32_t>(channels, 1), c);
  if (weights.size() == parts && parts > 0 && j < parts) {
    const std::vector<uint64_t> bounds = WeightedBounds(n, std::vector<double>(weights.begin(), weights.end()));
    return {o + bounds[j], bounds[j + 1] - bounds[j]};
  }
  return split(o, n, std::max<uint32_t>(parts, 1), j);
}

uint64_t CollectiveRequest::input_count() const {
  const auto n = static_cast<uint64_t>(nranks);
  switch (collective) {
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return n * count;
    case Collective::kRecv:
    case Collective::kBarrier:
      return 0;
    default:
      return count;
  }
}

uint64_t CollectiveRequest::output_count() const {
  const auto n = static_cast<uint64_t>(nranks);
  switch (collective) {
    case Collective::kAllGather:
    case Collective::kAllToAll:
      return n * count;
    case Collective::kSend:
    case Collective::kBarrier:
      return 0;
    default:
      return count;
  }
}

std::string CollectiveRequest::ToString() const {
  std::string s = fmt::format("{} count={} {}", CollectiveName(collective), count, DataTypeName(dtype));
  if (IsReduction(collective)) s += fmt::format(" {}", ReduceOpName(op));
  if (collective == Collective::kSend || collective == Collective::kRecv)
    s += fmt::format(" peer={}", root);
  else if (HasRoot(collective))
    s += fmt::format(" root={}", root);
  if (in_place) s += " in-place";
  s += fmt::format(" nranks={}", nranks);
  return s;
}

std::string_view BufferKindName(BufferKind b) {
  switch (b) {
    case BufferKind::kInput:
      return "in";
    case BufferKind::kOutput:
      return "out";
    case BufferKind::kScratch:
      return "scratch";
  }
  return "invalid";
}

std::string_view StepKindName(StepKind k) {
  switch (k) {
    case StepKind::kSend:
      return "send";
    case StepKind::kRecv:
      return "recv";
    case StepKind::kRecvReduce:
      return "recv-reduce";
    case StepKind::kCopy:
      return "copy";
    case StepKind::kReduce:
      return "reduce";
    case StepKind::kScale:
      return "scale";
  }
  return "invalid";
}

bool Step::ConflictsWith(const Step& other) const {
  const bool writes = kind != StepKind::kSend;
  const bool other_writes = other.kind != StepKind::kSend;
  if (writes && other_writes && dst.Overlaps(other.dst)) return true;
  if (writes)
    for (const Slice& s : other.srcs)
      if (dst.Overlaps(s)) return true;
  if (other_writes)
    for (const Slice& s : srcs)
      if (other.dst.Overlaps(s)) return true;
  return false;
}

size_t RankPlan::step_count() const {
  size_t n = epilogue.size();
  for (const auto& c : channels) n += c.size();
  return n;
}

Status ValidateRankPlan(const CollectiveRequest& request, const RankPlan& plan, uint64_t max_step_count,
                        int aggregators) {
  const bool aggregator = plan.rank >= request.nranks;
  const uint64_t sizes[3] = {aggregator ? 0 : request.input_count(), aggregator ? 0 : request.output_count(),
                             plan.scratch_count};
  const int world = request.nranks + std::max(aggregators, 0);
  auto check_slice = [&](const Slice& s, std::string_view role) -> std::string {
    const auto b = static_cast<size_t>(s.buffer);
    if (b >= 3) return fmt::format("{} names no buffer", role);
    if (s.count > sizes[b] || s.offset > sizes[b] - s.count)
      return fmt::format("{} {} lies outside the {} buffer of {} elements", role, SliceString(s),
                         BufferKindName(s.buffer), sizes[b]);
    return {};
  };
  auto check_step = [&](const Step& step) -> std::string {
    const bool transfer =
        step.kind == StepKind::kSend || step.kind == StepKind::kRecv || step.kind == StepKind::kRecvReduce;
    if (transfer) {
      if (step.peer < 0 || step.peer >= world) return fmt::format("peer {} out of range", step.peer);
      if (step.peer == plan.rank) return "a transfer to the rank itself";
    } else if (step.peer != -1) {
      return "a local step with a peer";
    }
    size_t want_srcs = 1;
    if (step.kind == StepKind::kRecv) want_srcs = 0;
    if (step.kind == StepKind::kReduce) {
      if (step.srcs.size() < 2) return "a reduce with fewer than 2 sources";
    } else if (step.srcs.size() != want_srcs) {
      return fmt::format("{} sources where {} expected", step.srcs.size(), want_srcs);
    }
    for (const Slice& s : step.srcs) {
      if (std::string e = check_slice(s, "source"); !e.empty()) return e;
      if (step.kind != StepKind::kSend && s.count != step.dst.count)
        return fmt::format("source {} and destination {} differ in count", SliceString(s), SliceString(step.dst));
    }
    if (step.kind != StepKind::kSend) {
      if (std::string e = check_slice(step.dst, "destination"); !e.empty()) return e;
      const bool reduction = step.kind == StepKind::kRecvReduce || step.kind == StepKind::kReduce ||
                             step.kind == StepKind::kScale;
      for (const Slice& s : step.srcs)
        if (s.Overlaps(step.dst) && !(reduction && s == step.dst))
          return fmt::format("destination {} overlaps source {}", SliceString(step.dst), SliceString(s));
    }
    const uint64_t n = step.count();
    // Zero-element messages are how barriers synchronize; zero-element local work is a bug.
    if (n == 0 && step.kind != StepKind::kSend && step.kind != StepKind::kRecv) return "an empty step";
    if (max_step_count > 0 && n > max_step_count)
      return fmt::format("{} elements, more than the chunk of {}", n, max_step_count);
    if (step.kind == StepKind::kScale && plan.divisor == 0) return "a scale step with divisor 0";
    if (step.average) {
      if (step.kind != StepKind::kReduce) return "an averaging step that is not a reduce";
      if (!IsReduction(request.collective) || request.op != ReduceOp::kAvg)
        return "an averaging reduce in a request that is not an avg";
      if (step.srcs.size() != static_cast<size_t>(request.nranks))
        return fmt::format("an averaging reduce of {} sources, not the {} ranks' contributions", step.srcs.size(),
                           request.nranks);
    }
    return {};
  };
  for (size_t c = 0; c <= plan.channels.size(); ++c) {
    const bool epilogue = c == plan.channels.size();
    const std::vector<Step>& steps = epilogue ? plan.epilogue : plan.channels[c];
    for (size_t i = 0; i < steps.size(); ++i) {
      if (std::string e = check_step(steps[i]); !e.empty()) {
        return Internal(fmt::format("plan for {} rank {}: {} step {} ({}): {}", request.ToString(), plan.rank,
                                    epilogue ? std::string("epilogue") : fmt::format("channel {}", c), i,
                                    StepKindName(steps[i].kind), e));
      }
    }
  }
  if (const std::vector<uint64_t>& w = plan.host_part_weights; !w.empty()) {
    if (w.size() != plan.host_parts || std::find(w.begin(), w.end(), uint64_t{0}) != w.end())
      return Internal(
          fmt::format("plan for {} rank {}: {} host part weight(s) ({}) for {} host part(s): expected one "
                      "above 0 per part",
                      request.ToString(), plan.rank, w.size(), fmt::join(w, ", "), plan.host_parts));
  }
  if (const std::vector<uint64_t>& b = plan.fused_bounds; !b.empty()) {
    const uint64_t work = FusedWorkCount(request);
    const bool ordered = std::is_sorted(b.begin(), b.end());
    if (b.size() != static_cast<size_t>(request.nranks) + 1 || b.front() != 0 || b.back() != work || !ordered)
      return Internal(
          fmt::format("plan for {} rank {}: fused parts beginning at {} do not cut {} elements into {} "
                      "parts in order",
                      request.ToString(), plan.rank, fmt::join(b, ", "), work, request.nranks));
  }
  return Status::Ok();
}

uint64_t FusedWorkCount(const CollectiveRequest& request) {
  const bool blocks = request.collective == Collective::kReduceScatter || request.collective == Collective::kAllGather;
  return blocks ? request.count * static_cast<uint64_t>(request.nranks) : request.count;
}

std::string RankPlanToString(const RankPlan& plan) {
  std::string out = fmt::format("rank {}: {} steps, scratch {} elements\n", plan.rank, plan.step_count(),
                                plan.scratch_count);
  auto print = [&](const std::vector<Step>& steps, const std::string& label) {
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      out += fmt::format("  {} #{} {}", label, i, StepKindName(s.kind));
      if (s.peer >= 0) out += fmt::format(" peer={}", s.peer);
      if (s.kind != StepKind::kSend) out += " " + SliceString(s.dst);
      if (!s.srcs.empty()) {
        if (s.kind != StepKind::kSend) out += " <-";
        for (size_t j = 0; j < s.srcs.size(); ++j) out += (j ? ", " : " ") + SliceString(s.srcs[j]);
      }
      if (s.kind == StepKind::kScale) out += fmt::format(" / {}", plan.divisor);
      if (s.average) out += fmt::format(" / {}", s.srcs.size());
      out += "\n";
    }
  };
  // hier:fused's host level, which the executor runs around the steps.
  if (plan.host_parts > 0)
    out += fmt::format("  host level: {} part(s) per channel over {} channel(s)\n", plan.host_parts,
                       plan.host_channels);
  // ReduceScatter: summed over the host into dst; AllGather: copied from local rank `from`.
  for (const RankPlan::HostBlock& hb : plan.host_blocks)
    out += fmt::format("  host block {}: {} (local rank {})\n", hb.block, SliceString(hb.dst), hb.from);
  if (!plan.fused_bounds.empty()) out += fmt::format("  fused parts begin at {}\n", fmt::join(plan.fused_bounds, ", "));
  if (!plan.host_part_weights.empty())
    out += fmt::format("  host parts weighed {}\n", fmt::join(plan.host_part_weights, ", "));
  for (size_t c = 0; c < plan.channels.size(); ++c) print(plan.channels[c], fmt::format("c{}", c));
  print(plan.epilogue, "epilogue");
  return out;
}

std::string PlanToString(const Plan& plan) {
  std::string out = fmt::format("plan: {} algorithm={} chunk={} elements channels={}\n", plan.request.ToString(),
                                AlgorithmName(plan.algorithm), plan.chunk_count, plan.channels);
  if (plan.aggregators > 0)
    out += fmt::format("aggregation devices: ranks {}..{}\n", plan.request.nranks, plan.world() - 1);
  for (const RankPlan& r : plan.ranks) out += RankPlanToString(r);
  return out;
}

}  // namespace kizuna::collectives
