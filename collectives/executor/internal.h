// The executor's private parts, shared by executor.cc (the executor's life: queue, thread,
// failures), run.cc (running one operation: steps, waits), straight.cc (an operation whose every
// transfer rides in a header), control.cc (headers, connections, probes, notices) and serve.cc (an
// aggregation device's loop). Not a public header: only the executor's files include it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/executor/containers.h"
#include "collectives/executor/executor.h"

namespace kizuna::collectives {
namespace executor_internal {

using Clock = std::chrono::steady_clock;

// Control messages travel on their own tag, beside the data tags (member * kMaxChannels + channel).
constexpr int kControlTag = 1 << 30;
constexpr int kMaxChannels = 64;
// Point-to-point transfers take tags from here up, one per channel (see Run::Setup).
constexpr int kP2pTagBase = 1 << 29;
// Started steps per point-to-point channel: enough to overlap a chunk's copy with the previous
// chunk's transfer. Every point-to-point channel of an operation gets this many slots.
constexpr int kP2pWindow = 2;
// Point-to-point chunks are never smaller than this (P2pStagingBytes grows with the ranks instead).
constexpr size_t kMinP2pChunkBytes = 16 << 10;
constexpr uint32_t kControlMagic = 0x6b7a4354;  // "kzCT"
constexpr size_t kControlSlotBytes = 512;       // one control message; control_bytes holds several
// A slot is at least this big: smaller chunks would be all overhead (and the staging split below
// rounds to it).
constexpr size_t kMinSlotBytes = 64;
// The largest chunk when KIZUNA_CHUNK_BYTES does not say: large enough that per-step overhead
// (a stream round trip and a fabric post, tens of microseconds) is small against the copy of the chunk
// at memory speed, small enough that a 2-channel window of 4 fits the default 8 MiB staging.
constexpr size_t kDefaultChunkBytes = 512 << 10;
// The same where some peer is reached over a network (Transport::network()): a message there
// pays a fixed cost that 512 KiB does not amortize; over tcp;ofi_rxm 2 MiB chunks were faster
// than 512 KiB and 4 or 8 MiB no better (docs/RACE.md, "Where the gaps are, and why": TCP).
constexpr size_t kNetworkChunkBytes = 2 << 20;
// Steps up to this size on host-accessible memory run on the thread that runs the operation
// (Run::OnCpu), larger ones on the device's streams, beside the thread's work on the wire.
constexpr size_t kCpuStepBytes = 64 << 10;
// Collectives up to this size where some peer is reached over a network (Transport::network())
// run whole on the calling thread where they may (Executor::TryOnCaller), every step of theirs on
// the CPU: a step there waits for the wire far longer than the CPU takes to copy or reduce it, and
// a hand-off to a stream's thread and back costs more than either below a few MiB (2 x 1
// namespace hosts, 1 MiB AllReduce: 1.06 GB/s through the streams, 1.90 on the CPU;
// docs/PERFORMANCE.md). Larger ones keep the wire busy while the streams copy (64 MiB: 1.0-1.2
// GB/s with 2 MiB steps on the executor's thread, 1.26 on the streams).
constexpr size_t kNetworkCpuStepBytes = 4 << 20;
// A first transfer to a peer up to this size travels inside the operation header (one message
// where there were two): what a control message has room for beside the header's fields.
constexpr size_t kHeaderPayloadBytes = kControlSlotBytes - 64;
// Transfers from this size up move the caller's bytes without a staging slot where the fabric
// registers memory cheaply (Run::Direct); smaller ones are copied, which costs less than the
// registration.
constexpr size_t kDirectMinBytes = 16 << 10;
// Control receives kept posted per peer (at most the control buffer's slots). Reposted half at a
// time: over tcp each batch of posts is one packet, so 32 cost 1/16 of a packet per message where
// 8 cost 1/4 (2 x 1 namespace hosts, 8-byte AllReduce: 1.75 packets per call and host before, 1.56
// after; 1.6-5 us faster in four paired runs).
constexpr size_t kControlDepth = 32;
// How long the executor blocks on one thing before looking at everything again: short, so a
// completion elsewhere is not left waiting, long enough not to burn a core.
constexpr auto kWaitSlice = std::chrono::microseconds(200);

// The CPU reaches the device's memory, and its streams model no speed or launch latency that
// running a step on the CPU would skip (an emulated device with KIZUNA_EMU_* throttles keeps them).
inline bool CpuSteps(const device::DeviceProperties& p) {
  return p.host_accessible && p.copy_gbps == 0 && p.reduce_gbps == 0 && p.launch_latency_us == 0;
}

inline size_t CallerOpBytes(const Transport& t) { return t.network() ? kNetworkCpuStepBytes : kCpuStepBytes; }

// kProbe asks a peer where it is; it answers kState (members 0: idle, seq its last operation;
// else the operation it is running, described as a header, and in `reason` what it waits on).
// Both are consumed as they arrive (Executor::ReceiveControl), never queued with the headers.
enum class ControlKind : uint32_t { kHeader = 1, kAbort = 2, kProbe = 3, kState = 4 };

// An operation that has made no progress for this long asks its peers where they are: a peer at
// the same operation with another signature is a mismatch, reported then; the answers (or their
// absence) name the culprit when the deadline comes. At most a quarter of the deadline.
constexpr std::chrono::milliseconds kProbeAfter{1000};
// How long past its deadline an operation that stopped moving still listens for its peers'
// failure notices before it reports its own timeout: in a chain of waits (a hierarchical
// operation's host level waiting on a stopped rank, the network level on that host's leader),
// every rank's deadline falls within about a round of the others, and the notice of the rank next
// to the stopped one names it, where the others could only name the peer they wait on.
constexpr std::chrono::milliseconds kBlameGrace{1000};
// How long an operation of the executor's plan waits before it looks whether a peer of its host
// runs the same operation on the fused path (a mismatch that no header or probe would show).
constexpr std::chrono::milliseconds kFusedPeerCheckAfter{1};
// How often an idle executor looks for probes (an answer takes at most this long) and takes the
// connections peers made to it.
constexpr std::chrono::milliseconds kIdlePoll{20};
// While an operation runs with the connections it needs, the listen comms are looked at this
// often at most, as while idle (what arrives then is for later: a peer's next operation, a probe);
// while it waits for a connection, every round.
constexpr std::chrono::milliseconds kAcceptEvery{20};

// What a rank says about the operation it is at; compared field by field with the receiver's own.
struct ControlMessage {
  uint32_t magic = kControlMagic;
  ControlKind kind = ControlKind::kHeader;
  uint64_t seq = 0;
  uint64_t signature = 0;  // hash over every member's signature
  uint32_t members = 0;
  uint8_t collective = 0, dtype = 0, op = 0, algorithm = 0;
  int32_t root = 0;
  int32_t nranks = 0;
  uint64_t count = 0;
  uint64_t chunk_count = 0;
  uint32_t channels = 0;
  // kHeader: the bytes of the operation's first transfer to the receiver, carried in `reason`
  // (Run::Setup says which transfer); 0: none, the header goes alone.
  uint32_t inline_bytes = 0;
  char reason[kControlSlotBytes - 64] = {};  // kAbort: why, NUL-terminated; kHeader: inline bytes
};
static_assert(sizeof(ControlMessage) == kControlSlotBytes);
static_assert(offsetof(ControlMessage, reason) + kHeaderPayloadBytes == kControlSlotBytes);
// What of a message goes on the wire: an operation header only its fields and the inline bytes it
// carries (an 8-byte AllReduce's header is 72 bytes, not 512: smaller packets through every
// interface and bridge on the way), every other kind whole.
constexpr size_t kControlFieldBytes = offsetof(ControlMessage, reason);
inline size_t WireBytes(const ControlMessage& m) {
  return m.kind == ControlKind::kHeader && m.inline_bytes <= kHeaderPayloadBytes ? kControlFieldBytes + m.inline_bytes
                                                                                 : sizeof m;
}

inline uint64_t Mix(uint64_t h, uint64_t v) {
  // A whole word per step (multiply by the golden-ratio constant, fold the high bits down): stable
  // across processes and builds of one version, and a few cycles, where FNV-1a's byte at a time
  // was 8 dependent multiplies per value on every call's path.
  h = (h ^ v) * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

// What must agree between ranks for one member. in_place may differ between ranks (as in NCCL),
// so plans never let it change a rank's transfers, and it is not part of the signature.
inline uint64_t MemberSignature(const Plan& plan) {
  const CollectiveRequest& r = plan.request;
  uint64_t h = 0xcbf29ce484222325ull;
  h = Mix(h, static_cast<uint64_t>(r.collective));
  h = Mix(h, r.count);
  h = Mix(h, static_cast<uint64_t>(r.dtype));
  h = Mix(h, IsReduction(r.collective) ? static_cast<uint64_t>(r.op) : 0);
  h = Mix(h, static_cast<uint64_t>(r.root));
  h = Mix(h, static_cast<uint64_t>(r.nranks));
  h = Mix(h, static_cast<uint64_t>(plan.algorithm));
  h = Mix(h, plan.chunk_count);
  h = Mix(h, static_cast<uint64_t>(plan.channels));
  // fused and hier:fused parts sized by speed: the same on every rank, or some rank's part overlaps
  // another's.
  if (!plan.ranks.empty())
    for (const std::vector<uint64_t>* v : {&plan.ranks[0].fused_bounds, &plan.ranks[0].host_part_weights})
      for (uint64_t b : *v) h = Mix(h, b);
  return h;
}

// A peer's abort notice as this rank's error: kRemoteError naming the rank that failed first.
Status AbortNotice(int peer, const ControlMessage& m);
// The header of an operation made of `members` (Executor::FillHeader).
Status FillHeader(const std::vector<OperationMember>& members, ControlMessage* header, int* total_channels);
// Its signature alone (what the calling thread's path needs), checking that every member has this
// rank's plan.
Result<uint64_t> OperationSignature(const std::vector<OperationMember>& members);

inline std::string DescribeHeader(const ControlMessage& m) {
  CollectiveRequest r;
  r.collective = static_cast<Collective>(m.collective);
  r.nranks = m.nranks;
  r.count = m.count;
  r.dtype = static_cast<DataType>(m.dtype);
  r.op = static_cast<ReduceOp>(m.op);
  r.root = m.root;
  std::string s = fmt::format("operation {}: {} ({}, chunk {}, {} channels)", m.seq, r.ToString(),
                              AlgorithmName(static_cast<Algorithm>(m.algorithm)), m.chunk_count, m.channels);
  if (m.members > 1) s += fmt::format(" and {} more in a group", m.members - 1);
  return s;
}


}  // namespace executor_internal

using executor_internal::ControlMessage;
using executor_internal::PeerSet;

// ---------------------------------------------------------------------------------------------
// Operations

// A peer's control messages not yet consumed, oldest first.
using ControlQueue = executor_internal::FifoQueue<ControlMessage>;

// Per peer where a peer has a connection (maps: a rank talks to few of the communicator's ranks).
struct Executor::ControlState {
  // The control receives posted per peer, oldest first, each into its slot of the peer's
  // control_in (slot = posted count so far mod the slots); a message completes the oldest.
  struct Posted {
    std::deque<fabric::Request*> requests;
    uint64_t next = 0;  // receives posted so far
    // The oldest receive, which WaitControl saw complete (the request is released):
    // ReceiveControl takes it from here instead of testing the request.
    std::optional<Result<fabric::Completion>> waited;
  };
  std::vector<Posted> recv;
  std::map<int, ControlQueue> inbox;                    // received, not yet consumed, per peer
  std::map<int, std::deque<fabric::Request*>> pending;  // header sends in flight, per peer
  std::map<int, uint64_t> next;                       // the next control slot to use, per peer
  std::vector<Status> gone;                           // per peer: why its control connection ended
  // Probes: each peer's last answer and when it came (absent: never).
  struct Answer {
    ControlMessage state;
    executor_internal::Clock::time_point at{};
  };
  std::map<int, Answer> state;
  std::set<int> owed;  // peers that asked where this rank is, not answered yet (no connection yet)
  executor_internal::Clock::time_point accepted_at{};  // the transport's last Poll
};

struct Executor::Operation {
  uint64_t seq = 0;  // 0: point-to-point only (collectives are numbered, transfers are not)
  size_t slot_bytes = 0;
  int slots = 0;  // the collectives' slots
  std::vector<OperationMember> members;
  ControlMessage header;

