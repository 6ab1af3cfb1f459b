// The C API (kizuna.h) over the C++ one. No exception or C++ type crosses it; every failure is
// a kzResult_t plus the thread's last error message.
//
// Handles. What the API hands out for a communicator, a stream or a device is not a pointer but a
// pointer-sized value: the kind (bits 0..7, an odd byte, so that no aligned pointer carries it),
// a slot of that kind's table (bits 8..31) and the slot's generation when the handle was made
// (bits 32..63). A call finds its object by indexing the table and copying a shared_ptr under the
// slot's own lock (tens of nanoseconds, no global lock), and holds that reference while it runs:
// a destroy on another thread only drops the table's reference, and the object goes when the last
// call using it returns. Destroying bumps the slot's generation, so every later use of the old
// handle, a second destroy included, is recognised and refused with kzInvalidArgument; a value
// the tables never issued (a stray pointer, another kind's handle) is refused by its kind byte,
// slot or generation without being dereferenced. Memory from kzMalloc is a real pointer (the
// caller reads and writes it); kzFree looks it up in a map of live allocations.
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/c_api_handles.h"
#include "runtime/communicator.h"
#include "runtime/core/version.h"
#include "runtime/device/registry.h"
#include "runtime/kizuna.h"

namespace {

using namespace kizuna::c_api_internal;  // NOLINT(build/namespaces): the results and handle tables
using kizuna::Status;
using kizuna::StatusCode;

// ---- The objects behind the handles ----

// A communicator. One made by kzCommInitFromEnv owns its device (the registry it created), so
// whatever uses that device — its streams, its memory, communicators split from it — holds
// `device_keep`, a reference to the owner's entry: the device outlives them all.
struct StreamEntry {
  std::shared_ptr<void> device_keep;
  std::unique_ptr<kizuna::device::Stream> stream;
};

enum CommState : int { kCommReady, kCommCreating, kCommFailed };

struct CommEntry {
  std::shared_ptr<void> device_keep;  // declared first: released after `comm`
  uintptr_t device = 0;               // the handle of its device
  std::unique_ptr<kizuna::Communicator> comm;  // set before `state` turns kCommReady
  // Non-blocking creation (kzCommInitRankConfig, blocking = 0): where it stands, why it failed
  // (written before `state` turns kCommFailed), and the thread that creates it, joined before
  // anything else of the entry goes.
  std::atomic<int> state{kCommReady};
  Status failure;
  std::thread creator;
  // The streams its calls used (kzCommFinalize waits for them), and whether it was finalized.
  std::mutex streams_mu;
  std::vector<std::weak_ptr<StreamEntry>> streams;
  std::atomic<bool> finalized{false};

  CommEntry() = default;
  CommEntry(const CommEntry&) = delete;
  CommEntry& operator=(const CommEntry&) = delete;
  ~CommEntry() {
    if (creator.joinable()) creator.join();
  }
};

struct BufferEntry {
  std::shared_ptr<void> device_keep;
  std::unique_ptr<kizuna::device::Buffer> buffer;
};

// A device: one of the process's (below, kept for the life of the process) or one a
// kzCommInitFromEnv communicator owns (usable while that communicator, or anything that keeps its
// device, lives). Device slots are never removed: a communicator-owned one answers, once its
// owner is gone, that the communicator was destroyed.
struct DeviceEntry {
  kizuna::device::Device* device = nullptr;
  bool owned = false;
  std::weak_ptr<CommEntry> owner;
};

HandleTable<CommEntry>& Comms() {
  static auto* t = new HandleTable<CommEntry>(Kind::kComm);  // never destroyed: C callers may call at exit
  return *t;
}
HandleTable<StreamEntry>& Streams() {
  static auto* t = new HandleTable<StreamEntry>(Kind::kStream);
  return *t;
}
HandleTable<DeviceEntry>& DeviceTable() {
  static auto* t = new HandleTable<DeviceEntry>(Kind::kDevice);
  return *t;
}

uintptr_t Bits(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }
kzComm_t CommHandle(uintptr_t bits) { return reinterpret_cast<kzComm_t>(bits); }
kzStream_t StreamHandle(uintptr_t bits) { return reinterpret_cast<kzStream_t>(bits); }
kzDevice_t DeviceHandle(uintptr_t bits) { return reinterpret_cast<kzDevice_t>(bits); }

// The process's devices: the first available backend's, created on first use and kept for the
// life of the process (communicators, buffers and streams refer to them).
class Devices {
 public:
  static Devices& Get() {
    static Devices* d = new Devices();  // never destroyed: C callers may free at exit in any order
    return *d;
  }
  kizuna::Status status() const { return status_; }
  const std::vector<uintptr_t>& handles() const { return handles_; }

