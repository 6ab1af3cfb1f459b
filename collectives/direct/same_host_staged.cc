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
namespace {

// The bytes of this rank's stage and result for `req` (header comment); kInvalidArgument for a
// collective the fused path does not run.
Status StagedBytes(const CollectiveRequest& req, int n, int me, uint64_t& stage_bytes, uint64_t& result_bytes) {
  const uint64_t elem = DataTypeSize(req.dtype);
  stage_bytes = req.input_count() * elem;
  result_bytes = 0;
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
  return Status::Ok();
}

// One rank's staged operation: its buffers, and after the meeting the other ranks' stages and
// results, shared by the three steps of the header comment.
struct StagedPass {
  const CollectiveRequest& req;
  int n, me;
  uint64_t elem;
  uint64_t c;  // elements per rank block (ReduceScatter, AllGather)
  const uint8_t* in;
  uint8_t* out;
  uint8_t* stage;
  uint8_t* result;
  std::vector<const uint8_t*> stages, results;  // indexed by rank; null for this one

  static void Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
    if (bytes > 0 && dst != src) HostCopy(dst, src, bytes);
  }

  // Step 1: what the others read of this rank's input.
  void FillStage() const {
    switch (req.collective) {
      case Collective::kAllReduce:
      case Collective::kReduce:
        for (int q = 0; q < n; ++q) {
          if (q == me) continue;
          const auto [first, count] = FusedSlice(req.count, n, q);
          Copy(stage + first * elem, in + first * elem, count * elem);
        }
        break;
      case Collective::kReduceScatter:
        for (int q = 0; q < n; ++q) {
          const uint64_t at = static_cast<uint64_t>(q) * c * elem;
          if (q != me) Copy(stage + at, in + at, c * elem);
        }
        break;
      case Collective::kAllGather:
        Copy(stage, in, c * elem);
        Copy(out + static_cast<uint64_t>(me) * c * elem, in, c * elem);
        break;
      default:  // kBroadcast
        if (me == req.root) {
          Copy(stage, in, c * elem);
          Copy(out, in, c * elem);
        }
        break;
    }
  }

  // Step 2: this rank's share, reading its own input and the others' stages.
  Status DoShare() const {
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
          if (q != me) Copy(out + static_cast<uint64_t>(q) * c * elem, stages[static_cast<size_t>(q)], c * elem);
        break;
      default:  // kBroadcast
        if (me != req.root) Copy(out, stages[static_cast<size_t>(req.root)], c * elem);
        break;
    }
    return Status::Ok();
  }

  // Step 3: the others' result slices.
  void CopyResults() const {
    if (req.collective == Collective::kAllReduce || (req.collective == Collective::kReduce && me == req.root)) {
      for (int q = 0; q < n; ++q) {
        if (q == me) continue;
        const auto [first, count] = FusedSlice(req.count, n, q);
        Copy(out + first * elem, results[static_cast<size_t>(q)], count * elem);
      }
    }
  }
};

}  // namespace

Status SameHostGroup::RunStaged(uint64_t seq, uint64_t signature, const CollectiveRequest& req, const void* input,
                         void* output, Deadline deadline, const std::atomic<bool>& abort) {
  const int n = nranks_, me = rank_;
  uint64_t stage_bytes = 0, result_bytes = 0;
  KZ_RETURN_IF_ERROR(StagedBytes(req, n, me, stage_bytes, result_bytes));
  // The stage and the result, grown to a power of two so that a sweep of sizes maps a few.
  for (int which : {0, 1}) {
    const uint64_t bytes = which == 0 ? stage_bytes : result_bytes;
    if (bytes == 0 || (staging_[which] && staging_[which]->size() >= bytes)) continue;
    Retire(std::move(staging_[which]));
    KZ_ASSIGN_OR_RETURN(staging_[which], device_.Allocate(std::bit_ceil(bytes)));
  }
  StagedPass pass{.req = req,
                  .n = n,
                  .me = me,
                  .elem = DataTypeSize(req.dtype),
                  .c = req.count,
                  .in = static_cast<const uint8_t*>(input),
                  .out = static_cast<uint8_t*>(output),
                  .stage = stage_bytes > 0 ? static_cast<uint8_t*>(staging_[0]->data()) : nullptr,
                  .result = result_bytes > 0 ? static_cast<uint8_t*>(staging_[1]->data()) : nullptr,
                  .stages = std::vector<const uint8_t*>(static_cast<size_t>(n)),
                  .results = std::vector<const uint8_t*>(static_cast<size_t>(n))};

  pass.FillStage();
  KZ_RETURN_IF_ERROR(PublishRegion(0, pass.stage, stage_bytes).WithContext("the staged collective's stage"));
  KZ_RETURN_IF_ERROR(PublishRegion(1, pass.result, result_bytes).WithContext("the staged collective's result"));
  KZ_RETURN_IF_ERROR(Meet(seq, signature, req, Protocol::kStaged, deadline, abort));
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    KZ_ASSIGN_OR_RETURN(pass.stages[static_cast<size_t>(q)], Resolve(q, 0, seq));
    KZ_ASSIGN_OR_RETURN(pass.results[static_cast<size_t>(q)], Resolve(q, 1, seq));
  }

  KZ_RETURN_IF_ERROR(pass.DoShare());
  KZ_RETURN_IF_ERROR(Finish(seq, deadline, abort));

  pass.CopyResults();
  return Status::Ok();
}

}  // namespace kizuna::collectives
