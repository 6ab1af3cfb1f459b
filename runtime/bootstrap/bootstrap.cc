#include "runtime/bootstrap/bootstrap.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/auth.h"
#include "runtime/bootstrap/socket.h"
#include "runtime/logging.h"

namespace kizuna::bootstrap {

// ---------------------------------------------------------------------------------------------
// The non-virtual wrappers: argument checks, one call at a time, sticky collective failures.

namespace {
constexpr std::string_view kAllGather = "AllGather";
constexpr std::string_view kBarrier = "Barrier";
}  // namespace

Status Bootstrap::Enter(std::string_view op) {
  if (busy_.exchange(true, std::memory_order_acquire)) {
    return InvalidArgument(fmt::format("{}: this Bootstrap (rank {}) is already serving a call from another "
                                       "thread; it serves one call at a time",
                                       op, rank_));
  }
  if (!failed_.ok()) {
    busy_.store(false, std::memory_order_release);
    return Aborted(fmt::format("{}: the bootstrap is unusable after an earlier failure: {}", op, failed_.ToString()));
  }
  return Status::Ok();
}

void Bootstrap::Leave() { busy_.store(false, std::memory_order_release); }

class Bootstrap::CallGuard {
 public:
  explicit CallGuard(Bootstrap* b) : b_(b) {}
  ~CallGuard() { b_->Leave(); }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  Bootstrap* b_;
};

Result<std::vector<Bytes>> Bootstrap::AllGather(std::span<const uint8_t> mine, Deadline deadline) {
  if (mine.size() > kMaxMessageBytes)
    return InvalidArgument(fmt::format("AllGather: {} bytes from rank {} exceed the limit of {} bytes per rank",
                                       mine.size(), rank_, kMaxMessageBytes));
  KZ_RETURN_IF_ERROR(Enter(kAllGather));
  CallGuard guard(this);
  Result<std::vector<Bytes>> r = DoAllGather(mine, deadline);
  if (!r.ok()) failed_ = r.status();
  return r;
}

Status Bootstrap::Barrier(Deadline deadline) {
  KZ_RETURN_IF_ERROR(Enter(kBarrier));
  CallGuard guard(this);
  Status s = DoBarrier(deadline);
  if (!s.ok()) failed_ = s;
  return s;
}

Status Bootstrap::Send(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) {
  if (peer < 0 || peer >= size_)
    return InvalidArgument(fmt::format("Send: peer {} is not a rank (size {})", peer, size_));
  if (bytes.size() > kMaxMessageBytes)
    return InvalidArgument(
        fmt::format("Send: {} bytes exceed the bootstrap's limit of {} bytes per message", bytes.size(), kMaxMessageBytes));
  KZ_RETURN_IF_ERROR(Enter("Send"));
  CallGuard guard(this);
  return DoSend(peer, tag, bytes, deadline);
}

Result<Bytes> Bootstrap::Recv(int peer, uint32_t tag, Deadline deadline) {
  if (peer < 0 || peer >= size_)
    return InvalidArgument(fmt::format("Recv: peer {} is not a rank (size {})", peer, size_));
  KZ_RETURN_IF_ERROR(Enter("Recv"));
  CallGuard guard(this);
  return DoRecv(peer, tag, deadline);
}

// ---------------------------------------------------------------------------------------------
// TCP.

namespace {

using Clock = Deadline::Clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Little-endian encoding, so ranks on hosts of different byte order agree.
void PutU16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}
void PutU32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutString(Bytes& b, std::string_view s) {
  PutU16(b, static_cast<uint16_t>(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}

// Reads what Put* wrote; every read is bounds-checked (ok() turns false on a short message).
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> b) : b_(b) {}
  uint64_t Uint(int bytes) {
    if (!ok_ || pos_ + bytes > b_.size()) {
      ok_ = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{b_[pos_ + i]} << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::string String(size_t max) {
    size_t n = Uint(2);
    if (!ok_ || n > max || pos_ + n > b_.size()) {
      ok_ = false;
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  std::span<const uint8_t> Take(size_t n) {
    if (!ok_ || pos_ + n > b_.size()) {
      ok_ = false;
      return {};
    }
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  bool ok() const { return ok_; }
  bool AtEnd() const { return ok_ && pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Frames on authenticated connections: a fixed header, then `length` payload bytes.
enum class FrameType : uint32_t {
  kJoin = 1,          // rank -> root: rank, size, where it listens for peers
  kWelcome = 2,       // root -> rank: every rank's listening address
  kAbort = 3,         // root -> rank: the job failed (status code and message)
  kGather = 4,        // rank -> root: a collective contribution (tag: kind)
  kGatherResult = 5,  // root -> rank: every rank's contribution (tag: kind)
  kPeerHello = 6,     // first frame on a peer-to-peer connection: sender and intended receiver
  kData = 7,          // peer-to-peer message (tag: the caller's tag)
};
constexpr uint32_t kFrameMagic = 0x46425a4b;  // "KZBF"
constexpr size_t kFrameHeaderBytes = 24;
constexpr size_t kMaxIntroBytes = 4096;
constexpr size_t kMaxAbortBytes = 64 * 1024;
constexpr size_t kMaxHostBytes = 255;
constexpr uint32_t kKindAllGather = 0;
constexpr uint32_t kKindBarrier = 1;

std::string_view KindName(uint32_t kind) { return kind == kKindBarrier ? kBarrier : kAllGather; }

size_t MaxPayload(FrameType type, int size) {
  switch (type) {
    case FrameType::kJoin:
    case FrameType::kPeerHello: return kMaxIntroBytes;
    case FrameType::kWelcome: return 16 + static_cast<size_t>(size) * (4 + kMaxHostBytes);
    case FrameType::kAbort: return kMaxAbortBytes;
    case FrameType::kGather:
    case FrameType::kData: return kMaxMessageBytes;
    case FrameType::kGatherResult: return kMaxAllGatherBytes + 8 + 8 * static_cast<size_t>(size);
  }
  return 0;
}

Bytes FrameHeader(FrameType type, uint32_t tag, uint64_t length) {
  Bytes h;
  h.reserve(kFrameHeaderBytes);
  PutU32(h, kFrameMagic);
  PutU32(h, static_cast<uint32_t>(type));
  PutU32(h, tag);
  PutU32(h, 0);
  PutU64(h, length);
  return h;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  const size_t kShown = 16;
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) s += fmt::format(" and {} more", ranks.size() - kShown);
  return s;
}

std::string PluralRanks(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", RankList(ranks));
}

struct OutChunk {
  std::shared_ptr<const Bytes> data;
  size_t offset = 0;
};

struct Conn {
  enum class Phase {
    kConnecting,         // client: connect() in progress, or waiting to retry (fd invalid)
    kAwaitServerHello,   // client: hello sent, reading the server's reply
    kAwaitClientHello,   // server: reading the client's hello
    kAwaitClientProof,   // server: reading the client's proof
    kAwaitIntro,         // server: authenticated, reading the Join or PeerHello frame
    kEstablished,        // frames
    kClosed,
  };
  enum class Role {
    kPending,   // accepted, not identified yet
    kToRoot,    // non-root: the rendezvous connection
    kFromRank,  // root: the rendezvous connection of rank `peer`
    kPeerOut,   // this rank sends to `peer`
    kPeerIn,    // `peer` sends to this rank
  };

  UniqueFd fd;
  Phase phase = Phase::kConnecting;
  Role role = Role::kPending;
  int peer = -1;
  std::string address;  // the remote end, for messages
  Clock::time_point handshake_deadline{};
  std::optional<ClientHandshake> client;
  std::optional<ServerHandshake> server;

  // Input: the unit being read (a handshake message, a frame header or a frame payload).
  Bytes in;
  size_t in_have = 0;
  bool in_payload = false;
  FrameType frame_type{};
  uint32_t frame_tag = 0;

  std::deque<OutChunk> out;
  std::deque<OutChunk> later;  // client: frames queued before authentication finished
  std::string closed_reason;  // why it closed (kClosed)
  bool dead = false;          // pending connection to be removed

  // Client connections: where to connect and when to try again.
  std::vector<net::Address> targets;
  size_t next_target = 0;
  Clock::time_point retry_at{};
  std::chrono::milliseconds backoff{20};
  std::string last_error;

  bool open() const { return phase != Phase::kClosed; }
  void Expect(size_t n) {
    in.assign(n, 0);
    in_have = 0;
  }
};

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(const UniqueId& id, int rank, int size, const TcpBootstrapOptions& options)
      : Bootstrap(rank, size),
        id_(id),
        options_(options),
        rank_conn_(size, nullptr),
        in_conn_(size, nullptr),
        out_conn_(size, nullptr),
        peers_(size),
        gather_in_(size) {}

  std::string_view kind() const override { return "tcp"; }

  Status Start(Deadline deadline);

 protected:
  Result<std::vector<Bytes>> DoAllGather(std::span<const uint8_t> mine, Deadline deadline) override {
    return Collective(kKindAllGather, mine, deadline);
  }
  Status DoBarrier(Deadline deadline) override { return Collective(kKindBarrier, {}, deadline).status(); }
  Status DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) override;
  Result<Bytes> DoRecv(int peer, uint32_t tag, Deadline deadline) override;

 private:
  bool is_root() const { return rank() == 0; }
  std::string Me() const { return fmt::format("bootstrap rank {}/{}", rank(), size()); }

  // Root: the deadline it waits for others, a little before the caller's, so that its verdict
  // reaches the other ranks before their own deadlines.
  static Deadline RootWaitDeadline(Deadline deadline) {
    auto margin = std::min<std::chrono::nanoseconds>(std::chrono::seconds(1), deadline.Remaining() / 10);
    return Deadline::At(deadline.when() - margin);
  }

  Status StartRoot(Deadline deadline);
  Status StartNonRoot(Deadline deadline);
  Result<std::vector<Bytes>> Collective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline);
  Result<std::vector<Bytes>> RootCollective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline);

  // The poll loop: runs until done() (ok), a fatal error (that error), or the deadline
  // (on_timeout()).
  Status Progress(Deadline deadline, const std::function<bool()>& done,
                  const std::function<Status()>& on_timeout);
  void Accept();
  void StartConnect(Conn& c);
  void FinishConnect(Conn& c);
  void ClientConnectFailed(Conn& c, const std::string& why, bool retryable);
  void ReadAvailable(Conn& c);
  void Flush(Conn& c);
  void OnUnit(Conn& c);
  void OnFrame(Conn& c, Bytes payload);
  void OnIntro(Conn& c, Bytes payload);
  void OnClientAuthenticated(Conn& c);
  void Close(Conn& c, std::string reason);
  void Reject(Conn& c, std::string_view reason);
  void QueueFrame(Conn& c, FrameType type, uint32_t tag, std::span<const uint8_t> payload);
  void QueueShared(Conn& c, FrameType type, uint32_t tag, std::shared_ptr<const Bytes> payload);
  Conn* NewConn(Conn::Role role);
  void RemoveDead();
  // Root: tells every rank (and `also`, a connection not identified yet) that the job failed,
  // waits up to a second for the messages to leave, and makes the failure sticky.
  Status FailJob(Status status, Conn* also = nullptr);

  const UniqueId id_;
  const TcpBootstrapOptions options_;
  UniqueFd listener_;
  std::vector<net::Address> root_addresses_;
  std::vector<std::unique_ptr<Conn>> conns_;  // every connection; Conn objects never move
  Conn* root_conn_ = nullptr;                 // non-root
  std::vector<Conn*> rank_conn_;              // root: rendezvous connection of each rank
  std::vector<Conn*> in_conn_;                // peer-to-peer, from each rank
  std::vector<Conn*> out_conn_;               // peer-to-peer, to each rank
  std::vector<HostPort> peers_;               // where each rank listens (after the rendezvous)
  std::map<std::pair<int, uint32_t>, std::deque<Bytes>> mailbox_;
  std::vector<std::deque<std::pair<uint32_t, Bytes>>> gather_in_;  // root: contributions by rank
  std::deque<std::pair<uint32_t, Bytes>> results_;                  // non-root: root's answers
  int joined_ = 0;               // root: ranks whose Join was accepted
  bool rendezvous_done_ = false;
  bool welcomed_ = false;        // non-root
  Status fatal_;                 // the job failed (the root said so, or a protocol violation)
  Status job_error_;             // root: a misconfigured job found inside the poll loop
  Conn* job_error_conn_ = nullptr;  // ... and the connection that revealed it
  Clock::time_point listener_paused_until_{};  // out of file descriptors: accept later
  std::string listen_text_;      // where this rank listens, for logs
};

Conn* TcpBootstrap::NewConn(Conn::Role role) {
  conns_.push_back(std::make_unique<Conn>());
  Conn* c = conns_.back().get();
  c->role = role;
  return c;
}

void TcpBootstrap::RemoveDead() {
  std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
}

void TcpBootstrap::Close(Conn& c, std::string reason) {
  if (c.phase == Conn::Phase::kClosed) return;
  c.phase = Conn::Phase::kClosed;
  c.closed_reason = std::move(reason);
  c.fd.Reset();
  c.out.clear();
  c.later.clear();
  KZ_TRACE(kLogBootstrap, "{}: connection with {} closed: {}", Me(), c.address, c.closed_reason);
}

void TcpBootstrap::Reject(Conn& c, std::string_view reason) {
  KZ_WARN(kLogBootstrap, "{}: rejected a connection from {}: {}; nothing it sent was used", Me(), c.address, reason);
  Close(c, std::string(reason));
  c.dead = true;
}

// Frames wait in `later` until a client connection has authenticated: the handshake goes first.
static std::deque<OutChunk>& FrameQueue(Conn& c) {
  bool before_auth = c.phase == Conn::Phase::kConnecting || c.phase == Conn::Phase::kAwaitServerHello;
  return before_auth ? c.later : c.out;
}

void TcpBootstrap::QueueFrame(Conn& c, FrameType type, uint32_t tag, std::span<const uint8_t> payload) {
  std::deque<OutChunk>& q = FrameQueue(c);
  Bytes frame = FrameHeader(type, tag, payload.size());
  if (payload.size() <= 64 * 1024) {  // one buffer, one send()
    frame.insert(frame.end(), payload.begin(), payload.end());
    q.push_back({std::make_shared<const Bytes>(std::move(frame)), 0});
    return;
  }
  q.push_back({std::make_shared<const Bytes>(std::move(frame)), 0});
  q.push_back({std::make_shared<const Bytes>(payload.begin(), payload.end()), 0});
}

void TcpBootstrap::QueueShared(Conn& c, FrameType type, uint32_t tag, std::shared_ptr<const Bytes> payload) {
  std::deque<OutChunk>& q = FrameQueue(c);
  q.push_back({std::make_shared<const Bytes>(FrameHeader(type, tag, payload->size())), 0});
  if (!payload->empty()) q.push_back({std::move(payload), 0});
}

Status TcpBootstrap::FailJob(Status status, Conn* also) {
  job_error_ = Status::Ok();
  job_error_conn_ = nullptr;
  if (is_root()) {
    Bytes msg;
    PutU32(msg, static_cast<uint32_t>(status.code()));
    std::string text = status.message().substr(0, kMaxAbortBytes - 64);
    PutU32(msg, static_cast<uint32_t>(text.size()));
    msg.insert(msg.end(), text.begin(), text.end());
    std::vector<Conn*> targets;
    for (Conn* c : rank_conn_)
      if (c != nullptr && c->open()) targets.push_back(c);
    if (also != nullptr && also->open()) targets.push_back(also);
    // Behind whatever is queued: cutting a frame short would leave the rank unable to parse this.
    for (Conn* c : targets) QueueFrame(*c, FrameType::kAbort, 0, msg);
    // Best effort: a rank that is not reading must not hold the root for long.
    Status flushed = Progress(
        Deadline::After(std::chrono::seconds(1)),
        [&] {
          for (Conn* c : targets)
            if (c->open() && !c->out.empty()) return false;
          return true;
        },
        [] { return Status::Ok(); });
    flushed.IgnoreError();
  }
  KZ_WARN(kLogBootstrap, "{}: {}", Me(), status.ToString());
  fatal_ = status;
  return status;
}

// ---- connections ----------------------------------------------------------------------------

void TcpBootstrap::Accept() {
  for (int i = 0; i < 64; ++i) {
    net::Address peer;
    peer.length = sizeof(peer.storage);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer.storage), &peer.length,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection stays queued; try again shortly instead of spinning on poll().
        KZ_WARN(kLogBootstrap, "{}: accept failed: {}; retrying in 100 ms", Me(), std::strerror(errno));
        listener_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
        KZ_WARN(kLogBootstrap, "{}: accept failed: {}", Me(), std::strerror(errno));
      }
      return;
    }
    UniqueFd owned(fd);
    size_t pending = 0;
    for (const auto& c : conns_) pending += c->role == Conn::Role::kPending && c->open();
    if (pending >= static_cast<size_t>(std::max(1, options_.max_pending_connections))) {
      KZ_WARN(kLogBootstrap, "{}: rejected a connection from {}: {} connections are already authenticating",
              Me(), peer.ToString(), pending);
      continue;
    }
    Result<ServerHandshake> hs = ServerHandshake::Start(id_.secret);
    if (!hs.ok()) {
      KZ_WARN(kLogBootstrap, "{}: dropped a connection from {}: {}", Me(), peer.ToString(), hs.status().ToString());
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Conn* c = NewConn(Conn::Role::kPending);
    c->fd = std::move(owned);
    c->address = peer.ToString();
    c->phase = Conn::Phase::kAwaitClientHello;
    c->server.emplace(std::move(hs).value());
    c->handshake_deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                           std::max(0.001, options_.handshake_timeout_s)));
    c->Expect(kClientHelloBytes);
    KZ_TRACE(kLogBootstrap, "{}: accepted a connection from {}", Me(), c->address);
  }
}

