// The tcp fabric's comms: tagged sends and receives over a connection's Link, and the hub that
// lets one thread's wait progress every connection of the fabric (README.md, "Protocol", "Both
// directions" and "Waiting").
//
// Matching: the k-th send on a tag matches the peer's k-th receive on that tag (k: the message's
// `seq` on its tag, counted at each end). A receive announces itself to the sender with a post
// frame (its seq and capacity). A send of at most kEagerBytes leaves at once, before its post —
// the receiver places it into the receive if that is posted, else keeps it until it is (counted as
// staged bytes) — as long as the eager bytes still waiting for their posts stay within
// kEagerCredit (what a receiver may have to hold). A larger send waits for its post and then goes
// straight into the receive's buffer, on the sender's bulk streams (cut into one frame per stream
// from kStripeBytes). A send is done when its bytes
// are written and its post has arrived (so that a receive too small fails both sides, naming both
// sizes); its buffer may be reused once it is done.
#pragma once

#include <poll.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/tcp/link.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::tcp {

// Sends up to this size leave before their receive is posted (README.md, measurements).
inline constexpr uint64_t kEagerBytes = 64 << 10;
// Eager bytes a sender may have in flight without their posts: what a receiver may hold unposted.
inline constexpr uint64_t kEagerCredit = 256 << 10;
// Messages from this size are cut into one frame per stream.
inline constexpr uint64_t kStripeBytes = 256 << 10;
// Requests in flight per comm.
inline constexpr int kMaxRequests = 256;
// The longest one wait blocks before it looks again (the caller's deadline may be sooner).
inline constexpr auto kMaxBlock = std::chrono::milliseconds(100);
// The longest a comm going away waits for its sockets' bytes to reach the peer (Link::CloseGracefully):
// a full socket buffer of several MB takes about a second over a 0.1 Gb/s cable.
inline constexpr auto kCloseLinger = std::chrono::seconds(2);
// A wait polls the sockets without blocking for this long before it sleeps in poll(): a message
// already on its way arrives meanwhile, where a sleep and a wake-up would cost 5-60 us on the
// build machines (README.md, measurements). Where the host's ranks outnumber its CPUs
// (HostOversubscribed) it yields the CPU between looks: a plain spin holds the CPU its peer needs
// (8 ranks of two namespace hosts on 2 CPUs, an 8-byte AllReduce: 1.0-1.2 ms spinning, 0.75-0.82
// ms sleeping at once), and sleeping at once lets the CPU halt, whose wake-up in a VM costs more
// than the message (4 namespace hosts of 1 rank on 2 CPUs: 240-320 us sleeping at once, 370-440
// spinning, 130-180 yielding; 4 x 2: 0.6 ms sleeping, 0.17-0.37 ms yielding).
inline constexpr auto kSpinWait = std::chrono::microseconds(50);

// A connection as the hub sees it.
class HubMember {
 public:
  virtual ~HubMember() = default;
  // Guards the connection and its comms' state: their owners' calls and other threads' waits
  // that progress it.
  std::mutex mu;
  // mu held: reads and writes what the sockets take now; true when anything moved.
  virtual bool ProgressLocked() = 0;
  // mu held: the sockets to wait on.
  virtual void AppendPollFds(std::vector<pollfd>& fds) const = 0;
};

class Connection;

// Every connection of one fabric instance. A wait on one comm progresses its connection and every
// other connection whose lock is free (what this wait needs may depend on a comm its owner is not
// driving now, e.g. a large send waiting for its post while its thread waits on a receive, or a
// post not yet flushed), for up to kSpinWait, then blocks on all of their sockets at once, so that
// activity on any of them wakes it. It also knows the connections this end made that may carry
// the other direction too, by nonce, for the peer's way back (README.md, "Both directions").
class Hub {
 public:
  void Add(HubMember* m);
  void Remove(HubMember* m);
  // Returns as soon as `self` progressed, else after poll() says a socket is ready, or at the
  // deadline (at most kSpinWait + kMaxBlock).
  Status Wait(HubMember& self, Deadline deadline);

  void AddTwoWay(uint64_t nonce, const std::shared_ptr<Connection>& c);
  // The live connection this end made with `nonce`, or null.
  std::shared_ptr<Connection> FindTwoWay(uint64_t nonce);

 private:
  std::mutex mu_;  // taken before any member's mu
  std::vector<HubMember*> members_;
  std::mutex two_way_mu_;
  std::map<uint64_t, std::weak_ptr<Connection>> two_way_;
};

