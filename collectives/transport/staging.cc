// The transport's staging buffer: allocated on the device in Create, and registered on each comm as
// the comm is made, the first way that comm takes (DMA-BUF fd, the device's fd export, device
// pointer, host pointer) — or, when a fabric device that serves a peer takes none of those and the
// device's memory is not host accessible, host memory from Device::AllocateHost for every comm
// (transport.h). Which it is, is decided in Create from the fabric devices' properties; a refusal
// only registering shows moves the staging to host memory when it comes from the rank's first
// comm, and is an error after that.
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "collectives/transport/internal.h"
#include "collectives/transport/transport.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {

using transport_internal::NameList;
using transport_internal::SizeText;
using transport_internal::StagingExports;

namespace {

using StagingTry = std::pair<StagingPath, fabric::MemoryDescriptor>;

// The ways a comm whose device takes `support` (fabric::kPtr* bits) may register the staging
// buffer, in the order they are tried.
std::vector<StagingTry> StagingTries(uint32_t support, device::Buffer& staging, const StagingExports& exports,
                                     const device::DeviceProperties& dprops) {
  std::vector<StagingTry> tries;
  if (exports.dmabuf && (support & fabric::kPtrFd) != 0)
    tries.emplace_back(StagingPath::kDmaBuf,
                       fabric::MemoryDescriptor::FromExport(staging.data(), *exports.dmabuf, dprops.host_accessible));
  if (exports.exported && (support & fabric::kPtrFd) != 0)
    tries.emplace_back(StagingPath::kFd,
                       fabric::MemoryDescriptor::FromExport(staging.data(), *exports.exported, dprops.host_accessible));
  if ((support & fabric::kPtrDevice) != 0)
    tries.emplace_back(StagingPath::kDevicePointer,
                       fabric::MemoryDescriptor{fabric::MemoryType::kDevice, staging.data(), staging.size(),
                                                dprops.host_accessible, -1, 0});
  if (dprops.host_accessible && (support & fabric::kPtrHost) != 0)
    tries.emplace_back(StagingPath::kHostPointer, fabric::MemoryDescriptor::Host(staging.data(), staging.size()));
  return tries;
}

// What a fabric device takes and what the device offers: "fabric device w0:port1 takes host pointers
// fds; the device is not host accessible and exports DMA-BUF".
std::string Capabilities(const fabric::FabricDeviceProperties& props, const device::DeviceProperties& dprops) {
  std::string takes;
  if ((props.ptr_support & fabric::kPtrHost) != 0) takes += " host pointers";
  if ((props.ptr_support & fabric::kPtrDevice) != 0) takes += " device pointers";
  if ((props.ptr_support & fabric::kPtrFd) != 0) takes += " fds";
  const std::string exports = dprops.export_dmabuf && dprops.export_fd ? "DMA-BUF and fds"
                              : dprops.export_dmabuf                   ? "DMA-BUF"
                              : dprops.export_fd                       ? "fds"
                                                                       : "nothing";
  return fmt::format("fabric device {} takes{}; the device is {}host accessible and exports {}", props.name,
                     takes.empty() ? " nothing" : takes, dprops.host_accessible ? "" : "not ", exports);
}

}  // namespace

std::string_view StagingPathName(StagingPath path) {
  switch (path) {
    case StagingPath::kDmaBuf: return "by DMA-BUF fd";
    case StagingPath::kFd: return "by fd (device export)";
    case StagingPath::kDevicePointer: return "by device pointer";
    case StagingPath::kHostPointer: return "by host pointer";
    case StagingPath::kHostMemory: return "through host memory";
  }
  return "?";
}

