#include "collectives/plan/rings.h"

#include <algorithm>

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
  for (int r = 0; r < p && in_order && p > 1; ++r) in_order = shape.Reachable(r, (r + 1) % p);
  if (in_order) return order;
  // Each rank's reachable neighbours.
  std::vector<std::vector<int>> next(static_cast<size_t>(p));
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b)
      if (shape.Reachable(a, b)) next[static_cast<size_t>(a)].push_back(b);
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
      if (shape.Reachable(path.back(), 0)) return path;
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

}  // namespace kizuna::collectives
