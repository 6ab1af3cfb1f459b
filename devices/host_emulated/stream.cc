#include "devices/host_emulated/stream.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "devices/host_emulated/stream_ops.h"
#include "runtime/device/host_reduce.h"
#include "runtime/core/logging.h"

namespace kizuna::host_emulated {
namespace {

using namespace stream_internal;  // NOLINT(build/namespaces): this file runs what stream_ops.h describes


}  // namespace

// ---- The stream's shared core (outside the anonymous namespace: DeviceStreams, stream.h, names it) ----

struct StreamSettings {
  std::string label;  // "host_emulated:0 stream #1"
  double timeout_s = 600;
  nanoseconds launch{0};
  double copy_bytes_per_s = 0;    // 0: unthrottled
  double reduce_bytes_per_s = 0;  // 0: unthrottled
};

// Everything the worker thread touches. Owned jointly by the Stream and its worker, so a worker
// that outlives an aborted stream (stuck in a misbehaving host callback) still runs on valid
// state; it never touches the device or the backend.
class StreamCore {
 public:
  StreamCore(StreamSettings settings, std::shared_ptr<DevicePacer> pacer,
             std::shared_ptr<const MemoryManager> translator)
      : s_(std::move(settings)), pacer_(std::move(pacer)), translator_(std::move(translator)) {}

  const StreamSettings& settings() const { return s_; }

  void Enqueue(Op op) {
    bool wake;
    {
      std::lock_guard lock(mu_);
      // A hold on a stream with nothing to do parks at once, without waking the worker: it has
      // nothing to run until the hold opens (Open), and Open counts the hold complete itself.
      if (auto* gate = std::get_if<GateWork>(&op.work); gate != nullptr && queue_.empty() && worker_idle_ &&
                                                        parked_ == nullptr && !aborted_.load()) {
        enqueued_.fetch_add(1, std::memory_order_release);
        if (!gate->gate->open) {
          parked_ = std::move(gate->gate);
          return;
        }
        completed_.fetch_add(1, std::memory_order_release);
        return;
      }
      queue_.push_back(std::move(op));
      pending_.store(queue_.size(), std::memory_order_release);
      enqueued_.fetch_add(1, std::memory_order_release);
      wake = worker_idle_;
    }
    if (wake) wake_cv_.notify_one();
  }

  // Opens a hold (GateHold::Release). A hold the stream is parked at completes here, on the
  // caller's thread: whoever waits in Synchronize wakes at once, and the worker is woken only
  // when work is queued behind the hold. A hold not reached yet completes when the worker gets to
  // it. Idempotent.
  void Open(const std::shared_ptr<GateState>& gate) {
    bool notify_sync = false, wake = false;
    {
      std::lock_guard lock(mu_);
      if (gate->open) return;
      gate->open = true;
      if (parked_ != gate) return;
      parked_ = nullptr;
      completed_.fetch_add(1, std::memory_order_release);
      notify_sync = sync_waiters_ > 0;
      wake = !queue_.empty() && worker_idle_;
    }
    if (notify_sync) done_cv_.notify_all();
    if (wake) wake_cv_.notify_one();
  }

  // The worker thread's body: runs operations until Stop() and an empty queue.
  void Run() {
    tls_worker = this;
    Op op;
    Status sticky;
    while (Next(&op, &sticky)) {
      const bool parked = Park(op);
      if (!parked) Execute(op, sticky);
      op = Op{};  // drop captured callbacks and event states now, not at the next operation
      if (!parked) Finish();
    }
    {
      std::lock_guard lock(mu_);
      exited_ = true;
    }
    done_cv_.notify_all();
  }

  Status Synchronize(Deadline deadline) {
    const uint64_t target = enqueued_.load(std::memory_order_acquire);
    if (!WaitCompleted(target, deadline)) {
      std::lock_guard lock(mu_);
      const uint64_t unfinished = target - std::min(target, completed_.load(std::memory_order_relaxed));
      const std::string doing =
          waiting_on_ != nullptr ? fmt::format("; the stream is waiting for {}", waiting_on_->label) : "";
      return Timeout(fmt::format("{}: Synchronize reached its deadline with {} operation(s) unfinished{}", s_.label,
                                 unfinished, doing));
    }
    if (!failed_.load(std::memory_order_acquire)) return Status::Ok();
    std::lock_guard lock(mu_);
    return error_;
  }

