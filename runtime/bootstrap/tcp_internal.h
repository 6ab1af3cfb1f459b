// The TCP Bootstrap's private pieces, shared by its implementation files (internal to
// runtime/bootstrap; nothing outside this folder includes it):
//
//   tcp_wire.cc        the frames on authenticated connections (bytes encoded with runtime/core/wire.h)
//   tcp_connection.cc  one connection's socket: accepting, connecting (with retries), sending, reading
//   tcp_progress.cc    the poll loop, the handshake state machine and the dispatch of frames
//   tcp_root.cc        rank 0's side: the rendezvous, the star collectives, the job's verdicts
//   tcp_rank.cc        every other rank's side: joining the root, collectives through it
//   tcp_peer.cc        the direct connections between two ranks for Send/Recv
//   bootstrap.cc       the public wrappers, CreateTcpBootstrap and Start
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/bootstrap/auth.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/bootstrap/socket.h"
#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"
#include "runtime/core/wire.h"

namespace kizuna::bootstrap::tcp {

using Clock = Deadline::Clock;

double SecondsSince(Clock::time_point t);

// ---- frames (tcp_wire.cc) ---------------------------------------------------------------------

// Payloads are encoded with kizuna::wire (little-endian, strings behind a u32 length), so ranks on
// hosts of different byte order agree.
//
// Frames on authenticated connections: a fixed header, then `length` payload bytes.
enum class FrameType : uint32_t {
  kJoin = 1,          // rank -> root: rank, size, where it listens for peers
  kWelcome = 2,       // root -> rank: every rank's listening address
  kAbort = 3,         // root -> rank: the job failed (status code and message)
  kGather = 4,        // rank -> root: a collective contribution (tag: kind)
  kGatherResult = 5,  // root -> rank: every rank's contribution (tag: kind)
  kPeerHello = 6,     // first frame on a peer-to-peer connection: sender and intended receiver
  kData = 7,          // peer-to-peer message (tag: the caller's tag)
};
constexpr uint32_t kFrameMagic = 0x46425a4b;  // "KZBF"
constexpr size_t kFrameHeaderBytes = 24;
constexpr size_t kMaxIntroBytes = 4096;
constexpr size_t kMaxAbortBytes = 64 * 1024;
constexpr size_t kMaxHostBytes = 255;
// Warnings about rejected connections: this many at once, then this many a second.
constexpr int kRejectWarningBurst = 32;
constexpr double kRejectWarningsPerSecond = 1;
constexpr uint32_t kKindAllGather = 0;
constexpr uint32_t kKindBarrier = 1;

std::string_view KindName(uint32_t kind);
// The largest payload a frame of `type` may carry in a job of `size` ranks.
size_t MaxPayload(FrameType type, int size);
Bytes FrameHeader(FrameType type, uint32_t tag, uint64_t length);
// "1, 2, 3" (the first 16, then "and N more"); "rank 1" / "ranks 1, 2".
std::string RankList(const std::vector<int>& ranks);
std::string PluralRanks(const std::vector<int>& ranks);

// ---- connections and the Bootstrap ----------------------------------------------------------

struct OutChunk {
  std::shared_ptr<const Bytes> data;
  size_t offset = 0;
};

struct Conn {
  enum class Phase {
    kConnecting,         // client: connect() in progress, or waiting to retry (fd invalid)
    kAwaitServerHello,   // client: hello sent, reading the server's reply
    kAwaitClientHello,   // server: reading the client's hello
    kAwaitClientProof,   // server: reading the client's proof
    kAwaitIntro,         // server: authenticated, reading the Join or PeerHello frame
    kEstablished,        // frames
    kClosed,
  };
  enum class Role {
    kPending,   // accepted, not identified yet
    kToRoot,    // non-root: the rendezvous connection
    kFromRank,  // root: the rendezvous connection of rank `peer`
    kPeerOut,   // this rank sends to `peer`
    kPeerIn,    // `peer` sends to this rank
  };

  UniqueFd fd;
  Phase phase = Phase::kConnecting;
  Role role = Role::kPending;
  int peer = -1;
  std::string address;  // the remote end, for messages
  Clock::time_point handshake_deadline{};
  std::optional<ClientHandshake> client;
  std::optional<ServerHandshake> server;

  // Input: the unit being read (a handshake message, a frame header or a frame payload).
  Bytes in;
  size_t in_have = 0;
  bool in_payload = false;
  FrameType frame_type{};
  uint32_t frame_tag = 0;

  std::deque<OutChunk> out;
  std::deque<OutChunk> later;  // client: frames queued before authentication finished
  std::string closed_reason;  // why it closed (kClosed)
  bool dead = false;          // pending connection to be removed

  // Client connections: where to connect and when to try again.
  std::vector<net::Address> targets;
  size_t next_target = 0;
  Clock::time_point retry_at{};
  std::chrono::milliseconds backoff{20};
  std::string last_error;

  bool open() const { return phase != Phase::kClosed; }
  void Expect(size_t n) {
    in.assign(n, 0);
    in_have = 0;
  }
};

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(const UniqueId& id, int rank, int size, const TcpBootstrapOptions& options)
      : Bootstrap(rank, size),
        id_(id),
        options_(options),
        rank_conn_(size, nullptr),
        in_conn_(size, nullptr),
        out_conn_(size, nullptr),
        peers_(size),
        gather_in_(size) {}

  std::string_view kind() const override { return "tcp"; }
  const UniqueId* job() const override { return &id_; }

