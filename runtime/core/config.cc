#include "runtime/core/config.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/core/logging.h"
#include "runtime/core/status.h"

extern char** environ;

namespace kizuna {
namespace {

using Setter = std::function<std::string(std::string_view value, Config& c)>;  // "" or an error

struct Entry {
  ConfigVariable doc;
  Setter set;
};

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return std::string(s);
}

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos) end = s.size();
    std::string item = Trim(s.substr(start, end - start));
    if (!item.empty()) out.push_back(std::move(item));
    start = end + 1;
  }
  return out;
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return out;
}

// Integers with an optional binary suffix (K, M, G, T; KiB/MiB/... also accepted).
std::optional<uint64_t> ParseSize(std::string_view text) {
  std::string s = Trim(text);
  if (s.empty()) return std::nullopt;
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr == s.data()) return std::nullopt;
  std::string suffix = Upper(std::string_view(ptr, s.data() + s.size() - ptr));
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TIB") shift = 40;
  else return std::nullopt;
  if (shift > 0 && value > (~uint64_t{0} >> shift)) return std::nullopt;
  return value << shift;
}

std::optional<int64_t> ParseInt(std::string_view text) {
  std::string s = Trim(text);
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<double> ParseDouble(std::string_view text) {
  std::string s = Trim(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !(v == v)) return std::nullopt;
  return v;
}

std::string Expect(std::string_view what) { return fmt::format("expected {}", what); }

// Setter builders.
Setter IntIn(std::optional<int> Config::*field, int64_t lo, int64_t hi) {
  return [=](std::string_view v, Config& c) -> std::string {
    auto x = ParseInt(v);
    if (!x || *x < lo || *x > hi) return Expect(fmt::format("an integer in [{}, {}]", lo, hi));
    c.*field = static_cast<int>(*x);
    return "";
  };
}
Setter PositiveSize(std::optional<uint64_t> Config::*field) {
  return [=](std::string_view v, Config& c) -> std::string {
    auto x = ParseSize(v);
    if (!x || *x == 0) return Expect("a positive integer, optionally with K, M, G or T");
    c.*field = *x;
    return "";
  };
}
Setter PositiveDouble(std::optional<double> Config::*field, bool allow_zero) {
  return [=](std::string_view v, Config& c) -> std::string {
    auto x = ParseDouble(v);
    if (!x || *x < 0 || (!allow_zero && *x == 0) || *x > 1e12)
      return Expect(allow_zero ? "a non-negative number" : "a positive number");
    c.*field = *x;
    return "";
  };
}
Setter Flag(bool Config::*field) {
  return [=](std::string_view v, Config& c) -> std::string {
    const std::string s = Trim(v);
    if (s == "0") c.*field = false;
    else if (s == "1") c.*field = true;
    else return Expect("0 or 1");
    return "";
  };
}
Setter Text(std::string Config::*field) {
  return [=](std::string_view v, Config& c) -> std::string {
    c.*field = Trim(v);
    return "";
  };
}
Setter List(std::vector<std::string> Config::*field, char sep) {
  return [=](std::string_view v, Config& c) -> std::string {
    c.*field = Split(v, sep);
    return "";
  };
}

std::optional<LogLevel> ParseLevel(std::string_view v) {
  std::string s = Upper(Trim(v));
  if (s == "NONE" || s == "OFF") return LogLevel::kNone;
  if (s == "WARN" || s == "WARNING") return LogLevel::kWarn;
  if (s == "INFO") return LogLevel::kInfo;
  if (s == "TRACE" || s == "DEBUG") return LogLevel::kTrace;
  return std::nullopt;
}

constexpr LogSubsys kSubsystems[] = {kLogInit,      kLogDevice, kLogFabric, kLogColl,
                                     kLogBootstrap, kLogPlugin, kLogEnv,    kLogTune};

std::string ParseSubsys(std::string_view v, uint32_t& mask) {
  std::vector<std::string> items = Split(v, ',');
  if (items.empty()) return Expect("a comma list of subsystems");
  uint32_t result = 0;
  bool only_removals = true;
  for (const std::string& raw : items) {
    bool remove = raw[0] == '^';
    std::string name = Upper(remove ? raw.substr(1) : raw);
    uint32_t bits = 0;
    if (name == "ALL") bits = kLogAll;
    for (LogSubsys s : kSubsystems)
      if (name == LogSubsysName(s)) bits = s;
    if (bits == 0)
      return fmt::format(
          "unknown subsystem '{}' (known: ALL, INIT, DEVICE, FABRIC, COLL, BOOTSTRAP, PLUGIN, "
          "ENV, TUNE)",
          ShownText(name));
    if (remove) {
      result &= ~bits;
    } else {
      only_removals = false;
      result |= bits;
    }
  }
  if (only_removals) {  // "^DEVICE" alone means everything but DEVICE.
    result = kLogAll;
    for (const std::string& raw : items) {
      std::string name = Upper(raw.substr(1));
      for (LogSubsys s : kSubsystems)
        if (name == LogSubsysName(s)) result &= ~static_cast<uint32_t>(s);
    }
  }
  mask = result;
  return "";
}

// Kept whole: the table of every KIZUNA_* variable, one entry each (its documentation next to its parser).
const std::vector<Entry>& Entries() {
  static const std::vector<Entry> entries = [] {
    std::vector<Entry> e;
    auto add = [&](ConfigVariable doc, Setter set) { e.push_back({doc, std::move(set)}); };
    add({"KIZUNA_DEBUG", "WARN|INFO|TRACE|NONE", "WARN", "log level"},
        [](std::string_view v, Config& c) -> std::string {
          auto l = ParseLevel(v);
          if (!l) return Expect("one of WARN, INFO, TRACE, NONE");
          c.debug = *l;
          return "";
        });
    add({"KIZUNA_DEBUG_SUBSYS", "comma list, ^NAME removes", "ALL",
         "INIT, DEVICE, FABRIC, COLL, BOOTSTRAP, PLUGIN, ENV, TUNE"},
        [](std::string_view v, Config& c) { return ParseSubsys(v, c.debug_subsys); });
    add({"KIZUNA_DEBUG_FILE", "path (%h host, %p pid)", "stderr", "where log lines go"},
        Text(&Config::debug_file));
    add({"KIZUNA_TIMEOUT", "seconds", "600", "deadline of every blocking wait"},
        [](std::string_view v, Config& c) -> std::string {
          auto x = ParseDouble(v);
          if (!x || *x <= 0 || *x > 1e9) return Expect("a positive number of seconds");
          c.timeout_s = *x;
          return "";
        });
    add({"KIZUNA_DEVICE_PLUGINS", "colon-separated paths", "", "device plugins to dlopen"},
        List(&Config::device_plugins, ':'));
    add({"KIZUNA_FABRIC_PLUGINS", "colon-separated paths", "", "fabric plugins to dlopen"},
        List(&Config::fabric_plugins, ':'));
    add({"KIZUNA_TUNER_PLUGIN", "path", "", "tuner plugin to dlopen: chooses the algorithm where KIZUNA_ALGO does not"},
        Text(&Config::tuner_plugin));
    add({"KIZUNA_EMULATED_DEVICES", "count", "8", "emulated devices on this host (0 disables them)"},
        [](std::string_view v, Config& c) -> std::string {
          auto x = ParseInt(v);
          if (!x || *x < 0 || *x > 1024) return Expect("an integer in [0, 1024]");
          c.emulated_devices = static_cast<int>(*x);
          return "";
        });
    add({"KIZUNA_DEVICE", "index", "local_rank % N", "device a rank uses"}, IntIn(&Config::device, 0, 1 << 20));
    add({"KIZUNA_EMU_MEM_BYTES", "bytes (K/M/G suffix)", "host memory", "memory of each emulated device"},
        PositiveSize(&Config::emu_mem_bytes));
    add({"KIZUNA_EMU_COPY_GBPS", "GB/s", "unthrottled", "emulated copy bandwidth"},
        PositiveDouble(&Config::emu_copy_gbps, false));
    add({"KIZUNA_EMU_REDUCE_GBPS", "GB/s", "unthrottled", "emulated reduce bandwidth (bytes read)"},
        PositiveDouble(&Config::emu_reduce_gbps, false));
    add({"KIZUNA_EMU_PCI_BUS_IDS", "comma list of PCI bus ids", "none",
         "emulated device i's PCI bus id, for a machine topology file (KIZUNA_MACHINE_TOPOLOGY)"},
        List(&Config::emu_pci_bus_ids, ','));
    add({"KIZUNA_EMU_SPEED_FACTORS", "comma list of factors", "1",
         "emulated device i's copy and reduce throttles times the i-th factor"},
        [](std::string_view v, Config& c) -> std::string {
          std::vector<double> factors;
          std::string_view rest = v;
          while (true) {
            const size_t comma = rest.find(',');
            auto x = ParseDouble(rest.substr(0, comma));
            if (!x || *x <= 0 || *x > 1e6) return Expect("positive numbers separated by commas");
            factors.push_back(*x);
            if (comma == std::string_view::npos) break;
            rest.remove_prefix(comma + 1);
          }
          c.emu_speed_factors = std::move(factors);
          return "";
        });
    add({"KIZUNA_EMU_LAUNCH_US", "microseconds", "0", "emulated launch latency per stream operation"},
        PositiveDouble(&Config::emu_launch_us, true));
    add({"KIZUNA_EMU_FAIL_ALLOC", "k (1-based)", "off", "fail the k-th emulated allocation"},
        PositiveSize(&Config::emu_fail_alloc));
    add({"KIZUNA_EMU_FAIL_STREAM_OP", "k (1-based)", "off", "fail the k-th emulated stream operation"},
        PositiveSize(&Config::emu_fail_stream_op));
    add({"KIZUNA_EMU_OPAQUE", "0|1", "0", "emulated device memory the CPU cannot dereference, as GPU memory"},
        Flag(&Config::emu_opaque));
    add({"KIZUNA_EMU_SYNC_FREE", "0|1", "0",
         "freeing emulated memory waits for the device's streams, as cudaFree does"},
        Flag(&Config::emu_sync_free));
    add({"KIZUNA_UNIQUE_ID", "printable id", "", "rendezvous id (address, port, secret)"},
        Text(&Config::unique_id));
    add({"KIZUNA_UNIQUE_ID_FILE", "path", "", "rank 0 writes the id here, others wait for it"},
        Text(&Config::unique_id_file));
    add({"KIZUNA_ROOT", "host:port", "MASTER_ADDR:MASTER_PORT+1", "root's bootstrap address"},
        Text(&Config::root));
    add({"KIZUNA_DUMP_ON_TIMEOUT", "path (%r rank, %p pid, %h host)", "",
         "each rank writes its last operations (JSON) here when one times out"},
        Text(&Config::dump_on_timeout));
    add({"KIZUNA_TRACE_FILE", "path (%r rank, %p pid, %h host)", "",
         "each rank writes a trace of its collectives and their steps (Chrome trace JSON) here"},
        Text(&Config::trace_file));
    add({"KIZUNA_RUN_DIR", "path", "/tmp/kizuna-<uid>",
         "where each process serves its status to kizuna-status (a folder per job)"},
        Text(&Config::run_dir));
    add({"KIZUNA_COST_FILE", "path", "",
         "the machine's measured costs (kizuna-tune's file): the cost model's constants and link speeds"},
        Text(&Config::cost_file));
    add({"KIZUNA_FABRIC", "comma list (name or name:device)", "auto",
         "fabrics in preference order, e.g. ofi:shm,directconnect"},
        List(&Config::fabric, ','));
    add({"KIZUNA_NICS", "comma list (interface or fabric device)", "nearest (machine topology), then by local rank",
         "the NIC each local rank uses between hosts, in local-rank order (rails)"},
        List(&Config::nics, ','));
    add({"KIZUNA_MACHINE_TOPOLOGY", "path", "this machine (hwloc)",
         "an hwloc XML file (lstopo --of xml) read as this machine's topology: the NIC nearest each accelerator"},
        Text(&Config::machine_topology));
    add({"KIZUNA_TOPOLOGY", "path or spec", "", "direct-connect topology file, or full|ring[:N]|torus{1,2,3}d:shape"},
        Text(&Config::topology));
    add({"KIZUNA_ALGO", "name or coll:name;coll:name", "cost model", "algorithm override"},
        Text(&Config::algo));
    add({"KIZUNA_PLAN_FILE", "comma list of paths", "",
         "plan files (custom schedules, docs/PLAN_FILES.md): checked at creation, run as the algorithm 'file'"},
        List(&Config::plan_files, ','));
    add({"KIZUNA_INA_LAYOUT", "path", "",
         "INA layout (kizuna-plan --layout): ranks after its workers are aggregation devices"},
        Text(&Config::ina_layout));
    add({"KIZUNA_REWEIGH_CALLS", "N", "0", "re-measure the devices and re-weigh the work every N calls (0: never)"},
        [](std::string_view v, Config& c) -> std::string {
          auto x = ParseInt(v);
          if (!x || *x < 0 || *x > (1 << 30)) return Expect("a non-negative integer");
          c.reweigh_calls = static_cast<int>(*x);
          return "";
        });
    add({"KIZUNA_DETERMINISTIC", "0|1", "0", "same reduction order on every run"},
        Flag(&Config::deterministic));
    add({"KIZUNA_CHUNK_BYTES", "bytes (K/M/G suffix)", "cost model", "pipeline chunk size override"},
        PositiveSize(&Config::chunk_bytes));
    add({"KIZUNA_IB_HCA", "device[:port] list", "all", "RDMA devices to use"}, Text(&Config::ib_hca));
    add({"KIZUNA_IB_GID_INDEX", "index", "auto (RoCEv2)", "GID index"}, IntIn(&Config::ib_gid_index, 0, 65535));
    add({"KIZUNA_IB_ADDR_FAMILY", "ipv4|ipv6", "ipv4", "GID address family"},
        [](std::string_view v, Config& c) -> std::string {
          std::string s = Trim(v);
          if (s != "ipv4" && s != "ipv6") return Expect("ipv4 or ipv6");
          c.ib_addr_family = s;
          return "";
        });
    add({"KIZUNA_IB_TC", "0..255", "0", "traffic class (DSCP << 2 | ECN)"}, IntIn(&Config::ib_tc, 0, 255));
    add({"KIZUNA_IB_SL", "0..15", "0", "service level"}, IntIn(&Config::ib_sl, 0, 15));
    return e;
  }();
  return entries;
}

// The edit distance of a and b, or `limit` when it is `limit` or more (the distance is at least
// the difference of the lengths: a long name costs nothing).
size_t EditDistance(std::string_view a, std::string_view b, size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) >= limit) return limit;
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return std::min(prev[b.size()], limit);
}

}  // namespace

