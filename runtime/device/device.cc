#include "runtime/device/device.h"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "runtime/core/logging.h"

namespace kizuna::device {
namespace {

bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

Status CheckAddressable(const Device& d, const void* p, size_t bytes, std::string_view what) {
  if (p == nullptr) return InvalidArgument(fmt::format("{} is null", what));
  if (!d.Addressable(p, bytes))
    return InvalidArgument(fmt::format("{} {} (+{} bytes) is not memory that {} can use: allocate it on the "
                                       "device or import it",
                                       what, p, bytes, d.label()));
  return Status::Ok();
}

Status CheckSameBackend(const Device& a, const Device& b, std::string_view what) {
  if (a.properties().backend != b.properties().backend)
    return NotSupported(fmt::format("{} belongs to {}, the stream to {}: events cannot cross backends", what,
                                    b.label(), a.label()));
  return Status::Ok();
}

}  // namespace

// ---- Stream ----

Status Stream::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  KZ_RETURN_IF_ERROR(CheckAddressable(device(), dst, bytes, "copy destination"));
  KZ_RETURN_IF_ERROR(CheckAddressable(device(), src, bytes, "copy source"));
  if (Overlaps(dst, bytes, src, bytes)) return InvalidArgument("copy source and destination overlap");
  KZ_TRACE(kLogDevice, "{} copy {} bytes {} -> {}", device().label(), bytes, src, dst);
  return DoCopy(dst, src, bytes);
}

Status Stream::Reduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) {
  if (!IsValid(type)) return InvalidArgument(fmt::format("invalid data type {}", static_cast<int>(type)));
  if (!IsValid(op)) return InvalidArgument(fmt::format("invalid reduce op {}", static_cast<int>(op)));
  if (srcs.empty()) return InvalidArgument("reduce needs at least one input");
  if (count == 0) return Status::Ok();
  const size_t esize = DataTypeSize(type);
  if (count > SIZE_MAX / esize) return InvalidArgument(fmt::format("reduce count {} overflows", count));
  const size_t bytes = count * esize;
  KZ_RETURN_IF_ERROR(CheckAddressable(device(), dst, bytes, "reduce output"));
  for (size_t k = 0; k < srcs.size(); ++k) {
    KZ_RETURN_IF_ERROR(CheckAddressable(device(), srcs[k], bytes, fmt::format("reduce input {}", k)));
    if (srcs[k] != dst && Overlaps(srcs[k], bytes, dst, bytes))
      return InvalidArgument(fmt::format("reduce input {} partially overlaps the output", k));
  }
  KZ_TRACE(kLogDevice, "{} reduce {} x {} {} ({}) -> {}", device().label(), srcs.size(), count, DataTypeName(type),
           ReduceOpName(op), dst);
  return DoReduce(dst, srcs, count, type, op);
}

Status Stream::ReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
                           DataType type, ReduceOp op) {
  if (!IsValid(type)) return InvalidArgument(fmt::format("invalid data type {}", static_cast<int>(type)));
  if (!IsValid(op)) return InvalidArgument(fmt::format("invalid reduce op {}", static_cast<int>(op)));
  if (srcs.empty()) return InvalidArgument("reduce needs at least one input");
  if (dsts.empty()) return InvalidArgument("reduce needs at least one output");
  if (count == 0) return Status::Ok();
  const size_t esize = DataTypeSize(type);
  if (count > SIZE_MAX / esize) return InvalidArgument(fmt::format("reduce count {} overflows", count));
  const size_t bytes = count * esize;
  for (size_t k = 0; k < srcs.size(); ++k)
    KZ_RETURN_IF_ERROR(CheckAddressable(device(), srcs[k], bytes, fmt::format("reduce input {}", k)));
  for (size_t j = 0; j < dsts.size(); ++j) {
    KZ_RETURN_IF_ERROR(CheckAddressable(device(), dsts[j], bytes, fmt::format("reduce output {}", j)));
    for (size_t k = 0; k < srcs.size(); ++k)
      if (srcs[k] != dsts[j] && Overlaps(srcs[k], bytes, dsts[j], bytes))
        return InvalidArgument(fmt::format("reduce input {} partially overlaps output {}", k, j));
    for (size_t i = 0; i < j; ++i)
      if (Overlaps(dsts[i], bytes, dsts[j], bytes))
        return InvalidArgument(fmt::format("reduce outputs {} and {} overlap", i, j));
  }
  KZ_TRACE(kLogDevice, "{} reduce {} x {} {} ({}) -> {} outputs", device().label(), srcs.size(), count,
           DataTypeName(type), ReduceOpName(op), dsts.size());
  return DoReduceMulti(dsts, srcs, count, type, op);
}

