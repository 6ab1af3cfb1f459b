// The cost model's constants as a table (cost_model.h): names, units and where each default
// comes from, and the "name=value,..." form that kizuna-plan --cost reads.
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

#include "collectives/cost/model.h"

namespace kizuna::collectives {
namespace {

constexpr std::array<CostConstantInfo, 12> kConstantTable = {{
    {"unknown_link_latency_us", "us", "directconnect 8-byte one-way latency, 1.12-1.16 us (PERFORMANCE.md)",
     &CostConstants::unknown_link_latency_us},
    {"unknown_link_gbps", "GB/s", "directconnect single-copy bandwidth, 25.3 GB/s at 1 MiB (PERFORMANCE.md)",
     &CostConstants::unknown_link_gbps},
    {"unknown_copy_gbps", "GB/s", "kizuna-demo copy on host_emulated:0, 28.1 GB/s (PERFORMANCE.md)",
     &CostConstants::unknown_copy_gbps},
    {"unknown_reduce_gbps", "GB/s", "kizuna-demo 2-input sum on host_emulated:0, 42.9 GB/s (PERFORMANCE.md)",
     &CostConstants::unknown_reduce_gbps},
    {"unknown_launch_us", "us", "H100 tiny kernel launch, 4.2 us (DESIGN.md section 10)",
     &CostConstants::unknown_launch_us},
    {"message_overhead_us", "us", "estimate, not measured yet: executor work per message",
     &CostConstants::message_overhead_us},
    {"step_overhead_us", "us", "estimate, not measured yet: executor work per plan step",
     &CostConstants::step_overhead_us},
    {"staging_copy_max_gbps", "GB/s", "H100 pinned host<->device copy, 55 GB/s per direction (DESIGN.md section 10)",
     &CostConstants::staging_copy_max_gbps},
    {"direct_rendezvous_us", "us", "estimate, not measured yet: fused's two in-process rendezvous and stream sync",
     &CostConstants::direct_rendezvous_us},
    {"oneshot_us", "us",
     "one-shot AllReduce (and Barrier) through shared pages between processes (SameHostGroup::RunOneShot): 0.34-0.55 us "
     "measured at 2 ranks, 8 B (RACE.md), the upper end",
     &CostConstants::oneshot_us},
    {"oversubscribed_wake_us", "us",
     "per thread beyond a host's CPUs and rendezvous: 8-byte AllReduce, 4 and 8 processes on 2 CPUs, 14-48 us "
     "(RACE.md)",
     &CostConstants::oversubscribed_wake_us},
    {"host_memory_gbps", "GB/s",
     "memory traffic of a host's emulated devices together: the race ceiling's fused pass over 8 x 256 MiB, 45 GB/s",
     &CostConstants::host_memory_gbps},
}};

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

std::span<const CostConstantInfo> CostConstantTable() { return kConstantTable; }

std::string CostConstantsToString(const CostConstants& constants) {
  std::string out;
  for (const CostConstantInfo& c : kConstantTable)
    out += fmt::format("{}{}={}", out.empty() ? "" : ",", c.name, constants.*c.field);
  return out;
}

Result<CostConstants> ParseCostConstants(std::string_view text, CostConstants base) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string item = Trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return InvalidArgument(fmt::format("cost constants: '{}' is not name=value", item));
    const std::string name = Trim(std::string_view(item).substr(0, eq));
    const std::string value = Trim(std::string_view(item).substr(eq + 1));
    const CostConstantInfo* info = nullptr;
    for (const CostConstantInfo& c : kConstantTable)
      if (c.name == name) info = &c;
    if (info == nullptr) {
      std::string known;
      for (const CostConstantInfo& c : kConstantTable) known += fmt::format("{}{}", known.empty() ? "" : ", ", c.name);
      return InvalidArgument(fmt::format("cost constants: unknown constant '{}' (known: {})", name, known));
    }
    double v = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(v) || v < 0)
      return InvalidArgument(
          fmt::format("cost constants: '{}': expected a finite, non-negative number of {}", item, info->unit));
    if (info->unit == "GB/s" && v == 0)
      return InvalidArgument(fmt::format("cost constants: '{}': a speed must be positive", item));
    base.*info->field = v;
  }
  return base;
}

}  // namespace kizuna::collectives
