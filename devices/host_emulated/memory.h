// Device memory of the emulated accelerator: memfd-backed allocations, fd export and import, the
// per-device memory budget, allocation fault injection, the address map behind
// Device::Addressable, and host memory for the streams (Device::AllocateHost) in opaque mode.
//
// Every allocation is its own memfd (memfd_create + ftruncate + fallocate + mmap MAP_SHARED,
// populated: the memory is committed and mapped when Allocate returns, as with cudaMalloc), so
// an exported buffer is a real file descriptor: another process that maps it sees the same
// physical pages, exactly as a DMA-BUF export of GPU memory would behave. The memfd is sealed
// against resizing, so an importer can never shrink it under the exporter (which would turn the
// exporter's next access into SIGBUS).
//
// Opaque mode (Config::emu_opaque, KIZUNA_EMU_OPAQUE=1) makes device memory behave like GPU
// memory: the CPU cannot dereference it. Each allocation and import keeps its real mapping
// private and hands out, as its device address, a PROT_NONE reservation of the same size
// (MAP_NORESERVE: address space, no memory). Any CPU access to a device address faults at once;
// the stream workers translate device addresses to the real mapping (Translate) before they
// copy, reduce or scale. Host memory (AllocateHost) is a memfd mapping the CPU uses directly,
// with the identity translation, so bytes get in and out through stream copies, as with
// cudaMallocHost. Outside opaque mode every address translates to itself and streams never ask.
//
// Threading: every MemoryManager method is thread-safe. Lifetime: buffers keep the manager alive
// (shared ownership), so a buffer destroyed after its backend still releases cleanly; its
// device() reference, however, is only valid while the backend lives.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated {

// The live allocations and imports of one backend instance, as [start, end) ranges of device
// addresses, each with the address of the real mapping behind it (the same address unless the
// backend is opaque). Lookups vastly outnumber updates (every enqueued copy or reduce checks its
// pointers, and in opaque mode the worker translates them), hence the reader-writer lock.
class AddressMap {
 public:
  AddressMap();

  // `bytes` > 0; ranges never overlap (each is a distinct mapping). `real` is where the CPU
  // reaches the range's first byte; `fd` the allocation's memfd (-1 for imports) and `serial` its
  // number (Device::FindAllocation).
  void Insert(const void* start, size_t bytes, void* real, int fd = -1, uint64_t serial = 0);
  void Erase(const void* start);
  // True when [ptr, ptr + bytes) lies inside one live range (bytes == 0: ptr lies inside or at
  // the end of one).
  bool Contains(const void* ptr, size_t bytes) const;
  // The real address of `ptr` when [ptr, ptr + bytes) lies inside one live range; else null.
  void* Translate(const void* ptr, size_t bytes) const;
  // The allocation holding [ptr, ptr + bytes): kInvalidArgument when none does or it is an import.
  Result<device::AllocationRef> Lookup(const void* ptr, size_t bytes) const;

 private:
  struct Range {
    uintptr_t end;  // exclusive
    uintptr_t real;
    int fd;
    uint64_t serial;
  };
  // The range holding [p, p + bytes), or null. Caller holds mu_ (shared).
  const std::pair<const uintptr_t, Range>* Find(uintptr_t p, size_t bytes) const;

  mutable std::shared_mutex mu_;
  std::map<uintptr_t, Range> ranges_;  // start -> range; guarded by mu_
  // Changes at every Insert and Erase, to a value no map has had before (one counter for all), so
  // that a thread's cached answer of Contains (memory.cc) is trusted only while it is the same.
  std::atomic<uint64_t> version_;
};

class MemoryBuffer;

// The memory side of one backend instance, shared by all of its devices.
class MemoryManager : public std::enable_shared_from_this<MemoryManager> {
 public:
  // `device_count` devices with `capacity_bytes` each. Reads Config::emu_fail_alloc and
  // Config::emu_opaque.
  static std::shared_ptr<MemoryManager> Create(const Config& config, int device_count, uint64_t capacity_bytes);

