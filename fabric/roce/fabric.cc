#include "fabric/roce/fabric.h"

#include <net/if.h>

#include <cerrno>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "fabric/registry.h"
#include "fabric/roce/endpoint.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::roce {
namespace {

static_assert(IBV_MTU_256 == 1 && IBV_MTU_4096 == 5, "gid.h's MtuBytes follows the verbs enumeration");
static_assert(IBV_GID_TYPE_ROCE_V2 == static_cast<int>(GidType::kRoceV2));

using ContextPtr = std::unique_ptr<ibv_context, std::function<void(ibv_context*)>>;

ContextPtr OpenContext(const IbVerbs& lib, ibv_device* device) {
  return ContextPtr(lib.open_device(device), [&lib](ibv_context* c) {
    if (c != nullptr) lib.close_device(c);
  });
}

std::string ReadLine(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  char buf[256] = {};
  const bool ok = std::fgets(buf, sizeof(buf), f) != nullptr;
  std::fclose(f);
  if (!ok) return "";
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void Locality(const std::string& device_name, FabricDeviceProperties* p) {
  char resolved[4096];
  const std::string dir = "/sys/class/infiniband/" + device_name + "/device";
  if (::realpath(dir.c_str(), resolved) == nullptr) return;
  const std::string path(resolved);
  if (path.find("/pci") == std::string::npos) return;  // rdma_rxe, siw: no PCI device of their own
  p->pci_path = path;
  const std::string numa = ReadLine(path + "/numa_node");
  if (!numa.empty()) p->numa_node = std::max(-1, static_cast<int>(std::strtol(numa.c_str(), nullptr, 10)));
}

// The port's GID table as pure rows (gid.h).
Result<std::vector<GidRow>> GidTable(const IbVerbs& lib, ibv_context* ctx, uint8_t port, int table_len, int ports) {
  std::vector<ibv_gid_entry> entries(static_cast<size_t>(std::max(1, table_len * std::max(1, ports))));
  const ssize_t n = lib.query_gid_table(ctx, entries.data(), entries.size(), 0, sizeof(ibv_gid_entry));
  if (n < 0) return lib.Error(static_cast<int>(-n), "ibv_query_gid_table");
  std::vector<GidRow> rows;
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& e = entries[static_cast<size_t>(i)];
    if (e.port_num != port) continue;
    GidRow r;
    r.index = e.gid_index;
    r.type = e.gid_type <= IBV_GID_TYPE_ROCE_V2 ? static_cast<GidType>(e.gid_type) : GidType::kIb;
    std::memcpy(r.gid.data(), e.gid.raw, 16);
    char ifname[IF_NAMESIZE] = {};
    if (e.ndev_ifindex != 0 && ::if_indextoname(e.ndev_ifindex, ifname) != nullptr) r.netdev = ifname;
    rows.push_back(std::move(r));
  }
  return rows;
}

// ---- CreateWith's steps ----

// Records why a device or port is not used: in `skipped` (the error when no port is usable) and
// in the log.
void Skip(std::string& skipped, const std::string& what, const std::string& why) {
  skipped += fmt::format("{}{}: {}", skipped.empty() ? "" : "; ", what, why);
  KZ_INFO(kLogFabric, "roce: {} not used: {}", what, why);
}

}  // namespace

Result<std::vector<HcaCandidate>> HcaCandidates(const std::vector<HcaSpec>& hca,
                                                const std::vector<std::string>& names) {
  std::string all_names;
  for (const std::string& n : names) all_names += (all_names.empty() ? "" : ", ") + n;
  for (const HcaSpec& spec : hca)
    if (std::find(names.begin(), names.end(), spec.device) == names.end())
      return InvalidArgument(
          fmt::format("KIZUNA_IB_HCA names '{}', which is not an RDMA device here (devices: {}); "
                      "name one of them, or unset KIZUNA_IB_HCA to use them all",
                      spec.device, all_names));
  std::vector<HcaCandidate> candidates;
  if (hca.empty()) {
    for (int i = 0; i < static_cast<int>(names.size()); ++i) candidates.push_back({i, std::nullopt});
  } else {
    for (const HcaSpec& spec : hca)
      candidates.push_back(
          {static_cast<int>(std::find(names.begin(), names.end(), spec.device) - names.begin()), spec.port});
  }
  return candidates;
}