  std::mutex mu;
  std::condition_variable cv;
  bool inputs_ready = false;  // guarded by mu
  Status stream_status;       // guarded by mu: the user stream's state when it reached the call
  bool done = false;          // guarded by mu
  std::unique_ptr<device::StreamHold> hold;  // guarded by mu: the caller's stream, held until done
  // The caller's stream: valid while the hold is (a stream waits for its held work before it goes
  // away); told of a failure before the hold is released (Stream::ReportFailure).
  device::Stream* stream = nullptr;
  // Counted in the host group while the caller's stream is held (SameHostGroup::BeginHold); set
  // by Submit before the operation is shared.
  bool group_hold = false;
  // Steps up to this size run on the CPU (Run::OnCpu): kCpuStepBytes, or a small operation's
  // whole size where it runs on the calling thread (TryOnCaller).
  size_t cpu_step_bytes = executor_internal::kCpuStepBytes;
};

// ---------------------------------------------------------------------------------------------
// Running one operation

class Executor::Run {
 public:
  Run(Executor& ex, Operation& op, size_t slot_bytes, int slots)
      : ex_(ex),
        op_(op),
        tr_(*ex.transport_),
        slot_bytes_(slot_bytes),
        slots_(slots),
        cpu_steps_(executor_internal::CpuSteps(ex.device_->properties())),
        cpu_step_bytes_(op.cpu_step_bytes) {}