  Result<bool> Query() {
    // Without a lock unless the stream failed: a fused operation asks this before every call.
    if (!failed_.load(std::memory_order_acquire))
      return completed_.load(std::memory_order_acquire) >= enqueued_.load(std::memory_order_acquire);
    std::lock_guard lock(mu_);
    return error_;
  }

  bool WaitDrained(Deadline deadline) { return WaitCompleted(enqueued_.load(std::memory_order_acquire), deadline); }

  // The stream's worker thread, when the caller is one (a host callback); else null.
  static const StreamCore* CurrentWorker() { return tls_worker; }

  // Drops every queued operation: events complete with `why`, callbacks are called with it (on
  // this thread); interrupts an event wait or throttle delay in progress.
  void Abort(const Status& why) {
    std::deque<Op> dropped;
    std::shared_ptr<EventState> waiting;
    {
      std::lock_guard lock(mu_);
      aborted_.store(true, std::memory_order_release);
      dropped.swap(queue_);
      pending_.store(0, std::memory_order_release);
      completed_.fetch_add(dropped.size(), std::memory_order_release);
      if (parked_ != nullptr) {  // a parked hold is dropped too: the stream goes on
        parked_->open = true;
        parked_ = nullptr;
        completed_.fetch_add(1, std::memory_order_release);
      }
      waiting = waiting_on_;
      if (error_.ok()) error_ = why;
      failed_.store(true, std::memory_order_release);
    }
    wake_cv_.notify_all();
    done_cv_.notify_all();
    if (waiting != nullptr) {
      // Taking the event's lock orders this notify after the worker's predicate check.
      { std::lock_guard lock(waiting->mu); }
      waiting->cv.notify_all();
    }
    for (Op& op : dropped) {
      if (auto* record = std::get_if<RecordWork>(&op.work)) record->event->Complete(why);
      if (auto* callback = std::get_if<CallbackWork>(&op.work)) RunCallback(callback->fn, why);
    }
  }

  // For DeviceStreams::WaitForDevice: how many operations were enqueued so far, waiting until as
  // many have completed, and failing the stream from outside (later work is skipped).
  uint64_t Enqueued() const { return enqueued_.load(std::memory_order_acquire); }
  uint64_t Completed() const { return completed_.load(std::memory_order_acquire); }
  bool WaitUntilCompleted(uint64_t target, Deadline deadline) { return WaitCompleted(target, deadline); }
  void FailFromOutside(const Status& status) { Fail(status); }

  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_cv_.notify_all();
  }

  bool WaitExited(Deadline deadline) {
    std::unique_lock lock(mu_);
    return done_cv_.wait_until(lock, deadline.when(), [this] { return exited_; });
  }

 private:
  // Takes the next operation and the stream's error as of now; false when stopped and drained.
  bool Next(Op* op, Status* sticky) {
    if (pending_.load(std::memory_order_acquire) == 0)
      SpinBriefly([this] { return pending_.load(std::memory_order_acquire) != 0; });
    std::unique_lock lock(mu_);
    // An idle worker has nothing to time out: Enqueue, Open and Stop wake it. Behind a parked
    // hold it waits for Open (or Abort): the hold's owner opens it at the latest when it drops
    // the hold (GateHold's destructor).
    while ((queue_.empty() || parked_ != nullptr) && !stopping_) {
      worker_idle_ = true;
      wake_cv_.wait(lock);
    }
    worker_idle_ = false;
    if (queue_.empty()) return false;
    *op = std::move(queue_.front());
    queue_.pop_front();
    pending_.store(queue_.size(), std::memory_order_release);
    *sticky = error_;
    return true;
  }

  // A hold the worker reached closed: the stream parks there (true), and Open completes it.
  bool Park(Op& op) {
    auto* gate = std::get_if<GateWork>(&op.work);
    if (gate == nullptr) return false;
    std::lock_guard lock(mu_);
    if (gate->gate->open || aborted_.load(std::memory_order_acquire)) return false;  // Finish counts it
    parked_ = std::move(gate->gate);
    return true;
  }

