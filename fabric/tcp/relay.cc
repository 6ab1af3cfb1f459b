#include "fabric/tcp/relay.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/wire.h"

namespace kizuna::fabric::tcp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kForwardHeader = 12;

size_t AddressBytes(int family) { return family == AF_INET ? 4 : 16; }
size_t RelayBytes(int family) { return 2 + 2 + AddressBytes(family) + 16; }

}  // namespace

bool IsForward(const Handle& handle) {
  uint32_t magic = 0;
  if (handle.size < sizeof magic) return false;
  std::memcpy(&magic, handle.data.data(), sizeof magic);
  return magic == kForwardMagic;
}

Result<Handle> EncodeForward(std::span<const Fabric::Hop> hops, const Handle& target) {
  KZ_ASSIGN_OR_RETURN(WireHandle t, DecodeHandle(target));
  const size_t need = kForwardHeader + hops.size() * RelayBytes(t.family) + sizeof(WireHandle);
  if (hops.empty() || hops.size() > 255 || need > Handle::kMax)
    return InvalidArgument(fmt::format(
        "tcp: a path through {} relaying rank(s) takes {} bytes, and a handle holds {} (at most {} relays over {})",
        hops.size(), need, Handle::kMax, (Handle::kMax - kForwardHeader - sizeof(WireHandle)) / RelayBytes(t.family),
        t.family == AF_INET ? "IPv4" : "IPv6"));
  Handle out;
  uint8_t* p = out.data.data();
  auto put = [&](const void* bytes, size_t n) {
    std::memcpy(p, bytes, n);
    p += n;
  };
  const uint32_t magic = kForwardMagic;
  const uint16_t version = kProtocolVersion, order = kByteOrderMark, reserved = 0;
  const uint8_t count = static_cast<uint8_t>(hops.size()), family = static_cast<uint8_t>(t.family);
  put(&magic, 4);
  put(&version, 2);
  put(&order, 2);
  put(&count, 1);
  put(&family, 1);
  put(&reserved, 2);
  for (const Fabric::Hop& hop : hops) {
    KZ_ASSIGN_OR_RETURN(WireHandle via, DecodeHandle(hop.via));
    if (via.family != t.family) return InvalidArgument("tcp: a forwarding path mixes IPv4 and IPv6 handles");
    if (hop.out_device > UINT16_MAX)
      return InvalidArgument(fmt::format("tcp: device {} to forward from", hop.out_device));
    const uint16_t device = static_cast<uint16_t>(hop.out_device);
    put(&via.port, 2);
    put(&device, 2);
    put(via.address.data(), AddressBytes(t.family));
    put(via.secret.data(), via.secret.size());
  }
  put(&t, sizeof t);
  out.size = static_cast<uint32_t>(p - out.data.data());
  return out;
}

Result<Forwarding> DecodeForward(const Handle& handle) {
  const uint8_t* p = handle.data.data();
  if (handle.size < kForwardHeader || !IsForward(handle))
    return InvalidArgument(fmt::format("tcp: a handle of {} bytes is not a forward handle", handle.size));
  uint16_t version = 0, order = 0;
  std::memcpy(&version, p + 4, 2);
  std::memcpy(&order, p + 6, 2);
  const int relays = p[8];
  const int family = p[9];
  if (order != kByteOrderMark)
    return InvalidArgument("tcp: the forward handle comes from a host of another byte order");
  if (version != kProtocolVersion)
    return InvalidArgument(fmt::format("tcp: the forward handle is of protocol version {} (this build speaks {})",
                                       version, kProtocolVersion));
  if (family != AF_INET && family != AF_INET6)
    return InvalidArgument(fmt::format("tcp: the forward handle names address family {}", family));
  const size_t relay = RelayBytes(family);
  if (relays < 1 || handle.size != kForwardHeader + static_cast<size_t>(relays) * relay + sizeof(WireHandle))
    return InvalidArgument(
        fmt::format("tcp: a forward handle of {} bytes does not hold its {} relay(s)", handle.size, relays));
  Forwarding f;
  f.relays = relays;
  const uint8_t* r = p + kForwardHeader;
  WireHandle first;
  first.family = static_cast<uint16_t>(family);
  std::memcpy(&first.port, r, 2);
  std::memcpy(&f.first.out_device, r + 2, 2);
  std::memcpy(first.address.data(), r + 4, AddressBytes(family));
  std::memcpy(f.first.secret.data(), r + 4 + AddressBytes(family), 16);
  if (first.port == 0) return InvalidArgument("tcp: the forward handle names port 0 for a relay");
  f.first.address = AddressOf(first);
  const uint8_t* rest = r + relay;
  const size_t target_at = kForwardHeader + static_cast<size_t>(relays) * relay;
  Handle target;
  target.size = sizeof(WireHandle);
  std::memcpy(target.data.data(), p + target_at, sizeof(WireHandle));
  KZ_ASSIGN_OR_RETURN(f.target, DecodeHandle(target));
  if (f.target.family != family) return InvalidArgument("tcp: a forward handle mixes IPv4 and IPv6 addresses");
  if (relays == 1) {
    f.onward = target;
    return f;
  }
  // The onward handle: the same header, one relay fewer.
  uint8_t* o = f.onward.data.data();
  std::memcpy(o, p, kForwardHeader);
  o[8] = static_cast<uint8_t>(relays - 1);
  const size_t tail = handle.size - static_cast<size_t>(rest - p);
  std::memcpy(o + kForwardHeader, rest, tail);
  f.onward.size = static_cast<uint32_t>(kForwardHeader + tail);
  return f;
}

