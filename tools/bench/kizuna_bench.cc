// kizuna-bench: nccl-tests for kizuna. Times collectives over a sweep of sizes, checks their
// results, and prints nccl-tests' table (plus the algorithm the engine ran and the cost model's
// prediction for it), in one process (--mode threads) or one rank per process under a launcher.
//
//   kizuna-bench [-b 8 -e 128M -f 2 | -i 1M] [-n 20] [-w 5] [-c 1] [-o sum] [-d float] [-r 0]
//                [--coll allreduce] [--ranks N] [--mode auto|threads|procs] [--backend NAME]
//                [--devices K] [--plugin PATH] [--fabric NAME] [--algo auto|NAME|all]
//                [--topology FILE|SPEC] [--buffers device|host] [--json FILE] [--csv FILE]
//                [--plot FILE.svg]
//
// Flags follow nccl-tests (src/common.cu): -b/-e/-i/-f sizes, -n iterations, -w warm-up calls,
// -c check iterations (0: none), -o reduction (sum, prod, min, max, avg, all), -d type (float,
// half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64, all), -r root. The collective
// is --coll; since reductions and collectives have disjoint names, -o allreduce works too.
// README.md describes every flag, column and mode.
//
// Timing (as nccl-tests): per row and placement, -w warm-up calls, then -n calls enqueued back to
// back on every rank; the time is the wall time from before the first enqueue to after every
// rank's stream synchronized, divided by -n, the largest over the ranks. The check is one further
// call on known inputs (values.h), compared element by element; fills and checks are never timed.
//
// Exit status: 0 when every check passed; 1 when an element was wrong or a call failed; 2 for bad
// command-line input or a configuration that cannot run (CLI11's parse errors included), with a
// message naming the flag.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/core/config.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "tools/bench/choice.h"
#include "tools/bench/plot.h"
#include "tools/bench/report.h"
#include "tools/bench/sweep.h"
#include "tools/bench/world.h"

