#include "runtime/device/plugin_backend.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <mutex>
#include <source_location>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/device/kizuna_device_plugin.h"
#include "runtime/device/plugin_table.h"
#include "runtime/core/logging.h"

namespace kizuna::device {
namespace {

using plugin_table::BoundedString;
using plugin_table::CheckTable;
using plugin_table::kApi10TableSize;
using plugin_table::kApi11TableSize;
using plugin_table::kMaxNameLength;
using plugin_table::kProps10Size;

constexpr size_t kMaxVersionLength = 256;
constexpr size_t kMaxLastErrorLength = 4096;
// A plugin claiming more devices than this is returning garbage, not describing a machine.
constexpr int32_t kMaxDevices = 1 << 16;

std::string_view ResultCodeName(kz_plugin_result_t rc) {
  switch (rc) {
    case KZ_PLUGIN_OK: return "KZ_PLUGIN_OK";
    case KZ_PLUGIN_ERR_INVALID_ARGUMENT: return "KZ_PLUGIN_ERR_INVALID_ARGUMENT";
    case KZ_PLUGIN_ERR_UNAVAILABLE: return "KZ_PLUGIN_ERR_UNAVAILABLE";
    case KZ_PLUGIN_ERR_NOT_SUPPORTED: return "KZ_PLUGIN_ERR_NOT_SUPPORTED";
    case KZ_PLUGIN_ERR_OUT_OF_MEMORY: return "KZ_PLUGIN_ERR_OUT_OF_MEMORY";
    case KZ_PLUGIN_ERR_TIMEOUT: return "KZ_PLUGIN_ERR_TIMEOUT";
    case KZ_PLUGIN_ERR_ABORTED: return "KZ_PLUGIN_ERR_ABORTED";
    case KZ_PLUGIN_ERR_REMOTE: return "KZ_PLUGIN_ERR_REMOTE";
    case KZ_PLUGIN_ERR_INTERNAL: return "KZ_PLUGIN_ERR_INTERNAL";
    case KZ_PLUGIN_NOT_READY: return "KZ_PLUGIN_NOT_READY";
    default: return "unknown result code";
  }
}

StatusCode ResultStatusCode(kz_plugin_result_t rc) {
  switch (rc) {
    case KZ_PLUGIN_OK: return StatusCode::kOk;
    case KZ_PLUGIN_ERR_INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case KZ_PLUGIN_ERR_UNAVAILABLE: return StatusCode::kUnavailable;
    case KZ_PLUGIN_ERR_NOT_SUPPORTED: return StatusCode::kNotSupported;
    case KZ_PLUGIN_ERR_OUT_OF_MEMORY: return StatusCode::kOutOfMemory;
    case KZ_PLUGIN_ERR_TIMEOUT: return StatusCode::kTimeout;
    case KZ_PLUGIN_ERR_ABORTED: return StatusCode::kAborted;
    case KZ_PLUGIN_ERR_REMOTE: return StatusCode::kRemoteError;
    // NOT_READY is a valid answer only from the two query calls, which handle it themselves;
    // anywhere else it is a plugin bug, like an unknown code.
    default: return StatusCode::kInternal;
  }
}


// Non-zero while this thread runs a host callback for a plugin (HostCallbackTrampoline), i.e. it
// is a plugin's thread, inside the plugin's code. stream_destroy there would wait for the very
// thread it runs on, and finalize + dlclose would unmap the code it returns into; so a stream, or
// the last reference to a library, released on such a thread is handed to a thread of kizuna's
// own (RunOnOwnThread). Any plugin's callback counts: a wait on another plugin's thread
// from inside a callback could just as well close a cycle.
thread_local int t_host_callback_depth = 0;

bool OnPluginCallbackThread() { return t_host_callback_depth > 0; }

// Marks the current thread as inside a host callback for the scope.
class HostCallbackScope {
 public:
  HostCallbackScope() { ++t_host_callback_depth; }
  ~HostCallbackScope() { --t_host_callback_depth; }
  HostCallbackScope(const HostCallbackScope&) = delete;
  HostCallbackScope& operator=(const HostCallbackScope&) = delete;
};

// Runs `job` (a heap object with a Run() that consumes it) on a new detached thread that kizuna
// owns. Returns false, with `job` still the caller's, when no thread can be started.
template <typename Job>
bool RunOnOwnThread(std::unique_ptr<Job>& job) noexcept {
  Job* raw = job.get();
  try {
    std::thread([raw] {
      pthread_setname_np(pthread_self(), "kz-plugin-rel");  // for debuggers and top
      std::unique_ptr<Job> owned(raw);
      owned->Run();
    }).detach();
  } catch (const std::system_error&) {
    return false;  // the lambda held only a raw pointer: nothing was released
  }
  job.release();  // the thread owns it now
  return true;
}

// Closes a dlopen handle; the loader holds one until a PluginLibrary takes it over.
struct DlCloser {
  void operator()(void* handle) const {
    if (handle != nullptr && dlclose(handle) != 0)
      KZ_WARN(kLogPlugin, "dlclose failed: {}", BoundedString(dlerror(), kMaxLastErrorLength));
  }
};
using DlHandle = std::unique_ptr<void, DlCloser>;

// The plugin's table as kizuna's version of the struct: only the struct_size bytes the plugin
// declared are read (a table built against an older header ends there, and reading further would
// read past its object); the fields it lacks stay zero, i.e. NULL, which every call site already
// treats as "not supported". Called after CheckTable, so struct_size covers at least api 1.0.
kz_device_plugin_api_t CopyTable(const kz_device_plugin_api_t& table) {
  kz_device_plugin_api_t copy;
  std::memset(&copy, 0, sizeof copy);
  std::memcpy(&copy, &table, std::min(table.struct_size, sizeof copy));
  return copy;
}

// Everything the plugin's objects need: the dlopen handle, the function table and the context.
// The backend and every device, buffer, stream and event hold it through a shared_ptr, so
// finalize and dlclose run after the last of them is gone, in whatever order they are destroyed,
// and never on a plugin's thread (DeleteLibrary). A library whose stream_destroy failed is
// abandoned: a plugin thread may still be running its code, so it is never finalized or closed.
class PluginLibrary {
 public:
  PluginLibrary(DlHandle handle, const kz_device_plugin_api_t& api, std::string path, std::string name,
                std::string version)
      : handle_(std::move(handle)),
        api_(CopyTable(api)),
        path_(std::move(path)),
        name_(std::move(name)),
        version_(std::move(version)),
        domain_(fmt::format("device plugin '{}'", name_)) {}