void TcpBootstrap::StartConnect(Conn& c) {
  const net::Address& target = c.targets[c.next_target % c.targets.size()];
  c.next_target++;
  c.address = target.ToString();
  c.phase = Conn::Phase::kConnecting;
  c.fd.Reset(socket(target.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!c.fd.valid()) {
    ClientConnectFailed(c, fmt::format("socket: {}", std::strerror(errno)), false);
    return;
  }
  int one = 1;
  setsockopt(c.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(c.fd.get(), target.get(), target.length) == 0 || errno == EINPROGRESS) return;  // POLLOUT tells
  int err = errno;
  ClientConnectFailed(c, std::strerror(err), err == ECONNREFUSED || err == EAGAIN || err == ENETUNREACH ||
                                                 err == EHOSTUNREACH || err == ETIMEDOUT);
}

void TcpBootstrap::FinishConnect(Conn& c) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) {
    ClientConnectFailed(c, std::strerror(err), err == ECONNREFUSED || err == ENETUNREACH || err == EHOSTUNREACH ||
                                                   err == ETIMEDOUT || err == ECONNRESET);
    return;
  }
  Result<ClientHandshake> hs = ClientHandshake::Start(id_.secret);
  if (!hs.ok()) {
    ClientConnectFailed(c, hs.status().ToString(), false);
    return;
  }
  c.client.emplace(std::move(hs).value());
  c.out.push_back({std::make_shared<const Bytes>(c.client->hello().begin(), c.client->hello().end()), 0});
  c.phase = Conn::Phase::kAwaitServerHello;
  c.Expect(kServerHelloBytes);
}

