// The libfabric side of one connection end (or of a listener): an RDM endpoint with its own
// completion queue and address vector, the operations in flight on it, a small registered arena
// for control messages, and how the end learns that its peer went away.
//
// One endpoint per comm (rather than one per device shared by tags) keeps comms independent:
// each has its own completion queue to poll and to block on, so comms used by different threads
// never contend, and closing a comm closes its endpoint, which the peer's provider notices.
//
// Peers that vanish without a word are noticed three ways (PeerWatch):
//  - in this process: the peer endpoint's EndpointLife (closed under its lock, see below);
//  - on this host: a pidfd of the peer process, readable once it has exited;
//  - elsewhere: the provider's connection errors, provoked by a probe message when a comm has
//    waited a while without hearing from its peer (transfer.h).
//
// In-process peers need more than notice: libfabric 1.17's shm provider shares one mapping of an
// endpoint's region between the endpoints of a process, so an endpoint that posts to, or merely
// progresses towards, a peer endpoint of its process that was closed dereferences freed memory
// (progressing the response to a message larger than shm's inject size is enough). Hence:
//  - every post towards an in-process peer happens under a shared lock of the peer's
//    EndpointLife, and fails as a connection error once `closed` is set (set under the
//    exclusive lock);
//  - an end whose in-process peer is still open is not closed when its comm goes: Link::Retire
//    marks it closed (its peer stops posting and breaks the connection) and keeps the endpoint,
//    with its operations, until the peer's endpoint has really been closed (`released`); the
//    second of the two to go closes for real and releases the first.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fabric/ofi/fabric.h"
#include "fabric/ofi/memory.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::ofi {

// ---- The process, as a peer sees it ----

struct ProcessIdentity {
  uint64_t nonce = 0;       // random per process (tells two processes with the same pid apart)
  uint64_t host = 0;        // hash of the kernel's boot id
  uint64_t pid_ns = 0;      // inode of the pid namespace
  uint64_t start_time = 0;  // the process's start time in clock ticks since boot
  uint32_t pid = 0;
  uint32_t reserved = 0;

  static const ProcessIdentity& Self();
  // Same kernel and pid namespace: the pid means the same process here.
  bool SameHostAs(const ProcessIdentity& o) const { return host != 0 && host == o.host && pid_ns == o.pid_ns; }
  bool SameProcessAs(const ProcessIdentity& o) const { return nonce == o.nonce && pid == o.pid; }
};
static_assert(sizeof(ProcessIdentity) == 40);

// ---- Endpoints of this process, for in-process peers ----

struct EndpointLife {
  std::shared_mutex mu;
  bool closed = false;  // guarded by mu: no more posts towards the endpoint (set when its comm goes)
  std::atomic<bool> released{false};  // the endpoint has been closed (fi_close returned)
};

enum class EndpointRole : uint8_t { kListener = 1, kSend = 2, kRecv = 3 };
struct LocalKey {
  uint64_t id = 0;  // a hash of a listener's address, or a connection's nonce
  EndpointRole role = EndpointRole::kListener;
};

// The live endpoints of this process by key, so that an in-process peer can hold their
// EndpointLife. Thread-safe.
class LocalEndpoints {
 public:
  static void Publish(LocalKey key, std::shared_ptr<EndpointLife> life);
  static void Withdraw(LocalKey key, const EndpointLife* life);
  static std::shared_ptr<EndpointLife> Find(LocalKey key);
};

// ---- How an end learns that its peer is gone ----

class PeerWatch {
 public:
  PeerWatch() = default;
  // For a peer process `peer`; `life` is the peer endpoint's when it is in this process (nullptr
  // when it is but has already closed: then the watch reports it gone at once).
  static PeerWatch For(const ProcessIdentity& peer, std::shared_ptr<EndpointLife> life);
  // A watch that knows only an in-process endpoint (the listener behind a handle).
  static PeerWatch InProcess(std::shared_ptr<EndpointLife> life);

  bool in_process() const { return in_process_; }
  // A pidfd that becomes readable when the peer process exits; -1 when there is none.
  int fd() const { return pidfd_.get(); }
  // True when the watch cannot see the peer's death itself (another host): probes are needed.
  bool blind() const { return !in_process_ && !pidfd_.valid() && !gone_; }
  // Ok while the peer may be alive; kRemoteError once it is known gone (checks the pidfd
  // without blocking).
  Status Check() const;
  // Holds off the in-process peer's close for the duration of a post; test closed() under it.
  std::shared_lock<std::shared_mutex> Guard() const;
  bool closed() const { return in_process_ && (life_ == nullptr || life_->closed); }
  // The in-process peer endpoint's life record (nullptr for other peers).
  const std::shared_ptr<EndpointLife>& life() const { return life_; }

