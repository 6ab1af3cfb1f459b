#include "devices/level_zero/stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "runtime/core/dtype.h"
#include "runtime/device/host_reduce.h"
#include "runtime/core/logging.h"

namespace kizuna::level_zero {
namespace {

using Clock = Deadline::Clock;

// Drains poll the stream's event (zeEventQueryStatus) rather than block in
// zeEventHostSynchronize, inside which a driver may spin for the whole timeout: first kPollSpin of
// polls that yield the core, then sleeps growing from kPollSleepMin to kPollSleepMax (the cuda
// backend's waits), so an oversubscribed host keeps its cores and every wait has a deadline.
constexpr std::chrono::microseconds kPollSpin{200};
constexpr std::chrono::microseconds kPollSleepMin{10};
constexpr std::chrono::microseconds kPollSleepMax{200};

// ---- Events ----

// The completion of the work one Record captured; shared by the event (until re-recorded), the
// recording stream's queue and every stream or thread waiting for it.
struct EventState {
  std::atomic<bool> done{false};
  std::mutex mu;
  std::condition_variable cv;
  Status status;  // written once under mu before `done` is set; read after seeing `done`

  void Complete(Status s) {
    {
      std::lock_guard lock(mu);
      status = std::move(s);
      done.store(true, std::memory_order_release);
    }
    cv.notify_all();
  }
  bool WaitUntil(Clock::time_point deadline) {
    std::unique_lock lock(mu);
    cv.wait_until(lock, deadline, [&] { return done.load(std::memory_order_acquire); });
    return done.load(std::memory_order_acquire);
  }
};

class ZeEvent final : public device::Event {
 public:
  ZeEvent(device::Device* device, std::string label) : Event(device), label_(std::move(label)) {}
  const std::string& label() const { return label_; }

  std::shared_ptr<EventState> Captured() const {
    std::lock_guard lock(mu_);
    return state_;
  }
  std::shared_ptr<EventState> Rearm() {
    auto state = std::make_shared<EventState>();
    std::lock_guard lock(mu_);
    state_ = state;
    return state;
  }

 protected:
  Result<bool> DoQuery() override {
    const std::shared_ptr<EventState> state = Captured();
    if (state == nullptr) return true;
    if (!state->done.load(std::memory_order_acquire)) return false;
    if (!state->status.ok()) return state->status;
    return true;
  }
  Status DoSynchronize(Deadline deadline) override {
    const std::shared_ptr<EventState> state = Captured();
    if (state == nullptr) return Status::Ok();
    if (!state->WaitUntil(deadline.when()))
      return Timeout(fmt::format("{}: the recorded work is not complete at the deadline", label_));
    return state->status;
  }

 private:
  const std::string label_;
  mutable std::mutex mu_;
  std::shared_ptr<EventState> state_;  // guarded by mu_
};

// ---- Operations ----

struct CopyWork {
  void* dst;
  const void* src;
  size_t bytes;
};
struct ReduceWork {
  void* dst;
  std::vector<const void*> srcs;  // copied: the caller's span dies when the enqueue returns
  size_t count;
  DataType type;
  ReduceOp op;
};
struct ScaleWork {
  void* dst;
  const void* src;
  size_t count;
  DataType type;
  uint32_t divisor;
};
struct RecordWork {
  std::shared_ptr<EventState> state;
};
struct WaitWork {
  std::shared_ptr<EventState> state;
  std::string label;
};
struct CallbackWork {
  device::HostCallback fn;
};
using Op = std::variant<CopyWork, ReduceWork, ScaleWork, RecordWork, WaitWork, CallbackWork>;

// ---- The stream's core: everything the worker touches ----

// Owned jointly by the stream and its worker, so a worker that outlives its stream (destroyed
// from one of its own host callbacks) still runs on valid state.
class StreamCore {
 public:
  StreamCore(std::shared_ptr<DeviceCore> core, std::string label) : core_(std::move(core)), label_(std::move(label)) {}
  ~StreamCore() {
    const ZeApi& api = core_->api();
    if (staging_ != nullptr) api.zeMemFree(core_->ctx(), staging_);
    if (fence_ != nullptr) api.zeEventDestroy(fence_);
    if (pool_ != nullptr) api.zeEventPoolDestroy(pool_);
    if (list_ != nullptr) api.zeCommandListDestroy(list_);
  }
  StreamCore(const StreamCore&) = delete;
  StreamCore& operator=(const StreamCore&) = delete;

  const std::string& label() const { return label_; }

