// Which NIC each accelerator uses, what an operator should be told about the machine, and the
// machine as text and JSON.
#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/topology/machine_topology.h"

namespace kizuna::topology {
namespace {

Distance At(const MachineTopology& t, size_t a, size_t n) { return t.Between(t.accelerators[a], t.nics[n]); }

// The NICs nearest accelerator a (all those at its smallest distance).
std::vector<int> Nearest(const MachineTopology& t, size_t a) {
  std::vector<int> out;
  Distance best = Distance::kSystem;
  for (size_t n = 0; n < t.nics.size(); ++n) {
    const Distance d = At(t, a, n);
    if (out.empty() || d < best) {
      best = d;
      out.assign(1, static_cast<int>(n));
    } else if (d == best) {
      out.push_back(static_cast<int>(n));
    }
  }
  return out;
}

std::string Names(const std::vector<PciDevice>& devices, const std::vector<int>& which) {
  std::string out;
  for (size_t i = 0; i < which.size(); ++i)
    out += (i == 0 ? "" : i + 1 == which.size() ? " and " : ", ") + devices[static_cast<size_t>(which[i])].name;
  return out;
}

}  // namespace

std::vector<NicChoice> AssignNics(const MachineTopology& t) {
  std::vector<NicChoice> out(t.accelerators.size());
  if (t.nics.empty()) return out;
  std::vector<int> users(t.nics.size(), 0);
  // A NIC of its own within the NUMA node, nearest class first; in each class the accelerator
  // with the fewest free NICs chooses first, so that a flexible one does not take a constrained
  // one's only NIC.
  for (Distance within : {Distance::kSwitch, Distance::kRootComplex, Distance::kNumaNode}) {
    while (true) {
      int pick = -1, pick_nic = -1;
      size_t fewest = SIZE_MAX;
      for (size_t a = 0; a < out.size(); ++a) {
        if (out[a].nic >= 0) continue;
        size_t options = 0;
        int nearest = -1;
        for (size_t n = 0; n < t.nics.size(); ++n) {
          if (users[n] > 0 || At(t, a, n) > within) continue;
          ++options;
          if (nearest < 0 || At(t, a, n) < At(t, a, static_cast<size_t>(nearest))) nearest = static_cast<int>(n);
        }
        if (options > 0 && options < fewest) {
          fewest = options;
          pick = static_cast<int>(a);
          pick_nic = nearest;
        }
      }
      if (pick < 0) break;
      out[static_cast<size_t>(pick)].nic = pick_nic;
      ++users[static_cast<size_t>(pick_nic)];
    }
  }
  // The rest share: the nearest NIC, the least used among equally near ones.
  for (size_t a = 0; a < out.size(); ++a) {
    if (out[a].nic >= 0) continue;
    int best = -1;
    for (size_t n = 0; n < t.nics.size(); ++n) {
      if (best < 0) {
        best = static_cast<int>(n);
        continue;
      }
      const auto b = static_cast<size_t>(best);
      if (At(t, a, n) < At(t, a, b) || (At(t, a, n) == At(t, a, b) && users[n] < users[b])) best = static_cast<int>(n);
    }
    out[a].nic = best;
    ++users[static_cast<size_t>(best)];
  }
  for (size_t a = 0; a < out.size(); ++a) {
    out[a].distance = At(t, a, static_cast<size_t>(out[a].nic));
    out[a].shared = users[static_cast<size_t>(out[a].nic)] > 1;
  }
  return out;
}

const char* FindingName(Finding::Kind k) {
  switch (k) {
    case Finding::Kind::kSharedNearestNic: return "shared-nearest-nic";
    case Finding::Kind::kNicOnOtherSocket: return "nic-on-other-socket";
    case Finding::Kind::kUnexpectedSwitches: return "unexpected-switches";
    case Finding::Kind::kNoNicInSwitch: return "no-nic-in-switch";
  }
  return "?";
}

std::vector<Finding> Check(const MachineTopology& t, int expect_switches) {
  std::vector<Finding> out;
  const std::vector<NicChoice> choice = AssignNics(t);
  std::vector<std::vector<int>> nearest(t.accelerators.size());
  std::set<int> anyones_nearest;
  for (size_t a = 0; a < t.accelerators.size(); ++a) {
    nearest[a] = Nearest(t, a);
    anyones_nearest.insert(nearest[a].begin(), nearest[a].end());
  }
  std::vector<int> idle;
  for (size_t n = 0; n < t.nics.size(); ++n)
    if (anyones_nearest.count(static_cast<int>(n)) == 0) idle.push_back(static_cast<int>(n));
  // Accelerators with one nearest NIC, the same one, while a NIC is nobody's nearest: a
  // nearest-NIC rule (NCCL's) would crowd them onto it and leave the other unused.
  for (size_t n = 0; n < t.nics.size() && !idle.empty(); ++n) {
    std::vector<int> crowd;
    for (size_t a = 0; a < t.accelerators.size(); ++a)
      if (nearest[a] == std::vector<int>{static_cast<int>(n)}) crowd.push_back(static_cast<int>(a));
    if (crowd.size() < 2) continue;
    std::string moved;
    for (int a : crowd) {
      const NicChoice& c = choice[static_cast<size_t>(a)];
      if (c.nic != static_cast<int>(n))
        moved +=
            fmt::format("{}{} takes {} ({})", moved.empty() ? "" : "; ", t.accelerators[static_cast<size_t>(a)].name,
                        t.nics[static_cast<size_t>(c.nic)].name, DistanceName(c.distance));
    }
    out.push_back({Finding::Kind::kSharedNearestNic,
                   fmt::format("{} have one nearest NIC, {} ({}), while {} {} no accelerator's nearest; {}",
                               Names(t.accelerators, crowd), t.nics[n].name,
                               DistanceName(At(t, static_cast<size_t>(crowd[0]), n)), Names(t.nics, idle),
                               idle.size() == 1 ? "is" : "are",
                               moved.empty() ? "they share it" : "kizuna spreads them: " + moved)});
  }
  // A NIC whose nearest accelerators are all on another socket.
  for (size_t n = 0; n < t.nics.size(); ++n) {
    if (t.nics[n].socket < 0) continue;
    std::vector<int> near;
    bool same_socket = false;
    for (size_t a = 0; a < t.accelerators.size(); ++a)
      if (std::count(nearest[a].begin(), nearest[a].end(), static_cast<int>(n)) > 0) {
        near.push_back(static_cast<int>(a));
        same_socket = same_socket || t.accelerators[a].socket == t.nics[n].socket;
      }
    if (near.empty() || same_socket) continue;
    out.push_back({Finding::Kind::kNicOnOtherSocket,
                   fmt::format("{} is on socket {}, {} on socket {}: every byte between them crosses the sockets' link",
                               t.nics[n].name, t.nics[n].socket, Names(t.accelerators, near),
                               t.accelerators[static_cast<size_t>(near[0])].socket)});
  }
  if (expect_switches >= 0 && static_cast<int>(t.switches.size()) != expect_switches) {
    std::string list;
    for (const Switch& s : t.switches) {
      std::vector<std::string> members;
      for (int a : s.accelerators) members.push_back(t.accelerators[static_cast<size_t>(a)].name);
      for (int n : s.nics) members.push_back(t.nics[static_cast<size_t>(n)].name);
      list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", s.pci_bus_id, fmt::join(members, " "));
    }
    out.push_back({Finding::Kind::kUnexpectedSwitches,
                   fmt::format("{} PCIe switch(es) where {} {} expected: {}; a switch that firmware partitions "
                               "shows up as several, and which NIC is nearest changes with it",
                               t.switches.size(), expect_switches, expect_switches == 1 ? "is" : "are",
                               list.empty() ? "none" : list)});
  }
  for (size_t a = 0; a < t.accelerators.size() && !t.nics.empty(); ++a) {
    if (!nearest[a].empty() && At(t, a, static_cast<size_t>(nearest[a][0])) == Distance::kSwitch) continue;
    const PciDevice& d = t.accelerators[a];
    out.push_back({Finding::Kind::kNoNicInSwitch,
                   fmt::format("{} ({}) has no NIC within its PCIe switch{}; nearest: {} ({})", d.name, d.pci_bus_id,
                               d.switch_index < 0 ? " (it is behind none)" : "", Names(t.nics, nearest[a]),
                               DistanceName(At(t, a, static_cast<size_t>(nearest[a][0]))))});
  }
  return out;
}

std::string DescribeAssignment(const MachineTopology& t) {
  std::string out = fmt::format(
      "{}{}: {} socket(s), {} NUMA node(s), {} root complex(es), {} PCIe switch(es), "
      "{} accelerator(s), {} NIC(s)\n",
      t.source, t.host_name.empty() ? "" : " (" + t.host_name + ")", t.sockets, t.numa_nodes, t.root_complexes,
      t.switches.size(), t.accelerators.size(), t.nics.size());
  if (t.accelerators.empty()) return out;
  const std::vector<NicChoice> choice = AssignNics(t);
  out += fmt::format("{:<12} {:<13} {:>6} {:>6}  {:<10} {:<18}", "accelerator", "PCI", "switch", "socket", "NIC",
                     "distance");
  for (const PciDevice& n : t.nics) out += fmt::format(" {:>5}", n.name.substr(0, 5));
  out += "\n";
  for (size_t a = 0; a < t.accelerators.size(); ++a) {
    const PciDevice& d = t.accelerators[a];
    const NicChoice& c = choice[a];
    out += fmt::format("{:<12} {:<13} {:>6} {:>6}  {:<10} {:<18}", d.name, d.pci_bus_id,
                       d.switch_index < 0 ? "-" : std::to_string(d.switch_index), d.socket,
                       c.nic < 0 ? "none" : t.nics[static_cast<size_t>(c.nic)].name + (c.shared ? "*" : ""),
                       c.nic < 0 ? "" : DistanceName(c.distance));
    // Each NIC's class: SW, RC, NUMA, SOCK, SYS (NCCL's PIX/PXB, PHB, NODE, -, SYS).
    static const char* kShort[] = {"SW", "RC", "NUMA", "SOCK", "SYS"};
    for (size_t n = 0; n < t.nics.size(); ++n) out += fmt::format(" {:>5}", kShort[static_cast<int>(At(t, a, n))]);
    out += "\n";
  }
  if (std::any_of(choice.begin(), choice.end(), [](const NicChoice& c) { return c.shared; }))
    out += "* shared with another accelerator\n";
  return out;
}

std::string ToJson(const MachineTopology& t, int expect_switches) {
  using nlohmann::json;
  auto device = [&](const PciDevice& d) {
    json j = {{"name", d.name},           {"pci_bus_id", d.pci_bus_id},
              {"switch", d.switch_index}, {"root_complex", d.root_complex},
              {"numa_node", d.numa_node}, {"socket", d.socket}};
    if (!d.rdma.empty()) j["rdma"] = d.rdma;
    return j;
  };
  json j = {{"source", t.source},
            {"host_name", t.host_name},
            {"sockets", t.sockets},
            {"numa_nodes", t.numa_nodes},
            {"root_complexes", t.root_complexes}};
  j["switches"] = json::array();
  for (const Switch& s : t.switches)
    j["switches"].push_back({{"pci_bus_id", s.pci_bus_id},
                             {"root_complex", s.root_complex},
                             {"socket", s.socket},
                             {"accelerators", s.accelerators},
                             {"nics", s.nics}});
  j["accelerators"] = json::array();
  for (const PciDevice& d : t.accelerators) j["accelerators"].push_back(device(d));
  j["nics"] = json::array();
  for (const PciDevice& d : t.nics) j["nics"].push_back(device(d));
  j["distance"] = json::array();  // [accelerator][NIC]
  for (size_t a = 0; a < t.accelerators.size(); ++a) {
    json row = json::array();
    for (size_t n = 0; n < t.nics.size(); ++n) row.push_back(DistanceName(At(t, a, n)));
    j["distance"].push_back(row);
  }
  j["assignment"] = json::array();
  for (const NicChoice& c : AssignNics(t))
    j["assignment"].push_back({{"nic", c.nic},
                               {"nic_name", c.nic < 0 ? "" : t.nics[static_cast<size_t>(c.nic)].name},
                               {"distance", DistanceName(c.distance)},
                               {"shared", c.shared}});
  j["findings"] = json::array();
  for (const Finding& f : Check(t, expect_switches))
    j["findings"].push_back({{"kind", FindingName(f.kind)}, {"message", f.message}});
  return j.dump(1) + "\n";
}

}  // namespace kizuna::topology
