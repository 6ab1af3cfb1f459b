#include "collectives/transport/device_map.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <fmt/format.h>

namespace kizuna::collectives::transport_internal {

using fabric::FabricDeviceProperties;

std::string_view InterfaceOf(std::string_view name) {
  const size_t colon = name.rfind(':');
  return colon == std::string_view::npos ? name : name.substr(colon + 1);
}

std::string_view ProviderOf(std::string_view name) {
  const size_t colon = name.rfind(':');
  return colon == std::string_view::npos ? std::string_view() : name.substr(0, colon);
}

Result<std::optional<MachinePlace>> PlaceOf(const device::DeviceProperties& device, const std::string& file) {
  if (device.pci_bus_id.empty()) return std::optional<MachinePlace>();
  // Read once per process and file: hwloc's walk of sysfs takes milliseconds, and a process may
  // create many communicators (or hold many ranks).
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Result<topology::MachineTopology>>> cache;
  std::shared_ptr<const Result<topology::MachineTopology>> t;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = cache[file];
    if (!slot)
      slot = std::make_shared<const Result<topology::MachineTopology>>(file.empty() ? topology::Detect()
                                                                                    : topology::LoadXml(file));
    t = slot;
  }
  if (!t->ok()) {
    if (!file.empty()) return t->status().WithContext("KIZUNA_MACHINE_TOPOLOGY");
    return std::optional<MachinePlace>();  // no topology of this machine: the fabric's own nearness decides
  }
  const topology::MachineTopology& m = t->value();
  const int a = m.FindAccelerator(device.pci_bus_id);
  if (a < 0 || m.nics.empty()) return std::optional<MachinePlace>();
  MachinePlace p;
  p.source = m.source;
  p.accelerator = a;
  p.accelerators = m.accelerators;
  p.choice = topology::AssignNics(m);
  for (const topology::NicChoice& c : p.choice) p.nic_of.push_back(m.nics[static_cast<size_t>(c.nic)]);
  return std::optional<MachinePlace>(std::move(p));
}

Result<DeviceMap> DeviceMap::Build(fabric::Fabric& fabric, const device::Device& device, int rank, const Rails& rails) {
  DeviceMap m;
  m.rank_ = rank;
  m.rails_ = &rails;
  for (int d = 0; d < fabric.device_count(); ++d) {
    KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, fabric.properties(d));
    m.props_.push_back(std::move(p));
  }
  // The switched device nearest the rank's accelerator: the machine topology's NIC for it, then
  // one that names it, then one on its NUMA node, then the first.
  const device::DeviceProperties& dp = device.properties();
  auto first_switched = [&](auto&& pred) {
    for (size_t d = 0; d < m.props_.size(); ++d)
      if (!m.props_[d].point_to_point && pred(m.props_[d])) return static_cast<int>(d);
    return -1;
  };
  if (const MachinePlace* place = rails.place) {
    const auto a = static_cast<size_t>(place->accelerator);
    m.switched_ = m.DeviceOfNic(place->nic_of[a]);
    if (m.switched_ >= 0)
      m.why_ = fmt::format("the machine topology's NIC for its accelerator {} ({}{})", dp.pci_bus_id,
                           topology::DistanceName(place->choice[a].distance),
                           place->choice[a].shared ? ", shared with another accelerator" : "");
  }
  if (m.switched_ < 0)
    m.switched_ = first_switched([&](const FabricDeviceProperties& p) {
      return !dp.uuid.empty() &&
             std::find(p.near_device_uuids.begin(), p.near_device_uuids.end(), dp.uuid) != p.near_device_uuids.end();
    });
  if (m.switched_ < 0 && dp.numa_node >= 0)
    m.switched_ = first_switched([&](const FabricDeviceProperties& p) { return p.numa_node == dp.numa_node; });
  if (m.switched_ < 0) m.switched_ = first_switched([](const FabricDeviceProperties&) { return true; });
  if (m.switched_ >= 0) KZ_RETURN_IF_ERROR(m.ChooseRails(fabric.name()));
  return m;
}

int DeviceMap::DeviceOfNic(const topology::PciDevice& nic) const {
  for (size_t d = 0; d < props_.size(); ++d) {
    const FabricDeviceProperties& p = props_[d];
    if (p.point_to_point) continue;
    const std::string_view iface = InterfaceOf(p.name);
    if (iface == nic.name || (!nic.rdma.empty() && (p.name == nic.rdma || ProviderOf(p.name) == nic.rdma)) ||
        (!p.pci_path.empty() && p.pci_path.ends_with(nic.pci_bus_id)))
      return static_cast<int>(d);
  }
  return -1;
}