  void Finish() {
    bool notify;
    {
      std::lock_guard lock(mu_);
      completed_.fetch_add(1, std::memory_order_release);
      notify = sync_waiters_ > 0;
    }
    if (notify) done_cv_.notify_all();
  }

  bool WaitCompleted(uint64_t target, Deadline deadline) {
    auto drained = [&] { return completed_.load(std::memory_order_acquire) >= target; };
    if (SpinBriefly(drained)) return true;
    std::unique_lock lock(mu_);
    ++sync_waiters_;
    const bool done = done_cv_.wait_until(lock, deadline.when(), drained);
    --sync_waiters_;
    return done;
  }

  void Fail(const Status& status) {
    bool first;
    {
      std::lock_guard lock(mu_);
      first = error_.ok();
      if (first) error_ = status;
      failed_.store(true, std::memory_order_release);
    }
    if (first) KZ_WARN(kLogDevice, "{}: {}; later operations on this stream are skipped", s_.label, status.ToString());
  }

  Status InjectedFault(const Op& op) const {
    return Internal(fmt::format("injected fault: stream operation #{} failed ({} on {}; KIZUNA_EMU_FAIL_STREAM_OP={})",
                                op.number, OpName(op), s_.label, op.number));
  }

  void RunCallback(const HostCallback& fn, const Status& status) {
    // A callback is user code on a backend thread: an exception escaping it must become the
    // stream's error, not std::terminate.
    try {
      fn(status);
    } catch (const std::exception& e) {
      Fail(Internal(fmt::format("{}: host callback threw: {}", s_.label, e.what())));
    } catch (...) {
      Fail(Internal(fmt::format("{}: host callback threw a non-standard exception", s_.label)));
    }
  }

  void Execute(Op& op, const Status& sticky) {
    if (std::holds_alternative<GateWork>(op.work)) return;  // a hold found open: nothing to do
    if (auto* record = std::get_if<RecordWork>(&op.work)) {
      record->event->Complete(sticky);
      return;
    }
    if (auto* callback = std::get_if<CallbackWork>(&op.work)) {
      Status status = sticky;
      if (status.ok()) {
        Delay(s_.launch);
        if (op.inject_fault) {
          status = InjectedFault(op);
          Fail(status);
        }
      }
      RunCallback(callback->fn, status);
      return;
    }
    if (!sticky.ok()) return;  // copies, reduces, scales and waits after an error are skipped
    if (auto* wait = std::get_if<WaitWork>(&op.work)) {
      Status status = WaitFor(wait->event);
      if (!status.ok()) Fail(status);
      return;
    }
    Delay(s_.launch);
    if (op.inject_fault) {
      Fail(InjectedFault(op));
      return;
    }
    // Opaque memory: reach the bytes through their real mappings. (Null otherwise: the addresses
    // are the mappings, and the hot path looks nothing up.)
    if (translator_ != nullptr) {
      if (Status translated = Translate(op); !translated.ok()) {
        Fail(translated);
        return;
      }
    }
    Status status;
    try {
      if (auto* copy = std::get_if<CopyWork>(&op.work)) {
        status = Throttled(copy->bytes, s_.copy_bytes_per_s, [&] {
          HostCopy(copy->dst, copy->src, copy->bytes);
          return Status::Ok();
        });
      } else if (auto* reduce = std::get_if<ReduceWork>(&op.work)) {
        const size_t read = reduce->count * DataTypeSize(reduce->type) * reduce->srcs.size();
        status = Throttled(read, s_.reduce_bytes_per_s, [&] {
          if (reduce->more_dsts.empty())
            return HostReduce(reduce->dst, reduce->srcs, reduce->count, reduce->type, reduce->op);
          std::vector<void*> dsts{reduce->dst};
          dsts.insert(dsts.end(), reduce->more_dsts.begin(), reduce->more_dsts.end());
          return HostReduceMulti(dsts, reduce->srcs, reduce->count, reduce->type, reduce->op);
        });
      } else if (auto* scale = std::get_if<ScaleWork>(&op.work)) {
        // The arithmetic unit's rate, like a reduce: bytes of input read.
        const size_t read = scale->count * DataTypeSize(scale->type);
        status = Throttled(read, s_.reduce_bytes_per_s, [&] {
          return HostScale(scale->dst, scale->src, scale->count, scale->type, scale->divisor);
        });
      }
    } catch (const std::exception& e) {  // oneTBB may throw (e.g. std::bad_alloc)
      status = Internal(fmt::format("{} threw: {}", OpName(op), e.what()));
    }
    if (!status.ok()) Fail(status.WithContext(s_.label));
  }

