#include "runtime/device/exported_memory.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace kizuna::device {
namespace {

constexpr uint32_t kMagic = 0x4d585a4b;  // "KZXM"
constexpr uint16_t kVersion = 1;
constexpr uint32_t kMaxName = 256;
constexpr uint32_t kMaxOpaque = 4096;

struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint8_t kind;
  uint8_t has_fd;  // bit 0: an fd travels beside the message; bit 1: it is a DMA-BUF
  uint64_t offset;
  uint64_t size;
  int32_t device_index;
  uint32_t backend_len;
  uint32_t uuid_len;
  uint32_t opaque_len;
};

Status WaitFor(int fd, short events, Deadline deadline, std::string_view what) {
  while (true) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    if (ms <= 0 && deadline.Expired()) return Timeout(fmt::format("{}: deadline passed", what));
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms + 1, 1 << 30)));
    if (r > 0) return Status::Ok();
    if (r == 0) continue;
    if (errno == EINTR) continue;
    return FromErrno(errno, "poll");
  }
}

// Receives exactly `len` bytes; the first recvmsg also collects an fd when `fd_out` is set.
Status RecvAll(int sock, void* buf, size_t len, Deadline deadline, UniqueFd* fd_out) {
  char* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < len) {
    KZ_RETURN_IF_ERROR(WaitFor(sock, POLLIN, deadline, "receiving exported memory"));
    iovec iov{p + got, len - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd_out != nullptr && !fd_out->valid()) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
    }
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "recvmsg");
    }
    // Take ownership of every descriptor that arrived before judging the message, so that none
    // leaks: a well-formed message carries exactly one, in the first segment.
    int extra_fds = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
        if (fd_out != nullptr && !fd_out->valid()) {
          fd_out->Reset(fd);
        } else {
          ::close(fd);
          ++extra_fds;
        }
      }
    }
    if (extra_fds > 0)
      return InvalidArgument(fmt::format("exported-memory message carried {} unexpected file descriptor(s)", extra_fds));
    if (msg.msg_flags & MSG_CTRUNC)
      return InvalidArgument("exported-memory message carried more control data than one descriptor");
    if (n == 0) return RemoteError("peer closed the socket while sending exported memory");
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SendAll(int sock, const void* buf, size_t len, Deadline deadline, int fd) {
  const char* p = static_cast<const char*>(buf);
  size_t sent = 0;
  bool fd_pending = fd >= 0;
  while (sent < len) {
    KZ_RETURN_IF_ERROR(WaitFor(sock, POLLOUT, deadline, "sending exported memory"));
    iovec iov{const_cast<char*>(p + sent), len - sent};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (fd_pending) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd, sizeof(fd));
    }
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return FromErrno(errno, "sendmsg");
    }
    fd_pending = false;
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Status SendExportedMemory(int socket_fd, const ExportedMemory& e, Deadline deadline) {
  if (e.kind == ExportKind::kFd && !e.fd.valid()) return InvalidArgument("exported memory has no fd to send");
  if (e.backend.size() > kMaxName || e.device_uuid.size() > kMaxName || e.opaque.size() > kMaxOpaque)
    return InvalidArgument("exported memory descriptor is too large");
  WireHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.kind = static_cast<uint8_t>(e.kind);
  h.has_fd = e.kind == ExportKind::kFd ? static_cast<uint8_t>(1 | (e.dmabuf ? 2 : 0)) : 0;
  h.offset = e.offset;
  h.size = e.size;
  h.device_index = e.device_index;
  h.backend_len = static_cast<uint32_t>(e.backend.size());
  h.uuid_len = static_cast<uint32_t>(e.device_uuid.size());
  h.opaque_len = static_cast<uint32_t>(e.opaque.size());
  std::string msg(reinterpret_cast<const char*>(&h), sizeof(h));
  msg += e.backend;
  msg += e.device_uuid;
  msg.append(reinterpret_cast<const char*>(e.opaque.data()), e.opaque.size());
  return SendAll(socket_fd, msg.data(), msg.size(), deadline, h.has_fd ? e.fd.get() : -1);
}

Result<ExportedMemory> ReceiveExportedMemory(int socket_fd, Deadline deadline) {
  WireHeader h{};
  ExportedMemory e;
  KZ_RETURN_IF_ERROR(RecvAll(socket_fd, &h, sizeof(h), deadline, &e.fd));
  if (h.magic != kMagic) return InvalidArgument("not an exported-memory message (bad magic)");
  if (h.version != kVersion)
    return InvalidArgument(fmt::format("exported-memory message version {}, expected {}", h.version, kVersion));
  if (h.kind != static_cast<uint8_t>(ExportKind::kFd) && h.kind != static_cast<uint8_t>(ExportKind::kOpaque))
    return InvalidArgument(fmt::format("exported-memory message of unknown kind {}", h.kind));
  if (h.backend_len > kMaxName || h.uuid_len > kMaxName || h.opaque_len > kMaxOpaque)
    return InvalidArgument("exported-memory message is too large");
  if ((h.has_fd & 1) != 0 && !e.fd.valid()) return InvalidArgument("exported-memory message arrived without its fd");
  std::string rest(h.backend_len + h.uuid_len + h.opaque_len, '\0');
  if (!rest.empty()) KZ_RETURN_IF_ERROR(RecvAll(socket_fd, rest.data(), rest.size(), deadline, nullptr));
  e.kind = static_cast<ExportKind>(h.kind);
  e.dmabuf = (h.has_fd & 2) != 0;
  e.offset = h.offset;
  e.size = h.size;
  e.device_index = h.device_index;
  e.backend = rest.substr(0, h.backend_len);
  e.device_uuid = rest.substr(h.backend_len, h.uuid_len);
  e.opaque.assign(rest.begin() + h.backend_len + h.uuid_len, rest.end());
  return e;
}

}  // namespace kizuna::device