Status Stream::DoReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
                             DataType type, ReduceOp op) {
  KZ_RETURN_IF_ERROR(DoReduce(dsts[0], srcs, count, type, op));
  for (size_t j = 1; j < dsts.size(); ++j)
    KZ_RETURN_IF_ERROR(DoCopy(dsts[j], dsts[0], count * DataTypeSize(type)));
  return Status::Ok();
}

Status Stream::Scale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) {
  if (!IsValid(type)) return InvalidArgument(fmt::format("invalid data type {}", static_cast<int>(type)));
  if (divisor == 0) return InvalidArgument("scale divisor is 0");
  if (count == 0) return Status::Ok();
  const size_t esize = DataTypeSize(type);
  if (count > SIZE_MAX / esize) return InvalidArgument(fmt::format("scale count {} overflows", count));
  const size_t bytes = count * esize;
  KZ_RETURN_IF_ERROR(CheckAddressable(device(), dst, bytes, "scale output"));
  KZ_RETURN_IF_ERROR(CheckAddressable(device(), src, bytes, "scale input"));
  if (src != dst && Overlaps(src, bytes, dst, bytes))
    return InvalidArgument("scale input partially overlaps the output (only dst == src is allowed)");
  KZ_TRACE(kLogDevice, "{} scale {} {} / {} {} -> {}", device().label(), count, DataTypeName(type), divisor, src, dst);
  return DoScale(dst, src, count, type, divisor);
}

Status Stream::DoScale(void*, const void*, size_t, DataType, uint32_t) {
  return NotSupported(fmt::format("{} has no scale operation", device().properties().backend));
}

Status Stream::Record(Event& event) {
  KZ_RETURN_IF_ERROR(CheckSameBackend(device(), event.device(), "event"));
  return DoRecord(event);
}

Status Stream::Wait(const Event& event) {
  KZ_RETURN_IF_ERROR(CheckSameBackend(device(), event.device(), "event"));
  return DoWait(event);
}

Status Stream::EnqueueHostCallback(HostCallback fn) {
  if (!fn) return InvalidArgument("host callback is empty");
  return DoHostCallback(std::move(fn));
}

Result<std::unique_ptr<StreamHold>> Stream::EnqueueHold() { return DoEnqueueHold(); }

