#include "fabric/plugin_fabric.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <source_location>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fabric/kizuna_fabric_plugin.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric {
namespace {

// The api 1.0 table ends with poll_immediate (optional entries included: their slots are part of
// 1.0, NULL when absent). Later minors append after it, so this stays the least a major-1 plugin
// must provide however far the header grows.
constexpr size_t kApi10TableSize =
    offsetof(kz_fabric_plugin_api_t, poll_immediate) + sizeof(kz_fabric_plugin_api_t::poll_immediate);
// struct_size, api_major and api_minor must be present before anything else can be judged.
constexpr size_t kVersionFieldsSize = offsetof(kz_fabric_plugin_api_t, api_minor) + sizeof(uint32_t);
// The api 1.0 device properties end with max_message_bytes.
constexpr size_t kProps10Size = offsetof(kz_fabric_device_properties_t, max_message_bytes) +
                                sizeof(kz_fabric_device_properties_t::max_message_bytes);

constexpr size_t kMaxNameLength = 64;
constexpr size_t kMaxVersionLength = 256;
constexpr size_t kMaxLastErrorLength = 4096;
// A plugin claiming more devices than this is returning garbage, not describing a machine.
constexpr int32_t kMaxDevices = 1 << 12;
// The conformance suite's floor (fabric.h callers chunk larger messages themselves).
constexpr uint64_t kMinMaxMessageBytes = uint64_t{1} << 20;
// Without the plugin's wait / wait_acceptable, kizuna sleeps this long between tests: short next
// to a message's transfer time, long enough that an idle waiter costs no CPU.
constexpr auto kFallbackWaitSleep = std::chrono::microseconds(200);

std::string_view ResultCodeName(kz_fabric_result_t rc) {
  switch (rc) {
    case KZ_FABRIC_OK: return "KZ_FABRIC_OK";
    case KZ_FABRIC_ERR_INVALID_ARGUMENT: return "KZ_FABRIC_ERR_INVALID_ARGUMENT";
    case KZ_FABRIC_ERR_UNAVAILABLE: return "KZ_FABRIC_ERR_UNAVAILABLE";
    case KZ_FABRIC_ERR_NOT_SUPPORTED: return "KZ_FABRIC_ERR_NOT_SUPPORTED";
    case KZ_FABRIC_ERR_OUT_OF_MEMORY: return "KZ_FABRIC_ERR_OUT_OF_MEMORY";
    case KZ_FABRIC_ERR_TIMEOUT: return "KZ_FABRIC_ERR_TIMEOUT";
    case KZ_FABRIC_ERR_ABORTED: return "KZ_FABRIC_ERR_ABORTED";
    case KZ_FABRIC_ERR_REMOTE: return "KZ_FABRIC_ERR_REMOTE";
    case KZ_FABRIC_ERR_INTERNAL: return "KZ_FABRIC_ERR_INTERNAL";
    default: return "unknown result code";
  }
}

StatusCode ResultStatusCode(kz_fabric_result_t rc) {
  switch (rc) {
    case KZ_FABRIC_OK: return StatusCode::kOk;
    case KZ_FABRIC_ERR_INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case KZ_FABRIC_ERR_UNAVAILABLE: return StatusCode::kUnavailable;
    case KZ_FABRIC_ERR_NOT_SUPPORTED: return StatusCode::kNotSupported;
    case KZ_FABRIC_ERR_OUT_OF_MEMORY: return StatusCode::kOutOfMemory;
    case KZ_FABRIC_ERR_TIMEOUT: return StatusCode::kTimeout;
    case KZ_FABRIC_ERR_ABORTED: return StatusCode::kAborted;
    case KZ_FABRIC_ERR_REMOTE: return StatusCode::kRemoteError;
    default: return StatusCode::kInternal;  // an unknown code is a plugin bug
  }
}

// A string the plugin owns, copied with a length bound so an unterminated one cannot run away.
std::string BoundedString(const char* s, size_t max) {
  if (s == nullptr) return {};
  return std::string(s, strnlen(s, max));
}

uint64_t ToTimeoutNs(Deadline deadline) {
  const auto ns = deadline.Remaining().count();
  return ns > 0 ? static_cast<uint64_t>(ns) : 0;
}

void SleepFallback(Deadline deadline) {
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(kFallbackWaitSleep, deadline.Remaining()));
}

