#include "tools/sim/timed_run.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "tools/sim/flows.h"

namespace kizuna::sim {
namespace {

using collectives::Plan;
using collectives::Step;
using collectives::StepKind;

constexpr double kInf = std::numeric_limits<double>::infinity();

bool IsTransfer(const Step& s) {
  return s.kind == StepKind::kSend || s.kind == StepKind::kRecv || s.kind == StepKind::kRecvReduce;
}

struct StepRef {
  int rank = 0, channel = 0;
  uint32_t step = 0;
};

class Runner {
 public:
  Runner(const Plan& plan, const Network& net, const DeviceModel& d, const collectives::CostConstants& k,
         const RankGroup* group)
      : plan_(plan),
        net_(net),
        group_(group),
        p_(plan.world()),  // the workers, then an INA plan's aggregation devices
        s_(group ? group->unit() : p_),
        esize_(static_cast<double>(DataTypeSize(plan.request.dtype))),
        table_(net, d.fifo) {
    copy_ = (d.copy_gbps > 0 ? d.copy_gbps : k.unknown_copy_gbps) * 1e9;
    reduce_ = (d.reduce_gbps > 0 ? d.reduce_gbps : k.unknown_reduce_gbps) * 1e9;
    launch_ = (d.launch_us > 0 ? d.launch_us : k.unknown_launch_us) * 1e-6;
    message_ = (d.message_us >= 0 ? d.message_us : k.message_overhead_us) * 1e-6;
    step_ = (d.step_us >= 0 ? d.step_us : k.step_overhead_us) * 1e-6;
    window_ = static_cast<size_t>(std::max(2, d.window));
    fifo_ = d.fifo;
    staged_ = d.staged;
    cpus_ = d.host_cpus;
    per_host_ = d.ranks_per_host > 0 ? d.ranks_per_host : 1;
    trace_ = d.trace;
    message_cpu_ = d.message_cpu_us * 1e-6;
  }

