#include "devices/level_zero/properties.h"

#include <cstring>

#include <fmt/format.h>

namespace kizuna::level_zero {

std::string UuidText(const ze_device_uuid_t& uuid) {
  const uint8_t* b = uuid.id;
  return fmt::format(
      "ZE-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", b[0],
      b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

std::string PciBusIdText(const ze_pci_address_ext_t& a) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.device, a.function);
}

double PeakMemoryGbps(uint32_t clock_mhz, uint32_t bus_width_bits) {
  if (clock_mhz == 0 || bus_width_bits == 0) return 0;
  return 2.0 * clock_mhz * 1e6 * bus_width_bits / 8 / 1e9;
}

double StagingPcieGbps(const std::optional<ze_pci_ext_properties_t>& pci) {
  const double link =
      pci.has_value() && pci->maxSpeed.maxBandwidth > 0 ? static_cast<double>(pci->maxSpeed.maxBandwidth) / 1e9
                                                         : kDefaultPcieGbps;
  return link * kPcieEfficiency;
}

double StagedReduceGbps(double pcie_gbps, double host_reduce_gbps, int inputs) {
  if (!(pcie_gbps > 0) || !(host_reduce_gbps > 0) || inputs < 1) return 0;
  const double n = inputs;
  // Seconds per byte of one input (S = 1): n bytes down, n bytes reduced, 1 byte up.
  const double seconds = n / pcie_gbps + n / host_reduce_gbps + 1.0 / pcie_gbps;
  return n / seconds;
}

device::DeviceProperties TranslateProperties(const DeviceFacts& facts, int index) {
  device::DeviceProperties p;
  p.backend = "level_zero";
  p.index = index;
  p.name = std::string(facts.device.name, ::strnlen(facts.device.name, sizeof(facts.device.name)));
  if (p.name.empty()) p.name = fmt::format("Level Zero device {}", index);
  p.uuid = UuidText(facts.device.uuid);
  double peak_gbps = 0;
  for (const ze_device_memory_properties_t& m : facts.memories) {
    p.memory_bytes += m.totalSize;
    peak_gbps += PeakMemoryGbps(m.maxClockRate, m.maxBusWidth);
  }
  p.copy_gbps = peak_gbps * kStreamingEfficiency / 2;
  p.reduce_gbps = StagedReduceGbps(StagingPcieGbps(facts.pci), kHostReduceGbps);
  p.launch_latency_us = kLaunchLatencyUs;
  p.host_accessible = false;
  p.export_fd = false;
  p.export_opaque = facts.driver_ipc_memory;
  p.export_dmabuf = (facts.external.memoryAllocationExportTypes & ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF) != 0;
  if (facts.pci.has_value()) p.pci_bus_id = PciBusIdText(facts.pci->address);
  p.numa_node = facts.numa_node;
  return p;
}

}  // namespace kizuna::level_zero
