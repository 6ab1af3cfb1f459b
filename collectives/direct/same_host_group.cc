#include "collectives/direct/same_host_group.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <type_traits>

#include <fmt/format.h>

#include "runtime/device/host_reduce.h"
#include "runtime/core/logging.h"
#include "runtime/core/resources.h"

namespace kizuna::collectives {

// One rank's page. Only its owner writes it; the others read it. The owner writes a region before
// it stores `arrived` (release); a reader loads `arrived` (acquire) before it reads the regions.
// A region stays valid until every rank has finished the operation, and the owner cannot publish
// the next one before that, so one set of regions suffices.
struct SharedRegion {
  int32_t fd;            // the allocation's fd in the owner's process; -1: empty region
  uint32_t pad;
  uint64_t serial;       // the allocation's serial (Device::FindAllocation)
  uint64_t alloc_bytes;  // the allocation's size
  uint64_t offset;       // where the buffer starts in it
  uint64_t bytes;        // the buffer's size
};

// What a rank's op-th host-group operation was (op % 2 picks the slot): a peer that reads the
// slot checks that it holds the operation it expects before it trusts the data next to it.
struct SlotHeader {
  uint64_t seq;        // the operation's number (0: none yet)
  uint64_t signature;  // its header signature
  uint32_t protocol;   // SameHostGroup::Protocol: the data is in the slot (one-shot) or the regions
  CollectiveRequest request;
};

// A one-shot operation of at most SameHostGroup::kLineBytes whole in one cache line: a peer that sees
// `seq` has the data in the same line, so it crosses between cores once.
struct alignas(64) OneLine {
  std::atomic<uint64_t> seq;  // the operation (written last, release)
  uint64_t signature;
  uint8_t data[SameHostGroup::kLineBytes];
};
static_assert(sizeof(OneLine) == 64);

struct SameHostPage {
  OneLine lines[2];  // by slot, as `slots`
  alignas(64) std::atomic<uint64_t> arrived;  // the last operation whose slot / regions are published
  alignas(64) std::atomic<uint64_t> finished;  // the last operation whose device work is done
  alignas(64) std::atomic<uint32_t> bell;      // futex word: bumped at every change
  std::atomic<uint32_t> sleepers;              // ranks sleeping on `bell`
  std::atomic<uint32_t> failed;                // nonzero once `failure` is written
  // ReleaseRetired against BeginHold (a Dekker pair, both sequentially consistent): the owner's
  // operations whose caller stream is held or about to be, and the owner's frees under way. Lines
  // of their own: every call reads each peer's `freeing`, which stays cached while nobody frees.
  alignas(64) std::atomic<uint32_t> holding;
  alignas(64) std::atomic<uint32_t> freeing;
  SlotHeader slots[2];
  // The last operation this rank runs as the executor's plan instead (PublishPlanned), written
  // before `planned_seq` (release).
  SlotHeader planned;
  alignas(64) std::atomic<uint64_t> planned_seq;
  SharedRegion regions[2];  // input, output (Exchange)
  char failure[600];
  alignas(64) uint8_t data[2][SameHostGroup::kInlineBytes];  // RunOneShot: the inputs
};
static_assert(std::is_trivially_copyable_v<CollectiveRequest>);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the page's atomics must be lock-free to work across processes");

namespace {

constexpr size_t kPageBytes = (sizeof(SameHostPage) + 4095) / 4096 * 4096;
// Imports kept per group before the least recently used ones are dropped (a buffer freed by its
// owner stays mapped here until then).
constexpr size_t kMaxImportsPerRank = 16;
// How long a rank with a core of its own spins before it yields (WaitFor).
constexpr auto kSpinWindow = std::chrono::microseconds(50);
// How often a rank polls its peer, a pause apart, before it yields (Wait). Ranks that outnumber
// the CPUs yield at once: a peer not there yet usually waits for this CPU, and 64 pauses cost
// about 2 µs of it (docs/RACE.md, "Since the 16:04 run": oversubscribed waits look once, then
// yield).
constexpr int kSpins = 64, kOversubscribedSpins = 0;
// How long a wait inside an operation lasts before it says what it waits on (set_stall_report):
// as the executor's plans (ProbeIfStalled).
constexpr auto kStallReport = std::chrono::seconds(1);
// How long past its deadline a rank waits for a peer inside the operation to report its own
// failure: the peer waits on another rank (a hierarchical operation's leader on the network level),
// its deadline falls about now, and its error names the rank that stopped, where this rank's
// could only name the peer. Notices travel in milliseconds; the ranks' deadlines start within one
// round of each other. A peer that has not arrived gets none: it is the culprit.
constexpr auto kBlameGrace = std::chrono::seconds(1);

// The CPUs this process may run on, a bit each (none when the kernel does not say).
void UsableCpus(uint64_t (&bits)[16]) {
  std::fill(std::begin(bits), std::end(bits), 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return;
  for (int c = 0; c < std::min(CPU_SETSIZE, 1024); ++c)
    if (CPU_ISSET(c, &set)) bits[c / 64] |= uint64_t{1} << (c % 64);
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void CopyString(char* dst, size_t cap, std::string_view s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

struct Hello {  // what each rank allgathers at creation
  int32_t pid;
  int32_t fd;         // its page; -1 when it has none (the reason follows in the verdicts)
  char backend[48];   // its device's backend: imports need one backend on every rank
  int32_t host_accessible;  // the CPU reaches its device memory (RunOneShot needs every rank's to)
  uint64_t cpus[16];        // the CPUs its process may run on (a bit each, the first 1024)
};

bool ProcessEnded(int pidfd) {
  if (pidfd < 0) return false;
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace

SameHostGroup::SameHostGroup(int rank, int nranks, device::Device& device)
    : rank_(rank), nranks_(nranks), device_(device), peers_(static_cast<size_t>(nranks)) {}

SameHostGroup::~SameHostGroup() {
  for (Peer& p : peers_)
    if (p.map != nullptr) ::munmap(p.map, kPageBytes);
}

namespace {

// Whether `device` names the allocation behind an address (Device::FindAllocation), tried on a
// small allocation of its own.
Status CanNameAllocations(device::Device& device) {
  KZ_ASSIGN_OR_RETURN(auto probe, device.Allocate(64));
  return device.FindAllocation(probe->data(), probe->size()).status();
}

}  // namespace

Result<std::shared_ptr<SameHostGroup>> SameHostGroup::Create(int rank, int nranks, device::Device& device,
                                                     const AllGather& allgather) {
  std::shared_ptr<SameHostGroup> g(new SameHostGroup(rank, nranks, device));
  // Step 1: this rank's page. A failure here is still reported through the allgathers below, so
  // every rank learns it and none waits for the others.
  Hello hello{static_cast<int32_t>(::getpid()), -1, {}, device.properties().host_accessible ? 1 : 0, {}};
  UsableCpus(hello.cpus);
  CopyString(hello.backend, sizeof(hello.backend), device.properties().backend);
  Status local = g->OpenOwnPage();
  if (local.ok()) hello.fd = g->page_fd_.get();
  KZ_ASSIGN_OR_RETURN(auto hellos, allgather(std::span(reinterpret_cast<const uint8_t*>(&hello), sizeof(hello))));
  // Step 2: every peer's page, through pidfd_getfd. A failure still goes through the verdicts
  // below: every rank must reach the second allgather.
  if (local.ok()) local = g->MapPeerPages(hellos, hello.backend);
  // Step 3: all or none.
  const std::string verdict = local.ok() ? std::string() : local.ToString();
  KZ_ASSIGN_OR_RETURN(auto verdicts, allgather(std::span(reinterpret_cast<const uint8_t*>(verdict.data()),
                                                         verdict.size())));
  for (int q = 0; q < nranks; ++q) {
    const auto& v = verdicts[static_cast<size_t>(q)];
    if (!v.empty())
      return NotSupported(fmt::format("rank {}: {}", q, std::string(v.begin(), v.end())));
  }
  return g;
}

Status SameHostGroup::OpenOwnPage() {
  if (!device_.properties().export_fd)
    return NotSupported(fmt::format("{} does not export its memory as file descriptors", device_.label()));
  // Peers find a buffer's allocation by its address (PublishRegion): a device that cannot say
  // which allocation an address lies in would fail every fused call.
  if (Status named = CanNameAllocations(device_); !named.ok()) return NotSupported(named.message());
  // Each call named with the page's size; the memory limits where memory was refused.
  const auto page_error = [](int err, std::string_view call) {
    Status s = FromErrno(err, fmt::format("{} of the host group's page ({} bytes)", call, kPageBytes));
    if (err != ENOMEM && err != ENOSPC) return s;
    return Status(s.code(), fmt::format("{}; {}", s.message(), DescribeMemoryLimits()));
  };
  UniqueFd fd(::memfd_create("kizuna-host-group", MFD_CLOEXEC));
  if (!fd.valid()) return page_error(errno, "memfd_create");
  if (::ftruncate(fd.get(), kPageBytes) != 0) return page_error(errno, "ftruncate");
  void* map = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return page_error(errno, "mmap");
  Peer& me = peers_[static_cast<size_t>(rank_)];
  me.map = map;
  me.page = new (map) SameHostPage{};
  me.pid = ::getpid();
  page_fd_ = std::move(fd);
  return Status::Ok();
}

Status SameHostGroup::MapPeerPages(const std::vector<std::vector<uint8_t>>& hellos, std::string_view backend) {
  uint64_t all_cpus[16] = {};  // the union of every rank's CPUs
  for (int q = 0; q < nranks_; ++q) {
    if (hellos[static_cast<size_t>(q)].size() != sizeof(Hello))
      return NotSupported(fmt::format("rank {} sent {} bytes, not a host-group hello (another kizuna version?)", q,
                                      hellos[static_cast<size_t>(q)].size()));
    Hello h;
    std::memcpy(&h, hellos[static_cast<size_t>(q)].data(), sizeof(h));
    h.backend[sizeof(h.backend) - 1] = '\0';
    if (std::string_view(h.backend) != backend)
      return NotSupported(fmt::format("rank {} has a {} device, rank {} a {} device", q, h.backend, rank_, backend));
    if (!h.host_accessible) one_shot_ = false;
    for (int w = 0; w < 16; ++w) all_cpus[w] |= h.cpus[w];
    for (int o = 0; o < q; ++o)
      if (peers_[static_cast<size_t>(o)].pid == h.pid) one_rank_per_process_ = false;
    if (h.fd < 0) return NotSupported(fmt::format("rank {} could not create its page", q));
    Peer& p = peers_[static_cast<size_t>(q)];
    p.pid = h.pid;
    p.pidfd.Reset(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(h.pid), 0)));
    if (!p.pidfd.valid()) return FromErrno(errno, fmt::format("pidfd_open of rank {} (pid {})", q, h.pid));
    if (q == rank_) continue;
    UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_getfd, p.pidfd.get(), h.fd, 0)));
    if (!fd.valid()) return FromErrno(errno, fmt::format("pidfd_getfd of rank {}'s page (pid {})", q, h.pid));
    void* map = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (map == MAP_FAILED) return FromErrno(errno, fmt::format("mmap of rank {}'s page", q));
    p.map = map;
    p.page = static_cast<SameHostPage*>(map);
  }
  int cpus = 0;
  for (uint64_t w : all_cpus) cpus += std::popcount(w);
  spin_ = cpus >= nranks_;
  cpus_ = cpus;
  return Status::Ok();
}

void SameHostGroup::Ring() {
  if (spin_) return;  // nobody sleeps: every rank spins (WaitFor)
  SameHostPage& p = mine();
  p.bell.fetch_add(1, std::memory_order_seq_cst);
  if (p.sleepers.load(std::memory_order_seq_cst) > 0) Futex(&p.bell, FUTEX_WAKE, INT_MAX, nullptr);
}

void SameHostGroup::Fail(const Status& why) {
  SameHostPage& p = mine();
  if (p.failed.load() != 0) return;
  CopyString(p.failure, sizeof(p.failure), why.ToString());
  p.failed.store(1, std::memory_order_release);
  Ring();
}

Status SameHostGroup::WaitFor(int q, uint64_t seq, Phase phase, int slot, Deadline deadline,
                          const std::atomic<bool>& abort) {
  const SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
  if (phase == Phase::kFinish)
    return Wait(
        q, seq, "finish the fused collective", [&] { return p.finished.load(std::memory_order_acquire) >= seq; },
        deadline, abort, /*inside=*/true);
  // A peer that took the one-line protocol for this operation does not store `arrived`: seeing
  // its line ends the wait too, and the caller names the mismatch.
  return Wait(
      q, seq, "arrive at the fused collective",
      [&] {
        return p.arrived.load(std::memory_order_acquire) >= seq ||
               p.lines[slot].seq.load(std::memory_order_acquire) == seq;
      },
      deadline, abort);
}

template <typename Reached>
Status SameHostGroup::Wait(int q, uint64_t seq, const char* what, Reached reached, Deadline deadline,
                           const std::atomic<bool>& abort, bool inside) {
  SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
  // With a CPU for every rank, spin (the peer is usually there already or about to be), yielding
  // once per kSpinWindow: a system call costs a microsecond or more (more inside a VM), longer
  // than a peer running on another CPU takes to arrive, and with no sleeper nobody needs to ring
  // (Ring). With more ranks than CPUs, look once, then yield the core a few times, then sleep on
  // the peer's bell: the peer may need this CPU. Every slice ends to look at the deadline and the
  // peer.
  if (reached()) return Status::Ok();
  for (int i = 0; i < (spin_ ? kSpins : kOversubscribedSpins); ++i) {
    __builtin_ia32_pause();
    if (reached()) return Status::Ok();
  }
  const auto began = std::chrono::steady_clock::now();
  bool reported = seq == 0 || !stall_report_;  // point-to-point holds (seq 0) are no operation's
  auto report = [&] {
    if (reported || std::chrono::steady_clock::now() - began < kStallReport) return;
    reported = true;
    stall_report_(fmt::format("waiting on rank {} (to {})", Name(q), what));
  };
  if (spin_) {
    // No rank sleeps, so none rings (Ring): spin, yielding the core between windows, and look at
    // the peer, the abort flag and the deadline after each window.
    while (true) {
      const auto until = std::chrono::steady_clock::now() + kSpinWindow;
      do {
        for (int i = 0; i < 64; ++i) {
          if (reached()) return Status::Ok();
          __builtin_ia32_pause();
        }
      } while (std::chrono::steady_clock::now() < until);
      KZ_RETURN_IF_ERROR(Stalled(q, seq, what, deadline, abort, inside));
      report();
      if (while_waiting_) while_waiting_();
      ::sched_yield();
    }
  }
  for (int round = 0;; ++round) {
    if (reached()) return Status::Ok();
    if (p.failed.load(std::memory_order_acquire) != 0)
      return Aborted(
          fmt::format("rank {} failed: {}", Name(q), std::string(p.failure, strnlen(p.failure, sizeof(p.failure)))));
    if (round < 32) {
      ::sched_yield();
      continue;
    }
    KZ_RETURN_IF_ERROR(Stalled(q, seq, what, deadline, abort, inside));
    report();
    if (while_waiting_) {
      while_waiting_();
      if (reached()) return Status::Ok();
    }
    p.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t bell = p.bell.load(std::memory_order_seq_cst);
    if (!reached() && p.failed.load() == 0) {
      // At least a millisecond: past the deadline, a grace (Stalled) may still run.
      const auto slice = std::clamp<std::chrono::nanoseconds>(deadline.Remaining(), std::chrono::milliseconds(1),
                                                              std::chrono::milliseconds(10));
      const timespec ts{0, static_cast<long>(slice.count())};
      Futex(&p.bell, FUTEX_WAIT, bell, &ts);
    }
    p.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

Status SameHostGroup::Stalled(int q, uint64_t seq, const char* what, Deadline deadline, const std::atomic<bool>& abort,
                              bool inside) const {
  const Peer& peer = peers_[static_cast<size_t>(q)];
  const SameHostPage& p = *peer.page;
  if (p.failed.load(std::memory_order_acquire) != 0)
    return Aborted(
        fmt::format("rank {} failed: {}", Name(q), std::string(p.failure, strnlen(p.failure, sizeof(p.failure)))));
  if (abort.load()) return Aborted("the communicator was aborted");
  if (seq != 0 && p.planned_seq.load(std::memory_order_acquire) == seq) {
    // The peer runs this operation as a plan: it will never arrive here.
    const SameHostPage& me = mine();
    const SlotHeader* own = me.slots[0].seq == seq ? &me.slots[0] : me.slots[1].seq == seq ? &me.slots[1] : nullptr;
    return InvalidArgument(fmt::format(
        "collective mismatch between ranks: rank {} is at operation {}: {}; rank {} is at operation {}: {} (run "
        "another way: the ranks disagree on the algorithm)",
        Name(rank_), seq, own != nullptr ? own->request.ToString() : std::string("a fused call"), Name(q), seq,
        p.planned.request.ToString()));
  }
  // Point-to-point operations (BeginHold) have no number.
  const std::string op = seq != 0 ? fmt::format("operation {}: ", seq) : std::string();
  if (ProcessEnded(peer.pidfd.get()))
    return RemoteError(fmt::format("{}rank {} (pid {}) ended before it could {}", op, Name(q), peer.pid, what));
  if (!deadline.Expired()) return Status::Ok();
  if (inside && std::chrono::steady_clock::now() < deadline.when() + kBlameGrace) return Status::Ok();
  return Timeout(fmt::format("{}rank {} did not {} by the deadline", op, Name(q), what));
}

Status SameHostGroup::PublishRegion(int which, const void* ptr, uint64_t bytes) {
  SharedRegion& r = mine().regions[which];
  r = SharedRegion{-1, 0, 0, 0, 0, bytes};
  if (bytes == 0) return Status::Ok();
  KZ_ASSIGN_OR_RETURN(device::AllocationRef a, device_.FindAllocation(ptr, bytes));
  r.fd = a.fd;
  r.serial = a.serial;
  r.alloc_bytes = a.bytes;
  r.offset = static_cast<uint64_t>(static_cast<const uint8_t*>(ptr) - static_cast<const uint8_t*>(a.base));
  return Status::Ok();
}

Result<uint8_t*> SameHostGroup::Resolve(int q, int which, uint64_t seq) {
  const SharedRegion r = peers_[static_cast<size_t>(q)].page->regions[which];
  if (r.bytes == 0) return nullptr;
  if (r.fd < 0 || r.offset > r.alloc_bytes || r.bytes > r.alloc_bytes - r.offset)
    return InvalidArgument(fmt::format("rank {} published a malformed buffer (fd {}, offset {}, {} of {} bytes)", q,
                                       r.fd, r.offset, r.bytes, r.alloc_bytes));
  auto it = imports_.find({q, r.serial});
  if (it == imports_.end() || it->second.buffer->size() != r.alloc_bytes) {
    const Peer& p = peers_[static_cast<size_t>(q)];
    device::ExportedMemory e;
    e.kind = device::ExportKind::kFd;
    e.fd.Reset(static_cast<int>(::syscall(SYS_pidfd_getfd, p.pidfd.get(), r.fd, 0)));
    if (!e.fd.valid())
      return FromErrno(errno, fmt::format("pidfd_getfd of rank {}'s buffer (pid {}, fd {})", q, p.pid, r.fd));
    e.offset = 0;
    e.size = r.alloc_bytes;
    e.backend = device_.properties().backend;
    e.device_uuid = device_.properties().uuid;
    auto buffer = device_.Import(e);
    if (!buffer.ok()) return buffer.status().WithContext(fmt::format("mapping rank {}'s buffer", q));
    if (it != imports_.end()) {  // a mapping of another size: replaced
      Retire(std::move(it->second.buffer));
      imports_.erase(it);
    }
    Evict(seq);
    it = imports_.insert_or_assign({q, r.serial}, Import{std::move(*buffer), seq}).first;
    KZ_INFO(kLogColl, "rank {}: mapped rank {}'s allocation {} ({} bytes) for the fused collectives", rank_, q,
            r.serial, r.alloc_bytes);
  }
  it->second.last_used = seq;
  return static_cast<uint8_t*>(it->second.buffer->data()) + r.offset;
}

void SameHostGroup::Retire(std::unique_ptr<device::Buffer> buffer) {
  if (!buffer) return;
  std::lock_guard lock(retired_mu_);
  retired_.push_back(std::move(buffer));
}

size_t SameHostGroup::retired() const {
  std::lock_guard lock(retired_mu_);
  return retired_.size();
}

bool SameHostGroup::ReleaseRetired() {
  {
    std::lock_guard lock(retired_mu_);
    if (retired_.empty()) return true;
  }
  // Announce the free, then look for held streams; BeginHold counts its operation, then looks for
  // frees. With both sequentially consistent, at least one of the two sees the other: either this
  // rank keeps its buffers for later, or the other rank waits for the free before it holds its
  // stream. So a free here never waits for a stream held by an operation of the group, which could
  // need this very thread to go on.
  SameHostPage& me = mine();
  me.freeing.fetch_add(1, std::memory_order_seq_cst);
  int busy = -1;
  for (int q = 0; q < nranks_ && busy < 0; ++q)
    if (peers_[static_cast<size_t>(q)].page->holding.load(std::memory_order_seq_cst) != 0) busy = q;
  std::vector<std::unique_ptr<device::Buffer>> release;
  if (busy < 0) {
    std::lock_guard lock(retired_mu_);
    release.swap(retired_);
  }
  if (!release.empty())
    KZ_TRACE(kLogColl, "rank {}: releasing {} mappings and buffers the fused collectives no longer use", rank_,
             release.size());
  else if (busy >= 0)
    KZ_TRACE(kLogColl, "rank {}: keeping the buffers the fused collectives no longer use: rank {} holds a stream",
             rank_, busy);
  release.clear();  // the frees: each may wait for every stream of the device
  me.freeing.fetch_sub(1, std::memory_order_seq_cst);
  Ring();
  return busy < 0;
}

Status SameHostGroup::BeginHold(uint64_t seq, Deadline deadline, const std::atomic<bool>& abort) {
  mine().holding.fetch_add(1, std::memory_order_seq_cst);
  for (int q = 0; q < nranks_; ++q) {
    const SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
    Status s = Wait(
        q, seq, "finish freeing the memory its fused collectives no longer use",
        [&] { return p.freeing.load(std::memory_order_seq_cst) == 0; }, deadline, abort);
    if (!s.ok()) {
      EndHold();
      return s;
    }
  }
  return Status::Ok();
}

void SameHostGroup::EndHold() { mine().holding.fetch_sub(1, std::memory_order_seq_cst); }

void SameHostGroup::Evict(uint64_t seq) {
  const size_t cap = kMaxImportsPerRank * static_cast<size_t>(nranks_);
  while (imports_.size() >= cap) {
    auto oldest = imports_.end();
    for (auto it = imports_.begin(); it != imports_.end(); ++it)
      if (it->second.last_used < seq && (oldest == imports_.end() || it->second.last_used < oldest->second.last_used))
        oldest = it;
    if (oldest == imports_.end()) return;  // all in use by this operation
    Retire(std::move(oldest->second.buffer));
    imports_.erase(oldest);
  }
}

Status SameHostGroup::Mismatch(int q, uint64_t seq, const CollectiveRequest& request, Protocol protocol,
                           int slot) const {
  const SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
  const SlotHeader& h = p.slots[slot];
  std::string why;
  if (h.seq == seq && static_cast<Protocol>(h.protocol) != protocol &&
      (protocol == Protocol::kStaged || static_cast<Protocol>(h.protocol) == Protocol::kStaged))
    why = fmt::format(" (rank {} passes {}, rank {} {}: pass the same kind of memory on every rank)", Name(rank_),
                      protocol == Protocol::kStaged ? "plain host memory" : "device memory", Name(q),
                      protocol == Protocol::kStaged ? "device memory" : "plain host memory");
  else if (h.seq == seq && h.request.ToString() == request.ToString())
    why = " (run another way: the ranks disagree on the algorithm)";
  return InvalidArgument(fmt::format("collective mismatch between ranks: rank {} is at operation {}: {}; rank {} is at "
                                     "operation {}: {}{}",
                                     Name(rank_), seq, request.ToString(), Name(q), h.seq, h.request.ToString(), why));
}

void SameHostGroup::PublishPlanned(uint64_t seq, uint64_t signature, const CollectiveRequest& request) {
  SameHostPage& me = mine();
  me.planned = SlotHeader{seq, signature, 0, request};
  me.planned_seq.store(seq, std::memory_order_release);
  Ring();
}

Status SameHostGroup::CheckFusedPeers(uint64_t seq, std::string_view call) const {
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    const SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
    if (p.arrived.load(std::memory_order_acquire) < seq) continue;
    for (const SlotHeader& h : p.slots)
      if (h.seq == seq)
        return InvalidArgument(fmt::format(
            "collective mismatch between ranks: rank {} is at {}; rank {} is at operation {}: {} (run another way: "
            "the ranks disagree on the algorithm)",
            Name(rank_), call, Name(q), seq, h.request.ToString()));
  }
  return Status::Ok();
}

Status SameHostGroup::Meet(uint64_t seq, uint64_t signature, const CollectiveRequest& request, Protocol protocol,
                       Deadline deadline, const std::atomic<bool>& abort) {
  SameHostPage& me = mine();
  const int slot = static_cast<int>(ops_++ % 2);
  me.slots[slot] = SlotHeader{seq, signature, static_cast<uint32_t>(protocol), request};
  me.arrived.store(seq, std::memory_order_release);
  Ring();
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    KZ_RETURN_IF_ERROR(WaitFor(q, seq, Phase::kArrive, slot, deadline, abort));
    const SlotHeader& h = peers_[static_cast<size_t>(q)].page->slots[slot];
    if (h.seq != seq || h.signature != signature || h.protocol != static_cast<uint32_t>(protocol))
      return Mismatch(q, seq, request, protocol, slot);
  }
  return Status::Ok();
}

Result<SameHostGroup::Buffers> SameHostGroup::Exchange(uint64_t seq, uint64_t signature,
                                                       const CollectiveRequest& request, const void* input,
                                                       uint64_t input_bytes, const void* output, uint64_t output_bytes,
                                                       Deadline deadline, const std::atomic<bool>& abort) {
  KZ_RETURN_IF_ERROR(PublishRegion(0, input, input_bytes).WithContext("the fused collective's input"));
  KZ_RETURN_IF_ERROR(PublishRegion(1, output, output_bytes).WithContext("the fused collective's output"));
  KZ_RETURN_IF_ERROR(Meet(seq, signature, request, Protocol::kMapped, deadline, abort));
  Buffers b;
  b.inputs.resize(static_cast<size_t>(nranks_));
  b.outputs.resize(static_cast<size_t>(nranks_));
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) {
      b.inputs[static_cast<size_t>(q)] = input;
      b.outputs[static_cast<size_t>(q)] = const_cast<void*>(output);
      continue;
    }
    KZ_ASSIGN_OR_RETURN(uint8_t * in, Resolve(q, 0, seq));
    KZ_ASSIGN_OR_RETURN(uint8_t * out, Resolve(q, 1, seq));
    b.inputs[static_cast<size_t>(q)] = in;
    b.outputs[static_cast<size_t>(q)] = out;
  }
  return b;
}

