#include "fabric/ofi/endpoint.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include <fmt/format.h>

#include "fabric/ofi/transfer.h"
#include "runtime/core/logging.h"
#include "runtime/core/random.h"

namespace kizuna::fabric::ofi {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kHandleMagic = 0x484f'5a4b;   // "KZOH"
constexpr uint32_t kHelloMagic = 0x454f'5a4b;    // "KZOE"
constexpr uint32_t kWelcomeMagic = 0x574f'5a4b;  // "KZOW"
constexpr size_t kMaxAddressBytes = 128;         // in hellos and welcomes
// Control-message slots of a comm's link: receives kept posted, sends in flight at once.
constexpr int kControlRecvSlots = 32;
constexpr int kControlSendSlots = 64;
// Hellos a listener keeps posted.
constexpr int kHelloSlots = 16;

struct WireHandle {
  uint32_t magic;
  uint16_t version;
  uint16_t address_bytes;
  uint32_t provider;
  uint32_t addr_format;
  uint8_t token[kTokenBytes];
  uint64_t process_nonce;
  uint32_t pid;
  uint32_t reserved;
  // followed by the listener's address
};
static_assert(sizeof(WireHandle) == 48);

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t address_bytes;
  uint8_t token[kTokenBytes];
  uint64_t nonce;
  ProcessIdentity process;
  uint8_t address[kMaxAddressBytes];
};
static_assert(sizeof(Hello) <= Link::kSlotBytes);

struct Welcome {
  uint32_t magic;
  uint16_t version;
  uint16_t address_bytes;
  uint64_t nonce;
  ProcessIdentity process;
  uint8_t address[kMaxAddressBytes];
};
static_assert(sizeof(Welcome) <= Link::kSlotBytes);

bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n) {
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

// How an in-process connector finds a listener: by its endpoint address, which the handle
// carries (not by the secret, so that a wrong secret still reaches the listener and is refused
// there, logged, like any stranger's).
uint64_t AddressId(std::string_view address) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : address) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

size_t CqEntries(const OfiDevice& device) {
  return static_cast<size_t>(2 * device.properties().max_requests + kControlRecvSlots + kControlSendSlots + 64);
}

// Sleeps 50 us doubling to 10 ms, never past `limit` (providers without a wait object).
void Backoff(int attempt, Deadline limit) {
  const auto backoff = std::chrono::microseconds(50L << std::min(attempt, 8));
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
      std::min<std::chrono::nanoseconds>(backoff, std::chrono::milliseconds(10)), limit.Remaining()));
}

Deadline BlockLimit(Deadline deadline) {
  return Deadline::At(std::min(deadline.when(), Clock::now() + Connection::kMaxBlock));
}

// ---- The listening side ----

class OfiListenComm final : public ListenComm, private CompletionSink {
 public:
  OfiListenComm(OfiFabric& fabric, int dev, FabricDeviceProperties properties, Handle handle,
                std::unique_ptr<Link> link, const uint8_t* token)
      : ListenComm(std::move(properties), handle), fabric_(fabric), dev_(dev), link_(std::move(link)) {
    std::memcpy(token_, token, kTokenBytes);
  }

 protected:
  Result<std::unique_ptr<RecvComm>> DoAccept() override;
  Status DoWaitAcceptable(Deadline deadline) override;

 private:
  void OnMessage(const Message& message) override;
  void OnOpDone(FiOp&, size_t) override {}
  void OnOpFailed(FiOp&, const Status&, bool) override {}
  void OnImmediate(uint64_t) override {}
  // The RecvComm for a verified hello (its welcome queued, not yet sent).
  Result<std::unique_ptr<OfiRecvComm>> Admit(const Hello& hello);
  std::string Where() const { return fmt::format("ofi {}", properties().name); }

  OfiFabric& fabric_;
  int dev_;
  std::unique_ptr<Link> link_;
  uint8_t token_[kTokenBytes];
  std::deque<Hello> hellos_;  // verified, not yet admitted
  // Admitted, handed out once their welcome has left (the connecting side completes on it, and
  // nobody may progress a comm before Accept returns it).
  std::deque<std::unique_ptr<OfiRecvComm>> admitted_;
  int idle_waits_ = 0;
};

