#include "runtime/communicator.h"
#include "runtime/communicator_internal.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/cost/model.h"
#include "collectives/executor/executor.h"
#include "collectives/cost/selector.h"
#include "collectives/transport/transport.h"
#include "runtime/bootstrap/sub_bootstrap.h"
#include "runtime/core/logging.h"

namespace kizuna {

using collectives::Algorithm;
using collectives::Collective;
using collectives::CollectiveRequest;
using collectives::Plan;

namespace {

// Messages at least this large are spread over two channels (two device streams, two tag
// sequences): below it one channel's chunk pipeline is enough and a second only adds steps.
constexpr size_t kTwoChannelBytes = 256 << 10;
// Plans kept per communicator; a workload cycles through far fewer distinct shapes.
constexpr size_t kPlanCacheEntries = 1024;
// Tags of split bootstraps: above everything the parent bootstrap's users pick by hand.
constexpr uint32_t kSplitTagBase = 1u << 24;
constexpr uint32_t kSplitTagStride = 1u << 17;

// The calling thread's group (GroupStart / GroupEnd).
thread_local GroupState g_group;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Plans

Result<const std::shared_ptr<const Plan>*> Communicator::PlanFor(const CollectiveRequest& request,
                                                                 const CallOptions& options, size_t slot_bytes,
                                                                 int channels, bool grouped) {
  const size_t elem = DataTypeSize(request.dtype);
  collectives::PlanOptions popts;
  popts.chunk_count = std::max<uint64_t>(1, slot_bytes / elem);
  popts.channels = channels;
  popts.deterministic = config_->deterministic;
  popts.balance = options.balance;
  const int forced = options.algorithm ? static_cast<int>(*options.algorithm) : -1;
  PlanCache::Key key{static_cast<int>(request.collective), request.count, static_cast<int>(request.dtype),
                     static_cast<int>(request.op), request.root, request.in_place, forced, popts.chunk_count,
                     channels, popts.deterministic, popts.balance, grouped};
  // The plan is returned as the cache's last one, valid until the next call (call_mu_ is held):
  // the caller copies it where it keeps it, so that a repeated call costs no reference count.
  if (plans_->last_plan != nullptr && plans_->last_key == key) return &plans_->last_plan;
  {
    std::lock_guard lock(plans_->mu);
    auto it = plans_->plans.find(key);
    if (it != plans_->plans.end()) {
      plans_->last_key = key;
      plans_->last_plan = it->second;
      return &plans_->last_plan;
    }
  }
  KZ_ASSIGN_OR_RETURN(collectives::Selection sel, Select(request, popts, options.algorithm, grouped));
  // The model's choice, or the next supported candidate by predicted time when building says no
  // (what only the build can tell: a deterministic plan on links that are not all there, a
  // point-to-point peer out of reach).
  std::vector<const collectives::Candidate*> order;
  for (const collectives::Candidate& cand : sel.candidates)
    if (cand.supported() && cand.algorithm != sel.chosen) order.push_back(&cand);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->seconds() < b->seconds(); });
  Result<Plan> built = collectives::BuildPlan(sel.chosen, request, shape_, popts, rank_);
  std::string refused;
  for (const collectives::Candidate* next : order) {
    if (built.ok() || built.status().code() != StatusCode::kNotSupported) break;
    refused += fmt::format("{}{}: {}", refused.empty() ? "" : "; ", collectives::AlgorithmName(sel.chosen),
                           built.status().message());
    sel.chosen = next->algorithm;
    built = collectives::BuildPlan(sel.chosen, request, shape_, popts, rank_);
  }
  if (!built.ok()) return built.status().WithContext(request.ToString());
  Plan plan = std::move(*built);
  const bool log = rank_ == 0 || !refused.empty();
  if (log) {
    KZ_INFO(kLogTune, "{}{}", collectives::SelectionToString(sel),
            refused.empty() ? "" : fmt::format(" [building refused: {}; using {}]", refused,
                                               collectives::AlgorithmName(sel.chosen)));
  }
  size_t steps = plan.ranks[0].step_count();
  KZ_INFO(kLogColl, "rank {} plan: {} via {}, chunk {} elements, {} channel(s), {} steps, scratch {} elements",
          rank_, request.ToString(), collectives::AlgorithmName(plan.algorithm), plan.chunk_count, plan.channels,
          steps, plan.ranks[0].scratch_count);
  KZ_TRACE(kLogColl, "{}", collectives::PlanToString(plan));
  plan.signature = collectives::PlanSignature(plan);
  auto shared = std::make_shared<const Plan>(std::move(plan));
  std::lock_guard lock(plans_->mu);
  if (plans_->plans.size() >= kPlanCacheEntries) plans_->plans.clear();
  plans_->plans[key] = shared;
  plans_->last_key = key;
  plans_->last_plan = std::move(shared);
  return &plans_->last_plan;
}

