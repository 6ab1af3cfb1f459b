#include "fabric/fabric.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "runtime/core/logging.h"

namespace kizuna::fabric {
namespace {

constexpr std::string_view kHexDigits = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string DescribeMemory(const MemoryDescriptor& m) {
  std::string out = fmt::format("{} memory {} (+{} bytes)", m.type == MemoryType::kHost ? "host" : "device",
                                m.data, m.size);
  if (m.fd >= 0) out += fmt::format(" fd {} offset {}", m.fd, m.fd_offset);
  return out;
}

}  // namespace

// ---- OpaqueBlob ----

template <size_t kMaxBytes, typename Tag>
Result<OpaqueBlob<kMaxBytes, Tag>> OpaqueBlob<kMaxBytes, Tag>::FromBytes(std::span<const uint8_t> bytes) {
  if (bytes.size() > kMax)
    return InvalidArgument(fmt::format("opaque blob of {} bytes exceeds the limit of {}", bytes.size(), kMax));
  OpaqueBlob out;
  out.size = static_cast<uint32_t>(bytes.size());
  std::copy(bytes.begin(), bytes.end(), out.data.begin());
  return out;
}

template <size_t kMaxBytes, typename Tag>
std::string OpaqueBlob<kMaxBytes, Tag>::ToHex() const {
  std::string out;
  out.reserve(size * 2);
  for (uint32_t i = 0; i < size; ++i) {
    out += kHexDigits[data[i] >> 4];
    out += kHexDigits[data[i] & 15];
  }
  return out;
}

template <size_t kMaxBytes, typename Tag>
Result<OpaqueBlob<kMaxBytes, Tag>> OpaqueBlob<kMaxBytes, Tag>::FromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return InvalidArgument(fmt::format("hex blob has an odd length ({})", hex.size()));
  if (hex.size() / 2 > kMax)
    return InvalidArgument(fmt::format("hex blob of {} bytes exceeds the limit of {}", hex.size() / 2, kMax));
  OpaqueBlob out;
  out.size = static_cast<uint32_t>(hex.size() / 2);
  for (size_t i = 0; i < out.size; ++i) {
    const int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return InvalidArgument(
          fmt::format("hex blob has a non-hex character at position {}", hi < 0 ? 2 * i : 2 * i + 1));
    out.data[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return out;
}

template struct OpaqueBlob<kHandleMaxBytes, HandleTag>;
template struct OpaqueBlob<kRemoteKeyMaxBytes, RemoteKeyTag>;

std::string_view RequestKindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kSend: return "send";
    case RequestKind::kRecv: return "receive";
    case RequestKind::kWrite: return "write";
  }
  return "invalid";
}

// ---- Registration ----

bool Registration::Contains(const void* p, size_t bytes) const {
  const auto start = reinterpret_cast<uintptr_t>(memory_.data);
  const auto x = reinterpret_cast<uintptr_t>(p);
  return x >= start && x - start <= memory_.size && bytes <= memory_.size - (x - start);
}

// ---- Comm ----

Comm::Comm(std::string label, FabricDeviceProperties properties)
    : label_(std::move(label)), properties_(std::move(properties)) {}

// Requests and registrations are destroyed here, after the backend's destructor has torn the
// connection down, in that order (a request points at its registration).
Comm::~Comm() {
  requests_.clear();
  registrations_.clear();
}

Result<Registration*> Comm::Register(const MemoryDescriptor& memory) {
  if (memory.size == 0) return InvalidArgument(fmt::format("{}: registration of 0 bytes (post 0-byte messages "
                                                           "with a null registration)", label_));
  if (memory.data == nullptr) return InvalidArgument(fmt::format("{}: registration of a null pointer", label_));
  if (reinterpret_cast<uintptr_t>(memory.data) > UINTPTR_MAX - memory.size)
    return InvalidArgument(fmt::format("{}: registered range {} + {} wraps around", label_, memory.data, memory.size));
  const uint32_t support = properties_.ptr_support;
  if (memory.fd >= 0) {
    if ((support & kPtrFd) == 0)
      return NotSupported(fmt::format("{}: {} cannot register memory by fd + offset", label_, properties_.name));
  } else if (memory.type == MemoryType::kHost) {
    if ((support & kPtrHost) == 0)
      return NotSupported(fmt::format("{}: {} cannot register host memory", label_, properties_.name));
  } else if ((support & kPtrDevice) == 0) {
    return NotSupported(fmt::format("{}: {} cannot register device memory by pointer{}", label_, properties_.name,
                                    (support & kPtrFd) != 0 ? " (register it by fd: export it from the device)" : ""));
  }
  if (memory.type == MemoryType::kHost && !memory.host_accessible)
    return InvalidArgument(fmt::format("{}: host memory marked as not host accessible", label_));
  auto r = DoRegister(memory);
  if (!r.ok()) {
    KZ_INFO(kLogFabric, "{}: registration of {} failed: {}", label_, DescribeMemory(memory), r.status().ToString());
    return r.status().WithContext(label_);
  }
  Registration* reg = r->get();
  registrations_.emplace(reg, std::move(r).value());
  KZ_TRACE(kLogFabric, "{}: registered {} as {}", label_, DescribeMemory(memory), static_cast<void*>(reg));
  return reg;
}

