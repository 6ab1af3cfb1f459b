#include "fabric/ofi/loader.h"

#include <dlfcn.h>
#include <link.h>
#include <rdma/fi_errno.h>
#include <string.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric::ofi {
namespace {

// Three ofi_rxm defaults that do not fit how this fabric uses libfabric are changed before
// libfabric reads its parameters (on the first fi_getinfo), unless the user set them:
//  - FI_OFI_RXM_USE_RNDV_WRITE=1: 1.17's read-based rendezvous (the receiver reads the sender's
//    buffer) crashes inside fi_close when an endpoint closes while such a read is in flight — a
//    peer closing mid-transfer; the write-based one fails the peer's transfer cleanly.
//  - FI_OFI_RXM_MSG_RX_SIZE=16 (default 128): each comm has its own endpoint, and with 128
//    every endpoint preallocates and touches ~70 MB of receive buffers (~0.25 s to open one on
//    the build machines); with 16, ~18 MB. Receives land in the user's buffers (rendezvous) or
//    are few and small (eager), so the deeper queue buys nothing here.
//  - FI_OFI_RXM_EAGER_LIMIT=2 MiB (default 16 KiB): over tcp (rxm's dynamic receive buffers; verbs
//    ignores it) a message up to this size goes at once, straight into the receive this fabric
//    has always posted before its send starts (transfer.h), instead of paying rxm's rendezvous
//    round trips. 2 MiB is the collective executor's chunk when peers are over a network
//    (collectives/executor/internal.h, kNetworkChunkBytes). Between two network namespaces it
//    made 2-rank AllReduces faster at 1 and 64 MiB (docs/RACE.md, "Between the 09:11 and 11:42
//    runs"). Every rank must use the same value: rxm refuses a connection between endpoints whose
//    eager limits differ.
void PrepareProviderEnvironment() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct Default {
      const char* name;
      const char* value;
    };
    for (const Default& d : {Default{"FI_OFI_RXM_USE_RNDV_WRITE", "1"}, Default{"FI_OFI_RXM_MSG_RX_SIZE", "16"},
                             Default{"FI_OFI_RXM_EAGER_LIMIT", "2097152"}}) {
      if (std::getenv(d.name) != nullptr) continue;
      ::setenv(d.name, d.value, 0);
      KZ_INFO(kLogFabric, "ofi: {}={} (kizuna's default; set it to override)", d.name, d.value);
    }
  });
}

std::string VersionText(uint32_t v) { return fmt::format("{}.{}", FI_MAJOR(v), FI_MINOR(v)); }

template <typename F>
bool Resolve(void* handle, const char* name, F* out, std::string* missing) {
  void* sym = ::dlsym(handle, name);
  if (sym == nullptr) {
    *missing += (missing->empty() ? "" : ", ") + std::string(name);
    return false;
  }
  *out = reinterpret_cast<F>(sym);
  return true;
}

// What SignalHandlerGuard's scopes share.
struct GuardState {
  std::recursive_mutex mu;                       // held for the whole of a scope
  std::set<std::string> brought_in;              // objects that appeared during a scope (guarded by mu)
  bool logged[SignalHandlerGuard::kCount] = {};  // guarded by mu
};

GuardState& Guards() {
  static auto* state = new GuardState();  // never destroyed: fabrics may be created during exit
  return *state;
}

std::set<std::string> LoadedObjects() {
  std::set<std::string> names;
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        static_cast<std::set<std::string>*>(out)->insert(info->dlpi_name != nullptr ? info->dlpi_name : "");
        return 0;
      },
      &names);
  return names;
}

void* HandlerCode(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(a.sa_sigaction)
                                        : reinterpret_cast<void*>(a.sa_handler);
}

}  // namespace

SignalHandlerGuard::SignalHandlerGuard(std::string_view during) : during_(during) {
  Guards().mu.lock();
  for (size_t i = 0; i < kCount; ++i) ::sigaction(kSignals[i], nullptr, &saved_[i]);
  objects_before_ = LoadedObjects();
}

SignalHandlerGuard::~SignalHandlerGuard() {
  GuardState& state = Guards();
  for (const std::string& name : LoadedObjects())
    if (!objects_before_.contains(name)) state.brought_in.insert(name);
  for (size_t i = 0; i < kCount; ++i) {
    struct sigaction now {};
    if (::sigaction(kSignals[i], nullptr, &now) != 0) continue;
    void* code = HandlerCode(now);
    if (code == HandlerCode(saved_[i])) continue;
    // Only a handler of a library that came with libfabric: SIG_DFL and SIG_IGN are in no object,
    // and the program's own code is in objects that were loaded before.
    Dl_info where{};
    if (code == reinterpret_cast<void*>(SIG_DFL) || code == reinterpret_cast<void*>(SIG_IGN) ||
        ::dladdr(code, &where) == 0 || where.dli_fname == nullptr || !state.brought_in.contains(where.dli_fname))
      continue;
    if (::sigaction(kSignals[i], &saved_[i], nullptr) != 0) continue;
    if (!state.logged[i]) {
      state.logged[i] = true;
      KZ_INFO(kLogFabric,
              "ofi: {} (loaded with libfabric) replaced the SIG{} handler during {}; the previous one is "
              "restored, so that the program keeps its own handling (a crash stays a crash, with its core dump)",
              where.dli_fname, ::sigabbrev_np(kSignals[i]), during_);
    }
  }
  state.mu.unlock();
}