Status SameHostGroup::Finish(uint64_t seq, Deadline deadline, const std::atomic<bool>& abort) {
  mine().finished.store(seq, std::memory_order_release);
  Ring();
  for (int q = 0; q < nranks_; ++q)
    if (q != rank_) KZ_RETURN_IF_ERROR(WaitFor(q, seq, Phase::kFinish, 0, deadline, abort));
  return Status::Ok();
}

Status SameHostGroup::RunOneShot(uint64_t seq, uint64_t signature, const CollectiveRequest& request, const void* input,
                          void* output, Deadline deadline, const std::atomic<bool>& abort) {
  const uint64_t bytes = request.count * DataTypeSize(request.dtype);
  const bool barrier = request.collective == Collective::kBarrier;
  if ((request.collective != Collective::kAllReduce && !barrier) || bytes > kInlineBytes)
    return Internal(fmt::format("one-shot cannot run {}", request.ToString()));
  // The slot is free: every peer has arrived at this rank's previous operation (this rank waited
  // for that), so each has read the operation before it, the last one to use this slot.
  const int slot = static_cast<int>(ops_ % 2);
  if (bytes <= kLineBytes) {
    // One line: the header (for a mismatch's message), then the data and signature, then seq.
    ++ops_;
    SameHostPage& me = mine();
    me.slots[slot] = SlotHeader{seq, signature, static_cast<uint32_t>(Protocol::kOneShot), request};
    OneLine& line = me.lines[slot];
    if (bytes > 0 && !barrier) std::memcpy(line.data, input, bytes);
    line.signature = signature;
    line.seq.store(seq, std::memory_order_release);
    Ring();
    // Every rank's line, on the stack for the usual group sizes (no allocation on this path).
    const void* few[16];
    std::vector<const void*> many;
    if (nranks_ > 16) many.resize(static_cast<size_t>(nranks_));
    const std::span<const void*> srcs(nranks_ > 16 ? many.data() : few, static_cast<size_t>(nranks_));
    for (int q = 0; q < nranks_; ++q) {
      const OneLine& theirs = peers_[static_cast<size_t>(q)].page->lines[slot];
      // This rank's own data from its input, not from its line: once a spinning peer has read
      // the line, reading it back here misses the cache (about 300 cycles measured on the build
      // machines, the largest single cost of an 8-byte AllReduce after the transfer itself).
      srcs[static_cast<size_t>(q)] = q == rank_ ? input : theirs.data;
      if (q == rank_) continue;
      const SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
      // `arrived` first: a peer that ran this operation another way stored it after its line.
      KZ_RETURN_IF_ERROR(Wait(
          q, seq, "arrive at the fused collective",
          [&] {
            const bool other = p.arrived.load(std::memory_order_acquire) >= seq;
            return theirs.seq.load(std::memory_order_acquire) == seq || other;
          },
          deadline, abort));
      if (theirs.seq.load(std::memory_order_acquire) != seq || theirs.signature != signature)
        return Mismatch(q, seq, request, Protocol::kOneShot, slot);
    }
    if (barrier) return Status::Ok();
    return HostReduce(output, srcs, request.count, request.dtype, request.op);
  }
  if (bytes > 0 && !barrier) std::memcpy(mine().data[slot], input, bytes);
  KZ_RETURN_IF_ERROR(Meet(seq, signature, request, Protocol::kOneShot, deadline, abort));
  if (barrier) return Status::Ok();
  std::vector<const void*> srcs(static_cast<size_t>(nranks_));
  for (int q = 0; q < nranks_; ++q)
    srcs[static_cast<size_t>(q)] = q == rank_ ? input : peers_[static_cast<size_t>(q)].page->data[slot];
  // A peer may move on to its next operation meanwhile; it writes the other slot, and cannot get
  // further before this rank arrives there too.
  return HostReduce(output, srcs, request.count, request.dtype, request.op);
}