  Status Execute(Deadline deadline);
  // The straight path (straight.cc), for an operation whose every transfer travels inside an
  // operation header: whether this one may take it (a single collective on one channel, each peer
  // sent to and received from at most once, every transfer within kHeaderPayloadBytes between
  // ranks whose CPUs reach their memory, every other step small enough for this thread, its
  // connections made, no trace), and running it. The same messages as Execute's, without its
  // slots, phases and device streams: a rank on either path meets a peer on the other.
  bool Straight();
  Status ExecuteStraight(Deadline deadline);

 private:
  enum class Phase : uint8_t { kWaiting, kCopyIn, kReadyToPost, kPosted, kReceived, kConsume, kDone };

  struct StepState {
    Phase phase = Phase::kWaiting;
    int slot = -1;
    fabric::Request* request = nullptr;
    device::Event* event = nullptr;
    // What WaitBriefly found for the posted request: its completion, or its failure (the request
    // is then already released).
    std::optional<Result<fabric::Completion>> waited;
    // The peer's first transfer of this operation, small enough to travel inside the operation
    // header (kHeaderPayloadBytes): a send goes with this rank's header, a receive takes its bytes
    // from the peer's. No fabric request of its own.
    bool in_header = false;
    // The transfer sends from its source or receives into its destination, registered on the
    // peer's comm for this step alone, or within a registered region (Run::Direct): no slot, no
    // copy.
    bool direct = false;
    fabric::Registration* registration = nullptr;
    // `registration` is a registered region's (Executor::Register), kept after the step.
    bool region = false;
    // With a trace (KIZUNA_TRACE_FILE): when the step became active, was posted, and its data
    // arrived (Tracer::NowUs); 0 before.
    uint64_t traced_active = 0, traced_posted = 0, traced_arrived = 0;
  };

