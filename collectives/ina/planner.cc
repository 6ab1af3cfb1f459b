#include "collectives/ina/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

namespace kizuna::collectives::ina {
namespace {

// Values are bandwidths × 2(N − 1): a tree-like part's 1 is 2(N − 1), a ring's N/(2(N − 1)) is N.
int64_t TreeValue(const Problem& p) { return 2 * (int64_t{p.workers} - 1); }

Item FullTreeItem(const Problem& p) {
  return {PartKind::kFullTree, FullTreeAggregators(p.workers, p.aggregator_ports), p.workers, TreeValue(p)};
}
// k = 0 is the line: a chain of workers is a partial tree with no device and two chain ends.
Item PartialItem(const Problem& p, int k) {
  const int64_t chains = int64_t{k} * (p.aggregator_ports - 2) + 2;
  return {k == 0 ? PartKind::kLine : PartKind::kPartialTree, k, 2 * int64_t{p.workers} - chains, TreeValue(p)};
}
Item RingItem(const Problem& p) { return {PartKind::kRing, 0, p.workers, p.workers}; }

// The optimum's order: more value, then fewer devices, then fewer ports.
struct Key {
  int64_t value = 0, aggregators = 0, ports = 0;
  bool BetterThan(const Key& o) const {
    if (value != o.value) return value > o.value;
    if (aggregators != o.aggregators) return aggregators < o.aggregators;
    return ports < o.ports;
  }
};

// The items the DP keeps, in the caller's order: those that fit and that no other item dominates
// (no more devices, no more ports, no less value; of identical items the first). In the order of
// devices, then ports, a dominating item comes first, so one sweep with a prefix minimum of ports
// over the values seen (a Fenwick tree over value ranks) finds them in O(n log n): a model with
// 65534 partial trees (N = 65536, E = 3) costs milliseconds.
std::vector<size_t> Useful(const std::vector<Item>& items, int64_t aggregators, int64_t ports) {
  std::vector<size_t> fit;
  for (size_t j = 0; j < items.size(); ++j) {
    const Item& b = items[j];
    if (b.worker_ports > 0 && b.value > 0 && b.aggregators <= aggregators && b.worker_ports <= ports) fit.push_back(j);
  }
  std::vector<size_t> order = fit;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    const Item &a = items[x], &b = items[y];
    if (a.aggregators != b.aggregators) return a.aggregators < b.aggregators;
    if (a.worker_ports != b.worker_ports) return a.worker_ports < b.worker_ports;
    return a.value > b.value;
  });
  std::vector<int64_t> values;
  for (size_t j : fit) values.push_back(items[j].value);
  std::sort(values.begin(), values.end(), std::greater<>());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  // fewest[r]: the fewest ports of an item seen so far whose value ranks r or better (1-based tree).
  std::vector<int64_t> fewest(values.size() + 1, std::numeric_limits<int64_t>::max());
  std::vector<bool> dominated(items.size(), false);
  for (size_t j : order) {
    const size_t rank =
        static_cast<size_t>(std::lower_bound(values.begin(), values.end(), items[j].value, std::greater<>()) -
                            values.begin()) + 1;
    int64_t best = std::numeric_limits<int64_t>::max();
    for (size_t r = rank; r > 0; r -= r & (~r + 1)) best = std::min(best, fewest[r]);
    dominated[j] = best <= items[j].worker_ports;
    for (size_t r = rank; r < fewest.size(); r += r & (~r + 1)) fewest[r] = std::min(fewest[r], items[j].worker_ports);
  }
  std::vector<size_t> keep;
  for (size_t j : fit)
    if (!dominated[j]) keep.push_back(j);
  return keep;
}

DpStats Size(const std::vector<Item>& items, const std::vector<size_t>& keep, int64_t aggregators, int64_t ports) {
  DpStats st;
  st.items = static_cast<int>(keep.size());
  if (keep.empty()) return st;
  int64_t g = 0, fewest = std::numeric_limits<int64_t>::max(), most_devices = 0;
  for (size_t i : keep) {
    g = std::gcd(g, items[i].worker_ports);
    fewest = std::min(fewest, items[i].worker_ports);
    most_devices = std::max<int64_t>(most_devices, items[i].aggregators);
  }
  st.gcd = g;
  st.rows = std::min(aggregators, (ports / fewest) * most_devices) + 1;
  st.columns = ports / g + 1;
  return st;
}

