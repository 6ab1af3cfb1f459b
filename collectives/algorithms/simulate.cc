#include "collectives/algorithms/simulate.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/half.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {
namespace {

// A deadlock report names at most this many stuck channels (a plan over thousands of ranks
// would otherwise produce a message of megabytes); the rest are counted.
constexpr size_t kMaxReportedChannels = 32;
// Scratch is filled with this byte so that a plan reading scratch it never wrote shows up as
// wrong results rather than as lucky zeros.
constexpr unsigned char kScratchPoison = 0xa5;

std::string Describe(const Step& s) {
  switch (s.kind) {
    case StepKind::kSend:
      return fmt::format("send to rank {}, {} elements", s.peer, s.count());
    case StepKind::kRecv:
    case StepKind::kRecvReduce:
      return fmt::format("{} from rank {}, {} elements", StepKindName(s.kind), s.peer, s.count());
    default:
      return fmt::format("{}, {} elements", StepKindName(s.kind), s.count());
  }
}

bool IsTransfer(const Step& s) {
  return s.kind == StepKind::kSend || s.kind == StepKind::kRecv || s.kind == StepKind::kRecvReduce;
}

// A byte range a step reads or writes.
struct Access {
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
  bool write = false;
  bool Overlaps(const Access& o) const { return begin < o.end && o.begin < end; }
};

// dst = src / divisor elementwise, per dtype.h's avg: floating types divide in float32
// (float16, bfloat16, float32) or float64 and round once; integers truncate toward zero.
template <typename T>
void ScaleTyped(std::byte* dst, const std::byte* src, uint64_t n, uint32_t divisor) {
  for (uint64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    if constexpr (std::is_floating_point_v<T>) v = static_cast<T>(v / static_cast<T>(divisor));
    else if constexpr (std::is_signed_v<T>) v = static_cast<T>(static_cast<int64_t>(v) / static_cast<int64_t>(divisor));
    else v = static_cast<T>(static_cast<uint64_t>(v) / static_cast<uint64_t>(divisor));
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  }
}

template <float (*kLoad)(uint16_t), uint16_t (*kStore)(float)>
void ScaleHalf(std::byte* dst, const std::byte* src, uint64_t n, uint32_t divisor) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, src + i * 2, 2);
    v = kStore(kLoad(v) / static_cast<float>(divisor));
    std::memcpy(dst + i * 2, &v, 2);
  }
}

void Scale(DataType t, std::byte* dst, const std::byte* src, uint64_t n, uint32_t divisor) {
  switch (t) {
    case DataType::kFloat16: return ScaleHalf<HalfToFloat, FloatToHalf>(dst, src, n, divisor);
    case DataType::kBfloat16: return ScaleHalf<Bfloat16ToFloat, FloatToBfloat16>(dst, src, n, divisor);
    case DataType::kFloat32: return ScaleTyped<float>(dst, src, n, divisor);
    case DataType::kFloat64: return ScaleTyped<double>(dst, src, n, divisor);
    case DataType::kInt8: return ScaleTyped<int8_t>(dst, src, n, divisor);
    case DataType::kUint8: return ScaleTyped<uint8_t>(dst, src, n, divisor);
    case DataType::kInt32: return ScaleTyped<int32_t>(dst, src, n, divisor);
    case DataType::kUint32: return ScaleTyped<uint32_t>(dst, src, n, divisor);
    case DataType::kInt64: return ScaleTyped<int64_t>(dst, src, n, divisor);
    case DataType::kUint64: return ScaleTyped<uint64_t>(dst, src, n, divisor);
  }
}

// A started, incomplete transfer.
struct InFlight {
  int channel = 0;
  uint32_t step = 0;
  std::array<Access, 2> access{};
  int naccess = 0;
};

struct StepRef {
  int rank = 0;
  int channel = 0;
  uint32_t step = 0;
};

class Simulator {
 public:
  Simulator(const Plan& plan, std::span<const SimRankBuffers> buffers, const SimOptions& options)
      : plan_(plan), req_(plan.request), buffers_(buffers), window_(static_cast<size_t>(options.window)),
        esize_(DataTypeSize(plan.request.dtype)),
        op_(plan.request.op == ReduceOp::kAvg ? ReduceOp::kSum : plan.request.op), world_(plan.world()) {}