 private:
  Devices() {
    registry_ = kizuna::device::DeviceRegistry::Create(kizuna::GlobalConfig());
    std::vector<kizuna::device::Device*> devices = registry_->devices();
    if (devices.empty()) {
      std::string why;
      for (const auto& slot : registry_->backends()) why += fmt::format("; {}: {}", slot.name, slot.status.ToString());
      status_ = kizuna::Unavailable("no devices" + why);
      return;
    }
    const std::string backend = devices[0]->properties().backend;
    std::erase_if(devices, [&](kizuna::device::Device* d) { return d->properties().backend != backend; });
    for (kizuna::device::Device* d : devices) {
      auto entry = std::make_shared<DeviceEntry>();
      entry->device = d;
      handles_.push_back(DeviceTable().Add(std::move(entry)));
    }
  }
  std::unique_ptr<kizuna::device::DeviceRegistry> registry_;
  std::vector<uintptr_t> handles_;
  kizuna::Status status_;
};

// kzMalloc's live allocations, by address.
struct Allocations {
  std::mutex mu;
  std::map<void*, BufferEntry> buffers;  // guarded by mu
};
Allocations& Buffers() {
  static auto* a = new Allocations();  // never destroyed: C callers may free at exit in any order
  return *a;
}

// A device handle resolved: the device, and what keeps it alive while it is used.
struct DeviceRef {
  kizuna::device::Device* device = nullptr;
  std::shared_ptr<void> keep;
};

// False, with the reason, when `handle` is not a live device.
bool FindDevice(kzDevice_t handle, const char* arg, DeviceRef* out) {
  std::shared_ptr<DeviceEntry> entry = DeviceTable().Find(Bits(handle), arg);
  if (entry == nullptr) return false;
  out->device = entry->device;
  out->keep = nullptr;
  if (entry->owned) {
    out->keep = entry->owner.lock();
    if (out->keep == nullptr) {
      Refuse(fmt::format("{}: device handle {:#x} belonged to a communicator of kzCommInitFromEnv, which was destroyed",
                         arg, Bits(handle)));
      return false;
    }
  }
  return true;
}

// A new communicator's handle on `device` (a live device handle), kept alive by `keep`.
kzResult_t AddComm(std::unique_ptr<kizuna::Communicator> comm, uintptr_t device, std::shared_ptr<void> keep,
                   kzComm_t* out) {
  auto entry = std::make_shared<CommEntry>();
  entry->device_keep = std::move(keep);
  entry->device = device;
  entry->comm = std::move(comm);
  const uintptr_t handle = Comms().Add(std::move(entry));
  if (handle == 0) return Report(kizuna::OutOfMemory("too many live communicators (their handle table is full)"));
  *out = CommHandle(handle);
  return kzSuccess;
}

bool ValidType(kzDataType_t t) { return static_cast<int>(t) >= 0 && static_cast<int>(t) < kizuna::kNumDataTypes; }
bool ValidOp(kzRedOp_t op) { return static_cast<int>(op) >= 0 && static_cast<int>(op) < kizuna::kNumReduceOps; }

// kzSuccess when the communicator can be used: kzInProgress while a non-blocking creation runs,
// the creation's error after it failed.
kzResult_t Ready(const CommEntry& c) {
  switch (c.state.load(std::memory_order_acquire)) {
    case kCommReady:
      return kzSuccess;
    case kCommCreating:
      g_last_error = "the communicator is still being created (kzCommInitRankConfig with blocking = 0): "
                     "kzCommGetAsyncError says when it is ready";
      return kzInProgress;
    default:
      return Report(c.failure.WithContext("the communicator's creation failed"));
  }
}

// Ready, not finalized, and `s` remembered for kzCommFinalize.
kzResult_t Usable(CommEntry& c, const std::shared_ptr<StreamEntry>& s) {
  if (const kzResult_t r = Ready(c); r != kzSuccess) return r;
  if (c.finalized.load(std::memory_order_acquire))
    return Invalid("the communicator was finalized (kzCommFinalize): only kzCommDestroy may follow");
  std::lock_guard lock(c.streams_mu);
  for (const auto& w : c.streams)
    if (w.lock() == s) return kzSuccess;
  std::erase_if(c.streams, [](const std::weak_ptr<StreamEntry>& w) { return w.expired(); });
  c.streams.push_back(s);
  return kzSuccess;
}

// `c` and `s`: the communicator and stream entries of a call, held until it returns.
#define KZ_C_CHECK_COMM(comm, stream)                                            \
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm");         \
  if (c == nullptr) return kzInvalidArgument;                                    \
  const std::shared_ptr<StreamEntry> s = Streams().Find(Bits(stream), "stream"); \
  if (s == nullptr) return kzInvalidArgument;                                    \
  if (const kzResult_t usable = Usable(*c, s); usable != kzSuccess) return usable

// `c`: a communicator entry that is ready (Ready), held until the call returns.
#define KZ_C_READY_COMM(comm)                                                                     \
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm");                          \
  if (c == nullptr) return kzInvalidArgument;                                                     \
  if (const kzResult_t ready = Ready(*c); ready != kzSuccess) return ready

#define KZ_C_CHECK_TYPE(t) \
  if (!ValidType(t)) return Invalid(fmt::format("datatype {} is not a kzDataType_t", static_cast<int>(t)))
#define KZ_C_CHECK_OP(op) \
  if (!ValidOp(op)) return Invalid(fmt::format("op {} is not a kzRedOp_t", static_cast<int>(op)))

}  // namespace

