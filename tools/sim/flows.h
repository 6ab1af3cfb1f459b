// The flows on a simulated network's links, and how fast each moves.
//
// Flows share links max-min fairly (progressive filling), or, with `fifo`, a link carries its
// flows one after another in the order they were given (seq). A flow stands for `load` flows per
// link (1 on each link of its route; in a symmetric run the copies of the other blocks, counted on
// the first link of each orbit). Rates are recomputed only where a flow started or ended since the
// last Share: max-min fair shares split into independent problems along the links that can
// saturate, and a link whose flows could all run at their routes' slowest links at once (a spine
// much faster than the NICs below it) binds nobody. Progress is kept lazily (a flow's bytes are
// counted when its rate changes or it ends), and the ends are kept in a heap; a run of a million
// flows so costs what each flow's neighbourhood costs, not what all flows do.
#pragma once

#include <cstdint>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "tools/sim/network.h"

namespace kizuna::sim {

class FlowTable {
 public:
  using Load = std::vector<std::pair<int, double>>;  // (link, flows per link)

  FlowTable(const Network& net, bool fifo);

  // A flow of `bytes` starting at `now`; `load` must outlive it. Returns its id (ids of ended
  // flows are reused).
  size_t Add(double now, double bytes, const Load* load, uint64_t seq);
  // When the next flow ends (infinity when none moves).
  double NextEnd();
  // The flows that end by `now` (or within a nanosecond after: flows of one round end together),
  // removed from the links.
  std::vector<size_t> TakeEnded(double now);
  // New rates where flows were added or removed since the last call.
  void Share(double now);

  size_t active() const { return active_; }
  // Bytes each link carried (a symmetric run: on each orbit's first link, what each of its links did).
  const std::vector<double>& link_bytes() const { return link_bytes_; }

 private:
  struct Flow {
    const Load* load = nullptr;
    std::vector<uint32_t> pos;  // its place in on_link_ of each load entry
    double remaining = 0, rate = 0, t_set = 0, capmin = 0;
    uint64_t seq = 0;
    uint32_t version = 0;
    bool active = false;
  };

  void Settle(size_t id, double now);  // count its progress up to now
  void Remove(size_t id);
  void Schedule(size_t id, double now);
  bool Binding(int l) const;  // could the link's flows together want more than it carries?
  void FairShare(double now);
  void FifoShare(double now);

  const Network& net_;
  const bool fifo_;
  std::vector<Flow> flows_;
  std::vector<size_t> free_;
  size_t active_ = 0;
  std::vector<std::vector<size_t>> on_link_;  // active flows per link
  std::vector<double> link_sum_;              // per link: sum of load x capmin of its flows
  std::vector<double> link_bytes_;
  std::vector<char> bound_;  // per link: Binding at the last Share that looked at it
  std::vector<int> touched_links_;
  std::vector<size_t> added_;
  // Share's scratch, per link and per flow, marked by pass.
  std::vector<uint32_t> link_pass_, flow_pass_, constraint_pass_;
  uint32_t pass_ = 0;
  std::vector<double> left_, weight_;
  std::priority_queue<std::tuple<double, size_t, uint32_t>, std::vector<std::tuple<double, size_t, uint32_t>>,
                      std::greater<>>
      ends_;  // (time, flow, version): stale once the flow's version moved on
};

}  // namespace kizuna::sim