namespace {

// A port RoCE can use: its attributes and the GID it uses.
struct UsablePort {
  ibv_port_attr attr;
  GidRow gid;
};

// Port `port` of an open device when it is active, Ethernet and has a GID to use; else nullopt,
// with the reason recorded (Skip). Fails only on a wrong override (KIZUNA_IB_GID_INDEX).
Result<std::optional<UsablePort>> ProbePort(const IbVerbs& l, ibv_context* ctx, int port, int ports,
                                            const std::string& port_name, const GidRequest& gid_request,
                                            std::string& skipped) {
  ibv_port_attr pattr{};
  if (const int rc = l.QueryPort(ctx, static_cast<uint8_t>(port), &pattr); rc != 0) {
    Skip(skipped, port_name, l.Error(rc, "ibv_query_port").message());
    return std::optional<UsablePort>();
  }
  if (pattr.state != IBV_PORT_ACTIVE) {
    Skip(skipped, port_name, fmt::format("port state is {}, not active", static_cast<int>(pattr.state)));
    return std::optional<UsablePort>();
  }
  if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET) {
    Skip(skipped, port_name, "link layer is InfiniBand, not Ethernet (RoCE)");
    return std::optional<UsablePort>();
  }
  auto table = GidTable(l, ctx, static_cast<uint8_t>(port), pattr.gid_tbl_len, ports);
  if (!table.ok()) {
    Skip(skipped, port_name, table.status().message());
    return std::optional<UsablePort>();
  }
  auto gid = SelectGid(*table, gid_request, port_name);
  if (!gid.ok()) {
    if (gid.status().code() == StatusCode::kInvalidArgument) return gid.status();  // a wrong override
    Skip(skipped, port_name, gid.status().message());
    return std::optional<UsablePort>();
  }
  return std::optional<UsablePort>(UsablePort{pattr, *gid});
}

// The fabric device properties of port `port_name` (of RDMA device `dev_name`), device `index`
// of the fabric.
void FillProperties(FabricDeviceProperties& p, int index, const std::string& port_name, const std::string& dev_name,
                    const ibv_port_attr& pattr) {
  p.fabric = std::string(kFabricName);
  p.index = index;
  p.name = port_name;
  p.speed_gbps = PortSpeedGbps(pattr.active_speed, pattr.active_width);
  p.latency_us = 0;
  p.ptr_support = kPtrHost | kPtrFd;
  p.max_requests = kMaxRequests;
  p.max_message_bytes = kMaxMessageBytes;
  p.write_immediate = true;
  p.needs_flush = false;
  Locality(dev_name, &p);
}

}  // namespace

