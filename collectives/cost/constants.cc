// The cost model's constants (model.h): the one table that gives each constant its name, unit,
// default value and the reason for that value, the constructor of CostConstants that applies the
// defaults, and the "name=value,..." form that kizuna-plan --cost reads. The measurements behind
// the reasons, with machine, date and command: docs/PERFORMANCE.md, "Where the cost model's
// constants come from".
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

#include "collectives/cost/model.h"

namespace kizuna::collectives {
namespace {

constexpr std::array<CostConstantInfo, 16> kConstantTable = {{
    {"unknown_link_latency_us", "us", 1.1,
     "directconnect's 8-byte one-way latency, 1.12-1.16 us median (kizuna-p2p), its software path included",
     &CostConstants::unknown_link_latency_us},
    {"unknown_link_gbps", "GB/s", 25.0,
     "directconnect's single copy, 25.3 GB/s at 1 MiB (kizuna-p2p); also a 200 Gb/s NIC",
     &CostConstants::unknown_link_gbps},
    {"unknown_copy_gbps", "GB/s", 28.0, "kizuna-demo's copy on host_emulated:0, 28.1 GB/s (the slower device)",
     &CostConstants::unknown_copy_gbps},
    {"unknown_reduce_gbps", "GB/s", 43.0, "kizuna-demo's 2-input sum on host_emulated:0, 42.9 GB/s (the slower device)",
     &CostConstants::unknown_reduce_gbps},
    {"unknown_launch_us", "us", 4.2,
     "a tiny kernel launch on the H100 (docs/PERFORMANCE.md, the CUDA backend on an H100), the only one measured",
     &CostConstants::unknown_launch_us},
    {"message_overhead_us", "us", 0.5, "estimate, not measured yet: executor work per message beyond the fabric's",
     &CostConstants::message_overhead_us},
    {"step_overhead_us", "us", 0.2, "estimate, not measured yet: executor work per plan step",
     &CostConstants::step_overhead_us},
    {"staging_copy_max_gbps", "GB/s", 55.0,
     "H100 pinned host<->device copy per direction (docs/PERFORMANCE.md, the CUDA backend on an H100); emulated "
     "devices are below it",
     &CostConstants::staging_copy_max_gbps},
    {"direct_rendezvous_us", "us", 20.0,
     "estimate, not measured yet: fused's two in-process rendezvous and stream sync",
     &CostConstants::direct_rendezvous_us},
    {"oneshot_us", "us", 0.55, "one-shot AllReduce between 2 processes, 8 B: the upper end of 0.34-0.55 us (RACE.md)",
     &CostConstants::oneshot_us},
    {"oversubscribed_wake_us", "us", 8.0,
     "8-byte AllReduce on 2 CPUs: 7-14 us per thread beyond them at 4 processes, 8 us at 8 (RACE.md)",
     &CostConstants::oversubscribed_wake_us},
    {"handoff_wake_us", "us", 8.0,
     "as oversubscribed_wake_us until measured apart: a stage's hand-offs to the executor's and streams' threads",
     &CostConstants::handoff_wake_us},
    {"relay_us", "us", 80.0,
     "Send/Recv between 4 namespace hosts on a 2 x 2 torus of cables, 2 CPUs: 504-555 us where the pair is "
     "forwarded, 391-475 us between neighbours (docs/PERFORMANCE.md)",
     &CostConstants::relay_us},
    {"host_memory_gbps", "GB/s", 50.0,
     "a host's emulated devices together: the race ceiling's fused pass 45 GB/s, its copy 52-113 GB/s (RACE.md)",
     &CostConstants::host_memory_gbps},
    {"host_cache_mib", "MiB", 32.0, "the build VM's last-level cache (AMD EPYC, L3 32 MiB); kizuna-tune reads sysfs",
     &CostConstants::host_cache_mib},
    {"cache_speedup", "x", 2.0,
     "fused AllReduce of 2 processes at 256 KiB-2 MiB ran 1.6-2.3x faster than the memory rates predict "
     "(docs/OPERABILITY.md, tuning)",
     &CostConstants::cache_speedup},
}};

// The constructor sets a member only through the table: every member must be in it, once.
constexpr bool EveryMemberOnce() {
  for (size_t i = 0; i < kConstantTable.size(); ++i)
    for (size_t j = i + 1; j < kConstantTable.size(); ++j)
      if (kConstantTable[i].field == kConstantTable[j].field || kConstantTable[i].name == kConstantTable[j].name)
        return false;
  return true;
}
static_assert(EveryMemberOnce(), "a constant is in the table twice");
static_assert(sizeof(CostConstants) == kConstantTable.size() * sizeof(double),
              "every member of CostConstants needs a row in the table (its default value and reason)");

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

CostConstants::CostConstants() {
  for (const CostConstantInfo& c : kConstantTable) this->*c.field = c.value;
}

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
