// The fabric abstraction: devices (NICs, ports), connections, memory registration, tagged
// send/receive, one-sided write with immediate data, completions (fabric/README.md).
//
// The shape follows NCCL's net plugin API (ncclNet_v8 .. v12, ext-net/ in NCCL's repository), so
// that a vendor who has written an ncclNet_t recognizes every call:
//
//   ncclNet_t                      kizuna::fabric
//   ---------------------------    ---------------------------------------------------------
//   devices / getProperties        Fabric::device_count / Fabric::properties
//   listen                         Fabric::Listen -> ListenComm (its Handle: <= 128 bytes)
//   connect (sendComm may be NULL) Fabric::Connect (non-blocking: ok + nullptr = call again)
//   accept  (recvComm may be NULL) ListenComm::Accept (non-blocking, the same way)
//   regMr / regMrDmaBuf            Comm::Register (MemoryDescriptor: host pointer or fd + offset)
//   deregMr                        Comm::Deregister
//   isend / irecv (request NULL)   SendComm::Send / RecvComm::Recv (ok + nullptr = busy, retry)
//   test                           Comm::Test (done + size); Comm::Wait adds a deadline
//   iflush                         RecvComm::Flush
//   closeSend/closeRecv/closeListen  destroying the SendComm / RecvComm / ListenComm
//   (RDMA write with immediate)    SendComm::Write, RecvComm::Expose / PollImmediate
//
// Differences from ncclNet_t, on purpose: errors are Status values naming what is wrong (never a
// bare ncclInternalError); every wait has a Deadline (Comm::Wait, ListenComm::Accept(deadline),
// Fabric::Connect(deadline), RecvComm::WaitImmediate) and is backed by the backend's own blocking
// primitive (DoWaitForProgress: eventfd, completion channel, poll) rather than a caller's spin; a
// receive is posted one buffer at a time (no grouped irecv); one-sided writes are part of the
// interface, NotSupported where the fabric has none.
//
// Connections are one-directional, as in NCCL: the side that calls Connect gets a SendComm, the
// side that accepts gets a RecvComm, and bytes flow from the first to the second. Two ranks that
// exchange data both ways open two connections.
//
// Public entry points are non-virtual: they validate arguments (ranges inside registrations,
// registrations and requests belonging to this comm, sizes within the device's limits), enforce
// the in-flight limit and trace (subsystem FABRIC), then call the protected Do* virtuals, so
// backends never repeat these checks.
//
// Threading: a Fabric's methods are thread-safe. A ListenComm, SendComm or RecvComm is used by
// one thread at a time (NCCL's proxy thread owns its comms the same way); different comms may be
// used concurrently from different threads.
//
// Lifetime: the Fabric outlives every comm created from it (the FabricRegistry owns fabrics).
// Requests and registrations are owned by their comm: a Request* is valid from the post until
// Test (or Wait) reports it done or failed; a Registration* until Deregister or the comm's
// destruction. Destroying a comm abandons its requests (the peer's requests then fail with
// kRemoteError) and releases its registrations.
//
// Failures: a peer that closes its comm or dies surfaces on the survivor's outstanding requests
// as kRemoteError (never a hang, never SIGPIPE). A message longer than the receive's capacity
// fails both requests with kInvalidArgument naming both sizes.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::fabric {

// ---- Opaque byte blobs exchanged between ranks ----

// A fixed-size, length-prefixed blob. Handle (<= 128 bytes, NCCL_NET_HANDLE_MAXSIZE) is what
// Listen produces and Connect consumes; RemoteKey (<= 64 bytes) names a region exposed for
// one-sided writes. Both are plain bytes: ranks exchange them through the bootstrap (or any
// channel), and a receiver must treat them as untrusted input (backends validate them).
template <size_t kMaxBytes, typename Tag>
struct OpaqueBlob {
  static constexpr size_t kMax = kMaxBytes;

  uint32_t size = 0;                  // bytes used in `data`, <= kMax
  std::array<uint8_t, kMaxBytes> data{};

  std::span<const uint8_t> bytes() const { return {data.data(), size}; }

