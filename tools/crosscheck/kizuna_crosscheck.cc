// kizuna-crosscheck: random collectives and point-to-point patterns on emulated devices, each
// result compared with a reference computed here, independently of kizuna's kernels and
// algorithms (README.md beside this file).
//
//   kizuna-crosscheck --cases 300 --seed 7
//   kizuna-crosscheck --seconds 3600 --mode mixed
//   kizuna-crosscheck --seed 7 --only-case 123          (a failure's reproducer)
//
// Each failing case prints one line with its seed, index and parameters, then what was wrong and
// the command that runs it alone; the run ends with "N cases: N passed, N failed" and exits 1
// when a case failed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/core/random.h"
#include "tools/crosscheck/cases.h"
#include "tools/crosscheck/driver.h"

namespace kizuna::crosscheck {
namespace {

using Clock = std::chrono::steady_clock;

// "4096", "64K", "4M", "1G" (powers of 1024).
std::optional<uint64_t> ParseBytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return std::nullopt;
  const std::string suffix(end);
  if (suffix.empty()) return v;
  if (suffix == "K" || suffix == "k") return v << 10;
  if (suffix == "M" || suffix == "m") return v << 20;
  if (suffix == "G" || suffix == "g") return v << 30;
  return std::nullopt;
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// kizuna-run beside this binary: in Bazel's output tree (bazel-bin/tools/run/kizuna-run) or in
// this binary's runfiles (`bazel run`).
std::string FindKizunaRun(const std::string& self) {
  const std::string dir = self.substr(0, self.rfind('/'));
  std::vector<std::string> candidates = {dir + "/../run/kizuna-run", self + ".runfiles/kizuna/tools/run/kizuna-run"};
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"})
    if (const char* root = std::getenv(var); root != nullptr)
      candidates.push_back(std::string(root) + "/kizuna/tools/run/kizuna-run");
  for (const std::string& c : candidates)
    if (access(c.c_str(), X_OK) == 0) return c;
  return std::string();
}

// This process's resident memory, for the progress lines: a long run that keeps growing leaks.
double ResidentMiB() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20) : 0;
}

struct Tally {
  uint64_t passed = 0;
  uint64_t failed = 0;
  uint64_t skipped = 0;
};