Status SameHostGroup::RunShare(uint64_t seq, uint64_t signature, const CollectiveRequest& request, int root,
                               void* data, Deadline deadline, const std::atomic<bool>& abort) {
  const uint64_t bytes = request.count * DataTypeSize(request.dtype);
  if (!one_shot_ || bytes > kInlineBytes || root < 0 || root >= nranks_)
    return Internal(fmt::format("cannot share {} from rank {} through the pages", request.ToString(), root));
  const int slot = static_cast<int>(ops_++ % 2);
  SameHostPage& me = mine();
  me.slots[slot] = SlotHeader{seq, signature, static_cast<uint32_t>(Protocol::kOneShot), request};
  OneLine& line = me.lines[slot];
  auto seen = [&](int q) {
    const SameHostPage& p = *peers_[static_cast<size_t>(q)].page;
    const OneLine& theirs = p.lines[slot];
    // `arrived` too: a peer that ran this operation another way stored it (a mismatch, named below).
    return Wait(
        q, seq,
        q == root ? "share the hierarchical collective's result" : "arrive at the hierarchical collective's end",
        [&] {
          return theirs.seq.load(std::memory_order_acquire) == seq || p.arrived.load(std::memory_order_acquire) >= seq;
        },
        deadline, abort, /*inside=*/q == root);
  };
  auto matches = [&](int q) {
    const OneLine& theirs = peers_[static_cast<size_t>(q)].page->lines[slot];
    return theirs.seq.load(std::memory_order_acquire) == seq && theirs.signature == signature;
  };
  if (rank_ != root) {
    line.signature = signature;
    line.seq.store(seq, std::memory_order_release);  // arrived
    Ring();
    KZ_RETURN_IF_ERROR(seen(root));
    if (!matches(root)) return Mismatch(root, seq, request, Protocol::kOneShot, slot);
    const SameHostPage& p = *peers_[static_cast<size_t>(root)].page;
    if (bytes > 0) std::memcpy(data, bytes <= kLineBytes ? p.lines[slot].data : p.data[slot], bytes);
    return Status::Ok();
  }
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    KZ_RETURN_IF_ERROR(seen(q));
    if (!matches(q)) return Mismatch(q, seq, request, Protocol::kOneShot, slot);
  }
  if (bytes > 0) std::memcpy(bytes <= kLineBytes ? line.data : me.data[slot], data, bytes);
  line.signature = signature;
  line.seq.store(seq, std::memory_order_release);
  Ring();
  return Status::Ok();
}

}  // namespace kizuna::collectives