  // `before`: run after the buffers are set up and before any step, with every rank's scratch
  // (hier:fused's host level).
  Result<SimStats> Run(const std::function<Status(std::span<std::byte* const> scratch)>& before = {}) {
    KZ_RETURN_IF_ERROR(Setup());
    if (before) {
      std::vector<std::byte*> scratch;
      for (RankState& rs : ranks_) scratch.push_back(rs.scratch.data());
      KZ_RETURN_IF_ERROR(before(scratch));
    }
    const int p = world_;
    size_t finished = 0;
    while (finished < static_cast<size_t>(p)) {
      ++stats_.rounds;
      bool progress = false;
      for (int r = 0; r < p; ++r) {
        RankState& rs = ranks_[static_cast<size_t>(r)];
        if (rs.finished) continue;
        for (int c = 0; c < static_cast<int>(rs.next.size()); ++c) {
          KZ_ASSIGN_OR_RETURN(bool moved, Advance(r, c));
          progress |= moved;
        }
      }
      for (int r = 0; r < p; ++r) {
        RankState& rs = ranks_[static_cast<size_t>(r)];
        if (rs.finished || !ChannelsDone(r)) continue;
        KZ_RETURN_IF_ERROR(RunEpilogue(r));
        rs.finished = true;
        ++finished;
        progress = true;
      }
      // Stuck: a send or receive without a partner, or counts that differ, explain it best;
      // otherwise the plan really deadlocks. (Checked only here: it costs a pass over the plan.)
      if (!progress) {
        KZ_RETURN_IF_ERROR(CheckMatching());
        return Deadlock();
      }
    }
    return stats_;
  }

 private:
  struct RankState {
    std::vector<std::byte> scratch;
    std::array<std::byte*, 3> base{};  // by BufferKind
    std::vector<size_t> next;          // per channel: the first step not started
    std::vector<InFlight> inflight;    // every channel's started, incomplete transfers
    bool finished = false;
  };
  struct Link {
    std::deque<StepRef> sends, recvs;  // started, unmatched
  };

  const RankPlan& RankOf(int r) const { return plan_.ranks[static_cast<size_t>(r)]; }
  const Step& StepAt(const StepRef& s) const {
    return RankOf(s.rank).channels[static_cast<size_t>(s.channel)][s.step];
  }
  std::string Name(const StepRef& s) const {
    return fmt::format("rank {} channel {} step {} ({})", s.rank, s.channel, s.step, Describe(StepAt(s)));
  }

  Status Setup() {
    const int p = world_;
    if (!IsValid(req_.dtype)) return InvalidArgument(fmt::format("plan for {}: no such data type", req_.ToString()));
    if (req_.nranks < 1 || plan_.aggregators < 0 || plan_.ranks.size() != static_cast<size_t>(p))
      return InvalidArgument(fmt::format("plan for {} holds {} ranks; the simulator runs all of them",
                                         req_.ToString(), plan_.ranks.size()));
    if (buffers_.size() != static_cast<size_t>(req_.nranks))
      return InvalidArgument(fmt::format("{} rank buffers for {} ranks", buffers_.size(), req_.nranks));
    ranks_.resize(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
      const RankPlan& rp = RankOf(r);
      if (rp.rank != r) return InvalidArgument(fmt::format("plan.ranks[{}] is the plan of rank {}", r, rp.rank));
      KZ_RETURN_IF_ERROR(ValidateRankPlan(req_, rp, plan_.chunk_count, plan_.aggregators));
      // An aggregation device (beyond nranks) has scratch only.
      const SimRankBuffers b = r < req_.nranks ? buffers_[static_cast<size_t>(r)] : SimRankBuffers{};
      if (r < req_.nranks && req_.input_count() > 0 && b.input == nullptr)
        return InvalidArgument(fmt::format("rank {}: no input buffer for {} elements", r, req_.input_count()));
      if (r < req_.nranks && req_.output_count() > 0 && b.output == nullptr)
        return InvalidArgument(fmt::format("rank {}: no output buffer for {} elements", r, req_.output_count()));
      RankState& rs = ranks_[static_cast<size_t>(r)];
      rs.scratch.assign(rp.scratch_count * esize_, std::byte{kScratchPoison});
      rs.base = {static_cast<std::byte*>(b.input), static_cast<std::byte*>(b.output), rs.scratch.data()};
      rs.next.assign(rp.channels.size(), 0);
      max_channels_ = std::max(max_channels_, rp.channels.size());
      for (size_t i = 0; i < rp.epilogue.size(); ++i)
        if (IsTransfer(rp.epilogue[i]))
          return Internal(fmt::format("rank {} epilogue step {} ({}): the epilogue holds local steps only", r, i,
                                      Describe(rp.epilogue[i])));
    }
    return Status::Ok();
  }

