#include "fabric/directconnect/transfer.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "fabric/directconnect/endpoint.h"
#include "runtime/device/exported_memory.h"
#include "runtime/host_reduce.h"
#include "runtime/logging.h"

namespace kizuna::fabric::directconnect {
namespace {

using Clock = Link::Clock;

// Record types. Forward ring (sender -> receiver):
//   kData        id = receive id, arg0 = offset in the message, arg1 = message size,
//                arg2 = delivery time (ns), payload = the chunk
//   kDone        id = receive id, arg0 = size, arg2 = delivery time — the bytes are in place
//   kPull        id = receive id, arg0 = size, arg1 = sender region, arg2 = delivery time,
//                arg3 = offset in the region — the receiver copies them out and answers kPulled
//   kTooBig      id = receive id, arg0 = the message's size
//   kWriteData   id = exposed region, arg0 = offset in it, arg2 = delivery time, arg3 = immediate,
//                flags = kFlagLast | kFlagImmediate, payload = the chunk
//   kWriteNotify arg0 = immediate, arg2 = delivery time — a direct write's immediate
// Reverse ring (receiver -> sender):
//   kPost        id = receive id, arg0 = capacity, arg1 = tag, arg2 = region (0: none),
//                arg3 = offset in the region
//   kPulled      id = receive id, arg0 = 0 (copied) or 1 (refused: region not mappable here)
enum RecordType : uint16_t {
  kData = 1,
  kDone = 2,
  kPull = 3,
  kTooBig = 4,
  kWriteData = 5,
  kWriteNotify = 6,
  kPost = 16,
  kPulled = 17,
};
constexpr uint16_t kFlagLast = 1;
constexpr uint16_t kFlagImmediate = 2;
constexpr uint64_t kPullRefused = 1;

std::string_view RecordName(uint16_t type) {
  switch (type) {
    case kData: return "data";
    case kDone: return "done";
    case kPull: return "pull";
    case kTooBig: return "too-big";
    case kWriteData: return "write-data";
    case kWriteNotify: return "write-notify";
    case kPost: return "receive-post";
    case kPulled: return "pulled";
  }
  return "unknown";
}

// Delivery times travel as steady_clock nanoseconds: both ends are on one host, and libstdc++'s
// steady_clock is CLOCK_MONOTONIC, which all processes share. 0 means "no hold".
uint64_t ToNs(Clock::time_point t) {
  return t == Clock::time_point{} ? 0
                                  : static_cast<uint64_t>(
                                        std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}
Clock::time_point FromNs(uint64_t ns) {
  return ns == 0 ? Clock::time_point{} : Clock::time_point(std::chrono::nanoseconds(static_cast<int64_t>(ns)));
}

// The remote key of an exposed region.
struct WireKey {
  uint32_t magic;
  uint16_t version;
  uint16_t mappable;  // 1: the region was offered by fd (the writer may map it)
  uint64_t nonce;     // the connection
  uint64_t region;
  uint64_t size;
};
static_assert(sizeof(WireKey) <= kRemoteKeyMaxBytes);
constexpr uint32_t kKeyMagic = 0x4b52'5a4b;  // "KZRK"
constexpr uint16_t kKeyVersion = 1;

// How long a side waits for a region message that a record has named (see Link::AwaitRegion).
constexpr double kRegionWaitSeconds = 5.0;

Status ProtocolError(const std::string& label, std::string_view what) {
  return RemoteError(fmt::format("{}: protocol error from the peer: {}", label, what));
}

}  // namespace

// ---- Link ----

Link::Link(ConnectionParts& parts)
    : channel_(std::move(parts.channel)),
      socket_(std::move(parts.socket)),
      nonce_(parts.nonce),
      label_(parts.label),
      io_timeout_s_(parts.io_timeout_s) {}

Link::~Link() {
  // The flag tells a live peer at once; closing the socket (UniqueFd) tells it too, and is what
  // it sees if this process dies instead.
  channel_->Close();
}

void Link::Break(Status why) {
  if (!broken_.ok() || why.ok()) return;
  KZ_INFO(kLogFabric, "{}: connection unusable: {}", label_, why.ToString());
  broken_ = std::move(why);
}

Status Link::CheckPeer(bool poll_socket) {
  if (!peer_gone_ && channel_->peer_closed()) peer_gone_ = true;
  // The socket reports a peer that died without closing; a syscall per progress would be
  // wasteful when the peer is busy, so an idle Test loop looks every 64th time.
  if (poll_socket || (++idle_checks_ & 63) == 0) return PumpSocket();
  return Status::Ok();
}

Status Link::PumpSocket() {
  while (!peer_gone_) {
    pollfd p{socket_.get(), POLLIN, 0};
    const int r = ::poll(&p, 1, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return FromErrno(errno, "poll");
    }
    if (r == 0) return Status::Ok();
    char byte;
    const ssize_t n = ::recv(socket_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE))) {
      peer_gone_ = true;
      return Status::Ok();
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return Status::Ok();
      return FromErrno(errno, "recv");
    }
    KZ_RETURN_IF_ERROR(ReadOneSocketMessage());
  }
  return Status::Ok();
}

