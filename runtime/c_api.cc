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
#include "runtime/c_api_entries.h"
#include "runtime/c_api_handles.h"
#include "runtime/communicator.h"
#include "runtime/core/version.h"
#include "runtime/device/registry.h"
#include "runtime/kizuna.h"

namespace {

using namespace kizuna::c_api_internal;  // NOLINT(build/namespaces): the results and handle tables
using kizuna::Status;
using kizuna::StatusCode;

// kzMalloc's live allocations, by address.
struct Allocations {
  std::mutex mu;
  std::map<void*, BufferEntry> buffers;  // guarded by mu
};
Allocations& Buffers() {
  static auto* a = new Allocations();  // never destroyed: C callers may free at exit in any order
  return *a;
}

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

}  // extern "C"
