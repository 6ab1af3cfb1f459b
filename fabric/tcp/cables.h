// Cables between hosts (README.md, "Cables"): where KIZUNA_TOPOLOGY names a direct-connect
// topology (a file, or a generator with its shape such as "torus2d:2x2") in which some of this
// rank's ports are cabled to ranks on other hosts, each such port is a point-to-point device of the
// tcp fabric: its network interface (the node's "interfaces", else "p<port>") reaches exactly the
// other end of its cable.
#pragma once

#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::tcp {

// Parallel cables between two ranks are one device, a bundle (README.md, "Cables"): its
// connections' streams go round them.
struct CablePort {
  std::string node;                           // this rank's node
  int port = -1;                              // the port in the topology
  std::string interface;                      // its network interface on this host
  LinkPeer peer;                              // the other end; peer.port is the other end's tcp device index
  int bundle = 0;                             // this rank's tcp device index: its bundles in order of first port
  int cable = 0;                              // its place in its bundle (in port order)
  int peer_cable = 0;                         // the other end's place in the other end's bundle
  double bandwidth_gbps = 0, latency_us = 0;  // the link's, 0 where the file gives none
  std::string topology;                       // how errors and logs name the topology
};

// This rank's ports cabled to ranks on other hosts, in port order (a port's device index is its
// bundle's place among the bundles, the cables to one rank making one bundle); empty where no topology is set, the
// setting is a generator spanning the world (directconnect's "full", "ring": ranks of one host), the rank has no node,
// or none of its cables leaves its host. kInvalidArgument for a file that cannot be read or parsed.
Result<std::vector<CablePort>> CablePorts(const Config& config, const FabricContext& context);

}  // namespace kizuna::fabric::tcp
