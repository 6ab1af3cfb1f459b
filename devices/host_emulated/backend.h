// host_emulated: the CPU-emulated accelerator, so that the whole stack (collectives, fabrics,
// tools, tests) runs without a GPU. Registered in the device registry as "host_emulated".
//
// Devices are host-wide (README.md, "Devices"): KIZUNA_EMULATED_DEVICES=N describes N devices on the host,
// and device i has the same uuid in every process on the host ("emu-<host>-<boot id>-<i>"), so
// ranks in different processes can tell that they share a device. Each process still keeps its
// own memory budget and throttle timeline per device (see README.md, "Limits").
//
// Device memory is memfd-backed host memory (memory.h): host-accessible, exportable as a real fd
// that another process maps onto the same pages. With Config::emu_opaque (KIZUNA_EMU_OPAQUE=1)
// it is not host-accessible: device addresses fault on any CPU access, as GPU memory does, and
// Device::AllocateHost gives the host memory that bytes travel through (memory.h). Streams run on
// one worker thread each (stream.h). Properties:
//   backend "host_emulated", name "emulated accelerator <i>", memory_bytes KIZUNA_EMU_MEM_BYTES
//   (default: the host's physical memory), copy_gbps / reduce_gbps / launch_latency_us from the
//   KIZUNA_EMU_* throttles (0 when unthrottled), host_accessible (unless opaque), export_fd (never
//   export_opaque or export_dmabuf), numa_node when the host has a single NUMA node (otherwise -1:
//   pages land wherever they are first touched).
#pragma once

#include <memory>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated {

// Creates a backend instance with Config::emulated_devices devices. kUnavailable when that is 0
// ("disabled by KIZUNA_EMULATED_DEVICES=0"), kInvalidArgument when negative. `config` must
// outlive the backend; tests pass their own (faults, throttles, small timeouts).
//
// Counters for fault injection (KIZUNA_EMU_FAIL_ALLOC, KIZUNA_EMU_FAIL_STREAM_OP) are per backend
// instance. Every buffer, stream and event must be destroyed before the backend.
Result<std::unique_ptr<device::Backend>> CreateHostEmulatedBackend(const Config& config);

}  // namespace kizuna::host_emulated
