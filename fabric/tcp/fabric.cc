#include "fabric/tcp/fabric.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "fabric/registry.h"
#include "fabric/tcp/cables.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::tcp {
namespace {

bool IsLinkLocal(const sockaddr_storage& a) {
  if (a.ss_family != AF_INET6) return false;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
  return IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr);
}

// Interface names come from the kernel; only plain ones are looked up in sysfs.
bool SafeName(std::string_view name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

std::string ReadSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string value;
  in >> value;
  return value;
}

// The interface's speed, PCI device and NUMA node, where sysfs says.
void Describe(const std::string& name, FabricDeviceProperties* p) {
  if (!SafeName(name)) return;
  const std::string mbps = ReadSysfs("/sys/class/net/" + name + "/speed");
  const long v = mbps.empty() ? 0 : std::strtol(mbps.c_str(), nullptr, 10);
  p->speed_gbps = v > 0 ? static_cast<double>(v) / 1000.0 : 0;
  char resolved[4096];
  if (::realpath(("/sys/class/net/" + name + "/device").c_str(), resolved) == nullptr) return;
  const std::string path(resolved);
  if (path.find("/pci") == std::string::npos) return;  // a virtual interface
  p->pci_path = path;
  const std::string numa = ReadSysfs(path + "/numa_node");
  if (!numa.empty()) p->numa_node = std::max(-1, static_cast<int>(std::strtol(numa.c_str(), nullptr, 10)));
}