  // Replaces every device address of a copy, reduce or scale with the address of its real
  // mapping, or says which one no longer has memory behind it. One overload per kind of work: an
  // operation added to Op without one does not compile, so none can slip past untranslated.
  Status Translate(Op& op) const {
    const std::string_view name = OpName(op);
    auto translate = [&](auto*& ptr, size_t bytes, std::string_view what) -> Status {
      void* real = translator_->Translate(ptr, bytes);
      if (real == nullptr)
        return Internal(fmt::format("{}: illegal address: {} {} (+{} bytes) of a {} is not live memory of this "
                                    "backend (freed before the operation ran?)",
                                    s_.label, what, static_cast<const void*>(ptr), bytes, name));
      ptr = static_cast<std::remove_reference_t<decltype(ptr)>>(real);
      return Status::Ok();
    };
    struct Translator {
      decltype(translate)& one;
      Status operator()(CopyWork& w) const {
        KZ_RETURN_IF_ERROR(one(w.dst, w.bytes, "destination"));
        return one(w.src, w.bytes, "source");
      }
      Status operator()(ReduceWork& w) const {
        const size_t bytes = w.count * DataTypeSize(w.type);
        KZ_RETURN_IF_ERROR(one(w.dst, bytes, "output"));
        for (void*& dst : w.more_dsts) KZ_RETURN_IF_ERROR(one(dst, bytes, "output"));
        for (const void*& src : w.srcs) KZ_RETURN_IF_ERROR(one(src, bytes, "input"));
        return Status::Ok();
      }
      Status operator()(ScaleWork& w) const {
        const size_t bytes = w.count * DataTypeSize(w.type);
        KZ_RETURN_IF_ERROR(one(w.dst, bytes, "output"));
        return one(w.src, bytes, "input");
      }
      // No device memory in these.
      Status operator()(RecordWork&) const { return Status::Ok(); }
      Status operator()(WaitWork&) const { return Status::Ok(); }
      Status operator()(CallbackWork&) const { return Status::Ok(); }
      Status operator()(GateWork&) const { return Status::Ok(); }
    };
    return std::visit(Translator{translate}, op.work);
  }

  // Runs `work`, then holds the operation until the device's throttled memory time for `bytes`
  // has passed on the device's timeline (DevicePacer::Occupy: in turns with other streams).
  template <typename Work>
  Status Throttled(size_t bytes, double bytes_per_s, Work&& work) {
    if (bytes_per_s <= 0) return work();
    return pacer_->Occupy(ToNanos(static_cast<double>(bytes) / bytes_per_s), std::forward<Work>(work),
                          [this](Clock::time_point t) { SleepUntil(t); });
  }

  Status WaitFor(const std::shared_ptr<EventState>& event) {
    if (!event->done.load(std::memory_order_acquire)) {
      {
        std::lock_guard lock(mu_);
        waiting_on_ = event;
      }
      const bool done = event->WaitUntil(Deadline::AfterSeconds(s_.timeout_s).when(), &aborted_);
      {
        std::lock_guard lock(mu_);
        waiting_on_.reset();
      }
      if (!done) {
        if (aborted_.load(std::memory_order_acquire))
          return Aborted(fmt::format("{}: destroyed while waiting for {}", s_.label, event->label));
        return Timeout(fmt::format("{}: waiting for {} timed out after {} s (KIZUNA_TIMEOUT)", s_.label, event->label,
                                   s_.timeout_s));
      }
    }
    if (!event->status.ok())
      return Status(event->status.code(), fmt::format("{}: waited for {}, whose work failed: {}", s_.label,
                                                      event->label, event->status.message()));
    return Status::Ok();
  }

  void Delay(nanoseconds d) {
    if (d.count() > 0) SleepUntil(Clock::now() + d);
  }

