#include "fabric/directconnect/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric::directconnect {
namespace {

Status CheckFdCovers(int fd, uint64_t offset, uint64_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FromErrno(errno, "fstat");
  // A memfd's and a DMA-BUF's st_size is the object's size; anything else that reports 0 we let
  // mmap judge.
  if (st.st_size > 0 &&
      (offset > static_cast<uint64_t>(st.st_size) || size > static_cast<uint64_t>(st.st_size) - offset))
    return InvalidArgument(fmt::format("region [{}, +{}) lies beyond the fd's {} bytes", offset, size, st.st_size));
  return Status::Ok();
}

}  // namespace

// ---- FdMapping ----

FdMapping::FdMapping(FdMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

FdMapping& FdMapping::operator=(FdMapping&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, map_bytes_);
    base_ = std::exchange(o.base_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

FdMapping::~FdMapping() {
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
}

Result<FdMapping> FdMapping::Map(int fd, uint64_t offset, uint64_t size, bool writable) {
  if (size == 0) return InvalidArgument("mapping of 0 bytes");
  KZ_RETURN_IF_ERROR(CheckFdCovers(fd, offset, size));
  // mmap wants a page-aligned file offset: map from the page holding the start.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset & ~(page - 1);
  const uint64_t adjust = offset - aligned;
  FdMapping m;
  m.map_bytes_ = adjust + size;
  void* base = ::mmap(nullptr, m.map_bytes_, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd,
                      static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int err = errno;
    return NotSupported(fmt::format("mmap of fd {} [{}, +{}) failed: {}", fd, offset, size, std::strerror(err)));
  }
  m.base_ = base;
  m.data_ = static_cast<uint8_t*>(base) + adjust;
  m.size_ = size;
  return m;
}

// ---- DcRegistration ----

Result<std::unique_ptr<DcRegistration>> DcRegistration::Create(const MemoryDescriptor& memory, uint64_t id) {
  std::unique_ptr<DcRegistration> reg(new DcRegistration(memory, id));
  if (memory.fd >= 0) {
    reg->fd_ = UniqueFd(::fcntl(memory.fd, F_DUPFD_CLOEXEC, 0));
    if (!reg->fd_.valid()) return FromErrno(errno, "fcntl(F_DUPFD_CLOEXEC) of the registered fd");
    KZ_RETURN_IF_ERROR(CheckFdCovers(reg->fd_.get(), memory.fd_offset, memory.size));
  }
  if (memory.host_accessible) {
    reg->cpu_base_ = static_cast<uint8_t*>(memory.data);
  } else if (reg->fd_.valid()) {
    auto mapping = FdMapping::Map(reg->fd_.get(), memory.fd_offset, memory.size, /*writable=*/true);
    if (!mapping.ok())
      return NotSupported(fmt::format("directconnect copies with the CPU, and device memory at {} is not host "
                                      "accessible and its fd cannot be mapped: {}",
                                      memory.data, mapping.status().message()));
    reg->local_ = std::move(mapping).value();
    reg->cpu_base_ = reg->local_.data();
  } else {
    return NotSupported(fmt::format("directconnect copies with the CPU: device memory at {} is not host accessible; "
                                    "register it by fd (export it from the device) so it can be mapped",
                                    memory.data));
  }
  return reg;
}

// ---- PeerRegions ----

void PeerRegions::Add(uint64_t id, const device::ExportedMemory& exported, bool writable) {
  Region region;
  region.size = exported.size;
  if (exported.kind != device::ExportKind::kFd || !exported.fd.valid()) {
    region.why_not = "the peer offered no fd";
  } else if (const int seals = ::fcntl(exported.fd.get(), F_GET_SEALS); seals >= 0 && (seals & F_SEAL_SHRINK) == 0) {
    // A memory file the peer could shrink under us: an access past its new end would be SIGBUS.
    region.why_not = "the peer's memory file is not sealed against shrinking";
  } else if (exported.size == 0) {
    region.why_not = "the peer offered an empty region";
  } else {
    auto mapping = FdMapping::Map(exported.fd.get(), exported.offset, exported.size, writable);
    if (mapping.ok()) {
      region.mapping = std::move(mapping).value();
      region.mappable = true;
    } else {
      region.why_not = mapping.status().message();
    }
  }
  if (!region.mappable)
    KZ_INFO(kLogFabric, "directconnect: peer region {} ({} bytes) not mapped, transfers with it are staged: {}", id,
            exported.size, region.why_not);
  regions_.insert_or_assign(id, std::move(region));
  highest_id_ = std::max(highest_id_, id);
}

}  // namespace kizuna::fabric::directconnect
