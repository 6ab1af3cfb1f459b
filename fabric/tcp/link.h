// One connection's sockets and the frames they carry (README.md, "Protocol").
//
// A connection joins a SendComm and the peer's RecvComm, and over a switched network the other
// direction's pair too (transfer.h's Connection), by TCP sockets: stream 0 carries the small
// messages (kData, kTruncated), each direction's larger messages its bulk streams, cut into one
// frame per stream so that several sockets carry them at once, and the posts (kPost) come back on
// stream 0 of a one-way connection, on the sender's first bulk stream of a two-way one.
// Every socket is non-blocking with TCP_NODELAY; a Link reads and writes as far as the sockets
// take without waiting, and its connection calls Progress from its comms' posts, tests and waits.
//
// Reading takes up to 4 KiB per system call between payloads: whole frames (a batch of posts, a
// small message's header and payload) come in one call, and a read that returns less than it
// asked for ends the look at that socket without a further call. A payload's bytes that came with
// its header are copied to the place the FrameSink names (the posted receive's buffer); the rest
// of a larger payload is read straight into that place.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::tcp {

enum class FrameType : uint8_t {
  kData = 1,       // sender -> receiver: `length` payload bytes of message (tag, seq) at `offset`
  kPost = 2,       // receiver -> sender: receive (tag, seq) is posted with capacity `total`
  kTruncated = 3,  // sender -> receiver: message (tag, seq) of `total` bytes did not fit its receive
};

inline constexpr uint16_t kFrameMagic = 0x4b46;  // "KF"
// The largest message (FabricDeviceProperties::max_message_bytes): far from offset overflow.
inline constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

// Every frame starts with this, in the host's byte order (both ends are the same build, and the
// handshake refuses a peer whose byte order differs).
struct Frame {
  uint16_t magic = kFrameMagic;
  FrameType type = FrameType::kData;
  uint8_t reserved = 0;
  int32_t tag = 0;
  uint64_t seq = 0;     // the message's index among the messages of its tag on this connection
  uint64_t total = 0;   // kData, kTruncated: the message's size; kPost: the receive's capacity
  uint64_t offset = 0;  // kData: where this frame's payload goes in the message
  uint64_t length = 0;  // kData: payload bytes after the header
};
static_assert(sizeof(Frame) == 40);

// A frame's header as read: kInvalidArgument naming what is wrong (bad magic or type, a payload
// outside its message, a message above `max_message`).
Status CheckFrame(const Frame& f, uint64_t max_message);

// What a Link reports to its owner while progressing.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  // A kData header arrived on some stream: where its `length` payload bytes go, or nullptr to read
  // and drop them. An error breaks the connection (a protocol error).
  virtual Result<uint8_t*> OnData(const Frame& f) = 0;
  // The payload of that frame is in place.
  virtual Status OnDataDone(const Frame& f) = 0;
  // A frame without payload (kPost, kTruncated).
  virtual Status OnControl(const Frame& f) = 0;
  // An output item queued with `owner` has been written whole.
  virtual void OnWritten(void* owner) = 0;
};

class Link {
 public:
  // `fds`: the connected sockets, stream 0 first (made non-blocking with TCP_NODELAY by the
  // endpoint). `bulk_in`: whether the streams after the first bring this side large messages
  // (the receiving side's), or take them away (the sending side's, never read but for their end).
  Link(std::vector<UniqueFd> fds, std::string label, bool bulk_in);
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  const std::string& label() const { return label_; }
  int streams() const { return static_cast<int>(streams_.size()); }
  // More streams for the connection (the sockets of its way back: connection.h); their indices
  // follow the others'.
  void AddStreams(std::vector<UniqueFd> fds, bool bulk_in);
  // ok, or why the connection no longer works (kRemoteError when the peer closed or vanished).
  const Status& broken() const { return broken_; }
  void Break(Status why);