Status Comm::Deregister(Registration* registration) {
  auto it = registrations_.find(registration);
  if (it == registrations_.end())
    return InvalidArgument(fmt::format("{}: {} is not a live registration of this comm", label_,
                                       static_cast<void*>(registration)));
  if (registration->in_flight_ > 0)
    return InvalidArgument(fmt::format("{}: registration {} is in use by {} request(s) in flight", label_,
                                       static_cast<void*>(registration), registration->in_flight_));
  Status s = DoDeregister(*registration);
  registrations_.erase(it);
  KZ_TRACE(kLogFabric, "{}: deregistered {}", label_, static_cast<void*>(registration));
  return s.WithContext(label_);
}

Result<Completion> Comm::Test(Request* request) {
  auto it = requests_.find(request);
  if (it == requests_.end())
    return InvalidArgument(fmt::format("{}: {} is not a live request of this comm (already reported done?)", label_,
                                       static_cast<void*>(request)));
  Result<Completion> r = DoTest(*request);
  if (r.ok() && !r->done) return r;
  if (request->registration_ != nullptr) --request->registration_->in_flight_;
  if (r.ok()) {
    KZ_TRACE(kLogFabric, "{}: {} tag {} done, {} bytes", label_, RequestKindName(request->kind()), request->tag(),
             r->size);
  } else {
    KZ_INFO(kLogFabric, "{}: {} tag {} failed: {}", label_, RequestKindName(request->kind()), request->tag(),
            r.status().ToString());
  }
  Requests::node_type node = requests_.extract(it);
  node.mapped().reset();  // the request goes; its node stays for the next one
  if (spare_nodes_.size() < kSpareNodes) spare_nodes_.push_back(std::move(node));
  return r;
}

Result<size_t> Comm::Wait(Request* request, Deadline deadline) {
  while (true) {
    KZ_ASSIGN_OR_RETURN(Completion c, Test(request));
    if (c.done) return c.size;
    if (deadline.Expired())
      return Timeout(fmt::format("{}: {} tag {} not done by the deadline", label_, RequestKindName(request->kind()),
                                 request->tag()));
    KZ_RETURN_IF_ERROR(DoWaitForProgress(deadline));
  }
}

Status Comm::CheckRange(const void* data, size_t bytes, Registration* registration, std::string_view what) const {
  if (bytes > properties_.max_message_bytes)
    return InvalidArgument(fmt::format("{}: {} of {} bytes exceeds the device's limit of {} bytes", label_, what,
                                       bytes, properties_.max_message_bytes));
  if (registration == nullptr) {
    if (bytes == 0) return Status::Ok();
    return InvalidArgument(fmt::format("{}: {} of {} bytes without a registration", label_, what, bytes));
  }
  if (!OwnsRegistration(registration))
    return InvalidArgument(fmt::format("{}: {}: {} is not a live registration of this comm", label_, what,
                                       static_cast<const void*>(registration)));
  if (bytes > 0 && data == nullptr) return InvalidArgument(fmt::format("{}: {} from a null pointer", label_, what));
  if (bytes > 0 && !registration->Contains(data, bytes))
    return InvalidArgument(fmt::format("{}: {} range {} (+{} bytes) lies outside its registration {} (+{} bytes)",
                                       label_, what, data, bytes, registration->memory().data,
                                       registration->memory().size));
  return Status::Ok();
}

bool Comm::AtRequestLimit() const { return requests_in_flight() >= properties_.max_requests; }

bool Comm::OwnsRegistration(const Registration* registration) const {
  return registrations_.count(registration) != 0;
}

Request* Comm::Adopt(std::unique_ptr<Request> request, Registration* registration) {
  Request* r = request.get();
  r->registration_ = registration;
  if (registration != nullptr) ++registration->in_flight_;
  if (spare_nodes_.empty()) {
    requests_.emplace(r, std::move(request));
    return r;
  }
  Requests::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.key() = r;
  node.mapped() = std::move(request);
  requests_.insert(std::move(node));
  return r;
}

// ---- SendComm ----

Result<Request*> SendComm::Send(const void* data, size_t size, int tag, Registration* registration) {
  KZ_RETURN_IF_ERROR(CheckRange(data, size, registration, "send"));
  if (AtRequestLimit()) return static_cast<Request*>(nullptr);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Request> request, DoSend(data, size, tag, registration));
  if (request == nullptr) return static_cast<Request*>(nullptr);
  KZ_TRACE(kLogFabric, "{}: send {} bytes tag {} from {}", label(), size, tag, data);
  return Adopt(std::move(request), registration);
}

