#include "collectives/executor/executor.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "collectives/executor/internal.h"
#include "runtime/device/host_reduce.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {

using namespace executor_internal;  // the executor's own constants and control messages

// ---------------------------------------------------------------------------------------------
// The executor

std::atomic<int> Executor::live_executors_{0};

Executor::Executor(Transport* transport, device::Device* device, const ExecutorOptions& options)
    : transport_(transport), device_(device), options_(options) {
  live_executors_.fetch_add(1, std::memory_order_relaxed);
  tracer_ = Tracer::Open(options.trace_file, options.rank);
  control_ = std::make_unique<ControlState>();
  control_->recv.resize(static_cast<size_t>(transport->nranks()));
  control_->gone.resize(static_cast<size_t>(transport->nranks()));
  // The fused path's waits say what they wait on, as the plans' do (kizuna-status, the dumps).
  for (const auto& group : {options_.same_host, options_.host_group})
    if (group)
      group->set_stall_report([this](std::string what) { recorder_.Waiting(record_ticket_, std::move(what)); });
  if (options_.host_group)
    options_.host_group->set_while_waiting([this] {
      if (host_waits_move_fabric_.load(std::memory_order_relaxed)) MoveFabricWhileWaiting();
    });
}

Result<std::unique_ptr<Executor>> Executor::Create(Transport* transport, device::Device* device,
                                                   const ExecutorOptions& options) {
  if (transport == nullptr || device == nullptr) return InvalidArgument("executor: null transport or device");
  if (options.window < 2) return InvalidArgument(fmt::format("executor: window {} (at least 2)", options.window));
  if (!(options.timeout_s > 0)) return InvalidArgument("executor: timeout must be positive");
  if (transport->nranks() > 1 && transport->control_bytes() < kControlSlotBytes)
    return InvalidArgument(fmt::format("executor: control buffers of {} bytes (at least {})",
                                       transport->control_bytes(), kControlSlotBytes));
  std::unique_ptr<Executor> ex(new Executor(transport, device, options));
  ex->thread_ = std::thread([e = ex.get()] { e->Loop(); });
  return ex;
}

Executor::~Executor() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const auto& group : {options_.same_host, options_.host_group})
    if (group) group->set_stall_report(nullptr);  // the group may outlive this executor
  if (options_.host_group) options_.host_group->set_while_waiting(nullptr);
  live_executors_.fetch_sub(1, std::memory_order_relaxed);
  {
    std::lock_guard run(run_mu_);
    ReleaseRegions(0);
  }
  // Control receives and header sends still posted are released with the comms (the
  // transport's); nothing here refers to them after this point.
  for (auto& s : streams_) s->Synchronize(Deadline::AfterSeconds(10)).IgnoreError();
}

void Executor::DumpRecorder() {
  if (options_.dump_on_timeout.empty()) return;
  const std::string path = ExpandPathPattern(options_.dump_on_timeout, options_.rank);
  const std::string json = recorder_.ToJson(options_.rank);
  bool written = false;
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    written = std::fwrite(json.data(), 1, json.size(), f) == json.size();
    written = std::fclose(f) == 0 && written;
  }
  if (written) {
    KZ_WARN(kLogColl, "rank {}: an operation timed out; its last operations are in {} (KIZUNA_DUMP_ON_TIMEOUT)",
            options_.rank, path);
  } else {
    KZ_WARN(kLogColl, "rank {}: KIZUNA_DUMP_ON_TIMEOUT: cannot write {}: {}", options_.rank, path,
            std::strerror(errno));
  }
}

uint64_t Executor::Register(const void* base, size_t bytes) {
  std::lock_guard lock(regions_mu_);
  const uint64_t id = next_region_++;
  regions_.push_back(Region{id, reinterpret_cast<uintptr_t>(base), bytes});
  return id;
}

Status Executor::Deregister(uint64_t id) {
  {
    std::lock_guard lock(regions_mu_);
    const auto it = std::find_if(regions_.begin(), regions_.end(), [&](const Region& r) { return r.id == id; });
    if (it == regions_.end()) return InvalidArgument(fmt::format("no registered buffer has handle {}", id));
    regions_.erase(it);
  }
  // The running operation may be sending from the region: its registrations go after it.
  std::lock_guard run(run_mu_);
  ReleaseRegions(id);
  return Status::Ok();
}

