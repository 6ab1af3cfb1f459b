// Bootstrap: the out-of-band channel ranks use to find each other before any fabric exists
// (NCCL's bootstrap, Gloo's Store + rendezvous). Small and slow on purpose: it carries host and
// device descriptions and fabric connection handles, not user data.
//
// Operations (all ranks of the job take part in the collectives, in the same order):
//   AllGather(mine)       every rank's bytes, indexed by rank (sizes may differ between ranks)
//   Barrier()             returns when every rank has entered it
//   Send(peer, tag, b)    point to point; returns when the bytes are handed to the transport
//   Recv(peer, tag)       the next message from `peer` with `tag`; messages of one (peer, tag)
//                         pair arrive in the order they were sent, different tags are independent
//                         (a Recv for tag 2 does not consume a waiting tag-1 message)
// A rank may Send to itself (the message waits for its own Recv; a Recv from itself with nothing
// waiting is kInvalidArgument at once, since nothing could ever arrive).
//
// Deadlines: every call takes one, there is no "wait forever". Errors are values:
//   kInvalidArgument  bad arguments (nothing was done), a collective mismatch between ranks
//                     (one in AllGather while another is in Barrier), a misconfigured job
//                     (rank out of range, duplicate rank, sizes that disagree)
//   kTimeout          the deadline passed; the message names the ranks that were missing
//   kRemoteError      a peer went away (its process ended or its Bootstrap was destroyed); the
//                     message names the rank
//   kAborted          the Bootstrap is unusable after an earlier collective failed (the message
//                     repeats that failure)
// A failed AllGather or Barrier leaves the Bootstrap's collectives unusable (ranks may be in
// different rounds); Send and Recv between ranks that are alive still work (survivors of a lost
// rank build a new communicator on them: Communicator::Shrink). A failed Recv can be retried (a
// Recv that timed out; a peer that went away stays gone).
// A Send that timed out may still be delivered during later calls: do not send it again.
//
// Threading: a Bootstrap serves one call at a time. A call made while another call on the same
// object is in progress (from another thread) returns kInvalidArgument at once. Different Bootstrap
// objects are independent. Destroying a Bootstrap is how a rank leaves: its peers see kRemoteError
// when they next need it.
//
// Limits: one Send, or one rank's AllGather contribution, is at most kMaxMessageBytes; an
// AllGather's total is at most kMaxAllGatherBytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {

inline constexpr size_t kMaxMessageBytes = size_t{64} << 20;
inline constexpr size_t kMaxAllGatherBytes = size_t{1} << 30;
inline constexpr int kMaxRanks = 1 << 20;

using Bytes = std::vector<uint8_t>;

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "tcp" or "in-process" (for logs).
  virtual std::string_view kind() const = 0;
  // The job's unique id where the ranks met through one (TCP, and the bootstraps made from such
  // one: a Split's); null otherwise (in-process). Its secret authenticates kizuna-status.
  virtual const UniqueId* job() const { return nullptr; }

  // Every rank's bytes, result[r] from rank r (result[rank()] is `mine`).
  Result<std::vector<Bytes>> AllGather(std::span<const uint8_t> mine, Deadline deadline);
  Status Barrier(Deadline deadline);
  Status Send(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline);
  Result<Bytes> Recv(int peer, uint32_t tag, Deadline deadline);

 protected:
  Bootstrap(int rank, int size) : rank_(rank), size_(size) {}

  // Called by the wrappers above after their checks (arguments, one call at a time, not failed).
  virtual Result<std::vector<Bytes>> DoAllGather(std::span<const uint8_t> mine, Deadline deadline) = 0;
  virtual Status DoBarrier(Deadline deadline) = 0;
  virtual Status DoSend(int peer, uint32_t tag, std::span<const uint8_t> bytes, Deadline deadline) = 0;
  virtual Result<Bytes> DoRecv(int peer, uint32_t tag, Deadline deadline) = 0;

 private:
  class CallGuard;
  Status Enter(std::string_view op, bool collective);
  void Leave();

  const int rank_;
  const int size_;
  std::atomic<bool> busy_{false};
  Status failed_;  // first collective failure; written only by the thread holding busy_
};

struct TcpBootstrapOptions {
  // How long an accepted connection may take to authenticate and introduce itself before it is
  // dropped (also capped by the call's deadline). Strangers cost a rank at most this long.
  double handshake_timeout_s = 10.0;
  // Connections still authenticating at one time (a flood of strangers cannot exhaust this
  // process's file descriptors). When all are taken, the oldest connection that has not
  // authenticated is closed to make room for a new one, so strangers that connect and stay silent
  // cannot keep the ranks out.
  int max_pending_connections = 256;
};

// Joins the job named by `id` as `rank` of `size` ranks over TCP.
//
// Rank 0 is the root: it listens at id.root (adopting the socket CreateUniqueId reserved in this
// process, if any); every other rank connects to it, retrying while the root is not yet listening.
// Every connection, to the root or between peers, first runs the mutual handshake of auth.h with
// id.secret, bound to the ranks at both ends; a connection that fails it (wrong secret, garbage,
// silence past handshake_timeout_s, a handshake meant for another rank) is closed and logged
// (KZ_WARN, BOOTSTRAP, naming its address; rate-limited, since strangers decide how often), and
// nothing it sent is used. Then each rank tells the root its rank, the size it was given and where it
// listens for peers; the root checks them (rank in range, no duplicate, same size: otherwise every
// rank gets kInvalidArgument naming the problem) and, once all ranks have joined, sends everyone the
// table of addresses. The call returns when this rank has the table (the root: when every rank has
// it), or kTimeout naming the ranks that never joined.
//
// Transport: AllGather and Barrier go through the root over these rendezvous connections (a star;
// the root sees every rank's connection, so it names a rank that went away and tells the others,
// who get the same error). Send/Recv use direct connections between the two ranks, opened on first
// use and authenticated the same way (one connection per direction and pair). All of this is driven
// from inside the calls by one poll() loop per Bootstrap; there is no background thread, so a rank
// makes progress (answers handshakes, forwards the root's work) only while it is in a call. As in
// NCCL, ranks are expected to be in bootstrap calls at about the same time.
//
// The root gives up waiting in a collective a little before the deadline (a tenth of the wait, at
// most one second) so that its verdict naming the missing ranks reaches the others before their
// own deadlines pass.
Result<std::unique_ptr<Bootstrap>> CreateTcpBootstrap(const UniqueId& id, int rank, int size, Deadline deadline,
                                                      const TcpBootstrapOptions& options = {});

}  // namespace kizuna::bootstrap
