#include "fabric/tcp/transfer.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "fabric/tcp/memory.h"
#include "runtime/core/host_id.h"

namespace kizuna::fabric::tcp {
namespace {

Status TooLong(const std::string& label, uint64_t message, uint64_t capacity, int tag) {
  return InvalidArgument(fmt::format("{}: a message of {} bytes is longer than its receive ({} bytes, tag {})", label,
                                     message, capacity, tag));
}

}  // namespace

// ---- Hub ----

void Hub::Add(HubMember* m) {
  std::lock_guard<std::mutex> lock(mu_);
  members_.push_back(m);
}

void Hub::Remove(HubMember* m) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase(members_, m);
}

Status Hub::Wait(HubMember& self, Deadline deadline) {
  const bool yield = HostOversubscribed();
  const auto spin_until = std::min(std::chrono::steady_clock::now() + kSpinWait, deadline.when());
  std::vector<pollfd> fds;
  for (bool first = true;; first = false) {
    const bool spinning = std::chrono::steady_clock::now() < spin_until;
    if (spinning && yield && !first) sched_yield();
    fds.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (HubMember* m : members_) {
        if (m == &self) {
          // This thread owns `self`; only another wait can hold its lock, and that one holds mu_.
          std::lock_guard<std::mutex> own(m->mu);
          if (m->ProgressLocked()) return Status::Ok();
          if (!spinning) m->AppendPollFds(fds);
          continue;
        }
        std::unique_lock<std::mutex> other(m->mu, std::try_to_lock);
        if (!other.owns_lock()) continue;  // its owner is driving it right now
        m->ProgressLocked();
        if (!spinning) m->AppendPollFds(fds);
      }
    }
    if (!spinning) break;
  }
  const auto limit = std::min<std::chrono::nanoseconds>(deadline.Remaining(), kMaxBlock);
  if (limit.count() <= 0) return Status::Ok();
  timespec ts{static_cast<time_t>(limit.count() / 1000000000), static_cast<long>(limit.count() % 1000000000)};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) < 0 && errno != EINTR) return FromErrno(errno, "tcp: ppoll");
  return Status::Ok();
}

void Hub::AddTwoWay(uint64_t nonce, const std::shared_ptr<Connection>& c) {
  std::lock_guard<std::mutex> lock(two_way_mu_);
  std::erase_if(two_way_, [](const auto& e) { return e.second.expired(); });
  two_way_[nonce] = c;
}

std::shared_ptr<Connection> Hub::FindTwoWay(uint64_t nonce) {
  std::lock_guard<std::mutex> lock(two_way_mu_);
  auto it = two_way_.find(nonce);
  return it == two_way_.end() ? nullptr : it->second.lock();
}

// ---- Connection ----

Connection::Connection(std::vector<UniqueFd> fds, std::string label, bool sending, Hub& hub, uint64_t nonce,
                       bool two_way)
    : hub_(hub), link_(std::move(fds), std::move(label), /*bulk_in=*/!sending), nonce_(nonce), two_way_(two_way) {
  hub_.Add(this);
}

Connection::~Connection() {
  hub_.Remove(this);  // waits for another thread's wait that may be progressing this connection
  link_.CloseGracefully(kCloseLinger);
}

void Connection::Attach(TcpSendComm* c) {
  send_ = c;
  // Posts that came first (the peer's receives, posted as soon as its end of the way back was
  // there).
  std::vector<Frame> early = std::move(early_posts_);
  early_posts_.clear();
  for (const Frame& f : early)
    if (Status st = static_cast<FrameSink&>(*c).OnControl(f); !st.ok()) link_.Break(st);
  if (!link_.broken().ok()) AfterBreak();
}

void Connection::Attach(TcpRecvComm* c) {
  recv_ = c;
  data_after_recv_ = false;
}

void Connection::Detach(TcpSendComm* c) {
  if (send_ != c) return;
  send_ = nullptr;
  // Its frames still queued read its requests' buffers, which go with it.
  if (c->has_queued_frames()) {
    link_.Close();
    AfterBreak();
  }
}

void Connection::Detach(TcpRecvComm* c) {
  if (recv_ != c) return;
  recv_ = nullptr;
  data_after_recv_ = true;
  link_.DropPayloads();  // a payload being read went into its receives' buffers
}