  // Allocates `bytes` on `device` (0 bytes: an empty buffer whose data() is null).
  // kOutOfMemory, naming the device, the request and the free bytes, when the device's budget
  // or the kernel has no room (or no file descriptor is left: each allocation holds its memfd
  // open for export); kOutOfMemory saying "injected fault" for the allocation chosen by
  // KIZUNA_EMU_FAIL_ALLOC (allocations are numbered from 1 across all devices of the backend,
  // 0-byte ones and AllocateHost calls included). In opaque mode data() is a PROT_NONE
  // reservation: only the streams reach the bytes.
  Result<std::unique_ptr<device::Buffer>> Allocate(device::Device* device, size_t bytes);

  // Opaque mode's Device::AllocateHost: a memfd mapping the CPU reads and writes at data() and
  // the streams of every device of this backend instance take as it is (identity translation).
  // Host memory, not device memory: it does not count against the device's budget (the kernel's
  // answer is the limit, kOutOfMemory as for Allocate). Numbered with the allocations for
  // KIZUNA_EMU_FAIL_ALLOC, so a fault lands on the same call whatever the mode. It can be
  // exported like device memory. Outside opaque mode the device answers AllocateHost with
  // ordinary (host-accessible) device memory instead and never calls this.
  Result<std::unique_ptr<device::Buffer>> AllocateHost(device::Device* device, size_t bytes);

  // A dup() of the buffer's memfd (close-on-exec) and `offset`; the range was checked by the
  // caller (Device::Export).
  Result<device::ExportedMemory> Export(const device::Buffer& buffer, size_t offset, size_t size) const;

  // Maps [exported.offset, + exported.size) of an fd export into this process. The fd must be
  // a memory file (memfd) at least offset + size bytes long, else kInvalidArgument. The buffer
  // holds its own mapping (the ExportedMemory and its fd may be dropped) and unmaps it on
  // destruction. Imported memory does not count against the device's budget: it belongs to
  // the exporting device. In opaque mode the import gets its own PROT_NONE device address.
  Result<std::unique_ptr<device::Buffer>> Import(device::Device* device, const device::ExportedMemory& exported);

  // True when [ptr, ptr + bytes) lies inside a live allocation, import or host allocation of
  // any device of this backend instance.
  bool Addressable(const void* ptr, size_t bytes) const { return addresses_.Contains(ptr, bytes); }
  // Device::FindAllocation: device and host allocations of this backend instance (not imports).
  Result<device::AllocationRef> FindAllocation(const void* ptr, size_t bytes) const {
    return addresses_.Lookup(ptr, bytes);
  }

  // Where the CPU reaches the device address `ptr`, for the stream workers in opaque mode:
  // null when [ptr, ptr + bytes) is not inside live memory of this backend instance (freed
  // before the operation ran). The identity outside opaque mode.
  void* Translate(const void* ptr, size_t bytes) const { return addresses_.Translate(ptr, bytes); }

  // Called with the device's index before a buffer of it (an allocation, a host allocation or an
  // import) is unmapped (Config::emu_sync_free: the backend waits for the device's streams there).
  // Set once, before the first allocation.
  void SetFreeHook(std::function<void(int device_index, std::string_view what)> hook) { free_hook_ = std::move(hook); }

  // Config::emu_opaque: device addresses are PROT_NONE reservations that streams translate.
  bool opaque() const { return opaque_; }
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes(int device_index) const;

 private:
  friend class MemoryBuffer;
  MemoryManager(const Config& config, int device_count, uint64_t capacity_bytes);

  enum class Kind { kDevice, kHost };
  Result<std::unique_ptr<device::Buffer>> AllocateKind(device::Device* device, size_t bytes, Kind kind);

  // Takes `bytes` from the device's budget, or explains why not.
  Status Reserve(const device::Device& device, size_t bytes);
  void Unreserve(int device_index, size_t bytes);

  const uint64_t capacity_;
  const std::optional<uint64_t> fail_alloc_;
  const bool opaque_;
  std::atomic<uint64_t> allocations_{0};    // Allocate calls so far (fault injection numbering)
  std::vector<std::atomic<uint64_t>> used_;  // bytes allocated per device
  std::function<void(int, std::string_view)> free_hook_;  // SetFreeHook; empty by default
  AddressMap addresses_;
};

}  // namespace kizuna::host_emulated