struct DlCloser {
  void operator()(void* handle) const {
    if (handle != nullptr && dlclose(handle) != 0)
      KZ_WARN(kLogPlugin, "dlclose failed: {}", BoundedString(dlerror(), kMaxLastErrorLength));
  }
};
using DlHandle = std::unique_ptr<void, DlCloser>;

// One loaded plugin context: the dlopen reference, the table and the context from init. Shared by
// the fabric and every comm, so finalize and dlclose come after the last of them, whatever the
// order of destruction.
class PluginContext {
 public:
  PluginContext(DlHandle handle, const kz_fabric_plugin_api_t* api, std::string path, std::string name)
      : handle_(std::move(handle)),
        api_(api),
        path_(std::move(path)),
        name_(std::move(name)),
        domain_(fmt::format("fabric plugin '{}'", name_)) {}
  ~PluginContext() {
    if (context_ != nullptr) api_->finalize(context_);
    // handle_ is closed after this body: the table and the plugin's code stay mapped until here.
  }
  PluginContext(const PluginContext&) = delete;
  PluginContext& operator=(const PluginContext&) = delete;

  const kz_fabric_plugin_api_t& api() const { return *api_; }
  void* context() const { return context_; }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }

  Status Init(const Config& config, const FabricContext& fc) {
    kz_fabric_init_args_t args;
    std::memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.rank = fc.rank;
    args.world_size = fc.world_size;
    args.local_rank = fc.local_rank;
    args.host_id = fc.host_id.c_str();
    const double ns = config.timeout_s * 1e9;
    args.timeout_ns = std::isfinite(ns) && ns > 0 && ns < 1.8e19 ? static_cast<uint64_t>(ns) : UINT64_MAX;
    void* context = nullptr;
    KZ_RETURN_IF_ERROR(ToStatus(api_->init(&args, &context), "init"));
    if (context == nullptr) return InvalidArgument(fmt::format("{}: init succeeded but returned no context", domain_));
    context_ = context;
    return Status::Ok();
  }

  // Converts a plugin result code into a Status, once, at the boundary: the call, the code, the
  // plugin's last_error (read on this thread right after the failing call, as the ABI requires)
  // and the place it was received.
  Status ToStatus(kz_fabric_result_t rc, std::string_view what,
                  std::source_location where = std::source_location::current()) const {
    if (rc == KZ_FABRIC_OK) return Status::Ok();
    std::string detail(ResultCodeName(rc));
    std::string last = BoundedString(api_->last_error(), kMaxLastErrorLength);
    if (!last.empty()) detail += ": " + last;
    return FromForeign(ResultStatusCode(rc), domain_, what, rc, detail, where);
  }

 private:
  DlHandle handle_;
  const kz_fabric_plugin_api_t* api_;
  std::string path_;
  std::string name_;
  std::string domain_;
  void* context_ = nullptr;
};

using ContextRef = std::shared_ptr<const PluginContext>;

class PluginRegistration final : public Registration {
 public:
  PluginRegistration(const MemoryDescriptor& memory, kz_fabric_mr_t mr) : Registration(memory), mr_(mr) {}
  kz_fabric_mr_t mr() const { return mr_; }

 private:
  kz_fabric_mr_t mr_;  // released by dereg_mr, or by the plugin when the comm closes
};

kz_fabric_mr_t MrOf(Registration* registration) {
  return registration == nullptr ? nullptr : static_cast<PluginRegistration*>(registration)->mr();
}

// The plugin releases a request when test reports it done or failed, or when its comm closes;
// this object only names it.
class PluginRequest final : public Request {
 public:
  PluginRequest(RequestKind kind, int tag, size_t size, kz_fabric_request_t handle)
      : Request(kind, tag, size), handle_(handle) {}
  kz_fabric_request_t handle() const { return handle_; }

 private:
  kz_fabric_request_t handle_;
};

// What the send and receive comms share: registration, test and wait go through the same calls,
// told apart by is_send.
class CommCore {
 public:
  CommCore(ContextRef ctx, kz_fabric_comm_t handle, bool is_send, bool staged)
      : ctx_(std::move(ctx)), handle_(handle), is_send_(is_send), staged_(staged) {}

  const PluginContext& ctx() const { return *ctx_; }
  kz_fabric_comm_t handle() const { return handle_; }

