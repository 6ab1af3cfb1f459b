// The typed configuration: every KIZUNA_* environment variable, parsed once at the edge
// (README.md, "Configuration") and passed explicitly to what needs it.
//
// Unknown KIZUNA_* names and malformed values produce a warning naming the variable (and, for a
// misspelling, the closest known name); the default is kept. The table of variables (name, form,
// default, meaning) is data: README.md's configuration table and `kizuna-demo --env` print it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kizuna {

enum class LogLevel : uint8_t { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

// Logging subsystems; KIZUNA_DEBUG_SUBSYS is a comma list of these names (or ALL), and a name
// prefixed with ^ removes it ("ALL,^DEVICE"), as NCCL_DEBUG_SUBSYS does.
enum LogSubsys : uint32_t {
  kLogInit = 1u << 0,
  kLogDevice = 1u << 1,
  kLogFabric = 1u << 2,
  kLogColl = 1u << 3,
  kLogBootstrap = 1u << 4,
  kLogPlugin = 1u << 5,
  kLogEnv = 1u << 6,
  kLogTune = 1u << 7,
  kLogAll = 0xffffffffu,
};
std::string_view LogSubsysName(LogSubsys s);

struct Config {
  // Logging.
  LogLevel debug = LogLevel::kWarn;
  uint32_t debug_subsys = kLogAll;
  std::string debug_file;  // %h host, %p pid; empty: stderr

  // Every blocking wait's deadline, in seconds.
  double timeout_s = 600.0;

  // Plugins (dlopen paths).
  std::vector<std::string> device_plugins;
  std::vector<std::string> fabric_plugins;
  // The tuner plugin (collectives/tuner): chooses the algorithm where the call and KIZUNA_ALGO do
  // not. Named explicitly, so a library that cannot be loaded fails communicator creation.
  std::string tuner_plugin;

  // Emulated devices (host-wide: the same N devices in every process on the host).
  int emulated_devices = 8;
  std::optional<int> device;  // which device a rank uses; default local_rank % N
  std::optional<uint64_t> emu_mem_bytes;  // per device; default: the host's physical memory
  std::optional<double> emu_copy_gbps;
  std::optional<double> emu_reduce_gbps;
  // Per device index, a factor on its copy and reduce throttles (devices beyond the list: 1):
  // devices of unlike speeds in one backend, e.g. 1,1,1,1,0.25,0.25,0.25,0.25.
  std::vector<double> emu_speed_factors;
  // KIZUNA_EMU_PCI_BUS_IDS: emulated device i's PCI bus id, the i-th of the list (a place in a
  // machine topology file; none by default).
  std::vector<std::string> emu_pci_bus_ids;
  std::optional<double> emu_launch_us;
  std::optional<uint64_t> emu_fail_alloc;      // fail the k-th allocation (1-based)
  std::optional<uint64_t> emu_fail_stream_op;  // fail the k-th stream operation (1-based)
  // Emulated device memory the CPU may not dereference (as GPU memory): device addresses are
  // PROT_NONE reservations, so code that touches them on the CPU faults in CI.
  bool emu_opaque = false;
  // Freeing emulated device or host memory first waits for every stream of the device to finish
  // the work enqueued before (as cudaFree and cuMemFreeHost do): an engine that frees memory while
  // a stream it holds waits for it fails its test at the deadline instead of hanging on a GPU.
  bool emu_sync_free = false;

  // Rendezvous.
  std::string unique_id;
  std::string unique_id_file;
  std::string root;  // host:port

  // Diagnostics: where each rank writes its flight recorder (its last operations, JSON) when an
  // operation times out; %r the rank, %p the process id, %h the host name. Empty: nowhere.
  std::string dump_on_timeout;
  // Where each rank writes its trace (Chrome trace / Perfetto JSON of its collectives and their
  // steps) when its communicator is destroyed; %r, %p, %h as above. Empty: no trace.
  std::string trace_file;
  // Where each process of a job serves its status to kizuna-status (runtime/job_status.h): a
  // folder per job inside; empty: /tmp/kizuna-<uid>.
  std::string run_dir;
  // The machine's measured costs (collectives/cost/cost_file.h, written by kizuna-tune); empty:
  // the cost model's defaults.
  std::string cost_file;

  // Fabric and topology.
  std::vector<std::string> fabric;
  std::string topology;
  // KIZUNA_NICS: the network devices (interface names such as eth1, or fabric device names) that
  // local ranks use between hosts, in local-rank order (rails); empty: by nearness, then by local rank.
  std::vector<std::string> nics;
  // KIZUNA_MACHINE_TOPOLOGY: an hwloc XML file (lstopo --of xml) read as this machine's topology
  // instead of detecting it: which NIC is nearest each accelerator (runtime/topology).
  std::string machine_topology;

  // Collectives.
  std::string algo;
  // KIZUNA_PLAN_FILE: plan files (collectives/plan/plan_file.h) the "file" algorithm runs.
  std::vector<std::string> plan_files;
  // In-network aggregation: the layout file (kizuna-plan --layout) naming the job's aggregation
  // devices, which are the ranks after its workers (collectives/ina/layout.h).
  std::string ina_layout;
  bool deterministic = false;
  // Re-measure the devices and re-weigh the work before every N-th collective call
  // (Communicator::Reweigh); 0: never.
  int reweigh_calls = 0;
  std::optional<uint64_t> chunk_bytes;

  // RoCE.
  std::string ib_hca;
  std::optional<int> ib_gid_index;
  std::string ib_addr_family;  // ipv4 | ipv6
  std::optional<int> ib_tc;
  std::optional<int> ib_sl;
};

// One configuration variable as documented.
struct ConfigVariable {
  std::string_view name;
  std::string_view form;
  std::string_view default_value;
  std::string_view meaning;
};
std::span<const ConfigVariable> ConfigVariables();

struct ParsedConfig {
  Config config;
  std::vector<std::string> warnings;  // one per unknown name or malformed value
};

// Parses a name -> value map (only KIZUNA_* names are looked at). Pure: tests call it directly.
ParsedConfig ParseConfig(const std::map<std::string, std::string>& env);

// The process environment's KIZUNA_* variables.
std::map<std::string, std::string> KizunaEnvironment();

// The process-wide configuration, parsed from the environment on first use; warnings are logged
// once (subsystem ENV). Components take a `const Config&` so tests can pass their own.
const Config& GlobalConfig();

}  // namespace kizuna