  // Queues a frame (and `length` bytes of payload from `payload`, which must stay valid until
  // OnWritten(owner)) on `stream`, behind what that stream already has queued. Nothing is written
  // until Flush or Progress.
  void Queue(int stream, const Frame& header, const uint8_t* payload, void* owner);
  // Writes what the streams take now.
  void Flush(FrameSink& sink);
  // Reads and writes what the sockets take now; true when anything moved. A failure breaks the
  // link (broken() says why) and stops.
  bool Progress(FrameSink& sink);
  // Whether the bulk streams coming in may bring something: they are read only while messages
  // that do not go on stream 0 are arriving (`all` true), saving a system call per stream per
  // progress.
  void set_read_all_streams(bool all) { read_all_ = all; }
  // The posts for this side's sends come back on stream i. Where that is not stream 0 (a two-way
  // connection) it is read only while some send waits for its post (`read` true): posts are sent
  // ahead, so most sends find theirs already read, and a look at an idle socket is a system call
  // (2 x 1 namespace hosts, 8-byte AllReduce: one of the three recv calls per operation that
  // found nothing).
  void PostsComeOn(int stream) { streams_[static_cast<size_t>(stream)].posts_in = true; }
  void set_read_posts(bool read) { read_posts_ = read; }

  bool output_pending() const;
  // The sockets to poll for this link: POLLIN on the streams it reads, POLLOUT where output waits.
  void AppendPollFds(std::vector<pollfd>& fds) const;
  // The payloads being read go nowhere from now on (the receives they were for are gone).
  void DropPayloads();
  // Ends the connection: what is queued is abandoned; the peer sees the sockets close.
  void Close();
  // Ends a connection that still works without losing what its sockets hold: a send is done once
  // its bytes are in the kernel's buffer, and closing a socket whose peer has sent something not
  // yet read resets the connection, which throws away what the buffer had not sent (over a slow
  // cable, the last chunks of an operation the peer still waits for). So each stream is shut for
  // writing (its bytes then a FIN go out), what arrives is read and dropped, and the sockets close
  // once the peer has every byte (nothing unacknowledged), the peer has closed its end, or
  // `within` has passed; then Close.
  void CloseGracefully(std::chrono::milliseconds within);

 private:
  struct OutItem {
    Frame header;
    const uint8_t* payload = nullptr;
    size_t written = 0;  // of sizeof(Frame) + header.length
    void* owner = nullptr;
  };
  enum class In : uint8_t { kHeader, kPayload };
  struct Stream {
    UniqueFd fd;
    std::deque<OutItem> out;
    In in = In::kHeader;
    std::vector<uint8_t> in_buf;  // bytes read and not yet taken: [in_at, in_end)
    size_t in_at = 0, in_end = 0;
    Frame frame;             // the frame being read
    uint8_t* dst = nullptr;  // where the payload goes; nullptr: dropped
    size_t payload_got = 0;
    bool eof = false;
    bool bulk_in = false;   // brings large messages (read while they arrive)
    bool posts_in = false;  // brings the posts for this side's sends
  };

  bool Read(Stream& s, FrameSink& sink);
  bool Write(Stream& s, FrameSink& sink);
  // What a recv that returned k <= 0 means (errno as it left it): try again (EINTR), nothing to
  // read now, or the link broke (Break called with the reason).
  enum class RecvEnd { kRetry, kLater, kBroken };
  RecvEnd OnRecvEnd(Stream& s, ssize_t k);
  // Whether stream i is read: stream 0, the bulk streams coming in while large messages arrive,
  // the posts' stream while a send waits for its post, and every one once stream 0 has reached
  // its end (the rest of a message may follow there); never one at its end.
  bool Reads(size_t i) const;

  std::vector<Stream> streams_;
  std::string label_;
  Status broken_;
  bool read_all_ = false;
  bool read_posts_ = false;
  std::vector<uint8_t> drop_;   // payload of frames nobody takes
};

}  // namespace kizuna::fabric::tcp