  ~PluginLibrary() {
    if (initialized_) api_.finalize(context_);
    // handle_ is closed after this body: the table and all plugin code stay mapped until here.
  }

  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  // The plugin's table, copied (CopyTable): fields beyond the plugin's struct_size are NULL.
  const kz_device_plugin_api_t& api() const { return api_; }
  // Whether the plugin's table reaches `table_size` bytes (it was built against that minor or later).
  bool HasFieldsUpTo(size_t table_size) const { return api_.struct_size >= table_size; }
  void* context() const { return context_; }
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& domain() const { return domain_; }

  // Keeps the library loaded, unfinalized, until the process exits. Called when a plugin thread
  // may still run its code after kizuna is done with it (stream_destroy failed, or no thread could
  // be started to release it off a plugin thread). Idempotent; logs once.
  void Abandon(std::string_view why) const {
    if (abandoned_.exchange(true)) return;
    KZ_WARN(kLogPlugin, "{} ({}): {}; a thread of the plugin may still run its code, so the plugin stays loaded "
            "(no finalize, no dlclose) until the process exits",
            domain_, path_, why);
  }
  bool abandoned() const { return abandoned_.load(); }

  Status Init() {
    void* context = nullptr;
    kz_plugin_result_t rc = api_.init(&context);
    if (rc != KZ_PLUGIN_OK) return ToStatus(rc, "init");
    context_ = context;
    initialized_ = true;
    return Status::Ok();
  }

