// The engine's calls: plans (the cache, the selection and its fallback), operations launched on
// the calling thread or through the executor. Creation is in engine_create.cc.
#include "collectives/engine.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/executor/executor.h"
#include "collectives/plan/shares.h"
#include "collectives/transport/transport.h"
#include "collectives/tuner/tuner_plugin.h"
#include "fabric/registry.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {
namespace {

// Messages at least this large are spread over two channels (two device streams, two tag
// sequences): below it one channel's chunk pipeline is enough and a second only adds steps.
constexpr size_t kTwoChannelBytes = 256 << 10;
// The channels a call asks for: two for a large one that runs alone (or a transfer), else one.
int ChannelsAsked(const CollectiveRequest& request, bool alone) {
  const size_t bytes = std::max(request.input_count(), request.output_count()) * DataTypeSize(request.dtype);
  return bytes >= kTwoChannelBytes && (alone || IsPointToPoint(request.collective)) ? 2 : 1;
}
// Plans kept per engine; a workload cycles through far fewer distinct shapes.
constexpr size_t kPlanCacheEntries = 1024;

}  // namespace

Engine::Engine() = default;

Engine::~Engine() {
  executor_.reset();
  transport_.reset();
  fabrics_.reset();
}

std::string Engine::DescribeConnections() const { return transport_->description(); }

std::vector<int> Engine::ConnectedPeers() const { return transport_->connected_peers(); }

// ---------------------------------------------------------------------------------------------
// Plans

Result<const std::shared_ptr<const Plan>*> Engine::PlanFor(const EngineCall& call, size_t slot_bytes, int channels,
                                                           bool grouped) {
  const CollectiveRequest& request = call.request;
  PlanOptions popts;
  popts.chunk_count = std::max<uint64_t>(1, slot_bytes / DataTypeSize(request.dtype));
  popts.channels = channels;
  popts.deterministic = config_->deterministic;
  popts.balance = call.balance;
  const PlanKey key{request.collective, request.count, request.dtype,  request.op,
                    request.root,       request.in_place, call.algorithm, popts.chunk_count,
                    channels,           popts.deterministic, popts.balance, grouped};
  // The plan is returned as the cache's last one, valid until the next call (call_mu_ is held):
  // the caller copies it where it keeps it, so that a repeated call costs no reference count.
  if (last_plan_ != nullptr && last_key_ == key) return &last_plan_;
  {
    std::lock_guard lock(plans_mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      last_key_ = key;
      last_plan_ = it->second;
      return &last_plan_;
    }
  }
  KZ_ASSIGN_OR_RETURN(Selection sel, Select(request, popts, call.algorithm, grouped));
  // Devices of unlike speed: the split by speed costs something too (uneven chunks, longer
  // pipelines), so where the model predicts the even split faster, for the same algorithm when it
  // was forced, the even split runs.
  if (popts.balance && !sel.tuned && UnlikeSpeeds(shape_)) {
    PlanOptions even_opts = popts;
    even_opts.balance = false;
    KZ_ASSIGN_OR_RETURN(Selection even, Select(request, even_opts, call.algorithm, grouped));
    const double by_speed = sel.candidate(sel.chosen).seconds(), evenly = even.candidate(even.chosen).seconds();
    if (!even.tuned && (even.chosen == sel.chosen || !sel.forced) && evenly < by_speed) {
      KZ_INFO(kLogTune, "{}: split evenly by {}, predicted {}, against {} by {} split by speed", request.ToString(),
              AlgorithmName(even.chosen), FormatSeconds(evenly), FormatSeconds(by_speed), AlgorithmName(sel.chosen));
      sel = std::move(even);
      popts.balance = false;
    }
  }
  // A tuner plugin's plan options (at most the chunk the slots hold: TunerPlugin::Choose). More
  // channels than Prepare sized the slots for make it size them again.
  if (sel.chunk_count) popts.chunk_count = *sel.chunk_count;
  if (sel.channels) popts.channels = *sel.channels;
  KZ_ASSIGN_OR_RETURN(Plan plan, BuildWithFallback(request, popts, sel));
  std::string levels = GetAlgorithm(plan.algorithm).Describe(request, shape_, rank_);
  if (const std::string split =
          DescribeSplit(plan.algorithm, request, shape_, popts.balance, plan.ranks[0].fused_bounds);
      !split.empty())
    levels += (levels.empty() ? "" : "; ") + split;
  KZ_INFO(kLogColl, "rank {} plan: {} via {}, chunk {} elements, {} channel(s), {} steps, scratch {} elements{}{}",
          rank_, request.ToString(), AlgorithmName(plan.algorithm), plan.chunk_count, plan.channels,
          plan.ranks[0].step_count(), plan.ranks[0].scratch_count, levels.empty() ? "" : "; ", levels);
  KZ_TRACE(kLogColl, "{}", PlanToString(plan));
  plan.signature = PlanSignature(plan);
  auto shared = std::make_shared<const Plan>(std::move(plan));
  std::lock_guard lock(plans_mu_);
  if (plans_.size() >= kPlanCacheEntries) plans_.clear();
  plans_[key] = shared;
  last_key_ = key;
  last_plan_ = std::move(shared);
  return &last_plan_;
}

