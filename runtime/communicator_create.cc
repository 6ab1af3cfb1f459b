// Creating communicators: from a unique id, a bootstrap, the launcher's environment, or N local
// devices (communicator.h). Every rank allgathers its host, agrees with the others on the fabrics
// they all have, connects (collectives/transport/transport.h), and builds the shape the engine plans with.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/executor/executor.h"
#include "collectives/ina/layout.h"
#include "collectives/cost/selector.h"
#include "collectives/transport/transport.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/communicator.h"
#include "runtime/communicator_internal.h"
#include "runtime/device/registry.h"
#include "runtime/core/host_id.h"
#include "runtime/core/logging.h"

namespace kizuna {
namespace {

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
  const int32_t cpus = me.host_cpus;
  Put(out, &cpus, sizeof cpus);
  const uint8_t compute = me.host_compute ? 1 : 0;
  Put(out, &compute, 1);
  for (const collectives::LinkDesc& l : row) {
    const uint8_t flags = (l.reachable ? 1 : 0) | (l.staged ? 2 : 0);
    Put(out, &flags, 1);
    Put(out, &l.latency_us, sizeof l.latency_us);
    Put(out, &l.gbps, sizeof l.gbps);
  }
  return out;
}

// "3 ranks on this host's 2 CPUs (oversubscribed: they take turns, the cost model counts it)".
std::string DescribeHostCpus(const collectives::CommShape& shape, int rank) {
  const collectives::RankDesc& me = shape.ranks[static_cast<size_t>(rank)];
  int here = 0;
  for (const collectives::RankDesc& d : shape.ranks) here += d.host_id == me.host_id ? 1 : 0;
  if (me.host_cpus <= 0) return fmt::format("{} rank(s) on this host, its CPUs unknown", here);
  return fmt::format("{} rank(s) on this host's {} CPUs{}", here, me.host_cpus,
                     here > me.host_cpus ? " (oversubscribed: they take turns, the cost model counts it)" : "");
}

// The executor's window in INA jobs. An INA plan has many steps per chunk at a node with
// children (a receive per child, a reduce, a send up, a receive down, a send per child), and a
// chunk stays in flight for a round trip through the tree, so a node must hold several chunks'
// steps at once. Workers use kInaWindow (their staging slots, and so the chunks, get smaller with
// it: finer pipelining); an aggregation device with E ports 4(E+1), about two chunks of its E+5
// steps. (A deeper window, 8(E+2), did not speed up the two-level tree that runs slowest under
// link shaping: docs/PERFORMANCE.md.)
constexpr int kInaWindow = 16;
// CommOptions::staging_bytes 0: this much, or kNetworkStagingBytes when a peer is reached over a
// network (a 2-channel window of 4 slots of collectives' kNetworkChunkBytes).
constexpr size_t kDefaultStagingBytes = 8u << 20;
constexpr size_t kNetworkStagingBytes = 16u << 20;
int InaWindow(const collectives::ina::Layout& layout, bool aggregation_device) {
  return aggregation_device ? std::max(kInaWindow, 4 * (layout.aggregator_ports + 1)) : kInaWindow;
}

// KIZUNA_INA_LAYOUT: the layout file, read and validated (ina::FromJson names the problem).
Result<std::shared_ptr<const collectives::ina::Layout>> LoadInaLayout(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(fmt::format("KIZUNA_INA_LAYOUT {}: cannot read the file", path));
  std::stringstream text;
  text << in.rdbuf();
  KZ_ASSIGN_OR_RETURN(collectives::ina::Layout layout, collectives::ina::FromJson(text.str(), path));
  return std::make_shared<const collectives::ina::Layout>(std::move(layout));
}

// The layout's cables as a directconnect topology file of this process (removed once the fabrics
// have read it). Every rank writes the same content, so their topology fingerprints agree.
Result<std::string> WriteLayoutTopology(const collectives::ina::Layout& layout) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/kizuna-ina-topology-XXXXXX", tmp != nullptr && *tmp != 0 ? tmp : "/tmp");
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return FromErrno(errno, "mkstemp " + path);
  const std::string json = collectives::ina::TopologyJson(layout, 0, 0, false);
  const ssize_t n = ::write(fd, json.data(), json.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(json.size())) {
    ::unlink(path.c_str());
    return FromErrno(n < 0 ? err : EIO, "write " + path);
  }
  return path;
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

// `extra`: the number of links after the rank's row (an INA job's slowest cable to a device).
Status DecodeRankRow(const bootstrap::Bytes& bytes, int rank, collectives::CommShape& shape,
                     std::vector<collectives::LinkDesc>* extra = nullptr) {
  RowReader r(bytes);
  collectives::RankDesc& d = shape.ranks[static_cast<size_t>(rank)];
  int32_t cpus = 0;
  uint8_t compute = 0;
  bool ok = r.GetString(&d.host_id) && r.GetString(&d.device) && r.Get(&d.copy_gbps, 8) &&
            r.Get(&d.reduce_gbps, 8) && r.Get(&d.launch_us, 8) && r.Get(&cpus, 4) && r.Get(&compute, 1);
  d.host_cpus = std::max<int32_t>(cpus, 0);
  d.host_compute = compute != 0;
  const size_t n = static_cast<size_t>(shape.nranks) + (extra != nullptr ? extra->size() : 0);
  for (size_t q = 0; ok && q < n; ++q) {
    collectives::LinkDesc& l = q < static_cast<size_t>(shape.nranks) ? shape.link(rank, static_cast<int>(q))
                                                                      : (*extra)[q - static_cast<size_t>(shape.nranks)];
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
// Creation

Result<std::unique_ptr<Communicator>> Communicator::Init(std::shared_ptr<bootstrap::Bootstrap> boot,
                                                         device::Device& device, const CommOptions& options,
                                                         std::shared_ptr<collectives::SameProcessGroup> direct) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->config_ = options.config != nullptr ? options.config : &GlobalConfig();
  c->options_ = options;
  c->rank_ = boot->rank();
  c->size_ = boot->size();
  const Config& cfg = options.config != nullptr ? *options.config : GlobalConfig();
  // In-network aggregation: the layout names the job's aggregation devices, the ranks after its
  // workers. The communicator is the workers'; the devices join its transport.
  std::shared_ptr<const collectives::ina::Layout> layout;
  if (!cfg.ina_layout.empty()) {
    KZ_ASSIGN_OR_RETURN(layout, LoadInaLayout(cfg.ina_layout));
    if (boot->size() != layout->workers + layout->aggregators)
      return InvalidArgument(fmt::format("KIZUNA_INA_LAYOUT {}: {} workers and {} aggregation devices, but the job has "
                                         "{} ranks (workers first, then the devices)",
                                         cfg.ina_layout, layout->workers, layout->aggregators, boot->size()));
    c->size_ = layout->workers;
    c->aggregation_device_ = c->rank_ >= layout->workers;
  }
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

  const size_t staging_bytes = options.staging_bytes > 0 ? options.staging_bytes : kDefaultStagingBytes;
  if (c->bootstrap_->size() == 1) {
    // Nothing to connect: no fabric is needed (or wanted: a one-rank job must work anywhere).
    collectives::TransportOptions topts;
    topts.staging_bytes = staging_bytes;
    topts.force_host_staging = options.force_host_staging;
    KZ_ASSIGN_OR_RETURN(c->transport_, collectives::Transport::CreateSingle(device, topts));
  } else {
    fabric::FabricContext context;
    context.rank = c->rank_;
    context.world_size = c->bootstrap_->size();
    if (c->aggregation_device_)
      context.node = collectives::ina::Node::Aggregator(c->rank_ - layout->workers).Name();
    if (layout)
      for (int a = 0; a < layout->aggregators; ++a)
        context.node_ranks[collectives::ina::Node::Aggregator(a).Name()] = layout->workers + a;
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
    // An INA job without a topology file runs on the layout's cables (the circuit switch's map).
    std::string layout_topology;
    if (layout && config.topology.empty()) {
      KZ_ASSIGN_OR_RETURN(layout_topology, WriteLayoutTopology(*layout));
      c->fabric_config_.topology = layout_topology;
    }
    c->fabrics_ = fabric::FabricRegistry::Create(c->fabric_config_, context);
    if (!layout_topology.empty()) ::unlink(layout_topology.c_str());
    KZ_ASSIGN_OR_RETURN(std::vector<fabric::Fabric*> common,
                        AgreeOnFabrics(*c->fabrics_, *c->bootstrap_, c->rank_, deadline));

    collectives::TransportOptions topts;
    topts.staging_bytes = staging_bytes;
    // Not in INA jobs: their workers' and aggregation devices' slots must match (InaWindow).
    if (options.staging_bytes == 0 && !layout) topts.network_staging_bytes = kNetworkStagingBytes;
    // An aggregation device keeps more steps in flight (InaWindow): its staging grows with its
    // window, so that its slots are as large as the workers' chunks.
    if (layout && c->aggregation_device_)
      topts.staging_bytes = staging_bytes / kInaWindow * static_cast<size_t>(InaWindow(*layout, true));
    topts.force_host_staging = options.force_host_staging;
    KZ_ASSIGN_OR_RETURN(c->transport_,
                        collectives::Transport::Create(common, *c->bootstrap_, device, topts, deadline));
  }

  // Ranks of one host in several processes share their allocations for the fused collectives
  // when their devices allow (same_host.h); all ranks take part in deciding.
  std::shared_ptr<collectives::SameHostGroup> same_host;
  const bool one_host = std::all_of(hosts.begin(), hosts.end(),
                                    [&](const auto& h) { return std::string(h.begin(), h.end()) == host; });
  if (direct == nullptr && !layout && c->size_ > 1 && one_host && options.direct_access) {
    auto allgather = [&](std::span<const uint8_t> bytes) { return c->bootstrap_->AllGather(bytes, deadline); };
    auto group = collectives::SameHostGroup::Create(c->rank_, c->size_, device, allgather);
    if (group.ok()) {
      same_host = std::move(*group);
      if (c->rank_ == 0)
        KZ_INFO(kLogInit, "{} ranks on one host in separate processes share their buffers directly (fused "
                          "algorithms available; each rank maps a peer's buffer on first use)", c->size_);
    } else if (group.status().code() == StatusCode::kNotSupported) {
      if (c->rank_ == 0)
        KZ_INFO(kLogInit, "ranks on one host do not share buffers directly (fused algorithms not available): {}",
                group.status().message());
    } else {
      return group.status().WithContext("setting up the ranks' shared buffers");
    }
  }

  // The shape: every rank's device and link row, allgathered, so every rank holds the same.
  collectives::RankDesc me;
  me.host_id = host;
  me.device = device.label();
  me.copy_gbps = props.copy_gbps;
  me.reduce_gbps = props.reduce_gbps;
  me.launch_us = props.launch_latency_us;
  // The ranks' CPUs together where they share a host group (ranks bound to a CPU each see one),
  // else this process's.
  me.host_cpus = same_host && same_host->cpus() > 0 ? same_host->cpus() : UsableCpuCount();
  me.host_compute = props.host_compute;
  // The links among the workers; in an INA job, then this rank's slowest cable to an aggregation
  // device (the cost model's aggregation cables).
  const std::vector<collectives::LinkDesc>& full_row = c->transport_->link_row();
  std::vector<collectives::LinkDesc> row(full_row.begin(),
                                         full_row.begin() + std::min<ptrdiff_t>(c->size_, std::ssize(full_row)));
  if (layout) {
    collectives::LinkDesc slowest;
    for (size_t q = static_cast<size_t>(c->size_); q < full_row.size(); ++q) {
      const collectives::LinkDesc& l = full_row[q];
      if (!l.reachable) continue;
      if (!slowest.reachable || l.gbps < slowest.gbps) slowest.gbps = l.gbps;
      slowest.latency_us = std::max(slowest.latency_us, l.latency_us);
      slowest.reachable = true;
    }
    row.push_back(slowest);
  }
  KZ_ASSIGN_OR_RETURN(auto rows, c->bootstrap_->AllGather(EncodeRankRow(me, row), deadline));
  collectives::CommShape shape;
  shape.nranks = c->size_;
  shape.ranks.resize(static_cast<size_t>(c->size_));
  shape.links.resize(static_cast<size_t>(c->size_) * static_cast<size_t>(c->size_));
  for (int r = 0; r < c->size_; ++r) {
    std::vector<collectives::LinkDesc> extra(layout ? 1 : 0);
    KZ_RETURN_IF_ERROR(DecodeRankRow(rows[static_cast<size_t>(r)], r, shape, &extra));
    // The slowest worker's slowest cable stands for every aggregation cable.
    if (!extra.empty() && extra[0].reachable &&
        (!shape.ina_link.reachable || extra[0].gbps < shape.ina_link.gbps || shape.ina_link.gbps == 0)) {
      const double latency = std::max(shape.ina_link.latency_us, extra[0].latency_us);
      shape.ina_link = extra[0];
      shape.ina_link.latency_us = latency;
    }
  }
  // A link is usable only when both directions are (every transfer needs its connection).
  for (int a = 0; a < c->size_; ++a)
    for (int b = 0; b < c->size_; ++b)
      if (a == b || !shape.link(a, b).reachable || !shape.link(b, a).reachable) shape.link(a, b).reachable = false;
  shape.direct = direct != nullptr || same_host != nullptr;
  if (same_host) shape.direct_inline_bytes = same_host->one_shot_bytes();
  shape.ina = layout;
  KZ_RETURN_IF_ERROR(shape.Validate());
  c->shape_ = std::move(shape);

  // KIZUNA_ALGO, parsed once: a malformed value fails creation, naming the bad item, instead of
  // every call; names not available yet are logged once.
  KZ_ASSIGN_OR_RETURN(c->overrides_, collectives::ParseAlgoOverrides(config.algo));
  if (c->rank_ == 0)
    for (const std::string& w : c->overrides_.warnings) KZ_WARN(kLogTune, "KIZUNA_ALGO: {}", w);

  collectives::ExecutorOptions eopts;
  eopts.timeout_s = config.timeout_s;
  eopts.same_process = std::move(direct);
  eopts.same_host = std::move(same_host);
  eopts.rank = c->rank_;
  // INA jobs: deeper windows (InaWindow).
  if (layout) eopts.window = InaWindow(*layout, c->aggregation_device_);
  if (c->aggregation_device_) {
    eopts.workers = c->size_;
    // Plans for what the workers start (their operation headers say what): this device's part.
    Communicator* self = c.get();
    eopts.serve = [self](const collectives::CollectiveRequest& request, collectives::Algorithm algorithm,
                         uint64_t chunk_count, int channels) -> Result<std::shared_ptr<const collectives::Plan>> {
      if (algorithm != collectives::Algorithm::kIna)
        return InvalidArgument(fmt::format("an aggregation device serves ina, not {}", AlgorithmName(algorithm)));
      collectives::PlanOptions po;
      po.chunk_count = chunk_count;
      po.channels = channels;
      KZ_ASSIGN_OR_RETURN(collectives::Plan plan, collectives::BuildPlan(algorithm, request, self->shape_, po, self->rank_));
      return std::make_shared<const collectives::Plan>(std::move(plan));
    };
  }
  KZ_ASSIGN_OR_RETURN(c->executor_, collectives::Executor::Create(c->transport_.get(), &device, eopts));

  if (c->aggregation_device_)
    KZ_INFO(kLogInit, "aggregation device {} (rank {} of a job of {} workers) on {}, {}",
            collectives::ina::Node::Aggregator(c->rank_ - layout->workers).Name(), c->rank_, c->size_, device.label(),
            c->transport_->description());
  else
    KZ_INFO(kLogInit, "communicator rank {} of {} on {} ({}), {}; {} host(s), {}{}", c->rank_, c->size_, device.label(),
            props.name, c->transport_->description(), c->shape_.host_count(), DescribeHostCpus(c->shape_, c->rank_),
            layout ? fmt::format("; INA layout {} with {} aggregation devices, {:.3g} x b", cfg.ina_layout,
                                 layout->aggregators, layout->bandwidth())
                   : std::string());
  return c;
}

std::string Communicator::DescribeConnections() const { return transport_->description(); }

Status Communicator::ServeAggregation(uint64_t* served) {
  if (!aggregation_device_)
    return InvalidArgument(fmt::format("rank {} is a worker, not an aggregation device", rank_));
  return executor_->WaitServing(served);
}

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
  auto group = direct ? std::make_shared<collectives::SameProcessGroup>(n) : nullptr;
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

}  // namespace kizuna