  // The command list and the one-event pool whose event marks a drain.
  Status Open() {
    const ZeApi& api = core_->api();
    ze_command_queue_desc_t queue{};
    queue.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
    queue.ordinal = core_->queue_ordinal;
    queue.index = 0;
    queue.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
    queue.priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL;
    ze_result_t r = api.zeCommandListCreateImmediate(core_->ctx(), core_->device, &queue, &list_);
    if (r != ZE_RESULT_SUCCESS) return ZeError(r, label_ + ": zeCommandListCreateImmediate");
    ze_event_pool_desc_t pool{};
    pool.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
    pool.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;
    pool.count = 1;
    ze_device_handle_t dev = core_->device;
    r = api.zeEventPoolCreate(core_->ctx(), &pool, 1, &dev, &pool_);
    if (r != ZE_RESULT_SUCCESS) return ZeError(r, label_ + ": zeEventPoolCreate");
    ze_event_desc_t event{};
    event.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
    event.index = 0;
    event.signal = ZE_EVENT_SCOPE_FLAG_HOST;
    event.wait = ZE_EVENT_SCOPE_FLAG_HOST;
    r = api.zeEventCreate(pool_, &event, &fence_);
    if (r != ZE_RESULT_SUCCESS) return ZeError(r, label_ + ": zeEventCreate");
    return Status::Ok();
  }

  // ---- Called by the stream (any thread) ----

