// The C API's results and handle tables (c_api.cc's header comment says how handles work): the
// thread's last error, kzResult_t from a Status, and one table per kind of handle. Not a public
// header: only the C API's sources include it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/status.h"
#include "runtime/kizuna.h"

namespace kizuna::c_api_internal {

using kizuna::Status;
using kizuna::StatusCode;

static_assert(sizeof(uintptr_t) == 8, "handles carry a 32-bit generation beside the slot and the kind");

inline thread_local std::string g_last_error;  // the calling thread's last error message

inline kzResult_t ToResult(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return kzSuccess;
    case StatusCode::kInvalidArgument:
      return kzInvalidArgument;
    case StatusCode::kUnavailable:
      return kzUnavailable;
    case StatusCode::kNotSupported:
      return kzNotSupported;
    case StatusCode::kOutOfMemory:
      return kzOutOfMemory;
    case StatusCode::kTimeout:
      return kzTimeout;
    case StatusCode::kAborted:
      return kzAborted;
    case StatusCode::kRemoteError:
      return kzRemoteError;
    case StatusCode::kInternal:
      return kzInternalError;
  }
  return kzInternalError;
}

inline kzResult_t Report(const Status& s) {
  if (!s.ok()) g_last_error = s.ToString();
  return ToResult(s.code());
}

inline kzResult_t Invalid(std::string message) { return Report(kizuna::InvalidArgument(std::move(message))); }
// Records why a handle was refused (the caller returns kzInvalidArgument).
inline void Refuse(std::string message) { Invalid(std::move(message)); }

// ---- Handle tables ----

enum class Kind : uint8_t { kComm = 0xc5, kStream = 0x5b, kDevice = 0xd9 };

inline const char* KindName(uint64_t tag) {
  switch (static_cast<Kind>(tag)) {
    case Kind::kComm: return "communicator";
    case Kind::kStream: return "stream";
    case Kind::kDevice: return "device";
  }
  return nullptr;
}

// One kind's handles. Slots live in chunks that are never freed, so a reader indexes them without
// a lock; each slot's lock guards its generation and object.
template <typename T>
class HandleTable {
 public:
  explicit HandleTable(Kind kind) : kind_(kind) {}
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  // The new handle; 0 when kMaxSlots handles of this kind are live.
  uintptr_t Add(std::shared_ptr<T> object) {
    std::lock_guard lock(add_mu_);
    uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = size_.load(std::memory_order_relaxed);
      if (index >= kMaxSlots) return 0;
      if (index % kChunkSlots == 0)
        chunks_[index / kChunkSlots].store(new Slot[kChunkSlots], std::memory_order_release);
    }
    Slot& slot = At(index);
    uint32_t generation;
    {
      std::lock_guard slot_lock(slot.mu);
      slot.object = std::move(object);
      generation = slot.generation;
    }
    // Published after the chunk: a reader that sees the index in range sees the chunk.
    if (index == size_.load(std::memory_order_relaxed)) size_.store(index + 1, std::memory_order_release);
    return (uintptr_t{generation} << 32) | (uintptr_t{index} << 8) | static_cast<uint8_t>(kind_);
  }

  // The object, or null with the reason in the thread's last error. `arg` names the argument.
  std::shared_ptr<T> Find(uintptr_t handle, const char* arg) const {
    Slot* slot = Locate(handle, arg);
    if (slot == nullptr) return nullptr;
    uint32_t current;
    {
      std::lock_guard lock(slot->mu);
      current = slot->generation;
      // A free slot has no object: a forged handle naming its next generation is refused too.
      if (current == Generation(handle) && slot->object != nullptr) return slot->object;
    }
    Stale(handle, current, arg);
    return nullptr;
  }

  // Every live object, in slot order.
  std::vector<std::shared_ptr<T>> Live() const {
    std::vector<std::shared_ptr<T>> live;
    const uint32_t n = size_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n; ++i) {
      Slot& slot = At(i);
      std::lock_guard lock(slot.mu);
      if (slot.object != nullptr) live.push_back(slot.object);
    }
    return live;
  }

  // Takes the object out of the table (the caller drops the table's reference); later uses of the
  // handle are refused. Null, with the reason, when the handle is not live.
  std::shared_ptr<T> Remove(uintptr_t handle, const char* arg) {
    Slot* slot = Locate(handle, arg);
    if (slot == nullptr) return nullptr;
    std::shared_ptr<T> object;
    uint32_t current;
    {
      std::lock_guard lock(slot->mu);
      current = slot->generation;
      if (current == Generation(handle)) {
        object = std::move(slot->object);
        slot->object = nullptr;
        // Generation 0 is never issued. A slot reused 2^32 times would accept its oldest handles
        // again: far beyond any program's life.
        slot->generation = current + 1 == 0 ? 1 : current + 1;
      }
    }
    if (object == nullptr) {
      Stale(handle, current, arg);
      return nullptr;
    }
    std::lock_guard lock(add_mu_);
    free_.push_back(Index(handle));
    return object;
  }

 private:
  static constexpr uint32_t kChunkSlots = 1024;
  static constexpr uint32_t kMaxChunks = 1024;
  static constexpr uint32_t kMaxSlots = kChunkSlots * kMaxChunks;  // live handles of one kind

  struct Slot {
    std::mutex mu;
    uint32_t generation = 1;
    std::shared_ptr<T> object;
  };

  static uint32_t Index(uintptr_t handle) { return static_cast<uint32_t>((handle >> 8) & 0xffffff); }
  static uint32_t Generation(uintptr_t handle) { return static_cast<uint32_t>(handle >> 32); }
  Slot& At(uint32_t index) const {
    return chunks_[index / kChunkSlots].load(std::memory_order_acquire)[index % kChunkSlots];
  }

  // The slot a handle of this kind names, or null with the reason.
  Slot* Locate(uintptr_t handle, const char* arg) const {
    const char* kind = KindName(static_cast<uint8_t>(kind_));
    if (handle == 0) {
      Refuse(fmt::format("{} is NULL", arg));
      return nullptr;
    }
    const uint64_t tag = handle & 0xff;
    if (tag != static_cast<uint8_t>(kind_)) {
      const char* other = KindName(tag);
      Refuse(other != nullptr
                 ? fmt::format("{}: {:#x} is not a {} handle (it is a {} handle)", arg, handle, kind, other)
                 : fmt::format("{}: {:#x} is not a {} handle", arg, handle, kind));
      return nullptr;
    }
    const uint32_t index = Index(handle);
    if (Generation(handle) == 0 || index >= size_.load(std::memory_order_acquire)) {
      Refuse(fmt::format("{}: {:#x} is not a {} handle", arg, handle, kind));
      return nullptr;
    }
    return &At(index);
  }

  void Stale(uintptr_t handle, uint32_t current, const char* arg) const {
    const char* kind = KindName(static_cast<uint8_t>(kind_));
    if (Generation(handle) < current) {
      Refuse(fmt::format("{}: {} handle {:#x} was destroyed", arg, kind, handle));
    } else {
      Refuse(fmt::format("{}: {:#x} is not a {} handle", arg, handle, kind));
    }
  }

  const Kind kind_;
  std::array<std::atomic<Slot*>, kMaxChunks> chunks_{};
  std::atomic<uint32_t> size_{0};
  std::mutex add_mu_;
  std::vector<uint32_t> free_;  // guarded by add_mu_
};

}  // namespace kizuna::c_api_internal