Status Transport::SetUpStaging(device::Device& device, const TransportOptions& options) {
  how_ = std::make_unique<Staging>();
  staging_bytes_ = options.staging_bytes;
  if (options.force_host_staging) return SetUpHostStaging(device, "forced by TransportOptions::force_host_staging", "");

  const device::DeviceProperties& dprops = device.properties();
  // The fabric devices comms will be made on: each peer's device to connect from and the listen
  // its connection arrives at.
  struct Used {
    fabric::FabricDeviceProperties props;
    std::string fabric;
  };
  std::vector<Used> used;
  auto note = [&](const fabric::FabricDeviceProperties& props, const std::string& fabric) {
    for (const Used& u : used)
      if (u.fabric == fabric && u.props.index == props.index) return;
    used.push_back(Used{props, fabric});
  };
  for (const Route& r : routes_) {
    if (r.fabric < 0) continue;
    fabric::Fabric& fab = *fabrics_[static_cast<size_t>(r.fabric)];
    KZ_ASSIGN_OR_RETURN(fabric::FabricDeviceProperties props, fab.properties(r.connect_dev));
    note(props, fab.name());
    note(listens_[static_cast<size_t>(r.listen)].comm->properties(), fab.name());
  }
  for (const Used& u : used) how_->any_takes_fd = how_->any_takes_fd || (u.props.ptr_support & fabric::kPtrFd) != 0;

  // Per fabric device, the first way it takes (as far as the device's properties tell: an export
  // may still fail, and a comm still refuse): what its comms will register by.
  std::set<StagingPath> paths;
  std::set<std::string> fallbacks;  // why some comm will not register by fd (an extra copy per transfer)
  std::vector<std::string> fabric_names;
  for (const Used& u : used) {
    if (std::find(fabric_names.begin(), fabric_names.end(), u.fabric) == fabric_names.end())
      fabric_names.push_back(u.fabric);
    const uint32_t support = u.props.ptr_support;
    if ((dprops.export_fd || dprops.export_dmabuf) && (support & fabric::kPtrFd) == 0)
      fallbacks.insert(fmt::format("{} does not register by fd", u.props.name));
    std::optional<StagingPath> first;
    if ((support & fabric::kPtrFd) != 0 && dprops.export_dmabuf)
      first = StagingPath::kDmaBuf;
    else if ((support & fabric::kPtrFd) != 0 && dprops.export_fd)
      first = StagingPath::kFd;
    else if ((support & fabric::kPtrDevice) != 0)
      first = StagingPath::kDevicePointer;
    else if (dprops.host_accessible && (support & fabric::kPtrHost) != 0)
      first = StagingPath::kHostPointer;
    if (first) {
      paths.insert(*first);
      continue;
    }
    // No way applies: this fabric cannot reach the device's memory.
    const std::string why = fmt::format("{} cannot reach {} memory", u.fabric, device.label());
    const std::string detail =
        fmt::format("{}: no way of registering device memory applies", Capabilities(u.props, dprops));
    if (dprops.host_accessible)
      return NotSupported(fmt::format("{}: {}: {}; the CPU already addresses that memory, so staging through host "
                                      "memory would not help",
                                      where_, why, detail));
    // One staging buffer serves every comm: everything stages through host memory.
    return SetUpHostStaging(device, why, detail);
  }

  std::string text;
  for (StagingPath path : paths) text += fmt::format("{}{}", text.empty() ? "" : " and ", StagingPathName(path));
  {
    std::lock_guard lock(mu_);
    staging_paths_.assign(paths.begin(), paths.end());
    staging_text_ = text.empty() ? std::string("unregistered") : text;
  }
  if (!fallbacks.empty()) {
    std::string why;
    for (const std::string& f : fallbacks) why += fmt::format("{}{}", why.empty() ? "" : "; ", f);
    KZ_WARN(kLogColl, "{}: staging is not registered by fd everywhere, so transfers take an extra copy: {}", where_,
            why);
  }
  KZ_INFO(kLogColl, "{}: staging {} on {}, allocated with the first connection and registered {} on {}", where_,
          SizeText(staging_bytes_), device.label(), text.empty() ? std::string("nowhere (no peers)") : text,
          NameList(fabric_names));
  return Status::Ok();
}

Status Transport::EnsureStaging() {
  if (staging_ != nullptr) return Status::Ok();
  auto allocated = how_->host ? device_->AllocateHost(staging_bytes_) : device_->Allocate(staging_bytes_);
  if (!allocated.ok())
    return allocated.status().WithContext(fmt::format("{}: allocating {} of {}staging for {}", where_,
                                                      SizeText(staging_bytes_), how_->host ? "host " : "",
                                                      device_->label()));
  staging_ = std::move(allocated).value();
  if (!how_->host) how_->exports = ExportRegion(*staging_, "the staging buffer");
  return Status::Ok();
}

