// The RoCEv2 fabric (README.md): ibverbs RC queue pairs, registered as "roce".
//
// Each fabric device is one active Ethernet port of an RDMA device (a RoCE NIC, or rdma_rxe:
// Soft-RoCE), with its own verbs context and protection domain, the GID it uses (RoCE v2
// auto-selection in gid.h, or KIZUNA_IB_GID_INDEX), its active MTU, and the traffic class and
// service level every queue pair on it is given (KIZUNA_IB_TC, KIZUNA_IB_SL). KIZUNA_IB_HCA
// ("mlx5_0:1,mlx5_1") limits the devices and ports; an entry naming nothing here is an error.
//
// Connections (endpoint.h) are made over a small TCP handshake to the GID's IP address, which
// exchanges the queue pair numbers, PSNs and GIDs and then stays open as the peer's liveness
// signal; transfers (transfer.h) run over one RC queue pair per comm (qp.h); memory is
// registered through a per-device cache (memory.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/pending_connects.h"
#include "fabric/roce/gid.h"
#include "fabric/roce/loader.h"
#include "fabric/roce/memory.h"
#include "runtime/core/config.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::roce {

inline constexpr std::string_view kFabricName = "roce";
// Requests in flight per comm. Queue depths follow from it (qp.h).
inline constexpr int kMaxRequests = 64;
// The largest message: far beyond any buffer, far from offset overflow. A transfer larger than the
// port's max_msg_sz (8 MiB on rdma_rxe) is split into several RDMA writes.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

// What every queue pair on a device is given.
struct QpSettings {
  uint8_t traffic_class = 0;  // KIZUNA_IB_TC: DSCP << 2 | ECN (DCQCN marks ECN)
  uint8_t service_level = 0;  // KIZUNA_IB_SL
  uint8_t hop_limit = 64;
  // Local ACK timeout 4.096 us * 2^14 = 67 ms, 7 retries: a vanished peer fails a transfer with
  // "transport retry counter exceeded" within about half a second.
  uint8_t timeout = 14;
  uint8_t retry_count = 7;
  // 7: retry forever on "receiver not ready" — the peer is alive but has not reposted its
  // control buffers yet (it is between polls); a dead peer is seen through the TCP socket.
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 12;  // 0.64 ms
};

// One port of one RDMA device: the context, protection domain and GID every comm on it uses.
// Comms and registrations keep it alive (shared_ptr). Thread-safe.
class RoceDevice {
 public:
  ~RoceDevice();
  RoceDevice(const RoceDevice&) = delete;
  RoceDevice& operator=(const RoceDevice&) = delete;

  const IbVerbs& lib() const { return *lib_; }
  const std::shared_ptr<const IbVerbs>& lib_ptr() const { return lib_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  const GidRow& gid() const { return gid_; }
  int active_mtu() const { return active_mtu_; }  // IBV_MTU_* enumeration value
  int max_qp_wr() const { return max_qp_wr_; }
  // The most bytes one work request moves: the port's max_msg_sz, at most 1 GiB.
  uint64_t max_write_bytes() const { return max_write_bytes_; }
  const QpSettings& settings() const { return settings_; }
  const FabricDeviceProperties& properties() const { return properties_; }
  const std::string& name() const { return properties_.name; }  // "mlx5_0:1"
  MemoryCache& memory() { return *memory_; }

 private:
  friend class RoceFabric;
  RoceDevice() = default;
  std::shared_ptr<const IbVerbs> lib_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  GidRow gid_;
  int active_mtu_ = 0;
  int max_qp_wr_ = 0;
  uint64_t max_write_bytes_ = 0;
  QpSettings settings_;
  FabricDeviceProperties properties_;
  std::unique_ptr<MemoryCache> memory_;
};

class PendingConnect;

class RoceFabric : public Fabric {
 public:
  // The factory registered as "roce": the process's libibverbs (IbVerbs::Default()).
  static Result<std::unique_ptr<Fabric>> Create(const Config& config, const FabricContext& context);
  // With a given library (or the failure to load one): tests force a bad library path here.
  static Result<std::unique_ptr<Fabric>> CreateWith(const Config& config, const FabricContext& context,
                                                    Result<std::shared_ptr<const IbVerbs>> lib);
  ~RoceFabric() override;

  std::shared_ptr<RoceDevice> device(int dev) const { return roce_devices_[static_cast<size_t>(dev)]; }

 protected:
  Result<std::unique_ptr<ListenComm>> DoListen(int dev) override;
  Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) override;
  Status DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt) override;

 private:
  RoceFabric(const Config* config, FabricContext context, std::vector<std::shared_ptr<RoceDevice>> devices);
  // CreateWith's step for one RDMA device (`dev_name`): adds a RoceDevice to `devices` for each of
  // its ports that RoCE can use (only `only_port` when KIZUNA_IB_HCA names one), and records in
  // `skipped` why the others are not used. A member, as only RoceFabric makes RoceDevices.
  static Status AddPorts(const std::shared_ptr<const IbVerbs>& l, ibv_device* device, const std::string& dev_name,
                         std::optional<int> only_port, const GidRequest& gid_request, const QpSettings& settings,
                         std::vector<std::shared_ptr<RoceDevice>>& devices, std::string& skipped);

  std::vector<std::shared_ptr<RoceDevice>> roce_devices_;
  // Connections in progress, by device and handle bytes.
  PendingConnects<PendingConnect> pending_;
};

// A device (index into the verbs device list) and the port KIZUNA_IB_HCA names on it, if any.
struct HcaCandidate {
  int device;
  std::optional<int> port;
};
// (device index, port) in KIZUNA_IB_HCA order, else every device's every port. kInvalidArgument,
// naming the entry and the devices here, when KIZUNA_IB_HCA names a device not among `names`.
Result<std::vector<HcaCandidate>> HcaCandidates(const std::vector<HcaSpec>& hca, const std::vector<std::string>& names);

// Link speed in Gb/s from ibv_port_attr's active_speed and active_width; 0 when unknown.
double PortSpeedGbps(uint32_t active_speed, uint8_t active_width);

}  // namespace kizuna::fabric::roce