class TcpRequest : public Request {
 public:
  enum class State : uint8_t { kActive, kDone, kFailed };
  TcpRequest(RequestKind kind, int tag, size_t size) : Request(kind, tag, size) {}

  State state = State::kActive;
  Status failure;
  uint8_t* local = nullptr;  // the buffer, in this process
  uint64_t seq = 0;
  // Sends.
  bool eager = false;        // left before its post
  bool transmitted = false;  // its frames are queued (or written)
  bool post_seen = false;    // its receive's post arrived and the message fits
  int unwritten = 0;         // frames queued and not yet written whole
  // Receives.
  uint64_t total = UINT64_MAX;  // the message's size, once its first frame arrived
  uint64_t received = 0;
  // Its comm's list of requests not yet reported (LiveRequests).
  TcpRequest* live_prev = nullptr;
  TcpRequest* live_next = nullptr;
  bool live = false;
};

// A comm's requests not yet reported done or failed (a break fails them all), linked through the
// requests themselves: a std::set of them allocated and freed a node per message.
class LiveRequests {
 public:
  void Add(TcpRequest* r) {
    r->live_prev = nullptr;
    r->live_next = head_;
    if (head_ != nullptr) head_->live_prev = r;
    head_ = r;
    r->live = true;
  }
  // No effect on a request not in the list.
  void Remove(TcpRequest* r) {
    if (!r->live) return;
    (r->live_prev != nullptr ? r->live_prev->live_next : head_) = r->live_next;
    if (r->live_next != nullptr) r->live_next->live_prev = r->live_prev;
    r->live_prev = r->live_next = nullptr;
    r->live = false;
  }
  template <typename F>
  void ForEach(F f) const {
    for (TcpRequest* r = head_; r != nullptr; r = r->live_next) f(*r);
  }

 private:
  TcpRequest* head_ = nullptr;
};

using MessageKey = std::pair<int, uint64_t>;  // (tag, seq)

class TcpSendComm;
class TcpRecvComm;

// One connection's sockets and the comms on them: the one this end made (Connect's SendComm,
// Accept's RecvComm) and, where the connection goes both ways, the other (README.md, "Both
// directions"). Stream 0 carries the small messages and the posts; large messages go on the
// sending side's bulk streams. The Link reports frames here, and each goes to the comm it is for:
// data and truncation notices to the RecvComm, posts to the SendComm. Shared by its comms (and by
// the hub's list of two-way connections, weakly); the last comm to go closes it.
class Connection : public HubMember, public FrameSink {
 public:
  // `fds`: stream 0, then the bulk streams of the side that made it (sending: this end's own;
  // accepted: the peer's). `two_way`: the other direction may join it (README.md, "Both
  // directions").
  Connection(std::vector<UniqueFd> fds, std::string label, bool sending, Hub& hub, uint64_t nonce, bool two_way);
  ~Connection() override;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  uint64_t nonce() const { return nonce_; }
  bool two_way() const { return two_way_; }
  Link& link() { return link_; }
  Hub& hub() { return hub_; }

  // mu held: a comm joins or leaves. A SendComm that leaves with frames still queued closes the
  // connection (they point into its requests' buffers); a RecvComm that leaves drops whatever
  // its receives were being read into.
  void Attach(TcpSendComm* c);
  void Attach(TcpRecvComm* c);
  void Detach(TcpSendComm* c);
  void Detach(TcpRecvComm* c);

  bool ProgressLocked() override;
  // mu held: a comm's Test of a request that is not done progresses the connection, unless the
  // look just before (by either comm, or a wait) moved something and so left every socket it
  // reads empty: the caller that found one message done and tests the next then does not pay
  // another system call to learn it has not come (2 x 1 namespace hosts, 8-byte AllReduce: one of
  // the three recv calls per operation that found nothing). Only the one Test right after such a
  // look is answered without a look; a caller that keeps testing still reads the sockets.
  void ProgressForTest() {
    if (!std::exchange(just_moved_, false)) ProgressLocked();
  }
  void AppendPollFds(std::vector<pollfd>& fds) const override { link_.AppendPollFds(fds); }
  // mu held: after the link broke, the link is closed and every request of both comms fails with
  // its reason.
  void AfterBreak();

 private:
  Result<uint8_t*> OnData(const Frame& f) override;
  Status OnDataDone(const Frame& f) override;
  Status OnControl(const Frame& f) override;
  void OnWritten(void* owner) override;

