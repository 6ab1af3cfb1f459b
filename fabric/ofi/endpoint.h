// Listen, connect and accept for ofi. RDM endpoints are connectionless, so a connection is made
// by a small handshake over them:
//  - Listen opens an endpoint that receives only hellos, draws a 128-bit random secret and puts
//    the endpoint's address (fi_getname), the secret, the provider and this process's identity
//    in the handle.
//  - Connect (non-blocking; the fabric keeps the attempt by handle until it completes) opens the
//    future SendComm's endpoint, inserts the listener's address, and sends a hello: the secret,
//    a random 64-bit connection nonce, its own address and process identity. It returns the
//    SendComm once the welcome arrives.
//  - Accept reads hellos without blocking and checks the secret (constant time) and the protocol
//    version; a hello that fails is logged (WARN) and dropped, never returned, and nothing it
//    carried reaches a comm. For a good one it opens the RecvComm's own endpoint, inserts the
//    connector's address, sends a welcome with that endpoint's address, and returns the RecvComm
//    at once (the welcome leaves during the comm's first progress).
// The nonce's low bits are in every later tag of the connection (fabric.h, TagLayout).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/ofi/fabric.h"
#include "fabric/ofi/link.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::ofi {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kTokenBytes = 16;

// What an ofi handle carries (its wire form is private to endpoint.cc).
struct HandleInfo {
  uint16_t version = 0;
  uint32_t provider_hash = 0;  // OfiDevice::provider_hash() of the listener's device
  uint32_t addr_format = 0;    // the listener's fi_info::addr_format
  uint8_t token[kTokenBytes] = {};
  uint64_t process_nonce = 0;  // the listener's ProcessIdentity nonce and pid (in-process peers)
  uint32_t pid = 0;
  std::string address;         // the listener endpoint's address
};
// kInvalidArgument when `handle` is not an ofi handle (size, magic, version, address length).
Result<HandleInfo> ParseHandle(const Handle& handle);
// kNotSupported when the address does not fit.
Result<Handle> EncodeHandle(const HandleInfo& info);
size_t MaxHandleAddressBytes();

// The fabric's Listen (OfiFabric::DoListen).
Result<std::unique_ptr<ListenComm>> ListenOn(OfiFabric& fabric, int dev);

// A connection in progress (OfiFabric keeps it by device and handle between Connect calls).
class PendingConnect : private CompletionSink {
 public:
  // Validates the handle against the device and sends the hello.
  static Result<std::shared_ptr<PendingConnect>> Start(OfiFabric& fabric, int dev, const Handle& handle);
  ~PendingConnect() override;

  // Progresses the handshake: the SendComm once the welcome has arrived, nullptr while it has
  // not, an error when the attempt failed (the listener is gone, the handle was refused).
  Result<std::unique_ptr<SendComm>> Poll();
  // Blocks until the handshake may have progressed, or the deadline.
  Status Wait(Deadline deadline, int attempt);

  // Serializes Poll and Wait of Connect calls with the same handle from different threads.
  std::mutex mu;

 private:
  PendingConnect() = default;
  void OnMessage(const Message& message) override;
  void OnOpDone(FiOp& op, size_t len) override;
  void OnOpFailed(FiOp& op, const Status& status, bool connection) override;
  void OnImmediate(uint64_t) override {}

  std::unique_ptr<Link> link_;
  OfiFabric* fabric_ = nullptr;
  int dev_ = 0;
  uint64_t nonce_ = 0;
  std::string listener_address_;
  std::string peer_address_;  // the RecvComm's endpoint, from the welcome
  bool welcomed_ = false;
  Status failure_;
  std::vector<std::vector<uint8_t>> early_;  // control messages read together with the welcome
};

}  // namespace kizuna::fabric::ofi
