// Creating an engine (engine.h): every rank, together, learns who shares its host, agrees on the
// fabrics and connects, sets up the group of ranks that share buffers, agrees on the shape the
// engine plans with, and starts its executor. Each step is one of Builder's methods, in order.
#include <unistd.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/from_file.h"
#include "collectives/cost/cost_file.h"
#include "collectives/direct/same_host_group.h"
#include "collectives/engine.h"
#include "collectives/executor/executor.h"
#include "collectives/ina/layout.h"
#include "collectives/transport/transport.h"
#include "collectives/tuner/tuner_plugin.h"
#include "fabric/registry.h"
#include "runtime/core/host_id.h"
#include "runtime/core/logging.h"
#include "runtime/core/version.h"
#include "runtime/core/wire.h"

namespace kizuna::collectives {
namespace {

// EngineOptions::staging_bytes 0: this much, or kNetworkStagingBytes when a peer is reached over a
// network (a 2-channel window of 4 slots of the executor's network chunk).
constexpr size_t kDefaultStagingBytes = 8u << 20;
constexpr size_t kNetworkStagingBytes = 16u << 20;

// The executor's window in INA jobs. An INA plan has many steps per chunk at a node with
// children (a receive per child, a reduce, a send up, a receive down, a send per child), and a
// chunk stays in flight for a round trip through the tree, so a node must hold several chunks'
// steps at once. Workers use kInaWindow (their staging slots, and so the chunks, get smaller with
// it: finer pipelining); an aggregation device with E ports 4(E+1), about two chunks of its E+5
// steps. (A deeper window did not speed up the slowest layout: docs/PERFORMANCE.md, INA.)
constexpr int kInaWindow = 16;
// The head of the first record ranks exchange at creation ("KZVR").
constexpr uint32_t kVersionMagic = 0x52565a4b;
// A host id longer than this is not one (HostId() is a host name and a boot id).
constexpr size_t kMaxHostIdBytes = 4096;
// Nor a tuner plugin's name and version one this long (TunerPlugin::identity).
constexpr size_t kMaxTunerIdBytes = 1024;
// Nor costs this long (AppliedCosts::Digest, its source).
constexpr size_t kMaxCostBytes = 65536;
int InaWindow(const ina::Layout& layout, bool aggregation_device) {
  return aggregation_device ? std::max(kInaWindow, 4 * (layout.aggregator_ports + 1)) : kInaWindow;
}

// "3 ranks on this host's 2 CPUs (oversubscribed: they take turns, the cost model counts it)".
std::string DescribeHostCpus(const CommTopology& shape, int rank) {
  const RankDesc& me = shape.ranks[static_cast<size_t>(rank)];
  int here = 0;
  for (const RankDesc& d : shape.ranks) here += d.host_id == me.host_id ? 1 : 0;
  if (me.host_cpus <= 0) return fmt::format("{} rank(s) on this host, its CPUs unknown", here);
  return fmt::format("{} rank(s) on this host's {} CPUs{}", here, me.host_cpus,
                     here > me.host_cpus ? " (oversubscribed: they take turns, the cost model counts it)" : "");
}

}  // namespace

class Engine::Builder {
 public:
  Builder(Engine& e, const EngineOptions& options, std::shared_ptr<SameProcessGroup> same_process)
      : e_(e), options_(options), same_process_(std::move(same_process)),
        deadline_(Deadline::AfterSeconds(e.config_->timeout_s)) {}

  Status LoadInaLayout();
  // KIZUNA_PLAN_FILE: the plan files for this communicator's size, each checked in the simulator.
  Status LoadPlanFiles();
  Status ExchangeHosts();
  // KIZUNA_COST_FILE: the constants and link costs of this communicator's size (costs_, cost_).
  Status LoadCosts();
  Status Connect(device::Device& device);
  Status JoinSameHostGroup(device::Device& device);
  Status JoinHostGroups(device::Device& device);
  Status AgreeOnShape(device::Device& device);
  Status StartExecutor(device::Device& device);
  // With a trace on every rank (KIZUNA_TRACE_FILE): each rank's clock against rank 0's.
  Status MeasureClockOffsets();
  void LogCreated(device::Device& device) const;