// A client connection failed before it was authenticated. The root may simply not be listening
// yet, so that connection retries (with backoff) until the caller's deadline; a peer's listener
// exists from the rendezvous on, so a refused peer connection means the peer is gone.
void TcpBootstrap::ClientConnectFailed(Conn& c, const std::string& why, bool retryable) {
  c.last_error = why;
  c.fd.Reset();
  c.out.clear();
  if (c.role == Conn::Role::kToRoot && retryable) {
    c.phase = Conn::Phase::kConnecting;
    c.retry_at = Clock::now() + c.backoff;
    c.backoff = std::min<std::chrono::milliseconds>(c.backoff * 2, std::chrono::milliseconds(500));
    KZ_TRACE(kLogBootstrap, "{}: root at {} not reachable yet ({}); retrying", Me(), c.address, why);
    return;
  }
  if (c.role == Conn::Role::kToRoot) {
    fatal_ = RemoteError(fmt::format("{}: cannot join the root at {}: {}", Me(), c.address, why));
    Close(c, why);
    return;
  }
  Close(c, fmt::format("cannot connect to rank {} at {}: {} (has it exited?)", c.peer, c.address, why));
}

void TcpBootstrap::Flush(Conn& c) {
  while (!c.out.empty() && c.fd.valid()) {
    OutChunk& chunk = c.out.front();
    ssize_t n = send(c.fd.get(), chunk.data->data() + chunk.offset, chunk.data->size() - chunk.offset,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      chunk.offset += static_cast<size_t>(n);
      if (chunk.offset == chunk.data->size()) c.out.pop_front();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    std::string why = n < 0 ? std::strerror(errno) : "send returned 0";
    if (c.phase == Conn::Phase::kAwaitServerHello || c.phase == Conn::Phase::kConnecting) {
      ClientConnectFailed(c, why, true);
    } else if (c.role == Conn::Role::kPending) {
      Reject(c, fmt::format("send failed: {}", why));
    } else {
      Close(c, fmt::format("the connection broke while sending ({})", why));
    }
    return;
  }
}

void TcpBootstrap::ReadAvailable(Conn& c) {
  // Bounded per wake-up so one busy connection cannot starve the others.
  for (int rounds = 0; rounds < 64 && c.fd.valid() && c.phase != Conn::Phase::kConnecting; ++rounds) {
    ssize_t n = recv(c.fd.get(), c.in.data() + c.in_have, c.in.size() - c.in_have, MSG_DONTWAIT);
    if (n > 0) {
      c.in_have += static_cast<size_t>(n);
      if (c.in_have == c.in.size()) OnUnit(c);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    std::string why = n == 0 ? "closed by the peer" : std::strerror(errno);
    switch (c.role) {
      case Conn::Role::kPending:
        Reject(c, n == 0 ? "it closed the connection before authenticating" : why);
        return;
      case Conn::Role::kToRoot:
        if (c.phase == Conn::Phase::kAwaitServerHello) {
          ClientConnectFailed(c, fmt::format("the root closed the connection during authentication ({})", why), true);
        } else {
          Close(c, fmt::format("rank 0 (the root, at {}) closed the bootstrap connection: its process ended or its "
                               "Bootstrap was destroyed",
                               c.address));
        }
        return;
      case Conn::Role::kFromRank:
      case Conn::Role::kPeerIn:
        Close(c, fmt::format("rank {} (at {}) closed its connection: its process ended or its Bootstrap was destroyed",
                             c.peer, c.address));
        return;
      case Conn::Role::kPeerOut:
        Close(c, fmt::format("rank {} (at {}) closed the connection{}: its process ended or its Bootstrap was "
                             "destroyed",
                             c.peer, c.address, c.phase == Conn::Phase::kAwaitServerHello ? " during authentication" : ""));
        return;
    }
  }
}

// A complete unit (handshake message, frame header or payload) is in c.in.
void TcpBootstrap::OnUnit(Conn& c) {
  switch (c.phase) {
    case Conn::Phase::kAwaitServerHello: {
      ServerHello reply;
      std::memcpy(reply.data(), c.in.data(), reply.size());
      Result<ClientProof> proof = c.client->OnServerHello(reply);
      if (!proof.ok()) {
        std::string why = fmt::format("{} at {}: {}", c.role == Conn::Role::kToRoot ? std::string("the root")
                                                                                    : fmt::format("rank {}", c.peer),
                                      c.address, proof.status().message());
        KZ_WARN(kLogBootstrap, "{}: {}", Me(), why);
        if (c.role == Conn::Role::kToRoot) fatal_ = Status(proof.status().code(), why);
        Close(c, why);
        return;
      }
      c.out.push_back({std::make_shared<const Bytes>(proof->begin(), proof->end()), 0});
      c.phase = Conn::Phase::kEstablished;
      c.Expect(kFrameHeaderBytes);
      c.in_payload = false;
      OnClientAuthenticated(c);
      while (!c.later.empty()) {
        c.out.push_back(std::move(c.later.front()));
        c.later.pop_front();
      }
      return;
    }
    case Conn::Phase::kAwaitClientHello: {
      ClientHello hello;
      std::memcpy(hello.data(), c.in.data(), hello.size());
      Result<ServerHello> reply = c.server->OnClientHello(hello);
      if (!reply.ok()) {
        Reject(c, reply.status().message());
        return;
      }
      c.out.push_back({std::make_shared<const Bytes>(reply->begin(), reply->end()), 0});
      c.phase = Conn::Phase::kAwaitClientProof;
      c.Expect(kClientProofBytes);
      return;
    }
    case Conn::Phase::kAwaitClientProof: {
      ClientProof proof;
      std::memcpy(proof.data(), c.in.data(), proof.size());
      Status s = c.server->OnClientProof(proof);
      if (!s.ok()) {
        Reject(c, s.message());
        return;
      }
      c.phase = Conn::Phase::kAwaitIntro;
      c.Expect(kFrameHeaderBytes);
      c.in_payload = false;
      return;
    }
    case Conn::Phase::kAwaitIntro:
    case Conn::Phase::kEstablished: {
      if (c.in_payload) {
        Bytes payload = std::move(c.in);
        c.in_payload = false;
        c.Expect(kFrameHeaderBytes);
        if (c.phase == Conn::Phase::kAwaitIntro) OnIntro(c, std::move(payload));
        else OnFrame(c, std::move(payload));
        return;
      }
      WireReader r(c.in);
      uint32_t magic = static_cast<uint32_t>(r.Uint(4));
      uint32_t type = static_cast<uint32_t>(r.Uint(4));
      uint32_t tag = static_cast<uint32_t>(r.Uint(4));
      r.Uint(4);
      uint64_t length = r.Uint(8);
      std::string bad;
      if (magic != kFrameMagic) bad = "a frame without the frame magic";
      else if (type < 1 || type > 7) bad = fmt::format("a frame of unknown type {}", type);
      else if (c.phase == Conn::Phase::kAwaitIntro && type != static_cast<uint32_t>(FrameType::kJoin) &&
               type != static_cast<uint32_t>(FrameType::kPeerHello))
        bad = fmt::format("a frame of type {} before introducing itself", type);
      else if (length > MaxPayload(static_cast<FrameType>(type), size()))
        bad = fmt::format("a frame of type {} with {} bytes (limit {})", type, length,
                          MaxPayload(static_cast<FrameType>(type), size()));
      if (!bad.empty()) {
        if (c.role == Conn::Role::kPending) {
          Reject(c, fmt::format("authenticated, then sent {}", bad));
        } else {
          std::string why = fmt::format("rank {} (at {}) sent {}", c.peer, c.address, bad);
          KZ_WARN(kLogBootstrap, "{}: {}", Me(), why);
          if (c.role == Conn::Role::kToRoot) fatal_ = Internal(why);
          Close(c, why);
        }
        return;
      }
      c.frame_type = static_cast<FrameType>(type);
      c.frame_tag = tag;
      if (length == 0) {
        c.Expect(kFrameHeaderBytes);
        if (c.phase == Conn::Phase::kAwaitIntro) OnIntro(c, {});
        else OnFrame(c, {});
        return;
      }
      c.in_payload = true;
      c.Expect(static_cast<size_t>(length));
      return;
    }
    case Conn::Phase::kConnecting:
    case Conn::Phase::kClosed: return;
  }
}

// The client side finished authenticating: introduce this rank.
void TcpBootstrap::OnClientAuthenticated(Conn& c) {
  if (c.role == Conn::Role::kPeerOut) {
    Bytes hello;
    PutU32(hello, static_cast<uint32_t>(rank()));
    PutU32(hello, static_cast<uint32_t>(c.peer));
    QueueFrame(c, FrameType::kPeerHello, 0, hello);
    KZ_TRACE(kLogBootstrap, "{}: connected to rank {} at {}", Me(), c.peer, c.address);
    return;
  }
  // To the root: listen for peers on the address this host uses to reach the root, which is the
  // one most likely reachable by the other ranks too.
  net::Address local = net::LocalAddress(c.fd.get());
  net::Address bind_to = local;
  if (bind_to.family() == AF_INET) reinterpret_cast<sockaddr_in*>(&bind_to.storage)->sin_port = 0;
  else if (bind_to.family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&bind_to.storage)->sin6_port = 0;
  Result<UniqueFd> listener = net::Listen(bind_to);
  if (!listener.ok()) {
    fatal_ = listener.status().WithContext(fmt::format("{}: listening for peers", Me()));
    Close(c, fatal_.message());
    return;
  }
  listener_ = std::move(listener).value();
  net::Address bound = net::LocalAddress(listener_.get());
  listen_text_ = bound.ToString();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  Bytes join;
  PutU32(join, static_cast<uint32_t>(rank()));
  PutU32(join, static_cast<uint32_t>(size()));
  PutU16(join, bound.Port());
  PutString(join, bound.Host());
  PutString(join, std::string_view(host).substr(0, kMaxHostBytes));
  QueueFrame(c, FrameType::kJoin, 0, join);
}

// The first frame of an authenticated incoming connection: who it is.
void TcpBootstrap::OnIntro(Conn& c, Bytes payload) {
  WireReader r(payload);
  if (c.frame_type == FrameType::kPeerHello) {
    int from = static_cast<int>(r.Uint(4));
    int to = static_cast<int>(r.Uint(4));
    if (!r.AtEnd()) return Reject(c, "malformed peer hello");
    if (to != rank()) return Reject(c, fmt::format("a peer connection meant for rank {} reached rank {}", to, rank()));
    if (from < 0 || from >= size() || from == rank())
      return Reject(c, fmt::format("a peer connection from rank {}, which is not a peer in a job of {} ranks", from, size()));
    if (in_conn_[from] != nullptr && in_conn_[from]->open())
      return Reject(c, fmt::format("a second connection claiming to be rank {}", from));
    c.role = Conn::Role::kPeerIn;
    c.peer = from;
    c.phase = Conn::Phase::kEstablished;
    in_conn_[from] = &c;
    KZ_TRACE(kLogBootstrap, "{}: rank {} connected from {}", Me(), from, c.address);
    return;
  }
  if (c.frame_type != FrameType::kJoin || !is_root())
    return Reject(c, fmt::format("unexpected first frame (type {})", static_cast<uint32_t>(c.frame_type)));
  int64_t jrank = static_cast<int32_t>(r.Uint(4));
  int64_t jsize = static_cast<int32_t>(r.Uint(4));
  uint16_t port = static_cast<uint16_t>(r.Uint(2));
  std::string host = r.String(kMaxHostBytes);
  std::string hostname = r.String(kMaxHostBytes);
  if (!r.AtEnd() || port == 0 || ValidateHost(host, "peer address").code() != StatusCode::kOk)
    return Reject(c, "malformed join message");
  if (rendezvous_done_)
    return Reject(c, fmt::format("a late join as rank {}: every rank has already joined", jrank));
  // From here the sender knows the secret: it is part of this job, so a mismatch is the job's
  // misconfiguration, and every rank is told.
  Status bad;
  if (jsize != size()) {
    bad = InvalidArgument(fmt::format("rank {} (at {}, host {}) was started with size {}, but the root has size {}: "
                                      "every rank must be given the same size",
                                      jrank, c.address, hostname, jsize, size()));
  } else if (jrank < 1 || jrank >= size()) {
    bad = InvalidArgument(fmt::format("a rank at {} (host {}) says it is rank {}, outside 1..{} (rank 0 is the root)",
                                      c.address, hostname, jrank, size() - 1));
  } else if (rank_conn_[jrank] != nullptr) {
    bad = InvalidArgument(fmt::format("rank {} joined twice: from {} and from {} (host {}); every rank must have a "
                                      "distinct rank number",
                                      jrank, rank_conn_[jrank]->address, c.address, hostname));
  }
  if (!bad.ok()) {
    // Reported by the poll loop to the root's caller, which tells every rank (FailJob): not from
    // here, inside the loop.
    if (job_error_.ok()) {
      job_error_ = bad;
      job_error_conn_ = &c;
    }
    return;
  }
  c.role = Conn::Role::kFromRank;
  c.peer = static_cast<int>(jrank);
  c.phase = Conn::Phase::kEstablished;
  rank_conn_[jrank] = &c;
  peers_[jrank] = HostPort{host, port};
  ++joined_;
  KZ_TRACE(kLogBootstrap, "{}: rank {} joined from {} (host {}, listening at {}) [{}/{}]", Me(), jrank, c.address,
           hostname, peers_[jrank].ToString(), joined_ + 1, size());
}

void TcpBootstrap::OnFrame(Conn& c, Bytes payload) {
  switch (c.role) {
    case Conn::Role::kFromRank:
      if (c.frame_type == FrameType::kGather) {
        gather_in_[c.peer].emplace_back(c.frame_tag, std::move(payload));
        return;
      }
      break;
    case Conn::Role::kToRoot:
      if (c.frame_type == FrameType::kWelcome && !welcomed_) {
        WireReader r(payload);
        int n = static_cast<int>(r.Uint(4));
        std::vector<HostPort> table;
        for (int i = 0; i < n && r.ok() && n == size(); ++i) {
          uint16_t port = static_cast<uint16_t>(r.Uint(2));
          std::string host = r.String(kMaxHostBytes);
          table.push_back(HostPort{host, port});
        }
        if (n != size() || !r.AtEnd()) {
          fatal_ = Internal(fmt::format("{}: malformed welcome from the root at {} ({} ranks)", Me(), c.address, n));
          Close(c, fatal_.message());
          return;
        }
        peers_ = std::move(table);
        welcomed_ = true;
        return;
      }
      if (c.frame_type == FrameType::kGatherResult) {
        results_.emplace_back(c.frame_tag, std::move(payload));
        return;
      }
      if (c.frame_type == FrameType::kAbort) {
        WireReader r(payload);
        auto code = static_cast<StatusCode>(r.Uint(4));
        size_t len = r.Uint(4);
        auto text = r.Take(len);
        std::string message(text.begin(), text.end());
        if (!r.ok() || code == StatusCode::kOk || static_cast<uint32_t>(code) > static_cast<uint32_t>(StatusCode::kInternal))
          code = StatusCode::kRemoteError;
        fatal_ = Status(code, fmt::format("rank 0 (the root) reports: {}", message));
        KZ_WARN(kLogBootstrap, "{}: {}", Me(), fatal_.ToString());
        return;
      }
      break;
    case Conn::Role::kPeerIn:
      if (c.frame_type == FrameType::kData) {
        mailbox_[{c.peer, c.frame_tag}].push_back(std::move(payload));
        return;
      }
      break;
    case Conn::Role::kPeerOut:
    case Conn::Role::kPending: break;
  }
  std::string why = fmt::format("rank {} (at {}) sent an unexpected frame (type {})", c.peer, c.address,
                                static_cast<uint32_t>(c.frame_type));
  KZ_WARN(kLogBootstrap, "{}: {}", Me(), why);
  if (c.role == Conn::Role::kToRoot) fatal_ = Internal(why);
  Close(c, why);
}

// ---- the poll loop --------------------------------------------------------------------------

Status TcpBootstrap::Progress(Deadline deadline, const std::function<bool()>& done,
                              const std::function<Status()>& on_timeout) {
  std::vector<pollfd> fds;
  std::vector<Conn*> who;
  // At least one pass even with an expired deadline, so bytes that already arrived are seen.
  bool first = true;
  while (true) {
    RemoveDead();
    if (!fatal_.ok()) return fatal_;
    if (!job_error_.ok()) return job_error_;
    if (done()) return Status::Ok();
    Clock::time_point now = Clock::now();
    if (!first && now >= deadline.when()) return on_timeout();
    first = false;

    Clock::time_point wake = deadline.when();
    for (const auto& owned : conns_) {
      Conn& c = *owned;
      if (c.role == Conn::Role::kPending && c.open()) {
        if (now >= c.handshake_deadline) {
          Reject(c, fmt::format("it did not authenticate within {} s", options_.handshake_timeout_s));
          continue;
        }
        wake = std::min(wake, c.handshake_deadline);
      }
      if (c.phase == Conn::Phase::kConnecting && !c.fd.valid() && c.role == Conn::Role::kToRoot) {
        if (now >= c.retry_at) StartConnect(c);
        else wake = std::min(wake, c.retry_at);
      }
    }
    if (!fatal_.ok()) return fatal_;

    fds.clear();
    who.clear();
    if (listener_.valid() && now >= listener_paused_until_) {
      fds.push_back({listener_.get(), POLLIN, 0});
      who.push_back(nullptr);
    } else if (listener_.valid()) {
      wake = std::min(wake, listener_paused_until_);
    }
    for (const auto& owned : conns_) {
      Conn& c = *owned;
      if (!c.fd.valid() || !c.open()) continue;
      short events = 0;
      if (c.phase == Conn::Phase::kConnecting) events = POLLOUT;
      else events = static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT));
      fds.push_back({c.fd.get(), events, 0});
      who.push_back(&c);
    }
    int r = poll(fds.data(), fds.size(), net::PollTimeoutMs(Deadline::At(wake)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return FromErrno(errno, "poll");
    }
    if (r == 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn* c = who[i];
      if (c == nullptr) {
        Accept();
        continue;
      }
      if (!c->fd.valid() || c->fd.get() != fds[i].fd) continue;  // closed (or retried) meanwhile
      if (c->phase == Conn::Phase::kConnecting) {
        FinishConnect(*c);
        if (c->phase != Conn::Phase::kConnecting) Flush(*c);
        continue;
      }
      if (fds[i].revents & POLLOUT) Flush(*c);
      if (c->fd.valid() && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) ReadAvailable(*c);
    }
  }
}

// ---- start ----------------------------------------------------------------------------------

Status TcpBootstrap::Start(Deadline deadline) {
  if (size() == 1) {
    // Nobody to meet: release a socket GetUniqueId may have reserved for this id.
    internal::TakeReservedListener(id_.root.port);
    peers_[0] = id_.root;
    rendezvous_done_ = welcomed_ = true;
    KZ_INFO(kLogBootstrap, "{}: single rank, no rendezvous", Me());
    return Status::Ok();
  }
  KZ_ASSIGN_OR_RETURN(root_addresses_, net::Resolve(id_.root, "root address"));
  return is_root() ? StartRoot(deadline) : StartNonRoot(deadline);
}

Status TcpBootstrap::StartRoot(Deadline deadline) {
  Clock::time_point start = Clock::now();
  listener_ = internal::TakeReservedListener(id_.root.port);
  if (!listener_.valid()) {
    Result<UniqueFd> l = net::ListenForRoot(id_.root);
    if (!l.ok()) return l.status().WithContext(fmt::format("{}: root of {}", Me(), id_.Redacted()));
    listener_ = std::move(l).value();
  }
  peers_[0] = id_.root;
  listen_text_ = net::LocalAddress(listener_.get()).ToString();
  KZ_INFO(kLogBootstrap, "{}: root of {} listening on {}, waiting for {} other rank{}", Me(), id_.Redacted(),
          listen_text_, size() - 1, size() == 2 ? "" : "s");
  Deadline wait = RootWaitDeadline(deadline);
  Status s = Progress(
      wait, [&] { return joined_ == size() - 1; },
      [&] {
        std::vector<int> missing;
        for (int r = 1; r < size(); ++r)
          if (rank_conn_[r] == nullptr) missing.push_back(r);
        return Timeout(fmt::format("rendezvous at {}: {} never joined within {:.1f} s ({} of {} ranks joined)",
                                   id_.root.ToString(), PluralRanks(missing), SecondsSince(start), joined_ + 1,
                                   size()));
      });
  if (s.ok()) {
    // A rank that joined and then went away before the table was sent.
    for (int r = 1; r < size(); ++r)
      if (!rank_conn_[r]->open())
        s = RemoteError(fmt::format("rendezvous: {}", rank_conn_[r]->closed_reason));
  }
  if (!s.ok()) return fatal_.ok() ? FailJob(s, job_error_conn_) : s;

  rendezvous_done_ = true;
  Bytes table;
  PutU32(table, static_cast<uint32_t>(size()));
  for (const HostPort& p : peers_) {
    PutU16(table, p.port);
    PutString(table, p.host);
  }
  auto shared = std::make_shared<const Bytes>(std::move(table));
  for (int r = 1; r < size(); ++r) QueueShared(*rank_conn_[r], FrameType::kWelcome, 0, shared);
  s = Progress(
      deadline,
      [&] {
        for (int r = 1; r < size(); ++r)
          if (rank_conn_[r]->open() && !rank_conn_[r]->out.empty()) return false;
        return true;
      },
      [&] { return Timeout("rendezvous: sending the address table to every rank did not finish before the deadline"); });
  for (int r = 1; s.ok() && r < size(); ++r)
    if (!rank_conn_[r]->open()) s = RemoteError(fmt::format("rendezvous: {}", rank_conn_[r]->closed_reason));
  if (!s.ok()) return fatal_.ok() ? FailJob(s) : s;
  KZ_INFO(kLogBootstrap, "{}: all {} ranks joined the root at {} in {:.1f} ms", Me(), size(), listen_text_,
          SecondsSince(start) * 1e3);
  return Status::Ok();
}

Status TcpBootstrap::StartNonRoot(Deadline deadline) {
  Clock::time_point start = Clock::now();
  root_conn_ = NewConn(Conn::Role::kToRoot);
  root_conn_->peer = 0;
  root_conn_->targets = root_addresses_;
  StartConnect(*root_conn_);
  Status s = Progress(
      deadline, [&] { return welcomed_ || !root_conn_->open(); },
      [&] {
        if (root_conn_->phase == Conn::Phase::kConnecting || root_conn_->phase == Conn::Phase::kAwaitServerHello)
          return Timeout(fmt::format("{}: could not reach the root at {} within {:.1f} s (last error: {}); is rank 0 "
                                     "running with the same unique id?",
                                     Me(), id_.root.ToString(), SecondsSince(start),
                                     root_conn_->last_error.empty() ? "none" : root_conn_->last_error));
        return Timeout(fmt::format("{}: joined the root at {}, but the rendezvous did not complete within {:.1f} s "
                                   "(the root waits for all {} ranks)",
                                   Me(), id_.root.ToString(), SecondsSince(start), size()));
      });
  if (s.ok() && !welcomed_) s = RemoteError(fmt::format("{}: rendezvous: {}", Me(), root_conn_->closed_reason));
  if (!s.ok()) {
    fatal_ = s;
    return s;
  }
  rendezvous_done_ = true;
  KZ_INFO(kLogBootstrap, "{}: joined the root at {} in {:.1f} ms; listening for peers at {}", Me(),
          id_.root.ToString(), SecondsSince(start) * 1e3, listen_text_);
  return Status::Ok();
}

// ---- operations -----------------------------------------------------------------------------

Result<std::vector<Bytes>> TcpBootstrap::Collective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline) {
  if (!fatal_.ok()) return fatal_;
  std::string_view op = KindName(kind);
  if (size() == 1) {
    std::vector<Bytes> out;
    if (kind == kKindAllGather) out.emplace_back(mine.begin(), mine.end());
    return out;
  }
  if (is_root()) return RootCollective(kind, mine, deadline);

  Clock::time_point start = Clock::now();
  if (!root_conn_->open()) return RemoteError(fmt::format("{}: {}", op, root_conn_->closed_reason));
  QueueFrame(*root_conn_, FrameType::kGather, kind, mine);
  Status s = Progress(
      deadline, [&] { return !results_.empty() || !root_conn_->open(); },
      [&] {
        return Timeout(fmt::format("{}: no answer from the root (rank 0 at {}) within {:.1f} s; the root names the "
                                   "missing ranks in its own log",
                                   op, id_.root.ToString(), SecondsSince(start)));
      });
  if (s.ok() && results_.empty()) s = RemoteError(fmt::format("{}: {}", op, root_conn_->closed_reason));
  if (!s.ok()) {
    fatal_ = s;
    return s;
  }
  auto [got_kind, payload] = std::move(results_.front());
  results_.pop_front();
  if (got_kind != kind) {
    fatal_ = InvalidArgument(fmt::format("{}: the root answered a {} (ranks called different collectives)", op,
                                         KindName(got_kind)));
    return fatal_;
  }
  std::vector<Bytes> out;
  if (kind == kKindBarrier) return out;
  WireReader r(payload);
  uint32_t n = static_cast<uint32_t>(r.Uint(4));
  std::vector<uint64_t> lengths;
  for (uint32_t i = 0; i < n && r.ok() && n == static_cast<uint32_t>(size()); ++i) lengths.push_back(r.Uint(8));
  for (uint32_t i = 0; i < n && r.ok() && lengths.size() == n; ++i) {
    auto part = r.Take(lengths[i]);
    out.emplace_back(part.begin(), part.end());
  }
  if (n != static_cast<uint32_t>(size()) || !r.AtEnd()) {
    fatal_ = Internal(fmt::format("{}: malformed result from the root ({} entries for {} ranks)", op, n, size()));
    return fatal_;
  }
  return out;
}

