#include "fabric/ofi/link.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::ofi {
namespace {

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot; 0 when unreadable.
uint64_t StartTime(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  // The command name (field 2) may contain spaces and parentheses: fields resume after the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return 0;
  return std::strtoull(field.c_str(), nullptr, 10);
}

ProcessIdentity ComputeSelf() {
  ProcessIdentity id;
  // Without the kernel's randomness the nonce still differs between processes (pid and time):
  // it tells processes apart, it is not a secret.
  if (Result<uint64_t> nonce = RandomValue<uint64_t>(); nonce.ok())
    id.nonce = *nonce;
  else
    id.nonce = static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot >> boot_id) id.host = Fnv1a(boot_id);
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) id.pid_ns = st.st_ino;
  id.pid = static_cast<uint32_t>(::getpid());
  id.start_time = StartTime(std::to_string(id.pid));
  return id;
}

// Links retired while their in-process peer was open (Link::Retire). Never destroyed: what is
// still buried at exit is left to the process's end, like libfabric itself.
struct Graveyard {
  std::mutex mu;
  std::vector<std::unique_ptr<Link>> buried;  // guarded by mu
};
Graveyard& TheGraveyard() {
  static auto* g = new Graveyard();
  return *g;
}

// Closes the buried links whose peer endpoint has been closed.
void Reap() {
  std::vector<std::unique_ptr<Link>> ready;
  {
    std::lock_guard<std::mutex> lock(TheGraveyard().mu);
    auto& buried = TheGraveyard().buried;
    for (auto it = buried.begin(); it != buried.end();) {
      const auto& life = (*it)->watch().life();
      if (life == nullptr || life->released.load()) {
        ready.push_back(std::move(*it));
        it = buried.erase(it);
      } else {
        ++it;
      }
    }
  }
  ready.clear();  // outside the lock: closing reaps again
}

std::mutex& LocalMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::pair<uint64_t, uint8_t>, std::shared_ptr<EndpointLife>>& LocalMap() {
  static std::map<std::pair<uint64_t, uint8_t>, std::shared_ptr<EndpointLife>> map;
  return map;
}

// Every link not yet closed nor retired, for Link::ProgressOthers.
std::mutex& OpenLinksMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::set<const Link*>& OpenLinks() {
  static auto* links = new std::set<const Link*>();
  return *links;
}
void ForgetLink(const Link* link) {
  std::lock_guard<std::mutex> lock(OpenLinksMutex());
  OpenLinks().erase(link);
}

}  // namespace

// ---- ProcessIdentity ----

const ProcessIdentity& ProcessIdentity::Self() {
  static std::mutex mu;
  static ProcessIdentity self;
  std::lock_guard<std::mutex> lock(mu);
  // Recomputed in a forked child: the pid, start time and nonce are its own.
  if (self.pid != static_cast<uint32_t>(::getpid())) self = ComputeSelf();
  return self;
}

// ---- LocalEndpoints ----

void LocalEndpoints::Publish(LocalKey key, std::shared_ptr<EndpointLife> life) {
  std::lock_guard<std::mutex> lock(LocalMutex());
  LocalMap()[{key.id, static_cast<uint8_t>(key.role)}] = std::move(life);
}

void LocalEndpoints::Withdraw(LocalKey key, const EndpointLife* life) {
  std::lock_guard<std::mutex> lock(LocalMutex());
  auto it = LocalMap().find({key.id, static_cast<uint8_t>(key.role)});
  if (it != LocalMap().end() && it->second.get() == life) LocalMap().erase(it);
}

std::shared_ptr<EndpointLife> LocalEndpoints::Find(LocalKey key) {
  std::lock_guard<std::mutex> lock(LocalMutex());
  auto it = LocalMap().find({key.id, static_cast<uint8_t>(key.role)});
  return it == LocalMap().end() ? nullptr : it->second;
}

// ---- PeerWatch ----