  // kInvalidArgument when `bytes` is longer than kMax.
  static Result<OpaqueBlob> FromBytes(std::span<const uint8_t> bytes);
  // Lower-case hex of bytes(), for text channels (files, command lines, environment).
  std::string ToHex() const;
  // Parses ToHex() output; kInvalidArgument naming the problem (odd length, bad digit, too long).
  static Result<OpaqueBlob> FromHex(std::string_view hex);

  friend bool operator==(const OpaqueBlob& a, const OpaqueBlob& b) {
    return a.size == b.size && std::equal(a.data.begin(), a.data.begin() + a.size, b.data.begin());
  }
};

struct HandleTag;
struct RemoteKeyTag;
inline constexpr size_t kHandleMaxBytes = 128;    // NCCL_NET_HANDLE_MAXSIZE
inline constexpr size_t kRemoteKeyMaxBytes = 64;
using Handle = OpaqueBlob<kHandleMaxBytes, HandleTag>;
using RemoteKey = OpaqueBlob<kRemoteKeyMaxBytes, RemoteKeyTag>;

// ---- Devices and their properties ----

// Memory a device can send from and receive into (NCCL_PTR_HOST / NCCL_PTR_CUDA / NCCL_PTR_DMABUF).
enum PointerSupport : uint32_t {
  kPtrHost = 1u << 0,    // host memory, registered by pointer
  kPtrDevice = 1u << 1,  // device memory, registered by pointer
  kPtrFd = 1u << 2,      // memory registered by fd + offset (DMA-BUF, or a memfd of the emulated device)
};
// A fabric with kPtrFd moves bytes between two fd-registered regions on one host without an
// intermediate buffer (TransferStats::staged_bytes stays 0): that is what registering by fd is for.
// The conformance suite checks it.

// The one endpoint a point-to-point device reaches (direct-connect fabrics).
struct LinkPeer {
  std::string node;  // the peer's node name in the topology
  int rank = -1;     // the worker rank at that node; -1 for a node that is not a rank (an aggregator)
  int port = -1;     // the peer's port, i.e. its fabric device index, to Listen on
};

struct FabricDeviceProperties {
  std::string fabric;      // registry name, e.g. "directconnect"
  int index = 0;           // device index within the fabric (a NIC, a port)
  std::string name;        // human-readable, e.g. "w3:port1" or "mlx5_0:1"
  double speed_gbps = 0;   // per direction, Gb/s; 0: unknown
  double latency_us = 0;   // one-way latency of a small message; 0: unknown
  uint32_t ptr_support = kPtrHost;  // PointerSupport bits
  int max_requests = 1;    // requests in flight per comm; a post beyond it answers busy
  uint64_t max_message_bytes = 0;   // the largest single send / receive / write
  bool write_immediate = false;     // SendComm::Write and RecvComm::Expose/PollImmediate work
  bool needs_flush = false;         // RecvComm::Flush does real work (NCCL's forceFlush)
  // Registering memory the CPU addresses costs no more than bookkeeping (no pinning, no mapping:
  // the backend keeps the pointer), so a caller may register a buffer for one transfer and
  // deregister it after: the collective executor then sends from and receives into the
  // caller's buffers instead of copying them through its staging.
  bool cheap_registration = false;

  // Locality: which local accelerators this device is close to.
  std::vector<std::string> near_device_uuids;  // device::DeviceProperties::uuid values
  int numa_node = -1;                          // -1: unknown
  std::string pci_path;                        // sysfs PCI path; "" when unknown or not PCI

  // Point-to-point devices (direct-connect ports) reach only the other end of their link,
  // `link_peer` (none when it is empty: an unconnected port); Connect on such a device works only
  // with a handle from exactly that node and port. Switched devices (false) reach every peer.
  bool point_to_point = false;
  std::optional<LinkPeer> link_peer;
  // A point-to-point device's parallel cables to its link peer, bundled into this one device (a
  // 2 x 2 torus cables each pair of neighbours twice): how many rings may each take one of them.
  int cables = 1;
};