  // Converts a plugin result code into a Status, once, at the boundary: the call, the code, the
  // plugin's last_error (read on this thread right after the failing call, as the ABI requires)
  // and the place it was received.
  Status ToStatus(kz_plugin_result_t rc, std::string_view what,
                  std::source_location where = std::source_location::current()) const {
    if (rc == KZ_PLUGIN_OK) return Status::Ok();
    std::string detail(ResultCodeName(rc));
    std::string last = BoundedString(api_.last_error(), kMaxLastErrorLength);
    if (!last.empty()) detail += ": " + last;
    return FromForeign(ResultStatusCode(rc), domain_, what, rc, detail, where);
  }

  // The status a stream hands to a host callback. No last_error here: the callback runs on a
  // plugin thread that made no failing call; the error's text comes from Synchronize.
  Status StreamStatus(kz_plugin_result_t rc, std::source_location where = std::source_location::current()) const {
    if (rc == KZ_PLUGIN_OK) return Status::Ok();
    return FromForeign(ResultStatusCode(rc), domain_, "earlier work on the stream", rc, ResultCodeName(rc), where);
  }

 private:
  DlHandle handle_;
  const kz_device_plugin_api_t api_;  // copied from the plugin; handle_ keeps the code it points to mapped
  std::string path_;
  std::string name_;
  std::string version_;
  std::string domain_;
  void* context_ = nullptr;
  bool initialized_ = false;
  mutable std::atomic<bool> abandoned_{false};
};

using LibraryRef = std::shared_ptr<const PluginLibrary>;

// The last reference to a library released on a plugin's thread: finalize and dlclose run on a
// thread of kizuna's own instead.
struct DeferredLibraryDelete {
  PluginLibrary* lib;
  void Run() { delete lib; }
};

// Abandoned libraries, kept (objects included: a callback still running may read one through its
// holder) until the process exits; listed here so that they stay reachable, not leaked.
void KeepForever(PluginLibrary* lib) {
  static std::mutex mu;
  static auto* kept = new std::vector<PluginLibrary*>();  // never destroyed: outlives every thread
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(lib);
}

// The deleter of every LibraryRef.
void DeleteLibrary(PluginLibrary* lib) noexcept {
  if (lib->abandoned()) {
    KeepForever(lib);
    return;
  }
  if (!OnPluginCallbackThread()) {
    delete lib;
    return;
  }
  auto job = std::make_unique<DeferredLibraryDelete>(DeferredLibraryDelete{lib});
  if (!RunOnOwnThread(job)) {
    lib->Abandon("released inside a host callback and no thread could be started to unload it");
    KeepForever(lib);
  }
}

// stream_destroy on the calling thread (never a plugin thread). A failure means the plugin may
// still run code for that stream (a host callback that did not return in its time): the library is
// then abandoned rather than finalized and unloaded under that thread.
void DestroyPluginStream(const PluginLibrary& lib, kz_plugin_stream_t handle, const std::string& label) {
  Status s = lib.ToStatus(lib.api().stream_destroy(lib.context(), handle), "stream_destroy").WithContext(label);
  if (s.ok()) return;
  KZ_WARN(kLogPlugin, "{}", s.ToString());
  lib.Abandon(fmt::format("stream_destroy on {} failed", label));
}

// A stream released on a plugin's thread (typically from its own host callback): stream_destroy
// and the release of its library reference run on a thread of kizuna's own. stream_destroy there
// waits for the callback that released it to return, as the ABI promises for every callback.
struct DeferredStreamDestroy {
  LibraryRef lib;
  kz_plugin_stream_t handle;
  std::string label;
  void Run() { DestroyPluginStream(*lib, handle, label); }  // then lib is released here
};

class PluginDevice;

class PluginBuffer final : public Buffer {
 public:
  PluginBuffer(PluginDevice* device, void* data, size_t size, bool imported, LibraryRef lib, int32_t index);
  ~PluginBuffer() override {
    if (data() == nullptr) return;
    const kz_device_plugin_api_t& api = lib_->api();
    // A failure here cannot be returned (destructors never fail); it is logged instead.
    Status s = imported() ? lib_->ToStatus(api.mem_unimport(lib_->context(), index_, data(), size()), "mem_unimport")
                          : lib_->ToStatus(api.mem_free(lib_->context(), index_, data()), "mem_free");
    if (!s.ok()) KZ_WARN(kLogPlugin, "{}:{}: releasing {} bytes at {}: {}", lib_->name(), index_, size(), data(),
                         s.ToString());
  }

