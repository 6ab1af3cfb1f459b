#include "fabric/roce/transfer.h"

#include <cstring>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric::roce {
namespace {

constexpr uint32_t kKeyMagic = 0x4b52435a;  // "ZCRK"
// What the peer sent before its socket closed gets this long to arrive before pending requests fail.
constexpr auto kPeerGoneGrace = std::chrono::milliseconds(100);

struct WireKey {
  uint32_t magic;
  uint32_t rkey;
  uint64_t nonce;
  uint64_t addr;
  uint64_t size;
  uint64_t check;
};
static_assert(sizeof(WireKey) == 40 && sizeof(WireKey) <= RemoteKey::kMax);

uint64_t KeyCheck(const WireKey& k) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t v : {uint64_t{k.magic}, uint64_t{k.rkey}, k.nonce, k.addr, k.size}) {
    h ^= v;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

RemoteKey EncodeKey(const KeyInfo& key) {
  WireKey w{kKeyMagic, key.rkey, key.nonce, key.addr, key.size, 0};
  w.check = KeyCheck(w);
  RemoteKey out;
  out.size = sizeof(w);
  std::memcpy(out.data.data(), &w, sizeof(w));
  return out;
}

Result<KeyInfo> ParseKey(const RemoteKey& key) {
  if (key.size != sizeof(WireKey))
    return InvalidArgument(fmt::format("roce: a remote key of {} bytes is not a roce key ({} bytes)", key.size,
                                       sizeof(WireKey)));
  WireKey w;
  std::memcpy(&w, key.data.data(), sizeof(w));
  if (w.magic != kKeyMagic || w.check != KeyCheck(w))
    return InvalidArgument("roce: the remote key is not a roce key (bad magic or checksum)");
  return KeyInfo{w.nonce, w.addr, w.size, w.rkey};
}

// ---- Connection ----

Result<std::unique_ptr<Registration>> Connection::Register(const MemoryDescriptor& memory) {
  std::shared_ptr<RoceDevice> device = link_->device_ptr();
  KZ_ASSIGN_OR_RETURN(std::shared_ptr<MemoryRegion> region, device->memory().Get(memory));
  return std::unique_ptr<Registration>(new RoceRegistration(memory, std::move(device), std::move(region)));
}

uint64_t Connection::Track(RoceRequest* request) {
  const uint64_t id = next_id_++;
  if (next_id_ > 0xffffffffu) next_id_ = 1;  // receive ids travel in 32 bits; at most kMaxRequests are live
  request->id = id;
  live_[id] = request;
  return id;
}

RoceRequest* Connection::Find(uint64_t id) {
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

void Connection::Complete(uint64_t id, size_t size) {
  RoceRequest* r = Find(id);
  if (r == nullptr || r->state != RoceRequest::State::kPending) return;
  r->state = RoceRequest::State::kDone;
  r->result = size;
}

void Connection::FailRequest(uint64_t id, Status status) {
  RoceRequest* r = Find(id);
  if (r == nullptr || r->state != RoceRequest::State::kPending) return;
  r->state = RoceRequest::State::kFailed;
  r->failure = std::move(status);
}

void Connection::Break(Status status) {
  if (!broken_.ok()) return;
  broken_ = std::move(status);
  for (auto& [id, r] : live_)
    if (r->state == RoceRequest::State::kPending) {
      r->state = RoceRequest::State::kFailed;
      r->failure = broken_;
    }
}

void Connection::UpdateBroken() {
  if (!broken_.ok() || link_ == nullptr) return;
  if (!link_->failure().ok()) {
    Break(link_->failure());
    return;
  }
  if (const auto gone = link_->peer_gone()) {
    const bool pending = std::any_of(live_.begin(), live_.end(),
                                     [](const auto& e) { return e.second->state == RoceRequest::State::kPending; });
    if (!pending || std::chrono::steady_clock::now() - *gone >= kPeerGoneGrace)
      Break(RemoteError(fmt::format("{}: rank {} closed the connection or exited", link_->label(),
                                    link_->peer_rank())));
  }
}

void Connection::Progress(LinkSink& sink) {
  if (link_ != nullptr && broken_.ok()) link_->Progress(sink);
  UpdateBroken();
}

Result<Completion> Connection::Report(RoceRequest& request) {
  auto finish = [&] { live_.erase(request.id); };
  switch (request.state) {
    case RoceRequest::State::kDone:
      finish();
      return Completion{true, request.result};
    case RoceRequest::State::kFailed:
      finish();
      return request.failure;
    case RoceRequest::State::kPending:
      break;
  }
  return Completion{false, 0};
}

Status Connection::Wait(Deadline deadline, LinkSink& sink) {
  if (!broken_.ok() || link_ == nullptr) return Status::Ok();
  KZ_RETURN_IF_ERROR(link_->Wait(deadline, sink));
  UpdateBroken();
  return Status::Ok();
}

// ---- RoceSendComm ----

RoceSendComm::RoceSendComm(std::string label, FabricDeviceProperties properties, std::unique_ptr<Link> link,
                           uint64_t nonce)
    : SendComm(std::move(label), std::move(properties)), conn_(std::move(link), nonce) {}

// The queue pair goes first (the hardware stops touching registered memory), then the socket
// closes, which the peer sees; requests and registrations go in ~Comm.
RoceSendComm::~RoceSendComm() { conn_.Destroy(); }

Result<std::unique_ptr<Registration>> RoceSendComm::DoRegister(const MemoryDescriptor& memory) {
  return conn_.Register(memory);
}

Result<std::unique_ptr<Request>> RoceSendComm::DoSend(const void* data, size_t size, int tag,
                                                      Registration* registration) {
  conn_.Progress(*this);
  if (!conn_.broken().ok()) return conn_.broken();
  auto request = std::make_unique<RoceRequest>(RequestKind::kSend, tag, size);
  request->data = data;
  request->lkey = registration != nullptr ? static_cast<RoceRegistration*>(registration)->region().lkey() : 0;
  sends_[tag].push_back(conn_.Track(request.get()));
  Match();
  return std::unique_ptr<Request>(std::move(request));
}

Result<std::unique_ptr<Request>> RoceSendComm::DoWrite(const void* data, size_t size, Registration* registration,
                                                       const RemoteKey& remote, uint64_t remote_offset,
                                                       std::optional<uint32_t> immediate) {
  KZ_ASSIGN_OR_RETURN(KeyInfo key, ParseKey(remote));
  if (key.nonce != conn_.nonce())
    return InvalidArgument(fmt::format("{}: the remote key was exposed on another connection", label()));
  if (remote_offset > key.size || size > key.size - remote_offset)
    return InvalidArgument(fmt::format("{}: write of {} bytes at offset {} lies beyond the exposed region of {} bytes",
                                       label(), size, remote_offset, key.size));
  conn_.Progress(*this);
  if (!conn_.broken().ok()) return conn_.broken();
  auto request = std::make_unique<RoceRequest>(RequestKind::kWrite, -1, size);
  Transfer t;
  t.op = conn_.Track(request.get());
  t.data = static_cast<const uint8_t*>(data);
  t.size = size;
  t.lkey = registration != nullptr ? static_cast<RoceRegistration*>(registration)->region().lkey() : 0;
  t.remote = key.addr + remote_offset;
  t.rkey = key.rkey;
  t.immediate = immediate;
  transfers_.push_back(t);
  Pump();
  return std::unique_ptr<Request>(std::move(request));
}

void RoceSendComm::Match() {
  for (auto& [tag, posts] : posts_) {
    auto s = sends_.find(tag);
    if (s == sends_.end()) continue;
    std::deque<uint64_t>& sends = s->second;
    while (!posts.empty() && !sends.empty() && conn_.broken().ok()) {
      const CtrlMsg post = posts.front();
      const uint64_t id = sends.front();
      posts.pop_front();
      sends.pop_front();
      RoceRequest* r = conn_.Find(id);
      if (r == nullptr || r->state != RoceRequest::State::kPending) continue;
      if (r->size() > post.size) {
        CtrlMsg t{static_cast<uint32_t>(CtrlKind::kTruncated), post.id, tag, 0, 0, r->size()};
        conn_.link().PostCtrl(t);
        conn_.FailRequest(id, InvalidArgument(fmt::format("{}: message of {} bytes for tag {} is longer than the "
                                                          "receive's {} bytes", label(), r->size(), tag, post.size)));
        continue;
      }
      Transfer t;
      t.op = id;
      t.data = static_cast<const uint8_t*>(r->data);
      t.size = r->size();
      t.lkey = r->lkey;
      t.remote = post.addr;
      t.rkey = post.rkey;
      t.done = CtrlMsg{static_cast<uint32_t>(CtrlKind::kDone), post.id, tag, 0, 0, r->size()};
      transfers_.push_back(t);
    }
  }
  // Tags come and go: keep only the queues that hold something.
  std::erase_if(posts_, [](const auto& e) { return e.second.empty(); });
  std::erase_if(sends_, [](const auto& e) { return e.second.empty(); });
  Pump();
}

void RoceSendComm::Pump() {
  Link& link = conn_.link();
  const uint64_t chunk = link.device().max_write_bytes();
  while (!transfers_.empty() && conn_.broken().ok()) {
    Transfer& t = transfers_.front();
    // Sends need no work request for 0 bytes (the done message says it); one-sided writes post
    // one, which carries the immediate.
    const bool needs_wr = t.size > 0 || !t.done.has_value();
    while (needs_wr && (t.posted < t.size || !t.started)) {
      if (!link.CanPostWrite()) return;
      const uint64_t n = std::min(chunk, t.size - t.posted);
      const bool last = t.posted + n == t.size;
      // A write completes with its last work request (RC completes them in order); a send
      // completes with its done message.
      const uint64_t op = last && !t.done.has_value() ? t.op : 0;
      Status st = link.PostWrite(op, t.data + t.posted, n, t.lkey, t.remote + t.posted, t.rkey,
                                 last ? t.immediate : std::nullopt);
      if (!st.ok()) {
        conn_.Break(st);
        return;
      }
      t.posted += n;
      t.started = true;
    }
    if (t.done.has_value()) link.PostCtrl(*t.done, t.op);
    transfers_.pop_front();
  }
}

void RoceSendComm::OnOpDone(uint64_t op) {
  RoceRequest* r = conn_.Find(op);
  if (r == nullptr) return;
  conn_.Complete(op, r->size());
}

void RoceSendComm::OnCtrl(const CtrlMsg& msg) {
  if (msg.kind != static_cast<uint32_t>(CtrlKind::kPost)) {
    conn_.Break(RemoteError(fmt::format("{}: rank {} sent an unexpected control message (kind {})", label(),
                                        conn_.link().peer_rank(), msg.kind)));
    return;
  }
  posts_[msg.tag].push_back(msg);
}

void RoceSendComm::OnImmediate(uint32_t) {
  conn_.Break(RemoteError(fmt::format("{}: rank {} wrote into the sending side of the connection", label(),
                                      conn_.link().peer_rank())));
}

Result<Completion> RoceSendComm::DoTest(Request& request) {
  conn_.Progress(*this);
  Match();
  auto& r = static_cast<RoceRequest&>(request);
  KZ_ASSIGN_OR_RETURN(Completion c, conn_.Report(r));
  if (c.done) {
    ++stats_.messages;
    stats_.bytes += c.size;
  }
  return c;
}

Status RoceSendComm::DoWaitForProgress(Deadline deadline) {
  KZ_RETURN_IF_ERROR(conn_.Wait(deadline, *this));
  Match();
  return Status::Ok();
}

// ---- RoceRecvComm ----

RoceRecvComm::RoceRecvComm(std::string label, FabricDeviceProperties properties, std::unique_ptr<Link> link,
                           uint64_t nonce)
    : RecvComm(std::move(label), std::move(properties)), conn_(std::move(link), nonce) {}

RoceRecvComm::~RoceRecvComm() { conn_.Destroy(); }

Result<std::unique_ptr<Registration>> RoceRecvComm::DoRegister(const MemoryDescriptor& memory) {
  return conn_.Register(memory);
}

Result<std::unique_ptr<Request>> RoceRecvComm::DoRecv(void* data, size_t capacity, int tag,
                                                      Registration* registration) {
  conn_.Progress(*this);
  if (!conn_.broken().ok()) return conn_.broken();
  auto request = std::make_unique<RoceRequest>(RequestKind::kRecv, tag, capacity);
  const uint64_t id = conn_.Track(request.get());
  CtrlMsg post{static_cast<uint32_t>(CtrlKind::kPost), static_cast<uint32_t>(id), tag,
               registration != nullptr ? static_cast<RoceRegistration*>(registration)->region().rkey() : 0,
               reinterpret_cast<uintptr_t>(data), capacity};
  conn_.link().PostCtrl(post);
  return std::unique_ptr<Request>(std::move(request));
}

void RoceRecvComm::OnCtrl(const CtrlMsg& msg) {
  RoceRequest* r = conn_.Find(msg.id);
  const bool known = r != nullptr && r->kind() == RequestKind::kRecv;
  if (msg.kind == static_cast<uint32_t>(CtrlKind::kDone) && known && msg.size <= r->size()) {
    conn_.Complete(msg.id, msg.size);
  } else if (msg.kind == static_cast<uint32_t>(CtrlKind::kTruncated) && known) {
    conn_.FailRequest(msg.id, InvalidArgument(fmt::format("{}: message of {} bytes for tag {} is longer than the "
                                                          "receive's {} bytes", label(), msg.size, r->tag(),
                                                          r->size())));
  } else {
    conn_.Break(RemoteError(fmt::format("{}: rank {} sent an unexpected control message (kind {}, receive {}, {} "
                                        "bytes)", label(), conn_.link().peer_rank(), msg.kind, msg.id, msg.size)));
  }
}

void RoceRecvComm::OnImmediate(uint32_t value) { immediates_.push_back(value); }

Result<Completion> RoceRecvComm::DoTest(Request& request) {
  conn_.Progress(*this);
  auto& r = static_cast<RoceRequest&>(request);
  KZ_ASSIGN_OR_RETURN(Completion c, conn_.Report(r));
  if (c.done) {
    ++stats_.messages;
    stats_.bytes += c.size;
  }
  return c;
}

Status RoceRecvComm::DoWaitForProgress(Deadline deadline) { return conn_.Wait(deadline, *this); }

Result<RemoteKey> RoceRecvComm::DoExpose(Registration& registration) {
  const auto& reg = static_cast<RoceRegistration&>(registration);
  return EncodeKey(KeyInfo{conn_.nonce(), reinterpret_cast<uintptr_t>(reg.memory().data), reg.memory().size,
                           reg.region().rkey()});
}

Result<std::optional<uint32_t>> RoceRecvComm::DoPollImmediate() {
  conn_.Progress(*this);
  if (!immediates_.empty()) {
    const uint32_t v = immediates_.front();
    immediates_.pop_front();
    return std::optional<uint32_t>(v);
  }
  if (!conn_.broken().ok()) return conn_.broken();
  return std::optional<uint32_t>();
}

}  // namespace kizuna::fabric::roce
