#include "fabric/ofi/transfer.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "fabric/ofi/endpoint.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::ofi {
namespace {

using Clock = std::chrono::steady_clock;

// How long a peer that has exited (or closed its endpoint in this process) without a close
// message is given for what it sent before to arrive, before its connection is declared broken.
constexpr auto kExitGrace = std::chrono::milliseconds(100);
// How often the peer watch is consulted during progress (a pidfd poll is a system call).
constexpr auto kWatchInterval = std::chrono::milliseconds(2);
// How long a closing comm waits for its close message to leave.
constexpr auto kCloseWait = std::chrono::milliseconds(500);

uint64_t KeyCheck(const WireKey& k) {
  uint64_t h = 0x6f66'695f'6b65'7973ull;  // mixed over every field but the check itself
  for (uint64_t v : {uint64_t{k.magic} << 32 | k.version, k.nonce, k.key, k.base, k.size}) {
    h ^= v;
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  return h;
}

template <typename T>
std::span<const uint8_t> Bytes(const T& v) {
  return {reinterpret_cast<const uint8_t*>(&v), sizeof(v)};
}

}  // namespace

// ---- Remote keys ----

RemoteKey EncodeKey(WireKey key) {
  key.magic = kKeyMagic;
  key.version = kProtocolVersion;
  key.check = KeyCheck(key);
  RemoteKey out;
  out.size = sizeof(key);
  std::memcpy(out.data.data(), &key, sizeof(key));
  return out;
}

Result<WireKey> ParseKey(const RemoteKey& remote) {
  if (remote.size != sizeof(WireKey))
    return InvalidArgument(fmt::format("ofi: a remote key of {} bytes is not an ofi key ({} bytes)", remote.size,
                                       sizeof(WireKey)));
  WireKey k;
  std::memcpy(&k, remote.data.data(), sizeof(k));
  if (k.magic != kKeyMagic || k.version != kProtocolVersion || k.check != KeyCheck(k))
    return InvalidArgument("ofi: the remote key is not a key from RecvComm::Expose of this fabric");
  return k;
}

// ---- Connection ----

Connection::Connection(ConnectionParts& parts, CompletionSink& sink)
    : link_(std::move(parts.link)),
      sink_(sink),
      nonce_(parts.nonce),
      piece_bytes_(link_->device().provider().find("ofi_rxm") != std::string::npos ? kRxmPieceBytes
                                                                                  : kWholeMessage),
      label_(parts.label),
      io_timeout_s_(parts.io_timeout_s) {}

void Connection::Break(Status why) {
  if (!broken_.ok()) return;
  broken_ = std::move(why);
  KZ_INFO(kLogFabric, "{}: connection broken: {}", label_, broken_.ToString());
}

void Connection::PeerClosed() {
  peer_closed_ = true;
  Break(RemoteError(fmt::format("{}: the peer closed the connection", label_)));
}

bool Connection::Progress(bool requests_waiting) {
  const auto now = Clock::now();
  bool any = false;
  if (auto polled = link_->Poll(sink_); !polled.ok()) {
    Break(polled.status().WithContext(label_));
  } else {
    any = *polled > 0;
  }
  if (broken_.ok()) {
    if (Status s = link_->FlushMessages(); !s.ok())
      Break(s.code() == StatusCode::kRemoteError
                ? RemoteError(fmt::format("{}: the peer is unreachable: {}", label_, s.message()))
                : s.WithContext(label_));
  }
  if (any) {
    last_activity_ = now;
    spins_ = 0;
    backoff_ = std::chrono::microseconds(10);
  }
  if (!broken_.ok()) return any;
  if (exit_noticed_.has_value()) {
    // What the peer sent before it went may still be arriving: wait for the stream to go quiet.
    if (any) exit_noticed_ = now;
    if (now - *exit_noticed_ > kExitGrace) Break(RemoteError(fmt::format("{}: {}", label_, exit_reason_)));
  } else if (now - last_watch_check_ >= kWatchInterval) {
    last_watch_check_ = now;
    if (Status s = link_->watch().Check(); !s.ok()) {
      exit_noticed_ = now;
      exit_reason_ = s.message();
    }
  }
  if (requests_waiting && link_->watch().blind() && now - last_activity_ > kProbeInterval &&
      now - last_probe_ > kProbeInterval) {
    // On another host only the provider can tell that the peer is gone, and only when asked to
    // move something: a small message every second while requests wait.
    last_probe_ = now;
    SendControl(ControlType::kProbe);
  }
  return any;
}

Status Connection::Wait(Deadline deadline, bool deferred) {
  if (spins_ < kSpinPolls) {
    ++spins_;
    std::this_thread::yield();
    return Status::Ok();
  }
  const Deadline limit = Deadline::At(std::min(deadline.when(), Clock::now() + kMaxBlock));
  // What this wait needs may be stuck in another comm's endpoint that its owner no longer drives.
  link_->ProgressOthers();
  if (!deferred && !link_->messages_queued()) {
    KZ_ASSIGN_OR_RETURN(bool blocked, link_->Block(limit, !exit_noticed_.has_value()));
    if (blocked) return Status::Ok();
  }
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(backoff_, limit.Remaining()));
  backoff_ = std::min<std::chrono::nanoseconds>(backoff_ * 2, kMaxBackoff);
  return Status::Ok();
}

