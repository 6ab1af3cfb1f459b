// Running one operation: steps over staging slots and device streams, waits (headers, connections
// and probes: control.cc).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "collectives/executor/internal.h"
#include "runtime/core/logging.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {

using namespace executor_internal;  // the executor's own constants and control messages

const void* Executor::Run::Address(const ChannelRun& ch, const Slice& s) const {
  const OperationMember& m = member(ch);
  const size_t off = static_cast<size_t>(s.offset) * elem(ch);
  switch (s.buffer) {
    case BufferKind::kInput:
      return static_cast<const uint8_t*>(m.input) + off;
    case BufferKind::kOutput:
      return static_cast<uint8_t*>(m.output) + off;
    case BufferKind::kScratch:
      return static_cast<uint8_t*>(ex_.scratch_->data()) +
             (scratch_offsets_.empty() ? 0 : scratch_offsets_[static_cast<size_t>(ch.member)]) + off;
  }
  return nullptr;
}

std::string Executor::Run::StepName(const ChannelRun& ch, size_t index) const {
  const Step& s = (*ch.steps)[index];
  std::string where = ch.epilogue ? "epilogue" : fmt::format("channel {}", ch.channel);
  if (op_.members.size() > 1) where = fmt::format("member {} {}", ch.member, where);
  std::string text = fmt::format("{} step {} ({}", where, index, StepKindName(s.kind));
  if (s.peer >= 0) text += fmt::format(" {} rank {}", s.kind == StepKind::kSend ? "to" : "from", s.peer);
  return text + ")";
}

