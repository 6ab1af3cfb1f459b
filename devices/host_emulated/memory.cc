#include "devices/host_emulated/memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/resources.h"

namespace kizuna::host_emulated {

// ---- AddressMap ----

namespace {

std::atomic<uint64_t> g_map_versions{1};

uint64_t NextVersion() { return g_map_versions.fetch_add(1, std::memory_order_relaxed); }

// The ranges this thread last found with Contains, with the map and its version then: a call checks
// its send and receive buffers every time (two lookups, four atomic operations on the lock), and
// these are usually the ones it checked last time.
struct ContainsHit {
  const void* map = nullptr;
  uint64_t version = 0;
  uintptr_t start = 0, end = 0;
};
thread_local ContainsHit t_hits[2];
thread_local unsigned t_next_hit = 0;

}  // namespace

AddressMap::AddressMap() : version_(NextVersion()) {}

void AddressMap::Insert(const void* start, size_t bytes, void* real, int fd, uint64_t serial) {
  const auto s = reinterpret_cast<uintptr_t>(start);
  std::unique_lock lock(mu_);
  ranges_[s] = Range{s + bytes, reinterpret_cast<uintptr_t>(real), fd, serial};
  version_.store(NextVersion(), std::memory_order_release);
}

void AddressMap::Erase(const void* start) {
  std::unique_lock lock(mu_);
  ranges_.erase(reinterpret_cast<uintptr_t>(start));
  version_.store(NextVersion(), std::memory_order_release);
}

const std::pair<const uintptr_t, AddressMap::Range>* AddressMap::Find(uintptr_t p, size_t bytes) const {
  if (p > std::numeric_limits<uintptr_t>::max() - bytes) return nullptr;  // wraps around
  auto it = ranges_.upper_bound(p);  // first range starting after p
  if (it == ranges_.begin()) return nullptr;
  --it;  // the last range starting at or before p
  return p + bytes <= it->second.end ? &*it : nullptr;
}

bool AddressMap::Contains(const void* ptr, size_t bytes) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  const uint64_t now = version_.load(std::memory_order_acquire);
  for (const ContainsHit& hit : t_hits)
    if (hit.map == this && hit.version == now && p >= hit.start && p <= hit.end && bytes <= hit.end - p) return true;
  std::shared_lock lock(mu_);
  const auto* range = Find(p, bytes);
  if (range == nullptr) return false;
  t_hits[t_next_hit++ % 2] =
      ContainsHit{this, version_.load(std::memory_order_relaxed), range->first, range->second.end};
  return true;
}

void* AddressMap::Translate(const void* ptr, size_t bytes) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::shared_lock lock(mu_);
  const auto* range = Find(p, bytes);
  if (range == nullptr) return nullptr;
  return reinterpret_cast<void*>(range->second.real + (p - range->first));
}

Result<device::AllocationRef> AddressMap::Lookup(const void* ptr, size_t bytes) const {
  std::shared_lock lock(mu_);
  const auto* range = Find(reinterpret_cast<uintptr_t>(ptr), bytes);
  if (range == nullptr || range->second.fd < 0)
    return InvalidArgument(fmt::format("[{}, +{}) is not inside an allocation of this emulated device{}", ptr, bytes,
                                       range == nullptr ? "" : " (it is imported memory)"));
  return device::AllocationRef{range->second.fd, range->second.serial, reinterpret_cast<const void*>(range->first),
                               range->second.end - range->first};
}

// ---- Mapping ----

namespace {

// One mmap'ed region, unmapped on destruction (or Reset).
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      Reset();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { Reset(); }