Result<collectives::Selection> Communicator::Select(const CollectiveRequest& request,
                                                   const collectives::PlanOptions& options,
                                                   std::optional<Algorithm> per_call, bool grouped) const {
  return collectives::SelectAlgorithm(
      request, shape_, options, collectives::CostConstants{}, overrides_, per_call,
      [grouped](Algorithm a, const CollectiveRequest& r, const collectives::CommShape& s) {
        if (grouped && a == Algorithm::kFused)
          return NotSupported("fused runs alone, not as one of several calls of a group");
        return collectives::GetAlgorithm(a).Supports(r, s);
      });
}

Result<std::string> Communicator::ExplainChoice(Collective collective, size_t count, DataType type) const {
  CollectiveRequest r;
  r.collective = collective;
  r.nranks = size_;
  r.count = count;
  r.dtype = type;
  collectives::PlanOptions popts;
  const size_t elem = std::max<size_t>(1, DataTypeSize(type));
  popts.chunk_count = std::max<uint64_t>(
      1, executor_->slot_bytes_for(1, config_->chunk_bytes.value_or(0)) / elem);
  popts.deterministic = config_->deterministic;
  KZ_ASSIGN_OR_RETURN(collectives::Selection sel, Select(r, popts, std::nullopt));
  return collectives::SelectionToString(sel);
}

// ---------------------------------------------------------------------------------------------
// Calls

bool Communicator::TakesHostMemory() const { return executor_ && executor_->TakesHostMemory(); }

Status Communicator::Prepare(std::span<Call> calls, Prepared* out) {
  // One operation: every call of this communicator, with staging slots sized for all channels.
  device::Stream* stream = calls[0].stream;
  for (const Call& c : calls)
    if (c.stream != stream)
      return InvalidArgument("a group uses two different streams for one communicator; use one stream per "
                             "communicator within a group");
  // Plain host memory (CheckBuffer let it through: TakesHostMemory): the call runs fused on this
  // thread (Executor::TryInline).
  // (Without TakesHostMemory, CheckBuffer refused every address the device does not own.)
  bool host_memory = false;
  for (Call& c : TakesHostMemory() ? calls : std::span<Call>()) {
    const size_t elem = DataTypeSize(c.request.dtype);
    const uint64_t in = c.request.input_count() * elem, out = c.request.output_count() * elem;
    const bool host = (c.input != nullptr && in > 0 && !device_->Addressable(c.input, in)) ||
                      (c.output != nullptr && out > 0 && !device_->Addressable(c.output, out));
    if (host && !c.options.algorithm) c.options.algorithm = collectives::Algorithm::kFused;
    host_memory = host_memory || host;
  }
  // Channels asked for per call: two for one large call, else one.
  auto channels = [&](const Call& c) {
    const size_t bytes =
        std::max(c.request.input_count(), c.request.output_count()) * DataTypeSize(c.request.dtype);
    return bytes >= kTwoChannelBytes && calls.size() == 1 ? 2 : 1;
  };
  int total = 0;
  for (const Call& c : calls) total += channels(c);
  size_t slot_bytes = executor_->slot_bytes_for(total, config_->chunk_bytes.value_or(0));
  // Reused (call_mu_ is held): a call that runs inline allocates nothing here.
  std::vector<collectives::OperationMember>& members = launch_members_;
  // An algorithm may use more channels than asked (ina: one per part of the layout): then the
  // slots are sized again for the channels the plans really have, and the plans rebuilt for them.
  for (int attempt = 0; attempt < 2; ++attempt) {
    // Resized, not cleared: a member assigned the plan it already holds costs no reference count.
    members.resize(calls.size());
    int used = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      KZ_ASSIGN_OR_RETURN(const std::shared_ptr<const collectives::Plan>* plan,
                          PlanFor(calls[i].request, calls[i].options, slot_bytes, channels(calls[i]),
                                  calls.size() > 1));
      used += static_cast<int>((*plan)->ranks[0].channels.size());
      members[i].plan = *plan;
      members[i].input = calls[i].input;
      members[i].output = calls[i].output;
    }
    if (used <= total) break;
    total = used;
    slot_bytes = executor_->slot_bytes_for(total, config_->chunk_bytes.value_or(0));
  }
  *out = Prepared{stream, host_memory, slot_bytes};
  return Status::Ok();
}

