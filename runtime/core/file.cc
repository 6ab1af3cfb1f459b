#include "runtime/core/file.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "runtime/core/deadline.h"
#include "runtime/core/unique_fd.h"

namespace kizuna {
namespace {

constexpr size_t kChunk = size_t{64} << 10;

std::string ErrnoText(int err) { return fmt::format("{} (errno {})", std::strerror(err), err); }

}  // namespace

std::string ByteSizeName(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) return fmt::format("{} GiB", bytes >> 30);
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (size_t{1} << 10) && bytes % (size_t{1} << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

Result<std::string> ReadFileCapped(const std::string& path, size_t cap, std::string_view what, double timeout_s) {
  const std::string name = fmt::format("{} {}", what, path);
  const Deadline deadline = Deadline::AfterSeconds(timeout_s);
  // Non-blocking: opening a FIFO must not wait for a writer, nor reading a silent one forever.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return InvalidArgument(fmt::format("{}: cannot open: {}", name, ErrnoText(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return InvalidArgument(fmt::format("{}: cannot stat: {}", name, ErrnoText(errno)));
  if (S_ISDIR(st.st_mode)) return InvalidArgument(fmt::format("{}: is a directory", name));
  const auto too_large = [&] { return InvalidArgument(fmt::format("{}: larger than {}", name, ByteSizeName(cap))); };
  std::string text;
  if (S_ISREG(st.st_mode)) {
    if (st.st_size > 0 && static_cast<uint64_t>(st.st_size) > cap) return too_large();
    text.reserve(static_cast<size_t>(st.st_size) + 1);
  }
  // At most cap + 1 bytes: one byte past the cap proves the source too large.
  while (true) {
    const size_t want = std::min(kChunk, cap + 1 - text.size());
    const size_t old = text.size();
    text.resize(old + want);
    const ssize_t n = ::read(fd.get(), text.data() + old, want);
    const int err = errno;
    text.resize(old + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n > 0) {
      if (text.size() > cap) return too_large();
      continue;
    }
    if (n == 0) break;
    if (err == EINTR) continue;
    if (err != EAGAIN && err != EWOULDBLOCK)
      return InvalidArgument(fmt::format("{}: cannot read: {}", name, ErrnoText(err)));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    if (left <= 0)
      return Timeout(
          fmt::format("{}: no data within {:.1f} s (a pipe or device whose writer stays silent)", name, timeout_s));
    pollfd p{fd.get(), POLLIN, 0};
    (void)::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
  }
  return text;
}

}  // namespace kizuna