Result<uint8_t*> Connection::OnData(const Frame& f) {
  if (recv_ != nullptr) return static_cast<FrameSink&>(*recv_).OnData(f);
  if (data_after_recv_) return nullptr;
  return RemoteError(fmt::format("{}: protocol error: data on a connection that does not receive", link_.label()));
}

Status Connection::OnDataDone(const Frame& f) {
  return recv_ != nullptr ? static_cast<FrameSink&>(*recv_).OnDataDone(f) : Status::Ok();
}

Status Connection::OnControl(const Frame& f) {
  if (f.type == FrameType::kPost) {
    if (send_ != nullptr) return static_cast<FrameSink&>(*send_).OnControl(f);
    if (!two_way_)
      return RemoteError(fmt::format("{}: protocol error: a post on a connection that does not send", link_.label()));
    early_posts_.push_back(f);
    return Status::Ok();
  }
  if (recv_ != nullptr) return static_cast<FrameSink&>(*recv_).OnControl(f);
  return Status::Ok();  // a truncation notice for receives that went with their comm
}

void Connection::OnWritten(void* owner) {
  if (send_ != nullptr) static_cast<FrameSink&>(*send_).OnWritten(owner);
}

bool Connection::ProgressLocked() {
  if (!link_.broken().ok()) return false;
  const bool moved = link_.Progress(*this);
  just_moved_ = moved;
  if (!link_.broken().ok()) AfterBreak();
  return moved;
}

void Connection::AfterBreak() {
  // Queued output is abandoned with the link: no frame refers to a request's buffer any more.
  link_.Close();
  if (send_ != nullptr) send_->AfterBreak();
  if (recv_ != nullptr) recv_->AfterBreak();
}

// ---- TcpSendComm ----

TcpSendComm::TcpSendComm(std::string label, FabricDeviceProperties properties, std::shared_ptr<Connection> connection,
                         std::vector<int> bulk)
    : SendComm(std::move(label), std::move(properties)),
      connection_(std::move(connection)),
      link_(connection_->link()),
      bulk_(std::move(bulk)) {
  std::lock_guard<std::mutex> lock(connection_->mu);
  link_.PostsComeOn(bulk_[0]);
  connection_->Attach(this);
}

TcpSendComm::~TcpSendComm() {
  std::lock_guard<std::mutex> lock(connection_->mu);
  connection_->Detach(this);
}

Result<std::unique_ptr<Registration>> TcpSendComm::DoRegister(const MemoryDescriptor& memory) {
  KZ_ASSIGN_OR_RETURN(auto r, TcpRegistration::Create(memory));
  return std::unique_ptr<Registration>(std::move(r));
}

Status TcpSendComm::DoDeregister(Registration&) { return Status::Ok(); }

Result<std::unique_ptr<Request>> TcpSendComm::DoSend(const void* data, size_t size, int tag,
                                                     Registration* registration) {
  std::lock_guard<std::mutex> lock(connection_->mu);
  if (!link_.broken().ok()) return link_.broken();
  auto r = std::make_unique<TcpRequest>(RequestKind::kSend, tag, size);
  if (size > 0) r->local = static_cast<const TcpRegistration*>(registration)->Local(data);
  r->seq = next_seq_[tag]++;
  const MessageKey key{tag, r->seq};
  live_.Add(r.get());
  if (auto it = early_posts_.find(key); it != early_posts_.end()) {
    const uint64_t capacity = it->second;
    early_posts_.erase(it);
    if (size > capacity) {
      Fail(*r, TooLong(label(), size, capacity, tag));
      Frame t{.type = FrameType::kTruncated, .tag = tag, .seq = r->seq, .total = size};
      link_.Queue(0, t, nullptr, nullptr);
    } else {
      r->post_seen = true;
      Transmit(*r);
    }
  } else if (size <= kEagerBytes && eager_in_flight_ + size <= kEagerCredit) {
    r->eager = true;
    eager_in_flight_ += size;
    waiting_[key] = r.get();
    Transmit(*r);
  } else {
    waiting_[key] = r.get();  // leaves when its post arrives
  }
  ReadPostsWhileWaiting();
  link_.Flush(*connection_);
  if (!link_.broken().ok()) connection_->AfterBreak();  // fails both comms' requests
  return std::unique_ptr<Request>(std::move(r));
}

