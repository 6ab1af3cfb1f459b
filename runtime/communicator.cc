#include "runtime/communicator.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "collectives/cost_model.h"
#include "collectives/executor.h"
#include "collectives/selector.h"
#include "collectives/transport.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/bootstrap/sub_bootstrap.h"
#include "runtime/device/registry.h"
#include "runtime/host_id.h"
#include "runtime/logging.h"

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

// One rank's part of the shape, for the allgather at creation: its device and its row of links.
// Internal format (every rank runs the same build): strings as u32 length + bytes, numbers as
// their bytes.
void Put(bootstrap::Bytes& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
void PutString(bootstrap::Bytes& out, const std::string& s) {
  const auto n = static_cast<uint32_t>(s.size());
  Put(out, &n, sizeof n);
  Put(out, s.data(), s.size());
}

bootstrap::Bytes EncodeRankRow(const collectives::RankDesc& me, const std::vector<collectives::LinkDesc>& row) {
  bootstrap::Bytes out;
  PutString(out, me.host_id);
  PutString(out, me.device);
  for (double v : {me.copy_gbps, me.reduce_gbps, me.launch_us}) Put(out, &v, sizeof v);
  for (const collectives::LinkDesc& l : row) {
    const uint8_t flags = (l.reachable ? 1 : 0) | (l.staged ? 2 : 0);
    Put(out, &flags, 1);
    Put(out, &l.latency_us, sizeof l.latency_us);
    Put(out, &l.gbps, sizeof l.gbps);
  }
  return out;
}

class RowReader {
 public:
  explicit RowReader(const bootstrap::Bytes& b) : b_(b) {}
  bool Get(void* p, size_t n) {
    if (n > b_.size() - pos_) return false;
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n = 0;
    if (!Get(&n, sizeof n) || n > b_.size() - pos_) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  const bootstrap::Bytes& b_;
  size_t pos_ = 0;
};

Status DecodeRankRow(const bootstrap::Bytes& bytes, int rank, collectives::CommShape& shape) {
  RowReader r(bytes);
  collectives::RankDesc& d = shape.ranks[static_cast<size_t>(rank)];
  bool ok = r.GetString(&d.host_id) && r.GetString(&d.device) && r.Get(&d.copy_gbps, 8) &&
            r.Get(&d.reduce_gbps, 8) && r.Get(&d.launch_us, 8);
  for (int q = 0; ok && q < shape.nranks; ++q) {
    collectives::LinkDesc& l = shape.link(rank, q);
    uint8_t flags = 0;
    ok = r.Get(&flags, 1) && r.Get(&l.latency_us, 8) && r.Get(&l.gbps, 8);
    l.reachable = (flags & 1) != 0;
    l.staged = (flags & 2) != 0;
  }
  if (!ok || !r.done()) return Internal(fmt::format("rank {} sent a malformed description of its links", rank));
  return Status::Ok();
}

// The fabrics every rank can use, in rank 0's preference order: each pair of ranks must see the
// same list, or they would pick different fabrics for one connection. Collective over `boot`.
// A rank with no usable fabric still takes part in the exchange (with an empty list), so that
// every rank fails at once with the reason instead of waiting for it until the deadline.
Result<std::vector<fabric::Fabric*>> AgreeOnFabrics(const fabric::FabricRegistry& registry,
                                                    bootstrap::Bootstrap& boot, int rank, Deadline deadline) {
  const int size = boot.size();
  Result<std::vector<fabric::Fabric*>> selected = registry.SelectAll();
  const std::vector<fabric::Fabric*> available = selected.ok() ? *selected : std::vector<fabric::Fabric*>{};
  bootstrap::Bytes mine;
  for (const fabric::Fabric* f : available) PutString(mine, f->name());
  KZ_ASSIGN_OR_RETURN(auto lists, boot.AllGather(mine, deadline));
  std::vector<std::vector<std::string>> names(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    RowReader reader(lists[static_cast<size_t>(r)]);
    while (!reader.done()) {
      std::string name;
      if (!reader.GetString(&name)) return Internal(fmt::format("rank {} sent a malformed list of its fabrics", r));
      names[static_cast<size_t>(r)].push_back(std::move(name));
    }
  }
  std::vector<fabric::Fabric*> common;
  std::string common_names;
  for (const std::string& name : names[0]) {
    bool everywhere = true;
    for (const auto& list : names) everywhere &= std::find(list.begin(), list.end(), name) != list.end();
    if (!everywhere) continue;
    common.push_back(*std::find_if(available.begin(), available.end(),
                                   [&](const fabric::Fabric* f) { return f->name() == name; }));
    common_names += (common_names.empty() ? "" : ", ") + name;
  }
  if (common.empty()) {
    if (!selected.ok()) return selected.status();
    std::string each;
    for (int r = 0; r < size && r < 8; ++r) {
      std::string list;
      for (const std::string& name : names[static_cast<size_t>(r)]) list += (list.empty() ? "" : ", ") + name;
      each += fmt::format("{}rank {}: {}", each.empty() ? "" : "; ", r, list.empty() ? "none" : list);
    }
    if (size > 8) each += fmt::format("; and {} more ranks", size - 8);
    return InvalidArgument(fmt::format("no fabric is available on every rank ({}); make one available everywhere, "
                                       "or set KIZUNA_FABRIC alike on every rank",
                                       each));
  }
  if (rank == 0) KZ_INFO(kLogInit, "fabrics on every rank, in preference order: {}", common_names);
  return common;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Calls and groups

struct Communicator::Call {
  CollectiveRequest request;
  const void* input = nullptr;
  void* output = nullptr;
  device::Stream* stream = nullptr;
  CallOptions options;
};

struct GroupState {
  int depth = 0;
  std::vector<std::pair<Communicator*, Communicator::Call>> calls;
};

namespace {
thread_local GroupState g_group;
}

struct Communicator::PlanCache {
  std::mutex mu;
  using Key = std::tuple<int, uint64_t, int, int, int, bool, int, uint64_t, int, bool, bool, bool>;
  std::map<Key, std::shared_ptr<const Plan>> plans;
  std::map<std::tuple<int, uint64_t, int, int, int, int>, bool> logged;  // selections logged once
};

// ---------------------------------------------------------------------------------------------
// Creation

Result<std::unique_ptr<Communicator>> Communicator::Init(std::shared_ptr<bootstrap::Bootstrap> boot,
                                                         device::Device& device, const CommOptions& options,
                                                         std::shared_ptr<collectives::DirectGroup> direct) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->config_ = options.config != nullptr ? options.config : &GlobalConfig();
  c->options_ = options;
  c->rank_ = boot->rank();
  c->size_ = boot->size();
  c->device_ = &device;
  c->bootstrap_ = std::move(boot);
  c->plans_ = std::make_unique<PlanCache>();
  const Config& config = *c->config_;
  const Deadline deadline = Deadline::AfterSeconds(config.timeout_s);
  const device::DeviceProperties& props = device.properties();

  // Who shares this host (local rank for the fabric; which pairs direct links can join).
  const std::string host = options.host_id.empty() ? HostId() : options.host_id;
  KZ_ASSIGN_OR_RETURN(auto hosts, c->bootstrap_->AllGather(
                                      std::span(reinterpret_cast<const uint8_t*>(host.data()), host.size()), deadline));
  std::vector<std::string> rank_hosts;
  for (const auto& h : hosts) rank_hosts.emplace_back(h.begin(), h.end());
  int local_rank = 0;
  for (int r = 0; r < c->rank_; ++r)
    if (rank_hosts[static_cast<size_t>(r)] == host) ++local_rank;

  if (c->size_ == 1) {
    // Nothing to connect: no fabric is needed (or wanted: a one-rank job must work anywhere).
    collectives::TransportOptions topts;
    topts.staging_bytes = options.staging_bytes;
    topts.force_host_staging = options.force_host_staging;
    KZ_ASSIGN_OR_RETURN(c->transport_, collectives::Transport::CreateSingle(device, topts));
  } else {
    fabric::FabricContext context;
    context.rank = c->rank_;
    context.world_size = c->size_;
    context.local_rank = local_rank;
    context.host_id = host;
    context.rank_hosts = std::move(rank_hosts);
    context.device_uuids = {props.uuid};
    // With no topology given, every pair of ranks on one host is one hop of shared memory away:
    // describe that to the fabrics as direct-connect links ("full" links the ranks of each host,
    // since the fabric knows every rank's host), so that they can use direct links (single-copy,
    // mapped peer memory) instead of a network stack; pairs across hosts take a network fabric.
    c->fabric_config_ = config;
    if (c->fabric_config_.topology.empty()) c->fabric_config_.topology = "full";
    c->fabrics_ = fabric::FabricRegistry::Create(c->fabric_config_, context);
    KZ_ASSIGN_OR_RETURN(std::vector<fabric::Fabric*> common,
                        AgreeOnFabrics(*c->fabrics_, *c->bootstrap_, c->rank_, deadline));

    collectives::TransportOptions topts;
    topts.staging_bytes = options.staging_bytes;
    topts.force_host_staging = options.force_host_staging;
    KZ_ASSIGN_OR_RETURN(c->transport_,
                        collectives::Transport::Create(common, *c->bootstrap_, device, topts, deadline));
  }

  // The shape: every rank's device and link row, allgathered, so every rank holds the same.
  collectives::RankDesc me;
  me.host_id = host;
  me.device = device.label();
  me.copy_gbps = props.copy_gbps;
  me.reduce_gbps = props.reduce_gbps;
  me.launch_us = props.launch_latency_us;
  KZ_ASSIGN_OR_RETURN(auto rows,
                      c->bootstrap_->AllGather(EncodeRankRow(me, c->transport_->link_row()), deadline));
  collectives::CommShape shape;
  shape.nranks = c->size_;
  shape.ranks.resize(static_cast<size_t>(c->size_));
  shape.links.resize(static_cast<size_t>(c->size_) * static_cast<size_t>(c->size_));
  for (int r = 0; r < c->size_; ++r) KZ_RETURN_IF_ERROR(DecodeRankRow(rows[static_cast<size_t>(r)], r, shape));
  // A link is usable only when both directions are (every transfer needs its connection).
  for (int a = 0; a < c->size_; ++a)
    for (int b = 0; b < c->size_; ++b)
      if (a == b || !shape.link(a, b).reachable || !shape.link(b, a).reachable) shape.link(a, b).reachable = false;
  shape.direct = direct != nullptr;
  KZ_RETURN_IF_ERROR(shape.Validate());
  c->shape_ = std::move(shape);

  // KIZUNA_ALGO, parsed once: a malformed value fails creation, naming the bad item, instead of
  // every call; names not available yet are logged once.
  KZ_ASSIGN_OR_RETURN(c->overrides_, collectives::ParseAlgoOverrides(config.algo));
  if (c->rank_ == 0)
    for (const std::string& w : c->overrides_.warnings) KZ_WARN(kLogTune, "KIZUNA_ALGO: {}", w);

  collectives::ExecutorOptions eopts;
  eopts.timeout_s = config.timeout_s;
  eopts.direct_group = std::move(direct);
  eopts.rank = c->rank_;
  KZ_ASSIGN_OR_RETURN(c->executor_, collectives::Executor::Create(c->transport_.get(), &device, eopts));

  KZ_INFO(kLogInit, "communicator rank {} of {} on {} ({}), {}; {} host(s)", c->rank_, c->size_, device.label(),
          props.name, c->transport_->description(), c->shape_.host_count());
  return c;
}

std::string Communicator::DescribeConnections() const { return transport_->description(); }

Result<std::unique_ptr<Communicator>> Communicator::Create(std::shared_ptr<bootstrap::Bootstrap> bootstrap,
                                                           device::Device& device, const CommOptions& options) {
  if (!bootstrap) return InvalidArgument("Communicator::Create: no bootstrap");
  return Init(std::move(bootstrap), device, options);
}

Result<std::unique_ptr<Communicator>> Communicator::Create(const bootstrap::UniqueId& id, int rank, int size,
                                                           device::Device& device, const CommOptions& options) {
  const Config& config = options.config != nullptr ? *options.config : GlobalConfig();
  if (size < 1 || rank < 0 || rank >= size)
    return InvalidArgument(fmt::format("Communicator::Create: rank {} of {} ranks", rank, size));
  KZ_ASSIGN_OR_RETURN(auto boot,
                      bootstrap::CreateTcpBootstrap(id, rank, size, Deadline::AfterSeconds(config.timeout_s)));
  return Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(boot)), device, options);
}

