// The executor's direct path: operations whose plan is a single-host direct algorithm (fused.cc)
// run here instead of through steps and the transport. The ranks of one process meet in their
// DirectGroup: each publishes its buffer addresses, reduces its slice of every rank's input into
// that slice of every rank's output with one device operation (on the emulated device: on the
// executor's thread), waits for it, and waits for every other rank to have done the same before
// its held stream continues (another rank writes into this rank's output until then).
#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "collectives/executor_internal.h"
#include "runtime/host_reduce.h"
#include "runtime/logging.h"

namespace kizuna::collectives {


namespace {

// Enqueues rank `rank`'s part of a fused operation on `stream`, given every rank's buffers
// (fused.cc says who does what).
template <typename Sink>
Status DirectPart(const CollectiveRequest& req, int rank, std::span<const void* const> inputs,
                  std::span<void* const> outputs, Sink& stream) {
  const size_t elem = DataTypeSize(req.dtype);
  const auto n = static_cast<size_t>(req.nranks);
  const auto me = static_cast<size_t>(rank);
  const auto root = static_cast<size_t>(req.root);
  auto at = [elem](const void* p, uint64_t elements) {
    return const_cast<uint8_t*>(static_cast<const uint8_t*>(p)) + elements * elem;
  };
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce: {
      const auto [offset, count] = FusedSlice(req.count, req.nranks, rank);
      if (count == 0) return Status::Ok();
      for (size_t q = 0; q < n; ++q) {
        srcs.push_back(at(inputs[q], offset));
        if (req.collective == Collective::kAllReduce) dsts.push_back(at(outputs[q], offset));
      }
      if (req.collective == Collective::kReduce) dsts.push_back(at(outputs[root], offset));
      return stream.ReduceMulti(dsts, srcs, count, req.dtype, req.op);
    }
    case Collective::kReduceScatter: {
      if (req.count == 0) return Status::Ok();
      for (size_t q = 0; q < n; ++q) srcs.push_back(at(inputs[q], me * req.count));
      dsts.push_back(outputs[me]);
      return stream.ReduceMulti(dsts, srcs, req.count, req.dtype, req.op);
    }
    case Collective::kAllGather: {
      // Pushed, not pulled: block r of every output is this rank's input, read once for all n.
      if (req.count == 0) return Status::Ok();
      for (size_t q = 0; q < n; ++q) {
        uint8_t* dst = at(outputs[q], me * req.count);
        if (dst != inputs[me]) dsts.push_back(dst);
      }
      return stream.CopyMulti(dsts, inputs[me], req.count * elem);
    }
    case Collective::kBroadcast: {
      const auto [offset, count] = FusedSlice(req.count, req.nranks, rank);
      if (count == 0) return Status::Ok();
      const uint8_t* src = at(inputs[root], offset);
      for (size_t q = 0; q < n; ++q) {
        uint8_t* dst = at(outputs[q], offset);
        if (dst != src) dsts.push_back(dst);
      }
      return stream.CopyMulti(dsts, src, count * elem);
    }
    case Collective::kBarrier:
      return Status::Ok();  // the rendezvous around the part is the barrier
    default:
      return Internal(fmt::format("fused does not run {}", req.ToString()));
  }
}

// Where a fused part goes: onto a device stream, or straight to the CPU (host-accessible memory,
// run on the calling thread).
struct HostSink {
  Status ReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                     ReduceOp op) {
    return HostReduceMulti(dsts, srcs, count, type, op);
  }
  Status Copy(void* dst, const void* src, size_t bytes) {
    HostCopy(dst, src, bytes);
    return Status::Ok();
  }
  Status CopyMulti(std::span<void* const> dsts, const void* src, size_t bytes) {
    HostCopyMulti(dsts, src, bytes);
    return Status::Ok();
  }
};

// A device stream as DirectPart's sink: one copy per output.
struct StreamSink {
  device::Stream& stream;
  Status ReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                     ReduceOp op) {
    return stream.ReduceMulti(dsts, srcs, count, type, op);
  }
  Status Copy(void* dst, const void* src, size_t bytes) { return stream.Copy(dst, src, bytes); }
  Status CopyMulti(std::span<void* const> dsts, const void* src, size_t bytes) {
    for (void* dst : dsts) KZ_RETURN_IF_ERROR(stream.Copy(dst, src, bytes));
    return Status::Ok();
  }
};