extern "C" {

const char* kzGetErrorString(kzResult_t result) {
  switch (result) {
    case kzSuccess: return "success";
    case kzInvalidArgument: return "invalid argument";
    case kzUnavailable: return "unavailable";
    case kzNotSupported: return "not supported";
    case kzOutOfMemory: return "out of memory";
    case kzTimeout: return "timeout";
    case kzAborted: return "aborted";
    case kzRemoteError: return "remote error";
    case kzInternalError: return "internal error";
    case kzInProgress: return "in progress";
  }
  return "unknown result code";
}

const char* kzGetLastError(void) { return g_last_error.c_str(); }

static_assert(KZ_MAJOR == kizuna::kVersion.major && KZ_MINOR == kizuna::kVersion.minor &&
                  KZ_PATCH == kizuna::kVersion.patch,
              "kizuna.h's KZ_MAJOR/KZ_MINOR/KZ_PATCH and runtime/core/version.h's kVersion differ");

kzResult_t kzGetVersion(int* version) {
  if (version == nullptr) return Invalid("version is NULL");
  *version = KZ_VERSION_CODE;
  return kzSuccess;
}

kzResult_t kzDeviceCount(int* count) {
  if (count == nullptr) return Invalid("count is NULL");
  Devices& d = Devices::Get();
  if (!d.status().ok()) return Report(d.status());
  *count = static_cast<int>(d.handles().size());
  return kzSuccess;
}

kzResult_t kzDeviceGet(int index, kzDevice_t* device) {
  if (device == nullptr) return Invalid("device is NULL");
  Devices& d = Devices::Get();
  if (!d.status().ok()) return Report(d.status());
  if (index < 0 || index >= static_cast<int>(d.handles().size()))
    return Invalid(fmt::format("device index {} (there are {})", index, d.handles().size()));
  *device = DeviceHandle(d.handles()[static_cast<size_t>(index)]);
  return kzSuccess;
}

const char* kzDeviceName(kzDevice_t device) {
  if (device == nullptr) return "(null)";
  DeviceRef ref;
  if (!FindDevice(device, "device", &ref)) return "(not a device)";
  thread_local std::string name;
  name = ref.device->label();
  return name.c_str();
}

kzResult_t kzMalloc(kzDevice_t device, size_t bytes, void** ptr) {
  if (ptr == nullptr) return Invalid("ptr is NULL");
  DeviceRef ref;
  if (!FindDevice(device, "device", &ref)) return kzInvalidArgument;
  auto buffer = ref.device->Allocate(bytes);
  if (!buffer.ok()) return Report(buffer.status());
  void* p = (*buffer)->data();
  if (p == nullptr) {
    *ptr = nullptr;  // a zero-byte allocation: nothing to track
    return kzSuccess;
  }
  Allocations& a = Buffers();
  std::lock_guard lock(a.mu);
  a.buffers[p] = BufferEntry{std::move(ref.keep), std::move(*buffer)};
  *ptr = p;
  return kzSuccess;
}

namespace {

// What cudaFree does: wait for the work queued on the device's streams, so that a collective still
// queued or running (its caller's stream is held until it is done) never meets freed memory. The
// reported failures stay for the streams' own Synchronize (an event is waited for, not the stream).
Status WaitForDeviceStreams(kizuna::device::Device& device) {
  const kizuna::Deadline deadline = kizuna::Deadline::AfterSeconds(device.config().timeout_s);
  for (const std::shared_ptr<StreamEntry>& s : Streams().Live()) {
    if (&s->stream->device() != &device) continue;
    auto event = device.CreateEvent();
    if (!event.ok()) return event.status();
    KZ_RETURN_IF_ERROR(s->stream->Record(**event));
    KZ_RETURN_IF_ERROR((*event)->Synchronize(deadline));
  }
  return Status::Ok();
}

}  // namespace

kzResult_t kzFree(kzDevice_t device, void* ptr) {
  if (ptr == nullptr) return kzSuccess;
  DeviceRef ref;
  if (!FindDevice(device, "device", &ref)) return kzInvalidArgument;
  Allocations& a = Buffers();
  {
    std::lock_guard lock(a.mu);
    auto it = a.buffers.find(ptr);
    if (it == a.buffers.end())
      return Invalid(fmt::format("kzFree: {} is not memory of kzMalloc (never allocated, or freed already)", ptr));
    if (&it->second.buffer->device() != ref.device)
      return Invalid(fmt::format("kzFree: {} was allocated on {}, not on {}", ptr, it->second.buffer->device().label(),
                                 ref.device->label()));
  }
  if (Status s = WaitForDeviceStreams(*ref.device); !s.ok())
    return Report(s.WithContext(fmt::format("kzFree: {} not freed: work queued on {}'s streams, which may still use it, "
                                            "did not finish",
                                            ptr, ref.device->label())));
  BufferEntry freed;  // released after the lock
  std::lock_guard lock(a.mu);
  auto it = a.buffers.find(ptr);
  if (it == a.buffers.end())
    return Invalid(fmt::format("kzFree: {} is not memory of kzMalloc (freed meanwhile by another thread)", ptr));
  freed = std::move(it->second);
  a.buffers.erase(it);
  return kzSuccess;
}

// kzStreamCreate, or kzStreamAdopt of `native`.
static kzResult_t NewStream(kzDevice_t device, void* native, kzStream_t* stream, bool adopt) {
  if (stream == nullptr) return Invalid("stream is NULL");
  DeviceRef ref;
  if (!FindDevice(device, "device", &ref)) return kzInvalidArgument;
  auto created = adopt ? ref.device->AdoptStream(native) : ref.device->CreateStream();
  if (!created.ok()) return Report(created.status());
  auto entry = std::make_shared<StreamEntry>();
  entry->device_keep = std::move(ref.keep);
  entry->stream = std::move(*created);
  const uintptr_t handle = Streams().Add(std::move(entry));
  if (handle == 0) return Report(kizuna::OutOfMemory("too many live streams (their handle table is full)"));
  *stream = StreamHandle(handle);
  return kzSuccess;
}

kzResult_t kzStreamCreate(kzDevice_t device, kzStream_t* stream) { return NewStream(device, nullptr, stream, false); }

kzResult_t kzStreamAdopt(kzDevice_t device, void* native, kzStream_t* stream) {
  return NewStream(device, native, stream, /*adopt=*/true);
}

kzResult_t kzStreamGetNative(kzStream_t stream, void** native) {
  if (native == nullptr) return Invalid("native is NULL");
  const std::shared_ptr<StreamEntry> s = Streams().Find(Bits(stream), "stream");
  if (s == nullptr) return kzInvalidArgument;
  *native = s->stream->native_handle();
  if (*native == nullptr)
    return Report(kizuna::NotSupported(fmt::format("stream of {}: its backend has no native handle",
                                                   s->stream->device().label())));
  return kzSuccess;
}

kzResult_t kzStreamDestroy(kzStream_t stream) {
  if (stream == nullptr) return kzSuccess;
  return Streams().Remove(Bits(stream), "stream") != nullptr ? kzSuccess : kzInvalidArgument;
}

kzResult_t kzStreamSynchronize(kzStream_t stream) {
  const std::shared_ptr<StreamEntry> s = Streams().Find(Bits(stream), "stream");
  if (s == nullptr) return kzInvalidArgument;
  return Report(s->stream->Synchronize());
}

kzResult_t kzGetUniqueId(kzUniqueId* id) {
  if (id == nullptr) return Invalid("id is NULL");
  auto u = kizuna::bootstrap::GetUniqueId();
  if (!u.ok()) return Report(u.status());
  const std::string text = u->ToString();
  if (text.size() >= sizeof id->internal) return Report(kizuna::Internal("unique id text too long"));
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, text.data(), text.size());
  return kzSuccess;
}

