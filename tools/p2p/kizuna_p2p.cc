// kizuna-p2p: point-to-point latency and bandwidth of every fabric, between two ranks (perftest's
// ib_write_lat / ib_write_bw for kizuna's fabrics).
//
//   kizuna-p2p [--fabric NAME] [--max-bytes 64M] [--iters 1000] [--window 16] [--json]
//   kizuna-run -n 2 -- kizuna-p2p --processes ...
//
// Two ranks — two threads of this process over the in-process bootstrap, or, with --processes,
// two processes started by kizuna-run that bootstrap from its environment — create each fabric,
// exchange listen handles through the bootstrap and connect both directions. Then, for host memory
// and for emulated device buffers registered by fd (where the fabric registers by fd), rank 0
// measures:
//   latency    8-byte ping-pong; half the round trip, median and p99, after a warm-up;
//   bandwidth  rank 0 to rank 1, sizes doubling (or --factor) from --min-bytes to --max-bytes,
//              `window` sends in flight; the clock stops when rank 1's acknowledgement of the last
//              message arrives, so a send that completes before its bytes land is not counted early.
// The "copies" column says whether the transfers went directly between the two registered regions
// (1) or through an intermediate buffer (2), from the comm's TransferStats. A single-thread memcpy
// of the same sizes, measured in the same run, is printed as the bound of a one-copy transfer.
//
// Exit status: 0 when every measurement ran (fabrics unavailable here are rows with the reason),
// 1 on a failure (the reason on stderr), 2 on bad options.

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/core/config.h"
#include "runtime/core/logging.h"
#include "runtime/device/registry.h"
#include "tools/p2p/measure.h"

