#include "runtime/host_id.h"

#include <unistd.h>

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

}  // namespace kizuna
