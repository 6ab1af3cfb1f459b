#include "collectives/transport.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/logging.h"

namespace kizuna::collectives {
namespace {

using fabric::FabricDeviceProperties;
using fabric::Handle;

// ---- The connection record each rank contributes to the allgather ----
//
// magic (4 bytes) | rank count (u32) | per rank q: flags (u8) [| device (u32) | handle size (u8) |
// handle bytes]. Entry q carries the handle this rank listens on for q, the fabric device it
// listens on, and whether that device is point-to-point (the connecting side then needs the port
// at the far end of exactly that link). All integers little-endian.
constexpr uint8_t kMagic[4] = {'K', 'Z', 'T', '1'};
constexpr uint8_t kHasHandle = 1u << 0;
constexpr uint8_t kPointToPoint = 1u << 1;
constexpr uint8_t kKnownFlags = kHasHandle | kPointToPoint;

struct Offer {
  int device = -1;
  bool point_to_point = false;
  Handle handle;
};
using Record = std::vector<std::optional<Offer>>;  // indexed by the peer the offer is for

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> SerializeRecord(const Record& record) {
  std::vector<uint8_t> out(std::begin(kMagic), std::end(kMagic));
  PutU32(out, static_cast<uint32_t>(record.size()));
  for (const std::optional<Offer>& offer : record) {
    if (!offer) {
      out.push_back(0);
      continue;
    }
    out.push_back(static_cast<uint8_t>(kHasHandle | (offer->point_to_point ? kPointToPoint : 0)));
    PutU32(out, static_cast<uint32_t>(offer->device));
    out.push_back(static_cast<uint8_t>(offer->handle.size));  // <= 128
    const auto bytes = offer->handle.bytes();
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

// Records come from other processes: every length is checked before use.
Result<Record> ParseRecord(std::span<const uint8_t> in, int nranks, int from) {
  auto bad = [from](std::string_view why) {
    return InvalidArgument(fmt::format("malformed connection record from rank {}: {}", from, why));
  };
  size_t pos = 0;
  auto u32 = [&](uint32_t& v) {
    if (in.size() - pos < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(in[pos + static_cast<size_t>(i)]) << (8 * i);
    pos += 4;
    return true;
  };
  if (in.size() < 8 || !std::equal(std::begin(kMagic), std::end(kMagic), in.begin()))
    return bad("it does not start with the transport's magic (a different kizuna version?)");
  pos = 4;
  uint32_t count = 0;
  if (!u32(count) || count != static_cast<uint32_t>(nranks))
    return bad(fmt::format("it describes {} ranks, the job has {}", count, nranks));
  Record record(static_cast<size_t>(nranks));
  for (int q = 0; q < nranks; ++q) {
    if (pos >= in.size()) return bad(fmt::format("it ends before the entry for rank {}", q));
    const uint8_t flags = in[pos++];
    if ((flags & ~kKnownFlags) != 0) return bad(fmt::format("unknown flags {:#x} for rank {}", flags, q));
    if ((flags & kHasHandle) == 0) continue;
    Offer offer;
    uint32_t device = 0;
    if (!u32(device) || device > static_cast<uint32_t>(INT32_MAX) || pos >= in.size())
      return bad(fmt::format("the entry for rank {} is truncated", q));
    const size_t size = in[pos++];
    if (in.size() - pos < size) return bad(fmt::format("the handle for rank {} is truncated", q));
    auto handle = Handle::FromBytes(in.subspan(pos, size));
    if (!handle.ok()) return bad(handle.status().message());
    pos += size;
    offer.device = static_cast<int>(device);
    offer.point_to_point = (flags & kPointToPoint) != 0;
    offer.handle = *handle;
    record[static_cast<size_t>(q)] = std::move(offer);
  }
  if (pos != in.size()) return bad(fmt::format("{} trailing bytes", in.size() - pos));
  return record;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += fmt::format(" and {} more", ranks.size() - 16);
  return s;
}

std::string SizeText(size_t n) {
  if (n >= (size_t{1} << 30) && n % (size_t{1} << 30) == 0) return fmt::format("{} GiB", n >> 30);
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n >= (size_t{1} << 10) && n % (size_t{1} << 10) == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
}

// ---- Which fabric device serves which peer ----

class DeviceMap {
 public:
  static Result<DeviceMap> Build(fabric::Fabric& fabric, const device::Device& device) {
    DeviceMap m;
    for (int d = 0; d < fabric.device_count(); ++d) {
      KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, fabric.properties(d));
      m.props_.push_back(std::move(p));
    }
    // The switched device nearest the rank's accelerator: one that names it, then one on its NUMA
    // node, then the first.
    const device::DeviceProperties& dp = device.properties();
    auto first_switched = [&](auto&& pred) {
      for (size_t d = 0; d < m.props_.size(); ++d)
        if (!m.props_[d].point_to_point && pred(m.props_[d])) return static_cast<int>(d);
      return -1;
    };
    m.switched_ = first_switched([&](const FabricDeviceProperties& p) {
      return !dp.uuid.empty() &&
             std::find(p.near_device_uuids.begin(), p.near_device_uuids.end(), dp.uuid) != p.near_device_uuids.end();
    });
    if (m.switched_ < 0 && dp.numa_node >= 0)
      m.switched_ = first_switched([&](const FabricDeviceProperties& p) { return p.numa_node == dp.numa_node; });
    if (m.switched_ < 0) m.switched_ = first_switched([](const FabricDeviceProperties&) { return true; });
    return m;
  }

  const FabricDeviceProperties& props(int d) const { return props_[static_cast<size_t>(d)]; }

  // The device this rank listens on for `peer`: the first port linked to it, else the switched
  // device; -1 when none reaches it.
  int Serving(int peer) const {
    for (size_t d = 0; d < props_.size(); ++d)
      if (props_[d].point_to_point && props_[d].link_peer && props_[d].link_peer->rank == peer)
        return static_cast<int>(d);
    return switched_;
  }

  // The device to connect from to `peer`'s offer: for a point-to-point listener, the port at the
  // far end of exactly that link (with two links between a pair, each direction uses its own);
  // for a switched one, this rank's switched device. -1 when there is none.
  int ConnectingFor(int peer, const Offer& offer) const {
    if (!offer.point_to_point) return switched_;
    for (size_t d = 0; d < props_.size(); ++d) {
      const FabricDeviceProperties& p = props_[d];
      if (p.point_to_point && p.link_peer && p.link_peer->rank == peer && p.link_peer->port == offer.device)
        return static_cast<int>(d);
    }
    return -1;
  }

 private:
  std::vector<FabricDeviceProperties> props_;
  int switched_ = -1;
};

// ---- How the staging buffer is registered ----

enum class StagingPath { kFd, kDevicePointer, kHostPointer };

std::string_view PathName(StagingPath path) {
  switch (path) {
    case StagingPath::kFd: return "by fd (DMA-BUF/memfd)";
    case StagingPath::kDevicePointer: return "by device pointer";
    case StagingPath::kHostPointer: return "by host pointer";
  }
  return "?";
}

}  // namespace

Transport::~Transport() {
  // Comms first: their registrations (and any mapping of the staging fd a fabric keeps) must go
  // before the memory they describe.
  peers_.clear();
  listens_.clear();
  staging_.reset();
}

Result<std::unique_ptr<Transport>> Transport::CreateSingle(device::Device& device, const TransportOptions& options) {
  if (options.staging_bytes == 0) return InvalidArgument("transport: staging_bytes must be positive");
  std::unique_ptr<Transport> t(new Transport());
  t->rank_ = 0;
  t->nranks_ = 1;
  t->peers_.resize(1);
  t->listens_.resize(1);
  t->link_row_.assign(1, LinkDesc{});
  KZ_ASSIGN_OR_RETURN(t->staging_, device.Allocate(options.staging_bytes));
  t->description_ = "a single rank (no fabric)";
  return t;
}

Result<std::unique_ptr<Transport>> Transport::Create(fabric::Fabric& fabric, bootstrap::Bootstrap& bootstrap,
                                                     device::Device& device, const TransportOptions& options,
                                                     Deadline deadline) {
  const int rank = bootstrap.rank();
  const int n = bootstrap.size();
  const std::string where = fmt::format("transport (rank {} of {} on {})", rank, n, fabric.name());
  if (fabric.context().rank != rank || fabric.context().world_size != n)
    return InvalidArgument(fmt::format("{}: the fabric was created for rank {} of {}, the bootstrap is rank {} of {}",
                                       where, fabric.context().rank, fabric.context().world_size, rank, n));
  if (options.staging_bytes == 0 || options.control_bytes == 0)
    return InvalidArgument(fmt::format("{}: staging_bytes ({}) and control_bytes ({}) must be positive", where,
                                       options.staging_bytes, options.control_bytes));

  std::unique_ptr<Transport> t(new Transport());
  t->rank_ = rank;
  t->nranks_ = n;
  t->peers_.resize(static_cast<size_t>(n));
  t->listens_.resize(static_cast<size_t>(n));
  t->link_row_.assign(static_cast<size_t>(n), LinkDesc{});

  KZ_ASSIGN_OR_RETURN(DeviceMap devices, DeviceMap::Build(fabric, device));

  // Listen once per peer this rank has a device for; the handles go out in one allgather.
  Record mine(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    if (q == rank) continue;
    const int dev = devices.Serving(q);
    if (dev < 0) continue;
    auto listen = fabric.Listen(dev);
    if (!listen.ok())
      return listen.status().WithContext(
          fmt::format("{}: listening for rank {} on {}", where, q, devices.props(dev).name));
    mine[static_cast<size_t>(q)] = Offer{dev, devices.props(dev).point_to_point, (*listen)->handle()};
    t->listens_[static_cast<size_t>(q)] = std::move(listen).value();
  }
  auto gathered = bootstrap.AllGather(SerializeRecord(mine), deadline);
  if (!gathered.ok()) return gathered.status().WithContext(fmt::format("{}: exchanging connection handles", where));
  std::vector<Record> records;
  for (int q = 0; q < n; ++q) {
    auto record = ParseRecord((*gathered)[static_cast<size_t>(q)], n, q);
    if (!record.ok()) return record.status().WithContext(where);
    records.push_back(std::move(record).value());
  }

  // A pair is used when each side offered the other a handle: both sides read the same two
  // entries of the allgathered records, so they agree without another round.
  struct Pending {
    int connect_dev = -1;
    const Handle* handle = nullptr;
  };
  std::vector<Pending> pending(static_cast<size_t>(n));
  std::vector<int> unreachable;
  for (int q = 0; q < n; ++q) {
    if (q == rank) continue;
    const std::optional<Offer>& theirs = records[static_cast<size_t>(q)][static_cast<size_t>(rank)];
    const std::optional<Offer>& ours = records[static_cast<size_t>(rank)][static_cast<size_t>(q)];
    if (!theirs || !ours) {
      if (theirs || ours)
        KZ_WARN(kLogColl, "{}: only {} offers a connection between ranks {} and {} (do the ranks see the same "
                "topology?); the pair is left unconnected", where, ours ? "this rank" : fmt::format("rank {}", q),
                rank, q);
      t->listens_[static_cast<size_t>(q)].reset();
      unreachable.push_back(q);
      continue;
    }
    const int dev = devices.ConnectingFor(q, *theirs);
    if (dev < 0)
      return InvalidArgument(fmt::format(
          "{}: rank {} listens for this rank on its {} device {}, and no device of this rank {}", where, q,
          theirs->point_to_point ? "point-to-point" : "switched", theirs->device,
          theirs->point_to_point ? fmt::format("is linked to port {} of rank {} (do the ranks load the same topology?)",
                                               theirs->device, q)
                                 : std::string("is switched")));
    pending[static_cast<size_t>(q)] = Pending{dev, &theirs->handle};
    t->peers_[static_cast<size_t>(q)] = std::make_unique<Peer>();
    t->peers_[static_cast<size_t>(q)]->rank = q;
  }

  // Connect to every peer and accept from every peer, interleaved and non-blocking, so no pair
  // waits for another; sleep briefly between rounds that changed nothing (the 2-core machines
  // this runs on in CI must not be spun).
  constexpr auto kMinSleep = std::chrono::microseconds(20);
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  auto sleep = kMinSleep;
  for (;;) {
    bool progressed = false;
    std::vector<int> no_send, no_recv;
    for (int q = 0; q < n; ++q) {
      Peer* p = t->peers_[static_cast<size_t>(q)].get();
      if (p == nullptr) continue;
      const Pending& pend = pending[static_cast<size_t>(q)];
      if (p->send == nullptr) {
        auto send = fabric.Connect(pend.connect_dev, *pend.handle);
        if (!send.ok())
          return send.status().WithContext(
              fmt::format("{}: connecting to rank {} from {}", where, q, devices.props(pend.connect_dev).name));
        if (*send != nullptr) {
          p->send = std::move(send).value();
          progressed = true;
          KZ_TRACE(kLogColl, "{}: connected to rank {}: {}", where, q, p->send->label());
        } else {
          no_send.push_back(q);
        }
      }
      if (p->recv == nullptr) {
        auto recv = t->listens_[static_cast<size_t>(q)]->Accept();
        if (!recv.ok())
          return recv.status().WithContext(fmt::format("{}: accepting rank {}'s connection on {}", where, q,
                                                       t->listens_[static_cast<size_t>(q)]->properties().name));
        if (*recv != nullptr) {
          p->recv = std::move(recv).value();
          progressed = true;
          KZ_TRACE(kLogColl, "{}: accepted rank {}: {}", where, q, p->recv->label());
        } else {
          no_recv.push_back(q);
        }
      }
    }
    if (no_send.empty() && no_recv.empty()) break;
    if (deadline.Expired()) {
      std::string missing;
      if (!no_send.empty()) missing += fmt::format("no connection to {}", RankList(no_send));
      if (!no_recv.empty())
        missing += fmt::format("{}no connection from {}", missing.empty() ? "" : ", ", RankList(no_recv));
      return Timeout(fmt::format("{}: {} by the deadline", where, missing));
    }
    if (progressed) {
      sleep = kMinSleep;
      continue;
    }
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(sleep, deadline.Remaining()));
    sleep = std::min(sleep * 2, kMaxSleep);
  }

  // The staging buffer, registered on every comm. Exported once (when the device exports fds and
  // some comm takes them); the export is only needed during Register, which dup()s what it keeps.
  const device::DeviceProperties& dprops = device.properties();
  auto staging = device.Allocate(options.staging_bytes);
  if (!staging.ok())
    return staging.status().WithContext(
        fmt::format("{}: allocating {} of staging on {}", where, SizeText(options.staging_bytes), device.label()));
  t->staging_ = std::move(staging).value();
  bool any_takes_fd = false;
  for (const auto& p : t->peers_)
    if (p != nullptr)
      any_takes_fd = any_takes_fd || (p->send->properties().ptr_support & fabric::kPtrFd) != 0 ||
                     (p->recv->properties().ptr_support & fabric::kPtrFd) != 0;
  std::optional<device::ExportedMemory> exported;
  if (dprops.export_fd && any_takes_fd) {
    auto e = device.Export(*t->staging_);
    if (e.ok() && e->kind == device::ExportKind::kFd && e->fd.valid()) {
      exported = std::move(e).value();
    } else {
      KZ_WARN(kLogColl, "{}: exporting the staging buffer of {} failed ({}); registering it without an fd, so "
              "transfers between staging buffers take an extra copy", where, device.label(),
              e.ok() ? std::string("no fd in the export") : e.status().ToString());
    }
  }
  std::set<StagingPath> paths_used;
  std::set<std::string> fallbacks;
  auto register_staging = [&](fabric::Comm& comm, int q) -> Result<fabric::Registration*> {
    const uint32_t support = comm.properties().ptr_support;
    std::vector<std::pair<StagingPath, fabric::MemoryDescriptor>> tries;
    if (exported && (support & fabric::kPtrFd) != 0)
      tries.emplace_back(StagingPath::kFd,
                         fabric::MemoryDescriptor::FromExport(t->staging_->data(), *exported, dprops.host_accessible));
    if ((support & fabric::kPtrDevice) != 0)
      tries.emplace_back(StagingPath::kDevicePointer,
                         fabric::MemoryDescriptor{fabric::MemoryType::kDevice, t->staging_->data(),
                                                  t->staging_->size(), dprops.host_accessible, -1, 0});
    if (dprops.host_accessible && (support & fabric::kPtrHost) != 0)
      tries.emplace_back(StagingPath::kHostPointer,
                         fabric::MemoryDescriptor::Host(t->staging_->data(), t->staging_->size()));
    if (dprops.export_fd && (support & fabric::kPtrFd) == 0)
      fallbacks.insert(fmt::format("{} does not register by fd", comm.properties().name));
    std::string refused;
    for (auto& [path, memory] : tries) {
      auto reg = comm.Register(memory);
      if (reg.ok()) {
        paths_used.insert(path);
        return *reg;
      }
      if (reg.status().code() != StatusCode::kNotSupported)
        return reg.status().WithContext(fmt::format("{}: registering the staging buffer {} for rank {}", where,
                                                    PathName(path), q));
      fallbacks.insert(fmt::format("{} refused registration {}: {}", comm.label(), PathName(path),
                                   reg.status().message()));
      refused += fmt::format("; {}: {}", PathName(path), reg.status().message());
    }
    std::string takes;
    if ((support & fabric::kPtrHost) != 0) takes += " host pointers";
    if ((support & fabric::kPtrDevice) != 0) takes += " device pointers";
    if ((support & fabric::kPtrFd) != 0) takes += " fds";
    return NotSupported(fmt::format(
        "{}: {} cannot reach the staging memory of {} for rank {} (the device is {}host accessible and exports {}; "
        "fabric device {} takes{}){}; staging through host memory is not implemented",
        where, fabric.name(), device.label(), q, dprops.host_accessible ? "" : "not ",
        dprops.export_fd ? "fds" : "no fds", comm.properties().name, takes.empty() ? " nothing" : takes, refused));
  };
  auto register_control = [&](fabric::Comm& comm, std::vector<uint8_t>& buffer, int q,
                              std::string_view dir) -> Result<fabric::Registration*> {
    buffer.assign(options.control_bytes, 0);
    auto reg = comm.Register(fabric::MemoryDescriptor::Host(buffer.data(), buffer.size()));
    if (!reg.ok())
      return reg.status().WithContext(
          fmt::format("{}: registering the control buffer {} rank {}", where, dir, q));
    return *reg;
  };
  std::vector<int> connected;
  std::set<std::string> device_names;
  for (int q = 0; q < n; ++q) {
    Peer* p = t->peers_[static_cast<size_t>(q)].get();
    if (p == nullptr) continue;
    KZ_ASSIGN_OR_RETURN(p->send_staging, register_staging(*p->send, q));
    KZ_ASSIGN_OR_RETURN(p->recv_staging, register_staging(*p->recv, q));
    KZ_ASSIGN_OR_RETURN(p->send_control, register_control(*p->send, p->control_out, q, "to"));
    KZ_ASSIGN_OR_RETURN(p->recv_control, register_control(*p->recv, p->control_in, q, "from"));
    // FabricDeviceProperties::speed_gbps is in gigabits per second (as NICs are rated);
    // LinkDesc::gbps is in gigabytes per second (as the cost model counts bytes): divide by 8.
    const FabricDeviceProperties& via = p->send->properties();
    t->link_row_[static_cast<size_t>(q)] = LinkDesc{true, via.latency_us, via.speed_gbps / 8.0, true};
    connected.push_back(q);
    device_names.insert(via.name);
    device_names.insert(p->recv->properties().name);
  }
  exported.reset();

  std::string paths;
  for (StagingPath path : paths_used) paths += fmt::format("{}{}", paths.empty() ? "" : " and ", PathName(path));
  std::string names;
  for (const std::string& name : device_names) names += fmt::format("{}{}", names.empty() ? "" : ", ", name);
  t->description_ = fmt::format("{} ({}), staging {}", fabric.name(),
                                names.empty() ? std::string("no peers") : "device" +
                                    std::string(device_names.size() == 1 ? " " : "s ") + names,
                                paths.empty() ? std::string("unregistered") : paths);
  if (!fallbacks.empty()) {
    std::string why;
    for (const std::string& f : fallbacks) why += fmt::format("{}{}", why.empty() ? "" : "; ", f);
    KZ_WARN(kLogColl, "{}: staging is not registered by fd everywhere, so transfers take an extra copy: {}", where,
            why);
  }
  KZ_INFO(kLogColl, "{}: {} peer(s) ({}) over {}{}", where, connected.size(),
          connected.empty() ? std::string("none") : RankList(connected),
          names.empty() ? std::string("no device")
                        : fmt::format("{} {}", device_names.size() == 1 ? "device" : "devices", names),
          unreachable.empty() ? std::string() : fmt::format("; {} unreachable", RankList(unreachable)));
  KZ_INFO(kLogColl, "{}: staging {} on {}, registered {} on {}", where, SizeText(options.staging_bytes), device.label(),
          paths.empty() ? std::string("nowhere (no peers)") : paths, fabric.name());
  return t;
}

}  // namespace kizuna::collectives
