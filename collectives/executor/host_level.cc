// hier:fused's host level (plan.h, RankPlan::host_parts): the ranks of this host meet in their
// host group (collectives/direct/same_host_group.h), each sums its parts over every local rank's
// input into its own output, the plan's network steps AllReduce the parts among their owners on
// every host, and after a second meeting each rank copies the other parts from their owners'
// outputs. Host memory traffic: every input byte read once, every output byte written twice (its
// owner's sum, then every other rank's copy), where the pairwise host level sends each byte
// through staging twice. The group's operation numbers are 2 seq (the buffers, then the network
// level done) and 2 seq + 1 (every copy done): the next operation may then reuse the buffers.
#include <vector>

#include <fmt/format.h>

#include "collectives/executor/internal.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {

Status Executor::RunHostFused(Operation& op) {
  // A rank alone on its host has no group: its host level is its own input.
  SameHostGroup* group = options_.host_group.get();
  const OperationMember& m = op.members[0];
  const CollectiveRequest& req = m.plan->request;
  const RankPlan& rp = m.plan->ranks[0];
  const size_t elem = DataTypeSize(req.dtype);
  const uint64_t bytes = req.count * elem;
  const Deadline deadline = Deadline::AfterSeconds(options_.timeout_s);
  const uint64_t seq = 2 * op.seq;
  auto failed = [&](const Status& s) {
    return s.WithContext(fmt::format("{} (hier:fused), its host level", DescribeHeader(op.header)));
  };
  Result<SameHostGroup::Buffers> buffers = SameHostGroup::Buffers{{m.input}, {m.output}};
  if (group != nullptr)
    buffers = group->Exchange(seq, op.header.signature, req, m.input, bytes, m.output, bytes, deadline, abort_);
  if (!buffers.ok()) return failed(buffers.status());
  const int P = group != nullptr ? group->nranks() : 1, me = group != nullptr ? group->rank() : 0;
  const ReduceOp sum = req.op == ReduceOp::kAvg ? ReduceOp::kSum : req.op;  // divided by the steps
  auto* out = static_cast<uint8_t*>(m.output);
  std::vector<const void*> srcs(static_cast<size_t>(P));
  for (uint32_t c = 0; c < rp.host_channels; ++c)
    for (uint32_t j = static_cast<uint32_t>(me); j < rp.host_parts; j += static_cast<uint32_t>(P)) {
      const auto [offset, n] = HostPart(req.count, rp.host_channels, rp.host_parts, c, j);
      if (n == 0) continue;
      for (int q = 0; q < P; ++q)
        srcs[static_cast<size_t>(q)] = static_cast<const uint8_t*>(buffers->inputs[static_cast<size_t>(q)]) + offset * elem;
      if (P == 1 && srcs[0] == out + offset * elem) continue;  // in place, alone on its host
      if (Status s = HostReduce(out + offset * elem, srcs, n, req.dtype, sum); !s.ok()) return failed(s);
    }
  Run run(*this, op, op.slot_bytes, op.slots);
  running_ = &run;
  Status network = run.Execute(deadline);
  running_ = nullptr;
  if (!network.ok()) return network;
  if (group == nullptr) return Status::Ok();
  if (Status s = group->Finish(seq, deadline, abort_); !s.ok()) return failed(s);
  if (req.collective == Collective::kBarrier) return Status::Ok();  // the meeting is all of it
  for (uint32_t c = 0; c < rp.host_channels; ++c)
    for (uint32_t j = 0; j < rp.host_parts; ++j) {
      const int owner = static_cast<int>(j % static_cast<uint32_t>(P));
      if (owner == me) continue;
      const auto [offset, n] = HostPart(req.count, rp.host_channels, rp.host_parts, c, j);
      if (n == 0) continue;
      HostCopy(out + offset * elem,
               static_cast<const uint8_t*>(buffers->outputs[static_cast<size_t>(owner)]) + offset * elem, n * elem);
    }
  if (Status s = group->Finish(seq + 1, deadline, abort_); !s.ok()) return failed(s);
  return Status::Ok();
}

}  // namespace kizuna::collectives