StagingExports Transport::ExportRegion(device::Buffer& buffer, std::string_view what) {
  // Exported once each (when the device exports them and some fabric device takes fds); an export
  // is only needed during Register, which dup()s what it keeps, and is kept for the comms made later.
  StagingExports exports;
  const device::DeviceProperties& dprops = device_->properties();
  if (how_->any_takes_fd && dprops.export_dmabuf) {
    auto e = device_->ExportDmaBuf(buffer, 0, buffer.size());
    if (e.ok() && e->fd.valid()) {
      exports.dmabuf = std::move(e).value();
    } else {
      KZ_INFO(kLogColl, "{}: exporting {} of {} as a DMA-BUF failed ({}); trying its other exports", where_, what,
              device_->label(), e.ok() ? std::string("no fd in the export") : e.status().ToString());
    }
  }
  if (how_->any_takes_fd && dprops.export_fd) {
    auto e = device_->Export(buffer);
    if (e.ok() && e->kind == device::ExportKind::kFd && e->fd.valid()) {
      exports.exported = std::move(e).value();
    } else {
      KZ_WARN(kLogColl,
              "{}: exporting {} of {} failed ({}); registering it without an fd, so transfers between staging "
              "buffers take an extra copy",
              where_, what, device_->label(), e.ok() ? std::string("no fd in the export") : e.status().ToString());
    }
  }
  return exports;
}

Status Transport::SetUpHostStaging(device::Device& device, const std::string& why, const std::string& detail) {
  const std::string because = detail.empty() ? why : fmt::format("{}: {}", why, detail);
  // The device must have host memory for its streams (AllocateHost): asked now, so that a device
  // without any fails the communicator's creation, not its first operation.
  if (auto probe = device.AllocateHost(1); !probe.ok())
    return probe.status().WithContext(
        fmt::format("{}: staging through host memory ({}): host memory for {}", where_, because, device.label()));
  Retire(std::move(staging_));  // allocated again, in host memory, when a comm needs it
  how_->host = true;
  how_->exports = StagingExports{};
  if (p2p_ != nullptr) {
    // Point-to-point's region moves too (no comm has registered it yet: this is the first).
    auto p2p = device.AllocateHost(p2p_->size());
    if (!p2p.ok())
      return p2p.status().WithContext(fmt::format("{}: allocating {} of host memory for point-to-point staging",
                                                  where_, SizeText(p2p_->size())));
    how_->p2p_exports = StagingExports{};
    Retire(std::move(p2p_));
    p2p_ = std::move(p2p).value();
  }
  bool any_peer = false;
  for (const Route& r : routes_) any_peer = any_peer || r.fabric >= 0;
  {
    std::lock_guard lock(mu_);
    host_staging_ = true;
    staging_paths_.clear();
    if (any_peer) staging_paths_.push_back(StagingPath::kHostMemory);
    staging_text_ = fmt::format("through host memory ({})", why);
  }
  KZ_INFO(kLogColl, "{}: staging through host memory: {} ({} of {}'s host memory, registered on each connection)",
          where_, because, SizeText(staging_bytes_), device.label());
  return Status::Ok();
}