template <typename V>
Selection RunDp(const std::vector<Item>& items, const std::vector<size_t>& keep, const DpStats& st) {
  const int64_t R = st.rows, C = st.columns;
  std::vector<V> t(static_cast<size_t>(R * C), 0);  // t[a*C + p]: best value with <= a devices, <= p·gcd ports
  for (size_t i : keep) {
    const int64_t ai = items[i].aggregators, wi = items[i].worker_ports / st.gcd;
    const V vi = static_cast<V>(items[i].value);
    for (int64_t a = ai; a < R; ++a) {
      V* row = t.data() + a * C;
      if (ai == 0) {
        // In place, ascending: t[a][p - wi] already counts copies of this item (unbounded).
        for (int64_t p = wi; p < C; ++p) row[p] = std::max(row[p], static_cast<V>(row[p - wi] + vi));
      } else {
        // A lower row, already final for this item: no overlap, so the loop vectorizes.
        const V* __restrict src = t.data() + (a - ai) * C;
        V* __restrict dst = row;
        for (int64_t p = wi; p < C; ++p) dst[p] = std::max(dst[p], static_cast<V>(src[p - wi] + vi));
      }
    }
  }
  // t is monotone in both budgets, so the fewest devices reaching the best value, then the fewest
  // ports at that many devices, are exactly what an optimal multiset with those ties uses.
  const V best = t[static_cast<size_t>(R * C - 1)];
  int64_t a = 0, p = 0;
  while (t[static_cast<size_t>(a * C + C - 1)] != best) ++a;
  while (t[static_cast<size_t>(a * C + p)] != best) ++p;
  std::vector<int> count(items.size(), 0);
  while (t[static_cast<size_t>(a * C + p)] > 0) {
    const V here = t[static_cast<size_t>(a * C + p)];
    bool found = false;
    for (size_t i : keep) {
      const int64_t ai = items[i].aggregators, wi = items[i].worker_ports / st.gcd;
      if (ai > a || wi > p || t[static_cast<size_t>((a - ai) * C + p - wi)] + items[i].value != here) continue;
      ++count[i];
      a -= ai;
      p -= wi;
      found = true;
      break;
    }
    if (!found) break;  // unreachable: some item always explains a positive entry
  }
  Selection s;
  for (size_t i = 0; i < items.size(); ++i)
    if (count[i] > 0) s.picks.push_back({items[i], count[i]});
  for (const Pick& pk : s.picks) {
    s.value += pk.item.value * pk.count;
    s.aggregators += int64_t{pk.item.aggregators} * pk.count;
    s.worker_ports += pk.item.worker_ports * pk.count;
  }
  return s;
}

Selection FromCounts(const Problem& p, int full, int others, int64_t devices, int rings) {
  Selection s;
  if (full > 0) s.picks.push_back({FullTreeItem(p), full});
  if (others > 0) {
    // Evenly: `extra` parts with base + 1 devices, the rest with base (0: lines).
    const int base = static_cast<int>(devices / others), extra = static_cast<int>(devices % others);
    if (extra > 0) s.picks.push_back({PartialItem(p, base + 1), extra});
    if (others - extra > 0) s.picks.push_back({PartialItem(p, base), others - extra});
  }
  if (rings > 0) s.picks.push_back({RingItem(p), rings});
  for (const Pick& pk : s.picks) {
    s.value += pk.item.value * pk.count;
    s.aggregators += int64_t{pk.item.aggregators} * pk.count;
    s.worker_ports += pk.item.worker_ports * pk.count;
  }
  return s;
}

// Balanced ports, the invariant BuildLayout keeps: before a part, every worker has used L or L+1
// ports (max − min <= 1). A part gives every worker degree 1 or 2 (a ring: 1 everywhere, s = 0),
// and its s degree-2 roles go to the s workers with the fewest ports used. Adding 1 to everyone
// keeps the loads in {L+1, L+2}. If s is at most the number of workers at L+1, those s move to L+2
// and the loads stay in {L+1, L+2}; otherwise every worker at L+1 moves to L+2 and the rest of the
// s go to L+3, so the loads are in {L+2, L+3}. Either way max − min <= 1 again, which starts true
// (all 0), so it holds after every part. Then the largest load is ⌈(ports used)/N⌉ <= D whenever
// the total is at most N·D: the knapsack's total-ports constraint is exact.
// Up to this many workers, BuildLayout searches chain and ring orders in which no worker pair
// carries two parts (the transport carries a pair's traffic over one connection, so two parts on
// one pair would share its bandwidth); each search stops after kPairSearchSteps expansions.
constexpr int kPairSearchWorkers = 512;
constexpr int64_t kPairSearchSteps = 200000;

