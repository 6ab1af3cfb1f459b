#include "collectives/plan/rings.h"

#include <algorithm>
#include <cmath>

namespace kizuna::collectives {

bool IsRankOrder(const std::vector<int>& order) {
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] != static_cast<int>(i)) return false;
  return true;
}

std::vector<int> RingOrder(const CommTopology& shape) {
  const int p = shape.nranks;
  std::vector<int> order(static_cast<size_t>(std::max(p, 0)));
  for (int r = 0; r < p; ++r) order[static_cast<size_t>(r)] = r;
  bool in_order = true;
  for (int r = 0; r < p && in_order && p > 1; ++r) in_order = shape.Adjacent(r, (r + 1) % p);
  if (in_order) return order;
  // Each rank's reachable neighbours.
  std::vector<std::vector<int>> next(static_cast<size_t>(p));
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b)
      if (shape.Adjacent(a, b)) next[static_cast<size_t>(a)].push_back(b);
  std::vector<char> used(static_cast<size_t>(p), 0);
  auto free_neighbours = [&](int r) {
    int n = 0;
    for (int q : next[static_cast<size_t>(r)]) n += used[static_cast<size_t>(q)] ? 0 : 1;
    return n;
  };
  // The path so far, and at each depth the neighbours not tried yet (best last).
  std::vector<int> path = {0};
  std::vector<std::vector<int>> untried(1);
  used[0] = 1;
  auto candidates = [&](int r) {
    std::vector<int> c;
    for (int q : next[static_cast<size_t>(r)])
      if (!used[static_cast<size_t>(q)]) c.push_back(q);
    std::sort(c.begin(), c.end(), [&](int x, int y) {
      const int fx = free_neighbours(x), fy = free_neighbours(y);
      return fx != fy ? fx > fy : x > y;  // popped from the back: fewest free neighbours, lowest rank
    });
    return c;
  };
  untried[0] = candidates(0);
  for (int steps = 0; !path.empty() && steps < kRingSearchSteps; ++steps) {
    if (static_cast<int>(path.size()) == p) {
      if (shape.Adjacent(path.back(), 0)) return path;
      untried.back().clear();  // a path through everyone that does not close: back off
    }
    if (untried.back().empty()) {
      used[static_cast<size_t>(path.back())] = 0;
      path.pop_back();
      untried.pop_back();
      continue;
    }
    const int q = untried.back().back();
    untried.back().pop_back();
    used[static_cast<size_t>(q)] = 1;
    path.push_back(q);
    untried.push_back(candidates(q));
  }
  return {};
}

int Torus::Coordinate(int place, int dim) const {
  int stride = 1;
  for (int d = 0; d < dim; ++d) stride *= dims[static_cast<size_t>(d)];
  return (place / stride) % dims[static_cast<size_t>(dim)];
}

int Torus::Move(int place, int dim, int step) const {
  int stride = 1;
  for (int d = 0; d < dim; ++d) stride *= dims[static_cast<size_t>(d)];
  const int size = dims[static_cast<size_t>(dim)];
  const int coord = (place / stride) % size;
  const int to = ((coord + step) % size + size) % size;
  return place + (to - coord) * stride;
}

namespace {

// The factorizations of p into `k` factors >= 2, the most even first (smallest largest factor,
// then the first factor smallest).
void Factorizations(int p, int k, std::vector<int>& prefix, std::vector<std::vector<int>>& out) {
  if (k == 1) {
    if (p >= 2) {
      prefix.push_back(p);
      out.push_back(prefix);
      prefix.pop_back();
    }
    return;
  }
  for (int f = 2; f <= p / 2; ++f) {
    if (p % f != 0) continue;
    prefix.push_back(f);
    Factorizations(p / f, k - 1, prefix, out);
    prefix.pop_back();
  }
}

bool HasTorusLinks(const CommTopology& shape, const Torus& t) {
  const int p = shape.nranks;
  for (int place = 0; place < p; ++place)
    for (int d = 0; d < static_cast<int>(t.dims.size()); ++d)
      for (int step : {1, -1})
        if (!shape.Adjacent(t.rank(place), t.rank(t.Move(place, d, step)))) return false;
  return true;
}

}  // namespace

Torus FindTorus(const CommTopology& shape) {
  const int p = shape.nranks;
  Torus t;
  if (p < 2) return t;
  for (int k = 3; k >= 2; --k) {
    std::vector<std::vector<int>> candidates;
    std::vector<int> prefix;
    Factorizations(p, k, prefix, candidates);
    std::stable_sort(candidates.begin(), candidates.end(), [](const std::vector<int>& a, const std::vector<int>& b) {
      return *std::max_element(a.begin(), a.end()) < *std::max_element(b.begin(), b.end());
    });
    for (const std::vector<int>& dims : candidates) {
      t.dims = dims;
      t.order.resize(static_cast<size_t>(p));
      for (int r = 0; r < p; ++r) t.order[static_cast<size_t>(r)] = r;
      if (HasTorusLinks(shape, t)) return t;
    }
  }
  t.order = RingOrder(shape);
  t.dims = t.order.empty() ? std::vector<int>{} : std::vector<int>{p};
  return t;
}

