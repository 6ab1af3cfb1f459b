// Handles, listening, connecting and accepting for the tcp fabric (README.md, "Connections").
//
// A handle (44 bytes) carries the listener's address and port, a 128-bit random secret and the
// protocol version; a bundle's (parallel cables to one peer, DeviceAddress::more) adds the port and
// address of each further cable's listening socket, 18 bytes each. Connect opens `streams` sockets to it, non-blocking,
// and sends a hello on each (the secret, a random 64-bit connection nonce, the stream's index, flags: whether the
// connection may go both ways, or is the way back of one the listener's side made); Accept reads hellos
// without blocking, checks the secret in constant time, gathers a connection's streams by nonce, and answers each with
// a welcome once all have arrived. The connecting side has its SendComm once every welcome is in. A hello that fails
// the checks is logged and its socket closed: nothing it carried reaches a comm.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/tcp/transfer.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::tcp {

inline constexpr uint32_t kHandleMagic = 0x4b5a5448;   // "KZTH"
inline constexpr uint32_t kHelloMagic = 0x4b5a5443;    // "KZTC"
inline constexpr uint32_t kWelcomeMagic = 0x4b5a5457;  // "KZTW"
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr uint16_t kByteOrderMark = 0x0102;
// A connection's sockets, at most (the handshake refuses more).
inline constexpr int kMaxStreams = 16;
// How long an accepted socket may take to deliver its hello before it is dropped.
inline constexpr auto kHelloTimeout = std::chrono::seconds(10);

// What a Listen's handle holds.
struct WireHandle {
  uint32_t magic = kHandleMagic;
  uint16_t version = kProtocolVersion;
  uint16_t byte_order = kByteOrderMark;
  uint16_t family = 0;                // AF_INET or AF_INET6
  uint16_t port = 0;                  // host byte order
  std::array<uint8_t, 16> address{};  // network byte order; IPv4 in the first 4 bytes
  std::array<uint8_t, 16> secret{};
};
static_assert(sizeof(WireHandle) == 44);

// A further cable's listening socket in a bundle's handle, after the WireHandle.
struct WireCable {
  uint16_t port = 0;                  // host byte order
  std::array<uint8_t, 16> address{};  // network byte order; IPv4 in the first 4 bytes
};
static_assert(sizeof(WireCable) == 18);
// Cables in one bundle, at most: what a handle holds.
inline constexpr int kMaxBundle = 1 + static_cast<int>((kHandleMaxBytes - sizeof(WireHandle)) / sizeof(WireCable));

// Hello::flags.
inline constexpr uint32_t kHelloTwoWay = 1;  // the other direction may join the connection later
inline constexpr uint32_t kHelloBack = 2;    // the way back of the listener's own connection `nonce`

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kProtocolVersion;
  uint16_t byte_order = kByteOrderMark;
  std::array<uint8_t, 16> secret{};
  uint64_t nonce = 0;
  uint16_t stream = 0;
  uint16_t streams = 0;
  uint32_t flags = 0;
};
static_assert(sizeof(Hello) == 40);

struct Welcome {
  uint32_t magic = kWelcomeMagic;
  uint32_t stream = 0;
  uint64_t nonce = 0;
};
static_assert(sizeof(Welcome) == 16);

// The size of `a` for bind and connect.
socklen_t LengthOf(const sockaddr_storage& a);
// A non-blocking stream socket of `family`.
Result<UniqueFd> NewSocket(int family);
// TCP_NODELAY: small messages leave at once.
Status NoDelay(int fd);

Handle EncodeHandle(const WireHandle& h, const std::vector<WireCable>& more = {});
// kInvalidArgument naming what is wrong: size, magic, version, byte order, address family, port.
// `more`, when given, receives a bundle's further cables.
Result<WireHandle> DecodeHandle(const Handle& handle, std::vector<WireCable>* more = nullptr);
// "10.0.0.1:4242", "[fd00::1]:4242".
std::string DescribeAddress(const sockaddr_storage& a);
sockaddr_storage AddressOf(const WireHandle& h);
sockaddr_storage AddressOf(const WireHandle& h, const WireCable& c);

// A device as the endpoint needs it: its properties and the address its sockets bind to.
struct DeviceAddress {
  FabricDeviceProperties properties;
  sockaddr_storage address{};  // port 0
  // A bundle: further cables to the same peer, each with the address of its own interface. A
  // connection's streams go round the cables (stream s on cable s mod cables, `address` being
  // cable 0), each to the peer's end of its cable: the peer's cable at_peer[i] (the order of the
  // peer's handle) is this side's cable i. A listener listens on every cable.
  std::vector<sockaddr_storage> more;
  std::vector<int> at_peer;  // empty: a single cable (or none)
  int cables() const { return 1 + static_cast<int>(more.size()); }
};