  Status Enqueue(Op op) {
    {
      std::lock_guard lock(mu_);
      if (stop_) return Internal(fmt::format("{} is being destroyed", label_));
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
    return Status::Ok();
  }
  // true when nothing is queued, running or unfinished on the device; asks the worker for a
  // drain when only device work is left.
  Result<bool> Query() {
    std::unique_lock lock(mu_);
    if (!queue_.empty() || busy_) return false;
    if (dirty_.load(std::memory_order_acquire)) {
      if (!stop_) queue_.push_back(RecordWork{std::make_shared<EventState>()});
      lock.unlock();
      cv_.notify_all();
      return false;
    }
    if (!error_.ok()) return error_;
    return true;
  }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

  // ---- The worker ----

  void Run() {
    while (true) {
      Op op;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;  // stopped and drained
        op = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      Execute(op);
      {
        std::lock_guard lock(mu_);
        busy_ = false;
      }
    }
    // The list may only be destroyed once the device is done with it.
    if (Status s = Drain(); !s.ok()) KZ_WARN(kLogDevice, "{}: teardown: {}", label_, s.ToString());
  }

 private:
  Status Error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  void Fail(const Status& s) {
    std::lock_guard lock(mu_);
    if (error_.ok()) {
      error_ = s;
      KZ_INFO(kLogDevice, "{} failed: {}", label_, s.ToString());
    }
  }
  Deadline WaitDeadline() const { return Deadline::AfterSeconds(core_->timeout_s); }

  Status Append(ze_result_t r, std::string_view what) {
    if (r == ZE_RESULT_SUCCESS) return Status::Ok();
    return ZeError(r, fmt::format("{}: {}", label_, what));
  }
  // A copy, then a barrier: later commands of the list start after it.
  Status AppendCopy(void* dst, const void* src, size_t bytes) {
    const ZeApi& api = core_->api();
    KZ_RETURN_IF_ERROR(Append(api.zeCommandListAppendMemoryCopy(list_, dst, src, bytes, nullptr, 0, nullptr),
                              "zeCommandListAppendMemoryCopy"));
    dirty_.store(true, std::memory_order_release);
    return Append(api.zeCommandListAppendBarrier(list_, nullptr, 0, nullptr), "zeCommandListAppendBarrier");
  }
  // Waits until the device has finished everything appended so far.
  Status Drain() {
    if (!dirty_.load(std::memory_order_acquire)) return Status::Ok();
    const ZeApi& api = core_->api();
    KZ_RETURN_IF_ERROR(Append(api.zeCommandListAppendBarrier(list_, fence_, 0, nullptr), "zeCommandListAppendBarrier"));
    const Deadline deadline = WaitDeadline();
    const Clock::time_point spin_end = Clock::now() + kPollSpin;
    std::chrono::microseconds sleep = kPollSleepMin;
    while (true) {
      const ze_result_t r = api.zeEventQueryStatus(fence_);
      if (r == ZE_RESULT_SUCCESS) break;
      if (r != ZE_RESULT_NOT_READY) return ZeError(r, label_ + ": zeEventQueryStatus");
      if (deadline.Expired())
        return Timeout(fmt::format("{}: device work not complete after {} s (KIZUNA_TIMEOUT)", label_,
                                   core_->timeout_s));
      if (Clock::now() < spin_end) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, kPollSleepMax);
      }
    }
    KZ_RETURN_IF_ERROR(Append(api.zeEventHostReset(fence_), "zeEventHostReset"));
    dirty_.store(false, std::memory_order_release);
    return Status::Ok();
  }
  // Staging memory of at least `bytes` (the list must be drained: nothing in flight uses it).
  Status EnsureStaging(size_t bytes) {
    if (staging_bytes_ >= bytes) return Status::Ok();
    const ZeApi& api = core_->api();
    if (staging_ != nullptr) api.zeMemFree(core_->ctx(), staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    ze_host_mem_alloc_desc_t desc{};
    desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
    const ze_result_t r = api.zeMemAllocHost(core_->ctx(), &desc, bytes, 4096, &staging_);
    if (r != ZE_RESULT_SUCCESS) {
      staging_ = nullptr;
      return ZeError(r, fmt::format("{}: zeMemAllocHost of {} bytes of reduce staging", label_, bytes));
    }
    staging_bytes_ = bytes;
    return Status::Ok();
  }

  // dst[0..count) = reduce(srcs) through host memory, in chunks that fit kStagingBytes.
  Status StagedReduce(const ReduceWork& w) {
    const size_t esize = DataTypeSize(w.type);
    const size_t n = w.srcs.size();
    const size_t chunk_elems = std::max<size_t>(1, kStagingBytes / (n + 1) / esize);
    const size_t slot = std::min(chunk_elems, w.count) * esize;  // bytes per input in staging
    KZ_RETURN_IF_ERROR(Drain());
    KZ_RETURN_IF_ERROR(EnsureStaging(slot * (n + 1)));
    auto* staging = static_cast<uint8_t*>(staging_);
    std::vector<const void*> host_srcs(n);
    for (size_t k = 0; k < n; ++k) host_srcs[k] = staging + k * slot;
    uint8_t* host_dst = staging + n * slot;
    for (size_t begin = 0; begin < w.count; begin += chunk_elems) {
      const size_t m = std::min(chunk_elems, w.count - begin);
      const size_t off = begin * esize, bytes = m * esize;
      KZ_RETURN_IF_ERROR(Drain());  // the previous chunk's result has left the staging memory
      for (size_t k = 0; k < n; ++k)
        KZ_RETURN_IF_ERROR(AppendCopy(staging + k * slot, static_cast<const uint8_t*>(w.srcs[k]) + off, bytes));
      KZ_RETURN_IF_ERROR(Drain());
      KZ_RETURN_IF_ERROR(HostReduce(host_dst, host_srcs, m, w.type, w.op));
      KZ_RETURN_IF_ERROR(AppendCopy(static_cast<uint8_t*>(w.dst) + off, host_dst, bytes));
    }
    return Status::Ok();
  }
  Status StagedScale(const ScaleWork& w) {
    const size_t esize = DataTypeSize(w.type);
    const size_t chunk_elems = std::max<size_t>(1, kStagingBytes / esize);
    KZ_RETURN_IF_ERROR(Drain());
    KZ_RETURN_IF_ERROR(EnsureStaging(std::min(chunk_elems, w.count) * esize));
    auto* staging = static_cast<uint8_t*>(staging_);
    for (size_t begin = 0; begin < w.count; begin += chunk_elems) {
      const size_t m = std::min(chunk_elems, w.count - begin);
      const size_t off = begin * esize, bytes = m * esize;
      KZ_RETURN_IF_ERROR(Drain());
      KZ_RETURN_IF_ERROR(AppendCopy(staging, static_cast<const uint8_t*>(w.src) + off, bytes));
      KZ_RETURN_IF_ERROR(Drain());
      KZ_RETURN_IF_ERROR(HostScale(staging, staging, m, w.type, w.divisor));
      KZ_RETURN_IF_ERROR(AppendCopy(static_cast<uint8_t*>(w.dst) + off, staging, bytes));
    }
    return Status::Ok();
  }

  void Execute(Op& op) {
    if (auto* c = std::get_if<CopyWork>(&op)) {
      if (!Error().ok()) return;
      if (Status s = AppendCopy(c->dst, c->src, c->bytes); !s.ok()) Fail(s);
    } else if (auto* r = std::get_if<ReduceWork>(&op)) {
      if (!Error().ok()) return;
      if (Status s = StagedReduce(*r); !s.ok()) Fail(s);
    } else if (auto* sc = std::get_if<ScaleWork>(&op)) {
      if (!Error().ok()) return;
      if (Status s = StagedScale(*sc); !s.ok()) Fail(s);
    } else if (auto* rec = std::get_if<RecordWork>(&op)) {
      if (Error().ok())
        if (Status s = Drain(); !s.ok()) Fail(s);
      rec->state->Complete(Error());
    } else if (auto* w = std::get_if<WaitWork>(&op)) {
      if (!Error().ok()) return;
      if (!w->state->WaitUntil(WaitDeadline().when())) {
        Fail(Timeout(fmt::format("{}: waited {} s for {} (KIZUNA_TIMEOUT)", label_, core_->timeout_s, w->label)));
      } else if (!w->state->status.ok()) {
        Fail(w->state->status.WithContext(fmt::format("{} waited for {}", label_, w->label)));
      }
    } else if (auto* cb = std::get_if<CallbackWork>(&op)) {
      if (Error().ok())
        if (Status s = Drain(); !s.ok()) Fail(s);
      cb->fn(Error());
    }
  }

  const std::shared_ptr<DeviceCore> core_;
  const std::string label_;
  ze_command_list_handle_t list_ = nullptr;  // used by the worker only (after Open)
  ze_event_pool_handle_t pool_ = nullptr;
  ze_event_handle_t fence_ = nullptr;
  void* staging_ = nullptr;  // worker only
  size_t staging_bytes_ = 0;
  std::atomic<bool> dirty_{false};  // device work appended since the last drain (written by the worker)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;  // guarded by mu_
  bool busy_ = false;     // guarded by mu_: the worker is executing an operation
  bool stop_ = false;     // guarded by mu_
  Status error_;          // guarded by mu_: the sticky error
};

class ZeStream final : public device::Stream {
 public:
  ZeStream(ZeDevice* device, std::shared_ptr<StreamCore> core, double timeout_s)
      : Stream(device), core_(std::move(core)), timeout_s_(timeout_s) {}
  Status Start() {
    try {
      worker_ = std::thread([core = core_] { core->Run(); });
    } catch (const std::system_error& e) {
      return Internal(fmt::format("{}: cannot start the stream's worker thread: {}", core_->label(), e.what()));
    }
    return Status::Ok();
  }
  ~ZeStream() override {
    if (!worker_.joinable()) return;
    if (std::this_thread::get_id() == worker_.get_id()) {
      // Destroyed from one of its own host callbacks: the worker finishes the queue and the
      // teardown by itself, holding the core.
      core_->Stop();
      worker_.detach();
      return;
    }
    if (Status s = DoSynchronize(Deadline::AfterSeconds(timeout_s_)); s.code() == StatusCode::kTimeout) {
      KZ_WARN(kLogDevice, "{}: destroyed with work unfinished after {} s; the worker finishes it alone",
              core_->label(), timeout_s_);
      core_->Stop();
      worker_.detach();
      return;
    }
    core_->Stop();
    worker_.join();
  }

