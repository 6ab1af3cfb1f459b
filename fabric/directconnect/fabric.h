// The direct-connect fabric (README.md): point-to-point links between accelerators, each node with
// a fixed number of ports, from a topology file (topology.h). This process is one node of the
// topology — the worker of its rank, or the node FabricContext::node names — and its fabric
// devices are that node's ports: device p is port p, and Listen / Connect on it reach exactly the
// node and port at the other end of p's link (FabricDeviceProperties::link_peer).
//
// On one host a link is a shared-memory channel (channel.h) set up through a Unix socket in the
// abstract namespace whose name and secret travel in the handle (endpoint.h); transfers are in
// transfer.h, registration in memory.h. With "shaping": true in the topology, transfers on a port
// are paced to its link's bandwidth and latency (shaper below).
//
// Configuration: KIZUNA_TOPOLOGY names the topology file, or a generator spec ("full", "ring:8",
// "torus2d:4x4"; README.md). Without it the fabric is unavailable, saying so (there is no default
// topology: a direct-connect network is whatever its cables say).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "fabric/directconnect/topology.h"
#include "fabric/fabric.h"
#include "runtime/core/config.h"

namespace kizuna::fabric::directconnect {

inline constexpr std::string_view kFabricName = "directconnect";
// Requests in flight per comm: matches what the reverse ring holds with room to spare (each
// posted receive takes one 48-byte record there until the sender reads it).
inline constexpr int kMaxRequests = 128;
// The largest single transfer. Nothing in the protocol limits it below 2^63; this bound only keeps
// sizes far from overflow in offset arithmetic.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

// Paces the transfers of one port to its link's bandwidth and latency (topology "shaping": true).
// A transfer of n bytes occupies the link for n / bandwidth after the previous one on the port
// ends; the sender's request completes when its last byte has left, the receiver's a latency
// later. Bytes are copied at full speed; only completions are held back, so measurements see the
// modelled network. Thread-safe (comms of one port share it).
class LinkShaper {
 public:
  using Clock = std::chrono::steady_clock;
  LinkShaper(double bandwidth_gbps, double latency_us, bool enabled)
      : bandwidth_gbps_(bandwidth_gbps), latency_us_(latency_us), enabled_(enabled) {}

  struct Times {
    Clock::time_point sent;       // epoch (no hold) when shaping is off
    Clock::time_point delivered;
  };
  Times Reserve(uint64_t bytes);
  bool enabled() const { return enabled_; }

 private:
  const double bandwidth_gbps_;  // 0: no bandwidth limit
  const double latency_us_;
  const bool enabled_;
  std::mutex mu_;
  Clock::time_point busy_until_{};  // guarded by mu_
};

class Acceptor;  // endpoint.cc: the listening socket the ports' ListenComms share

class DirectConnectFabric : public Fabric {
 public:
  // The factory registered as "directconnect".
  static Result<std::unique_ptr<Fabric>> Create(const Config& config, const FabricContext& context);
  // From a parsed topology (tests); `node` is this process's node index.
  static Result<std::unique_ptr<DirectConnectFabric>> CreateWithTopology(const Config& config,
                                                                         const FabricContext& context,
                                                                         Topology topology, int node);

  const Topology& topology() const { return topology_; }
  // topology().Fingerprint(), computed once (it reads every link: a "full" topology of a host's N
  // ranks has N(N-1)/2, and every handle and hello carries it).
  uint64_t topology_fingerprint() const { return topology_fingerprint_; }
  int node() const { return node_; }
  std::shared_ptr<LinkShaper> shaper(int port) const { return shapers_[static_cast<size_t>(port)]; }
  // A fingerprint of the host (its boot id): handles from another host are refused by name.
  uint64_t host_fingerprint() const { return host_fingerprint_; }
  // Bounds the short internal waits (sending a hello, reading a region message the peer has
  // already sent): KIZUNA_TIMEOUT.
  double io_timeout_s() const { return config().timeout_s; }

 protected:
  Result<std::unique_ptr<ListenComm>> DoListen(int dev) override;
  Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) override;

 private:
  DirectConnectFabric(const Config* config, FabricContext context, Topology topology, int node);
  friend Result<std::unique_ptr<ListenComm>> ListenOnPort(DirectConnectFabric& fabric, int port);
  Topology topology_;
  int node_;
  uint64_t host_fingerprint_ = 0;
  uint64_t topology_fingerprint_ = 0;
  std::vector<std::shared_ptr<LinkShaper>> shapers_;  // one per port
  std::mutex acceptor_mu_;
  std::weak_ptr<Acceptor> acceptor_;  // guarded by acceptor_mu_: while some ListenComm lives
};

}  // namespace kizuna::fabric::directconnect
