#include "runtime/topology/machine_topology.h"

#include <algorithm>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kizuna::topology {
namespace {

MachineTopology Load(const std::string& name) {
  auto t = LoadXml("runtime/topology/testdata/" + name + ".xml");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : MachineTopology{};
}

std::vector<std::string> ChosenNics(const MachineTopology& t) {
  std::vector<std::string> out;
  for (const NicChoice& c : AssignNics(t)) out.push_back(c.nic < 0 ? "none" : t.nics[static_cast<size_t>(c.nic)].name);
  return out;
}

std::vector<Finding::Kind> Kinds(const std::vector<Finding>& f) {
  std::vector<Finding::Kind> out;
  for (const Finding& x : f) out.push_back(x.kind);
  return out;
}

TEST(MachineTopology, EightAcceleratorServerHasFourSwitchesAndANicOfItsOwnPerAccelerator) {
  const MachineTopology t = Load("server_8x8");
  EXPECT_EQ(t.sockets, 2);
  EXPECT_EQ(t.numa_nodes, 2);
  EXPECT_EQ(t.root_complexes, 4);
  ASSERT_EQ(t.switches.size(), 4u);
  ASSERT_EQ(t.accelerators.size(), 8u);
  ASSERT_EQ(t.nics.size(), 8u);
  for (const Switch& s : t.switches) {
    EXPECT_EQ(s.accelerators.size(), 2u);
    EXPECT_EQ(s.nics.size(), 2u);
  }
  EXPECT_EQ(t.accelerators[0].name, "cuda0");
  EXPECT_EQ(t.accelerators[0].pci_bus_id, "0000:04:00.0");
  EXPECT_EQ(t.nics[0].name, "eth1");
  EXPECT_EQ(t.nics[0].rdma, "mlx5_0");
  EXPECT_EQ(t.accelerators[6].socket, 1);
  EXPECT_EQ(t.accelerators[6].numa_node, 1);
  EXPECT_EQ(t.Between(t.accelerators[0], t.nics[1]), Distance::kSwitch);
  EXPECT_EQ(t.Between(t.accelerators[0], t.nics[2]), Distance::kNumaNode);
  EXPECT_EQ(t.Between(t.accelerators[0], t.nics[7]), Distance::kSystem);
  EXPECT_EQ(ChosenNics(t), (std::vector<std::string>{"eth1", "eth2", "eth3", "eth4", "eth5", "eth6", "eth7", "eth8"}));
  for (const NicChoice& c : AssignNics(t)) {
    EXPECT_EQ(c.distance, Distance::kSwitch);
    EXPECT_FALSE(c.shared);
  }
  EXPECT_TRUE(Check(t, 4).empty()) << Check(t, 4)[0].message;
  EXPECT_NE(t.tree.find("PCIe switch 3 (upstream port 0000:a2:00.0)"), std::string::npos) << t.tree;
  EXPECT_EQ(t.FindAccelerator("00000000:04:00.0"), 0);  // CUDA's form
  EXPECT_EQ(t.FindAccelerator("04:00.0"), 0);
  EXPECT_EQ(t.FindAccelerator("0000:05:00.0"), -1);
}

// Seed of many an operator's week: one switch seen as two. The nearest-NIC rule would put both of
// its accelerators on one NIC and leave the other idle; the check says so, kizuna spreads them.
TEST(MachineTopology, ASplitSwitchIsCountedAndItsCrowdedNicReported) {
  const MachineTopology t = Load("server_8x8_split");
  EXPECT_EQ(t.switches.size(), 5u);
  EXPECT_EQ(ChosenNics(t), (std::vector<std::string>{"eth1", "eth2", "eth3", "eth4", "eth5", "eth6", "eth7", "eth8"}));
  const std::vector<NicChoice> c = AssignNics(t);
  EXPECT_EQ(c[6].distance, Distance::kSwitch);
  EXPECT_EQ(c[7].distance, Distance::kRootComplex);
  const std::vector<Finding> f = Check(t, 4);
  ASSERT_EQ(Kinds(f),
            (std::vector<Finding::Kind>{Finding::Kind::kSharedNearestNic, Finding::Kind::kUnexpectedSwitches}));
  EXPECT_NE(f[0].message.find("cuda6 and cuda7 have one nearest NIC, eth7 (same PCIe switch), while eth8 is no"),
            std::string::npos)
      << f[0].message;
  EXPECT_NE(f[0].message.find("cuda7 takes eth8 (same root complex)"), std::string::npos) << f[0].message;
  EXPECT_NE(f[1].message.find("5 PCIe switch(es) where 4 are expected"), std::string::npos) << f[1].message;
  EXPECT_EQ(Kinds(Check(t)), std::vector<Finding::Kind>{Finding::Kind::kSharedNearestNic});  // no --expect
}

TEST(MachineTopology, WorkstationAcceleratorsShareItsOneNic) {
  const MachineTopology t = Load("workstation_4x1");
  EXPECT_EQ(t.sockets, 1);
  EXPECT_TRUE(t.switches.empty());  // root ports with one device each are no switch
  ASSERT_EQ(t.accelerators.size(), 4u);
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].rdma, "");
  for (const NicChoice& c : AssignNics(t)) {
    EXPECT_EQ(c.nic, 0);
    EXPECT_EQ(c.distance, Distance::kRootComplex);
    EXPECT_TRUE(c.shared);
  }
  const std::vector<Finding> f = Check(t, 0);
  ASSERT_EQ(f.size(), 4u);  // no idle NIC to complain of: only "no NIC in its switch", per accelerator
  for (const Finding& x : f) EXPECT_EQ(x.kind, Finding::Kind::kNoNicInSwitch);
  EXPECT_NE(f[0].message.find("cuda0 (0000:02:00.0) has no NIC within its PCIe switch (it is behind none); nearest: "
                              "enp9s0 (same root complex)"),
            std::string::npos)
      << f[0].message;
}