StatusCode ErrorCode(int fi_errno) {
  switch (fi_errno) {
    case FI_ENOMEM: case FI_ENOSPC: case FI_ENOBUFS: return StatusCode::kOutOfMemory;
    case FI_ETIMEDOUT: return StatusCode::kTimeout;
    case FI_EINVAL: case FI_EBADF: case FI_EFAULT: case FI_EBADFLAGS: case FI_EMSGSIZE: case FI_ETRUNC:
    case FI_ETOOSMALL: case FI_EKEYREJECTED: case FI_EADDRNOTAVAIL:
      return StatusCode::kInvalidArgument;
    case FI_ENOSYS: case FI_EOPNOTSUPP: case FI_ENODATA: case FI_ENOPROTOOPT:
      return StatusCode::kNotSupported;
    case FI_ECANCELED: return StatusCode::kAborted;
    default: break;
  }
  return IsConnectionError(fi_errno) ? StatusCode::kRemoteError : StatusCode::kInternal;
}

bool IsConnectionError(int fi_errno) {
  switch (fi_errno) {
    case FI_ECONNREFUSED: case FI_ECONNRESET: case FI_ECONNABORTED: case FI_ENOTCONN: case FI_ESHUTDOWN:
    case FI_EHOSTUNREACH: case FI_EHOSTDOWN: case FI_ENETUNREACH: case FI_ENETDOWN: case FI_EIO: case EPIPE:
    case FI_EREMOTEIO:
      return true;
    default: return false;
  }
}

std::string LibFabric::VersionString() const { return VersionText(runtime_version_); }

Status LibFabric::Error(int rc, std::string_view what, std::source_location where) const {
  const int err = rc < 0 ? -rc : rc;
  return FromForeign(ErrorCode(err), "libfabric", what, -err, strerror != nullptr ? strerror(err) : "?", where);
}

Result<std::shared_ptr<const LibFabric>> LibFabric::Open(const std::string& path) {
  ::dlerror();
  // Never dlclose()d: providers start threads and register handlers that must outlive every
  // object created from the library, and unloading it while any of them runs is undefined.
  void* handle = nullptr;
  std::string why;
  {
    SignalHandlerGuard keep_signals(fmt::format("dlopen({})", path));
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* error = handle == nullptr ? ::dlerror() : nullptr;
    why = error != nullptr ? error : "unknown reason";
  }
  if (handle == nullptr) {
    return Unavailable(
        fmt::format("libfabric is not installed here: dlopen({}) failed: {} (install libfabric1, "
                    "or point the loader at it)",
                    path, why));
  }
  std::shared_ptr<LibFabric> lib(new LibFabric());
  lib->path_ = path;
  std::string missing;
  Resolve(handle, "fi_getinfo", &lib->getinfo, &missing);
  Resolve(handle, "fi_freeinfo", &lib->freeinfo, &missing);
  Resolve(handle, "fi_dupinfo", &lib->dupinfo, &missing);
  Resolve(handle, "fi_fabric", &lib->open_fabric, &missing);
  Resolve(handle, "fi_strerror", &lib->strerror, &missing);
  Resolve(handle, "fi_version", &lib->version, &missing);
  if (!missing.empty())
    return Unavailable(fmt::format("{} is not a usable libfabric: it lacks {}", path, missing));
  lib->runtime_version_ = lib->version();
  if (FI_MAJOR(lib->runtime_version_) != FI_MAJOR(kApiVersion) || lib->runtime_version_ < kApiVersion)
    return Unavailable(fmt::format("{} is libfabric {}, older than (or incompatible with) the {} this build needs",
                                   path, VersionText(lib->runtime_version_), VersionText(kApiVersion)));
  PrepareProviderEnvironment();
  KZ_INFO(kLogFabric, "ofi: loaded {} (libfabric {}, API {})", path, lib->VersionString(), VersionText(kApiVersion));
  return std::shared_ptr<const LibFabric>(std::move(lib));
}

Result<std::shared_ptr<const LibFabric>> LibFabric::Default() {
  static std::mutex mu;
  static std::shared_ptr<const LibFabric> loaded;
  static Status failure;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded != nullptr) return loaded;
  if (!failure.ok()) return failure;
  auto r = Open(kDefaultLibrary);
  if (!r.ok()) {
    failure = r.status();
    return failure;
  }
  loaded = *r;
  return loaded;
}

}  // namespace kizuna::fabric::ofi
