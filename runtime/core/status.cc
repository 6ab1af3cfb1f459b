#include "runtime/core/status.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace kizuna {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kUnavailable: return "unavailable";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kOutOfMemory: return "out of memory";
    case StatusCode::kTimeout: return "timeout";
    case StatusCode::kAborted: return "aborted";
    case StatusCode::kRemoteError: return "remote error";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown status code";
}

Status::Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
  if (code_ == StatusCode::kOk) message_.clear();
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", StatusCodeName(code_), message_);
}

Status Status::WithContext(std::string_view context) const& {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_));
}

Status Status::WithContext(std::string_view context) && {
  if (ok()) return std::move(*this);
  message_ = fmt::format("{}: {}", context, message_);
  return std::move(*this);
}

Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status NotSupported(std::string m) { return Status(StatusCode::kNotSupported, std::move(m)); }
Status OutOfMemory(std::string m) { return Status(StatusCode::kOutOfMemory, std::move(m)); }
Status Timeout(std::string m) { return Status(StatusCode::kTimeout, std::move(m)); }
Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status RemoteError(std::string m) { return Status(StatusCode::kRemoteError, std::move(m)); }
Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

namespace {
// Bazel compiles with paths relative to the workspace ("runtime/core/status.cc"); keep those, and cut
// anything before the first top-level folder when a build used absolute paths.
std::string_view SourcePath(const char* path) {
  std::string_view p(path);
  for (std::string_view top : {"/runtime/", "/devices/", "/fabric/", "/collectives/", "/tests/", "/tools/",
                               "/examples/"}) {
    size_t pos = p.find(top);
    if (pos != std::string_view::npos) return p.substr(pos + 1);
  }
  return p;
}
}  // namespace

Status FromErrno(int err, std::string_view what, std::source_location where) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case ENOMEM: case ENOSPC: code = StatusCode::kOutOfMemory; break;
    case ETIMEDOUT: code = StatusCode::kTimeout; break;
    case EINVAL: case EBADF: case EFAULT: code = StatusCode::kInvalidArgument; break;
    case ENOENT: case ENODEV: case ENXIO: case ENOSYS: code = StatusCode::kUnavailable; break;
    case ECONNRESET: case EPIPE: case ECONNREFUSED: code = StatusCode::kRemoteError; break;
    default: break;
  }
  // The limit behind the commonest trap of jobs with many peers: sockets and mapped buffers are
  // descriptors, and the default soft limit (1024) is soon reached.
  std::string hint;
  if (err == EMFILE) {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0)
      hint = fmt::format(" (this process may hold {} descriptors, ulimit -n: raise it; connections to peers and "
                         "buffers mapped from them each hold some)",
                         limit.rlim_cur);
  } else if (err == ENFILE) {
    hint = " (the system's table of open files is full: /proc/sys/fs/file-max)";
  }
  return Status(code, fmt::format("{} failed: {} (errno {}){} [{}:{}]", what, std::strerror(err), err, hint,
                                  SourcePath(where.file_name()), where.line()));
}

Status FromForeign(StatusCode code, std::string_view domain, std::string_view what, int64_t foreign_code,
                   std::string_view foreign_name, std::source_location where) {
  return Status(code, fmt::format("{} failed: {} error {} ({}) [{}:{}]", what, domain, foreign_code,
                                  foreign_name, SourcePath(where.file_name()), where.line()));
}

void DieOnBadResultAccess(const Status& status) {
  std::fprintf(stderr, "kizuna: value() called on a failed Result: %s\n", status.ToString().c_str());
  std::abort();
}

std::string ShownText(std::string_view text) {
  constexpr size_t kShownBytes = 64;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kShownBytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (text.size() > kShownBytes) out += fmt::format("...({} bytes)", text.size());
  return out;
}

}  // namespace kizuna