Status Link::ReadOneSocketMessage() {
  const Deadline deadline = IoDeadline();
  SocketMessage m;
  Status s = RecvAll(socket_.get(), &m, sizeof(m), deadline);
  if (s.code() == StatusCode::kRemoteError) {
    peer_gone_ = true;
    return Status::Ok();
  }
  KZ_RETURN_IF_ERROR(s);
  if (m.magic != kSocketMessageMagic) return ProtocolError(label_, "bad socket message magic");
  switch (static_cast<SocketMessageType>(m.type)) {
    case SocketMessageType::kRegionAdd: {
      auto exported = device::ReceiveExportedMemory(socket_.get(), deadline);
      if (!exported.ok()) {
        if (exported.status().code() == StatusCode::kRemoteError) {
          peer_gone_ = true;
          return Status::Ok();
        }
        return exported.status().WithContext(label_);
      }
      peer_regions_.Add(m.id, *exported, /*writable=*/channel_->side() == Side::kSender);
      return Status::Ok();
    }
    case SocketMessageType::kRegionRemove:
      peer_regions_.Remove(m.id);
      return Status::Ok();
    case SocketMessageType::kReject: {
      std::string text(std::min(m.length, kMaxRejectText), '\0');
      if (!text.empty() && !RecvAll(socket_.get(), text.data(), text.size(), deadline).ok()) text = "(no reason given)";
      reject_reason_ = text;
      Break(RemoteError(fmt::format("{}: the listener rejected the connection: {}", label_, text)));
      peer_gone_ = true;
      return Status::Ok();
    }
  }
  return ProtocolError(label_, fmt::format("unknown socket message type {}", m.type));
}

Result<const PeerRegions::Region*> Link::AwaitRegion(uint64_t id) {
  // The peer sends a region's message before any record naming it, so the message is in the
  // socket already (at most still being copied in by the kernel): a short wait suffices, and a
  // region that is still missing was withdrawn or never offered.
  const Deadline deadline = Deadline::AfterSeconds(std::min(io_timeout_s_, kRegionWaitSeconds));
  while (true) {
    if (const PeerRegions::Region* r = peer_regions_.Find(id)) return r;
    if (peer_gone_) return RemoteError(fmt::format("{}: the peer went away before offering region {}", label_, id));
    if (id <= peer_regions_.highest_id())
      return ProtocolError(label_, fmt::format("region {} is named, but the peer withdrew it (or never offered it)", id));
    if (deadline.Expired()) return ProtocolError(label_, fmt::format("region {} was named but never offered", id));
    pollfd p{socket_.get(), POLLIN, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    const int r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms, 1, 1000)));
    if (r < 0 && errno != EINTR) return FromErrno(errno, "poll");
    KZ_RETURN_IF_ERROR(PumpSocket());
  }
}

Status Link::OfferRegion(DcRegistration& registration) {
  const Deadline deadline = IoDeadline();
  device::ExportedMemory e;
  e.kind = device::ExportKind::kFd;
  e.fd = registration.TakeFd();
  e.offset = registration.memory().fd_offset;
  e.size = registration.memory().size;
  e.backend = std::string(kFabricName);
  KZ_RETURN_IF_ERROR(SendSocketMessage(socket_.get(), SocketMessageType::kRegionAdd, registration.id(), "", deadline));
  KZ_RETURN_IF_ERROR(device::SendExportedMemory(socket_.get(), e, deadline));
  registration.offered_to_peer = true;
  return Status::Ok();
}

Status Link::WithdrawRegion(const DcRegistration& registration) {
  return SendSocketMessage(socket_.get(), SocketMessageType::kRegionRemove, registration.id(), "", IoDeadline());
}

Status Link::Wait(uint64_t seen, Deadline deadline, std::optional<Clock::time_point> wake_at) {
  KZ_ASSIGN_OR_RETURN(WaitResult w, channel_->Wait(seen, deadline, socket_.get(), wake_at));
  if (w.extra_ready) return PumpSocket();
  return Status::Ok();
}

