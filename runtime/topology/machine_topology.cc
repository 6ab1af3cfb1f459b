// Reading the machine's topology with hwloc: one walk over hwloc's tree collects the bridges, the
// accelerators and the NICs, each device with its chain of bridges, NUMA node and socket.
#include "runtime/topology/machine_topology.h"

#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

namespace kizuna::topology {
namespace {

struct HwlocDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using Hwloc = std::unique_ptr<hwloc_topology, HwlocDeleter>;

std::string BusId(const hwloc_obj_t o) {
  const auto& p = o->attr->pcidev;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", p.domain, p.bus, p.dev, p.func);
}

// The first OS device below `pci` of one of `types`, "" if none.
std::string OsDevice(const hwloc_obj_t pci, std::initializer_list<hwloc_obj_osdev_type_e> types) {
  for (hwloc_obj_osdev_type_e type : types)
    for (hwloc_obj_t c = pci->io_first_child; c != nullptr; c = c->next_sibling)
      if (c->type == HWLOC_OBJ_OS_DEVICE && c->attr->osdev.type == type && c->name != nullptr) return c->name;
  return "";
}

// Accelerators by PCI class: 3D controllers, processing accelerators, co-processors; a VGA
// controller only when a compute runtime names it (CUDA, OpenCL, Level Zero: a co-processor OS
// device) or it is NVIDIA's or AMD's (a virtual machine's display adapter is not one).
bool IsAccelerator(const hwloc_obj_t pci) {
  const unsigned cls = pci->attr->pcidev.class_id, vendor = pci->attr->pcidev.vendor_id;
  if (cls == 0x0302 || cls == 0x1200 || cls == 0x0b40) return true;
  return cls == 0x0300 && (!OsDevice(pci, {HWLOC_OBJ_OSDEV_COPROC}).empty() || vendor == 0x10de || vendor == 0x1002);
}

bool IsNic(const hwloc_obj_t pci) { return (pci->attr->pcidev.class_id >> 8) == 0x02; }

class Walker {
 public:
  Walker(hwloc_topology* h, MachineTopology* t) : h_(h), t_(t) {}

  // Returns the subtree's lines (empty when nothing below is an accelerator or a NIC).
  std::string Walk(hwloc_obj_t o, int indent) {
    std::string text;
    if (o->type == HWLOC_OBJ_BRIDGE) return WalkBridge(o, indent);
    if (o->type == HWLOC_OBJ_PCI_DEVICE) return WalkPci(o, indent);
    const bool io_parent = o->io_arity > 0;
    std::string below;
    for (hwloc_obj_t c = o->first_child; c != nullptr; c = c->next_sibling) below += Walk(c, indent + 1);
    for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) below += Walk(c, indent + 1);
    if (below.empty()) return "";
    if (o->type == HWLOC_OBJ_PACKAGE || (io_parent && o->type != HWLOC_OBJ_MACHINE))
      return fmt::format("{:{}}{}\n", "", 2 * indent, Place(o)) + below;
    // Levels that say nothing about placement (the machine, caches, groups) are left out.
    return Dedent(below);
  }

 private:
  std::string WalkBridge(hwloc_obj_t o, int indent) {
    const bool host = o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
    Bridge b;
    b.host = host;
    if (!host) b.pci_bus_id = BusId(o);
    // The switch rule (machine_topology.h): the first PCI-to-PCI bridge below a root port, or a
    // bridge on the host bridge that fans out to several bridges (root ports hidden).
    const bool parent_host = !chain_.empty() && t_->bridges[static_cast<size_t>(chain_.back())].host;
    int bridge_children = 0;
    for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling)
      bridge_children += c->type == HWLOC_OBJ_BRIDGE ? 1 : 0;
    b.is_switch = !host && !InSwitch() && (!parent_host || bridge_children > 1);
    const int index = static_cast<int>(t_->bridges.size());
    t_->bridges.push_back(b);
    int root = root_;
    if (host) root_ = t_->root_complexes++;
    chain_.push_back(index);
    std::string below;
    for (hwloc_obj_t c = o->io_first_child; c != nullptr; c = c->next_sibling) below += Walk(c, indent + 1);
    chain_.pop_back();
    if (host) root_ = root;
    if (below.empty()) {
      // Nothing of interest below: forget it (and any switch numbering stays dense).
      return "";
    }
    std::string line;
    if (host) {
      line = fmt::format("root complex {}", t_->root_complexes - 1);
    } else if (b.is_switch) {
      line = fmt::format("PCIe switch {} (upstream port {})", SwitchOf(index), b.pci_bus_id);
    } else {
      line = fmt::format("bridge {}", b.pci_bus_id);
    }
    return fmt::format("{:{}}{}\n", "", 2 * indent, line) + below;
  }