void OfiListenComm::OnMessage(const Message& message) {
  Hello hello{};
  if (message.bytes.size() < offsetof(Hello, address)) {
    KZ_WARN(kLogFabric, "{}: dropped a {}-byte message that is not a hello", Where(), message.bytes.size());
    return;
  }
  std::memcpy(&hello, message.bytes.data(), std::min(message.bytes.size(), sizeof(hello)));
  std::string why;
  if (hello.magic != kHelloMagic) {
    why = "not a kizuna hello";
  } else if (!ConstantTimeEqual(hello.token, token_, kTokenBytes)) {
    why = "authentication failed (wrong secret)";
  } else if (hello.version != kProtocolVersion) {
    why = fmt::format("protocol version {}, this side speaks {}", hello.version, kProtocolVersion);
  } else if (hello.address_bytes == 0 || hello.address_bytes > kMaxAddressBytes ||
             offsetof(Hello, address) + hello.address_bytes > message.bytes.size()) {
    why = fmt::format("malformed hello (address of {} bytes in a {}-byte message)", hello.address_bytes,
                      message.bytes.size());
  } else if (hello.nonce == 0) {
    why = "malformed hello (no connection nonce)";
  }
  if (!why.empty()) {
    KZ_WARN(kLogFabric, "{}: rejected a connection attempt: {}", Where(), why);
    return;
  }
  hellos_.push_back(hello);
}

Result<std::unique_ptr<OfiRecvComm>> OfiListenComm::Admit(const Hello& hello) {
  std::shared_ptr<OfiDevice> device = fabric_.device(dev_);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> endpoint, Endpoint::Open(device, CqEntries(*device)));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Link> link,
                      Link::Create(std::move(endpoint), kControlRecvSlots, kControlSendSlots));
  const std::string peer_address(reinterpret_cast<const char*>(hello.address), hello.address_bytes);
  KZ_ASSIGN_OR_RETURN(fi_addr_t peer, link->endpoint().Insert(peer_address));
  std::shared_ptr<EndpointLife> peer_life;
  if (ProcessIdentity::Self().SameProcessAs(hello.process))
    peer_life = LocalEndpoints::Find(LocalKey{hello.nonce, EndpointRole::kSend});
  link->SetPeer(peer, PeerWatch::For(hello.process, std::move(peer_life)));
  link->endpoint().Publish(LocalKey{hello.nonce, EndpointRole::kRecv});
  const TagLayout& tags = device->tags();
  KZ_RETURN_IF_ERROR(link->PostMessageReceives(tags.Make(TagKind::kControl, hello.nonce, 0), kControlRecvSlots));

  Welcome welcome{};
  welcome.magic = kWelcomeMagic;
  welcome.version = kProtocolVersion;
  welcome.nonce = hello.nonce;
  welcome.process = ProcessIdentity::Self();
  const std::string& mine = link->endpoint().address();
  if (mine.size() > kMaxAddressBytes)
    return NotSupported(fmt::format("{}: endpoint addresses of {} bytes do not fit a welcome", Where(), mine.size()));
  welcome.address_bytes = static_cast<uint16_t>(mine.size());
  std::memcpy(welcome.address, mine.data(), mine.size());
  link->QueueMessage({reinterpret_cast<const uint8_t*>(&welcome), sizeof(welcome)},
                     tags.Make(TagKind::kWelcome, hello.nonce, 0));

  ConnectionParts parts;
  parts.nonce = hello.nonce;
  // The arrow points the way the bytes flow: this is the receiving side.
  parts.label = fmt::format("ofi {} {}<-{}", properties().name, link->endpoint().Describe(mine),
                            link->endpoint().Describe(peer_address));
  parts.properties = properties();
  parts.io_timeout_s = fabric_.io_timeout_s();
  parts.link = std::move(link);
  return std::make_unique<OfiRecvComm>(std::move(parts));
}