// ---- Registration, shared by both sides ----

namespace {

Result<std::unique_ptr<Registration>> RegisterOn(Link& link, const MemoryDescriptor& memory, uint64_t id) {
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<DcRegistration> reg, DcRegistration::Create(memory, id));
  if (reg->fd().valid()) {
    // Offered at once, so that the message is in the socket before any record names the region.
    // A failure only costs the single-copy path: transfers with this region are then staged.
    if (Status s = link.OfferRegion(*reg); !s.ok())
      KZ_INFO(kLogFabric, "{}: region {} not offered to the peer (transfers with it are staged): {}", link.label(),
              id, s.ToString());
  }
  return std::unique_ptr<Registration>(std::move(reg));
}

Status DeregisterOn(Link& link, DcRegistration& reg) {
  if (!reg.offered_to_peer || link.peer_gone()) return Status::Ok();
  Status s = link.WithdrawRegion(reg);
  // A peer that is gone needs no notice; anything else is worth reporting.
  if (s.code() == StatusCode::kRemoteError) return Status::Ok();
  return s;
}

}  // namespace

// ---- Sending side ----

struct DcSendComm::Op : Request {
  enum class State { kUnmatched, kQueued, kAwaitPull, kDone, kFailed };
  enum class Path { kDirect, kPull, kStaged, kTooBig, kWrite };

  Op(RequestKind kind, int tag, size_t size) : Request(kind, tag, size) {}

  const uint8_t* src = nullptr;  // CPU view of the data
  DcRegistration* reg = nullptr;
  uint64_t reg_offset = 0;       // where the data starts in its registration
  State state = State::kUnmatched;
  Path path = Path::kStaged;
  Status error;
  Post post;             // sends: the matched receive
  uint64_t pushed = 0;   // staged bytes pushed so far
  bool copied = false;   // direct copy done (its completion record may still be pending)
  bool started = false;  // link time reserved
  LinkShaper::Times times{};
  // Writes.
  uint64_t region = 0;
  uint64_t remote_offset = 0;
  bool remote_mappable = false;
  std::optional<uint32_t> immediate;
};

DcSendComm::DcSendComm(ConnectionParts parts)
    : SendComm(parts.label, parts.properties), link_(parts), shaper_(std::move(parts.shaper)) {}

DcSendComm::~DcSendComm() = default;

Result<std::unique_ptr<Registration>> DcSendComm::DoRegister(const MemoryDescriptor& memory) {
  return RegisterOn(link_, memory, next_region_++);
}

Status DcSendComm::DoDeregister(Registration& registration) {
  return DeregisterOn(link_, static_cast<DcRegistration&>(registration));
}

Result<std::unique_ptr<Request>> DcSendComm::DoSend(const void* data, size_t size, int tag,
                                                    Registration* registration) {
  if (!link_.broken().ok()) return link_.broken();
  auto op = std::make_unique<Op>(RequestKind::kSend, tag, size);
  op->reg = static_cast<DcRegistration*>(registration);
  op->src = op->reg != nullptr && size > 0 ? op->reg->cpu(data) : nullptr;
  op->reg_offset = op->reg != nullptr && size > 0 ? op->reg->offset_of(data) : 0;
  ops_.emplace(op.get(), op.get());
  auto posts = unmatched_posts_.find(tag);
  if (posts != unmatched_posts_.end() && !posts->second.empty()) {
    Match(*op, posts->second.front());
    posts->second.pop_front();
  } else {
    unmatched_sends_[tag].push_back(op.get());
  }
  Progress();  // a failure is the op's to report, through Test
  return std::unique_ptr<Request>(std::move(op));
}

