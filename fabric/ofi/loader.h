// libfabric, reached at run time through dlopen, so that kizuna builds and runs
// on a machine without it: there the ofi fabric reports kUnavailable with the reason.
//
// Almost all of libfabric's API (fi_domain, fi_endpoint, fi_tsend, fi_cq_read, fi_mr_reg, ...) is
// static inline in <rdma/fi_*.h>: each call goes through a function pointer in the ops table of
// the object it is given. Only the calls that create the first objects or describe errors are real
// symbols, and those are what the table below resolves. Code of this fabric must therefore never
// call those few directly — in particular not fi_allocinfo(), an inline wrapper of fi_dupinfo:
// use LibFabric::dupinfo(nullptr). Nothing links -lfabric; a stray direct call fails to link.
//
// Headers come from Debian's libfabric-dev (1.17): kApiVersion is the version the structures
// here are laid out for; a run-time library older than that is refused as unavailable.
#pragma once

#include <rdma/fabric.h>
#include <signal.h>

#include <cstdint>
#include <memory>
#include <set>
#include <source_location>
#include <string>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna::fabric::ofi {

inline constexpr const char* kDefaultLibrary = "libfabric.so.1";
inline constexpr uint32_t kApiVersion = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

// The resolved symbol table of one loaded libfabric. Immutable after Open; thread-safe.
class LibFabric {
 public:
  // dlopen()s `path` and resolves the table. kUnavailable, naming the library and the loader's
  // reason, when it cannot be loaded, lacks a symbol, or is older than kApiVersion.
  static Result<std::shared_ptr<const LibFabric>> Open(const std::string& path);
  // The process's libfabric (kDefaultLibrary), loaded on first use; later calls return the same
  // instance, or the same failure.
  static Result<std::shared_ptr<const LibFabric>> Default();

  LibFabric(const LibFabric&) = delete;
  LibFabric& operator=(const LibFabric&) = delete;

  // The real symbols.
  int (*getinfo)(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
                 fi_info** info) = nullptr;
  void (*freeinfo)(fi_info* info) = nullptr;
  fi_info* (*dupinfo)(const fi_info* info) = nullptr;  // dupinfo(nullptr) is fi_allocinfo()
  int (*open_fabric)(fi_fabric_attr* attr, fid_fabric** fabric, void* context) = nullptr;  // fi_fabric
  const char* (*strerror)(int errnum) = nullptr;
  uint32_t (*version)() = nullptr;

  const std::string& path() const { return path_; }
  uint32_t runtime_version() const { return runtime_version_; }
  std::string VersionString() const;  // "1.17"

  // Converts a libfabric return code (negative fi errno, as the fi_* calls return it) into a
  // Status naming the call, libfabric's text for the code, and where it was received. This is
  // the one place fi_* codes become kizuna codes (ErrorCode below).
  Status Error(int rc, std::string_view what, std::source_location where = std::source_location::current()) const;

 private:
  LibFabric() = default;
  std::string path_;
  uint32_t runtime_version_ = 0;
};

// The program's crash and termination signals (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGINT,
// SIGTERM) kept as they were across a scope that loads libfabric or lets it load and start its
// providers (dlopen, fi_getinfo, fi_fabric, fi_domain). Libraries libfabric links take them over:
// libinfinipath (the PSM provider's), loaded with libfabric.so.1 on Debian, installs handlers that
// print a backtrace and exit(1), so that a crash reports "exited with status 1" with no core dump,
// and SIGINT or SIGTERM no longer reach the program's own handlers. On leaving the scope, each of
// those signals whose handler changed to code in a library that appeared during such a scope gets
// its previous handler back (logged once per signal at INFO, naming the library); a handler whose
// code lies anywhere else (the program's, installed meanwhile by another thread) is left alone.
// Scopes nest and may run on several threads (one at a time: they take a process-wide lock).
class SignalHandlerGuard {
 public:
  explicit SignalHandlerGuard(std::string_view during);
  ~SignalHandlerGuard();
  SignalHandlerGuard(const SignalHandlerGuard&) = delete;
  SignalHandlerGuard& operator=(const SignalHandlerGuard&) = delete;

  // The signals kept, and how many.
  static constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGINT, SIGTERM};
  static constexpr size_t kCount = sizeof kSignals / sizeof kSignals[0];

 private:
  std::string during_;
  struct sigaction saved_[kCount];
  std::set<std::string> objects_before_;  // names of the objects loaded when the scope began
};

// The kizuna code for a (positive) fi errno: connection failures -> kRemoteError, bad arguments
// and truncation -> kInvalidArgument, missing features -> kNotSupported, ENOMEM -> kOutOfMemory,
// ETIMEDOUT -> kTimeout, cancellation -> kAborted, anything else -> kInternal.
StatusCode ErrorCode(int fi_errno);

// Whether a (positive) fi errno means the peer or the path to it is gone.
bool IsConnectionError(int fi_errno);

}  // namespace kizuna::fabric::ofi