  struct ChannelRun {
    int member = 0;
    int channel = 0;
    const std::vector<Step>* steps = nullptr;
    std::vector<StepState> states;
    size_t next = 0;              // the next step to start
    std::vector<size_t> active;   // started, not done, in order
    device::Stream* stream = nullptr;
    int tag = 0;
    bool epilogue = false;
    // A Send or Recv: its slots are point-to-point's, its peer sends no operation header, and it
    // starts once the transfers before it to or from the same peer (in `after`, indices into
    // channels_) are done: a pair's transfers go in call order on the same tags.
    bool p2p = false;
    std::vector<size_t> after;
    size_t window = 0;  // started steps at most
    bool done() const { return next == steps->size() && active.empty(); }
  };

  Status Setup();
  // The trace's events for a step that is done (the executor has a tracer).
  void TraceStep(const ChannelRun& ch, size_t index, const StepState& st) const;
  // Connects to every peer the operation sends to and waits for every peer it receives from to
  // connect (Transport::Connect, Poll), answering probes meanwhile; a peer that does not make its
  // connection fails the operation at its deadline like any wait, naming the peer.
  Status Connect(Deadline deadline);
  // Every connection the operation uses is made.
  bool Connected() const;
  Status SendHeaders();
  // `accept_now`: take the peers' connections now, first those of `expecting` (ReceiveControl).
  Result<bool> PollControl(bool accept_now = false, std::span<const int> expecting = {});
  Result<bool> Advance(ChannelRun& ch);
  // Takes step `index` of `ch` through its phases as far as it can go now (true when it moved),
  // by these: Post (kReadyToPost: onto the fabric; a step that cannot post blocks the later ones to
  // its peer in `send_blocked` / `recv_blocked`), TestPosted (kPosted: its completion) and Consume
  // (kReceived: once its peer's header is verified, the slot into its destination).
  Result<bool> Drive(ChannelRun& ch, size_t index, PeerSet& send_blocked, PeerSet& recv_blocked);
  Result<bool> Post(ChannelRun& ch, size_t index, PeerSet& send_blocked, PeerSet& recv_blocked);
  Result<bool> TestPosted(ChannelRun& ch, size_t index);
  // Post for a step in the header (StepState::in_header): a send leaves with this rank's header;
  // a receive waits for the peer's.
  Result<bool> PostInHeader(ChannelRun& ch, size_t index);
  // Marks StepState::in_header (Setup).
  void MarkTransfersInHeaders();
  Result<bool> Consume(ChannelRun& ch, size_t index);
  // Whether step `index` is a transfer that moves the caller's bytes itself, without a staging
  // slot: a collective's send or plain receive (a receive that reduces needs both operands), not
  // in a header, large enough (kDirectMinBytes), on memory the CPU reaches, over a comm that
  // registers it cheaply (FabricDeviceProperties::cheap_registration). Decided when the step
  // starts, once the operation's connections are made.
  bool Direct(const ChannelRun& ch, size_t index) const;
  // Its registration, once its request is done or failed (released).
  Status Unregister(const ChannelRun& ch, StepState& st);
  // Records the step's event (from the pool) on the channel's stream.
  Status RecordEvent(ChannelRun& ch, StepState& st);
  Status Start(ChannelRun& ch, size_t index);
  // A local step (copy, reduce, scale), on the channel's stream, or done here when `cpu`.
  Status EnqueueLocal(ChannelRun& ch, const Step& step, bool cpu);
  // What a receive's slot goes into (a copy or a reduce), on the stream or here when `cpu`.
  Status EnqueueConsume(ChannelRun& ch, const Step& step, StepState& st, bool cpu);
  // Whether a step moving `bytes` runs on this thread instead of a device stream: small steps on
  // memory the CPU reaches, where the hand-off to the stream's thread and back costs far more
  // than the copy, and more than the fabric transfer itself (docs/RACE.md, "After the 09:11
  // run").
  bool OnCpu(size_t bytes) const { return cpu_steps_ && bytes <= cpu_step_bytes_; }
  Result<bool> EventDone(StepState& st);
  Status CompleteRecv(ChannelRun& ch, size_t index, size_t size);
  // Staging slots: the collectives' (0..slots_-1, slot_bytes_ each) and point-to-point's (from
  // slots_ up, p2p_chunk_ each, after the collectives' part of the staging buffer).
  bool HasFreeSlot(const ChannelRun& ch) const { return ch.p2p ? !free_p2p_slots_.empty() : !free_slots_.empty(); }
  int TakeSlot(const ChannelRun& ch);
  void FreeSlot(int slot) { (slot < slots_ ? free_slots_ : free_p2p_slots_).push_back(slot); }
  size_t SlotCapacity(int slot) const { return slot < slots_ ? slot_bytes_ : p2p_chunk_; }
  void WaitBriefly();
  // This rank's header to `peer` carrying `bytes` of `data` (its first transfer to the peer), sent
  // (PostInHeader, and the straight path's sends).
  Status SendInHeader(int peer, const void* data, size_t bytes, fabric::Request** request);
  // The straight path's receive: takes the peer's header (false while it has not come).
  Result<bool> TakeFromHeader(ChannelRun& ch, size_t index);
  // One round of the straight path's wait: the control connections looked at, then (when nothing
  // moved) a brief block on `peer`'s next message (-1: a sleep); stalls and the deadline as Execute.
  Status StraightWait(bool progress, int peer, Deadline deadline);
  // The timeout of an operation that stopped moving: what this rank waits on, where its peers are.
  Status NoProgress() const;
  // A failure as the peer that failed first tells it (ExplainFailure), where it may.
  Status Explain(Status status);
  Status CheckHeader(int peer, const ControlMessage& m);
  std::string Waiting() const;
  void Release();