  uint64_t LinkKey(int from, int to, int channel) const {
    return (static_cast<uint64_t>(from) * static_cast<uint64_t>(world_) + static_cast<uint64_t>(to)) *
               static_cast<uint64_t>(max_channels_) +
           static_cast<uint64_t>(channel);
  }

  // Pairs the k-th send from a to b on channel c with the k-th receiving step of b from a on c:
  // a missing partner or a count mismatch is reported by name.
  Status CheckMatching() const {
    std::unordered_map<uint64_t, std::pair<std::vector<StepRef>, std::vector<StepRef>>> links;
    for (int r = 0; r < world_; ++r) {
      const RankPlan& rp = RankOf(r);
      for (int c = 0; c < static_cast<int>(rp.channels.size()); ++c) {
        const auto& steps = rp.channels[static_cast<size_t>(c)];
        for (uint32_t i = 0; i < steps.size(); ++i) {
          const Step& s = steps[i];
          if (s.kind == StepKind::kSend) links[LinkKey(r, s.peer, c)].first.push_back({r, c, i});
          else if (IsTransfer(s)) links[LinkKey(s.peer, r, c)].second.push_back({r, c, i});
        }
      }
    }
    for (const auto& [key, link] : links) {
      const auto& [sends, recvs] = link;
      const size_t n = std::min(sends.size(), recvs.size());
      for (size_t k = 0; k < n; ++k)
        if (StepAt(sends[k]).count() != StepAt(recvs[k]).count())
          return Internal(fmt::format("{} is matched by {}: the counts differ", Name(sends[k]), Name(recvs[k])));
      if (sends.size() > n)
        return Internal(fmt::format("{} has no matching receive ({} sends, {} receives on that link)", Name(sends[n]),
                                    sends.size(), recvs.size()));
      if (recvs.size() > n)
        return Internal(fmt::format("{} has no matching send ({} sends, {} receives on that link)", Name(recvs[n]),
                                    sends.size(), recvs.size()));
    }
    return Status::Ok();
  }

  Access Resolve(int r, const Slice& s, bool write) const {
    const std::byte* at = ranks_[static_cast<size_t>(r)].base[static_cast<size_t>(s.buffer)] + s.offset * esize_;
    return {at, at + s.count * esize_, write};
  }

  bool ChannelsDone(int r) const {
    const RankState& rs = ranks_[static_cast<size_t>(r)];
    if (!rs.inflight.empty()) return false;
    for (size_t c = 0; c < rs.next.size(); ++c)
      if (rs.next[c] < RankOf(r).channels[c].size()) return false;
    return true;
  }