// kzCommInitRank's arguments checked: the device and the id, parsed.
static kzResult_t InitArgs(kzComm_t* comm, const kzUniqueId& id, kzDevice_t device, DeviceRef* ref,
                           kizuna::bootstrap::UniqueId* parsed) {
  if (comm == nullptr) return Invalid("comm is NULL");
  if (!FindDevice(device, "device", ref)) return kzInvalidArgument;
  auto p = kizuna::bootstrap::UniqueId::Parse(std::string(id.internal, strnlen(id.internal, sizeof id.internal)));
  if (!p.ok()) return Report(p.status());
  *parsed = *p;
  return kzSuccess;
}

kzResult_t kzCommInitRank(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device) {
  DeviceRef ref;
  kizuna::bootstrap::UniqueId parsed;
  if (const kzResult_t r = InitArgs(comm, id, device, &ref, &parsed); r != kzSuccess) return r;
  auto c = kizuna::Communicator::Create(parsed, rank, nranks, *ref.device);
  if (!c.ok()) return Report(c.status());
  return AddComm(std::move(*c), Bits(device), std::move(ref.keep), comm);
}

namespace {

// A kzConfig_t the caller passed (not NULL) is one KZ_CONFIG_INITIALIZER set up.
kzResult_t CheckConfig(const kzConfig_t& config) {
  if (config.size != sizeof(kzConfig_t) || config.magic != KZ_CONFIG_MAGIC)
    return Invalid(
        fmt::format("config was not set up with KZ_CONFIG_INITIALIZER (size {}, magic {:#x}; expected "
                    "{} and {:#x})",
                    config.size, config.magic, sizeof(kzConfig_t), KZ_CONFIG_MAGIC));
  if (config.version / 10000 != KZ_MAJOR)
    return Invalid(
        fmt::format("config comes from kizuna.h of version {}, this library is {}", config.version, KZ_VERSION_CODE));
  if (config.blocking != 0 && config.blocking != 1)
    return Invalid(fmt::format("config->blocking is {} (0 or 1)", config.blocking));
  return kzSuccess;
}

}  // namespace