Status Executor::Run::Setup() {
  // Scratch: one region per member, grown when too small (every earlier operation is finished,
  // so the old buffer is unused).
  size_t scratch_bytes = 0;
  scratch_offsets_.reserve(op_.members.size());
  for (const OperationMember& m : op_.members) {
    scratch_offsets_.push_back(scratch_bytes);
    scratch_bytes += ScratchBytes(*m.plan);
  }
  KZ_RETURN_IF_ERROR(ex_.EnsureScratch(scratch_bytes));

  int stream_index = 0;
  auto stream_for = [&]() -> Result<device::Stream*> {
    const size_t i = static_cast<size_t>(stream_index++ % kMaxChannels);
    while (ex_.streams_.size() <= i) {
      KZ_ASSIGN_OR_RETURN(auto s, ex_.device_->CreateStream());
      ex_.streams_.push_back(std::move(s));
    }
    return ex_.streams_[i].get();
  };
  // Tags: the sender's and the receiver's must agree. Collective members are numbered alike on
  // every rank (the signature checks it). Point-to-point transfers are matched per pair of ranks in
  // call order, whatever the groups around them (they differ between the two ranks: one lists a
  // send where the other lists a receive, beside other calls): every transfer to a peer uses the
  // same tags (one per channel, its channels and chunks a function of the transfer alone) and
  // starts when the one before it to that peer is done, so the k-th send to q meets q's k-th
  // receive from this rank, in this operation or a later one.
  int collective_index = 0;
  std::map<std::pair<int, bool>, std::vector<size_t>> previous_transfer;  // (peer, send): its channels
  for (size_t mi = 0; mi < op_.members.size(); ++mi) {
    const RankPlan& rp = op_.members[mi].plan->ranks[0];
    const CollectiveRequest& req = op_.members[mi].plan->request;
    const bool p2p = IsPointToPoint(req.collective);
    const int tag_base = p2p ? kP2pTagBase : collective_index++ * kMaxChannels;
    if (tag_base >= kP2pTagBase && !p2p) return InvalidArgument("too many collectives in one group");
    if (rp.channels.size() > static_cast<size_t>(kMaxChannels))
      return Internal(fmt::format("plan with {} channels (at most {})", rp.channels.size(), kMaxChannels));
    std::vector<size_t>* before = p2p ? &previous_transfer[{req.root, req.collective == Collective::kSend}] : nullptr;
    std::vector<size_t> mine;
    for (size_t c = 0; c < rp.channels.size(); ++c) {
      if (rp.channels[c].empty()) continue;
      ChannelRun ch;
      ch.member = static_cast<int>(mi);
      ch.channel = static_cast<int>(c);
      ch.steps = &rp.channels[c];
      ch.states.resize(ch.steps->size());
      ch.tag = tag_base + static_cast<int>(c);
      ch.p2p = p2p;
      ch.window = p2p ? kP2pWindow : static_cast<size_t>(ex_.options_.window);
      if (before != nullptr) ch.after = *before;
      KZ_ASSIGN_OR_RETURN(ch.stream, stream_for());
      for (const Step& s : *ch.steps) {
        const bool recv = s.kind == StepKind::kRecv || s.kind == StepKind::kRecvReduce;
        if (!p2p && recv) expect_from_.insert(s.peer);
        if (s.peer < 0) continue;
        if (!tr_.reachable(s.peer))
          return Internal(fmt::format("the plan needs rank {}, which no fabric connects this rank to", s.peer));
        (recv ? recv_from_ : send_to_).insert(s.peer);
      }
      if (before != nullptr) mine.push_back(channels_.size());
      channels_.push_back(std::move(ch));
    }
    if (before != nullptr && !mine.empty()) *before = std::move(mine);
    if (!rp.epilogue.empty()) {
      ChannelRun ch;
      ch.member = static_cast<int>(mi);
      ch.steps = &rp.epilogue;
      ch.states.resize(ch.steps->size());
      ch.epilogue = true;
      KZ_ASSIGN_OR_RETURN(ch.stream, stream_for());
      epilogues_.push_back(std::move(ch));
    }
  }
  MarkTransfersInHeaders();
  if (tr_.staging_bytes() < slot_bytes_ * static_cast<size_t>(slots_))
    return Internal(
        fmt::format("staging of {} bytes holds no {} slots of {} bytes", tr_.staging_bytes(), slots_, slot_bytes_));
  free_slots_.reserve(static_cast<size_t>(slots_));
  for (int s = slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  // Point-to-point: every channel gets its window of slots (none waits for another's), in the
  // transport's region for them, grown to this operation's needs.
  const size_t p2p_channels = static_cast<size_t>(
      std::count_if(channels_.begin(), channels_.end(), [](const ChannelRun& ch) { return ch.p2p; }));
  if (p2p_channels > 0) {
    p2p_chunk_ = ex_.p2p_chunk_bytes();
    const size_t p2p_slots = p2p_channels * static_cast<size_t>(kP2pWindow);
    KZ_RETURN_IF_ERROR(tr_.ReserveP2p(p2p_slots * p2p_chunk_));
    for (size_t s = p2p_slots; s-- > 0;) free_p2p_slots_.push_back(slots_ + static_cast<int>(s));
  }
  return Status::Ok();
}

void Executor::Run::MarkTransfersInHeaders() {
  // Per peer, the first collective transfer to it (the first in the first channel that has one)
  // goes inside this rank's operation header when it fits: a small operation then sends one
  // message per peer and step where it sent two. Its receiver marks the same transfer from its
  // side — the first from this rank in the first channel with one, the same tag's first message —
  // so both agree without asking. The header, which used to leave at the start, then leaves with
  // that transfer: the receiver trusts none of this rank's data before it either way.
  // Both ends' CPUs must reach their staging: each end knows it of both from the shape.
  const std::vector<bool>& cpu = ex_.options_.host_memory;
  auto reaches = [&](int r) { return r >= 0 && static_cast<size_t>(r) < cpu.size() && cpu[static_cast<size_t>(r)]; };
  if (!reaches(tr_.rank())) return;
  PeerSet first_send, first_recv;
  for (ChannelRun& ch : channels_) {
    if (ch.p2p) continue;
    for (size_t i = 0; i < ch.steps->size(); ++i) {
      const Step& s = (*ch.steps)[i];
      const bool send = s.kind == StepKind::kSend;
      if (!send && s.kind != StepKind::kRecv && s.kind != StepKind::kRecvReduce) continue;
      if (!(send ? first_send : first_recv).insert(s.peer)) continue;
      const size_t bytes = static_cast<size_t>(s.count()) * elem(ch);
      if (bytes > kHeaderPayloadBytes || !reaches(s.peer)) continue;
      ch.states[i].in_header = true;
      (send ? header_with_data_ : data_in_header_).insert(s.peer);
    }
  }
}

Result<bool> Executor::Run::EventDone(StepState& st) {
  KZ_ASSIGN_OR_RETURN(bool done, st.event->Query());
  if (done) {
    free_events_.push_back(st.event);
    st.event = nullptr;
  }
  return done;
}

Status Executor::Run::EnqueueLocal(ChannelRun& ch, const Step& step, bool cpu) {
  const CollectiveRequest& r = member(ch).plan->request;
  const size_t bytes = static_cast<size_t>(step.dst.count) * elem(ch);
  // avg sums, and a kScale divides later; a Step::average reduce divides itself (plan.h).
  const ReduceOp op = r.op == ReduceOp::kAvg && !step.average ? ReduceOp::kSum : r.op;
  switch (step.kind) {
    case StepKind::kCopy:
      if (cpu) {
        HostCopy(MutableAddress(ch, step.dst), Address(ch, step.srcs[0]), bytes);
        return Status::Ok();
      }
      return ch.stream->Copy(MutableAddress(ch, step.dst), Address(ch, step.srcs[0]), bytes);
    case StepKind::kReduce: {
      // A reduce's sources (two, usually) in place; more than 8 on the heap.
      std::array<const void*, 8> few{};
      std::vector<const void*> many(step.srcs.size() > few.size() ? step.srcs.size() : 0);
      const std::span<const void*> srcs = many.empty() ? std::span(few.data(), step.srcs.size()) : std::span(many);
      for (size_t i = 0; i < step.srcs.size(); ++i) srcs[i] = Address(ch, step.srcs[i]);
      if (cpu) return HostReduce(MutableAddress(ch, step.dst), srcs, step.dst.count, r.dtype, op);
      return ch.stream->Reduce(MutableAddress(ch, step.dst), srcs, step.dst.count, r.dtype, op);
    }
    case StepKind::kScale: {
      const uint32_t divisor = member(ch).plan->ranks[0].divisor;
      void* dst = MutableAddress(ch, step.dst);
      const void* src = Address(ch, step.srcs[0]);
      if (cpu) return HostScale(dst, src, step.dst.count, r.dtype, divisor);
      return ch.stream->Scale(dst, src, step.dst.count, r.dtype, divisor);
    }
    default:
      return Internal("not a local step");
  }
}

Status Executor::Run::EnqueueConsume(ChannelRun& ch, const Step& step, StepState& st, bool cpu) {
  const CollectiveRequest& r = member(ch).plan->request;
  const size_t bytes = static_cast<size_t>(step.dst.count) * elem(ch);
  const uint8_t* slot = SlotAddress(st.slot);
  if (step.kind == StepKind::kRecv) {
    if (bytes == 0) return Status::Ok();
    if (cpu) {
      HostCopy(MutableAddress(ch, step.dst), slot, bytes);
      return Status::Ok();
    }
    return ch.stream->Copy(MutableAddress(ch, step.dst), slot, bytes);
  }
  const std::array<const void*, 2> srcs = {Address(ch, step.srcs[0]), slot};
  const ReduceOp op = r.op == ReduceOp::kAvg ? ReduceOp::kSum : r.op;
  if (cpu) return HostReduce(MutableAddress(ch, step.dst), srcs, step.dst.count, r.dtype, op);
  return ch.stream->Reduce(MutableAddress(ch, step.dst), srcs, step.dst.count, r.dtype, op);
}

Status Executor::Run::Start(ChannelRun& ch, size_t index) {
  const Step& step = (*ch.steps)[index];
  StepState& st = ch.states[index];
  const bool moves_bytes = step.count() > 0;
  st.direct = Direct(ch, index);
  if ((step.kind == StepKind::kSend || step.kind == StepKind::kRecv || step.kind == StepKind::kRecvReduce) &&
      moves_bytes && !st.direct)
    st.slot = TakeSlot(ch);
  const size_t bytes = static_cast<size_t>(step.count()) * elem(ch);
  switch (step.kind) {
    case StepKind::kSend:
      if (st.direct) {
        st.phase = Phase::kReadyToPost;
      } else if (moves_bytes && OnCpu(bytes)) {
        HostCopy(SlotAddress(st.slot), Address(ch, step.srcs[0]), bytes);
        st.phase = Phase::kReadyToPost;
      } else if (moves_bytes) {
        KZ_RETURN_IF_ERROR(ch.stream->Copy(SlotAddress(st.slot), Address(ch, step.srcs[0]), bytes));
        KZ_RETURN_IF_ERROR(RecordEvent(ch, st));
        st.phase = Phase::kCopyIn;
      } else {
        st.phase = Phase::kReadyToPost;
      }
      break;
    case StepKind::kRecv:
    case StepKind::kRecvReduce:
      st.phase = Phase::kReadyToPost;
      break;
    default: {
      const bool cpu = OnCpu(static_cast<size_t>(step.dst.count) * elem(ch));
      KZ_RETURN_IF_ERROR(EnqueueLocal(ch, step, cpu));
      if (cpu) {
        st.phase = Phase::kDone;
        break;
      }
      KZ_RETURN_IF_ERROR(RecordEvent(ch, st));
      st.phase = Phase::kConsume;
      break;
    }
  }
  ch.active.push_back(index);
  return Status::Ok();
}

bool Executor::Run::Direct(const ChannelRun& ch, size_t index) const {
  const Step& s = (*ch.steps)[index];
  if (ch.p2p || !cpu_steps_ || ch.states[index].in_header) return false;
  if (s.kind != StepKind::kSend && s.kind != StepKind::kRecv) return false;
  if (static_cast<size_t>(s.count()) * elem(ch) < kDirectMinBytes) return false;
  const Transport::Peer* p = tr_.peer(s.peer);
  if (p == nullptr) return false;
  const fabric::Comm* comm = s.kind == StepKind::kSend ? static_cast<const fabric::Comm*>(p->send.get())
                                                       : static_cast<const fabric::Comm*>(p->recv.get());
  if (comm == nullptr) return false;
  if (comm->properties().cheap_registration) return true;
  // The caller registered the buffer (Communicator::Register): any fabric takes it as it is.
  const void* data = s.kind == StepKind::kSend ? Address(ch, s.srcs[0]) : Address(ch, s.dst);
  return ex_.RegionOf(data, static_cast<size_t>(s.count()) * elem(ch)).has_value();
}

int Executor::Run::TakeSlot(const ChannelRun& ch) {
  std::vector<int>& pool = ch.p2p ? free_p2p_slots_ : free_slots_;
  const int slot = pool.back();
  pool.pop_back();
  return slot;
}

Status Executor::Run::CompleteRecv(ChannelRun& ch, size_t index, size_t size) {
  const Step& step = (*ch.steps)[index];
  const size_t want = static_cast<size_t>(step.dst.count) * elem(ch);
  if (size != want) {
    if (ch.p2p)
      return InvalidArgument(fmt::format(
          "point-to-point mismatch: rank {} sent {} bytes where rank {} expects {} at {} of its {}", step.peer,
          size == SlotCapacity(ch.states[index].slot) ? fmt::format("{} or more", size) : fmt::format("{}", size),
          tr_.rank(), want, StepName(ch, index), member(ch).plan->request.ToString()));
    return InvalidArgument(fmt::format(
        "collective mismatch between ranks: rank {} sent {} bytes where rank {} expects {} at {} of {}", step.peer,
        size, tr_.rank(), want, StepName(ch, index), DescribeHeader(op_.header)));
  }
  ch.states[index].phase = Phase::kReceived;
  return Status::Ok();
}

// The step's phases in order, each taking it as far as it can go now: a phase that must wait
// leaves the step where it is, and the later ones then have nothing to do.
Result<bool> Executor::Run::Drive(ChannelRun& ch, size_t index, PeerSet& send_blocked, PeerSet& recv_blocked) {
  StepState& st = ch.states[index];
  bool progress = false;
  Tracer* const tracer = ex_.tracer_.get();
  const Phase entry = st.phase;
  if (tracer != nullptr && st.traced_active == 0) st.traced_active = Tracer::NowUs();
  if (st.phase == Phase::kCopyIn) {
    KZ_ASSIGN_OR_RETURN(bool done, EventDone(st));
    if (done) {
      st.phase = Phase::kReadyToPost;
      progress = true;
    }
  }
  if (st.phase == Phase::kReadyToPost || st.phase == Phase::kCopyIn) {
    // A failed post names its step (the fabric's error names addresses only).
    Result<bool> posted = Post(ch, index, send_blocked, recv_blocked);
    if (!posted.ok())
      return posted.status().WithContext(fmt::format("{} of {}", StepName(ch, index), DescribeHeader(op_.header)));
    progress |= *posted;
    if (tracer != nullptr && st.phase == Phase::kPosted) st.traced_posted = Tracer::NowUs();
  }
  if (st.phase == Phase::kPosted) {
    KZ_ASSIGN_OR_RETURN(bool completed, TestPosted(ch, index));
    progress |= completed;
    if (tracer != nullptr && st.phase != Phase::kPosted) st.traced_arrived = Tracer::NowUs();
  }
  if (st.phase == Phase::kReceived) {
    KZ_ASSIGN_OR_RETURN(bool consumed, Consume(ch, index));
    progress |= consumed;
  }
  if (st.phase == Phase::kConsume) {
    KZ_ASSIGN_OR_RETURN(bool done, EventDone(st));
    if (done) {
      st.phase = Phase::kDone;
      progress = true;
    }
  }
  if (st.phase == Phase::kDone && st.slot >= 0) {
    FreeSlot(st.slot);
    st.slot = -1;
  }
  if (tracer != nullptr && st.phase == Phase::kDone && entry != Phase::kDone) TraceStep(ch, index, st);
  return progress;
}

Result<bool> Executor::Run::Post(ChannelRun& ch, size_t index, PeerSet& send_blocked, PeerSet& recv_blocked) {
  const Step& step = (*ch.steps)[index];
  StepState& st = ch.states[index];
  const size_t bytes = static_cast<size_t>(step.count()) * elem(ch);
  const bool is_send = step.kind == StepKind::kSend;
  // Posts to one peer on one tag go out in step order: an earlier step that has not posted
  // blocks the later ones.
  PeerSet& blocked = is_send ? send_blocked : recv_blocked;
  if (st.phase == Phase::kCopyIn || blocked.count(step.peer)) {
    blocked.insert(step.peer);
    return false;
  }
  if (st.in_header) return PostInHeader(ch, index);
  Transport::Peer* p = tr_.peer(step.peer);
  fabric::Request* r = nullptr;
  if (st.direct) {
    // The caller's bytes themselves, registered for this transfer (kept over a busy answer).
    // A receive's capacity is its destination: a longer message fails it (TestPosted names both
    // ranks' calls).
    void* data = is_send ? const_cast<void*>(Address(ch, step.srcs[0])) : MutableAddress(ch, step.dst);
    fabric::Comm& comm = is_send ? static_cast<fabric::Comm&>(*p->send) : static_cast<fabric::Comm&>(*p->recv);
    if (st.registration == nullptr && comm.properties().cheap_registration) {
      KZ_ASSIGN_OR_RETURN(st.registration, comm.Register(fabric::MemoryDescriptor::Host(data, bytes)));
    } else if (st.registration == nullptr) {
      // Within a registered region (Run::Direct checked; it cannot go while this runs: run_mu_).
      const std::optional<Region> region = ex_.RegionOf(data, bytes);
      if (!region) return Internal("its registered buffer is gone");
      KZ_ASSIGN_OR_RETURN(st.registration, ex_.RegionRegistration(comm, *region));
      st.region = true;
    }
    if (!ex_.direct_logged_) {
      ex_.direct_logged_ = true;
      KZ_INFO(kLogColl,
              "rank {}: transfers of {} KiB and more go from and into the caller's buffers over {} (the first: {})",
              tr_.rank(), kDirectMinBytes >> 10, comm.properties().fabric, StepName(ch, index));
    }
    if (is_send) {
      KZ_ASSIGN_OR_RETURN(r, p->send->Send(data, bytes, ch.tag, st.registration));
    } else {
      KZ_ASSIGN_OR_RETURN(r, p->recv->Recv(data, bytes, ch.tag, st.registration));
    }
  } else if (is_send) {
    void* data = bytes > 0 ? SlotAddress(st.slot) : p->control_out.data();
    fabric::Registration* reg = bytes == 0 ? nullptr : st.slot < slots_ ? p->send_staging : p->send_p2p;
    KZ_ASSIGN_OR_RETURN(r, p->send->Send(data, bytes, ch.tag, reg));
  } else {
    void* data = bytes > 0 ? SlotAddress(st.slot) : nullptr;
    // Capacity is the whole slot, so that a peer sending more than expected is reported here,
    // with both operations named, rather than as a bare length error.
    fabric::Registration* reg = bytes == 0 ? nullptr : st.slot < slots_ ? p->recv_staging : p->recv_p2p;
    KZ_ASSIGN_OR_RETURN(r, p->recv->Recv(data, bytes > 0 ? SlotCapacity(st.slot) : 0, ch.tag, reg));
  }
  if (r == nullptr) {
    blocked.insert(step.peer);
    return false;
  }
  st.request = r;
  st.phase = Phase::kPosted;
  return true;
}

Result<bool> Executor::Run::PostInHeader(ChannelRun& ch, size_t index) {
  const Step& step = (*ch.steps)[index];
  StepState& st = ch.states[index];
  if (step.kind != StepKind::kSend) {
    st.phase = Phase::kPosted;  // TestPosted takes the bytes once the peer's header is here
    return true;
  }
  fabric::Request* request = nullptr;
  KZ_RETURN_IF_ERROR(
      SendInHeader(step.peer, SlotAddress(st.slot), static_cast<size_t>(step.count()) * elem(ch), &request));
  // Done when the header's send is (PollControl reaps it from the pending sends): an operation
  // that left with its last message still queued in the fabric could wait next where nothing
  // moves the fabric (a host group's meeting), and its peer would wait for that message forever.
  st.request = request;
  st.phase = Phase::kPosted;
  return true;
}

Result<bool> Executor::Run::TestPosted(ChannelRun& ch, size_t index) {
  const Step& step = (*ch.steps)[index];
  StepState& st = ch.states[index];
  if (st.in_header && step.kind == StepKind::kSend) {
    if (st.waited && !st.waited->ok()) {
      const Status failed = st.waited->status();
      st.waited.reset();
      st.request = nullptr;
      return failed.WithContext(fmt::format("{} of {}", StepName(ch, index), DescribeHeader(op_.header)));
    }
    const auto& pending = ex_.control_->pending[step.peer];
    if (std::find(pending.begin(), pending.end(), st.request) != pending.end()) return false;
    st.request = nullptr;
    st.phase = Phase::kDone;
    return true;
  }
  if (st.in_header) {
    const auto h = headers_.find(step.peer);
    if (h == headers_.end()) return false;
    const size_t size = h->second.inline_bytes;
    const size_t room = st.slot >= 0 ? SlotCapacity(st.slot) : 0;
    if (size > room || size > kHeaderPayloadBytes)
      return CompleteRecv(ch, index, size);  // names both ranks' calls
    if (size > 0) std::memcpy(SlotAddress(st.slot), h->second.reason, size);
    KZ_RETURN_IF_ERROR(CompleteRecv(ch, index, size));
    return true;
  }
  const bool is_send = step.kind == StepKind::kSend;
  Transport::Peer* p = tr_.peer(step.peer);
  fabric::Comm& comm = is_send ? static_cast<fabric::Comm&>(*p->send) : static_cast<fabric::Comm&>(*p->recv);
  // A completion WaitBriefly already collected, or a fresh test.
  Result<fabric::Completion> c = st.waited ? *st.waited : comm.Test(st.request);
  st.waited.reset();
  if (!c.ok()) {
    st.request = nullptr;
    KZ_RETURN_IF_ERROR(Unregister(ch, st));
    if (st.direct && !is_send && c.status().code() == StatusCode::kInvalidArgument)
      return InvalidArgument(fmt::format(
          "collective mismatch between ranks: rank {} sent more than the {} bytes rank {} expects at {} of {} ({})",
          step.peer, static_cast<size_t>(step.count()) * elem(ch), tr_.rank(), StepName(ch, index),
          DescribeHeader(op_.header), c.status().message()));
    return c.status().WithContext(fmt::format("{} of {}", StepName(ch, index), DescribeHeader(op_.header)));
  }
  if (!c->done) return false;
  st.request = nullptr;
  KZ_RETURN_IF_ERROR(Unregister(ch, st));
  if (is_send) {
    st.phase = Phase::kDone;
  } else {
    KZ_RETURN_IF_ERROR(CompleteRecv(ch, index, c->size));
  }
  return true;
}

Result<bool> Executor::Run::Consume(ChannelRun& ch, size_t index) {
  const Step& step = (*ch.steps)[index];
  StepState& st = ch.states[index];
  const size_t bytes = static_cast<size_t>(step.count()) * elem(ch);
  // A collective's data is not trusted before its sender's header; a transfer's size is its check.
  if (!ch.p2p && !verified_.count(step.peer)) return false;
  if (st.direct) {
    st.phase = Phase::kDone;  // received in place
  } else if (bytes > 0 && OnCpu(bytes)) {
    KZ_RETURN_IF_ERROR(EnqueueConsume(ch, step, st, /*cpu=*/true));
    st.phase = Phase::kDone;
  } else if (bytes > 0) {
    KZ_RETURN_IF_ERROR(EnqueueConsume(ch, step, st, /*cpu=*/false));
    KZ_RETURN_IF_ERROR(RecordEvent(ch, st));
    st.phase = Phase::kConsume;
  } else {
    st.phase = Phase::kDone;
  }
  return true;
}

Status Executor::Run::RecordEvent(ChannelRun& ch, StepState& st) {
  if (free_events_.empty()) {
    KZ_ASSIGN_OR_RETURN(auto e, ex_.device_->CreateEvent());
    free_events_.push_back(e.get());
    events_.push_back(std::move(e));
  }
  st.event = free_events_.back();
  free_events_.pop_back();
  return ch.stream->Record(*st.event);
}

Result<bool> Executor::Run::Advance(ChannelRun& ch) {
  for (size_t before : ch.after)
    if (!channels_[before].done()) return false;
  bool progress = false;
  PeerSet send_blocked, recv_blocked;
  for (size_t index : ch.active) {
    KZ_ASSIGN_OR_RETURN(bool p, Drive(ch, index, send_blocked, recv_blocked));
    progress |= p;
  }
  std::erase_if(ch.active, [&](size_t i) { return ch.states[i].phase == Phase::kDone; });
  const size_t window = ch.window > 0 ? ch.window : static_cast<size_t>(ex_.options_.window);
  while (ch.next < ch.steps->size() && ch.active.size() < window) {
    const Step& step = (*ch.steps)[ch.next];
    bool conflict = false;
    for (size_t a : ch.active)
      if ((*ch.steps)[a].ConflictsWith(step)) conflict = true;
    if (conflict) break;
    const bool needs_slot = step.kind != StepKind::kCopy && step.kind != StepKind::kReduce &&
                            step.kind != StepKind::kScale && step.count() > 0 && !Direct(ch, ch.next);
    if (needs_slot && !HasFreeSlot(ch)) break;
    KZ_RETURN_IF_ERROR(Start(ch, ch.next));
    ++ch.next;
    progress = true;
    // A receive posts at once (after any earlier one to the same peer that has not).
    KZ_ASSIGN_OR_RETURN(bool p, Drive(ch, ch.active.back(), send_blocked, recv_blocked));
    (void)p;
    std::erase_if(ch.active, [&](size_t i) { return ch.states[i].phase == Phase::kDone; });
  }
  return progress;
}

void Executor::Run::WaitBriefly() {
  // Block on the first thing the operation waits for — a device event, else a posted fabric
  // request — in that backend's own primitive (futex, eventfd), so that its completion wakes this
  // thread at once; a timed sleep would cost the timer slack (~50 us) per wait.
  std::vector<ChannelRun*> all;
  for (auto& c : channels_) all.push_back(&c);
  for (auto& c : epilogues_) all.push_back(&c);
  for (ChannelRun* ch : all)
    for (size_t i : ch->active)
      if (StepState& st = ch->states[i]; st.event != nullptr) {
        st.event->Synchronize(Deadline::After(kWaitSlice)).IgnoreError();  // the loop reads the verdict
        return;
      }
  for (ChannelRun* ch : all)
    for (size_t i : ch->active) {
      StepState& st = ch->states[i];
      const Step& step = (*ch->steps)[i];
      if (st.phase != Phase::kPosted || !st.in_header) continue;
      if (step.kind != StepKind::kSend) {
        if (headers_.count(step.peer)) continue;
        ex_.WaitControl(step.peer, Deadline::After(kWaitSlice));
        return;
      }
      // The header's send, once it is the oldest the pending list holds for the peer (the list
      // reaps the others): its completion, or its failure, is the step's.
      auto& pending = ex_.control_->pending[step.peer];
      if (st.waited || pending.empty() || pending.front() != st.request) continue;
      Result<size_t> got = tr_.peer(step.peer)->send->Wait(st.request, Deadline::After(kWaitSlice));
      if (!got.ok() && got.status().code() == StatusCode::kTimeout) return;
      pending.pop_front();  // released by the comm either way
      if (!got.ok()) st.waited = Result<fabric::Completion>(got.status());
      return;
    }
  for (ChannelRun* ch : all)
    for (size_t i : ch->active) {
      StepState& st = ch->states[i];
      // A header's send (in_header) is the pending list's to test: not waited on here.
      if (st.phase != Phase::kPosted || st.request == nullptr || st.waited || st.in_header) continue;
      const Step& step = (*ch->steps)[i];
      Transport::Peer* p = tr_.peer(step.peer);
      fabric::Comm& comm = step.kind == StepKind::kSend ? static_cast<fabric::Comm&>(*p->send)
                                                        : static_cast<fabric::Comm&>(*p->recv);
      auto got = comm.Wait(st.request, Deadline::After(kWaitSlice));
      if (got.ok()) {
        st.waited = Result<fabric::Completion>(fabric::Completion{true, *got});
      } else if (got.status().code() != StatusCode::kTimeout) {
        st.waited = Result<fabric::Completion>(got.status());  // failed, and released by the comm
      }
      return;
    }
  std::this_thread::sleep_for(std::chrono::microseconds(20));
}

std::string Executor::Run::Waiting() const {
  std::vector<std::string> items;
  std::set<int> peers;
  for (const auto* list : {&channels_, &epilogues_})
    for (const ChannelRun& ch : *list)
      for (size_t i : ch.active) {
        const Step& s = (*ch.steps)[i];
        if (s.peer >= 0) peers.insert(s.peer);
        if (items.size() < 6) items.push_back(StepName(ch, i));
      }
  for (int q : no_connection_to_) {
    peers.insert(q);
    if (items.size() < 6) items.push_back(fmt::format("the connection to rank {}", q));
  }
  for (int q : no_connection_from_) {
    peers.insert(q);
    if (items.size() < 6) items.push_back(fmt::format("the connection from rank {}", q));
  }
  for (int q : expect_from_)
    if (!verified_.count(q)) {
      peers.insert(q);
      if (items.size() < 6) items.push_back(fmt::format("the operation header of rank {}", q));
    }
  std::string ranks;
  for (int q : peers) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", q);
  return fmt::format("waiting on rank(s) {} ({})", ranks.empty() ? "none" : ranks, fmt::join(items, "; "));
}

void Executor::Run::Release() {
  // Device work still queued reads or writes memory this run owns (slots, scratch): let it
  // finish, bounded, before the slots are reused by the next operation.
  for (auto& s : ex_.streams_) s->Synchronize(Deadline::AfterSeconds(10)).IgnoreError();
}

Status Executor::Run::Execute(Deadline deadline) {
  last_progress_ = Clock::now();
  Status status = [&]() -> Status {
    KZ_RETURN_IF_ERROR(Setup());
    // With every connection there, the first messages leave before the control connections are
    // looked at (a system call each: four, 4-6 us, before the data left for an 8-byte AllReduce
    // between two hosts); a failure still reads an idle peer's abort notice (ExplainFailure). New
    // connections are looked for first only when the operation lacks one.
    const bool connected = Connected();
    if (!connected) {
      KZ_RETURN_IF_ERROR(PollControl(/*accept_now=*/true).status());
      KZ_RETURN_IF_ERROR(Connect(deadline));
    }
    KZ_RETURN_IF_ERROR(SendHeaders());
    for (bool first = connected;; first = false) {
      if (ex_.abort_.load()) return Aborted("the communicator was aborted");
      bool progress = false;
      if (!first) {
        KZ_ASSIGN_OR_RETURN(bool p, PollControl());
        progress |= p;
      }
      bool all_done = true;
      for (ChannelRun& ch : channels_) {
        if (ch.done()) continue;
        KZ_ASSIGN_OR_RETURN(bool q, Advance(ch));
        progress |= q;
        all_done &= ch.done();
      }
      if (all_done) {
        bool epilogue_done = true;
        for (ChannelRun& ch : epilogues_) {
          if (ch.done()) continue;
          KZ_ASSIGN_OR_RETURN(bool q, Advance(ch));
          progress |= q;
          epilogue_done &= ch.done();
        }
        if (epilogue_done && verified_.size() == expect_from_.size()) return Status::Ok();
      }
      ProbeIfStalled(progress);
      KZ_RETURN_IF_ERROR(CheckStates());
      // The deadline is for an operation that stopped moving, not one that moves slowly.
      if (deadline.Expired() &&
          Clock::now() - last_progress_ > std::chrono::duration<double>(ex_.options_.timeout_s) + kBlameGrace)
        return NoProgress();
      if (!progress) WaitBriefly();
    }
  }();
  if (!status.ok()) status = Explain(status);
  // Requests still outstanding after a failure belong to the comms, which the failure path
  // closes; device work still queued is waited for here.
  Release();
  return status;
}

}  // namespace kizuna::collectives
