#include "fabric/ofi/fabric.h"

#include <net/if.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "fabric/ofi/endpoint.h"
#include "fabric/registry.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::ofi {
namespace {

constexpr std::string_view kConfigPrefix = "ofi:";
// What this fabric can do for a provider's memory-registration requirements: register before
// use and pass descriptors (LOCAL), name remote memory by address (VIRT_ADDR), register only
// allocated memory (ALLOCATED), accept provider-chosen keys (PROV_KEY), bind regions to the
// endpoint (ENDPOINT). Device memory (HMEM) and raw keys are not offered.
constexpr int kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

using InfoPtr = std::unique_ptr<fi_info, std::function<void(fi_info*)>>;

struct Discovered {
  ProviderEntry entry;
  InfoPtr info;
};

// The names of this host's network interfaces (if_nameindex), in the kernel's order.
std::vector<std::string> HostInterfaces() {
  std::vector<std::string> names;
  if (struct if_nameindex* all = ::if_nameindex()) {
    for (struct if_nameindex* i = all; i->if_index != 0 && i->if_name != nullptr; ++i) names.emplace_back(i->if_name);
    ::if_freenameindex(all);
  }
  return names;
}

uint32_t Fnv1a32(std::string_view s) {
  uint32_t h = 2166136261u;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 16777619u;
  }
  return h;
}

// Interface names come from the provider; only plain ones are looked up in sysfs.
bool SafeName(std::string_view name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == ':';
    if (!ok) return false;
  }
  return true;
}

std::string ReadSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string value;
  in >> value;
  return value;
}

bool IsLoopbackInterface(const std::string& domain) {
  if (domain == "lo") return true;
  if (!SafeName(domain)) return false;
  const std::string flags = ReadSysfs("/sys/class/net/" + domain + "/flags");
  return !flags.empty() && (std::strtoul(flags.c_str(), nullptr, 16) & 0x8) != 0;  // IFF_LOOPBACK
}

bool IsLinkLocal(const ProviderEntry& e) { return e.fabric.rfind("fe80", 0) == 0; }

// Whether `a` is the better entry for its (provider, domain): one-sided writes, then IPv4, then a
// routable address family.
bool Better(const ProviderEntry& a, const ProviderEntry& b) {
  if (a.rma != b.rma) return a.rma;
  const bool a4 = a.addr_format == FI_SOCKADDR_IN, b4 = b.addr_format == FI_SOCKADDR_IN;
  if (a4 != b4) return a4;
  return !IsLinkLocal(a) && IsLinkLocal(b);
}

Result<std::vector<Discovered>> Discover(const LibFabric& lib) {
  std::vector<Discovered> out;
  std::set<std::string> seen;
  // With one-sided writes first, so that a provider offering them is recorded with them.
  for (const uint64_t caps : {uint64_t{FI_TAGGED | FI_RMA}, uint64_t{FI_TAGGED}}) {
    InfoPtr hints(lib.dupinfo(nullptr), lib.freeinfo);
    if (hints == nullptr) return OutOfMemory("ofi: fi_dupinfo(NULL) failed");
    hints->caps = caps;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = kMrModes;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    fi_info* list = nullptr;
    const int rc = lib.getinfo(kApiVersion, nullptr, nullptr, 0, hints.get(), &list);
    if (rc == -FI_ENODATA) continue;
    if (rc != 0) return lib.Error(rc, "fi_getinfo");
    InfoPtr owned_list(list, lib.freeinfo);
    for (const fi_info* i = list; i != nullptr; i = i->next) {
      ProviderEntry e;
      e.provider = i->fabric_attr->prov_name != nullptr ? i->fabric_attr->prov_name : "";
      e.fabric = i->fabric_attr->name != nullptr ? i->fabric_attr->name : "";
      e.domain = i->domain_attr->name != nullptr ? i->domain_attr->name : "";
      e.addr_format = i->addr_format;
      e.loopback = IsLoopbackInterface(e.domain);
      e.rma = (i->caps & FI_RMA) != 0;
      const std::string key = fmt::format("{}\n{}\n{}\n{}", e.provider, e.fabric, e.domain, e.addr_format);
      if (!seen.insert(key).second) continue;
      InfoPtr dup(lib.dupinfo(i), lib.freeinfo);
      if (dup == nullptr) return OutOfMemory("ofi: fi_dupinfo failed");
      out.push_back(Discovered{std::move(e), std::move(dup)});
    }
  }
  return out;
}

