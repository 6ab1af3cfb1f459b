#include "collectives/algorithms/algorithm.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "collectives/algorithms/impl.h"
#include "collectives/ina/layout.h"

namespace kizuna::collectives {
namespace {

int AggregatorCount(const CommTopology& shape) { return shape.ina ? shape.ina->aggregators : 0; }

// The largest buffer a request may describe, in bytes: offsets and sizes stay far from overflow
// when multiplied out (elements x element size, plus offsets) anywhere downstream.
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 62;
// More channels than this are a configuration error (NCCL caps its channels at 64 too); the cap
// keeps a wild value from allocating billions of empty step lists.
constexpr int kMaxChannels = 256;
// A plan whose buffers split into more chunks than this is a configuration error (a chunk size
// far too small for the message): it would hold hundreds of millions of steps.
constexpr uint64_t kMaxChunks = uint64_t{1} << 24;

// The checks that depend on the rank built (-1: none), for a request and shape already checked.
Status CheckRank(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape, int rank) {
  const int aggregators = algorithm == Algorithm::kIna ? AggregatorCount(shape) : 0;
  if (rank >= request.nranks + aggregators)
    return InvalidArgument(aggregators > 0 ? fmt::format("rank {} is not below nranks {} + {} aggregation devices",
                                                         rank, request.nranks, aggregators)
                                           : fmt::format("rank {} is not below nranks {}", rank, request.nranks));
  if ((request.collective == Collective::kSend || request.collective == Collective::kRecv) && rank == request.root)
    return InvalidArgument(fmt::format("rank {} cannot {} itself", rank,
                                       request.collective == Collective::kSend ? "send to" : "receive from"));
  return Status::Ok();
}

Status ValidateRequest(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                       const PlanOptions& options, int rank) {
  if (static_cast<int>(algorithm) >= kNumAlgorithms)
    return InvalidArgument(fmt::format("algorithm {} does not exist", static_cast<int>(algorithm)));
  if (static_cast<int>(request.collective) >= kNumCollectives)
    return InvalidArgument(fmt::format("collective {} does not exist", static_cast<int>(request.collective)));
  if (request.nranks < 1) return InvalidArgument(fmt::format("nranks {} is not positive", request.nranks));
  if (shape.nranks != request.nranks)
    return InvalidArgument(
        fmt::format("the request has {} ranks, the communicator shape {}", request.nranks, shape.nranks));
  KZ_RETURN_IF_ERROR(shape.Validate());
  KZ_RETURN_IF_ERROR(CheckRank(algorithm, request, shape, rank));
  if (!IsValid(request.dtype))
    return InvalidArgument(fmt::format("data type {} does not exist", static_cast<int>(request.dtype)));
  if (IsReduction(request.collective) && !IsValid(request.op))
    return InvalidArgument(fmt::format("reduction op {} does not exist", static_cast<int>(request.op)));
  if (HasRoot(request.collective) && (request.root < 0 || request.root >= request.nranks))
    return InvalidArgument(fmt::format(
        "{} {} is not a rank of {}",
        request.collective == Collective::kSend || request.collective == Collective::kRecv ? "peer" : "root",
        request.root, request.nranks));
  const uint64_t per_rank_limit = kMaxBufferBytes / DataTypeSize(request.dtype) / static_cast<uint64_t>(request.nranks);
  if (request.count > per_rank_limit)
    return InvalidArgument(fmt::format("count {} is too large ({} elements of {} at most for {} ranks)", request.count,
                                       per_rank_limit, DataTypeName(request.dtype), request.nranks));
  if (options.chunk_count < 1) return InvalidArgument("chunk_count is 0: a step must move at least one element");
  if (options.channels < 1) return InvalidArgument(fmt::format("channels {} is not positive", options.channels));
  if (options.channels > kMaxChannels)
    return InvalidArgument(
        fmt::format("channels {} is more than the {} a plan may use", options.channels, kMaxChannels));
  const uint64_t largest = std::max(request.input_count(), request.output_count());
  if (algo::PieceCount(largest, options.chunk_count) > kMaxChunks)
    return InvalidArgument(fmt::format("chunk_count {} is too small for {} elements: more than {} chunks",
                                       options.chunk_count, largest, kMaxChunks));
  return Status::Ok();
}

// The avg epilogue: the rank's results (its whole output, or the root's for Reduce) divided by
// nranks, in place, in chunks.
void AddAvgEpilogue(const CollectiveRequest& request, uint64_t chunk, RankPlan& plan) {
  if (request.nranks == 1) return;        // dividing by 1 changes no value
  if (plan.rank >= request.nranks) return;  // an aggregation device has no output
  if (request.collective == Collective::kReduce && plan.rank != request.root) return;
  const uint64_t n = request.output_count();
  if (n == 0) return;
  plan.divisor = static_cast<uint32_t>(request.nranks);
  // In place, chunk by chunk: each element is read once and written once.
  for (uint64_t k = 0; k < algo::PieceCount(n, chunk); ++k) {
    const algo::Range pc = algo::Piece({0, n}, chunk, k);
    const Slice out{BufferKind::kOutput, pc.offset, pc.count};
    plan.epilogue.push_back(Step::Scale(out, out));
  }
}

}  // namespace

std::span<const AlgorithmImpl* const> AllAlgorithms() {
  static const std::array<const AlgorithmImpl*, kNumAlgorithms> table = {
      &algo::RingAlgorithm(),   &algo::TreeAlgorithm(),          &algo::RhdAlgorithm(),
      &algo::RdAlgorithm(),     &algo::PairwiseAlgorithm(),      &algo::P2pAlgorithm(),
      &algo::FusedAlgorithm(),  &algo::InaAlgorithm(),           &algo::HierRingAlgorithm(),
      &algo::HierRdAlgorithm(), &algo::HierFusedRingAlgorithm(), &algo::HierFusedRdAlgorithm(),
      &algo::FileAlgorithm(),   &algo::TorusAlgorithm(),         &algo::CyclesAlgorithm(),
  };
  return table;
}

const AlgorithmImpl& GetAlgorithm(Algorithm a) {
  const auto i = static_cast<size_t>(a);
  if (i >= AllAlgorithms().size()) {
    // A caller bug (BuildPlan checks first): there is no algorithm to return.
    std::fprintf(stderr, "kizuna: GetAlgorithm(%zu): no such algorithm\n", i);
    std::abort();
  }
  return *AllAlgorithms()[i];
}

Result<Plan> BuildPlan(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                       const PlanOptions& options, int rank) {
  std::vector<int> ranks;
  if (rank >= 0) ranks.push_back(rank);
  return BuildPlan(algorithm, request, shape, options, ranks, rank < 0);
}

Result<Plan> BuildPlan(Algorithm algorithm, const CollectiveRequest& request, const CommTopology& shape,
                       const PlanOptions& options, std::span<const int> ranks, bool every_rank) {
  const std::string context = fmt::format("{} plan for {}", AlgorithmName(algorithm), request.ToString());
  KZ_RETURN_IF_ERROR(
      ValidateRequest(algorithm, request, shape, options, ranks.empty() ? -1 : ranks[0]).WithContext(context));
  for (int rank : ranks) {
    if (rank < 0) return InvalidArgument(fmt::format("rank {} is negative", rank)).WithContext(context);
    KZ_RETURN_IF_ERROR(CheckRank(algorithm, request, shape, rank).WithContext(context));
  }
  const AlgorithmImpl& impl = GetAlgorithm(algorithm);
  KZ_RETURN_IF_ERROR(impl.Supports(request, shape).WithContext(request.ToString()));
  const bool avg = IsReduction(request.collective) && request.op == ReduceOp::kAvg;
  Plan plan;
  plan.request = request;
  plan.algorithm = algorithm;
  plan.chunk_count = options.chunk_count;
  plan.channels = options.channels;
  plan.aggregators = algorithm == Algorithm::kIna ? AggregatorCount(shape) : 0;
  std::vector<int> all;
  if (every_rank)
    for (int r = 0; r < plan.world(); ++r) all.push_back(r);
  for (int r : every_rank ? std::span<const int>(all) : ranks) {
    Result<RankPlan> built = impl.Build(request, shape, options, r);
    if (!built.ok()) return built.status().WithContext(request.ToString());
    RankPlan rp = std::move(built).value();
    // fused divides in its one pass (fused.cc), a plan that averages in its reduces there: no epilogue.
    if (avg && algorithm != Algorithm::kFused && !rp.averages) AddAvgEpilogue(request, options.chunk_count, rp);
    KZ_RETURN_IF_ERROR(ValidateRankPlan(request, rp, options.chunk_count, plan.aggregators)
                           .WithContext(fmt::format("{} built a bad plan", AlgorithmName(algorithm))));
    plan.ranks.push_back(std::move(rp));
  }
  return plan;
}

}  // namespace kizuna::collectives
