// PMIx, Open MPI's launcher store (launcher_kvs.h): libpmix.so.2 through dlopen, built against
// Debian's headers (libpmix-dev) for the structures' layout.
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <string>

#include <fmt/format.h>
#include <pmix.h>

#include "runtime/bootstrap/launcher_kvs.h"

namespace kizuna::bootstrap {

namespace {

struct PmixApi {
  decltype(&PMIx_Init) init = nullptr;
  decltype(&PMIx_Finalize) finalize = nullptr;
  decltype(&PMIx_Put) put = nullptr;
  decltype(&PMIx_Commit) commit = nullptr;
  decltype(&PMIx_Fence) fence = nullptr;
  decltype(&PMIx_Get) get = nullptr;
  decltype(&PMIx_Error_string) error_string = nullptr;
};

// The library, loaded once for the process and never unloaded (MPI may use it too).
const PmixApi* LoadPmix(std::string* why) {
  static const PmixApi* api = [&]() -> const PmixApi* {
    void* lib = ::dlopen("libpmix.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      *why = fmt::format("libpmix.so.2 could not be loaded ({}); install Debian's libpmix2", ::dlerror());
      return nullptr;
    }
    auto* a = new PmixApi();
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (fn == nullptr) {
        *why = fmt::format("libpmix.so.2 has no {}", name);
        ok = false;
      }
    };
    sym(a->init, "PMIx_Init");
    sym(a->finalize, "PMIx_Finalize");
    sym(a->put, "PMIx_Put");
    sym(a->commit, "PMIx_Commit");
    sym(a->fence, "PMIx_Fence");
    sym(a->get, "PMIx_Get");
    sym(a->error_string, "PMIx_Error_string");
    return ok ? a : nullptr;
  }();
  return api;
}

class Pmix final : public LauncherKvs {
 public:
  Pmix(const PmixApi* api, std::string nspace) : api_(api), nspace_(std::move(nspace)) {}

  std::string Describe() const override { return fmt::format("PMIx (namespace {})", nspace_); }

  Result<std::string> Share(int rank, std::string_view key, std::string_view value, Deadline deadline) override {
    if (key.size() > PMIX_MAX_KEYLEN) return InvalidArgument(fmt::format("{}: key '{}' too long", Describe(), key));
    const std::string k(key);
    pmix_proc_t me;
    PMIX_PROC_CONSTRUCT(&me);
    if (pmix_status_t rc = api_->init(&me, nullptr, 0); rc != PMIX_SUCCESS) return Failed("PMIx_Init", rc);
    Result<std::string> out = ShareInitialised(me, rank, k, value, deadline);
    api_->finalize(nullptr, 0);  // balances this Init; PMIx counts them, MPI's stays
    return out;
  }

 private:
  Status Failed(std::string_view what, pmix_status_t rc) const {
    return RemoteError(fmt::format("{}: {} failed: {}", Describe(), what, api_->error_string(rc)));
  }

  Result<std::string> ShareInitialised(const pmix_proc_t& me, int rank, const std::string& key, std::string_view value,
                                       Deadline deadline) {
    if (rank == 0) {
      std::string text(value);
      pmix_value_t v;
      std::memset(&v, 0, sizeof v);
      v.type = PMIX_STRING;
      v.data.string = text.data();
      if (pmix_status_t rc = api_->put(PMIX_GLOBAL, key.c_str(), &v); rc != PMIX_SUCCESS)
        return Failed("PMIx_Put", rc);
      if (pmix_status_t rc = api_->commit(); rc != PMIX_SUCCESS) return Failed("PMIx_Commit", rc);
    }
    // Every process of the namespace, collecting what was put; bounded by the deadline.
    pmix_info_t info[2];
    std::memset(info, 0, sizeof info);
    std::strncpy(info[0].key, PMIX_COLLECT_DATA, PMIX_MAX_KEYLEN);
    info[0].value.type = PMIX_BOOL;
    info[0].value.data.flag = true;
    std::strncpy(info[1].key, PMIX_TIMEOUT, PMIX_MAX_KEYLEN);
    info[1].value.type = PMIX_INT;
    info[1].value.data.integer =
        std::max(1, static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(deadline.Remaining()).count()));
    if (pmix_status_t rc = api_->fence(nullptr, 0, info, 2); rc != PMIX_SUCCESS)
      return rc == PMIX_ERR_TIMEOUT ? Timeout(fmt::format("{}: PMIx_Fence timed out (did every rank start?)",
                                                          Describe()))
                                    : Failed("PMIx_Fence", rc);
    if (rank == 0) return std::string(value);
    pmix_proc_t root = me;
    root.rank = 0;
    pmix_value_t* got = nullptr;
    if (pmix_status_t rc = api_->get(&root, key.c_str(), nullptr, 0, &got); rc != PMIX_SUCCESS)
      return Failed("PMIx_Get", rc);
    if (got == nullptr || got->type != PMIX_STRING || got->data.string == nullptr)
      return RemoteError(fmt::format("{}: rank 0's '{}' is not a string", Describe(), key));
    std::string out = got->data.string;
    // The value came from the library's allocator: a small, one-time leak rather than calling a
    // destructor macro whose body differs between PMIx versions.
    return out;
  }

  const PmixApi* api_;
  std::string nspace_;
};

}  // namespace

std::unique_ptr<LauncherKvs> OpenPmix(const Environment& env, Status* why) {
  std::string reason;
  const PmixApi* api = LoadPmix(&reason);
  if (api == nullptr) {
    *why = Unavailable(fmt::format("the launcher offers PMIx (PMIX_RANK is set), but {}", reason));
    return nullptr;
  }
  return std::make_unique<Pmix>(api, env.at("PMIX_NAMESPACE"));
}

}  // namespace kizuna::bootstrap
