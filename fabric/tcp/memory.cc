#include "fabric/tcp/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace kizuna::fabric::tcp {

Result<std::unique_ptr<TcpRegistration>> TcpRegistration::Create(const MemoryDescriptor& memory) {
  std::unique_ptr<TcpRegistration> r(new TcpRegistration(memory));
  if (memory.type == MemoryType::kHost || memory.host_accessible) {
    r->base_ = static_cast<uint8_t*>(memory.data);
    return r;
  }
  if (memory.fd < 0)
    return NotSupported(
        fmt::format("tcp: device memory at {} that the CPU cannot address and no fd to map "
                    "(stage it through host memory)",
                    memory.data));
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = memory.fd_offset / page * page;
  const size_t bytes = static_cast<size_t>(memory.fd_offset - start + memory.size);
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory.fd, static_cast<off_t>(start));
  if (m == MAP_FAILED)
    return FromErrno(errno, fmt::format("tcp: mmap of {} bytes at offset {} of fd {}", bytes, start, memory.fd));
  r->mapping_ = m;
  r->mapping_bytes_ = bytes;
  r->base_ = static_cast<uint8_t*>(m) + (memory.fd_offset - start);
  return r;
}

TcpRegistration::~TcpRegistration() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

}  // namespace kizuna::fabric::tcp