 private:
  LibraryRef lib_;
  int32_t index_;
};

class PluginEvent final : public Event {
 public:
  PluginEvent(PluginDevice* device, LibraryRef lib, kz_plugin_event_t handle);
  ~PluginEvent() override {
    Status s = lib_->ToStatus(lib_->api().event_destroy(lib_->context(), handle_), "event_destroy");
    if (!s.ok()) KZ_WARN(kLogPlugin, "{}", s.ToString());
  }

  const PluginLibrary* library() const { return lib_.get(); }
  kz_plugin_event_t handle() const { return handle_; }

 protected:
  Result<bool> DoQuery() override {
    kz_plugin_result_t rc = lib_->api().event_query(lib_->context(), handle_);
    if (rc == KZ_PLUGIN_OK) return true;
    if (rc == KZ_PLUGIN_NOT_READY) return false;
    return Check(rc, "event_query");
  }

  Status DoSynchronize(Deadline deadline) override {
    const auto ns = static_cast<uint64_t>(deadline.Remaining().count());
    return Check(lib_->api().event_synchronize(lib_->context(), handle_, ns), "event_synchronize");
  }

 private:
  // The label saved at creation, not device().label(): the stream and the event keep the library
  // alive and work after the backend (and its devices) are gone.
  Status Check(kz_plugin_result_t rc, std::string_view what,
               std::source_location where = std::source_location::current()) const {
    return lib_->ToStatus(rc, what, where).WithContext(label_);
  }

  LibraryRef lib_;
  kz_plugin_event_t handle_;
  std::string label_;  // the device's
};

// What a host callback's user_data points to: owned by the plugin from a successful
// stream_host_callback until the trampoline runs (exactly once) and deletes it.
struct HostCallbackHolder {
  HostCallback fn;
  // A plain pointer, not a LibraryRef: the stream keeps the library alive until its queued work,
  // this callback included, has run (stream_destroy returns only after every callback has), and an
  // abandoned library is never deleted.
  const PluginLibrary* lib;
  std::string label;  // the stream's device, for the status
};

void HostCallbackTrampoline(void* user_data, kz_plugin_result_t stream_status) {
  // Declared first, so it also covers the holder's destruction: the callback's captures may own
  // the stream, or the last objects of the plugin.
  HostCallbackScope on_plugin_thread;
  std::unique_ptr<HostCallbackHolder> holder(static_cast<HostCallbackHolder*>(user_data));
  const PluginLibrary* lib = holder->lib;
  // No exception may unwind through the plugin's C frames.
  try {
    holder->fn(lib->StreamStatus(stream_status).WithContext(holder->label));
    holder.reset();
  } catch (...) {
    KZ_WARN(kLogPlugin, "{}: a host callback threw an exception; it was dropped", lib->domain());
  }
}

class PluginStream final : public Stream {
 public:
  PluginStream(PluginDevice* device, LibraryRef lib, kz_plugin_stream_t handle);
  ~PluginStream() override {
    // On a plugin's thread (the application drops the stream in a host callback) stream_destroy
    // would wait for the thread it runs on: it goes to a thread of kizuna's own (the ABI promises
    // plugins this). Elsewhere it runs here; the plugin bounds its wait (see stream_destroy in the
    // ABI header). The device may be gone already: only the label saved at creation is used.
    if (OnPluginCallbackThread()) {
      auto job = std::make_unique<DeferredStreamDestroy>(DeferredStreamDestroy{lib_, handle_, label_});
      if (!RunOnOwnThread(job)) {
        KZ_WARN(kLogPlugin, "{}: stream released inside a host callback and no thread could be started to destroy "
                "it; the stream is leaked", label_);
        lib_->Abandon(fmt::format("a stream of {} could not be destroyed", label_));
      }
      return;
    }
    DestroyPluginStream(*lib_, handle_, label_);
  }

