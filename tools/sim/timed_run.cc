#include "tools/sim/timed_run.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <unordered_map>

#include <fmt/format.h>

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
  Runner(const Plan& plan, const Network& net, const DeviceModel& d, const collectives::CostConstants& k)
      : plan_(plan), net_(net), p_(plan.request.nranks), esize_(static_cast<double>(DataTypeSize(plan.request.dtype))) {
    copy_ = (d.copy_gbps > 0 ? d.copy_gbps : k.unknown_copy_gbps) * 1e9;
    reduce_ = (d.reduce_gbps > 0 ? d.reduce_gbps : k.unknown_reduce_gbps) * 1e9;
    launch_ = (d.launch_us > 0 ? d.launch_us : k.unknown_launch_us) * 1e-6;
    message_ = (d.message_us >= 0 ? d.message_us : k.message_overhead_us) * 1e-6;
    step_ = (d.step_us >= 0 ? d.step_us : k.step_overhead_us) * 1e-6;
    window_ = static_cast<size_t>(std::max(2, d.window));
    fifo_ = d.fifo;
  }

  Result<TimedResult> Go() {
    if (plan_.aggregators > 0 || collectives::IsHostFused(plan_.algorithm) ||
        plan_.algorithm == collectives::Algorithm::kFused)
      return InvalidArgument(fmt::format("kizuna-sim: {} plans do work outside their steps; the simulator runs steps",
                                         collectives::AlgorithmName(plan_.algorithm)));
    if (plan_.ranks.size() != static_cast<size_t>(p_) || net_.ranks() != p_)
      return InvalidArgument(
          fmt::format("kizuna-sim: a plan of {} ranks on a network of {}", plan_.ranks.size(), net_.ranks()));
    chans_.resize(static_cast<size_t>(p_));
    left_.assign(static_cast<size_t>(p_), 0);
    device_free_.assign(static_cast<size_t>(p_), 0);
    device_busy_.assign(static_cast<size_t>(p_), 0);
    dirty_flag_.assign(static_cast<size_t>(p_), false);
    for (int r = 0; r < p_; ++r) MarkDirty(r);
    left_cap_.assign(net_.links().size(), 0);
    unfrozen_on_.assign(net_.links().size(), 0);
    finish_.assign(static_cast<size_t>(p_), -1);
    link_bytes_.assign(net_.links().size(), 0);
    for (int r = 0; r < p_; ++r) {
      chans_[static_cast<size_t>(r)].resize(plan_.ranks[static_cast<size_t>(r)].channels.size());
      for (const auto& ch : plan_.ranks[static_cast<size_t>(r)].channels) left_[static_cast<size_t>(r)] += ch.size();
    }
    for (int r = 0; r < p_; ++r)
      if (left_[static_cast<size_t>(r)] == 0) {
        ++left_[static_cast<size_t>(r)];
        Done({r, 0, 0});  // a rank without steps: only its epilogue
      }
    StartAll();
    Rates();
    while (finished_ < p_) {
      if (!error_.ok()) return error_;
      double t_flow = kInf;
      for (size_t f : active_) {
        const Flow& fl = flows_[f];
        if (fl.rate > 0) t_flow = std::min(t_flow, now_ + fl.remaining / fl.rate);
      }
      const double t_event = events_.empty() ? kInf : events_.top().t;
      const double t = std::min(t_flow, t_event);
      if (t == kInf) return Stuck();
      AdvanceFlows(t - now_);
      now_ = t;
      bool changed = false;
      for (size_t i = 0; i < active_.size();) {
        Flow& fl = flows_[active_[i]];
        // Flows ending within a nanosecond of each other end together (a symmetric round's
        // flows would otherwise each cost a pass of the fair-share computation).
        if (fl.remaining <= fl.rate * 1e-9 + fl.bytes * 1e-12) {
          const size_t id = active_[i];
          active_[i] = active_.back();
          active_.pop_back();
          Delivered(id);
          changed = true;
        } else {
          ++i;
        }
      }
      while (!events_.empty() && events_.top().t <= now_) {
        const Event e = events_.top();
        events_.pop();
        if (e.activate) {
          active_.push_back(e.flow);
          changed = true;
        } else {
          Done(e.ref);
        }
      }
      StartAll();
      if (changed) Rates();
    }
    TimedResult out;
    for (double f : finish_) out.seconds = std::max(out.seconds, f);
    out.flows = flow_count_;
    for (size_t l = 0; l < link_bytes_.size(); ++l) {
      out.network_bytes += link_bytes_[l];
      const double busy = out.seconds > 0 ? link_bytes_[l] / (net_.links()[l].gbps * 1e9 * out.seconds) : 0;
      if (busy > out.bottleneck_busy) {
        out.bottleneck_busy = busy;
        out.bottleneck = net_.links()[l].name;
      }
    }
    // A device busier than every link is what limits (copies and reductions, one after another).
    for (int r = 0; r < p_; ++r) {
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
    size_t next = 0;
    std::vector<uint32_t> inflight;
  };
  struct Flow {
    StepRef send, recv;
    const std::vector<int>* links = nullptr;
    double bytes = 0, remaining = 0, rate = 0;
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
  // Device work on rank r from now on, after what it already does; returns when it ends.
  double OnDevice(int r, double seconds) {
    double& free = device_free_[static_cast<size_t>(r)];
    free = std::max(free, now_) + seconds;
    device_busy_[static_cast<size_t>(r)] += seconds;
    return free;
  }
  double LocalSeconds(const Step& s) const {
    const double bytes = static_cast<double>(s.count()) * esize_;
    switch (s.kind) {
      case StepKind::kReduce: return launch_ + step_ + bytes * static_cast<double>(s.srcs.size()) / reduce_;
      default: return launch_ + step_ + bytes / copy_;
    }
  }

  // Starts what may start on the ranks whose steps completed since the last look.
  void StartAll() {
    std::vector<int> ranks;
    ranks.swap(dirty_);
    for (int r : ranks) {
      dirty_flag_[static_cast<size_t>(r)] = false;
      for (size_t c = 0; c < chans_[static_cast<size_t>(r)].size(); ++c) Start(r, static_cast<int>(c));
    }
  }
  void MarkDirty(int r) {
    if (dirty_flag_[static_cast<size_t>(r)]) return;
    dirty_flag_[static_cast<size_t>(r)] = true;
    dirty_.push_back(r);
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
      if (!IsTransfer(s)) {
        events_.push({OnDevice(r, LocalSeconds(s)), false, 0, ref});
        continue;
      }
      const bool send = s.kind == StepKind::kSend;
      if (send) send_order_[StepKey(ref)] = ++sends_started_;  // a port sends in this order (FIFO)
      // Only one side of a (from, to, channel) waits at a time: a step meets the other side's
      // oldest waiting step, or waits itself.
      Waiting& w = waiting_[send ? Key(r, s.peer, c) : Key(s.peer, r, c)];
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
    f.links = &net_.Route(send.rank, recv.rank);
    if (f.links->empty() && error_.ok())
      error_ = InvalidArgument(
          fmt::format("kizuna-sim: the network has no route from rank {} to rank {}", send.rank, recv.rank));
    f.bytes = f.remaining = static_cast<double>(At(send).count()) * esize_;
    const auto order = send_order_.find(StepKey(send));
    f.seq = order->second;
    send_order_.erase(order);
    size_t id = flows_.size();
    if (free_flows_.empty()) {
      flows_.push_back(f);
    } else {
      id = free_flows_.back();
      free_flows_.pop_back();
      flows_[id] = f;
    }
    ++flow_count_;
    // Both ends' executors handle the message, then the first byte crosses the route.
    events_.push({now_ + 2 * message_ + step_ + net_.RouteLatency(send.rank, recv.rank), true, id, {}});
  }

  void Delivered(size_t id) {
    const Flow f = flows_[id];
    free_flows_.push_back(id);
    Done(f.send);
    if (At(f.recv).kind == StepKind::kRecvReduce) {
      events_.push({OnDevice(f.recv.rank, launch_ + 2 * f.bytes / reduce_), false, 0, f.recv});
    } else {
      Done(f.recv);
    }
  }

  void Done(const StepRef& ref) {
    MarkDirty(ref.rank);
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

  void AdvanceFlows(double dt) {
    if (dt <= 0) return;
    for (size_t id : active_) {
      Flow& f = flows_[id];
      const double moved = std::min(f.remaining, f.rate * dt);
      f.remaining -= moved;
      for (int l : *f.links) link_bytes_[static_cast<size_t>(l)] += moved;
    }
  }

  // FIFO links: a flow moves, at its route's slowest link, only while it is the oldest active
  // flow on every link of its route.
  void FifoRates() {
    const auto& links = net_.links();
    std::vector<size_t> order = active_;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return flows_[a].seq < flows_[b].seq; });
    std::vector<int> taken;
    for (size_t id : order) {
      Flow& f = flows_[id];
      bool head = true;
      double rate = kInf;
      for (int l : *f.links) {
        head = head && unfrozen_on_[static_cast<size_t>(l)] == 0;
        rate = std::min(rate, links[static_cast<size_t>(l)].gbps * 1e9);
      }
      for (int l : *f.links)
        if (unfrozen_on_[static_cast<size_t>(l)]++ == 0) taken.push_back(l);
      f.rate = head ? (rate == kInf ? 1e30 : rate) : 0;
    }
    for (int l : taken) unfrozen_on_[static_cast<size_t>(l)] = 0;
  }

  // Max-min fair rates over the active flows (progressive filling).
  void Rates() {
    if (fifo_) return FifoRates();
    const auto& links = net_.links();
    std::vector<int> used;
    for (size_t id : active_) {
      flows_[id].rate = 0;
      for (int l : *flows_[id].links) {
        const auto li = static_cast<size_t>(l);
        if (unfrozen_on_[li]++ == 0) {
          left_cap_[li] = links[li].gbps * 1e9;
          used.push_back(l);
        }
      }
    }
    std::vector<size_t> unfrozen = active_;
    while (!unfrozen.empty()) {
      double inc = kInf;
      for (int l : used)
        if (unfrozen_on_[static_cast<size_t>(l)] > 0)
          inc = std::min(inc, left_cap_[static_cast<size_t>(l)] / unfrozen_on_[static_cast<size_t>(l)]);
      if (inc == kInf) {  // flows crossing no link: instant
        for (size_t id : unfrozen) flows_[id].rate = 1e30;
        break;
      }
      for (size_t id : unfrozen) {
        flows_[id].rate += inc;
        for (int l : *flows_[id].links) left_cap_[static_cast<size_t>(l)] -= inc;
      }
      std::vector<size_t> still;
      for (size_t id : unfrozen) {
        bool saturated = false;
        for (int l : *flows_[id].links)
          saturated = saturated || left_cap_[static_cast<size_t>(l)] <= links[static_cast<size_t>(l)].gbps * 1e9 * 1e-9;
        if (!saturated) {
          still.push_back(id);
          continue;
        }
        for (int l : *flows_[id].links) --unfrozen_on_[static_cast<size_t>(l)];
      }
      unfrozen.swap(still);
    }
    for (int l : used) unfrozen_on_[static_cast<size_t>(l)] = 0;
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
  const int p_;
  const double esize_;
  double copy_ = 0, reduce_ = 0, launch_ = 0, message_ = 0, step_ = 0;
  size_t window_ = 4;
  bool fifo_ = false;
  std::vector<std::vector<Chan>> chans_;
  std::vector<size_t> left_;  // per rank: steps not done
  std::vector<double> device_free_, device_busy_, finish_;
  struct Waiting {
    std::vector<StepRef> queue;  // from head on: started, unmatched steps of one side
    size_t head = 0;
    bool sends = false;  // which side waits
  };
  std::unordered_map<uint64_t, Waiting> waiting_;  // by (from, to, channel)
  std::vector<Flow> flows_;
  std::vector<size_t> free_flows_;  // delivered flows' slots, reused
  uint64_t flow_count_ = 0, sends_started_ = 0;
  std::unordered_map<uint64_t, uint64_t> send_order_;  // started sends not yet matched: their order
  std::vector<size_t> active_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<double> link_bytes_;
  std::vector<int> dirty_;  // ranks to look at for steps that may start
  std::vector<bool> dirty_flag_;
  std::vector<double> left_cap_;  // Rates: per link, capacity not yet shared out
  std::vector<int> unfrozen_on_;  // Rates: per link, flows still growing
  double now_ = 0;
  int finished_ = 0;
  Status error_;
};

}  // namespace

Result<TimedResult> RunTimed(const collectives::Plan& plan, const Network& net, const DeviceModel& device,
                             const collectives::CostConstants& k) {
  return Runner(plan, net, device, k).Go();
}

}  // namespace kizuna::sim