Result<std::unique_ptr<RecvComm>> OfiListenComm::DoAccept() {
  KZ_ASSIGN_OR_RETURN(int handled, link_->Poll(*this));
  if (handled > 0) idle_waits_ = 0;
  while (!hellos_.empty()) {
    const Hello hello = hellos_.front();
    hellos_.pop_front();
    auto comm = Admit(hello);
    if (comm.ok()) {
      admitted_.push_back(std::move(comm).value());
      continue;
    }
    // A peer whose address this provider cannot use is that peer's problem; a local failure
    // (no resources for an endpoint) is the caller's.
    if (comm.status().code() != StatusCode::kInvalidArgument) return comm.status().WithContext(Where());
    KZ_WARN(kLogFabric, "{}: rejected a connection attempt: {}", Where(), comm.status().message());
  }
  for (auto it = admitted_.begin(); it != admitted_.end(); ++it) {
    const Status welcomed = (*it)->ProgressWelcome();
    if (welcomed.code() == StatusCode::kUnavailable) continue;  // still leaving
    std::unique_ptr<OfiRecvComm> comm = std::move(*it);
    admitted_.erase(it);
    if (welcomed.ok()) return std::unique_ptr<RecvComm>(std::move(comm));
    KZ_WARN(kLogFabric, "{}: dropped a connection whose peer went away during the handshake: {}", Where(),
            welcomed.message());
    break;  // the iterator is gone; the rest wait for the next call
  }
  return std::unique_ptr<RecvComm>();
}

Status OfiListenComm::DoWaitAcceptable(Deadline deadline) {
  // Welcomes still leaving wait on the new comms' queues, not the listener's: short sleeps.
  if (!admitted_.empty()) {
    Backoff(std::min(idle_waits_++, 4), deadline);
    return Status::Ok();
  }
  KZ_ASSIGN_OR_RETURN(bool blocked, link_->Block(BlockLimit(deadline)));
  if (!blocked) Backoff(idle_waits_++, deadline);
  return Status::Ok();
}

}  // namespace

// ---- Handles ----

size_t MaxHandleAddressBytes() { return kHandleMaxBytes - sizeof(WireHandle); }

Result<HandleInfo> ParseHandle(const Handle& handle) {
  WireHandle h{};
  if (handle.size < sizeof(WireHandle) || handle.size > kHandleMaxBytes)
    return InvalidArgument(fmt::format("ofi: a handle of {} bytes is not an ofi handle", handle.size));
  std::memcpy(&h, handle.data.data(), sizeof(h));
  if (h.magic != kHandleMagic) return InvalidArgument("ofi: the handle is not an ofi handle");
  if (h.version != kProtocolVersion)
    return InvalidArgument(fmt::format("ofi: handle of protocol version {}, this side speaks {}", h.version,
                                       kProtocolVersion));
  if (h.address_bytes == 0 || sizeof(WireHandle) + h.address_bytes != handle.size)
    return InvalidArgument(fmt::format("ofi: the handle's address of {} bytes does not match its size of {} bytes",
                                       h.address_bytes, handle.size));
  HandleInfo info;
  info.version = h.version;
  info.provider_hash = h.provider;
  info.addr_format = h.addr_format;
  std::memcpy(info.token, h.token, kTokenBytes);
  info.process_nonce = h.process_nonce;
  info.pid = h.pid;
  info.address.assign(reinterpret_cast<const char*>(handle.data.data()) + sizeof(WireHandle), h.address_bytes);
  return info;
}

Result<Handle> EncodeHandle(const HandleInfo& info) {
  if (info.address.empty() || info.address.size() > MaxHandleAddressBytes())
    return NotSupported(fmt::format("ofi: an endpoint address of {} bytes does not fit a handle (at most {})",
                                    info.address.size(), MaxHandleAddressBytes()));
  WireHandle h{};
  h.magic = kHandleMagic;
  h.version = info.version;
  h.address_bytes = static_cast<uint16_t>(info.address.size());
  h.provider = info.provider_hash;
  h.addr_format = info.addr_format;
  std::memcpy(h.token, info.token, kTokenBytes);
  h.process_nonce = info.process_nonce;
  h.pid = info.pid;
  Handle handle;
  handle.size = static_cast<uint32_t>(sizeof(h) + info.address.size());
  std::memcpy(handle.data.data(), &h, sizeof(h));
  std::memcpy(handle.data.data() + sizeof(h), info.address.data(), info.address.size());
  return handle;
}

// ---- Listen ----