// What a fabric needs to know about the rank creating it.
struct FabricContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string host_id;  // identical for every rank on one host (the bootstrap's host id)
  // The host id of every rank of the job, indexed by rank (rank_hosts[rank] == host_id); empty
  // when unknown (a process that creates a fabric without a communicator). Fabrics that can only
  // link ranks of one host (directconnect's generated topologies) use it to see which ranks share
  // this one.
  std::vector<std::string> rank_hosts;
  // The rank's accelerators (DeviceProperties::uuid); a fabric lists the ones its devices are
  // close to in FabricDeviceProperties::near_device_uuids.
  std::vector<std::string> device_uuids;
  // A topology node to act as, for a process that is not a worker rank (an aggregation daemon);
  // empty: the worker node of `rank`.
  std::string node;
  // The job's ranks of topology nodes that are not workers (an INA job's aggregation devices,
  // "a0" -> rank N): a point-to-point fabric reports them as its links' peers (LinkPeer::rank),
  // so that the transport connects those ranks over the node's cables. Empty: none are ranks.
  std::map<std::string, int> node_ranks;
};

// ---- Memory ----

enum class MemoryType : uint8_t { kHost = 0, kDevice = 1 };

// A region to register. Registration by fd is NCCL's regMrDmaBuf: `data` is the region's local
// address and [fd_offset, fd_offset + size) the same bytes within the fd's object.
struct MemoryDescriptor {
  MemoryType type = MemoryType::kHost;
  void* data = nullptr;
  size_t size = 0;
  // kDevice: whether the CPU may dereference `data` (device::DeviceProperties::host_accessible).
  // kHost: always true.
  bool host_accessible = true;
  int fd = -1;  // borrowed for the duration of Register: a fabric dup()s what it keeps
  uint64_t fd_offset = 0;

  static MemoryDescriptor Host(void* data, size_t size) {
    return MemoryDescriptor{MemoryType::kHost, data, size, true, -1, 0};
  }
  // Device memory exported by the device layer (a memfd of the emulated device, a DMA-BUF):
  // `data` is where the exported region starts in this process.
  static MemoryDescriptor FromExport(void* data, const device::ExportedMemory& exported, bool host_accessible) {
    return MemoryDescriptor{MemoryType::kDevice, data, static_cast<size_t>(exported.size), host_accessible,
                            exported.fd.get(), exported.offset};
  }
};

class Comm;

// A registered region (NCCL's mhandle). Owned by its comm; backends subclass it.
class Registration {
 public:
  virtual ~Registration() = default;
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // As registered; `fd` is the caller's (borrowed) descriptor and must not be used afterwards.
  const MemoryDescriptor& memory() const { return memory_; }
  // True when [p, p + bytes) lies inside the region.
  bool Contains(const void* p, size_t bytes) const;

 protected:
  explicit Registration(const MemoryDescriptor& memory) : memory_(memory) {}

 private:
  friend class Comm;
  MemoryDescriptor memory_;
  int in_flight_ = 0;  // requests posted on this region and not yet reported done or failed
};

// ---- Requests ----

enum class RequestKind : uint8_t { kSend, kRecv, kWrite };
std::string_view RequestKindName(RequestKind kind);

// An operation in flight. Owned by its comm; backends subclass it. Its destructor runs after the
// backend's comm object is gone (on comm destruction): it must not reach back into the comm.
class Request {
 public:
  virtual ~Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  RequestKind kind() const { return kind_; }
  int tag() const { return tag_; }
  size_t size() const { return size_; }  // bytes sent/written, or the receive's capacity

 protected:
  Request(RequestKind kind, int tag, size_t size) : kind_(kind), tag_(tag), size_(size) {}

 private:
  friend class Comm;
  RequestKind kind_;
  int tag_;
  size_t size_;
  Registration* registration_ = nullptr;  // counted in its in_flight_ while this request lives
};

// What Test reports for a request that has not failed.
struct Completion {
  bool done = false;
  size_t size = 0;  // when done: bytes received (receives), bytes sent / written (others)
};

// Per-comm counters (kept by the backend; read them from the comm's thread).
struct TransferStats {
  uint64_t messages = 0;      // sends, receives and writes completed
  uint64_t bytes = 0;         // their payload bytes
  // Payload bytes that passed through an intermediate buffer (a ring, a bounce buffer) on their
  // way; 0 for transfers copied or DMA'd directly between the two registered regions.
  uint64_t staged_bytes = 0;
};

// ---- Comms ----

// What SendComm and RecvComm share: registration, completion, waiting.
class Comm {
 public:
  virtual ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // "directconnect:w0:port1->w1:port0" — how logs and errors name the connection.
  const std::string& label() const { return label_; }
  // The fabric device (NIC, port) this comm runs over, and its properties.
  const FabricDeviceProperties& properties() const { return properties_; }

