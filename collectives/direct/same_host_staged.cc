// SameHostGroup::RunStaged: fused operations over plain host memory (malloc), which no other process can
// map. Each rank reads only its own input and writes only its own output; the ranks meet in two
// allocations of each rank's device that the others map (the stage: what the others read from
// this rank's input, as large as the input; the result: this rank's reduced slice, 1/n of it).
// Three passes, two rendezvous:
//
//   1. copy into the stage what the others need of this rank's input; publish; meet;
//   2. this rank's share of the work, reading its own input and the others' stages (an AllReduce
//      reduces its slice into its output and its result); finish (every rank has done step 2);
//   3. copy every other rank's result slice into this rank's output.
//
// The stage is rewritten only at the next operation's step 1, after every rank has passed step 2
// of this one (the finish); the result only at the next step 2, after every rank has met there,
// so after its step 3 of this one. No third rendezvous is needed.
#include <bit>

#include <fmt/format.h>

#include "collectives/direct/same_host_group.h"
#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {

Status SameHostGroup::RunStaged(uint64_t seq, uint64_t signature, const CollectiveRequest& req, const void* input,
                         void* output, Deadline deadline, const std::atomic<bool>& abort) {
  const uint64_t elem = DataTypeSize(req.dtype);
  const int n = nranks_, me = rank_;
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  const uint64_t c = req.count;  // elements per rank block (ReduceScatter, AllGather)
  uint64_t stage_bytes = req.input_count() * elem, result_bytes = 0;
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce:
      // This rank's slice only, at the result's start: the others read it there.
      result_bytes = FusedSlice(req.count, n, me).second * elem;
      break;
    case Collective::kBroadcast:
      if (me != req.root) stage_bytes = 0;
      break;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      break;
    default:
      return InvalidArgument(fmt::format("{} with plain host memory: the fused path runs AllReduce, ReduceScatter, "
                                         "AllGather, Broadcast and Reduce only",
                                         req.ToString()));
  }
  // The stage and the result, grown to a power of two so that a sweep of sizes maps a few.
  for (int which : {0, 1}) {
    const uint64_t bytes = which == 0 ? stage_bytes : result_bytes;
    if (bytes == 0 || (staging_[which] && staging_[which]->size() >= bytes)) continue;
    Retire(std::move(staging_[which]));
    KZ_ASSIGN_OR_RETURN(staging_[which], device_.Allocate(std::bit_ceil(bytes)));
  }
  uint8_t* stage = stage_bytes > 0 ? static_cast<uint8_t*>(staging_[0]->data()) : nullptr;
  uint8_t* result = result_bytes > 0 ? static_cast<uint8_t*>(staging_[1]->data()) : nullptr;
  auto copy = [](uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    if (bytes > 0 && dst != src) HostCopy(dst, src, bytes);
  };

  // Step 1: what the others read of this rank's input.
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce:
      for (int q = 0; q < n; ++q) {
        if (q == me) continue;
        const auto [first, count] = FusedSlice(req.count, n, q);
        copy(stage + first * elem, in + first * elem, count * elem);
      }
      break;
    case Collective::kReduceScatter:
      for (int q = 0; q < n; ++q) {
        const uint64_t at = static_cast<uint64_t>(q) * c * elem;
        if (q != me) copy(stage + at, in + at, c * elem);
      }
      break;
    case Collective::kAllGather:
      copy(stage, in, c * elem);
      copy(out + static_cast<uint64_t>(me) * c * elem, in, c * elem);
      break;
    default:  // kBroadcast
      if (me == req.root) {
        copy(stage, in, c * elem);
        copy(out, in, c * elem);
      }
      break;
  }
  KZ_RETURN_IF_ERROR(PublishRegion(0, stage, stage_bytes).WithContext("the staged collective's stage"));
  KZ_RETURN_IF_ERROR(PublishRegion(1, result, result_bytes).WithContext("the staged collective's result"));
  KZ_RETURN_IF_ERROR(Meet(seq, signature, req, Protocol::kStaged, deadline, abort));
  std::vector<const uint8_t*> stages(static_cast<size_t>(n)), results(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    KZ_ASSIGN_OR_RETURN(stages[static_cast<size_t>(q)], Resolve(q, 0, seq));
    KZ_ASSIGN_OR_RETURN(results[static_cast<size_t>(q)], Resolve(q, 1, seq));
  }

  // Step 2: this rank's share, reading its own input and the others' stages.
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce:
    case Collective::kReduceScatter: {
      const bool scatter = req.collective == Collective::kReduceScatter;
      const auto [first, count] = scatter ? std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(me) * c, c}
                                          : FusedSlice(req.count, n, me);
      if (count == 0) break;
      std::vector<const void*> srcs;
      for (int q = 0; q < n; ++q) srcs.push_back((q == me ? in : stages[static_cast<size_t>(q)]) + first * elem);
      std::vector<void*> dsts;
      if (scatter)
        dsts.push_back(out);
      else if (req.collective == Collective::kAllReduce)
        dsts = {out + first * elem, result};
      else
        dsts.push_back(me == req.root ? out + first * elem : result);
      KZ_RETURN_IF_ERROR(HostReduceMulti(dsts, srcs, count, req.dtype, req.op));
      break;
    }
    case Collective::kAllGather:
      for (int q = 0; q < n; ++q)
        if (q != me) copy(out + static_cast<uint64_t>(q) * c * elem, stages[static_cast<size_t>(q)], c * elem);
      break;
    default:  // kBroadcast
      if (me != req.root) copy(out, stages[static_cast<size_t>(req.root)], c * elem);
      break;
  }
  KZ_RETURN_IF_ERROR(Finish(seq, deadline, abort));

  // Step 3: the others' result slices.
  if (req.collective == Collective::kAllReduce || (req.collective == Collective::kReduce && me == req.root)) {
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      const auto [first, count] = FusedSlice(req.count, n, q);
      copy(out + first * elem, results[static_cast<size_t>(q)], count * elem);
    }
  }
  return Status::Ok();
}

}  // namespace kizuna::collectives
