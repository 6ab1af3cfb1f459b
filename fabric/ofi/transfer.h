// Posting and completing transfers on an ofi connection (one RDM endpoint at each end).
//
// The protocol is receiver-driven, as NCCL's own network transports are, so that a message only
// ever moves into a receive that is waiting for it and no tag can hold up another:
//  1. Recv posts a tagged receive for the message (tag: kData | connection | receive id) into the
//     user's buffer, then sends the sender a kPost control message (id, tag, capacity).
//  2. The sender takes posts in id order and matches them to its sends per tag, each in posting
//     order. A match moves straight from the send buffer into the receive buffer, no staging of
//     ours, in pieces: the receive posts one tagged receive per piece of its capacity (ids id,
//     id + 1, ...: a post takes RecvPieces ids), the sender one tagged send per piece of its
//     message, and a piece shorter than its receive ends the message (one of 0 bytes when the
//     message ends on a piece boundary before the receive does); the receive's remaining pieces
//     are then cancelled. Over ofi_rxm a piece is kRxmPieceBytes, within its eager limit as
//     kizuna sets it (loader.cc): rxm's rendezvous protocol, which larger messages would take,
//     can hang two endpoints that send large messages to each other at once (libfabric issue
//     10945). Other providers (shm) move a message as one piece. A message longer than the
//     receive fails the send and, by a kTruncated control message, the receive, both naming both
//     sizes; the receive's posted pieces are cancelled.
//  3. One-sided writes (where the provider has FI_RMA and remote CQ data) go straight into the
//     region the receiver exposed (RemoteKey: connection, memory key, base, size). An immediate
//     travels as the write's remote CQ data, which the provider reports after the write's bytes
//     are placed. On providers that do not order writes (FI_ORDER_WAW; shm) each write waits for
//     the previous one to be delivered (FI_DELIVERY_COMPLETE), so writes and immediates still
//     arrive in posting order.
//
// Progress happens in the caller's thread, inside posts, Test and the waits (libfabric's manual
// progress, as in NCCL's net plugins); there are no background threads. Waits spin briefly, then
// block on the completion queue's wait fd (and the peer's pidfd) where the provider has one, or
// sleep with a growing backoff (at most 1 ms) where it does not.
//
// Failures: a peer that closes its comm sends kClose; one that dies is noticed by its pidfd (same
// host), its EndpointLife (same process) or the provider's connection errors (elsewhere; a kProbe
// control message every second while requests wait makes the provider find out). Everything the
// peer published before is consumed, then every request not done fails with kRemoteError naming
// the connection; later posts fail the same way. A failed receive's buffer is withdrawn
// (fi_cancel) first; a failed send's or write's cannot be (libfabric has no such call): the
// provider may read it until it gives the operation up, at the latest when the comm is destroyed.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/ofi/link.h"
#include "fabric/ofi/memory.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::ofi {

// ---- Control messages (tag kind kControl) ----

enum class ControlType : uint16_t { kPost = 1, kTruncated = 2, kClose = 3, kProbe = 4 };

struct ControlMessage {
  uint32_t magic = 0;
  uint16_t type = 0;
  uint16_t reserved = 0;
  uint64_t nonce = 0;  // the connection's
  uint64_t id = 0;     // kPost, kTruncated: the receive's id
  uint64_t size = 0;   // kPost: the receive's capacity; kTruncated: the message's size
  int64_t tag = 0;     // kPost: the receive's tag
};
static_assert(sizeof(ControlMessage) == 40);
inline constexpr uint32_t kControlMagic = 0x434f'5a4b;  // "KZOC"

// ---- Pieces ----

// The largest piece of a message over ofi_rxm (2 MiB: FI_OFI_RXM_EAGER_LIMIT as kizuna sets it,
// loader.cc); other providers send a message whole (kWholeMessage). Both ends of a connection
// use one provider, hence one piece size.
inline constexpr uint64_t kRxmPieceBytes = uint64_t{2} << 20;
inline constexpr uint64_t kWholeMessage = UINT64_MAX;

// The receives posted for a receive of `capacity` bytes in pieces of `piece` bytes: one per
// piece (the last may be shorter; one of 0 bytes for a capacity of 0). Also the ids its post takes.
inline uint32_t RecvPieces(uint64_t capacity, uint64_t piece) {
  return capacity == 0 ? 1 : static_cast<uint32_t>((capacity - 1) / piece + 1);
}

