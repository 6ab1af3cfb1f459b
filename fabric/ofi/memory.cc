#include "fabric/ofi/memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rdma/fi_endpoint.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "fabric/ofi/fabric.h"
#include "runtime/core/logging.h"

namespace kizuna::fabric::ofi {

// ---- MemoryRegion ----

Result<std::unique_ptr<MemoryRegion>> MemoryRegion::Register(OfiDevice& device, fid_ep* ep, void* addr, size_t len,
                                                             uint64_t access) {
  const LibFabric& lib = device.lib();
  std::unique_ptr<MemoryRegion> r(new MemoryRegion());
  int rc = fi_mr_reg(device.domain(), addr, len, access, 0, device.NextKey(), 0, &r->mr_, nullptr);
  if (rc != 0) return lib.Error(rc, fmt::format("fi_mr_reg of {} bytes at {}", len, addr));
  if ((device.mr_mode() & FI_MR_ENDPOINT) != 0) {
    if ((rc = fi_mr_bind(r->mr_, &ep->fid, 0)) != 0) return lib.Error(rc, "fi_mr_bind");
    if ((rc = fi_mr_enable(r->mr_)) != 0) return lib.Error(rc, "fi_mr_enable");
  }
  r->desc_ = fi_mr_desc(r->mr_);
  r->key_ = fi_mr_key(r->mr_);
  if (r->key_ == FI_KEY_NOTAVAIL)
    return NotSupported(fmt::format("{}: memory keys do not fit in 64 bits (FI_MR_RAW)", device.provider()));
  return r;
}

MemoryRegion::~MemoryRegion() {
  if (mr_ != nullptr) {
    if (const int rc = fi_close(&mr_->fid); rc != 0)
      KZ_WARN(kLogFabric, "ofi: closing a memory registration failed (error {})", rc);
  }
}

// ---- FdMapping ----

FdMapping::~FdMapping() {
  if (base_ != nullptr) ::munmap(base_, map_bytes_);
}

FdMapping::FdMapping(FdMapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      data_(std::exchange(o.data_, nullptr)) {}

FdMapping& FdMapping::operator=(FdMapping&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, map_bytes_);
    base_ = std::exchange(o.base_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    data_ = std::exchange(o.data_, nullptr);
  }
  return *this;
}

Result<FdMapping> FdMapping::Map(int fd, uint64_t offset, uint64_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FromErrno(errno, "fstat of the registered fd");
  // A memfd's and a DMA-BUF's st_size is the object's size; objects reporting 0 are left to mmap.
  if (st.st_size > 0 &&
      (offset > static_cast<uint64_t>(st.st_size) || size > static_cast<uint64_t>(st.st_size) - offset))
    return InvalidArgument(fmt::format("region [{}, +{}) lies beyond the fd's {} bytes", offset, size, st.st_size));
  // mmap wants a page-aligned file offset: map from the page holding the start.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset & ~(page - 1);
  FdMapping m;
  m.map_bytes_ = static_cast<size_t>(offset - aligned + size);
  void* base = ::mmap(nullptr, m.map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int err = errno;
    m.map_bytes_ = 0;
    return NotSupported(fmt::format("mmap of fd {} [{}, +{}) failed: {}", fd, offset, size, std::strerror(err)));
  }
  m.base_ = base;
  m.data_ = static_cast<uint8_t*>(base) + (offset - aligned);
  return m;
}

// ---- OfiRegistration ----

Result<std::unique_ptr<OfiRegistration>> OfiRegistration::Create(OfiDevice& device, fid_ep* ep,
                                                                 const MemoryDescriptor& memory, uint64_t id) {
  std::unique_ptr<OfiRegistration> reg(new OfiRegistration(memory, id));
  if (memory.fd >= 0) {
    auto mapping = FdMapping::Map(memory.fd, memory.fd_offset, memory.size);
    if (mapping.ok()) {
      reg->backing_->mapping = std::move(mapping).value();
      reg->local_base_ = reg->backing_->mapping.data();
    } else if (mapping.status().code() == StatusCode::kInvalidArgument) {
      return mapping.status();
    } else if (memory.host_accessible) {
      // The CPU reaches the region through its pointer anyway: register that.
      KZ_INFO(kLogFabric, "ofi: fd {} cannot be mapped ({}); registering the region by its pointer", memory.fd,
              mapping.status().message());
      reg->local_base_ = static_cast<uint8_t*>(memory.data);
    } else {
      return NotSupported(fmt::format("libfabric {} registers host memory only, and device memory at {} is neither "
                                      "host accessible nor mappable through its fd ({}): stage it through host memory",
                                      device.lib().VersionString(), memory.data, mapping.status().message()));
    }
  } else if (memory.type == MemoryType::kDevice && !memory.host_accessible) {
    return NotSupported(
        fmt::format("libfabric {} registers host memory only: device memory at {} is not host "
                    "accessible; register it by fd so it can be mapped, or stage it through host memory",
                    device.lib().VersionString(), memory.data));
  } else {
    reg->local_base_ = static_cast<uint8_t*>(memory.data);
  }
  KZ_ASSIGN_OR_RETURN(reg->backing_->region,
                      MemoryRegion::Register(device, ep, reg->local_base_, memory.size, device.mr_access()));
  reg->rma_base_ = (device.mr_mode() & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uint64_t>(reg->local_base_) : 0;
  return reg;
}

}  // namespace kizuna::fabric::ofi
