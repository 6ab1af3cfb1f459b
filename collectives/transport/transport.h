// A communicator's connections (docs/ARCHITECTURE.md): for every peer some fabric reaches,
// one SendComm (bytes to the peer) and one RecvComm (bytes from it), a registered staging region
// through which plan steps move data (device memory, or host memory where a fabric cannot reach
// the device's), and small host control buffers for the executor's per-operation headers.
//
// Several fabrics, one per pair: Create takes the fabrics in preference order (every rank passes
// fabrics of the same names in the same order). A pair of ranks (a, b) is served by the FIRST
// fabric in which a has a device serving b and b has a device serving a — both ranks compute the
// same answer from what they allgathered, so they never need to agree in another round. As with
// NCCL's transports (P2P/SHM inside a node, NET between nodes): direct links (directconnect)
// between the ranks of one host, a network fabric (ofi, roce) between hosts. A pair no fabric
// serves is unreachable (LinkDesc::reachable false in the row this rank contributes to the shape).
//
// Which fabric device serves which peer follows the fabric's properties, never its name: a
// switched device (FabricDeviceProperties::point_to_point false) reaches every peer — the device
// nearest the rank's accelerator (near_device_uuids, then numa_node) is used, device 0 when none
// is nearer; a point-to-point device reaches only its link_peer.
//
// Memory: one staging buffer per rank, through which plan steps move data, registered on every
// comm (so by each comm's own fabric). Zero-copy where the pair allows, staged through host
// memory only where it must be (docs/ARCHITECTURE.md):
//  1. Device memory (Device::Allocate), registered per comm the first way the comm accepts:
//     by DMA-BUF fd (Device::ExportDmaBuf, what an RDMA NIC registers) when the device exports
//     one and the comm takes fds; by the device's own exported fd (a memfd of the emulated
//     device: a direct-connect peer then copies straight between the two staging regions); by
//     device pointer (kPtrDevice); by host pointer when the device is host accessible (kPtrHost).
//  2. When some comm refuses every one of those (each try kNotSupported, or none applies: CUDA
//     memory over libfabric 1.17 or direct links, whose fds cannot be mapped) and the CPU cannot
//     address the device's memory, the transport falls back, for all comms at once (one staging
//     buffer): it deregisters what it registered, frees the device buffer, and registers host
//     memory from Device::AllocateHost (as cudaMallocHost) as host memory everywhere. The
//     executor's device streams copy and reduce between the user's buffers and the slots exactly
//     as before; the fabric reads and writes the slots with the CPU.
//  3. TransportOptions::force_host_staging takes path 2 from the start, on any device (tests).
// Create fails, naming the fabric, the device and every refusal, when a comm cannot reach a
// host-accessible device's memory (kNotSupported: host memory would be the same memory), when the
// device has no host memory for its streams (AllocateHost's kNotSupported), or when a comm
// refuses even host memory (its error).
// The choice is logged at INFO (subsystem COLL): "staging 8 MiB on host_emulated:3, registered
// by fd (device export) on directconnect, ofi", or "staging through host memory: ofi cannot
// reach cuda:0 memory: <every refusal>"; staging_paths(), host_staging() and description() say
// it too.
//
// Lifetime: the Transport owns its comms, listen comms and registrations; it must be destroyed
// before the Fabrics, the Device and the staging Buffer's device. Not thread-safe: one thread (the
// communicator's executor) uses it after Create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/topology.h"
#include "fabric/fabric.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::fabric {
class FabricRegistry;
}

namespace kizuna::collectives {

// The fabrics every rank can use, in rank 0's preference order: each pair of ranks must see the
// same list, or they would pick different fabrics for one connection (fabric_choice.cc).
// Collective over `boot`. A rank with no usable fabric still takes part in the exchange (with an
// empty list), so that every rank fails at once with the reason, naming each rank's fabrics,
// instead of waiting for it until the deadline.
Result<std::vector<fabric::Fabric*>> AgreeOnFabrics(const fabric::FabricRegistry& registry, bootstrap::Bootstrap& boot,
                                                    int rank, Deadline deadline);

struct TransportOptions {
  size_t staging_bytes = 8u << 20;  // memory per rank for staging slots
  size_t control_bytes = 8192;      // host memory per peer and direction for control messages
  // Stage through host memory (Device::AllocateHost) even where a fabric could reach the
  // device's memory: runs the host-staged path on any device (tests, comparisons).
  bool force_host_staging = false;
  // When some peer is reached over a network (a switched fabric device: ofi, roce), the staging
  // buffer grows to at least this much (0: staging_bytes regardless), so that the executor's
  // slots can hold the larger chunks network transfers want (Executor::slot_bytes_for): each
  // message there pays a fixed cost (tcp;ofi_rxm between two hosts: a rendezvous of several
  // round trips), which 512 KiB chunks do not amortize (docs/PERFORMANCE.md, "TCP").
  size_t network_staging_bytes = 0;
};

// How the staging buffer is registered on a comm.
enum class StagingPath : uint8_t {
  kDmaBuf,         // device memory, by DMA-BUF fd + offset (Device::ExportDmaBuf)
  kFd,             // device memory, by the device's own exported fd + offset (Device::Export)
  kDevicePointer,  // device memory, by device pointer
  kHostPointer,    // device memory the CPU may address, by host pointer
  kHostMemory,     // host memory from Device::AllocateHost, by host pointer (staged through the host)
};
// "by DMA-BUF fd", "by fd (device export)", "by device pointer", "by host pointer",
// "through host memory".
std::string_view StagingPathName(StagingPath path);

class Transport {
 public:
  struct Peer {
    int rank = -1;
    fabric::Fabric* fabric = nullptr;        // the fabric that serves the pair (one of Create's)
    std::unique_ptr<fabric::SendComm> send;  // to the peer
    std::unique_ptr<fabric::RecvComm> recv;  // from the peer
    fabric::Registration* send_staging = nullptr;  // the staging buffer, registered on `send`
    fabric::Registration* recv_staging = nullptr;  // the staging buffer, registered on `recv`
    // Host control buffers (TransportOptions::control_bytes each), registered on send / recv.
    std::vector<uint8_t> control_out, control_in;
    fabric::Registration* send_control = nullptr;
    fabric::Registration* recv_control = nullptr;
  };