kzResult_t kzCommInitRankConfig(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device,
                                const kzConfig_t* config) {
  if (config == nullptr) return kzCommInitRank(comm, nranks, id, rank, device);
  if (const kzResult_t r = CheckConfig(*config); r != kzSuccess) return r;
  if (config->blocking == 1) return kzCommInitRank(comm, nranks, id, rank, device);
  DeviceRef ref;
  kizuna::bootstrap::UniqueId parsed;
  if (const kzResult_t r = InitArgs(comm, id, device, &ref, &parsed); r != kzSuccess) return r;
  auto entry = std::make_shared<CommEntry>();
  entry->device_keep = std::move(ref.keep);
  entry->device = Bits(device);
  entry->state.store(kCommCreating, std::memory_order_relaxed);
  // The thread holds no reference: the entry's destructor joins it, so the entry outlives it.
  CommEntry* e = entry.get();
  kizuna::device::Device* d = ref.device;
  entry->creator = std::thread([e, d, id = parsed, rank, nranks] {
    auto c = kizuna::Communicator::Create(id, rank, nranks, *d);
    if (c.ok()) {
      e->comm = std::move(*c);
      e->state.store(kCommReady, std::memory_order_release);
    } else {
      e->failure = c.status();
      e->state.store(kCommFailed, std::memory_order_release);
    }
  });
  const uintptr_t handle = Comms().Add(std::move(entry));
  if (handle == 0) return Report(kizuna::OutOfMemory("too many live communicators (their handle table is full)"));
  *comm = CommHandle(handle);
  g_last_error = "the communicator is being created (kzCommInitRankConfig with blocking = 0)";
  return kzInProgress;
}

