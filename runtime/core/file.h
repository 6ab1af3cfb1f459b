// Reading files that users and other programs hand to kizuna (topology files, INA layouts, unique
// id files) without trusting their size or their kind.
//
// A path may name anything: a regular file, /dev/zero, a FIFO whose writer never closes it, a
// terminal. ReadFileCapped reads at most `cap` + 1 bytes, so an endless source is refused with an
// error naming the limit instead of growing the process until the OOM killer ends it, and it waits
// for a silent pipe only until its deadline.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna {

// The cap of configuration files (topology files, INA layouts): generous for the largest valid
// ones (a 65536-node topology file is about 9 MiB), small enough to refuse garbage quickly.
inline constexpr size_t kMaxConfigFileBytes = size_t{16} << 20;

// How long a pipe or device may stay silent before ReadFileCapped gives up.
inline constexpr double kReadFileTimeoutS = 60.0;

// Reads `path` whole. `what` names the file in errors, which are kInvalidArgument (kTimeout for a
// silent pipe) and start with "<what> <path>: ":
//   "KIZUNA_TOPOLOGY file /dev/zero: larger than 16 MiB"
//   "KIZUNA_TOPOLOGY file /no/such.json: cannot open: No such file or directory (errno 2)"
//   "KIZUNA_TOPOLOGY file /etc: is a directory"
// A regular file larger than `cap` is refused before reading; anything else is read until its end
// or until more than `cap` bytes arrived. A FIFO without a writer reads as empty (it is opened
// without waiting for one); one whose writer stays silent fails after `timeout_s`.
Result<std::string> ReadFileCapped(const std::string& path, size_t cap, std::string_view what = "file",
                                   double timeout_s = kReadFileTimeoutS);

// "16 MiB", "4 KiB", "1000 bytes": a byte count as errors name limits.
std::string ByteSizeName(size_t bytes);

}  // namespace kizuna