Result<Plan> Engine::BuildWithFallback(const CollectiveRequest& request, const PlanOptions& options,
                                       Selection& sel) {
  std::vector<const Candidate*> order;
  for (const Candidate& cand : sel.candidates)
    if (cand.supported() && cand.algorithm != sel.chosen) order.push_back(&cand);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto* a, const auto* b) { return a->seconds() < b->seconds(); });
  Result<Plan> built = BuildPlan(sel.chosen, request, shape_, options, rank_);
  std::string refused;
  for (const Candidate* next : order) {
    if (built.ok() || built.status().code() != StatusCode::kNotSupported) break;
    refused +=
        fmt::format("{}{}: {}", refused.empty() ? "" : "; ", AlgorithmName(sel.chosen), built.status().message());
    sel.chosen = next->algorithm;
    built = BuildPlan(sel.chosen, request, shape_, options, rank_);
  }
  if (!built.ok()) return built.status().WithContext(request.ToString());
  if (rank_ == 0 || !refused.empty()) {
    KZ_INFO(kLogTune, "{}{}", SelectionToString(sel),
            refused.empty() ? ""
                            : fmt::format(" [building refused: {}; using {}]", refused, AlgorithmName(sel.chosen)));
  }
  return built;
}

Result<Selection> Engine::Select(const CollectiveRequest& request, const PlanOptions& options,
                                 std::optional<Algorithm> per_call, bool grouped) const {
  KZ_ASSIGN_OR_RETURN(
      Selection sel,
      SelectAlgorithm(request, shape_, options, cost_, overrides_, per_call,
                      [grouped](Algorithm a, const CollectiveRequest& r, const CommTopology& s) {
                        if (grouped && (a == Algorithm::kFused || IsHostFused(a)))
                          return NotSupported(fmt::format("{} runs alone, not as one of several calls of a group",
                                                          AlgorithmName(a)));
                        return GetAlgorithm(a).Supports(r, s);
                      }));
  if (tuner_ != nullptr && tuner::PluginDecides(request.collective, per_call.has_value(), overrides_))
    tuner_->Choose(sel, options);
  return sel;
}

namespace {

// A request as ExplainChoice and PredictWith see it: a call of `count` elements, in place.
CollectiveRequest RequestFor(Collective collective, int nranks, size_t count, DataType type) {
  CollectiveRequest r;
  r.collective = collective;
  r.nranks = nranks;
  r.count = count;
  r.dtype = type;
  return r;
}

}  // namespace

std::string Engine::FabricOf(int q) const { return transport_ ? std::string(transport_->FabricOf(q)) : std::string(); }

PlanOptions Engine::ChoiceOptions(const CollectiveRequest& request) const {
  PlanOptions popts;
  const size_t elem = std::max<size_t>(1, DataTypeSize(request.dtype));
  // The channels a call of it alone asks for: a large one's algorithm may use them (the torus goes
  // both ways round its lines only with two).
  popts.channels = ChannelsAsked(request, /*alone=*/true);
  popts.chunk_count =
      std::max<uint64_t>(1, executor_->slot_bytes_for(popts.channels, config_->chunk_bytes.value_or(0)) / elem);
  popts.deterministic = config_->deterministic;
  return popts;
}