 protected:
  Status DoCopy(void* dst, const void* src, size_t bytes) override {
    return Check(lib_->api().stream_copy(lib_->context(), handle_, dst, src, bytes), "stream_copy");
  }

  Status DoReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) override {
    if (srcs.size() > std::numeric_limits<uint32_t>::max())
      return InvalidArgument(fmt::format("reduce of {} inputs: the plugin ABI takes at most {}", srcs.size(),
                                         std::numeric_limits<uint32_t>::max()));
    return Check(lib_->api().stream_reduce(lib_->context(), handle_, dst, srcs.data(),
                                           static_cast<uint32_t>(srcs.size()), count, static_cast<int32_t>(type),
                                           static_cast<int32_t>(op)),
                 "stream_reduce");
  }

  Status DoScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) override {
    // Optional since api 1.1: a plugin built against 1.0 has a smaller table and no such field.
    if (!lib_->HasFieldsUpTo(kApi11TableSize))
      return NotSupported(fmt::format("{}: {} has no scale operation (stream_scale needs plugin api 1.1; the plugin "
                                      "was built against {}.{})",
                                      label_, lib_->domain(), lib_->api().api_major, lib_->api().api_minor));
    if (lib_->api().stream_scale == nullptr)
      return NotSupported(fmt::format("{}: {} has no scale operation (its stream_scale is NULL)", label_,
                                      lib_->domain()));
    return Check(lib_->api().stream_scale(lib_->context(), handle_, dst, src, count, static_cast<int32_t>(type),
                                          divisor),
                 "stream_scale");
  }

  Status DoRecord(Event& event) override {
    KZ_ASSIGN_OR_RETURN(const PluginEvent* e, SameInstance(event));
    return Check(lib_->api().event_record(lib_->context(), e->handle(), handle_), "event_record");
  }

  Status DoWait(const Event& event) override {
    KZ_ASSIGN_OR_RETURN(const PluginEvent* e, SameInstance(event));
    return Check(lib_->api().stream_wait_event(lib_->context(), handle_, e->handle()), "stream_wait_event");
  }

  Status DoHostCallback(HostCallback fn) override {
    auto holder =
        std::make_unique<HostCallbackHolder>(HostCallbackHolder{std::move(fn), lib_.get(), label_});
    kz_plugin_result_t rc =
        lib_->api().stream_host_callback(lib_->context(), handle_, &HostCallbackTrampoline, holder.get());
    if (rc != KZ_PLUGIN_OK) return Check(rc, "stream_host_callback");  // not queued: holder freed here
    holder.release();  // the trampoline owns it now
    return Status::Ok();
  }

  Status DoSynchronize(Deadline deadline) override {
    const auto ns = static_cast<uint64_t>(deadline.Remaining().count());
    return Check(lib_->api().stream_synchronize(lib_->context(), handle_, ns), "stream_synchronize");
  }

  Result<bool> DoQuery() override {
    kz_plugin_result_t rc = lib_->api().stream_query(lib_->context(), handle_);
    if (rc == KZ_PLUGIN_OK) return true;
    if (rc == KZ_PLUGIN_NOT_READY) return false;
    return Check(rc, "stream_query");
  }

 private:
  // The label saved at creation, not device().label(): the stream and the event keep the library
  // alive and work after the backend (and its devices) are gone.
  Status Check(kz_plugin_result_t rc, std::string_view what,
               std::source_location where = std::source_location::current()) const {
    return lib_->ToStatus(rc, what, where).WithContext(label_);
  }