std::string DescribeOffered(const std::vector<Discovered>& found) {
  std::set<std::string> names;
  for (const Discovered& d : found) names.insert(fmt::format("{} on {}", d.entry.provider, d.entry.domain));
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "no RDM provider with tagged messages at all" : out;
}

// Link speed in Gb/s: the provider's NIC attributes, else the interface's sysfs speed; 0 unknown.
double SpeedGbps(const fi_info& info, const std::string& domain) {
  if (info.nic != nullptr && info.nic->link_attr != nullptr && info.nic->link_attr->speed > 0)
    return static_cast<double>(info.nic->link_attr->speed) / 1e9;
  if (!SafeName(domain)) return 0;
  const std::string mbps = ReadSysfs("/sys/class/net/" + domain + "/speed");
  const long v = mbps.empty() ? 0 : std::strtol(mbps.c_str(), nullptr, 10);
  return v > 0 ? static_cast<double>(v) / 1000.0 : 0;
}

// The PCI device behind the domain (NIC attributes, else the interface's sysfs device link).
void Locality(const fi_info& info, const std::string& domain, FabricDeviceProperties* p) {
  std::string device_dir;
  if (info.nic != nullptr && info.nic->bus_attr != nullptr && info.nic->bus_attr->bus_type == FI_BUS_PCI) {
    const fi_pci_attr& pci = info.nic->bus_attr->attr.pci;
    device_dir = fmt::format("/sys/bus/pci/devices/{:04x}:{:02x}:{:02x}.{:x}", pci.domain_id, pci.bus_id,
                             pci.device_id, pci.function_id);
  } else if (SafeName(domain)) {
    device_dir = "/sys/class/net/" + domain + "/device";
  }
  if (device_dir.empty()) return;
  char resolved[4096];
  if (::realpath(device_dir.c_str(), resolved) == nullptr) return;
  const std::string path(resolved);
  if (path.find("/pci") == std::string::npos) return;  // a virtual interface
  p->pci_path = path;
  const std::string numa = ReadSysfs(path + "/numa_node");
  if (!numa.empty()) p->numa_node = std::max(-1, static_cast<int>(std::strtol(numa.c_str(), nullptr, 10)));
}

}  // namespace

// ---- Selection ----

std::vector<std::string> ProvidersFromConfig(const std::vector<std::string>& kizuna_fabric) {
  std::vector<std::string> out;
  for (const std::string& f : kizuna_fabric)
    if (f.size() > kConfigPrefix.size() && f.compare(0, kConfigPrefix.size(), kConfigPrefix) == 0)
      out.push_back(f.substr(kConfigPrefix.size()));
  return out;
}

bool ProviderMatches(std::string_view provider, std::string_view wanted) {
  if (provider == wanted) return true;
  return provider.size() > wanted.size() && provider.substr(0, wanted.size()) == wanted &&
         provider[wanted.size()] == ';';
}

Status CheckTcpIface(std::string_view fi_tcp_iface, const std::vector<std::string>& host_interfaces) {
  std::vector<std::string> missing;
  for (size_t start = 0; start <= fi_tcp_iface.size();) {
    const size_t comma = std::min(fi_tcp_iface.find(',', start), fi_tcp_iface.size());
    const std::string name(fi_tcp_iface.substr(start, comma - start));
    if (!name.empty() && std::find(host_interfaces.begin(), host_interfaces.end(), name) == host_interfaces.end())
      missing.push_back(name);
    start = comma + 1;
  }
  if (missing.empty()) return Status::Ok();
  std::string have;
  for (const std::string& i : host_interfaces) have += (have.empty() ? "" : ", ") + i;
  return InvalidArgument(
      fmt::format("FI_TCP_IFACE names {}, which this host does not have (it has: {}); libfabric "
                  "would use its other interfaces instead: name one it has, or unset FI_TCP_IFACE",
                  fmt::join(missing, ", "), have.empty() ? "none" : have));
}