 private:
  bool in_process_ = false;
  std::shared_ptr<EndpointLife> life_;
  UniqueFd pidfd_;
  uint32_t pid_ = 0;
  bool gone_ = false;  // the peer process had already exited when the watch was made
};

// ---- The endpoint ----

class Endpoint {
 public:
  // An enabled RDM endpoint on `device` with a completion queue of `cq_entries` (blocking
  // through a wait fd where the provider has one) and an address vector.
  static Result<std::unique_ptr<Endpoint>> Open(std::shared_ptr<OfiDevice> device, size_t cq_entries);
  // Closes the endpoint (under its life's exclusive lock), then the address vector and queue.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  OfiDevice& device() const { return *device_; }
  const std::shared_ptr<OfiDevice>& device_ptr() const { return device_; }
  const LibFabric& lib() const { return device_->lib(); }
  fid_ep* ep() const { return ep_; }
  fid_cq* cq() const { return cq_; }
  int wait_fd() const { return wait_fd_; }
  const std::shared_ptr<EndpointLife>& life() const { return life_; }
  // The endpoint's address (fi_getname), as peers insert it.
  const std::string& address() const { return address_; }
  // A printable form of an address of this provider (fi_av_straddr).
  std::string Describe(std::string_view address) const;
  // Inserts a peer's address; kInvalidArgument when the provider rejects it.
  Result<fi_addr_t> Insert(std::string_view address);
  // Publishes the endpoint for in-process peers until it closes.
  void Publish(LocalKey key);

 private:
  Endpoint() = default;
  std::shared_ptr<OfiDevice> device_;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;  // owned by the CQ
  std::string address_;
  std::shared_ptr<EndpointLife> life_ = std::make_shared<EndpointLife>();
  std::vector<LocalKey> published_;
};

// ---- Operations in flight ----

enum class OpKind : uint8_t { kMessageSend, kMessageRecv, kDataSend, kDataRecv, kWrite };

// One libfabric operation; libfabric hands `context` back in its completion, which is how the
// completion finds the operation. Owned by its Link; outlives the request it serves when that
// request is released first (a failed receive whose posted buffer is being cancelled).
struct FiOp {
  fi_context2 context;  // first member: &context == this
  OpKind kind = OpKind::kDataSend;
  void* owner = nullptr;  // the request served; nullptr once that request has been released
  int slot = -1;          // the arena slot of a message send / receive
  uint32_t piece = 0;     // a data send / receive: which piece of the message (transfer.h)
  bool live = false;
  std::shared_ptr<const void> hold;  // the registration's backing, until libfabric is done
};

// A small message on the control path (handshake and control messages), as received.
struct Message {
  std::span<const uint8_t> bytes;
  uint64_t tag = 0;
};

// What a Link reports while polling; implemented by listeners, pending connects and comms.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // A message arrived in an arena slot (the slot is reposted after this returns).
  virtual void OnMessage(const Message& message) = 0;
  // A data send / receive / write finished; `len` from the completion.
  virtual void OnOpDone(FiOp& op, size_t len) = 0;
  // An operation failed (`op` may be a message send, whose owner is null). `status` names the
  // provider's error; `connection` tells whether it means the peer is unreachable.
  virtual void OnOpFailed(FiOp& op, const Status& status, bool connection) = 0;
  // Remote CQ data of a write into this end (an immediate).
  virtual void OnImmediate(uint64_t data) = 0;
};

// The end of a connection: endpoint, operations, control arena, peer.
class Link {
 public:
  static constexpr size_t kSlotBytes = 256;

  // `recv_slots` arena slots receive small messages, `send_slots` send them.
  static Result<std::unique_ptr<Link>> Create(std::unique_ptr<Endpoint> endpoint, int recv_slots, int send_slots);
  // How an owner lets go of its link: closed at once, or — when its peer is an endpoint of this
  // process that is still open — marked closed and kept until that peer's endpoint is closed
  // (see the top of this file). Thread-safe.
  static void Retire(std::unique_ptr<Link> link);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  Endpoint& endpoint() const { return *endpoint_; }
  OfiDevice& device() const { return endpoint_->device(); }
  const LibFabric& lib() const { return endpoint_->lib(); }
  fi_addr_t peer() const { return peer_; }
  const PeerWatch& watch() const { return watch_; }
  void SetPeer(fi_addr_t peer, PeerWatch watch) {
    peer_ = peer;
    watch_ = std::move(watch);
  }