  // The public wrapper checked that the event's backend has this name; a second load of the same
  // plugin has the same name but a different context, whose handles mean nothing here.
  Result<const PluginEvent*> SameInstance(const Event& event) const {
    const auto* e = dynamic_cast<const PluginEvent*>(&event);
    if (e == nullptr || e->library() != lib_.get())
      return NotSupported(fmt::format("the event belongs to another instance of {} than the stream", lib_->domain()));
    return e;
  }

  LibraryRef lib_;
  kz_plugin_stream_t handle_;
  std::string label_;  // the device's
};

class PluginDevice final : public Device {
 public:
  PluginDevice(DeviceProperties properties, const Config* config, LibraryRef lib, int32_t index)
      : Device(std::move(properties), config), lib_(std::move(lib)), index_(index) {}

 protected:
  Result<std::unique_ptr<Buffer>> DoAllocate(size_t bytes) override {
    void* ptr = nullptr;
    KZ_RETURN_IF_ERROR(Check(lib_->api().mem_alloc(lib_->context(), index_, bytes, &ptr), "mem_alloc"));
    if (ptr == nullptr && bytes > 0)
      return Internal(fmt::format("{}: mem_alloc of {} bytes succeeded but returned a null pointer", label(), bytes));
    return std::unique_ptr<Buffer>(std::make_unique<PluginBuffer>(this, ptr, bytes, false, lib_, index_));
  }

  Result<std::unique_ptr<Stream>> DoCreateStream() override {
    kz_plugin_stream_t handle = nullptr;
    KZ_RETURN_IF_ERROR(Check(lib_->api().stream_create(lib_->context(), index_, &handle), "stream_create"));
    if (handle == nullptr) return Internal(fmt::format("{}: stream_create succeeded but returned no stream", label()));
    return std::unique_ptr<Stream>(std::make_unique<PluginStream>(this, lib_, handle));
  }

  Result<std::unique_ptr<Event>> DoCreateEvent() override {
    kz_plugin_event_t handle = nullptr;
    KZ_RETURN_IF_ERROR(Check(lib_->api().event_create(lib_->context(), index_, &handle), "event_create"));
    if (handle == nullptr) return Internal(fmt::format("{}: event_create succeeded but returned no event", label()));
    return std::unique_ptr<Event>(std::make_unique<PluginEvent>(this, lib_, handle));
  }

  Result<ExportedMemory> DoExport(const Buffer& buffer, size_t offset, size_t size) override {
    if (lib_->api().mem_export_fd == nullptr)
      return NotSupported(fmt::format("{}: the plugin has no mem_export_fd", label()));
    void* ptr = static_cast<char*>(buffer.data()) + offset;
    int32_t fd = -1;
    uint64_t fd_offset = 0;
    KZ_RETURN_IF_ERROR(
        Check(lib_->api().mem_export_fd(lib_->context(), index_, ptr, size, &fd, &fd_offset), "mem_export_fd"));
    if (fd < 0) return Internal(fmt::format("{}: mem_export_fd succeeded but returned fd {}", label(), fd));
    ExportedMemory exported;
    exported.kind = ExportKind::kFd;
    exported.fd = UniqueFd(fd);
    exported.offset = fd_offset;
    return exported;
  }

  Result<std::unique_ptr<Buffer>> DoImport(const ExportedMemory& exported) override {
    if (exported.kind != ExportKind::kFd)
      return NotSupported(fmt::format("{} imports only fd exports, not opaque IPC handles", label()));
    if (lib_->api().mem_import_fd == nullptr)
      return NotSupported(fmt::format("{}: the plugin has no mem_import_fd", label()));
    void* ptr = nullptr;
    KZ_RETURN_IF_ERROR(Check(lib_->api().mem_import_fd(lib_->context(), index_, exported.fd.get(), exported.offset,
                                                       exported.size, &ptr),
                             "mem_import_fd"));
    if (ptr == nullptr)
      return Internal(fmt::format("{}: mem_import_fd succeeded but returned a null pointer", label()));
    return std::unique_ptr<Buffer>(std::make_unique<PluginBuffer>(this, ptr, exported.size, true, lib_, index_));
  }

