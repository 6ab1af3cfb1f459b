#include "devices/cuda/stream.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "devices/cuda/kernel_abi.h"
#include "devices/cuda/kernels_fatbin.h"
#include "runtime/core/logging.h"

namespace kizuna::cuda {
namespace {

// Kernel name parts, indexed by DataType and ReduceOp (kernel_abi.h).
constexpr const char* kTypeNames[kNumDataTypes] = {"f16", "bf16", "f32", "f64", "i8",
                                                   "u8",  "i32",  "u32", "i64", "u64"};
constexpr const char* kOpNames[kNumReduceOps] = {"sum", "prod", "min", "max", "avg"};

// Grid size (measured on an H100 with 256 MiB and 16 MiB buffers: docs/PERFORMANCE.md, "CUDA
// backend on an H100", the kernels' grid): about one block per 1024 vectors of 16 bytes, at most
// 64 blocks per SM. Fewer blocks per SM are slower at 256 MiB; at 16 MiB a smaller grid wins
// because each thread first sets up avg's divider.
constexpr size_t kVectorsPerBlock = 1024;
constexpr int kMaxBlocksPerSm = 64;
// How long a wait polls the driver (yielding the core between polls) before it starts sleeping,
// and the longest sleep: a wait ends at most about kMaxSleep after the work did. (With a shorter
// spin and sleeps growing to 1 ms, each rank's finish, a synchronization, cost the fused
// AllReduce on an H100 a large share of its time: docs/PERFORMANCE.md, "CUDA backend on an
// H100".)
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kMaxSleep = std::chrono::microseconds(200);

// Set while a host callback of this backend runs on the driver's callback thread: no CUDA call
// may be made there.
thread_local const void* tls_callback_stream = nullptr;

// Polls `query` (a cuStreamQuery / cuEventQuery) until it stops answering CUDA_ERROR_NOT_READY or
// the deadline passes.
template <typename Query>
CUresult PollUntil(Query query, Deadline deadline, bool* timed_out) {
  *timed_out = false;
  const auto spin_until = std::chrono::steady_clock::now() + kSpin;
  auto sleep = std::chrono::microseconds(5);
  while (true) {
    CUresult r = query();
    if (r != CUDA_ERROR_NOT_READY) return r;
    if (deadline.Expired()) {
      *timed_out = true;
      return r;
    }
    if (std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(sleep, deadline.Remaining()));
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

struct CallbackData {
  device::HostCallback fn;
  std::shared_ptr<StreamState> state;
  std::shared_ptr<DeviceCore> core;
  const void* stream;
};

void CUDA_CB Trampoline(CUstream, CUresult status, void* p) {
  std::unique_ptr<CallbackData> d(static_cast<CallbackData*>(p));
  if (status != CUDA_SUCCESS)
    d->state->Fail(CudaError(d->core->api, status, fmt::format("cuda:{}: the stream failed", d->core->index)));
  Status s = d->state->Get();
  tls_callback_stream = d->stream;
  d->fn(s);
  tls_callback_stream = nullptr;
}

}  // namespace

// ---- Holds: the stream waits on a word of pinned memory (cuStreamWaitValue32) ----

// Words of pinned host memory that holds wait on. A slot's value only grows: a hold on slot i
// waits until it reaches its generation g, and its release stores g. A slot is given to a new
// hold only after the previous one on it was released, so a new hold is never satisfied early and
// an old wait is never left behind.
struct HoldSlots {
  static constexpr size_t kSlots = 1024;
  std::shared_ptr<DeviceCore> core;
  uint32_t* words = nullptr;  // cuMemHostAlloc'd, kSlots words
  std::mutex mu;
  std::vector<uint32_t> generation = std::vector<uint32_t>(kSlots, 0);  // guarded by mu
  std::vector<char> busy = std::vector<char>(kSlots, 0);               // guarded by mu
  size_t next = 0;                                                      // guarded by mu
  ~HoldSlots() {
    if (words == nullptr) return;
    ScopedContext scope(core->api, core->ctx);
    core->api.cuMemFreeHost(words);
  }
};

namespace {

class CudaHold final : public device::StreamHold {
 public:
  CudaHold(std::shared_ptr<HoldSlots> slots, size_t slot, uint32_t generation)
      : slots_(std::move(slots)), slot_(slot), generation_(generation) {}
  // The word the held stream waits on, and the value that releases it.
  CUdeviceptr word() const { return reinterpret_cast<CUdeviceptr>(&slots_->words[slot_]); }
  uint32_t generation() const { return generation_; }
  ~CudaHold() override { Release(); }
  void Release() override {
    std::lock_guard lock(slots_->mu);
    if (released_) return;
    released_ = true;
    __atomic_store_n(&slots_->words[slot_], generation_, __ATOMIC_RELEASE);
    slots_->busy[slot_] = 0;
  }

 private:
  std::shared_ptr<HoldSlots> slots_;
  size_t slot_;
  uint32_t generation_;
  bool released_ = false;  // guarded by slots_->mu
};

}  // namespace

Result<std::unique_ptr<device::StreamHold>> CudaStream::DoEnqueueHold() {
  if (holds_unsupported_) return Stream::DoEnqueueHold();
  KZ_RETURN_IF_ERROR(state_->Get());
  ScopedContext scope(core_->api, core_->ctx);
  if (!holds_) {
    auto slots = std::make_shared<HoldSlots>();
    slots->core = core_;
    void* words = nullptr;
    CUresult r = core_->api.cuMemHostAlloc(&words, HoldSlots::kSlots * sizeof(uint32_t),
                                           CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r != CUDA_SUCCESS) return Refused(r, "pinned memory for stream holds");
    std::memset(words, 0, HoldSlots::kSlots * sizeof(uint32_t));
    slots->words = static_cast<uint32_t*>(words);
    holds_ = std::move(slots);
  }
  size_t slot = 0;
  uint32_t generation = 0;
  {
    std::lock_guard lock(holds_->mu);
    size_t tries = 0;
    while (holds_->busy[holds_->next] && tries++ < HoldSlots::kSlots)
      holds_->next = (holds_->next + 1) % HoldSlots::kSlots;
    if (holds_->busy[holds_->next])
      return Internal(fmt::format("{}: {} stream holds outstanding", device().label(), HoldSlots::kSlots));
    slot = holds_->next;
    holds_->next = (holds_->next + 1) % HoldSlots::kSlots;
    holds_->busy[slot] = 1;
    generation = ++holds_->generation[slot];
  }
  CUresult r = core_->api.cuStreamWaitValue32(stream_, reinterpret_cast<CUdeviceptr>(&holds_->words[slot]), generation,
                                              CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) {
    {
      std::lock_guard lock(holds_->mu);
      holds_->busy[slot] = 0;
      --holds_->generation[slot];
    }
    if (r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_INVALID_VALUE) {
      KZ_WARN(kLogDevice, "{}: the driver refused a stream memory wait ({}); streams are held by host callbacks, "
              "so ranks sharing this process wait behind each other",
              device().label(), ErrorText(core_->api, r));
      holds_unsupported_ = true;
      return Stream::DoEnqueueHold();
    }
    return Refused(r, "cuStreamWaitValue32");
  }
  return std::unique_ptr<device::StreamHold>(new CudaHold(holds_, slot, generation));
}

Status CudaStream::DoEnqueueRelease(std::unique_ptr<device::StreamHold> hold) {
  auto* cuda_hold = dynamic_cast<CudaHold*>(hold.get());
  if (cuda_hold == nullptr) return Stream::DoEnqueueRelease(std::move(hold));  // a callback hold
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuStreamWriteValue32(stream_, cuda_hold->word(), cuda_hold->generation(), 0);
  if (r != CUDA_SUCCESS) {
    hold->Release();  // never leave the other stream held
    return Refused(r, "cuStreamWriteValue32 (releasing a held stream)");
  }
  // The hold object goes when this stream has passed the write: its Release then stores the value
  // the device already wrote, and frees the slot for reuse. Should this stream fail before the
  // write, that callback (which runs with the error) releases the held stream from the host.
  auto* boxed = new std::unique_ptr<device::StreamHold>(std::move(hold));
  r = core_->api.cuStreamAddCallback(
      stream_,
      [](CUstream, CUresult, void* p) {
        auto* h = static_cast<std::unique_ptr<device::StreamHold>*>(p);
        (*h)->Release();
        delete h;
      },
      boxed, 0);
  if (r != CUDA_SUCCESS) {
    (*boxed)->Release();
    delete boxed;
  }
  return Status::Ok();
}

// ---- CudaDevice: kernels, streams, events ----

Result<const KernelTable*> CudaDevice::Kernels() {
  std::call_once(kernels_once_, [this] {
    const DriverApi& a = api();
    ScopedContext scope(a, context());
    CUresult r = a.cuModuleLoadData(&kernels_.module, kKizunaCudaFatbin);
    if (r != CUDA_SUCCESS) {
      kernels_status_ = CudaError(
          a, r,
          fmt::format("{}: loading the reduce kernels (this GPU is sm_{}{}; the default build has code for sm_80 "
                      "and sm_90 and PTX for compute_90: rebuild with --//devices/cuda:archs=all for older GPUs)",
                      label(), attributes_.cc_major, attributes_.cc_minor));
      kernels_.module = nullptr;
      return;
    }
    for (int t = 0; t < kNumDataTypes; ++t) {
      for (int o = 0; o < kNumReduceOps; ++o) {
        const std::string name = fmt::format("kz_reduce_{}_{}", kTypeNames[t], kOpNames[o]);
        r = a.cuModuleGetFunction(&kernels_.reduce[t][o], kernels_.module, name.c_str());
        if (r == CUDA_SUCCESS) r = a.cuFuncLoad(kernels_.reduce[t][o]);
        if (r != CUDA_SUCCESS) {
          kernels_status_ = CudaError(a, r, fmt::format("{}: kernel {} missing from the fatbin", label(), name));
          return;
        }
      }
      const std::string name = fmt::format("kz_scale_{}", kTypeNames[t]);
      r = a.cuModuleGetFunction(&kernels_.scale[t], kernels_.module, name.c_str());
      if (r == CUDA_SUCCESS) r = a.cuFuncLoad(kernels_.scale[t]);
      if (r != CUDA_SUCCESS) {
        kernels_status_ = CudaError(a, r, fmt::format("{}: kernel {} missing from the fatbin", label(), name));
        return;
      }
    }
    KZ_INFO(kLogDevice, "{}: loaded {} reduce and {} scale kernels ({} bytes of fatbin)", label(),
            kNumDataTypes * kNumReduceOps, kNumDataTypes, kKizunaCudaFatbinSize);
  });
  if (!kernels_status_.ok()) return kernels_status_;
  return &kernels_;
}

Result<std::unique_ptr<device::Stream>> CudaDevice::DoCreateStream() {
  ScopedContext scope(api(), context());
  CUstream s = nullptr;
  CUresult r = api().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) return CudaError(api(), r, fmt::format("{}: cuStreamCreate", label()));
  return std::unique_ptr<device::Stream>(new CudaStream(this, s));
}

// A framework's CUstream (a torch stream's cuda_stream, a cudaStream_t: the same handle). The
// driver says which context it belongs to; it must be this device's (the primary context, which
// the runtime API and PyTorch use). The legacy default stream (null) is taken as it is.
Result<std::unique_ptr<device::Stream>> CudaDevice::DoAdoptStream(void* native) {
  auto stream = static_cast<CUstream>(native);
  ScopedContext scope(api(), context());
  CUcontext ctx = nullptr;
  CUresult r = api().cuStreamGetCtx(stream, &ctx);
  if (r != CUDA_SUCCESS)
    return CudaError(api(), r, fmt::format("{}: {} is not a live CUDA stream (cuStreamGetCtx)", label(), native));
  if (ctx != context())
    return InvalidArgument(fmt::format("{}: CUDA stream {} belongs to another context (another device, or a context "
                                       "other than the device's primary one)",
                                       label(), native));
  return std::unique_ptr<device::Stream>(new CudaStream(this, stream, /*owned=*/false));
}

Result<std::unique_ptr<device::Event>> CudaDevice::DoCreateEvent() {
  ScopedContext scope(api(), context());
  CUevent e = nullptr;
  CUresult r = api().cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return CudaError(api(), r, fmt::format("{}: cuEventCreate", label()));
  return std::unique_ptr<device::Event>(new CudaEvent(this, e));
}

// ---- CudaStream ----

CudaStream::CudaStream(CudaDevice* device, CUstream stream, bool owned)
    : Stream(device),
      core_(device->core()),
      stream_(stream),
      owned_(owned),
      state_(std::make_shared<StreamState>()) {}

CudaStream::~CudaStream() {
  if (!owned_) return;  // a framework's stream: its work and its life are the framework's
  const double timeout_s = device().config().timeout_s;
  if (tls_callback_stream != nullptr) {
    // Destroyed by a host callback, on the driver's callback thread, where no CUDA call is
    // allowed: finish the teardown on a thread of our own once the stream has drained.
    std::thread([core = core_, stream = stream_, timeout_s] {
      ScopedContext scope(core->api, core->ctx);
      bool timed_out = false;
      PollUntil([&] { return core->api.cuStreamQuery(stream); }, Deadline::AfterSeconds(timeout_s), &timed_out);
      core->api.cuStreamDestroy(stream);
    }).detach();
    return;
  }
  ScopedContext scope(core_->api, core_->ctx);
  bool timed_out = false;
  PollUntil([&] { return core_->api.cuStreamQuery(stream_); }, Deadline::AfterSeconds(timeout_s), &timed_out);
  if (timed_out)
    KZ_WARN(kLogDevice, "cuda:{}: a stream destroyed with work still unfinished after {} s; the driver releases it "
            "when that work ends", core_->index, timeout_s);
  core_->api.cuStreamDestroy(stream_);
}

Status CudaStream::Refused(CUresult r, std::string_view what) {
  Status s = CudaError(core_->api, r, fmt::format("{}: {}", device().label(), what));
  if (s.code() != StatusCode::kInvalidArgument) state_->Fail(s);
  return s;
}

Status CudaStream::DoCopy(void* dst, const void* src, size_t bytes) {
  KZ_RETURN_IF_ERROR(state_->Get());
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
                                        bytes, stream_);
  if (r != CUDA_SUCCESS) return Refused(r, fmt::format("copy of {} bytes", bytes));
  return Status::Ok();
}

Status CudaStream::Launch(CUfunction f, void* params, size_t elements, size_t element_bytes) {
  const size_t vectors = (elements * element_bytes + KZ_CUDA_VEC_BYTES - 1) / KZ_CUDA_VEC_BYTES;
  const size_t wanted = (vectors + kVectorsPerBlock - 1) / kVectorsPerBlock;
  const size_t cap = static_cast<size_t>(std::max(1, cuda().attributes().sm_count * kMaxBlocksPerSm));
  const auto blocks = static_cast<unsigned int>(std::clamp<size_t>(wanted, 1, cap));
  void* args[] = {params};
  CUresult r = core_->api.cuLaunchKernel(f, blocks, 1, 1, KZ_CUDA_BLOCK_THREADS, 1, 1, 0, stream_, args, nullptr);
  if (r != CUDA_SUCCESS) return Refused(r, "kernel launch");
  return Status::Ok();
}

Status CudaStream::DoReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) {
  KZ_RETURN_IF_ERROR(state_->Get());
  KZ_ASSIGN_OR_RETURN(const KernelTable* k, cuda().Kernels());
  ScopedContext scope(core_->api, core_->ctx);
  const size_t n = srcs.size();
  const size_t esize = DataTypeSize(type);
  const auto t = static_cast<size_t>(type);
  // More inputs than one launch takes: fold them into the output launch by launch (the output is
  // the first input of every later launch). Intermediate launches sum for avg; the last divides
  // by the total count. When the output is one of the later inputs it would be overwritten
  // before it is read, so the launches then fold into stream-ordered scratch.
  void* out = dst;
  CUdeviceptr scratch = 0;
  if (n > KZ_CUDA_MAX_INPUTS &&
      std::find(srcs.begin() + KZ_CUDA_MAX_INPUTS, srcs.end(), static_cast<const void*>(dst)) != srcs.end()) {
    CUresult r = core_->api.cuMemAllocAsync(&scratch, count * esize, stream_);
    if (r != CUDA_SUCCESS)
      return Refused(r, fmt::format("scratch of {} bytes for a {}-input reduce", count * esize, n));
    out = reinterpret_cast<void*>(scratch);
  }
  size_t next = 0;
  Status status;
  while (next < n && status.ok()) {
    KzReduceParams p{};
    int m = 0;
    if (next > 0) p.srcs[m++] = out;
    while (m < KZ_CUDA_MAX_INPUTS && next < n) p.srcs[m++] = srcs[next++];
    p.dsts[0] = out;
    p.ndsts = 1;
    p.count = count;
    p.nsrcs = m;
    p.avg_divisor = static_cast<unsigned int>(n);
    const ReduceOp launch_op = (op == ReduceOp::kAvg && next < n) ? ReduceOp::kSum : op;
    status = Launch(k->reduce[t][static_cast<size_t>(launch_op)], &p, count, esize);
  }
  if (scratch != 0) {
    if (status.ok()) {
      CUresult r = core_->api.cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), scratch, count * esize, stream_);
      if (r != CUDA_SUCCESS) status = Refused(r, "copying a reduce's result out of scratch");
    }
    core_->api.cuMemFreeAsync(scratch, stream_);
  }
  return status;
}