  Result<std::unique_ptr<Registration>> Register(const MemoryDescriptor& memory) const {
    const kz_fabric_plugin_api_t& api = ctx_->api();
    const int32_t type = memory.type == MemoryType::kHost ? KZ_FABRIC_MEM_HOST : KZ_FABRIC_MEM_DEVICE;
    kz_fabric_mr_t mr = nullptr;
    if (memory.fd >= 0) {
      // The loader refuses KZ_FABRIC_PTR_FD without reg_mr_fd, so the wrapper's ptr_support check
      // already stopped fd memory; this is the belt to that brace.
      if (api.reg_mr_fd == nullptr) return NotSupported(fmt::format("{} has no reg_mr_fd", ctx_->name()));
      KZ_RETURN_IF_ERROR(ctx_->ToStatus(api.reg_mr_fd(handle_, is_send_, memory.data, memory.size, type, memory.fd,
                                                      memory.fd_offset, &mr),
                                        "reg_mr_fd"));
    } else {
      KZ_RETURN_IF_ERROR(
          ctx_->ToStatus(api.reg_mr(handle_, is_send_, memory.data, memory.size, type, &mr), "reg_mr"));
    }
    return std::unique_ptr<Registration>(std::make_unique<PluginRegistration>(memory, mr));
  }

  Status Deregister(Registration& registration) const {
    return ctx_->ToStatus(ctx_->api().dereg_mr(handle_, is_send_, MrOf(&registration)), "dereg_mr");
  }

  Result<Completion> Test(Request& request, TransferStats& stats) const {
    int32_t done = 0;
    uint64_t size = 0;
    KZ_RETURN_IF_ERROR(
        ctx_->ToStatus(ctx_->api().test(static_cast<PluginRequest&>(request).handle(), &done, &size), "test"));
    if (done == 0) return Completion{false, 0};
    if (size > request.size())
      // The plugin has already released the request: report, do not trust the number.
      return Internal(fmt::format("{}: test reported {} bytes done for a {} of {} bytes", ctx_->name(), size,
                                  RequestKindName(request.kind()), request.size()));
    stats.messages++;
    stats.bytes += size;
    if (staged_) stats.staged_bytes += size;
    return Completion{true, static_cast<size_t>(size)};
  }

  Status WaitForProgress(Deadline deadline) const {
    if (ctx_->api().wait == nullptr) {
      SleepFallback(deadline);
      return Status::Ok();
    }
    return ctx_->ToStatus(ctx_->api().wait(handle_, is_send_, ToTimeoutNs(deadline)), "wait");
  }

 private:
  ContextRef ctx_;
  kz_fabric_comm_t handle_;
  bool is_send_;
  bool staged_;
};

bool IsStaged(const FabricDeviceProperties& p, const std::vector<bool>& staged) {
  return p.index >= 0 && static_cast<size_t>(p.index) < staged.size() && staged[static_cast<size_t>(p.index)];
}

class PluginSendComm final : public SendComm {
 public:
  PluginSendComm(std::string label, FabricDeviceProperties props, ContextRef ctx, kz_fabric_send_comm_t handle,
                 bool staged)
      : SendComm(std::move(label), std::move(props)), core_(std::move(ctx), handle, true, staged) {}
  ~PluginSendComm() override {
    Status s = core_.ctx().ToStatus(
        core_.ctx().api().close_send(static_cast<kz_fabric_send_comm_t>(core_.handle())), "close_send");
    if (!s.ok()) KZ_WARN(kLogPlugin, "{}: {}", label(), s.ToString());
  }

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override {
    return core_.Register(memory);
  }
  Status DoDeregister(Registration& registration) override { return core_.Deregister(registration); }
  Result<Completion> DoTest(Request& request) override { return core_.Test(request, stats_); }
  Status DoWaitForProgress(Deadline deadline) override { return core_.WaitForProgress(deadline); }

  Result<std::unique_ptr<Request>> DoSend(const void* data, size_t size, int tag,
                                          Registration* registration) override {
    kz_fabric_request_t request = nullptr;
    KZ_RETURN_IF_ERROR(core_.ctx().ToStatus(
        core_.ctx().api().isend(static_cast<kz_fabric_send_comm_t>(core_.handle()), data, size, tag,
                                MrOf(registration), &request),
        "isend"));
    if (request == nullptr) return std::unique_ptr<Request>();  // busy
    return std::unique_ptr<Request>(std::make_unique<PluginRequest>(RequestKind::kSend, tag, size, request));
  }