Result<std::unique_ptr<Request>> DcSendComm::DoWrite(const void* data, size_t size, Registration* registration,
                                                     const RemoteKey& remote, uint64_t remote_offset,
                                                     std::optional<uint32_t> immediate) {
  WireKey key{};
  if (remote.size != sizeof(WireKey))
    return InvalidArgument(fmt::format("{}: remote key of {} bytes is not a directconnect key", label(), remote.size));
  std::memcpy(&key, remote.data.data(), sizeof(key));
  if (key.magic != kKeyMagic || key.version != kKeyVersion)
    return InvalidArgument(fmt::format("{}: remote key is not a directconnect key (or of another version)", label()));
  if (key.nonce != link_.nonce())
    return InvalidArgument(fmt::format("{}: remote key belongs to another connection (expose the region on the "
                                       "RecvComm this SendComm is connected to)",
                                       label()));
  if (remote_offset > key.size || size > key.size - remote_offset)
    return InvalidArgument(fmt::format("{}: write of {} bytes at offset {} runs past the exposed region's {} bytes",
                                       label(), size, remote_offset, key.size));
  if (!link_.broken().ok()) return link_.broken();
  auto op = std::make_unique<Op>(RequestKind::kWrite, 0, size);
  op->reg = static_cast<DcRegistration*>(registration);
  op->src = op->reg != nullptr && size > 0 ? op->reg->cpu(data) : nullptr;
  op->path = Op::Path::kWrite;
  op->region = key.region;
  op->remote_offset = remote_offset;
  op->remote_mappable = key.mappable != 0;
  op->immediate = immediate;
  op->state = Op::State::kQueued;
  ops_.emplace(op.get(), op.get());
  outbound_.push_back(op.get());
  Progress();
  return std::unique_ptr<Request>(std::move(op));
}

void DcSendComm::Match(Op& op, const Post& post) {
  op.post = post;
  op.state = Op::State::kQueued;
  if (post.capacity < op.size()) op.path = Op::Path::kTooBig;
  else if (post.region != 0) op.path = Op::Path::kDirect;  // confirmed (or downgraded) in Advance
  else if (op.reg != nullptr && op.reg->offered_to_peer && op.size() > 0) op.path = Op::Path::kPull;
  else op.path = Op::Path::kStaged;
  outbound_.push_back(&op);
}

Result<bool> DcSendComm::DrainPosts() {
  bool changed = false;
  Channel& ch = link_.channel();
  while (true) {
    KZ_ASSIGN_OR_RETURN(std::optional<RecordHeader> rec, ch.Peek());
    if (!rec.has_value()) return changed;
    changed = true;
    if (rec->type == kPost) {
      Post post{rec->id, rec->arg[0], rec->arg[2], rec->arg[3]};
      const int tag = static_cast<int>(static_cast<uint32_t>(rec->arg[1]));
      auto sends = unmatched_sends_.find(tag);
      if (sends != unmatched_sends_.end() && !sends->second.empty()) {
        Op* op = sends->second.front();
        sends->second.pop_front();
        Match(*op, post);
      } else {
        unmatched_posts_[tag].push_back(post);
      }
    } else if (rec->type == kPulled) {
      auto it = awaiting_pull_.find(rec->id);
      if (it == awaiting_pull_.end())
        return ProtocolError(label(), fmt::format("pulled acknowledgement for unknown receive {}", rec->id));
      Op* op = it->second;
      awaiting_pull_.erase(it);
      if (rec->arg[0] == kPullRefused) {
        // The receiver cannot map this region: stage this message and the region's later ones.
        op->reg->offered_to_peer = false;
        op->path = Op::Path::kStaged;
        op->state = Op::State::kQueued;
        outbound_.push_front(op);
      } else {
        op->state = Op::State::kDone;
      }
    } else {
      return ProtocolError(label(), fmt::format("unexpected {} record on the reverse ring", RecordName(rec->type)));
    }
    ch.Pop();
  }
}