  void* base() const { return base_; }
  bool mapped() const { return base_ != nullptr; }
  void Reset() {
    if (base_ == nullptr) return;
    if (::munmap(base_, bytes_) != 0)
      KZ_WARN(kLogDevice, "host_emulated: munmap of {} bytes at {} failed: {}", bytes_, base_,
              FromErrno(errno, "munmap").message());
    base_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

// ---- MemoryBuffer ----

// One allocation (owning its memfd), host allocation (the same, outside the budget) or import
// (owning only its mapping). In opaque mode a device allocation or import also owns the PROT_NONE
// reservation that is its device address.
class MemoryBuffer final : public device::Buffer {
 public:
  MemoryBuffer(device::Device* device, void* data, size_t size, bool imported, bool budgeted, UniqueFd fd,
               Mapping real, Mapping reservation, std::shared_ptr<MemoryManager> owner)
      : Buffer(device, data, size, imported),
        budgeted_(budgeted),
        fd_(std::move(fd)),
        real_(std::move(real)),
        reservation_(std::move(reservation)),
        device_index_(device->properties().index),
        owner_(std::move(owner)) {}

  ~MemoryBuffer() override {
    if (!real_.mapped()) return;  // 0-byte buffer: nothing mapped, nothing reserved
    if (owner_->free_hook_) owner_->free_hook_(device_index_, imported() ? "unmapping an import" : "a free");
    // Forget the range before unmapping, so that the address can never be reported addressable
    // (or translated) while nothing is mapped there, and a new mapping at the same address can
    // be inserted.
    owner_->addresses_.Erase(data());
    real_.Reset();
    reservation_.Reset();
    if (budgeted_) owner_->Unreserve(device_index_, size());
  }

  int fd() const { return fd_.get(); }

 private:
  const bool budgeted_;  // counts against the device's budget (device allocations only)
  UniqueFd fd_;          // allocations only; imports need no fd once mapped
  Mapping real_;         // where the bytes are
  Mapping reservation_;  // opaque mode: the PROT_NONE device address; else unmapped
  int device_index_;
  std::shared_ptr<MemoryManager> owner_;
};

// ---- MemoryManager ----

namespace {

// Converts a failed kernel call into a Status. ENOMEM / ENOSPC / EFBIG mean the kernel has no
// memory for the request: that is the device being out of memory, not an internal error.
Status KernelError(int err, std::string_view call, const device::Device& device, size_t bytes) {
  // Emulated memory is shared memory (shmem) charged to this process's memory cgroup; mappings
  // count against ulimit -v. Which of these ran out is for the operator to see, with its figure.
  if (err == ENOMEM || err == ENOSPC || err == EFBIG)
    return OutOfMemory(
        fmt::format("{}: the kernel has no memory for {} bytes ({}: {}); {}; lower KIZUNA_EMU_MEM_BYTES or the job's "
                    "memory use, or raise the limit reached",
                    device.label(), bytes, call, FromErrno(err, call).message(), DescribeMemoryLimits()));
  // Each allocation holds one memfd: running out of descriptors is running out of allocations.
  if (err == EMFILE || err == ENFILE)
    return OutOfMemory(fmt::format("{}: cannot allocate {} bytes: out of file descriptors, and every emulated "
                                   "allocation holds one (raise `ulimit -n`) ({}: {})",
                                   device.label(), bytes, call, FromErrno(err, call).message()));
  return FromErrno(err, call).WithContext(fmt::format("{}: {} bytes", device.label(), bytes));
}

size_t PageSize() {
  static const size_t page = [] {
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

// Opaque mode's device address for `bytes`: address space the CPU cannot touch (PROT_NONE) and
// the kernel does not back or account (MAP_NORESERVE), so a CPU access faults at once.
Result<Mapping> ReserveDeviceAddresses(const device::Device& device, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return KernelError(errno, "mmap(PROT_NONE)", device, bytes);
  return Mapping(p, bytes);
}

}  // namespace

MemoryManager::MemoryManager(const Config& config, int device_count, uint64_t capacity_bytes)
    : capacity_(capacity_bytes),
      fail_alloc_(config.emu_fail_alloc),
      opaque_(config.emu_opaque),
      used_(static_cast<size_t>(device_count)) {}

std::shared_ptr<MemoryManager> MemoryManager::Create(const Config& config, int device_count,
                                                     uint64_t capacity_bytes) {
  // The constructor is private (buffers rely on shared ownership), so no make_shared.
  return std::shared_ptr<MemoryManager>(new MemoryManager(config, device_count, capacity_bytes));
}

uint64_t MemoryManager::used_bytes(int device_index) const {
  if (device_index < 0 || static_cast<size_t>(device_index) >= used_.size()) return 0;
  return used_[static_cast<size_t>(device_index)].load(std::memory_order_relaxed);
}

Status MemoryManager::Reserve(const device::Device& device, size_t bytes) {
  std::atomic<uint64_t>& used = used_[static_cast<size_t>(device.properties().index)];
  uint64_t current = used.load(std::memory_order_relaxed);
  do {
    if (current > capacity_ || bytes > capacity_ - current)
      return OutOfMemory(fmt::format("{}: out of memory: {} bytes requested, {} of {} bytes free", device.label(),
                                     bytes, capacity_ - std::min(current, capacity_), capacity_));
  } while (!used.compare_exchange_weak(current, current + bytes, std::memory_order_relaxed));
  return Status::Ok();
}

void MemoryManager::Unreserve(int device_index, size_t bytes) {
  used_[static_cast<size_t>(device_index)].fetch_sub(bytes, std::memory_order_relaxed);
}

Result<std::unique_ptr<device::Buffer>> MemoryManager::Allocate(device::Device* device, size_t bytes) {
  return AllocateKind(device, bytes, Kind::kDevice);
}

Result<std::unique_ptr<device::Buffer>> MemoryManager::AllocateHost(device::Device* device, size_t bytes) {
  return AllocateKind(device, bytes, Kind::kHost);
}

Result<std::unique_ptr<device::Buffer>> MemoryManager::AllocateKind(device::Device* device, size_t bytes,
                                                                    Kind kind) {
  const std::string_view what = kind == Kind::kHost ? "host allocation" : "allocation";
  const uint64_t number = allocations_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (fail_alloc_.has_value() && number == *fail_alloc_)
    return OutOfMemory(fmt::format("injected fault: allocation #{} ({} of {} bytes on {}) failed "
                                   "(KIZUNA_EMU_FAIL_ALLOC={})",
                                   number, what, bytes, device->label(), *fail_alloc_));
  const bool budgeted = kind == Kind::kDevice;
  if (bytes == 0)
    return std::unique_ptr<device::Buffer>(new MemoryBuffer(device, nullptr, 0, false, budgeted, UniqueFd(),
                                                            Mapping(), Mapping(), shared_from_this()));

  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max()))
    return OutOfMemory(fmt::format("{}: {} bytes exceed the largest memory object the kernel can make", device->label(),
                                   bytes));
  if (budgeted) KZ_RETURN_IF_ERROR(Reserve(*device, bytes));
  // Until the buffer owns the reservation, every early return must give it back.
  bool handed_over = !budgeted;
  struct ReservationGuard {
    MemoryManager* self;
    int index;
    size_t bytes;
    const bool* handed_over;
    ~ReservationGuard() {
      if (!*handed_over) self->Unreserve(index, bytes);
    }
  } guard{this, device->properties().index, bytes, &handed_over};

  const std::string name =
      fmt::format("kizuna-emu{}{}", device->properties().index, kind == Kind::kHost ? "-host" : "");
  // ulimit -f applies to memfds too, and growing one past it raises SIGXFSZ, which ends the process:
  // refused here instead, naming the limit.
  if (const std::optional<uint64_t> fsize = FileSizeLimit(); fsize && bytes > *fsize)
    return OutOfMemory(
        fmt::format("{}: cannot allocate {} bytes: every emulated allocation is a memory file, and this process's "
                    "file size limit is {} bytes (ulimit -f): raise it (ulimit -f unlimited)",
                    device->label(), bytes, *fsize));
  // A memory cgroup (a container's --memory) does not fail the commit below past its limit: its
  // OOM killer ends the process. An allocation larger than the whole limit cannot succeed, so it is
  // refused here, naming the limit (read once: limits are set before a job starts).
  static const std::optional<CgroupMemoryLimit> cgroup = CgroupMemory();
  if (cgroup && bytes > cgroup->limit_bytes)
    return OutOfMemory(
        fmt::format("{}: cannot allocate {} bytes: this process's memory cgroup allows {} in all ({}; a container's "
                    "--memory): lower KIZUNA_EMU_MEM_BYTES or the buffers, or raise the limit",
                    device->label(), bytes, ApproxByteSize(cgroup->limit_bytes), cgroup->file));
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return KernelError(errno, "memfd_create", *device, bytes);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return KernelError(errno, "ftruncate", *device, bytes);
  // Commit the pages now, as cudaMalloc does: a kernel without memory answers here, as
  // kOutOfMemory, instead of killing the process at the first touch of a page. Together with
  // MAP_POPULATE below it also takes most of the page-fault cost out of the first (possibly
  // throttled and measured) stream operation; populating in one call is several times cheaper
  // than faulting page by page (docs/PERFORMANCE.md, "Emulated device memory committed at
  // allocation").
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) return KernelError(err, "fallocate", *device, bytes);
    // A kernel whose memfds cannot preallocate: fall back to pages allocated on first touch.
  }
  // Exporting hands out the fd: no importer may resize the object under this mapping.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return KernelError(errno, "fcntl(F_ADD_SEALS)", *device, bytes);
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (data == MAP_FAILED) return KernelError(errno, "mmap", *device, bytes);
  Mapping real(data, bytes);

