#include "fabric/directconnect/transfer.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "fabric/directconnect/endpoint.h"
#include "fabric/directconnect/transfer_internal.h"
#include "runtime/device/host_reduce.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::directconnect {

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
  if (!op.started) {
    op.started = true;
    if (op.path != Op::Path::kTooBig && shaper_ != nullptr) op.times = shaper_->Reserve(op.size());
  }
  switch (op.path) {
    case Op::Path::kTooBig: return AdvanceTooBig(op);
    case Op::Path::kDirect: return AdvanceDirect(op);
    case Op::Path::kPull: return AdvancePull(op);
    case Op::Path::kStaged: return AdvanceStaged(op);
    case Op::Path::kWrite: break;
  }
  return AdvanceWrite(op);
}

Result<bool> DcSendComm::AdvanceTooBig(Op& op) {
  RecordHeader h{kTooBig, 0, 0, op.post.recv_id, {op.size(), 0, 0, 0}};
  KZ_ASSIGN_OR_RETURN(bool pushed, Push(h));
  if (!pushed) return false;
  op.state = Op::State::kFailed;
  op.error = InvalidArgument(fmt::format("{}: message of {} bytes is longer than the matching receive's capacity "
                                         "of {} bytes (tag {})",
                                         label(), op.size(), op.post.capacity, op.tag()));
  return true;
}

Result<bool> DcSendComm::AdvanceDirect(Op& op) {
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
  RecordHeader h{kDone, 0, 0, op.post.recv_id, {op.size(), 0, ToNs(op.times.delivered), 0}};
  KZ_ASSIGN_OR_RETURN(bool pushed, Push(h));
  if (!pushed) return false;
  op.state = Op::State::kDone;
  return true;
}

Result<bool> DcSendComm::AdvancePull(Op& op) {
  RecordHeader h{kPull, 0, 0, op.post.recv_id, {op.size(), op.reg->id(), ToNs(op.times.delivered), op.reg_offset}};
  KZ_ASSIGN_OR_RETURN(bool pushed, Push(h));
  if (!pushed) return false;
  op.state = Op::State::kAwaitPull;
  awaiting_pull_[op.post.recv_id] = &op;
  return true;
}

Result<bool> DcSendComm::AdvanceStaged(Op& op) {
  const uint64_t deliver = ToNs(op.times.delivered);
  if (op.size() == 0) {
    RecordHeader h{kDone, 0, 0, op.post.recv_id, {0, 0, deliver, 0}};
    KZ_ASSIGN_OR_RETURN(bool pushed, Push(h));
    if (!pushed) return false;
    op.state = Op::State::kDone;
    return true;
  }
  while (op.pushed < op.size()) {
    const uint64_t chunk = std::min<uint64_t>(link_.channel().max_payload(), op.size() - op.pushed);
    RecordHeader h{kData, 0, 0, op.post.recv_id, {op.pushed, op.size(), deliver, 0}};
    KZ_ASSIGN_OR_RETURN(bool pushed, Push(h, op.src + op.pushed, chunk));
    if (!pushed) return false;
    op.pushed += chunk;
    stats_.staged_bytes += chunk;
  }
  op.state = Op::State::kDone;
  return true;
}

Result<bool> DcSendComm::AdvanceWrite(Op& op) {
  const uint64_t deliver = ToNs(op.times.delivered);
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
      KZ_ASSIGN_OR_RETURN(bool pushed, Push(h));
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
    const uint64_t chunk = std::min<uint64_t>(link_.channel().max_payload(), op.size() - op.pushed);
    const bool last = op.pushed + chunk == op.size();
    const uint16_t flags = static_cast<uint16_t>((last ? kFlagLast : 0) | (last && op.immediate ? kFlagImmediate : 0));
    RecordHeader h{kWriteData, flags, 0, op.region,
                   {op.remote_offset + op.pushed, 0, deliver, op.immediate.value_or(0)}};
    KZ_ASSIGN_OR_RETURN(bool pushed, Push(h, chunk > 0 ? op.src + op.pushed : nullptr, chunk));
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

}  // namespace kizuna::fabric::directconnect