// The sends for a message of `size` bytes into a receive of `capacity` (size <= capacity): the
// full pieces, then the rest. A piece shorter than its receive marks the end, so a message that
// ends on a piece boundary before the receive does (or is empty) ends with a piece of 0 bytes.
inline uint32_t SendPieces(uint64_t size, uint64_t capacity, uint64_t piece) {
  const bool tail = size % piece != 0 || size < capacity || size == 0;
  return static_cast<uint32_t>(size / piece + (tail ? 1 : 0));
}

// ---- Remote keys ----

struct WireKey {
  uint32_t magic = 0;
  uint32_t version = 0;
  uint64_t nonce = 0;  // the connection the region is exposed on
  uint64_t key = 0;    // the memory region's key
  uint64_t base = 0;   // what the peer's RMA names for offset 0
  uint64_t size = 0;
  uint64_t check = 0;  // a checksum of the fields above, so that garbage is refused
};
static_assert(sizeof(WireKey) <= kRemoteKeyMaxBytes);
inline constexpr uint32_t kKeyMagic = 0x4b4f'5a4b;  // "KZOK"

RemoteKey EncodeKey(WireKey key);
// kInvalidArgument when `key` is not an ofi remote key.
Result<WireKey> ParseKey(const RemoteKey& key);

// ---- Requests ----

class OfiRequest final : public Request {
 public:
  OfiRequest(RequestKind kind, int tag, size_t size) : Request(kind, tag, size) {}

  enum class State : uint8_t { kWaiting, kPosted, kDone, kFailed };
  State state = State::kWaiting;
  Status failure;
  size_t received = 0;     // receives: the message's length
  void* local = nullptr;   // where libfabric reads or writes (inside the registration's mapping)
  void* desc = nullptr;    // the registration's descriptor
  std::shared_ptr<const void> hold;  // the registration's backing (OfiRegistration::hold)
  uint64_t id = 0;         // the receive's id (receives; sends once matched): its first piece's
  std::vector<FiOp*> ops;  // the libfabric operations in flight (a message's pieces, a write)
  uint32_t pieces = 0;     // operations in all: receives posted; sends (once matched) and writes to post
  uint32_t issued = 0;     // sends and writes: operations posted so far
  uint32_t arrived = 0;    // receives: pieces arrived
  int64_t terminal = -1;   // receives: the piece that ended the message (shorter than its receive)
  // Writes.
  uint64_t remote_addr = 0;
  uint64_t remote_key = 0;
  std::optional<uint32_t> immediate;
};

// ---- What both ends share ----

// What endpoint.cc hands to a comm it created.
struct ConnectionParts {
  std::unique_ptr<Link> link;
  uint64_t nonce = 0;
  std::string label;
  FabricDeviceProperties properties;
  double io_timeout_s = 600;
  // Control messages that arrived in the same completion batch as the welcome (connecting side):
  // the comm handles them first.
  std::vector<std::vector<uint8_t>> early_messages;
};

// The connection state both comms keep: link, broken state, progress pacing, closing.
class Connection {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kProbeInterval = std::chrono::seconds(1);
  static constexpr auto kMaxBlock = std::chrono::milliseconds(100);
  static constexpr auto kMaxBackoff = std::chrono::milliseconds(1);
  static constexpr int kSpinPolls = 16;

