// A communicator's connections (DESIGN.md section 3, step 4): for every peer the fabric reaches,
// one SendComm (bytes to the peer) and one RecvComm (bytes from it), a registered staging region
// on the rank's device through which plan steps move data, and small host control buffers for the
// executor's per-operation headers.
//
// Which fabric device serves which peer follows the fabric's properties, never its name: a
// switched device (FabricDeviceProperties::point_to_point false) reaches every peer — the device
// nearest the rank's accelerator (near_device_uuids, then numa_node) is used, device 0 when none
// is nearer; a point-to-point device reaches only its link_peer, so a peer with no link is simply
// unreachable (LinkDesc::reachable false in the row this rank contributes to the shape).
//
// Memory: the staging buffer is device memory of the rank's device. It is registered on every
// comm by fd + offset when the device exports fds and the fabric takes them (kPtrFd: a
// direct-connect peer then copies straight between the two staging regions), else by device
// pointer (kPtrDevice), else by host pointer when the device is host accessible and the fabric
// takes host memory (kPtrHost). A fabric that can reach the device's memory none of these ways
// makes Create fail with kNotSupported naming both (host staging for such pairs is future work).
// The path chosen is logged at INFO (subsystem COLL): "staging 8 MiB on host_emulated:3,
// registered by fd (DMA-BUF/memfd) on directconnect".
//
// Lifetime: the Transport owns its comms, listen comms and registrations; it must be destroyed
// before the Fabric, the Device and the staging Buffer's device. Not thread-safe: one thread (the
// communicator's executor) uses it after Create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/shape.h"
#include "fabric/fabric.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/deadline.h"
#include "runtime/device/device.h"
#include "runtime/status.h"

namespace kizuna::collectives {

struct TransportOptions {
  size_t staging_bytes = 8u << 20;  // device memory per rank for staging slots
  size_t control_bytes = 4096;      // host memory per peer and direction for control messages
};

class Transport {
 public:
  struct Peer {
    int rank = -1;
    std::unique_ptr<fabric::SendComm> send;  // to the peer
    std::unique_ptr<fabric::RecvComm> recv;  // from the peer
    fabric::Registration* send_staging = nullptr;  // the staging buffer, registered on `send`
    fabric::Registration* recv_staging = nullptr;  // the staging buffer, registered on `recv`
    // Host control buffers (TransportOptions::control_bytes each), registered on send / recv.
    std::vector<uint8_t> control_out, control_in;
    fabric::Registration* send_control = nullptr;
    fabric::Registration* recv_control = nullptr;
  };

  // Collective: every rank of `bootstrap` calls it with the same options. Listens, exchanges the
  // handles through the bootstrap (one allgather), connects to and accepts from every reachable
  // peer (connects and accepts are interleaved, non-blocking, so no pair waits on another), then
  // allocates and registers the staging buffer and the control buffers. Fails as a whole (every
  // comm released) on any error; kTimeout at the deadline naming the peers not yet connected.
  static Result<std::unique_ptr<Transport>> Create(fabric::Fabric& fabric, bootstrap::Bootstrap& bootstrap,
                                                   device::Device& device, const TransportOptions& options,
                                                   Deadline deadline);
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
  device::Buffer& staging() { return *staging_; }
  // This rank's row of the shape's links: links[to] for every rank (unreachable for itself),
  // from the fabric device's latency and speed (0 when the fabric does not say), staged = true.
  const std::vector<LinkDesc>& link_row() const { return link_row_; }
  // "directconnect (device w0:port1 ...), staging by fd": for logs.
  const std::string& description() const { return description_; }

 private:
  Transport() = default;
  int rank_ = 0;
  int nranks_ = 1;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<fabric::ListenComm>> listens_;
  std::unique_ptr<device::Buffer> staging_;
  std::vector<LinkDesc> link_row_;
  std::string description_;
};

}  // namespace kizuna::collectives