Result<bool> DcSendComm::Advance(Op& op) {
  Channel& ch = link_.channel();
  if (!op.started) {
    op.started = true;
    if (op.path != Op::Path::kTooBig && shaper_ != nullptr) op.times = shaper_->Reserve(op.size());
  }
  const uint64_t deliver = ToNs(op.times.delivered);
  auto push = [&ch](const RecordHeader& h, const void* payload = nullptr, size_t n = 0) { return ch.TryPush(h, payload, n); };

  if (op.path == Op::Path::kTooBig) {
    RecordHeader h{kTooBig, 0, 0, op.post.recv_id, {op.size(), 0, 0, 0}};
    KZ_ASSIGN_OR_RETURN(bool pushed, push(h));
    if (!pushed) return false;
    op.state = Op::State::kFailed;
    op.error = InvalidArgument(fmt::format("{}: message of {} bytes is longer than the matching receive's capacity "
                                           "of {} bytes (tag {})",
                                           label(), op.size(), op.post.capacity, op.tag()));
    return true;
  }

  if (op.path == Op::Path::kDirect) {
    KZ_ASSIGN_OR_RETURN(const PeerRegions::Region* region, link_.AwaitRegion(op.post.region));
    if (!region->mappable) {
      op.path = op.reg != nullptr && op.reg->offered_to_peer && op.size() > 0 ? Op::Path::kPull : Op::Path::kStaged;
      return Advance(op);
    }
    if (op.post.offset > region->size || op.post.capacity > region->size - op.post.offset)
      return ProtocolError(label(), fmt::format("receive {} of {} bytes at offset {} lies outside its region's {} bytes",
                                                op.post.recv_id, op.post.capacity, op.post.offset, region->size));
    if (!op.copied && op.size() > 0) HostCopy(region->mapping.data() + op.post.offset, op.src, op.size());
    op.copied = true;
    RecordHeader h{kDone, 0, 0, op.post.recv_id, {op.size(), 0, deliver, 0}};
    KZ_ASSIGN_OR_RETURN(bool pushed, push(h));
    if (!pushed) return false;
    op.state = Op::State::kDone;
    return true;
  }

  if (op.path == Op::Path::kPull) {
    RecordHeader h{kPull, 0, 0, op.post.recv_id, {op.size(), op.reg->id(), deliver, op.reg_offset}};
    KZ_ASSIGN_OR_RETURN(bool pushed, push(h));
    if (!pushed) return false;
    op.state = Op::State::kAwaitPull;
    awaiting_pull_[op.post.recv_id] = &op;
    return true;
  }

  if (op.path == Op::Path::kStaged) {
    if (op.size() == 0) {
      RecordHeader h{kDone, 0, 0, op.post.recv_id, {0, 0, deliver, 0}};
      KZ_ASSIGN_OR_RETURN(bool pushed, push(h));
      if (!pushed) return false;
      op.state = Op::State::kDone;
      return true;
    }
    while (op.pushed < op.size()) {
      const uint64_t chunk = std::min<uint64_t>(ch.max_payload(), op.size() - op.pushed);
      RecordHeader h{kData, 0, 0, op.post.recv_id, {op.pushed, op.size(), deliver, 0}};
      KZ_ASSIGN_OR_RETURN(bool pushed, push(h, op.src + op.pushed, chunk));
      if (!pushed) return false;
      op.pushed += chunk;
      stats_.staged_bytes += chunk;
    }
    op.state = Op::State::kDone;
    return true;
  }

  // A one-sided write.
  bool direct = false;
  const PeerRegions::Region* region = nullptr;
  if (op.remote_mappable) {
    KZ_ASSIGN_OR_RETURN(region, link_.AwaitRegion(op.region));
    direct = region->mappable;
    if (direct && (op.remote_offset > region->size || op.size() > region->size - op.remote_offset))
      return ProtocolError(label(), fmt::format("exposed region {} has {} bytes, the key said more", op.region,
                                                region->size));
  }
  if (direct) {
    if (!op.copied && op.size() > 0) HostCopy(region->mapping.data() + op.remote_offset, op.src, op.size());
    op.copied = true;
    if (op.immediate.has_value()) {
      RecordHeader h{kWriteNotify, kFlagImmediate, 0, op.region, {*op.immediate, 0, deliver, 0}};
      KZ_ASSIGN_OR_RETURN(bool pushed, push(h));
      if (!pushed) return false;
    }
    op.state = Op::State::kDone;
    return true;
  }
  if (op.size() == 0 && !op.immediate.has_value()) {
    op.state = Op::State::kDone;
    return true;
  }
  do {
    const uint64_t chunk = std::min<uint64_t>(ch.max_payload(), op.size() - op.pushed);
    const bool last = op.pushed + chunk == op.size();
    const uint16_t flags = static_cast<uint16_t>((last ? kFlagLast : 0) | (last && op.immediate ? kFlagImmediate : 0));
    RecordHeader h{kWriteData, flags, 0, op.region,
                   {op.remote_offset + op.pushed, 0, deliver, op.immediate.value_or(0)}};
    KZ_ASSIGN_OR_RETURN(bool pushed, push(h, chunk > 0 ? op.src + op.pushed : nullptr, chunk));
    if (!pushed) return false;
    op.pushed += chunk;
    stats_.staged_bytes += chunk;
  } while (op.pushed < op.size());
  op.state = Op::State::kDone;
  return true;
}

Result<bool> DcSendComm::RunOutbound() {
  bool changed = false;
  while (!outbound_.empty()) {
    Op* op = outbound_.front();
    KZ_ASSIGN_OR_RETURN(bool finished, Advance(*op));
    if (!finished) return changed;
    changed = true;
    if (!outbound_.empty() && outbound_.front() == op) outbound_.pop_front();
  }
  return changed;
}

