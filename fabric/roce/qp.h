// One RC queue pair with its completion queue, completion channel and control buffers: the
// transport under one roce comm (transfer.h), plus the TCP socket of its handshake, kept open as
// the peer's liveness signal (endpoint.h).
//
// Queue pair life: Create (RESET -> INIT, control receive buffers posted) -> Connect with the
// peer's number, PSN, GID and MTU (INIT -> RTR -> RTS, with a global route header: RoCE has no
// LIDs, so every packet carries the GRH with the peer's GID, our GID index, the traffic class and
// hop limit; path MTU = the smaller of the two ports' active MTUs).
//
// Work requests: control messages (CtrlMsg) are SENDs from a ring of registered slots into the
// peer's posted receive slots; data moves with RDMA WRITE (WITH_IMM for immediates). Every work
// request is signaled, so a completion frees one send queue entry; a completion in error breaks
// the link (the first error is kept, flushes after it are not reported again).
//
// Not thread-safe: used by its comm's thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/roce/fabric.h"
#include "fabric/roce/gid.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::roce {

// What the two ends of a connection exchange to connect their queue pairs.
struct QpInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;   // 24 bits
  GidBytes gid{};
  uint8_t mtu = 0;    // the port's active MTU (IBV_MTU_*)
};

// A control message (fixed size; fields unused by a kind are 0).
enum class CtrlKind : uint32_t {
  kPost = 1,       // receiver -> sender: receive `id` for `tag`, `size` bytes at `addr` / `rkey`
  kDone = 2,       // sender -> receiver: receive `id` holds a message of `size` bytes
  kTruncated = 3,  // sender -> receiver: the message for receive `id` had `size` bytes, too long
};
struct CtrlMsg {
  uint32_t kind = 0;
  uint32_t id = 0;
  int32_t tag = 0;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
};
static_assert(sizeof(CtrlMsg) == 32);

// Receives what a link's completions mean.
class LinkSink {
 public:
  virtual ~LinkSink() = default;
  virtual void OnOpDone(uint64_t op) = 0;           // a user work request completed
  virtual void OnCtrl(const CtrlMsg& msg) = 0;      // a control message arrived
  virtual void OnImmediate(uint32_t value) = 0;     // an RDMA write with immediate arrived
};

class Link {
 public:
  // Control buffers: receive slots posted at all times, and send slots.
  static constexpr int kRecvSlots = 2 * kMaxRequests + 32;
  static constexpr int kSendSlots = 2 * kMaxRequests + 16;

  // A queue pair in INIT with its receive slots posted. `label` and `peer_rank` name the
  // connection in errors.
  static Result<std::unique_ptr<Link>> Create(std::shared_ptr<RoceDevice> device, std::string label, int peer_rank);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  QpInfo local() const { return local_; }
  // INIT -> RTR -> RTS towards `remote`.
  Status Connect(const QpInfo& remote);
  void set_label(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }
  int peer_rank() const { return peer_rank_; }
  RoceDevice& device() { return *device_; }
  const std::shared_ptr<RoceDevice>& device_ptr() const { return device_; }

  // The handshake socket (liveness; on the accepting side also the peer's "ready").
  void AdoptSocket(UniqueFd socket, bool ready);
  bool ready() const { return ready_; }
  // When the peer's socket reached end of file (it closed its comm or died); nullopt while open.
  std::optional<std::chrono::steady_clock::time_point> peer_gone() const { return peer_gone_; }

  // Queues a control message; it leaves once the peer is ready and a slot and a send queue
  // entry are free. `op` (nonzero) is reported to OnOpDone when the message has been delivered.
  void PostCtrl(const CtrlMsg& msg, uint64_t op = 0);
  // Whether an RDMA write can be posted now (leaving room for the queued control messages).
  bool CanPostWrite() const;
  // RDMA WRITE (with `immediate`: WRITE_WITH_IMM) of [local, local + size) with `lkey` to
  // `remote_addr` / `rkey`. `op` nonzero: reported to OnOpDone on completion.
  Status PostWrite(uint64_t op, const void* local, size_t size, uint32_t lkey, uint64_t remote_addr, uint32_t rkey,
                   std::optional<uint32_t> immediate);

  // Drains the completion queue and the socket, reporting to `sink`; returns how many
  // completions were handled. Never blocks.
  int Progress(LinkSink& sink) { return Progress(sink, /*read_socket=*/true); }
  // Spins briefly, then blocks on the completion channel and the socket until something may
  // have happened, the deadline, or at most 100 ms. Reports to `sink` what it finds.
  Status Wait(Deadline deadline, LinkSink& sink);

  // The first failure of the link (a completion in error, a failed post); ok while healthy.
  const Status& failure() const { return failure_; }

 private:
  Link() = default;
  void Fail(Status status);
  void FlushBacklog();
  Status PostCtrlNow(const CtrlMsg& msg, uint64_t op);
  Status PostRecvSlot(int slot);
  void HandleCompletion(const ibv_wc& wc, LinkSink& sink);
  void ReadSocket();
  int Progress(LinkSink& sink, bool read_socket);

  std::shared_ptr<RoceDevice> device_;
  std::string label_;
  int peer_rank_ = -1;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* ctrl_mr_ = nullptr;
  std::vector<CtrlMsg> ctrl_;  // kRecvSlots receive slots, then kSendSlots send slots
  std::vector<int> free_send_slots_;
  std::vector<uint64_t> send_slot_op_;  // per send slot: the op to report when it completes
  int send_queue_free_ = 0;
  QpInfo local_;
  bool connected_ = false;
  std::deque<std::pair<CtrlMsg, uint64_t>> backlog_;
  UniqueFd socket_;
  bool ready_ = false;
  std::optional<std::chrono::steady_clock::time_point> peer_gone_;
  Status failure_;
};

}  // namespace kizuna::fabric::roce