Result<std::unique_ptr<Communicator>> Communicator::CreateFromEnvironment(const CommOptions& options) {
  const Config& config = options.config != nullptr ? *options.config : GlobalConfig();
  const bootstrap::Environment env = bootstrap::ProcessEnvironment();
  KZ_ASSIGN_OR_RETURN(bootstrap::LaunchInfo launch, bootstrap::DetectLaunch(env));
  auto registry = device::DeviceRegistry::Create(config);
  std::vector<device::Device*> devices = registry->devices();
  if (devices.empty()) {
    std::string why;
    for (const auto& slot : registry->backends()) why += fmt::format("; {}: {}", slot.name, slot.status.ToString());
    return Unavailable(fmt::format("no device for rank {}{}", launch.rank, why));
  }
  // Real accelerators first (a GPU machine uses its GPUs, as NCCL users expect), else the first
  // available backend in registry order (the emulated devices on a machine without hardware).
  std::string backend = devices[0]->properties().backend;
  for (const auto& slot : registry->backends()) {
    if (slot.status.ok() && slot.needs_hardware && slot.backend->device_count() > 0) {
      backend = slot.name;
      break;
    }
  }
  KZ_INFO(kLogInit, "rank {}: devices of backend {} (KIZUNA_EMULATED_DEVICES=0 leaves out the emulated ones)",
          launch.rank, backend);
  std::erase_if(devices, [&](device::Device* d) { return d->properties().backend != backend; });
  int index = launch.local_rank % static_cast<int>(devices.size());
  if (config.device) {
    if (*config.device < 0 || *config.device >= static_cast<int>(devices.size()))
      return InvalidArgument(fmt::format("KIZUNA_DEVICE={} but {} has {} devices", *config.device, backend,
                                         devices.size()));
    index = *config.device;
  }
  device::Device* device = devices[static_cast<size_t>(index)];
  KZ_ASSIGN_OR_RETURN(auto boot, bootstrap::BootstrapFromEnvironment());
  KZ_ASSIGN_OR_RETURN(auto comm, Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(boot)), *device, options));
  comm->owned_devices_ = std::move(registry);
  return comm;
}

