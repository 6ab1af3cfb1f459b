// Listen, connect and accept for roce. Queue pairs need each other's numbers before they can
// talk, so a connection starts with a small TCP handshake to the listener's GID address (the IP
// address of the port's network interface: the same network the RoCE traffic takes):
//  - Listen binds a TCP socket to the device's GID address (IPv4 for an IPv4-mapped GID),
//    draws a 128-bit random secret, and puts address, port, secret, its rank and GID in the
//    handle (EncodeHandle).
//  - Connect (non-blocking; the fabric keeps the attempt by handle until it completes) creates
//    the future SendComm's queue pair, connects the socket and sends a hello: the secret, a
//    random 64-bit connection nonce, its rank and queue pair (number, PSN, GID, MTU). On the
//    welcome it moves its queue pair to RTR and RTS, sends "ready" (one byte) and returns the
//    comm.
//  - Accept reads hellos without blocking and checks magic, version and the secret (constant
//    time); a hello that fails is logged (WARN) and dropped. For a good one it creates the
//    RecvComm's queue pair, moves it to RTR and RTS towards the connector's, and answers with a
//    welcome carrying its own; the comm is returned at once and sends nothing until "ready"
//    arrived (before that the connector's queue pair would drop it).
// The socket then stays open for the connection's life: its end of file is how a peer's close or
// death is seen (transfer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/roce/fabric.h"
#include "fabric/roce/qp.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::roce {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kSecretBytes = 16;

// What a roce handle carries.
struct HandleInfo {
  bool ipv6 = false;          // the address family of `address`
  uint8_t address[16] = {};   // IPv4 in the first 4 bytes, or IPv6
  uint16_t port = 0;          // TCP port of the listener (host order)
  uint32_t scope_id = 0;      // IPv6 link-local scope (an override may choose such a GID)
  uint8_t secret[kSecretBytes] = {};
  int32_t rank = -1;          // the listener's rank
  GidBytes gid{};             // the listener's GID (for logs; the queue pair's comes in the welcome)
};
// The handle's wire form (little-endian, versioned; <= 128 bytes).
Handle EncodeHandle(const HandleInfo& info);
// kInvalidArgument when `handle` is not a roce handle (size, magic, version, family).
Result<HandleInfo> ParseHandle(const Handle& handle);

// The fabric's Listen (RoceFabric::DoListen).
Result<std::unique_ptr<ListenComm>> ListenOn(RoceFabric& fabric, int dev);

// A connection in progress (RoceFabric keeps it by device and handle between Connect calls).
class PendingConnect {
 public:
  static Result<std::shared_ptr<PendingConnect>> Start(RoceFabric& fabric, int dev, const Handle& handle);

  // Progresses the handshake: the SendComm once connected, nullptr while not yet, an error when
  // the attempt failed (listener gone, secret refused).
  Result<std::unique_ptr<SendComm>> Poll();
  // Blocks until the socket may have progressed, or the deadline (at most 100 ms).
  Status Wait(Deadline deadline);

  // Serializes Poll and Wait of Connect calls with the same handle from different threads.
  std::mutex mu;

 private:
  enum class State { kConnecting, kSending, kReceiving };
  PendingConnect() = default;
  Status Fail(std::string why) const;

  std::shared_ptr<RoceDevice> device_;
  int my_rank_ = 0;
  HandleInfo peer_;
  std::string peer_text_;  // "10.0.0.2:40123 (rank 0)"
  std::unique_ptr<Link> link_;
  UniqueFd socket_;
  State state_ = State::kConnecting;
  uint64_t nonce_ = 0;
  std::vector<uint8_t> out_;  // the hello, sent from out_sent_
  size_t out_sent_ = 0;
  std::vector<uint8_t> in_;   // the welcome, received up to in_got_
  size_t in_got_ = 0;
};

}  // namespace kizuna::fabric::roce