bool DcSendComm::Progress() {
  if (!link_.broken().ok()) {
    // Broken outside Progress (a rejection read from the socket): fail what is still pending.
    FailAll(link_.broken());
    return false;
  }
  auto run = [this]() -> Result<bool> {
    KZ_RETURN_IF_ERROR(link_.CheckPeer(false));
    const bool gone = link_.peer_gone();
    KZ_ASSIGN_OR_RETURN(bool a, DrainPosts());
    if (gone) return RemoteError(fmt::format("{}: the receiving side closed the connection or exited", label()));
    KZ_ASSIGN_OR_RETURN(bool b, RunOutbound());
    return a || b;
  };
  Result<bool> r = run();
  if (!r.ok()) {
    link_.Break(r.status());
    FailAll(link_.broken());
    return true;
  }
  return *r;
}

void DcSendComm::FailAll(const Status& why) {
  int failed = 0;
  for (auto& [request, op] : ops_) {
    if (op->state == Op::State::kDone || op->state == Op::State::kFailed) continue;
    op->state = Op::State::kFailed;
    op->error = why;
    ++failed;
  }
  unmatched_sends_.clear();
  unmatched_posts_.clear();
  outbound_.clear();
  awaiting_pull_.clear();
  if (failed > 0) KZ_INFO(kLogFabric, "{}: {} request(s) failed: {}", label(), failed, why.ToString());
}

std::optional<Link::Clock::time_point> DcSendComm::NextWake() const {
  std::optional<Clock::time_point> next;
  for (const auto& [request, op] : ops_)
    if (op->state == Op::State::kDone && op->times.sent != Clock::time_point{} && (!next || op->times.sent < *next))
      next = op->times.sent;
  return next;
}

Result<Completion> DcSendComm::DoTest(Request& request) {
  Progress();
  auto it = ops_.find(&request);
  if (it == ops_.end()) return Internal(fmt::format("{}: request unknown to the backend", label()));
  Op& op = *it->second;
  if (op.state == Op::State::kFailed) {
    ops_.erase(it);
    return op.error;
  }
  if (op.state != Op::State::kDone) return Completion{};
  if (op.times.sent != Clock::time_point{} && Clock::now() < op.times.sent) return Completion{};
  ops_.erase(it);
  ++stats_.messages;
  stats_.bytes += op.size();
  return Completion{true, op.size()};
}

Status DcSendComm::DoWaitForProgress(Deadline deadline) {
  const uint64_t seen = link_.channel().events();
  const bool changed = Progress();
  if (changed) return Status::Ok();
  if (!link_.broken().ok()) {
    // Nothing can arrive any more; only a completion held back by shaping may still be due.
    if (const auto wake = NextWake()) std::this_thread::sleep_until(std::min(*wake, deadline.when()));
    return Status::Ok();
  }
  return link_.Wait(seen, deadline, NextWake());
}

// ---- Receiving side ----

struct DcRecvComm::Op : Request {
  enum class State { kPosted, kDone, kFailed };
  Op(int tag, size_t capacity) : Request(RequestKind::kRecv, tag, capacity) {}

  uint8_t* dst = nullptr;  // CPU view of the buffer
  uint64_t id = 0;
  State state = State::kPosted;
  Status error;
  uint64_t received = 0;   // staged bytes so far
  uint64_t length = 0;     // the message's size, once known
  Clock::time_point deliver_at{};
};

DcRecvComm::DcRecvComm(ConnectionParts parts) : RecvComm(parts.label, parts.properties), link_(parts) {}

DcRecvComm::~DcRecvComm() = default;

Result<std::unique_ptr<Registration>> DcRecvComm::DoRegister(const MemoryDescriptor& memory) {
  return RegisterOn(link_, memory, next_region_++);
}

Status DcRecvComm::DoDeregister(Registration& registration) {
  auto& reg = static_cast<DcRegistration&>(registration);
  exposed_.erase(reg.id());
  return DeregisterOn(link_, reg);
}

Result<std::unique_ptr<Request>> DcRecvComm::DoRecv(void* data, size_t capacity, int tag, Registration* registration) {
  if (!link_.broken().ok()) return link_.broken();
  auto* reg = static_cast<DcRegistration*>(registration);
  auto op = std::make_unique<Op>(tag, capacity);
  op->dst = reg != nullptr && capacity > 0 ? reg->cpu(data) : nullptr;
  op->id = next_recv_id_;
  const bool offered = reg != nullptr && reg->offered_to_peer && capacity > 0;
  RecordHeader h{kPost, 0, 0, op->id,
                 {capacity, static_cast<uint32_t>(tag), offered ? reg->id() : 0, offered ? reg->offset_of(data) : 0}};
  Result<bool> pushed = link_.channel().TryPush(h, nullptr, 0);
  if (!pushed.ok()) {
    link_.Break(pushed.status().WithContext(label()));
    FailAll(link_.broken());
    return link_.broken();
  }
  if (!*pushed) return std::unique_ptr<Request>();  // the reverse ring is full: busy
  ++next_recv_id_;
  posted_.emplace(op->id, op.get());
  ops_.emplace(op.get(), op.get());
  return std::unique_ptr<Request>(std::move(op));
}