void TcpSendComm::Transmit(TcpRequest& r) {
  r.transmitted = true;
  const uint64_t size = r.size();
  const auto n = static_cast<uint64_t>(bulk_.size());
  if (size <= kEagerBytes || size < kStripeBytes || n == 1) {
    // Small messages share stream 0 with the posts (both ways on a two-way connection); a larger
    // one goes on the first bulk stream, so that no post waits behind it.
    const int stream = size <= kEagerBytes ? 0 : bulk_[0];
    Frame f{.type = FrameType::kData, .tag = r.tag(), .seq = r.seq, .total = size, .offset = 0, .length = size};
    link_.Queue(stream, f, r.local, &r);
    ++r.unwritten;
    ++unwritten_frames_;
  } else {
    // One frame per bulk stream, in 4 KiB multiples: the sockets carry the message side by side.
    const uint64_t part = ((size + n - 1) / n + 4095) / 4096 * 4096;
    for (size_t s = 0; s < bulk_.size(); ++s) {
      const uint64_t offset = part * s;
      if (offset >= size) break;
      const uint64_t length = std::min(part, size - offset);
      Frame f{
          .type = FrameType::kData, .tag = r.tag(), .seq = r.seq, .total = size, .offset = offset, .length = length};
      link_.Queue(bulk_[s], f, r.local + offset, &r);
      ++r.unwritten;
      ++unwritten_frames_;
    }
  }
}

void TcpSendComm::OnWritten(void* owner) {
  auto* r = static_cast<TcpRequest*>(owner);
  --r->unwritten;
  --unwritten_frames_;
  MaybeDone(*r);
}

void TcpSendComm::MaybeDone(TcpRequest& r) {
  if (r.state != TcpRequest::State::kActive || !r.transmitted || r.unwritten > 0 || !r.post_seen) return;
  r.state = TcpRequest::State::kDone;
  ++stats_.messages;
  stats_.bytes += r.size();
}

void TcpSendComm::Fail(TcpRequest& r, Status why) {
  if (r.state != TcpRequest::State::kActive) return;
  r.state = TcpRequest::State::kFailed;
  r.failure = std::move(why);
}

Result<uint8_t*> TcpSendComm::OnData(const Frame&) {
  return RemoteError(fmt::format("{}: protocol error: data on the connection's return direction", label()));
}

Status TcpSendComm::OnDataDone(const Frame&) { return Status::Ok(); }

Status TcpSendComm::OnControl(const Frame& f) {
  if (f.type != FrameType::kPost)
    return RemoteError(
        fmt::format("{}: protocol error: a frame of type {} from the receiver", label(), static_cast<int>(f.type)));
  const MessageKey key{f.tag, f.seq};
  auto it = waiting_.find(key);
  if (it == waiting_.end()) {
    // Its send is not posted yet (or the post repeats one: a protocol error).
    auto next = next_seq_.find(f.tag);
    if ((next != next_seq_.end() && f.seq < next->second) || !early_posts_.emplace(key, f.total).second)
      return RemoteError(
          fmt::format("{}: protocol error: a second post for message {} of tag {}", label(), f.seq, f.tag));
    return Status::Ok();
  }
  TcpRequest& r = *it->second;
  waiting_.erase(it);
  ReadPostsWhileWaiting();
  if (r.eager) eager_in_flight_ -= r.size();
  if (r.size() > f.total) {
    // An eager message the receiver has dropped already (and failed its receive); a waiting one
    // never leaves, and the receiver learns why.
    if (!r.transmitted) {
      Frame t{.type = FrameType::kTruncated, .tag = r.tag(), .seq = r.seq, .total = r.size()};
      link_.Queue(0, t, nullptr, nullptr);
    }
    Fail(r, TooLong(label(), r.size(), f.total, r.tag()));
    return Status::Ok();
  }
  r.post_seen = true;
  if (!r.transmitted) Transmit(r);
  MaybeDone(r);
  return Status::Ok();
}

void TcpSendComm::AfterBreak() {
  const Status why = link_.broken();
  live_.ForEach([&](TcpRequest& r) {
    r.unwritten = 0;
    Fail(r, why);
  });
  unwritten_frames_ = 0;
  waiting_.clear();
}