// The NICs of the rails (rail_nics_), in rail order, from the switched device chosen above:
// KIZUNA_NICS' devices in its order; else, where the machine topology places the accelerator, the
// NICs it gives the host's accelerators, in their order; else every device of the same provider
// and locality with another interface (loopback left out), by interface name.
Status DeviceMap::ChooseRails(const std::string& fabric) {
  const FabricDeviceProperties& first = props_[static_cast<size_t>(switched_)];
  rail_nics_ = {switched_};
  if (rails_->local.empty()) return Status::Ok();
  if (!rails_->nics.empty()) {
    rail_nics_.clear();
    for (const std::string& nic : rails_->nics) {
      int found = -1;
      for (size_t d = 0; d < props_.size() && found < 0; ++d)
        if (!props_[d].point_to_point && (props_[d].name == nic || InterfaceOf(props_[d].name) == nic))
          found = static_cast<int>(d);
      if (found < 0) {
        std::string names;
        for (const FabricDeviceProperties& p : props_)
          if (!p.point_to_point) names += (names.empty() ? "" : ", ") + p.name;
        return InvalidArgument(
            fmt::format("KIZUNA_NICS names {}, which {} does not have (its devices: {}); name "
                        "those to use between hosts, or unset KIZUNA_NICS",
                        nic, fabric, names.empty() ? "none" : names));
      }
      rail_nics_.push_back(found);
    }
    why_ = "as KIZUNA_NICS says";
    return Status::Ok();
  }
  if (const MachinePlace* place = rails_->place; place != nullptr && !why_.empty()) {
    std::vector<int> ordered;
    for (const topology::PciDevice& nic : place->nic_of) {
      const int d = DeviceOfNic(nic);
      if (d >= 0 && std::find(ordered.begin(), ordered.end(), d) == ordered.end()) ordered.push_back(d);
    }
    if (ordered.size() > 1) {
      rail_nics_ = std::move(ordered);
      const int mine = rails_->local[static_cast<size_t>(rank_)] % rail_count();
      if (rail_nics_[static_cast<size_t>(mine)] != switched_)
        why_ = fmt::format("rail {} of the machine topology's order; its accelerator {} is nearest {}", mine,
                           place->accelerators[static_cast<size_t>(place->accelerator)].pci_bus_id,
                           props_[static_cast<size_t>(switched_)].name);
      return Status::Ok();
    }
  }
  std::vector<std::pair<std::string, int>> same;
  for (size_t d = 0; d < props_.size(); ++d) {
    const FabricDeviceProperties& p = props_[d];
    if (p.point_to_point || ProviderOf(p.name) != ProviderOf(first.name) || InterfaceOf(p.name) == "lo" ||
        p.numa_node != first.numa_node || p.near_device_uuids != first.near_device_uuids)
      continue;
    same.emplace_back(std::string(InterfaceOf(p.name)), static_cast<int>(d));
  }
  std::sort(same.begin(), same.end());
  if (same.size() > 1) {
    rail_nics_.clear();
    for (const auto& [name, d] : same) rail_nics_.push_back(d);
    why_.clear();  // by local rank among the NICs, not the topology's choice
  }
  return Status::Ok();
}

int DeviceMap::RailOf(int peer) const {
  const auto k = static_cast<int>(rail_nics_.size());
  if (k <= 1 || rails_->local.empty()) return -1;
  const int i = rails_->local[static_cast<size_t>(rank_)] % k;
  if (rails_->hosts[static_cast<size_t>(peer)] == rails_->hosts[static_cast<size_t>(rank_)]) return i;
  return std::min(i, rails_->local[static_cast<size_t>(peer)] % k);
}

int DeviceMap::Serving(int peer) const {
  for (size_t d = 0; d < props_.size(); ++d)
    if (props_[d].point_to_point && props_[d].link_peer && props_[d].link_peer->rank == peer)
      return static_cast<int>(d);
  return switched_ < 0 ? -1 : SwitchedFor(peer);
}

int DeviceMap::ConnectingFor(int peer, const Offer& offer) const {
  if (!offer.point_to_point) return switched_ < 0 ? -1 : SwitchedFor(peer);
  for (size_t d = 0; d < props_.size(); ++d) {
    const FabricDeviceProperties& p = props_[d];
    if (p.point_to_point && p.link_peer && p.link_peer->rank == peer && p.link_peer->port == offer.device)
      return static_cast<int>(d);
  }
  return -1;
}

}  // namespace kizuna::collectives::transport_internal