void Connection::SendControl(ControlType type, uint64_t id, uint64_t size, int64_t tag) {
  ControlMessage m;
  m.magic = kControlMagic;
  m.type = static_cast<uint16_t>(type);
  m.nonce = nonce_;
  m.id = id;
  m.size = size;
  m.tag = tag;
  link_->QueueMessage(Bytes(m), Tag(TagKind::kControl, 0));
}

std::optional<ControlMessage> Connection::Decode(const Message& message) const {
  ControlMessage m;
  if (message.tag != Tag(TagKind::kControl, 0) || message.bytes.size() != sizeof(m)) {
    KZ_WARN(kLogFabric, "{}: dropped a {}-byte message that is not a control message", label_, message.bytes.size());
    return std::nullopt;
  }
  std::memcpy(&m, message.bytes.data(), sizeof(m));
  if (m.magic != kControlMagic || m.nonce != nonce_) {
    KZ_WARN(kLogFabric, "{}: dropped a control message of another connection", label_);
    return std::nullopt;
  }
  return m;
}

void Connection::Close() {
  if (peer_closed_ || exit_noticed_.has_value() || link_->watch().closed()) return;
  SendControl(ControlType::kClose);
  // Bounded: a peer that cannot take the message learns of the close from its provider instead.
  const Deadline until = Deadline::At(
      std::min(Clock::now() + kCloseWait,
               Deadline::AfterSeconds(io_timeout_s_).when()));
  while (!until.Expired()) {
    if (!link_->Poll(sink_).ok()) return;
    if (!link_->FlushMessages().ok()) return;
    if (!link_->messages_queued() && !link_->messages_in_flight()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Result<std::unique_ptr<Registration>> Connection::Register(const MemoryDescriptor& memory) {
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<OfiRegistration> reg,
                      OfiRegistration::Create(link_->device(), link_->endpoint().ep(), memory, next_region_++));
  return std::unique_ptr<Registration>(std::move(reg));
}

// ---- OfiSendComm ----

OfiSendComm::OfiSendComm(ConnectionParts parts) : SendComm(parts.label, parts.properties), conn_(parts, *this) {
  for (const std::vector<uint8_t>& m : parts.early_messages) OnMessage(Message{m, conn_.Tag(TagKind::kControl, 0)});
  Progress();
}

OfiSendComm::~OfiSendComm() { conn_.Close(); }

Result<std::unique_ptr<Registration>> OfiSendComm::DoRegister(const MemoryDescriptor& memory) {
  return conn_.Register(memory);
}

Status OfiSendComm::DoDeregister(Registration&) { return Status::Ok(); }

Result<std::unique_ptr<Request>> OfiSendComm::DoSend(const void* data, size_t size, int tag,
                                                     Registration* registration) {
  if (!conn_.broken().ok()) return conn_.broken();
  auto r = std::make_unique<OfiRequest>(RequestKind::kSend, tag, size);
  if (size > 0) {
    const auto& reg = static_cast<const OfiRegistration&>(*registration);
    r->local = reg.local(data);
    r->desc = reg.desc();
    r->hold = reg.hold();
  }
  live_.insert(r.get());
  unmatched_sends_[tag].push_back(r.get());
  Match(tag);
  Progress();  // issues the match, or sends what matching queued (a truncation notice)
  return std::unique_ptr<Request>(std::move(r));
}

Result<std::unique_ptr<Request>> OfiSendComm::DoWrite(const void* data, size_t size, Registration* registration,
                                                      const RemoteKey& remote, uint64_t remote_offset,
                                                      std::optional<uint32_t> immediate) {
  KZ_ASSIGN_OR_RETURN(WireKey key, ParseKey(remote));
  if (key.nonce != conn_.nonce())
    return InvalidArgument(fmt::format("{}: the remote key was exposed on another connection", label()));
  if (remote_offset > key.size || size > key.size - remote_offset)
    return InvalidArgument(fmt::format("{}: a write of {} bytes at offset {} exceeds the exposed region of {} bytes",
                                       label(), size, remote_offset, key.size));
  if (!conn_.broken().ok()) return conn_.broken();
  auto r = std::make_unique<OfiRequest>(RequestKind::kWrite, 0, size);
  if (size > 0) {
    const auto& reg = static_cast<const OfiRegistration&>(*registration);
    r->local = reg.local(data);
    r->desc = reg.desc();
    r->hold = reg.hold();
  }
  r->remote_addr = key.base + remote_offset;
  r->remote_key = key.key;
  r->immediate = immediate;
  live_.insert(r.get());
  outbound_writes_.push_back(r.get());
  Progress();
  return std::unique_ptr<Request>(std::move(r));
}

void OfiSendComm::Progress() {
  conn_.Progress(!live_.empty());
  if (conn_.broken().ok()) {
    IssueSends();
    IssueWrites();
  }
  if (!conn_.broken().ok()) FailAll();
}

void OfiSendComm::Match(int tag) {
  auto& sends = unmatched_sends_[tag];
  auto& posts = unmatched_posts_[tag];
  while (!sends.empty() && !posts.empty()) {
    OfiRequest* s = sends.front();
    const Post p = posts.front();
    sends.pop_front();
    posts.pop_front();
    if (s->size() > p.capacity) {
      Fail(*s, InvalidArgument(fmt::format("{}: a message of {} bytes is longer than the receive it matched ({} bytes, "
                                           "tag {})",
                                           label(), s->size(), p.capacity, tag)));
      conn_.SendControl(ControlType::kTruncated, p.id, s->size());
      continue;
    }
    s->id = p.id;
    s->pieces = SendPieces(s->size(), p.capacity, conn_.piece_bytes());
    outbound_sends_.push_back(s);
  }
}

void OfiSendComm::IssueSends() {
  Link& link = conn_.link();
  while (!outbound_sends_.empty() && conn_.broken().ok()) {
    OfiRequest* s = outbound_sends_.front();
    // Piece by piece (transfer.h); a request that failed meanwhile posts no more.
    while (s->issued < s->pieces && s->state != OfiRequest::State::kFailed) {
      const uint32_t piece = s->issued;
      const uint64_t offset = uint64_t{piece} * conn_.piece_bytes();  // piece > 0 only for finite pieces
      const size_t len = static_cast<size_t>(std::min<uint64_t>(conn_.piece_bytes(), s->size() - offset));
      FiOp* op = link.NewOp(OpKind::kDataSend, s);
      op->hold = s->hold;
      op->piece = piece;
      void* from = len > 0 ? static_cast<uint8_t*>(s->local) + offset : s->local;
      const uint64_t tag = conn_.Tag(TagKind::kData, static_cast<uint32_t>(s->id + piece));
      const ssize_t rc = link.PostToPeer(
          [&] { return fi_tsend(link.endpoint().ep(), from, len, s->desc, link.peer(), tag, &op->context); });
      if (rc == -FI_EAGAIN) {
        link.FreeOp(op);
        return;  // the provider's queue is full: Wait sleeps, progress retries
      }
      if (rc != 0) {
        link.FreeOp(op);
        const Status st = link.lib().Error(static_cast<int>(rc), "fi_tsend");
        if (st.code() == StatusCode::kRemoteError) {
          conn_.Break(RemoteError(fmt::format("{}: the peer is unreachable: {}", label(), st.message())));
          return;
        }
        Fail(*s, st.WithContext(label()));
        break;
      }
      s->ops.push_back(op);
      ++s->issued;
      s->state = OfiRequest::State::kPosted;
    }
    outbound_sends_.pop_front();
  }
}

void OfiSendComm::IssueWrites() {
  Link& link = conn_.link();
  const bool ordered = link.device().ordered_writes();
  while (!outbound_writes_.empty() && conn_.broken().ok()) {
    // Without write-after-write ordering, a write goes only once the previous one is delivered.
    if (!ordered && writes_in_flight_ > 0) return;
    OfiRequest* w = outbound_writes_.front();
    FiOp* op = link.NewOp(OpKind::kWrite, w);
    op->hold = w->hold;
    const ssize_t rc = link.PostToPeer([&]() -> ssize_t {
      fid_ep* ep = link.endpoint().ep();
      if (ordered) {
        if (w->immediate.has_value())
          return fi_writedata(ep, w->local, w->size(), w->desc, *w->immediate, link.peer(), w->remote_addr,
                              w->remote_key, &op->context);
        return fi_write(ep, w->local, w->size(), w->desc, link.peer(), w->remote_addr, w->remote_key, &op->context);
      }
      iovec iov{w->local, w->size()};
      void* desc = w->desc;
      fi_rma_iov rma{w->remote_addr, w->size(), w->remote_key};
      fi_msg_rma msg{&iov, &desc, 1, link.peer(), &rma, 1, &op->context, w->immediate.value_or(0)};
      return fi_writemsg(ep, &msg, FI_DELIVERY_COMPLETE | (w->immediate.has_value() ? FI_REMOTE_CQ_DATA : 0));
    });
    if (rc == -FI_EAGAIN) {
      link.FreeOp(op);
      return;
    }
    outbound_writes_.pop_front();
    if (rc != 0) {
      link.FreeOp(op);
      const Status st = link.lib().Error(static_cast<int>(rc), "fi_write");
      if (st.code() == StatusCode::kRemoteError) {
        conn_.Break(RemoteError(fmt::format("{}: the peer is unreachable: {}", label(), st.message())));
      } else {
        Fail(*w, st.WithContext(label()));
      }
      continue;
    }
    ++writes_in_flight_;
    w->ops.push_back(op);
    w->pieces = w->issued = 1;
    w->state = OfiRequest::State::kPosted;
  }
}

void OfiSendComm::OnMessage(const Message& message) {
  std::optional<ControlMessage> m = conn_.Decode(message);
  if (!m.has_value()) return;
  switch (static_cast<ControlType>(m->type)) {
    case ControlType::kPost: {
      if (m->id < next_post_ || early_posts_.count(m->id) != 0 || m->tag < INT_MIN || m->tag > INT_MAX) {
        conn_.Break(RemoteError(fmt::format("{}: protocol error: receive post {} (tag {}) out of sequence", label(),
                                            m->id, m->tag)));
        return;
      }
      early_posts_.emplace(m->id, std::make_pair(static_cast<int>(m->tag), m->size));
      // Posts are matched in the order the receiver made them, whatever order they arrive in.
      for (auto it = early_posts_.find(next_post_); it != early_posts_.end(); it = early_posts_.find(next_post_)) {
        const int tag = it->second.first;
        unmatched_posts_[tag].push_back(Post{it->first, it->second.second});
        next_post_ = it->first + RecvPieces(it->second.second, conn_.piece_bytes());  // an id per piece
        early_posts_.erase(it);
        Match(tag);
      }
      return;
    }
    case ControlType::kClose: conn_.PeerClosed(); return;
    case ControlType::kProbe: return;
    case ControlType::kTruncated: break;
  }
  KZ_WARN(kLogFabric, "{}: dropped an unexpected control message (type {})", label(), m->type);
}

void OfiSendComm::OnOpDone(FiOp& op, size_t) {
  if (op.kind == OpKind::kWrite) --writes_in_flight_;
  auto* r = static_cast<OfiRequest*>(op.owner);
  if (r == nullptr) return;
  std::erase(r->ops, &op);
  if (r->issued < r->pieces || !r->ops.empty()) return;  // pieces still to post or in flight
  r->state = OfiRequest::State::kDone;
  ++stats_.messages;
  stats_.bytes += r->size();
}

void OfiSendComm::OnOpFailed(FiOp& op, const Status& status, bool connection) {
  if (op.kind == OpKind::kWrite) --writes_in_flight_;
  if (connection) conn_.Break(RemoteError(fmt::format("{}: the peer is unreachable: {}", label(), status.message())));
  auto* r = static_cast<OfiRequest*>(op.owner);
  if (r == nullptr) return;
  std::erase(r->ops, &op);
  Fail(*r, connection ? conn_.broken() : status.WithContext(label()));
}

void OfiSendComm::OnImmediate(uint64_t) {}

void OfiSendComm::Fail(OfiRequest& r, Status why) {
  if (r.state == OfiRequest::State::kDone || r.state == OfiRequest::State::kFailed) return;
  r.state = OfiRequest::State::kFailed;
  r.failure = std::move(why);
  // Sends cannot be cancelled; the operations complete (or fail) on their own, unowned.
  for (FiOp* op : r.ops) op->owner = nullptr;
  r.ops.clear();
}

void OfiSendComm::FailAll() {
  for (OfiRequest* r : live_) Fail(*r, conn_.broken());
  unmatched_sends_.clear();
  outbound_sends_.clear();
  outbound_writes_.clear();
}

Result<Completion> OfiSendComm::DoTest(Request& request) {
  auto& r = static_cast<OfiRequest&>(request);
  // Always: a request that failed at matching may have left a control message to send.
  Progress();
  switch (r.state) {
    case OfiRequest::State::kDone: live_.erase(&r); return Completion{true, r.size()};
    case OfiRequest::State::kFailed: live_.erase(&r); return r.failure;
    default: return Completion{false, 0};
  }
}

Status OfiSendComm::DoWaitForProgress(Deadline deadline) {
  return conn_.Wait(deadline, deferred());
}

// ---- OfiRecvComm ----

OfiRecvComm::OfiRecvComm(ConnectionParts parts) : RecvComm(parts.label, parts.properties), conn_(parts, *this) {
  Progress();  // sends the welcome
}

OfiRecvComm::~OfiRecvComm() { conn_.Close(); }

Status OfiRecvComm::ProgressWelcome() {
  Progress();
  if (!conn_.broken().ok()) return conn_.broken();
  Link& link = conn_.link();
  if (link.messages_queued() || link.messages_in_flight()) return Unavailable("the welcome is still leaving");
  return Status::Ok();
}

Result<std::unique_ptr<Registration>> OfiRecvComm::DoRegister(const MemoryDescriptor& memory) {
  return conn_.Register(memory);
}

Status OfiRecvComm::DoDeregister(Registration&) { return Status::Ok(); }

Result<std::unique_ptr<Request>> OfiRecvComm::DoRecv(void* data, size_t capacity, int tag, Registration* registration) {
  if (!conn_.broken().ok()) return conn_.broken();
  auto r = std::make_unique<OfiRequest>(RequestKind::kRecv, tag, capacity);
  if (capacity > 0) {
    const auto& reg = static_cast<const OfiRegistration&>(*registration);
    r->local = reg.local(data);
    r->desc = reg.desc();
    r->hold = reg.hold();
  }
  Link& link = conn_.link();
  const uint64_t id = next_recv_;
  const uint64_t piece_bytes = conn_.piece_bytes();
  r->pieces = RecvPieces(capacity, piece_bytes);
  for (uint32_t piece = 0; piece < r->pieces; ++piece) {
    const uint64_t offset = uint64_t{piece} * piece_bytes;  // piece > 0 only for finite pieces
    const size_t len = static_cast<size_t>(std::min<uint64_t>(piece_bytes, capacity - offset));
    void* into = len > 0 ? static_cast<uint8_t*>(r->local) + offset : r->local;
    FiOp* op = link.NewOp(OpKind::kDataRecv, r.get());
    op->hold = r->hold;
    op->piece = piece;
    ssize_t rc = 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      // Posting a receive acts on this end only: no peer guard.
      rc = fi_trecv(link.endpoint().ep(), into, len, r->desc, link.peer(),
                    conn_.Tag(TagKind::kData, static_cast<uint32_t>(id + piece)), 0, &op->context);
      if (rc != -FI_EAGAIN) break;
      Progress();
    }
    if (rc != 0) {
      link.FreeOp(op);
      // The pieces posted so far are withdrawn (nothing can match them: the post was not sent),
      // and the ids are used again by the next receive.
      for (FiOp* posted : r->ops) {
        posted->owner = nullptr;
        link.Cancel(posted);
      }
      if (rc == -FI_EAGAIN) return std::unique_ptr<Request>();  // busy: the provider's queue is full
      return link.lib().Error(static_cast<int>(rc), "fi_trecv").WithContext(label());
    }
    r->ops.push_back(op);
  }
  next_recv_ += r->pieces;
  r->id = id;
  r->state = OfiRequest::State::kPosted;
  posted_[id] = r.get();
  live_.insert(r.get());
  conn_.SendControl(ControlType::kPost, id, capacity, tag);
  Progress();
  return std::unique_ptr<Request>(std::move(r));
}

void OfiRecvComm::Progress() {
  conn_.Progress(!live_.empty());
  if (!conn_.broken().ok()) FailAll();
}

void OfiRecvComm::OnMessage(const Message& message) {
  std::optional<ControlMessage> m = conn_.Decode(message);
  if (!m.has_value()) return;
  switch (static_cast<ControlType>(m->type)) {
    case ControlType::kTruncated: {
      auto it = posted_.find(m->id);
      if (it == posted_.end()) return;  // already failed or released
      OfiRequest& r = *it->second;
      Fail(r, InvalidArgument(fmt::format("{}: a message of {} bytes arrived for a receive of {} bytes (tag {})",
                                          label(), m->size, r.size(), r.tag())));
      return;
    }
    case ControlType::kClose: conn_.PeerClosed(); return;
    case ControlType::kProbe: return;
    case ControlType::kPost: break;
  }
  KZ_WARN(kLogFabric, "{}: dropped an unexpected control message (type {})", label(), m->type);
}

void OfiRecvComm::OnOpDone(FiOp& op, size_t len) {
  auto* r = static_cast<OfiRequest*>(op.owner);
  if (r == nullptr) return;
  std::erase(r->ops, &op);
  r->received += len;
  ++r->arrived;
  // A piece shorter than its receive ended the message (transfer.h).
  const uint64_t piece_bytes = conn_.piece_bytes();
  const uint64_t posted = std::min<uint64_t>(piece_bytes, r->size() - uint64_t{op.piece} * piece_bytes);
  if (len < posted && (r->terminal < 0 || op.piece < r->terminal)) r->terminal = op.piece;
  const bool ended = r->terminal >= 0 ? static_cast<int64_t>(r->arrived) == r->terminal + 1 : r->arrived == r->pieces;
  if (!ended) return;
  // The receive's pieces beyond the message's end are withdrawn.
  for (FiOp* rest : r->ops) {
    rest->owner = nullptr;
    conn_.link().Cancel(rest);
  }
  r->ops.clear();
  r->state = OfiRequest::State::kDone;
  posted_.erase(r->id);
  ++stats_.messages;
  stats_.bytes += r->received;
}

void OfiRecvComm::OnOpFailed(FiOp& op, const Status& status, bool connection) {
  if (connection) conn_.Break(RemoteError(fmt::format("{}: the peer is unreachable: {}", label(), status.message())));
  auto* r = static_cast<OfiRequest*>(op.owner);
  if (r == nullptr) return;
  std::erase(r->ops, &op);
  Fail(*r, connection ? conn_.broken() : status.WithContext(label()));
}

void OfiRecvComm::OnImmediate(uint64_t data) { immediates_.push_back(static_cast<uint32_t>(data)); }

void OfiRecvComm::Fail(OfiRequest& r, Status why) {
  if (r.state == OfiRequest::State::kDone || r.state == OfiRequest::State::kFailed) return;
  r.state = OfiRequest::State::kFailed;
  r.failure = std::move(why);
  posted_.erase(r.id);
  // Withdraw the posted pieces so that nothing lands in them after the failure is reported.
  for (FiOp* op : r.ops) {
    op->owner = nullptr;
    conn_.link().Cancel(op);
  }
  r.ops.clear();
}

void OfiRecvComm::FailAll() {
  for (OfiRequest* r : live_) Fail(*r, conn_.broken());
}

Result<Completion> OfiRecvComm::DoTest(Request& request) {
  auto& r = static_cast<OfiRequest&>(request);
  Progress();
  switch (r.state) {
    case OfiRequest::State::kDone: live_.erase(&r); return Completion{true, r.received};
    case OfiRequest::State::kFailed: live_.erase(&r); return r.failure;
    default: return Completion{false, 0};
  }
}

Status OfiRecvComm::DoWaitForProgress(Deadline deadline) { return conn_.Wait(deadline, false); }

Result<RemoteKey> OfiRecvComm::DoExpose(Registration& registration) {
  const auto& reg = static_cast<const OfiRegistration&>(registration);
  WireKey key;
  key.nonce = conn_.nonce();
  key.key = reg.key();
  key.base = reg.rma_base();
  key.size = reg.memory().size;
  return EncodeKey(key);
}

Result<std::optional<uint32_t>> OfiRecvComm::DoPollImmediate() {
  Progress();
  if (!immediates_.empty()) {
    const uint32_t v = immediates_.front();
    immediates_.pop_front();
    return std::optional<uint32_t>(v);
  }
  if (!conn_.broken().ok()) return conn_.broken();
  return std::optional<uint32_t>();
}

}  // namespace kizuna::fabric::ofi