std::vector<uint8_t> RelayPrefix(const Forwarding& f) {
  RelayHello h;
  h.secret = f.first.secret;
  h.out_device = f.first.out_device;
  h.onward_size = static_cast<uint16_t>(f.onward.size);
  std::vector<uint8_t> out(sizeof h + f.onward.size);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, f.onward.data.data(), f.onward.size);
  return out;
}

const sockaddr_storage& CableToFirst(const DeviceAddress& device) {
  for (size_t c = 0; c < device.at_peer.size(); ++c)
    if (device.at_peer[c] == 0) return c == 0 ? device.address : device.more[c - 1];
  return device.address;
}

// ---- The relay thread ----

// One relayed socket: `in` from the rank before, `out` to the rank after; a buffer each way.
struct Relays::Pair {
  struct Direction {
    std::vector<uint8_t> data = std::vector<uint8_t>(kRelayBufferBytes);
    size_t head = 0, tail = 0;  // bytes [head, tail) wait to be written
    bool eof = false;           // the reading side closed its sending half
    bool shut = false;          // and that was passed on (shutdown of the writing side)
  };
  UniqueFd in, out;
  bool connecting = true;
  Clock::time_point since = Clock::now();
  std::string where;
  Direction forth, back;  // in -> out, out -> in
};

namespace {

// Reads what `from` has into `d`; false when the connection failed.
bool Fill(int from, Relays::Pair::Direction& d, uint64_t& moved) {
  if (d.head == d.tail) {
    d.head = d.tail = 0;
  } else if (d.tail == d.data.size() && d.head > 0) {
    std::memmove(d.data.data(), d.data.data() + d.head, d.tail - d.head);
    d.tail -= d.head;
    d.head = 0;
  }
  while (!d.eof && d.tail < d.data.size()) {
    const ssize_t k = ::recv(from, d.data.data() + d.tail, d.data.size() - d.tail, MSG_DONTWAIT);
    if (k > 0) {
      d.tail += static_cast<size_t>(k);
      moved += static_cast<uint64_t>(k);
      continue;
    }
    if (k == 0) {
      d.eof = true;
      break;
    }
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
  return true;
}

// Writes what `d` holds to `to`; false when the connection failed.
bool Drain(int to, Relays::Pair::Direction& d) {
  while (d.head < d.tail) {
    const ssize_t k = ::send(to, d.data.data() + d.head, d.tail - d.head, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      d.head += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  d.head = d.tail = 0;  // all written: the whole buffer is free again
  if (d.eof && !d.shut) {
    ::shutdown(to, SHUT_WR);
    d.shut = true;
  }
  return true;
}

}  // namespace

Relays::Relays(std::vector<DeviceAddress> devices) : devices_(std::move(devices)) {}

Relays::~Relays() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (wake_.valid()) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t k = ::write(wake_.get(), &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
}

size_t Relays::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

uint64_t Relays::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

Status Relays::Start(UniqueFd from, int out_device, const Handle& onward, const std::string& where) {
  if (out_device < 0 || out_device >= static_cast<int>(devices_.size()))
    return InvalidArgument(
        fmt::format("tcp: asked to relay from device {}; this fabric has {}", out_device, devices_.size()));
  const DeviceAddress& device = devices_[static_cast<size_t>(out_device)];
  auto pair = std::make_unique<Pair>();
  sockaddr_storage to{};
  if (IsForward(onward)) {
    KZ_ASSIGN_OR_RETURN(Forwarding f, DecodeForward(onward));
    to = f.first.address;
    const std::vector<uint8_t> prefix = RelayPrefix(f);
    std::memcpy(pair->forth.data.data(), prefix.data(), prefix.size());
    pair->forth.tail = prefix.size();
  } else {
    KZ_ASSIGN_OR_RETURN(WireHandle w, DecodeHandle(onward));
    to = AddressOf(w);
  }
  if (to.ss_family != device.address.ss_family)
    return InvalidArgument(fmt::format("tcp: {} has no address of the onward handle's family", device.properties.name));
  KZ_ASSIGN_OR_RETURN(UniqueFd fd, NewSocket(to.ss_family));
  KZ_RETURN_IF_ERROR(NoDelay(fd.get()));
  KZ_RETURN_IF_ERROR(NoDelay(from.get()));
  // Out over the device's own cable, as a connection of this rank's would go.
  const sockaddr_storage& local = CableToFirst(device);
  if (device.properties.point_to_point &&
      ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&local), LengthOf(local)) != 0)
    return FromErrno(errno, fmt::format("tcp: bind to {} ({})", DescribeAddress(local), device.properties.name));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), LengthOf(to)) != 0 && errno != EINPROGRESS)
    return FromErrno(errno, fmt::format("tcp: relaying to {}", DescribeAddress(to)));
  pair->in = std::move(from);
  pair->out = std::move(fd);
  pair->where = fmt::format("{} -> {} ({})", where, DescribeAddress(to), device.properties.name);
  KZ_INFO(kLogFabric, "tcp: relaying {}", pair->where);
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Aborted("tcp: the fabric is closing");
  if (!wake_.valid()) {
    wake_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_.valid()) return FromErrno(errno, "tcp: eventfd");
    thread_ = std::thread([this] { Loop(); });
  }
  adding_.push_back(std::move(pair));
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t k = ::write(wake_.get(), &one, sizeof one);
  return Status::Ok();
}