  Connection(ConnectionParts& parts, CompletionSink& sink);
  ~Connection() { Link::Retire(std::move(link_)); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Link& link() { return *link_; }
  uint64_t nonce() const { return nonce_; }
  // The largest piece a message moves in (kRxmPieceBytes or kWholeMessage; see the top).
  uint64_t piece_bytes() const { return piece_bytes_; }
  uint64_t Tag(TagKind kind, uint32_t sequence) const { return link_->device().tags().Make(kind, nonce_, sequence); }

  // Why the connection is unusable, once it is; ok before.
  const Status& broken() const { return broken_; }
  void Break(Status why);
  void PeerClosed();

  // Polls completions, sends queued control messages, checks the peer; true when anything moved.
  bool Progress(bool requests_waiting);
  // Blocks (bounded) until something may have changed; `deferred`: posts wait for provider queue
  // room (sleep rather than block on the completion queue, which may stay quiet).
  Status Wait(Deadline deadline, bool deferred);

  void SendControl(ControlType type, uint64_t id = 0, uint64_t size = 0, int64_t tag = 0);
  // Decodes a control message of this connection; nullopt (logged) for anything else.
  std::optional<ControlMessage> Decode(const Message& message) const;

  // Sends kClose (unless the peer is known gone) and waits, briefly, until it has left.
  void Close();

  Result<std::unique_ptr<Registration>> Register(const MemoryDescriptor& memory);

 private:
  std::unique_ptr<Link> link_;
  CompletionSink& sink_;
  uint64_t nonce_;
  uint64_t piece_bytes_;
  std::string label_;
  double io_timeout_s_;
  Status broken_;
  bool peer_closed_ = false;
  // When the peer watch fired (process exited, in-process endpoint closed): the connection breaks
  // once nothing more has arrived for a short grace period.
  std::optional<Clock::time_point> exit_noticed_;
  std::string exit_reason_;
  uint64_t next_region_ = 1;
  int spins_ = 0;
  std::chrono::nanoseconds backoff_{std::chrono::microseconds(10)};
  Clock::time_point last_activity_ = Clock::now();
  Clock::time_point last_probe_ = Clock::now();
  Clock::time_point last_watch_check_{};
};

// ---- The comms ----

class OfiSendComm final : public SendComm, private CompletionSink {
 public:
  explicit OfiSendComm(ConnectionParts parts);
  ~OfiSendComm() override;

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration& registration) override;
  Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag,
                                          Registration* registration) override;
  Result<std::unique_ptr<Request>> DoWrite(const void* data, size_t size, Registration* registration,
                                           const RemoteKey& remote, uint64_t remote_offset,
                                           std::optional<uint32_t> immediate) override;
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;

 private:
  struct Post {
    uint64_t id = 0;
    uint64_t capacity = 0;
  };
  void OnMessage(const Message& message) override;
  void OnOpDone(FiOp& op, size_t len) override;
  void OnOpFailed(FiOp& op, const Status& status, bool connection) override;
  void OnImmediate(uint64_t data) override;

  void Progress();
  void Match(int tag);
  void IssueSends();
  void IssueWrites();
  void Fail(OfiRequest& r, Status why);
  void FailAll();
  bool deferred() const { return !outbound_sends_.empty() || !outbound_writes_.empty(); }

  Connection conn_;
  std::unordered_set<OfiRequest*> live_;
  std::unordered_map<int, std::deque<OfiRequest*>> unmatched_sends_;
  std::unordered_map<int, std::deque<Post>> unmatched_posts_;
  std::map<uint64_t, std::pair<int, uint64_t>> early_posts_;  // id -> (tag, capacity), ahead of order
  uint64_t next_post_ = 1;
  std::deque<OfiRequest*> outbound_sends_;   // matched, waiting for provider queue room
  std::deque<OfiRequest*> outbound_writes_;  // in posting order
  int writes_in_flight_ = 0;
};

class OfiRecvComm final : public RecvComm, private CompletionSink {
 public:
  explicit OfiRecvComm(ConnectionParts parts);
  ~OfiRecvComm() override;

  // For the listener, before it hands the comm out: progresses the welcome. Ok once it has left;
  // kUnavailable while it is leaving; kRemoteError when the peer went away.
  Status ProgressWelcome();

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration& registration) override;
  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration* registration) override;
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;
  Result<RemoteKey> DoExpose(Registration& registration) override;
  Result<std::optional<uint32_t>> DoPollImmediate() override;

 private:
  void OnMessage(const Message& message) override;
  void OnOpDone(FiOp& op, size_t len) override;
  void OnOpFailed(FiOp& op, const Status& status, bool connection) override;
  void OnImmediate(uint64_t data) override;

  void Progress();
  void Fail(OfiRequest& r, Status why);
  void FailAll();

  Connection conn_;
  std::unordered_set<OfiRequest*> live_;
  std::unordered_map<uint64_t, OfiRequest*> posted_;  // by receive id, until done or failed
  uint64_t next_recv_ = 1;
  std::deque<uint32_t> immediates_;
};

}  // namespace kizuna::fabric::ofi