Result<Request*> SendComm::Write(const void* data, size_t size, Registration* registration, const RemoteKey& remote,
                                 uint64_t remote_offset, std::optional<uint32_t> immediate) {
  if (!properties().write_immediate)
    return NotSupported(fmt::format("{}: {} has no one-sided write", label(), properties().name));
  KZ_RETURN_IF_ERROR(CheckRange(data, size, registration, "write"));
  if (remote.size == 0 || remote.size > RemoteKey::kMax)
    return InvalidArgument(fmt::format("{}: write with a remote key of {} bytes", label(), remote.size));
  if (AtRequestLimit()) return static_cast<Request*>(nullptr);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Request> request,
                      DoWrite(data, size, registration, remote, remote_offset, immediate));
  if (request == nullptr) return static_cast<Request*>(nullptr);
  KZ_TRACE(kLogFabric, "{}: write {} bytes at remote offset {}{}", label(), size, remote_offset,
           immediate ? fmt::format(" with immediate {:#x}", *immediate) : std::string());
  return Adopt(std::move(request), registration);
}

Result<std::unique_ptr<Request>> SendComm::DoWrite(const void*, size_t, Registration*, const RemoteKey&, uint64_t,
                                                   std::optional<uint32_t>) {
  return NotSupported(fmt::format(
      "{}: this fabric has no one-sided write with immediate data (properties().write_immediate is false)", label()));
}

// ---- RecvComm ----

Result<Request*> RecvComm::Recv(void* data, size_t capacity, int tag, Registration* registration) {
  KZ_RETURN_IF_ERROR(CheckRange(data, capacity, registration, "receive"));
  if (AtRequestLimit()) return static_cast<Request*>(nullptr);
  KZ_ASSIGN_OR_RETURN(std::unique_ptr<Request> request, DoRecv(data, capacity, tag, registration));
  if (request == nullptr) return static_cast<Request*>(nullptr);
  KZ_TRACE(kLogFabric, "{}: receive up to {} bytes tag {} into {}", label(), capacity, tag, data);
  return Adopt(std::move(request), registration);
}

Status RecvComm::Flush(void* data, size_t size, Registration* registration, Deadline deadline) {
  if (registration == nullptr) return InvalidArgument(fmt::format("{}: flush without a registration", label()));
  KZ_RETURN_IF_ERROR(CheckRange(data, size, registration, "flush"));
  if (size == 0) return Status::Ok();
  return DoFlush(data, size, *registration, deadline);
}

Result<RemoteKey> RecvComm::Expose(Registration* registration) {
  if (!properties().write_immediate)
    return NotSupported(fmt::format("{}: {} has no one-sided write", label(), properties().name));
  if (!OwnsRegistration(registration))
    return InvalidArgument(fmt::format("{}: expose: {} is not a live registration of this comm", label(),
                                       static_cast<const void*>(registration)));
  auto key = DoExpose(*registration);
  if (key.ok()) KZ_TRACE(kLogFabric, "{}: exposed {} bytes at {}", label(), registration->memory().size,
                         registration->memory().data);
  return key;
}

Result<std::optional<uint32_t>> RecvComm::PollImmediate() {
  if (!properties().write_immediate)
    return NotSupported(fmt::format("{}: {} has no one-sided write", label(), properties().name));
  return DoPollImmediate();
}

Result<uint32_t> RecvComm::WaitImmediate(Deadline deadline) {
  while (true) {
    KZ_ASSIGN_OR_RETURN(std::optional<uint32_t> imm, PollImmediate());
    if (imm.has_value()) return *imm;
    if (deadline.Expired()) return Timeout(fmt::format("{}: no immediate arrived by the deadline", label()));
    KZ_RETURN_IF_ERROR(DoWaitForProgress(deadline));
  }
}

Status RecvComm::DoFlush(void*, size_t, Registration&, Deadline) { return Status::Ok(); }

Result<RemoteKey> RecvComm::DoExpose(Registration&) {
  return NotSupported(fmt::format(
      "{}: this fabric has no one-sided write with immediate data (properties().write_immediate is false)", label()));
}

Result<std::optional<uint32_t>> RecvComm::DoPollImmediate() {
  return NotSupported(fmt::format(
      "{}: this fabric has no one-sided write with immediate data (properties().write_immediate is false)", label()));
}

// ---- ListenComm ----

Result<std::unique_ptr<RecvComm>> ListenComm::Accept() {
  auto r = DoAccept();
  if (r.ok() && *r != nullptr) KZ_INFO(kLogFabric, "accepted {}", (*r)->label());
  return r;
}