PeerWatch PeerWatch::For(const ProcessIdentity& peer, std::shared_ptr<EndpointLife> life) {
  const ProcessIdentity& self = ProcessIdentity::Self();
  if (self.SameProcessAs(peer)) return InProcess(std::move(life));
  PeerWatch w;
  if (!self.SameHostAs(peer) || peer.pid == 0) return w;  // another host: blind, probes will tell
  w.pid_ = peer.pid;
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(peer.pid), 0));
  if (fd < 0) {
    // ESRCH: the peer has already exited. Anything else (an old kernel): no pidfd; probe instead.
    w.gone_ = errno == ESRCH;
    return w;
  }
  w.pidfd_.Reset(fd);
  // The pid may have been reused between the peer's handshake and now: then the pidfd refers to
  // another process, and the peer is gone.
  if (peer.start_time != 0 && StartTime(std::to_string(peer.pid)) != peer.start_time) {
    w.pidfd_.Reset();
    w.gone_ = true;
  }
  return w;
}

PeerWatch PeerWatch::InProcess(std::shared_ptr<EndpointLife> life) {
  PeerWatch w;
  w.in_process_ = true;
  w.life_ = std::move(life);
  return w;
}

Status PeerWatch::Check() const {
  if (in_process_) {
    if (life_ == nullptr) return RemoteError("the peer endpoint (in this process) was closed");
    std::shared_lock<std::shared_mutex> lock(life_->mu);
    if (life_->closed) return RemoteError("the peer endpoint (in this process) was closed");
    return Status::Ok();
  }
  if (gone_) return RemoteError(fmt::format("the peer process {} has exited", pid_));
  if (pidfd_.valid()) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) return RemoteError(fmt::format("the peer process {} has exited", pid_));
  }
  return Status::Ok();
}

std::shared_lock<std::shared_mutex> PeerWatch::Guard() const {
  if (in_process_ && life_ != nullptr) return std::shared_lock<std::shared_mutex>(life_->mu);
  return std::shared_lock<std::shared_mutex>();
}

// ---- Endpoint ----

Result<std::unique_ptr<Endpoint>> Endpoint::Open(std::shared_ptr<OfiDevice> device, size_t cq_entries) {
  std::unique_ptr<Endpoint> e(new Endpoint());
  e->device_ = std::move(device);
  const LibFabric& lib = e->lib();
  OfiDevice& dev = *e->device_;

  fi_cq_attr cq_attr{};
  cq_attr.size = cq_entries;
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_FD;
  int rc = fi_cq_open(dev.domain(), &cq_attr, &e->cq_, nullptr);
  if (rc != 0) {
    // Providers without a pollable wait object (shm): the comm sleeps between polls instead.
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(dev.domain(), &cq_attr, &e->cq_, nullptr);
    if (rc != 0) return lib.Error(rc, "fi_cq_open");
  } else if (fi_control(&e->cq_->fid, FI_GETWAIT, &e->wait_fd_) != 0) {
    e->wait_fd_ = -1;
  }

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = 4;
  if ((rc = fi_av_open(dev.domain(), &av_attr, &e->av_, nullptr)) != 0) return lib.Error(rc, "fi_av_open");
  if ((rc = fi_endpoint(dev.domain(), const_cast<fi_info*>(&dev.info()), &e->ep_, nullptr)) != 0)
    return lib.Error(rc, "fi_endpoint");
  if ((rc = fi_ep_bind(e->ep_, &e->cq_->fid, FI_TRANSMIT | FI_RECV)) != 0) return lib.Error(rc, "fi_ep_bind(cq)");
  if ((rc = fi_ep_bind(e->ep_, &e->av_->fid, 0)) != 0) return lib.Error(rc, "fi_ep_bind(av)");
  if ((rc = fi_enable(e->ep_)) != 0) return lib.Error(rc, "fi_enable");

  char name[256];
  size_t len = sizeof(name);
  if ((rc = fi_getname(&e->ep_->fid, name, &len)) != 0) return lib.Error(rc, "fi_getname");
  e->address_.assign(name, len);
  return e;
}

Endpoint::~Endpoint() {
  if (ep_ != nullptr) {
    std::unique_lock<std::shared_mutex> lock(life_->mu);
    life_->closed = true;
    if (const int rc = fi_close(&ep_->fid); rc != 0)
      KZ_WARN(kLogFabric, "ofi: closing an endpoint failed: {}", lib().Error(rc, "fi_close(ep)").ToString());
    life_->released = true;
  }
  if (av_ != nullptr) {
    if (const int rc = fi_close(&av_->fid); rc != 0)
      KZ_WARN(kLogFabric, "ofi: closing an address vector failed: {}", lib().Error(rc, "fi_close(av)").ToString());
  }
  if (cq_ != nullptr) {
    if (const int rc = fi_close(&cq_->fid); rc != 0)
      KZ_WARN(kLogFabric, "ofi: closing a completion queue failed: {}", lib().Error(rc, "fi_close(cq)").ToString());
  }
  for (const LocalKey& key : published_) LocalEndpoints::Withdraw(key, life_.get());
  if (ep_ != nullptr) Reap();  // ends kept for this one may go now
}