std::string ShmProviderHint(bool wanted, bool offered, const Result<FileSystemSpace>& dev_shm, unsigned cores) {
  if (!wanted || offered) return "";
  if (dev_shm.ok() && dev_shm->free_bytes >= (uint64_t{32} << 20) * std::max(cores, 1u)) return "";
  const std::string space = dev_shm.ok() ? fmt::format("/dev/shm has {}, {} free", ApproxByteSize(dev_shm->size_bytes),
                                                       ApproxByteSize(dev_shm->free_bytes))
                                         : fmt::format("/dev/shm cannot be measured: {}", dev_shm.status().message());
  return fmt::format(
      "; libfabric's shm provider leaves itself out when /dev/shm has too little room for its regions "
      "(tens of MiB; FI_LOG_LEVEL=warn shows it), and {}: give /dev/shm room (docker run "
      "--shm-size=1g; mount -o remount,size=1g /dev/shm), or name another fabric (KIZUNA_FABRIC=tcp)",
      space);
}

std::vector<size_t> SelectDevices(const std::vector<ProviderEntry>& entries, const SelectionRequest& request) {
  std::vector<std::string> wanted;
  if (request.fi_provider_set) {
    for (const ProviderEntry& e : entries)
      if (std::find(wanted.begin(), wanted.end(), e.provider) == wanted.end()) wanted.push_back(e.provider);
  } else {
    wanted = request.providers.empty() ? kDefaultProviders : request.providers;
  }
  std::vector<size_t> out;
  for (const std::string& w : wanted) {
    // The best entry per (provider, domain), in order of first appearance.
    std::vector<size_t> best;
    for (size_t i = 0; i < entries.size(); ++i) {
      const ProviderEntry& e = entries[i];
      if (!ProviderMatches(e.provider, w)) continue;
      auto same = std::find_if(best.begin(), best.end(), [&](size_t b) {
        return entries[b].provider == e.provider && entries[b].domain == e.domain;
      });
      if (same == best.end()) {
        best.push_back(i);
      } else if (Better(e, entries[*same])) {
        *same = i;
      }
    }
    const bool any_routable =
        std::any_of(best.begin(), best.end(), [&](size_t b) { return !entries[b].loopback; });
    for (size_t b : best) {
      if (any_routable && entries[b].loopback) continue;
      if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
    }
  }
  return out;
}

// ---- TagLayout ----

uint64_t TagLayout::Make(TagKind kind, uint64_t connection, uint32_t sequence) const {
  const int conn_bits = connection_bits();
  const uint64_t conn_mask = conn_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << conn_bits) - 1;
  return (static_cast<uint64_t>(kind) << (bits - 4)) | ((connection & conn_mask) << 32) | sequence;
}

// ---- OfiDevice ----