Result<Completion> TcpSendComm::DoTest(Request& request) {
  std::lock_guard<std::mutex> lock(connection_->mu);
  auto& r = static_cast<TcpRequest&>(request);
  // A request already done needs no look at the sockets (a system call each): posts are sent
  // ahead, so a small send is often done once written.
  if (r.state != TcpRequest::State::kDone) connection_->ProgressForTest();
  // A failed request whose frames are still queued is reported once they are written (the link
  // still reads its buffer until then).
  if (r.state == TcpRequest::State::kDone) {
    live_.Remove(&r);
    return Completion{true, r.size()};
  }
  if (r.state == TcpRequest::State::kFailed && r.unwritten == 0) {
    live_.Remove(&r);
    waiting_.erase(MessageKey{r.tag(), r.seq});
    ReadPostsWhileWaiting();
    return r.failure;
  }
  return Completion{false, 0};
}

Status TcpSendComm::DoWaitForProgress(Deadline deadline) { return connection_->hub().Wait(*connection_, deadline); }

// ---- TcpRecvComm ----

TcpRecvComm::TcpRecvComm(std::string label, FabricDeviceProperties properties, std::shared_ptr<Connection> connection,
                         int post_stream)
    : RecvComm(std::move(label), std::move(properties)),
      connection_(std::move(connection)),
      link_(connection_->link()),
      post_stream_(post_stream) {
  std::lock_guard<std::mutex> lock(connection_->mu);
  connection_->Attach(this);
}

TcpRecvComm::~TcpRecvComm() {
  std::lock_guard<std::mutex> lock(connection_->mu);
  connection_->Detach(this);
}

Result<std::unique_ptr<Registration>> TcpRecvComm::DoRegister(const MemoryDescriptor& memory) {
  KZ_ASSIGN_OR_RETURN(auto r, TcpRegistration::Create(memory));
  return std::unique_ptr<Registration>(std::move(r));
}

Status TcpRecvComm::DoDeregister(Registration&) { return Status::Ok(); }

Result<std::unique_ptr<Request>> TcpRecvComm::DoRecv(void* data, size_t capacity, int tag, Registration* registration) {
  std::lock_guard<std::mutex> lock(connection_->mu);
  if (!link_.broken().ok()) return link_.broken();
  auto r = std::make_unique<TcpRequest>(RequestKind::kRecv, tag, capacity);
  if (capacity > 0) r->local = static_cast<const TcpRegistration*>(registration)->Local(data);
  r->seq = next_seq_[tag]++;
  const MessageKey key{tag, r->seq};
  live_.Add(r.get());
  // The post goes whatever happens next: the sender completes (or fails) its send on it.
  Frame post{.type = FrameType::kPost, .tag = tag, .seq = r->seq, .total = capacity};
  link_.Queue(post_stream_, post, nullptr, nullptr);
  if (auto it = unexpected_.find(key); it != unexpected_.end()) {
    if (it->second.complete) {
      Deliver(*r, it->second);
      unexpected_.erase(it);
    } else {
      awaiting_unexpected_[key] = r.get();  // its message is being read into the buffer
    }
  } else {
    posted_[key] = r.get();
    if (capacity > kEagerBytes && large_posted_++ == 0) link_.set_read_all_streams(true);
  }
  // The post leaves now: the sender may be waiting for it, and nothing says this comm will be
  // progressed again. In a batch (BeginPosts), with the batch's others at EndPosts.
  if (!batching_) link_.Flush(*connection_);
  if (!link_.broken().ok()) connection_->AfterBreak();  // fails both comms' requests
  return std::unique_ptr<Request>(std::move(r));
}

void TcpRecvComm::DoBeginPosts() {
  std::lock_guard<std::mutex> lock(connection_->mu);
  batching_ = true;
}

void TcpRecvComm::DoEndPosts() {
  std::lock_guard<std::mutex> lock(connection_->mu);
  batching_ = false;
  if (!link_.broken().ok()) return;
  link_.Flush(*connection_);  // the batch's posts, in one sendmsg where they fit its gather list
  if (!link_.broken().ok()) connection_->AfterBreak();
}

void TcpRecvComm::Deliver(TcpRequest& r, Unexpected& u) {
  if (u.bytes.size() > r.size()) {
    Fail(r, TooLong(label(), u.bytes.size(), r.size(), r.tag()));
    return;
  }
  if (!u.bytes.empty()) std::memcpy(r.local, u.bytes.data(), u.bytes.size());
  stats_.staged_bytes += u.bytes.size();
  r.total = r.received = u.bytes.size();
  Complete(r);
}