std::optional<Executor::Region> Executor::RegionOf(const void* p, size_t bytes) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(regions_mu_);
  for (const Region& r : regions_)
    if (a >= r.base && a - r.base <= r.bytes && bytes <= r.bytes - (a - r.base)) return r;
  return std::nullopt;
}

Result<fabric::Registration*> Executor::RegionRegistration(fabric::Comm& comm, const Region& region) {
  fabric::Registration*& reg = region_regs_[{&comm, region.id}];
  if (reg == nullptr) {
    Result<fabric::Registration*> made =
        comm.Register(fabric::MemoryDescriptor::Host(reinterpret_cast<void*>(region.base), region.bytes));
    if (!made.ok()) {
      region_regs_.erase({&comm, region.id});
      return made.status().WithContext("registering a registered buffer with the fabric");
    }
    reg = *made;
  }
  registered_transfers_.fetch_add(1, std::memory_order_relaxed);
  return reg;
}

// A direct step's registration: its own, released after it; a registered region's, kept.
Status Executor::Run::Unregister(const ChannelRun& ch, StepState& st) {
  if (st.registration == nullptr) return Status::Ok();
  if (st.region) {  // the region's, kept for its next transfer
    st.registration = nullptr;
    st.region = false;
    return Status::Ok();
  }
  const Step& step = (*ch.steps)[static_cast<size_t>(&st - ch.states.data())];
  Transport::Peer* p = tr_.peer(step.peer);
  fabric::Comm& comm = step.kind == StepKind::kSend ? static_cast<fabric::Comm&>(*p->send)
                                                    : static_cast<fabric::Comm&>(*p->recv);
  fabric::Registration* r = st.registration;
  st.registration = nullptr;
  return comm.Deregister(r);
}

void Executor::ReleaseRegions(uint64_t id) {
  for (auto it = region_regs_.begin(); it != region_regs_.end();) {
    if (id != 0 && it->first.second != id) {
      ++it;
      continue;
    }
    // Connections closed after a failure took their registrations with them.
    if (!closed_) it->first.first->Deregister(it->second).IgnoreError();
    it = region_regs_.erase(it);
  }
}

size_t Executor::slot_bytes_for(int total_channels, size_t chunk_bytes) const {
  const size_t slots = static_cast<size_t>(std::max(total_channels, 1)) * static_cast<size_t>(options_.window);
  size_t bytes = transport_->staging_bytes() / slots;
  const size_t cap = transport_->network() ? kNetworkChunkBytes : kDefaultChunkBytes;
  bytes = std::min(bytes, chunk_bytes > 0 ? chunk_bytes : cap);
  bytes = bytes / kMinSlotBytes * kMinSlotBytes;
  return bytes;
}

size_t Executor::P2pStagingBytes(int nranks, size_t staging_bytes) {
  // The most point-to-point channels active at once: a send and a receive per peer (a pair's
  // transfers run one after the other), of two channels each (a large transfer's). What sets the
  // chunk; the transport's region holds what an operation's channels use.
  const size_t channels = 4 * static_cast<size_t>(std::max(nranks - 1, 1));
  return std::max(staging_bytes / 2, channels * kP2pWindow * kMinP2pChunkBytes);
}

size_t Executor::p2p_chunk_bytes() const {
  const size_t channels = 4 * static_cast<size_t>(std::max(transport_->nranks() - 1, 1));
  size_t bytes = options_.p2p_staging_bytes / (channels * kP2pWindow);
  bytes = std::min(bytes, options_.chunk_bytes > 0 ? options_.chunk_bytes : kDefaultChunkBytes);
  return std::max(bytes / kMinSlotBytes * kMinSlotBytes, kMinSlotBytes);
}

Status Executor::FillHeader(Operation& op, int* total_channels) {
  return executor_internal::FillHeader(op.members, &op.header, total_channels);
}

uint64_t PlanSignature(const Plan& plan) { return executor_internal::MemberSignature(plan); }