 protected:
  Status DoCopy(void* dst, const void* src, size_t bytes) override { return core_->Enqueue(CopyWork{dst, src, bytes}); }
  Status DoReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) override {
    return core_->Enqueue(ReduceWork{dst, std::vector<const void*>(srcs.begin(), srcs.end()), count, type, op});
  }
  Status DoScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) override {
    return core_->Enqueue(ScaleWork{dst, src, count, type, divisor});
  }
  Status DoRecord(device::Event& event) override {
    return core_->Enqueue(RecordWork{static_cast<ZeEvent&>(event).Rearm()});
  }
  Status DoWait(const device::Event& event) override {
    const auto& e = static_cast<const ZeEvent&>(event);
    std::shared_ptr<EventState> state = e.Captured();
    if (state == nullptr) return Status::Ok();  // never recorded: nothing to wait for
    return core_->Enqueue(WaitWork{std::move(state), e.label()});
  }
  Status DoHostCallback(device::HostCallback fn) override { return core_->Enqueue(CallbackWork{std::move(fn)}); }
  Status DoSynchronize(Deadline deadline) override {
    auto state = std::make_shared<EventState>();
    KZ_RETURN_IF_ERROR(core_->Enqueue(RecordWork{state}));
    if (!state->WaitUntil(deadline.when()))
      return Timeout(fmt::format("{}: work not complete at the deadline", core_->label()));
    return state->status;
  }
  Result<bool> DoQuery() override { return core_->Query(); }

 private:
  std::shared_ptr<StreamCore> core_;
  const double timeout_s_;
  std::thread worker_;
};

std::atomic<uint64_t> g_stream_ids{0};
std::atomic<uint64_t> g_event_ids{0};

}  // namespace

Result<std::unique_ptr<device::Stream>> MakeStream(ZeDevice* device, std::shared_ptr<DeviceCore> core) {
  const double timeout_s = core->timeout_s;
  auto stream_core = std::make_shared<StreamCore>(
      std::move(core), fmt::format("{} stream #{}", device->label(), g_stream_ids.fetch_add(1) + 1));
  KZ_RETURN_IF_ERROR(stream_core->Open());
  auto stream = std::make_unique<ZeStream>(device, std::move(stream_core), timeout_s);
  KZ_RETURN_IF_ERROR(stream->Start());
  return std::unique_ptr<device::Stream>(std::move(stream));
}

Result<std::unique_ptr<device::Event>> MakeEvent(ZeDevice* device) {
  return std::unique_ptr<device::Event>(
      new ZeEvent(device, fmt::format("{} event #{}", device->label(), g_event_ids.fetch_add(1) + 1)));
}

}  // namespace kizuna::level_zero
