// Listen, connect and accept for direct-connect links on one host.
//
// Listen on port p of node n adds a listener to the node's Unix stream socket in the abstract
// namespace (bound under a random name, with a 128-bit random secret, by the first Listen of the
// fabric and shared by every port's ListenComm until the last one closes: a node with a port per
// peer holds one listening descriptor, not one per peer); the handle carries the socket's name, the
// secret, n, p, the listener's id, the topology's fingerprint and the host's. Connect on port q
// checks, before touching the socket, that the topology links (this node, q) to exactly (n, p) —
// anything else is kInvalidArgument naming the topology — then connects, creates the connection's
// shared-memory channel and sends a hello carrying the secret and the listener's id with the
// channel's memfd and eventfds (SCM_RIGHTS). Accept takes pending connections off the node's socket
// without blocking, reads each hello as it arrives and checks, in order, the peer's uid
// (SO_PEERCRED), the secret (constant-time), the protocol version, the topology fingerprint, that
// the listener is still there, and that the connecting (node, port) is its port's link peer; the
// connection then waits for that listener's Accept. A hello whose descriptors the kernel dropped
// (MSG_CTRUNC: this process is at its open-file limit) is refused saying so. A connection that
// fails a check gets a one-line reason on its socket and is closed; it is logged (WARN) and never
// returned, and nothing it sent reaches a comm. A connection that sends no complete hello within
// kHelloTimeout is dropped, so a stranger cannot hold a slot.
//
// After the handshake the socket stays open beside the channel: it carries the fds of regions
// registered for single-copy transfers (memory.h) and its hang-up is how a side learns that the
// peer process died.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fabric/directconnect/fabric.h"
#include "fabric/fabric.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::directconnect {

inline constexpr auto kHelloTimeout = std::chrono::seconds(10);

// ---- Messages on the connection's socket after the handshake ----

enum class SocketMessageType : uint16_t {
  kRegionAdd = 1,     // followed by SendExportedMemory's message (with the region's fd)
  kRegionRemove = 2,
  kReject = 3,        // followed by `length` bytes of reason text
};

struct SocketMessage {
  uint32_t magic = 0;
  uint16_t type = 0;
  uint16_t reserved = 0;
  uint32_t length = 0;  // bytes of text that follow (kReject)
  uint32_t reserved2 = 0;
  uint64_t id = 0;      // region id (kRegionAdd / kRegionRemove)
};
static_assert(sizeof(SocketMessage) == 24);

inline constexpr uint32_t kSocketMessageMagic = 0x4d53'5a4b;  // "KZSM"
inline constexpr uint32_t kMaxRejectText = 1024;

// Writes / reads exactly `bytes` on a non-blocking stream socket, waiting in poll() up to the
// deadline (kTimeout). Reads return kRemoteError when the peer closed the socket. No SIGPIPE.
Status SendAll(int sock, const void* data, size_t bytes, Deadline deadline);
Status RecvAll(int sock, void* data, size_t bytes, Deadline deadline);
Status SendSocketMessage(int sock, SocketMessageType type, uint64_t id, std::string_view text, Deadline deadline);

// ---- Handles ----

inline constexpr size_t kTokenBytes = 16;

// What a directconnect handle carries (its wire form is private to endpoint.cc).
struct HandleInfo {
  uint16_t version = 0;
  int node = -1;                 // the listener's node index in the topology
  int port = -1;                 // the listener's port
  uint32_t listener = 0;         // the listener's id on its node's socket
  uint64_t topology = 0;         // Topology::Fingerprint() of the listener's topology
  uint64_t host = 0;             // DirectConnectFabric::host_fingerprint() of the listener's host
  uint8_t token[kTokenBytes] = {};  // the listener's secret
  std::string socket_name;       // abstract-namespace name of the listener's socket
};
// kInvalidArgument when `handle` is not a directconnect handle (size, magic, version).
Result<HandleInfo> ParseHandle(const Handle& handle);
Handle EncodeHandle(const HandleInfo& info);

// The fabric's Listen / Connect (DirectConnectFabric::DoListen / DoConnect call these).
Result<std::unique_ptr<ListenComm>> ListenOnPort(DirectConnectFabric& fabric, int port);
// ok + nullptr when the listener's accept queue is full (call again).
Result<std::unique_ptr<SendComm>> ConnectOnPort(DirectConnectFabric& fabric, int port, const Handle& handle);

}  // namespace kizuna::fabric::directconnect