class LayoutBuilder {
 public:
  LayoutBuilder(const Problem& p, const WorkerSpeeds& speeds)
      : p_(p),
        speeds_(speeds),
        load_(static_cast<size_t>(p.workers), 0),
        unordered_(static_cast<size_t>(p.workers), 0),
        directed_(static_cast<size_t>(p.workers), 0) {
    if (p.workers <= kPairSearchWorkers)
      pair_used_.assign(static_cast<size_t>(p.workers) * static_cast<size_t>(p.workers), 0);
    layout_.workers = p.workers;
    layout_.aggregators = p.aggregators;
    layout_.worker_ports = p.worker_ports;
    layout_.aggregator_ports = p.aggregator_ports;
  }

  void Add(const Item& item) {
    const int n = p_.workers;
    Part part;
    part.kind = item.kind;
    part.bandwidth = item.bandwidth(n);
    part.aggregators = item.aggregators;
    part.worker_ports = static_cast<int>(item.worker_ports);
    // Degree-2 roles (a chain's inner workers: they reduce) to the least-used workers; among
    // those, the fastest (ties: lower index).
    const size_t twos = static_cast<size_t>(item.worker_ports - n);
    std::vector<int> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const WorkerSpeeds& speed = speeds_;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      if (load_[a] != load_[b]) return load_[a] < load_[b];
      return !speed.empty() && speed[static_cast<size_t>(a)] > speed[static_cast<size_t>(b)];
    });
    deg2_.assign(order.begin(), order.begin() + static_cast<long>(twos));
    deg1_.assign(order.begin() + static_cast<long>(twos), order.end());
    next2_ = next1_ = 0;
    switch (item.kind) {
      case PartKind::kFullTree:
      case PartKind::kPartialTree:
        AddTree(part, item.aggregators);
        break;
      case PartKind::kLine:
        AddLine(part);
        break;
      case PartKind::kRing:
        AddRing(part);
        break;
    }
    layout_.parts.push_back(std::move(part));
  }

  Layout Finish() { return std::move(layout_); }
  const std::vector<int>& load() const { return load_; }

 private:
  int Take(int worker) { return load_[static_cast<size_t>(worker)]++; }
  int One() { return deg1_[next1_++]; }
  int Two() { return deg2_[next2_++]; }
  // The next worker of a role for a chain behind `parent`: the first not yet taken whose cable to
  // a worker parent no earlier part uses (else the next in order).
  int OneAvoiding(const Node& parent) { return Avoiding(deg1_, next1_, parent); }
  int TwoAvoiding(const Node& parent) { return Avoiding(deg2_, next2_, parent); }
  int Avoiding(std::vector<int>& role, size_t& next, const Node& parent) {
    if (!parent.aggregator())
      for (size_t j = next; j < role.size(); ++j)
        if (!PairUsed(role[j], parent.index) && !PairUsed(parent.index, role[j])) {
          std::swap(role[next], role[j]);
          break;
        }
    return role[next++];
  }

  // Devices as a complete tree in breadth-first order (the root first: the tree's centre), so
  // that device j hangs on the (j−1)-th free port; workers take the remaining ports in the same
  // order. The root's ports 0..E−1 are all children; another device's port 0 is its parent.
  void AddTree(Part& part, int k) {
    const int first = next_aggregator_;
    next_aggregator_ += k;
    std::vector<std::pair<int, int>> slots;  // (device, port), breadth first
    for (int port = 0; port < p_.aggregator_ports; ++port) slots.push_back({first, port});
    for (int j = 1; j < k; ++j) {
      const auto [dev, port] = slots[static_cast<size_t>(j - 1)];
      part.edges.push_back({Node::Aggregator(first + j), 0, Node::Aggregator(dev), port});
      for (int q = 1; q < p_.aggregator_ports; ++q) slots.push_back({first + j, q});
    }
    part.root = Node::Aggregator(first);
    const size_t free0 = static_cast<size_t>(k - 1);
    const int n = p_.workers;
    if (part.kind == PartKind::kFullTree) {
      // T is the fewest devices with N free ports, so the last device keeps at least two workers.
      for (int w = 0; w < n; ++w) {
        const auto [dev, port] = slots[free0 + static_cast<size_t>(w)];
        part.edges.push_back({Node::Worker(w), Take(w), Node::Aggregator(dev), port});
      }
      return;
    }
    // c chains as even as possible, the longer ones on the shallower ports; a chain's last worker
    // has degree 1, the others 2.
    const int c = static_cast<int>(slots.size() - free0);
    for (int chain = 0; chain < c; ++chain) {
      const int length = n / c + (chain < n % c ? 1 : 0);
      const auto [dev, port] = slots[free0 + static_cast<size_t>(chain)];
      Node parent = Node::Aggregator(dev);
      int parent_port = port;
      for (int i = 0; i < length; ++i) {
        const int w = i + 1 == length ? OneAvoiding(parent) : TwoAvoiding(parent);
        const int up = Take(w);
        part.edges.push_back({Node::Worker(w), up, parent, parent.aggregator() ? parent_port : Take(parent.index)});
        Cabled(Node::Worker(w), parent);
        parent = Node::Worker(w);
      }
    }
  }

  // The chain's two ends have degree 1; the root is the middle worker, so its depth is ~N/2.
  void AddLine(Part& part) {
    const int n = p_.workers;
    std::vector<int> chain(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) chain[static_cast<size_t>(i)] = (i == 0 || i == n - 1) ? One() : Two();
    // The same ends and inner workers in an order whose cables no earlier part uses, if any.
    if (n > 2) {
      std::vector<int> inner(chain.begin() + 1, chain.end() - 1);
      if (std::vector<int> found = SearchPath(inner, chain.front(), chain.back(), false, true); !found.empty())
        chain = std::move(found);
    }
    const int mid = (n - 1) / 2;
    part.root = Node::Worker(chain[static_cast<size_t>(mid)]);
    auto link = [&](int child_pos, int parent_pos) {
      const int c = chain[static_cast<size_t>(child_pos)], q = chain[static_cast<size_t>(parent_pos)];
      const int cp = Take(c);
      part.edges.push_back({Node::Worker(c), cp, Node::Worker(q), Take(q)});
      Cabled(Node::Worker(c), Node::Worker(q));
    };
    for (int i = mid - 1; i >= 0; --i) link(i, i + 1);
    for (int i = mid + 1; i < n; ++i) link(i, i - 1);
  }

  // Cables between workers, counted by the difference of their indices (b − a mod N): what
  // AddRing compares against. A tree's cable is duplex, so it counts in both directions.
  size_t Class(int64_t d) const { return static_cast<size_t>(std::min<int64_t>(d, p_.workers - d)); }
  void Cabled(const Node& a, const Node& b) {
    if (a.aggregator() || b.aggregator()) return;
    MarkPair(a.index, b.index);
    MarkPair(b.index, a.index);
    const int n = p_.workers, d = ((b.index - a.index) % n + n) % n;
    ++unordered_[Class(d)];
    ++directed_[static_cast<size_t>(d)];
    ++directed_[static_cast<size_t>((n - d) % n)];
  }

  bool PairUsed(int a, int b) const {
    return !pair_used_.empty() &&
           pair_used_[static_cast<size_t>(a) * static_cast<size_t>(p_.workers) + static_cast<size_t>(b)];
  }
  void MarkPair(int a, int b) {
    if (!pair_used_.empty())
      pair_used_[static_cast<size_t>(a) * static_cast<size_t>(p_.workers) + static_cast<size_t>(b)] = 1;
  }

  // A path through `middle` (any order) from `first` to `last` (either may be -1: free), or a
  // cycle when `cycle`, whose consecutive pairs are all unused (both directions when `duplex`):
  // depth-first, trying candidates in index order, bounded by kPairSearchSteps expansions.
  // Empty when none was found within the bound (the caller keeps its own order then).
  std::vector<int> SearchPath(std::vector<int> pool, int first, int last, bool cycle, bool duplex) const {
    if (pair_used_.empty()) return {};
    const size_t n = pool.size() + (first >= 0 ? 1 : 0) + (last >= 0 ? 1 : 0);
    std::sort(pool.begin(), pool.end());
    std::vector<int> path;
    std::vector<char> taken(pool.size(), 0);
    int64_t steps = 0;
    auto ok = [&](int a, int b) { return !PairUsed(a, b) && (!duplex || !PairUsed(b, a)); };
    std::function<bool()> extend = [&]() -> bool {
      if (++steps > kPairSearchSteps) return false;
      if (path.size() == n - (last >= 0 ? 1 : 0)) {
        if (last >= 0 && !ok(path.back(), last)) return false;
        if (cycle && !ok(last >= 0 ? last : path.back(), path.front())) return false;
        return true;
      }
      for (size_t i = 0; i < pool.size(); ++i) {
        if (taken[i] || (!path.empty() && !ok(path.back(), pool[i]))) continue;
        taken[i] = 1;
        path.push_back(pool[i]);
        if (extend()) return true;
        path.pop_back();
        taken[i] = 0;
        if (steps > kPairSearchSteps) return false;
      }
      return false;
    };
    if (first >= 0) path.push_back(first);
    if (!extend()) return {};
    if (last >= 0) path.push_back(last);
    return path;
  }

  // A ring in the order 0, s, 2s, ... (mod N) for a stride s coprime to N: one cycle through every
  // worker, each giving it its next free port. The transport carries a pair of workers' traffic
  // over the first link between them (collectives/transport/transport.cc, one per direction), so parts that
  // cable the same pair would share it: each ring takes the stride whose circuits repeat the fewest
  // pairs cabled so far in either direction, then the fewest in its own direction, then the
  // smallest. Strides of different classes (s and N − s are one class) share no pair, so rings
  // meet only once the φ(N)/2 classes run out (N = 6 has one) or where the trees' chains took a
  // class.
  void AddRing(Part& part) {
    const int n = p_.workers;
    if (strides_.empty())
      for (int s = 1; s < n; ++s)
        if (std::gcd(s, n) == 1) strides_.push_back(s);
    int best = strides_[0];
    std::pair<int64_t, int64_t> cost{std::numeric_limits<int64_t>::max(), 0};
    for (int s : strides_) {
      const std::pair<int64_t, int64_t> c{unordered_[Class(s)], directed_[static_cast<size_t>(s)]};
      if (c < cost) cost = c, best = s;
    }
    std::vector<int> order;
    for (int i = 0, w = 0; i < n; ++i, w = static_cast<int>((int64_t{w} + best) % n)) order.push_back(w);
    // Where every stride repeats a pair (N = 6 has one class), search for a cycle that does not.
    bool repeats = false;
    for (int i = 0; i < n; ++i)
      repeats |= PairUsed(order[static_cast<size_t>(i)], order[static_cast<size_t>((i + 1) % n)]);
    if (repeats) {
      std::vector<int> rest(order.begin() + 1, order.end());
      if (std::vector<int> found = SearchPath(rest, 0, -1, true, false); !found.empty()) order = std::move(found);
    }
    for (int i = 0; i < n; ++i) {
      const int w = order[static_cast<size_t>(i)];
      part.ring.push_back(w);
      part.ring_ports.push_back(Take(w));
      MarkPair(w, order[static_cast<size_t>((i + 1) % n)]);
    }
    unordered_[Class(best)] += n;
    directed_[static_cast<size_t>(best)] += n;
  }

  const Problem& p_;
  const WorkerSpeeds& speeds_;  // empty: all alike
  Layout layout_;
  std::vector<int> load_;
  std::vector<int> deg1_, deg2_;
  size_t next1_ = 0, next2_ = 0;
  int next_aggregator_ = 0;
  std::vector<int64_t> unordered_, directed_;  // worker-to-worker cables by class / difference
  std::vector<int> strides_;                   // 1..N−1 coprime to N, once a ring needs them
  // Which ordered worker pairs carry a part already (a duplex cable marks both directions), for
  // jobs up to kPairSearchWorkers: chains and rings are searched so that no pair carries two parts.
  std::vector<char> pair_used_;
};

}  // namespace