Result<std::vector<Bytes>> TcpBootstrap::RootCollective(uint32_t kind, std::span<const uint8_t> mine,
                                                        Deadline deadline) {
  std::string_view op = KindName(kind);
  Clock::time_point start = Clock::now();
  auto have = [&](int r) { return !gather_in_[r].empty(); };
  Status s = Progress(
      RootWaitDeadline(deadline),
      [&] {
        for (int r = 1; r < size(); ++r)
          if (!have(r) && rank_conn_[r]->open()) return false;
        return true;
      },
      [&] {
        std::vector<int> missing;
        for (int r = 1; r < size(); ++r)
          if (!have(r)) missing.push_back(r);
        return Timeout(fmt::format("{}: {} did not call {} within {:.1f} s (or are stuck)", op, PluralRanks(missing), op,
                                   SecondsSince(start)));
      });
  for (int r = 1; s.ok() && r < size(); ++r)
    if (!have(r)) s = RemoteError(fmt::format("{}: {}", op, rank_conn_[r]->closed_reason));
  for (int r = 1; s.ok() && r < size(); ++r) {
    if (gather_in_[r].front().first != kind)
      s = InvalidArgument(fmt::format("collective mismatch: rank 0 called {} while rank {} called {}", op, r,
                                      KindName(gather_in_[r].front().first)));
  }
  if (!s.ok()) return fatal_.ok() ? FailJob(s) : s;

  std::vector<Bytes> out(size());
  out[0].assign(mine.begin(), mine.end());
  for (int r = 1; r < size(); ++r) {
    out[r] = std::move(gather_in_[r].front().second);
    gather_in_[r].pop_front();
  }
  auto payload = std::make_shared<Bytes>();
  if (kind == kKindAllGather) {
    size_t total = 0;
    for (const Bytes& b : out) total += b.size();
    if (total > kMaxAllGatherBytes)
      return FailJob(InvalidArgument(fmt::format("AllGather: {} bytes in all exceed the limit of {} bytes", total,
                                                 kMaxAllGatherBytes)));
    payload->reserve(4 + 8 * out.size() + total);
    PutU32(*payload, static_cast<uint32_t>(size()));
    for (const Bytes& b : out) PutU64(*payload, b.size());
    for (const Bytes& b : out) payload->insert(payload->end(), b.begin(), b.end());
  }
  std::shared_ptr<const Bytes> shared = std::move(payload);
  for (int r = 1; r < size(); ++r) QueueShared(*rank_conn_[r], FrameType::kGatherResult, kind, shared);
  s = Progress(
      deadline,
      [&] {
        for (int r = 1; r < size(); ++r)
          if (rank_conn_[r]->open() && !rank_conn_[r]->out.empty()) return false;
        return true;
      },
      [&] {
        std::vector<int> slow;
        for (int r = 1; r < size(); ++r)
          if (!rank_conn_[r]->out.empty()) slow.push_back(r);
        return Timeout(fmt::format("{}: {} did not take the result within {:.1f} s", op, PluralRanks(slow),
                                   SecondsSince(start)));
      });
  for (int r = 1; s.ok() && r < size(); ++r)
    if (!rank_conn_[r]->open()) s = RemoteError(fmt::format("{}: {}", op, rank_conn_[r]->closed_reason));
  if (!s.ok()) return fatal_.ok() ? FailJob(s) : s;
  if (kind == kKindBarrier) out.clear();
  return out;
}