  Status Start(Deadline deadline);

 protected:
  Result<std::vector<Bytes>> DoAllGather(std::span<const uint8_t> mine, Deadline deadline) override {
    return Collective(kKindAllGather, mine, deadline);
  }
  Status DoBarrier(Deadline deadline) override { return Collective(kKindBarrier, {}, deadline).status(); }
  Status DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) override;
  Result<Bytes> DoRecv(int peer, uint32_t tag, Deadline deadline) override;

 private:
  bool is_root() const { return rank() == 0; }
  std::string Me() const { return fmt::format("bootstrap rank {}/{}", rank(), size()); }

  // Root: the deadline it waits for others, a little before the caller's, so that its verdict
  // reaches the other ranks before their own deadlines.
  static Deadline RootWaitDeadline(Deadline deadline) {
    auto margin = std::min<std::chrono::nanoseconds>(std::chrono::seconds(1), deadline.Remaining() / 10);
    return Deadline::At(deadline.when() - margin);
  }

  // tcp_connection.cc: one connection's socket.
  Conn* NewConn(Conn::Role role);
  void RemoveDead();
  void Close(Conn& c, std::string reason);
  // Closes a connection that has not identified itself as a rank, logging why (KZ_WARN).
  void Reject(Conn& c, std::string_view reason);
  void WarnRejected(std::string_view address, std::string_view reason);
  void QueueFrame(Conn& c, FrameType type, uint32_t tag, std::span<const uint8_t> payload);
  void QueueShared(Conn& c, FrameType type, uint32_t tag, std::shared_ptr<const Bytes> payload);
  void Accept();
  void StartConnect(Conn& c);
  void FinishConnect(Conn& c);
  void ClientConnectFailed(Conn& c, const std::string& why, bool retryable);
  void Flush(Conn& c);
  void ReadAvailable(Conn& c);

  // tcp_progress.cc: the poll loop runs until done() (ok), a fatal error (that error), or the
  // deadline (on_timeout()); what arrives goes through OnUnit.
  Status Progress(Deadline deadline, const std::function<bool()>& done,
                  const std::function<Status()>& on_timeout);
  void OnUnit(Conn& c);
  void OnServerHello(Conn& c);  // OnUnit's cases: the client's handshake step, and frames
  void OnFrameUnit(Conn& c);
  void OnClientAuthenticated(Conn& c);
  void OnIntro(Conn& c, Bytes payload);
  void OnFrame(Conn& c, Bytes payload);

  // tcp_root.cc: rank 0.
  Status StartRoot(Deadline deadline);
  void OnJoin(Conn& c, Bytes payload);
  Result<std::vector<Bytes>> RootCollective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline);
  // Root: tells every rank (and `also`, a connection not identified yet) that the job failed,
  // waits up to a second for the messages to leave, and makes the failure sticky.
  Status FailJob(Status status, Conn* also = nullptr);

  // tcp_rank.cc: every other rank.
  Status StartNonRoot(Deadline deadline);
  void SendJoin(Conn& c);
  void OnWelcome(Conn& c, Bytes payload);
  void OnAbort(Bytes payload);
  Result<std::vector<Bytes>> Collective(uint32_t kind, std::span<const uint8_t> mine, Deadline deadline);

  // tcp_peer.cc: direct connections for Send/Recv.
  void SendPeerHello(Conn& c);
  void OnPeerHello(Conn& c, Bytes payload);

  const UniqueId id_;
  const TcpBootstrapOptions options_;
  UniqueFd listener_;
  std::vector<net::Address> root_addresses_;
  std::vector<std::unique_ptr<Conn>> conns_;  // every connection; Conn objects never move
  Conn* root_conn_ = nullptr;                 // non-root
  std::vector<Conn*> rank_conn_;              // root: rendezvous connection of each rank
  std::vector<Conn*> in_conn_;                // peer-to-peer, from each rank
  std::vector<Conn*> out_conn_;               // peer-to-peer, to each rank
  std::vector<HostPort> peers_;               // where each rank listens (after the rendezvous)
  std::map<std::pair<int, uint32_t>, std::deque<Bytes>> mailbox_;
  std::vector<std::deque<std::pair<uint32_t, Bytes>>> gather_in_;  // root: contributions by rank
  std::deque<std::pair<uint32_t, Bytes>> results_;                  // non-root: root's answers
  int joined_ = 0;               // root: ranks whose Join was accepted
  bool rendezvous_done_ = false;
  bool welcomed_ = false;        // non-root
  Status fatal_;                 // the rendezvous failed (the root said so, or a protocol violation)
  // A collective failed after the rendezvous (the root said so, or this rank saw it): collectives
  // only; Send and Recv between ranks that are alive go on (Bootstrap's contract).
  Status collective_failed_;
  Status job_error_;             // root: a misconfigured job found inside the poll loop
  Conn* job_error_conn_ = nullptr;  // ... and the connection that revealed it
  Clock::time_point listener_paused_until_{};  // out of file descriptors: accept later
  std::string accept_error_;                   // root: why accept last failed (no descriptors), for timeouts
  std::string listen_text_;      // where this rank listens, for logs
  struct {
    double tokens = kRejectWarningBurst;
    Clock::time_point last{};
    uint64_t hidden = 0;  // rejections since the last warning shown
  } reject_log_;          // rate limit of the warnings about rejected connections
};

}  // namespace kizuna::bootstrap::tcp
