// The straight path: an operation whose every transfer travels inside an operation header (a small
// collective between ranks whose CPUs reach their memory: an 8-byte AllReduce, a barrier) runs its
// steps in order on this thread. Execute's machinery (staging slots, step phases, device streams
// and events, a window of steps per channel) serves transfers that need it; here a send is one
// control message, a receive the peer's header, and a local step a CPU loop. The messages are
// Execute's, so a rank on either path meets a peer on the other.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "collectives/executor/internal.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {

using namespace executor_internal;  // the executor's own constants and control messages

namespace {

// The steps done are a bit each.
constexpr size_t kMaxStraightSteps = 64;

bool IsTransfer(StepKind kind) {
  return kind == StepKind::kSend || kind == StepKind::kRecv || kind == StepKind::kRecvReduce;
}

}  // namespace

bool Executor::Run::Straight() {
  if (ex_.tracer_ != nullptr || op_.seq == 0 || op_.members.size() != 1 || !cpu_steps_) return false;
  const Plan& plan = *op_.members[0].plan;
  if (IsPointToPoint(plan.request.collective) || plan.ranks.empty()) return false;
  const RankPlan& rp = plan.ranks[0];
  // Both ends' CPUs reach their staging, as for any transfer in a header (MarkTransfersInHeaders).
  const std::vector<bool>& cpu = ex_.options_.host_memory;
  auto reaches = [&](int r) { return r >= 0 && static_cast<size_t>(r) < cpu.size() && cpu[static_cast<size_t>(r)]; };
  if (!reaches(tr_.rank())) return false;
  int channel = -1;
  for (size_t c = 0; c < rp.channels.size(); ++c) {
    if (rp.channels[c].empty()) continue;
    if (channel >= 0) return false;
    channel = static_cast<int>(c);
  }
  if (channel < 0 || rp.channels[static_cast<size_t>(channel)].size() > kMaxStraightSteps) return false;
  const size_t elem = DataTypeSize(plan.request.dtype);
  // Only a peer's first transfer each way rides in a header: every transfer must be one.
  PeerSet sends, recvs;
  for (const Step& s : rp.channels[static_cast<size_t>(channel)]) {
    if (!IsTransfer(s.kind)) {
      if (!OnCpu(static_cast<size_t>(s.dst.count) * elem)) return false;
      continue;
    }
    const bool send = s.kind == StepKind::kSend;
    if (static_cast<size_t>(s.count()) * elem > kHeaderPayloadBytes || !reaches(s.peer)) return false;
    if (!(send ? sends : recvs).insert(s.peer)) return false;
    // Connections are Execute's to make.
    const Transport::Peer* p = tr_.peer(s.peer);
    if (p == nullptr || (send ? p->send == nullptr : p->recv == nullptr)) return false;
  }
  for (const Step& s : rp.epilogue)
    if (IsTransfer(s.kind) || !OnCpu(static_cast<size_t>(s.dst.count) * elem)) return false;
  straight_channel_ = channel;
  send_to_ = sends;
  recv_from_ = recvs;
  expect_from_ = recvs;
  return true;
}