Status CheckProblem(const Problem& p) {
  if (p.workers < 2 || p.workers > kMaxWorkers)
    return InvalidArgument(fmt::format("{} workers: expected 2..{}", p.workers, kMaxWorkers));
  if (p.worker_ports < 1 || p.worker_ports > kMaxPlannerPorts)
    return InvalidArgument(fmt::format("{} ports per worker: expected 1..{}", p.worker_ports, kMaxPlannerPorts));
  if (p.aggregators < 0 || p.aggregators > kMaxAggregators)
    return InvalidArgument(fmt::format("{} aggregation devices: expected 0..{}", p.aggregators, kMaxAggregators));
  if (p.aggregator_ports < 3 || p.aggregator_ports > kMaxPortsPerNode)
    return InvalidArgument(fmt::format("{} ports per aggregation device: expected 3..{} (a device in a tree needs a "
                                       "parent and two children)",
                                       p.aggregator_ports, kMaxPortsPerNode));
  if (int64_t{p.workers} * p.worker_ports + int64_t{p.aggregators} * p.aggregator_ports > kMaxLayoutPorts)
    return InvalidArgument(fmt::format("{} x {} worker ports and {} x {} aggregation device ports: more than {} ports",
                                       p.workers, p.worker_ports, p.aggregators, p.aggregator_ports, kMaxLayoutPorts));
  return Status::Ok();
}

