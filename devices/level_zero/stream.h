// Streams and events of the Level Zero backend.
//
// A stream is an immediate command list (zeCommandListCreateImmediate, asynchronous mode, on the
// device's compute queue group) driven by one worker thread that takes the stream's operations in
// order:
//  - Copy appends zeCommandListAppendMemoryCopy and a barrier (zeCommandListAppendBarrier), so
//    later commands start after it: Level Zero does not promise that commands of one list run in
//    order without barriers or events. The worker does not wait for the copy.
//  - Reduce and Scale are staged through host memory (no SPIR-V kernels): the worker drains the
//    list, copies the inputs into the stream's zeMemAllocHost staging memory, drains, reduces
//    with the CPU (runtime/device/host_reduce.h, the code behind host_emulated's streams) and appends the
//    copy of the result back. Large operations go in chunks so that staging stays bounded
//    (kStagingBytes per stream). DeviceProperties::reduce_gbps tells the cost model this path's
//    throughput (properties.h).
//  - Record, host callbacks, Synchronize and Query drain the list first: the worker appends a
//    barrier that signals the stream's Level Zero event (a one-event host-visible event pool) and
//    polls it (zeEventQueryStatus: yields, then short sleeps), bounded by Config::timeout_s.
//  - A device::Event is the completion of the work one Record captured, host-side (as in
//    host_emulated): re-recording keeps earlier Waits on what they captured. Wait makes the
//    worker wait (bounded) before it appends later work, so an event may order streams of any
//    device of the backend.
//
// Errors: an append or a drain the driver fails, or a bounded wait that expires, becomes the
// stream's sticky error: later copies, reduces, scales and waits are skipped, host callbacks get
// the error, events recorded afterwards carry it, Synchronize and Query return it. A stream that
// waits on an event whose work failed takes that error.
//
// Destruction waits (bounded) for the queued work; a host callback may destroy its own stream (the
// worker then finishes the queue and the teardown on its own).
#pragma once

#include <memory>

#include "devices/level_zero/backend.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::level_zero {

// Host staging memory per stream for reduce and scale: operations larger than this go in chunks.
inline constexpr size_t kStagingBytes = size_t{64} << 20;

// A stream on `device` with its command list, event pool and worker thread. Errors of the driver
// calls as ZeError; kInternal when the thread cannot start.
Result<std::unique_ptr<device::Stream>> MakeStream(ZeDevice* device, std::shared_ptr<DeviceCore> core);

// An event on `device`; never recorded yet (queries report it complete).
Result<std::unique_ptr<device::Event>> MakeEvent(ZeDevice* device);

}  // namespace kizuna::level_zero