Status CudaStream::DoReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
                                 DataType type, ReduceOp op) {
  // One pass writing every output (the fused AllReduce's kernel) when one launch takes them all;
  // otherwise the device layer's default (one output, then copies).
  if (srcs.size() > KZ_CUDA_MAX_INPUTS || dsts.size() > KZ_CUDA_MAX_OUTPUTS)
    return Stream::DoReduceMulti(dsts, srcs, count, type, op);
  KZ_RETURN_IF_ERROR(state_->Get());
  KZ_ASSIGN_OR_RETURN(const KernelTable* k, cuda().Kernels());
  ScopedContext scope(core_->api, core_->ctx);
  KzReduceParams p{};
  for (size_t i = 0; i < srcs.size(); ++i) p.srcs[i] = srcs[i];
  for (size_t j = 0; j < dsts.size(); ++j) p.dsts[j] = dsts[j];
  p.nsrcs = static_cast<int>(srcs.size());
  p.ndsts = static_cast<int>(dsts.size());
  p.count = count;
  p.avg_divisor = static_cast<unsigned int>(srcs.size());
  return Launch(k->reduce[static_cast<size_t>(type)][static_cast<size_t>(op)], &p, count, DataTypeSize(type));
}

Status CudaStream::DoScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) {
  KZ_RETURN_IF_ERROR(state_->Get());
  KZ_ASSIGN_OR_RETURN(const KernelTable* k, cuda().Kernels());
  ScopedContext scope(core_->api, core_->ctx);
  KzScaleParams p{};
  p.src = src;
  p.dst = dst;
  p.count = count;
  p.divisor = divisor;
  return Launch(k->scale[static_cast<size_t>(type)], &p, count, DataTypeSize(type));
}

