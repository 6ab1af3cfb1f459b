#include "fabric/roce/qp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::roce {
namespace {

constexpr uint64_t kRecvSlotBit = uint64_t{1} << 63;
constexpr uint64_t kSendSlotBit = uint64_t{1} << 62;
constexpr int kSendQueueDepth = 4 * kMaxRequests + 64;
// How long a wait polls the completion queue before blocking on the channel. Waking from the
// channel costs an interrupt and a thread wake-up (several times the 8-byte latency of busy
// polling in the Soft-RoCE VM: docs/PERFORMANCE.md, "RoCE over Soft-RoCE"); 100 us covers tens of round trips
// on RoCE hardware (a few us each), so a transfer in flight completes without sleeping, while a
// comm that waits for a slow peer blocks after 100 us and costs no CPU (cuda/stream.cc spins 200 us,
// directconnect 10 us).
constexpr auto kSpin = std::chrono::microseconds(100);
constexpr auto kMaxBlock = std::chrono::milliseconds(100);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

std::string_view OpName(uint64_t wr_id) {
  if ((wr_id & kRecvSlotBit) != 0) return "receive of a control message";
  if ((wr_id & kSendSlotBit) != 0) return "send of a control message";
  return "RDMA write";
}

}  // namespace

Result<std::unique_ptr<Link>> Link::Create(std::shared_ptr<RoceDevice> device, std::string label, int peer_rank) {
  std::unique_ptr<Link> link(new Link());
  link->device_ = std::move(device);
  link->label_ = std::move(label);
  link->peer_rank_ = peer_rank;
  RoceDevice& d = *link->device_;
  const IbVerbs& lib = d.lib();
  if (d.max_qp_wr() > 0 && (d.max_qp_wr() < kSendQueueDepth || d.max_qp_wr() < kRecvSlots))
    return NotSupported(fmt::format("roce {}: queue pairs hold at most {} work requests, {} needed", d.name(),
                                    d.max_qp_wr(), std::max(kSendQueueDepth, kRecvSlots)));

  link->channel_ = lib.create_comp_channel(d.context());
  if (link->channel_ == nullptr) return lib.Error(errno, "ibv_create_comp_channel");
  const int flags = ::fcntl(link->channel_->fd, F_GETFL);
  if (flags < 0 || ::fcntl(link->channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return FromErrno(errno, "fcntl(completion channel, O_NONBLOCK)");
  link->cq_ = lib.create_cq(d.context(), kSendQueueDepth + kRecvSlots, nullptr, link->channel_, 0);
  if (link->cq_ == nullptr) return lib.Error(errno, "ibv_create_cq");

  ibv_qp_init_attr init{};
  init.send_cq = link->cq_;
  init.recv_cq = link->cq_;
  init.cap.max_send_wr = kSendQueueDepth;
  init.cap.max_recv_wr = kRecvSlots;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 1;
  link->qp_ = lib.create_qp(d.pd(), &init);
  if (link->qp_ == nullptr) return lib.Error(errno, "ibv_create_qp(RC)");
  link->send_queue_free_ = kSendQueueDepth;

  link->ctrl_.resize(kRecvSlots + kSendSlots);
  link->ctrl_mr_ = lib.reg_mr_iova2(d.pd(), link->ctrl_.data(), link->ctrl_.size() * sizeof(CtrlMsg),
                                    reinterpret_cast<uintptr_t>(link->ctrl_.data()), IBV_ACCESS_LOCAL_WRITE);
  if (link->ctrl_mr_ == nullptr) return lib.Error(errno, "ibv_reg_mr(control buffers)");
  link->send_slot_op_.assign(kSendSlots, 0);
  for (int s = kSendSlots - 1; s >= 0; --s) link->free_send_slots_.push_back(s);

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = d.port();
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (const int rc = lib.modify_qp(link->qp_, &attr,
                                   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0)
    return lib.Error(rc, "ibv_modify_qp(INIT)");
  for (int s = 0; s < kRecvSlots; ++s) KZ_RETURN_IF_ERROR(link->PostRecvSlot(s));

  KZ_ASSIGN_OR_RETURN(const uint32_t psn, RandomValue<uint32_t>());
  link->local_.qpn = link->qp_->qp_num;
  link->local_.psn = psn & 0xffffff;
  link->local_.gid = d.gid().gid;
  link->local_.mtu = static_cast<uint8_t>(d.active_mtu());
  return link;
}

Link::~Link() {
  if (device_ == nullptr) return;
  const IbVerbs& lib = device_->lib();
  if (qp_ != nullptr) lib.destroy_qp(qp_);
  if (ctrl_mr_ != nullptr) lib.dereg_mr(ctrl_mr_);
  if (cq_ != nullptr) lib.destroy_cq(cq_);
  if (channel_ != nullptr) lib.destroy_comp_channel(channel_);
}

Status Link::Connect(const QpInfo& remote) {
  const IbVerbs& lib = device_->lib();
  const QpSettings& s = device_->settings();
  const int mtu = std::min<int>(local_.mtu, remote.mtu);
  if (MtuBytes(mtu) == 0)
    return InvalidArgument(fmt::format("{}: the peer's MTU enumeration {} is not a verbs MTU", label_, remote.mtu));

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(mtu);
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn & 0xffffff;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = s.min_rnr_timer;
  attr.ah_attr.is_global = 1;  // RoCE: every packet carries the global route header
  std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
  attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->gid().index);
  attr.ah_attr.grh.hop_limit = s.hop_limit;
  attr.ah_attr.grh.traffic_class = s.traffic_class;
  attr.ah_attr.grh.flow_label = 0;
  attr.ah_attr.dlid = 0;
  attr.ah_attr.sl = s.service_level;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = device_->port();
  if (const int rc = lib.modify_qp(qp_, &attr,
                                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0)
    return lib.Error(rc, fmt::format("ibv_modify_qp(RTR) towards rank {} (GID {}, QP {:#x})", peer_rank_,
                                     GidToString(remote.gid), remote.qpn));

  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = s.timeout;
  attr.retry_cnt = s.retry_count;
  attr.rnr_retry = s.rnr_retry;
  attr.sq_psn = local_.psn;
  attr.max_rd_atomic = 1;
  if (const int rc = lib.modify_qp(qp_, &attr,
                                   IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                       IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0)
    return lib.Error(rc, fmt::format("ibv_modify_qp(RTS) towards rank {}", peer_rank_));
  connected_ = true;
  KZ_TRACE(kLogFabric, "{}: QP {:#x} (PSN {:#x}) connected to rank {}'s QP {:#x} (PSN {:#x}, GID {}), MTU {}",
           label_, local_.qpn, local_.psn, peer_rank_, remote.qpn, remote.psn, GidToString(remote.gid),
           MtuBytes(mtu));
  return Status::Ok();
}

void Link::AdoptSocket(UniqueFd socket, bool ready) {
  socket_ = std::move(socket);
  ready_ = ready;
}

void Link::Fail(Status status) {
  if (!failure_.ok()) return;
  KZ_INFO(kLogFabric, "{}: {}", label_, status.ToString());
  failure_ = std::move(status);
}

Status Link::PostRecvSlot(int slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(&ctrl_[static_cast<size_t>(slot)]);
  sge.length = sizeof(CtrlMsg);
  sge.lkey = ctrl_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = kRecvSlotBit | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) return device_->lib().Error(rc, "ibv_post_recv");
  return Status::Ok();
}

Status Link::PostCtrlNow(const CtrlMsg& msg, uint64_t op) {
  const int slot = free_send_slots_.back();
  CtrlMsg& buf = ctrl_[static_cast<size_t>(kRecvSlots + slot)];
  buf = msg;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(&buf);
  sge.length = sizeof(CtrlMsg);
  sge.lkey = ctrl_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = kSendSlotBit | static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0)
    return device_->lib().Error(rc, "ibv_post_send(control message)");
  free_send_slots_.pop_back();
  send_slot_op_[static_cast<size_t>(slot)] = op;
  --send_queue_free_;
  return Status::Ok();
}

void Link::PostCtrl(const CtrlMsg& msg, uint64_t op) {
  backlog_.emplace_back(msg, op);
  FlushBacklog();
}

void Link::FlushBacklog() {
  while (!backlog_.empty() && ready_ && connected_ && failure_.ok() && !free_send_slots_.empty() &&
         send_queue_free_ > 0) {
    Status s = PostCtrlNow(backlog_.front().first, backlog_.front().second);
    if (!s.ok()) {
      Fail(RemoteError(fmt::format("{}: posting to rank {} failed: {}", label_, peer_rank_, s.message())));
      return;
    }
    backlog_.pop_front();
  }
}

bool Link::CanPostWrite() const {
  return ready_ && connected_ && failure_.ok() && send_queue_free_ >= 2 + static_cast<int>(backlog_.size());
}

Status Link::PostWrite(uint64_t op, const void* local, size_t size, uint32_t lkey, uint64_t remote_addr, uint32_t rkey,
                       std::optional<uint32_t> immediate) {
  if (!failure_.ok()) return failure_;
  if (op >= kSendSlotBit) return Internal(fmt::format("{}: operation id {:#x} out of range", label_, op));
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(local);
  sge.length = static_cast<uint32_t>(size);
  sge.lkey = lkey;
  ibv_send_wr wr{};
  wr.wr_id = op;
  wr.sg_list = size > 0 ? &sge : nullptr;
  wr.num_sge = size > 0 ? 1 : 0;
  wr.opcode = immediate.has_value() ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (immediate.has_value()) wr.imm_data = htonl(*immediate);
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
    Status s = device_->lib().Error(rc, "ibv_post_send(RDMA write)");
    Fail(RemoteError(fmt::format("{}: posting to rank {} failed: {}", label_, peer_rank_, s.message())));
    return failure_;
  }
  --send_queue_free_;
  return Status::Ok();
}

void Link::HandleCompletion(const ibv_wc& wc, LinkSink& sink) {
  const bool recv = (wc.wr_id & kRecvSlotBit) != 0;
  if (!recv) ++send_queue_free_;
  if ((wc.wr_id & kSendSlotBit) != 0) {
    const int slot = static_cast<int>(wc.wr_id & ~kSendSlotBit);
    free_send_slots_.push_back(slot);
    const uint64_t op = std::exchange(send_slot_op_[static_cast<size_t>(slot)], 0);
    if (wc.status == IBV_WC_SUCCESS && op != 0) sink.OnOpDone(op);
  }
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status == IBV_WC_WR_FLUSH_ERR && !failure_.ok()) return;
    Fail(RemoteError(fmt::format("{}: connection to rank {} broken: {} failed: {} (status {}, vendor error {:#x})",
                                 label_, peer_rank_, OpName(wc.wr_id), device_->lib().WcStatus(wc.status),
                                 static_cast<int>(wc.status), wc.vendor_err)));
    return;
  }
  if (recv) {
    const int slot = static_cast<int>(wc.wr_id & ~kRecvSlotBit);
    const CtrlMsg msg = ctrl_[static_cast<size_t>(slot)];
    if (Status s = PostRecvSlot(slot); !s.ok()) {
      Fail(RemoteError(fmt::format("{}: reposting a receive failed: {}", label_, s.message())));
      return;
    }
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      sink.OnImmediate(ntohl(wc.imm_data));
    } else if (wc.byte_len == sizeof(CtrlMsg)) {
      sink.OnCtrl(msg);
    } else {
      Fail(RemoteError(fmt::format("{}: rank {} sent a control message of {} bytes (expected {})", label_, peer_rank_,
                                   wc.byte_len, sizeof(CtrlMsg))));
    }
    return;
  }
  if ((wc.wr_id & kSendSlotBit) == 0 && wc.wr_id != 0) sink.OnOpDone(wc.wr_id);
}