Result<DcRecvComm::Op*> DcRecvComm::FindOp(uint64_t recv_id, std::string_view record) {
  auto it = posted_.find(recv_id);
  if (it == posted_.end())
    return ProtocolError(label(), fmt::format("{} record for receive {}, which is not posted", record, recv_id));
  return it->second;
}

Result<bool> DcRecvComm::Handle(const RecordHeader& rec) {
  Channel& ch = link_.channel();
  auto complete = [this](Op* op, uint64_t length, uint64_t deliver_ns) {
    op->state = Op::State::kDone;
    op->length = length;
    op->deliver_at = FromNs(deliver_ns);
    posted_.erase(op->id);
  };
  switch (rec.type) {
    case kData: {
      KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "data"));
      const uint64_t offset = rec.arg[0], total = rec.arg[1], n = rec.payload_bytes;
      if (total > op->size() || offset > total || n > total - offset || n == 0)
        return ProtocolError(label(), fmt::format("data chunk [{}, +{}) of a {}-byte message into a {}-byte receive",
                                                  offset, n, total, op->size()));
      ch.ReadPayload(0, op->dst + offset, n);
      op->received += n;
      stats_.staged_bytes += n;
      if (offset + n == total) complete(op, total, rec.arg[2]);
      return true;
    }
    case kDone: {
      KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "done"));
      if (rec.arg[0] > op->size())
        return ProtocolError(label(), fmt::format("{} bytes delivered into a {}-byte receive", rec.arg[0], op->size()));
      complete(op, rec.arg[0], rec.arg[2]);
      return true;
    }
    case kPull: {
      KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "pull"));
      const uint64_t size = rec.arg[0], region_id = rec.arg[1], offset = rec.arg[3];
      if (size > op->size())
        return ProtocolError(label(), fmt::format("pull of {} bytes into a {}-byte receive", size, op->size()));
      KZ_ASSIGN_OR_RETURN(const PeerRegions::Region* region, link_.AwaitRegion(region_id));
      const bool ok = region->mappable;
      if (ok && (offset > region->size || size > region->size - offset))
        return ProtocolError(label(), fmt::format("pull of [{}, +{}) from a {}-byte region", offset, size, region->size));
      if (ok && op->received == 0 && size > 0) {
        HostCopy(op->dst, region->mapping.data() + offset, size);
        op->received = size;  // marks the copy done, should the acknowledgement have to wait
      }
      RecordHeader ack{kPulled, 0, 0, rec.id, {ok ? 0 : kPullRefused, 0, 0, 0}};
      KZ_ASSIGN_OR_RETURN(bool pushed, ch.TryPush(ack, nullptr, 0));
      if (!pushed) return false;
      if (ok) complete(op, size, rec.arg[2]);
      return true;
    }
    case kTooBig: {
      KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "too-big"));
      op->state = Op::State::kFailed;
      op->error = InvalidArgument(fmt::format("{}: the matching send has {} bytes, more than this receive's capacity "
                                              "of {} bytes (tag {})",
                                              label(), rec.arg[0], op->size(), op->tag()));
      posted_.erase(op->id);
      return true;
    }
    case kWriteData: {
      auto it = exposed_.find(rec.id);
      if (it == exposed_.end())
        return ProtocolError(label(), fmt::format("write into region {}, which is not exposed", rec.id));
      DcRegistration* reg = it->second;
      const uint64_t offset = rec.arg[0], n = rec.payload_bytes;
      if (offset > reg->memory().size || n > reg->memory().size - offset)
        return ProtocolError(label(), fmt::format("write of [{}, +{}) into a {}-byte region", offset, n,
                                                  reg->memory().size));
      if (n > 0) ch.ReadPayload(0, reg->cpu(reg->memory().data) + offset, n);
      stats_.staged_bytes += n;
      if ((rec.flags & kFlagLast) != 0) {
        ++stats_.messages;
        if ((rec.flags & kFlagImmediate) != 0)
          immediates_.push_back(Immediate{static_cast<uint32_t>(rec.arg[3]), FromNs(rec.arg[2])});
      }
      stats_.bytes += n;
      return true;
    }
    case kWriteNotify:
      ++stats_.messages;
      immediates_.push_back(Immediate{static_cast<uint32_t>(rec.arg[0]), FromNs(rec.arg[2])});
      return true;
    default:
      return ProtocolError(label(), fmt::format("unexpected {} record on the forward ring", RecordName(rec.type)));
  }
}