Result<uint64_t> executor_internal::OperationSignature(const std::vector<OperationMember>& members) {
  uint64_t signature = 0xcbf29ce484222325ull;
  // Point-to-point members differ between ranks by nature (rank 0 sends to 1 while 1 receives
  // from 0): they are checked pairwise, by the receiver comparing the bytes that arrive with the
  // bytes it expects, and stay out of the signature, which must be equal on every rank.
  for (const OperationMember& m : members) {
    if (!m.plan || m.plan->ranks.size() != 1) return Internal("an operation member without this rank's plan");
    if (!IsPointToPoint(m.plan->request.collective))
      signature = Mix(signature, m.plan->signature != 0 ? m.plan->signature : MemberSignature(*m.plan));
  }
  return signature;
}

Status executor_internal::FillHeader(const std::vector<OperationMember>& members, ControlMessage* header,
                                     int* total_channels) {
  KZ_ASSIGN_OR_RETURN(const uint64_t signature, OperationSignature(members));
  *total_channels = 0;
  const OperationMember* described = nullptr;
  for (const OperationMember& m : members) {
    if (IsPointToPoint(m.plan->request.collective)) continue;  // their slots are point-to-point's
    if (described == nullptr) described = &m;
    *total_channels += static_cast<int>(m.plan->ranks[0].channels.size());
  }
  if (described == nullptr) described = &members[0];
  const Plan& first = *described->plan;
  ControlMessage& h = *header;
  h.signature = signature;
  h.members = static_cast<uint32_t>(members.size());
  h.collective = static_cast<uint8_t>(first.request.collective);
  h.dtype = static_cast<uint8_t>(first.request.dtype);
  h.op = static_cast<uint8_t>(first.request.op);
  h.algorithm = static_cast<uint8_t>(first.algorithm);
  h.root = first.request.root;
  h.nranks = first.request.nranks;
  h.count = first.request.count;
  h.chunk_count = first.chunk_count;
  h.channels = static_cast<uint32_t>(first.channels);
  return Status::Ok();
}

Result<std::shared_ptr<Executor::Operation>> Executor::NewOperation(std::vector<OperationMember> members,
                                                                    size_t slot_bytes) {
  auto op = std::make_shared<Operation>();
  op->members = std::move(members);
  KZ_RETURN_IF_ERROR(InitOperation(*op, slot_bytes));
  return op;
}

Status Executor::InitOperation(Operation& op, size_t slot_bytes) {
  if (op.members.empty()) return InvalidArgument("an operation with no collective");
  const bool collective = std::any_of(op.members.begin(), op.members.end(), [](const OperationMember& m) {
    return m.plan && !IsPointToPoint(m.plan->request.collective);
  });
  if (collective && slot_bytes < kMinSlotBytes)
    return InvalidArgument(fmt::format("staging slots of {} bytes (at least {}): too many channels for the staging "
                                       "buffer",
                                       slot_bytes, kMinSlotBytes));
  op.slot_bytes = slot_bytes;
  int total_channels = 0;
  KZ_RETURN_IF_ERROR(FillHeader(op, &total_channels));
  const size_t slots =
      collective ? static_cast<size_t>(std::max(total_channels, 1)) * static_cast<size_t>(options_.window) : 0;
  const size_t collectives_part = transport_->staging_bytes();
  if (slots * slot_bytes > collectives_part)
    return Internal(fmt::format("{} slots of {} bytes exceed the collectives' staging of {} bytes", slots, slot_bytes,
                                collectives_part));
  op.slots = static_cast<int>(slots);
  return Status::Ok();
}