std::string Endpoint::Describe(std::string_view address) const {
  char buf[256];
  size_t len = sizeof(buf);
  const char* s = fi_av_straddr(av_, address.data(), buf, &len);
  return s != nullptr ? std::string(s) : fmt::format("({}-byte address)", address.size());
}

Result<fi_addr_t> Endpoint::Insert(std::string_view address) {
  fi_addr_t out = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_, address.data(), 1, &out, 0, nullptr);
  if (n != 1 || out == FI_ADDR_NOTAVAIL)
    return InvalidArgument(fmt::format("ofi {}: the peer's address {} is not valid for this provider{}",
                                       device_->provider(), Describe(address),
                                       n < 0 ? fmt::format(" ({})", lib().strerror(-n)) : std::string()));
  return out;
}

void Endpoint::Publish(LocalKey key) {
  LocalEndpoints::Publish(key, life_);
  published_.push_back(key);
}

// ---- Link ----

Result<std::unique_ptr<Link>> Link::Create(std::unique_ptr<Endpoint> endpoint, int recv_slots, int send_slots) {
  std::unique_ptr<Link> l(new Link());
  l->endpoint_ = std::move(endpoint);
  l->recv_slots_ = recv_slots;
  l->send_slots_ = send_slots;
  const int total = recv_slots + send_slots;
  l->arena_.assign(static_cast<size_t>(std::max(total, 1)) * kSlotBytes, 0);
  if ((l->device().mr_mode() & FI_MR_LOCAL) != 0) {
    KZ_ASSIGN_OR_RETURN(l->arena_mr_, MemoryRegion::Register(l->device(), l->endpoint_->ep(), l->arena_.data(),
                                                             l->arena_.size(), FI_SEND | FI_RECV));
  }
  l->recv_posted_.assign(static_cast<size_t>(recv_slots), false);
  for (int s = total - 1; s >= recv_slots; --s) l->free_send_slots_.push_back(s);
  {
    std::lock_guard<std::mutex> lock(OpenLinksMutex());
    OpenLinks().insert(l.get());
  }
  return l;
}

void Link::Retire(std::unique_ptr<Link> link) {
  if (link == nullptr) return;
  ForgetLink(link.get());  // a kept link is progressed by nobody, as before it was retired
  {
    // One decision at a time, so that of two ends retiring together exactly one is kept.
    std::lock_guard<std::mutex> lock(TheGraveyard().mu);
    const std::shared_ptr<EndpointLife>& peer = link->watch_.life();
    bool peer_open = false;
    if (link->watch_.in_process() && peer != nullptr) {
      std::shared_lock<std::shared_mutex> peer_lock(peer->mu);
      peer_open = !peer->closed;
    }
    if (peer_open) {
      std::unique_lock<std::shared_mutex> own(link->endpoint_->life()->mu);
      link->endpoint_->life()->closed = true;
      TheGraveyard().buried.push_back(std::move(link));
      return;
    }
  }
  link.reset();
}

Link::~Link() {
  ForgetLink(this);
  // The endpoint first: once it is closed libfabric references no operation context, no arena
  // slot and no registration any more.
  endpoint_.reset();
  ops_.clear();
  arena_mr_.reset();
}

FiOp* Link::NewOp(OpKind kind, void* owner) {
  FiOp* op;
  if (!free_ops_.empty()) {
    op = free_ops_.back();
    free_ops_.pop_back();
  } else {
    ops_.push_back(std::make_unique<FiOp>());
    op = ops_.back().get();
  }
  std::memset(&op->context, 0, sizeof(op->context));
  op->kind = kind;
  op->owner = owner;
  op->slot = -1;
  op->live = true;
  return op;
}

void Link::FreeOp(FiOp* op) {
  op->live = false;
  op->owner = nullptr;
  op->hold.reset();
  free_ops_.push_back(op);
}

void Link::Cancel(FiOp* op) {
  // Cancelling acts on this end only (a posted receive): no peer guard needed.
  const ssize_t rc = fi_cancel(&endpoint_->ep()->fid, &op->context);
  if (rc != 0) KZ_TRACE(kLogFabric, "ofi: fi_cancel: {}", lib().strerror(static_cast<int>(-rc)));
}

