// The INA term of the cost model (cost_model_ina.h). A part of the layout is a pipeline:
//
//   tree (full tree, partial tree, line) of height h, k chunks: 2h + k - 1 stages (the fill up and
//     down the tree paid at the largest chunk, then one stage per chunk). In a stage the busiest
//     node — the one with the most children, q — receives q chunks and its parent's, sends one up
//     and q down (2(q+1) messages through its staging slots) and reduces q chunks into its own;
//     every cable carries one chunk each way, in parallel with the others (its own port).
//   ring: a ring allreduce of the part (one port per worker, each sending to the next): 2(N-1)
//     stages per round of chunks of the part's N pieces; half of them reduce.
//
// Parts run at once on their own cables, but a worker's messages, staging copies and reductions
// go through one executor thread and one memory system, so the operation takes the longer of the
// slowest part alone and the sum over parts of that host work. Constants are the model's own
// (message and step overheads, staging speed); nothing here is fitted to INA measurements yet.
#include "collectives/cost/model_ina.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "collectives/ina/layout.h"

namespace kizuna::collectives::cost_internal {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// Height of a tree part (hops from the root to its deepest node) and its largest child count.
std::pair<int, int> TreeShape(const ina::Part& part) {
  std::map<std::pair<int, int>, std::pair<int, int>> parent;  // node -> parent
  std::map<std::pair<int, int>, int> children;
  auto key = [](const ina::Node& n) { return std::make_pair(static_cast<int>(n.kind), n.index); };
  for (const ina::TreeEdge& e : part.edges) {
    parent[key(e.child)] = key(e.parent);
    ++children[key(e.parent)];
  }
  int height = 0;
  for (const auto& [node, up] : parent) {
    int d = 1;
    for (auto at = up; parent.count(at) && d <= static_cast<int>(parent.size()); at = parent.at(at)) ++d;
    height = std::max(height, d);
  }
  int q = 0;
  for (const auto& [node, n] : children) q = std::max(q, n);
  return {height, q};
}

}  // namespace

Result<std::vector<InaStage>> InaStages(const CollectiveRequest& request, const CommTopology& shape,
                                        const PlanOptions& options, const CostConstants& k, const InaResolved& r) {
  if (!shape.ina) return NotSupported("the communicator has no aggregation layout");
  const ina::Layout& L = *shape.ina;
  if (L.workers != request.nranks)
    return NotSupported(
        fmt::format("the layout is for {} workers, the communicator has {}", L.workers, request.nranks));
  if (options.deterministic) return NotSupported("aggregation devices do not reduce in rank order");
  const double message = (k.message_overhead_us + k.step_overhead_us) * 1e-6;
  const std::vector<ina::PartRange> shares = ina::SplitCount(L, request.count, 1);
  // The plan runs a channel per part, and the executor sizes its staging slots over the channels a
  // plan really has (engine.cc, Prepare): where the call asked for fewer channels than there are
  // parts, each chunk shrinks by that ratio (in 64-byte multiples, as the slots are).
  uint64_t chunk_count = options.chunk_count;
  const uint64_t asked = static_cast<uint64_t>(std::max(options.channels, 1));
  if (L.parts.size() > asked) {
    const uint64_t elem = std::max<uint64_t>(1, static_cast<uint64_t>(r.elem));
    const uint64_t bytes = chunk_count * elem * asked / L.parts.size() / 64 * 64;
    chunk_count = std::max<uint64_t>(1, bytes / elem);
  }
  // One stage's terms, apart: what the cables take (latency, wire) and what the host does.
  struct Terms {
    double latency = 0, host = 0, wire = 0, staging = 0, reduce = 0;
    double all() const { return latency + host + wire + staging + reduce; }
    double host_work() const { return host + staging + reduce; }
  };
  auto stage = [&](double bytes, double messages, double reduced_chunks) {
    return Terms{r.latency_s, 2 * r.launch_s + messages * message, bytes * r.wire_per_byte,
                 messages * bytes * r.staging_per_byte, reduced_chunks * 2.0 * bytes * r.reduce_per_byte};
  };
  struct PartStages {
    std::string label;
    Terms fill, steady;
    double fills = 0, steadies = 0;
    double alone() const { return fills * fill.all() + steadies * steady.all(); }
    double host() const { return fills * fill.host_work() + steadies * steady.host_work(); }
  };
  std::vector<PartStages> parts;
  for (size_t i = 0; i < L.parts.size(); ++i) {
    const ina::Part& part = L.parts[i];
    const uint64_t count = shares[i].count;
    if (count == 0) continue;
    PartStages ps;
    if (part.kind == ina::PartKind::kRing) {
      const uint64_t n = static_cast<uint64_t>(std::max(request.nranks, 2));
      const uint64_t piece = CeilDiv(count, n);
      const uint64_t chunks = CeilDiv(piece, chunk_count);
      const double bytes = static_cast<double>(piece) * r.elem / static_cast<double>(chunks);
      ps.label = fmt::format("ina part {} ring", i);
      ps.steady = stage(bytes, 2, 0.5);  // one message out, one in; half the stages reduce
      ps.steadies = static_cast<double>(2 * (n - 1) * chunks);
    } else {
      const auto [height, q] = TreeShape(part);
      const uint64_t chunks = CeilDiv(count, chunk_count);
      const double max_bytes = static_cast<double>(std::min<uint64_t>(count, chunk_count)) * r.elem;
      const double bytes = static_cast<double>(count) * r.elem / static_cast<double>(chunks);
      ps.label = fmt::format("ina part {} {}", i, ina::PartKindName(part.kind));
      ps.fill = stage(max_bytes, 2.0 * (q + 1), q);
      ps.fills = 2.0 * height - 1;
      ps.steady = stage(bytes, 2.0 * (q + 1), q);
      ps.steadies = static_cast<double>(chunks);
    }
    parts.push_back(ps);
  }
  std::vector<InaStage> out;
  if (parts.empty()) return out;
  size_t slowest = 0;
  double host_total = 0;
  for (size_t j = 0; j < parts.size(); ++j) {
    if (parts[j].alone() > parts[slowest].alone()) slowest = j;
    host_total += parts[j].host();
  }
  auto emit = [&](const std::string& label, const Terms& t, double repeat, bool host_only) {
    if (repeat <= 0) return;
    out.push_back({label, host_only ? t.host : t.latency + t.host,
                   host_only ? t.staging : t.wire + t.staging, t.reduce, repeat});
  };
  if (host_total > parts[slowest].alone()) {  // the host's work over all parts decides
    for (const PartStages& ps : parts) {
      emit(ps.label + " (host work)", ps.fill, ps.fills, true);
      emit(ps.label + " (host work)", ps.steady, ps.steadies, true);
    }
  } else {
    emit(parts[slowest].label, parts[slowest].fill, parts[slowest].fills, false);
    emit(parts[slowest].label, parts[slowest].steady, parts[slowest].steadies, false);
  }
  return out;
}

}  // namespace kizuna::collectives::cost_internal