TEST(MachineTopology, ANicOnTheOtherSocketIsReported) {
  const MachineTopology t = Load("remote_nic");
  ASSERT_EQ(t.accelerators.size(), 2u);
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].socket, 1);
  for (const NicChoice& c : AssignNics(t)) {
    EXPECT_EQ(c.distance, Distance::kSystem);
    EXPECT_TRUE(c.shared);
  }
  const std::vector<Finding> f = Check(t, 1);
  ASSERT_EQ(Kinds(f), (std::vector<Finding::Kind>{Finding::Kind::kNicOnOtherSocket, Finding::Kind::kNoNicInSwitch,
                                                  Finding::Kind::kNoNicInSwitch}));
  EXPECT_NE(f[0].message.find("eth1 is on socket 1, cuda0 and cuda1 on socket 0"), std::string::npos) << f[0].message;
}

TEST(MachineTopology, TableAndJsonSayTheSame) {
  const MachineTopology t = Load("server_8x8_split");
  const std::string table = DescribeAssignment(t);
  EXPECT_NE(
      table.find("2 socket(s), 2 NUMA node(s), 4 root complex(es), 5 PCIe switch(es), 8 accelerator(s), 8 NIC(s)"),
      std::string::npos)
      << table;
  const auto j = nlohmann::json::parse(ToJson(t, 4));
  EXPECT_EQ(j["switches"].size(), 5u);
  EXPECT_EQ(j["assignment"][7]["nic_name"], "eth8");
  EXPECT_EQ(j["distance"][7][6], "same PCIe switch");
  EXPECT_EQ(j["findings"].size(), 2u);
  EXPECT_EQ(j["findings"][1]["kind"], "unexpected-switches");
}

TEST(MachineTopology, BadFilesAreNamed) {
  auto missing = LoadXml("runtime/topology/testdata/no_such_server.xml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("no_such_server.xml"), std::string::npos) << missing.status().ToString();
}

// This machine: whatever it has, detection works and the table prints.
TEST(MachineTopology, DetectsThisMachine) {
  auto t = Detect();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_GE(t->sockets, 1);
  EXPECT_FALSE(DescribeAssignment(*t).empty());
}

}  // namespace
}  // namespace kizuna::topology