Result<bool> Executor::TryOnCaller(const std::vector<OperationMember>& members, device::Stream& stream,
                                   size_t slot_bytes) {
  if (options_.serve || options_.same_process || members.size() != 1) return false;
  const Plan& plan = *members[0].plan;
  const CollectiveRequest& req = plan.request;
  // The plans of one host's processes run here too (4 processes on 2 CPUs, 8-byte ring: 56-64 us
  // against 85-100 us through the executor's thread); the fused one has a path of its own.
  if (IsPointToPoint(req.collective) || plan.algorithm == Algorithm::kFused || !CpuSteps(device_->properties()))
    return false;
  const uint64_t elems = std::max(req.input_count(), req.output_count());
  if (elems * DataTypeSize(req.dtype) > CallerOpBytes(*transport_)) return false;
  // Another rank of this process (another communicator's) may need this thread to make its call
  // before this one can complete; an executor of its own makes no such demand.
  if (live_executors_.load(std::memory_order_relaxed) != 1) return false;
  auto idle = stream.Idle();
  if (!idle.ok() || !*idle) return false;
  std::unique_lock run(run_mu_, std::try_to_lock);
  if (!run.owns_lock()) {
    // With nothing queued, the executor's thread holds it only for a look at its connections and
    // probes (every kIdlePoll while idle): wait for that rather than hand this call over. A call
    // handed over makes the next one find it queued and go the same way, and calls made back to
    // back then never come back to this thread (2 x 1 namespace hosts, 8 bytes back to back: 84 us
    // per call instead of 25 once one call missed the lock).
    {
      std::lock_guard lock(mu_);
      if (!queue_.empty() || pending_ > 0) return false;
    }
    run.lock();
  }
  // The caller's operation is over when this returns: one object serves them all, its storage kept.
  if (!caller_op_) caller_op_ = std::make_unique<Operation>();
  Operation& op = *caller_op_;
  op.members.assign(members.begin(), members.end());
  op.header = ControlMessage{};
  KZ_RETURN_IF_ERROR(InitOperation(op, slot_bytes));
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return Aborted(fmt::format("the communicator failed earlier: {}", error_.ToString()));
    if (!queue_.empty() || pending_ > 0) return false;  // earlier work goes first, on the executor's thread
    op.seq = op.header.seq = next_seq_++;
    ++pending_;
  }
  op.inputs_ready = true;
  op.cpu_step_bytes = CallerOpBytes(*transport_);
  // No operation of this rank is in flight and its streams are idle: memory its host's group
  // stopped using may be freed (SameHostGroup::ReleaseRetired).
  if (options_.host_group) options_.host_group->ReleaseRetired();
  if (!on_caller_logged_) {
    on_caller_logged_ = true;
    KZ_INFO(kLogColl, "rank {}: collectives up to {} KiB run on the calling thread (the first: {})", options_.rank,
            CallerOpBytes(*transport_) >> 10, req.ToString());
  }
  const Status status = RunOperation(op, RunPath::kCaller);
  {
    std::lock_guard lock(mu_);
    --pending_;  // no one waits for it: the executor's thread wakes for the queue
  }
  if (!status.ok()) return status;
  return true;
}

size_t Executor::caller_op_bytes() const { return CpuSteps(device_->properties()) ? CallerOpBytes(*transport_) : 0; }

size_t Executor::ScratchBytes(const Plan& plan) {
  return (plan.ranks[0].scratch_count * DataTypeSize(plan.request.dtype) + 255) / 256 * 256;
}

Status Executor::EnsureScratch(size_t bytes) {
  if (bytes == 0 || (scratch_ && scratch_->size() >= bytes)) return Status::Ok();
  // The old buffer is kept until the executor goes away: freeing device memory can wait for the
  // whole device (CUDA), and the caller's stream — held until this operation is done — is part
  // of it. Growth at least doubles, so the kept buffers add up to less than the current one.
  if (scratch_) {
    bytes = std::max(bytes, 2 * scratch_->size());
    retired_scratch_.push_back(std::move(scratch_));
  }
  KZ_ASSIGN_OR_RETURN(scratch_, device_->Allocate(bytes));
  return Status::Ok();
}