  const OperationMember& member(const ChannelRun& ch) const { return op_.members[static_cast<size_t>(ch.member)]; }
  size_t elem(const ChannelRun& ch) const { return DataTypeSize(member(ch).plan->request.dtype); }
  const void* Address(const ChannelRun& ch, const Slice& s) const;
  void* MutableAddress(const ChannelRun& ch, const Slice& s) const { return const_cast<void*>(Address(ch, s)); }
  uint8_t* SlotAddress(int slot) const {
    auto* base = static_cast<uint8_t*>(tr_.staging().data());
    if (slot < slots_) return base + static_cast<size_t>(slot) * slot_bytes_;
    return static_cast<uint8_t*>(tr_.p2p_staging()->data()) + static_cast<size_t>(slot - slots_) * p2p_chunk_;
  }
  std::string StepName(const ChannelRun& ch, size_t index) const;

  Executor& ex_;
  Operation& op_;
  Transport& tr_;
  const size_t slot_bytes_;
  const int slots_;
  const bool cpu_steps_;  // the device's memory is host accessible (OnCpu)
  const size_t cpu_step_bytes_;  // OnCpu's limit: Operation::cpu_step_bytes

  std::vector<ChannelRun> channels_;
  std::vector<ChannelRun> epilogues_;  // one per member that has an epilogue
  std::vector<int> free_slots_;
  std::vector<int> free_p2p_slots_;
  size_t p2p_chunk_ = 0;
  std::vector<std::unique_ptr<device::Event>> events_;  // the pool's storage
  std::vector<device::Event*> free_events_;
  std::vector<size_t> scratch_offsets_;  // bytes into the scratch buffer, per member (straight path: none, 0)
  int straight_channel_ = -1;            // Straight(): the plan's one channel with steps

