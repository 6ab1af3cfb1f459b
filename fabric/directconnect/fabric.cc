#include "fabric/directconnect/fabric.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "fabric/directconnect/endpoint.h"
#include "fabric/registry.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::directconnect {
namespace {

// Handles name the host by its boot id (two processes share memfds exactly when they run under
// one kernel instance); 0 when it cannot be read, which then matches only itself.
uint64_t HostFingerprint() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(in >> id)) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : id) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

constexpr std::string_view kAcceptedForms =
    "a topology file, or a generator: full, ring, full:N, ring:N, torus1d:X, torus2d:XxY, torus3d:XxYxZ "
    "(full and ring without a size span the job's world size)";

// "full" over the job's world when the host of every rank is known. A link of this fabric is
// shared memory, so it can only join ranks of one host: each host's ranks form one fully connected
// clique. Workers keep their rank numbers (node w<r> is rank r), and rank r's port j goes to the
// j-th other rank of its host in rank order, as GenerateFullyConnected numbers them on one host.
// A rank alone on its host has nothing to link to, yet must be a node (every rank finds its worker),
// and Topology::Finalize wants at least one port per node: it gets one port with no cable, which
// serves no peer (no link_peer). A job on one host gets exactly the topology of "full:<world size>".
Result<Topology> GenerateFullPerHost(const FabricContext& context) {
  const int n = context.world_size;
  if (context.rank_hosts.size() != static_cast<size_t>(n))
    return InvalidArgument(fmt::format("the fabric context names the hosts of {} ranks, the world has {}",
                                       context.rank_hosts.size(), n));
  std::map<std::string_view, std::vector<int>> by_host;  // ranks in ascending order per host
  for (int r = 0; r < n; ++r) {
    const std::string& host = context.rank_hosts[static_cast<size_t>(r)];
    if (host.empty()) return InvalidArgument(fmt::format("the fabric context gives rank {} an empty host id", r));
    by_host[host].push_back(r);
  }
  if (by_host.size() == 1) return GenerateFullyConnected(n, LinkParams{});
  Topology t;
  t.name = fmt::format("full-{}-on-{}-hosts", n, by_host.size());
  t.nodes.resize(static_cast<size_t>(n));
  for (const auto& [host, ranks] : by_host) {
    const int local = static_cast<int>(ranks.size());
    if (local - 1 > kMaxPortsPerNode)
      return InvalidArgument(fmt::format("{} ranks on host {}: a fully connected clique needs at most {}", local,
                                         host, kMaxPortsPerNode + 1));
    for (int i = 0; i < local; ++i) {
      const int r = ranks[static_cast<size_t>(i)];
      t.nodes[static_cast<size_t>(r)] =
          TopologyNode{fmt::format("w{}", r), NodeKind::kWorker, r, std::max(local - 1, 1), 0, {}};
    }
    // Port of the i-th local rank towards the k-th: the others in rank order, skipping itself.
    auto port_to = [](int from, int to) { return to < from ? to : to - 1; };
    for (int i = 0; i < local; ++i)
      for (int k = i + 1; k < local; ++k)
        t.links.push_back(TopologyLink{PortRef{ranks[static_cast<size_t>(i)], port_to(i, k)},
                                       PortRef{ranks[static_cast<size_t>(k)], port_to(k, i)}, 0, 0, 0});
  }
  KZ_RETURN_IF_ERROR(t.Finalize());
  return t;
}