  Result<TimedResult> Go() {
    if (collectives::IsHostFused(plan_.algorithm) || plan_.algorithm == collectives::Algorithm::kFused)
      return InvalidArgument(fmt::format("kizuna-sim: {} plans do work outside their steps; the simulator runs steps",
                                         collectives::AlgorithmName(plan_.algorithm)));
    if (plan_.ranks.size() != static_cast<size_t>(s_) || net_.ranks() != p_ || (group_ && group_->ranks() != p_))
      return InvalidArgument(fmt::format("kizuna-sim: a plan of {} ranks ({} simulated) on a network of {}", p_,
                                         plan_.ranks.size(), net_.ranks()));
    if (group_ && fifo_) return InvalidArgument("kizuna-sim: a symmetric run needs fair sharing");
    if (group_) {
      orbits_ = net_.LinkOrbits(*group_);
    } else {
      orbits_.canon.resize(net_.links().size());
      for (size_t l = 0; l < orbits_.canon.size(); ++l) orbits_.canon[l] = static_cast<int>(l);
      orbits_.size.assign(net_.links().size(), 1);
    }
    chans_.resize(static_cast<size_t>(s_));
    left_.assign(static_cast<size_t>(s_), 0);
    device_free_.assign(static_cast<size_t>(s_), 0);
    device_busy_.assign(static_cast<size_t>(s_), 0);
    if (cpus_ > 0) {
      if (group_ && group_->unit() % per_host_ != 0)
        return InvalidArgument("kizuna-sim: a symmetric run's blocks must hold whole hosts when hosts share CPUs");
      cpu_free_.assign(static_cast<size_t>((s_ + per_host_ - 1) / per_host_ * cpus_), 0);
    }
    finish_.assign(static_cast<size_t>(s_), -1);
    for (int r = 0; r < s_; ++r) {
      chans_[static_cast<size_t>(r)].resize(plan_.ranks[static_cast<size_t>(r)].channels.size());
      for (size_t c = 0; c < chans_[static_cast<size_t>(r)].size(); ++c) MarkDirty(r, static_cast<int>(c));
      for (const auto& ch : plan_.ranks[static_cast<size_t>(r)].channels) left_[static_cast<size_t>(r)] += ch.size();
    }
    for (int r = 0; r < s_; ++r)
      if (left_[static_cast<size_t>(r)] == 0) {
        ++left_[static_cast<size_t>(r)];
        Done({r, 0, 0});  // a rank without steps: only its epilogue
      }
    StartAll();
    while (finished_ < s_) {
      if (!error_.ok()) return error_;
      const double t = std::min(table_.NextEnd(), events_.empty() ? kInf : events_.top().t);
      if (t == kInf) return Stuck();
      now_ = std::max(now_, t);
      std::vector<size_t> ended = table_.TakeEnded(now_);
      // A rank's device takes the reductions of flows that end together in its channels' and
      // steps' order, not in the order the flows happen to be listed: otherwise the ranks of other
      // hosts, listed in between, would change which reduction one rank does first.
      std::sort(ended.begin(), ended.end(), [&](size_t x, size_t y) {
        const Flow& a = flows_[x];
        const Flow& b = flows_[y];
        return std::tie(a.recv.channel, a.recv.step, a.send.channel, a.send.step, a.recv.rank, a.send.rank) <
               std::tie(b.recv.channel, b.recv.step, b.send.channel, b.send.step, b.recv.rank, b.send.rank);
      });
      for (size_t id : ended) Delivered(flows_[id]);
      while (!events_.empty() && events_.top().t <= now_) {
        const Event e = events_.top();
        events_.pop();
        if (e.activate) {
          Flow& f = starting_[e.flow];
          const size_t id = table_.Add(now_, f.bytes, f.load, f.seq);
          if (flows_.size() <= id) flows_.resize(id + 1);
          flows_[id] = f;
          free_starting_.push_back(e.flow);
        } else {
          Done(e.ref);
        }
      }
      StartAll();
      table_.Share(now_);
    }
    TimedResult out;
    for (double f : finish_) out.seconds = std::max(out.seconds, f);
    out.finish = finish_;
    out.trace = std::move(spans_);
    out.simulated_flows = flow_count_;
    out.flows = flow_count_ * static_cast<uint64_t>(group_ ? group_->order() : 1);
    const std::vector<double>& link_bytes = table_.link_bytes();
    for (size_t l = 0; l < link_bytes.size(); ++l) {
      // A symmetric run counts on each orbit's first link what each of its links carries.
      out.network_bytes += link_bytes[l] * orbits_.size[l];
      const double busy = out.seconds > 0 ? link_bytes[l] / (net_.links()[l].gbps * 1e9 * out.seconds) : 0;
      if (busy > out.bottleneck_busy) {
        out.bottleneck_busy = busy;
        out.bottleneck = net_.links()[l].name;
      }
    }
    // A device busier than every link is what limits (copies and reductions, one after another).
    for (int r = 0; r < s_; ++r) {
      const double busy = out.seconds > 0 ? device_busy_[static_cast<size_t>(r)] / out.seconds : 0;
      if (busy > out.bottleneck_busy) {
        out.bottleneck_busy = busy;
        out.bottleneck = fmt::format("device of rank {}", r);
      }
    }
    return out;
  }

 private:
  struct Chan {
    bool dirty = false;  // listed in dirty_
    size_t next = 0;
    std::vector<uint32_t> inflight;
  };
  struct Flow {  // a matched transfer; the table moves its bytes
    StepRef send, recv;
    const FlowTable::Load* load = nullptr;  // Load(sender, receiver)
    double bytes = 0;
    uint64_t seq = 0;  // its send's start order (FIFO links)
  };
  struct Event {
    double t;
    bool activate;
    size_t flow;
    StepRef ref;
    bool operator>(const Event& o) const { return t > o.t; }
  };