Status Communicator::Launch(std::span<Call> calls) {
  Prepared p;
  KZ_RETURN_IF_ERROR(Prepare(calls, &p));
  KZ_ASSIGN_OR_RETURN(const bool ran, executor_->TryInline(launch_members_, *p.stream, p.host_memory));
  if (ran) return Status::Ok();
  return executor_->Submit(std::exchange(launch_members_, {}), *p.stream, p.slot_bytes);
}

Result<bool> Communicator::TryLaunchTogether(std::span<Communicator* const> comms,
                                             std::map<Communicator*, std::vector<Call>>& calls) {
  // Cheap refusals first: one call per communicator, none an aggregation device.
  for (Communicator* comm : comms)
    if (calls[comm].size() != 1 || comm->aggregation_device_) return false;
  // Every communicator's call lock, in one order (by address) whoever groups them.
  std::vector<Communicator*> by_address(comms.begin(), comms.end());
  std::sort(by_address.begin(), by_address.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(by_address.size());
  for (Communicator* comm : by_address) locks.emplace_back(comm->call_mu_);
  std::vector<collectives::Executor*> executors;
  std::vector<const std::vector<collectives::OperationMember>*> members;
  std::vector<device::Stream*> streams;
  for (Communicator* comm : comms) {
    Prepared p;
    // An error here is the usual path's to report, call by call.
    if (!comm->Prepare(calls[comm], &p).ok() || p.host_memory) return false;
    executors.push_back(comm->executor_.get());
    members.push_back(&comm->launch_members_);
    streams.push_back(p.stream);
  }
  return collectives::Executor::TryInlineGroup(executors, members, streams);
}

Status Communicator::Enqueue(Call call) {
  if (aggregation_device_)
    return InvalidArgument(fmt::format("rank {} is an aggregation device of the INA layout: it serves the workers' "
                                       "operations (ServeAggregation) and calls none",
                                       rank_));
  if (g_group.depth > 0) {
    g_group.calls.emplace_back(this, std::move(call));
    return Status::Ok();
  }
  std::lock_guard lock(call_mu_);
  return Launch(std::span<Call>(&call, 1));
}

Status Communicator::GroupStart() {
  ++g_group.depth;
  return Status::Ok();
}

Status Communicator::GroupEnd() {
  if (g_group.depth == 0) return InvalidArgument("GroupEnd without GroupStart");
  if (--g_group.depth > 0) return Status::Ok();
  auto calls = std::move(g_group.calls);
  g_group.calls.clear();
  // Per communicator, in the order each first appeared.
  std::vector<Communicator*> order;
  std::map<Communicator*, std::vector<Call>> by_comm;
  for (auto& [comm, call] : calls) {
    if (!by_comm.count(comm)) order.push_back(comm);
    by_comm[comm].push_back(std::move(call));
  }
  // One thread driving every rank of an in-process group: it may run them all itself.
  if (order.size() > 1) {
    KZ_ASSIGN_OR_RETURN(const bool ran, TryLaunchTogether(order, by_comm));
    if (ran) return Status::Ok();
  }
  Status first;
  for (Communicator* comm : order) {
    std::lock_guard lock(comm->call_mu_);
    Status s = comm->Launch(by_comm[comm]);
    if (!s.ok() && first.ok()) first = s.WithContext(fmt::format("GroupEnd, communicator rank {}", comm->rank_));
  }
  return first;
}

namespace {

Status CheckCommon(const Communicator& comm, std::string_view what, DataType type, device::Stream& stream) {
  if (!IsValid(type))
    return InvalidArgument(fmt::format("{}: data type {} is not one of kizuna's", what, static_cast<int>(type)));
  if (&stream.device() != &comm.device())
    return InvalidArgument(fmt::format("{}: the stream belongs to {}, the communicator to {}", what,
                                       stream.device().label(), comm.device().label()));
  return Status::Ok();
}

Status CheckBuffer(const Communicator& comm, std::string_view what, std::string_view name, const void* p,
                   uint64_t count, DataType type) {
  if (count == 0) return Status::Ok();
  const size_t elem = DataTypeSize(type);
  if (count > SIZE_MAX / elem) return InvalidArgument(fmt::format("{}: {} elements overflow", what, count));
  if (p == nullptr) return InvalidArgument(fmt::format("{}: {} is null with {} elements", what, name, count));
  if (!comm.TakesHostMemory() && !comm.device().Addressable(p, count * elem))
    return InvalidArgument(fmt::format("{}: {} [{}, +{} bytes) is not memory of {} (plain host memory is taken only "
                                       "by communicators of one rank per process on one host whose devices the CPU "
                                       "reaches)",
                                       what, name, p, count * elem, comm.device().label()));
  return Status::Ok();
}

// In place exactly as the table in collectives/plan/plan.h says, or no overlap at all.
Result<bool> InPlace(std::string_view what, const void* send, uint64_t send_bytes, const void* recv,
                     uint64_t recv_bytes, const void* in_place_send) {
  if (send_bytes == 0 || recv_bytes == 0 || send == nullptr || recv == nullptr) return send == in_place_send && send;
  if (send == in_place_send) return true;
  const auto* s = static_cast<const uint8_t*>(send);
  const auto* r = static_cast<const uint8_t*>(recv);
  if (s < r + recv_bytes && r < s + send_bytes)
    return InvalidArgument(fmt::format("{}: send and receive buffers overlap without being the in-place "
                                       "arrangement",
                                       what));
  return false;
}

}  // namespace

#define KZ_CALL_PROLOGUE(name)                         \
  constexpr std::string_view what = name;              \
  KZ_RETURN_IF_ERROR(CheckCommon(*this, what, type, stream))

Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                               device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("AllReduce");
  if (!IsValid(op)) return InvalidArgument(fmt::format("{}: reduction op {} is invalid", what, static_cast<int>(op)));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  const size_t bytes = count * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, bytes, recv, bytes, recv));
  return Enqueue({{Collective::kAllReduce, size_, count, type, op, 0, in_place}, send, recv, &stream, options});
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t recvcount, DataType type, ReduceOp op,
                                   device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("ReduceScatter");
  if (!IsValid(op)) return InvalidArgument(fmt::format("{}: reduction op {} is invalid", what, static_cast<int>(op)));
  if (recvcount > SIZE_MAX / static_cast<size_t>(size_))
    return InvalidArgument(fmt::format("{}: recvcount {} x {} ranks overflows", what, recvcount, size_));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, recvcount * static_cast<size_t>(size_), type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, recvcount, type));
  const size_t elem = DataTypeSize(type);
  const void* in_place_send = static_cast<const uint8_t*>(recv) - static_cast<size_t>(rank_) * recvcount * elem;
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, recvcount * elem * static_cast<size_t>(size_), recv,
                                             recvcount * elem, in_place_send));
  return Enqueue({{Collective::kReduceScatter, size_, recvcount, type, op, 0, in_place}, send, recv, &stream, options});
}