Result<std::shared_ptr<OfiDevice>> OfiDevice::Open(std::shared_ptr<const LibFabric> lib, const fi_info& info,
                                                   int index) {
  std::shared_ptr<OfiDevice> d(new OfiDevice());
  d->lib_ = std::move(lib);
  const LibFabric& l = *d->lib_;
  d->info_ = l.dupinfo(&info);
  if (d->info_ == nullptr) return OutOfMemory("ofi: fi_dupinfo failed");
  d->provider_ = info.fabric_attr->prov_name != nullptr ? info.fabric_attr->prov_name : "";
  d->domain_name_ = info.domain_attr->name != nullptr ? info.domain_attr->name : "";
  d->provider_hash_ = Fnv1a32(d->provider_);

  const uint64_t format = info.ep_attr->mem_tag_format;
  d->tags_.bits = format == 0 ? 64 : 64 - std::countl_zero(format);
  if (d->tags_.bits < TagLayout::kMinTagBits)
    return NotSupported(fmt::format("ofi {}: {} usable tag bits, {} needed", d->provider_, d->tags_.bits,
                                    TagLayout::kMinTagBits));

  d->mr_mode_ = static_cast<uint64_t>(info.domain_attr->mr_mode);
  // The pre-1.5 "basic" mode is the combination it stands for.
  if (d->mr_mode_ == FI_MR_BASIC) d->mr_mode_ = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  const bool rma = (info.caps & FI_RMA) != 0 && info.domain_attr->cq_data_size >= 4 &&
                   info.domain_attr->mr_key_size <= 8 && (d->mr_mode_ & FI_MR_RAW) == 0;
  d->write_immediate_ = rma;
  d->ordered_writes_ = (info.tx_attr->msg_order & FI_ORDER_WAW) != 0;
  d->mr_access_ = FI_SEND | FI_RECV | (rma ? FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ : 0);

  int rc = l.open_fabric(d->info_->fabric_attr, &d->fabric_, nullptr);
  if (rc != 0) return l.Error(rc, fmt::format("fi_fabric({})", d->provider_));
  if ((rc = fi_domain(d->fabric_, d->info_, &d->domain_, nullptr)) != 0)
    return l.Error(rc, fmt::format("fi_domain({}, {})", d->provider_, d->domain_name_));

  FabricDeviceProperties& p = d->properties_;
  p.fabric = std::string(kFabricName);
  p.index = index;
  p.name = d->provider_ == d->domain_name_ ? d->provider_ : fmt::format("{}:{}", d->provider_, d->domain_name_);
  p.speed_gbps = SpeedGbps(info, d->domain_name_);
  p.latency_us = 0;  // unknown until measured
  p.ptr_support = kPtrHost | kPtrFd;
  const size_t depth = std::min(info.tx_attr->size, info.rx_attr->size);
  p.max_requests = static_cast<int>(std::clamp<size_t>(depth / 4, 1, kMaxRequests));
  p.max_message_bytes = std::min<uint64_t>(info.ep_attr->max_msg_size, kMaxMessageBytes);
  p.write_immediate = d->write_immediate_;
  p.needs_flush = false;  // host memory only: nothing sits behind a device cache
  Locality(info, d->domain_name_, &p);
  return d;
}

OfiDevice::~OfiDevice() {
  // ofi_rxm keeps a transfer's internal resources when a peer vanished in the middle of it, and
  // then refuses to close the domain (EBUSY): the domain is left to the process's exit.
  bool domain_closed = domain_ == nullptr;
  if (domain_ != nullptr) {
    const int rc = fi_close(&domain_->fid);
    domain_closed = rc == 0;
    if (rc != 0)
      KZ_INFO(kLogFabric, "ofi: domain {} left open (the provider still holds resources of an interrupted "
                          "transfer): {}", domain_name_, lib_->Error(rc, "fi_close(domain)").ToString());
  }
  if (fabric_ != nullptr && domain_closed) fi_close(&fabric_->fid);
  if (info_ != nullptr) lib_->freeinfo(info_);
}

// ---- OfiFabric ----

OfiFabric::OfiFabric(const Config* config, FabricContext context, std::shared_ptr<const LibFabric> lib,
                     std::vector<std::shared_ptr<OfiDevice>> devices)
    : Fabric(std::string(kFabricName), config, std::move(context)),
      lib_(std::move(lib)),
      ofi_devices_(std::move(devices)) {
  for (const auto& d : ofi_devices_) devices_.push_back(d->properties());
  // Over tcp or sockets alone, ofi is kernel sockets under ofi_rxm's layer: the tcp fabric does the
  // same without it, and comes first (fabric/tcp/README.md). Any other provider (verbs, efa) has
  // its own path to the NIC.
  const bool sockets_only = std::all_of(ofi_devices_.begin(), ofi_devices_.end(), [](const auto& d) {
    return d->provider().rfind("tcp", 0) == 0 || d->provider().rfind("sockets", 0) == 0 || d->provider() == "shm";
  });
  default_rank_ = sockets_only ? kRankLayeredSockets : kRankNative;
}

