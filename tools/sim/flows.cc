#include "tools/sim/flows.h"

#include <algorithm>
#include <limits>

namespace kizuna::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// A flow that crosses no link (a rank to itself through no switch) moves at once.
constexpr double kUnlimited = 1e30;

}  // namespace

FlowTable::FlowTable(const Network& net, bool fifo)
    : net_(net),
      fifo_(fifo),
      on_link_(net.links().size()),
      link_sum_(net.links().size(), 0),
      link_bytes_(net.links().size(), 0),
      bound_(net.links().size(), 0),
      link_pass_(net.links().size(), 0),
      constraint_pass_(net.links().size(), 0),
      left_(net.links().size(), 0),
      weight_(net.links().size(), 0) {}

size_t FlowTable::Add(double now, double bytes, const Load* load, uint64_t seq) {
  size_t id = flows_.size();
  if (free_.empty()) {
    flows_.emplace_back();
    flow_pass_.push_back(0);
  } else {
    id = free_.back();
    free_.pop_back();
  }
  Flow& f = flows_[id];
  f.load = load;
  f.remaining = bytes;
  f.rate = 0;
  f.t_set = now;
  f.seq = seq;
  ++f.version;
  f.active = true;
  f.capmin = kUnlimited;
  for (const auto& [l, w] : *load) f.capmin = std::min(f.capmin, net_.links()[static_cast<size_t>(l)].gbps * 1e9);
  f.pos.clear();
  for (const auto& [l, w] : *load) {
    auto& on = on_link_[static_cast<size_t>(l)];
    f.pos.push_back(static_cast<uint32_t>(on.size()));
    on.push_back(id);
    link_sum_[static_cast<size_t>(l)] += w * f.capmin;
  }
  ++active_;
  added_.push_back(id);
  return id;
}

void FlowTable::Settle(size_t id, double now) {
  Flow& f = flows_[id];
  const double moved = std::min(f.remaining, f.rate * (now - f.t_set));
  if (moved > 0) {
    f.remaining -= moved;
    for (const auto& [l, w] : *f.load) link_bytes_[static_cast<size_t>(l)] += moved * w;
  }
  f.t_set = now;
}

void FlowTable::Remove(size_t id) {
  Flow& f = flows_[id];
  for (size_t i = 0; i < f.load->size(); ++i) {
    const auto [l, w] = (*f.load)[i];
    auto& on = on_link_[static_cast<size_t>(l)];
    const size_t moved = on.back();
    on[f.pos[i]] = moved;
    on.pop_back();
    if (moved != id) {  // the flow moved into the hole: its entry for this link points there now
      Flow& m = flows_[moved];
      for (size_t j = 0; j < m.load->size(); ++j)
        if ((*m.load)[j].first == l) m.pos[j] = f.pos[i];
    }
    link_sum_[static_cast<size_t>(l)] -= w * f.capmin;
    touched_links_.push_back(l);
  }
  f.active = false;
  ++f.version;
  --active_;
  free_.push_back(id);
}

void FlowTable::Schedule(size_t id, double now) {
  Flow& f = flows_[id];
  ++f.version;
  if (f.rate > 0) ends_.emplace(now + f.remaining / f.rate, id, f.version);
}

double FlowTable::NextEnd() {
  while (!ends_.empty()) {
    const auto& [t, id, version] = ends_.top();
    if (flows_[id].active && flows_[id].version == version) return t;
    ends_.pop();
  }
  return kInf;
}

std::vector<size_t> FlowTable::TakeEnded(double now) {
  std::vector<size_t> ended;
  while (NextEnd() <= now + 1e-9) {
    const size_t id = std::get<1>(ends_.top());
    ends_.pop();
    Settle(id, std::max(now, flows_[id].t_set + flows_[id].remaining / flows_[id].rate));
    ended.push_back(id);
    Remove(id);
  }
  return ended;
}

bool FlowTable::Binding(int l) const {
  return link_sum_[static_cast<size_t>(l)] > net_.links()[static_cast<size_t>(l)].gbps * 1e9 * (1 + 1e-9);
}

void FlowTable::Share(double now) {
  if (added_.empty() && touched_links_.empty()) return;
  if (fifo_) {
    FifoShare(now);
  } else {
    FairShare(now);
  }
  added_.clear();
  touched_links_.clear();
}