Status Link::PostSlotReceive(int slot) {
  FiOp* op = NewOp(OpKind::kMessageRecv, nullptr);
  op->slot = slot;
  void* desc = arena_mr_ != nullptr ? arena_mr_->desc() : nullptr;
  const ssize_t rc = fi_trecv(endpoint_->ep(), arena_.data() + static_cast<size_t>(slot) * kSlotBytes, kSlotBytes,
                              desc, FI_ADDR_UNSPEC, recv_tag_, 0, &op->context);
  if (rc != 0) {
    FreeOp(op);
    if (rc == -FI_EAGAIN) return Status::Ok();  // posted on a later poll
    return lib().Error(static_cast<int>(rc), "fi_trecv of a control buffer");
  }
  recv_posted_[static_cast<size_t>(slot)] = true;
  return Status::Ok();
}

Status Link::PostMessageReceives(uint64_t tag, int count) {
  recv_tag_ = tag;
  recv_active_ = std::min(count, recv_slots_);
  for (int s = 0; s < recv_active_; ++s)
    if (!recv_posted_[static_cast<size_t>(s)]) KZ_RETURN_IF_ERROR(PostSlotReceive(s));
  return Status::Ok();
}

void Link::QueueMessage(std::span<const uint8_t> bytes, uint64_t tag) {
  Outgoing out;
  out.size = std::min(bytes.size(), kSlotBytes);
  std::memcpy(out.bytes.data(), bytes.data(), out.size);
  out.tag = tag;
  outbox_.push_back(out);
}

Status Link::FlushMessages() {
  void* desc = arena_mr_ != nullptr ? arena_mr_->desc() : nullptr;
  while (!outbox_.empty() && !free_send_slots_.empty()) {
    const Outgoing& out = outbox_.front();
    const int slot = free_send_slots_.back();
    uint8_t* buf = arena_.data() + static_cast<size_t>(slot) * kSlotBytes;
    std::memcpy(buf, out.bytes.data(), out.size);
    FiOp* op = NewOp(OpKind::kMessageSend, nullptr);
    op->slot = slot;
    const ssize_t rc =
        PostToPeer([&] { return fi_tsend(endpoint_->ep(), buf, out.size, desc, peer_, out.tag, &op->context); });
    if (rc != 0) {
      FreeOp(op);
      if (rc == -FI_EAGAIN) return Status::Ok();  // the provider's queue is full: later
      return lib().Error(static_cast<int>(rc), "fi_tsend of a control message");
    }
    free_send_slots_.pop_back();
    outbox_.pop_front();
  }
  return Status::Ok();
}

Result<int> Link::Poll(CompletionSink& sink) {
  int handled = 0;
  constexpr int kBatch = 16;
  // Bounded, so that a peer streaming completions cannot hold the caller here forever.
  for (int round = 0; round < 64; ++round) {
    fi_cq_tagged_entry entries[kBatch];
    ssize_t n;
    {
      auto guard = watch_.Guard();
      n = fi_cq_read(endpoint_->cq(), entries, kBatch);
    }
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      if (!OnFailedCompletion(sink)) break;
      ++handled;
      continue;
    }
    if (n < 0) return lib().Error(static_cast<int>(n), "fi_cq_read");
    for (ssize_t i = 0; i < n; ++i) {
      ++handled;
      OnCompletion(entries[i], sink);
    }
    if (n < kBatch) break;
  }
  // Receive slots a full provider queue refused earlier.
  for (int s = 0; s < recv_active_; ++s)
    if (!recv_posted_[static_cast<size_t>(s)]) PostSlotReceive(s).IgnoreError();
  return handled;
}

