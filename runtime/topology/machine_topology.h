// The machine's topology as an operator needs it for placing traffic: sockets, NUMA nodes, the PCIe
// tree, the accelerators and the NICs in it, and how far each accelerator is from each NIC. Read by
// hwloc from this machine (Detect) or from an hwloc XML file (LoadXml: another machine's
// `lstopo --of xml`, or a server shape written for tests).
//
// What counts as a PCIe switch: the upstream port of one, i.e. a PCI-to-PCI bridge below the root
// complex other than a root port with a single child (a root port leading to one switch or one
// device is the CPU's, not a switch). An accelerator or NIC directly on a root port is behind no
// switch. A switch that firmware partitions shows up as several: that is what --expect catches.
#ifndef KIZUNA_RUNTIME_TOPOLOGY_MACHINE_TOPOLOGY_H_
#define KIZUNA_RUNTIME_TOPOLOGY_MACHINE_TOPOLOGY_H_

#include <string>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::topology {

// How far apart two PCI devices are, nearest first (NCCL's PIX/PXB, PHB, NODE and SYS, with the
// socket split out of SYS).
enum class Distance {
  kSwitch = 0,       // below one PCIe switch: traffic never reaches the CPU
  kRootComplex = 1,  // below one root complex (host bridge)
  kNumaNode = 2,     // different root complexes of one NUMA node
  kSocket = 3,       // different NUMA nodes of one socket
  kSystem = 4,       // across sockets
};
const char* DistanceName(Distance d);  // "same PCIe switch", ...

// An accelerator or a NIC: a PCI device and where it sits.
struct PciDevice {
  std::string name;          // accelerators: the OS device ("cuda0", "rsmi1", ...) else the bus id;
                             // NICs: the network interface ("eth1"), else the RDMA device
  std::string rdma;          // NICs: the RDMA device ("mlx5_0"), "" if none
  std::string pci_bus_id;    // "0000:1b:00.0"
  int switch_index = -1;     // into MachineTopology::switches; -1: behind no switch
  int root_complex = -1;     // index of its host bridge, in the order found
  int numa_node = -1;        // OS index; -1 unknown
  int socket = -1;           // OS index of its package; -1 unknown
  std::vector<int> parents;  // indices into MachineTopology::bridges, the host bridge first
};

struct Bridge {
  std::string pci_bus_id;  // "" for a host bridge
  bool host = false;       // a host bridge (root complex)
  bool is_switch = false;  // the upstream port of a PCIe switch (see the top of this file)
};

struct Switch {
  int bridge = -1;  // into MachineTopology::bridges
  std::string pci_bus_id;
  int root_complex = -1;
  int socket = -1;
  std::vector<int> accelerators, nics;  // indices
};

struct MachineTopology {
  std::string source;  // "this machine" or the XML file's path
  std::string host_name;
  int sockets = 0, numa_nodes = 0, root_complexes = 0;
  std::vector<Bridge> bridges;
  std::vector<Switch> switches;
  std::vector<PciDevice> accelerators, nics;
  std::string tree;  // the PCIe tree as indented text, accelerators and NICs named

  Distance Between(const PciDevice& a, const PciDevice& b) const;
  // The accelerator with this PCI bus id (any case, with or without the domain), -1 if none.
  int FindAccelerator(const std::string& pci_bus_id) const;
};

// This machine, through hwloc (every I/O object kept).
Result<MachineTopology> Detect();
// An hwloc XML topology file; kInvalidArgument naming the file when hwloc cannot read it.
Result<MachineTopology> LoadXml(const std::string& path);

// The NIC each accelerator should use, by index (-1: the machine has no NIC). Every accelerator
// takes a NIC of its own where one is free within its NUMA node, nearest first (the free NICs of
// its switch, then of its root complex, then of its NUMA node; accelerators with fewer choices
// first); the rest share the nearest, least used NIC.
struct NicChoice {
  int nic = -1;
  Distance distance = Distance::kSystem;
  bool shared = false;  // another accelerator has the same NIC
};
std::vector<NicChoice> AssignNics(const MachineTopology& t);

// What operators trip on. Each finding is one line of text, saying what and what kizuna does.
struct Finding {
  enum class Kind {
    kSharedNearestNic,    // accelerators whose nearest NIC is one while another NIC is nobody's nearest
    kNicOnOtherSocket,    // a NIC on a socket none of the accelerators nearest to it are on
    kUnexpectedSwitches,  // more (or fewer) PCIe switches than --expect says
    kNoNicInSwitch,       // an accelerator with no NIC within its PCIe switch
  };
  Kind kind;
  std::string message;
};
const char* FindingName(Finding::Kind k);  // "shared-nearest-nic", ...
// `expect_switches` < 0: not checked.
std::vector<Finding> Check(const MachineTopology& t, int expect_switches = -1);

// The device-to-NIC table (accelerator, its bus id, switch, socket, the NIC chosen, distance, and
// each NIC's distance class), as text.
std::string DescribeAssignment(const MachineTopology& t);
// Everything above as JSON: sockets, switches, accelerators, NICs, the distance matrix, the
// assignment and the findings.
std::string ToJson(const MachineTopology& t, int expect_switches = -1);

}  // namespace kizuna::topology

#endif  // KIZUNA_RUNTIME_TOPOLOGY_MACHINE_TOPOLOGY_H_
