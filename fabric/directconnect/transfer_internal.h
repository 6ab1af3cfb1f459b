// The direct-connect transfer protocol's private pieces, shared by its implementation files
// (internal to fabric/directconnect; nothing outside this folder includes it):
//
//   transfer.cc       Link (the connection state both sides share) and registration on a link
//   transfer_send.cc  DcSendComm: matching posts to sends, the direct / pull / staged paths, writes
//   transfer_recv.cc  DcRecvComm: receive posts, the records the sender writes, exposed regions
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "fabric/directconnect/memory.h"
#include "fabric/directconnect/transfer.h"
#include "fabric/fabric.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::directconnect {

using Clock = Link::Clock;

// Record types. Forward ring (sender -> receiver):
//   kData        id = receive id, arg0 = offset in the message, arg1 = message size,
//                arg2 = delivery time (ns), payload = the chunk
//   kDone        id = receive id, arg0 = size, arg2 = delivery time — the bytes are in place
//   kPull        id = receive id, arg0 = size, arg1 = sender region, arg2 = delivery time,
//                arg3 = offset in the region — the receiver copies them out and answers kPulled
//   kTooBig      id = receive id, arg0 = the message's size
//   kWriteData   id = exposed region, arg0 = offset in it, arg2 = delivery time, arg3 = immediate,
//                flags = kFlagLast | kFlagImmediate, payload = the chunk
//   kWriteNotify arg0 = immediate, arg2 = delivery time — a direct write's immediate
// Reverse ring (receiver -> sender):
//   kPost        id = receive id, arg0 = capacity, arg1 = tag, arg2 = region (0: none),
//                arg3 = offset in the region
//   kPulled      id = receive id, arg0 = 0 (copied) or 1 (refused: region not mappable here)
enum RecordType : uint16_t {
  kData = 1,
  kDone = 2,
  kPull = 3,
  kTooBig = 4,
  kWriteData = 5,
  kWriteNotify = 6,
  kPost = 16,
  kPulled = 17,
};
constexpr uint16_t kFlagLast = 1;
constexpr uint16_t kFlagImmediate = 2;
constexpr uint64_t kPullRefused = 1;

inline std::string_view RecordName(uint16_t type) {
  switch (type) {
    case kData: return "data";
    case kDone: return "done";
    case kPull: return "pull";
    case kTooBig: return "too-big";
    case kWriteData: return "write-data";
    case kWriteNotify: return "write-notify";
    case kPost: return "receive-post";
    case kPulled: return "pulled";
  }
  return "unknown";
}

// Delivery times travel as steady_clock nanoseconds: both ends are on one host, and libstdc++'s
// steady_clock is CLOCK_MONOTONIC, which all processes share. 0 means "no hold".
inline uint64_t ToNs(Clock::time_point t) {
  return t == Clock::time_point{}
             ? 0
             : static_cast<uint64_t>(
                   std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}
inline Clock::time_point FromNs(uint64_t ns) {
  return ns == 0 ? Clock::time_point{} : Clock::time_point(std::chrono::nanoseconds(static_cast<int64_t>(ns)));
}

// The remote key of an exposed region.
struct WireKey {
  uint32_t magic;
  uint16_t version;
  uint16_t mappable;  // 1: the region was offered by fd (the writer may map it)
  uint64_t nonce;     // the connection
  uint64_t region;
  uint64_t size;
};
static_assert(sizeof(WireKey) <= kRemoteKeyMaxBytes);
constexpr uint32_t kKeyMagic = 0x4b52'5a4b;  // "KZRK"
constexpr uint16_t kKeyVersion = 1;

// How long a side waits for a region message that a record has named (see Link::AwaitRegion).
constexpr double kRegionWaitSeconds = 5.0;

inline Status ProtocolError(const std::string& label, std::string_view what) {
  return RemoteError(fmt::format("{}: protocol error from the peer: {}", label, what));
}

// Registration, shared by both sides: creates the registration and, when it has an fd, offers it
// to the peer at once (so that the message is in the socket before any record names the region).
Result<std::unique_ptr<Registration>> RegisterOn(Link& link, const MemoryDescriptor& memory, uint64_t id);
// Withdraws an offered region from the peer; a peer that is gone needs no notice.
Status DeregisterOn(Link& link, DcRegistration& reg);

}  // namespace kizuna::fabric::directconnect
