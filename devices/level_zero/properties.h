// What a Level Zero device reports, translated into device::DeviceProperties: pure functions, no
// driver calls, so the translation is unit-tested on machines without a driver (properties_test).
//
// The cost model reads copy_gbps, reduce_gbps and launch_latency_us. The backend reduces on the
// host (stream.h: inputs copied to host memory, reduced by the CPU, the result copied back), so
// reduce_gbps is that staged path's throughput, far below the device's memory bandwidth: the
// engine must not believe the device reduces at HBM speed.
#pragma once

#include <level_zero/ze_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/device/device.h"

namespace kizuna::level_zero {

// Share of the memory's peak a streaming copy reaches; the cuda backend's figure (3.0 of 3.35 TB/s
// on an H100, docs/PERFORMANCE.md). Not yet measured on an Intel GPU.
inline constexpr double kStreamingEfficiency = 0.9;
// Share of the PCIe link's theoretical bandwidth a pinned host <-> device copy reaches: 55 of
// 63 GB/s on the H100's PCIe 5.0 x16 (docs/PERFORMANCE.md, "CUDA backend on an H100").
inline constexpr double kPcieEfficiency = 0.87;
// The link assumed when the driver does not report one (zeDevicePciGetPropertiesExt missing or
// maxBandwidth -1): PCIe 4.0 x16, 31.5 GB/s theoretical, the link of current Intel data-center
// GPUs' hosts.
inline constexpr double kDefaultPcieGbps = 31.5;
// The CPU reduce the staged path runs (runtime/device/host_reduce.h, multi-threaded): a 2-input float32
// sum on host_emulated measured 42.9 GB/s of input read (docs/PERFORMANCE.md; the same figure is
// the cost model's unknown_reduce_gbps).
inline constexpr double kHostReduceGbps = 43.0;
// Cost of one stream operation: an append to an immediate command list plus the barrier that
// keeps the stream in order. Unmeasured estimate (no driver here), above the 4.2 us kernel launch
// measured on an H100; replace with a kizuna-device-bench figure.
inline constexpr double kLaunchLatencyUs = 10.0;

// Everything the backend gathered about one device from the driver.
struct DeviceFacts {
  ze_device_properties_t device{};                         // zeDeviceGetProperties
  std::vector<ze_device_memory_properties_t> memories;     // zeDeviceGetMemoryProperties
  std::optional<ze_pci_ext_properties_t> pci;              // zeDevicePciGetPropertiesExt, when it answered
  ze_device_external_memory_properties_t external{};       // zeDeviceGetExternalMemoryProperties
  bool driver_ipc_memory = false;                          // zeDriverGetIpcProperties: ZE_IPC_PROPERTY_FLAG_MEMORY
  int numa_node = -1;                                      // from sysfs, by PCI address
};

// "ZE-0011...": the 16 uuid bytes as 8-4-4-4-12 lower-case hex groups, prefixed "ZE-". The driver
// gives the same uuid to the same device in every process on the host.
std::string UuidText(const ze_device_uuid_t& uuid);

// "0000:3a:00.0" (domain:bus:device.function, lower-case hex, as Linux's sysfs names the device).
std::string PciBusIdText(const ze_pci_address_ext_t& address);

// Peak bandwidth of one memory in GB/s: maxClockRate (MHz) x 2 (double data rate, the cuda
// backend's formula) x maxBusWidth (bits) / 8. 0 when either is unknown (0).
double PeakMemoryGbps(uint32_t clock_mhz, uint32_t bus_width_bits);

// The PCIe bandwidth host staging gets, GB/s each way: the reported maxBandwidth (bytes/s) or
// kDefaultPcieGbps, times kPcieEfficiency.
double StagingPcieGbps(const std::optional<ze_pci_ext_properties_t>& pci);

// Throughput of the host-staged reduce of `inputs` inputs of S bytes each, in bytes of input read
// per second / 1e9 (DeviceProperties::reduce_gbps): the inputs cross PCIe to the host (inputs x S),
// the CPU reads them (inputs x S at host_reduce_gbps), the result crosses back (S), one after the
// other: inputs x S / (inputs x S / pcie + inputs x S / host + S / pcie). 0 for a non-positive rate.
double StagedReduceGbps(double pcie_gbps, double host_reduce_gbps, int inputs = 2);

// The properties of device `index` of the backend: name, uuid, memory (the sum of every memory
// module), PCI bus id and NUMA node when known, copy_gbps from the memories' peak x
// kStreamingEfficiency / 2 (a copy reads and writes), reduce_gbps from StagedReduceGbps (two
// inputs, kHostReduceGbps), launch_latency_us kLaunchLatencyUs, host_accessible false,
// export_opaque when the driver supports memory IPC, export_dmabuf when allocations can be
// exported as DMA-BUF (ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF among the allocation export types),
// export_fd false (the IPC handle is the opaque form; DMA-BUF is for NICs).
device::DeviceProperties TranslateProperties(const DeviceFacts& facts, int index);

}  // namespace kizuna::level_zero