class Relays;  // relay.h

class TcpListenComm : public ListenComm {
 public:
  // `relays` takes the connections that arrive with a relay hello (relay.h); null: none are taken.
  static Result<std::unique_ptr<TcpListenComm>> Create(const DeviceAddress& device, Hub& hub, Relays* relays);

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override;
  Status DoWaitAcceptable(Deadline deadline) override;

 private:
  struct Incoming {
    UniqueFd fd;
    Hello hello;
    size_t got = 0;
    std::chrono::steady_clock::time_point since;
    Handle onward;  // a relay hello's onward handle (relay.h), onward.size bytes of it read
    size_t onward_got = 0;
  };
  TcpListenComm(FabricDeviceProperties properties, Handle handle, WireHandle wire, std::vector<UniqueFd> fds, Hub& hub,
                Relays* relays)
      : ListenComm(std::move(properties), handle), wire_(wire), fds_(std::move(fds)), hub_(hub), relays_(relays) {}
  // Reads what the pending sockets sent; a complete, valid hello joins its connection's streams, a
  // complete, valid relay hello goes to relays_.
  void ReadHellos();
  // Reads a relay hello's onward handle; "" while it is coming, else why the socket is dropped,
  // or "relayed" once relays_ took it.
  std::string ReadRelay(Incoming& in);

  std::mutex mu_;
  WireHandle wire_;
  std::vector<UniqueFd> fds_;  // listening: one socket per cable of the device
  Hub& hub_;
  Relays* relays_;
  // A connection whose streams have all come: the comm that receives on it.
  Result<std::unique_ptr<RecvComm>> Accepted(uint64_t nonce, uint32_t flags, std::vector<UniqueFd> fds);

  std::vector<Incoming> incoming_;  // accepted, hello not complete
  struct Gathering {
    uint32_t flags = 0;
    std::vector<UniqueFd> fds;  // by stream index
  };
  std::map<uint64_t, Gathering> gathering_;  // by nonce: the streams so far
};

// One Connect in progress (Fabric::Connect is called again with the same handle until it yields).
class PendingConnect {
 public:
  // `streams` sockets; a connection that may go both ways (`two_way`: a switched device, no relay)
  // has one more, stream 0, for its small messages and posts.
  static Result<std::shared_ptr<PendingConnect>> Start(const DeviceAddress& device, const Handle& handle, int streams,
                                                       Hub& hub);
  // The way back over `back`, a connection the peer made (README.md, "Both directions"): its
  // stream 0 and `streams` more sockets, for this side's large messages.
  static Result<std::shared_ptr<PendingConnect>> StartBack(const DeviceAddress& device, const Handle& handle,
                                                           int streams, Hub& hub, std::shared_ptr<Connection> back);
  // The SendComm once every stream is welcomed; nullptr meanwhile.
  Result<std::unique_ptr<SendComm>> Poll();
  // Blocks until a socket of the attempt is ready or the deadline.
  Status Wait(Deadline deadline);

  std::mutex mu;  // serializes Poll and Wait of one attempt

 private:
  enum class Phase : uint8_t { kConnecting, kHelloSent, kWelcomed };
  struct StreamState {
    UniqueFd fd;
    Phase phase = Phase::kConnecting;
    Welcome welcome;
    size_t got = 0;
  };
  PendingConnect(const DeviceAddress& device, Hub& hub) : device_(device), hub_(hub) {}
  // Stream `stream`'s socket, from `local` (on a cable) to peers_[stream], connecting.
  Result<UniqueFd> Open(const sockaddr_storage& local, int stream);
  Status Advance(StreamState& s, int index);

  DeviceAddress device_;
  Hub& hub_;
  WireHandle wire_;
  std::vector<sockaddr_storage> peers_;  // per stream: the peer's end of the stream's cable
  uint64_t nonce_ = 0;
  uint32_t flags_ = 0;                // Hello::flags
  std::shared_ptr<Connection> back_;  // StartBack's
  std::vector<uint8_t> prefix_;       // sent before each hello: a relay hello (relay.h), or nothing
  std::vector<StreamState> streams_;
};

}  // namespace kizuna::fabric::tcp
