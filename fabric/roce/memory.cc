#include "fabric/roce/memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric::roce {
namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

// Whether `fd` is a DMA-BUF: the kernel names its file "anon_inode:dmabuf" (older kernels) or
// "/dmabuf:<name>". A memfd reads "/memfd:<name> (deleted)".
bool IsDmaBuf(int fd) {
  char link[64];
  char target[256] = {};
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return false;
  const std::string_view t(target, static_cast<size_t>(n));
  return t.starts_with("anon_inode:dmabuf") || t.starts_with("/dmabuf:");
}

std::string Describe(const MemoryDescriptor& m) {
  if (m.fd < 0) return fmt::format("{} (+{} bytes)", m.data, m.size);
  return fmt::format("{} (+{} bytes, fd offset {})", m.data, m.size, m.fd_offset);
}

}  // namespace

std::string_view RegistrationPathName(RegistrationPath path) {
  switch (path) {
    case RegistrationPath::kHost: return "host";
    case RegistrationPath::kDmaBuf: return "dmabuf";
    case RegistrationPath::kMapped: return "mapped fd";
  }
  return "?";
}

MemoryRegion::~MemoryRegion() {
  if (mr_ != nullptr) {
    const int rc = lib_->dereg_mr(mr_);
    if (rc != 0) KZ_WARN(kLogFabric, "roce: {}", lib_->Error(rc, "ibv_dereg_mr").ToString());
  }
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

uint64_t MemoryCache::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

Result<std::shared_ptr<MemoryRegion>> MemoryCache::Get(const MemoryDescriptor& memory) {
  Key key{reinterpret_cast<uintptr_t>(memory.data), memory.size, 0, 0, 0};
  if (memory.fd >= 0) {
    struct stat st {};
    if (::fstat(memory.fd, &st) != 0) return FromErrno(errno, "fstat(registered fd)");
    key = Key{reinterpret_cast<uintptr_t>(memory.data), memory.size, static_cast<uint64_t>(st.st_dev),
              static_cast<uint64_t>(st.st_ino), memory.fd_offset};
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(key);
  if (it != regions_.end()) {
    if (std::shared_ptr<MemoryRegion> live = it->second.lock()) {
      KZ_TRACE(kLogFabric, "roce {}: {} found in the registration cache", device_name_, Describe(memory));
      return live;
    }
    regions_.erase(it);
  }
  KZ_ASSIGN_OR_RETURN(std::shared_ptr<MemoryRegion> region, Register(memory));
  ++registrations_;
  regions_[key] = region;
  // Drop entries whose regions are gone, so the map does not grow with dead keys.
  for (auto i = regions_.begin(); i != regions_.end();) i = i->second.expired() ? regions_.erase(i) : std::next(i);
  return region;
}

Result<std::shared_ptr<MemoryRegion>> MemoryCache::Register(const MemoryDescriptor& memory) {
  std::shared_ptr<MemoryRegion> region(new MemoryRegion());
  region->lib_ = lib_;
  const uint64_t iova = reinterpret_cast<uintptr_t>(memory.data);
  if (memory.fd < 0) {
    region->mr_ = lib_->reg_mr_iova2(pd_, memory.data, memory.size, iova, kAccess);
    if (region->mr_ == nullptr) return lib_->Error(errno, fmt::format("ibv_reg_mr on {}", device_name_));
    region->path_ = RegistrationPath::kHost;
    KZ_INFO(kLogFabric, "roce {}: registered {} memory {} (path: host)",
            device_name_, memory.type == MemoryType::kHost ? "host" : "device", Describe(memory));
    return region;
  }
  std::string dmabuf_failure;
  if (IsDmaBuf(memory.fd)) {
    region->mr_ = lib_->reg_dmabuf_mr(pd_, memory.fd_offset, memory.size, iova, memory.fd, kAccess);
    if (region->mr_ != nullptr) {
      region->path_ = RegistrationPath::kDmaBuf;
      KZ_INFO(kLogFabric, "roce {}: registered device memory {} (path: dmabuf)", device_name_, Describe(memory));
      return region;
    }
    dmabuf_failure = lib_->Error(errno, "ibv_reg_dmabuf_mr").ToString();
  }
  // Not a DMA-BUF (a memfd), or one the driver refused: map the fd range and register the mapping.
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t skew = memory.fd_offset % static_cast<uint64_t>(page);
  const size_t bytes = memory.size + skew;
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory.fd,
                     static_cast<off_t>(memory.fd_offset - skew));
  if (map == MAP_FAILED) {
    const int err = errno;
    KZ_INFO(kLogFabric, "roce {}: device memory {} cannot be registered (path: staged by the caller): mmap: {}{}",
            device_name_, Describe(memory), std::strerror(err),
            dmabuf_failure.empty() ? "" : "; " + dmabuf_failure);
    return NotSupported(fmt::format("roce {}: fd region {} is neither a usable DMA-BUF nor mappable ({}{}); stage it "
                                    "through host memory", device_name_, Describe(memory), std::strerror(err),
                                    dmabuf_failure.empty() ? "" : "; " + dmabuf_failure));
  }
  region->mapping_ = map;
  region->mapping_bytes_ = bytes;
  region->mr_ = lib_->reg_mr_iova2(pd_, static_cast<uint8_t*>(map) + skew, memory.size, iova, kAccess);
  if (region->mr_ == nullptr) return lib_->Error(errno, fmt::format("ibv_reg_mr (mapped fd) on {}", device_name_));
  region->path_ = RegistrationPath::kMapped;
  KZ_INFO(kLogFabric, "roce {}: registered device memory {} (path: mapped fd{})", device_name_, Describe(memory),
          dmabuf_failure.empty() ? ", not a DMA-BUF" : ", DMA-BUF refused: " + dmabuf_failure);
  return region;
}

}  // namespace kizuna::fabric::roce