Status EnqueueDirectPart(const CollectiveRequest& req, int rank, std::span<const void* const> inputs,
                         std::span<void* const> outputs, device::Stream& stream) {
  StreamSink sink{stream};
  return DirectPart(req, rank, inputs, outputs, sink);
}

Status HostDirectPart(const CollectiveRequest& req, int rank, std::span<const void* const> inputs,
                      std::span<void* const> outputs) {
  HostSink sink;
  return DirectPart(req, rank, inputs, outputs, sink);
}

// The bytes of this rank's input and output that a fused operation touches (the root's buffer
// alone matters for Broadcast's input and Reduce's output).
std::pair<uint64_t, uint64_t> DirectBytes(const CollectiveRequest& req, int rank) {
  const uint64_t elem = DataTypeSize(req.dtype);
  uint64_t in = req.input_count() * elem, out = req.output_count() * elem;
  if (req.collective == Collective::kBroadcast && rank != req.root) in = 0;
  if (req.collective == Collective::kReduce && rank != req.root) out = 0;
  return {in, out};
}

// A device whose streams are the host's CPUs over memory the CPU reaches (the emulated device,
// unthrottled: a throttled one paces its streams' work): a rank's part may run on any thread, as
// the stream's thread would run it.
bool CpuDoesParts(const device::DeviceProperties& props) {
  const bool throttled = props.copy_gbps > 0 || props.reduce_gbps > 0 || props.launch_latency_us > 0;
  return props.host_compute && props.host_accessible && !throttled;
}

}  // namespace

// ---- DirectGroup ----

DirectGroup::DirectGroup(int nranks) : nranks_(nranks) {}

void DirectGroup::Fail(const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (!failure_.ok()) return;
    failure_ = why;
  }
  cv_.notify_all();
}