Status CudaStream::DoRecord(device::Event& event) {
  if (&event.device() != &device())
    return InvalidArgument(fmt::format("an event of {} cannot be recorded on a stream of {}: record it on a stream "
                                       "of its own device (waits may cross devices)",
                                       event.device().label(), device().label()));
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuEventRecord(static_cast<CudaEvent&>(event).handle(), stream_);
  if (r != CUDA_SUCCESS) return Refused(r, "cuEventRecord");
  return Status::Ok();
}

Status CudaStream::DoWait(const device::Event& event) {
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuStreamWaitEvent(stream_, static_cast<const CudaEvent&>(event).handle(), 0);
  if (r != CUDA_SUCCESS) return Refused(r, "cuStreamWaitEvent");
  return Status::Ok();
}

Status CudaStream::DoHostCallback(device::HostCallback fn) {
  auto data = std::make_unique<CallbackData>(CallbackData{std::move(fn), state_, core_, this});
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuStreamAddCallback(stream_, &Trampoline, data.get(), 0);
  if (r == CUDA_SUCCESS) {
    data.release();  // the trampoline owns it now
    return Status::Ok();
  }
  // The stream can take no more work (its context failed): the callback still runs, on a thread
  // of its own, and receives the error.
  Status s = Refused(r, "cuStreamAddCallback");
  if (s.code() == StatusCode::kInvalidArgument) return s;
  std::thread([d = std::move(data), s] { d->fn(s); }).detach();
  return Status::Ok();
}