  // Sleeps (blocking) or, for the last few tens of microseconds, spins until `t`; an abort cuts
  // the wait short.
  void SleepUntil(Clock::time_point t) {
    for (;;) {
      const Clock::time_point now = Clock::now();
      if (now >= t || aborted_.load(std::memory_order_acquire)) return;
      if (t - now > kSleepThreshold) {
        std::unique_lock lock(mu_);
        wake_cv_.wait_until(lock, t, [this] { return aborted_.load(std::memory_order_acquire); });
      } else {
        CpuRelax();
      }
    }
  }

  const StreamSettings s_;
  const std::shared_ptr<DevicePacer> pacer_;
  const std::shared_ptr<const MemoryManager> translator_;  // opaque mode only; null otherwise

  std::mutex mu_;
  std::condition_variable wake_cv_;  // the worker waits here: new work, Stop, Abort, throttle delays
  std::condition_variable done_cv_;  // Synchronize and the destructor wait here: progress, exit
  std::deque<Op> queue_;             // guarded by mu_
  Status error_;                     // guarded by mu_; the first failure, sticky
  // Set with error_, before the failed operation counts as completed: clear means error_ is ok.
  std::atomic<bool> failed_{false};
  std::shared_ptr<EventState> waiting_on_;  // guarded by mu_; the event the worker waits for now
  std::shared_ptr<GateState> parked_;       // guarded by mu_; the closed hold the stream stops at
  int sync_waiters_ = 0;                    // guarded by mu_
  bool worker_idle_ = false;                // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  bool exited_ = false;                     // guarded by mu_
  // Written under mu_, read without it by the spinning waiters.
  std::atomic<uint64_t> enqueued_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<size_t> pending_{0};  // queue_.size()
  std::atomic<bool> aborted_{false};

  static thread_local const StreamCore* tls_worker;
};

thread_local const StreamCore* StreamCore::tls_worker = nullptr;

namespace {

// ---- Stream ----

// Opens its gate when released, at the latest when destroyed.
class GateHold final : public device::StreamHold {
 public:
  GateHold(std::shared_ptr<StreamCore> core, std::shared_ptr<GateState> gate)
      : core_(std::move(core)), gate_(std::move(gate)) {}
  ~GateHold() override { Release(); }
  void Release() override { core_->Open(gate_); }

 private:
  std::shared_ptr<StreamCore> core_;
  std::shared_ptr<GateState> gate_;
};

class EmuStream final : public device::Stream {
 public:
  EmuStream(device::Device* device, StreamEnvironment* env, std::shared_ptr<StreamCore> core)
      : Stream(device), env_(env), core_(std::move(core)) {}
  // An adopted stream (AdoptStream): the core of a stream another object owns, whose worker
  // (`worker`) it enqueues to; no worker of its own, so destroying it stops nothing.
  EmuStream(device::Device* device, StreamEnvironment* env, std::shared_ptr<StreamCore> core, std::thread::id worker)
      : Stream(device), env_(env), core_(std::move(core)), worker_id_(worker) {}

  std::thread::id worker_id() const { return worker_id_; }

  Status Start(const std::string& thread_name) {
    try {
      worker_ = std::thread([core = core_] { core->Run(); });
    } catch (const std::system_error& e) {
      return Internal(fmt::format("{}: cannot start its worker thread: {}", core_->settings().label, e.what()));
    }
    worker_id_ = worker_.get_id();
    // Named for debuggers and top; the kernel allows 15 characters.
    pthread_setname_np(worker_.native_handle(), thread_name.substr(0, 15).c_str());
    return Status::Ok();
  }

  ~EmuStream() override {
    if (!worker_.joinable()) return;
    const std::string& label = core_->settings().label;
    if (OnWorker()) {
      // Destroyed from its own host callback: the worker cannot join itself. It finishes the
      // queue on the shared core and exits.
      core_->Stop();
      worker_.detach();
      return;
    }
    const double timeout_s = core_->settings().timeout_s;
    if (!core_->WaitDrained(Deadline::AfterSeconds(timeout_s))) {
      KZ_WARN(kLogDevice, "{}: destroyed with work unfinished after {} s (KIZUNA_TIMEOUT); aborting that work", label,
              timeout_s);
      core_->Abort(Aborted(fmt::format("{} was destroyed before this work ran", label)));
    }
    core_->Stop();
    if (core_->WaitExited(Deadline::AfterSeconds(timeout_s))) {
      worker_.join();
    } else {
      KZ_WARN(kLogDevice, "{}: worker still inside a host callback after {} s; leaving it to finish on its own", label,
              timeout_s);
      worker_.detach();
    }
  }

