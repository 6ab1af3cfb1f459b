#include "runtime/core/host_id.h"

#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

namespace kizuna {

std::string HostId() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
  std::string id = name[0] ? name : "localhost";
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (boot && std::getline(boot, boot_id) && !boot_id.empty()) id += ":" + boot_id.substr(0, 8);
  return id;
}

std::string MachineOf(const std::string& host_id) {
  const size_t colon = host_id.rfind(':');
  return colon == std::string::npos ? host_id : host_id.substr(colon + 1);
}

int UsableCpuCount() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

namespace {
std::atomic<bool> host_oversubscribed{false};
}  // namespace

void SetHostOversubscribed() { host_oversubscribed.store(true, std::memory_order_relaxed); }

bool HostOversubscribed() { return host_oversubscribed.load(std::memory_order_relaxed); }

}  // namespace kizuna