Status CudaStream::DoSynchronize(Deadline deadline) {
  if (tls_callback_stream == this)
    return InvalidArgument(fmt::format("{}: Synchronize from one of the stream's own host callbacks would wait for "
                                       "itself", device().label()));
  ScopedContext scope(core_->api, core_->ctx);
  bool timed_out = false;
  CUresult r = PollUntil([&] { return core_->api.cuStreamQuery(stream_); }, deadline, &timed_out);
  if (timed_out) return Timeout(fmt::format("{}: stream work unfinished at the deadline", device().label()));
  if (r != CUDA_SUCCESS) state_->Fail(CudaError(core_->api, r, fmt::format("{}: stream failed", device().label())));
  return state_->Get();
}

Result<bool> CudaStream::DoQuery() {
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuStreamQuery(stream_);
  if (r == CUDA_ERROR_NOT_READY) return false;
  if (r != CUDA_SUCCESS) state_->Fail(CudaError(core_->api, r, fmt::format("{}: stream failed", device().label())));
  KZ_RETURN_IF_ERROR(state_->Get());
  return true;
}

// ---- CudaEvent ----

CudaEvent::CudaEvent(CudaDevice* device, CUevent event) : Event(device), core_(device->core()), event_(event) {}

CudaEvent::~CudaEvent() {
  ScopedContext scope(core_->api, core_->ctx);
  core_->api.cuEventDestroy(event_);
}

Result<bool> CudaEvent::DoQuery() {
  ScopedContext scope(core_->api, core_->ctx);
  CUresult r = core_->api.cuEventQuery(event_);
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) return false;
  return CudaError(core_->api, r, fmt::format("{}: the work an event captured failed", device().label()));
}

Status CudaEvent::DoSynchronize(Deadline deadline) {
  ScopedContext scope(core_->api, core_->ctx);
  bool timed_out = false;
  CUresult r = PollUntil([&] { return core_->api.cuEventQuery(event_); }, deadline, &timed_out);
  if (timed_out) return Timeout(fmt::format("{}: event not complete at the deadline", device().label()));
  if (r != CUDA_SUCCESS)
    return CudaError(core_->api, r, fmt::format("{}: the work an event captured failed", device().label()));
  return Status::Ok();
}

}  // namespace kizuna::cuda