Status Executor::RunOperation(Operation& op, RunPath path) {
  const OperationMember& first = op.members[0];
  const bool direct = op.members.size() == 1 && op.members[0].plan->algorithm == Algorithm::kFused;
  const bool host_fused = std::any_of(op.members.begin(), op.members.end(),
                                      [](const OperationMember& m) { return IsHostFused(m.plan->algorithm); });
  std::optional<Run> run;
  if (!direct && !host_fused) run.emplace(*this, op, op.slot_bytes, op.slots);
  const bool straight = run && run->Straight();
  const uint64_t ticket = recorder_.Begin(op.seq, first.plan->request, first.plan->algorithm,
                                          static_cast<int>(op.members.size()), path, straight);
  const uint64_t traced_from = tracer_ ? Tracer::NowUs() : 0;
  record_ticket_ = ticket;
  Status status;
  // The fused path decides for itself (its group knows when its ranks outnumber the CPUs).
  const ScopedSerialHostWork serial(!direct && options_.serial_host_work);
  if (direct) {
    status = RunDirect(op, Deadline::AfterSeconds(options_.timeout_s));
  } else if (host_fused) {
    // Its host level is the whole operation's (the engine never groups it with other calls).
    status = op.members.size() == 1 ? RunHostFused(op)
                                    : Internal("a hier:fused plan in a group of several calls (it runs alone)");
  } else {
    // A peer of this host that runs the operation on the fused path waits for this rank there, not
    // for its header: it sees this instead, and names the mismatch (Run::CheckStates, this side's).
    if (options_.same_host && op.seq != 0)
      options_.same_host->PublishPlanned(op.seq, op.header.signature, op.members[0].plan->request);
    if (options_.same_process && op.seq != 0) {
      std::string call = op.members[0].plan->request.ToString();
      if (op.members.size() > 1) call += fmt::format(" and {} more calls in a group", op.members.size() - 1);
      options_.same_process->Publish(op.seq, options_.rank, op.header.signature, std::move(call));
    }
    status = RunSteps(op, *run, straight, Deadline::AfterSeconds(options_.timeout_s));
  }
  if (op.seq != 0) last_seq_ = op.seq;
  recorder_.End(ticket, status);
  if (tracer_) {
    std::string name = fmt::format("{} ({})", first.plan->request.ToString(), AlgorithmName(first.plan->algorithm));
    if (op.members.size() > 1) name += fmt::format(" and {} more calls", op.members.size() - 1);
    tracer_->Complete(std::move(name), "collective", traced_from, Tracer::NowUs(), 0, op.seq);
  }
  if (status.code() == StatusCode::kTimeout) DumpRecorder();
  if (!status.ok()) {
    Fail(status);
    if (!closed_) TellPeersAndClose(status);
  }
  return status;
}

Status Executor::RunSteps(const Operation& op, Run& run, bool straight, Deadline deadline) {
  if (straight && !straight_logged_) {
    straight_logged_ = true;
    const Plan& plan = *op.members[0].plan;
    KZ_INFO(kLogColl,
            "rank {}: collectives whose every transfer fits in an operation header run straight (the "
            "first: {}, {})",
            options_.rank, plan.request.ToString(), AlgorithmName(plan.algorithm));
  }
  running_ = &run;
  Status status = straight ? run.ExecuteStraight(deadline) : run.Execute(deadline);
  running_ = nullptr;
  return status;
}

Status Executor::Submit(std::vector<OperationMember> members, device::Stream& stream, size_t slot_bytes) {
  KZ_ASSIGN_OR_RETURN(std::shared_ptr<Operation> op, NewOperation(std::move(members), slot_bytes));
  const bool collective = op->slots > 0;
  ControlMessage& h = op->header;
  bool idle_executor = false;
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return Aborted(fmt::format("the communicator failed earlier: {}", error_.ToString()));
    // Collectives are numbered alike on every rank; point-to-point transfers involve two ranks
    // each, so counting them here would put the ranks that took no part behind the others.
    if (collective) op->seq = next_seq_++;
    h.seq = op->seq;
    idle_executor = queue_.empty() && pending_ == 0;
  }
  // Memory the host group stopped using is freed here, with no operation of this rank in flight
  // and before this call holds the stream: a free may wait for the whole device (cudaFree does).
  // It waits for the whole group to hold no stream (SameHostGroup::ReleaseRetired): another rank on
  // this device may have called this operation already, holding its stream until this rank joins.
  if (idle_executor && options_.same_host) options_.same_host->ReleaseRetired();
  // Counted in the group from before the hold until after its release, so that no rank frees
  // memory meanwhile; waits for a free under way.
  if (options_.same_host) {
    if (Status s = options_.same_host->BeginHold(op->seq, Deadline::AfterSeconds(options_.timeout_s), abort_);
        !s.ok()) {
      s = s.WithContext("before holding the caller's stream for a collective");
      Fail(s);  // the operation was numbered (see below)
      return s;
    }
    op->group_hold = true;
  }
  // The stream tells the executor when it reaches the call (the inputs are ready), then is held
  // until the operation is done, so later work on it sees the results. The hold blocks no host
  // thread where the device can wait on memory (several ranks' streams in one process must not
  // wait behind each other's held callbacks: CUDA runs them all on one thread).
  // A stream with nothing queued has reached the call already: the executor need not wait for a
  // callback from it (one thread hand-off fewer per call; the hold below still orders later work).
  auto idle = stream.Idle();
  Status enq;
  if (idle.ok() && *idle) {
    op->inputs_ready = true;  // not yet shared with another thread
  } else {
    enq = stream.EnqueueHostCallback([op](const Status& stream_status) {
      std::lock_guard lock(op->mu);
      op->inputs_ready = true;
      op->stream_status = stream_status;
      op->cv.notify_all();
    });
  }
  if (enq.ok()) {
    auto hold = stream.EnqueueHold();
    if (hold.ok()) {
      std::lock_guard lock(op->mu);
      op->hold = std::move(*hold);
      op->stream = &stream;
    } else {
      enq = hold.status();
    }
  }
  if (!enq.ok()) {
    // Sequence numbers must stay dense across ranks: a call that was numbered but never runs
    // would make every later header disagree. Fail the communicator, saying why.
    Fail(enq.WithContext("enqueueing a collective on the caller's stream"));
    if (op->group_hold) options_.same_host->EndHold();  // nothing of the stream is held
    return enq;
  }
  {
    std::lock_guard lock(mu_);
    queue_.push_back(op);
  }
  cv_.notify_all();
  return Status::Ok();
}