OfiFabric::~OfiFabric() {
  pending_.Clear();
}

Result<std::unique_ptr<Fabric>> OfiFabric::Create(const Config& config, const FabricContext& context) {
  return CreateWith(config, context, LibFabric::Default());
}

Result<std::unique_ptr<Fabric>> OfiFabric::CreateWith(const Config& config, const FabricContext& context,
                                                      Result<std::shared_ptr<const LibFabric>> lib) {
  if (!lib.ok()) {
    if (lib.status().code() == StatusCode::kUnavailable) return lib.status();
    return Unavailable(fmt::format("libfabric cannot be used: {}", lib.status().ToString()));
  }
  std::shared_ptr<const LibFabric> l = *lib;
  // fi_getinfo loads and starts the providers, fi_fabric and fi_domain open them.
  SignalHandlerGuard keep_signals("libfabric's provider discovery and device opening");
  auto found = Discover(*l);
  if (!found.ok()) return Unavailable(fmt::format("libfabric {}: {}", l->VersionString(), found.status().ToString()));

  SelectionRequest request;
  // libfabric's own provider filter: when the user set it, what it lets through is the choice.
  const char* fi_provider = std::getenv("FI_PROVIDER");
  request.fi_provider_set = fi_provider != nullptr && fi_provider[0] != '\0';
  request.providers = ProvidersFromConfig(config.fabric);
  if (const char* iface = std::getenv("FI_TCP_IFACE"); iface != nullptr && iface[0] != '\0') {
    bool tcp_wanted = false;
    if (request.fi_provider_set) {
      tcp_wanted = std::string_view(fi_provider).find("tcp") != std::string_view::npos;
    } else {
      for (const std::string& p : request.providers.empty() ? kDefaultProviders : request.providers)
        tcp_wanted = tcp_wanted || ProviderMatches("tcp;ofi_rxm", p);
    }
    if (tcp_wanted) KZ_RETURN_IF_ERROR(CheckTcpIface(iface, HostInterfaces()));
  }
  std::vector<ProviderEntry> entries;
  for (const Discovered& d : *found) entries.push_back(d.entry);
  const std::vector<size_t> chosen = SelectDevices(entries, request);

  std::string wanted;
  if (request.fi_provider_set) {
    wanted = fmt::format("FI_PROVIDER={}", fi_provider);
  } else {
    for (const std::string& p : request.providers.empty() ? kDefaultProviders : request.providers)
      wanted += (wanted.empty() ? "" : ", ") + p;
  }
  // Is shm among the providers asked for, and did libfabric offer it?
  bool shm_wanted = false, shm_offered = false;
  if (request.fi_provider_set) {
    shm_wanted = std::string_view(fi_provider).find("shm") != std::string_view::npos;
  } else {
    for (const std::string& p : request.providers.empty() ? kDefaultProviders : request.providers)
      shm_wanted = shm_wanted || p == "shm";
  }
  for (const ProviderEntry& e : entries) shm_offered = shm_offered || e.provider == "shm";
  const std::string shm_hint =
      ShmProviderHint(shm_wanted, shm_offered, SpaceOf("/dev/shm"), std::max(1u, std::thread::hardware_concurrency()));
  if (chosen.empty())
    return Unavailable(fmt::format("libfabric {} offers no RDM endpoint with tagged messages for {} (it offers: {}){}",
                                   l->VersionString(), wanted, DescribeOffered(*found), shm_hint));
  if (!shm_hint.empty()) KZ_INFO(kLogFabric, "ofi: no shm device{}", shm_hint);

  std::vector<std::shared_ptr<OfiDevice>> devices;
  std::string failures;
  for (size_t i : chosen) {
    const Discovered& d = (*found)[i];
    auto dev = OfiDevice::Open(l, *d.info, static_cast<int>(devices.size()));
    if (!dev.ok()) {
      failures += fmt::format("{}{} on {}: {}", failures.empty() ? "" : "; ", d.entry.provider, d.entry.domain,
                              dev.status().ToString());
      KZ_INFO(kLogFabric, "ofi: {} on {} not usable: {}", d.entry.provider, d.entry.domain, dev.status().ToString());
      continue;
    }
    devices.push_back(std::move(dev).value());
  }
  if (devices.empty())
    return Unavailable(fmt::format("libfabric {}: no provider for {} could be opened ({})", l->VersionString(), wanted,
                                   failures));

  for (const auto& d : devices) {
    const FabricDeviceProperties& p = d->properties();
    KZ_INFO(kLogFabric, "ofi: device {}: {} ({}), {} Gb/s, {} requests in flight, one-sided writes {}{}", p.index,
            p.name, d->info().fabric_attr->name != nullptr ? d->info().fabric_attr->name : "?",
            p.speed_gbps > 0 ? fmt::format("{:.1f}", p.speed_gbps) : std::string("unknown"), p.max_requests,
            p.write_immediate ? "yes" : "no",
            p.write_immediate && !d->ordered_writes() ? " (unordered: serialized)" : "");
  }
  KZ_INFO(kLogFabric, "ofi: libfabric {} registers host memory only (no DMA-BUF registration, no CUDA or Level Zero "
                      "memory): fd-exported regions are mapped and registered as host memory, and device memory the "
                      "CPU cannot address must be staged through host memory",
          l->VersionString());
  return std::unique_ptr<Fabric>(new OfiFabric(&config, context, std::move(l), std::move(devices)));
}

