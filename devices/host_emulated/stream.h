// Streams and events of the emulated accelerator.
//
// Each stream owns one worker thread that executes an in-order queue of operations: copy
// (HostCopy), reduce (HostReduce), scale (HostScale), record event, wait event, host callback,
// hold. Enqueueing never blocks on the work; the worker does it.
//
// Contract beyond runtime/device/device.h:
//  - Sticky errors: the first failing operation's Status stays with the stream. Later copies,
//    reduces, scales and event waits are skipped; host callbacks still run and receive the
//    error; events recorded afterwards complete with it; Synchronize and Query return it.
//  - A stream that waits on an event whose captured work failed takes that error as its own
//    (its later work would read what the failed work did not write).
//  - Event waits on the worker are bounded by Config::timeout_s: on expiry the stream fails with
//    kTimeout naming the event. The event may belong to any emulated device (any backend
//    instance, even: the completion state is plain shared memory of this process).
//  - Record captures the work enqueued so far in a fresh completion state, so re-recording an
//    event behaves as in CUDA: earlier Waits keep waiting for what they captured.
//  - Fault injection: Config::emu_fail_stream_op = k fails the k-th copy / reduce / scale / host
//    callback enqueued on any stream of the backend instance (numbered from 1 at enqueue time,
//    so the choice is deterministic in program order) with kInternal "injected fault: stream
//    operation #k failed".
//  - Throttles: Config::emu_launch_us delays each copy, reduce, scale and host callback by that
//    much; emu_copy_gbps / emu_reduce_gbps make a copy (bytes copied) or a reduce or scale (bytes
//    of input read) last at least bytes / rate. The rate is shared by all streams of one device
//    (a device has one memory system): concurrent operations on a device queue for it.
//  - Holds (Stream::EnqueueHold) are native: the stream stops at a closed hold without a host
//    callback blocking the worker. A hold enqueued on an idle stream parks without waking the
//    worker, and the release of a hold the stream is stopped at completes it on the releasing
//    thread (a Synchronize waiter wakes from there; the worker only when work follows). Not
//    numbered for fault injection. Released at the latest when the StreamHold is destroyed;
//    dropped (released) when the stream is aborted.
//  - Waiting never burns a core: every wait spins for a few microseconds, then blocks.
//  - Opaque mode (memory.h): the worker translates every device address of a copy, reduce or
//    scale to the real mapping when the operation runs. An address whose memory is gone by then
//    (freed with the operation still queued, against the contract) fails the stream with
//    kInternal "illegal address" instead of touching whatever is mapped there now.
//  - Destruction waits (up to Config::timeout_s) for the queued work. If it does not finish, the
//    stream is aborted: queued copies, reduces and scales are dropped, queued events complete
//    with kAborted and queued host callbacks are called with kAborted on the destroying thread;
//    then the worker is joined (or, if it is stuck inside a host callback that ignores the
//    contract, left to finish on its own, holding only its own state).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "devices/host_emulated/memory.h"
#include "devices/host_emulated/pacer.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated {

class StreamCore;  // stream.cc: the state a stream shares with its worker thread

// The live streams of each device of one backend instance, for Config::emu_sync_free: freeing
// memory waits for the device's streams, as cudaFree waits for the GPU. Thread-safe; shared by
// the backend's streams and its memory (a buffer may be freed after the backend is gone).
class DeviceStreams {
 public:
  void Add(int device, std::weak_ptr<StreamCore> core);
  // Waits until every live stream of `device` has finished the work enqueued before this call,
  // except the calling thread's own stream (a host callback). A stream still busy at the deadline
  // fails with kTimeout naming `what` (on a GPU the free would hang there): the first such
  // error is returned, and the wait goes on to the other streams with what is left of the time.
  Status WaitForDevice(int device, Deadline deadline, std::string_view what);

 private:
  std::mutex mu_;
  std::vector<std::vector<std::weak_ptr<StreamCore>>> streams_;  // by device index; guarded by mu_
};

// Numbering shared by every stream and event of one backend instance. Thread-safe.
class StreamEnvironment {
 public:
  // `config` outlives this object (and every stream created with it).
  explicit StreamEnvironment(const Config& config) : config_(config) {}

  const Config& config() const { return config_; }
  const std::shared_ptr<DeviceStreams>& device_streams() const { return device_streams_; }
  // The backend-wide number (from 1) of the next copy / reduce / scale / host callback.
  uint64_t NextOperation() { return operations_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t NextStreamId() { return streams_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t NextEventId() { return events_.fetch_add(1, std::memory_order_relaxed) + 1; }

  // The live streams by native handle (Stream::native_handle: the address of the stream's core),
  // so that Device::AdoptStream takes only a handle that names one, never a stray pointer.
  struct Native {
    int device = 0;
    std::weak_ptr<StreamCore> core;
    std::thread::id worker;
  };
  void AddNative(void* handle, Native native);
  // The stream `handle` names, or nullopt when none lives (never was, or destroyed since).
  std::optional<Native> FindNative(void* handle);

 private:
  const Config& config_;
  std::mutex natives_mu_;
  std::unordered_map<void*, Native> natives_;  // guarded by natives_mu_
  size_t natives_pruned_at_ = 0;               // guarded by natives_mu_
  std::shared_ptr<DeviceStreams> device_streams_ = std::make_shared<DeviceStreams>();
  std::atomic<uint64_t> operations_{0};
  std::atomic<uint64_t> streams_{0};
  std::atomic<uint64_t> events_{0};
};

// A stream on `device` (an emulated device), with its worker thread started. `env` outlives the
// stream; the pacer is shared with the device's other streams. `translator` is the backend's
// memory in opaque mode (the worker translates device addresses through it and keeps it alive)
// and null otherwise (addresses are used as they are, with no lookup). kInternal when the thread
// cannot be started.
Result<std::unique_ptr<device::Stream>> MakeStream(device::Device* device, StreamEnvironment* env,
                                                   std::shared_ptr<DevicePacer> pacer,
                                                   std::shared_ptr<const MemoryManager> translator);

// A stream of `device` that works on the live stream `native` names (StreamEnvironment::Native):
// its work goes to that stream's worker, and destroying it leaves that stream alone.
// kInvalidArgument when `native` names no live stream, or one of another device.
Result<std::unique_ptr<device::Stream>> AdoptStream(device::Device* device, StreamEnvironment* env, void* native);

// An event on `device`; never recorded yet (queries report it complete).
Result<std::unique_ptr<device::Event>> MakeEvent(device::Device* device, StreamEnvironment* env);

}  // namespace kizuna::host_emulated