  // Registers memory for posts on this comm (regMr / regMrDmaBuf). kNotSupported when the
  // device's ptr_support lacks the memory's kind (host pointer, device pointer, fd) or the
  // backend cannot reach it; kInvalidArgument for an empty, null or wrapping region, host memory
  // marked not host accessible, or an fd range beyond the fd's object.
  Result<Registration*> Register(const MemoryDescriptor& memory);
  // Releases a registration. kInvalidArgument when it is not this comm's, or while requests
  // posted on it are in flight (Test them to completion first).
  Status Deregister(Registration* registration);

  // Non-blocking: progresses the comm and reports whether `request` is done. When it reports done,
  // or returns an error (the request failed: kRemoteError when the peer went away,
  // kInvalidArgument for a message longer than the receive, ...), the request is released and the
  // pointer becomes invalid. kInvalidArgument, releasing nothing, for a pointer that is not a live
  // request of this comm.
  Result<Completion> Test(Request* request);
  // Test until done or the deadline. Blocks in the backend's wait primitive between tests (no
  // busy loop beyond a short spin). kTimeout at the deadline leaves the request live: wait again
  // or destroy the comm. Returns Completion::size.
  Result<size_t> Wait(Request* request, Deadline deadline);

  int requests_in_flight() const { return static_cast<int>(requests_.size()); }
  const TransferStats& stats() const { return stats_; }

 protected:
  Comm(std::string label, FabricDeviceProperties properties);

  virtual Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) = 0;
  // Called before the object is destroyed; no request uses it. Errors are reported to the caller
  // of Deregister, and the registration is released regardless.
  virtual Status DoDeregister(Registration& registration) = 0;
  // Progresses and reports `request`. Returning done or an error hands the request back to the
  // base, which destroys it: the backend must hold no reference to it afterwards.
  virtual Result<Completion> DoTest(Request& request) = 0;
  // Blocks until something may have changed for this comm (peer activity, a socket event, a
  // completion) or the deadline passes, after at most a short spin. Returns ok in both cases;
  // an error only when waiting itself failed. Spurious returns are fine.
  virtual Status DoWaitForProgress(Deadline deadline) = 0;

  // For SendComm / RecvComm: validation shared by posts, and adoption of a posted request.
  Status CheckRange(const void* data, size_t bytes, Registration* registration, std::string_view what) const;
  bool AtRequestLimit() const;
  Request* Adopt(std::unique_ptr<Request> request, Registration* registration);
  bool OwnsRegistration(const Registration* registration) const;

  TransferStats stats_;  // backends update it

 private:
  std::string label_;
  FabricDeviceProperties properties_;
  std::unordered_map<const Registration*, std::unique_ptr<Registration>> registrations_;
  using Requests = std::unordered_map<const Request*, std::unique_ptr<Request>>;
  Requests requests_;
  // Nodes of requests_ whose requests are done, kept (at most kSpareNodes) for the next ones: a
  // message then costs no node allocated and freed (node handles, C++17's extract and insert).
  static constexpr size_t kSpareNodes = 16;
  std::vector<Requests::node_type> spare_nodes_;
};

// The sending side of a connection (from Fabric::Connect).
class SendComm : public Comm {
 public:
  // Posts a send of [data, data + size) with `tag` (isend). `registration` must contain the range
  // (it may be null when size is 0). Sends and receives with the same tag match in posting order;
  // different tags are independent. Returns nullptr, posting nothing, when the comm already has
  // max_requests requests in flight or the backend's queues are full: Test some and post again.
  // kInvalidArgument for a range outside the registration or size > max_message_bytes.
  Result<Request*> Send(const void* data, size_t size, int tag, Registration* registration);

  // One-sided write of [data, data + size) into the peer's region named by `remote` (from the
  // peer's RecvComm::Expose), at `remote_offset`; with `immediate`, the peer's PollImmediate
  // yields it after the bytes are visible there. Writes and immediates arrive in posting order.
  // The request completes when the local buffer may be reused. kNotSupported unless
  // properties().write_immediate; kInvalidArgument for a key of another connection or a range
  // beyond the exposed region; nullptr when busy, as for Send.
  Result<Request*> Write(const void* data, size_t size, Registration* registration, const RemoteKey& remote,
                         uint64_t remote_offset, std::optional<uint32_t> immediate);