Status TcpBootstrap::DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) {
  if (!fatal_.ok()) return fatal_;
  if (peer == rank()) {
    mailbox_[{peer, tag}].emplace_back(bytes.begin(), bytes.end());
    return Status::Ok();
  }
  Conn* c = out_conn_[peer];
  if (c == nullptr) {
    c = NewConn(Conn::Role::kPeerOut);
    c->peer = peer;
    if (peer == 0) {
      c->targets = root_addresses_;
    } else {
      Result<std::vector<net::Address>> a = net::Resolve(peers_[peer], fmt::format("rank {}'s address", peer));
      if (!a.ok()) {
        Close(*c, a.status().message());
        out_conn_[peer] = c;
        return RemoteError(fmt::format("Send to rank {}: {}", peer, a.status().message()));
      }
      c->targets = std::move(a).value();
    }
    out_conn_[peer] = c;
    StartConnect(*c);
  }
  if (!c->open()) return RemoteError(fmt::format("Send to rank {} (tag {}): {}", peer, tag, c->closed_reason));
  Clock::time_point start = Clock::now();
  QueueFrame(*c, FrameType::kData, tag, bytes);
  Status s = Progress(
      deadline, [&] { return !c->open() || (c->phase == Conn::Phase::kEstablished && c->out.empty()); },
      [&] {
        return Timeout(fmt::format("Send to rank {} (tag {}, {} bytes): not taken within {:.1f} s (rank {} is not in "
                                   "a bootstrap call, or is stuck); it may still be delivered during later calls",
                                   peer, tag, bytes.size(), SecondsSince(start), peer));
      });
  if (!s.ok()) return s;
  if (!c->open()) return RemoteError(fmt::format("Send to rank {} (tag {}): {}", peer, tag, c->closed_reason));
  return Status::Ok();
}