  Result<std::unique_ptr<Request>> DoWrite(const void* data, size_t size, Registration* registration,
                                           const RemoteKey& remote, uint64_t remote_offset,
                                           std::optional<uint32_t> immediate) override {
    const kz_fabric_plugin_api_t& api = core_.ctx().api();
    if (api.iwrite == nullptr) return NotSupported(fmt::format("{}: the plugin has no iwrite", label()));
    kz_fabric_request_t request = nullptr;
    KZ_RETURN_IF_ERROR(core_.ctx().ToStatus(
        api.iwrite(static_cast<kz_fabric_send_comm_t>(core_.handle()), data, size, MrOf(registration),
                   remote.data.data(), remote.size, remote_offset, immediate.has_value() ? 1 : 0,
                   immediate.value_or(0), &request),
        "iwrite"));
    if (request == nullptr) return std::unique_ptr<Request>();
    return std::unique_ptr<Request>(std::make_unique<PluginRequest>(RequestKind::kWrite, 0, size, request));
  }

 private:
  CommCore core_;
};

class PluginRecvComm final : public RecvComm {
 public:
  PluginRecvComm(std::string label, FabricDeviceProperties props, ContextRef ctx, kz_fabric_recv_comm_t handle,
                 bool staged)
      : RecvComm(std::move(label), std::move(props)), core_(std::move(ctx), handle, false, staged) {}
  ~PluginRecvComm() override {
    Status s = core_.ctx().ToStatus(core_.ctx().api().close_recv(recv_handle()), "close_recv");
    if (!s.ok()) KZ_WARN(kLogPlugin, "{}: {}", label(), s.ToString());
  }

 protected:
  Result<std::unique_ptr<Registration>> DoRegister(const MemoryDescriptor& memory) override {
    return core_.Register(memory);
  }
  Status DoDeregister(Registration& registration) override { return core_.Deregister(registration); }
  Result<Completion> DoTest(Request& request) override { return core_.Test(request, stats_); }
  Status DoWaitForProgress(Deadline deadline) override { return core_.WaitForProgress(deadline); }

  Result<std::unique_ptr<Request>> DoRecv(void* data, size_t capacity, int tag, Registration* registration) override {
    kz_fabric_request_t request = nullptr;
    KZ_RETURN_IF_ERROR(core_.ctx().ToStatus(
        core_.ctx().api().irecv(recv_handle(), data, capacity, tag, MrOf(registration), &request), "irecv"));
    if (request == nullptr) return std::unique_ptr<Request>();
    return std::unique_ptr<Request>(std::make_unique<PluginRequest>(RequestKind::kRecv, tag, capacity, request));
  }

  Status DoFlush(void* data, size_t size, Registration& registration, Deadline deadline) override {
    const kz_fabric_plugin_api_t& api = core_.ctx().api();
    if (api.flush == nullptr) return Status::Ok();  // the loader tied NEEDS_FLUSH to flush
    return core_.ctx().ToStatus(api.flush(recv_handle(), data, size, MrOf(&registration), ToTimeoutNs(deadline)),
                                "flush");
  }

  Result<RemoteKey> DoExpose(Registration& registration) override {
    const kz_fabric_plugin_api_t& api = core_.ctx().api();
    if (api.expose == nullptr) return NotSupported(fmt::format("{}: the plugin has no expose", label()));
    std::array<uint8_t, KZ_FABRIC_REMOTE_KEY_MAX_BYTES> key{};
    uint32_t key_size = 0;
    KZ_RETURN_IF_ERROR(
        core_.ctx().ToStatus(api.expose(recv_handle(), MrOf(&registration), key.data(), &key_size), "expose"));
    if (key_size == 0 || key_size > key.size())
      return Internal(fmt::format("{}: expose returned a key of {} bytes (1..{} allowed)", label(), key_size,
                                  key.size()));
    return RemoteKey::FromBytes(std::span<const uint8_t>(key.data(), key_size));
  }

  Result<std::optional<uint32_t>> DoPollImmediate() override {
    const kz_fabric_plugin_api_t& api = core_.ctx().api();
    if (api.poll_immediate == nullptr)
      return NotSupported(fmt::format("{}: the plugin has no poll_immediate", label()));
    int32_t has = 0;
    uint32_t value = 0;
    KZ_RETURN_IF_ERROR(core_.ctx().ToStatus(api.poll_immediate(recv_handle(), &has, &value), "poll_immediate"));
    if (has == 0) return std::optional<uint32_t>();
    return std::optional<uint32_t>(value);
  }

