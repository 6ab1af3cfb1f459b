#include "fabric/tcp/link.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace kizuna::fabric::tcp {
namespace {

// Output items gathered into one sendmsg: small frames queued together leave in one system call.
constexpr int kMaxIov = 64;
// What one read takes from a socket between payloads: whole frames of posts, or a small message's
// header and payload, in one system call.
constexpr size_t kReadBytes = 4096;
// Payload nobody takes is read into a buffer of this size, piece by piece, and dropped.
constexpr size_t kDropBytes = 64 << 10;

bool Transient(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

}  // namespace

Status CheckFrame(const Frame& f, uint64_t max_message) {
  if (f.magic != kFrameMagic) return InvalidArgument(fmt::format("a frame with magic {:#x}", f.magic));
  switch (f.type) {
    case FrameType::kData:
      if (f.total > max_message)
        return InvalidArgument(fmt::format("a message of {} bytes (at most {})", f.total, max_message));
      if (f.length > f.total || f.offset > f.total - f.length)
        return InvalidArgument(
            fmt::format("a frame of {} bytes at offset {} of a {}-byte message", f.length, f.offset, f.total));
      return Status::Ok();
    case FrameType::kPost:
    case FrameType::kTruncated:
      if (f.length != 0) return InvalidArgument(fmt::format("a control frame with {} bytes of payload", f.length));
      return Status::Ok();
  }
  return InvalidArgument(fmt::format("a frame of unknown type {}", static_cast<int>(f.type)));
}

Link::Link(std::vector<UniqueFd> fds, std::string label, bool bulk_in) : label_(std::move(label)) {
  streams_.resize(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    streams_[i].fd = std::move(fds[i]);
    streams_[i].bulk_in = i > 0 && bulk_in;
  }
}

void Link::AddStreams(std::vector<UniqueFd> fds, bool bulk_in) {
  for (UniqueFd& fd : fds) {
    Stream& s = streams_.emplace_back();
    s.fd = std::move(fd);
    s.bulk_in = bulk_in;
  }
}

void Link::Break(Status why) {
  if (!broken_.ok()) return;
  broken_ = std::move(why);
}

void Link::Queue(int stream, const Frame& header, const uint8_t* payload, void* owner) {
  streams_[static_cast<size_t>(stream)].out.push_back(OutItem{header, payload, 0, owner});
}

void Link::Flush(FrameSink& sink) {
  for (Stream& s : streams_) {
    if (!broken_.ok()) return;
    if (!s.out.empty()) Write(s, sink);
  }
}

bool Link::Progress(FrameSink& sink) {
  bool moved = false;
  for (size_t i = 0; i < streams_.size() && broken_.ok(); ++i) {
    Stream& s = streams_[i];
    if (!s.out.empty()) moved |= Write(s, sink);
    if (!broken_.ok()) break;
    if (Reads(i)) moved |= Read(s, sink);
  }
  // What the frames just read queued (a message that waited for its post, a truncation notice)
  // leaves now: its owner may not progress this link again.
  for (Stream& s : streams_) {
    if (!broken_.ok()) break;
    if (!s.out.empty()) moved |= Write(s, sink);
  }
  return moved;
}

bool Link::output_pending() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const Stream& s) { return !s.out.empty(); });
}

void Link::AppendPollFds(std::vector<pollfd>& fds) const {
  if (!broken_.ok()) return;
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& s = streams_[i];
    short events = Reads(i) ? POLLIN : 0;
    if (!s.out.empty()) events |= POLLOUT;
    if (events != 0 && s.fd.valid()) fds.push_back(pollfd{s.fd.get(), events, 0});
  }
}

void Link::DropPayloads() {
  for (Stream& s : streams_)
    if (s.in == In::kPayload) s.dst = nullptr;
}

void Link::Close() {
  for (Stream& s : streams_) {
    if (!s.fd.valid()) continue;
    ::shutdown(s.fd.get(), SHUT_RDWR);
    s.fd = UniqueFd();
    s.out.clear();
  }
  Break(RemoteError(fmt::format("{}: the connection was closed", label_)));
}

void Link::CloseGracefully(std::chrono::milliseconds within) {
  if (!broken_.ok()) return Close();
  const auto until = std::chrono::steady_clock::now() + within;
  std::vector<bool> open(streams_.size(), false);
  for (size_t i = 0; i < streams_.size(); ++i)
    open[i] = streams_[i].fd.valid() && ::shutdown(streams_[i].fd.get(), SHUT_WR) == 0;
  uint8_t drop[4096];
  while (std::chrono::steady_clock::now() < until) {
    std::vector<pollfd> fds;
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (!open[i]) continue;
      const int fd = streams_[i].fd.get();
      // Read what arrived (and see the peer's FIN), so that closing sends no reset.
      while (true) {
        const ssize_t k = ::recv(fd, drop, sizeof drop, MSG_DONTWAIT);
        if (k > 0) continue;
        if (k < 0 && errno == EINTR) continue;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) open[i] = false;  // the peer closed, or it broke
        break;
      }
      int unacknowledged = 0;
      if (open[i] && ::ioctl(fd, SIOCOUTQ, &unacknowledged) == 0 && unacknowledged == 0) open[i] = false;
      if (open[i]) fds.push_back(pollfd{fd, POLLIN, 0});
    }
    if (fds.empty()) break;
    ::poll(fds.data(), fds.size(), 1);
  }
  Close();
}