  const Step& At(const StepRef& s) const {
    return plan_.ranks[static_cast<size_t>(s.rank)].channels[static_cast<size_t>(s.channel)][s.step];
  }
  uint64_t StepKey(const StepRef& s) const {
    return (static_cast<uint64_t>(s.rank) * 4096 + static_cast<uint64_t>(s.channel)) * (uint64_t{1} << 32) + s.step;
  }
  uint64_t Key(int from, int to, int channel) const {
    return (static_cast<uint64_t>(from) * static_cast<uint64_t>(p_) + static_cast<uint64_t>(to)) * 4096 +
           static_cast<uint64_t>(channel);
  }
  // The key of a send from r to q as q's receive sees it: in a symmetric run, q's steps are those
  // of its block-0 counterpart, which receives from r moved back by the same element.
  uint64_t SendKey(int r, int q, int channel) const {
    if (!group_) return Key(r, q, channel);
    const int e = group_->Inverse(group_->ElementTo(q / group_->unit()));
    return Key(group_->Apply(e, r), q % group_->unit(), channel);
  }
  // The flows per link that a flow from a to b stands for: 1 on each link of its route, or, in a
  // symmetric run, order / orbit size on the first link of each orbit the route crosses (the
  // moved copies of the flow cross each link of the orbit that often, on average and, since the
  // copies are spread evenly by the group, exactly).
  const std::vector<std::pair<int, double>>& Load(int a, int b) {
    auto [it, fresh] =
        load_.try_emplace(static_cast<uint64_t>(a) * static_cast<uint64_t>(p_) + static_cast<uint64_t>(b));
    if (!fresh) return it->second;
    const double order = group_ ? group_->order() : 1;
    for (int l : net_.Route(a, b)) {
      const int c = orbits_.canon[static_cast<size_t>(l)];
      const double w = order / orbits_.size[static_cast<size_t>(c)];
      bool merged = false;
      for (auto& [k, v] : it->second)
        if (k == c) v += w, merged = true;
      if (!merged) it->second.emplace_back(c, w);
    }
    return it->second;
  }
  // Device work on rank r from now on, after what it already does; returns when it ends.
  double OnDevice(int r, double seconds) {
    double& free = device_free_[static_cast<size_t>(r)];
    double start = std::max(free, now_);
    double* cpu = Cpu(r, start);
    if (cpu) start = std::max(start, *cpu);
    free = start + seconds;
    if (cpu) *cpu = free;
    device_busy_[static_cast<size_t>(r)] += seconds;
    return free;
  }
  // Where the host's devices share its CPUs, the one that work from `start` on takes: the CPU
  // free by `start` that freed last (work is booked ahead, and a CPU's gap before it cannot be
  // used again), else the one that frees first. Null where each device has its own.
  double* Cpu(int r, double start) {
    if (cpus_ <= 0) return nullptr;
    double* cpu = nullptr;
    const size_t host = static_cast<size_t>(r / per_host_ * cpus_);
    for (size_t i = host; i < host + static_cast<size_t>(cpus_); ++i) {
      const double f = cpu_free_[i];
      if (!cpu || (f <= start ? *cpu > start || f > *cpu : *cpu > start && f < *cpu)) cpu = &cpu_free_[i];
    }
    return cpu;
  }
  // The executor's handling of one message of `bytes` to copy on rank r's host CPUs, from now on
  // (message_cpu_us); returns when it ends.
  double OnCpu(int r, double bytes = 0) {
    double* cpu = Cpu(r, now_);
    if (!cpu || message_cpu_ <= 0) return now_;
    *cpu = std::max(*cpu, now_) + message_cpu_ + bytes / copy_;
    return *cpu;
  }
  double LocalSeconds(const Step& s) const {
    const double bytes = static_cast<double>(s.count()) * esize_;
    switch (s.kind) {
      case StepKind::kReduce: return launch_ + step_ + bytes * static_cast<double>(s.srcs.size()) / reduce_;
      default: return launch_ + step_ + bytes / copy_;
    }
  }

