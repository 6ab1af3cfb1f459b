// The executor's direct path: operations whose plan is the single-host direct algorithm
// (direct/fused.h) run here instead of through steps and the transport. The ranks of one process
// meet in their SameProcessGroup, the ranks of one host in several processes in their
// SameHostGroup: each publishes its buffer addresses, does its part (on the emulated device: on
// the executor's thread), waits for it, and waits for every other rank to have done the same
// before its held stream continues (another rank writes into this rank's output until then).
#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "collectives/direct/fused.h"
#include "collectives/executor/internal.h"
#include "runtime/device/host_reduce.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {

// ---- Executor::RunDirect ----

Status Executor::DirectStream() {
  if (streams_.empty()) {
    KZ_ASSIGN_OR_RETURN(auto s, device_->CreateStream());
    streams_.push_back(std::move(s));
  }
  return Status::Ok();
}

Status Executor::RunDirect(Operation& op, Deadline deadline) {
  if (options_.same_host) return RunHostDirect(op, deadline);
  SameProcessGroup* group = options_.same_process.get();
  const OperationMember& m = op.members[0];
  const Plan& plan = *m.plan;
  const CollectiveRequest& req = plan.request;
  if (group == nullptr || group->nranks() != req.nranks)
    return Internal(fmt::format("operation {}: a {} plan on a communicator without an in-process group", op.seq,
                                AlgorithmName(plan.algorithm)));
  const int rank = options_.rank;
  SameProcessGroup::Entry mine{m.input, m.output, op.header.signature, true, req.ToString()};
  auto exchanged = group->Exchange(op.seq, rank, mine, deadline, abort_);
  if (!exchanged.ok()) return exchanged.status();
  const std::vector<SameProcessGroup::Entry>& all = *exchanged;
  auto failed = [&](const Status& s) {
    Status f = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}", op.seq, rank, req.ToString()));
    group->Fail(f);
    return f;
  };
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (const SameProcessGroup::Entry& e : all) {
    inputs.push_back(e.input);
    outputs.push_back(e.output);
  }
  // Where the CPU does the parts (CpuDoesParts), this thread does this rank's itself, and the
  // operation is done for this rank once every rank's part is. Two thread hand-offs fewer per
  // call (to the stream's thread and back; docs/PERFORMANCE.md, "Ranks of one process"). A rank
  // that published no event finished its part before
  // publishing; the events of ranks that went through their streams are waited for here.
  if (CpuDoesParts(device_->properties())) {
    if (Status s = RunFusedPartOnCpu(req, rank, plan.ranks[0].fused_bounds, inputs, outputs); !s.ok()) return failed(s);
    KZ_ASSIGN_OR_RETURN(std::vector<device::Event*> events,
                        group->Finish(op.seq, rank, nullptr, deadline, abort_));
    for (device::Event* e : events)
      if (e != nullptr)
        if (Status s = e->Synchronize(deadline); !s.ok()) return failed(s);
    return Status::Ok();  // FinishOperation releases the caller's stream
  }
  KZ_RETURN_IF_ERROR(DirectStream());
  device::Stream& stream = *streams_[0];
  if (!direct_done_) {
    KZ_ASSIGN_OR_RETURN(direct_done_, device_->CreateEvent());
  }
  if (Status s = EnqueueFusedPart(req, rank, plan.ranks[0].fused_bounds, inputs, outputs, stream); !s.ok())
    return failed(s);
  if (Status s = stream.Record(*direct_done_); !s.ok()) return failed(s);
  // The finish stays on the device: this rank's stream waits for every other rank's part, then
  // releases the caller's stream itself. No host thread waits for the device pass.
  KZ_ASSIGN_OR_RETURN(std::vector<device::Event*> events,
                      group->Finish(op.seq, rank, direct_done_.get(), deadline, abort_));
  for (int q = 0; q < req.nranks; ++q)
    if (q != rank && events[static_cast<size_t>(q)] != nullptr)
      if (Status s = stream.Wait(*events[static_cast<size_t>(q)]); !s.ok()) return failed(s);
  std::unique_ptr<device::StreamHold> hold;
  {
    std::lock_guard lock(op.mu);
    hold = std::move(op.hold);
  }
  if (hold) {
    if (Status s = stream.EnqueueRelease(std::move(hold)); !s.ok()) return failed(s);
  }
  return Status::Ok();
}

}  // namespace kizuna::collectives