bool Link::Write(Stream& s, FrameSink& sink) {
  bool moved = false;
  while (!s.out.empty() && broken_.ok()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = s.out.begin(); it != s.out.end() && n + 2 <= kMaxIov; ++it) {
      size_t done = it->written;
      if (done < sizeof(Frame)) {
        iov[n++] = iovec{reinterpret_cast<uint8_t*>(&it->header) + done, sizeof(Frame) - done};
        done = 0;
      } else {
        done -= sizeof(Frame);
      }
      if (it->header.length > done)
        iov[n++] = iovec{const_cast<uint8_t*>(it->payload) + done, static_cast<size_t>(it->header.length - done)};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    const ssize_t k = ::sendmsg(s.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (Transient(errno)) break;
      Break(errno == EPIPE || errno == ECONNRESET
                ? RemoteError(fmt::format("{}: the peer closed the connection ({})", label_, std::strerror(errno)))
                : FromErrno(errno, fmt::format("{}: sendmsg", label_)));
      break;
    }
    moved = true;
    size_t left = static_cast<size_t>(k);
    while (!s.out.empty()) {
      OutItem& item = s.out.front();
      const size_t whole = sizeof(Frame) + item.header.length;
      const size_t take = std::min(left, whole - item.written);
      item.written += take;
      left -= take;
      if (item.written < whole) break;
      void* owner = item.owner;
      s.out.pop_front();
      if (owner != nullptr) sink.OnWritten(owner);
    }
  }
  return moved;
}

bool Link::Read(Stream& s, FrameSink& sink) {
  bool moved = false;
  for (bool drained = false; broken_.ok();) {
    // The frames the buffer holds whole, and the start of a payload that follows its header.
    while (s.in == In::kHeader && s.in_end - s.in_at >= sizeof(Frame) && broken_.ok()) {
      std::memcpy(&s.frame, s.in_buf.data() + s.in_at, sizeof(Frame));
      s.in_at += sizeof(Frame);
      if (Status c = CheckFrame(s.frame, kMaxMessageBytes); !c.ok()) {
        Break(RemoteError(fmt::format("{}: protocol error: {}", label_, c.message())));
        return true;
      }
      if (s.frame.type != FrameType::kData) {
        if (Status c = sink.OnControl(s.frame); !c.ok()) Break(c);
        continue;
      }
      Result<uint8_t*> dst = sink.OnData(s.frame);
      if (!dst.ok()) {
        Break(dst.status());
        return true;
      }
      s.dst = *dst;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(s.frame.length, s.in_end - s.in_at));
      if (s.dst != nullptr && take > 0) std::memcpy(s.dst, s.in_buf.data() + s.in_at, take);
      s.in_at += take;
      s.payload_got = take;
      if (s.payload_got < s.frame.length) {
        s.in = In::kPayload;  // the rest goes straight into its place
      } else if (Status c = sink.OnDataDone(s.frame); !c.ok()) {
        Break(c);
      }
    }
    if (!broken_.ok() || drained) break;
    // Then the socket: a payload's rest into its place, else as much as the buffer takes.
    uint8_t* to;
    size_t want;
    if (s.in == In::kPayload) {
      const size_t left = s.frame.length - s.payload_got;
      if (s.dst == nullptr && drop_.empty()) drop_.resize(kDropBytes);
      to = s.dst != nullptr ? s.dst + s.payload_got : drop_.data();
      want = s.dst != nullptr ? left : std::min(left, drop_.size());
    } else {
      if (s.in_buf.empty()) s.in_buf.resize(kReadBytes);
      // A partial header moves to the front.
      std::memmove(s.in_buf.data(), s.in_buf.data() + s.in_at, s.in_end - s.in_at);
      s.in_end -= s.in_at;
      s.in_at = 0;
      to = s.in_buf.data() + s.in_end;
      want = s.in_buf.size() - s.in_end;
    }
    const ssize_t k = ::recv(s.fd.get(), to, want, MSG_DONTWAIT);
    if (k <= 0) {
      const RecvEnd end = OnRecvEnd(s, k);
      if (end == RecvEnd::kRetry) continue;
      return end == RecvEnd::kLater ? moved : true;
    }
    moved = true;
    if (s.in == In::kPayload) {
      s.payload_got += static_cast<size_t>(k);
      if (s.payload_got == s.frame.length) {
        s.in = In::kHeader;
        if (Status c = sink.OnDataDone(s.frame); !c.ok()) Break(c);
      }
    } else {
      s.in_end += static_cast<size_t>(k);
    }
    // Between payloads, a short read ends the look after the frames it brought. A payload is read
    // until the socket has no more: reading opens the window, and more of it comes at once.
    drained = s.in == In::kHeader && static_cast<size_t>(k) < want;
  }
  return moved;
}

bool Link::Reads(size_t i) const {
  const Stream& s = streams_[i];
  return !s.eof && (i == 0 || (s.posts_in && read_posts_) || (s.bulk_in && read_all_) || streams_[0].eof);
}

Link::RecvEnd Link::OnRecvEnd(Stream& s, ssize_t k) {
  if (k == 0) {
    // The peer closed this socket after everything it sent on it. Its other sockets may still
    // hold the rest of a message cut over them: they are read to their ends before the
    // connection counts as closed.
    s.eof = true;
    if (std::all_of(streams_.begin(), streams_.end(), [](const Stream& x) { return x.eof || !x.fd.valid(); })) {
      Break(RemoteError(fmt::format("{}: the peer closed the connection", label_)));
      return RecvEnd::kBroken;
    }
    return RecvEnd::kLater;
  }
  if (errno == EINTR) return RecvEnd::kRetry;
  if (Transient(errno)) return RecvEnd::kLater;
  Break(errno == ECONNRESET ? RemoteError(fmt::format("{}: the connection was reset by the peer", label_))
                            : FromErrno(errno, fmt::format("{}: recv", label_)));
  return RecvEnd::kBroken;
}

}  // namespace kizuna::fabric::tcp