 private:
  kz_fabric_recv_comm_t recv_handle() const { return static_cast<kz_fabric_recv_comm_t>(core_.handle()); }
  CommCore core_;
};

// Comms are named "<fabric>:<device>:send#N" / ":recv#N": the plugin does not tell kizuna who the
// peer is, so a per-fabric counter keeps the labels of concurrent connections apart in logs.
std::string CommLabel(const FabricDeviceProperties& p, std::string_view kind, uint64_t n) {
  return fmt::format("{}:{}:{}#{}", p.fabric, p.name, kind, n);
}

class PluginListenComm final : public ListenComm {
 public:
  PluginListenComm(FabricDeviceProperties props, Handle handle, ContextRef ctx, kz_fabric_listen_comm_t listen,
                   bool staged, std::atomic<uint64_t>* counter)
      : ListenComm(std::move(props), handle),
        ctx_(std::move(ctx)),
        listen_(listen),
        staged_(staged),
        counter_(counter) {}
  ~PluginListenComm() override {
    Status s = ctx_->ToStatus(ctx_->api().close_listen(listen_), "close_listen");
    if (!s.ok()) KZ_WARN(kLogPlugin, "{}: {}", properties().name, s.ToString());
  }

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override {
    kz_fabric_recv_comm_t comm = nullptr;
    KZ_RETURN_IF_ERROR(ctx_->ToStatus(ctx_->api().accept(listen_, &comm), "accept"));
    if (comm == nullptr) return std::unique_ptr<RecvComm>();
    return std::unique_ptr<RecvComm>(std::make_unique<PluginRecvComm>(
        CommLabel(properties(), "recv", counter_->fetch_add(1)), properties(), ctx_, comm, staged_));
  }

  Status DoWaitAcceptable(Deadline deadline) override {
    if (ctx_->api().wait_acceptable == nullptr) {
      SleepFallback(deadline);
      return Status::Ok();
    }
    return ctx_->ToStatus(ctx_->api().wait_acceptable(listen_, ToTimeoutNs(deadline)), "wait_acceptable");
  }

 private:
  ContextRef ctx_;
  kz_fabric_listen_comm_t listen_;
  bool staged_;
  std::atomic<uint64_t>* counter_;  // the fabric's, which outlives its comms
};

class PluginFabric final : public Fabric {
 public:
  PluginFabric(std::string name, const Config* config, FabricContext context, ContextRef ctx,
               std::vector<FabricDeviceProperties> devices, std::vector<bool> staged)
      : Fabric(std::move(name), config, std::move(context)), ctx_(std::move(ctx)), staged_(std::move(staged)) {
    devices_ = std::move(devices);
  }
  ~PluginFabric() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, state] : connecting_) ctx_->api().connect_abort(ctx_->context(), state);
  }

 protected:
  Result<std::unique_ptr<ListenComm>> DoListen(int dev) override {
    std::array<uint8_t, KZ_FABRIC_HANDLE_MAX_BYTES> bytes{};
    uint32_t size = 0;
    kz_fabric_listen_comm_t listen = nullptr;
    KZ_RETURN_IF_ERROR(ctx_->ToStatus(ctx_->api().listen(ctx_->context(), dev, bytes.data(), &size, &listen),
                                      fmt::format("listen({})", dev)));
    if (size == 0 || size > bytes.size() || listen == nullptr) {
      // A listener we cannot describe to a peer is useless; do not leak it.
      if (listen != nullptr) (void)ctx_->api().close_listen(listen);
      return Internal(fmt::format("{}: listen({}) returned a handle of {} bytes (1..{} allowed){}", name(), dev, size,
                                  bytes.size(), listen == nullptr ? " and no listen comm" : ""));
    }
    KZ_ASSIGN_OR_RETURN(Handle handle, Handle::FromBytes(std::span<const uint8_t>(bytes.data(), size)));
    const auto& props = devices_[static_cast<size_t>(dev)];
    return std::unique_ptr<ListenComm>(
        std::make_unique<PluginListenComm>(props, handle, ctx_, listen, IsStaged(props, staged_), &counter_));
  }

  Result<std::unique_ptr<SendComm>> DoConnect(int dev, const Handle& handle) override {
    // The in-progress state is keyed by the device and the handle's bytes (fabric.h: callers
    // retry with the same pair). Taken out of the map for the call, so a concurrent connect with
    // the same pair starts its own attempt rather than sharing one.
    const std::string key = fmt::format("{}:{}", dev, handle.ToHex());
    kz_fabric_connect_state_t state = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = connecting_.find(key);
      if (it != connecting_.end()) {
        state = it->second;
        connecting_.erase(it);
      }
    }
    kz_fabric_send_comm_t comm = nullptr;
    const kz_fabric_result_t rc =
        ctx_->api().connect(ctx_->context(), dev, handle.data.data(), handle.size, &state, &comm);
    if (rc != KZ_FABRIC_OK) return ctx_->ToStatus(rc, fmt::format("connect({})", dev));  // state released
    if (comm == nullptr) {
      if (state != nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        auto [it, inserted] = connecting_.emplace(key, state);
        // Another thread parked an attempt for the same pair meanwhile: keep one, drop ours.
        if (!inserted) ctx_->api().connect_abort(ctx_->context(), state);
      }
      return std::unique_ptr<SendComm>();
    }
    const auto& props = devices_[static_cast<size_t>(dev)];
    return std::unique_ptr<SendComm>(std::make_unique<PluginSendComm>(
        CommLabel(props, "send", counter_.fetch_add(1)), props, ctx_, comm, IsStaged(props, staged_)));
  }

 private:
  ContextRef ctx_;
  std::vector<bool> staged_;  // per device: KZ_FABRIC_DEVICE_STAGED
  std::atomic<uint64_t> counter_{0};
  std::mutex mu_;
  std::map<std::string, kz_fabric_connect_state_t> connecting_;  // guarded by mu_
};