// KIZUNA_TOPOLOGY's value as "<kind>[:<shape>]" (GenerateNamed's kinds): a direct-connect network
// for a job on one host without writing a file. Generated links have unknown bandwidth and latency
// and no shaping: nothing says what a modelled link should be, and a file can say it.
Result<Topology> GenerateFromSpec(std::string_view spec, const FabricContext& context) {
  const size_t colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  std::string shape = colon == std::string_view::npos ? std::string() : std::string(spec.substr(colon + 1));
  const bool sized_by_world = kind == "ring" || kind == "full" || kind == "fully_connected";
  const bool torus = kind == "torus1d" || kind == "torus2d" || kind == "torus3d";
  auto refuse = [&](std::string_view why) {
    return InvalidArgument(fmt::format(
        "KIZUNA_TOPOLOGY=\"{}\" is neither an existing file nor a valid generator spec ({}); accepted: {}", spec, why,
        kAcceptedForms));
  };
  if (!sized_by_world && !torus)
    return refuse(fmt::format("no file of that name, and \"{}\" is not a generator", kind));
  if (colon != std::string_view::npos && shape.empty()) return refuse("the shape after ':' is empty");
  if (shape.empty()) {
    if (torus) return refuse(fmt::format("{} needs a shape, e.g. {}:4x4", kind, kind));
    // One rank has no one to link to; a network of one node is not a direct-connect network.
    if (context.world_size < 2)
      return Unavailable(fmt::format("KIZUNA_TOPOLOGY=\"{}\" spans the world size, and a world of {} rank(s) has no "
                                     "links to make",
                                     spec, context.world_size));
    // "full" over the world links only ranks that share a host, when the hosts are known.
    if (kind != "ring" && !context.rank_hosts.empty()) {
      Result<Topology> per_host = GenerateFullPerHost(context);
      if (!per_host.ok()) return per_host.status().WithContext(fmt::format("KIZUNA_TOPOLOGY=\"{}\"", spec));
      per_host->source = fmt::format("generated from KIZUNA_TOPOLOGY={}", spec);
      return per_host;
    }
    shape = std::to_string(context.world_size);
  }
  Result<Topology> topology = GenerateNamed(kind, shape, LinkParams{});
  if (!topology.ok()) return refuse(topology.status().message());
  topology->source = fmt::format("generated from KIZUNA_TOPOLOGY={}", spec);
  return topology;
}

// A value naming an existing path is a file, even when it also reads as a generator spec (a file
// called "full" in the working directory wins): the file is the more deliberate of the two.
Result<Topology> TopologyFromConfig(const std::string& value, const FabricContext& context) {
  struct stat st {};
  constexpr std::string_view kWhat = "KIZUNA_TOPOLOGY file";
  if (::stat(value.c_str(), &st) == 0) return LoadTopology(value, kWhat);
  // A value that can only be a path (a generator spec has no '/' and no ".json"): say the file
  // cannot be read, with the system's reason.
  if (value.find('/') != std::string::npos || value.ends_with(".json")) return LoadTopology(value, kWhat);
  return GenerateFromSpec(value, context);
}

}  // namespace

LinkShaper::Times LinkShaper::Reserve(uint64_t bytes) {
  if (!enabled_) return Times{};
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point start = std::max(Clock::now(), busy_until_);
  const double seconds = bandwidth_gbps_ > 0 ? static_cast<double>(bytes) * 8.0 / (bandwidth_gbps_ * 1e9) : 0.0;
  const Clock::time_point end =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  busy_until_ = end;
  const auto latency =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(latency_us_));
  return Times{end, end + latency};
}

DirectConnectFabric::DirectConnectFabric(const Config* config, FabricContext context, Topology topology, int node)
    : Fabric(std::string(kFabricName), config, std::move(context)),
      topology_(std::move(topology)),
      node_(node),
      host_fingerprint_(HostFingerprint()),
      topology_fingerprint_(topology_.Fingerprint()) {
  const TopologyNode& me = topology_.nodes[static_cast<size_t>(node_)];
  for (int port = 0; port < me.ports; ++port) {
    FabricDeviceProperties p;
    p.fabric = std::string(kFabricName);
    p.index = port;
    p.name = fmt::format("{}:port{}", me.name, port);
    p.ptr_support = kPtrHost | kPtrDevice | kPtrFd;
    p.max_requests = kMaxRequests;
    p.max_message_bytes = kMaxMessageBytes;
    p.write_immediate = true;
    p.needs_flush = false;  // the CPU copies; nothing sits behind a device cache
    // The ports belong to the accelerator itself (as DirectConnect ports do): close to all of the
    // rank's devices.
    p.near_device_uuids = this->context().device_uuids;
    p.point_to_point = true;
    double bandwidth = 0, latency = 0;
    if (const TopologyLink* link = topology_.LinkAt(PortRef{node_, port})) {
      const PortRef peer = *topology_.PeerOf(PortRef{node_, port});
      const TopologyNode& other = topology_.nodes[static_cast<size_t>(peer.node)];
      int peer_rank = other.rank;
      if (peer_rank < 0)
        if (auto it = this->context().node_ranks.find(other.name); it != this->context().node_ranks.end())
          peer_rank = it->second;
      bandwidth = link->bandwidth_gbps;
      latency = link->latency_us;
      const auto& hosts = this->context().rank_hosts;
      if (peer_rank >= 0 && static_cast<size_t>(peer_rank) < hosts.size() &&
          hosts[static_cast<size_t>(peer_rank)] != this->context().host_id) {
        // A cable to another host is a network link: the tcp fabric carries it over the port's
        // interface (fabric/tcp/README.md, "Cables"). Here the port stays unconnected.
        KZ_INFO(kLogFabric, "directconnect: {}'s cable goes to rank {} on host {}: left to a network fabric", p.name,
                peer_rank, hosts[static_cast<size_t>(peer_rank)]);
      } else {
        p.link_peer = LinkPeer{other.name, peer_rank, peer.port};
      }
    }
    p.speed_gbps = bandwidth;
    p.latency_us = latency;
    devices_.push_back(std::move(p));
    shapers_.push_back(std::make_shared<LinkShaper>(bandwidth, latency, topology_.shaping));
  }
}