 protected:
  using Comm::Comm;
  // Ranges and limits are checked. nullptr: busy (nothing posted).
  virtual Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag,
                                                  Registration* registration) = 0;
  // The key's length is within kRemoteKeyMaxBytes; its contents are the backend's to check.
  virtual Result<std::unique_ptr<Request>> DoWrite(const void* data, size_t size, Registration* registration,
                                                   const RemoteKey& remote, uint64_t remote_offset,
                                                   std::optional<uint32_t> immediate);
};

// The receiving side of a connection (from ListenComm::Accept).
class RecvComm : public Comm {
 public:
  // Posts a receive into [data, data + capacity) for `tag` (irecv). Completion::size is the
  // message's length. A message longer than `capacity` fails this request and the matching send
  // with kInvalidArgument naming both sizes. Busy and range rules as for SendComm::Send.
  Result<Request*> Recv(void* data, size_t capacity, int tag, Registration* registration);
  // Receives posted between BeginPosts and EndPosts may be announced to their sender together: a
  // backend whose receives announce themselves (tcp's post frames) then sends one message for the
  // batch where it sends one per receive. Nothing else changes; EndPosts sends what the batch held
  // back. Backends without announcements ignore both.
  void BeginPosts() { DoBeginPosts(); }
  void EndPosts() { DoEndPosts(); }

  // Makes data received into [data, data + size) visible to the local device (NCCL's iflush; for
  // fabrics that write device memory behind the device's caches). Ok at once where
  // properties().needs_flush is false.
  Status Flush(void* data, size_t size, Registration* registration, Deadline deadline);

  // Exposes a registered region to the peer's one-sided writes; send the key to the peer (over
  // this fabric or the bootstrap). The region stays exposed until it is deregistered; the caller
  // must make sure the peer writes no more before deregistering (as with RDMA). kNotSupported
  // unless properties().write_immediate.
  Result<RemoteKey> Expose(Registration* registration);
  // The next immediate value written by the peer, in posting order, or nullopt when none has
  // arrived (progresses the comm). kRemoteError once the peer is gone and no more are queued.
  Result<std::optional<uint32_t>> PollImmediate();
  // PollImmediate until one arrives or the deadline (kTimeout).
  Result<uint32_t> WaitImmediate(Deadline deadline);

 protected:
  using Comm::Comm;
  virtual Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag,
                                                  Registration* registration) = 0;
  virtual Status DoFlush(void* data, size_t size, Registration& registration, Deadline deadline);
  virtual Result<RemoteKey> DoExpose(Registration& registration);
  virtual Result<std::optional<uint32_t>> DoPollImmediate();
  virtual void DoBeginPosts() {}
  virtual void DoEndPosts() {}
};

// A listening endpoint on one fabric device (NCCL's listenComm).
class ListenComm {
 public:
  virtual ~ListenComm() = default;
  ListenComm(const ListenComm&) = delete;
  ListenComm& operator=(const ListenComm&) = delete;

  // What a peer passes to Fabric::Connect. Knowing it is what lets a peer connect: backends put
  // an unguessable secret in it, so a stranger cannot attach.
  const Handle& handle() const { return handle_; }
  const FabricDeviceProperties& properties() const { return properties_; }

  // Non-blocking: a RecvComm for the next peer that connected with this handle, or nullptr while
  // none has (call again). A connection attempt without the handle's secret is rejected and
  // logged, never returned.
  Result<std::unique_ptr<RecvComm>> Accept();
  // Accept until a connection arrives or the deadline (kTimeout); blocks between attempts.
  Result<std::unique_ptr<RecvComm>> Accept(Deadline deadline);

 protected:
  ListenComm(FabricDeviceProperties properties, Handle handle)
      : properties_(std::move(properties)), handle_(handle) {}
  virtual Result<std::unique_ptr<RecvComm>> DoAccept() = 0;
  // Blocks until a connection attempt may be pending or the deadline; ok in both cases.
  virtual Status DoWaitAcceptable(Deadline deadline) = 0;

 private:
  FabricDeviceProperties properties_;
  Handle handle_;
};

