// The limits behind memory and shared-memory space the kernel refuses, described for errors, so
// that a message says which limit was reached and where to raise it: the host's memory, the memory
// cgroup (a container's --memory), ulimit -v / -f / -l, and the size of a tmpfs such as /dev/shm
// (a container's --shm-size). Each figure names its source; one that cannot be read is left out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/core/status.h"

namespace kizuna {

// "64.0 KiB", "21.6 GiB", "512 bytes": a figure read from the system, rounded.
std::string ApproxByteSize(uint64_t bytes);

struct FileSystemSpace {
  uint64_t size_bytes = 0;
  uint64_t free_bytes = 0;  // what an unprivileged process may still use
};
// statvfs of `path`.
Result<FileSystemSpace> SpaceOf(const std::string& path);
// "/dev/shm has 64.0 KiB, 0 bytes free", or why that cannot be told.
std::string DescribeSpace(const std::string& path);

// The tightest memory limit of this process's cgroup (v2 memory.max, v1 memory.limit_in_bytes,
// over the cgroup and its ancestors): the limit, what the cgroup uses now, and the file; nullopt
// where no limit is set or none can be read.
struct CgroupMemoryLimit {
  uint64_t limit_bytes = 0;
  std::optional<uint64_t> used_bytes;
  std::string file;  // "/sys/fs/cgroup/memory/docker/ab12.../memory.limit_in_bytes"
};
std::optional<CgroupMemoryLimit> CgroupMemory();

// What bounds the memory this process can get, in one line for an error about memory the kernel
// refused: "the host has 21.6 GiB available of 23.5 GiB (/proc/meminfo); the cgroup's limit is
// 512 MiB with 500 MiB in use (/sys/fs/cgroup/.../memory.max); ulimit -v is 1.0 GiB".
std::string DescribeMemoryLimits();

// RLIMIT_FSIZE (ulimit -f) and RLIMIT_MEMLOCK (ulimit -l), soft limits; nullopt when unlimited.
std::optional<uint64_t> FileSizeLimit();
std::optional<uint64_t> LockedMemoryLimit();

}  // namespace kizuna