  // Starts every step of channel c of rank r that may start now. Returns whether any did.
  Result<bool> Advance(int r, int c) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    const auto& steps = RankOf(r).channels[static_cast<size_t>(c)];
    size_t& next = rs.next[static_cast<size_t>(c)];
    bool moved = false;
    while (next < steps.size()) {
      const Step& step = steps[next];
      size_t mine = 0;
      bool blocked = false;
      for (const InFlight& f : rs.inflight) {
        if (f.channel != c) continue;
        ++mine;
        if (steps[f.step].ConflictsWith(step)) blocked = true;
      }
      if (blocked || mine >= window_) break;
      const StepRef ref{r, c, static_cast<uint32_t>(next)};
      KZ_RETURN_IF_ERROR(CheckRaces(ref));
      ++next;
      ++stats_.steps;
      moved = true;
      if (!IsTransfer(step)) {
        if (Status done = Execute(r, step); !done.ok()) return done.WithContext(Name(ref));
        continue;
      }
      const bool send = step.kind == StepKind::kSend;
      Link& link = links_[send ? LinkKey(r, step.peer, c) : LinkKey(step.peer, r, c)];
      std::deque<StepRef>& partners = send ? link.recvs : link.sends;
      if (!partners.empty()) {
        const StepRef other = partners.front();
        partners.pop_front();
        KZ_RETURN_IF_ERROR(send ? Transfer(ref, other) : Transfer(other, ref));
        Retire(other);
        continue;
      }
      (send ? link.sends : link.recvs).push_back(ref);
      InFlight f;
      f.channel = c;
      f.step = ref.step;
      if (send) {
        f.access[f.naccess++] = Resolve(r, step.srcs[0], false);
      } else {
        f.access[f.naccess++] = Resolve(r, step.dst, true);
        if (step.kind == StepKind::kRecvReduce) f.access[f.naccess++] = Resolve(r, step.srcs[0], false);
      }
      rs.inflight.push_back(f);
    }
    return moved;
  }

  // A step about to start must not touch memory that a transfer in flight on the same rank
  // writes, nor write what one reads: the executor would race there. Slices of different buffer
  // kinds that alias in memory (in-place requests) and two channels sharing data both end here,
  // where Step::ConflictsWith, which compares slices, cannot see them.
  Status CheckRaces(const StepRef& ref) {
    const Step& step = StepAt(ref);
    const RankState& rs = ranks_[static_cast<size_t>(ref.rank)];
    std::vector<Access>& acc = accesses_;
    acc.clear();
    if (step.kind != StepKind::kSend) acc.push_back(Resolve(ref.rank, step.dst, true));
    for (const Slice& s : step.srcs) acc.push_back(Resolve(ref.rank, s, false));
    if (step.kind != StepKind::kSend) {
      // Elementwise steps may run exactly in place (each element read before it is written).
      const bool reduction = step.kind == StepKind::kReduce || step.kind == StepKind::kRecvReduce ||
                             step.kind == StepKind::kScale;
      for (size_t i = 1; i < acc.size(); ++i) {
        const bool same = acc[i].begin == acc[0].begin && acc[i].end == acc[0].end;
        if (acc[0].Overlaps(acc[i]) && !(reduction && same))
          return Internal(fmt::format("{}: its destination overlaps source {} in memory (aliased buffers)", Name(ref),
                                      i - 1));
      }
    }
    for (const InFlight& f : rs.inflight)
      for (int j = 0; j < f.naccess; ++j)
        for (const Access& a : acc)
          if ((a.write || f.access[j].write) && a.Overlaps(f.access[j]))
            return Internal(fmt::format("{} races with {}, still in flight: they touch the same memory", Name(ref),
                                        Name({ref.rank, f.channel, f.step})));
    return Status::Ok();
  }

  // Both ends have started: the bytes move (or are reduced into the receiver) now.
  Status Transfer(const StepRef& send, const StepRef& recv) {
    const Step& s = StepAt(send);
    const Step& d = StepAt(recv);
    if (s.count() != d.count())
      return Internal(fmt::format("{} is matched by {}: the counts differ", Name(send), Name(recv)));
    const Access from = Resolve(send.rank, s.srcs[0], false);
    const Access to = Resolve(recv.rank, d.dst, true);
    const size_t bytes = static_cast<size_t>(from.end - from.begin);
    if (d.kind == StepKind::kRecv) {
      if (bytes > 0) std::memcpy(const_cast<std::byte*>(to.begin), from.begin, bytes);
    } else {
      const Access local = Resolve(recv.rank, d.srcs[0], false);
      const void* srcs[2] = {local.begin, from.begin};
      const Status reduced = HostReduce(const_cast<std::byte*>(to.begin), srcs, d.count(), req_.dtype, op_);
      if (!reduced.ok()) return reduced.WithContext(Name(recv));
    }
    ++stats_.messages;
    stats_.bytes_sent += bytes;
    return Status::Ok();
  }

  void Retire(const StepRef& ref) {
    auto& v = ranks_[static_cast<size_t>(ref.rank)].inflight;
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i].channel == ref.channel && v[i].step == ref.step) {
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  }

  Status Execute(int r, const Step& step) {
    const uint64_t n = step.dst.count;
    std::byte* dst = const_cast<std::byte*>(Resolve(r, step.dst, true).begin);
    switch (step.kind) {
      case StepKind::kCopy:
        std::memcpy(dst, Resolve(r, step.srcs[0], false).begin, n * esize_);
        return Status::Ok();
      case StepKind::kReduce: {
        std::vector<const void*> srcs;
        for (const Slice& s : step.srcs) srcs.push_back(Resolve(r, s, false).begin);
        return HostReduce(dst, srcs, n, req_.dtype, step.average ? ReduceOp::kAvg : op_);
      }
      case StepKind::kScale:
        Scale(req_.dtype, dst, Resolve(r, step.srcs[0], false).begin, n, RankOf(r).divisor);
        return Status::Ok();
      default:
        return Internal(fmt::format("rank {}: {} is not a local step", r, Describe(step)));
    }
  }

  Status RunEpilogue(int r) {
    const auto& steps = RankOf(r).epilogue;
    for (size_t i = 0; i < steps.size(); ++i) {
      const Status done = Execute(r, steps[i]);
      if (!done.ok()) return done.WithContext(fmt::format("rank {} epilogue step {}", r, i));
      ++stats_.steps;
    }
    return Status::Ok();
  }

  Status Deadlock() const {
    std::string msg = fmt::format("plan for {} ({}) deadlocks with a window of {} after {} rounds:",
                                  req_.ToString(), AlgorithmName(plan_.algorithm), window_, stats_.rounds);
    size_t stuck = 0;
    for (int r = 0; r < world_; ++r) {
      const RankState& rs = ranks_[static_cast<size_t>(r)];
      if (rs.finished) continue;
      for (int c = 0; c < static_cast<int>(rs.next.size()); ++c) {
        const auto& steps = RankOf(r).channels[static_cast<size_t>(c)];
        std::string waiting;
        for (const InFlight& f : rs.inflight)
          if (f.channel == c) {
            const Step& s = steps[f.step];
            waiting += fmt::format(" step {} ({}) waits for rank {};", f.step, Describe(s), s.peer);
          }
        const size_t next = rs.next[static_cast<size_t>(c)];
        if (next < steps.size())
          waiting += fmt::format(" step {} ({}) not started;", next, Describe(steps[next]));
        if (waiting.empty()) continue;
        if (++stuck <= kMaxReportedChannels) msg += fmt::format("\n  rank {} channel {}:{}", r, c, waiting);
      }
    }
    if (stuck > kMaxReportedChannels)
      msg += fmt::format("\n  ... and {} more stuck channels", stuck - kMaxReportedChannels);
    return Internal(msg);
  }

  const Plan& plan_;
  const CollectiveRequest& req_;
  std::span<const SimRankBuffers> buffers_;
  const size_t window_;
  const size_t esize_;
  const ReduceOp op_;
  const int world_;  // workers and aggregation devices (Plan::world)
  size_t max_channels_ = 1;
  std::vector<RankState> ranks_;
  std::unordered_map<uint64_t, Link> links_;
  std::vector<Access> accesses_;  // CheckRaces' working list, kept to avoid an allocation per step
  SimStats stats_;
};

}  // namespace

