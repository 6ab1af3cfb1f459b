// The objects behind the C API's handles (c_api.cc's header comment says how handles work): a
// communicator's, a stream's and a device's entry, their tables, the process's devices, and the
// checks every call of a communicator makes. Not a public header: only c_api.cc and c_api_comm.cc
// include it.
#pragma once

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

#include "runtime/c_api_handles.h"
#include "runtime/communicator.h"
#include "runtime/device/registry.h"
#include "runtime/kizuna.h"

namespace kizuna::c_api_internal {

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
  std::shared_ptr<void> device_keep;           // declared first: released after `comm`
  uintptr_t device = 0;                        // the handle of its device
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

inline HandleTable<CommEntry>& Comms() {
  static auto* t = new HandleTable<CommEntry>(Kind::kComm);  // never destroyed: C callers may call at exit
  return *t;
}
inline HandleTable<StreamEntry>& Streams() {
  static auto* t = new HandleTable<StreamEntry>(Kind::kStream);
  return *t;
}
inline HandleTable<DeviceEntry>& DeviceTable() {
  static auto* t = new HandleTable<DeviceEntry>(Kind::kDevice);
  return *t;
}

inline uintptr_t Bits(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }
inline kzComm_t CommHandle(uintptr_t bits) { return reinterpret_cast<kzComm_t>(bits); }
inline kzStream_t StreamHandle(uintptr_t bits) { return reinterpret_cast<kzStream_t>(bits); }
inline kzDevice_t DeviceHandle(uintptr_t bits) { return reinterpret_cast<kzDevice_t>(bits); }

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

// A device handle resolved: the device, and what keeps it alive while it is used.
struct DeviceRef {
  kizuna::device::Device* device = nullptr;
  std::shared_ptr<void> keep;
};

// False, with the reason, when `handle` is not a live device.
inline bool FindDevice(kzDevice_t handle, const char* arg, DeviceRef* out) {
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
inline kzResult_t AddComm(std::unique_ptr<kizuna::Communicator> comm, uintptr_t device, std::shared_ptr<void> keep,
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

inline bool ValidType(kzDataType_t t) {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) < kizuna::kNumDataTypes;
}
inline bool ValidOp(kzRedOp_t op) { return static_cast<int>(op) >= 0 && static_cast<int>(op) < kizuna::kNumReduceOps; }

// kzSuccess when the communicator can be used: kzInProgress while a non-blocking creation runs,
// the creation's error after it failed.
inline kzResult_t Ready(const CommEntry& c) {
  switch (c.state.load(std::memory_order_acquire)) {
    case kCommReady: return kzSuccess;
    case kCommCreating:
      g_last_error =
          "the communicator is still being created (kzCommInitRankConfig with blocking = 0): "
          "kzCommGetAsyncError says when it is ready";
      return kzInProgress;
    default: return Report(c.failure.WithContext("the communicator's creation failed"));
  }
}

// Ready, not finalized, and `s` remembered for kzCommFinalize.
inline kzResult_t Usable(CommEntry& c, const std::shared_ptr<StreamEntry>& s) {
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
#define KZ_C_READY_COMM(comm)                                            \
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm"); \
  if (c == nullptr) return kzInvalidArgument;                            \
  if (const kzResult_t ready = Ready(*c); ready != kzSuccess) return ready

#define KZ_C_CHECK_TYPE(t) \
  if (!ValidType(t)) return Invalid(fmt::format("datatype {} is not a kzDataType_t", static_cast<int>(t)))
#define KZ_C_CHECK_OP(op) \
  if (!ValidOp(op)) return Invalid(fmt::format("op {} is not a kzRedOp_t", static_cast<int>(op)))

}  // namespace kizuna::c_api_internal