Status CheckWorkerSpeeds(const Problem& p, const WorkerSpeeds& speeds) {
  if (speeds.empty()) return Status::Ok();
  if (speeds.size() != static_cast<size_t>(p.workers))
    return InvalidArgument(
        fmt::format("{} worker speeds for {} workers: give one per worker", speeds.size(), p.workers));
  for (size_t i = 0; i < speeds.size(); ++i)
    if (!(speeds[i] > 0) || !std::isfinite(speeds[i]))
      return InvalidArgument(fmt::format("worker {}'s speed {}: expected a finite number above 0", i, speeds[i]));
  return Status::Ok();
}

int FullTreeAggregators(int workers, int aggregator_ports) {
  if (workers <= aggregator_ports) return 1;
  return (workers - 2 + aggregator_ports - 3) / (aggregator_ports - 2);
}

std::vector<Item> EnumerateItems(const Problem& p) {
  std::vector<Item> items = {FullTreeItem(p)};
  for (int k = FullTreeAggregators(p.workers, p.aggregator_ports) - 1; k >= 1; --k) items.push_back(PartialItem(p, k));
  items.push_back(PartialItem(p, 0));
  items.push_back(RingItem(p));
  return items;
}

int Selection::parts() const {
  int n = 0;
  for (const Pick& pk : picks) n += pk.count;
  return n;
}

