// The executor of an aggregation device (ExecutorOptions::serve, algorithms/ina.cc): no caller
// submits anything; an operation starts when the first of its headers arrives from a peer (a
// child sending its chunks up), runs the plan the communicator builds for the request the header
// describes, and the device waits for the next one. It stops when the job ends — every worker
// has closed its connections between operations — or when an operation fails (a worker died
// mid-stream, a peer sent an abort): either way the executor fails with the reason, its
// connections are closed, and the process that runs it (kizuna-aggd) frees the communicator and
// may serve another job.
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "collectives/executor/executor.h"
#include "collectives/executor/internal.h"
#include "runtime/core/logging.h"

namespace kizuna::collectives {

using executor_internal::ControlKind;
using executor_internal::kWaitSlice;

namespace {

// The request an operation header describes.
CollectiveRequest RequestOf(const ControlMessage& m) {
  CollectiveRequest request;
  request.collective = static_cast<Collective>(m.collective);
  request.dtype = static_cast<DataType>(m.dtype);
  request.op = static_cast<ReduceOp>(m.op);
  request.root = m.root;
  request.nranks = m.nranks;
  request.count = m.count;
  return request;
}

}  // namespace

void Executor::Serve() {
  Status status;
  while (status.ok()) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || abort_.load()) {
        status = abort_.load() ? error_ : Unavailable("the aggregation device is shutting down");
        break;
      }
    }
    Result<bool> got = ReceiveControl(/*accept_now=*/true);
    if (!got.ok()) {
      status = got.status();
      break;
    }
    // The first message waiting, lowest rank first (it stays in the inbox: the run checks it).
    // An aggregation device's transport connects its peers at creation
    // (TransportOptions::connect_at_creation): the job ends when every worker's connection has.
    int from = -1, connected = 0;
    for (int q : transport_->receiving_from()) {
      Transport::Peer* p = transport_->peer(q);
      if (p == nullptr || !p->recv) continue;
      if (q < options_.workers && control_->gone[static_cast<size_t>(q)].ok()) ++connected;
    }
    for (const auto& [q, inbox] : control_->inbox)
      if (!inbox.empty()) {
        from = q;
        break;
      }
    if (from < 0) {
      if (connected == 0) {
        status = Unavailable("the job ended: every worker closed its connections");
        break;
      }
      if (!*got) std::this_thread::sleep_for(kWaitSlice);  // idle: nothing is waiting on this device
      continue;
    }
    status = ServeOne(from);
  }
  KZ_INFO(kLogColl, "aggregation device rank {} stops serving after {} operations: {}", options_.rank, served_,
          status.ToString());
  Fail(status);
  // A job that ended owes nobody a notice (the other devices see their workers leave too).
  if (!closed_) TellPeersAndClose(status, status.code() != StatusCode::kUnavailable);
}

Status Executor::ServeOne(int from) {
  const ControlMessage m = control_->inbox[from].front();
  if (m.kind == ControlKind::kAbort) {
    std::string why(m.reason, strnlen(m.reason, sizeof m.reason));
    return RemoteError(fmt::format("rank {} failed: {}", from, why));
  }
  if (m.members != 1)
    return InvalidArgument(fmt::format("rank {} sent an operation of {} grouped calls; an aggregation device "
                                       "serves one collective at a time",
                                       from, m.members));
  const CollectiveRequest request = RequestOf(m);
  auto plan = options_.serve(request, static_cast<Algorithm>(m.algorithm), m.chunk_count, static_cast<int>(m.channels));
  if (!plan.ok()) return plan.status().WithContext(fmt::format("serving rank {}'s {}", from, DescribeHeader(m)));
  Operation op;
  op.members.push_back({std::move(*plan), nullptr, nullptr});
  int channels = 0;
  KZ_RETURN_IF_ERROR(FillHeader(op, &channels));
  op.seq = op.header.seq = m.seq;
  op.slot_bytes = slot_bytes_for(channels, m.chunk_count * DataTypeSize(request.dtype));
  op.slots = std::max(channels, 1) * options_.window;
  if (op.slot_bytes < m.chunk_count * DataTypeSize(request.dtype))
    return InvalidArgument(fmt::format("{}: chunks of {} elements do not fit this device's staging slots of {} "
                                       "bytes (give it the workers' staging size)",
                                       DescribeHeader(m), m.chunk_count, op.slot_bytes));
  KZ_TRACE(kLogColl, "aggregation device rank {}: {}", options_.rank, DescribeHeader(m));
  {
    std::lock_guard lock(mu_);
    ++pending_;
  }
  Run run(*this, op, op.slot_bytes, op.slots);
  const Status status = run.Execute(Deadline::AfterSeconds(options_.timeout_s));
  std::lock_guard lock(mu_);
  --pending_;
  if (status.ok()) ++served_;
  return status;
}

Status Executor::WaitServing(uint64_t* served) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !error_.ok(); });
  if (served != nullptr) *served = served_;
  return error_;
}

}  // namespace kizuna::collectives
