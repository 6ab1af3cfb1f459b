// What kizuna-bench measures, as nccl-tests defines it: the collectives, how a row's size in bytes
// becomes the counts and buffers of each rank, the sizes of a sweep, and the bus bandwidth factor.
//
// Sizes follow nccl-tests (src/common.cu, getCollByteCount of each test): a row's requested size
// S gives count = S / element size, and per collective
//   collective     count passed to the call   send buffer       recv buffer       in place
//   allreduce      count                      count             count             send = recv
//   reducescatter  count / n                  (count / n) * n   count / n         send = recv - rank * count/n
//   allgather      count / n                  count / n         (count / n) * n   send = recv + rank * count/n
//   broadcast      count                      count             count             send = recv
//   reduce         count                      count             count             send = recv
//   alltoall       count / n                  (count / n) * n   (count / n) * n   (not in place)
//   sendrecv       count                      count             count             (not in place)
// (elements; n ranks). The row's printed size is the larger buffer in bytes, so it may be below the
// requested size when S is not a multiple of n elements. sendrecv: every rank sends to rank + 1 and
// receives from rank - 1 (mod n), the two calls in one group.
//
// algbw = size / time; busbw = algbw * factor: allreduce 2(n-1)/n; reducescatter, allgather,
// alltoall (n-1)/n; broadcast, reduce, sendrecv 1 (README.md; nccl-tests' PERFORMANCE.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna::bench {

enum class BenchColl : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,
};

// "allreduce", "reducescatter", ... , "sendrecv".
std::string_view BenchCollName(BenchColl c);
// The names above, case-insensitively, plus nccl-tests' spellings ("all_reduce", "AllReduce",
// "reduce_scatter", "all_gather", "alltoall", "send_recv"). nullopt for anything else.
std::optional<BenchColl> ParseBenchColl(std::string_view name);
// "allreduce, reducescatter, allgather, broadcast, reduce, alltoall, sendrecv" (for messages).
std::string BenchCollNames();

bool IsReduction(BenchColl c);  // allreduce, reducescatter, reduce: the op matters
bool HasRoot(BenchColl c);      // broadcast, reduce
// The engine's collective whose choice and prediction describe the call (sendrecv: send).
collectives::Collective EngineCollective(BenchColl c);
// The bus bandwidth factor for n ranks (see the header comment).
double BusBwFactor(BenchColl c, int nranks);

// nccl-tests' names of the element types ("float", "half", "bfloat16", "int8", ...): the type column.
std::string_view NcclTypeName(DataType t);

// One row's counts for n ranks (see the table above), in elements of the row's type.
struct Geometry {
  uint64_t count = 0;       // passed to the call
  uint64_t send_count = 0;  // each rank's input
  uint64_t recv_count = 0;  // each rank's output
  // In place: the input starts at recv + rank * send_offset, the output at recv + rank * recv_offset.
  uint64_t send_offset = 0;
  uint64_t recv_offset = 0;
  bool in_place = true;  // false: the engine has no in-place form (alltoall, sendrecv)
  size_t elem = 1;       // bytes per element

  // The row's size: the larger buffer, in bytes.
  uint64_t size_bytes() const { return (send_count > recv_count ? send_count : recv_count) * elem; }
  // Elements the in-place arrangement needs in the receive buffer.
  uint64_t in_place_recv_count(int rank) const;
};

Geometry GeometryFor(BenchColl c, uint64_t requested_bytes, DataType t, int nranks);

// The requested sizes: min, then min * factor (factor > 1) or min + step, while <= max.
// kInvalidArgument when the sweep would never end (min 0 with a factor, step 0) or has more than
// kMaxSweepSizes sizes.
inline constexpr uint64_t kMaxSweepSizes = 10000;
Result<std::vector<uint64_t>> SweepSizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t step_bytes,
                                         uint64_t step_factor);

// "8", "64K", "1M", "2G", "1T" (binary multiples; "B", "KiB", ... and lower case accepted).
// kInvalidArgument naming `flag` for anything else or a value of 2^50 bytes or more.
Result<uint64_t> ParseByteSize(std::string_view text, std::string_view flag);

}  // namespace kizuna::bench
