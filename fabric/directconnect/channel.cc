#include "fabric/directconnect/channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <string>

#include <fmt/format.h>

#include "runtime/core/host_id.h"

namespace kizuna::fabric::directconnect {
namespace {

constexpr uint32_t kMagic = 0x4344'5a4b;  // "KZDC"
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 4096;  // the shared header's page; the rings follow it
constexpr uint64_t kMinRing = 4096;
constexpr uint64_t kMaxRing = 256ull << 20;
// How long a side spins on its event counter before it sleeps: long enough to catch a peer that
// answers at once (a small message's round trip), short enough not to matter on an
// oversubscribed machine.
constexpr auto kSpin = std::chrono::microseconds(10);
// On an oversubscribed machine a side yields its CPU this many times, looking between, before it
// sleeps: the peer it waits for is usually runnable on this very CPU, and a side that sleeps lets
// the CPU halt, so that every wake-up costs an interprocessor interrupt through the hypervisor.
// 4 processes on 2 CPUs, 8-byte ring AllReduce: 270-600 us with no yield, 85-160 us with 32 (as
// the host group's waits: collectives/direct/same_host_group.cc).
constexpr int kOversubscribedYields = 32;

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

Status CheckEventFd(int fd, std::string_view what) {
  if (fd < 0) return InvalidArgument(fmt::format("{}: no eventfd", what));
  char link[64] = {};
  const std::string path = fmt::format("/proc/self/fd/{}", fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  // Without /proc the kind of fd cannot be told; the peer has already proved it holds the
  // listener's secret, so this check is only a second line and is skipped.
  if (n < 0) return Status::Ok();
  if (std::string_view(link, static_cast<size_t>(n)) != "anon_inode:[eventfd]")
    return RemoteError(fmt::format("{}: the peer sent {} where an eventfd belongs", what, link));
  return Status::Ok();
}

}  // namespace

struct alignas(64) SideState {
  std::atomic<uint64_t> events;    // bumped by the peer after every change this side may wait for
  std::atomic<uint32_t> sleeping;  // 1 while this side is (about to be) blocked in poll()
  std::atomic<uint32_t> closed;    // 1 once this side has closed its end
};
struct alignas(64) RingIndex {
  std::atomic<uint64_t> value;  // bytes ever published (head) or consumed (tail)
};

// Ring 0 is produced by the sender (forward), ring 1 by the receiver (reverse).
struct Channel::Shared {
  uint32_t magic;
  uint32_t version;
  uint64_t segment_bytes;
  uint64_t ring_offset[2];
  uint64_t ring_capacity[2];
  SideState side[2];
  RingIndex head[2];
  RingIndex tail[2];
};
static_assert(sizeof(Channel::Shared) <= kHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the channel's atomics are shared between processes: they must be lock-free");

Channel::~Channel() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

Result<std::unique_ptr<Channel>> Channel::Create(const ChannelSizes& sizes) {
  for (uint64_t cap : {sizes.forward_bytes, sizes.reverse_bytes})
    if (!IsPowerOfTwo(cap) || cap < kMinRing || cap > kMaxRing)
      return InvalidArgument(fmt::format("channel ring of {} bytes: must be a power of two in [{}, {}]", cap, kMinRing,
                                         kMaxRing));
  std::unique_ptr<Channel> ch(new Channel());
  ch->side_ = Side::kSender;
  const uint64_t total = kHeaderBytes + sizes.forward_bytes + sizes.reverse_bytes;
  ch->segment_fd_ = UniqueFd(::memfd_create("kizuna-dc-channel", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!ch->segment_fd_.valid()) return FromErrno(errno, "memfd_create");
  if (::ftruncate(ch->segment_fd_.get(), static_cast<off_t>(total)) != 0) return FromErrno(errno, "ftruncate");
  // Sealed: the peer maps this too, and a shrink would turn its next access into SIGBUS.
  if (::fcntl(ch->segment_fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return FromErrno(errno, "fcntl(F_ADD_SEALS)");
  void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, ch->segment_fd_.get(), 0);
  if (map == MAP_FAILED) return FromErrno(errno, "mmap");
  ch->map_ = map;
  ch->map_bytes_ = total;
  auto* shared = new (map) Shared{};
  shared->magic = kMagic;
  shared->version = kVersion;
  shared->segment_bytes = total;
  shared->ring_offset[0] = kHeaderBytes;
  shared->ring_capacity[0] = sizes.forward_bytes;
  shared->ring_offset[1] = kHeaderBytes + sizes.forward_bytes;
  shared->ring_capacity[1] = sizes.reverse_bytes;
  ch->shared_ = shared;
  for (UniqueFd& w : ch->wake_) {
    w = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!w.valid()) return FromErrno(errno, "eventfd");
  }
  auto* base = static_cast<uint8_t*>(map);
  ch->out_data_ = base + shared->ring_offset[0];
  ch->out_capacity_ = sizes.forward_bytes;
  ch->in_data_ = base + shared->ring_offset[1];
  ch->in_capacity_ = sizes.reverse_bytes;
  return ch;
}

Result<std::unique_ptr<Channel>> Channel::Attach(UniqueFd segment, UniqueFd wake_sender, UniqueFd wake_receiver) {
  KZ_RETURN_IF_ERROR(CheckEventFd(wake_sender.get(), "channel wakeup (sender)"));
  KZ_RETURN_IF_ERROR(CheckEventFd(wake_receiver.get(), "channel wakeup (receiver)"));
  struct stat st {};
  if (::fstat(segment.get(), &st) != 0) return FromErrno(errno, "fstat");
  const int seals = ::fcntl(segment.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return RemoteError("the peer's channel segment is not a memfd sealed against shrinking");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes + 2 * kMinRing || size > kHeaderBytes + 2 * kMaxRing)
    return RemoteError(fmt::format("the peer's channel segment has {} bytes, outside the valid range", size));
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, segment.get(), 0);
  if (map == MAP_FAILED) return FromErrno(errno, "mmap");
  std::unique_ptr<Channel> ch(new Channel());
  ch->map_ = map;
  ch->map_bytes_ = size;
  ch->side_ = Side::kReceiver;
  ch->shared_ = static_cast<Shared*>(map);
  // Read the layout once into locals, then validate: the peer can change shared memory at will.
  Shared* s = ch->shared_;
  const uint32_t magic = s->magic, version = s->version;
  const uint64_t bytes = s->segment_bytes;
  const uint64_t off[2] = {s->ring_offset[0], s->ring_offset[1]};
  const uint64_t cap[2] = {s->ring_capacity[0], s->ring_capacity[1]};
  if (magic != kMagic) return RemoteError("the peer's channel segment has a bad magic number");
  if (version != kVersion)
    return RemoteError(fmt::format("the peer's channel is version {}, this side speaks {}", version, kVersion));
  if (bytes != size) return RemoteError("the peer's channel segment size does not match its header");
  for (int r = 0; r < 2; ++r) {
    if (!IsPowerOfTwo(cap[r]) || cap[r] < kMinRing || cap[r] > kMaxRing || off[r] < kHeaderBytes || off[r] > size ||
        cap[r] > size - off[r])
      return RemoteError(fmt::format("the peer's channel ring {} layout is invalid", r));
  }
  if (off[0] < off[1] ? off[0] + cap[0] > off[1] : off[1] + cap[1] > off[0])
    return RemoteError("the peer's channel rings overlap");
  if (s->head[0].value.load() != 0 || s->head[1].value.load() != 0 || s->tail[0].value.load() != 0 ||
      s->tail[1].value.load() != 0)
    return RemoteError("the peer's channel segment is not fresh");
  ch->segment_fd_ = std::move(segment);
  ch->wake_[0] = std::move(wake_sender);
  ch->wake_[1] = std::move(wake_receiver);
  auto* base = static_cast<uint8_t*>(map);
  ch->out_data_ = base + off[1];
  ch->out_capacity_ = cap[1];
  ch->in_data_ = base + off[0];
  ch->in_capacity_ = cap[0];
  return ch;
}

Status Channel::Corrupt(std::string_view what) const {
  return RemoteError(fmt::format("corrupt channel: {} (the peer wrote invalid ring state)", what));
}

void Channel::CopyIn(uint64_t position, const void* src, uint64_t bytes) {
  const uint64_t at = position & (out_capacity_ - 1);
  const uint64_t first = std::min(bytes, out_capacity_ - at);
  std::memcpy(out_data_ + at, src, first);
  if (bytes > first) std::memcpy(out_data_, static_cast<const uint8_t*>(src) + first, bytes - first);
}

void Channel::CopyOut(uint64_t position, void* dst, uint64_t bytes) const {
  const uint64_t at = position & (in_capacity_ - 1);
  const uint64_t first = std::min(bytes, in_capacity_ - at);
  std::memcpy(dst, in_data_ + at, first);
  if (bytes > first) std::memcpy(static_cast<uint8_t*>(dst) + first, in_data_, bytes - first);
}

Result<bool> Channel::TryPush(const RecordHeader& header, const void* payload, size_t payload_bytes) {
  if (payload_bytes > max_payload())
    return Internal(fmt::format("record payload of {} bytes exceeds the ring's {}", payload_bytes, max_payload()));
  const int out = static_cast<int>(side_);
  const uint64_t tail = shared_->tail[out].value.load(std::memory_order_acquire);
  if (tail < out_tail_seen_ || tail > out_head_) return Corrupt("the consumer's tail moved backwards or past the head");
  out_tail_seen_ = tail;
  const uint64_t need = RecordBytes(payload_bytes);
  if (out_head_ - tail + need > out_capacity_) return false;
  RecordHeader h = header;
  h.payload_bytes = static_cast<uint32_t>(payload_bytes);
  CopyIn(out_head_, &h, sizeof(h));
  if (payload_bytes > 0) CopyIn(out_head_ + sizeof(h), payload, payload_bytes);
  out_head_ += need;
  shared_->head[out].value.store(out_head_, std::memory_order_release);
  NotifyPeer();
  return true;
}

Result<std::optional<RecordHeader>> Channel::Peek() {
  if (peeked_.has_value()) return peeked_;
  const int in = static_cast<int>(Other(side_));
  const uint64_t head = shared_->head[in].value.load(std::memory_order_acquire);
  if (head < in_head_seen_ || head - in_tail_ > in_capacity_)
    return Corrupt("the producer's head moved backwards or beyond the ring");
  in_head_seen_ = head;
  if (head == in_tail_) return std::optional<RecordHeader>();
  const uint64_t available = head - in_tail_;
  if (available < sizeof(RecordHeader)) return Corrupt("a partial record was published");
  RecordHeader h;
  CopyOut(in_tail_, &h, sizeof(h));
  if (RecordBytes(h.payload_bytes) > available) return Corrupt("a record's payload runs past the published head");
  peeked_ = h;
  return peeked_;
}

void Channel::ReadPayload(uint64_t offset, void* dst, uint64_t bytes) const {
  CopyOut(in_tail_ + sizeof(RecordHeader) + offset, dst, bytes);
}

void Channel::Pop() {
  if (!peeked_.has_value()) return;
  in_tail_ += RecordBytes(peeked_->payload_bytes);
  peeked_.reset();
  shared_->tail[static_cast<int>(Other(side_))].value.store(in_tail_, std::memory_order_release);
  NotifyPeer();
}

uint64_t Channel::events() const {
  return shared_->side[static_cast<int>(side_)].events.load(std::memory_order_seq_cst);
}

void Channel::NotifyPeer() {
  const int peer = static_cast<int>(Other(side_));
  SideState& p = shared_->side[peer];
  p.events.fetch_add(1, std::memory_order_seq_cst);
  if (p.sleeping.load(std::memory_order_seq_cst) != 0) {
    const uint64_t one = 1;
    // EAGAIN means the counter is saturated: the peer has a wakeup pending anyway.
    [[maybe_unused]] const ssize_t n = ::write(wake_[peer].get(), &one, sizeof(one));
  }
}

Result<WaitResult> Channel::Wait(uint64_t seen, Deadline deadline, int extra_fd,
                                 std::optional<Deadline::Clock::time_point> wake_at) {
  SideState& me = shared_->side[static_cast<int>(side_)];
  WaitResult result;
  const bool oversubscribed = HostOversubscribed();
  const auto spin_until = Deadline::Clock::now() + (oversubscribed ? Deadline::Clock::duration(0) : kSpin);
  do {
    for (int i = 0; i < 64; ++i) {
      if (me.events.load(std::memory_order_acquire) != seen) return result;
      CpuRelax();
    }
  } while (Deadline::Clock::now() < spin_until);
  for (int i = 0; oversubscribed && i < kOversubscribedYields; ++i) {
    ::sched_yield();
    if (me.events.load(std::memory_order_acquire) != seen) return result;
  }

  me.sleeping.store(1, std::memory_order_seq_cst);
  if (me.events.load(std::memory_order_seq_cst) != seen) {
    me.sleeping.store(0, std::memory_order_relaxed);
    return result;
  }
  Deadline::Clock::time_point until = deadline.when();
  if (wake_at.has_value() && *wake_at < until) until = *wake_at;
  const auto remaining = std::max<Deadline::Clock::duration>(until - Deadline::Clock::now(), {});
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(remaining).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  pollfd fds[2] = {{wake_[static_cast<int>(side_)].get(), POLLIN, 0}, {extra_fd, POLLIN, 0}};
  const int r = ::ppoll(fds, extra_fd >= 0 ? 2 : 1, &ts, nullptr);
  const int err = errno;
  me.sleeping.store(0, std::memory_order_relaxed);
  uint64_t drained;
  [[maybe_unused]] const ssize_t n = ::read(wake_[static_cast<int>(side_)].get(), &drained, sizeof(drained));
  if (r < 0 && err != EINTR) return FromErrno(err, "ppoll");
  if (r > 0 && extra_fd >= 0) result.extra_ready = (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  return result;
}

void Channel::Close() {
  shared_->side[static_cast<int>(side_)].closed.store(1, std::memory_order_seq_cst);
  NotifyPeer();
}

bool Channel::peer_closed() const {
  return shared_->side[static_cast<int>(Other(side_))].closed.load(std::memory_order_acquire) != 0;
}

}  // namespace kizuna::fabric::directconnect