Result<std::vector<std::unique_ptr<Communicator>>> Communicator::CreateLocal(std::span<device::Device* const> devices,
                                                                           const CommOptions& options) {
  if (devices.empty()) return InvalidArgument("Communicator::CreateLocal: no devices");
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] == nullptr) return InvalidArgument(fmt::format("Communicator::CreateLocal: device {} is null", i));
  const int n = static_cast<int>(devices.size());
  KZ_ASSIGN_OR_RETURN(auto boots, bootstrap::CreateInProcessBootstraps(n));
  // Ranks of one process address each other's buffers directly when they share one device, or
  // when their devices are of one backend whose memory the CPU addresses (emulated devices: any
  // of their streams takes any of their memory). GPUs of one process would need peer access.
  bool direct = options.direct_access;
  for (device::Device* d : devices)
    direct = direct && d->properties().backend == devices[0]->properties().backend &&
             (d == devices[0] || (d->properties().host_accessible && devices[0]->properties().host_accessible));
  auto group = direct ? std::make_shared<collectives::DirectGroup>(n) : nullptr;
  KZ_INFO(kLogInit, "{} local ranks: {}", n,
          direct ? "they address each other's memory directly (fused algorithms available)"
                 : "no direct access between them (fused algorithms not available)");
  std::vector<Result<std::unique_ptr<Communicator>>> results;
  for (int r = 0; r < n; ++r) results.emplace_back(Internal("not created"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)] =
          Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(boots[static_cast<size_t>(r)])),
               *devices[static_cast<size_t>(r)], options, group);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) {
    auto& res = results[static_cast<size_t>(r)];
    if (!res.ok()) return res.status().WithContext(fmt::format("rank {}", r));
    comms.push_back(std::move(*res));
  }
  return comms;
}