std::string_view SolverName(Solver s) {
  switch (s) {
    case Solver::kAuto:
      return "auto";
    case Solver::kDp:
      return "dp";
    case Solver::kClosedForm:
      return "closed-form";
  }
  return "invalid";
}

DpStats DpSize(const std::vector<Item>& items, int64_t aggregators, int64_t worker_ports) {
  return Size(items, Useful(items, aggregators, worker_ports), aggregators, worker_ports);
}

Selection SolveDp(const std::vector<Item>& items, int64_t aggregators, int64_t worker_ports, DpStats* stats) {
  const std::vector<size_t> keep = Useful(items, aggregators, worker_ports);
  const DpStats st = Size(items, keep, aggregators, worker_ports);
  if (stats) *stats = st;
  if (keep.empty()) return {};
  // Values fit 32 bits unless the items are unusually valuable: the smaller table is faster.
  int64_t most = 0;
  for (size_t i : keep) most = std::max(most, items[i].value);
  const int64_t bound = (worker_ports / std::max<int64_t>(1, st.gcd)) * most;
  return bound < std::numeric_limits<int32_t>::max() ? RunDp<int32_t>(items, keep, st)
                                                     : RunDp<int64_t>(items, keep, st);
}

Selection SolveClosedForm(const Problem& p) {
  const int64_t n = p.workers, P = n * p.worker_ports, drop = p.aggregator_ports - 2, tree = TreeValue(p);
  const int t = FullTreeAggregators(p.workers, p.aggregator_ports);
  Key best;
  int best_f = 0, best_q = 0, best_r = 0;
  int64_t best_a = 0;
  // At most D parts (each uses >= N ports): `trees` tree-like parts, f of them full trees. The
  // empty selection (all zero) is the start; a candidate replaces it only when strictly better.
  for (int trees = 0; trees <= p.worker_ports; ++trees) {
    for (int f = 0; f <= trees && int64_t{f} * t <= p.aggregators; ++f) {
      const int q = trees - f;
      const int64_t amax = t >= 2 ? std::min<int64_t>(int64_t{q} * (t - 1), p.aggregators - int64_t{f} * t) : 0;
      const int64_t base = f * n + q * (2 * n - 2);  // ports with every other part a line
      if (base - amax * drop > P) continue;
      // The most rings that fit win (each adds value); then the fewest devices that make room.
      const int64_t r = (P - (base - amax * drop)) / n;
      const int64_t over = base + n * r - P;
      const int64_t a = over > 0 ? (over + drop - 1) / drop : 0;
      const Key key{trees * tree + r * n, int64_t{f} * t + a, base - a * drop + n * r};
      if (key.BetterThan(best)) {
        best = key;
        best_f = f, best_q = q, best_r = static_cast<int>(r), best_a = a;
      }
    }
  }
  return FromCounts(p, best_f, best_q, best_a, best_r);
}