Result<std::unique_ptr<ListenComm>> ListenOn(OfiFabric& fabric, int dev) {
  std::shared_ptr<OfiDevice> device = fabric.device(dev);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> endpoint, Endpoint::Open(device, 4 * kHelloSlots));
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Link> link, Link::Create(std::move(endpoint), kHelloSlots, 0));
  HandleInfo info;
  info.version = kProtocolVersion;
  info.provider_hash = device->provider_hash();
  info.addr_format = device->info().addr_format;
  KZ_RETURN_IF_ERROR(RandomBytes(info.token, kTokenBytes));
  const ProcessIdentity& self = ProcessIdentity::Self();
  info.process_nonce = self.nonce;
  info.pid = self.pid;
  info.address = link->endpoint().address();
  KZ_ASSIGN_OR_RETURN(Handle handle, EncodeHandle(info));
  link->endpoint().Publish(LocalKey{AddressId(info.address), EndpointRole::kListener});
  KZ_RETURN_IF_ERROR(link->PostMessageReceives(device->tags().Make(TagKind::kHello, 0, 0), kHelloSlots));
  return std::unique_ptr<ListenComm>(std::make_unique<OfiListenComm>(fabric, dev, device->properties(), handle,
                                                                     std::move(link), info.token));
}

// ---- Connect ----

Result<std::shared_ptr<PendingConnect>> PendingConnect::Start(OfiFabric& fabric, int dev, const Handle& handle) {
  KZ_ASSIGN_OR_RETURN(HandleInfo h, ParseHandle(handle));
  std::shared_ptr<OfiDevice> device = fabric.device(dev);
  if (h.provider_hash != device->provider_hash() || h.addr_format != device->info().addr_format)
    return InvalidArgument(fmt::format("ofi: the handle comes from a listener on another provider or address family "
                                       "than device {} ({}): connect on a device of the same provider",
                                       dev, device->properties().name));
  PeerWatch listener_watch;
  const ProcessIdentity& self = ProcessIdentity::Self();
  if (h.process_nonce == self.nonce && h.pid == self.pid) {
    std::shared_ptr<EndpointLife> life = LocalEndpoints::Find(LocalKey{AddressId(h.address), EndpointRole::kListener});
    if (life == nullptr)
      return RemoteError("ofi: nobody listens behind the handle any more (its ListenComm was closed)");
    listener_watch = PeerWatch::InProcess(std::move(life));
  }

  std::shared_ptr<PendingConnect> p(new PendingConnect());
  p->fabric_ = &fabric;
  p->dev_ = dev;
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> endpoint, Endpoint::Open(device, CqEntries(*device)));
  KZ_ASSIGN_OR_RETURN(p->link_, Link::Create(std::move(endpoint), kControlRecvSlots, kControlSendSlots));
  KZ_ASSIGN_OR_RETURN(fi_addr_t listener, p->link_->endpoint().Insert(h.address));
  p->listener_address_ = h.address;
  p->link_->SetPeer(listener, std::move(listener_watch));
  do {
    KZ_RETURN_IF_ERROR(RandomBytes(&p->nonce_, sizeof(p->nonce_)));
  } while (p->nonce_ == 0);
  p->link_->endpoint().Publish(LocalKey{p->nonce_, EndpointRole::kSend});
  const TagLayout& tags = device->tags();
  KZ_RETURN_IF_ERROR(p->link_->PostMessageReceives(tags.Make(TagKind::kWelcome, p->nonce_, 0), 1));

  Hello hello{};
  hello.magic = kHelloMagic;
  hello.version = kProtocolVersion;
  std::memcpy(hello.token, h.token, kTokenBytes);
  hello.nonce = p->nonce_;
  hello.process = self;
  const std::string& mine = p->link_->endpoint().address();
  if (mine.size() > kMaxAddressBytes)
    return NotSupported(fmt::format("ofi {}: endpoint addresses of {} bytes do not fit a hello",
                                    device->properties().name, mine.size()));
  hello.address_bytes = static_cast<uint16_t>(mine.size());
  std::memcpy(hello.address, mine.data(), mine.size());
  p->link_->QueueMessage({reinterpret_cast<const uint8_t*>(&hello), sizeof(hello)}, tags.Make(TagKind::kHello, 0, 0));
  if (Status s = p->link_->FlushMessages(); !s.ok())
    return RemoteError(fmt::format("ofi: cannot reach the listener at {}: {}",
                                   p->link_->endpoint().Describe(h.address), s.message()));
  return p;
}

