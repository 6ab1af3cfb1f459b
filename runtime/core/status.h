// Status and Result<T>: errors are values.
//
// Every fallible call in kizuna returns a [[nodiscard]] Status or Result<T>. Foreign error codes
// (errno, CUDA, ibverbs, libfabric, Level Zero, plugin ABI codes) are converted once, at the
// boundary where they are received, with FromErrno / FromForeign, which record file and line.
// No exception crosses a kizuna API.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kizuna {

// Two different "no"s: kNotSupported means "this backend/algorithm cannot do this,
// try the next one"; kUnavailable means "no hardware or library here" (tests skip, saying why).
// Text from outside (an environment value, a file, a peer) as an error message or a warning shows
// it: printable ASCII, backslash and every other byte as \xNN, at most 64 bytes of it ("...(N
// bytes)" after), so that a message stays one short line whatever the text held.
std::string ShownText(std::string_view text);

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kUnavailable,
  kNotSupported,
  kOutOfMemory,
  kTimeout,
  kAborted,
  kRemoteError,
  kInternal,
};

// "ok", "invalid argument", ... (stable strings; also used by the C API).
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "invalid argument: count 3 is not a multiple of ..." or "ok".
  std::string ToString() const;

  // Prefixes the message with context ("AllReduce: ..."); no-op on ok.
  Status WithContext(std::string_view context) const&;
  Status WithContext(std::string_view context) &&;

  // Explicitly discards a status whose failure does not matter at this place.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Shorthand constructors: kizuna::InvalidArgument("count is negative").
Status InvalidArgument(std::string message);
Status Unavailable(std::string message);
Status NotSupported(std::string message);
Status OutOfMemory(std::string message);
Status Timeout(std::string message);
Status Aborted(std::string message);
Status RemoteError(std::string message);
Status Internal(std::string message);

// Converts an errno value from `what` (a call name such as "memfd_create") into a Status naming
// the call, the error and where it was received. ENOMEM -> out of memory, ETIMEDOUT -> timeout,
// EINVAL/EBADF -> invalid argument, ENOENT/ENODEV -> unavailable, others -> internal.
Status FromErrno(int err, std::string_view what,
                 std::source_location where = std::source_location::current());

// Converts a foreign library's error (domain such as "cuda", "ibverbs"; its numeric code and
// name) into a Status of the given kizuna code, naming the call and where it was received.
Status FromForeign(StatusCode code, std::string_view domain, std::string_view what, int64_t foreign_code,
                   std::string_view foreign_name,
                   std::source_location where = std::source_location::current());

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit like StatusOr
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) v_ = Status(StatusCode::kInternal, "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // Precondition: ok(). Checked: a violation aborts with the status (a programming error).
  T& value() & { Check(); return std::get<T>(v_); }
  const T& value() const& { Check(); return std::get<T>(v_); }
  T&& value() && { Check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void Check() const;
  std::variant<Status, T> v_;
};

[[noreturn]] void DieOnBadResultAccess(const Status& status);

template <typename T>
void Result<T>::Check() const {
  if (!ok()) DieOnBadResultAccess(std::get<Status>(v_));
}

}  // namespace kizuna

#define KZ_CONCAT_INNER_(a, b) a##b
#define KZ_CONCAT_(a, b) KZ_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not ok.
#define KZ_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::kizuna::Status kz_status_ = (expr);            \
    if (!kz_status_.ok()) return kz_status_;         \
  } while (0)

// `KZ_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an ok Result or returns its status.
#define KZ_ASSIGN_OR_RETURN(lhs, expr) \
  KZ_ASSIGN_OR_RETURN_IMPL_(KZ_CONCAT_(kz_result_, __LINE__), lhs, expr)
#define KZ_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