  std::string WalkPci(hwloc_obj_t o, int indent) {
    const bool acc = IsAccelerator(o), nic = !acc && IsNic(o);
    if (!acc && !nic) return "";
    PciDevice d;
    d.pci_bus_id = BusId(o);
    d.parents = chain_;
    d.root_complex = root_;
    if (acc) {
      d.name = OsDevice(o, {HWLOC_OBJ_OSDEV_COPROC, HWLOC_OBJ_OSDEV_GPU});
    } else {
      d.name = OsDevice(o, {HWLOC_OBJ_OSDEV_NETWORK});
      d.rdma = OsDevice(o, {HWLOC_OBJ_OSDEV_OPENFABRICS});
      if (d.name.empty()) d.name = d.rdma;
    }
    if (d.name.empty()) d.name = d.pci_bus_id;
    const hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h_, o);
    if (anc != nullptr && anc->nodeset != nullptr && !hwloc_bitmap_iszero(anc->nodeset) &&
        hwloc_bitmap_weight(anc->nodeset) == 1)
      d.numa_node = hwloc_bitmap_first(anc->nodeset);
    hwloc_obj_t pkg = anc;
    while (pkg != nullptr && pkg->type != HWLOC_OBJ_PACKAGE) pkg = pkg->parent;
    if (pkg != nullptr) d.socket = static_cast<int>(pkg->os_index);
    for (int b : chain_)
      if (t_->bridges[static_cast<size_t>(b)].is_switch) {
        d.switch_index = SwitchOf(b);
        break;
      }
    std::string line;
    if (acc) {
      line = fmt::format("accelerator {} {}", d.name, d.pci_bus_id);
      if (d.switch_index >= 0)
        t_->switches[static_cast<size_t>(d.switch_index)].accelerators.push_back(
            static_cast<int>(t_->accelerators.size()));
      t_->accelerators.push_back(d);
    } else {
      line = fmt::format("NIC {}{} {}", d.name, d.rdma.empty() || d.rdma == d.name ? "" : " (" + d.rdma + ")",
                         d.pci_bus_id);
      if (d.switch_index >= 0)
        t_->switches[static_cast<size_t>(d.switch_index)].nics.push_back(static_cast<int>(t_->nics.size()));
      t_->nics.push_back(d);
    }
    return fmt::format("{:{}}{}\n", "", 2 * indent, line);
  }

  bool InSwitch() const {
    return std::any_of(chain_.begin(), chain_.end(),
                       [&](int b) { return t_->bridges[static_cast<size_t>(b)].is_switch; });
  }

  // The switch of bridge `b` (an upstream port), numbered when first met below it.
  int SwitchOf(int b) {
    for (size_t s = 0; s < t_->switches.size(); ++s)
      if (t_->switches[s].bridge == b) return static_cast<int>(s);
    Switch s;
    s.bridge = b;
    s.pci_bus_id = t_->bridges[static_cast<size_t>(b)].pci_bus_id;
    s.root_complex = root_;
    t_->switches.push_back(s);
    return static_cast<int>(t_->switches.size()) - 1;
  }

  std::string Place(hwloc_obj_t o) {
    if (o->type == HWLOC_OBJ_PACKAGE) {
      std::string nodes;
      if (o->nodeset != nullptr) {
        unsigned i = 0;
        hwloc_bitmap_foreach_begin(i, o->nodeset) nodes += (nodes.empty() ? "" : ", ") + std::to_string(i);
        hwloc_bitmap_foreach_end();
      }
      return fmt::format("socket {}{}", o->os_index, nodes.empty() ? "" : " (NUMA node " + nodes + ")");
    }
    return fmt::format("{} {}", hwloc_obj_type_string(o->type), o->os_index);
  }

  static std::string Dedent(const std::string& text) {
    std::string out;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + start, end - start);
      if (line.substr(0, 2) == "  ") line.remove_prefix(2);
      out.append(line).push_back('\n');
      start = end + 1;
    }
    return out;
  }

  hwloc_topology* h_;
  MachineTopology* t_;
  std::vector<int> chain_;  // the bridges above the object being walked, outermost first
  int root_ = -1;
};