// ---- Validation of the table and the properties ----

Status CheckName(const char* name, const std::string& path) {
  if (name == nullptr) return InvalidArgument(fmt::format("fabric plugin {}: the api table has no name", path));
  const std::string n = BoundedString(name, kMaxNameLength + 1);
  if (n.empty() || n.size() > kMaxNameLength)
    return InvalidArgument(fmt::format("fabric plugin {}: fabric name must be 1..{} characters", path, kMaxNameLength));
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return InvalidArgument(
          fmt::format("fabric plugin {}: fabric name '{}' has characters outside [a-z0-9_]", path, n));
  return Status::Ok();
}

struct RequiredFunction {
  std::string_view field;
  bool present;
};

Status CheckFunctions(const kz_fabric_plugin_api_t& api, const std::string& path) {
  const RequiredFunction required[] = {
      {"last_error", api.last_error != nullptr},   {"init", api.init != nullptr},
      {"finalize", api.finalize != nullptr},       {"device_count", api.device_count != nullptr},
      {"device_properties", api.device_properties != nullptr},
      {"listen", api.listen != nullptr},           {"connect", api.connect != nullptr},
      {"connect_abort", api.connect_abort != nullptr},
      {"accept", api.accept != nullptr},           {"close_listen", api.close_listen != nullptr},
      {"reg_mr", api.reg_mr != nullptr},           {"dereg_mr", api.dereg_mr != nullptr},
      {"isend", api.isend != nullptr},             {"irecv", api.irecv != nullptr},
      {"test", api.test != nullptr},               {"close_send", api.close_send != nullptr},
      {"close_recv", api.close_recv != nullptr},
  };
  for (const RequiredFunction& f : required)
    if (!f.present)
      return InvalidArgument(
          fmt::format("fabric plugin {}: required function '{}' is NULL in the api table", path, f.field));
  const int writes = (api.expose != nullptr) + (api.iwrite != nullptr) + (api.poll_immediate != nullptr);
  if (writes != 0 && writes != 3)
    return InvalidArgument(fmt::format("fabric plugin {}: one-sided writes need all of 'expose', 'iwrite' and "
                                       "'poll_immediate' or none (expose {}, iwrite {}, poll_immediate {})",
                                       path, api.expose != nullptr ? "set" : "NULL",
                                       api.iwrite != nullptr ? "set" : "NULL",
                                       api.poll_immediate != nullptr ? "set" : "NULL"));
  return Status::Ok();
}

