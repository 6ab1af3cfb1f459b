// Memory registration for direct-connect comms, and the peer's regions mapped into this process.
//
// A registration records where the CPU reaches the region: the pointer itself when it is host
// memory or host-accessible device memory, otherwise a local mapping of the region's fd (device
// memory the CPU cannot address directly but whose DMA-BUF / memfd can be mapped). A region
// registered with an fd is also offered to the peer: its fd travels over the connection's Unix
// socket (SCM_RIGHTS, runtime/device/exported_memory.h) and the peer maps it, so a transfer into
// or out of it is one copy between the two registered regions, with no staging in the ring.
//
// A peer's fd that cannot be mapped (a DMA-BUF without mmap support, a memfd not sealed against
// shrinking, which could turn an access into SIGBUS) is recorded as unmappable, and transfers
// using it fall back to staging through the channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "fabric/fabric.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::fabric::directconnect {

// An mmap of [offset, offset + size) of an fd; unmapped on destruction.
class FdMapping {
 public:
  FdMapping() = default;
  FdMapping(FdMapping&& o) noexcept;
  FdMapping& operator=(FdMapping&& o) noexcept;
  FdMapping(const FdMapping&) = delete;
  FdMapping& operator=(const FdMapping&) = delete;
  ~FdMapping();

  // kNotSupported when the fd cannot be mapped (with the kernel's reason).
  static Result<FdMapping> Map(int fd, uint64_t offset, uint64_t size, bool writable);

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  void* base_ = nullptr;
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

class DcRegistration : public Registration {
 public:
  // `id` names the region in messages to the peer (unique within the comm, > 0).
  static Result<std::unique_ptr<DcRegistration>> Create(const MemoryDescriptor& memory, uint64_t id);

  uint64_t id() const { return id_; }
  // Where the CPU reaches `p` (a pointer inside the registration).
  uint8_t* cpu(const void* p) const {
    return cpu_base_ + (static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(memory().data));
  }
  // The byte offset of `p` within the region.
  uint64_t offset_of(const void* p) const {
    return static_cast<uint64_t>(static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(memory().data));
  }
  // The registration's own fd (a dup), while it has one to offer the peer.
  const UniqueFd& fd() const { return fd_; }
  UniqueFd TakeFd() { return std::move(fd_); }

  // Set once the peer has been sent the region (it may map it).
  bool offered_to_peer = false;
  // Set by RecvComm::Expose.
  bool exposed = false;

 private:
  DcRegistration(const MemoryDescriptor& memory, uint64_t id) : Registration(memory), id_(id) {}
  uint64_t id_;
  uint8_t* cpu_base_ = nullptr;
  FdMapping local_;  // when the CPU reaches the region only through its fd
  UniqueFd fd_;
};

// The peer's regions, by the peer's region id.
class PeerRegions {
 public:
  struct Region {
    uint64_t size = 0;
    FdMapping mapping;       // empty when unmappable
    bool mappable = false;
    std::string why_not;     // when unmappable
  };

  // Maps the exported region (writable: the peer's receive buffers; read-only: its send buffers).
  // A region that cannot be mapped is recorded as unmappable (not an error).
  void Add(uint64_t id, const device::ExportedMemory& exported, bool writable);
  void Remove(uint64_t id) { regions_.erase(id); }
  // The highest id the peer has offered. Ids only grow (the peer numbers its registrations in
  // order and never reuses one), so a missing id at or below it will not arrive any more.
  uint64_t highest_id() const { return highest_id_; }
  // nullptr when the peer has not (yet) offered that region.
  const Region* Find(uint64_t id) const {
    auto it = regions_.find(id);
    return it == regions_.end() ? nullptr : &it->second;
  }

 private:
  std::unordered_map<uint64_t, Region> regions_;
  uint64_t highest_id_ = 0;
};

}  // namespace kizuna::fabric::directconnect
