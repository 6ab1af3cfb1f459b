// The public side of the bootstrap: the non-virtual wrappers every implementation shares, and
// CreateTcpBootstrap (the TCP implementation lives in tcp_*.cc, see tcp_internal.h).
#include "runtime/bootstrap/bootstrap.h"

#include <memory>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "runtime/bootstrap/tcp_internal.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap {

// ---------------------------------------------------------------------------------------------
// The non-virtual wrappers: argument checks, one call at a time, sticky collective failures.

namespace {
constexpr std::string_view kAllGather = "AllGather";
constexpr std::string_view kBarrier = "Barrier";
}  // namespace

Status Bootstrap::Enter(std::string_view op, bool collective) {
  if (busy_.exchange(true, std::memory_order_acquire)) {
    return InvalidArgument(fmt::format("{}: this Bootstrap (rank {}) is already serving a call from another "
                                       "thread; it serves one call at a time",
                                       op, rank_));
  }
  // Point to point stays usable after a failed collective: it needs only the two ranks, which is
  // what survivors build a new communicator on (Communicator::Shrink).
  if (collective && !failed_.ok()) {
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
  KZ_RETURN_IF_ERROR(Enter(kAllGather, /*collective=*/true));
  CallGuard guard(this);
  Result<std::vector<Bytes>> r = DoAllGather(mine, deadline);
  if (!r.ok()) failed_ = r.status();
  return r;
}

Status Bootstrap::Barrier(Deadline deadline) {
  KZ_RETURN_IF_ERROR(Enter(kBarrier, /*collective=*/true));
  CallGuard guard(this);
  Status s = DoBarrier(deadline);
  if (!s.ok()) failed_ = s;
  return s;
}

Status Bootstrap::Send(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) {
  if (peer < 0 || peer >= size_)
    return InvalidArgument(fmt::format("Send: peer {} is not a rank (size {})", peer, size_));
  if (bytes.size() > kMaxMessageBytes)
    return InvalidArgument(fmt::format("Send: {} bytes exceed the bootstrap's limit of {} bytes per message",
                                       bytes.size(), kMaxMessageBytes));
  KZ_RETURN_IF_ERROR(Enter("Send", /*collective=*/false));
  CallGuard guard(this);
  return DoSend(peer, tag, bytes, deadline);
}

Result<Bytes> Bootstrap::Recv(int peer, uint32_t tag, Deadline deadline) {
  if (peer < 0 || peer >= size_)
    return InvalidArgument(fmt::format("Recv: peer {} is not a rank (size {})", peer, size_));
  KZ_RETURN_IF_ERROR(Enter("Recv", /*collective=*/false));
  CallGuard guard(this);
  return DoRecv(peer, tag, deadline);
}

// ---------------------------------------------------------------------------------------------
// TCP.

namespace tcp {

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

}  // namespace tcp

Result<std::unique_ptr<Bootstrap>> CreateTcpBootstrap(const UniqueId& id, int rank, int size, Deadline deadline,
                                                      const TcpBootstrapOptions& options) {
  if (size < 1 || size > kMaxRanks)
    return InvalidArgument(fmt::format("bootstrap: size {} is not in 1..{}", size, kMaxRanks));
  if (rank < 0 || rank >= size)
    return InvalidArgument(fmt::format("bootstrap: rank {} is not in 0..{} (size {})", rank, size - 1, size));
  if (id.root.port == 0) return InvalidArgument("bootstrap: the unique id's port is 0");
  KZ_RETURN_IF_ERROR(ValidateHost(id.root.host, "bootstrap: the unique id's root"));
  auto b = std::make_unique<tcp::TcpBootstrap>(id, rank, size, options);
  KZ_RETURN_IF_ERROR(b->Start(deadline));
  return std::unique_ptr<Bootstrap>(std::move(b));
}

}  // namespace kizuna::bootstrap