  FiOp* NewOp(OpKind kind, void* owner);
  void FreeOp(FiOp* op);
  // Requests cancellation of a posted receive; its completion (ECANCELED) frees it later.
  void Cancel(FiOp* op);

  // Posts a receive for a small message with this exact tag (from any source) in receive slots
  // [0, count) not yet posted; those slots are reposted with it after each message.
  Status PostMessageReceives(uint64_t tag, int count);
  // Queues a small message (<= kSlotBytes) to the peer; sent in queue order as send slots and
  // the provider allow (FlushMessages, also called by Poll).
  void QueueMessage(std::span<const uint8_t> bytes, uint64_t tag);
  // Sends what the queue holds. A connection error is returned (the peer is gone); a full
  // provider queue leaves the rest queued.
  Status FlushMessages();
  bool messages_queued() const { return !outbox_.empty(); }
  // Small messages posted and not yet completed.
  bool messages_in_flight() const { return static_cast<int>(free_send_slots_.size()) < send_slots_; }

  // Runs a post towards the peer (fi_tsend, fi_writedata, ...) under the peer's guard. Returns the
  // post's code; -FI_ENOTCONN when an in-process peer has closed.
  template <typename F>
  ssize_t PostToPeer(F&& post) {
    auto guard = watch_.Guard();
    if (watch_.closed()) return -FI_ENOTCONN;
    return post();
  }

  // Reads every completion there is and reports it to `sink`; returns how many were handled.
  // Only a failure to read the queue itself is an error.
  Result<int> Poll(CompletionSink& sink);
  // Blocks until the completion queue may have something, the peer watch fires, or
  // `limit` passes: false when the provider has no wait object (the caller sleeps instead).
  // `watch_peer`: also wake when the peer's pidfd fires.
  Result<bool> Block(Deadline limit, bool watch_peer = true);
  // Drives the provider's progress on every other open link of this process without taking any
  // completion from their queues. With manual progress a provider may still hold work for an
  // endpoint after the last completion its owner waited for (data a full socket refused,
  // deferred protocol messages), and that owner need never touch the comm again (it waits on
  // its receive comm instead). Waits call this before blocking, so such a tail leaves within one
  // bounded block. Thread-safe (the domains are FI_THREAD_SAFE; completions stay for their owners).
  void ProgressOthers() const;

  // The label's address part: "local -> peer".
  std::string DescribeAddresses(std::string_view peer_address) const;

 private:
  Link() = default;
  Status PostSlotReceive(int slot);
  // Poll's two kinds of entries. A failed completion (read here with fi_cq_readerr; false when
  // there is none to read), reported to its op's owner or, for a control message, dropped.
  bool OnFailedCompletion(CompletionSink& sink);
  // A completion: a control message to `sink` (its slot reposted), an op's end, an immediate.
  void OnCompletion(const fi_cq_tagged_entry& e, CompletionSink& sink);

  std::unique_ptr<Endpoint> endpoint_;
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  PeerWatch watch_;
  std::vector<std::unique_ptr<FiOp>> ops_;
  std::vector<FiOp*> free_ops_;
  // Message slots: [0, recv_slots) receive, the rest send.
  std::vector<uint8_t> arena_;
  std::unique_ptr<MemoryRegion> arena_mr_;  // when the provider needs local registration
  int recv_slots_ = 0;
  int send_slots_ = 0;
  int recv_active_ = 0;  // slots [0, recv_active_) are kept posted
  uint64_t recv_tag_ = 0;
  std::vector<bool> recv_posted_;
  std::vector<int> free_send_slots_;
  struct Outgoing {
    std::array<uint8_t, kSlotBytes> bytes;
    size_t size;
    uint64_t tag;
  };
  std::deque<Outgoing> outbox_;
};

// Converts a completion-queue error entry into a Status with the provider's own text.
Status CqError(const Endpoint& endpoint, const fi_cq_err_entry& err, std::string_view what);

}  // namespace kizuna::fabric::ofi
