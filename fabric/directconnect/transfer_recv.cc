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

void DcRecvComm::Complete(Op* op, uint64_t length, uint64_t deliver_ns) {
  op->state = Op::State::kDone;
  op->length = length;
  op->deliver_at = FromNs(deliver_ns);
  posted_.erase(op->id);
}

Result<bool> DcRecvComm::Handle(const RecordHeader& rec) {
  switch (rec.type) {
    case kData: return HandleData(rec);
    case kDone: {
      KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "done"));
      if (rec.arg[0] > op->size())
        return ProtocolError(label(), fmt::format("{} bytes delivered into a {}-byte receive", rec.arg[0], op->size()));
      Complete(op, rec.arg[0], rec.arg[2]);
      return true;
    }
    case kPull: return HandlePull(rec);
    case kTooBig: {
      KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "too-big"));
      op->state = Op::State::kFailed;
      op->error = InvalidArgument(fmt::format("{}: the matching send has {} bytes, more than this receive's capacity "
                                              "of {} bytes (tag {})",
                                              label(), rec.arg[0], op->size(), op->tag()));
      posted_.erase(op->id);
      return true;
    }
    case kWriteData: return HandleWriteData(rec);
    case kWriteNotify:
      ++stats_.messages;
      immediates_.push_back(Immediate{static_cast<uint32_t>(rec.arg[0]), FromNs(rec.arg[2])});
      return true;
    default:
      return ProtocolError(label(), fmt::format("unexpected {} record on the forward ring", RecordName(rec.type)));
  }
}

Result<bool> DcRecvComm::HandleData(const RecordHeader& rec) {
  KZ_ASSIGN_OR_RETURN(Op * op, FindOp(rec.id, "data"));
  const uint64_t offset = rec.arg[0], total = rec.arg[1], n = rec.payload_bytes;
  if (total > op->size() || offset > total || n > total - offset || n == 0)
    return ProtocolError(label(), fmt::format("data chunk [{}, +{}) of a {}-byte message into a {}-byte receive",
                                              offset, n, total, op->size()));
  link_.channel().ReadPayload(0, op->dst + offset, n);
  op->received += n;
  stats_.staged_bytes += n;
  if (offset + n == total) Complete(op, total, rec.arg[2]);
  return true;
}

Result<bool> DcRecvComm::HandlePull(const RecordHeader& rec) {
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
  KZ_ASSIGN_OR_RETURN(bool pushed, link_.channel().TryPush(ack, nullptr, 0));
  if (!pushed) return false;
  if (ok) Complete(op, size, rec.arg[2]);
  return true;
}

Result<bool> DcRecvComm::HandleWriteData(const RecordHeader& rec) {
  auto it = exposed_.find(rec.id);
  if (it == exposed_.end())
    return ProtocolError(label(), fmt::format("write into region {}, which is not exposed", rec.id));
  DcRegistration* reg = it->second;
  const uint64_t offset = rec.arg[0], n = rec.payload_bytes;
  if (offset > reg->memory().size || n > reg->memory().size - offset)
    return ProtocolError(label(), fmt::format("write of [{}, +{}) into a {}-byte region", offset, n,
                                              reg->memory().size));
  if (n > 0) link_.channel().ReadPayload(0, reg->cpu(reg->memory().data) + offset, n);
  stats_.staged_bytes += n;
  if ((rec.flags & kFlagLast) != 0) {
    ++stats_.messages;
    if ((rec.flags & kFlagImmediate) != 0)
      immediates_.push_back(Immediate{static_cast<uint32_t>(rec.arg[3]), FromNs(rec.arg[2])});
  }
  stats_.bytes += n;
  return true;
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