Result<std::string> Engine::ExplainChoice(Collective collective, size_t count, DataType type, bool balance) const {
  const CollectiveRequest request = RequestFor(collective, size_, count, type);
  PlanOptions popts = ChoiceOptions(request);
  popts.balance = balance;
  KZ_ASSIGN_OR_RETURN(Selection sel, Select(request, popts, std::nullopt, false));
  return SelectionToString(sel);
}

Prediction Engine::PredictWith(Collective collective, size_t count, DataType type, Algorithm algorithm,
                               const CostConstants& constants) const {
  const CollectiveRequest request = RequestFor(collective, size_, count, type);
  return Predict(algorithm, request, shape_, ChoiceOptions(request), constants);
}

// ---------------------------------------------------------------------------------------------
// Operations

bool Engine::TakesHostMemory() const { return executor_ && executor_->TakesHostMemory(); }

Status Engine::Prepare(std::span<EngineCall> calls, Prepared* out) {
  // One operation: every call of this communicator, with staging slots sized for all channels.
  device::Stream* stream = calls[0].stream;
  for (const EngineCall& c : calls)
    if (c.stream != stream)
      return InvalidArgument("a group uses two different streams for one communicator; use one stream per "
                             "communicator within a group");
  // Plain host memory (the API let it through: TakesHostMemory): the call runs fused on this
  // thread (Executor::TryInline). Without TakesHostMemory the API refused every address the
  // device does not own.
  bool host_memory = false;
  for (EngineCall& c : TakesHostMemory() ? calls : std::span<EngineCall>()) {
    const size_t elem = DataTypeSize(c.request.dtype);
    const uint64_t in = c.request.input_count() * elem, out = c.request.output_count() * elem;
    const bool host = (c.input != nullptr && in > 0 && !device_->Addressable(c.input, in)) ||
                      (c.output != nullptr && out > 0 && !device_->Addressable(c.output, out));
    // Only fused serves host memory: a per-call choice falls back to it, as CallOptions says.
    if (host && c.algorithm && *c.algorithm != Algorithm::kFused)
      KZ_INFO(kLogTune, "rank {}: {} asked for {} on host memory, which only fused serves: using fused", rank_,
              c.request.ToString(), AlgorithmName(*c.algorithm));
    if (host) c.algorithm = Algorithm::kFused;
    host_memory = host_memory || host;
  }
  // A collective's plan depends on the collectives of the group only, and a point-to-point
  // transfer's on the transfer only: the ranks of a transfer, and the ranks that take no part in
  // it, may group other calls beside it.
  int collectives = 0;
  for (const EngineCall& c : calls) collectives += IsPointToPoint(c.request.collective) ? 0 : 1;
  // Channels asked for per call: two for one large collective alone or one large transfer, else one.
  auto channels = [&](const EngineCall& c) { return ChannelsAsked(c.request, collectives == 1); };
  int total = 0;
  for (const EngineCall& c : calls) total += IsPointToPoint(c.request.collective) ? 0 : channels(c);
  size_t slot_bytes = executor_->slot_bytes_for(total, config_->chunk_bytes.value_or(0));
  const size_t p2p_chunk_bytes = executor_->p2p_chunk_bytes();
  // An algorithm may use more channels than asked (ina: one per part of the layout): then the
  // slots are sized again for the channels the plans really have, and the plans rebuilt for them.
  for (int attempt = 0; attempt < 2; ++attempt) {
    // Resized, not cleared: a member assigned the plan it already holds costs no reference count.
    members_.resize(calls.size());
    int used = 0;
    for (size_t i = 0; i < calls.size(); ++i) {
      const bool p2p = IsPointToPoint(calls[i].request.collective);
      KZ_ASSIGN_OR_RETURN(const std::shared_ptr<const Plan>* plan,
                          PlanFor(calls[i], p2p ? p2p_chunk_bytes : slot_bytes, channels(calls[i]),
                                  !p2p && collectives > 1));
      if (!p2p) used += static_cast<int>((*plan)->ranks[0].channels.size());
      members_[i].plan = *plan;
      members_[i].input = calls[i].input;
      members_[i].output = calls[i].output;
    }
    if (used <= total) break;
    total = used;
    slot_bytes = executor_->slot_bytes_for(total, config_->chunk_bytes.value_or(0));
  }
  *out = Prepared{stream, host_memory, slot_bytes};
  return Status::Ok();
}

