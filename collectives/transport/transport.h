// A communicator's connections (docs/ARCHITECTURE.md): for every peer some fabric reaches, one
// SendComm (bytes to the peer) and one RecvComm (bytes from it), each made when first needed; a
// registered staging region through which plan steps move data (device memory, or host memory
// where a fabric cannot reach the device's), and small host control buffers for the executor's
// per-operation headers.
//
// Connections on demand. Create connects nobody: it agrees with the other ranks, through the
// bootstrap, on the fabric of every pair and exchanges the handles each rank listens on (one
// listen comm per fabric device that serves some peer, shared by every peer that device serves),
// then returns. A pair is connected when a plan first needs it: the executor calls Connect(q)
// (non-blocking) for each peer it sends to (data, operation headers, probes, answers) and Poll()
// to take the connections waiting on the listen comms (while it runs an operation and while idle),
// so creation time, descriptors and memory grow with the neighbours a rank's plans use (a ring: 2
// peers), not with the ranks. A connection's first message, on its own tag, says which rank made
// it: the accepting side hands the comm to that peer (after checking that the peer connects over
// the fabric and device the pair was given). Both sides of a pair may connect at once: connects
// and accepts are non-blocking. Where the pair's fabric carries both directions on one connection
// (Fabric::ConnectBack), a rank sends over the peer's connection once it has it, and of a pair
// about to connect both ways the higher rank waits for the lower one's connection (Connect,
// bounded by kAwaitPeer). connected_peers() counts the peers with a connection either way; the
// Transport logs them at INFO when it goes.
// TransportOptions::connect_at_creation connects every reachable pair in Create instead (jobs whose
// ranks learn the end of the job from their connections closing: an INA job's aggregation devices).
//
// Several fabrics, one per pair: Create takes the fabrics in preference order (every rank passes
// fabrics of the same names in the same order). A pair of ranks (a, b) is served by the FIRST
// fabric in which a has a device serving b and b has a device serving a — both ranks compute the
// same answer from what they allgathered, so they never need to agree in another round. As with
// NCCL's transports (P2P/SHM inside a node, NET between nodes): direct links (directconnect)
// between the ranks of one host, a network fabric (ofi, roce) between hosts. A pair no fabric
// serves is unreachable (LinkDesc::reachable false in the row this rank contributes to the shape).
// The row and the description come from the fabric devices, not from connections.
//
// Forwarding: a pair no fabric serves, on hosts that share no cable, is served through the ranks
// in between where one fabric links each pair along a shortest path and forwards
// (TransportOptions::forward, Fabric::Forward): the connection goes to the first rank of the path
// and is relayed by each rank in turn (their fabric does it, while their listen comms accept).
// Among shortest paths, each pair takes one by its ranks, so that pairs spread over equal paths.
// Its LinkDesc counts the cables (hops); description() lists it as "forwarded: rank 3 (via 1)".
//
// Which fabric device serves which peer follows the fabric's properties, never its name: a
// switched device (FabricDeviceProperties::point_to_point false) reaches every peer — the device
// nearest the rank's accelerator (near_device_uuids, then numa_node) is used, device 0 when none
// is nearer; a point-to-point device reaches only its link_peer. Rails: where a host has several
// such devices (equally near, one provider, other interfaces; or KIZUNA_NICS' list), local rank i
// talks to other hosts over the i-th (mod their number), and a pair of ranks with local indices
// i, j on two hosts over the min(i, j)-th at both ends (transport.cc, "Rails").
//
// Memory: one staging buffer per rank, through which plan steps move data, registered on every
// comm as the comm is made (so by each comm's own fabric). Zero-copy where the pair allows,
// staged through host memory only where it must be (docs/ARCHITECTURE.md):
//  1. Device memory (Device::Allocate), registered per comm the first way the comm accepts:
//     by DMA-BUF fd (Device::ExportDmaBuf, what an RDMA NIC registers) when the device exports
//     one and the comm takes fds; by the device's own exported fd (a memfd of the emulated
//     device: a direct-connect peer then copies straight between the two staging regions); by
//     device pointer (kPtrDevice); by host pointer when the device is host accessible (kPtrHost).
//  2. Host memory from Device::AllocateHost (as cudaMallocHost), registered as host memory on
//     every comm, when the CPU cannot address the device's memory and some fabric device that
//     serves a peer takes none of those ways (its ptr_support: CUDA memory over a host-only
//     fabric). Decided in Create, from the fabric devices, for every comm at once (one staging
//     buffer). The executor's device streams copy and reduce between the user's buffers and the
//     slots exactly as before; the fabric reads and writes the slots with the CPU.
//     A refusal only registering can show (each way kNotSupported: CUDA memory over libfabric
//     1.17 or direct links, whose fds cannot be mapped) moves the staging to host memory the
//     same way when it comes from the rank's first comm, before any comm has registered the
//     device's memory (no operation has used a slot yet); from a later comm it is an error
//     naming the fabric, the peer and every refusal.
//  3. TransportOptions::force_host_staging takes path 2 from the start, on any device (tests).
// Create fails, naming the fabric, the device and the reason, when a fabric device that serves a
// peer cannot reach a host-accessible device's memory (kNotSupported: host memory would be the
// same memory), or when the device has no host memory for its streams (AllocateHost's
// kNotSupported); a comm that refuses even host memory fails its connection (its error).
// The choice is logged at INFO (subsystem COLL): "staging 8 MiB on host_emulated:3, registered
// by fd (device export) on directconnect, ofi", or "staging through host memory: ofi cannot
// reach cuda:0 memory: <why>"; staging_paths(), host_staging() and description() say it too.
//
// Tags: the transport's own message (a connection's first) uses kIdentifyTag; every other tag is
// the executor's.
//
// Lifetime: the Transport owns its comms, listen comms and registrations; it must be destroyed
// before the Fabrics, the Device and the staging Buffer's device. Not thread-safe, except where a
// method says so: one thread (the communicator's executor) uses it after Create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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