bool Link::OnFailedCompletion(CompletionSink& sink) {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(endpoint_->cq(), &err, 0) != 1) return false;
  auto* op = static_cast<FiOp*>(err.op_context);
  if (op == nullptr) {
    KZ_TRACE(kLogFabric, "ofi: completion error without a context: {}", CqError(*endpoint_, err, "").ToString());
    return true;
  }
  const Status status = CqError(*endpoint_, err, "a transfer");
  // This end cancels only data receives, and detaches them (owner null) first: any other
  // operation cancelled means the provider tore the connection down (ofi_rxm reports
  // ECANCELED with the cause in prov_errno).
  const bool cancelled_here = op->kind == OpKind::kDataRecv && op->owner == nullptr;
  const bool connection = IsConnectionError(err.err) || (err.err == FI_ECANCELED && !cancelled_here);
  switch (op->kind) {
    case OpKind::kMessageRecv: {
      const int slot = op->slot;
      recv_posted_[static_cast<size_t>(slot)] = false;
      FreeOp(op);
      if (err.err == FI_ECANCELED) break;
      // A message too long for a slot can only come from a stranger or a broken peer.
      KZ_WARN(kLogFabric, "ofi {}: dropped an incoming control message: {}", device().provider(), status.ToString());
      if (slot < recv_active_) PostSlotReceive(slot).IgnoreError();
      break;
    }
    case OpKind::kMessageSend:
      free_send_slots_.push_back(op->slot);
      sink.OnOpFailed(*op, status, connection);
      FreeOp(op);
      break;
    default:
      sink.OnOpFailed(*op, status, connection);
      FreeOp(op);
      break;
  }
  return true;
}

void Link::OnCompletion(const fi_cq_tagged_entry& e, CompletionSink& sink) {
  if (e.op_context == nullptr) {
    if ((e.flags & FI_REMOTE_CQ_DATA) != 0) sink.OnImmediate(e.data);
    return;
  }
  auto* op = static_cast<FiOp*>(e.op_context);
  switch (op->kind) {
    case OpKind::kMessageRecv: {
      const int slot = op->slot;
      recv_posted_[static_cast<size_t>(slot)] = false;
      FreeOp(op);
      const size_t len = std::min(e.len, kSlotBytes);
      sink.OnMessage(Message{{arena_.data() + static_cast<size_t>(slot) * kSlotBytes, len}, e.tag});
      if (slot < recv_active_ && !recv_posted_[static_cast<size_t>(slot)]) PostSlotReceive(slot).IgnoreError();
      break;
    }
    case OpKind::kMessageSend:
      free_send_slots_.push_back(op->slot);
      FreeOp(op);
      break;
    default:
      sink.OnOpDone(*op, e.len);
      FreeOp(op);
      break;
  }
}

Result<bool> Link::Block(Deadline limit, bool watch_peer) {
  if (endpoint_->wait_fd() < 0) return false;
  fid* f = &endpoint_->cq()->fid;
  const int rc = fi_trywait(device().fabric(), &f, 1);
  if (rc == -FI_EAGAIN) return true;  // completions to read: no blocking
  if (rc != 0) return lib().Error(rc, "fi_trywait");
  pollfd fds[2] = {{endpoint_->wait_fd(), POLLIN, 0}, {watch_.fd(), POLLIN, 0}};
  const auto ns = limit.Remaining().count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  const nfds_t n = watch_peer && watch_.fd() >= 0 ? 2 : 1;
  if (::ppoll(fds, n, &ts, nullptr) < 0 && errno != EINTR) return FromErrno(errno, "ppoll");
  return true;
}

void Link::ProgressOthers() const {
  std::lock_guard<std::mutex> lock(OpenLinksMutex());
  for (const Link* other : OpenLinks()) {
    if (other == this) continue;
    // Under the peer's guard, as every call that may move data towards it (shm, see the top).
    auto guard = other->watch_.Guard();
    if (other->watch_.closed()) continue;
    // A read of zero entries runs the provider's progress and takes no completion.
    fi_cq_tagged_entry unused;
    (void)fi_cq_read(other->endpoint_->cq(), &unused, 0);
  }
}

std::string Link::DescribeAddresses(std::string_view peer_address) const {
  return fmt::format("{}->{}", endpoint_->Describe(endpoint_->address()), endpoint_->Describe(peer_address));
}

Status CqError(const Endpoint& endpoint, const fi_cq_err_entry& err, std::string_view what) {
  char buf[256] = {};
  const char* provider_text = fi_cq_strerror(endpoint.cq(), err.prov_errno, err.err_data, buf, sizeof(buf));
  const std::string text =
      fmt::format("{}; {}: {}", endpoint.lib().strerror(err.err), endpoint.device().provider(),
                  provider_text != nullptr && provider_text[0] != '\0' ? provider_text : "no details");
  return FromForeign(ErrorCode(err.err), "libfabric", what.empty() ? "a libfabric operation" : what, -err.err, text);
}

}  // namespace kizuna::fabric::ofi