namespace kizuna::bench {
namespace {

using collectives::Algorithm;

// Limits that keep a mistyped flag from running for days.
constexpr int kMaxIters = 1000000;
constexpr int kMaxRanks = 4096;
constexpr uint64_t kMaxStepFactor = 1024;

struct Options {
  std::string min_bytes = "32M", max_bytes = "32M", step_bytes = "1M";
  uint64_t step_factor = 1;
  int iters = 20, warmup = 5, check = 1;
  std::string op = "sum", dtype = "float";
  int root = 0;
  std::string coll;
  int ranks = 0;
  std::string mode = "auto", backend = "host_emulated";
  int devices = 0;
  std::vector<std::string> plugins;
  std::string fabric, topology;
  std::string algo = "auto", buffers = "device";
  std::string timing = "avg";
  std::string placement = "both";
  std::string split = "speed";
  std::string json, csv, plot;
};

// What the flags resolve to.
struct Plan {
  BenchColl coll = BenchColl::kAllReduce;
  std::vector<DataType> types;
  std::vector<ReduceOp> ops;
  std::vector<uint64_t> sizes;
  uint64_t min_bytes = 0, max_bytes = 0, step = 0;
  bool by_factor = false;
  bool algo_all = false;
  std::optional<Algorithm> algo;  // forced; nullopt with !algo_all: the engine chooses
  Mode mode = Mode::kThreads;
  bool host_buffers = false;
};

std::string AlgorithmNames() {
  std::string out;
  for (int i = 0; i < collectives::kNumAlgorithms; ++i)
    out += fmt::format("{}{}", i ? ", " : "", collectives::AlgorithmName(static_cast<Algorithm>(i)));
  return out;
}

// Kept whole: one check per command-line option, in --help's order, which reads best as one list.
Result<Plan> Resolve(const Options& o, bool step_bytes_given, const Config& config) {
  Plan p;
  // The collective: --coll, or a collective name given to -o (nccl-tests has one program per
  // collective, so scripts pass the op; the names do not overlap).
  std::optional<BenchColl> coll_from_op = ParseBenchColl(o.op);
  if (!o.coll.empty()) {
    auto c = ParseBenchColl(o.coll);
    if (!c)
      return InvalidArgument(fmt::format("--coll '{}': unknown collective (known: {})", o.coll, BenchCollNames()));
    if (coll_from_op && *coll_from_op != *c)
      return InvalidArgument(fmt::format("--coll {} and -o {} name different collectives", o.coll, o.op));
    p.coll = *c;
  } else if (coll_from_op) {
    p.coll = *coll_from_op;
  }
  if (coll_from_op || !IsReduction(p.coll)) {
    // Collectives that do not reduce ignore the op (nccl-tests prints "none").
    if (!coll_from_op && o.op != "sum" && o.op != "all" && !ParseReduceOp(o.op))
      return InvalidArgument(
          fmt::format("-o '{}': unknown reduction (sum, prod, min, max, avg, all) or collective "
                      "({})",
                      o.op, BenchCollNames()));
    p.ops = {ReduceOp::kSum};
  } else if (o.op == "all") {
    p.ops.assign(AllReduceOps().begin(), AllReduceOps().end());
  } else {
    auto op = ParseReduceOp(o.op);
    if (!op)
      return InvalidArgument(
          fmt::format("-o '{}': unknown reduction (sum, prod, min, max, avg, all) or collective "
                      "({})",
                      o.op, BenchCollNames()));
    p.ops = {*op};
  }
  if (o.dtype == "all") {
    p.types.assign(AllDataTypes().begin(), AllDataTypes().end());
  } else {
    auto t = ParseDataType(o.dtype);
    if (!t)
      return InvalidArgument(
          fmt::format("-d '{}': unknown type (float, half, bfloat16, double, int8, uint8, int32, "
                      "uint32, int64, uint64, all)",
                      o.dtype));
    p.types = {*t};
  }

  KZ_ASSIGN_OR_RETURN(p.min_bytes, ParseByteSize(o.min_bytes, "-b"));
  KZ_ASSIGN_OR_RETURN(p.max_bytes, ParseByteSize(o.max_bytes, "-e"));
  KZ_ASSIGN_OR_RETURN(p.step, ParseByteSize(o.step_bytes, "-i"));
  if (o.step_factor < 1 || o.step_factor > kMaxStepFactor)
    return InvalidArgument(fmt::format("-f {}: expected 2..{} (1: step by -i instead)", o.step_factor, kMaxStepFactor));
  if (o.step_factor > 1 && step_bytes_given)
    return InvalidArgument(
        fmt::format("-f {} and -i {}: give one of them (a factor, or an increment)", o.step_factor, o.step_bytes));
  p.by_factor = o.step_factor > 1;
  if (p.by_factor) p.step = o.step_factor;
  KZ_ASSIGN_OR_RETURN(p.sizes, SweepSizes(p.min_bytes, p.max_bytes, p.by_factor ? 0 : p.step, o.step_factor));

  if (o.iters < 1 || o.iters > kMaxIters)
    return InvalidArgument(fmt::format("-n {}: expected 1..{}", o.iters, kMaxIters));
  if (o.warmup < 0 || o.warmup > kMaxIters)
    return InvalidArgument(fmt::format("-w {}: expected 0..{}", o.warmup, kMaxIters));
  if (o.check < 0 || o.check > kMaxIters)
    return InvalidArgument(fmt::format("-c {}: expected 0 (no check), 1, or more check iterations", o.check));
  if (o.ranks < 0 || o.ranks > kMaxRanks)
    return InvalidArgument(fmt::format("--ranks {}: expected 1..{} (0: one per device)", o.ranks, kMaxRanks));
  if (o.devices < 0) return InvalidArgument(fmt::format("--devices {}: expected 1 or more (0: all)", o.devices));

  if (o.algo == "all") {
    p.algo_all = true;
  } else if (o.algo != "auto") {
    p.algo = collectives::ParseAlgorithm(o.algo);
    if (!p.algo)
      return InvalidArgument(fmt::format("--algo '{}': unknown algorithm (auto, all, {})", o.algo, AlgorithmNames()));
  }
  if (o.buffers != "device" && o.buffers != "host")
    return InvalidArgument(fmt::format("--buffers '{}': expected device or host", o.buffers));
  p.host_buffers = o.buffers == "host";

  // The mode: procs under a launcher (a world of more than one process, or a job id given).
  const bootstrap::Environment env = bootstrap::ProcessEnvironment();
  auto launch = bootstrap::DetectLaunch(env);
  if (!launch.ok()) return InvalidArgument(fmt::format("the launcher's environment: {}", launch.status().message()));
  const bool launched = launch->size > 1 || !config.unique_id.empty();
  if (o.mode == "auto") {
    p.mode = launched ? Mode::kProcs : Mode::kThreads;
  } else if (o.mode == "threads") {
    p.mode = Mode::kThreads;
  } else if (o.mode == "procs") {
    if (!launched)
      return InvalidArgument(
          "--mode procs: no launcher found (no RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, PMI_* or "
          "SLURM_* for more than one rank, no KIZUNA_UNIQUE_ID); start the ranks with "
          "kizuna-run -n N -- kizuna-bench ..., torchrun, mpirun or srun");
    p.mode = Mode::kProcs;
  } else {
    return InvalidArgument(fmt::format("--mode '{}': expected auto, threads or procs", o.mode));
  }
  return p;
}

// Files are opened before anything runs, so a bad path fails at once.
struct File {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f;
  std::string path;
};

Result<File> OpenOutput(const std::string& path, std::string_view flag) {
  File file;
  file.path = path;
  if (path.empty()) return file;
  file.f.reset(std::fopen(path.c_str(), "w"));
  if (!file.f)
    return InvalidArgument(fmt::format("{} {}: cannot open for writing: {}", flag, path, std::strerror(errno)));
  return file;
}

class Bench {
 public:
  Bench(const Options& o, const Plan& p, World& w) : o_(o), p_(p), w_(w) {}

