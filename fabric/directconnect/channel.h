// The shared-memory channel behind one direct-connect connection on a host: two single-producer
// single-consumer byte rings in one memfd segment (forward: sender -> receiver, for data and
// completions; reverse: receiver -> sender, for receive posts and acknowledgements), plus one
// eventfd per side for wakeups.
//
// Records: each ring carries framed records — a 48-byte RecordHeader followed by its payload,
// padded to 8 bytes — written at the head and read at the tail with copies that wrap around the
// ring's end. A record is published (head advanced, release) only once it is complete.
//
// Wakeups without endless spinning: each side has a shared event counter and a "sleeping" flag.
// After changing anything the peer can observe (a push, a pop, closing), a side bumps the peer's
// counter and writes the peer's eventfd only if the peer has said it sleeps. A side that found
// nothing to do spins briefly on its counter, then sets its flag, re-checks the counter (so a
// wakeup between the check and the sleep is never lost) and blocks in poll() on its eventfd and
// on any extra fd the caller passes (the connection's socket, which reports the peer's death).
//
// Trust: the segment comes from the peer process, which has proved it holds the listener's secret,
// but a buggy peer must still not crash us. Every index and length read from shared memory is
// validated against the ring's capacity before use, each side keeps its own copy of the index
// it owns, and the segment must be sealed against shrinking (so no access can SIGBUS). A
// violation is kRemoteError "corrupt channel".
//
// Threading: one thread per side at a time (the comm's owner).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::directconnect {

enum class Side : uint8_t { kSender = 0, kReceiver = 1 };
inline Side Other(Side s) { return s == Side::kSender ? Side::kReceiver : Side::kSender; }

// A record's fixed header. `type` is the transfer protocol's (transfer.cc); the channel only
// frames records.
struct RecordHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t payload_bytes = 0;
  uint64_t id = 0;
  uint64_t arg[4] = {0, 0, 0, 0};
};
static_assert(sizeof(RecordHeader) == 48);

struct ChannelSizes {
  uint64_t forward_bytes = 4u << 20;  // sender -> receiver: staged data, completions
  uint64_t reverse_bytes = 64u << 10;  // receiver -> sender: receive posts, acknowledgements
};

// What Wait observed.
struct WaitResult {
  bool extra_ready = false;  // the extra fd is readable (or hung up)
};

class Channel {
 public:
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // The connecting side: creates and seals the segment and both eventfds.
  static Result<std::unique_ptr<Channel>> Create(const ChannelSizes& sizes);
  // The accepting side: maps a segment received from the peer and validates its layout and seals.
  static Result<std::unique_ptr<Channel>> Attach(UniqueFd segment, UniqueFd wake_sender, UniqueFd wake_receiver);

  Side side() const { return side_; }
  // The fds to hand to the peer (the connecting side sends these in its hello).
  int segment_fd() const { return segment_fd_.get(); }
  int wake_fd(Side s) const { return wake_[static_cast<int>(s)].get(); }

  // ---- Producing on this side's outgoing ring ----

  // Bytes a record with `payload_bytes` of payload takes in the ring.
  static uint64_t RecordBytes(uint64_t payload_bytes) { return sizeof(RecordHeader) + ((payload_bytes + 7) & ~7ull); }
  // The largest payload one record may carry (a quarter of the outgoing ring, so several records
  // are in flight and the two sides copy concurrently).
  uint64_t max_payload() const { return out_capacity_ / 4; }
  // Appends a record with [payload, payload + payload_bytes) as its payload (copied straight from
  // the caller's memory: the only copy on the sending side). payload_bytes <= max_payload(). false when the ring has no
  // room (nothing written); kRemoteError when the peer corrupted the ring's indices. Notifies the peer.
  Result<bool> TryPush(const RecordHeader& header, const void* payload, size_t payload_bytes);

  // ---- Consuming this side's incoming ring ----

  // The next record's header (validated), or nullopt when the ring is empty.
  Result<std::optional<RecordHeader>> Peek();
  // Copies [offset, offset + bytes) of the peeked record's payload to dst. Precondition: Peek
  // returned a header and its payload_bytes covers the range.
  void ReadPayload(uint64_t offset, void* dst, uint64_t bytes) const;
  // Drops the peeked record and notifies the peer.
  void Pop();

  // ---- Waiting and closing ----

  // This side's event counter: take it before looking for work, pass it to Wait.
  uint64_t events() const;
  // Returns when the counter moved past `seen`, `extra_fd` (if >= 0) became readable, or the
  // deadline / `wake_at` (whichever is first) passed; after a short spin, blocks in poll().
  Result<WaitResult> Wait(uint64_t seen, Deadline deadline, int extra_fd,
                          std::optional<Deadline::Clock::time_point> wake_at);
  // Marks this side closed in the shared header and wakes the peer.
  void Close();
  bool peer_closed() const;
  // Wakes the peer (after a change it must notice that is not a push or pop).
  void NotifyPeer();

  struct Shared;  // the segment's header (channel.cc)

 private:
  Channel() = default;
  Status Corrupt(std::string_view what) const;
  void CopyIn(uint64_t position, const void* src, uint64_t bytes);
  void CopyOut(uint64_t position, void* dst, uint64_t bytes) const;

  Side side_ = Side::kSender;
  UniqueFd segment_fd_;
  UniqueFd wake_[2];
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  Shared* shared_ = nullptr;

  // Outgoing ring (this side produces).
  uint8_t* out_data_ = nullptr;
  uint64_t out_capacity_ = 0;
  uint64_t out_head_ = 0;       // our own copy of the head we publish
  uint64_t out_tail_seen_ = 0;  // the peer's tail, last validated value
  // Incoming ring (this side consumes).
  uint8_t* in_data_ = nullptr;
  uint64_t in_capacity_ = 0;
  uint64_t in_tail_ = 0;        // our own copy of the tail we publish
  uint64_t in_head_seen_ = 0;   // the peer's head, last validated value
  std::optional<RecordHeader> peeked_;
};

}  // namespace kizuna::fabric::directconnect