  // Opaque device memory: the address handed out is a reservation the CPU cannot touch. Host
  // memory is reached by the CPU and the streams at the same address.
  Mapping reservation;
  if (opaque_ && kind == Kind::kDevice) {
    KZ_ASSIGN_OR_RETURN(reservation, ReserveDeviceAddresses(*device, bytes));
  }
  void* address = reservation.mapped() ? reservation.base() : data;

  // Serials are process-wide (every backend instance draws from one counter), so that a peer's
  // cache of this process's allocations never confuses two of them.
  static std::atomic<uint64_t> serials{0};
  addresses_.Insert(address, bytes, data, fd.get(), serials.fetch_add(1) + 1);
  handed_over = true;
  return std::unique_ptr<device::Buffer>(new MemoryBuffer(device, address, bytes, false, budgeted, std::move(fd),
                                                          std::move(real), std::move(reservation),
                                                          shared_from_this()));
}

Result<device::ExportedMemory> MemoryManager::Export(const device::Buffer& buffer, size_t offset,
                                                    size_t size) const {
  const auto* mine = dynamic_cast<const MemoryBuffer*>(&buffer);
  if (mine == nullptr || mine->fd() < 0)
    return InvalidArgument(fmt::format("{}: buffer was not allocated by host_emulated", buffer.device().label()));
  const int dup = ::fcntl(mine->fd(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return FromErrno(errno, "fcntl(F_DUPFD_CLOEXEC)").WithContext(buffer.device().label());
  device::ExportedMemory exported;
  exported.kind = device::ExportKind::kFd;
  exported.fd = UniqueFd(dup);
  exported.offset = offset;
  exported.size = size;
  return exported;
}

Result<std::unique_ptr<device::Buffer>> MemoryManager::Import(device::Device* device,
                                                              const device::ExportedMemory& exported) {
  if (exported.kind != device::ExportKind::kFd)
    return InvalidArgument(fmt::format("{}: host_emulated imports fd exports only, not opaque IPC handles",
                                       device->label()));
  const int fd = exported.fd.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FromErrno(errno, "fstat").WithContext(device->label());
  if (!S_ISREG(st.st_mode))
    return InvalidArgument(
        fmt::format("{}: fd {} is not a memory file (memfd), cannot import it", device->label(), fd));
  // An object the exporter (or anyone holding the fd) could still shrink would turn a later copy
  // into SIGBUS: accept only memory sealed against shrinking, as host_emulated's own exports are.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return InvalidArgument(fmt::format("{}: fd {} is not sealed against shrinking (F_SEAL_SHRINK): the exporter "
                                       "must seal it, or a later truncation would crash this process",
                                       device->label(), fd));
  const auto object_bytes = static_cast<uint64_t>(st.st_size);
  if (exported.offset > object_bytes || exported.size > object_bytes - exported.offset)
    return InvalidArgument(fmt::format("{}: exported region [{}, {}) exceeds the memory object's {} bytes",
                                       device->label(), exported.offset, exported.offset + exported.size,
                                       object_bytes));
  if (exported.size > std::numeric_limits<size_t>::max() - PageSize())
    return InvalidArgument(fmt::format("{}: exported region of {} bytes is too large", device->label(), exported.size));

  // mmap needs a page-aligned file offset: map from the page holding the region's start and
  // point the buffer at the region inside that mapping.
  const uint64_t aligned = exported.offset & ~static_cast<uint64_t>(PageSize() - 1);
  const size_t slack = static_cast<size_t>(exported.offset - aligned);
  const size_t size = static_cast<size_t>(exported.size);
  const size_t map_bytes = size + slack;
  void* base = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                      static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int err = errno;
    if (err == EACCES)
      return InvalidArgument(fmt::format("{}: fd {} is not open for reading and writing", device->label(), fd));
    return KernelError(err, "mmap", *device, map_bytes);
  }
  Mapping real(base, map_bytes);
  void* data = static_cast<char*>(base) + slack;
  Mapping reservation;
  if (opaque_) {
    KZ_ASSIGN_OR_RETURN(reservation, ReserveDeviceAddresses(*device, size));
  }
  void* address = reservation.mapped() ? reservation.base() : data;
  addresses_.Insert(address, size, data);
  return std::unique_ptr<device::Buffer>(new MemoryBuffer(device, address, size, true, false, UniqueFd(),
                                                          std::move(real), std::move(reservation),
                                                          shared_from_this()));
}

}  // namespace kizuna::host_emulated
