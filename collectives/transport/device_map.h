// Which fabric device serves which peer: the NIC nearest the rank's accelerator (the machine's
// topology where it places the accelerator, else what the fabric says), the rails, the
// point-to-point ports. What transport.cc's phases consult; not a public header.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/fabric.h"
#include "runtime/core/status.h"
#include "runtime/device/device.h"
#include "runtime/topology/machine_topology.h"

namespace kizuna::collectives::transport_internal {

// A listen a rank offers its peers (the second allgather's records, transport.cc).
struct Offer {
  int fabric = -1;
  int device = -1;
  bool point_to_point = false;
  int link_peer = -1;  // point-to-point: the rank it reaches; switched: its rail (-1: no rails)
  fabric::Handle handle;
};

// Where the machine's topology (runtime/topology) puts the rank's accelerator, and the NIC it
// gives every accelerator of the machine, in the topology's order (PCI order).
struct MachinePlace {
  std::string source;  // the topology's file, or "this machine"
  int accelerator = -1;
  std::vector<topology::PciDevice> accelerators, nic_of;
  std::vector<topology::NicChoice> choice;
};
// The place of `device` in the machine's topology: KIZUNA_MACHINE_TOPOLOGY's hwloc XML file when
// `file` is set, else this machine as hwloc sees it (read once per process). nullopt when the
// device has no PCI bus id (emulated devices unless KIZUNA_EMU_PCI_BUS_IDS gives them one), the
// topology does not list it, or the machine has no NIC; a file that cannot be read is an error.
Result<std::optional<MachinePlace>> PlaceOf(const device::DeviceProperties& device, const std::string& file);

// Rails: a host with several NICs gives local rank i the i-th (KIZUNA_NICS' order; else the
// machine topology's, rail i being the NIC of the host's i-th accelerator; else by name) of the
// switched devices nearest its accelerator, so that the ranks of rail i (local rank i of every
// host) talk over NIC i on every host. A pair of ranks on two hosts with different local indices
// i, j uses NIC min(i mod k, j mod k) at both ends (both compute the same), so that a
// rail-optimised network, each NIC on a network of its own, still connects them.
struct Rails {
  std::vector<int> local;          // every rank's index among the ranks of its host; empty: no rails
  std::vector<std::string> hosts;  // every rank's host id
  std::vector<std::string> nics;   // KIZUNA_NICS
  const MachinePlace* place = nullptr;
};

// The interface a device name ends in: "tcp;ofi_rxm:eth1" -> "eth1".
std::string_view InterfaceOf(std::string_view name);
// The provider part before it ("tcp;ofi_rxm").
std::string_view ProviderOf(std::string_view name);

class DeviceMap {
 public:
  static Result<DeviceMap> Build(fabric::Fabric& fabric, const device::Device& device, int rank, const Rails& rails);

  // The rail of the pair (this rank, peer), -1 without rails (see Rails).
  int RailOf(int peer) const;
  // The switched device for the pair: its rail's NIC.
  int SwitchedFor(int peer) const {
    const int rail = RailOf(peer);
    return rail < 0 ? switched_ : rail_nics_[static_cast<size_t>(rail)];
  }
  // This rank's own NIC between hosts (for the log), how many rails there are, and why that NIC
  // ("" when nothing but the fabric's order chose it).
  int RailNic() const { return SwitchedFor(rank_); }
  int rail_count() const { return static_cast<int>(rail_nics_.size()); }
  const std::string& why() const { return why_; }

  const fabric::FabricDeviceProperties& props(int d) const { return props_[static_cast<size_t>(d)]; }

  // The device this rank listens on for `peer`: the first port linked to it, else the switched
  // device; -1 when none reaches it.
  int Serving(int peer) const;
  // The device to connect from to `peer`'s offer: for a point-to-point listener, the port at the
  // far end of exactly that link (with two links between a pair, each direction uses its own);
  // for a switched one, this rank's switched device. -1 when there is none.
  int ConnectingFor(int peer, const Offer& offer) const;

 private:
  Status ChooseRails(const std::string& fabric);
  // The switched device that is the topology's NIC `nic` (by interface, RDMA device or PCI
  // address), -1 if this fabric has none.
  int DeviceOfNic(const topology::PciDevice& nic) const;

  std::vector<fabric::FabricDeviceProperties> props_;
  int switched_ = -1;
  int rank_ = 0;
  const Rails* rails_ = nullptr;
  std::vector<int> rail_nics_;  // the rails' devices, rail i on rail_nics_[i]; one: no rails
  std::string why_;
};

}  // namespace kizuna::collectives::transport_internal
