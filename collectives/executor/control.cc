// The executor's control traffic and connections: operation headers, the connections an operation
// needs (made on its first use of a peer), control messages received and sent (probes, answers,
// abort notices), and what they tell about a stalled or failed operation.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collectives/executor/internal.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {

using namespace executor_internal;  // the executor's own constants and control messages

Status Executor::Run::SendHeaders() {
  PeerSet send_to;
  for (const ChannelRun& ch : channels_)
    for (const Step& s : *ch.steps)
      if (s.kind == StepKind::kSend && !ch.p2p && !header_with_data_.count(s.peer)) send_to.insert(s.peer);
  const Deadline deadline = Deadline::AfterSeconds(ex_.options_.timeout_s);
  for (int peer : send_to) {
    KZ_ASSIGN_OR_RETURN(bool sent, ex_.SendControl(peer, op_.header, true, deadline));
    if (!sent) return Timeout(fmt::format("could not post the operation header to rank {}", peer));
  }
  return Status::Ok();
}

Status Executor::Run::SendInHeader(int peer, const void* data, size_t bytes, fabric::Request** request) {
  ControlMessage h = op_.header;
  h.inline_bytes = static_cast<uint32_t>(bytes);
  if (bytes > 0) std::memcpy(h.reason, data, bytes);
  KZ_ASSIGN_OR_RETURN(bool sent,
                      ex_.SendControl(peer, h, true, Deadline::AfterSeconds(ex_.options_.timeout_s), request));
  if (!sent) return Timeout(fmt::format("could not post the operation header to rank {}", peer));
  return Status::Ok();
}

bool Executor::Run::Connected() const {
  for (int q : send_to_)
    if (tr_.peer(q) == nullptr || tr_.peer(q)->send == nullptr) return false;
  for (int q : recv_from_)
    if (tr_.peer(q) == nullptr || tr_.peer(q)->recv == nullptr) return false;
  return true;
}