 private:
  // The transport over the fabrics every rank has (more than one rank).
  Status ConnectFabrics(device::Device& device, TransportOptions topts);
  // This rank's row of the shape: its links to the workers, and in an INA job its slowest cable
  // to an aggregation device (the cost model's aggregation cables).
  std::vector<LinkDesc> LinkRow() const;

  Engine& e_;
  const EngineOptions& options_;
  std::shared_ptr<SameProcessGroup> same_process_;
  const Deadline deadline_;
  std::shared_ptr<const ina::Layout> layout_;
  std::string host_;
  std::vector<std::string> rank_hosts_;
  int local_rank_ = 0;
  std::shared_ptr<SameHostGroup> same_host_;
  // Across hosts: this host's ranks' group (JoinHostGroups), and whether every host has one.
  std::shared_ptr<SameHostGroup> host_group_;
  bool host_direct_ = false;
  bool serial_host_work_ = false;  // ExecutorOptions::serial_host_work
  int tracing_ranks_ = 0;          // ranks with a trace file (ExchangeHosts)
  AppliedCosts costs_;             // KIZUNA_COST_FILE's for this size, or the defaults (Create)
  std::shared_ptr<const PlanFiles> plan_files_;  // KIZUNA_PLAN_FILE's for this size (LoadPlanFiles)
  size_t p2p_staging_bytes_ = 0;  // what point-to-point's chunk is cut from (ExecutorOptions)
};

// In-network aggregation: the layout names the job's aggregation devices, the ranks after its
// workers. The communicator is the workers'; the devices join its transport.
Status Engine::Builder::LoadInaLayout() {
  const Config& config = *e_.config_;
  if (config.ina_layout.empty()) return Status::Ok();
  KZ_ASSIGN_OR_RETURN(ina::Layout layout, ina::LoadLayoutFile(config.ina_layout));
  const int ranks = e_.bootstrap_->size();
  if (ranks != layout.workers + layout.aggregators)
    return InvalidArgument(fmt::format("KIZUNA_INA_LAYOUT {}: {} workers and {} aggregation devices, but the job has "
                                       "{} ranks (workers first, then the devices)",
                                       config.ina_layout, layout.workers, layout.aggregators, ranks));
  e_.size_ = layout.workers;
  e_.aggregation_device_ = e_.rank_ >= layout.workers;
  layout_ = std::make_shared<const ina::Layout>(std::move(layout));
  return Status::Ok();
}

Status Engine::Builder::LoadPlanFiles() {
  const Config& config = *e_.config_;
  if (config.plan_files.empty() || e_.aggregation_device_) return Status::Ok();
  PlanFiles files;
  for (const std::string& path : config.plan_files) {
    Result<PlanFile> loaded = LoadPlanFile(path);
    if (!loaded.ok()) return loaded.status().WithContext("KIZUNA_PLAN_FILE");
    PlanFile f = std::move(loaded).value();
    if (f.nranks != e_.size_) {
      if (e_.rank_ == 0)
        KZ_INFO(kLogTune, "KIZUNA_PLAN_FILE: {} ({}) is for {} ranks, not this communicator's {}", f.name, path,
                f.nranks, e_.size_);
      continue;
    }
    KZ_RETURN_IF_ERROR(CheckPlanFile(f).WithContext("KIZUNA_PLAN_FILE"));
    if (e_.rank_ == 0)
      KZ_INFO(kLogTune, "KIZUNA_PLAN_FILE: {} ({}): {} on {} ranks in {} units, checked", f.name, path,
              CollectiveName(f.collective), f.nranks, f.units);
    files.push_back(std::move(f));
  }
  if (!files.empty()) plan_files_ = std::make_shared<const PlanFiles>(std::move(files));
  return Status::Ok();
}

// Who shares this host: the local rank for the fabrics, which pairs direct links can join, and
// whether every rank is here (the same-host group). The first exchange of every communicator, so
// it also carries each rank's version: ranks of different majors (ABIs) stop here, naming both,
// before they meet in any record whose layout a major may change. The record's head (magic,
// major, minor, patch) never changes. After the host comes the rank's tuner plugin (name and
// version, or none), which the workers must share to choose alike; a rank of an earlier minor
// sends none.
Status Engine::Builder::LoadCosts() {
  const std::string& path = e_.config_->cost_file;
  if (!path.empty()) {
    KZ_ASSIGN_OR_RETURN(CostFile file, LoadCostFile(path));
    costs_ = CostsFor(file, e_.size_);
  } else {
    costs_ = CostsFor(CostFile{}, e_.size_);
  }
  e_.cost_ = costs_.constants;
  if (e_.rank_ == 0 && !path.empty())
    KZ_INFO(kLogInit, "the cost model's constants: {} ({}){}", CostConstantsToString(costs_.constants), costs_.source,
            costs_.links.empty() ? "" : " and measured link costs");
  return Status::Ok();
}

Status Engine::Builder::ExchangeHosts() {
  host_ = options_.host_id.empty() ? HostId() : options_.host_id;
  const std::string tuner = e_.tuner_ ? e_.tuner_->identity() : std::string();
  wire::Bytes mine;
  wire::PutU32(mine, kVersionMagic);
  wire::PutI32(mine, options_.version.major);
  wire::PutI32(mine, options_.version.minor);
  wire::PutI32(mine, options_.version.patch);
  wire::PutString(mine, host_);
  wire::PutString(mine, tuner);
  wire::PutU32(mine, e_.config_->trace_file.empty() ? 0 : 1);
  const std::string costs = costs_.Digest();
  wire::PutString(mine, costs);
  wire::PutString(mine, costs_.source);
  KZ_ASSIGN_OR_RETURN(auto rows, e_.bootstrap_->AllGather(mine, deadline_));
  for (size_t r = 0; r < rows.size(); ++r) {
    wire::Reader in(rows[r]);
    const uint32_t magic = in.U32();
    Version v;
    v.major = in.I32();
    v.minor = in.I32();
    v.patch = in.I32();
    const std::span<const uint8_t> host = in.Bytes(kMaxHostIdBytes);
    if (!in.ok() || magic != kVersionMagic)
      return InvalidArgument(fmt::format("rank {} is not a kizuna {} rank (its first record at communicator "
                                         "creation is not this version's): every rank must run one major version",
                                         r, VersionString(options_.version)));
    if (v.major != options_.version.major)
      return InvalidArgument(fmt::format("rank {} runs kizuna {} and this rank (rank {}) kizuna {}: ranks of "
                                         "different major versions (ABIs) cannot form a communicator",
                                         r, VersionString(v), e_.rank_, VersionString(options_.version)));
    rank_hosts_.emplace_back(host.begin(), host.end());
    const std::string their_tuner = in.left() > 0 ? in.String(kMaxTunerIdBytes) : std::string();
    tracing_ranks_ += in.left() > 0 && in.U32() != 0 ? 1 : 0;
    // The same costs on every rank, or the ranks would choose differently (a rank of an earlier
    // minor sends none: the defaults).
    const std::string their_costs = in.left() > 0 ? in.String(kMaxCostBytes) : CostsFor(CostFile{}, 1).Digest();
    const std::string their_source = in.left() > 0 ? in.String(kMaxCostBytes) : std::string("defaults");
    if (their_costs != costs)
      return InvalidArgument(
          fmt::format("rank {} uses the costs of {} and this rank (rank {}) those of {}: every rank "
                      "must load the same KIZUNA_COST_FILE (or none)",
                      r, their_source, e_.rank_, costs_.source));
    // Aggregation devices choose nothing: only the workers compare.
    if (!e_.aggregation_device_ && static_cast<int>(r) < e_.size_)
      KZ_RETURN_IF_ERROR(tuner::CheckSameTuner(tuner, e_.rank_, their_tuner, static_cast<int>(r)));
  }
  for (int r = 0; r < e_.rank_; ++r) local_rank_ += rank_hosts_[static_cast<size_t>(r)] == host_ ? 1 : 0;
  return Status::Ok();
}

Status Engine::Builder::Connect(device::Device& device) {
  TransportOptions topts;
  const size_t staging = options_.staging_bytes > 0 ? options_.staging_bytes : kDefaultStagingBytes;
  topts.staging_bytes = staging;
  topts.force_host_staging = options_.force_host_staging;
  // Point-to-point's chunk is a function of the configured staging and the ranks alone: equal on
  // every rank, as a transfer's chunks must be. Its slots are the transport's second region, grown
  // to what an operation's transfers use (Transport::ReserveP2p).
  p2p_staging_bytes_ = Executor::P2pStagingBytes(e_.bootstrap_->size(), staging);
  if (e_.bootstrap_->size() == 1) {
    // Nothing to connect: no fabric is needed (or wanted: a one-rank job must work anywhere).
    KZ_ASSIGN_OR_RETURN(e_.transport_, Transport::CreateSingle(device, topts));
    return Status::Ok();
  }
  // Not in INA jobs: their workers' and aggregation devices' slots must match (InaWindow).
  if (options_.staging_bytes == 0 && !layout_) topts.network_staging_bytes = kNetworkStagingBytes;
  // An aggregation device keeps more steps in flight (InaWindow): its staging grows with its
  // window, so that its slots are as large as the workers' chunks.
  if (layout_ && e_.aggregation_device_)
    topts.staging_bytes = topts.staging_bytes / kInaWindow * static_cast<size_t>(InaWindow(*layout_, true));
  // An aggregation device learns that the job ended from its workers' connections closing, so an
  // INA job connects its ranks at creation (its pairs are the layout's cables); other jobs connect
  // a pair when an operation first needs it.
  topts.connect_at_creation = layout_ != nullptr;
  // An INA job's aggregation devices serve their workers and relay nothing.
  topts.forward = layout_ == nullptr;
  // Rails: local rank i of every host between hosts over NIC i (transport.h).
  if (!layout_) {
    topts.rank_hosts = rank_hosts_;
    topts.nics = e_.config_->nics;
    topts.machine_topology = e_.config_->machine_topology;
  }
  return ConnectFabrics(device, topts);
}

Status Engine::Builder::ConnectFabrics(device::Device& device, TransportOptions topts) {
  fabric::FabricContext context;
  context.rank = e_.rank_;
  context.world_size = e_.bootstrap_->size();
  if (e_.aggregation_device_) context.node = ina::Node::Aggregator(e_.rank_ - layout_->workers).Name();
  if (layout_)
    for (int a = 0; a < layout_->aggregators; ++a)
      context.node_ranks[ina::Node::Aggregator(a).Name()] = layout_->workers + a;
  context.local_rank = local_rank_;
  context.host_id = host_;
  context.rank_hosts = rank_hosts_;
  context.device_uuids = {device.properties().uuid};
  // With no topology given, every pair of ranks on one host is one hop of shared memory away:
  // describe that to the fabrics as direct-connect links ("full" links the ranks of each host,
  // since the fabric knows every rank's host), so that they can use direct links (single-copy,
  // mapped peer memory) instead of a network stack; pairs across hosts take a network fabric.
  const Config& config = *e_.config_;
  e_.fabric_config_ = config;
  if (e_.fabric_config_.topology.empty()) e_.fabric_config_.topology = "full";
  // An INA job without a topology file runs on the layout's cables (the circuit switch's map).
  std::string layout_topology;
  if (layout_ && config.topology.empty()) {
    KZ_ASSIGN_OR_RETURN(layout_topology, ina::WriteTopologyFile(*layout_));
    e_.fabric_config_.topology = layout_topology;
  }
  e_.fabrics_ = fabric::FabricRegistry::Create(e_.fabric_config_, context);
  if (!layout_topology.empty()) ::unlink(layout_topology.c_str());
  KZ_ASSIGN_OR_RETURN(std::vector<fabric::Fabric*> common,
                      AgreeOnFabrics(*e_.fabrics_, *e_.bootstrap_, e_.rank_, deadline_));
  KZ_ASSIGN_OR_RETURN(e_.transport_, Transport::Create(common, *e_.bootstrap_, device, topts, deadline_));
  return Status::Ok();
}

// Ranks of one host in several processes share their allocations for the fused collectives when
// their devices allow (same_host_group.h); all ranks take part in deciding.
Status Engine::Builder::JoinSameHostGroup(device::Device& device) {
  const bool one_host = std::all_of(rank_hosts_.begin(), rank_hosts_.end(), [&](const auto& h) { return h == host_; });
  if (same_process_ != nullptr || layout_ || e_.size_ == 1 || !one_host || !options_.direct_access)
    return Status::Ok();
  auto allgather = [&](std::span<const uint8_t> bytes) { return e_.bootstrap_->AllGather(bytes, deadline_); };
  Result<std::shared_ptr<SameHostGroup>> group = SameHostGroup::Create(e_.rank_, e_.size_, device, allgather);
  if (group.ok()) {
    same_host_ = std::move(*group);
    if (e_.rank_ == 0)
      KZ_INFO(kLogInit, "{} ranks on one host in separate processes share their buffers directly (fused "
                        "algorithms available; each rank maps a peer's buffer on first use)", e_.size_);
    return Status::Ok();
  }
  if (group.status().code() != StatusCode::kNotSupported)
    return group.status().WithContext("setting up the ranks' shared buffers");
  if (e_.rank_ == 0)
    KZ_INFO(kLogInit, "ranks on one host do not share buffers directly (fused algorithms not available): {}",
            group.status().message());
  return Status::Ok();
}

std::vector<LinkDesc> Engine::Builder::LinkRow() const {
  std::vector<LinkDesc> full_row = e_.transport_->link_row();
  // KIZUNA_COST_FILE's measured link costs, per fabric, over what the fabrics declare.
  for (size_t q = 0; q < full_row.size() && !costs_.links.empty(); ++q) {
    const auto it = costs_.links.find(std::string(e_.transport_->FabricOf(static_cast<int>(q))));
    if (it == costs_.links.end() || !full_row[q].reachable) continue;
    if (it->second.latency_us > 0) full_row[q].latency_us = it->second.latency_us;
    if (it->second.gbps > 0) full_row[q].gbps = it->second.gbps;
  }
  std::vector<LinkDesc> row(full_row.begin(), full_row.begin() + std::min<ptrdiff_t>(e_.size_, std::ssize(full_row)));
  if (!layout_) return row;
  LinkDesc slowest;
  for (size_t q = static_cast<size_t>(e_.size_); q < full_row.size(); ++q) {
    const LinkDesc& l = full_row[q];
    if (!l.reachable) continue;
    if (!slowest.reachable || l.gbps < slowest.gbps) slowest.gbps = l.gbps;
    slowest.latency_us = std::max(slowest.latency_us, l.latency_us);
    slowest.reachable = true;
  }
  row.push_back(slowest);
  return row;
}

// Across hosts, the ranks of each host share their buffers through a group of their own, as the
// ranks of a single host do (JoinSameHostGroup), for hier:fused's host level: where every host's
// group forms, the CPU reaches every rank's memory and each rank has a process of its own. Every
// rank makes the same three allgathers (SameHostGroup::Create's two, over the host's ranks only;
// a rank alone on its host makes them with nothing to say), then all agree.
Status Engine::Builder::JoinHostGroups(device::Device& device) {
  const bool one_host = std::all_of(rank_hosts_.begin(), rank_hosts_.end(), [&](const auto& h) { return h == host_; });
  if (same_process_ != nullptr || layout_ || e_.size_ == 1 || one_host || !options_.direct_access)
    return Status::Ok();
  std::vector<int> locals;
  for (int r = 0; r < e_.size_; ++r)
    if (rank_hosts_[static_cast<size_t>(r)] == host_) locals.push_back(r);
  auto allgather = [&](std::span<const uint8_t> bytes) -> Result<std::vector<std::vector<uint8_t>>> {
    KZ_ASSIGN_OR_RETURN(auto all, e_.bootstrap_->AllGather(bytes, deadline_));
    std::vector<std::vector<uint8_t>> here;
    for (int r : locals) here.push_back(std::move(all[static_cast<size_t>(r)]));
    return here;
  };
  std::string why;
  bool usable = false;
  if (locals.size() > 1) {
    const int me = static_cast<int>(std::find(locals.begin(), locals.end(), e_.rank_) - locals.begin());
    Result<std::shared_ptr<SameHostGroup>> group =
        SameHostGroup::Create(me, static_cast<int>(locals.size()), device, allgather);
    if (group.ok()) {
      host_group_ = std::move(*group);
      host_group_->set_rank_names(locals);
      usable = host_group_->host_accessible() && host_group_->one_rank_per_process();
      if (!usable) why = "a rank's memory is out of the CPU's reach, or ranks share a process";
    } else if (group.status().code() == StatusCode::kNotSupported) {
      why = std::string(group.status().message());
    } else {
      return group.status().WithContext("setting up the host's shared buffers");
    }
  } else {
    for (int i = 0; i < 2; ++i) KZ_RETURN_IF_ERROR(allgather({}).status());
    usable = device.properties().host_accessible;
    if (!usable) why = "its memory is out of the CPU's reach";
  }
  const uint8_t vote = usable ? 1 : 0;
  KZ_ASSIGN_OR_RETURN(auto votes, e_.bootstrap_->AllGather(std::span(&vote, 1), deadline_));
  int against = -1;
  for (int r = 0; r < e_.size_ && against < 0; ++r)
    if (votes[static_cast<size_t>(r)] != std::vector<uint8_t>{1}) against = r;
  host_direct_ = against < 0;
  if (!host_direct_) host_group_.reset();
  if (e_.rank_ == 0)
    KZ_INFO(kLogInit, "{}", host_direct_ ? std::string("the ranks of each host share their buffers (hier:fused available)")
                                         : fmt::format("hier:fused not available: rank {} {}", against,
                                                       against == 0 ? why : "cannot share its host's buffers"));
  return Status::Ok();
}

// The shape: every rank's device and link row, allgathered, so every rank holds the same.
Status Engine::Builder::AgreeOnShape(device::Device& device) {
  const device::DeviceProperties& props = device.properties();
  RankDesc me;
  me.host_id = host_;
  me.device = device.label();
  me.copy_gbps = props.copy_gbps;
  me.reduce_gbps = props.reduce_gbps;
  me.launch_us = props.launch_latency_us;
  // The ranks' CPUs together where they share a host group (ranks bound to a CPU each see one),
  // else this process's.
  me.host_cpus = same_host_ && same_host_->cpus() > 0 ? same_host_->cpus() : UsableCpuCount();
  me.host_compute = props.host_compute;
  me.host_memory = props.host_accessible;
  KZ_ASSIGN_OR_RETURN(auto rows, e_.bootstrap_->AllGather(EncodeRankRow(me, LinkRow()), deadline_));
  CommTopology shape;
  shape.nranks = e_.size_;
  shape.ranks.resize(static_cast<size_t>(e_.size_));
  shape.links.resize(static_cast<size_t>(e_.size_) * static_cast<size_t>(e_.size_));
  for (int r = 0; r < e_.size_; ++r) {
    LinkDesc extra;
    KZ_RETURN_IF_ERROR(
        DecodeRankRow(rows[static_cast<size_t>(r)], r, shape, layout_ ? std::span(&extra, 1) : std::span<LinkDesc>()));
    // The slowest worker's slowest cable stands for every aggregation cable.
    if (layout_ && extra.reachable &&
        (!shape.ina_link.reachable || extra.gbps < shape.ina_link.gbps || shape.ina_link.gbps == 0)) {
      const double latency = std::max(shape.ina_link.latency_us, extra.latency_us);
      shape.ina_link = extra;
      shape.ina_link.latency_us = latency;
    }
  }
  // A link is usable only when both directions are (every transfer needs its connection).
  for (int a = 0; a < e_.size_; ++a)
    for (int b = 0; b < e_.size_; ++b)
      if (a == b || !shape.link(a, b).reachable || !shape.link(b, a).reachable) shape.link(a, b).reachable = false;
  shape.direct = same_process_ != nullptr || same_host_ != nullptr;
  shape.host_direct = host_direct_;
  if (same_host_) shape.direct_inline_bytes = same_host_->one_shot_bytes();
  shape.ina = layout_;
  shape.plan_files = plan_files_;
  KZ_RETURN_IF_ERROR(shape.Validate());
  // Ranks on this machine, counted by the kernel's boot id in their host ids (MachineOf): hosts
  // made of containers or network namespaces share one kernel's CPUs under different host names.
  int here = 0;
  for (const RankDesc& d : shape.ranks) here += MachineOf(d.host_id) == MachineOf(me.host_id) ? 1 : 0;
  if (me.host_cpus > 0 && here > me.host_cpus) {
    SetHostOversubscribed();  // the fabrics' waits give the CPU away
    if (host_group_) host_group_->SetOversubscribed();
  }
  // Across hosts, where a rank's CPU work competes with the network stacks of the machine's other
  // ranks (2 namespace hosts of one rank on 2 CPUs, 1 MiB AllReduce: see ExecutorOptions).
  const bool across_hosts = std::any_of(shape.ranks.begin(), shape.ranks.end(),
                                        [&](const RankDesc& d) { return d.host_id != me.host_id; });
  serial_host_work_ = across_hosts && me.host_cpus > 0 && here >= me.host_cpus;
  e_.shape_ = std::move(shape);
  return Status::Ok();
}

// NTP's way over the bootstrap: rank r sends its time t0, rank 0 answers with its own T, rank r
// reads t1; its offset is (t0 + t1) / 2 - T, from the shortest of kClockPings round trips. Rank 0
// serves the ranks in turn. Only where every rank traces: the others would not answer.
Status Engine::Builder::MeasureClockOffsets() {
  constexpr int kClockPings = 5;
  constexpr uint32_t kClockTag = 0x100;  // below Communicator::Split's tags
  Tracer* tracer = e_.executor_ ? e_.executor_->tracer() : nullptr;
  const int n = e_.bootstrap_->size();
  if (tracer == nullptr || n == 1) return Status::Ok();
  if (tracing_ranks_ != n) {
    KZ_WARN(kLogInit,
            "rank {}: KIZUNA_TRACE_FILE is set on {} of {} ranks: clock offsets not measured (the traces "
            "are merged as if the clocks agreed)",
            e_.rank_, tracing_ranks_, n);
    tracer->SetClockOffset(0, 0, false);
    return Status::Ok();
  }
  auto put = [](uint64_t v) {
    wire::Bytes b;
    wire::PutU64(b, v);
    return b;
  };
  auto get = [](const bootstrap::Bytes& b) {
    wire::Reader in(b);
    return in.U64();
  };
  bootstrap::Bootstrap& boot = *e_.bootstrap_;
  if (e_.rank_ == 0) {
    for (int r = 1; r < n; ++r) {
      for (int i = 0; i < kClockPings; ++i) {
        KZ_RETURN_IF_ERROR(boot.Recv(r, kClockTag, deadline_).status());
        KZ_RETURN_IF_ERROR(boot.Send(r, kClockTag, put(Tracer::NowUs()), deadline_));
      }
    }
    tracer->SetClockOffset(0, 0, true);
    return Status::Ok();
  }
  double best_rtt = -1, offset = 0;
  for (int i = 0; i < kClockPings; ++i) {
    const uint64_t t0 = Tracer::NowUs();
    KZ_RETURN_IF_ERROR(boot.Send(0, kClockTag, put(t0), deadline_));
    KZ_ASSIGN_OR_RETURN(bootstrap::Bytes answer, boot.Recv(0, kClockTag, deadline_));
    const uint64_t t1 = Tracer::NowUs();
    const double rtt = static_cast<double>(t1 - t0);
    if (best_rtt < 0 || rtt < best_rtt) {
      best_rtt = rtt;
      offset = (static_cast<double>(t0) + static_cast<double>(t1)) / 2 - static_cast<double>(get(answer));
    }
  }
  tracer->SetClockOffset(offset, best_rtt, true);
  KZ_INFO(kLogInit, "rank {}: clock offset to rank 0 {:.1f} us (round trip {:.1f} us), for the trace", e_.rank_, offset,
          best_rtt);
  return Status::Ok();
}

Status Engine::Builder::StartExecutor(device::Device& device) {
  ExecutorOptions eopts;
  eopts.timeout_s = e_.config_->timeout_s;
  eopts.dump_on_timeout = e_.config_->dump_on_timeout;
  eopts.trace_file = e_.config_->trace_file;
  eopts.p2p_staging_bytes = p2p_staging_bytes_;
  eopts.chunk_bytes = e_.config_->chunk_bytes.value_or(0);
  eopts.same_process = same_process_;
  eopts.same_host = same_host_;
  eopts.host_group = host_group_;
  eopts.rank = e_.rank_;
  for (const RankDesc& d : e_.shape_.ranks) eopts.host_memory.push_back(d.host_memory);
  eopts.serial_host_work = serial_host_work_;
  // INA jobs: deeper windows (InaWindow).
  if (layout_) eopts.window = InaWindow(*layout_, e_.aggregation_device_);
  if (e_.aggregation_device_) {
    eopts.workers = e_.size_;
    // Plans for what the workers start (their operation headers say what): this device's part.
    Engine* self = &e_;
    eopts.serve = [self](const CollectiveRequest& request, Algorithm algorithm, uint64_t chunk_count,
                         int channels) -> Result<std::shared_ptr<const Plan>> {
      if (algorithm != Algorithm::kIna)
        return InvalidArgument(fmt::format("an aggregation device serves ina, not {}", AlgorithmName(algorithm)));
      PlanOptions po;
      po.chunk_count = chunk_count;
      po.channels = channels;
      KZ_ASSIGN_OR_RETURN(Plan plan, BuildPlan(algorithm, request, self->shape_, po, self->rank_));
      return std::make_shared<const Plan>(std::move(plan));
    };
  }
  KZ_ASSIGN_OR_RETURN(e_.executor_, Executor::Create(e_.transport_.get(), &device, eopts));
  // Small operations run on the calling thread where every rank's device computes on the host and
  // each process drives one rank (CommTopology::caller_inline_bytes; the model counts no
  // hand-offs for them). Every rank computes the same: the same devices' kind, and every rank has
  // a network peer or none.
  const bool all_host =
      std::all_of(e_.shape_.ranks.begin(), e_.shape_.ranks.end(), [](const RankDesc& d) { return d.host_compute; });
  if (all_host && same_process_ == nullptr) e_.shape_.caller_inline_bytes = e_.executor_->caller_op_bytes();
  return Status::Ok();
}

void Engine::Builder::LogCreated(device::Device& device) const {
  if (e_.aggregation_device_) {
    KZ_INFO(kLogInit, "aggregation device {} (rank {} of a job of {} workers) on {}, {}",
            ina::Node::Aggregator(e_.rank_ - layout_->workers).Name(), e_.rank_, e_.size_, device.label(),
            e_.transport_->description());
    return;
  }
  KZ_INFO(kLogInit, "communicator rank {} of {} on {} ({}), {}; {} host(s), {}{}", e_.rank_, e_.size_, device.label(),
          device.properties().name, e_.transport_->description(), e_.shape_.host_count(),
          DescribeHostCpus(e_.shape_, e_.rank_),
          layout_ ? fmt::format("; INA layout {} with {} aggregation devices, {:.3g} x b", e_.config_->ina_layout,
                                layout_->aggregators, layout_->bandwidth())
                  : std::string());
}

Result<std::unique_ptr<Engine>> Engine::Create(std::shared_ptr<bootstrap::Bootstrap> bootstrap, device::Device& device,
                                               const EngineOptions& options,
                                               std::shared_ptr<SameProcessGroup> same_process) {
  if (!bootstrap) return InvalidArgument("Engine::Create: no bootstrap");
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = options.config != nullptr ? options.config : &GlobalConfig();
  e->rank_ = bootstrap->rank();
  e->size_ = bootstrap->size();
  e->bootstrap_ = std::move(bootstrap);
  e->device_ = &device;
  Builder b(*e, options, std::move(same_process));
  KZ_RETURN_IF_ERROR(b.LoadInaLayout());
  KZ_RETURN_IF_ERROR(b.LoadPlanFiles());
  // KIZUNA_TUNER_PLUGIN: named explicitly, so a library that cannot be used fails creation (before
  // the ranks compare their plugins in ExchangeHosts). Aggregation devices choose nothing.
  if (!e->config_->tuner_plugin.empty() && !e->aggregation_device_) {
    KZ_ASSIGN_OR_RETURN(e->tuner_, tuner::TunerPlugin::Load(e->config_->tuner_plugin));
  }
  KZ_RETURN_IF_ERROR(b.LoadCosts());
  KZ_RETURN_IF_ERROR(b.ExchangeHosts());
  KZ_RETURN_IF_ERROR(b.Connect(device));
  KZ_RETURN_IF_ERROR(b.JoinSameHostGroup(device));
  KZ_RETURN_IF_ERROR(b.JoinHostGroups(device));
  KZ_RETURN_IF_ERROR(b.AgreeOnShape(device));
  if (e->tuner_) KZ_RETURN_IF_ERROR(e->tuner_->Init(e->rank_, e->shape_));
  // KIZUNA_ALGO, parsed once: a malformed value fails creation, naming the bad item, instead of
  // every call; names not available yet are logged once.
  KZ_ASSIGN_OR_RETURN(e->overrides_, ParseAlgoOverrides(e->config_->algo));
  if (e->rank_ == 0)
    for (const std::string& w : e->overrides_.warnings) KZ_WARN(kLogTune, "KIZUNA_ALGO: {}", w);
  KZ_RETURN_IF_ERROR(b.StartExecutor(device));
  KZ_RETURN_IF_ERROR(b.MeasureClockOffsets());
  b.LogCreated(device);
  return e;
}

}  // namespace kizuna::collectives