  // Starts what may start on the channels whose steps completed since the last look (a channel's
  // next step waits only for its own window and its own earlier steps).
  void StartAll() {
    std::vector<std::pair<int, int>> chans;
    chans.swap(dirty_);
    for (auto [r, c] : chans) {
      chans_[static_cast<size_t>(r)][static_cast<size_t>(c)].dirty = false;
      Start(r, c);
    }
  }
  void MarkDirty(int r, int c) {
    auto& chans = chans_[static_cast<size_t>(r)];
    if (static_cast<size_t>(c) >= chans.size() || chans[static_cast<size_t>(c)].dirty) return;
    chans[static_cast<size_t>(c)].dirty = true;
    dirty_.emplace_back(r, c);
  }

  void Start(int r, int c) {
    Chan& ch = chans_[static_cast<size_t>(r)][static_cast<size_t>(c)];
    const auto& steps = plan_.ranks[static_cast<size_t>(r)].channels[static_cast<size_t>(c)];
    while (ch.next < steps.size() && ch.inflight.size() < window_) {
      const Step& s = steps[ch.next];
      bool blocked = false;
      for (uint32_t i : ch.inflight) blocked = blocked || steps[i].ConflictsWith(s);
      if (blocked) break;
      const StepRef ref{r, c, static_cast<uint32_t>(ch.next)};
      ch.inflight.push_back(ref.step);
      ++ch.next;
      if (trace_) started_[StepKey(ref)] = now_;
      if (!IsTransfer(s)) {
        events_.push({OnDevice(r, LocalSeconds(s)), false, 0, ref});
        continue;
      }
      const bool send = s.kind == StepKind::kSend;
      if (send && fifo_) send_order_[StepKey(ref)] = ++sends_started_;  // a FIFO port sends in this order
      // Only one side of a (from, to, channel) waits at a time: a step meets the other side's
      // oldest waiting step, or waits itself.
      Waiting& w = waiting_[send ? SendKey(r, s.peer, c) : Key(s.peer, r, c)];
      if (w.head == w.queue.size() || w.sends == send) {
        w.sends = send;
        w.queue.push_back(ref);
        continue;
      }
      const StepRef other = w.queue[w.head++];
      if (w.head == w.queue.size()) {
        w.queue.clear();
        w.head = 0;
      }
      Pair(send ? ref : other, send ? other : ref);
    }
  }

  void Pair(const StepRef& send, const StepRef& recv) {
    Flow f;
    f.send = send;
    f.recv = recv;
    const int to = At(send).peer;  // recv.rank, or its block-0 counterpart in a symmetric run
    f.load = &Load(send.rank, to);
    if (net_.Route(send.rank, to).empty() && error_.ok())
      error_ =
          InvalidArgument(fmt::format("kizuna-sim: the network has no route from rank {} to rank {}", send.rank, to));
    f.bytes = static_cast<double>(At(send).count()) * esize_;
    if (fifo_) {
      const auto order = send_order_.find(StepKey(send));
      f.seq = order->second;
      send_order_.erase(order);
    }
    size_t id = starting_.size();
    if (free_starting_.empty()) {
      starting_.push_back(f);
    } else {
      id = free_starting_.back();
      free_starting_.pop_back();
      starting_[id] = f;
    }
    ++flow_count_;
    // Both ends' executors handle the message, then the first byte crosses the route. A staged
    // message is first copied into the fabric's buffer on the sender's device; where hosts' CPUs
    // are shared (message_cpu_us), the handling takes them, the sender's with its copy on the
    // direct path.
    double ready = staged_ ? OnDevice(send.rank, launch_ + f.bytes / copy_) : now_;
    ready = std::max({ready, OnCpu(send.rank, staged_ ? 0 : f.bytes), OnCpu(recv.rank)});
    events_.push({ready + 2 * message_ + step_ + net_.RouteLatency(send.rank, to), true, id, {}});
  }