 protected:
  Status DoCopy(void* dst, const void* src, size_t bytes) override {
    EnqueueNumbered(Op{CopyWork{dst, src, bytes}});
    return Status::Ok();
  }

  Status DoReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) override {
    EnqueueNumbered(Op{ReduceWork{dst, std::vector<const void*>(srcs.begin(), srcs.end()), count, type, op}});
    return Status::Ok();
  }

  // One pass writing every output (HostReduceMulti), instead of the default reduce-then-copy.
  Status DoReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                       ReduceOp op) override {
    EnqueueNumbered(Op{ReduceWork{dsts[0], std::vector<const void*>(srcs.begin(), srcs.end()), count, type, op,
                                  std::vector<void*>(dsts.begin() + 1, dsts.end())}});
    return Status::Ok();
  }

  Status DoScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) override {
    EnqueueNumbered(Op{ScaleWork{dst, src, count, type, divisor}});
    return Status::Ok();
  }

  Status DoRecord(device::Event& event) override {
    auto* mine = dynamic_cast<EmuEvent*>(&event);
    if (mine == nullptr) return InvalidArgument(fmt::format("{}: event is not a host_emulated event", label()));
    core_->Enqueue(Op{RecordWork{mine->Rearm()}});
    return Status::Ok();
  }

  Status DoWait(const device::Event& event) override {
    const auto* mine = dynamic_cast<const EmuEvent*>(&event);
    if (mine == nullptr) return InvalidArgument(fmt::format("{}: event is not a host_emulated event", label()));
    std::shared_ptr<EventState> state = mine->Captured();
    if (state == nullptr) return Status::Ok();  // never recorded: nothing to wait for
    if (state->done.load(std::memory_order_acquire) && state->status.ok()) return Status::Ok();
    core_->Enqueue(Op{WaitWork{std::move(state)}});
    return Status::Ok();
  }

  Status DoHostCallback(HostCallback fn) override {
    EnqueueNumbered(Op{CallbackWork{std::move(fn)}});
    return Status::Ok();
  }

  // A hold native to the stream: the worker stops at it without occupying a host callback, and
  // releasing it completes it on the releasing thread when the stream waits there (no hand-off to
  // the worker and back when nothing follows it). Not numbered for fault injection: it is no
  // device work.
  Result<std::unique_ptr<device::StreamHold>> DoEnqueueHold() override {
    auto gate = std::make_shared<GateState>();
    core_->Enqueue(Op{GateWork{gate}});
    return std::unique_ptr<device::StreamHold>(new GateHold(core_, std::move(gate)));
  }

  Status DoSynchronize(Deadline deadline) override {
    if (OnWorker())
      return InvalidArgument(fmt::format("{}: Synchronize called from one of its own host callbacks would wait for "
                                         "itself",
                                         label()));
    return core_->Synchronize(deadline);
  }

  Result<bool> DoQuery() override { return core_->Query(); }
  std::optional<uint64_t> DoCompleted() const override { return core_->Completed(); }
  void* DoNativeHandle() const override { return core_.get(); }

 private:
  const std::string& label() const { return core_->settings().label; }
  bool OnWorker() const { return std::this_thread::get_id() == worker_id_; }

  // Copies, reduces, scales and host callbacks get the backend-wide number fault injection counts.
  void EnqueueNumbered(Op op) {
    op.number = env_->NextOperation();
    const std::optional<uint64_t>& fail = env_->config().emu_fail_stream_op;
    op.inject_fault = fail.has_value() && op.number == *fail;
    core_->Enqueue(std::move(op));
  }

  StreamEnvironment* env_;
  std::shared_ptr<StreamCore> core_;
  std::thread worker_;
  std::thread::id worker_id_;  // the worker this stream enqueues to (its own, or an adopted stream's)
};

}  // namespace

// ---- Public ----

void DeviceStreams::Add(int device, std::weak_ptr<StreamCore> core) {
  std::lock_guard lock(mu_);
  if (device < 0) return;
  if (streams_.size() <= static_cast<size_t>(device)) streams_.resize(static_cast<size_t>(device) + 1);
  auto& list = streams_[static_cast<size_t>(device)];
  std::erase_if(list, [](const std::weak_ptr<StreamCore>& w) { return w.expired(); });
  list.push_back(std::move(core));
}