Result<Bytes> TcpBootstrap::DoRecv(int peer, uint32_t tag, Deadline deadline) {
  auto take = [&]() -> std::optional<Bytes> {
    auto it = mailbox_.find({peer, tag});
    if (it == mailbox_.end() || it->second.empty()) return std::nullopt;
    Bytes b = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) mailbox_.erase(it);
    return b;
  };
  if (auto b = take()) return std::move(*b);
  if (!fatal_.ok()) return fatal_;
  if (peer == rank())
    return InvalidArgument(fmt::format("Recv from this rank itself (rank {}, tag {}) with no message waiting: send "
                                       "it first",
                                       peer, tag));
  Clock::time_point start = Clock::now();
  auto gone = [&] { return in_conn_[peer] != nullptr && !in_conn_[peer]->open(); };
  Status s = Progress(
      deadline, [&] { return mailbox_.count({peer, tag}) > 0 || gone(); },
      [&] {
        return Timeout(fmt::format("Recv from rank {} (tag {}): nothing arrived within {:.1f} s", peer, tag,
                                   SecondsSince(start)));
      });
  if (!s.ok()) return s;
  if (auto b = take()) return std::move(*b);
  return RemoteError(fmt::format("Recv from rank {} (tag {}): {}", peer, tag, in_conn_[peer]->closed_reason));
}

}  // namespace

Result<std::unique_ptr<Bootstrap>> CreateTcpBootstrap(const UniqueId& id, int rank, int size, Deadline deadline,
                                                      const TcpBootstrapOptions& options) {
  if (size < 1 || size > kMaxRanks)
    return InvalidArgument(fmt::format("bootstrap: size {} is not in 1..{}", size, kMaxRanks));
  if (rank < 0 || rank >= size)
    return InvalidArgument(fmt::format("bootstrap: rank {} is not in 0..{} (size {})", rank, size - 1, size));
  if (id.root.port == 0) return InvalidArgument("bootstrap: the unique id's port is 0");
  KZ_RETURN_IF_ERROR(ValidateHost(id.root.host, "bootstrap: the unique id's root"));
  auto b = std::make_unique<TcpBootstrap>(id, rank, size, options);
  KZ_RETURN_IF_ERROR(b->Start(deadline));
  return std::unique_ptr<Bootstrap>(std::move(b));
}

}  // namespace kizuna::bootstrap