Status Executor::Run::Connect(Deadline deadline) {
  // Usually every connection is there (an operation after the first): nothing to wait for.
  if (Connected()) return Status::Ok();
  constexpr auto kMinSleep = std::chrono::microseconds(20);
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  auto sleep = kMinSleep;
  while (true) {
    if (ex_.abort_.load()) return Aborted("the communicator was aborted");
    bool progress = false;
    const size_t missing = no_connection_to_.size() + no_connection_from_.size();
    no_connection_to_.clear();
    for (int q : send_to_) {
      // A peer this rank also receives from connects to it now too: one connection may serve both.
      const bool peer_connects = recv_from_.count(q) != 0;
      KZ_ASSIGN_OR_RETURN(bool connected, tr_.Connect(q, peer_connects));
      if (!connected) no_connection_to_.push_back(q);
    }
    auto missing_from = [&] {
      no_connection_from_.clear();
      for (int q : recv_from_)
        if (tr_.peer(q) == nullptr || tr_.peer(q)->recv == nullptr) no_connection_from_.push_back(q);
    };
    // Accepts every round, where the peers this rank waits for connect.
    missing_from();
    KZ_ASSIGN_OR_RETURN(bool p, PollControl(/*accept_now=*/true, no_connection_from_));
    progress |= p;
    missing_from();
    if (no_connection_to_.empty() && no_connection_from_.empty()) return Status::Ok();
    progress |= no_connection_to_.size() + no_connection_from_.size() < missing;
    ProbeIfStalled(progress);
    KZ_RETURN_IF_ERROR(CheckStates());
    if (deadline.Expired() && Clock::now() - last_progress_ > std::chrono::duration<double>(ex_.options_.timeout_s))
      return NoProgress();
    if (progress) {
      sleep = kMinSleep;
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

Status Executor::Run::CheckHeader(int peer, const ControlMessage& m) {
  if (m.magic != kControlMagic) return RemoteError(fmt::format("rank {} sent a malformed control message", peer));
  if (m.kind == ControlKind::kAbort) return AbortNotice(peer, m);
  if (m.seq != op_.seq || m.signature != op_.header.signature) {
    return InvalidArgument(fmt::format("collective mismatch between ranks: rank {} is at {}; rank {} is at {}",
                                       tr_.rank(), DescribeHeader(op_.header), peer, DescribeHeader(m)));
  }
  return Status::Ok();
}

Result<bool> Executor::ReceiveControl(bool accept_now, std::span<const int> expecting) {
  bool progress = false;
  if (closed_) return false;
  // Connections peers made: each gets its control receive below.
  const Clock::time_point now = Clock::now();
  if (accept_now || now - control_->accepted_at >= kAcceptEvery) {
    control_->accepted_at = now;
    KZ_ASSIGN_OR_RETURN(bool accepted, transport_->Poll(expecting));
    progress |= accepted;
  }
  std::vector<int> answer;  // peers that asked where this rank is
  for (int q : transport_->receiving_from()) {
    Transport::Peer* p = transport_->peer(q);
    if (p == nullptr || !p->recv) continue;
    ControlState::Posted& posted = control_->recv[static_cast<size_t>(q)];
    Status& gone = control_->gone[static_cast<size_t>(q)];
    if (!gone.ok()) continue;
    const size_t nslots = p->control_in.size() / kControlSlotBytes;
    // The messages that arrived, in the order their receives were posted.
    while (!posted.requests.empty()) {
      Result<fabric::Completion> c = fabric::Completion{};
      if (posted.waited) {
        c = *posted.waited;
        posted.waited.reset();
      } else {
        c = p->recv->Test(posted.requests.front());
      }
      if (!c.ok()) {
        // The peer closed its side (it finished and left, or failed). That matters only if this
        // operation still needs the peer: its data steps then fail on their own, and a header
        // still expected from it fails below with this reason. Every receive still posted went
        // with the connection.
        posted.requests.clear();
        gone = c.status().WithContext(fmt::format("control connection from rank {}", q));
        break;
      }
      if (!c->done) break;
      const size_t slot = (posted.next - posted.requests.size()) % nslots;
      posted.requests.pop_front();
      ControlMessage m;
      if (c->size < kControlFieldBytes || c->size > sizeof m)
        return RemoteError(fmt::format("rank {} sent a control message of {} bytes", q, c->size));
      std::memcpy(&m, p->control_in.data() + slot * kControlSlotBytes, c->size);
      if (c->size != WireBytes(m))
        return RemoteError(
            fmt::format("rank {} sent a control message of {} bytes ({} expected)", q, c->size, WireBytes(m)));
      if (m.magic == kControlMagic && m.kind == ControlKind::kProbe) {
        answer.push_back(q);
      } else if (m.magic == kControlMagic && m.kind == ControlKind::kState) {
        control_->state[q] = ControlState::Answer{m, Clock::now()};
      } else {
        control_->inbox[q].push_back(m);
        progress = true;  // probes and answers are not the operation's progress
      }
    }
    if (!gone.ok()) continue;
    // Receives posted ahead, reposted half a window at a time in one batch (RecvComm::BeginPosts):
    // a fabric that announces each receive to its sender (tcp's post frames) sends one batch's
    // announcements together, where one receive reposted per message cost a system call per
    // message (2 x 1 namespace hosts, 8-byte AllReduce: 30 us per call before, 18-22 after).
    const size_t depth = std::min(nslots, kControlDepth);
    if (posted.requests.size() > depth / 2) continue;
    p->recv->BeginPosts();
    Status status;
    while (posted.requests.size() < depth) {
      uint8_t* where = p->control_in.data() + (posted.next % nslots) * kControlSlotBytes;
      Result<fabric::Request*> r = p->recv->Recv(where, kControlSlotBytes, kControlTag, p->recv_control);
      if (!r.ok()) status = r.status();
      if (!r.ok() || *r == nullptr) break;  // none free: the comm's requests are all in use; the next look
      posted.requests.push_back(*r);
      ++posted.next;
    }
    p->recv->EndPosts();
    KZ_RETURN_IF_ERROR(status);
  }
  // Answered after the receives are reposted: the answer may prompt the peer's next message. A
  // peer this rank has no connection to yet is answered once it has one (the probe started it).
  for (int q : answer) control_->owed.insert(q);
  if (!control_->owed.empty()) {
    const ControlMessage state = State();
    for (auto it = control_->owed.begin(); it != control_->owed.end();) {
      Result<bool> sent = SendControl(*it, state, false, Deadline::AfterSeconds(0));
      it = !sent.ok() || *sent ? control_->owed.erase(it) : std::next(it);
    }
  }
  return progress;
}

void Executor::MoveFabricWhileWaiting() {
  if (closed_) return;
  // A failure here (a peer's malformed message) is the communicator's: the next operation reports
  // it. A connection that ended is recorded in `gone` for the operation that needs it.
  if (Result<bool> r = ReceiveControl(); !r.ok()) Fail(r.status());
  if (Status s = ReapControlSends(); !s.ok()) Fail(s);
}

Status Executor::ReapControlSends() {
  for (auto& [peer, pending] : control_->pending) {
    Transport::Peer* p = transport_->peer(peer);
    while (!pending.empty()) {
      Result<fabric::Completion> c = p->send->Test(pending.front());
      if (!c.ok()) return c.status().WithContext(fmt::format("control message to rank {}", peer));
      if (!c->done) break;
      pending.pop_front();  // not an operation's progress: probes and answers go this way too
    }
  }
  return Status::Ok();
}

void Executor::WaitControl(int peer, Deadline deadline) {
  ControlState::Posted& posted = control_->recv[static_cast<size_t>(peer)];
  Transport::Peer* p = transport_->peer(peer);
  if (closed_ || posted.requests.empty() || posted.waited || p == nullptr || !p->recv) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    return;
  }
  Result<size_t> got = p->recv->Wait(posted.requests.front(), deadline);
  if (!got.ok() && got.status().code() == StatusCode::kTimeout) return;  // still posted
  // Done or failed: released by the comm either way; ReceiveControl takes it from `waited`
  // in place of testing the front request.
  posted.waited =
      got.ok() ? Result<fabric::Completion>(fabric::Completion{true, *got}) : Result<fabric::Completion>(got.status());
}

Result<bool> Executor::SendControl(int peer, const ControlMessage& m, bool wait, Deadline deadline,
                                   fabric::Request** sent) {
  // A failure names the peer: the fabric's error names addresses only.
  Result<bool> r = SendControlTo(peer, m, wait, deadline, sent);
  if (!r.ok()) return r.status().WithContext(fmt::format("control message to rank {}", peer));
  return r;
}

Result<bool> Executor::SendControlTo(int peer, const ControlMessage& m, bool wait, Deadline deadline,
                                     fabric::Request** sent) {
  if (closed_) return false;
  KZ_ASSIGN_OR_RETURN(bool connected, transport_->Connect(peer));
  if (!connected) return false;
  Transport::Peer* p = transport_->peer(peer);
  // A message slot that no earlier send still uses (they complete as the peer reposts its
  // control receive, one message at a time).
  const size_t nslots = transport_->control_bytes() / kControlSlotBytes;
  auto& pending = control_->pending[peer];
  while (!pending.empty()) {
    KZ_ASSIGN_OR_RETURN(fabric::Completion c, p->send->Test(pending.front()));
    if (!c.done) break;
    pending.pop_front();
  }
  while (pending.size() >= nslots) {
    if (!wait) return false;
    KZ_ASSIGN_OR_RETURN(size_t n, p->send->Wait(pending.front(), deadline));
    (void)n;
    pending.pop_front();
  }
  const size_t slot = control_->next[peer]++ % nslots;
  uint8_t* where = p->control_out.data() + slot * kControlSlotBytes;
  const size_t bytes = WireBytes(m);
  std::memcpy(where, &m, bytes);
  fabric::Request* r = nullptr;
  while (r == nullptr) {
    KZ_ASSIGN_OR_RETURN(r, p->send->Send(where, bytes, kControlTag, p->send_control));
    if (r == nullptr) {
      if (!wait || deadline.Expired()) return false;
      std::this_thread::sleep_for(kWaitSlice);
    }
  }
  pending.push_back(r);
  if (sent != nullptr) *sent = r;
  return true;
}

ControlMessage Executor::State() const {
  ControlMessage m;
  if (running_ != nullptr) {
    m = running_->header();
    m.members = std::max<uint32_t>(m.members, 1);
    const std::string waiting = running_->WaitingText();
    std::memcpy(m.reason, waiting.data(), std::min(waiting.size(), sizeof m.reason - 1));
  } else {
    m.members = 0;
    {
      std::lock_guard lock(mu_);
      m.seq = next_seq_ - 1;  // called (submitted) so far
    }
    const std::string what = stream_wait_seq_ != 0
                                 ? fmt::format("waiting for its stream to reach operation {}", stream_wait_seq_)
                                 : std::string("idle");
    std::memcpy(m.reason, what.data(), std::min(what.size(), sizeof m.reason - 1));
  }
  m.magic = kControlMagic;
  m.kind = ControlKind::kState;
  return m;
}

Status executor_internal::AbortNotice(int peer, const ControlMessage& m) {
  std::string why(m.reason, strnlen(m.reason, sizeof m.reason));
  // A notice that only passes another rank's on names that rank: the first cause travels as is.
  constexpr std::string_view kForwarded = "remote error: rank ";
  if (why.starts_with(kForwarded)) return RemoteError(why.substr(std::string_view("remote error: ").size()));
  return RemoteError(fmt::format("rank {} failed: {}", peer, why));
}

Status Executor::ExplainFailure(const Status& symptom, const ControlMessage& mine) {
  // The notice travels on the control connection, which closes right after it, and a peer's
  // header may not have been looked at (it was not expected yet): take whatever arrived, for a
  // short while (a failing peer waits as long for its notices to go out). A peer this rank sends
  // to but hears nothing from can tell it only through other ranks, which pass its notice on one
  // by one (around a ring), while this rank's transfer to it breaks at once: then kBlameGrace (a
  // 4-rank ring on a loaded machine named the closed connection after 200 ms instead of the
  // mismatch its neighbour found). Not always: a rank that waits longer here holds up the ranks
  // waiting on it past their own grace.
  bool indirect = false;
  for (int q = 0; q < transport_->nranks(); ++q) {
    const Transport::Peer* p = transport_->peer(q);
    indirect = indirect || (p != nullptr && p->send && !p->recv);
  }
  const Deadline grace =
      Deadline::After(indirect ? std::chrono::milliseconds(kBlameGrace) : std::chrono::milliseconds(200));
  while (true) {
    for (const auto& [q, inbox] : control_->inbox) {
      for (const ControlMessage& m : inbox) {
        if (m.magic != kControlMagic) continue;
        if (m.kind == ControlKind::kAbort) return AbortNotice(q, m);
        if (m.kind == ControlKind::kHeader && mine.seq != 0 && m.seq == mine.seq && m.signature != mine.signature)
          return InvalidArgument(fmt::format("collective mismatch between ranks: rank {} is at {}; rank {} is at {}",
                                             transport_->rank(), DescribeHeader(mine), q, DescribeHeader(m)));
      }
    }
    if (grace.Expired() || closed_) return symptom;
    auto got = ReceiveControl();
    if (!got.ok() || !*got) std::this_thread::sleep_for(kWaitSlice);
  }
}

Result<bool> Executor::Run::PollControl(bool accept_now, std::span<const int> expecting) {
  bool progress = false;
  KZ_RETURN_IF_ERROR(ex_.ReapControlSends());
  // Control receives: one posted per peer, always; each message is queued and the receive
  // reposted.
  KZ_ASSIGN_OR_RETURN(bool received, ex_.ReceiveControl(accept_now, expecting));
  progress |= received;
  // Headers waited for.
  for (int q : expect_from_) {
    if (verified_.count(q)) continue;
    auto& inbox = ex_.control_->inbox[q];
    if (inbox.empty()) {
      const Status& gone = ex_.control_->gone[static_cast<size_t>(q)];
      if (!gone.ok()) return gone;
      continue;
    }
    ControlMessage m = inbox.front();
    inbox.pop_front();
    KZ_RETURN_IF_ERROR(CheckHeader(q, m));
    verified_.insert(q);
    if (data_in_header_.count(q)) headers_.insert_or_assign(q, m);
    progress = true;
  }
  // An abort from any peer ends the operation, whether or not this rank talks to it now.
  for (const auto& [q, inbox] : ex_.control_->inbox) {
    for (const ControlMessage& m : inbox)
      if (m.kind == ControlKind::kAbort) KZ_RETURN_IF_ERROR(CheckHeader(q, m));
  }
  return progress;
}

Status Executor::Run::NoProgress() const {
  return Timeout(fmt::format("{} made no progress for {} s: rank {} is {}{}", DescribeHeader(op_.header),
                             ex_.options_.timeout_s, tr_.rank(), Waiting(), DescribePeers()));
}

Status Executor::Run::Explain(Status status) {
  // A connection that closed under this operation, or a transfer the peer's receive did not fit,
  // is the symptom: the peer that failed first said why before closing (TellPeersAndClose), or its
  // header shows the call it is at; either names the culprit better.
  if (status.code() == StatusCode::kAborted ||
      status.message().find("mismatch between ranks") != std::string_view::npos)
    return status;
  return ex_.ExplainFailure(status, op_.header);
}

void Executor::Run::ProbeIfStalled(bool progress) {
  const Clock::time_point now = Clock::now();
  if (progress) last_progress_ = now;
  const auto after = std::min<Clock::duration>(
      kProbeAfter, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(ex_.options_.timeout_s / 4)));
  if (now - last_progress_ < after || now - probed_at_ < after) return;
  probed_at_ = now;
  ControlMessage probe;
  probe.kind = ControlKind::kProbe;
  // The operation's peers (a rank its neighbours wait on shows up in their answers): probing
  // every rank would connect to every rank.
  for (int q : Peers()) ex_.SendControl(q, probe, false, Deadline::AfterSeconds(0)).status().IgnoreError();
  ex_.recorder_.Waiting(ex_.record_ticket_, Waiting());
}

Status Executor::Run::CheckStates() const {
  // A peer of this host at this operation on the fused path waits on this rank's arrival there,
  // and sends no header: its page says so once the operation stalls.
  if (ex_.options_.same_host && op_.seq != 0 && Clock::now() - last_progress_ > kFusedPeerCheckAfter)
    KZ_RETURN_IF_ERROR(ex_.options_.same_host->CheckFusedPeers(op_.seq, DescribeHeader(op_.header)));
  // Transfers are matched by their sizes; before a probe, no answer is this operation's.
  if (op_.seq == 0 || probed_at_ == Clock::time_point{}) return Status::Ok();
  for (const auto& [q, answer] : ex_.control_->state) {
    const ControlMessage& m = answer.state;
    if (m.members == 0 || m.seq != op_.seq || m.signature == op_.header.signature) continue;
    if (answer.at < probed_at_) continue;  // an answer to an older probe
    return InvalidArgument(fmt::format("collective mismatch between ranks: rank {} is at {}; rank {} is at {}",
                                       tr_.rank(), DescribeHeader(op_.header), q, DescribeHeader(m)));
  }
  return Status::Ok();
}

std::string Executor::Run::DescribePeers() const {
  if (probed_at_ == Clock::time_point{}) return "";
  std::vector<std::string> peers;
  const Clock::time_point now = Clock::now();
  for (int q : Peers()) {
    const auto found = ex_.control_->state.find(q);
    const ControlMessage m = found != ex_.control_->state.end() ? found->second.state : ControlMessage{};
    const Clock::time_point at = found != ex_.control_->state.end() ? found->second.at : Clock::time_point{};
    const std::string reason(m.reason, strnlen(m.reason, sizeof m.reason));
    if (at == Clock::time_point{} || now - at > std::chrono::seconds(2) + kProbeAfter) {
      const Status& gone = ex_.control_->gone[static_cast<size_t>(q)];
      peers.push_back(!gone.ok() ? fmt::format("rank {} is gone ({})", q, gone.message())
                      : at == Clock::time_point{}
                          ? fmt::format("rank {} does not answer (stopped, or its process not running)", q)
                          : fmt::format("rank {} has not answered for {:.1f} s (stopped, or its process not running)",
                                        q, std::chrono::duration<double>(now - at).count()));
    } else if (m.members == 0 && op_.seq != 0 && m.seq < op_.seq) {
      peers.push_back(fmt::format("rank {} has not called operation {} ({}; it called {} so far)", q, op_.seq,
                                  reason, m.seq));
    } else if (m.members != 0 && m.seq != op_.seq) {
      peers.push_back(fmt::format("rank {} is at {}, {}", q, DescribeHeader(m), reason));
    } else if (m.members != 0 && tr_.nranks() <= 8) {
      peers.push_back(fmt::format("rank {} is {}", q, reason));
    }
  }
  if (peers.empty()) return "";
  return fmt::format("; where the others are: {}", fmt::join(peers, "; "));
}

}  // namespace kizuna::collectives