namespace kizuna::collectives {

// ---- Executor::RunHostDirect ----

// Ranks in several processes: the buffers come through the host group (peers' allocations mapped
// on first use), and since events do not cross processes this rank waits for its own device pass
// on the host, then for every other rank's in the group, before the operation ends
// (FinishOperation then releases the caller's stream).
Status Executor::RunHostDirect(Operation& op, Deadline deadline) {
  SameHostGroup& group = *options_.same_host;
  const OperationMember& m = op.members[0];
  const CollectiveRequest& req = m.plan->request;
  const int rank = options_.rank;
  auto failed = [&](const Status& s) {
    Status f = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}", op.seq, rank, req.ToString()));
    group.Fail(f);
    return f;
  };
  // Small AllReduces take the one-shot protocol wherever they run (TryInline ran them on the
  // caller's thread when it could): the inputs are ready now, and the result is written by the
  // CPU before the caller's stream is released.
  // (FinishOperation releases the caller's stream, once the executor no longer counts it.)
  if (group.UsesOneShot(req)) {
    if (Status s = group.RunOneShot(op.seq, op.header.signature, req, m.input, m.output, deadline, abort_); !s.ok())
      return failed(s);
    return Status::Ok();
  }
  const auto [in_bytes, out_bytes] = FusedBytes(req, rank);
  auto buffers = group.Exchange(op.seq, op.header.signature, req, m.input, in_bytes, m.output, out_bytes, deadline,
                                abort_);
  if (!buffers.ok()) return failed(buffers.status());
  if (Status s = DirectStream(); !s.ok()) return failed(s);
  device::Stream& stream = *streams_[0];
  if (Status s = EnqueueFusedPart(req, rank, m.plan->ranks[0].fused_bounds, buffers->inputs, buffers->outputs, stream);
      !s.ok())
    return failed(s);
  if (Status s = stream.Synchronize(deadline); !s.ok()) return failed(s);
  if (Status s = group.Finish(op.seq, deadline, abort_); !s.ok()) return failed(s);
  return Status::Ok();
}

// ---- Executor::TryInline ----

Result<bool> Executor::TryInline(const std::vector<OperationMember>& members, device::Stream& stream,
                                 bool host_memory) {
  if (host_memory) {
    if (!TakesHostMemory()) return InvalidArgument("this communicator does not take plain host memory");
    if (members.size() != 1)
      return InvalidArgument("plain host memory in a group of several calls: call them one by one");
    if (members[0].plan->algorithm != Algorithm::kFused)
      return InvalidArgument(fmt::format("{} with plain host memory runs only as fused (the algorithm asked for or "
                                         "chosen is {})",
                                         members[0].plan->request.ToString(),
                                         AlgorithmName(members[0].plan->algorithm)));
    // Wait for earlier work on the stream and in the executor: then it runs here.
    const Deadline deadline = Deadline::AfterSeconds(options_.timeout_s);
    KZ_RETURN_IF_ERROR(stream.Synchronize(deadline));
    while (true) {
      {
        std::lock_guard lock(mu_);
        if (!error_.ok()) return Aborted(fmt::format("the communicator failed earlier: {}", error_.ToString()));
        if (queue_.empty() && pending_ == 0) break;
      }
      if (deadline.Expired())
        return Timeout("earlier operations of this communicator did not finish by the deadline");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  if (!options_.same_host || members.size() != 1) return false;
  const OperationMember& m = members[0];
  const CollectiveRequest& req = m.plan->request;
  SameHostGroup& group = *options_.same_host;
  if (m.plan->algorithm != Algorithm::kFused || !group.host_accessible() || !group.one_rank_per_process()) return false;
  // Throttled or fault-injected devices do their parts on their streams (RunHostDirect), where the
  // throttles and faults apply; only host memory, which no stream serves, must run here.
  if (!host_memory && !CpuDoesParts(device_->properties())) return false;
  // The caller's stream must have nothing queued: then the inputs are ready now, and running the
  // operation before returning orders it before whatever the caller enqueues next.
  auto idle = stream.Idle();
  if (!idle.ok() || !*idle) {
    if (host_memory) return idle.ok() ? Internal("the caller's stream is busy again") : idle.status();
    return false;
  }
  KZ_ASSIGN_OR_RETURN(const uint64_t signature, executor_internal::OperationSignature(members));
  uint64_t seq = 0;
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return Aborted(fmt::format("the communicator failed earlier: {}", error_.ToString()));
    // Anything still queued or running goes first, on the executor's thread: not inline.
    if (!queue_.empty() || pending_ > 0) {
      if (host_memory) return Internal("another thread submitted work to this communicator meanwhile");
      return false;
    }
    seq = next_seq_++;
  }
  // Nothing of this rank in flight, and this call holds no stream; kept for later while another
  // rank holds one (SameHostGroup::ReleaseRetired).
  group.ReleaseRetired();
  const Deadline deadline = Deadline::AfterSecondsCoarse(options_.timeout_s);
  // Ranks outnumbering the CPUs each do their part on this thread alone.
  const ScopedSerialHostWork serial(group.oversubscribed());
  const uint64_t ticket = recorder_.Begin(seq, req, m.plan->algorithm, 1, RunPath::kInline);
  record_ticket_ = ticket;  // the group's waits say here what they wait on (set_stall_report)
  const uint64_t traced_from = tracer_ ? Tracer::NowUs() : 0;
  Status s;
  if (group.UsesOneShot(req)) {
    s = group.RunOneShot(seq, signature, req, m.input, m.output, deadline, abort_);
  } else if (host_memory) {
    s = group.RunStaged(seq, signature, req, m.input, m.output, deadline, abort_);
  } else {
    // The same protocol as RunHostDirect, with the CPU doing this rank's part.
    const auto [in_bytes, out_bytes] = FusedBytes(req, options_.rank);
    auto buffers = group.Exchange(seq, signature, req, m.input, in_bytes, m.output, out_bytes, deadline,
                                  abort_);
    s = buffers.ok()
            ? RunFusedPartOnCpu(req, options_.rank, m.plan->ranks[0].fused_bounds, buffers->inputs, buffers->outputs)
            : buffers.status();
    if (s.ok()) s = group.Finish(seq, deadline, abort_);
  }
  recorder_.End(ticket, s);
  if (tracer_)
    tracer_->Complete(fmt::format("{} (fused)", req.ToString()), "fused", traced_from, Tracer::NowUs(), 0, seq);
  if (!s.ok()) {
    s = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}", seq, options_.rank, req.ToString()));
    if (s.code() == StatusCode::kTimeout) DumpRecorder();
    Fail(s);
    return s;
  }
  return true;
}