Status CheckTable(const kz_fabric_plugin_api_t* api, const std::string& path) {
  if (api == nullptr)
    return InvalidArgument(fmt::format("fabric plugin {}: {} returned no api table for kizuna's fabric plugin api "
                                       "{}.{} (the plugin does not serve this version)",
                                       path, KZ_FABRIC_PLUGIN_ENTRY_POINT, KZ_FABRIC_PLUGIN_API_MAJOR,
                                       KZ_FABRIC_PLUGIN_API_MINOR));
  if (api->struct_size < kVersionFieldsSize)
    return InvalidArgument(
        fmt::format("fabric plugin {}: api table struct_size {} is too small to hold its version", path,
                    api->struct_size));
  if (api->api_major != KZ_FABRIC_PLUGIN_API_MAJOR)
    return InvalidArgument(fmt::format("fabric plugin {}: plugin api version {}.{} is incompatible with kizuna's "
                                       "fabric plugin api {}.{} (the major versions must match; rebuild the plugin "
                                       "against kizuna_fabric_plugin.h {}.x)",
                                       path, api->api_major, api->api_minor, KZ_FABRIC_PLUGIN_API_MAJOR,
                                       KZ_FABRIC_PLUGIN_API_MINOR, KZ_FABRIC_PLUGIN_API_MAJOR));
  if (api->struct_size < kApi10TableSize)
    return InvalidArgument(fmt::format("fabric plugin {}: api table struct_size {} is smaller than the {} bytes of "
                                       "api {}.0",
                                       path, api->struct_size, kApi10TableSize, KZ_FABRIC_PLUGIN_API_MAJOR));
  KZ_RETURN_IF_ERROR(CheckName(api->name, path));
  return CheckFunctions(*api, path);
}

double SaneRate(double v) { return std::isfinite(v) && v >= 0 ? v : 0.0; }

Result<FabricDeviceProperties> ReadProperties(const PluginContext& ctx, int32_t index, bool* staged) {
  kz_fabric_device_properties_t raw;
  std::memset(&raw, 0, sizeof raw);
  raw.struct_size = sizeof raw;
  raw.numa_node = -1;
  const std::string what = fmt::format("device_properties({})", index);
  KZ_RETURN_IF_ERROR(ctx.ToStatus(ctx.api().device_properties(ctx.context(), index, &raw), what));
  const std::string where = fmt::format("fabric plugin '{}' ({}): {}", ctx.name(), ctx.path(), what);
  if (std::min(raw.struct_size, sizeof raw) < kProps10Size)
    return InvalidArgument(fmt::format("{} filled {} bytes; api {}.0 defines {}", where, raw.struct_size,
                                       KZ_FABRIC_PLUGIN_API_MAJOR, kProps10Size));
  const kz_fabric_plugin_api_t& api = ctx.api();
  if ((raw.ptr_support & KZ_FABRIC_PTR_HOST) == 0)
    return InvalidArgument(fmt::format("{}: ptr_support {:#x} lacks KZ_FABRIC_PTR_HOST (every fabric registers host "
                                       "memory)", where, raw.ptr_support));
  if ((raw.ptr_support & KZ_FABRIC_PTR_FD) != 0 && api.reg_mr_fd == nullptr)
    return InvalidArgument(fmt::format("{}: claims KZ_FABRIC_PTR_FD but 'reg_mr_fd' is NULL", where));
  if ((raw.flags & KZ_FABRIC_DEVICE_WRITE_IMMEDIATE) != 0 && api.iwrite == nullptr)
    return InvalidArgument(fmt::format("{}: claims KZ_FABRIC_DEVICE_WRITE_IMMEDIATE but 'iwrite' is NULL", where));
  if ((raw.flags & KZ_FABRIC_DEVICE_NEEDS_FLUSH) != 0 && api.flush == nullptr)
    return InvalidArgument(fmt::format("{}: claims KZ_FABRIC_DEVICE_NEEDS_FLUSH but 'flush' is NULL", where));
  if (raw.max_requests < 1)
    return InvalidArgument(fmt::format("{}: max_requests {} (must be >= 1)", where, raw.max_requests));
  if (raw.max_message_bytes < kMinMaxMessageBytes)
    return InvalidArgument(fmt::format("{}: max_message_bytes {} (must be >= {})", where, raw.max_message_bytes,
                                       kMinMaxMessageBytes));

  FabricDeviceProperties p;
  p.fabric = ctx.name();
  p.index = index;
  p.name = BoundedString(raw.name, sizeof raw.name);
  if (p.name.empty()) p.name = fmt::format("{}{}", ctx.name(), index);
  p.pci_path = BoundedString(raw.pci_path, sizeof raw.pci_path);
  p.speed_gbps = SaneRate(raw.speed_gbps);
  p.latency_us = SaneRate(raw.latency_us);
  p.ptr_support = raw.ptr_support & (kPtrHost | kPtrDevice | kPtrFd);
  p.max_requests = raw.max_requests;
  p.max_message_bytes = std::min<uint64_t>(raw.max_message_bytes, SIZE_MAX);
  p.write_immediate = (raw.flags & KZ_FABRIC_DEVICE_WRITE_IMMEDIATE) != 0;
  p.needs_flush = (raw.flags & KZ_FABRIC_DEVICE_NEEDS_FLUSH) != 0;
  p.numa_node = raw.numa_node < -1 ? -1 : raw.numa_node;
  *staged = (raw.flags & KZ_FABRIC_DEVICE_STAGED) != 0;
  return p;
}

}  // namespace