namespace kizuna::collectives::transport_internal {
struct StagingExports;  // internal.h
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
  size_t control_bytes = 16384;     // host memory per connection for control messages (32 slots)
  // Stage through host memory (Device::AllocateHost) even where a fabric could reach the
  // device's memory: runs the host-staged path on any device (tests, comparisons).
  bool force_host_staging = false;
  // When some peer is reached over a network (a switched fabric device: ofi, roce), the staging
  // buffer grows to at least this much (0: staging_bytes regardless), so that the executor's
  // slots can hold the larger chunks network transfers want (Executor::slot_bytes_for): each
  // message there pays a fixed cost (tcp;ofi_rxm between two hosts: a rendezvous of several
  // round trips), which 512 KiB chunks do not amortize (docs/PERFORMANCE.md, "TCP").
  size_t network_staging_bytes = 0;
  // Connect every reachable pair in Create, both ways, and return after a bootstrap barrier
  // (every rank has its connections then), instead of on first use.
  bool connect_at_creation = false;
  // A pair no fabric serves directly connects through the ranks in between (transport.cc,
  // "Forwarding"), where one fabric links every pair of the path and forwards (Fabric::Forward:
  // tcp's cables between hosts). false: such pairs stay unreachable.
  bool forward = true;
  // Rails (transport.cc, "Rails"): every rank's host id, indexed by rank (empty: one host, no
  // rails), and the NICs to use between hosts in local-rank order (KIZUNA_NICS; empty: every
  // device of the nearest kind, by interface name).
  std::vector<std::string> rank_hosts = {};
  std::vector<std::string> nics = {};
  // KIZUNA_MACHINE_TOPOLOGY: an hwloc XML file to read the machine's topology from, instead of
  // this machine's (device_map.h, PlaceOf).
  std::string machine_topology = {};
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
  // The transport's own tag: a connection's first message, which names the rank that made it.
  static constexpr int kIdentifyTag = 0x7fff'fff0;

