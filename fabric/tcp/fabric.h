// The tcp fabric (README.md): tagged messages over plain TCP sockets, registered as "tcp". Its
// devices are the host's network interfaces; between hosts it is the default network fabric where
// no RDMA fabric serves the pair (Fabric::default_rank).
//
// Which interfaces become devices (SelectInterfaces): the KIZUNA_FABRIC entries of the form
// "tcp:<interface>" in their order; else every interface that is up and has an address, loopback
// ones only where there is no other. An interface is listed once, with its IPv4 address, else a
// routable IPv6 one.
#pragma once

#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/pending_connects.h"
#include "fabric/tcp/endpoint.h"
#include "fabric/tcp/relay.h"
#include "fabric/tcp/transfer.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::tcp {

inline constexpr std::string_view kFabricName = "tcp";
// Sockets per connection (README.md, measurements).
inline constexpr int kDefaultStreams = 2;

// One address of one interface, as getifaddrs lists it.
struct Interface {
  std::string name;
  bool loopback = false;
  sockaddr_storage address{};
};

// The interfaces KIZUNA_FABRIC names for this fabric ("tcp:eth1" -> "eth1"), in order.
std::vector<std::string> InterfacesFromConfig(const std::vector<std::string>& kizuna_fabric);
// The devices among `all`, in order (this file's header comment). With `wanted` names that no
// interface has, those are listed in `missing`.
std::vector<Interface> SelectInterfaces(const std::vector<Interface>& all, const std::vector<std::string>& wanted,
                                        std::vector<std::string>* missing);

class TcpFabric : public Fabric {
 public:
  // The factory registered as "tcp".
  static Result<std::unique_ptr<Fabric>> Create(const Config& config, const FabricContext& context);
  // With given interfaces and sockets per connection (tests).
  static Result<std::unique_ptr<Fabric>> CreateWith(const Config& config, const FabricContext& context,
                                                    const std::vector<Interface>& all, int streams);
  ~TcpFabric() override;

  int streams() const { return streams_; }
  // What this rank relays for others (relay.h).
  const Relays& relays() const { return *relays_; }

 protected:
  Result<std::unique_ptr<ListenComm>> DoListen(int dev) override;
  Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) override;
  Status DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt) override;
  Result<Handle> DoForward(std::span<const Hop> hops, const Handle& target) const override;
  Result<std::unique_ptr<SendComm>> DoConnectBack(int dev, const Handle& handle, RecvComm& from) override;
  bool DoConnectsBack(int dev) const override;

 private:
  TcpFabric(const Config* config, FabricContext context, std::vector<DeviceAddress> devices, int streams);

  std::vector<DeviceAddress> addresses_;
  const int streams_;
  Hub hub_;
  PendingConnects<PendingConnect> pending_;
  // Relayed sockets close before the fabric's other state goes (declared last: destroyed first).
  std::unique_ptr<Relays> relays_;
};

}  // namespace kizuna::fabric::tcp