void Executor::FinishOperation(Operation& op, const Status& status) {
  if (!status.ok()) KZ_WARN(kLogColl, "operation {} failed: {}", op.seq, status.ToString());
  // No longer pending before the caller's stream goes on: a call made as soon as the stream is
  // free finds the executor idle and may run on the calling thread (TryInline), instead of
  // queueing behind this one, and every call after it too.
  {
    std::lock_guard lock(mu_);
    --pending_;
  }
  {
    std::lock_guard lock(op.mu);
    op.done = true;
    // The caller's Synchronize says the results it waited for are not there (not only AsyncError).
    if (!status.ok() && op.hold && op.stream != nullptr) op.stream->ReportFailure(status);
    if (op.hold) op.hold->Release();
  }
  if (op.group_hold) options_.same_host->EndHold();  // after the release: the group may free again
  op.cv.notify_all();
}

void Executor::Fail(const Status& status) {
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return;
    error_ = status;
    failing_.store(true, std::memory_order_release);
  }
  // The other ranks of an in-process group may be waiting for this one: they fail now, naming
  // this rank's error, instead of at their deadline.
  if (options_.same_process)
    options_.same_process->Fail(status.WithContext(fmt::format("rank {} failed", options_.rank)));
  if (options_.same_host) options_.same_host->Fail(status);  // its peers say "rank R failed: ..."
  if (options_.host_group) options_.host_group->Fail(status);
  failed_.store(true);
  cv_.notify_all();
}

void Executor::Abort(std::string_view why) {
  Fail(Aborted(fmt::format("aborted: {}", why)));
  abort_.store(true);
  cv_.notify_all();
}

Status Executor::AsyncError() const {
  if (!failing_.load(std::memory_order_acquire)) return Status::Ok();  // no lock on the common path
  std::lock_guard lock(mu_);
  return error_;
}

int Executor::pending() const {
  std::lock_guard lock(mu_);
  return pending_ + static_cast<int>(queue_.size());
}

void Executor::TellPeersAndClose(const Status& status, bool tell) {
  // Best effort: one abort message per connected peer, then the connections and listen comms
  // close, so that peers waiting on this rank, or about to connect to it, fail at once
  // (kRemoteError) with the first cause in hand (a peer that is not connected learns it from one
  // that is: notices are passed on).
  ControlMessage m;
  m.kind = ControlKind::kAbort;
  const std::string why = fmt::format("{}", status.ToString());
  std::memcpy(m.reason, why.data(), std::min(why.size(), sizeof m.reason - 1));
  std::vector<std::pair<Transport::Peer*, fabric::Request*>> sent;
  for (int q = 0; tell && q < transport_->nranks(); ++q) {
    Transport::Peer* p = transport_->peer(q);
    if (p == nullptr || !p->send) continue;
    auto& pending = control_->pending[q];
    const size_t nslots = p->control_out.size() / kControlSlotBytes;
    if (pending.size() >= nslots) continue;
    const size_t slot = control_->next[q]++ % nslots;
    uint8_t* where = p->control_out.data() + slot * kControlSlotBytes;
    std::memcpy(where, &m, sizeof m);
    auto r = p->send->Send(where, sizeof m, kControlTag, p->send_control);
    if (r.ok() && *r != nullptr) sent.emplace_back(p, *r);
  }
  const Deadline grace = Deadline::After(std::chrono::milliseconds(200));
  for (auto& [p, r] : sent) p->send->Wait(r, grace).status().IgnoreError();
  control_->pending.clear();
  for (ControlState::Posted& posted : control_->recv) {
    posted.requests.clear();
    posted.waited.reset();
  }
  ReleaseRegions(0);  // before their comms go
  transport_->Close();
  closed_ = true;
}

