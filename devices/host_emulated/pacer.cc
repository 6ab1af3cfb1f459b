#include "devices/host_emulated/pacer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/resources.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::host_emulated {

namespace {
constexpr int kSlots = 1024;  // KIZUNA_EMULATED_DEVICES is at most 1024
constexpr size_t kSlotBytes = 64;  // one cache line per device: no false sharing between devices
constexpr size_t kSegmentBytes = kSlots * kSlotBytes;

static_assert(std::atomic<int64_t>::is_always_lock_free, "cross-process atomics need lock-free int64");

// What to do when /dev/shm cannot hold the segment, with its size and free space.
std::string ShmAdvice(int err) {
  if (err == ENOSPC || err == ENOMEM || err == EFBIG)
    return fmt::format(
        "/dev/shm is full or too small ({}): give it room (docker run --shm-size=256m; mount -o "
        "remount,size=1g /dev/shm) or free it, or unset KIZUNA_EMU_COPY_GBPS and "
        "KIZUNA_EMU_REDUCE_GBPS",
        DescribeSpace("/dev/shm"));
  return "is /dev/shm a tmpfs this user may write? (`df /dev/shm`; or unset KIZUNA_EMU_COPY_GBPS and "
         "KIZUNA_EMU_REDUCE_GBPS)";
}

// A failed call on the segment: the error, then the advice.
Status ShmError(int err, const std::string& what) {
  const Status s = FromErrno(err, what);
  return Status(s.code(), fmt::format("{}; {}", s.message(), ShmAdvice(err)));
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Deadline::Clock::now().time_since_epoch()).count();
}
}  // namespace

// One mapping of the shared segment per name, shared by the pacers of a process.
class SharedTimelines {
 public:
  // The mapping, or why the segment cannot be used (the caller falls back to a per-process
  // timeline).
  static Result<std::shared_ptr<SharedTimelines>> Attach(const std::string& name) {
    static std::mutex mu;
    static std::map<std::string, std::weak_ptr<SharedTimelines>> open;
    std::lock_guard lock(mu);
    if (auto existing = open[name].lock()) return existing;
    UniqueFd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return ShmError(errno, fmt::format("shm_open(/dev/shm{})", name));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return FromErrno(errno, fmt::format("fstat(/dev/shm{})", name));
    // Only a segment this user owns and nobody else can write: anyone able to truncate it could
    // make every throttled process fault on its next reservation.
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      return Unavailable(fmt::format("/dev/shm{} is owned by uid {} with mode {:o}, not private to uid {}", name,
                                     st.st_uid, st.st_mode & 0777, ::geteuid()));
    }
    // Sized and given its memory now (posix_fallocate, also for a segment another process only
    // sized): with ftruncate alone, a page gets its memory at its first touch, and when /dev/shm
    // is full that touch is a SIGBUS in the middle of a throttled operation. 64 KiB: no cost worth
    // measuring. posix_fallocate returns the error number; it does not set errno.
    if (const int err = ::posix_fallocate(fd.get(), 0, kSegmentBytes); err != 0) {
      return ShmError(err, fmt::format("reserving the {} bytes of the throttle's timeline /dev/shm{} (posix_fallocate)",
                                       kSegmentBytes, name));
    }
    void* p = ::mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return FromErrno(errno, fmt::format("mmap(/dev/shm{}, {} bytes)", name, kSegmentBytes));
    auto timelines = std::shared_ptr<SharedTimelines>(new SharedTimelines(name, p));
    open[name] = timelines;
    KZ_INFO(kLogDevice, "host_emulated: throttle timelines shared host-wide in /dev/shm{}", name);
    return timelines;
  }

  ~SharedTimelines() { ::munmap(base_, kSegmentBytes); }

  const std::string& name() const { return name_; }
  std::atomic<int64_t>* slot(int index) {
    // A zero-filled page is a valid array of atomics (value 0) on every platform kizuna supports.
    return reinterpret_cast<std::atomic<int64_t>*>(static_cast<char*>(base_) + index * kSlotBytes);
  }

 private:
  SharedTimelines(std::string name, void* base) : name_(std::move(name)), base_(base) {}
  const std::string name_;
  void* const base_;
};

DevicePacer::DevicePacer(std::string host_identity, int device_index)
    : host_identity_(std::move(host_identity)), device_index_(device_index) {}

DevicePacer::~DevicePacer() = default;

std::atomic<int64_t>* DevicePacer::Slot() {
  std::call_once(attach_once_, [this] {
    if (device_index_ >= 0 && device_index_ < kSlots) {
      auto shared = SharedTimelines::Attach(fmt::format("/kizuna-emu-{}-{}", ::geteuid(), host_identity_));
      if (shared.ok()) {
        shared_ = std::move(shared).value();
      } else {
        shared_error_ = shared.status().ToString();
        KZ_WARN(kLogDevice,
                "host_emulated: device {}: {}; throttles are per process (ranks of several processes on this device "
                "are not paced together)",
                device_index_, shared_error_);
      }
    }
    slot_ = shared_ != nullptr ? shared_->slot(device_index_) : &local_;
  });
  return slot_;
}

Deadline::Clock::time_point DevicePacer::Reserve(std::chrono::nanoseconds duration) {
  std::atomic<int64_t>* slot = Slot();
  const int64_t now = NowNs();
  int64_t busy = slot->load(std::memory_order_relaxed);
  int64_t end;
  do {
    // No staleness check: the segment's name carries the boot id and /dev/shm does not outlive a
    // boot, so every value in it was written against this boot's CLOCK_MONOTONIC.
    const int64_t start = busy < now ? now : busy;
    end = start + duration.count();
  } while (!slot->compare_exchange_weak(busy, end, std::memory_order_relaxed));
  return Deadline::Clock::time_point(std::chrono::nanoseconds(end));
}

std::string DevicePacer::segment_name() const {
  return shared_ != nullptr && slot_ != nullptr ? shared_->name() : std::string();
}

std::string DevicePacer::shared_error() const { return slot_ != nullptr ? shared_error_ : std::string(); }

}  // namespace kizuna::host_emulated