double PortSpeedGbps(uint32_t active_speed, uint8_t active_width) {
  double lane = 0;
  switch (active_speed) {
    case 1: lane = 2.5; break;       // SDR
    case 2: lane = 5.0; break;       // DDR
    case 4: case 8: lane = 10.0; break;  // QDR, FDR10
    case 16: lane = 14.0; break;     // FDR
    case 32: lane = 25.0; break;     // EDR
    case 64: lane = 50.0; break;     // HDR
    case 128: lane = 100.0; break;   // NDR
    default: return 0;
  }
  int lanes = 0;
  switch (active_width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  return lane * lanes;
}

RoceDevice::~RoceDevice() {
  memory_.reset();  // every region is gone: registrations keep the device alive
  if (pd_ != nullptr) {
    const int rc = lib_->dealloc_pd(pd_);
    if (rc != 0) KZ_WARN(kLogFabric, "roce {}: {}", name(), lib_->Error(rc, "ibv_dealloc_pd").ToString());
  }
  if (context_ != nullptr) lib_->close_device(context_);
}

RoceFabric::RoceFabric(const Config* config, FabricContext context, std::vector<std::shared_ptr<RoceDevice>> devices)
    : Fabric(std::string(kFabricName), config, std::move(context)), roce_devices_(std::move(devices)) {
  for (const auto& d : roce_devices_) devices_.push_back(d->properties());
}

RoceFabric::~RoceFabric() {
  pending_.Clear();
}

Result<std::unique_ptr<Fabric>> RoceFabric::Create(const Config& config, const FabricContext& context) {
  return CreateWith(config, context, IbVerbs::Default());
}

Result<std::unique_ptr<Fabric>> RoceFabric::CreateWith(const Config& config, const FabricContext& context,
                                                       Result<std::shared_ptr<const IbVerbs>> lib) {
  if (!lib.ok()) {
    if (lib.status().code() == StatusCode::kUnavailable) return lib.status();
    return Unavailable(fmt::format("libibverbs cannot be used: {}", lib.status().ToString()));
  }
  std::shared_ptr<const IbVerbs> l = *lib;
  KZ_ASSIGN_OR_RETURN(std::vector<HcaSpec> hca, ParseHcaList(config.ib_hca));
  GidRequest gid_request;
  gid_request.family = config.ib_addr_family == "ipv6" ? AddrFamily::kIpv6 : AddrFamily::kIpv4;
  gid_request.index = config.ib_gid_index;
  QpSettings settings;
  settings.traffic_class = static_cast<uint8_t>(config.ib_tc.value_or(0));
  settings.service_level = static_cast<uint8_t>(config.ib_sl.value_or(0));

  int count = 0;
  errno = 0;
  std::unique_ptr<ibv_device*, std::function<void(ibv_device**)>> list(
      l->get_device_list(&count), [&](ibv_device** p) {
        if (p != nullptr) l->free_device_list(p);
      });
  // Where KIZUNA_IB_HCA names devices and there are none, the setting is named too: it is the
  // operator's clue that the job landed on a host without the NICs it was written for.
  const std::string named =
      config.ib_hca.empty() ? "" : fmt::format("; KIZUNA_IB_HCA names {}, none of which is here", config.ib_hca);
  if (list == nullptr) {
    // ENOSYS: the kernel has no RDMA subsystem (/sys/class/infiniband is missing).
    if (errno == ENOSYS)
      return Unavailable(
          fmt::format("no RDMA device (this kernel has no RDMA subsystem: no /sys/class/infiniband){}", named));
    return Unavailable(fmt::format("no RDMA device ({}){}", l->Error(errno, "ibv_get_device_list").message(), named));
  }
  if (count == 0)
    return Unavailable(fmt::format(
        "no RDMA device (libibverbs lists none: no RoCE NIC here, and no rdma_rxe / siw link set up){}", named));

  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.emplace_back(l->get_device_name(list.get()[i]));
  KZ_ASSIGN_OR_RETURN(const std::vector<HcaCandidate> candidates, HcaCandidates(hca, names));
  std::vector<std::shared_ptr<RoceDevice>> devices;
  std::string skipped;
  for (const HcaCandidate& c : candidates)
    KZ_RETURN_IF_ERROR(AddPorts(l, list.get()[c.device], names[static_cast<size_t>(c.device)], c.port, gid_request,
                                settings, devices, skipped));
  if (devices.empty())
    return Unavailable(fmt::format("no usable RoCE port on the RDMA device(s) here ({})", skipped));
  KZ_INFO(kLogFabric, "roce: device memory registers by DMA-BUF fd (ibv_reg_dmabuf_mr) or, for an fd that is not a "
                      "DMA-BUF (a memfd), by mapping it; device memory without an fd is staged by the caller");
  return std::unique_ptr<Fabric>(new RoceFabric(&config, context, std::move(devices)));
}

Status RoceFabric::AddPorts(const std::shared_ptr<const IbVerbs>& l, ibv_device* device, const std::string& dev_name,
                            std::optional<int> only_port, const GidRequest& gid_request, const QpSettings& settings,
                            std::vector<std::shared_ptr<RoceDevice>>& devices, std::string& skipped) {
  ContextPtr probe = OpenContext(*l, device);
  if (probe == nullptr) {
    Skip(skipped, dev_name, l->Error(errno, "ibv_open_device").message());
    return Status::Ok();
  }
  ibv_device_attr dattr{};
  if (const int rc = l->query_device(probe.get(), &dattr); rc != 0) {
    Skip(skipped, dev_name, l->Error(rc, "ibv_query_device").message());
    return Status::Ok();
  }
  if (only_port.has_value() && *only_port > dattr.phys_port_cnt)
    return InvalidArgument(fmt::format("KIZUNA_IB_HCA names {}:{}, but {} has {} port(s)", dev_name, *only_port,
                                       dev_name, dattr.phys_port_cnt));
  for (int port = 1; port <= dattr.phys_port_cnt; ++port) {
    if (only_port.has_value() && port != *only_port) continue;
    const std::string port_name = fmt::format("{}:{}", dev_name, port);
    if (std::any_of(devices.begin(), devices.end(), [&](const auto& d) { return d->name() == port_name; })) continue;
    KZ_ASSIGN_OR_RETURN(const std::optional<UsablePort> usable,
                        ProbePort(*l, probe.get(), port, dattr.phys_port_cnt, port_name, gid_request, skipped));
    if (!usable) continue;
    const ibv_port_attr& pattr = usable->attr;

    std::shared_ptr<RoceDevice> d(new RoceDevice());
    d->lib_ = l;
    d->context_ = l->open_device(device);
    if (d->context_ == nullptr) return l->Error(errno, fmt::format("ibv_open_device({})", dev_name));
    d->pd_ = l->alloc_pd(d->context_);
    if (d->pd_ == nullptr) return l->Error(errno, fmt::format("ibv_alloc_pd({})", dev_name));
    d->port_ = static_cast<uint8_t>(port);
    d->gid_ = usable->gid;
    d->active_mtu_ = static_cast<int>(pattr.active_mtu);
    d->max_qp_wr_ = dattr.max_qp_wr;
    d->max_write_bytes_ = std::clamp<uint64_t>(pattr.max_msg_sz, 4096, uint64_t{1} << 30);
    d->settings_ = settings;
    d->memory_ = std::make_unique<MemoryCache>(l, d->pd_, port_name);
    FabricDeviceProperties& p = d->properties_;
    FillProperties(p, static_cast<int>(devices.size()), port_name, dev_name, pattr);
    KZ_INFO(kLogFabric,
            "roce: device {}: {}, GID index {} {} ({}, {}), traffic class {}, SL {}, MTU {} (active), "
            "{} Gb/s, {} bytes per RDMA write",
            p.index, port_name, d->gid_.index, GidToString(d->gid_.gid), GidTypeName(d->gid_.type),
            d->gid_.netdev.empty() ? "no netdev" : d->gid_.netdev, settings.traffic_class, settings.service_level,
            MtuBytes(d->active_mtu_), p.speed_gbps > 0 ? fmt::format("{:g}", p.speed_gbps) : "unknown",
            d->max_write_bytes_);
    devices.push_back(std::move(d));
  }
  return Status::Ok();
}

Result<std::unique_ptr<ListenComm>> RoceFabric::DoListen(int dev) { return ListenOn(*this, dev); }

Result<std::unique_ptr<SendComm>> RoceFabric::DoConnect(int dev, const Handle& handle) {
  return pending_.Step(dev, handle, [&] { return PendingConnect::Start(*this, dev, handle); });
}

Status RoceFabric::DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt) {
  std::shared_ptr<PendingConnect> p = pending_.Find(dev, handle);
  if (p == nullptr) return Fabric::DoWaitConnectable(dev, handle, deadline, attempt);
  std::lock_guard<std::mutex> lock(p->mu);
  return p->Wait(deadline);
}

KZ_REGISTER_FABRIC(roce, &RoceFabric::Create, true);

}  // namespace kizuna::fabric::roce
