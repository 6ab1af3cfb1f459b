// The fused one-pass collectives' work (fused.h): one rank's part, given every rank's buffers.
#include "collectives/direct/fused.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/device/host_reduce.h"

namespace kizuna::collectives {
namespace {

// Rank `rank`'s part of the work: [begin, end) of FusedWorkCount(req) elements (the plan's
// bounds, or the even split: a slice of the vector, or the rank's own block).
std::pair<uint64_t, uint64_t> PartOf(const CollectiveRequest& req, int rank, std::span<const uint64_t> bounds) {
  const auto r = static_cast<size_t>(rank);
  if (bounds.size() == static_cast<size_t>(req.nranks) + 1) return {bounds[r], bounds[r + 1]};
  const uint64_t block =
      req.collective == Collective::kReduceScatter || req.collective == Collective::kAllGather ? req.count : 0;
  if (block > 0) return {r * block, (r + 1) * block};
  const auto [offset, count] = FusedSlice(req.count, req.nranks, rank);
  return {offset, offset + count};
}

// Rank `rank`'s part of a fused operation, given every rank's buffers, into `stream` (a device
// stream or the CPU; fused.h says who does what).
template <typename Sink>
Status FusedPart(const CollectiveRequest& req, int rank, std::span<const uint64_t> bounds,
                 std::span<const void* const> inputs, std::span<void* const> outputs, Sink& stream) {
  const size_t elem = DataTypeSize(req.dtype);
  const auto n = static_cast<size_t>(req.nranks);
  const auto root = static_cast<size_t>(req.root);
  auto at = [elem](const void* p, uint64_t elements) {
    return const_cast<uint8_t*>(static_cast<const uint8_t*>(p)) + elements * elem;
  };
  const auto [begin, end] = PartOf(req, rank, bounds);
  if (end <= begin) return Status::Ok();
  const uint64_t count = end - begin;
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  switch (req.collective) {
    case Collective::kAllReduce:
    case Collective::kReduce: {
      for (size_t q = 0; q < n; ++q) {
        srcs.push_back(at(inputs[q], begin));
        if (req.collective == Collective::kAllReduce) dsts.push_back(at(outputs[q], begin));
      }
      if (req.collective == Collective::kReduce) dsts.push_back(at(outputs[root], begin));
      return stream.ReduceMulti(dsts, srcs, count, req.dtype, req.op);
    }
    case Collective::kReduceScatter: {
      // Elements [begin, end) of the blocks laid end to end: a piece of each block it covers,
      // reduced over every input into the block's owner's output (its own block alone when even).
      for (uint64_t b = begin / req.count; b < n && b * req.count < end; ++b) {
        const uint64_t lo = std::max(begin, b * req.count), hi = std::min(end, (b + 1) * req.count);
        srcs.clear();
        for (size_t q = 0; q < n; ++q) srcs.push_back(at(inputs[q], lo));
        void* dst = at(outputs[b], lo - b * req.count);
        KZ_RETURN_IF_ERROR(stream.ReduceMulti(std::span<void* const>(&dst, 1), srcs, hi - lo, req.dtype, req.op));
      }
      return Status::Ok();
    }
    case Collective::kAllGather: {
      // Pushed, not pulled: each piece of block b is read once from rank b's input and written
      // into every output.
      for (uint64_t b = begin / req.count; b < n && b * req.count < end; ++b) {
        const uint64_t lo = std::max(begin, b * req.count), hi = std::min(end, (b + 1) * req.count);
        const uint8_t* src = at(inputs[b], lo - b * req.count);
        dsts.clear();
        for (size_t q = 0; q < n; ++q) {
          uint8_t* dst = at(outputs[q], lo);
          if (dst != src) dsts.push_back(dst);
        }
        KZ_RETURN_IF_ERROR(stream.CopyMulti(dsts, src, (hi - lo) * elem));
      }
      return Status::Ok();
    }
    case Collective::kBroadcast: {
      const uint8_t* src = at(inputs[root], begin);
      for (size_t q = 0; q < n; ++q) {
        uint8_t* dst = at(outputs[q], begin);
        if (dst != src) dsts.push_back(dst);
      }
      return stream.CopyMulti(dsts, src, count * elem);
    }
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

}  // namespace

Status EnqueueFusedPart(const CollectiveRequest& req, int rank, std::span<const uint64_t> bounds,
                        std::span<const void* const> inputs, std::span<void* const> outputs, device::Stream& stream) {
  StreamSink sink{stream};
  return FusedPart(req, rank, bounds, inputs, outputs, sink);
}

Status RunFusedPartOnCpu(const CollectiveRequest& req, int rank, std::span<const uint64_t> bounds,
                         std::span<const void* const> inputs, std::span<void* const> outputs) {
  HostSink sink;
  return FusedPart(req, rank, bounds, inputs, outputs, sink);
}

std::pair<uint64_t, uint64_t> FusedBytes(const CollectiveRequest& req, int rank) {
  const uint64_t elem = DataTypeSize(req.dtype);
  uint64_t in = req.input_count() * elem, out = req.output_count() * elem;
  if (req.collective == Collective::kBroadcast && rank != req.root) in = 0;
  if (req.collective == Collective::kReduce && rank != req.root) out = 0;
  return {in, out};
}

bool CpuDoesParts(const device::DeviceProperties& props) {
  const bool throttled = props.copy_gbps > 0 || props.reduce_gbps > 0 || props.launch_latency_us > 0;
  return props.host_compute && props.host_accessible && !throttled && !props.faults_injected;
}

}  // namespace kizuna::collectives