Status Communicator::AllGather(const void* send, void* recv, size_t sendcount, DataType type, device::Stream& stream,
                               const CallOptions& options) {
  KZ_CALL_PROLOGUE("AllGather");
  if (sendcount > SIZE_MAX / static_cast<size_t>(size_))
    return InvalidArgument(fmt::format("{}: sendcount {} x {} ranks overflows", what, sendcount, size_));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, sendcount, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, sendcount * static_cast<size_t>(size_), type));
  const size_t elem = DataTypeSize(type);
  const void* in_place_send = static_cast<const uint8_t*>(recv) + static_cast<size_t>(rank_) * sendcount * elem;
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, sendcount * elem, recv,
                                             sendcount * elem * static_cast<size_t>(size_), in_place_send));
  return Enqueue({{Collective::kAllGather, size_, sendcount, type, ReduceOp::kSum, 0, in_place}, send, recv, &stream,
                  options});
}

Status Communicator::Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                               device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("Broadcast");
  if (root < 0 || root >= size_) return InvalidArgument(fmt::format("{}: root {} of {} ranks", what, root, size_));
  if (rank_ == root) KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  const size_t bytes = count * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, rank_ == root ? send : nullptr, bytes, recv, bytes, recv));
  return Enqueue({{Collective::kBroadcast, size_, count, type, ReduceOp::kSum, root, in_place || rank_ != root},
                  rank_ == root ? send : recv, recv, &stream, options});
}

Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
                            device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("Reduce");
  if (!IsValid(op)) return InvalidArgument(fmt::format("{}: reduction op {} is invalid", what, static_cast<int>(op)));
  if (root < 0 || root >= size_) return InvalidArgument(fmt::format("{}: root {} of {} ranks", what, root, size_));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  if (rank_ == root) KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  const size_t bytes = count * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, bytes, rank_ == root ? recv : nullptr, bytes, recv));
  return Enqueue({{Collective::kReduce, size_, count, type, op, root, in_place}, send, recv, &stream, options});
}

Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType type, device::Stream& stream,
                              const CallOptions& options) {
  KZ_CALL_PROLOGUE("AllToAll");
  if (count > SIZE_MAX / static_cast<size_t>(size_))
    return InvalidArgument(fmt::format("{}: count {} x {} ranks overflows", what, count, size_));
  const size_t n = count * static_cast<size_t>(size_);
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, n, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, n, type));
  const size_t bytes = n * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, bytes, recv, bytes, nullptr));
  if (in_place && n > 0) return InvalidArgument(fmt::format("{}: in place is not supported", what));
  return Enqueue({{Collective::kAllToAll, size_, count, type, ReduceOp::kSum, 0, false}, send, recv, &stream, options});
}