  // Headers: which peers this rank must hear from, and what it heard.
  PeerSet expect_from_;
  PeerSet verified_;
  // Peers whose header goes with the first transfer to them (StepState::in_header), not at the
  // start; peers whose first transfer comes in their header, and those headers once verified.
  PeerSet header_with_data_, data_in_header_;
  std::map<int, ControlMessage> headers_;
  // Connections: the peers the operation sends to (data and headers) and receives from, and those
  // not connected yet (Connect).
  PeerSet send_to_, recv_from_;
  std::vector<int> no_connection_to_, no_connection_from_;

  // Probes (kProbeAfter): when this operation last moved, and when it last asked its peers.
  executor_internal::Clock::time_point last_progress_{}, probed_at_{};
 public:
  // What this rank waits on (Waiting), for a peer's probe.
  std::string WaitingText() const { return Waiting(); }
  const ControlMessage& header() const { return op_.header; }
 private:
  // The peers the operation exchanges with (data, headers), in rank order.
  PeerSet Peers() const {
    PeerSet all = send_to_;
    all.insert(recv_from_.begin(), recv_from_.end());
    all.insert(expect_from_.begin(), expect_from_.end());
    return all;
  }
  // Asks the operation's peers where they are, when it has not moved for kProbeAfter.
  void ProbeIfStalled(bool progress);
  // A peer's answer that shows a mismatch (the same operation, another signature); ok otherwise.
  Status CheckStates() const;
  // Where each peer said it was, for the timeout's message.
  std::string DescribePeers() const;
};

}  // namespace kizuna::collectives
