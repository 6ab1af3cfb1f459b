// libibverbs, reached at run time through dlopen, so that kizuna builds and runs
// on a machine without it: there the roce fabric reports kUnavailable with the reason.
//
// Most of the verbs data path (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) is
// static inline in <infiniband/verbs.h>: each call goes through the ops table of the context the
// object belongs to, so it works without linking. The calls below are real exported symbols and
// are resolved here; code of this fabric must call them through this table only. Several header
// names are macros or inline wrappers over differently named symbols (ibv_query_port ->
// ___ibv_query_port, which falls back to the exported ibv_query_port; ibv_query_gid_table ->
// _ibv_query_gid_table; ibv_reg_mr -> ibv_reg_mr_iova2): the table holds the real symbols, and
// the helpers (QueryPort) do what the inline wrappers do. Nothing links -libverbs; a stray direct
// call fails to link.
//
// Headers: Debian's rdma-core 44 (libibverbs-dev), used for types only.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <source_location>
#include <string>
#include <string_view>

#include "runtime/core/status.h"

namespace kizuna::fabric::roce {

inline constexpr const char* kDefaultLibrary = "libibverbs.so.1";

// The resolved symbol table of one loaded libibverbs. Immutable after Open; thread-safe.
class IbVerbs {
 public:
  // dlopen()s `path` and resolves the table. kUnavailable, naming the library and the loader's
  // reason ("libibverbs.so.1 not found: ..."), when it cannot be loaded or lacks a symbol.
  static Result<std::shared_ptr<const IbVerbs>> Open(const std::string& path);
  // The process's libibverbs (kDefaultLibrary), loaded on first use; later calls return the same
  // instance, or the same failure.
  static Result<std::shared_ptr<const IbVerbs>> Default();

  IbVerbs(const IbVerbs&) = delete;
  IbVerbs& operator=(const IbVerbs&) = delete;

  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  // The pre-1.1 ABI entry point (struct _compat_ibv_port_attr); use QueryPort.
  int (*query_port_compat)(ibv_context* context, uint8_t port, _compat_ibv_port_attr* attr) = nullptr;
  ssize_t (*query_gid_table)(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size) = nullptr;  // _ibv_query_gid_table
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr_iova2)(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) = nullptr;
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context) = nullptr;
  int (*destroy_comp_channel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = nullptr;
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  const char* (*wc_status_str)(ibv_wc_status status) = nullptr;

  const std::string& path() const { return path_; }

  // What the inline ___ibv_query_port does: the context's extended query_port op where the
  // provider has one, else the exported compatibility entry point.
  int QueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const;

  // Converts a failed verbs call (verbs return errno values, or NULL with errno set) into a Status
  // naming the call and where it was received: the one place verbs errors become kizuna codes.
  Status Error(int err, std::string_view what, std::source_location where = std::source_location::current()) const;
  // The text of a work completion status ("transport retry counter exceeded").
  std::string_view WcStatus(ibv_wc_status status) const;

 private:
  IbVerbs() = default;
  std::string path_;
};

}  // namespace kizuna::fabric::roce