  // Every row; ok, or the error that stopped the sweep (rows so far are kept).
  Status Run() {
    const int n = w_.nranks();
    const double factor = BusBwFactor(p_.coll, n);
    for (DataType type : p_.types) {
      for (ReduceOp op : p_.ops) {
        for (uint64_t size : p_.sizes) {
          const Geometry g = GeometryFor(p_.coll, size, type, n);
          // --split both: every row with the work split by speed, then evenly.
          for (const bool balance :
               o_.split == "both" ? std::vector<bool>{true, false} : std::vector<bool>{o_.split == "speed"}) {
            auto choice = w_.Explain(p_.coll, g.count, type, balance);
            if (!choice.ok()) Warn(fmt::format("no prediction for {} bytes: {}", size, choice.status().ToString()));
            std::vector<std::optional<Algorithm>> forced;
            if (p_.algo_all && choice.ok())
              for (Algorithm a : choice->Supported()) forced.push_back(a);
            else
              forced.push_back(p_.algo);
            for (const std::optional<Algorithm>& f : forced)
              KZ_RETURN_IF_ERROR(RunRow(type, op, g, f, choice.ok() ? &*choice : nullptr, factor, balance));
          }
        }
      }
    }
    return Status::Ok();
  }

  const std::vector<Row>& rows() const { return rows_; }
  const Totals& totals() const { return totals_; }