  void Delivered(const Flow& f) {
    if (trace_) arrived_[StepKey(f.recv)] = now_;
    Done(f.send);
    if (At(f.recv).kind == StepKind::kRecvReduce) {
      events_.push({OnDevice(f.recv.rank, launch_ + 2 * f.bytes / reduce_), false, 0, f.recv});
    } else if (staged_) {  // copied out of the fabric's buffer
      events_.push({OnDevice(f.recv.rank, launch_ + f.bytes / copy_), false, 0, f.recv});
    } else {
      Done(f.recv);
    }
  }

  void Done(const StepRef& ref) {
    if (trace_) Trace(ref);
    MarkDirty(ref.rank, ref.channel);
    auto& chans = chans_[static_cast<size_t>(ref.rank)];
    if (static_cast<size_t>(ref.channel) < chans.size())
      std::erase(chans[static_cast<size_t>(ref.channel)].inflight, ref.step);
    if (--left_[static_cast<size_t>(ref.rank)] > 0) return;
    // The epilogue (the avg division), then the rank is done.
    double end = now_;
    for (const Step& s : plan_.ranks[static_cast<size_t>(ref.rank)].epilogue) end = OnDevice(ref.rank, LocalSeconds(s));
    finish_[static_cast<size_t>(ref.rank)] = std::max(end, device_free_[static_cast<size_t>(ref.rank)]);
    ++finished_;
  }

  // The spans of a step that ends now (executor/trace.cc names them alike).
  void Trace(const StepRef& ref) {
    const auto& chans = plan_.ranks[static_cast<size_t>(ref.rank)].channels;
    if (static_cast<size_t>(ref.channel) >= chans.size() || ref.step >= chans[static_cast<size_t>(ref.channel)].size())
      return;  // a rank without steps
    const Step& s = At(ref);
    const auto started = started_.find(StepKey(ref));
    const double from = started->second;
    started_.erase(started);
    auto span = [&](std::string name, std::string_view cat, double a, double b) {
      spans_.push_back(TracedSpan{ref.rank, ref.channel, std::move(name), cat, a, b});
    };
    switch (s.kind) {
      case StepKind::kSend: span(fmt::format("send to {}", s.peer), "send", from, now_); break;
      case StepKind::kRecv:
      case StepKind::kRecvReduce: {
        const auto arrived = arrived_.find(StepKey(ref));
        const double at = arrived->second;
        arrived_.erase(arrived);
        span(fmt::format("recv from {}", s.peer), "recv", from, at);
        const bool reduce = s.kind == StepKind::kRecvReduce;
        if (now_ > at) span(reduce ? "reduce" : "copy", reduce ? "reduce" : "copy", at, now_);
        break;
      }
      case StepKind::kReduce: span("reduce", "reduce", from, now_); break;
      default: span("copy", "copy", from, now_); break;
    }
  }

  Status Stuck() const {
    for (int r = 0; r < p_; ++r)
      for (size_t c = 0; c < chans_[static_cast<size_t>(r)].size(); ++c) {
        const Chan& ch = chans_[static_cast<size_t>(r)][c];
        if (!ch.inflight.empty() || ch.next < plan_.ranks[static_cast<size_t>(r)].channels[c].size())
          return InvalidArgument(fmt::format("kizuna-sim: the plan stops: rank {} channel {} waits at step {}", r, c,
                                             ch.inflight.empty() ? ch.next : ch.inflight.front()));
      }
    return InvalidArgument("kizuna-sim: the plan stops");
  }

