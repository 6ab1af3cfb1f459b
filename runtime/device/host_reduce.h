// Element-wise reductions of N host-addressable inputs into one output, for every DataType x
// ReduceOp, and the division that finishes an average (HostScale): the CPU kernels behind the
// emulated device's streams, host staging and the CPU aggregation daemon.
//
// Semantics (shared with every device backend; the conformance suite checks them):
//  - dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], applied in input order.
//  - float16 / bfloat16 accumulate in float32 and round once (to nearest even) on the store.
//  - Integer sum / prod wrap modulo 2^bits; avg is defined in dtype.h.
//  - Floating min / max are IEEE 754-2019's minimum / maximum, whatever the order of the inputs:
//    -0 < +0 (max(+0, -0) = +0, min(+0, -0) = -0), and any NaN input gives the canonical quiet
//    NaN (positive, payload 0: float16 0x7e00, bfloat16 0x7fc0, float32 0x7fc00000, float64
//    0x7ff8000000000000). So the result is a function of the set of inputs, and ranks that
//    combine the same values in different orders store the same bits. (One input is a copy.)
//  - dst may be exactly one of the inputs (in place); any other overlap is invalid.
//  - n = 1 is a copy (avg of one input is that input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna {

// Validates and reduces. Large inputs are split across threads with oneTBB.
Status HostReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op);

// The reduction written to every output of `dsts` (disjoint from each other; each may be exactly
// one input, as in place), in one pass: a block is reduced into dsts[0] while the inputs stream
// by, then copied from the cache into the other outputs, so memory sees each input read once
// and each output written once (a reduce followed by copies would read dsts[0] back from memory
// once per other output). Validates as HostReduce; large counts are split across threads.
Status HostReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                       ReduceOp op);

// The same on one thread, without validation: the caller splits the range.
void HostReduceRange(void* dst, std::span<const void* const> srcs, size_t begin, size_t end, DataType type,
                     ReduceOp op);

// dst[i] = src[i] / divisor for i < count: the second half of ReduceOp::kAvg when the sum was
// formed elsewhere (a collective sums over all ranks, then divides once by the rank count:
// averaging partial averages would be wrong, avg(avg(a, b), c) != avg(a, b, c)).
//
// Semantics: exactly dtype.h's kAvg applied to one already-summed input (the input stands for
// kAvg's accumulator), so HostScale(HostReduce(kSum), n inputs) equals HostReduce(kAvg) bit for
// bit for integer, float32 and float64 types; for float16 / bfloat16 it does whenever the stored
// sum was exact (otherwise the sum was already rounded once to the type when it was stored):
//  - float16 / bfloat16 / float32: the element widened to float32, divided by float(divisor),
//    rounded once to the type (to nearest even); float64: divided in float64. The divisor is
//    converted to the accumulation type first, as kAvg converts its input count (exact up to
//    2^24 for float32).
//  - Integer types: truncation toward zero. Signed types divide the value as the signed type
//    (-7 / 2 = -3); unsigned types as unsigned. No overflow is possible (the divisor is >= 1).
//  - dst may equal src (in place); any other overlap is invalid.
//  - divisor 0 is kInvalidArgument; count 0 is valid and touches nothing.
// Validates, then scales; large counts are split across threads with oneTBB.
Status HostScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor);

// The same on one thread over elements [begin, end), without validation (divisor >= 1, a valid
// type): the caller splits the range.
void HostScaleRange(void* dst, const void* src, size_t begin, size_t end, DataType type, uint32_t divisor);

// Copies with oneTBB splitting large copies across threads; dst and src may overlap. A large
// copy (4 MiB or more, not overlapping) stores non-temporally: its output is not left in the
// caches (it would not fit them), and memory sees it written once without being read first.
void HostCopy(void* dst, const void* src, size_t bytes);

// src copied into every output of `dsts`, block by block, so src is read from memory once
// however many outputs there are (a broadcast); non-temporal stores when the outputs add up to
// 4 MiB or more, as HostCopy. The outputs must not overlap src or each other.
void HostCopyMulti(std::span<void* const> dsts, const void* src, size_t bytes);

// While one is alive (and made with serial = true), HostReduce, HostReduceMulti, HostScale,
// HostCopy and HostCopyMulti called on this thread run on it alone instead of splitting large work across oneTBB's
// threads: for callers that already run more threads than there are CPUs (ranks in several
// processes outnumbering the CPUs, where 1 MiB AllReduces ran faster this way: docs/PERFORMANCE.md,
// "Oversubscribed ranks keep their CPU work on one thread").
class ScopedSerialHostWork {
 public:
  explicit ScopedSerialHostWork(bool serial = true);
  ~ScopedSerialHostWork();
  ScopedSerialHostWork(const ScopedSerialHostWork&) = delete;
  ScopedSerialHostWork& operator=(const ScopedSerialHostWork&) = delete;

 private:
  bool previous_;
};

}  // namespace kizuna
