#include "fabric/roce/loader.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric::roce {
namespace {

template <typename F>
void Resolve(void* handle, const char* name, F* out, std::string* missing) {
  void* sym = ::dlsym(handle, name);
  if (sym == nullptr) {
    *missing += (missing->empty() ? "" : ", ") + std::string(name);
    return;
  }
  *out = reinterpret_cast<F>(sym);
}

}  // namespace

Result<std::shared_ptr<const IbVerbs>> IbVerbs::Open(const std::string& path) {
  ::dlerror();
  // Never dlclose()d: providers register themselves and keep state that must outlive every object
  // created from the library.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return Unavailable(fmt::format("{} not found: {} (install libibverbs1 and ibverbs-providers)", path,
                                   why != nullptr ? why : "unknown reason"));
  }
  std::shared_ptr<IbVerbs> lib(new IbVerbs());
  lib->path_ = path;
  std::string missing;
  Resolve(handle, "ibv_get_device_list", &lib->get_device_list, &missing);
  Resolve(handle, "ibv_free_device_list", &lib->free_device_list, &missing);
  Resolve(handle, "ibv_get_device_name", &lib->get_device_name, &missing);
  Resolve(handle, "ibv_open_device", &lib->open_device, &missing);
  Resolve(handle, "ibv_close_device", &lib->close_device, &missing);
  Resolve(handle, "ibv_query_device", &lib->query_device, &missing);
  Resolve(handle, "ibv_query_port", &lib->query_port_compat, &missing);
  Resolve(handle, "_ibv_query_gid_table", &lib->query_gid_table, &missing);
  Resolve(handle, "ibv_alloc_pd", &lib->alloc_pd, &missing);
  Resolve(handle, "ibv_dealloc_pd", &lib->dealloc_pd, &missing);
  Resolve(handle, "ibv_reg_mr_iova2", &lib->reg_mr_iova2, &missing);
  Resolve(handle, "ibv_reg_dmabuf_mr", &lib->reg_dmabuf_mr, &missing);
  Resolve(handle, "ibv_dereg_mr", &lib->dereg_mr, &missing);
  Resolve(handle, "ibv_create_comp_channel", &lib->create_comp_channel, &missing);
  Resolve(handle, "ibv_destroy_comp_channel", &lib->destroy_comp_channel, &missing);
  Resolve(handle, "ibv_create_cq", &lib->create_cq, &missing);
  Resolve(handle, "ibv_destroy_cq", &lib->destroy_cq, &missing);
  Resolve(handle, "ibv_get_cq_event", &lib->get_cq_event, &missing);
  Resolve(handle, "ibv_ack_cq_events", &lib->ack_cq_events, &missing);
  Resolve(handle, "ibv_create_qp", &lib->create_qp, &missing);
  Resolve(handle, "ibv_modify_qp", &lib->modify_qp, &missing);
  Resolve(handle, "ibv_destroy_qp", &lib->destroy_qp, &missing);
  Resolve(handle, "ibv_wc_status_str", &lib->wc_status_str, &missing);
  if (!missing.empty())
    return Unavailable(fmt::format("{} is not a usable libibverbs (rdma-core 44 or newer is needed): it lacks {}",
                                   path, missing));
  KZ_INFO(kLogFabric, "roce: loaded {}", path);
  return std::shared_ptr<const IbVerbs>(std::move(lib));
}

Result<std::shared_ptr<const IbVerbs>> IbVerbs::Default() {
  static std::mutex mu;
  static std::shared_ptr<const IbVerbs> loaded;
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

int IbVerbs::QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const {
  verbs_context* vctx = verbs_get_ctx_op(context, query_port);
  if (vctx == nullptr) {
    std::memset(attr, 0, sizeof(*attr));
    return query_port_compat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
  return vctx->query_port(context, port, attr, sizeof(*attr));
}

Status IbVerbs::Error(int err, std::string_view what, std::source_location where) const {
  if (err < 0) err = -err;
  if (err == 0) err = EIO;  // a NULL return without errno
  return FromErrno(err, fmt::format("ibverbs {}", what), where);
}

std::string_view IbVerbs::WcStatus(ibv_wc_status status) const {
  const char* s = wc_status_str != nullptr ? wc_status_str(status) : nullptr;
  return s != nullptr ? s : "unknown work completion status";
}

}  // namespace kizuna::fabric::roce
