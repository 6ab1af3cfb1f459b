#include "tools/sim/symmetry.h"

#include <algorithm>

#include <fmt/format.h>

namespace kizuna::sim {

RankGroup::RankGroup(Op op, int unit, std::vector<int> dims)
    : op_(op), unit_(unit), blocks_(1), dims_(std::move(dims)) {
  for (int d : dims_) blocks_ *= d;
}

std::string RankGroup::Describe() const {
  std::string shape;
  for (int d : dims_) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  return fmt::format("{} blocks of {} rank(s) {}", blocks_, unit_,
                     op_ == Op::kXor ? "relabelled by XOR" : fmt::format("shifted along {}", shape));
}

int RankGroup::ApplyBlock(int e, int b) const {
  if (op_ == Op::kXor) return b ^ e;
  int out = 0, stride = 1;
  for (int d : dims_) {
    out += ((b % d + e % d) % d) * stride;
    b /= d;
    e /= d;
    stride *= d;
  }
  return out;
}

int RankGroup::Inverse(int e) const {
  if (op_ == Op::kXor) return e;
  int out = 0, stride = 1;
  for (int d : dims_) {
    out += ((d - e % d) % d) * stride;
    e /= d;
    stride *= d;
  }
  return out;
}

std::vector<int> RankGroup::Generators() const {
  std::vector<int> gens;
  if (op_ == Op::kXor) {
    for (int bit = 1; bit < blocks_; bit <<= 1) gens.push_back(bit);
    return gens;
  }
  int stride = 1;
  for (int d : dims_) {
    if (d > 1) gens.push_back(stride);
    stride *= d;
  }
  return gens;
}

namespace {

bool IsTransfer(const collectives::Step& s) {
  using collectives::StepKind;
  return s.kind == StepKind::kSend || s.kind == StepKind::kRecv || s.kind == StepKind::kRecvReduce;
}

// Whether `moved` is `base` (rank r's plan) moved by e: the same steps, peers mapped.
bool Commutes(const RankGroup& g, int e, const collectives::RankPlan& base, const collectives::RankPlan& moved) {
  if (base.channels.size() != moved.channels.size() || base.epilogue.size() != moved.epilogue.size()) return false;
  for (size_t c = 0; c < base.channels.size(); ++c) {
    const auto& a = base.channels[c];
    const auto& b = moved.channels[c];
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].kind != b[i].kind || a[i].count() != b[i].count() || a[i].srcs.size() != b[i].srcs.size()) return false;
      if (IsTransfer(a[i]) && g.Apply(e, a[i].peer) != b[i].peer) return false;
    }
  }
  return true;
}

}  // namespace

namespace {

// The elements checked: the generators, and `samples` more at 1/(samples+1), 2/(samples+1), ... of
// the group's order, odd ones, so that XOR groups see high bits set together.
std::vector<int> Checked(const RankGroup& group, int samples) {
  std::vector<int> elements;
  for (int e : group.Generators())
    if (e > 0 && e < group.order()) elements.push_back(e);
  for (int s = 1; s <= samples && group.order() > 2; ++s) {
    const int e = static_cast<int>((static_cast<int64_t>(group.order()) * s) / (samples + 1)) | 1;
    if (e < group.order()) elements.push_back(e);
  }
  return elements;
}

}  // namespace

std::vector<int> CheckedRanks(const RankGroup& group, int samples) {
  std::vector<int> ranks;
  for (int local = 0; local < group.unit(); ++local) ranks.push_back(local);
  for (int e : Checked(group, samples))
    for (int local = 0; local < group.unit(); ++local) ranks.push_back(group.Apply(e, local));
  std::sort(ranks.begin() + group.unit(), ranks.end());
  ranks.erase(std::unique(ranks.begin() + group.unit(), ranks.end()), ranks.end());
  return ranks;
}

bool PlanIsInvariant(const RankGroup& group, const std::function<const collectives::RankPlan&(int rank)>& plan_of,
                     int samples) {
  for (int e : Checked(group, samples))
    for (int local = 0; local < group.unit(); ++local)
      if (!Commutes(group, e, plan_of(local), plan_of(group.Apply(e, local)))) return false;
  return true;
}

}  // namespace kizuna::sim
