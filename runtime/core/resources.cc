#include "runtime/core/resources.h"

#include <sys/resource.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace kizuna {

namespace {

// The first line of a small file (a cgroup or /proc figure), or nullopt.
std::optional<std::string> FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<uint64_t> Number(const std::optional<std::string>& text) {
  if (!text || text->empty() || text->find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  try {
    return std::stoull(*text);
  } catch (...) {
    return std::nullopt;
  }
}

// Where the memory controller's hierarchy is mounted, and the cgroup root that mount shows
// (mountinfo's 4th field: not "/" where a container sees only its part of the tree).
struct MemoryHierarchy {
  std::string mount_point;
  std::string mount_root;
  bool v2 = false;
};

std::vector<MemoryHierarchy> MemoryHierarchies() {
  std::vector<MemoryHierarchy> found;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 5 || dash + 1 >= f.size()) continue;
    const std::string& fstype = f[dash + 1];
    const std::string super = dash + 3 < f.size() ? f[dash + 3] : "";
    if (fstype == "cgroup2") found.push_back({f[4], f[3], true});
    if (fstype == "cgroup" && ("," + super + ",").find(",memory,") != std::string::npos)
      found.push_back({f[4], f[3], false});
  }
  return found;
}

// This process's cgroup path in the hierarchy: v2's "0::PATH" line, or v1's line naming memory.
std::optional<std::string> CgroupPath(bool v2) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (v2 ? (line.substr(0, a) == "0" && controllers.empty())
           : ("," + controllers + ",").find(",memory,") != std::string::npos)
      return line.substr(b + 1);
  }
  return std::nullopt;
}

}  // namespace

std::string ApproxByteSize(uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, kUnits[unit]);
}

Result<FileSystemSpace> SpaceOf(const std::string& path) {
  struct statvfs st {};
  if (::statvfs(path.c_str(), &st) != 0) return FromErrno(errno, fmt::format("statvfs({})", path));
  FileSystemSpace s;
  s.size_bytes = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  s.free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  return s;
}

std::string DescribeSpace(const std::string& path) {
  auto s = SpaceOf(path);
  if (!s.ok()) return fmt::format("the size of {} is unknown ({})", path, s.status().message());
  return fmt::format("{} has {}, {} free", path, ApproxByteSize(s->size_bytes), ApproxByteSize(s->free_bytes));
}

std::optional<CgroupMemoryLimit> CgroupMemory() {
  std::optional<CgroupMemoryLimit> tightest;
  for (const MemoryHierarchy& h : MemoryHierarchies()) {
    std::optional<std::string> path = CgroupPath(h.v2);
    if (!path) continue;
    std::string rel = *path;
    if (h.mount_root != "/" && rel.rfind(h.mount_root, 0) == 0) rel = rel.substr(h.mount_root.size());
    if (rel.empty()) rel = "/";
    // The cgroup and its ancestors: the smallest limit on the way up is the one that applies.
    while (true) {
      const std::string dir = h.mount_point + (rel == "/" ? "" : rel);
      const std::string limit_file = dir + (h.v2 ? "/memory.max" : "/memory.limit_in_bytes");
      // v1 writes "no limit" as a huge page-aligned number, v2 as "max".
      const std::optional<uint64_t> limit = Number(FirstLine(limit_file));
      if (limit && *limit < (uint64_t{1} << 62) && (!tightest || *limit < tightest->limit_bytes)) {
        tightest = CgroupMemoryLimit{
            *limit, Number(FirstLine(dir + (h.v2 ? "/memory.current" : "/memory.usage_in_bytes"))), limit_file};
      }
      if (rel == "/") break;
      const size_t slash = rel.rfind('/');
      rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
    }
  }
  return tightest;
}

std::optional<uint64_t> FileSizeLimit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_FSIZE, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<uint64_t>(l.rlim_cur);
}

std::optional<uint64_t> LockedMemoryLimit() {
  rlimit l{};
  if (::getrlimit(RLIMIT_MEMLOCK, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<uint64_t>(l.rlim_cur);
}

std::string DescribeMemoryLimits() {
  std::vector<std::string> parts;
  std::optional<uint64_t> total, available;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (in >> key >> kib) {
      std::getline(in, unit);
      if (key == "MemTotal:") total = kib * 1024;
      if (key == "MemAvailable:") available = kib * 1024;
    }
  }
  if (total && available)
    parts.push_back(fmt::format("the host has {} available of {} (/proc/meminfo)", ApproxByteSize(*available),
                                ApproxByteSize(*total)));
  if (std::optional<CgroupMemoryLimit> cg = CgroupMemory()) {
    parts.push_back(
        fmt::format("the memory cgroup's limit is {}{} ({}; a container's --memory)", ApproxByteSize(cg->limit_bytes),
                    cg->used_bytes ? " with " + ApproxByteSize(*cg->used_bytes) + " in use" : "", cg->file));
  }
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    parts.push_back(fmt::format("the address space is limited to {} (ulimit -v)",
                                ApproxByteSize(static_cast<uint64_t>(as.rlim_cur))));
  if (parts.empty()) return "no memory figure of this host could be read";
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

}  // namespace kizuna