namespace kizuna {
namespace {

using p2p::BandwidthCount;
using p2p::ChooseTopology;
using p2p::kLatencyBytes;
using p2p::kMaxAllowedBytes;
using p2p::MemcpyRows;
using p2p::Options;
using p2p::Row;
using p2p::RunInProcess;
using p2p::RunRank;
using p2p::Sizes;
using p2p::TempTopology;

Result<uint64_t> ParseBytes(const std::string& text, std::string_view option) {
  if (text.empty()) return InvalidArgument(fmt::format("{}: empty size", option));
  size_t used = 0;
  unsigned long long value = 0;
  if (text.front() == '-' || !std::isdigit(static_cast<unsigned char>(text.front())))
    return InvalidArgument(fmt::format("{} '{}': expected a byte count such as 8, 64K, 1M or 1G", option, text));
  while (used < text.size() && std::isdigit(static_cast<unsigned char>(text[used]))) {
    if (value > kMaxAllowedBytes) return InvalidArgument(fmt::format("{} '{}': at most 1G is allowed", option, text));
    value = value * 10 + static_cast<unsigned>(text[used] - '0');
    ++used;
  }
  const std::string suffix = text.substr(used);
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = uint64_t{1} << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = uint64_t{1} << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = uint64_t{1} << 30;
  else if (!suffix.empty())
    return InvalidArgument(fmt::format("{} '{}': unknown suffix '{}' (use K, M or G)", option, text, suffix));
  if (value > kMaxAllowedBytes / scale)
    return InvalidArgument(fmt::format("{} '{}': at most 1G is allowed", option, text));
  return static_cast<uint64_t>(value) * scale;
}

// ---- Output ----

std::string Num(double v, int precision) { return std::isnan(v) ? "-" : fmt::format("{:.{}f}", v, precision); }

void PrintTable(const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"fabric", "memory", "test", "bytes", "iters", "median_us", "p99_us", "GB/s", "Mmsg/s", "copies",
                   "note"});
  for (const Row& r : rows) {
    const bool measured = r.test != "-";
    cells.push_back({r.fabric, r.memory, r.test, measured ? std::to_string(r.bytes) : "-",
                     measured ? std::to_string(r.iterations) : "-", Num(r.median_us, 2), Num(r.p99_us, 2),
                     Num(r.gbps, 2), Num(r.mmsgs, 3), r.copies, r.note});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& line : cells)
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  for (const auto& line : cells) {
    std::string out;
    for (size_t i = 0; i < line.size(); ++i) {
      const bool left = i < 3 || i >= 9;  // names and notes left, numbers right
      if (i + 1 == line.size()) out += line[i];
      else out += left ? fmt::format("{:<{}}  ", line[i], width[i]) : fmt::format("{:>{}}  ", line[i], width[i]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    fmt::print("{}\n", out);
  }
}

void PrintJson(const std::vector<Row>& rows, const Options& o, const std::vector<std::string>& notes) {
  auto number = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json j;
  j["mode"] = o.processes ? "processes" : "threads";
  j["window"] = o.window;
  j["iterations"] = o.iters;
  j["notes"] = notes;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    j["rows"].push_back({{"fabric", r.fabric}, {"memory", r.memory}, {"test", r.test}, {"bytes", r.bytes},
                         {"iterations", r.iterations}, {"median_us", number(r.median_us)},
                         {"p99_us", number(r.p99_us)}, {"gbps", number(r.gbps)}, {"mmsgs", number(r.mmsgs)},
                         {"copies", r.copies}, {"note", r.note}});
  }
  fmt::print("{}\n", j.dump(2));
}

// Kept whole: the command line, its checks and the measurements it selects, in order, sharing their variables.
int Main(int argc, char** argv) {
  CLI::App app{"kizuna-p2p: point-to-point latency and bandwidth of the fabrics between two ranks"};
  Options o;
  std::string min_bytes = "8", max_bytes = "64M", bw_bytes = "1G";
  app.add_option("--fabric", o.fabric, "measure only this fabric (default: every fabric in the registry)");
  app.add_flag("--processes", o.processes, "run as one of two processes started by kizuna-run -n 2 "
                                          "(default: two threads of this process)");
  app.add_option("--min-bytes", min_bytes, "smallest bandwidth message (K/M/G suffixes)")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "largest bandwidth message, at most 1G")->capture_default_str();
  app.add_option("-f,--factor", o.factor, "size step of the bandwidth sweep (> 1)")->capture_default_str();
  app.add_option("--window", o.window, "sends (and receives) in flight in the bandwidth test")->capture_default_str();
  app.add_option("--iters", o.iters, "latency iterations; most messages per bandwidth size")->capture_default_str();
  app.add_option("--warmup", o.warmup, "latency warm-up iterations")->capture_default_str();
  app.add_option("--bw-bytes", bw_bytes, "bytes to move per bandwidth size (at least 4 messages)")
      ->capture_default_str();
  app.add_option("--memory", o.memory, "host, device (emulated device buffers registered by fd) or all")
      ->capture_default_str();
  app.add_flag("!--no-reference", o.reference, "skip the single-thread memcpy rows");
  app.add_flag("--json", o.json, "print JSON instead of the table");
  app.add_option("--timeout", o.timeout_s, "deadline of each phase in seconds (default: KIZUNA_TIMEOUT)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto usage = [](const Status& s) {
    fmt::print(stderr, "kizuna-p2p: {}\n", s.message());
    return 2;
  };
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kizuna-p2p: {}\n", s.ToString());
    return 1;
  };
  {
    auto v = ParseBytes(min_bytes, "--min-bytes");
    if (!v.ok()) return usage(v.status());
    o.min_bytes = *v;
    v = ParseBytes(max_bytes, "--max-bytes");
    if (!v.ok()) return usage(v.status());
    o.max_bytes = *v;
    v = ParseBytes(bw_bytes, "--bw-bytes");
    if (!v.ok()) return usage(v.status());
    o.bw_bytes = *v;
  }
  if (o.min_bytes == 0 || o.max_bytes < o.min_bytes)
    return usage(InvalidArgument(fmt::format("--min-bytes {} / --max-bytes {}: need 0 < min <= max", o.min_bytes,
                                             o.max_bytes)));
  if (o.max_bytes < kLatencyBytes)
    return usage(InvalidArgument(fmt::format("--max-bytes {}: at least {} (the latency message)", o.max_bytes,
                                             kLatencyBytes)));
  if (!(o.factor > 1.0) || o.factor > 1024)
    return usage(InvalidArgument(fmt::format("--factor {}: expected 1 < f <= 1024", o.factor)));
  if (o.window < 1 || o.window > 4096)
    return usage(InvalidArgument(fmt::format("--window {}: expected 1..4096", o.window)));
  if (o.iters < 1) return usage(InvalidArgument(fmt::format("--iters {}: expected at least 1", o.iters)));
  if (o.warmup < 0) return usage(InvalidArgument(fmt::format("--warmup {}: expected 0 or more", o.warmup)));
  if (o.bw_bytes == 0) return usage(InvalidArgument("--bw-bytes 0: expected a positive size"));
  if (o.memory != "host" && o.memory != "device" && o.memory != "all")
    return usage(InvalidArgument(fmt::format("--memory '{}': expected host, device or all", o.memory)));
  if (o.timeout_s < 0)
    return usage(InvalidArgument(fmt::format("--timeout {}: expected a positive value", o.timeout_s)));

  Config config = GlobalConfig();
  std::vector<std::string> notes;
  Result<std::vector<Row>> rows = std::vector<Row>{};
  if (o.processes) {
    TempTopology topology;
    if (Status s = ChooseTopology(config, o, topology, notes); !s.ok()) return fail(s);
    auto devices = device::DeviceRegistry::Create(config);
    auto made = bootstrap::BootstrapFromEnvironment();
    if (!made.ok()) return fail(made.status().WithContext("bootstrap (is this running under kizuna-run -n 2?)"));
    if ((*made)->size() != 2)
      return fail(InvalidArgument(fmt::format("--processes needs exactly 2 ranks, the job has {}", (*made)->size())));
    rows = RunRank(**made, config, o, devices.get());
    if (!rows.ok()) return fail(rows.status().WithContext(fmt::format("rank {}", (*made)->rank())));
    if ((*made)->rank() != 0) return 0;
    notes.push_back("2 processes under kizuna-run (TCP bootstrap)");
  } else {
    rows = RunInProcess(config, o, notes);
    if (!rows.ok()) return fail(rows.status());
  }
  if (o.reference) {
    auto ref = MemcpyRows(o);
    if (!ref.ok()) return fail(ref.status().WithContext("memcpy reference"));
    rows->insert(rows->end(), ref->begin(), ref->end());
  }
  notes.push_back(fmt::format("window {}, latency {} iterations after {} warm-up", o.window, o.iters, o.warmup));

  if (o.json) {
    PrintJson(*rows, o, notes);
  } else {
    for (const std::string& n : notes) fmt::print("# {}\n", n);
    PrintTable(*rows);
  }
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
