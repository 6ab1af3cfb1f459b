// Memory registration for the tcp fabric: the kernel's sockets read and write any memory of the
// process, so a registration only has to say where the region's bytes are in this process.
//
//  - host memory: the pointer as given;
//  - a region given by fd + offset whose memory the CPU reaches (an emulated device's memfd): the
//    descriptor's pointer, as for host memory (the fd is not needed);
//  - a region given by fd + offset that the CPU cannot address at that pointer (opaque device
//    memory with a mappable fd): the fd's range is mapped into the process (MAP_SHARED), and posts,
//    which name the region by its descriptor's pointers, are translated into the mapping.
// Either way transfers move the region's own bytes: no staging (TransferStats::staged_bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fabric/fabric.h"
#include "runtime/core/status.h"

namespace kizuna::fabric::tcp {

class TcpRegistration : public Registration {
 public:
  // kNotSupported for device memory by pointer that the CPU cannot address (no fd to map);
  // mmap's error when an fd range cannot be mapped.
  static Result<std::unique_ptr<TcpRegistration>> Create(const MemoryDescriptor& memory);
  ~TcpRegistration() override;

  // Where [p, p + n) of the region (named by the descriptor's pointers) is in this process.
  uint8_t* Local(const void* p) const {
    return base_ + (static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(memory().data));
  }
  bool mapped() const { return mapping_ != nullptr; }

 private:
  explicit TcpRegistration(const MemoryDescriptor& memory) : Registration(memory) {}
  uint8_t* base_ = nullptr;  // the region's first byte in this process
  void* mapping_ = nullptr;  // an mmap of the fd's pages, or nullptr
  size_t mapping_bytes_ = 0;
};

}  // namespace kizuna::fabric::tcp
