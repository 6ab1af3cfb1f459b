// Memory registration for ofi comms.
//
// A registration is a fid_mr on the device's domain (bound to the comm's endpoint where the
// provider asks for FI_MR_ENDPOINT), with a key unique within the domain. libfabric 1.17 has no
// DMA-BUF registration and no device-memory support, so only host memory is registered:
//  - a host pointer is registered as it is;
//  - a region given by fd + offset (an emulated device's memfd, a DMA-BUF that can be mapped) is
//    mapped into this process (MAP_SHARED) and the mapping is registered; transfers then move the
//    region's own pages, with no staging copy. Posts name the region by its descriptor's
//    pointers, which are translated into the mapping;
//  - device memory the CPU cannot address and whose fd cannot be mapped is kNotSupported: the
//    caller stages it through host memory (the fabric logs this once).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fabric/fabric.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::ofi {

class OfiDevice;

// A registered region (fid_mr), closed on destruction.
class MemoryRegion {
 public:
  // Registers [addr, addr + len) on `device` with `access` (FI_SEND, FI_REMOTE_WRITE, ...),
  // binding it to `ep` when the provider requires FI_MR_ENDPOINT.
  static Result<std::unique_ptr<MemoryRegion>> Register(OfiDevice& device, fid_ep* ep, void* addr, size_t len,
                                                        uint64_t access);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* desc() const { return desc_; }  // for the posts' desc arguments
  uint64_t key() const { return key_; }  // what a peer's RMA names

 private:
  MemoryRegion() = default;
  fid_mr* mr_ = nullptr;
  void* desc_ = nullptr;
  uint64_t key_ = 0;
};

// An mmap of [offset, offset + size) of an fd; unmapped on destruction.
class FdMapping {
 public:
  FdMapping() = default;
  ~FdMapping();
  FdMapping(FdMapping&& o) noexcept;
  FdMapping& operator=(FdMapping&& o) noexcept;
  FdMapping(const FdMapping&) = delete;
  FdMapping& operator=(const FdMapping&) = delete;

  // kNotSupported when the fd cannot be mapped (with the kernel's reason); kInvalidArgument when
  // the range lies beyond the fd's object.
  static Result<FdMapping> Map(int fd, uint64_t offset, uint64_t size);
  uint8_t* data() const { return data_; }

 private:
  void* base_ = nullptr;
  size_t map_bytes_ = 0;
  uint8_t* data_ = nullptr;
};

class OfiRegistration final : public Registration {
 public:
  static Result<std::unique_ptr<OfiRegistration>> Create(OfiDevice& device, fid_ep* ep,
                                                         const MemoryDescriptor& memory, uint64_t id);

  // Where libfabric reaches `p`, a pointer inside the registration.
  void* local(const void* p) const {
    return local_base_ + (static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(memory().data));
  }
  void* desc() const { return backing_->region->desc(); }
  uint64_t key() const { return backing_->region->key(); }
  // What a peer's RMA names for offset 0 of the region: its address where the provider uses
  // virtual addresses (FI_MR_VIRT_ADDR), else 0 (offsets).
  uint64_t rma_base() const { return rma_base_; }
  uint64_t id() const { return id_; }
  bool mapped() const { return backing_->mapping.data() != nullptr; }
  // Keeps the memory registration (and an fd region's mapping) alive: operations in flight hold
  // it, so that a provider still working on a request that failed early (the peer went away)
  // never touches a closed registration, even after Deregister.
  std::shared_ptr<const void> hold() const { return backing_; }

 private:
  struct Backing {
    FdMapping mapping;  // for fd regions
    std::unique_ptr<MemoryRegion> region;
  };
  OfiRegistration(const MemoryDescriptor& memory, uint64_t id)
      : Registration(memory), id_(id), backing_(std::make_shared<Backing>()) {}
  uint64_t id_;
  uint8_t* local_base_ = nullptr;
  uint64_t rma_base_ = 0;
  std::shared_ptr<Backing> backing_;
};

}  // namespace kizuna::fabric::ofi
