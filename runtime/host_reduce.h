// Element-wise reductions of N host-addressable inputs into one output, for every DataType x
// ReduceOp: the CPU kernels behind the emulated device's streams, host staging and the CPU
// aggregation daemon.
//
// Semantics (shared with every device backend; the conformance suite checks them):
//  - dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], applied in input order.
//  - float16 / bfloat16 accumulate in float32 and round once (to nearest even) on the store.
//  - Integer sum / prod wrap modulo 2^bits; avg is defined in dtype.h.
//  - dst may be exactly one of the inputs (in place); any other overlap is invalid.
//  - n = 1 is a copy (avg of one input is that input).
#pragma once

#include <cstddef>
#include <span>

#include "runtime/dtype.h"
#include "runtime/status.h"

namespace kizuna {

// Validates and reduces. Large inputs are split across threads with oneTBB.
Status HostReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op);

// The same on one thread, without validation: the caller splits the range.
void HostReduceRange(void* dst, std::span<const void* const> srcs, size_t begin, size_t end, DataType type,
                     ReduceOp op);

// Copies with oneTBB splitting large copies across threads.
void HostCopy(void* dst, const void* src, size_t bytes);

}  // namespace kizuna