// ---- Executor::TryInlineGroup ----

// One grouped call, through TryInlineGroup's steps: the executors, members and streams as the
// caller passed them, and, once Matches has found every rank once, which index each rank has.
class Executor::GroupCall {
 public:
  GroupCall(std::span<Executor* const> executors, std::span<const std::vector<OperationMember>* const> members,
            std::span<device::Stream* const> streams)
      : executors_(executors), members_(members), streams_(streams), n_(executors.size()) {}

  // Every rank of the group once, each with one fused call, the same call on every rank (otherwise
  // the usual path reports the mismatch); the CPU does every part (on idle streams) or the devices
  // do every part (each executor then has its events, created here).
  bool Matches();
  // Every executor idle and at the same operation: each takes its next number, all at once.
  bool TakeNumber();
  // Each rank's buffers, in rank order.
  void GatherBuffers();
  bool cpu() const { return cpu_; }
  // This thread runs every rank's part, in rank order.
  Result<bool> RunOnCpu();
  // The devices do the parts, each rank's on its caller's stream (where rank r's later work goes).
  Result<bool> EnqueueOnStreams();

 private:
  const CollectiveRequest& request(size_t r) const {
    return (*members_[static_cast<size_t>(order_[r])])[0].plan->request;
  }
  const std::vector<uint64_t>& bounds(size_t r) const {
    return (*members_[static_cast<size_t>(order_[r])])[0].plan->ranks[0].fused_bounds;
  }
  device::Stream& stream(size_t r) const { return *streams_[static_cast<size_t>(order_[r])]; }
  Executor& ex(size_t r) const { return *executors_[static_cast<size_t>(order_[r])]; }
  // Fails every executor with rank r's error `s`, and returns it.
  Status FailAll(Status s, size_t r) const;

  const std::span<Executor* const> executors_;
  const std::span<const std::vector<OperationMember>* const> members_;
  const std::span<device::Stream* const> streams_;
  const size_t n_;
  std::vector<int> order_;  // order_[rank]: its index in executors_
  bool cpu_ = false;
  uint64_t seq_ = 0;
  std::vector<const void*> inputs_;
  std::vector<void*> outputs_;
};

