#include "runtime/host_range.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace kizuna {
namespace {

struct Mapping {
  uintptr_t start = 0, end = 0;
  bool read = false, write = false;
};

class Mappings {
 public:
  // ok, or why [start, end) is not fully covered by mappings with the permissions needed.
  Status Check(uintptr_t start, uintptr_t end, bool written) const {
    uintptr_t at = start;
    auto it = std::upper_bound(maps_.begin(), maps_.end(), at, [](uintptr_t a, const Mapping& m) { return a < m.end; });
    while (at < end) {
      if (it == maps_.end() || it->start > at)
        return InvalidArgument(fmt::format("{:#x} is not mapped in this process", at));
      if (!it->read) return InvalidArgument(fmt::format("{:#x} is in a mapping that cannot be read", at));
      if (written && !it->write) return InvalidArgument(fmt::format("{:#x} is in a read-only mapping", at));
      at = it->end;
      ++it;
    }
    return Status::Ok();
  }

  // Re-reads /proc/self/maps. Lines are "start-end perms offset dev inode path".
  Status Load() {
    const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Unavailable("cannot read /proc/self/maps");
    std::string text;
    char chunk[1 << 16];
    while (true) {
      const ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(chunk, static_cast<size_t>(n));
    }
    ::close(fd);
    std::vector<Mapping> maps;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      const std::string line = text.substr(pos, eol - pos);
      pos = eol + 1;
      uintptr_t start = 0, end = 0;
      char perms[5] = {};
      if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s", &start, &end, perms) != 3) continue;
      maps.push_back({start, end, perms[0] == 'r', perms[1] == 'w'});
    }
    std::sort(maps.begin(), maps.end(), [](const Mapping& a, const Mapping& b) { return a.start < b.start; });
    maps_ = std::move(maps);
    return Status::Ok();
  }

 private:
  std::vector<Mapping> maps_;
};

std::shared_mutex mu;
Mappings* cache = nullptr;  // guarded by mu; created on first use, never freed (a process-wide table)

}  // namespace

Status CheckHostRange(const void* p, size_t bytes, bool written, std::string_view what) {
  if (bytes == 0) return Status::Ok();
  const auto start = reinterpret_cast<uintptr_t>(p);
  if (start + bytes < start) return InvalidArgument(fmt::format("{}: [{}, +{} bytes) wraps around", what, p, bytes));
  const uintptr_t end = start + bytes;
  {
    std::shared_lock lock(mu);
    if (cache != nullptr && cache->Check(start, end, written).ok()) return Status::Ok();
  }
  // Not inside what was mapped when last looked: look again (memory mapped since, or a bad range).
  std::unique_lock lock(mu);
  if (cache == nullptr) cache = new Mappings;
  KZ_RETURN_IF_ERROR(cache->Load());
  Status s = cache->Check(start, end, written);
  if (!s.ok())
    return InvalidArgument(fmt::format("{}: host memory [{}, +{} bytes) cannot be {}: {}", what, p, bytes,
                                       written ? "written" : "read", s.message()));
  return Status::Ok();
}

}  // namespace kizuna