  const Plan& plan_;
  const Network& net_;
  const RankGroup* group_;  // a symmetric run's, or null
  const int p_, s_;         // ranks, simulated ranks
  const double esize_;
  double copy_ = 0, reduce_ = 0, launch_ = 0, message_ = 0, step_ = 0;
  size_t window_ = 4;
  bool fifo_ = false, staged_ = false, trace_ = false;
  double message_cpu_ = 0;
  std::unordered_map<uint64_t, double> started_, arrived_;  // trace_: by StepKey
  std::vector<TracedSpan> spans_;
  int cpus_ = 0, per_host_ = 1;
  std::vector<double> cpu_free_;  // per host and CPU: when it is free
  std::vector<std::vector<Chan>> chans_;
  std::vector<size_t> left_;  // per rank: steps not done
  std::vector<double> device_free_, device_busy_, finish_;
  struct Waiting {
    std::vector<StepRef> queue;  // from head on: started, unmatched steps of one side
    size_t head = 0;
    bool sends = false;  // which side waits
  };
  std::unordered_map<uint64_t, Waiting> waiting_;  // by (from, to, channel)
  FlowTable table_;
  std::vector<Flow> flows_;     // by the table's flow id
  std::vector<Flow> starting_;  // matched, not yet on the wire (Event::flow)
  std::vector<size_t> free_starting_;
  uint64_t flow_count_ = 0, sends_started_ = 0;
  std::unordered_map<uint64_t, uint64_t> send_order_;  // started sends not yet matched: their order
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<std::pair<int, int>> dirty_;  // (rank, channel)s to look at for steps that may start
  Network::Orbits orbits_;  // each link's orbit (a run without symmetry: each its own)
  std::unordered_map<uint64_t, std::vector<std::pair<int, double>>> load_;  // Load's, by pair
  double now_ = 0;
  int finished_ = 0;
  Status error_;
};

}  // namespace

Result<TimedResult> RunTimed(const collectives::Plan& plan, const Network& net, const DeviceModel& device,
                             const collectives::CostConstants& k) {
  return Runner(plan, net, device, k, nullptr).Go();
}

Result<TimedResult> RunTimedSymmetric(const collectives::Plan& block0, const RankGroup& group, const Network& net,
                                      const DeviceModel& device, const collectives::CostConstants& k) {
  return Runner(block0, net, device, k, &group).Go();
}

Result<TimedResult> RunAlgorithm(collectives::Algorithm a, const collectives::CollectiveRequest& request,
                                 const collectives::CommTopology& shape, const collectives::PlanOptions& options,
                                 const Network& net, const DeviceModel& device, const collectives::CostConstants& k,
                                 bool symmetry, std::string* how, int max_whole_ranks) {
  how->clear();
  if (symmetry && !device.fifo) {
    for (const RankGroup& g : net.Symmetries()) {
      if (device.host_cpus > 0 && g.unit() % std::max(1, device.ranks_per_host) != 0) continue;
      const std::vector<int> ranks = CheckedRanks(g);
      auto built = collectives::BuildPlan(a, request, shape, options, ranks);
      if (!built.ok()) return built.status();
      std::unordered_map<int, size_t> at;
      for (size_t i = 0; i < ranks.size(); ++i) at[ranks[i]] = i;
      if (!PlanIsInvariant(g, [&](int r) -> const collectives::RankPlan& { return built->ranks[at.at(r)]; })) continue;
      built->ranks.resize(static_cast<size_t>(g.unit()));  // block 0's, listed first
      *how = g.Describe();
      return RunTimedSymmetric(*built, g, net, device, k);
    }
  }
  if (net.ranks() > max_whole_ranks)
    return NotSupported(
        fmt::format("its plan does not look alike from every host, and {} ranks one by one are more than "
                    "{} (--max-whole-ranks)",
                    net.ranks(), max_whole_ranks));
  auto plan = collectives::BuildPlan(a, request, shape, options, -1);
  if (!plan.ok()) return plan.status();
  return RunTimed(*plan, net, device, k);
}

}  // namespace kizuna::sim