  // Collective: every rank of `bootstrap` calls it with the same options and fabrics of the same
  // names in the same order (each rank its own Fabric objects, created for its rank). Two
  // allgathers through the bootstrap: first which peers each rank can serve on each fabric (from
  // which every rank computes the fabric of every pair), then the handles, each rank listening only
  // on the fabric and device chosen for each of its peers. Then it connects to and accepts from
  // every reachable peer (connects and accepts are interleaved, non-blocking, so no pair waits on
  // another) and allocates and registers the staging buffer and the control buffers, and returns
  // after a bootstrap barrier: every rank has its connections then, so a rank may close its
  // transport at once without leaving a peer in its handshake. kInvalidArgument when `fabrics` is empty, holds a null,
  // a fabric twice, or a fabric created for another rank, or when the ranks pass different fabric lists (naming both
  // lists). Fails as a whole (every comm released) on any error; kTimeout at the deadline naming the peers not yet
  // connected.
  static Result<std::unique_ptr<Transport>> Create(std::span<fabric::Fabric* const> fabrics,
                                                   bootstrap::Bootstrap& bootstrap, device::Device& device,
                                                   const TransportOptions& options, Deadline deadline);
  // A communicator of one rank: no fabric, no peers; only the staging buffer (the executor sizes
  // its slots from it).
  static Result<std::unique_ptr<Transport>> CreateSingle(device::Device& device, const TransportOptions& options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // nullptr for the rank itself and for unreachable peers.
  Peer* peer(int rank) { return peers_[static_cast<size_t>(rank)].get(); }
  // The staging buffer: device memory, or host memory from Device::AllocateHost when
  // host_staging(). Either way an address the device's streams take.
  device::Buffer& staging() { return *staging_; }
  // Every way some comm registers the staging buffer, in StagingPath order; empty without peers.
  const std::vector<StagingPath>& staging_paths() const { return staging_paths_; }
  // True when the staging buffer is host memory (StagingPath::kHostMemory on every comm).
  bool host_staging() const { return host_staging_; }
  // True when some peer is reached through a switched fabric device (point_to_point false: a
  // network such as ofi or roce), not only over direct links.
  bool network() const { return network_; }
  // This rank's row of the shape's links: links[to] for every rank (unreachable for itself),
  // from the fabric device's latency and speed (0 when the fabric does not say), staged = true.
  const std::vector<LinkDesc>& link_row() const { return link_row_; }
  // Which fabric serves which peers, the devices it uses, and how staging is registered, for logs
  // and tests: "directconnect: rank 1 (device w0:port0); ofi: ranks 2, 3 (device tcp;ofi_rxm:lo);
  // staging by fd (device export)", or "...; staging through host memory (ofi cannot reach
  // cuda:0 memory)". Unreachable peers are listed as "unreachable: ranks ...".
  const std::string& description() const { return description_; }

 private:
  Transport() = default;
  // Step 1 and 2 of the class comment: allocates the staging buffer and registers it on every
  // peer's comms. Sets staging_, staging_paths_, host_staging_ and staging_text_ (for the
  // description). `where` names the transport in errors and logs.
  Status SetUpStaging(device::Device& device, const TransportOptions& options, const std::string& where);
  // Registers host memory from Device::AllocateHost on every comm; `why` says why (logged).
  Status SetUpHostStaging(device::Device& device, const TransportOptions& options, const std::string& where,
                          const std::string& why, const std::string& detail);
  // Releases every staging registration made so far (the fallback to host memory).
  Status DeregisterStaging(const std::string& where);

  int rank_ = 0;
  int nranks_ = 1;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<fabric::ListenComm>> listens_;
  std::unique_ptr<device::Buffer> staging_;
  std::vector<StagingPath> staging_paths_;
  bool host_staging_ = false;
  bool network_ = false;
  std::string staging_text_;  // "by fd (device export)", "through host memory (why)"
  std::vector<LinkDesc> link_row_;
  std::string description_;
};

}  // namespace kizuna::collectives
