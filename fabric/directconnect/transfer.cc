#include "fabric/directconnect/transfer.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <thread>

#include <fmt/format.h>

#include "fabric/directconnect/endpoint.h"
#include "fabric/directconnect/transfer_internal.h"
#include "runtime/device/exported_memory.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::directconnect {

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
      return ProtocolError(label_,
                           fmt::format("region {} is named, but the peer withdrew it (or never offered it)", id));
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

}  // namespace kizuna::fabric::directconnect