void Executor::Loop() {
  // Connections made before the loop (TransportOptions::connect_at_creation) get their control
  // receive at once, so that a notice a peer sends before this rank's first operation (an abort
  // while idle) is delivered, not lost with the peer's connection; later ones as they are accepted.
  std::unique_lock run(run_mu_);
  ReceiveControl(/*accept_now=*/true).status().IgnoreError();
  if (options_.serve) {
    Serve();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return stopping_; });
    return;
  }
  run.unlock();
  while (true) {
    std::shared_ptr<Operation> op;
    {
      std::unique_lock lock(mu_);
      // Idle, it still answers its peers' probes (a rank that has not called yet is named so).
      while (!cv_.wait_for(lock, kIdlePoll, [&] { return stopping_ || !queue_.empty() || (abort_.load() && !closed_); })) {
        if (closed_) continue;
        lock.unlock();
        // Not while a caller runs an operation itself (TryOnCaller): it looks at the control
        // messages then, and waiting here for it would wake this thread after each of its calls.
        if (run.try_lock()) {
          ReceiveControl(/*accept_now=*/true).status().IgnoreError();  // a failure here is the next operation's
          run.unlock();
        }
        lock.lock();
      }
      if (queue_.empty() && abort_.load() && !closed_) {
        // Aborted while idle: tell the peers now, so that they do not wait for this rank.
        lock.unlock();
        run.lock();
        if (!closed_) TellPeersAndClose(AsyncError());
        run.unlock();
        continue;
      }
      if (queue_.empty()) break;
      op = queue_.front();
      queue_.pop_front();
      ++pending_;
    }
    run.lock();  // after an operation a caller runs itself (TryOnCaller), if one does
    Status status;
    // Wait for the caller's stream to reach the call.
    {
      const Deadline deadline = Deadline::AfterSeconds(options_.timeout_s);
      std::unique_lock lock(op->mu);
      stream_wait_seq_ = op->seq;
      while (!op->inputs_ready && !abort_.load() && !deadline.Expired()) {
        op->cv.wait_for(lock, std::chrono::milliseconds(10));
        if (op->inputs_ready || closed_) continue;
        lock.unlock();
        ReceiveControl(/*accept_now=*/true).status().IgnoreError();  // answers probes meanwhile
        lock.lock();
      }
      stream_wait_seq_ = 0;
      if (!op->inputs_ready)
        status = abort_.load() ? Aborted("the communicator was aborted")
                               : Timeout(fmt::format("the caller's stream did not reach operation {} within {} s",
                                                     op->seq, options_.timeout_s));
      else if (!op->stream_status.ok())
        status = op->stream_status.WithContext("the caller's stream failed before the collective");
    }
    if (status.ok()) {
      std::lock_guard lock(mu_);
      if (!error_.ok()) status = Aborted(fmt::format("the communicator failed earlier: {}", error_.ToString()));
    }
    if (status.ok()) {
      status = RunOperation(*op);
    } else {
      if (op->seq != 0) last_seq_ = op->seq;
      Fail(status);
      if (!closed_) TellPeersAndClose(status);
    }
    run.unlock();
    FinishOperation(*op, status);
    // The last rank of the group to finish may find every stream free, where the calls (Submit,
    // TryInline) find peers already holding theirs for the next operation: memory the host group
    // stopped using is freed here too, so that it does not wait for a call that happens to come
    // first. The caller's next call waits meanwhile (BeginHold); this thread is needed by nobody.
    if (options_.same_host) {
      bool idle = false;
      {
        std::lock_guard lock(mu_);
        idle = queue_.empty();
      }
      if (idle) options_.same_host->ReleaseRetired();
    }
  }
  if (!closed_) {
    // Control receives stay posted on the comms; the transport releases them with the comms.
  }
}

}  // namespace kizuna::collectives