// Kept whole: the command line, its checks, then the loop over batches with its limits and report.
int Main(int argc, char** argv) {
  CLI::App app{
      "kizuna-crosscheck: random collectives, data types, ops, counts, ranks, modes, algorithms, chunk sizes and "
      "point-to-point patterns on emulated devices, every result checked against a reference computed here.",
      "kizuna-crosscheck"};
  Options options;
  uint64_t cases = 0;
  double seconds = 0;
  std::optional<uint64_t> seed_flag, only_case;
  std::string mode = "mixed", ranks = "2-8", max_bytes = "4M", kizuna_run;
  std::vector<std::string> skips;
  bool verbose = false, worker = false, local_worker = false, in_process = false, history = false;
  uint64_t max_failures = 50, batch_index = 0, first = 0, last = 0;
  app.add_option("--cases", cases, "cases to run (default 200, or no limit with --seconds)");
  app.add_option("--seconds", seconds, "run until this many seconds have passed (no case starts after)");
  app.add_option("--seed", seed_flag, "the seed every case is drawn from (default: a random one, printed)");
  app.add_option("--only-case", only_case, "run this case alone (a failure's reproducer)");
  std::vector<uint64_t> drop;
  app.add_option("--drop-case", drop,
                 "leave this case out (repeatable; with --with-history, to narrow down which earlier cases a failure "
                 "needs)");
  app.add_flag("--with-history", history,
               "with --only-case: run the case's batch from its first case up to it, on one world (a failure that "
               "depends on what the world ran before)");
  app.add_option("--mode", mode,
                 "threads: every rank a thread of this process; one-thread: one thread issues every rank's calls; "
                 "processes: one rank per process under kizuna-run; mixed: the three in turn, per world")
      ->check(CLI::IsMember({"threads", "one-thread", "processes", "mixed"}))
      ->capture_default_str();
  app.add_option("--ranks", ranks, "rank counts, N or MIN-MAX")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "the largest buffer of a case (K, M, G suffixes)")->capture_default_str();
  app.add_option("--batch", options.batch, "cases per world (communicators are made once per world)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--timeout", options.timeout_s, "KIZUNA_TIMEOUT of the worlds, seconds; a run's calls get 30 s more")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_flag("--nans", options.nans, "NaN among the floating-point inputs");
  app.add_option("--ofi-max-ranks", options.ofi_max_ranks,
                 "the most ranks of a world over ofi (each connection holds about 95 MB)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  std::string known_skips;
  for (std::string_view k : KnownSkips()) known_skips += fmt::format("{}{}", known_skips.empty() ? "" : ", ", k);
  app.add_option("--skip", skips, "leave out a known failure while its fix lands (repeatable): " + known_skips);
  app.add_option("--max-failures", max_failures, "stop after this many failed cases (0: never)")->capture_default_str();
  app.add_option("--kizuna-run", kizuna_run, "the launcher for --mode processes (default: beside this binary)");
  app.add_flag("-v,--verbose", verbose, "print every case as it ends");
  app.add_flag("--in-process", in_process,
               "run the threads and one-thread batches in this process, not in a child process per batch (for a "
               "debugger; a crash then ends the run)");
  app.add_option("--corrupt-case", options.corrupt_case)->group("");  // the driver's own check
  // The children: a rank of a processes batch (started through kizuna-run), or every rank of a
  // threads or one-thread batch.
  app.add_flag("--worker", worker)->group("");
  app.add_flag("--local-worker", local_worker)->group("");
  app.add_option("--batch-index", batch_index)->group("");
  app.add_option("--first", first)->group("");
  app.add_option("--last", last)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto bad = [](const std::string& what) {
    std::fprintf(stderr, "kizuna-crosscheck: %s\n", what.c_str());
    return 2;
  };
  if (mode != "mixed")
    options.mode = mode == "threads" ? Mode::kThreads : mode == "one-thread" ? Mode::kOneThread : Mode::kProcesses;
  {
    const size_t dash = ranks.find('-');
    char* end = nullptr;
    options.min_ranks = static_cast<int>(std::strtol(ranks.c_str(), &end, 10));
    options.max_ranks = dash == std::string::npos ? options.min_ranks
                                                  : static_cast<int>(std::strtol(ranks.c_str() + dash + 1, &end, 10));
    if (*end != '\0' || options.min_ranks < 2 || options.max_ranks < options.min_ranks || options.max_ranks > 64)
      return bad(fmt::format("--ranks {}: want N or MIN-MAX with 2 <= MIN <= MAX <= 64", ranks));
  }
  options.drop.insert(drop.begin(), drop.end());
  const auto bytes = ParseBytes(max_bytes);
  if (!bytes || *bytes < 64)
    return bad(fmt::format("--max-bytes {}: want a size of at least 64 bytes (K, M, G suffixes)", max_bytes));
  options.max_bytes = *bytes;
  const std::vector<std::string_view> known = KnownSkips();
  for (const std::string& s : skips) {
    if (std::find(known.begin(), known.end(), s) == known.end())
      return bad(fmt::format("--skip {}: not a known failure ({})", s, known_skips));
    options.skip.insert(s);
  }
  const uint64_t seed = seed_flag ? *seed_flag : []() {
    uint64_t s = 0;
    if (!RandomBytes(&s, sizeof(s)).ok()) s = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    return s % 1000000000000ull;  // short enough to type
  }();
  const auto start = Clock::now();
  std::optional<Clock::time_point> deadline;
  if (seconds > 0)
    deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (worker || local_worker) {
    BatchContext ctx;
    ctx.options = &options;
    ctx.seed = seed;
    ctx.batch = batch_index;
    ctx.world = MakeWorld(options, seed, batch_index);
    ctx.first = first;
    ctx.last = last;
    ctx.deadline = deadline;
    return worker ? ProcessWorkerMain(ctx) : LocalWorkerMain(ctx);
  }

  const std::string self = SelfPath();
  if (kizuna_run.empty()) kizuna_run = FindKizunaRun(self);
  const bool uses_processes = options.mode == std::nullopt || *options.mode == Mode::kProcesses;
  if (uses_processes && kizuna_run.empty())
    return bad("no kizuna-run beside this binary: build //tools/run:kizuna-run or pass --kizuna-run PATH");
  if (cases == 0 && seconds <= 0) cases = 200;
  const std::string mode_flag = options.mode ? fmt::format("--mode {}", ModeName(*options.mode)) : "--mode mixed";
  std::printf("kizuna-crosscheck: seed %llu, %s, %s\n", static_cast<unsigned long long>(seed), mode_flag.c_str(),
              options.GenerationFlags().c_str());
  std::fflush(stdout);

  std::map<Mode, Tally> by_mode;
  Tally total;
  std::string note;
  auto last_progress = start;
  bool stop = false;
  auto summary = [&]() {
    for (const auto& [m, t] : by_mode)
      std::printf("  %s: %llu passed, %llu failed%s\n", std::string(ModeName(m)).c_str(),
                  static_cast<unsigned long long>(t.passed), static_cast<unsigned long long>(t.failed),
                  t.skipped > 0 ? fmt::format(", {} skipped", t.skipped).c_str() : "");
    if (!note.empty())
      std::printf("  %llu cases skipped: %s\n", static_cast<unsigned long long>(total.skipped), note.c_str());
    std::printf("%llu cases: %llu passed, %llu failed\n", static_cast<unsigned long long>(total.passed + total.failed),
                static_cast<unsigned long long>(total.passed), static_cast<unsigned long long>(total.failed));
    std::fflush(stdout);
  };
  auto sink = [&](const Case& c, const Outcome& o) {
    Tally& t = by_mode[c.world.mode];
    if (o.skipped) {
      ++t.skipped;
      ++total.skipped;
      return !stop;
    }
    (o.passed ? t.passed : t.failed)++;
    (o.passed ? total.passed : total.failed)++;
    const std::string what = fmt::format("seed={} case={} [{}] {}", seed, c.index, c.world.ToString(), c.ToString());
    if (!o.passed) {
      std::printf("FAIL %s: %s\n", what.c_str(), o.failures.empty() ? "" : o.failures[0].c_str());
      for (size_t i = 1; i < o.failures.size() && i < 8; ++i) std::printf("  %s\n", o.failures[i].c_str());
      if (o.failures.size() > 8) std::printf("  (%zu more)\n", o.failures.size() - 8);
      std::printf(
          "  reproduce: kizuna-crosscheck --seed %llu --only-case %llu %s %s (add --with-history for the "
          "batch's cases before it)\n",
          static_cast<unsigned long long>(seed), static_cast<unsigned long long>(c.index), mode_flag.c_str(),
          options.GenerationFlags().c_str());
    }
    const auto now = Clock::now();
    if (o.passed && verbose)
      std::printf("ok [%.1f s] %s\n", std::chrono::duration<double>(now - start).count(), what.c_str());
    if (now - last_progress > std::chrono::seconds(60)) {
      last_progress = now;
      std::printf("[%.0f s] %llu cases so far: %llu passed, %llu failed (resident memory %.0f MiB)\n",
                  std::chrono::duration<double>(now - start).count(),
                  static_cast<unsigned long long>(total.passed + total.failed),
                  static_cast<unsigned long long>(total.passed), static_cast<unsigned long long>(total.failed),
                  ResidentMiB());
    }
    std::fflush(stdout);
    if (max_failures > 0 && total.failed >= max_failures) stop = true;
    return !stop;
  };

  for (uint64_t batch = only_case ? *only_case / static_cast<uint64_t>(options.batch) : 0; !stop; ++batch) {
    BatchContext ctx;
    ctx.options = &options;
    ctx.seed = seed;
    ctx.batch = batch;
    ctx.world = MakeWorld(options, seed, batch);
    ctx.first = batch * static_cast<uint64_t>(options.batch);
    ctx.last = ctx.first + static_cast<uint64_t>(options.batch);
    if (only_case) {
      ctx.first = history ? ctx.first : *only_case;
      ctx.last = *only_case + 1;
    } else if (cases > 0) {
      if (ctx.first >= cases) break;
      ctx.last = std::min(ctx.last, cases);
    }
    if (deadline && Clock::now() >= *deadline) break;
    ctx.deadline = deadline;
    ctx.kizuna_run = kizuna_run;
    ctx.self = self;
    ctx.note = &note;
    if (verbose) {
      std::printf("world %llu: %s (resident memory %.0f MiB)\n", static_cast<unsigned long long>(batch),
                  ctx.world.ToString().c_str(), ResidentMiB());
      std::fflush(stdout);
    }
    if (in_process && ctx.world.mode != Mode::kProcesses)
      RunBatchInProcess(ctx, sink);
    else
      RunBatchInChildren(ctx, sink);
    if (only_case) break;
  }
  if (stop)
    std::printf("stopped after %llu failed cases (--max-failures)\n", static_cast<unsigned long long>(max_failures));
  summary();
  return total.failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace kizuna::crosscheck

int main(int argc, char** argv) { return kizuna::crosscheck::Main(argc, argv); }