Selection Canonical(const Problem& p, const Selection& s) {
  int full = 0, others = 0, rings = 0;
  int64_t devices = 0;
  for (const Pick& pk : s.picks) {
    if (pk.item.kind == PartKind::kFullTree) full += pk.count;
    if (pk.item.kind == PartKind::kRing) rings += pk.count;
    if (pk.item.kind == PartKind::kPartialTree || pk.item.kind == PartKind::kLine) {
      others += pk.count;
      devices += int64_t{pk.item.aggregators} * pk.count;
    }
  }
  return FromCounts(p, full, others, devices, rings);
}

double RingBandwidth(const Problem& p) {
  return static_cast<double>(p.worker_ports) * p.workers / (2.0 * (p.workers - 1));
}

Baseline BaselineOf(const Problem& p) {
  const int t = FullTreeAggregators(p.workers, p.aggregator_ports);
  Baseline b;
  const int trees = std::min(p.worker_ports, p.aggregators / t);
  // In item values, exactly: D rings are D·N, k trees k·2(N − 1).
  if (int64_t{p.worker_ports} * p.workers >= trees * TreeValue(p)) {
    b.rings = p.worker_ports;
    b.bandwidth = RingBandwidth(p);
  } else {
    b.trees = trees;
    b.bandwidth = trees;
  }
  return b;
}

double LpValue(const std::vector<Item>& items, double aggregators, double worker_ports) {
  double best = 0;
  for (const Item& it : items) {
    if (it.worker_ports <= 0) continue;
    double x = worker_ports / static_cast<double>(it.worker_ports);
    if (it.aggregators > 0) x = std::min(x, aggregators / it.aggregators);
    best = std::max(best, x * static_cast<double>(it.value));
  }
  // Both limits tight, two items in use: the other vertices of the LP.
  for (size_t i = 0; i < items.size(); ++i)
    for (size_t j = i + 1; j < items.size(); ++j) {
      const double ai = items[i].aggregators, aj = items[j].aggregators;
      const double pi = static_cast<double>(items[i].worker_ports), pj = static_cast<double>(items[j].worker_ports);
      const double det = ai * pj - aj * pi;
      if (det == 0) continue;
      const double x = (aggregators * pj - aj * worker_ports) / det;
      const double y = (ai * worker_ports - aggregators * pi) / det;
      if (x < 0 || y < 0) continue;
      best = std::max(best, x * static_cast<double>(items[i].value) + y * static_cast<double>(items[j].value));
    }
  return best;
}

double UpperBound(const Problem& p) {
  const int t = FullTreeAggregators(p.workers, p.aggregator_ports);
  std::vector<Item> extremes = {FullTreeItem(p), PartialItem(p, 0), RingItem(p)};
  if (t >= 2) extremes.push_back(PartialItem(p, t - 1));
  return LpValue(extremes, p.aggregators, static_cast<double>(p.workers) * p.worker_ports) /
         static_cast<double>(TreeValue(p));
}

