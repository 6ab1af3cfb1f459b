#include "collectives/plan/trees.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>

#include "collectives/plan/shares.h"

namespace kizuna::collectives {
namespace {

int Mod(int64_t a, int p) { return static_cast<int>(((a % p) + p) % p); }

}  // namespace

int BtreeParent(int n, int label) {
  if (label == 0) return -1;
  const int bit = label & -label;
  const int up = (label ^ bit) | (bit << 1);
  return up < n ? up : label ^ bit;
}

Tree MakeTree(const std::vector<int>& label_of) {
  const int n = static_cast<int>(label_of.size());
  std::vector<int> rank_of(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) rank_of[static_cast<size_t>(label_of[static_cast<size_t>(r)])] = r;
  Tree t;
  t.parent.resize(static_cast<size_t>(n));
  t.children.resize(static_cast<size_t>(n));
  t.depth.assign(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    const int up = BtreeParent(n, label_of[static_cast<size_t>(r)]);
    t.parent[static_cast<size_t>(r)] = up < 0 ? -1 : rank_of[static_cast<size_t>(up)];
    if (up < 0) t.root = r;
  }
  for (int r = 0; r < n; ++r)
    if (const int up = t.parent[static_cast<size_t>(r)]; up >= 0) t.children[static_cast<size_t>(up)].push_back(r);
  // A parent's label has a higher lowest set bit than its child's (or is 0), so walking up ends.
  for (int r = 0; r < n; ++r) {
    int d = 0;
    for (int x = r; t.parent[static_cast<size_t>(x)] >= 0; x = t.parent[static_cast<size_t>(x)]) ++d;
    t.depth[static_cast<size_t>(r)] = d;
    t.height = std::max(t.height, d);
  }
  return t;
}

namespace {

// Seconds per byte of a tree in steady state: a pipelined tree streams at the pace of its slowest
// stage — the slowest edge (both directions used: reduce up, broadcast down), or the node whose
// reductions (one chunk per child) take longest. nullopt when a reducing node's speed is unknown;
// 0 when nothing limits it that the shape reports.
std::optional<double> TreeSecondsPerByte(const Tree& t, const CommTopology& shape, bool up, bool down, bool reduces) {
  double worst = 0;
  const int n = static_cast<int>(t.parent.size());
  for (int v = 0; v < n; ++v) {
    const int parent = t.parent[static_cast<size_t>(v)];
    if (parent >= 0) {
      for (const auto& [from, to, used] : {std::tuple{v, parent, up}, std::tuple{parent, v, down}}) {
        if (!used) continue;
        // A fabric that does not report link speeds (0) reports none: links then do not tell
        // the trees apart, and the devices decide.
        const double gbps = shape.link(from, to).gbps;
        if (gbps > 0) worst = std::max(worst, 1e-9 / gbps);
      }
    }
    const size_t children = t.children[static_cast<size_t>(v)].size();
    if (reduces && children > 0) {
      const double gbps = shape.ranks[static_cast<size_t>(v)].reduce_gbps;
      if (!(gbps > 0)) return std::nullopt;
      worst = std::max(worst, 1e-9 * static_cast<double>(children) / gbps);
    }
  }
  return worst;
}

}  // namespace

std::vector<double> TreeWeights(const std::vector<Tree>& trees, const CommTopology& shape, bool balance,
                                Collective collective) {
  std::vector<double> w = {1.0, 1.0};
  if (!balance || shape.nranks < 3) return w;
  const bool up = collective != Collective::kBroadcast, down = collective != Collective::kReduce;
  const bool reduces = collective != Collective::kBroadcast;
  const auto c0 = TreeSecondsPerByte(trees[0], shape, up, down, reduces);
  const auto c1 = TreeSecondsPerByte(trees[1], shape, up, down, reduces);
  if (!c0 || !c1 || !(*c0 > 0) || !(*c1 > 0)) return w;
  return {1.0 / *c0, 1.0 / *c1};
}

std::vector<int> AllReduceLabels(const CommTopology& shape, bool balance) {
  const int n = shape.nranks;
  std::vector<int> label_of(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) label_of[static_cast<size_t>(r)] = r;
  const std::vector<double> w = ReduceWeights(shape, balance);
  if (n < 4 || std::all_of(w.begin(), w.end(), [&](double x) { return x == w[0]; })) return label_of;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b && !shape.Reachable(a, b)) return label_of;
  std::vector<int> by_speed(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) by_speed[static_cast<size_t>(r)] = r;
  std::stable_sort(by_speed.begin(), by_speed.end(),
                   [&](int x, int y) { return w[static_cast<size_t>(x)] > w[static_cast<size_t>(y)]; });
  std::vector<int> fast(by_speed.begin(), by_speed.begin() + (n + 1) / 2),
      slow(by_speed.begin() + (n + 1) / 2, by_speed.end());
  std::sort(fast.begin(), fast.end());
  std::sort(slow.begin(), slow.end());
  for (size_t i = 0; i < fast.size(); ++i) label_of[static_cast<size_t>(fast[i])] = static_cast<int>(2 * i);
  for (size_t i = 0; i < slow.size(); ++i) label_of[static_cast<size_t>(slow[i])] = static_cast<int>(2 * i + 1);
  return label_of;
}

std::vector<Tree> MakeTrees(int n, int root, const std::vector<int>& labels) {
  std::vector<int> first(static_cast<size_t>(n)), second(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& a = first[static_cast<size_t>(r)];
    auto& b = second[static_cast<size_t>(r)];
    if (root < 0) {
      a = labels.empty() ? r : labels[static_cast<size_t>(r)];
      b = n % 2 == 0 ? n - 1 - a : Mod(a - 1, n);
    } else {
      const int v = Mod(r - root, n);
      a = v;
      b = v == 0 ? 0 : (n % 2 == 1 ? n - v : Mod(v - 2, n - 1) + 1);
    }
  }
  return {MakeTree(first), MakeTree(second)};
}

}  // namespace kizuna::collectives