  // A peer's connections, made on first use: `send` by Connect, `recv` when Poll accepts the
  // peer's connection. Each comm's buffers are registered as it is made.
  struct Peer {
    int rank = -1;
    fabric::Fabric* fabric = nullptr;        // the fabric that serves the pair (one of Create's)
    std::unique_ptr<fabric::SendComm> send;  // to the peer; null until connected
    std::unique_ptr<fabric::RecvComm> recv;  // from the peer; null until accepted
    fabric::Registration* send_staging = nullptr;  // the staging buffer, registered on `send`
    fabric::Registration* recv_staging = nullptr;  // the staging buffer, registered on `recv`
    fabric::Registration* send_p2p = nullptr;      // point-to-point's region (p2p_staging()), on `send`
    fabric::Registration* recv_p2p = nullptr;      // and on `recv`
    // Host control buffers (TransportOptions::control_bytes each, allocated with their comm),
    // registered on send / recv.
    std::vector<uint8_t> control_out, control_in;
    fabric::Registration* send_control = nullptr;
    fabric::Registration* recv_control = nullptr;
    // The connection's first message (Transport::kIdentifyTag), registered on `send`; in flight
    // until `identify` is reported done.
    std::vector<uint8_t> identity;
    fabric::Registration* send_identity = nullptr;
    fabric::Request* identify = nullptr;
  };

  // Collective: every rank of `bootstrap` calls it with the same options and fabrics of the same
  // names in the same order (each rank its own Fabric objects, created for its rank). Two
  // allgathers through the bootstrap: first which peers each rank can serve on each fabric (from
  // which every rank computes the fabric of every pair), then the handles, each rank listening once
  // per fabric device that serves a peer of the pair's fabric. Decides how comms will register the
  // staging buffer (allocated with the first connection). Connects nobody (unless
  // connect_at_creation: then it connects to and accepts from every reachable peer, non-blocking
  // and interleaved, and returns after a bootstrap barrier). kInvalidArgument when `fabrics` is
  // empty, holds a null, a fabric twice, or a fabric created for another rank, or when the ranks
  // pass different fabric lists (naming both lists). Fails as a whole (every comm released) on any
  // error; kTimeout at the deadline naming the peers not yet connected (connect_at_creation).
  static Result<std::unique_ptr<Transport>> Create(std::span<fabric::Fabric* const> fabrics,
                                                   bootstrap::Bootstrap& bootstrap, device::Device& device,
                                                   const TransportOptions& options, Deadline deadline);
  // A communicator of one rank: no fabric, no peers, no staging buffer (nothing is sent);
  // staging_bytes() still sizes the executor's slots.
  static Result<std::unique_ptr<Transport>> CreateSingle(device::Device& device, const TransportOptions& options);
  // Logs at INFO how many peers the rank connected.
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // Whether some fabric serves the pair (this rank, q): known from Create, without a connection.
  bool reachable(int q) const;
  // The peer's connections so far; nullptr until it has one either way (always for the rank
  // itself and unreachable peers).
  Peer* peer(int q) { return peers_[static_cast<size_t>(q)].get(); }

  // Non-blocking: starts or continues connecting to `q`; true once Peer::send exists (its buffers
  // registered, its identifying message posted). kInvalidArgument for an unreachable peer; a
  // fabric's error names the peer, the fabric and the device.
  //
  // Both directions on one connection, where the pair's fabric can (Fabric::ConnectBack: tcp
  // over a switched network): a rank that has the peer's connection already sends over it. Where
  // both ranks are about to connect to each other (`peer_connects`: the caller also receives from
  // q now, so q connects to this rank too), the higher rank waits for the lower one's connection
  // (at most kAwaitPeer, then it connects on its own), so that one connection serves the pair.
  Result<bool> Connect(int q, bool peer_connects = false);
  static constexpr std::chrono::seconds kAwaitPeer{2};
  // Non-blocking: takes the connections waiting on the listen comms where the peers of `expecting`
  // connect, and on the next kPollEach others in turn (every listen comm is looked at within
  // listens / kPollEach calls), hands each to the peer its first message names (Peer::recv, its
  // buffers registered), and reaps identifying messages delivered. True when some peer got its
  // RecvComm. A connection that names a rank that cannot have made it is dropped (logged); an
  // error is this rank's (a listen comm or a registration failed).
  Result<bool> Poll(std::span<const int> expecting = {});
  static constexpr size_t kPollEach = 8;
  // Connects to every peer of `to` and accepts from every peer of `from`, until all are there (a
  // connection to a peer once the peer has taken its first message); kTimeout at the deadline
  // naming the peers not yet connected each way. The peers must make the other ends at the same
  // time (their own WaitConnected, or an executor).
  Status WaitConnected(std::span<const int> to, std::span<const int> from, Deadline deadline);
  // WaitConnected both ways with every reachable peer.
  Status ConnectAll(Deadline deadline);
  // After a failure: closes every comm and listen comm, so that peers waiting on this rank, or
  // connecting to it, fail at once (kRemoteError) instead of at their deadline. Connect and Poll
  // make nothing afterwards.
  void Close();

