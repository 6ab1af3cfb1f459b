// The transport's staging buffer: allocated on the device, registered on every connection the
// first way that connection takes (DMA-BUF fd, the device's fd export, device pointer, host
// pointer), or — when some connection takes none and the device's memory is not host accessible —
// moved to host memory from Device::AllocateHost for every connection (transport.h).
#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/transport/transport.h"
#include "collectives/transport/internal.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {
namespace {

using transport_internal::NameList;
using transport_internal::SizeText;

// ---- How the staging buffer is registered ----

// One comm's staging registration, wherever it lives in the peer table.
struct StagingSlot {
  fabric::Comm* comm = nullptr;
  fabric::Registration** registration = nullptr;  // Peer::send_staging or recv_staging
  const fabric::Fabric* fabric = nullptr;
  int peer = -1;
};

std::vector<StagingSlot> StagingSlots(std::vector<std::unique_ptr<Transport::Peer>>& peers) {
  std::vector<StagingSlot> out;
  for (auto& p : peers) {
    if (p == nullptr) continue;
    out.push_back(StagingSlot{p->send.get(), &p->send_staging, p->fabric, p->rank});
    out.push_back(StagingSlot{p->recv.get(), &p->recv_staging, p->fabric, p->rank});
  }
  return out;
}

// "directconnect, ofi": the fabrics the slots use, in peer order, each once.
std::string FabricsOf(const std::vector<StagingSlot>& slots) {
  std::vector<std::string> names;
  for (const StagingSlot& s : slots)
    if (std::find(names.begin(), names.end(), s.fabric->name()) == names.end()) names.push_back(s.fabric->name());
  return names.empty() ? std::string("no fabric") : NameList(names);
}

// ---- SetUpStaging's steps ----

// The staging buffer's fd exports, each present when the device makes it and some comm takes fds.
struct StagingExports {
  std::optional<device::ExportedMemory> dmabuf, exported;
};

// Exported once each (when the device exports them and some comm takes fds); an export is only
// needed during Register, which dup()s what it keeps.
StagingExports ExportStaging(device::Device& device, device::Buffer& staging, const std::vector<StagingSlot>& slots,
                             const std::string& where) {
  const device::DeviceProperties& dprops = device.properties();
  bool any_takes_fd = false;
  for (const StagingSlot& s : slots)
    any_takes_fd = any_takes_fd || (s.comm->properties().ptr_support & fabric::kPtrFd) != 0;
  StagingExports out;
  if (any_takes_fd && dprops.export_dmabuf) {
    auto e = device.ExportDmaBuf(staging, 0, staging.size());
    if (e.ok() && e->fd.valid()) {
      out.dmabuf = std::move(e).value();
    } else {
      KZ_INFO(kLogColl, "{}: exporting the staging buffer of {} as a DMA-BUF failed ({}); trying its other exports",
              where, device.label(), e.ok() ? std::string("no fd in the export") : e.status().ToString());
    }
  }
  if (any_takes_fd && dprops.export_fd) {
    auto e = device.Export(staging);
    if (e.ok() && e->kind == device::ExportKind::kFd && e->fd.valid()) {
      out.exported = std::move(e).value();
    } else {
      KZ_WARN(kLogColl,
              "{}: exporting the staging buffer of {} failed ({}); registering it without an fd, so "
              "transfers between staging buffers take an extra copy",
              where, device.label(), e.ok() ? std::string("no fd in the export") : e.status().ToString());
    }
  }
  return out;
}

using StagingTry = std::pair<StagingPath, fabric::MemoryDescriptor>;

// The ways a comm that takes `support` (fabric::kPtr* bits) may register the staging buffer, in
// the order they are tried.
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

// Registers the staging buffer on s's comm the first way of `tries` it accepts, and returns that
// way; nullopt when the comm refuses every one (kNotSupported each, added to `fallbacks` and, as
// "; path: why", to `refused`). Any other error fails.
Result<std::optional<StagingPath>> RegisterFirst(const StagingSlot& s, const std::vector<StagingTry>& tries,
                                                 const std::string& where, std::set<std::string>& fallbacks,
                                                 std::string& refused) {
  fabric::Comm& comm = *s.comm;
  for (const auto& [path, memory] : tries) {
    auto reg = comm.Register(memory);
    if (reg.ok()) {
      *s.registration = *reg;
      return std::optional<StagingPath>(path);
    }
    if (reg.status().code() != StatusCode::kNotSupported)
      return reg.status().WithContext(fmt::format("{}: registering the staging buffer {} for rank {} on {}", where,
                                                  StagingPathName(path), s.peer, s.fabric->name()));
    fallbacks.insert(
        fmt::format("{} refused registration {}: {}", comm.label(), StagingPathName(path), reg.status().message()));
    refused += fmt::format("; {}: {}", StagingPathName(path), reg.status().message());
  }
  return std::optional<StagingPath>();
}

// Why s's comm refused every way of registering the device's memory: what its fabric device takes,
// what the device exports, and each refusal (`refused`, from RegisterFirst).
std::string RefusalDetail(const StagingSlot& s, const device::DeviceProperties& dprops, const std::string& refused) {
  const fabric::Comm& comm = *s.comm;
  const uint32_t support = comm.properties().ptr_support;
  std::string takes;
  if ((support & fabric::kPtrHost) != 0) takes += " host pointers";
  if ((support & fabric::kPtrDevice) != 0) takes += " device pointers";
  if ((support & fabric::kPtrFd) != 0) takes += " fds";
  const std::string exports = dprops.export_dmabuf && dprops.export_fd ? "DMA-BUF and fds"
                              : dprops.export_dmabuf                   ? "DMA-BUF"
                              : dprops.export_fd                       ? "fds"
                                                                       : "nothing";
  return fmt::format("{} for rank {} (fabric device {} takes{}; the device is {}host accessible and exports {}){}",
                     comm.label(), s.peer, comm.properties().name, takes.empty() ? " nothing" : takes,
                     dprops.host_accessible ? "" : "not ", exports,
                     refused.empty() ? std::string(": no way of registering device memory applies") : refused);
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

Status Transport::SetUpStaging(device::Device& device, const TransportOptions& options, const std::string& where) {
  if (options.force_host_staging)
    return SetUpHostStaging(device, options, where, "forced by TransportOptions::force_host_staging", "");

  const device::DeviceProperties& dprops = device.properties();
  auto allocated = device.Allocate(options.staging_bytes);
  if (!allocated.ok())
    return allocated.status().WithContext(
        fmt::format("{}: allocating {} of staging on {}", where, SizeText(options.staging_bytes), device.label()));
  staging_ = std::move(allocated).value();
  const std::vector<StagingSlot> slots = StagingSlots(peers_);
  StagingExports exports = ExportStaging(device, *staging_, slots, where);

  // Per comm, so each by its own fabric: the first way the comm accepts.
  std::set<StagingPath> used;
  std::set<std::string> fallbacks;  // why some comm does not register by fd (an extra copy per transfer)
  for (const StagingSlot& s : slots) {
    const uint32_t support = s.comm->properties().ptr_support;
    const std::vector<StagingTry> tries = StagingTries(support, *staging_, exports, dprops);
    if ((dprops.export_fd || dprops.export_dmabuf) && (support & fabric::kPtrFd) == 0)
      fallbacks.insert(fmt::format("{} does not register by fd", s.comm->properties().name));
    std::string refused;
    KZ_ASSIGN_OR_RETURN(const std::optional<StagingPath> path, RegisterFirst(s, tries, where, fallbacks, refused));
    if (path) {
      used.insert(*path);
      continue;
    }

    // Every way refused: this fabric cannot reach the device's memory.
    const std::string why = fmt::format("{} cannot reach {} memory", s.fabric->name(), device.label());
    const std::string detail = RefusalDetail(s, dprops, refused);
    if (dprops.host_accessible)
      return NotSupported(
          fmt::format("{}: {}: {}; the CPU already addresses that memory, so staging through host "
                      "memory would not help",
                      where, why, detail));
    // One staging buffer serves every comm: release what the device buffer got, then stage
    // everything through host memory.
    exports.dmabuf.reset();
    exports.exported.reset();
    KZ_RETURN_IF_ERROR(DeregisterStaging(where));
    staging_.reset();
    return SetUpHostStaging(device, options, where, why, detail);
  }

  staging_paths_.assign(used.begin(), used.end());
  std::string paths;
  for (StagingPath path : staging_paths_)
    paths += fmt::format("{}{}", paths.empty() ? "" : " and ", StagingPathName(path));
  staging_text_ = paths.empty() ? std::string("unregistered") : paths;
  if (!fallbacks.empty()) {
    std::string why;
    for (const std::string& f : fallbacks) why += fmt::format("{}{}", why.empty() ? "" : "; ", f);
    KZ_WARN(kLogColl, "{}: staging is not registered by fd everywhere, so transfers take an extra copy: {}", where,
            why);
  }
  KZ_INFO(kLogColl, "{}: staging {} on {}, registered {} on {}", where, SizeText(options.staging_bytes), device.label(),
          paths.empty() ? std::string("nowhere (no peers)") : paths, FabricsOf(slots));
  return Status::Ok();
}

Status Transport::SetUpHostStaging(device::Device& device, const TransportOptions& options, const std::string& where,
                                   const std::string& why, const std::string& detail) {
  const std::string because = detail.empty() ? why : fmt::format("{}: {}", why, detail);
  auto allocated = device.AllocateHost(options.staging_bytes);
  if (!allocated.ok())
    return allocated.status().WithContext(fmt::format("{}: staging through host memory ({}): allocating {} of host "
                                                      "memory for {}",
                                                      where, because, SizeText(options.staging_bytes), device.label()));
  staging_ = std::move(allocated).value();
  host_staging_ = true;
  const std::vector<StagingSlot> slots = StagingSlots(peers_);
  for (const StagingSlot& s : slots) {
    auto reg = s.comm->Register(fabric::MemoryDescriptor::Host(staging_->data(), staging_->size()));
    if (!reg.ok())
      return reg.status().WithContext(fmt::format("{}: registering host staging memory for rank {} on {} (staging "
                                                  "through host memory: {})",
                                                  where, s.peer, s.fabric->name(), because));
    *s.registration = *reg;
  }
  staging_paths_.clear();
  if (!slots.empty()) staging_paths_.push_back(StagingPath::kHostMemory);
  staging_text_ = fmt::format("through host memory ({})", why);
  KZ_INFO(kLogColl, "{}: staging through host memory: {} ({} of {}'s host memory, registered on {})", where, because,
          SizeText(options.staging_bytes), device.label(), FabricsOf(slots));
  return Status::Ok();
}

Status Transport::DeregisterStaging(const std::string& where) {
  for (const StagingSlot& s : StagingSlots(peers_)) {
    fabric::Registration* reg = std::exchange(*s.registration, nullptr);
    if (reg == nullptr) continue;
    Status st = s.comm->Deregister(reg);
    if (!st.ok())
      return st.WithContext(fmt::format("{}: releasing the device staging registration for rank {}", where, s.peer));
  }
  staging_paths_.clear();
  return Status::Ok();
}

}  // namespace kizuna::collectives