namespace {

// DisjointCycles' search: cycles through every rank from rank 0, each taking one of the cables
// (cap) of the links it uses; a complete set ends the search.
class CycleSearch {
 public:
  CycleSearch(const CommTopology& shape, int want) : p_(shape.nranks), want_(want) {
    cap_.assign(static_cast<size_t>(p_) * static_cast<size_t>(p_), 0);
    double slowest = 0;
    bool unknown = false, counted = false;
    for (int a = 0; a < p_; ++a)
      for (int b = 0; b < p_; ++b)
        if (shape.Adjacent(a, b) && shape.Adjacent(b, a)) {
          const double g = std::min(shape.link(a, b).gbps, shape.link(b, a).gbps);
          unknown = unknown || g <= 0;
          if (g > 0 && (slowest == 0 || g < slowest)) slowest = g;
          counted = counted || shape.link(a, b).cables > 1;
        }
    near_.resize(static_cast<size_t>(p_));
    for (int a = 0; a < p_; ++a)
      for (int b = 0; b < p_; ++b)
        if (shape.Adjacent(a, b) && shape.Adjacent(b, a)) {
          const double g = std::min(shape.link(a, b).gbps, shape.link(b, a).gbps);
          const int by_speed = unknown ? 1 : std::max(1, static_cast<int>(std::lround(g / slowest)));
          Cap(a, b) = counted ? std::max(1, std::min(shape.link(a, b).cables, shape.link(b, a).cables)) : by_speed;
          near_[static_cast<size_t>(a)].push_back(b);
        }
  }

  std::vector<std::vector<int>> Run() {
    if (p_ < 3 || want_ < 1) return {};
    Start();
    Extend();
    return found_;
  }

 private:
  int& Cap(int a, int b) { return cap_[static_cast<size_t>(a) * static_cast<size_t>(p_) + static_cast<size_t>(b)]; }
  void Start() {
    path_ = {0};
    used_.assign(static_cast<size_t>(p_), 0);
    used_[0] = 1;
  }
  // The cycle's cables taken (-1) or given back (+1).
  void Take(const std::vector<int>& cycle, int delta) {
    for (size_t i = 0; i < cycle.size(); ++i) {
      const int a = cycle[i], b = cycle[(i + 1) % cycle.size()];
      Cap(a, b) += delta;
      Cap(b, a) += delta;
    }
  }
  int FreeNeighbours(int r) {
    int n = 0;
    for (int q : near_[static_cast<size_t>(r)]) n += !used_[static_cast<size_t>(q)] && Cap(r, q) > 0;
    return n;
  }
  // True once `want_` cycles are found (or the steps run out: then false all the way up).
  bool Extend() {
    if (++steps_ > kRingSearchSteps) return false;
    const int at = path_.back();
    if (static_cast<int>(path_.size()) == p_) {
      if (Cap(at, 0) <= 0) return false;
      found_.push_back(path_);
      Take(path_, -1);
      if (static_cast<int>(found_.size()) == want_) return true;
      const std::vector<int> path = path_;
      const std::vector<char> used = used_;
      Start();
      if (Extend()) return true;
      path_ = path;
      used_ = used;
      Take(path_, +1);
      found_.pop_back();
      return false;
    }
    std::vector<int> next;
    for (int q : near_[static_cast<size_t>(at)])
      if (!used_[static_cast<size_t>(q)] && Cap(at, q) > 0) next.push_back(q);
    // Warnsdorff, as RingOrder: the neighbours with the fewest free neighbours first, then the lower.
    std::vector<int> free(next.size());
    for (size_t i = 0; i < next.size(); ++i) free[i] = FreeNeighbours(next[i]);
    std::vector<size_t> idx(next.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return free[x] < free[y]; });
    for (size_t i : idx) {
      const int q = next[i];
      used_[static_cast<size_t>(q)] = 1;
      path_.push_back(q);
      if (Extend()) return true;
      path_.pop_back();
      used_[static_cast<size_t>(q)] = 0;
      if (steps_ > kRingSearchSteps) return false;
    }
    return false;
  }

  const int p_;
  const int want_;
  std::vector<int> cap_;                // [a * p + b]: cables of the link a - b not taken yet
  std::vector<std::vector<int>> near_;  // each rank's neighbours over links, in rank order
  std::vector<int> path_;
  std::vector<char> used_;
  std::vector<std::vector<int>> found_;
  long steps_ = 0;
};

}  // namespace

std::vector<std::vector<int>> DisjointCycles(const CommTopology& shape, int want) {
  // The search keeps a table of every pair: a shape beyond a few thousand ranks is not cables; nor
  // is one where every rank reaches every other (a switch's, or a mesh's: the ring serves it).
  if (shape.nranks > 4096 || shape.FullyConnected()) return {};
  CycleSearch search(shape, want);
  return search.Run();
}

}  // namespace kizuna::collectives