Result<Layout> BuildLayout(const Problem& p, const Selection& s, const WorkerSpeeds& speeds) {
  KZ_RETURN_IF_ERROR(CheckProblem(p));
  KZ_RETURN_IF_ERROR(CheckWorkerSpeeds(p, speeds));
  if (s.aggregators > p.aggregators || s.worker_ports > int64_t{p.workers} * p.worker_ports)
    return InvalidArgument(fmt::format("the selection uses {} aggregation devices and {} worker ports; {} and {} exist",
                                       s.aggregators, s.worker_ports, p.aggregators,
                                       int64_t{p.workers} * p.worker_ports));
  LayoutBuilder b(p, speeds);
  for (const Pick& pk : s.picks)
    for (int i = 0; i < pk.count; ++i) b.Add(pk.item);
  Layout layout = b.Finish();
  KZ_RETURN_IF_ERROR(Validate(layout));
  return layout;
}

Result<LayoutPlan> PlanLayout(const Problem& p, Solver solver, const WorkerSpeeds& speeds) {
  KZ_RETURN_IF_ERROR(CheckProblem(p));
  KZ_RETURN_IF_ERROR(CheckWorkerSpeeds(p, speeds));
  LayoutPlan plan;
  plan.problem = p;
  const std::vector<Item> items = EnumerateItems(p);
  const int64_t ports = int64_t{p.workers} * p.worker_ports;
  if (solver == Solver::kAuto) {
    const DpStats size = DpSize(items, p.aggregators, ports);
    solver = size.work() <= kDpAutoWork && size.rows * size.columns <= kDpMaxCells ? Solver::kDp : Solver::kClosedForm;
  }
  Selection raw;
  if (solver == Solver::kDp) {
    const DpStats size = DpSize(items, p.aggregators, ports);
    if (size.rows * size.columns > kDpMaxCells)
      return InvalidArgument(fmt::format("the DP's table would have {} x {} cells (at most {}): use the closed form",
                                         size.rows, size.columns, kDpMaxCells));
    raw = SolveDp(items, p.aggregators, ports, &plan.dp);
  } else {
    raw = SolveClosedForm(p);
  }
  plan.solver = solver;
  // A ring fits any problem (N of the N·D ports), so there is always a plan.
  if (raw.value == 0)
    return Internal(fmt::format("no sub-topology chosen for {} workers x {} ports", p.workers, p.worker_ports));
  plan.selection = Canonical(p, raw);
  KZ_ASSIGN_OR_RETURN(plan.layout, BuildLayout(p, plan.selection, speeds));
  plan.bandwidth = plan.layout.bandwidth();
  plan.ring = RingBandwidth(p);
  plan.baseline = BaselineOf(p);
  plan.upper_bound = UpperBound(p);
  int lo = std::numeric_limits<int>::max(), hi = 0;
  std::vector<int> used(static_cast<size_t>(p.workers), 0);
  for (const Part& part : plan.layout.parts) {
    for (const TreeEdge& e : part.edges) {
      if (!e.child.aggregator()) ++used[static_cast<size_t>(e.child.index)];
      if (!e.parent.aggregator()) ++used[static_cast<size_t>(e.parent.index)];
    }
    for (int w : part.ring) ++used[static_cast<size_t>(w)];
  }
  for (int u : used) lo = std::min(lo, u), hi = std::max(hi, u);
  plan.min_ports = lo;
  plan.max_ports = hi;
  return plan;
}

std::vector<StepsRow> Seed002Table(int workers, int worker_ports) {
  const int n = workers;
  const double time = 2.0 * (n - 1) / n / worker_ports;
  int log2n = -1;
  for (int d = 0; d < 31; ++d)
    if ((1 << d) == n) log2n = d;
  return {
      {"ring", "ring allreduce", 2 * (n - 1), time, "2(N-1): N-1 reduce-scatter steps, then N-1 allgather steps"},
      {"ring", "ring + streaming aggregation in the NIC", 2 * ((n + 1) / 2) - 1, time,
       "(N/2-1) + 1 + (N/2-1): the two halves of a bidirectional ring reduce as data streams towards one cable, "
       "meet there, and broadcast back"},
      {"hypercube", "optimized topology + streaming", log2n >= 0 && log2n <= worker_ports ? log2n : -1, time,
       "log2 N: streaming recursive doubling, one hypercube dimension (one port) per step"},
  };
}

}  // namespace kizuna::collectives::ina