Result<std::unique_ptr<Fabric>> LoadFabricPlugin(const std::string& path, const Config& config,
                                                 const FabricContext& context) {
  if (path.empty()) return InvalidArgument("fabric plugin path is empty");

  dlerror();  // clear any stale message
  DlHandle handle(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (handle == nullptr)
    return InvalidArgument(
        fmt::format("fabric plugin {}: dlopen failed: {}", path, BoundedString(dlerror(), kMaxLastErrorLength)));

  dlerror();
  auto get_api = reinterpret_cast<kz_fabric_plugin_get_api_fn>(dlsym(handle.get(), KZ_FABRIC_PLUGIN_ENTRY_POINT));
  if (get_api == nullptr) {
    const std::string why = BoundedString(dlerror(), kMaxLastErrorLength);
    return InvalidArgument(fmt::format("fabric plugin {}: not a kizuna fabric plugin: it does not export {}{}{}", path,
                                       KZ_FABRIC_PLUGIN_ENTRY_POINT, why.empty() ? "" : ": ", why));
  }

  const kz_fabric_plugin_api_t* api = get_api(KZ_FABRIC_PLUGIN_API_MAJOR, KZ_FABRIC_PLUGIN_API_MINOR);
  KZ_RETURN_IF_ERROR(CheckTable(api, path));

  const std::string name = BoundedString(api->name, kMaxNameLength);
  const std::string version = api->version != nullptr ? BoundedString(api->version, kMaxVersionLength) : "unknown";
  auto ctx = std::make_shared<PluginContext>(std::move(handle), api, path, name);
  const std::string where = fmt::format("fabric plugin '{}' ({})", name, path);
  KZ_RETURN_IF_ERROR(ctx->Init(config, context).WithContext(where));

  int32_t count = -1;
  KZ_RETURN_IF_ERROR(ctx->ToStatus(api->device_count(ctx->context(), &count), "device_count").WithContext(where));
  if (count < 0 || count > kMaxDevices)
    return InvalidArgument(fmt::format("{}: device_count returned {}", where, count));
  if (count == 0) return Unavailable(fmt::format("{} reports no devices", where));

  std::vector<FabricDeviceProperties> devices;
  std::vector<bool> staged;
  for (int32_t i = 0; i < count; ++i) {
    bool s = false;
    KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, ReadProperties(*ctx, i, &s));
    devices.push_back(std::move(p));
    staged.push_back(s);
  }

  KZ_INFO(kLogPlugin, "loaded fabric plugin {}: name {}, version {}, plugin api {}.{}, kizuna api {}.{}, {} device(s)",
          path, name, version, api->api_major, api->api_minor, KZ_FABRIC_PLUGIN_API_MAJOR,
          KZ_FABRIC_PLUGIN_API_MINOR, count);
  for (const FabricDeviceProperties& p : devices)
    KZ_INFO(kLogPlugin, "{}:{}: {} Gb/s, {} us, ptr support {:#x}, {} requests in flight, messages up to {} bytes, "
            "write+immediate {}",
            name, p.name, p.speed_gbps, p.latency_us, p.ptr_support, p.max_requests, p.max_message_bytes,
            p.write_immediate);
  return std::unique_ptr<Fabric>(
      std::make_unique<PluginFabric>(name, &config, context, std::move(ctx), std::move(devices), std::move(staged)));
}

}  // namespace kizuna::fabric