kzResult_t kzCommFinalize(kzComm_t comm) {
  KZ_C_READY_COMM(comm);
  if (c->finalized.exchange(true)) return Invalid("the communicator was finalized already");
  std::vector<std::shared_ptr<StreamEntry>> streams;
  {
    std::lock_guard lock(c->streams_mu);
    for (const auto& w : c->streams)
      if (auto s = w.lock()) streams.push_back(std::move(s));
  }
  // An event behind each stream's last operation, waited for with the job's deadline.
  const auto deadline = kizuna::Deadline::AfterSeconds(kizuna::GlobalConfig().timeout_s);
  for (const auto& s : streams) {
    auto event = s->stream->device().CreateEvent();
    if (!event.ok()) return Report(event.status());
    if (Status r = s->stream->Record(**event); !r.ok()) return Report(r);
    if (Status w = (*event)->Synchronize(deadline); !w.ok())
      return Report(w.WithContext("kzCommFinalize: waiting for the communicator's operations"));
  }
  return Report(c->comm->AsyncError());
}

kzResult_t kzCommInitAll(kzComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return Invalid("comms is NULL");
  if (ndev < 1) return Invalid(fmt::format("ndev {} (at least 1)", ndev));
  std::vector<kizuna::device::Device*> devices;
  std::vector<uintptr_t> handles;
  for (int i = 0; i < ndev; ++i) {
    kzDevice_t d = nullptr;
    const kzResult_t r = kzDeviceGet(devlist ? devlist[i] : i, &d);
    if (r != kzSuccess) return r;
    DeviceRef ref;
    if (!FindDevice(d, "device", &ref)) return kzInternalError;  // the process's devices are never destroyed
    devices.push_back(ref.device);
    handles.push_back(Bits(d));
  }
  auto all = kizuna::Communicator::CreateLocal(devices);
  if (!all.ok()) return Report(all.status());
  for (int i = 0; i < ndev; ++i) {
    const size_t k = static_cast<size_t>(i);
    const kzResult_t r = AddComm(std::move((*all)[k]), handles[k], nullptr, &comms[i]);
    if (r != kzSuccess) {
      for (int j = 0; j < i; ++j) Comms().Remove(Bits(comms[j]), "comms");
      return r;
    }
  }
  return kzSuccess;
}

