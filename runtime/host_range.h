// Plain host memory a caller passes where a communicator takes it (Communicator::TakesHostMemory):
// nothing else vouches for such a pointer, so before an operation reads or writes it, the range is
// checked against this process's mappings — a wild pointer, a read-only page or a buffer that
// runs off the end of its mapping is refused with kInvalidArgument naming the range, instead of
// crashing inside a reduction. A range inside one mapping of a too-large heap region cannot be
// told from a good one: what is checked is what the kernel knows. Nor can memory unmapped since it
// was last seen mapped (use after free: the cache still holds the old mapping) — checking that on
// every call would cost a system call per buffer, as much as a small operation itself.
#pragma once

#include <cstddef>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna {

// [p, p + bytes) lies in readable mappings of this process (and writable ones when `written`).
// The mappings are cached and re-read (/proc/self/maps) only when a range is not inside the
// cached ones, so a call with buffers seen before costs a lookup, not a system call.
Status CheckHostRange(const void* p, size_t bytes, bool written, std::string_view what);

}  // namespace kizuna