namespace {

// The default hold: a host callback that blocks until released.
class CallbackHold final : public StreamHold {
 public:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool released = false;  // guarded by mu
  };
  explicit CallbackHold(std::shared_ptr<State> state) : state_(std::move(state)) {}
  ~CallbackHold() override { Release(); }
  void Release() override {
    {
      std::lock_guard lock(state_->mu);
      state_->released = true;
    }
    state_->cv.notify_all();
  }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace

Result<std::unique_ptr<StreamHold>> Stream::DoEnqueueHold() {
  auto state = std::make_shared<CallbackHold::State>();
  const double hold_s = device().config().timeout_s + 30;
  const std::string where = device().label();
  KZ_RETURN_IF_ERROR(DoHostCallback([state, hold_s, where](const Status&) {
    std::unique_lock lock(state->mu);
    if (!state->cv.wait_for(lock, std::chrono::duration<double>(hold_s), [&] { return state->released; }))
      KZ_WARN(kLogDevice, "{}: a stream hold was not released after {} s; letting the stream go on", where, hold_s);
  }));
  return std::unique_ptr<StreamHold>(new CallbackHold(std::move(state)));
}

Status Stream::EnqueueRelease(std::unique_ptr<StreamHold> hold) {
  if (!hold) return InvalidArgument("no hold to release");
  return DoEnqueueRelease(std::move(hold));
}

Status Stream::DoEnqueueRelease(std::unique_ptr<StreamHold> hold) {
  std::shared_ptr<StreamHold> shared(std::move(hold));
  Status s = DoHostCallback([shared](const Status&) { shared->Release(); });
  if (!s.ok()) shared->Release();  // never leave the other stream held
  return s;
}

Status Stream::Synchronize(Deadline deadline) {
  KZ_RETURN_IF_ERROR(DoSynchronize(deadline));
  return TakeFailure();
}
Status Stream::Synchronize() {
  const double timeout_s = device().config().timeout_s;
  std::optional<uint64_t> mark = DoCompleted();
  Status s = DoSynchronize(Deadline::AfterSeconds(timeout_s));
  while (s.code() == StatusCode::kTimeout) {
    const std::optional<uint64_t> now = DoCompleted();
    if (!now || *now == *mark) return s;  // nothing completed for the whole timeout
    mark = now;
    s = DoSynchronize(Deadline::AfterSeconds(timeout_s));
  }
  KZ_RETURN_IF_ERROR(s);
  return TakeFailure();
}
Result<bool> Stream::Query() {
  KZ_ASSIGN_OR_RETURN(bool done, DoQuery());
  if (done) KZ_RETURN_IF_ERROR(TakeFailure());
  return done;
}

void Stream::ReportFailure(const Status& failure) {
  if (failure.ok()) return;
  std::lock_guard lock(failure_mu_);
  if (failure_.ok()) failure_ = failure;
  failed_.store(true, std::memory_order_release);
}

Status Stream::TakeFailure() {
  if (!failed_.load(std::memory_order_acquire)) return Status::Ok();  // the common path takes no lock
  std::lock_guard lock(failure_mu_);
  failed_.store(false, std::memory_order_relaxed);
  return std::exchange(failure_, Status::Ok());
}

// ---- Event ----

Result<bool> Event::Query() { return DoQuery(); }
Status Event::Synchronize(Deadline deadline) { return DoSynchronize(deadline); }
Status Event::Synchronize() { return DoSynchronize(Deadline::AfterSeconds(device().config().timeout_s)); }

// ---- Device ----

std::string Device::label() const { return fmt::format("{}:{}", properties_.backend, properties_.index); }

bool Device::Addressable(const void*, size_t) const { return true; }

Result<AllocationRef> Device::FindAllocation(const void*, size_t) const {
  return NotSupported(fmt::format("{} cannot name the allocation behind an address", label()));
}

Result<std::unique_ptr<Buffer>> Device::Allocate(size_t bytes) {
  auto r = DoAllocate(bytes);
  if (r.ok()) {
    KZ_TRACE(kLogDevice, "{} allocated {} bytes at {}", label(), bytes, (*r)->data());
  } else {
    KZ_INFO(kLogDevice, "{} allocation of {} bytes failed: {}", label(), bytes, r.status().ToString());
  }
  return r;
}

Result<std::unique_ptr<Buffer>> Device::AllocateHost(size_t bytes) {
  auto r = DoAllocateHost(bytes);
  if (r.ok()) {
    KZ_TRACE(kLogDevice, "{} allocated {} bytes of host memory at {}", label(), bytes, (*r)->data());
  } else {
    KZ_INFO(kLogDevice, "{} host allocation of {} bytes failed: {}", label(), bytes, r.status().ToString());
  }
  return r;
}

Result<std::unique_ptr<Buffer>> Device::DoAllocateHost(size_t bytes) {
  if (properties_.host_accessible) return DoAllocate(bytes);
  return NotSupported(fmt::format("{} has no host memory its streams can use", label()));
}

Result<std::unique_ptr<Stream>> Device::CreateStream() { return DoCreateStream(); }

Result<std::unique_ptr<Stream>> Device::AdoptStream(void* native) { return DoAdoptStream(native); }

Result<std::unique_ptr<Stream>> Device::DoAdoptStream(void* /*native*/) {
  return NotSupported(fmt::format("{}: backend {} cannot adopt a native stream", label(), properties_.backend));
}
Result<std::unique_ptr<Event>> Device::CreateEvent() { return DoCreateEvent(); }

namespace {

Status CheckExportRange(const Device& d, const Buffer& buffer, size_t offset, size_t size) {
  if (&buffer.device() != &d)
    return InvalidArgument(fmt::format("buffer belongs to {}, not {}", buffer.device().label(), d.label()));
  if (buffer.imported()) return NotSupported(fmt::format("{}: re-exporting imported memory", d.label()));
  if (offset > buffer.size() || size > buffer.size() - offset)
    return InvalidArgument(
        fmt::format("export range [{}, +{}) exceeds the buffer's {} bytes", offset, size, buffer.size()));
  if (size == 0) return InvalidArgument("export of an empty range");
  return Status::Ok();
}

}  // namespace

Result<ExportedMemory> Device::Export(const Buffer& buffer, size_t offset, size_t size) {
  KZ_RETURN_IF_ERROR(CheckExportRange(*this, buffer, offset, size));
  if (!properties_.export_fd && !properties_.export_opaque)
    return NotSupported(fmt::format("{} cannot export memory", label()));
  auto r = DoExport(buffer, offset, size);
  if (r.ok()) {
    r->backend = properties_.backend;
    r->device_uuid = properties_.uuid;
    r->device_index = properties_.index;
    r->size = size;
    KZ_INFO(kLogDevice, "{} exported {} bytes as {}", label(), size,
            r->kind == ExportKind::kFd ? "an fd" : "an opaque IPC handle");
  }
  return r;
}

Result<ExportedMemory> Device::ExportDmaBuf(const Buffer& buffer, size_t offset, size_t size) {
  KZ_RETURN_IF_ERROR(CheckExportRange(*this, buffer, offset, size));
  if (!properties_.export_dmabuf) return NotSupported(fmt::format("{} cannot export DMA-BUF", label()));
  auto r = DoExportDmaBuf(buffer, offset, size);
  if (r.ok()) {
    r->kind = ExportKind::kFd;
    r->dmabuf = true;
    r->backend = properties_.backend;
    r->device_uuid = properties_.uuid;
    r->device_index = properties_.index;
    r->size = size;
    KZ_INFO(kLogDevice, "{} exported {} bytes as a DMA-BUF", label(), size);
  }
  return r;
}

Result<ExportedMemory> Device::DoExportDmaBuf(const Buffer&, size_t, size_t) {
  return NotSupported(fmt::format("{} cannot export DMA-BUF", label()));
}

Result<std::unique_ptr<Buffer>> Device::Import(const ExportedMemory& exported) {
  if (exported.backend != properties_.backend)
    return NotSupported(fmt::format("memory exported by backend '{}' cannot be imported by {}", exported.backend,
                                    label()));
  if (exported.size == 0) return InvalidArgument("imported region is empty");
  if (exported.kind == ExportKind::kFd && !exported.fd.valid())
    return InvalidArgument("exported memory carries no file descriptor");
  if (exported.kind == ExportKind::kOpaque && exported.opaque.empty())
    return InvalidArgument("exported memory carries an empty IPC handle");
  auto r = DoImport(exported);
  if (r.ok())
    KZ_INFO(kLogDevice, "{} imported {} bytes exported by {}:{}", label(), exported.size, exported.backend,
            exported.device_index);
  return r;
}

Result<ExportedMemory> Device::DoExport(const Buffer&, size_t, size_t) {
  return NotSupported(fmt::format("{} cannot export memory", label()));
}

Result<std::unique_ptr<Buffer>> Device::DoImport(const ExportedMemory&) {
  return NotSupported(fmt::format("{} cannot import memory", label()));
}

}  // namespace kizuna::device