void Link::ReadSocket() {
  if (!socket_.valid() || peer_gone_.has_value()) return;
  char buf[16];
  while (true) {
    const ssize_t n = ::recv(socket_.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      if (std::memchr(buf, 'R', static_cast<size_t>(n)) != nullptr) ready_ = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    peer_gone_ = std::chrono::steady_clock::now();
    KZ_INFO(kLogFabric, "{}: rank {} closed the connection ({})", label_, peer_rank_,
            n == 0 ? "end of file" : std::strerror(errno));
    return;
  }
}

int Link::Progress(LinkSink& sink, bool read_socket) {
  int handled = 0;
  ibv_wc wcs[32];
  while (true) {
    const int n = ibv_poll_cq(cq_, 32, wcs);
    if (n < 0) {
      Fail(Internal(fmt::format("{}: ibv_poll_cq failed ({})", label_, n)));
      break;
    }
    for (int i = 0; i < n; ++i) HandleCompletion(wcs[i], sink);
    handled += n;
    if (n < 32) break;
  }
  if (read_socket) {
    const bool was_ready = ready_, was_gone = peer_gone_.has_value();
    ReadSocket();
    if (ready_ != was_ready || peer_gone_.has_value() != was_gone) ++handled;
  }
  FlushBacklog();
  return handled;
}

Status Link::Wait(Deadline deadline, LinkSink& sink) {
  // The spin polls the completion queue only (no socket syscall per round).
  const auto spin_end = std::min(std::chrono::steady_clock::now() + kSpin, deadline.when());
  for (int i = 0;; ++i) {
    if (Progress(sink, /*read_socket=*/false) > 0) return Status::Ok();
    if (i % 16 == 15 && std::chrono::steady_clock::now() >= spin_end) break;
    CpuRelax();
  }
  if (!failure_.ok()) return Status::Ok();  // nothing will complete: the caller sees the failure
  if (const int rc = ibv_req_notify_cq(cq_, 0); rc != 0) return device_->lib().Error(rc, "ibv_req_notify_cq");
  if (Progress(sink) > 0) return Status::Ok();  // arrived between the last poll and arming
  pollfd fds[2] = {{channel_->fd, POLLIN, 0}, {socket_.get(), POLLIN, 0}};
  const nfds_t nfds = socket_.valid() && !peer_gone_.has_value() ? 2 : 1;
  auto block = std::min<std::chrono::nanoseconds>(deadline.Remaining(), kMaxBlock);
  if (peer_gone_.has_value()) block = std::min<std::chrono::nanoseconds>(block, std::chrono::milliseconds(10));
  const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(block).count());
  const int rc = ::poll(fds, nfds, ms);
  if (rc < 0 && errno != EINTR) return FromErrno(errno, "poll(completion channel)");
  if (rc > 0 && (fds[0].revents & POLLIN) != 0) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (device_->lib().get_cq_event(channel_, &cq, &context) == 0) device_->lib().ack_cq_events(cq, 1);
  }
  Progress(sink);
  return Status::Ok();
}

}  // namespace kizuna::fabric::roce