void Relays::Loop() {
  std::vector<std::unique_ptr<Pair>> pairs;
  std::vector<pollfd> fds;
  while (true) {
    uint64_t moved = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      for (auto& p : adding_) pairs.push_back(std::move(p));
      adding_.clear();
      active_ = pairs.size();
    }
    fds.assign(1, pollfd{wake_.get(), POLLIN, 0});
    for (const auto& p : pairs) {
      short in = 0, out = 0;
      if (p->connecting) {
        out = POLLOUT;
      } else {
        if (!p->forth.eof && (p->forth.tail < p->forth.data.size() || p->forth.head > 0)) in |= POLLIN;
        if (!p->back.eof && (p->back.tail < p->back.data.size() || p->back.head > 0)) out |= POLLIN;
        if (p->back.head < p->back.tail) in |= POLLOUT;
        if (p->forth.head < p->forth.tail) out |= POLLOUT;
      }
      fds.push_back(pollfd{p->in.get(), in, 0});
      fds.push_back(pollfd{p->out.get(), out, 0});
    }
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) {
      KZ_WARN(kLogFabric, "tcp: the relay thread's poll failed: {}", std::strerror(errno));
      break;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t k = ::read(wake_.get(), &count, sizeof count);
    }
    const auto now = Clock::now();
    for (size_t i = 0; i < pairs.size();) {
      Pair& p = *pairs[i];
      const pollfd& pout = fds[2 + 2 * i];
      std::string failed;
      if (p.connecting) {
        if (pout.revents != 0) {
          int err = 0;
          socklen_t len = sizeof err;
          if (::getsockopt(p.out.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          if (err != 0)
            failed = fmt::format("the onward connection failed: {}", std::strerror(err));
          else
            p.connecting = false;
        } else if (now - p.since > kRelayConnectTimeout) {
          failed = "the onward connection was not made in time";
        }
      }
      if (failed.empty() && !p.connecting) {
        const bool ok = Fill(p.in.get(), p.forth, moved) && Fill(p.out.get(), p.back, moved) &&
                        Drain(p.out.get(), p.forth) && Drain(p.in.get(), p.back);
        if (!ok) failed = fmt::format("ended: {}", std::strerror(errno));
      }
      const bool done = p.forth.shut && p.back.shut;
      if (!failed.empty()) KZ_INFO(kLogFabric, "tcp: relay {} {}", p.where, failed);
      if (!failed.empty() || done) {
        // Closing both sockets ends both connections: the ends see their comms fail, never hang.
        pairs.erase(pairs.begin() + static_cast<ptrdiff_t>(i));
        fds.erase(fds.begin() + static_cast<ptrdiff_t>(1 + 2 * i), fds.begin() + static_cast<ptrdiff_t>(3 + 2 * i));
        continue;
      }
      ++i;
    }
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ += moved;
    active_ = pairs.size() + adding_.size();
  }
}

}  // namespace kizuna::fabric::tcp
