// Forwarding between ranks that share no cable (README.md, "Forwarding"): a connection crosses the
// ranks in between, each relaying its bytes from one socket to the next as they come (cut-through;
// nothing is stored beyond a buffer per direction).
//
// The connecting side (PendingConnect) holds a *forward handle* (Fabric::Forward): the relays in
// order, and the target's handle. Each stream connects to the first relay's listener and sends a
// *relay hello* (the relay's listen secret, the relay's device to leave from, the onward handle:
// the rest of the path), then the target's own hello, which the relays pass on untouched. The
// relay's listen comm reads the relay hello in Accept (it is the transport's, accepting for its own
// peers) and hands the socket to the fabric's Relays, whose thread connects onward from the named
// device (bound to its cable) and copies both ways until either end closes. The target accepts as
// from any peer; its welcome comes back the same way.
//
// A forward handle: magic "KZTF" (u32) | version (u16) | byte-order mark (u16) | relays (u8) |
// address family (u8) | reserved (u16) | per relay: port (u16) | device to leave from (u16) |
// address (4 bytes for IPv4, 16 for IPv6) | secret (16 bytes) | the target's handle (44 bytes: its
// first cable; a forwarded connection keeps to one cable of a bundle). 128 bytes hold three relays
// over IPv4 (a path of four cables), two over IPv6.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/tcp/endpoint.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::tcp {

inline constexpr uint32_t kForwardMagic = 0x4b5a5446;  // "KZTF"
inline constexpr uint32_t kRelayMagic = 0x4b5a5452;    // "KZTR"
// How long a relay may take to connect onward before it gives the connection up.
inline constexpr auto kRelayConnectTimeout = std::chrono::seconds(10);
// Bytes buffered per direction of a relayed socket.
inline constexpr size_t kRelayBufferBytes = 256 << 10;

// The first bytes on a socket to a relaying rank: as long as a Hello (the listener reads that many
// and looks at the magic), then `onward_size` bytes of the onward handle.
struct RelayHello {
  uint32_t magic = kRelayMagic;
  uint16_t version = kProtocolVersion;
  uint16_t byte_order = kByteOrderMark;
  std::array<uint8_t, 16> secret{};  // the relaying listener's
  uint16_t out_device = 0;           // the relaying rank's device to leave from
  uint16_t onward_size = 0;          // bytes of the onward handle that follow
  std::array<uint8_t, 12> reserved{};
};
static_assert(sizeof(RelayHello) == sizeof(Hello));

// One relay of a path, decoded.
struct RelayStep {
  sockaddr_storage address{};  // the relay's listening socket
  std::array<uint8_t, 16> secret{};
  uint16_t out_device = 0;
};

// A forward handle, decoded one step at a time: where to connect, and what that relay connects to
// (a forward handle of the relays after it, or the target's handle).
struct Forwarding {
  RelayStep first;
  Handle onward;
  WireHandle target;  // the end of the path (its first cable)
  int relays = 0;     // in the whole handle
};

// The handle through `hops` to `target` (Fabric::Forward). kInvalidArgument for a hop or target
// that is not a tcp handle, families that differ, or a path longer than a handle holds.
Result<Handle> EncodeForward(std::span<const Fabric::Hop> hops, const Handle& target);
bool IsForward(const Handle& handle);
// kInvalidArgument naming what is wrong.
Result<Forwarding> DecodeForward(const Handle& handle);
// The relay hello and onward handle a connection to `f.first` starts with.
std::vector<uint8_t> RelayPrefix(const Forwarding& f);
// The cable of `device` (0 or an index into `more`, plus one) that reaches the peer's first
// listening socket (DeviceAddress::at_peer), and its address.
const sockaddr_storage& CableToFirst(const DeviceAddress& device);

// A fabric's relayed connections and the thread that moves their bytes. Thread-safe.
class Relays {
 public:
  explicit Relays(std::vector<DeviceAddress> devices);
  // Stops the thread and closes every relayed socket (the ends see their connections fail).
  ~Relays();
  Relays(const Relays&) = delete;
  Relays& operator=(const Relays&) = delete;

  // Relays `from` (its relay hello read, checked) onward from device `out_device` to `onward`:
  // connects (non-blocking) and lets the thread copy. kInvalidArgument for a device that is not
  // this fabric's or an onward handle that is not a tcp handle; the caller closes `from`.
  Status Start(UniqueFd from, int out_device, const Handle& onward, const std::string& where);
  // Sockets relayed now (pairs), for tests and logs.
  size_t active() const;
  // Bytes relayed so far, both directions.
  uint64_t bytes() const;

  struct Pair;  // one relayed socket (relay.cc)

 private:
  void Loop();

  const std::vector<DeviceAddress> devices_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Pair>> adding_;  // guarded by mu_: for the thread to take
  size_t active_ = 0;                          // guarded by mu_
  uint64_t bytes_ = 0;                         // guarded by mu_
  bool stopping_ = false;                      // guarded by mu_
  UniqueFd wake_;                              // an eventfd: new pairs, stop
  std::thread thread_;                         // started with the first pair
};

}  // namespace kizuna::fabric::tcp