Result<std::vector<Interface>> ListInterfaces() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return FromErrno(errno, "tcp: getifaddrs");
  std::vector<Interface> out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    Interface itf;
    itf.name = i->ifa_name;
    itf.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    std::memcpy(&itf.address, i->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    out.push_back(itf);
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

std::vector<std::string> InterfacesFromConfig(const std::vector<std::string>& kizuna_fabric) {
  std::vector<std::string> out;
  const std::string prefix = std::string(kFabricName) + ":";
  for (const std::string& entry : kizuna_fabric)
    if (entry.rfind(prefix, 0) == 0 && entry.size() > prefix.size()) out.push_back(entry.substr(prefix.size()));
  return out;
}

std::vector<Interface> SelectInterfaces(const std::vector<Interface>& all, const std::vector<std::string>& wanted,
                                        std::vector<std::string>* missing) {
  // One address per interface: IPv4 first, then a routable IPv6, then a link-local one is left out.
  auto best_of = [&](const std::string& name) -> const Interface* {
    const Interface* best = nullptr;
    for (const Interface& i : all) {
      if (i.name != name || IsLinkLocal(i.address)) continue;
      if (best == nullptr || (i.address.ss_family == AF_INET && best->address.ss_family != AF_INET)) best = &i;
    }
    return best;
  };
  std::vector<std::string> names;
  if (!wanted.empty()) {
    names = wanted;
  } else {
    for (bool loopback : {false, true}) {
      if (loopback && !names.empty()) break;  // loopback only where nothing else is
      for (const Interface& i : all)
        if (i.loopback == loopback && std::find(names.begin(), names.end(), i.name) == names.end())
          names.push_back(i.name);
    }
  }
  std::vector<Interface> out;
  for (const std::string& n : names) {
    const Interface* best = best_of(n);
    if (best == nullptr) {
      if (missing != nullptr) missing->push_back(n);
      continue;
    }
    if (std::none_of(out.begin(), out.end(), [&](const Interface& o) { return o.name == n; })) out.push_back(*best);
  }
  return out;
}

TcpFabric::TcpFabric(const Config* config, FabricContext context, std::vector<DeviceAddress> devices, int streams)
    : Fabric(std::string(kFabricName), config, std::move(context)), addresses_(std::move(devices)), streams_(streams) {
  for (const DeviceAddress& d : addresses_) devices_.push_back(d.properties);
  default_rank_ = kRankSockets;
  relays_ = std::make_unique<Relays>(addresses_);
}

TcpFabric::~TcpFabric() { pending_.Clear(); }

Result<std::unique_ptr<Fabric>> TcpFabric::Create(const Config& config, const FabricContext& context) {
  auto all = ListInterfaces();
  if (!all.ok()) return Unavailable(all.status().ToString());
  return CreateWith(config, context, *all, kDefaultStreams);
}

Result<std::unique_ptr<Fabric>> TcpFabric::CreateWith(const Config& config, const FabricContext& context,
                                                      const std::vector<Interface>& all, int streams) {
  if (streams < 1 || streams > kMaxStreams)
    return InvalidArgument(fmt::format("tcp: {} sockets per connection (1 to {})", streams, kMaxStreams));
  std::string offered;
  for (const Interface& i : all)
    if (offered.find(i.name) == std::string::npos) offered += (offered.empty() ? "" : ", ") + i.name;
  std::vector<DeviceAddress> devices;
  auto add = [&](const Interface& i) -> FabricDeviceProperties& {
    DeviceAddress d;
    d.address = i.address;
    if (d.address.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&d.address)->sin_port = 0;
    } else {
      reinterpret_cast<sockaddr_in6*>(&d.address)->sin6_port = 0;
    }
    FabricDeviceProperties& p = d.properties;
    p.fabric = std::string(kFabricName);
    p.index = static_cast<int>(devices.size());
    p.name = i.name;
    p.ptr_support = kPtrHost | kPtrFd;
    p.max_requests = kMaxRequests;
    p.max_message_bytes = kMaxMessageBytes;
    p.cheap_registration = true;  // TcpRegistration keeps the pointer (memory.cc)
    Describe(i.name, &p);
    devices.push_back(std::move(d));
    return devices.back().properties;
  };
  auto log = [&](const DeviceAddress& d) {
    const FabricDeviceProperties& p = d.properties;
    std::string where = DescribeAddress(d.address);
    for (const sockaddr_storage& a : d.more) where += ", " + DescribeAddress(a);
    KZ_INFO(kLogFabric, "tcp: device {}: {} ({}){}, {} Gb/s, {} socket(s) per connection", p.index, p.name, where,
            p.link_peer
                ? fmt::format(", cabled to {}:{} (rank {})", p.link_peer->node, p.link_peer->port, p.link_peer->rank)
                : "",
            p.speed_gbps > 0 ? fmt::format("{:.1f}", p.speed_gbps) : "unknown",
            std::min(kMaxStreams, streams * d.cables()));
  };

  // Cables to other hosts first: a port's interface reaches only its cable's other end. Parallel
  // cables to one rank are one device, a bundle, whose connections' streams go round them.
  KZ_ASSIGN_OR_RETURN(const std::vector<CablePort> cables, CablePorts(config, context));
  std::vector<std::string> cabled;
  const size_t first_cable = devices.size();
  std::vector<std::vector<const CablePort*>> bundles;
  for (const CablePort& c : cables) {
    if (static_cast<size_t>(c.bundle) >= bundles.size()) bundles.resize(static_cast<size_t>(c.bundle) + 1);
    bundles[static_cast<size_t>(c.bundle)].push_back(&c);
  }
  for (const std::vector<const CablePort*>& bundle : bundles) {
    if (static_cast<int>(bundle.size()) > kMaxBundle)
      return InvalidArgument(fmt::format("tcp: topology {} has {} cables between {} and {}; a bundle takes at most {}",
                                         bundle[0]->topology, bundle.size(), bundle[0]->node, bundle[0]->peer.node,
                                         kMaxBundle));
  }
  for (const CablePort& c : cables) {
    const Interface* itf = nullptr;  // its IPv4 address, else a routable IPv6 one
    for (const Interface& i : all) {
      if (i.name != c.interface) continue;
      if (i.address.ss_family == AF_INET) {
        itf = &i;
        break;
      }
      if (itf == nullptr && !IsLinkLocal(i.address)) itf = &i;
    }
    if (itf == nullptr)
      return InvalidArgument(fmt::format(
          "tcp: topology {} cables {}'s port {} to {} (rank {}) on another host, but this host has no interface "
          "'{}' with an address (it has: {}); name the ports' interfaces in the node's \"interfaces\"",
          c.topology, c.node, c.port, c.peer.node, c.peer.rank, c.interface, offered.empty() ? "none" : offered));
    cabled.push_back(c.interface);
    if (c.cable > 0) {  // a further cable of the bundle: its address, and its speed added
      DeviceAddress& d = devices[first_cable + static_cast<size_t>(c.bundle)];
      sockaddr_storage a = itf->address;
      if (a.ss_family != d.address.ss_family)
        return InvalidArgument(
            fmt::format("tcp: topology {} bundles {}'s ports {} and {}, whose interfaces {} and {} "
                        "have addresses of different families",
                        c.topology, c.node, bundles[static_cast<size_t>(c.bundle)][0]->port, c.port,
                        bundles[static_cast<size_t>(c.bundle)][0]->interface, c.interface));
      if (a.ss_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(&a)->sin_port = 0;
      } else {
        reinterpret_cast<sockaddr_in6*>(&a)->sin6_port = 0;
      }
      d.more.push_back(a);
      d.at_peer.push_back(c.peer_cable);
      d.properties.name += fmt::format("+port{}:{}", c.port, c.interface);
      ++d.properties.cables;
      if (c.bandwidth_gbps > 0 && d.properties.speed_gbps > 0) d.properties.speed_gbps += c.bandwidth_gbps;
      continue;
    }
    FabricDeviceProperties& p = add(*itf);
    p.name = fmt::format("{}:port{}:{}", c.node, c.port, c.interface);
    p.point_to_point = true;
    p.link_peer = c.peer;
    if (c.bandwidth_gbps > 0) p.speed_gbps = c.bandwidth_gbps;
    p.latency_us = c.latency_us;
    devices.back().at_peer.push_back(c.peer_cable);
  }
  for (size_t d = first_cable; d < devices.size(); ++d) {
    if (devices[d].cables() == 1) devices[d].at_peer.clear();
    log(devices[d]);
  }

  const std::vector<std::string> wanted = InterfacesFromConfig(config.fabric);
  // With cables, they are the rank's network; a switched interface only where KIZUNA_FABRIC names it.
  if (!cables.empty() && wanted.empty()) {
    KZ_INFO(kLogFabric,
            "tcp: {} cable(s) of topology {} to other hosts; no switched device (KIZUNA_FABRIC=tcp:<interface> "
            "adds one)",
            cables.size(), cables.front().topology);
    return std::unique_ptr<Fabric>(new TcpFabric(&config, context, std::move(devices), streams));
  }
  std::vector<std::string> missing;
  std::vector<Interface> chosen = SelectInterfaces(all, wanted, &missing);
  std::erase_if(chosen,
                [&](const Interface& i) { return std::find(cabled.begin(), cabled.end(), i.name) != cabled.end(); });
  if (!missing.empty())
    KZ_WARN(kLogFabric,
            "tcp: KIZUNA_FABRIC names interface(s) this host does not have with a usable address: {} "
            "(it has: {})",
            fmt::join(missing, ", "), offered.empty() ? "none" : offered);
  // Interfaces named and none of them here: the user's setting is wrong, not the host unfit (a
  // list may name interfaces of several kinds of host; then the ones a host has are used).
  if (chosen.empty() && devices.empty() && !wanted.empty())
    return InvalidArgument(fmt::format(
        "tcp: KIZUNA_FABRIC names interface(s) {}, which this host does not have with a usable address (it has: "
        "{}); name one it has (tcp:<interface>), or just 'tcp' to let kizuna choose",
        fmt::join(wanted, ", "), offered.empty() ? "none" : offered));
  if (chosen.empty() && devices.empty())
    return Unavailable(fmt::format("tcp: no network interface with an address (interfaces up: {})",
                                   offered.empty() ? "none" : offered));
  for (const Interface& i : chosen) {
    add(i);
    log(devices.back());
  }
  return std::unique_ptr<Fabric>(new TcpFabric(&config, context, std::move(devices), streams));
}