 private:
  Status RunRow(DataType type, ReduceOp op, const Geometry& g, std::optional<Algorithm> forced,
                const AlgorithmChoice* choice, double factor, bool balance) {
    Row row;
    row.size_bytes = g.size_bytes();
    row.count = g.count;
    row.type = std::string(NcclTypeName(type));
    row.redop = IsReduction(p_.coll) ? std::string(ReduceOpName(op)) : "none";
    row.root = HasRoot(p_.coll) ? o_.root : -1;
    row.requested = forced ? std::string(collectives::AlgorithmName(*forced)) : "auto";
    row.algo = "-";
    if (choice) {
      if (auto used = choice->Used(forced)) {
        row.algo = std::string(collectives::AlgorithmName(*used));
        if (const auto* c = choice->Find(*used)) row.predicted_s = c->predicted_s;
        if (forced && *used != *forced)
          Warn(fmt::format("--algo {} cannot serve {} of {} bytes; the engine runs {} (the model's choice)",
                           row.requested, BenchCollName(p_.coll), row.size_bytes, row.algo));
      }
    }
    BenchCall call;
    call.coll = p_.coll;
    call.geometry = g;
    call.type = type;
    call.op = op;
    call.root = o_.root;
    call.algorithm = forced;
    call.balance = balance;
    if (o_.split == "both" && !balance) {  // the even split's rows (and plot lines) by their own name
      row.requested += " even";
      row.algo += " even";
    }
    for (bool in_place : {false, true}) {
      if (in_place && !g.in_place) continue;
      if (o_.placement != "both" && in_place != (o_.placement == "in")) continue;  // N/A in the table
      call.in_place = in_place;
      const std::string where = fmt::format("{} {} bytes {} {}", BenchCollName(p_.coll), row.size_bytes, row.type,
                                            in_place ? "in place" : "out of place");
      auto seconds =
          o_.timing == "median" ? w_.TimeEach(call, o_.warmup, o_.iters) : w_.Time(call, o_.warmup, o_.iters);
      if (!seconds.ok()) return seconds.status().WithContext(where);
      std::optional<uint64_t> wrong;
      for (int c = 0; c < o_.check; ++c) {
        auto w = w_.Check(call);
        if (!w.ok()) return w.status().WithContext(where + ", checking");
        wrong = *w;
        if (*wrong > 0) break;
      }
      (in_place ? row.in_place : row.out_of_place) = Measure(row.size_bytes, *seconds, factor, wrong);
    }
    if (w_.leader()) {
      std::fputs(TableRow(row).c_str(), stdout);
      std::fflush(stdout);
    }
    totals_.Add(row);
    rows_.push_back(std::move(row));
    return Status::Ok();
  }

  void Warn(const std::string& message) {
    if (!w_.leader()) return;
    for (const std::string& m : warned_)
      if (m == message) return;
    warned_.push_back(message);
    fmt::print(stderr, "kizuna-bench: warning: {}\n", message);
  }