  Hub& hub_;
  Link link_;
  const uint64_t nonce_;
  const bool two_way_;
  TcpSendComm* send_ = nullptr;
  TcpRecvComm* recv_ = nullptr;
  std::vector<Frame> early_posts_;  // posts that came before this end's SendComm joined
  bool data_after_recv_ = false;    // a RecvComm left: data for it is dropped, not a protocol error
  bool just_moved_ = false;         // the last look moved something (ProgressForTest)
};

class TcpSendComm : public SendComm, public FrameSink {
 public:
  // `bulk`: the streams of `connection` its large messages go on; the posts for its sends come
  // back on the first.
  TcpSendComm(std::string label, FabricDeviceProperties properties, std::shared_ptr<Connection> connection,
              std::vector<int> bulk);
  ~TcpSendComm() override;

  const std::shared_ptr<Connection>& connection() const { return connection_; }
  // Connection::mu held.
  bool has_queued_frames() const { return unwritten_frames_ > 0; }
  void AfterBreak();  // every request fails with the link's reason

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration& registration) override;
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;
  Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag, Registration* registration) override;

 private:
  Result<uint8_t*> OnData(const Frame& f) override;
  Status OnDataDone(const Frame& f) override;
  Status OnControl(const Frame& f) override;
  void OnWritten(void* owner) override;

  // Queues the message's frames: an eager one on stream 0, a larger one on the bulk streams (one
  // frame per stream from kStripeBytes).
  void Transmit(TcpRequest& r);
  void Fail(TcpRequest& r, Status why);
  void MaybeDone(TcpRequest& r);
  // After waiting_ changed: the posts' stream is read while it holds a send (Link::PostsComeOn).
  void ReadPostsWhileWaiting() { link_.set_read_posts(!waiting_.empty()); }

  std::shared_ptr<Connection> connection_;
  Link& link_;
  const std::vector<int> bulk_;
  int unwritten_frames_ = 0;                    // of this comm's requests, queued on the link
  std::map<int, uint64_t> next_seq_;            // per tag
  std::map<MessageKey, uint64_t> early_posts_;  // posts that arrived before their send: capacity
  std::map<MessageKey, TcpRequest*> waiting_;   // sends whose post has not arrived
  LiveRequests live_;
  uint64_t eager_in_flight_ = 0;  // eager bytes sent whose posts have not arrived
};

class TcpRecvComm : public RecvComm, public FrameSink {
 public:
  // `post_stream`: where its posts go (README.md, "Both directions": never behind this side's own
  // messages, which the peer's send may wait for otherwise).
  TcpRecvComm(std::string label, FabricDeviceProperties properties, std::shared_ptr<Connection> connection,
              int post_stream);
  ~TcpRecvComm() override;

  const std::shared_ptr<Connection>& connection() const { return connection_; }
  void AfterBreak();  // Connection::mu held: every request fails with the link's reason

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override;
  Status DoDeregister(Registration& registration) override;
  Result<Completion> DoTest(Request& request) override;
  Status DoWaitForProgress(Deadline deadline) override;
  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration* registration) override;
  void DoBeginPosts() override;
  void DoEndPosts() override;

 private:
  // An eager message that arrived before its receive was posted.
  struct Unexpected {
    std::vector<uint8_t> bytes;
    bool complete = false;
  };

  Result<uint8_t*> OnData(const Frame& f) override;
  Status OnDataDone(const Frame& f) override;
  Status OnControl(const Frame& f) override;
  void OnWritten(void*) override {}

  // Copies a complete unexpected message into `r` (or fails it when it does not fit).
  void Deliver(TcpRequest& r, Unexpected& u);
  void Complete(TcpRequest& r);
  void Fail(TcpRequest& r, Status why);
  void Forget(const MessageKey& key);  // no longer posted (done, failed)

  std::shared_ptr<Connection> connection_;
  Link& link_;
  const int post_stream_;
  std::map<int, uint64_t> next_seq_;                       // per tag
  std::map<MessageKey, TcpRequest*> posted_;               // receives waiting for their message
  std::map<MessageKey, Unexpected> unexpected_;            // eager messages without a receive yet
  std::map<MessageKey, TcpRequest*> awaiting_unexpected_;  // posted while their message was being read
  LiveRequests live_;
  int large_posted_ = 0;   // posted receives above kEagerBytes (their messages come on the bulk streams)
  bool batching_ = false;  // between BeginPosts and EndPosts: posts wait for EndPosts' flush
};

}  // namespace kizuna::fabric::tcp