std::string_view LogSubsysName(LogSubsys s) {
  switch (s) {
    case kLogInit: return "INIT";
    case kLogDevice: return "DEVICE";
    case kLogFabric: return "FABRIC";
    case kLogColl: return "COLL";
    case kLogBootstrap: return "BOOTSTRAP";
    case kLogPlugin: return "PLUGIN";
    case kLogEnv: return "ENV";
    case kLogTune: return "TUNE";
    case kLogAll: return "ALL";
  }
  return "?";
}

std::span<const ConfigVariable> ConfigVariables() {
  static const std::vector<ConfigVariable> docs = [] {
    std::vector<ConfigVariable> d;
    for (const Entry& e : Entries()) d.push_back(e.doc);
    return d;
  }();
  return docs;
}

ParsedConfig ParseConfig(const std::map<std::string, std::string>& env) {
  ParsedConfig out;
  for (const auto& [name, value] : env) {
    if (name.rfind("KIZUNA_", 0) != 0) continue;
    const Entry* entry = nullptr;
    for (const Entry& e : Entries())
      if (e.doc.name == name) entry = &e;
    if (entry == nullptr) {
      std::string_view best;
      size_t best_d = 4;  // suggest only close names
      for (const Entry& e : Entries()) {
        size_t d = EditDistance(name, e.doc.name, best_d);
        if (d < best_d) best_d = d, best = e.doc.name;
      }
      out.warnings.push_back(best.empty()
                                 ? fmt::format("unknown variable {} (ignored)", ShownText(name))
                                 : fmt::format("unknown variable {} (ignored; did you mean {}?)", ShownText(name), best));
      continue;
    }
    std::string err = entry->set(value, out.config);
    if (!err.empty())
      out.warnings.push_back(fmt::format("{}='{}' is malformed: {}; using the default ({})", name, ShownText(value), err,
                                         entry->doc.default_value));
  }
  return out;
}

std::map<std::string, std::string> KizunaEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (kv.rfind("KIZUNA_", 0) != 0) continue;
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

const Config& GlobalConfig() {
  static const ParsedConfig* parsed = [] {
    auto* p = new ParsedConfig(ParseConfig(KizunaEnvironment()));  // process lifetime, never freed
    ConfigureLogging(p->config);
    for (const std::string& w : p->warnings) KZ_WARN(kLogEnv, "{}", w);
    return p;
  }();
  return parsed->config;
}

}  // namespace kizuna