 private:
  Status Check(kz_plugin_result_t rc, std::string_view what,
               std::source_location where = std::source_location::current()) const {
    return lib_->ToStatus(rc, what, where).WithContext(label());
  }

  LibraryRef lib_;
  int32_t index_;
};

PluginBuffer::PluginBuffer(PluginDevice* device, void* data, size_t size, bool imported, LibraryRef lib,
                           int32_t index)
    : Buffer(device, data, size, imported), lib_(std::move(lib)), index_(index) {}

PluginEvent::PluginEvent(PluginDevice* device, LibraryRef lib, kz_plugin_event_t handle)
    : Event(device), lib_(std::move(lib)), handle_(handle), label_(device->label()) {}

PluginStream::PluginStream(PluginDevice* device, LibraryRef lib, kz_plugin_stream_t handle)
    : Stream(device), lib_(std::move(lib)), handle_(handle), label_(device->label()) {}

class PluginBackend final : public Backend {
 public:
  PluginBackend(LibraryRef lib, std::vector<std::unique_ptr<PluginDevice>> devices)
      : lib_(std::move(lib)), devices_(std::move(devices)) {}

  std::string_view name() const override { return lib_->name(); }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  Device* device(int index) override {
    if (index < 0 || index >= device_count()) return nullptr;
    return devices_[static_cast<size_t>(index)].get();
  }

 private:
  LibraryRef lib_;  // declared first: released after the devices
  std::vector<std::unique_ptr<PluginDevice>> devices_;
};

// ---- loading (the api table is checked in plugin_table.cc) ----

// A rate the plugin reports; anything that is not a finite non-negative number counts as unknown.
double SaneRate(double v) { return std::isfinite(v) && v >= 0 ? v : 0.0; }

Result<DeviceProperties> ReadProperties(const PluginLibrary& lib, int32_t index) {
  kz_plugin_device_properties_t raw;
  std::memset(&raw, 0, sizeof raw);
  raw.struct_size = sizeof raw;
  raw.numa_node = -1;
  KZ_RETURN_IF_ERROR(lib.ToStatus(lib.api().device_properties(lib.context(), index, &raw),
                                  fmt::format("device_properties({})", index)));
  // A plugin built against an older header may lower struct_size to what it filled; only fields
  // inside both its size and ours are read. Every api 1.0 field must be there.
  const size_t covered = std::min(raw.struct_size, sizeof raw);
  if (covered < kProps10Size)
    return InvalidArgument(fmt::format("{}: device_properties({}) filled {} bytes; api {}.0 defines {}",
                                       lib.domain(), index, raw.struct_size, KZ_DEVICE_PLUGIN_API_MAJOR, kProps10Size));

  DeviceProperties p;
  p.backend = lib.name();
  p.index = index;
  p.name = BoundedString(raw.name, sizeof raw.name);
  if (p.name.empty()) p.name = fmt::format("{} device {}", lib.name(), index);
  p.uuid = BoundedString(raw.uuid, sizeof raw.uuid);
  // The uuid must name the device identically in every process; the plugin's name and the index
  // do when the plugin gives nothing better.
  if (p.uuid.empty()) p.uuid = fmt::format("{}-{}", lib.name(), index);
  p.pci_bus_id = BoundedString(raw.pci_bus_id, sizeof raw.pci_bus_id);
  p.memory_bytes = raw.memory_bytes;
  p.copy_gbps = SaneRate(raw.copy_gbps);
  p.reduce_gbps = SaneRate(raw.reduce_gbps);
  p.launch_latency_us = SaneRate(raw.launch_latency_us);
  p.numa_node = raw.numa_node < -1 ? -1 : raw.numa_node;
  p.host_accessible = (raw.flags & KZ_PLUGIN_DEVICE_HOST_ACCESSIBLE) != 0;
  p.export_fd = (raw.flags & KZ_PLUGIN_DEVICE_EXPORT_FD) != 0;
  if (p.export_fd && lib.api().mem_export_fd == nullptr) {
    KZ_WARN(kLogPlugin, "{}: device {} claims fd export but mem_export_fd is NULL; export disabled", lib.domain(),
            index);
    p.export_fd = false;
  }
  p.export_opaque = false;  // the 1.0 ABI has no opaque IPC handles
  return p;
}

}  // namespace

