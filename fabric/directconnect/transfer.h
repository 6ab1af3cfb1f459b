// Posting and completing transfers on a direct-connect connection (one channel, one socket).
//
// The protocol is receiver-driven, so that a message is only ever moved into a buffer that is
// waiting for it and no tag can block another:
//  1. Recv pushes a receive post (id, tag, capacity, and the receive buffer's region if the
//     peer may map it) onto the reverse ring.
//  2. The sender matches posts to sends per tag, each in posting order. A match is then moved
//     by exactly one of:
//       - direct:  the receive buffer is in a region the sender has mapped -> one copy into it,
//                  then a completion record;
//       - pull:    the send buffer is in a region the receiver has mapped -> a record telling the
//                  receiver to copy it out, acknowledged on the reverse ring;
//       - staged:  neither -> chunks through the forward ring (copied in by the sender, out by
//                  the receiver straight into the receive buffer).
//     A message longer than the receive fails both requests, naming both sizes.
//  3. One-sided writes go into a region the receiver exposed (RemoteKey): directly when the
//     sender has it mapped, otherwise staged through the ring; an immediate is queued for the
//     receiver after the bytes are in place. Writes keep their posting order with respect to each
//     other.
//  A receiver that cannot map a send buffer's region answers a pull with a refusal, and the
//  sender stages that message (and later ones from the region) instead.
//
// Progress happens in the caller's thread, inside posts, Test and Wait (as in NCCL's net
// plugins); there are no background threads. Wait blocks in Channel::Wait (eventfd + the
// socket) after a short spin.
//
// Failures: the peer closing its comm (a flag in the shared header) or its process dying (the
// socket hangs up) is noticed in progress; everything the peer published before is still
// consumed, then every request not done fails with kRemoteError naming the connection. A peer
// that writes invalid records fails the connection the same way ("protocol error").
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "fabric/directconnect/channel.h"
#include "fabric/directconnect/fabric.h"
#include "fabric/directconnect/memory.h"
#include "fabric/fabric.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::directconnect {

// What endpoint.cc hands to a comm it created.
struct ConnectionParts {
  std::unique_ptr<Channel> channel;
  UniqueFd socket;                     // non-blocking, connected
  uint64_t nonce = 0;                  // the connection's id (remote keys carry it)
  std::shared_ptr<LinkShaper> shaper;  // the sender's port (null on the receiving side)
  std::string label;
  FabricDeviceProperties properties;
  double io_timeout_s = 600;
};

// The connection state both sides share: channel, socket, the peer's regions, peer liveness.
class Link {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Link(ConnectionParts& parts);
  ~Link();

  Channel& channel() { return *channel_; }
  int socket() const { return socket_.get(); }
  uint64_t nonce() const { return nonce_; }
  const std::string& label() const { return label_; }

  // Why the connection is unusable, once it is (peer closed or died, protocol error); ok before.
  const Status& broken() const { return broken_; }
  // Marks the connection broken (first reason wins).
  void Break(Status why);
  // Whether the peer has gone (flag or hang-up) — its published records may still be pending.
  bool peer_gone() const { return peer_gone_; }
  // Checks the peer's closed flag, and the socket: always when `poll_socket`, else every so often.
  Status CheckPeer(bool poll_socket);
  // Reads every message waiting on the socket without blocking (a message that has started is
  // read to its end, bounded by the I/O timeout).
  Status PumpSocket();
  // The peer's region `id`, reading the socket until it arrives (the peer sends a region's
  // message before any record naming it, so this waits only for the kernel). kRemoteError
  // when the peer goes away first. The sender maps the receiver's regions writable, the
  // receiver the sender's read-only.
  Result<const PeerRegions::Region*> AwaitRegion(uint64_t id);
  // Offers a registration's fd to the peer (kRegionAdd); marks it offered.
  Status OfferRegion(DcRegistration& registration);
  Status WithdrawRegion(const DcRegistration& registration);

  // Blocks until the channel's event counter moves past `seen`, the socket stirs, `wake_at`, or
  // the deadline. Pumps the socket when it is readable.
  Status Wait(uint64_t seen, Deadline deadline, std::optional<Clock::time_point> wake_at);

  Deadline IoDeadline() const { return Deadline::AfterSeconds(io_timeout_s_); }