Communicator::~Communicator() {
  executor_.reset();
  transport_.reset();
  fabrics_.reset();
}

// ---------------------------------------------------------------------------------------------
// Plans

Result<std::shared_ptr<const Plan>> Communicator::PlanFor(const CollectiveRequest& request,
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
  {
    std::lock_guard lock(plans_->mu);
    auto it = plans_->plans.find(key);
    if (it != plans_->plans.end()) return it->second;
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
  auto shared = std::make_shared<const Plan>(std::move(plan));
  std::lock_guard lock(plans_->mu);
  if (plans_->plans.size() >= kPlanCacheEntries) plans_->plans.clear();
  plans_->plans[key] = shared;
  return shared;
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

Status Communicator::Launch(std::vector<Call> calls) {
  // One operation: every call of this communicator, with staging slots sized for all channels.
  device::Stream* stream = calls[0].stream;
  for (const Call& c : calls)
    if (c.stream != stream)
      return InvalidArgument("a group uses two different streams for one communicator; use one stream per "
                             "communicator within a group");
  std::vector<int> channels;
  int total = 0;
  for (const Call& c : calls) {
    const size_t bytes =
        std::max(c.request.input_count(), c.request.output_count()) * DataTypeSize(c.request.dtype);
    const int ch = bytes >= kTwoChannelBytes && calls.size() == 1 ? 2 : 1;
    channels.push_back(ch);
    total += ch;
  }
  const size_t slot_bytes = executor_->slot_bytes_for(total, config_->chunk_bytes.value_or(0));
  std::vector<collectives::OperationMember> members;
  for (size_t i = 0; i < calls.size(); ++i) {
    KZ_ASSIGN_OR_RETURN(auto plan,
                        PlanFor(calls[i].request, calls[i].options, slot_bytes, channels[i], calls.size() > 1));
    members.push_back({std::move(plan), calls[i].input, calls[i].output});
  }
  return executor_->Submit(std::move(members), *stream, slot_bytes);
}

Status Communicator::Enqueue(Call call) {
  if (g_group.depth > 0) {
    g_group.calls.emplace_back(this, std::move(call));
    return Status::Ok();
  }
  std::lock_guard lock(call_mu_);
  std::vector<Call> calls;
  calls.push_back(std::move(call));
  return Launch(std::move(calls));
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
  Status first;
  for (Communicator* comm : order) {
    std::lock_guard lock(comm->call_mu_);
    Status s = comm->Launch(std::move(by_comm[comm]));
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
  if (!comm.device().Addressable(p, count * elem))
    return InvalidArgument(fmt::format("{}: {} [{}, +{} bytes) is not memory of {}", what, name, p, count * elem,
                                       comm.device().label()));
  return Status::Ok();
}

// In place exactly as the table in collectives/plan.h says, or no overlap at all.
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

}  // namespace kizuna
