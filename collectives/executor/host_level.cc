// hier:fused's host level (plan.h, RankPlan::host_parts and host_blocks): the ranks of this host
// meet in their host group (collectives/direct/same_host_group.h), each sums what it owns over
// every local rank's input (AllReduce: its parts, into its own output; ReduceScatter: its blocks,
// into its output or the scratch its steps send from), the plan's network steps run, and after a
// second meeting each rank copies what it lacks from the local rank that holds it (AllReduce: the
// other parts from their owners' outputs; AllGather: the blocks the others received). Host memory
// traffic: every input byte read once, every output byte written at most twice (its owner's sum,
// then every other rank's copy), where the pairwise host level sends each byte through staging
// twice. The group's operation numbers are 2 seq (the buffers, then the network level done) and
// 2 seq + 1 (every copy done): the next operation may then reuse the buffers. A small AllReduce
// in the leader form goes through the group's pages instead (RunOneShot, then RunShare).
#include <vector>

#include <fmt/format.h>

#include "collectives/executor/internal.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {

Status Executor::RunNetworkLevel(Operation& op, Deadline deadline) {
  Run run(*this, op, op.slot_bytes, op.slots);
  const bool straight = run.Straight();
  // The leader form's network level of a small AllReduce usually is (one header per peer).
  if (straight) recorder_.Straight(record_ticket_);
  return RunSteps(op, run, straight, deadline);
}

Status Executor::RunHostFused(Operation& op) {
  // A rank alone on its host has no group: its host level is its own input.
  SameHostGroup* group = options_.host_group.get();
  // The group's waits write the fabric's queued output meanwhile (MoveFabricWhileWaiting).
  host_waits_move_fabric_.store(true, std::memory_order_relaxed);
  struct Off {
    std::atomic<bool>& flag;
    ~Off() { flag.store(false, std::memory_order_relaxed); }
  } off{host_waits_move_fabric_};
  const OperationMember& m = op.members[0];
  const CollectiveRequest& req = m.plan->request;
  const RankPlan& rp = m.plan->ranks[0];
  const size_t elem = DataTypeSize(req.dtype);
  const Deadline deadline = Deadline::AfterSeconds(options_.timeout_s);
  const uint64_t seq = 2 * op.seq;
  auto failed = [&](const Status& s) {
    return s.WithContext(fmt::format("{} (hier:fused), its host level", DescribeHeader(op.header)));
  };
  const ReduceOp sum = req.op == ReduceOp::kAvg ? ReduceOp::kSum : req.op;  // divided by the steps
  // The leader form of a small AllReduce (one part, owned by local rank 0): the host's sum through
  // the pages on every rank (RunOneShot), the leader's network level, then the leader's result
  // through its page (RunShare): two meetings where the mapped path has three, no buffer mapped,
  // and the others wait for the leader alone at the end.
  if (group != nullptr && req.collective == Collective::kAllReduce && rp.host_parts == 1 &&
      group->host_accessible() && req.count * elem <= SameHostGroup::kInlineBytes) {
    CollectiveRequest host = req;
    host.op = sum;
    if (Status s = group->RunOneShot(seq, op.header.signature, host, m.input, m.output, deadline, abort_); !s.ok())
      return failed(s);
    if (Status network = RunNetworkLevel(op, deadline); !network.ok()) return network;
    if (Status s = group->RunShare(seq + 1, op.header.signature, req, 0, m.output, deadline, abort_); !s.ok())
      return failed(s);
    return Status::Ok();
  }
  Result<SameHostGroup::Buffers> buffers = SameHostGroup::Buffers{{m.input}, {m.output}};
  if (group != nullptr)
    buffers = group->Exchange(seq, op.header.signature, req, m.input, req.input_count() * elem, m.output,
                              req.output_count() * elem, deadline, abort_);
  if (!buffers.ok()) return failed(buffers.status());
  const int P = group != nullptr ? group->nranks() : 1, me = group != nullptr ? group->rank() : 0;
  auto* out = static_cast<uint8_t*>(m.output);
  std::vector<const void*> srcs(static_cast<size_t>(P));
  const size_t block_bytes = req.count * elem;
  if (req.collective == Collective::kReduceScatter) {
    // Where the plan's steps find each sum: this rank's output, or its scratch (Run::Setup keeps
    // the buffer EnsureScratch grows here).
    KZ_RETURN_IF_ERROR(EnsureScratch(ScratchBytes(*m.plan)));
    for (const RankPlan::HostBlock& hb : rp.host_blocks) {
      uint8_t* dst = (hb.dst.buffer == BufferKind::kScratch ? static_cast<uint8_t*>(scratch_->data()) : out) +
                     hb.dst.offset * elem;
      for (int q = 0; q < P; ++q)
        srcs[static_cast<size_t>(q)] =
            static_cast<const uint8_t*>(buffers->inputs[static_cast<size_t>(q)]) + hb.block * block_bytes;
      if (Status s = HostReduce(dst, srcs, req.count, req.dtype, sum); !s.ok()) return failed(s);
    }
  }
  for (uint32_t c = 0; c < rp.host_channels; ++c)
    for (uint32_t j = static_cast<uint32_t>(me); j < rp.host_parts; j += static_cast<uint32_t>(P)) {
      const auto [offset, n] = HostPart(req.count, rp.host_channels, rp.host_parts, c, j, rp.host_part_weights);
      if (n == 0) continue;
      for (int q = 0; q < P; ++q)
        srcs[static_cast<size_t>(q)] =
            static_cast<const uint8_t*>(buffers->inputs[static_cast<size_t>(q)]) + offset * elem;
      if (P == 1 && srcs[0] == out + offset * elem) continue;  // in place, alone on its host
      if (Status s = HostReduce(out + offset * elem, srcs, n, req.dtype, sum); !s.ok()) return failed(s);
    }
  if (Status network = RunNetworkLevel(op, deadline); !network.ok()) return network;
  if (group == nullptr) return Status::Ok();
  if (Status s = group->Finish(seq, deadline, abort_); !s.ok()) return failed(s);
  // Barrier: the meeting is all of it. ReduceScatter: every rank is past its sums (the only reads
  // of another rank's buffers), and each output is its own.
  if (req.collective == Collective::kBarrier || req.collective == Collective::kReduceScatter) return Status::Ok();
  for (const RankPlan::HostBlock& hb : rp.host_blocks)
    HostCopy(out + hb.block * block_bytes,
             static_cast<const uint8_t*>(buffers->outputs[static_cast<size_t>(hb.from)]) + hb.block * block_bytes,
             block_bytes);
  for (uint32_t c = 0; c < rp.host_channels; ++c)
    for (uint32_t j = 0; j < rp.host_parts; ++j) {
      const int owner = static_cast<int>(j % static_cast<uint32_t>(P));
      if (owner == me) continue;
      const auto [offset, n] = HostPart(req.count, rp.host_channels, rp.host_parts, c, j, rp.host_part_weights);
      if (n == 0) continue;
      HostCopy(out + offset * elem,
               static_cast<const uint8_t*>(buffers->outputs[static_cast<size_t>(owner)]) + offset * elem, n * elem);
    }
  if (Status s = group->Finish(seq + 1, deadline, abort_); !s.ok()) return failed(s);
  return Status::Ok();
}

}  // namespace kizuna::collectives
