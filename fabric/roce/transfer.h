// The roce comms: tagged send / receive and one-sided writes with immediate data over one RC
// queue pair per comm (qp.h).
//
// Send / receive is receiver-driven (as NCCL's IB transport): Recv sends the sender a post
// (receive id, tag, capacity, the buffer's address and rkey). The sender matches posts with its
// sends per tag, each in posting order, and moves the message with RDMA WRITEs (one per
// max_msg_sz of the port) straight from the send buffer into the receive buffer, followed by a done message (id, size)
// on the same queue pair — RC delivers the write's bytes before the done, so the receive completes on it with every
// byte in place, and the send completes when the done has been acknowledged. A message longer than the receive fails
// the send and, by a truncated message, the receive; both errors name both sizes and the connection stays usable.
// Nothing is staged (TransferStats::staged_bytes stays 0).
//
// Write: RDMA WRITE (WITH_IMM when there is an immediate) into a region the receiver exposed;
// the RemoteKey (40 bytes) holds the connection nonce, address, size and rkey with a checksum, so
// a key of another connection, garbage, or a range beyond the region is kInvalidArgument before
// anything is posted. Immediates arrive in posting order after their bytes (RC ordering).
//
// Progress happens in the caller's thread (posts, Test, waits). Waits spin briefly on the
// completion queue, then block in poll() on the completion channel and the handshake socket,
// bounded by the deadline and 100 ms.
//
// Failures: a completion in error (a QP in error, retry exceeded) fails every request of the comm
// and every later post with kRemoteError naming the peer rank and ibv_wc_status_str; the peer's
// socket reaching end of file (it closed the comm, or its process died) does the same once what
// it sent before has had 100 ms to arrive.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "fabric/fabric.h"
#include "fabric/roce/memory.h"
#include "fabric/roce/qp.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::roce {

// A one-sided write target (RecvComm::Expose) in its wire form.
struct KeyInfo {
  uint64_t nonce = 0;  // the connection's
  uint64_t addr = 0;   // the region's iova (its address at the exposing side)
  uint64_t size = 0;
  uint32_t rkey = 0;
};
RemoteKey EncodeKey(const KeyInfo& key);
// kInvalidArgument for a key that is not one of ours (size, magic, checksum).
Result<KeyInfo> ParseKey(const RemoteKey& key);

// A request of a roce comm.
class RoceRequest : public Request {
 public:
  RoceRequest(RequestKind kind, int tag, size_t size) : Request(kind, tag, size) {}
  enum class State { kPending, kDone, kFailed };
  uint64_t id = 0;
  State state = State::kPending;
  Status failure;
  size_t result = 0;            // bytes received / sent when done
  const void* data = nullptr;   // sends: the bytes to write
  uint32_t lkey = 0;
};

// What both comms share: the link, the live requests, the connection's failure.
class Connection {
 public:
  Connection(std::unique_ptr<Link> link, uint64_t nonce) : link_(std::move(link)), nonce_(nonce) {}
  Link& link() { return *link_; }
  uint64_t nonce() const { return nonce_; }

  Result<std::unique_ptr<Registration>> Register(const MemoryDescriptor& memory);
  uint64_t Track(RoceRequest* request);
  RoceRequest* Find(uint64_t id);
  void Complete(uint64_t id, size_t size);
  void FailRequest(uint64_t id, Status status);
  // Progresses the link and updates `broken()`.
  void Progress(LinkSink& sink);
  Result<Completion> Report(RoceRequest& request);
  Status Wait(Deadline deadline, LinkSink& sink);
  // Non-ok once the connection is unusable (every pending request then fails with it).
  const Status& broken() const { return broken_; }
  void Break(Status status);
  void Destroy() { link_.reset(); }

 private:
  void UpdateBroken();
  std::unique_ptr<Link> link_;
  uint64_t nonce_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, RoceRequest*> live_;  // pending requests by id (owned by the base Comm)
  Status broken_;
};

class RoceSendComm : public SendComm, private LinkSink {
 public:
  RoceSendComm(std::string label, FabricDeviceProperties properties, std::unique_ptr<Link> link, uint64_t nonce);
  ~RoceSendComm() override;

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration&) override { return Status::Ok(); }
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;
  Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag, Registration* registration) override;
  Result<std::unique_ptr<Request>> DoWrite(const void* data, size_t size, Registration* registration,
                                           const RemoteKey& remote, uint64_t remote_offset,
                                           std::optional<uint32_t> immediate) override;

 private:
  void OnOpDone(uint64_t op) override;
  void OnCtrl(const CtrlMsg& msg) override;
  void OnImmediate(uint32_t value) override;
  // Matches posts with sends (queueing transfers), then posts what the send queue has room for.
  void Match();
  void Pump();

  // Bytes on their way to the peer, in posting order: a matched send (its data, then the done
  // message) or a one-sided write (its data, the immediate on the last work request). A transfer
  // larger than the port's max_msg_sz leaves as several RDMA writes.
  struct Transfer {
    uint64_t op = 0;
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    uint32_t lkey = 0;
    uint64_t remote = 0;
    uint32_t rkey = 0;
    uint64_t posted = 0;
    bool started = false;
    std::optional<uint32_t> immediate;
    std::optional<CtrlMsg> done;  // sends: the done message that follows the data
  };

  Connection conn_;
  std::map<int, std::deque<uint64_t>> sends_;  // unmatched sends per tag, in posting order
  std::map<int, std::deque<CtrlMsg>> posts_;   // unmatched receive posts per tag, in arrival order
  std::deque<Transfer> transfers_;
};

class RoceRecvComm : public RecvComm, private LinkSink {
 public:
  RoceRecvComm(std::string label, FabricDeviceProperties properties, std::unique_ptr<Link> link, uint64_t nonce);
  ~RoceRecvComm() override;

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration&) override { return Status::Ok(); }
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;
  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration* registration) override;
  Result<RemoteKey> DoExpose(Registration& registration) override;
  Result<std::optional<uint32_t>> DoPollImmediate() override;

 private:
  void OnOpDone(uint64_t) override {}
  void OnCtrl(const CtrlMsg& msg) override;
  void OnImmediate(uint32_t value) override;

  Connection conn_;
  std::deque<uint32_t> immediates_;
};

}  // namespace kizuna::fabric::roce