  const Options& o_;
  const Plan& p_;
  World& w_;
  std::vector<Row> rows_;
  Totals totals_;
  std::vector<std::string> warned_;
};

std::string Describe(const Options& o, const Plan& p, const World& w) {
  std::string out = fmt::format(
      "# kizuna-bench: {} over {} rank(s), {} ({}), backend {}, {} buffers {}{}\n", BenchCollName(p.coll), w.nranks(),
      p.mode == Mode::kThreads ? "threads mode" : "procs mode",
      p.mode == Mode::kThreads ? "one process" : "one rank per process", o.backend, p.host_buffers ? "host" : "device",
      w.data_path(), o.algo == "auto" ? "" : fmt::format(", --algo {}", o.algo));
  // nccl-tests' parameter line, so that its parsers find what they expect.
  out += fmt::format(
      "# nThread 1 nGpus {} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: 1 "
      "validation: {} graph: 0\n",
      w.local_ranks(), p.min_bytes, p.max_bytes, p.step, p.by_factor ? "factor" : "bytes", o.warmup, o.iters, o.check);
  out += "#\n# Using devices\n";
  for (const std::string& line : w.device_lines()) out += fmt::format("#{}\n", line);
  out += "#\n";
  return out;
}

nlohmann::json Summary(const Options& o, const Plan& p, const World& w, const Bench& bench, const Status& error) {
  nlohmann::json j;
  j["tool"] = "kizuna-bench";
  j["collective"] = std::string(BenchCollName(p.coll));
  j["ranks"] = w.nranks();
  j["mode"] = p.mode == Mode::kThreads ? "threads" : "procs";
  j["backend"] = o.backend;
  j["buffers"] = p.host_buffers ? "host" : "device";
  j["fabric"] = o.fabric;
  j["topology"] = o.topology;
  j["algo"] = o.algo;
  j["root"] = HasRoot(p.coll) ? o.root : -1;
  j["iters"] = o.iters;
  j["warmup"] = o.warmup;
  j["timing"] = o.timing;
  j["check"] = o.check;
  j["min_bytes"] = p.min_bytes;
  j["max_bytes"] = p.max_bytes;
  j["step"] = p.step;
  j["step_kind"] = p.by_factor ? "factor" : "bytes";
  j["devices"] = w.device_lines();
  j["rows"] = nlohmann::json::array();
  for (const Row& row : bench.rows()) j["rows"].push_back(JsonRow(row));
  j["out_of_bounds"] = bench.totals().failed_measurements;
  j["avg_busbw_gbps"] = bench.totals().avg_busbw();
  j["error"] = error.ok() ? nlohmann::json(nullptr) : nlohmann::json(error.ToString());
  return j;
}

Status WriteFile(File& file, const std::string& text) {
  if (!file.f) return Status::Ok();
  if (std::fwrite(text.data(), 1, text.size(), file.f.get()) != text.size() || std::fflush(file.f.get()) != 0)
    return FromErrno(errno, fmt::format("writing {}", file.path));
  return Status::Ok();
}

// Kept whole: the command line in --help's order, then the run it sets up; both halves share its variables.
int Main(int argc, char** argv) {
  CLI::App app{
      "kizuna-bench: nccl-tests' measurements of kizuna's collectives (sizes, time, algbw, busbw, "
      "checked results), with the algorithm the engine ran and the cost model's prediction",
      "kizuna-bench"};
  Options o;
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size (bytes; K, M, G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size")->capture_default_str();
  app.add_option("-i,--stepbytes", o.step_bytes, "size increment (when -f is 1)")->capture_default_str();
  app.add_option("-f,--stepfactor", o.step_factor, "size factor (> 1 multiplies instead of adding -i)")
      ->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed calls per measurement")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up calls before each measurement")->capture_default_str();
  app.add_option("-c,--check", o.check, "check iterations per measurement (0: no check)")->capture_default_str();
  app.add_option("-o,--op", o.op, "reduction: sum, prod, min, max, avg, all (or a collective name)")
      ->capture_default_str();
  app.add_option("-d,--datatype", o.dtype, "element type: float, half, bfloat16, double, int8, ..., all")
      ->capture_default_str();
  app.add_option("-r,--root", o.root, "root of broadcast and reduce")->capture_default_str();
  app.add_option("--coll", o.coll,
                 "allreduce (default), reducescatter, allgather, broadcast, reduce, alltoall, sendrecv");
  app.add_option("--ranks", o.ranks, "communicator size in threads mode (default: one per device used)");
  app.add_option("--mode", o.mode, "auto (procs under a launcher, else threads), threads or procs")
      ->capture_default_str();
  app.add_option("--backend", o.backend, "device backend: host_emulated, cuda, or a plugin's name")
      ->capture_default_str();
  app.add_option("--devices", o.devices, "use the backend's first K devices, ranks round-robin (default: all)");
  app.add_option("--plugin", o.plugins, "device plugin to load, besides KIZUNA_DEVICE_PLUGINS (repeatable)")
      ->type_name("PATH");
  app.add_option("--fabric", o.fabric, "fabric(s) to use, comma-separated in preference order (KIZUNA_FABRIC)");
  app.add_option("--topology", o.topology,
                 "direct-connect topology: a file, or full, ring[:N], torus{1,2,3}d:shape (KIZUNA_TOPOLOGY)")
      ->type_name("FILE|SPEC");
  app.add_option("--algo", o.algo, "auto (the engine chooses), an algorithm name, or all (a row per algorithm)")
      ->capture_default_str();
  app.add_option("--buffers", o.buffers, "device (Device::Allocate) or host (plain host memory)")
      ->capture_default_str();
  app.add_option("--timing", o.timing,
                 "avg: -n calls back to back, averaged (nccl-tests); median: each call after a barrier, its "
                 "slowest rank's time, the median over -n calls (the MPI benchmarks' method)")
      ->check(CLI::IsMember({"avg", "median"}))
      ->capture_default_str();
  app.add_option("--placement", o.placement,
                 "both: out-of-place and in-place columns (nccl-tests); out or in: that one alone, the other N/A")
      ->check(CLI::IsMember({"both", "out", "in"}))
      ->capture_default_str();
  app.add_option("--split", o.split,
                 "speed: work split by each device's speed where the algorithm can (CallOptions::balance); even: "
                 "the even split; both: each row twice, the even one's algorithm named '<name> even'")
      ->check(CLI::IsMember({"speed", "even", "both"}))
      ->capture_default_str();
  app.add_option("--json", o.json, "write every row to this file as JSON")->type_name("FILE");
  app.add_option("--csv", o.csv, "write every row to this file as CSV")->type_name("FILE");
  app.add_option("--plot", o.plot, "draw busbw and the predicted busbw against size into this SVG file, a line per "
                 "algorithm with --algo all")->type_name("FILE.svg");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }

  // The registry and the communicators keep pointers to the configuration: it outlives them.
  Config config = GlobalConfig();
  config.device_plugins.insert(config.device_plugins.end(), o.plugins.begin(), o.plugins.end());
  if (!o.fabric.empty()) {
    config.fabric.clear();
    for (size_t at = 0; at <= o.fabric.size();) {
      size_t comma = o.fabric.find(',', at);
      if (comma == std::string::npos) comma = o.fabric.size();
      if (comma > at) config.fabric.push_back(o.fabric.substr(at, comma - at));
      at = comma + 1;
    }
  }
  if (!o.topology.empty()) config.topology = o.topology;

  auto plan = Resolve(o, app.count("-i") > 0, config);
  if (!plan.ok()) {
    fmt::print(stderr, "kizuna-bench: {}\n", plan.status().message());
    return 2;
  }
  WorldOptions wopts;
  wopts.mode = plan->mode;
  wopts.ranks = o.ranks;
  wopts.backend = o.backend;
  wopts.devices = o.devices;
  wopts.host_buffers = plan->host_buffers;
  wopts.buffer_bytes = plan->max_bytes;
  wopts.config = &config;
  auto world = World::Create(wopts);
  if (!world.ok()) {
    fmt::print(
        stderr, "kizuna-bench: {}\n",
        world.status().code() == StatusCode::kInvalidArgument ? world.status().message() : world.status().ToString());
    return world.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  World& w = **world;
  const int n = w.nranks();
  if (HasRoot(plan->coll) && (o.root < 0 || o.root >= n)) {
    fmt::print(stderr, "kizuna-bench: -r {}: expected a rank, 0..{}\n", o.root, n - 1);
    return 2;
  }
  if (plan->coll == BenchColl::kSendRecv && n < 2) {
    fmt::print(stderr, "kizuna-bench: sendrecv needs 2 ranks or more (each rank sends to the next)\n");
    return 2;
  }
  File json, csv, svg;
  if (w.leader()) {
    auto j = OpenOutput(o.json, "--json");
    auto c = OpenOutput(o.csv, "--csv");
    auto g = OpenOutput(o.plot, "--plot");
    for (const auto* r : {&j, &c, &g})
      if (!r->ok()) {
        fmt::print(stderr, "kizuna-bench: {}\n", r->status().message());
        return 2;
      }
    json = std::move(*j);
    csv = std::move(*c);
    svg = std::move(*g);
  }

  if (w.leader()) {
    std::fputs(Describe(o, *plan, w).c_str(), stdout);
    std::fputs(TableHeader().c_str(), stdout);
    std::fflush(stdout);
  }
  Bench bench(o, *plan, w);
  Status run = w.Prime();
  if (run.ok()) run = bench.Run();
  if (!run.ok()) fmt::print(stderr, "kizuna-bench: {}\n", run.ToString());

  int rc = run.ok() && bench.totals().failed_measurements == 0 ? 0 : 1;
  if (w.leader()) {
    std::fputs(Footer(bench.totals(), !run.ok()).c_str(), stdout);
    std::fflush(stdout);
    std::string csv_text = CsvHeader();
    for (const Row& row : bench.rows()) csv_text += CsvRow(row);
    const std::string title =
        fmt::format("kizuna-bench {}, {} ranks, {} mode, {}, --timing {}", BenchCollName(plan->coll), n,
                    plan->mode == Mode::kThreads ? "threads" : "procs", o.backend, o.timing);
    const std::string plot = svg.f ? PlotSvg(bench.rows(), BusBwFactor(plan->coll, n), title) : std::string();
    for (Status s : {WriteFile(json, Summary(o, *plan, w, bench, run).dump(2) + "\n"), WriteFile(csv, csv_text),
                     WriteFile(svg, plot)})
      if (!s.ok()) {
        fmt::print(stderr, "kizuna-bench: {}\n", s.ToString());
        rc = 1;
      }
  }
  return rc;
}

}  // namespace
}  // namespace kizuna::bench

int main(int argc, char** argv) { return kizuna::bench::Main(argc, argv); }