void TcpRecvComm::Complete(TcpRequest& r) {
  r.state = TcpRequest::State::kDone;
  ++stats_.messages;
  stats_.bytes += r.received;
}

void TcpRecvComm::Fail(TcpRequest& r, Status why) {
  if (r.state != TcpRequest::State::kActive) return;
  r.state = TcpRequest::State::kFailed;
  r.failure = std::move(why);
}

void TcpRecvComm::Forget(const MessageKey& key) {
  auto it = posted_.find(key);
  if (it == posted_.end()) return;
  if (it->second->size() > kEagerBytes && --large_posted_ == 0) link_.set_read_all_streams(false);
  posted_.erase(it);
}

Result<uint8_t*> TcpRecvComm::OnData(const Frame& f) {
  const MessageKey key{f.tag, f.seq};
  if (auto it = posted_.find(key); it != posted_.end()) {
    TcpRequest& r = *it->second;
    if (f.total > r.size()) {
      // Only an eager message comes unannounced this way; the sender fails its send on the post.
      Fail(r, TooLong(label(), f.total, r.size(), f.tag));
      Forget(key);
      return nullptr;
    }
    r.total = f.total;
    return r.local + f.offset;
  }
  // Not posted: only an eager message may arrive before its receive, whole, in one frame.
  if (f.offset != 0 || f.length != f.total || f.total > kEagerBytes || unexpected_.count(key) != 0)
    return RemoteError(
        fmt::format("{}: protocol error: message {} of tag {} ({} bytes at offset {} of {}) arrived "
                    "before its receive was posted",
                    label(), f.seq, f.tag, f.length, f.offset, f.total));
  Unexpected& u = unexpected_[key];
  u.bytes.resize(f.total);
  return u.bytes.data();
}

Status TcpRecvComm::OnDataDone(const Frame& f) {
  const MessageKey key{f.tag, f.seq};
  if (auto u = unexpected_.find(key); u != unexpected_.end()) {
    u->second.complete = true;
    if (auto w = awaiting_unexpected_.find(key); w != awaiting_unexpected_.end()) {
      Deliver(*w->second, u->second);
      awaiting_unexpected_.erase(w);
      unexpected_.erase(u);
    }
    return Status::Ok();
  }
  auto it = posted_.find(key);
  if (it == posted_.end()) return Status::Ok();  // a message its receive did not fit: dropped
  TcpRequest& r = *it->second;
  r.received += f.length;
  if (r.received == r.total) {
    Forget(key);
    Complete(r);
  }
  return Status::Ok();
}

Status TcpRecvComm::OnControl(const Frame& f) {
  if (f.type != FrameType::kTruncated)
    return RemoteError(
        fmt::format("{}: protocol error: a frame of type {} from the sender", label(), static_cast<int>(f.type)));
  const MessageKey key{f.tag, f.seq};
  auto it = posted_.find(key);
  if (it == posted_.end()) return Status::Ok();
  Fail(*it->second, TooLong(label(), f.total, it->second->size(), f.tag));
  Forget(key);
  return Status::Ok();
}

void TcpRecvComm::AfterBreak() {
  const Status why = link_.broken();
  live_.ForEach([&](TcpRequest& r) { Fail(r, why); });
  posted_.clear();
  awaiting_unexpected_.clear();
  large_posted_ = 0;
}

Result<Completion> TcpRecvComm::DoTest(Request& request) {
  std::lock_guard<std::mutex> lock(connection_->mu);
  auto& r = static_cast<TcpRequest&>(request);
  if (r.state != TcpRequest::State::kDone) connection_->ProgressForTest();
  if (r.state == TcpRequest::State::kDone) {
    live_.Remove(&r);
    return Completion{true, r.received};
  }
  if (r.state == TcpRequest::State::kFailed) {
    live_.Remove(&r);
    Forget(MessageKey{r.tag(), r.seq});
    awaiting_unexpected_.erase(MessageKey{r.tag(), r.seq});
    return r.failure;
  }
  return Completion{false, 0};
}

Status TcpRecvComm::DoWaitForProgress(Deadline deadline) { return connection_->hub().Wait(*connection_, deadline); }

}  // namespace kizuna::fabric::tcp