Status DeviceStreams::WaitForDevice(int device, Deadline deadline, std::string_view what) {
  // The streams and how far each had got when the free was called; waited for outside the lock.
  std::vector<std::pair<std::shared_ptr<StreamCore>, uint64_t>> busy;
  {
    std::lock_guard lock(mu_);
    if (device < 0 || static_cast<size_t>(device) >= streams_.size()) return Status::Ok();
    for (const std::weak_ptr<StreamCore>& w : streams_[static_cast<size_t>(device)]) {
      std::shared_ptr<StreamCore> core = w.lock();
      if (core == nullptr || core.get() == StreamCore::CurrentWorker()) continue;
      busy.emplace_back(std::move(core), 0);
    }
  }
  for (auto& [core, target] : busy) target = core->Enqueued();
  Status first;
  for (auto& [core, target] : busy) {
    if (core->WaitUntilCompleted(target, deadline)) continue;
    Status s = Timeout(fmt::format("{}: {} waited for this stream's earlier work, which did not finish by the "
                                   "deadline (KIZUNA_EMU_SYNC_FREE: freeing memory waits for the device's streams, as "
                                   "cudaFree does; on a GPU this free would hang)",
                                   core->settings().label, what));
    core->FailFromOutside(s);
    if (first.ok()) first = s;
  }
  return first;
}

Result<std::unique_ptr<device::Stream>> MakeStream(device::Device* device, StreamEnvironment* env,
                                                   std::shared_ptr<DevicePacer> pacer,
                                                   std::shared_ptr<const MemoryManager> translator) {
  const Config& config = env->config();
  const uint64_t id = env->NextStreamId();
  StreamSettings settings;
  settings.label = fmt::format("{} stream #{}", device->label(), id);
  settings.timeout_s = config.timeout_s;
  settings.launch = ToNanos(config.emu_launch_us.value_or(0.0) * 1e-6);
  // The device's own throttles: the backend's, times its KIZUNA_EMU_SPEED_FACTORS entry.
  settings.copy_bytes_per_s = device->properties().copy_gbps * 1e9;
  settings.reduce_bytes_per_s = device->properties().reduce_gbps * 1e9;
  auto core = std::make_shared<StreamCore>(std::move(settings), std::move(pacer), std::move(translator));
  if (config.emu_sync_free) env->device_streams()->Add(device->properties().index, core);
  StreamCore* native = core.get();
  std::weak_ptr<StreamCore> weak = core;
  auto stream = std::make_unique<EmuStream>(device, env, std::move(core));
  KZ_RETURN_IF_ERROR(stream->Start(fmt::format("kz-emu{}-s{}", device->properties().index, id)));
  env->AddNative(native, StreamEnvironment::Native{device->properties().index, std::move(weak), stream->worker_id()});
  KZ_TRACE(kLogDevice, "{} stream #{} created", device->label(), id);
  return std::unique_ptr<device::Stream>(std::move(stream));
}

Result<std::unique_ptr<device::Stream>> AdoptStream(device::Device* device, StreamEnvironment* env, void* native) {
  if (native == nullptr) return InvalidArgument(fmt::format("{}: the native stream to adopt is null", device->label()));
  std::optional<StreamEnvironment::Native> found = env->FindNative(native);
  std::shared_ptr<StreamCore> core = found ? found->core.lock() : nullptr;
  if (core == nullptr)
    return InvalidArgument(fmt::format("{}: {} is not a live stream of this backend (Stream::native_handle gives one)",
                                       device->label(), native));
  if (found->device != device->properties().index)
    return InvalidArgument(fmt::format("{}: native stream {} belongs to {} device {}", device->label(), native,
                                       device->properties().backend, found->device));
  return std::unique_ptr<device::Stream>(std::make_unique<EmuStream>(device, env, std::move(core), found->worker));
}

Result<std::unique_ptr<device::Event>> MakeEvent(device::Device* device, StreamEnvironment* env) {
  return std::unique_ptr<device::Event>(
      std::make_unique<EmuEvent>(device, fmt::format("{} event #{}", device->label(), env->NextEventId())));
}

}  // namespace kizuna::host_emulated