Status DirectGroup::WaitLocked(std::unique_lock<std::mutex>& lock, uint64_t seq, bool finish, Deadline deadline,
                               const std::atomic<bool>& abort) {
  const char* what = finish ? "finish" : "arrive at";
  while (true) {
    if (!failure_.ok()) return Aborted(fmt::format("another rank of this process failed: {}", failure_.ToString()));
    Slot& s = slots_[seq];
    if ((finish ? s.nfinished : s.npublished) == nranks_) return Status::Ok();
    if (abort.load()) return Aborted("the communicator was aborted");
    if (deadline.Expired()) {
      std::string missing;
      const std::vector<char>& seen = finish ? s.finished : s.published;
      for (int r = 0; r < nranks_; ++r)
        if (!seen[static_cast<size_t>(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      return Timeout(fmt::format("operation {}: rank(s) {} of this process did not {} the fused collective by the "
                                 "deadline",
                                 seq, missing, what));
    }
    // Bounded slices so that an abort flag set without a notification is seen.
    cv_.wait_for(lock, std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(10), deadline.Remaining()));
  }
}

DirectGroup::Slot& DirectGroup::SlotFor(uint64_t seq) {
  Slot& s = slots_[seq];
  if (s.entries.empty()) {
    s.entries.resize(static_cast<size_t>(nranks_));
    s.published.assign(static_cast<size_t>(nranks_), 0);
    s.finished.assign(static_cast<size_t>(nranks_), 0);
    s.events.assign(static_cast<size_t>(nranks_), nullptr);
  }
  return s;
}

int DirectGroup::PublishLocked(uint64_t seq, int rank, const Entry& entry) {
  Slot& s = SlotFor(seq);
  if (!s.published[static_cast<size_t>(rank)]) {
    s.entries[static_cast<size_t>(rank)] = entry;
    s.published[static_cast<size_t>(rank)] = 1;
    s.any_direct = s.any_direct || entry.direct;
    ++s.npublished;
    cv_.notify_all();
  }
  for (int q = 0; q < nranks_; ++q)
    if (s.published[static_cast<size_t>(q)] && s.entries[static_cast<size_t>(q)].signature != entry.signature)
      return q;
  return -1;
}

void DirectGroup::Publish(uint64_t seq, int rank, uint64_t signature, std::string call) {
  std::lock_guard lock(mu_);
  PublishLocked(seq, rank, Entry{nullptr, nullptr, signature, false, std::move(call)});
  // Nobody waits on an operation that no rank runs fused: forget it once every rank has been.
  Slot& s = slots_[seq];
  if (s.npublished == nranks_ && !s.any_direct) slots_.erase(seq);
}

Result<std::vector<DirectGroup::Entry>> DirectGroup::Exchange(uint64_t seq, int rank, const Entry& entry,
                                                              Deadline deadline, const std::atomic<bool>& abort) {
  std::unique_lock lock(mu_);
  while (true) {
    const int other = PublishLocked(seq, rank, entry);
    if (other >= 0)
      return InvalidArgument(fmt::format("collective mismatch between ranks: rank {} is at operation {}: {}; rank {} "
                                         "is at operation {}: {}",
                                         rank, seq, entry.call, other, seq,
                                         slots_[seq].entries[static_cast<size_t>(other)].call));
    if (slots_[seq].npublished == nranks_) break;
    // Wait a slice for more ranks (each one's arrival is checked against this rank's signature).
    if (!failure_.ok()) return Aborted(fmt::format("another rank of this process failed: {}", failure_.ToString()));
    if (abort.load()) return Aborted("the communicator was aborted");
    if (deadline.Expired()) return WaitLocked(lock, seq, /*finish=*/false, deadline, abort);  // names the missing
    cv_.wait_for(lock, std::min<std::chrono::nanoseconds>(std::chrono::milliseconds(10), deadline.Remaining()));
  }
  return slots_[seq].entries;
}

Result<std::vector<device::Event*>> DirectGroup::Finish(uint64_t seq, int rank, device::Event* done,
                                                             Deadline deadline, const std::atomic<bool>& abort) {
  std::unique_lock lock(mu_);
  Slot& s = slots_[seq];
  if (s.finished.empty()) return Internal(fmt::format("operation {}: finish before exchange", seq));
  if (!s.finished[static_cast<size_t>(rank)]) {
    s.finished[static_cast<size_t>(rank)] = 1;
    s.events[static_cast<size_t>(rank)] = done;
    if (++s.nfinished == nranks_) cv_.notify_all();
  }
  KZ_RETURN_IF_ERROR(WaitLocked(lock, seq, /*finish=*/true, deadline, abort));
  std::vector<device::Event*> events = slots_[seq].events;
  // The last rank to leave forgets the operation.
  if (++slots_[seq].departed == nranks_) slots_.erase(seq);
  return events;
}

// ---- Executor::RunDirect ----

Status Executor::DirectStream() {
  if (streams_.empty()) {
    KZ_ASSIGN_OR_RETURN(auto s, device_->CreateStream());
    streams_.push_back(std::move(s));
  }
  return Status::Ok();
}

Status Executor::RunDirect(Operation& op, Deadline deadline) {
  if (options_.host_group) return RunHostDirect(op, deadline);
  DirectGroup* group = options_.direct_group.get();
  const OperationMember& m = op.members[0];
  const Plan& plan = *m.plan;
  const CollectiveRequest& req = plan.request;
  if (group == nullptr || group->nranks() != req.nranks)
    return Internal(fmt::format("operation {}: a {} plan on a communicator without an in-process group", op.seq,
                                AlgorithmName(plan.algorithm)));
  const int rank = options_.rank;
  DirectGroup::Entry mine{m.input, m.output, op.header.signature, true, req.ToString()};
  auto exchanged = group->Exchange(op.seq, rank, mine, deadline, abort_);
  if (!exchanged.ok()) return exchanged.status();
  const std::vector<DirectGroup::Entry>& all = *exchanged;
  auto failed = [&](const Status& s) {
    Status f = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}", op.seq, rank, req.ToString()));
    group->Fail(f);
    return f;
  };
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (const DirectGroup::Entry& e : all) {
    inputs.push_back(e.input);
    outputs.push_back(e.output);
  }
  // Where the CPU does the parts (CpuDoesParts), this thread does this rank's itself, and the
  // operation is done for this rank once every rank's part is. Two thread hand-offs fewer per
  // call (to the stream's thread and back; 8-byte AllReduce of 2 in-process ranks 151-204 ->
  // 135-140 us on the 2-core VM). A rank that published no event finished its part before
  // publishing; the events of ranks that went through their streams are waited for here.
  if (CpuDoesParts(device_->properties())) {
    if (Status s = HostDirectPart(req, rank, inputs, outputs); !s.ok()) return failed(s);
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
  if (Status s = EnqueueDirectPart(req, rank, inputs, outputs, stream); !s.ok()) return failed(s);
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
  HostGroup& group = *options_.host_group;
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
    if (Status s = group.OneShot(op.seq, op.header.signature, req, m.input, m.output, deadline, abort_); !s.ok())
      return failed(s);
    return Status::Ok();
  }
  const auto [in_bytes, out_bytes] = DirectBytes(req, rank);
  auto buffers = group.Exchange(op.seq, op.header.signature, req, m.input, in_bytes, m.output, out_bytes, deadline,
                                abort_);
  if (!buffers.ok()) return failed(buffers.status());
  if (Status s = DirectStream(); !s.ok()) return failed(s);
  device::Stream& stream = *streams_[0];
  if (Status s = EnqueueDirectPart(req, rank, buffers->inputs, buffers->outputs, stream); !s.ok()) return failed(s);
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
  if (!options_.host_group || members.size() != 1) return false;
  const OperationMember& m = members[0];
  const CollectiveRequest& req = m.plan->request;
  HostGroup& group = *options_.host_group;
  if (m.plan->algorithm != Algorithm::kFused || !group.host_accessible() || !group.one_rank_per_process()) return false;
  // The caller's stream must have nothing queued: then the inputs are ready now, and running the
  // operation before returning orders it before whatever the caller enqueues next.
  auto idle = stream.Query();
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
  group.ReleaseRetired();  // nothing of this rank in flight, no stream held (HostGroup::ReleaseRetired)
  const Deadline deadline = Deadline::AfterSecondsCoarse(options_.timeout_s);
  // Ranks outnumbering the CPUs each do their part on this thread alone.
  const ScopedSerialHostWork serial(group.oversubscribed());
  Status s;
  if (group.UsesOneShot(req)) {
    s = group.OneShot(seq, signature, req, m.input, m.output, deadline, abort_);
  } else if (host_memory) {
    s = group.Staged(seq, signature, req, m.input, m.output, deadline, abort_);
  } else {
    // The same protocol as RunHostDirect, with the CPU doing this rank's part.
    const auto [in_bytes, out_bytes] = DirectBytes(req, options_.rank);
    auto buffers = group.Exchange(seq, signature, req, m.input, in_bytes, m.output, out_bytes, deadline,
                                  abort_);
    s = buffers.ok() ? HostDirectPart(req, options_.rank, buffers->inputs, buffers->outputs) : buffers.status();
    if (s.ok()) s = group.Finish(seq, deadline, abort_);
  }
  if (!s.ok()) {
    s = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}", seq, options_.rank, req.ToString()));
    Fail(s);
    return s;
  }
  return true;
}