Result<fabric::Registration*> Transport::RegisterStaging(fabric::Comm& comm, int q, bool p2p) {
  const std::string fabric_name = peers_[static_cast<size_t>(q)]->fabric->name();
  if (!p2p) KZ_RETURN_IF_ERROR(EnsureStaging());
  device::Buffer& buffer = p2p ? *p2p_ : *staging_;
  const std::string_view what = p2p ? "point-to-point staging" : "the staging buffer";
  if (how_->host) {
    auto reg = comm.Register(fabric::MemoryDescriptor::Host(buffer.data(), buffer.size()));
    if (!reg.ok())
      return reg.status().WithContext(fmt::format("{}: registering host memory for {} for rank {} on {} ({})", where_,
                                                  what, q, fabric_name, comm.label()));
    return *reg;
  }
  const device::DeviceProperties& dprops = device_->properties();
  const std::vector<StagingTry> tries =
      StagingTries(comm.properties().ptr_support, buffer, p2p ? how_->p2p_exports : how_->exports, dprops);
  std::string refused;
  for (const auto& [path, memory] : tries) {
    auto reg = comm.Register(memory);
    if (reg.ok()) {
      how_->registered_device = true;
      std::lock_guard lock(mu_);
      if (std::find(staging_paths_.begin(), staging_paths_.end(), path) == staging_paths_.end()) {
        // A way the fabric device's properties did not predict (an earlier one refused).
        staging_paths_.push_back(path);
        std::sort(staging_paths_.begin(), staging_paths_.end());
        staging_text_.clear();
        for (StagingPath p : staging_paths_)
          staging_text_ += fmt::format("{}{}", staging_text_.empty() ? "" : " and ", StagingPathName(p));
      }
      return *reg;
    }
    if (reg.status().code() != StatusCode::kNotSupported)
      return reg.status().WithContext(
          fmt::format("{}: registering {} {} for rank {} on {}", where_, what, StagingPathName(path), q, fabric_name));
    refused += fmt::format("; {}: {}", StagingPathName(path), reg.status().message());
  }
  // Every way refused: this fabric cannot reach the device's memory.
  const std::string why = fmt::format("{} cannot reach {} memory", fabric_name, device_->label());
  const std::string detail =
      fmt::format("{} for rank {} ({}){}", comm.label(), q, Capabilities(comm.properties(), dprops),
                  refused.empty() ? std::string(": no way of registering device memory applies") : refused);
  if (dprops.host_accessible)
    return NotSupported(fmt::format("{}: {}: {}; the CPU already addresses that memory, so staging through host "
                                    "memory would not help",
                                    where_, why, detail));
  if (how_->registered_device)
    return NotSupported(fmt::format("{}: {}: {}; other connections registered the staging buffer in the device's "
                                    "memory already, so it cannot move to host memory now (give the fabric "
                                    "properties that say so, or KIZUNA_FABRIC without it)",
                                    where_, why, detail));
  // The rank's first comm: no slot has carried a transfer yet, so the one staging buffer can still
  // move to host memory, for this comm and every later one.
  Retire(std::move(staging_));
  KZ_RETURN_IF_ERROR(SetUpHostStaging(*device_, why, detail));
  return RegisterStaging(comm, q, p2p);
}

void Transport::Retire(std::unique_ptr<device::Buffer> buffer) {
  if (buffer != nullptr) retired_.push_back(std::move(buffer));
}

Status Transport::ReserveP2p(size_t bytes) {
  if (p2p_ != nullptr && p2p_->size() >= bytes) return Status::Ok();
  const size_t size = std::max(bytes, p2p_ != nullptr ? 2 * p2p_->size() : bytes);
  auto allocated = how_->host ? device_->AllocateHost(size) : device_->Allocate(size);
  if (!allocated.ok())
    return allocated.status().WithContext(
        fmt::format("{}: allocating {} of point-to-point staging on {}", where_, SizeText(size), device_->label()));
  // Every comm's registration of the old region goes, then the new one is registered: no request is
  // in flight between operations.
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    for (auto [comm, reg] : {std::pair<fabric::Comm*, fabric::Registration**>{p->send.get(), &p->send_p2p},
                             std::pair<fabric::Comm*, fabric::Registration**>{p->recv.get(), &p->recv_p2p}}) {
      if (comm == nullptr || *reg == nullptr) continue;
      if (Status s = comm->Deregister(std::exchange(*reg, nullptr)); !s.ok())
        return s.WithContext(fmt::format("{}: releasing point-to-point staging for rank {}", where_, p->rank));
    }
  }
  Retire(std::move(p2p_));
  p2p_ = std::move(allocated).value();
  how_->p2p_exports = how_->host ? StagingExports{} : ExportRegion(*p2p_, "point-to-point staging");
  for (auto& p : peers_) {
    if (p == nullptr) continue;
    if (p->send != nullptr) {
      KZ_ASSIGN_OR_RETURN(p->send_p2p, RegisterStaging(*p->send, p->rank, /*p2p=*/true));
    }
    if (p->recv != nullptr) {
      KZ_ASSIGN_OR_RETURN(p->recv_p2p, RegisterStaging(*p->recv, p->rank, /*p2p=*/true));
    }
  }
  KZ_TRACE(kLogColl, "{}: point-to-point staging grown to {}", where_, SizeText(size));
  return Status::Ok();
}

std::vector<StagingPath> Transport::staging_paths() const {
  std::lock_guard lock(mu_);
  return staging_paths_;
}

bool Transport::host_staging() const {
  std::lock_guard lock(mu_);
  return host_staging_;
}

}  // namespace kizuna::collectives