Result<std::unique_ptr<Backend>> LoadDevicePlugin(const std::string& path, const Config& config) {
  if (path.empty()) return InvalidArgument("device plugin path is empty");

  dlerror();  // clear any stale message
  DlHandle handle(dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (handle == nullptr)
    return InvalidArgument(
        fmt::format("device plugin {}: dlopen failed: {}", path, BoundedString(dlerror(), kMaxLastErrorLength)));

  dlerror();
  auto get_api = reinterpret_cast<kz_device_plugin_get_api_fn>(dlsym(handle.get(), KZ_DEVICE_PLUGIN_ENTRY_POINT));
  if (get_api == nullptr) {
    const std::string why = BoundedString(dlerror(), kMaxLastErrorLength);
    return InvalidArgument(fmt::format("device plugin {}: not a kizuna device plugin: it does not export {}{}{}", path,
                                       KZ_DEVICE_PLUGIN_ENTRY_POINT, why.empty() ? "" : ": ", why));
  }

  const kz_device_plugin_api_t* api = get_api(KZ_DEVICE_PLUGIN_API_MAJOR, KZ_DEVICE_PLUGIN_API_MINOR);
  KZ_RETURN_IF_ERROR(CheckTable(api, path));

  // Through DeleteLibrary, so that the last release never finalizes or unloads on a plugin thread.
  std::shared_ptr<PluginLibrary> lib(
      new PluginLibrary(std::move(handle), *api, path, BoundedString(api->name, kMaxNameLength),
                        api->version != nullptr ? BoundedString(api->version, kMaxVersionLength)
                                                : std::string("unknown")),
      &DeleteLibrary);
  const std::string where = fmt::format("device plugin '{}' ({})", lib->name(), path);
  KZ_RETURN_IF_ERROR(lib->Init().WithContext(where));

  int32_t count = -1;
  KZ_RETURN_IF_ERROR(lib->ToStatus(lib->api().device_count(lib->context(), &count), "device_count").WithContext(where));
  if (count < 0 || count > kMaxDevices)
    return InvalidArgument(fmt::format("{}: device_count returned {}", where, count));
  if (count == 0) return Unavailable(fmt::format("{} reports no devices", where));

  std::vector<std::unique_ptr<PluginDevice>> devices;
  devices.reserve(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    KZ_ASSIGN_OR_RETURN(DeviceProperties props, ReadProperties(*lib, i));
    devices.push_back(std::make_unique<PluginDevice>(std::move(props), &config, lib, i));
  }

  KZ_INFO(kLogPlugin,
          "loaded device plugin {}: name {}, version {}, plugin api {}.{}, kizuna api {}.{}, {} device(s), "
          "stream_scale {}",
          path, lib->name(), lib->version(), api->api_major, api->api_minor, KZ_DEVICE_PLUGIN_API_MAJOR,
          KZ_DEVICE_PLUGIN_API_MINOR, count,
          lib->HasFieldsUpTo(kApi11TableSize) && lib->api().stream_scale != nullptr ? "yes" : "no (kNotSupported)");
  for (const auto& d : devices) {
    const DeviceProperties& p = d->properties();
    KZ_INFO(kLogPlugin, "{}: {} ({}), {} bytes, host accessible {}, fd export {}", d->label(), p.name, p.uuid,
            p.memory_bytes, p.host_accessible, p.export_fd);
  }
  return std::unique_ptr<Backend>(std::make_unique<PluginBackend>(std::move(lib), std::move(devices)));
}

}  // namespace kizuna::device