// ---- Executor::TryInlineGroup ----

Result<bool> Executor::TryInlineGroup(std::span<Executor* const> executors,
                                      std::span<const std::vector<OperationMember>* const> members,
                                      std::span<device::Stream* const> streams) {
  const size_t n = executors.size();
  DirectGroup* group = executors[0]->options_.direct_group.get();
  if (group == nullptr || static_cast<size_t>(group->nranks()) != n) return false;
  // Every rank of the group once, each with one fused call; the CPU does every part (on idle
  // streams) or the devices do every part.
  std::vector<int> order(n, -1);  // order[rank]: its index in executors
  const bool cpu = CpuDoesParts(executors[0]->device_->properties());
  for (size_t i = 0; i < n; ++i) {
    Executor& ex = *executors[i];
    const auto rank = static_cast<size_t>(ex.options_.rank);
    if (ex.options_.direct_group.get() != group || rank >= n || order[rank] >= 0) return false;
    order[rank] = static_cast<int>(i);
    if (members[i]->size() != 1 || (*members[i])[0].plan->algorithm != Algorithm::kFused) return false;
    if (CpuDoesParts(ex.device_->properties()) != cpu) return false;
    if (cpu) {
      auto idle = streams[i]->Query();
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
  // The same call on every rank; otherwise the usual path reports the mismatch.
  uint64_t signature = 0;
  for (size_t i = 0; i < n; ++i) {
    auto s = executor_internal::OperationSignature(*members[i]);
    if (!s.ok() || (i > 0 && *s != signature)) return false;
    signature = *s;
  }
  // Every executor idle and at the same operation: each takes its next number, all at once.
  std::vector<Executor*> by_address(executors.begin(), executors.end());
  std::sort(by_address.begin(), by_address.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(n);
  for (Executor* ex : by_address) locks.emplace_back(ex->mu_);
  const uint64_t seq = executors[0]->next_seq_;
  for (Executor* ex : executors)
    if (!ex->error_.ok() || !ex->queue_.empty() || ex->pending_ > 0 || ex->next_seq_ != seq) return false;
  for (Executor* ex : executors) ++ex->next_seq_;
  locks.clear();
  std::vector<const void*> inputs(n);
  std::vector<void*> outputs(n);
  for (size_t r = 0; r < n; ++r) {
    const OperationMember& m = (*members[static_cast<size_t>(order[r])])[0];
    inputs[r] = m.input;
    outputs[r] = m.output;
  }
  auto fail = [&](Status s, size_t r, const CollectiveRequest& req) -> Status {
    s = s.WithContext(fmt::format("operation {}: rank {}'s part of a fused {}, {} by the thread that grouped the "
                                  "calls",
                                  seq, r, req.ToString(), cpu ? "run" : "enqueued"));
    for (Executor* ex : executors) ex->Fail(s);
    return s;
  };
  auto request = [&](size_t r) -> const CollectiveRequest& {
    return (*members[static_cast<size_t>(order[r])])[0].plan->request;
  };
  if (cpu) {
    for (size_t r = 0; r < n; ++r)
      if (Status s = HostDirectPart(request(r), static_cast<int>(r), inputs, outputs); !s.ok())
        return fail(s, r, request(r));
    return true;
  }
  // The devices do the parts, each rank's on its caller's stream (where rank r's later work goes).
  auto stream = [&](size_t r) -> device::Stream& { return *streams[static_cast<size_t>(order[r])]; };
  auto ex = [&](size_t r) -> Executor& { return *executors[static_cast<size_t>(order[r])]; };
  if (!ex(0).group_on_streams_logged_) {
    ex(0).group_on_streams_logged_ = true;
    KZ_INFO(kLogColl, "{} ranks' fused calls grouped by one thread: each rank's part goes on its own stream, ordered "
                      "by events between the streams (no executor thread, no held stream); first: {}",
            n, request(0).ToString());
  }
  // 1. Where each caller's stream reached the call: its input is ready, its output free.
  for (size_t r = 0; r < n; ++r)
    if (Status s = stream(r).Record(*ex(r).group_ready_); !s.ok()) return fail(s, r, request(r));
  // 2. Each part once every rank's stream has reached the call (it reads every input and writes
  //    every output), then where it is done.
  for (size_t r = 0; r < n; ++r) {
    Status s;
    for (size_t q = 0; q < n && s.ok(); ++q)
      if (q != r) s = stream(r).Wait(*ex(q).group_ready_);
    if (s.ok()) s = EnqueueDirectPart(request(r), static_cast<int>(r), inputs, outputs, stream(r));
    if (s.ok()) s = stream(r).Record(*ex(r).group_done_);
    if (!s.ok()) return fail(s, r, request(r));
  }
  // 3. Each stream's later work after every part: the others write into its output and read its
  //    input until then.
  for (size_t r = 0; r < n; ++r)
    for (size_t q = 0; q < n; ++q)
      if (q != r)
        if (Status s = stream(r).Wait(*ex(q).group_done_); !s.ok()) return fail(s, r, request(r));
  return true;
}

}  // namespace kizuna::collectives