  // Peers with a connection either way, in rank order. Thread-safe (the executor makes them).
  std::vector<int> connected_peers() const;
  // Peers this rank has a RecvComm from, in the order they were accepted: what the executor
  // polls for control messages. The executor's thread only.
  const std::vector<int>& receiving_from() const { return receiving_from_; }
  // Host bytes per control buffer (TransportOptions::control_bytes).
  size_t control_bytes() const { return control_bytes_; }

  // The staging buffer: device memory, or host memory from Device::AllocateHost when
  // host_staging(). Either way an address the device's streams take. Allocated with the first
  // connection (a rank whose operations connect nobody holds none): there is one once peer(q)
  // has a comm, or after EnsureStaging.
  device::Buffer& staging() { return *staging_; }
  Status EnsureStaging();
  // Its size, fixed at Create (thread-safe).
  size_t staging_bytes() const { return staging_bytes_; }
  // Point-to-point's slots: a second region, registered like the staging buffer, empty until an
  // operation needs it and grown when one needs more (ReserveP2p) — so that its size follows the
  // transfers a rank makes at once, not the communicator's ranks. nullptr before the first.
  device::Buffer* p2p_staging() { return p2p_.get(); }
  // Grows point-to-point's region to at least `bytes`, registered on every comm made so far (and on
  // later ones as they are made). Between operations only: no request may be in flight on it.
  Status ReserveP2p(size_t bytes);
  // Every way some comm registers the staging buffer or will, in StagingPath order; empty without
  // peers. Thread-safe.
  std::vector<StagingPath> staging_paths() const;
  // True when the staging buffer is host memory (StagingPath::kHostMemory on every comm).
  // Thread-safe.
  bool host_staging() const;
  // True when some peer is reached through a switched fabric device (point_to_point false: a
  // network such as ofi or roce), not only over direct links.
  bool network() const { return network_; }
  // This rank's row of the shape's links: links[to] for every rank (unreachable for itself),
  // from the fabric device's latency and speed (0 when the fabric does not say), staged = true.
  const std::vector<LinkDesc>& link_row() const { return link_row_; }
  // The name of the fabric that reaches peer q ("directconnect", "tcp"); "" when none does.
  std::string_view FabricOf(int q) const;
  // Which fabric serves which peers, the devices it uses, and how staging is registered, for logs
  // and tests: "directconnect: rank 1 (device w0:port0); ofi: ranks 2, 3 (device tcp;ofi_rxm:lo);
  // staging by fd (device export)", or "...; staging through host memory (ofi cannot reach
  // cuda:0 memory)". Unreachable peers are listed as "unreachable: ranks ...". From the fabric
  // devices, whether or not the pairs are connected yet. Thread-safe.
  std::string description() const;

 private:
  // How this rank reaches a peer, from Create.
  struct Route {
    int fabric = -1;       // index into fabrics_; -1: unreachable
    int connect_dev = -1;  // this rank's device of that fabric to connect from
    int listen = -1;       // index into listens_: where the peer's connection arrives
    int offer = -1;        // index into offers_: the peer's handle this rank connects to
  };
  struct Listen {
    std::unique_ptr<fabric::ListenComm> comm;
    int fabric = -1;
    int device = -1;
  };
  // A connection accepted and not yet identified: its first message names the peer.
  struct Arrival;
  // Create's phases (transport.cc).
  class Planner;
  // How comms register the staging buffer (staging.cc).
  struct Staging;