bool Executor::GroupCall::Matches() {
  SameProcessGroup* group = executors_[0]->options_.same_process.get();
  if (group == nullptr || static_cast<size_t>(group->nranks()) != n_) return false;
  order_.assign(n_, -1);
  cpu_ = CpuDoesParts(executors_[0]->device_->properties());
  for (size_t i = 0; i < n_; ++i) {
    Executor& ex = *executors_[i];
    const auto rank = static_cast<size_t>(ex.options_.rank);
    if (ex.options_.same_process.get() != group || rank >= n_ || order_[rank] >= 0) return false;
    order_[rank] = static_cast<int>(i);
    if (members_[i]->size() != 1 || (*members_[i])[0].plan->algorithm != Algorithm::kFused) return false;
    if (CpuDoesParts(ex.device_->properties()) != cpu_) return false;
    if (cpu_) {
      auto idle = streams_[i]->Idle();
      if (!idle.ok() || !*idle) return false;
    } else {
      for (auto* event : {&ex.group_ready_, &ex.group_done_}) {
        if (*event) continue;
        auto created = ex.device_->CreateEvent();
        if (!created.ok()) return false;  // the usual path needs none
        *event = std::move(*created);
      }
    }
  }
  uint64_t signature = 0;
  for (size_t i = 0; i < n_; ++i) {
    auto s = executor_internal::OperationSignature(*members_[i]);
    if (!s.ok() || (i > 0 && *s != signature)) return false;
    signature = *s;
  }
  return true;
}

bool Executor::GroupCall::TakeNumber() {
  std::vector<Executor*> by_address(executors_.begin(), executors_.end());
  std::sort(by_address.begin(), by_address.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(n_);
  for (Executor* ex : by_address) locks.emplace_back(ex->mu_);
  seq_ = executors_[0]->next_seq_;
  for (Executor* ex : executors_)
    if (!ex->error_.ok() || !ex->queue_.empty() || ex->pending_ > 0 || ex->next_seq_ != seq_) return false;
  for (Executor* ex : executors_) ++ex->next_seq_;
  return true;
}

void Executor::GroupCall::GatherBuffers() {
  inputs_.resize(n_);
  outputs_.resize(n_);
  for (size_t r = 0; r < n_; ++r) {
    const OperationMember& m = (*members_[static_cast<size_t>(order_[r])])[0];
    inputs_[r] = m.input;
    outputs_[r] = m.output;
  }
}

Status Executor::GroupCall::FailAll(Status s, size_t r) const {
  s = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}, {} by the thread that grouped the "
                                "calls",
                                seq_, r, request(r).ToString(), cpu_ ? "run" : "enqueued"));
  for (Executor* ex : executors_) ex->Fail(s);
  return s;
}

Result<bool> Executor::GroupCall::RunOnCpu() {
  for (size_t r = 0; r < n_; ++r)
    if (Status s = RunFusedPartOnCpu(request(r), static_cast<int>(r), bounds(r), inputs_, outputs_); !s.ok())
      return FailAll(s, r);
  return true;
}

Result<bool> Executor::GroupCall::EnqueueOnStreams() {
  if (!ex(0).group_on_streams_logged_) {
    ex(0).group_on_streams_logged_ = true;
    KZ_INFO(kLogColl, "{} ranks' fused calls grouped by one thread: each rank's part goes on its own stream, ordered "
                      "by events between the streams (no executor thread, no held stream); first: {}",
            n_, request(0).ToString());
  }
  // 1. Where each caller's stream reached the call: its input is ready, its output free.
  for (size_t r = 0; r < n_; ++r)
    if (Status s = stream(r).Record(*ex(r).group_ready_); !s.ok()) return FailAll(s, r);
  // 2. Each part once every rank's stream has reached the call (it reads every input and writes
  //    every output), then where it is done.
  for (size_t r = 0; r < n_; ++r) {
    Status s;
    for (size_t q = 0; q < n_ && s.ok(); ++q)
      if (q != r) s = stream(r).Wait(*ex(q).group_ready_);
    if (s.ok()) s = EnqueueFusedPart(request(r), static_cast<int>(r), bounds(r), inputs_, outputs_, stream(r));
    if (s.ok()) s = stream(r).Record(*ex(r).group_done_);
    if (!s.ok()) return FailAll(s, r);
  }
  // 3. Each stream's later work after every part: the others write into its output and read its
  //    input until then.
  for (size_t r = 0; r < n_; ++r)
    for (size_t q = 0; q < n_; ++q)
      if (q != r)
        if (Status s = stream(r).Wait(*ex(q).group_done_); !s.ok()) return FailAll(s, r);
  return true;
}

Result<bool> Executor::TryInlineGroup(std::span<Executor* const> executors,
                                      std::span<const std::vector<OperationMember>* const> members,
                                      std::span<device::Stream* const> streams) {
  GroupCall call(executors, members, streams);
  if (!call.Matches() || !call.TakeNumber()) return false;
  call.GatherBuffers();
  return call.cpu() ? call.RunOnCpu() : call.EnqueueOnStreams();
}

}  // namespace kizuna::collectives