// SimOptions::host_of's host level, before (`sum`, with every rank's scratch) or after the steps.
static Status HostLevel(const Plan& plan, std::span<const SimRankBuffers> buffers, const std::vector<int>& host_of,
                        bool sum, std::span<std::byte* const> scratch = {}) {
  const CollectiveRequest& req = plan.request;
  if (host_of.size() != static_cast<size_t>(req.nranks))
    return InvalidArgument(fmt::format("a hier:fused plan needs the host of each of its {} ranks (SimOptions::host_of)",
                                       req.nranks));
  const size_t es = DataTypeSize(req.dtype);
  const ReduceOp op = req.op == ReduceOp::kAvg ? ReduceOp::kSum : req.op;
  for (int r = 0; r < req.nranks; ++r) {
    std::vector<int> host;  // r's host, ascending: local index = position
    for (int q = 0; q < req.nranks; ++q)
      if (host_of[static_cast<size_t>(q)] == host_of[static_cast<size_t>(r)]) host.push_back(q);
    const auto P = static_cast<uint32_t>(host.size());
    const auto l = static_cast<uint32_t>(std::find(host.begin(), host.end(), r) - host.begin());
    const RankPlan& rp = plan.ranks[static_cast<size_t>(r)];
    auto* out = static_cast<std::byte*>(buffers[static_cast<size_t>(r)].output);
    // ReduceScatter's sums (before) and AllGather's copies (after), whole blocks.
    const bool reduce = req.collective == Collective::kReduceScatter;
    for (const RankPlan::HostBlock& hb : rp.host_blocks) {
      const size_t block = static_cast<size_t>(hb.block) * req.count * es;
      if (hb.from >= P)
        return InvalidArgument(fmt::format("rank {}: a host block from local rank {} of {}", r, hb.from, P));
      if (!sum && !reduce) {
        const auto* from = static_cast<const std::byte*>(buffers[static_cast<size_t>(host[hb.from])].output);
        std::memcpy(out + block, from + block, req.count * es);
      } else if (sum && reduce) {
        std::byte* dst =
            (hb.dst.buffer == BufferKind::kScratch ? scratch[static_cast<size_t>(r)] : out) + hb.dst.offset * es;
        std::vector<const void*> srcs;
        for (int q : host) srcs.push_back(static_cast<const std::byte*>(buffers[static_cast<size_t>(q)].input) + block);
        KZ_RETURN_IF_ERROR(HostReduce(dst, srcs, req.count, req.dtype, op));
      }
    }
    for (uint32_t c = 0; c < rp.host_channels; ++c)
      for (uint32_t j = 0; j < rp.host_parts; ++j) {
        const auto [offset, n] = HostPart(req.count, rp.host_channels, rp.host_parts, c, j, rp.host_part_weights);
        const int owner = host[j % P];
        if (n == 0 || (sum && j % P != l) || (!sum && owner == r)) continue;
        if (!sum) {
          std::memcpy(out + offset * es,
                      static_cast<const std::byte*>(buffers[static_cast<size_t>(owner)].output) + offset * es, n * es);
          continue;
        }
        std::vector<const void*> srcs;
        for (int q : host) srcs.push_back(static_cast<const std::byte*>(buffers[static_cast<size_t>(q)].input) + offset * es);
        if (P == 1 && srcs[0] == out + offset * es) continue;
        KZ_RETURN_IF_ERROR(HostReduce(out + offset * es, srcs, n, req.dtype, op));
      }
  }
  return Status::Ok();
}

Result<SimStats> SimulatePlan(const Plan& plan, std::span<const SimRankBuffers> buffers, const SimOptions& options) {
  if (options.window < 1) return InvalidArgument(fmt::format("simulation window {} is below 1", options.window));
  const bool host_level = !plan.ranks.empty() && IsHostFused(plan.algorithm);
  std::function<Status(std::span<std::byte* const>)> before;
  if (host_level)
    before = [&](std::span<std::byte* const> scratch) {
      return HostLevel(plan, buffers, options.host_of, /*sum=*/true, scratch);
    };
  KZ_ASSIGN_OR_RETURN(SimStats stats, Simulator(plan, buffers, options).Run(before));
  if (host_level) KZ_RETURN_IF_ERROR(HostLevel(plan, buffers, options.host_of, /*sum=*/false));
  return stats;
}

}  // namespace kizuna::collectives