PendingConnect::~PendingConnect() { Link::Retire(std::move(link_)); }

void PendingConnect::OnMessage(const Message& message) {
  const TagLayout& tags = link_->device().tags();
  if (welcomed_) {
    // Control messages the RecvComm sent right after its welcome, read in the same batch.
    if (message.tag == tags.Make(TagKind::kControl, nonce_, 0))
      early_.emplace_back(message.bytes.begin(), message.bytes.end());
    return;
  }
  Welcome w{};
  std::memcpy(&w, message.bytes.data(), std::min(message.bytes.size(), sizeof(w)));
  if (message.bytes.size() < offsetof(Welcome, address) || w.magic != kWelcomeMagic || w.version != kProtocolVersion ||
      w.nonce != nonce_ || w.address_bytes == 0 || w.address_bytes > kMaxAddressBytes ||
      offsetof(Welcome, address) + w.address_bytes > message.bytes.size()) {
    KZ_WARN(kLogFabric, "ofi {}: dropped a malformed welcome", link_->device().properties().name);
    return;
  }
  peer_address_.assign(reinterpret_cast<const char*>(w.address), w.address_bytes);
  auto peer = link_->endpoint().Insert(peer_address_);
  if (!peer.ok()) {
    failure_ = peer.status();
    return;
  }
  std::shared_ptr<EndpointLife> life;
  if (ProcessIdentity::Self().SameProcessAs(w.process)) {
    life = LocalEndpoints::Find(LocalKey{nonce_, EndpointRole::kRecv});
  }
  link_->SetPeer(*peer, PeerWatch::For(w.process, std::move(life)));
  if (Status s = link_->PostMessageReceives(tags.Make(TagKind::kControl, nonce_, 0), kControlRecvSlots); !s.ok()) {
    failure_ = s;
    return;
  }
  welcomed_ = true;
}

void PendingConnect::OnOpDone(FiOp&, size_t) {}

void PendingConnect::OnOpFailed(FiOp& op, const Status& status, bool connection) {
  if (op.kind != OpKind::kMessageSend || welcomed_ || !failure_.ok()) return;
  failure_ = connection ? RemoteError(fmt::format("ofi: nobody listens behind the handle at {} any more: {}",
                                                  link_->endpoint().Describe(listener_address_), status.message()))
                        : status;
}

Result<std::unique_ptr<SendComm>> PendingConnect::Poll() {
  if (!failure_.ok()) return failure_;
  if (link_ == nullptr) return Internal("ofi: this connection attempt already produced its comm");
  KZ_RETURN_IF_ERROR(link_->Poll(*this).status());
  if (!failure_.ok()) return failure_;
  if (!welcomed_) {
    if (Status s = link_->FlushMessages(); !s.ok())
      return RemoteError(fmt::format("ofi: cannot reach the listener at {}: {}",
                                     link_->endpoint().Describe(listener_address_), s.message()));
    // A listener in this process that closed before answering will never answer.
    if (link_->watch().in_process()) KZ_RETURN_IF_ERROR(link_->watch().Check().WithContext("ofi: the listener"));
    return std::unique_ptr<SendComm>();
  }
  std::shared_ptr<OfiDevice> device = fabric_->device(dev_);
  ConnectionParts parts;
  parts.nonce = nonce_;
  parts.label = fmt::format("ofi {} {}", device->properties().name, link_->DescribeAddresses(peer_address_));
  parts.properties = device->properties();
  parts.io_timeout_s = fabric_->io_timeout_s();
  parts.early_messages = std::move(early_);
  parts.link = std::move(link_);
  return std::unique_ptr<SendComm>(std::make_unique<OfiSendComm>(std::move(parts)));
}

Status PendingConnect::Wait(Deadline deadline, int attempt) {
  if (link_ == nullptr) return Status::Ok();
  KZ_ASSIGN_OR_RETURN(bool blocked, link_->Block(BlockLimit(deadline)));
  if (!blocked) Backoff(attempt, deadline);
  return Status::Ok();
}

}  // namespace kizuna::fabric::ofi