 private:
  Status ReadOneSocketMessage();

  std::unique_ptr<Channel> channel_;
  UniqueFd socket_;
  uint64_t nonce_;
  std::string label_;
  double io_timeout_s_;
  PeerRegions peer_regions_;
  bool peer_gone_ = false;
  Status broken_;
  uint32_t idle_checks_ = 0;
  std::string reject_reason_;
};

class DcSendComm final : public SendComm {
 public:
  explicit DcSendComm(ConnectionParts parts);
  ~DcSendComm() override;

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
  struct Op;
  struct Post {  // a receive post from the peer
    uint64_t recv_id = 0;
    uint64_t capacity = 0;
    uint64_t region = 0;  // 0: not in a region the peer offered
    uint64_t offset = 0;
  };
  // Runs the protocol as far as it can without blocking; true when anything changed. A failure
  // breaks the connection and fails every request not done (reported through Test).
  bool Progress();
  Result<bool> DrainPosts();
  Result<bool> RunOutbound();
  // Pushes as much of `op` as the ring takes; true when op has nothing left to push. One step per
  // path (Op::Path), each as Advance.
  Result<bool> Advance(Op& op);
  Result<bool> AdvanceTooBig(Op& op);  // tells the receiver its receive is too small
  Result<bool> AdvanceDirect(Op& op);  // copies into the receive's region, else the pull or staged path
  Result<bool> AdvancePull(Op& op);    // asks the receiver to copy from this side's region
  Result<bool> AdvanceStaged(Op& op);  // through the ring
  Result<bool> AdvanceWrite(Op& op);   // a one-sided write: into the exposed region, else through the ring
  Result<bool> Push(const RecordHeader& header, const void* payload = nullptr, size_t payload_bytes = 0) {
    return link_.channel().TryPush(header, payload, payload_bytes);
  }
  void Match(Op& op, const Post& post);
  void FailAll(const Status& why);
  std::optional<Link::Clock::time_point> NextWake() const;

  Link link_;
  std::shared_ptr<LinkShaper> shaper_;
  uint64_t next_region_ = 1;
  std::unordered_map<int, std::deque<Op*>> unmatched_sends_;
  std::unordered_map<int, std::deque<Post>> unmatched_posts_;
  std::deque<Op*> outbound_;                      // matched sends and writes, in order
  std::unordered_map<uint64_t, Op*> awaiting_pull_;  // by the peer's receive id
  std::unordered_map<const Request*, Op*> ops_;      // every live op
};

class DcRecvComm final : public RecvComm {
 public:
  explicit DcRecvComm(ConnectionParts parts);
  ~DcRecvComm() override;

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration& registration) override;
  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration* registration) override;
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;
  Result<RemoteKey> DoExpose(Registration& registration) override;
  Result<std::optional<uint32_t>> DoPollImmediate() override;

 private:
  struct Op;
  struct Immediate {
    uint32_t value = 0;
    Link::Clock::time_point deliver_at{};
  };
  bool Progress();  // as DcSendComm::Progress
  // Handles the record at the head of the forward ring; false when it must wait (reverse ring
  // full for an acknowledgement).
  Result<bool> Handle(const RecordHeader& record);
  // Handle's larger cases: a chunk of a staged message, a pull (copy from the sender's region, then
  // acknowledge), a chunk of a one-sided write.
  Result<bool> HandleData(const RecordHeader& record);
  Result<bool> HandlePull(const RecordHeader& record);
  Result<bool> HandleWriteData(const RecordHeader& record);
  // Marks `op` received: `length` bytes, to be delivered at `deliver_ns` (ToNs).
  void Complete(Op* op, uint64_t length, uint64_t deliver_ns);
  Result<Op*> FindOp(uint64_t recv_id, std::string_view record);
  void FailAll(const Status& why);
  std::optional<Link::Clock::time_point> NextWake() const;

  Link link_;
  uint64_t next_region_ = 1;
  uint64_t next_recv_id_ = 1;
  std::unordered_map<uint64_t, Op*> posted_;      // by receive id
  std::unordered_map<const Request*, Op*> ops_;   // every live op
  std::unordered_map<uint64_t, DcRegistration*> exposed_;  // by region id
  std::deque<Immediate> immediates_;
};

}  // namespace kizuna::fabric::directconnect