kzResult_t kzCommInitFromEnv(kzComm_t* comm) {
  if (comm == nullptr) return Invalid("comm is NULL");
  auto c = kizuna::Communicator::CreateFromEnvironment();
  if (!c.ok()) return Report(c.status());
  // The communicator owns its device: the device's handle lives while the communicator's entry does.
  auto entry = std::make_shared<CommEntry>();
  auto device = std::make_shared<DeviceEntry>();
  device->device = &(*c)->device();
  device->owned = true;
  device->owner = entry;
  entry->device = DeviceTable().Add(std::move(device));
  if (entry->device == 0) return Report(kizuna::OutOfMemory("too many live devices (their handle table is full)"));
  entry->comm = std::move(*c);
  const uintptr_t handle = Comms().Add(std::move(entry));
  if (handle == 0) return Report(kizuna::OutOfMemory("too many live communicators (their handle table is full)"));
  *comm = CommHandle(handle);
  return kzSuccess;
}

kzResult_t kzCommSplit(kzComm_t comm, int color, int key, kzComm_t* newcomm) {
  if (newcomm == nullptr) return Invalid("newcomm is NULL");
  const std::shared_ptr<CommEntry> parent = Comms().Find(Bits(comm), "comm");
  if (parent == nullptr) return kzInvalidArgument;
  if (const kzResult_t r = Ready(*parent); r != kzSuccess) return r;
  DeviceRef ref;
  if (!FindDevice(DeviceHandle(parent->device), "comm's device", &ref)) return kzInvalidArgument;
  auto c = parent->comm->Split(color, key);
  if (!c.ok()) return Report(c.status());
  if (*c == nullptr) {
    *newcomm = nullptr;
    return kzSuccess;
  }
  return AddComm(std::move(*c), parent->device, std::move(ref.keep), newcomm);
}

kzResult_t kzCommShrink(kzComm_t comm, const int* exclude_ranks, int exclude_count, kzComm_t* newcomm,
                        const kzConfig_t* config, int flags) {
  if (newcomm == nullptr) return Invalid("newcomm is NULL");
  if (exclude_count < 0) return Invalid(fmt::format("exclude_count is {}", exclude_count));
  if (exclude_count > 0 && exclude_ranks == nullptr)
    return Invalid(fmt::format("exclude_ranks is NULL with exclude_count {}", exclude_count));
  if (flags != KZ_SHRINK_DEFAULT && flags != KZ_SHRINK_ABORT)
    return Invalid(fmt::format("flags is {} (KZ_SHRINK_DEFAULT or KZ_SHRINK_ABORT)", flags));
  if (config != nullptr) {
    if (const kzResult_t r = CheckConfig(*config); r != kzSuccess) return r;
    if (config->blocking == 0) return Invalid("config->blocking = 0: kzCommShrink creates blocking communicators only");
  }
  const std::shared_ptr<CommEntry> parent = Comms().Find(Bits(comm), "comm");
  if (parent == nullptr) return kzInvalidArgument;
  if (const kzResult_t r = Ready(*parent); r != kzSuccess) return r;
  DeviceRef ref;
  if (!FindDevice(DeviceHandle(parent->device), "comm's device", &ref)) return kzInvalidArgument;
  auto c = parent->comm->Shrink(std::span(exclude_ranks, static_cast<size_t>(exclude_count)),
                                flags == KZ_SHRINK_ABORT ? kizuna::ShrinkMode::kAbort : kizuna::ShrinkMode::kDefault);
  if (!c.ok()) return Report(c.status());
  return AddComm(std::move(*c), parent->device, std::move(ref.keep), newcomm);
}

kzResult_t kzCommRevoke(kzComm_t comm, int flags) {
  if (flags != 0) return Invalid(fmt::format("flags is {} (0)", flags));
  KZ_C_READY_COMM(comm);
  c->comm->Revoke();
  return kzSuccess;
}

kzResult_t kzCommDestroy(kzComm_t comm) {
  if (comm == nullptr) return kzSuccess;
  // The communicator goes with the last reference: here, or when a call running on another thread
  // returns.
  return Comms().Remove(Bits(comm), "comm") != nullptr ? kzSuccess : kzInvalidArgument;
}