Result<std::unique_ptr<ListenComm>> OfiFabric::DoListen(int dev) { return ListenOn(*this, dev); }

Result<std::unique_ptr<SendComm>> OfiFabric::DoConnect(int dev, const Handle& handle) {
  return pending_.Step(dev, handle, [&] { return PendingConnect::Start(*this, dev, handle); });
}

Status OfiFabric::DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt) {
  std::shared_ptr<PendingConnect> p = pending_.Find(dev, handle);
  if (p == nullptr) return Fabric::DoWaitConnectable(dev, handle, deadline, attempt);
  std::lock_guard<std::mutex> lock(p->mu);
  return p->Wait(deadline, attempt);
}

namespace {

// Where no directory entry names an RDMA or fabric device (verbs and EFA under
// /sys/class/infiniband, Omni-Path's /dev/hfi1_*, Slingshot's /sys/class/cxi), libfabric's
// providers here are sockets (tcp, udp) and shared memory: what the tcp and directconnect fabrics
// already serve and rank before it. Starting libfabric (its providers' libraries, and their start
// reading /proc/kallsyms through twice) took most of a process's launch to exit on the build
// machines (2 processes: 0.96 s against 0.01; docs/PERFORMANCE.md), so the registry then leaves it
// unstarted unless KIZUNA_FABRIC names ofi or FI_PROVIDER asks for a provider.
bool AnyEntry(const char* dir, std::string_view prefix) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().starts_with(prefix)) return true;
  return false;
}

bool StartedByDefault(std::string* why) {
  if (std::getenv("FI_PROVIDER") != nullptr || AnyEntry("/sys/class/infiniband", "") || AnyEntry("/dev", "hfi1_") ||
      AnyEntry("/sys/class/cxi", ""))
    return true;
  *why = "no RDMA device here (/sys/class/infiniband, /dev/hfi1_*, /sys/class/cxi) and no FI_PROVIDER: libfabric "
         "would offer sockets and shared memory, which the tcp and directconnect fabrics serve";
  return false;
}

}  // namespace

KZ_REGISTER_FABRIC_WHEN(ofi, &OfiFabric::Create, false, &StartedByDefault);

}  // namespace kizuna::fabric::ofi