Result<std::unique_ptr<ListenComm>> TcpFabric::DoListen(int dev) {
  KZ_ASSIGN_OR_RETURN(auto l, TcpListenComm::Create(addresses_[static_cast<size_t>(dev)], hub_, relays_.get()));
  return std::unique_ptr<ListenComm>(std::move(l));
}

Result<std::unique_ptr<SendComm>> TcpFabric::DoConnect(int dev, const Handle& handle) {
  return pending_.Step(dev, handle, [&]() -> Result<std::shared_ptr<PendingConnect>> {
    WireHandle w;
    if (IsForward(handle)) {
      KZ_ASSIGN_OR_RETURN(Forwarding f, DecodeForward(handle));
      w = f.target;
    } else {
      KZ_ASSIGN_OR_RETURN(w, DecodeHandle(handle));
    }
    if (w.family != addresses_[static_cast<size_t>(dev)].address.ss_family)
      return InvalidArgument(fmt::format("tcp: device {} ({}) has no address of the handle's family ({})", dev,
                                         devices_[static_cast<size_t>(dev)].name,
                                         w.family == AF_INET ? "IPv4" : "IPv6"));
    // A bundle's connection: as many streams on each of its cables as one cable's has.
    const DeviceAddress& d = addresses_[static_cast<size_t>(dev)];
    // A forwarded one keeps to one cable (relay.h).
    return PendingConnect::Start(d, handle, IsForward(handle) ? streams_ : std::min(kMaxStreams, streams_ * d.cables()),
                                 hub_);
  });
}

bool TcpFabric::DoConnectsBack(int dev) const { return !devices_[static_cast<size_t>(dev)].point_to_point; }

Result<std::unique_ptr<SendComm>> TcpFabric::DoConnectBack(int dev, const Handle& handle, RecvComm& from) {
  auto* comm = dynamic_cast<TcpRecvComm*>(&from);
  if (comm == nullptr || &comm->connection()->hub() != &hub_ || !comm->connection()->two_way() || IsForward(handle) ||
      !DoConnectsBack(dev))
    return NotSupported(fmt::format("tcp: {} carries one direction only", from.label()));
  return pending_.Step(dev, handle, [&]() -> Result<std::shared_ptr<PendingConnect>> {
    return PendingConnect::StartBack(addresses_[static_cast<size_t>(dev)], handle, streams_, hub_, comm->connection());
  });
}

Result<Handle> TcpFabric::DoForward(std::span<const Hop> hops, const Handle& target) const {
  return EncodeForward(hops, target);
}

Status TcpFabric::DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt) {
  std::shared_ptr<PendingConnect> p = pending_.Find(dev, handle);
  if (p == nullptr) return Fabric::DoWaitConnectable(dev, handle, deadline, attempt);
  std::lock_guard<std::mutex> lock(p->mu);
  return p->Wait(deadline);
}

KZ_REGISTER_FABRIC(tcp, &TcpFabric::Create, false);

}  // namespace kizuna::fabric::tcp