kzResult_t kzCommAbort(kzComm_t comm) {
  const std::shared_ptr<CommEntry> c = Comms().Remove(Bits(comm), "comm");
  if (c == nullptr) return kzInvalidArgument;
  // One still being created is waited for when `c` goes (its entry joins the creating thread).
  if (c->state.load(std::memory_order_acquire) == kCommReady) c->comm->Abort();
  return kzSuccess;
}

kzResult_t kzCommGetAsyncError(kzComm_t comm, kzResult_t* async_error) {
  if (async_error == nullptr) return Invalid("async_error is NULL");
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm");
  if (c == nullptr) return kzInvalidArgument;
  const int state = c->state.load(std::memory_order_acquire);
  if (state != kCommReady) {
    *async_error = state == kCommCreating ? kzInProgress : ToResult(c->failure.code());
    if (state == kCommFailed) g_last_error = c->failure.ToString();
    return kzSuccess;
  }
  const Status s = c->comm->AsyncError();
  if (!s.ok()) g_last_error = s.ToString();
  *async_error = ToResult(s.code());
  return kzSuccess;
}

kzResult_t kzCommRegister(const kzComm_t comm, void* buff, size_t size, void** handle) {
  if (handle == nullptr) return Invalid("handle is NULL");
  KZ_C_READY_COMM(comm);
  auto id = c->comm->Register(buff, size);
  if (!id.ok()) return Report(id.status());
  *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(*id));
  return kzSuccess;
}

kzResult_t kzCommDeregister(const kzComm_t comm, void* handle) {
  KZ_C_READY_COMM(comm);
  return Report(c->comm->Deregister(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle))));
}

kzResult_t kzCommCount(const kzComm_t comm, int* count) {
  if (count == nullptr) return Invalid("count is NULL");
  KZ_C_READY_COMM(comm);
  *count = c->comm->size();
  return kzSuccess;
}

kzResult_t kzCommUserRank(const kzComm_t comm, int* rank) {
  if (rank == nullptr) return Invalid("rank is NULL");
  KZ_C_READY_COMM(comm);
  *rank = c->comm->rank();
  return kzSuccess;
}

kzResult_t kzCommDevice(const kzComm_t comm, kzDevice_t* device) {
  if (device == nullptr) return Invalid("device is NULL");
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm");
  if (c == nullptr) return kzInvalidArgument;
  *device = DeviceHandle(c->device);
  return kzSuccess;
}

kzResult_t kzAllReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op,
                       kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(c->comm->AllReduce(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype),
                                   static_cast<kizuna::ReduceOp>(op), *s->stream));
}

kzResult_t kzBroadcast(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, int root,
                       kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(
      c->comm->Broadcast(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype), root, *s->stream));
}

kzResult_t kzReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op, int root,
                    kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(c->comm->Reduce(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype),
                                static_cast<kizuna::ReduceOp>(op), root, *s->stream));
}

kzResult_t kzAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, kzDataType_t datatype, kzComm_t comm,
                       kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->AllGather(sendbuff, recvbuff, sendcount, static_cast<kizuna::DataType>(datatype), *s->stream));
}

kzResult_t kzReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, kzDataType_t datatype, kzRedOp_t op,
                           kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(c->comm->ReduceScatter(sendbuff, recvbuff, recvcount, static_cast<kizuna::DataType>(datatype),
                                       static_cast<kizuna::ReduceOp>(op), *s->stream));
}

kzResult_t kzAllToAll(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzComm_t comm,
                      kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->AllToAll(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype), *s->stream));
}

kzResult_t kzSend(const void* sendbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm,
                  kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->Send(sendbuff, count, static_cast<kizuna::DataType>(datatype), peer, *s->stream));
}

kzResult_t kzRecv(void* recvbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->Recv(recvbuff, count, static_cast<kizuna::DataType>(datatype), peer, *s->stream));
}

kzResult_t kzBarrier(kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  return Report(c->comm->Barrier(*s->stream));
}

kzResult_t kzGroupStart(void) { return Report(kizuna::Communicator::GroupStart()); }
kzResult_t kzGroupEnd(void) { return Report(kizuna::Communicator::GroupEnd()); }

}  // extern "C"