Status Communicator::Send(const void* send, size_t count, DataType type, int peer, device::Stream& stream) {
  KZ_CALL_PROLOGUE("Send");
  if (peer < 0 || peer >= size_) return InvalidArgument(fmt::format("{}: peer {} of {} ranks", what, peer, size_));
  if (peer == rank_) return NotSupported(fmt::format("{}: a send to the rank itself (rank {})", what, rank_));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  return Enqueue({{Collective::kSend, size_, count, type, ReduceOp::kSum, peer, false}, send, nullptr, &stream, {}});
}

Status Communicator::Recv(void* recv, size_t count, DataType type, int peer, device::Stream& stream) {
  KZ_CALL_PROLOGUE("Recv");
  if (peer < 0 || peer >= size_) return InvalidArgument(fmt::format("{}: peer {} of {} ranks", what, peer, size_));
  if (peer == rank_) return NotSupported(fmt::format("{}: a receive from the rank itself (rank {})", what, rank_));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  return Enqueue({{Collective::kRecv, size_, count, type, ReduceOp::kSum, peer, false}, nullptr, recv, &stream, {}});
}

Status Communicator::Barrier(device::Stream& stream) {
  const DataType type = DataType::kUint8;
  KZ_CALL_PROLOGUE("Barrier");
  return Enqueue({{Collective::kBarrier, size_, 0, type, ReduceOp::kSum, 0, false}, nullptr, nullptr, &stream, {}});
}

#undef KZ_CALL_PROLOGUE

// ---------------------------------------------------------------------------------------------
// Split, abort, errors

Result<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  if (color < kSplitNoColor)
    return InvalidArgument(fmt::format("Split: color {} (a color is >= 0, or kSplitNoColor)", color));
  const Deadline deadline = Deadline::AfterSeconds(config_->timeout_s);
  const uint32_t tag_base = kSplitTagBase + splits_++ * kSplitTagStride;
  int32_t mine[2] = {color, key};
  KZ_ASSIGN_OR_RETURN(auto all,
                      bootstrap_->AllGather(std::span(reinterpret_cast<const uint8_t*>(mine), sizeof mine), deadline));
  if (color == kSplitNoColor) return std::unique_ptr<Communicator>();
  std::vector<std::tuple<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < size_; ++r) {
    int32_t theirs[2];
    if (all[static_cast<size_t>(r)].size() != sizeof theirs)
      return Internal(fmt::format("Split: rank {} sent a malformed color", r));
    std::memcpy(theirs, all[static_cast<size_t>(r)].data(), sizeof theirs);
    if (theirs[0] == color) members.emplace_back(theirs[1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (auto& [k, r] : members) ranks.push_back(r);
  KZ_ASSIGN_OR_RETURN(auto sub, bootstrap::CreateSubBootstrap(bootstrap_, ranks, tag_base));
  return Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(sub)), *device_, options_);
}

void Communicator::Abort() {
  if (executor_) executor_->Abort("Communicator::Abort");
}

Status Communicator::AsyncError() const { return executor_ ? executor_->AsyncError() : Status::Ok(); }

int Communicator::InFlight() const { return executor_ ? executor_->pending() : 0; }

}  // namespace kizuna