Result<std::unique_ptr<RecvComm>> ListenComm::Accept(Deadline deadline) {
  while (true) {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<RecvComm> comm, Accept());
    if (comm != nullptr) return comm;
    if (deadline.Expired())
      return Timeout(fmt::format("{}:{}: no peer connected by the deadline", properties_.fabric, properties_.name));
    KZ_RETURN_IF_ERROR(DoWaitAcceptable(deadline));
  }
}

// ---- Fabric ----

Status Fabric::CheckDevice(int dev) const {
  if (dev < 0 || dev >= device_count())
    return InvalidArgument(fmt::format("{}: device {} out of range (the fabric has {} device(s))", name_, dev,
                                       device_count()));
  return Status::Ok();
}

Result<FabricDeviceProperties> Fabric::properties(int dev) const {
  KZ_RETURN_IF_ERROR(CheckDevice(dev));
  return devices_[static_cast<size_t>(dev)];
}

Result<std::unique_ptr<ListenComm>> Fabric::Listen(int dev) {
  KZ_RETURN_IF_ERROR(CheckDevice(dev));
  auto r = DoListen(dev);
  if (r.ok()) {
    KZ_INFO(kLogFabric, "{}: listening on {} (handle of {} bytes)", name_, devices_[dev].name, (*r)->handle().size);
  } else {
    KZ_INFO(kLogFabric, "{}: listen on {} failed: {}", name_, devices_[dev].name, r.status().ToString());
  }
  return r;
}

Result<std::unique_ptr<SendComm>> Fabric::Connect(int dev, const Handle& handle) {
  KZ_RETURN_IF_ERROR(CheckDevice(dev));
  if (handle.size == 0 || handle.size > Handle::kMax)
    return InvalidArgument(fmt::format("{}: connect with a handle of {} bytes", name_, handle.size));
  auto r = DoConnect(dev, handle);
  if (r.ok() && *r != nullptr) KZ_INFO(kLogFabric, "connected {}", (*r)->label());
  return r;
}

Result<std::unique_ptr<SendComm>> Fabric::Connect(int dev, const Handle& handle, Deadline deadline) {
  for (int attempt = 0;; ++attempt) {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<SendComm> comm, Connect(dev, handle));
    if (comm != nullptr) return comm;
    if (deadline.Expired())
      return Timeout(fmt::format("{}: connection on {} not established by the deadline", name_, devices_[dev].name));
    KZ_RETURN_IF_ERROR(DoWaitConnectable(dev, handle, deadline, attempt));
  }
}

Result<std::unique_ptr<SendComm>> Fabric::ConnectBack(int dev, const Handle& handle, RecvComm& from) {
  KZ_RETURN_IF_ERROR(CheckDevice(dev));
  if (handle.size == 0 || handle.size > Handle::kMax)
    return InvalidArgument(fmt::format("{}: connect with a handle of {} bytes", name_, handle.size));
  auto r = DoConnectBack(dev, handle, from);
  if (r.ok() && *r != nullptr) KZ_INFO(kLogFabric, "connected {}", (*r)->label());
  return r;
}

bool Fabric::ConnectsBack(int dev) const { return CheckDevice(dev).ok() && DoConnectsBack(dev); }

Result<std::unique_ptr<SendComm>> Fabric::DoConnectBack(int, const Handle&, RecvComm& from) {
  return NotSupported(fmt::format("{}: {} carries one direction only", name_, from.label()));
}

Result<Handle> Fabric::Forward(std::span<const Hop> hops, const Handle& target) const {
  if (hops.empty()) return InvalidArgument(fmt::format("{}: forwarding through no rank", name_));
  for (const Hop& h : hops)
    if (h.via.size == 0 || h.via.size > Handle::kMax || h.out_device < 0)
      return InvalidArgument(
          fmt::format("{}: a forwarding hop with a handle of {} bytes and device {}", name_, h.via.size, h.out_device));
  if (target.size == 0 || target.size > Handle::kMax)
    return InvalidArgument(fmt::format("{}: forwarding to a handle of {} bytes", name_, target.size));
  return DoForward(hops, target);
}

Result<Handle> Fabric::DoForward(std::span<const Hop>, const Handle&) const {
  return NotSupported(fmt::format("{}: does not forward between ranks that share no link", name_));
}

Status Fabric::DoWaitConnectable(int, const Handle&, Deadline deadline, int attempt) {
  // Nothing to block on in general (a full accept backlog has no fd to poll): back off, 50 us
  // doubling to 10 ms, so a slow listener costs no CPU.
  const auto backoff = std::chrono::microseconds(50L << std::min(attempt, 8));
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
      std::min<std::chrono::nanoseconds>(backoff, std::chrono::milliseconds(10)), deadline.Remaining()));
  return Status::Ok();
}

}  // namespace kizuna::fabric
