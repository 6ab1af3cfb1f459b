// The directconnect handshake's wire forms and helpers, shared by endpoint.cc (handles, connect)
// and listener.cc (listen, accept). Not a public header.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "fabric/directconnect/endpoint.h"

namespace kizuna::fabric::directconnect::endpoint_internal {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHandleMagic = 0x4448'5a4b;  // "KZHD"
constexpr uint32_t kHelloMagic = 0x4548'5a4b;   // "KZHE"
// 2: one socket and secret per node, shared by its ports' listeners; handles and hellos name the
// listener.
constexpr uint16_t kProtocolVersion = 2;
constexpr size_t kSocketNameBytes = 48;
// A node's socket keeps at most this many connections that have not finished their hello (or two
// per listener, when more); beyond it one is dropped (a flood of strangers cannot exhaust
// descriptors) — the oldest of the process with the most, so a flood from one process evicts its
// own connections, not a peer's.
constexpr size_t kMaxPending = 64;

struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t port;
  uint32_t node;
  uint32_t listener;  // the listener's id on the node's socket
  uint64_t topology;  // Topology::Fingerprint()
  uint64_t host;      // DirectConnectFabric::host_fingerprint()
  uint8_t token[kTokenBytes];
  char socket_name[kSocketNameBytes];  // abstract-namespace name, NUL-padded
};
static_assert(sizeof(WireHandle) <= kHandleMaxBytes);

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  uint8_t token[kTokenBytes];
  uint64_t topology;
  uint32_t from_node, from_port;
  uint32_t to_node, to_port;
  uint64_t nonce;
  int32_t pid;
  uint32_t listener;  // from the handle
};
constexpr int kHelloFds = 3;  // channel segment, sender's wakeup, receiver's wakeup

inline std::string Hex(const uint8_t* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

inline bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

inline socklen_t AbstractAddress(std::string_view name, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  addr->sun_path[0] = '\0';
  std::memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

inline std::string PortLabel(const Topology& t, int node, int port) { return t.PortName(PortRef{node, port}); }

}  // namespace kizuna::fabric::directconnect::endpoint_internal