Result<std::unique_ptr<Fabric>> DirectConnectFabric::Create(const Config& config, const FabricContext& context) {
  if (config.topology.empty())
    return Unavailable("KIZUNA_TOPOLOGY is not set: the directconnect fabric needs a topology file naming its links, "
                       "or a generator spec such as \"full\" or \"torus2d:4x4\" (see fabric/directconnect/README.md)");
  KZ_ASSIGN_OR_RETURN(Topology topology, TopologyFromConfig(config.topology, context));
  int node = -1;
  if (!context.node.empty()) {
    node = topology.FindNode(context.node);
    if (node < 0)
      return InvalidArgument(fmt::format("topology {} has no node named '{}'", topology.Describe(), context.node));
  } else {
    node = topology.WorkerForRank(context.rank);
    if (node < 0)
      return InvalidArgument(fmt::format("topology {} has {} workers: rank {} has no node (world size {})",
                                         topology.Describe(), topology.worker_count(), context.rank,
                                         context.world_size));
    if (context.world_size - static_cast<int>(context.node_ranks.size()) != topology.worker_count())
      KZ_INFO(kLogFabric, "directconnect: topology {} has {} workers for a world of {} ranks", topology.Describe(),
              topology.worker_count(), context.world_size);
  }
  KZ_ASSIGN_OR_RETURN(auto fabric, CreateWithTopology(config, context, std::move(topology), node));
  return std::unique_ptr<Fabric>(std::move(fabric));
}

Result<std::unique_ptr<DirectConnectFabric>> DirectConnectFabric::CreateWithTopology(const Config& config,
                                                                                     const FabricContext& context,
                                                                                     Topology topology, int node) {
  if (node < 0 || static_cast<size_t>(node) >= topology.nodes.size())
    return InvalidArgument(fmt::format("node index {} out of range for topology {}", node, topology.Describe()));
  // Finalize builds the port index that every lookup uses; a hand-built topology may lack it.
  KZ_RETURN_IF_ERROR(topology.Finalize());
  std::unique_ptr<DirectConnectFabric> f(new DirectConnectFabric(&config, context, std::move(topology), node));
  int linked = 0;
  for (const FabricDeviceProperties& p : f->devices_) linked += p.link_peer.has_value() ? 1 : 0;
  KZ_INFO(kLogFabric, "directconnect: node {} of topology {}: {} port(s), {} linked{}", f->topology_.nodes[node].name,
          f->topology_.Describe(), f->devices_.size(), linked, f->topology_.shaping ? ", links shaped" : "");
  return f;
}

Result<std::unique_ptr<ListenComm>> DirectConnectFabric::DoListen(int dev) { return ListenOnPort(*this, dev); }

Result<std::unique_ptr<SendComm>> DirectConnectFabric::DoConnect(int dev, const Handle& handle) {
  return ConnectOnPort(*this, dev, handle);
}

KZ_REGISTER_FABRIC(directconnect, &DirectConnectFabric::Create, false);

}  // namespace kizuna::fabric::directconnect