bool DcRecvComm::Progress() {
  if (!link_.broken().ok()) {
    FailAll(link_.broken());
    return false;
  }
  auto run = [this]() -> Result<bool> {
    KZ_RETURN_IF_ERROR(link_.CheckPeer(false));
    const bool gone = link_.peer_gone();
    bool changed = false;
    Channel& ch = link_.channel();
    while (true) {
      KZ_ASSIGN_OR_RETURN(std::optional<RecordHeader> rec, ch.Peek());
      if (!rec.has_value()) break;
      KZ_ASSIGN_OR_RETURN(bool handled, Handle(*rec));
      if (!handled) break;
      ch.Pop();
      changed = true;
    }
    if (gone) return RemoteError(fmt::format("{}: the sending side closed the connection or exited", label()));
    return changed;
  };
  Result<bool> r = run();
  if (!r.ok()) {
    link_.Break(r.status());
    FailAll(link_.broken());
    return true;
  }
  return *r;
}

void DcRecvComm::FailAll(const Status& why) {
  int failed = 0;
  for (auto& [request, op] : ops_) {
    if (op->state != Op::State::kPosted) continue;
    op->state = Op::State::kFailed;
    op->error = why;
    ++failed;
  }
  posted_.clear();
  if (failed > 0) KZ_INFO(kLogFabric, "{}: {} receive(s) failed: {}", label(), failed, why.ToString());
}

std::optional<Link::Clock::time_point> DcRecvComm::NextWake() const {
  std::optional<Clock::time_point> next;
  for (const auto& [request, op] : ops_)
    if (op->state == Op::State::kDone && op->deliver_at != Clock::time_point{} && (!next || op->deliver_at < *next))
      next = op->deliver_at;
  if (!immediates_.empty() && immediates_.front().deliver_at != Clock::time_point{} &&
      (!next || immediates_.front().deliver_at < *next))
    next = immediates_.front().deliver_at;
  return next;
}

Result<Completion> DcRecvComm::DoTest(Request& request) {
  Progress();
  auto it = ops_.find(&request);
  if (it == ops_.end()) return Internal(fmt::format("{}: request unknown to the backend", label()));
  Op& op = *it->second;
  if (op.state == Op::State::kFailed) {
    ops_.erase(it);
    return op.error;
  }
  if (op.state != Op::State::kDone) return Completion{};
  if (op.deliver_at != Clock::time_point{} && Clock::now() < op.deliver_at) return Completion{};
  ops_.erase(it);
  ++stats_.messages;
  stats_.bytes += op.length;
  return Completion{true, op.length};
}

Status DcRecvComm::DoWaitForProgress(Deadline deadline) {
  const uint64_t seen = link_.channel().events();
  const bool changed = Progress();
  if (changed) return Status::Ok();
  if (!link_.broken().ok()) {
    // Nothing can arrive any more; only a completion held back by shaping may still be due.
    if (const auto wake = NextWake()) std::this_thread::sleep_until(std::min(*wake, deadline.when()));
    return Status::Ok();
  }
  return link_.Wait(seen, deadline, NextWake());
}

Result<RemoteKey> DcRecvComm::DoExpose(Registration& registration) {
  auto& reg = static_cast<DcRegistration&>(registration);
  reg.exposed = true;
  exposed_[reg.id()] = &reg;
  WireKey key{kKeyMagic, kKeyVersion, static_cast<uint16_t>(reg.offered_to_peer ? 1 : 0), link_.nonce(), reg.id(),
              reg.memory().size};
  RemoteKey out;
  out.size = sizeof(key);
  std::memcpy(out.data.data(), &key, sizeof(key));
  return out;
}

Result<std::optional<uint32_t>> DcRecvComm::DoPollImmediate() {
  Progress();
  if (!immediates_.empty()) {
    const Immediate& front = immediates_.front();
    if (front.deliver_at == Clock::time_point{} || Clock::now() >= front.deliver_at) {
      const uint32_t v = front.value;
      immediates_.pop_front();
      return std::optional<uint32_t>(v);
    }
    return std::optional<uint32_t>();
  }
  if (!link_.broken().ok()) return link_.broken();
  return std::optional<uint32_t>();
}

}  // namespace kizuna::fabric::directconnect