Status Executor::Run::ExecuteStraight(Deadline deadline) {
  last_progress_ = Clock::now();
  const RankPlan& rp = op_.members[0].plan->ranks[0];
  ChannelRun ch;
  ch.channel = straight_channel_;
  ch.steps = &rp.channels[static_cast<size_t>(straight_channel_)];
  ChannelRun epilogue;
  epilogue.steps = &rp.epilogue;
  epilogue.epilogue = true;
  const std::vector<Step>& steps = *ch.steps;
  // The header sends (the first nsent), each done once its peer's receive for it was announced
  // (as PostInHeader's).
  std::array<int, kMaxStraightSteps> sent_to;
  std::array<fabric::Request*, kMaxStraightSteps> sent;
  size_t nsent = 0;
  auto send = [&](size_t index) -> Status {
    const Step& step = steps[index];
    KZ_RETURN_IF_ERROR(
        SendInHeader(step.peer, Address(ch, step.srcs[0]), static_cast<size_t>(step.count()) * elem(ch), &sent[nsent]));
    sent_to[nsent++] = steps[index].peer;
    return Status::Ok();
  };
  Status status = [&]() -> Status {
    KZ_RETURN_IF_ERROR(ex_.EnsureScratch(ScratchBytes(*op_.members[0].plan)));
    uint64_t done = 0;
    auto is_done = [&](size_t i) { return (done >> i & 1) != 0; };
    size_t next = 0;
    while (true) {
      if (ex_.abort_.load()) return Aborted("the communicator was aborted");
      bool progress = false;
      for (; next < steps.size(); ++next) {
        if (is_done(next)) continue;
        const StepKind kind = steps[next].kind;
        if (kind == StepKind::kSend) {
          KZ_RETURN_IF_ERROR(send(next));
        } else if (IsTransfer(kind)) {
          KZ_ASSIGN_OR_RETURN(bool got, TakeFromHeader(ch, next));
          if (!got) break;
        } else {
          KZ_RETURN_IF_ERROR(EnqueueLocal(ch, steps[next], /*cpu=*/true));
        }
        done |= uint64_t{1} << next;
        progress = true;
      }
      if (next == steps.size()) break;
      // While a header is awaited, the later sends that touch nothing an unfinished step before
      // them writes (or reads, where they write) leave now, as Execute's window lets them: a plan
      // that receives from one peer before it sends to another waits on no one needlessly.
      for (size_t j = next + 1; j < steps.size(); ++j) {
        if (is_done(j) || steps[j].kind != StepKind::kSend) continue;
        bool conflict = false;
        for (size_t k = next; k < j && !conflict; ++k) conflict = !is_done(k) && steps[k].ConflictsWith(steps[j]);
        if (conflict) continue;
        KZ_RETURN_IF_ERROR(send(j));
        done |= uint64_t{1} << j;
        progress = true;
      }
      KZ_RETURN_IF_ERROR(StraightWait(progress, steps[next].peer, deadline));
    }
    for (const Step& s : rp.epilogue) KZ_RETURN_IF_ERROR(EnqueueLocal(epilogue, s, /*cpu=*/true));
    // Done when the header sends are: an operation that left with its last message still queued
    // in the fabric could wait next where nothing moves it (see PostInHeader).
    for (size_t i = 0; i < nsent;) {
      const auto& pending = ex_.control_->pending[sent_to[i]];
      if (std::find(pending.begin(), pending.end(), sent[i]) == pending.end()) {
        ++i;
        continue;
      }
      KZ_RETURN_IF_ERROR(StraightWait(false, -1, deadline));
    }
    return Status::Ok();
  }();
  return status.ok() ? status : Explain(status);
}

Result<bool> Executor::Run::TakeFromHeader(ChannelRun& ch, size_t index) {
  const Step& step = (*ch.steps)[index];
  ControlQueue& inbox = ex_.control_->inbox[step.peer];
  if (inbox.empty()) return false;
  const ControlMessage& m = inbox.front();
  KZ_RETURN_IF_ERROR(CheckHeader(step.peer, m));
  verified_.insert(step.peer);
  const CollectiveRequest& r = member(ch).plan->request;
  const size_t want = static_cast<size_t>(step.dst.count) * elem(ch);
  if (m.inline_bytes != want)
    return InvalidArgument(
        fmt::format("collective mismatch between ranks: rank {} sent {} bytes where rank {} expects {} at {} of {}",
                    step.peer, m.inline_bytes, tr_.rank(), want, StepName(ch, index), DescribeHeader(op_.header)));
  if (step.kind == StepKind::kRecv) {
    if (want > 0) HostCopy(MutableAddress(ch, step.dst), m.reason, want);
  } else {
    const std::array<const void*, 2> srcs = {Address(ch, step.srcs[0]), m.reason};
    KZ_RETURN_IF_ERROR(HostReduce(MutableAddress(ch, step.dst), srcs, step.dst.count, r.dtype,
                                  r.op == ReduceOp::kAvg ? ReduceOp::kSum : r.op));
  }
  inbox.pop_front();
  return true;
}

Status Executor::Run::StraightWait(bool progress, int peer, Deadline deadline) {
  KZ_RETURN_IF_ERROR(ex_.ReapControlSends());
  KZ_ASSIGN_OR_RETURN(bool received, ex_.ReceiveControl());
  progress |= received;
  // An abort from any peer ends the operation (as in PollControl).
  for (const auto& [q, inbox] : ex_.control_->inbox)
    for (const ControlMessage& m : inbox)
      if (m.kind == ControlKind::kAbort) KZ_RETURN_IF_ERROR(CheckHeader(q, m));
  const bool awaited = peer >= 0 && ex_.control_->inbox[peer].empty();
  if (awaited) {
    const Status& gone = ex_.control_->gone[static_cast<size_t>(peer)];
    if (!gone.ok()) return gone;
  }
  ProbeIfStalled(progress);
  KZ_RETURN_IF_ERROR(CheckStates());
  if (deadline.Expired() &&
      Clock::now() - last_progress_ > std::chrono::duration<double>(ex_.options_.timeout_s) + kBlameGrace)
    return NoProgress();
  if (progress) return Status::Ok();
  if (awaited) {
    // What the wait brought goes to the inbox now, where the caller looks next.
    ex_.WaitControl(peer, Deadline::After(kWaitSlice));
    KZ_RETURN_IF_ERROR(ex_.ReceiveControl().status());
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return Status::Ok();
}

}  // namespace kizuna::collectives