Status Engine::Launch(std::span<EngineCall> calls) {
  std::lock_guard lock(call_mu_);
  return LaunchLocked(calls);
}

Status Engine::LaunchLocked(std::span<EngineCall> calls) {
  Prepared p;
  KZ_RETURN_IF_ERROR(Prepare(calls, &p));
  // A fused collective (fused, hier:fused) runs alone (its groups meet for it alone): the transfers
  // grouped with it on this rank
  // — where the other ranks may call it alone — follow it as the next operation on the stream.
  std::vector<OperationMember> transfers;
  if (members_.size() > 1) {
    auto fused = std::find_if(members_.begin(), members_.end(),
                              [](const OperationMember& m) {
                                return m.plan->algorithm == Algorithm::kFused || IsHostFused(m.plan->algorithm);
                              });
    if (fused != members_.end()) {
      OperationMember collective = std::move(*fused);
      members_.erase(fused);
      transfers = std::exchange(members_, {collective});
    }
  }
  KZ_ASSIGN_OR_RETURN(bool ran, executor_->TryInline(members_, *p.stream, p.host_memory));
  if (!ran && !p.host_memory) {
    KZ_ASSIGN_OR_RETURN(ran, executor_->TryOnCaller(members_, *p.stream, p.slot_bytes));
  }
  if (!ran) KZ_RETURN_IF_ERROR(executor_->Submit(std::exchange(members_, {}), *p.stream, p.slot_bytes));
  if (transfers.empty()) return Status::Ok();
  return executor_->Submit(std::move(transfers), *p.stream, p.slot_bytes);
}

Result<bool> Engine::LaunchTogether(std::span<Engine* const> engines, std::span<std::vector<EngineCall>* const> calls) {
  // Cheap refusals first: one call per engine, none an aggregation device.
  for (size_t i = 0; i < engines.size(); ++i)
    if (calls[i]->size() != 1 || engines[i]->aggregation_device_) return false;
  // Every engine's call lock, in one order (by address) whoever groups them.
  std::vector<Engine*> by_address(engines.begin(), engines.end());
  std::sort(by_address.begin(), by_address.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(by_address.size());
  for (Engine* e : by_address) locks.emplace_back(e->call_mu_);
  std::vector<Executor*> executors;
  std::vector<const std::vector<OperationMember>*> members;
  std::vector<device::Stream*> streams;
  for (size_t i = 0; i < engines.size(); ++i) {
    Prepared p;
    // An error here is the usual path's to report, call by call.
    if (!engines[i]->Prepare(*calls[i], &p).ok() || p.host_memory) return false;
    executors.push_back(engines[i]->executor_.get());
    members.push_back(&engines[i]->members_);
    streams.push_back(p.stream);
  }
  return Executor::TryInlineGroup(executors, members, streams);
}

Status Engine::ServeAggregation(uint64_t* served) {
  if (!aggregation_device_)
    return InvalidArgument(fmt::format("rank {} is a worker, not an aggregation device", rank_));
  return executor_->WaitServing(served);
}

void Engine::Abort(std::string_view why) {
  if (executor_) executor_->Abort(why);
}

Status Engine::AsyncError() const { return executor_ ? executor_->AsyncError() : Status::Ok(); }

int Engine::InFlight() const { return executor_ ? executor_->pending() : 0; }

uint64_t Engine::Register(const void* buffer, size_t bytes) {
  return executor_ ? executor_->Register(buffer, bytes) : ++single_rank_regions_;
}

Status Engine::Deregister(uint64_t handle) {
  if (executor_) return executor_->Deregister(handle);
  if (handle == 0 || handle > single_rank_regions_)
    return InvalidArgument(fmt::format("no registered buffer has handle {}", handle));
  return Status::Ok();
}

std::string Engine::FlightRecord() const {
  return executor_ ? executor_->recorder().ToJson(rank_) : fmt::format("{{\"rank\":{},\"records\":[]}}\n", rank_);
}

uint64_t Engine::registered_transfers() const { return executor_ ? executor_->registered_transfers() : 0; }

}  // namespace kizuna::collectives