Result<MachineTopology> Load(const std::string* xml) {
  hwloc_topology* raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return Internal("hwloc: hwloc_topology_init failed");
  Hwloc h(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  const std::string where = xml != nullptr ? *xml : "this machine";
  if (xml != nullptr && hwloc_topology_set_xml(raw, xml->c_str()) != 0)
    return InvalidArgument(fmt::format("hwloc cannot read the XML topology {}: {}", *xml, std::strerror(errno)));
  if (hwloc_topology_load(raw) != 0)
    return xml != nullptr
               ? InvalidArgument(fmt::format("hwloc cannot load the XML topology {}: {}", *xml, std::strerror(errno)))
               : Internal(fmt::format("hwloc cannot read this machine's topology: {}", std::strerror(errno)));
  MachineTopology t;
  t.source = where;
  const hwloc_obj_t root = hwloc_get_root_obj(raw);
  if (const char* name = hwloc_obj_get_info_by_name(root, "HostName")) t.host_name = name;
  t.sockets = std::max(1, hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_PACKAGE));
  t.numa_nodes = std::max(1, hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE));
  Walker w(raw, &t);
  t.tree = w.Walk(root, 0);
  for (Switch& s : t.switches) {
    const std::vector<int>& first = s.accelerators.empty() ? s.nics : s.accelerators;
    const std::vector<PciDevice>& of = s.accelerators.empty() ? t.nics : t.accelerators;
    if (!first.empty()) s.socket = of[static_cast<size_t>(first.front())].socket;
  }
  return t;
}

}  // namespace

const char* DistanceName(Distance d) {
  switch (d) {
    case Distance::kSwitch: return "same PCIe switch";
    case Distance::kRootComplex: return "same root complex";
    case Distance::kNumaNode: return "same NUMA node";
    case Distance::kSocket: return "same socket";
    case Distance::kSystem: return "across sockets";
  }
  return "?";
}

Distance MachineTopology::Between(const PciDevice& a, const PciDevice& b) const {
  size_t common = 0;
  while (common < a.parents.size() && common < b.parents.size() && a.parents[common] == b.parents[common]) ++common;
  if (common > 0)
    return bridges[static_cast<size_t>(a.parents[common - 1])].host ? Distance::kRootComplex : Distance::kSwitch;
  if (a.numa_node >= 0 && a.numa_node == b.numa_node) return Distance::kNumaNode;
  if (a.socket >= 0 && a.socket == b.socket) return Distance::kSocket;
  // One socket, or neither placed: nothing says the traffic crosses sockets.
  if (sockets <= 1) return Distance::kSocket;
  return Distance::kSystem;
}

int MachineTopology::FindAccelerator(const std::string& pci_bus_id) const {
  std::string want = pci_bus_id;
  std::transform(want.begin(), want.end(), want.begin(), [](unsigned char c) { return std::tolower(c); });
  if (std::count(want.begin(), want.end(), ':') == 1) want = "0000:" + want;
  for (size_t i = 0; i < accelerators.size(); ++i)
    if (accelerators[i].pci_bus_id == want) return static_cast<int>(i);
  // CUDA names a bus id with an eight-digit domain ("00000000:1B:00.0").
  if (want.size() > 12 && want.find(':') > 4) {
    const std::string tail = want.substr(want.find(':') - 4);
    for (size_t i = 0; i < accelerators.size(); ++i)
      if (accelerators[i].pci_bus_id == tail) return static_cast<int>(i);
  }
  return -1;
}

Result<MachineTopology> Detect() { return Load(nullptr); }

Result<MachineTopology> LoadXml(const std::string& path) { return Load(&path); }

}  // namespace kizuna::topology
