// Memory registration for roce (README.md, "Memory"). Every region is registered with its iova
// equal to the descriptor's own address (MemoryDescriptor::data), so a post names memory by the
// caller's pointers whatever path registered it, and the peer writes at the address it was told:
//  - host memory: ibv_reg_mr_iova2 on the pointer ("host");
//  - a DMA-BUF fd: ibv_reg_dmabuf_mr(fd, offset) ("dmabuf"); the NIC reaches the device's pages;
//  - another fd (the emulated device's memfd is not a DMA-BUF; or a DMA-BUF the driver refused):
//    the fd range is mapped MAP_SHARED and the mapping registered ("mapped"), so the NIC moves the
//    region's own pages, unstaged;
//  - device memory that is neither (no fd, or an fd that cannot be mapped): kNotSupported, and the
//    caller stages it through host memory ("staged", logged).
// Registrations are cached per device, keyed by (address, length, fd object, offset): the many
// comms of one communicator (a comm per peer and channel) that register one buffer share one
// memory region. An entry lives while any registration holds it and is deregistered with the
// last one, so a freed and reused address never meets a stale region.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "fabric/fabric.h"
#include "fabric/roce/loader.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::roce {

class RoceDevice;

// How a region was registered (logged at INFO per new region).
enum class RegistrationPath : uint8_t { kHost, kDmaBuf, kMapped };
std::string_view RegistrationPathName(RegistrationPath path);

// One verbs memory region, shared by every registration of the same bytes on a device.
class MemoryRegion {
 public:
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  RegistrationPath path() const { return path_; }

 private:
  friend class MemoryCache;
  MemoryRegion() = default;
  std::shared_ptr<const IbVerbs> lib_;
  ibv_mr* mr_ = nullptr;
  RegistrationPath path_ = RegistrationPath::kHost;
  void* mapping_ = nullptr;  // the mapped fd range (kMapped), unmapped on destruction
  size_t mapping_bytes_ = 0;
};

// The registration cache of one protection domain. Thread-safe.
class MemoryCache {
 public:
  MemoryCache(std::shared_ptr<const IbVerbs> lib, ibv_pd* pd, std::string device_name)
      : lib_(std::move(lib)), pd_(pd), device_name_(std::move(device_name)) {}

  // The region for `memory` (registering it on first use). kNotSupported when the memory cannot
  // be reached by the NIC (the caller stages it); other errors from the verbs call.
  Result<std::shared_ptr<MemoryRegion>> Get(const MemoryDescriptor& memory);
  // Regions registered so far (new ones, not cache hits), for tests and logs.
  uint64_t registrations() const;

 private:
  // (address, length, fd device, fd inode, fd offset); the fd fields are 0 for host memory.
  using Key = std::tuple<uintptr_t, size_t, uint64_t, uint64_t, uint64_t>;
  Result<std::shared_ptr<MemoryRegion>> Register(const MemoryDescriptor& memory);

  std::shared_ptr<const IbVerbs> lib_;
  ibv_pd* pd_;
  std::string device_name_;
  mutable std::mutex mu_;
  std::map<Key, std::weak_ptr<MemoryRegion>> regions_;  // guarded by mu_
  uint64_t registrations_ = 0;                          // guarded by mu_
};

// A comm's registration: the shared region it uses.
class RoceRegistration : public Registration {
 public:
  RoceRegistration(const MemoryDescriptor& memory, std::shared_ptr<RoceDevice> device,
                   std::shared_ptr<MemoryRegion> region)
      : Registration(memory), device_(std::move(device)), region_(std::move(region)) {}
  const MemoryRegion& region() const { return *region_; }

 private:
  // The device (its protection domain) outlives the region: members go in reverse order.
  std::shared_ptr<RoceDevice> device_;
  std::shared_ptr<MemoryRegion> region_;
};

}  // namespace kizuna::fabric::roce