  Transport();
  // Decides, from the fabric devices that serve some peer, how comms register the staging buffer
  // (steps 1 and 2 of the class comment); EnsureStaging allocates it. Sets staging_paths_,
  // host_staging_ and staging_text_. `where` names the transport in errors and logs.
  Status SetUpStaging(device::Device& device, const TransportOptions& options);
  // Keeps `buffer` until the transport goes (retired_); null is ignored.
  void Retire(std::unique_ptr<device::Buffer> buffer);
  // Moves the staging buffer to host memory, `why` (and `detail`, logged) saying why.
  Status SetUpHostStaging(device::Device& device, const std::string& why, const std::string& detail);
  // Registers the staging buffer (`p2p`: point-to-point's region) on a comm to `q` (the way
  // SetUpStaging decided, the first the comm accepts); the first comm of the rank that refuses every
  // way moves staging to host memory.
  Result<fabric::Registration*> RegisterStaging(fabric::Comm& comm, int q, bool p2p = false);
  // The buffer's fd exports, as far as the device makes them and some fabric device takes fds.
  transport_internal::StagingExports ExportRegion(device::Buffer& buffer, std::string_view what);
  // Registers the control buffer (and, for a send comm, the identifying message) on a new comm.
  Status RegisterBuffers(Peer& p, bool send);
  Peer& EnsurePeer(int q);
  void MarkConnected(int q);
  // One arrival's identifying message: true when it was handed to its peer or dropped.
  Result<bool> Identify(Arrival& a, bool& got_peer);
  std::string Named(int q) const;  // "rank 3 (directconnect w0:port2)"

  int rank_ = 0;
  int nranks_ = 1;
  std::string where_;  // "transport (rank 0 of 4 on directconnect, ofi)"
  bool closed_ = false;  // Close
  std::vector<fabric::Fabric*> fabrics_;
  std::vector<Route> routes_;
  std::vector<fabric::Handle> offers_;
  std::vector<Listen> listens_;
  std::vector<std::unique_ptr<Arrival>> arrivals_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<int> receiving_from_;
  std::vector<int> identifying_;  // peers whose identifying message is in flight
  // Per peer: since when Connect waits for the peer's connection (peer_connects), and whether its
  // connection goes one way only (ConnectBack said kNotSupported).
  std::vector<std::chrono::steady_clock::time_point> awaiting_since_;
  std::vector<bool> one_way_;
  int connected_back_ = 0;        // peers this rank sends to over their connection
  size_t poll_cursor_ = 0;        // Poll's turn through the listen comms
  std::vector<size_t> poll_scratch_;
  size_t control_bytes_ = 0;
  std::unique_ptr<Staging> how_;
  device::Device* device_ = nullptr;
  std::unique_ptr<device::Buffer> staging_;
  size_t staging_bytes_ = 0;
  std::unique_ptr<device::Buffer> p2p_;
  // Staging this transport stopped using (an outgrown point-to-point region, a device buffer that
  // moved to host memory), freed with the transport: they go out of use during an operation, while
  // its caller's stream is held, and freeing device memory may wait for every stream of the device
  // (cudaFree does; KIZUNA_EMU_SYNC_FREE), that one included.
  std::vector<std::unique_ptr<device::Buffer>> retired_;
  bool network_ = false;
  std::vector<LinkDesc> link_row_;

  mutable std::mutex mu_;  // what other threads read: below
  std::vector<int> connected_;          // guarded by mu_: peers with a comm either way, sorted
  std::vector<StagingPath> staging_paths_;  // guarded by mu_
  bool host_staging_ = false;               // guarded by mu_
  std::string staging_text_;  // guarded by mu_: "by fd (device export)", "through host memory (why)"
  std::string groups_;        // "directconnect: rank 1 (device w0:port0)"; fixed at Create
};

}  // namespace kizuna::collectives