// The flows whose rates may change: those added, those on the links where flows came or went
// (where such a link binds now or did), and, transitively, those on the binding links of these.
// Max-min fair shares of flows joined by no binding link do not depend on each other.
void FlowTable::FairShare(double now) {
  ++pass_;
  std::vector<size_t> group;
  std::vector<int> queue, constraints;
  auto visit_link = [&](int l, bool seed) {
    const auto li = static_cast<size_t>(l);
    if (link_pass_[li] == pass_) return;
    link_pass_[li] = pass_;
    const bool binds = Binding(l);
    if (binds || (seed && bound_[li])) queue.push_back(l);
    bound_[li] = binds;
    if (binds) {
      constraint_pass_[li] = pass_;
      constraints.push_back(l);
    }
  };
  auto visit_flow = [&](size_t id) {
    if (!flows_[id].active || flow_pass_[id] == pass_) return;
    flow_pass_[id] = pass_;
    group.push_back(id);
    for (const auto& [l, w] : *flows_[id].load) visit_link(l, false);
  };
  for (int l : touched_links_) visit_link(l, true);
  for (size_t id : added_) visit_flow(id);
  for (size_t q = 0; q < queue.size(); ++q)
    for (size_t id : on_link_[static_cast<size_t>(queue[q])]) visit_flow(id);

  // Progressive filling over the group: every unfrozen flow's rate grows alike until a binding
  // link fills or the flow reaches its route's slowest link.
  for (int l : constraints) {
    left_[static_cast<size_t>(l)] = net_.links()[static_cast<size_t>(l)].gbps * 1e9;
    weight_[static_cast<size_t>(l)] = 0;
  }
  for (size_t id : group) {
    Settle(id, now);
    flows_[id].rate = 0;
    for (const auto& [l, w] : *flows_[id].load)
      if (constraint_pass_[static_cast<size_t>(l)] == pass_) weight_[static_cast<size_t>(l)] += w;
  }
  std::vector<size_t> unfrozen = group, still;
  while (!unfrozen.empty()) {
    double inc = kInf;
    for (int l : constraints)
      if (weight_[static_cast<size_t>(l)] > 1e-12)
        inc = std::min(inc, left_[static_cast<size_t>(l)] / weight_[static_cast<size_t>(l)]);
    for (size_t id : unfrozen) inc = std::min(inc, flows_[id].capmin - flows_[id].rate);
    inc = std::max(inc, 0.0);
    still.clear();
    for (size_t id : unfrozen) {
      Flow& f = flows_[id];
      f.rate += inc;
      for (const auto& [l, w] : *f.load)
        if (constraint_pass_[static_cast<size_t>(l)] == pass_) left_[static_cast<size_t>(l)] -= inc * w;
    }
    for (size_t id : unfrozen) {
      const Flow& f = flows_[id];
      bool frozen = f.rate >= f.capmin * (1 - 1e-9);
      for (const auto& [l, w] : *f.load)
        frozen = frozen || (constraint_pass_[static_cast<size_t>(l)] == pass_ &&
                            left_[static_cast<size_t>(l)] <= net_.links()[static_cast<size_t>(l)].gbps * 1e9 * 1e-9);
      if (!frozen) {
        still.push_back(id);
        continue;
      }
      for (const auto& [l, w] : *f.load)
        if (constraint_pass_[static_cast<size_t>(l)] == pass_) weight_[static_cast<size_t>(l)] -= w;
    }
    unfrozen.swap(still);
  }
  for (size_t id : group) Schedule(id, now);
}

// FIFO links: a flow moves, at its route's slowest link, only while it is the oldest active flow
// on every link of its route. Recomputed over every flow (the shaped direct-connect networks this
// stands for are small).
void FlowTable::FifoShare(double now) {
  std::vector<size_t> order;
  for (size_t id = 0; id < flows_.size(); ++id)
    if (flows_[id].active) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return flows_[a].seq < flows_[b].seq; });
  ++pass_;
  for (size_t id : order) {
    Flow& f = flows_[id];
    Settle(id, now);
    bool head = true;
    for (const auto& [l, w] : *f.load) head = head && link_pass_[static_cast<size_t>(l)] != pass_;
    for (const auto& [l, w] : *f.load) link_pass_[static_cast<size_t>(l)] = pass_;
    f.rate = head ? f.capmin : 0;
    Schedule(id, now);
  }
}

}  // namespace kizuna::sim