// A fabric: a registry entry whose devices are NICs or ports.
class Fabric {
 public:
  virtual ~Fabric() = default;
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  const std::string& name() const { return name_; }
  const Config& config() const { return *config_; }
  const FabricContext& context() const { return context_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  // kInvalidArgument for an index out of range.
  Result<FabricDeviceProperties> properties(int dev) const;

  // Where the fabric goes among the fabrics that are not direct in the default order
  // (FabricRegistry::SelectAll without KIZUNA_FABRIC): lower first, ties in registration order.
  enum DefaultRank : int {
    kRankNative = 0,           // its own path to the hardware (RDMA NICs; plugins say nothing else)
    kRankSockets = 10,         // the kernel's sockets (tcp)
    kRankLayeredSockets = 20,  // sockets under a messaging layer of its own (ofi's tcp;ofi_rxm)
  };
  int default_rank() const { return default_rank_; }

  // Starts listening on device `dev` (listen).
  Result<std::unique_ptr<ListenComm>> Listen(int dev);
  // Non-blocking connect to the listener that produced `handle` (connect): a SendComm, or nullptr
  // while the connection is in progress — call again with the same dev and handle (a backend may
  // keep in-progress state keyed by the handle's bytes). kInvalidArgument for a malformed handle,
  // or one that device `dev` cannot reach (a direct link that goes elsewhere).
  Result<std::unique_ptr<SendComm>> Connect(int dev, const Handle& handle);
  // Connect until connected or the deadline (kTimeout); waits between attempts.
  Result<std::unique_ptr<SendComm>> Connect(int dev, const Handle& handle, Deadline deadline);

  // Forwarding (optional; fabric/tcp has it): a handle for Connect whose connection reaches the
  // listener of `target` through ranks in between, each relaying its bytes as they come (ranks on
  // hosts that share no cable). `hops[0]` is the rank the connecting device's link goes to; each
  // hop names its listen handle for the rank before it (where the relayed connection arrives) and
  // its device toward the rank after it. The relaying ranks need do nothing but accept on those
  // listen comms, as they do for their own peers. kNotSupported where the fabric does not forward
  // (the default); kInvalidArgument when the path does not fit in a handle, naming its length.
  struct Hop {
    Handle via;           // the relaying rank's listen handle for the rank before it
    int out_device = -1;  // the relaying rank's device toward the rank after it
  };
  Result<Handle> Forward(std::span<const Hop> hops, const Handle& target) const;

  // Both directions on one connection (optional; fabric/tcp has it over switched networks): like
  // Connect, to the peer whose connection `from` is (the listener of `handle`, on the peer's
  // side), but over that same connection, which then carries this side's messages too. The peer
  // sees nothing new: its listen comm's Accept yields the RecvComm, as for any connection. Its
  // small messages then share their packets with the other direction's, where a connection per
  // direction sends each acknowledgement as a packet of its own. kNotSupported where the fabric
  // or that connection does not do it (the caller connects as usual); ConnectsBack says so before
  // there is a connection.
  Result<std::unique_ptr<SendComm>> ConnectBack(int dev, const Handle& handle, RecvComm& from);
  bool ConnectsBack(int dev) const;

 protected:
  Fabric(std::string name, const Config* config, FabricContext context)
      : name_(std::move(name)), config_(config), context_(std::move(context)) {}

  virtual Result<std::unique_ptr<ListenComm>> DoListen(int dev) = 0;
  virtual Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) = 0;
  // Waits before the next connection attempt; the default sleeps with a growing backoff
  // (at most 10 ms, never past the deadline). Backends with a pollable handshake override it.
  virtual Status DoWaitConnectable(int dev, const Handle& handle, Deadline deadline, int attempt);
  virtual Result<Handle> DoForward(std::span<const Hop> hops, const Handle& target) const;
  virtual Result<std::unique_ptr<SendComm>> DoConnectBack(int dev, const Handle& handle, RecvComm& from);
  virtual bool DoConnectsBack(int /*dev*/) const { return false; }

  std::vector<FabricDeviceProperties> devices_;  // set by the backend's constructor
  int default_rank_ = kRankNative;               // set by the backend's constructor

 private:
  Status CheckDevice(int dev) const;
  std::string name_;
  const Config* config_;  // outlives the fabric (owned by whoever created the registry)
  FabricContext context_;
};

}  // namespace kizuna::fabric
