#include "tools/crosscheck/driver.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "tools/crosscheck/runner.h"

extern char** environ;

namespace kizuna::crosscheck {
namespace {

using Clock = std::chrono::steady_clock;

// How long a world's destruction may take (each communicator waits for its queued operations).
constexpr double kDisposeSeconds = 60;
// Lines of a job's own output (not the workers' reports) kept for a failure's report.
constexpr size_t kTailLines = 12;
constexpr const char* kTag = "@crosscheck ";

bool Expired(const BatchContext& ctx) { return ctx.deadline && Clock::now() >= *ctx.deadline; }

// A call that does not return even after Abort: its threads still use the world, which therefore
// cannot be destroyed. The process ends at once (a child: its parent reports the case).
[[noreturn]] void GiveUp(const std::string& why) {
  std::printf("%s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

// Destroys a world within kDisposeSeconds: a communicator that cannot be destroyed ends the process.
void Dispose(const BatchContext& ctx, std::unique_ptr<LocalWorld>& world) {
  if (world == nullptr) return;
  std::shared_ptr<LocalWorld> owned(world.release());
  if (!FinishesWithin(kDisposeSeconds, [owned]() mutable { owned.reset(); }))
    GiveUp(fmt::format("the world [{}] was not destroyed within {} s", ctx.world.ToString(), kDisposeSeconds));
}

void SkipRest(const BatchContext& ctx, uint64_t from, const std::string& why, const CaseSink& sink) {
  if (ctx.note != nullptr && ctx.note->empty()) *ctx.note = why;
  Outcome o;
  o.skipped = true;
  for (uint64_t k = from; k < ctx.last; ++k)
    if (ctx.options->drop.count(k) == 0 && !sink(MakeCase(*ctx.options, ctx.seed, k, ctx.world), o)) return;
}

// One line of the worker's report, whole (the driver reads lines).
void Report(const std::string& line) {
  std::string one = line;
  for (char& ch : one)
    if (ch == '\n' || ch == '\r') ch = ' ';
  std::printf("%s%s\n", kTag, one.c_str());
  std::fflush(stdout);
}

struct JobResult {
  int status = 0;  // exit status; 128 + signal
  bool timed_out = false;
  std::vector<std::string> lines;
};

// Runs argv with `env` added to (and `unset` removed from) this process's environment, its
// stdout and stderr read as lines, for at most `seconds` (then SIGTERM, and SIGKILL 10 s later).
JobResult RunJob(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                 const std::set<std::string>& unset, double seconds) {
  JobResult result;
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (env.count(name) == 0 && unset.count(name) == 0) env_strings.push_back(entry);
  }
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    result.status = 127;
    result.lines.push_back(fmt::format("pipe: {}", std::strerror(errno)));
    return result;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    result.status = 127;
    result.lines.push_back(fmt::format("fork: {}", std::strerror(errno)));
    return result;
  }
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::string partial;
  bool terminated = false;
  auto kill_at = Clock::time_point::max();
  char buf[65536];
  for (;;) {
    const auto now = Clock::now();
    if (!terminated && now >= deadline) {
      result.timed_out = true;
      kill(pid, SIGTERM);
      terminated = true;
      kill_at = now + std::chrono::seconds(10);
    }
    if (terminated && now >= kill_at) kill(pid, SIGKILL);
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, 500);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t got = read(fds[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    partial.append(buf, static_cast<size_t>(got));
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      result.lines.push_back(partial.substr(0, nl));
      partial.erase(0, nl + 1);
    }
  }
  if (!partial.empty()) result.lines.push_back(partial);
  close(fds[0]);
  int status = 0;
  // The output closed: the job is ending; a launcher that lingers is stopped.
  for (int waited = 0; waitpid(pid, &status, WNOHANG) == 0; ++waited) {
    if (waited == 200) kill(pid, SIGKILL);
    usleep(50000);
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// What the reporters (the ranks of a job, or a local child) said about one case.
struct Reports {
  std::map<int, std::string> done;  // reporter -> "ok" / "failed" / "broken" / "skipped"
  std::map<int, std::string> hash;  // reporter -> hex or "-"
  std::vector<std::string> failures;
};

// The environment of a batch's children: the world's configuration as KIZUNA_* variables (the
// workers also set it in their Config), libfabric's tcp provider on the loopback interface.
void WorldEnvironment(const BatchContext& ctx, std::map<std::string, std::string>* env, std::set<std::string>* unset) {
  const WorldSpec& w = ctx.world;
  *env = {
      {"KIZUNA_EMULATED_DEVICES", std::to_string(w.devices)},
      {"KIZUNA_TIMEOUT", fmt::format("{}", ctx.options->timeout_s)},
      {"KIZUNA_DETERMINISTIC", w.deterministic ? "1" : "0"},
      {"KIZUNA_EMU_OPAQUE", w.opaque ? "1" : "0"},
      {"KIZUNA_EMU_SYNC_FREE", w.sync_free ? "1" : "0"},
      {"KIZUNA_FABRIC", w.ofi ? "ofi" : "directconnect"},
  };
  *unset = {"KIZUNA_ALGO",          "KIZUNA_DEVICE",        "KIZUNA_CHUNK_BYTES",    "KIZUNA_TOPOLOGY",
            "KIZUNA_EMU_LAUNCH_US", "KIZUNA_EMU_COPY_GBPS", "KIZUNA_EMU_REDUCE_GBPS"};
  if (w.chunk_bytes > 0) (*env)["KIZUNA_CHUNK_BYTES"] = std::to_string(w.chunk_bytes);
  if (w.throttled) {
    (*env)["KIZUNA_EMU_LAUNCH_US"] = fmt::format("{}", kThrottleLaunchUs);
    (*env)["KIZUNA_EMU_COPY_GBPS"] = fmt::format("{}", kThrottleGbps);
    (*env)["KIZUNA_EMU_REDUCE_GBPS"] = fmt::format("{}", kThrottleGbps);
  }
  if (w.ofi) {
    (*env)["FI_PROVIDER"] = "tcp";
    (*env)["FI_TCP_IFACE"] = "lo";
  } else {
    (*env)["KIZUNA_TOPOLOGY"] = "full";
  }
}

}  // namespace

void RunBatchInProcess(const BatchContext& ctx, const CaseSink& sink) {
  const double timeout = ctx.options->timeout_s;
  std::unique_ptr<LocalWorld> world;
  for (uint64_t k = ctx.first; k < ctx.last; ++k) {
    if (Expired(ctx)) break;
    if (ctx.options->drop.count(k) != 0) continue;
    const Case c = MakeCase(*ctx.options, ctx.seed, k, ctx.world);
    Outcome o;
    if (world == nullptr) {
      auto made = LocalWorld::Create(ctx.world, timeout);
      if (!made.ok()) {
        if (ctx.world.ofi && made.status().code() == StatusCode::kUnavailable)
          return SkipRest(ctx, k, "worlds over ofi skipped: " + made.status().ToString(), sink);
        o.failures.push_back("creating the world: " + made.status().ToString());
        sink(c, o);
        return;  // the batch's other cases are not run
      }
      world = std::move(*made);
    }
    CaseResult r = RunCase(*world, c, timeout, ctx.options->corrupt_case == k);
    o.failures = std::move(r.failures);
    o.passed = o.failures.empty();
    if (r.stuck) {
      sink(c, o);
      GiveUp(fmt::format("case {}: a call does not return even after Abort: the batch cannot go on", k));
    }
    if (r.broken) {
      world->AbortAll();
      Dispose(ctx, world);
    }
    if (!sink(c, o)) break;
  }
  Dispose(ctx, world);
}

void RunBatchInChildren(const BatchContext& ctx, const CaseSink& sink) {
  const Options& options = *ctx.options;
  const bool job = ctx.world.mode == Mode::kProcesses;
  const int reporters = job ? ctx.world.nranks : 1;
  std::map<std::string, std::string> env;
  std::set<std::string> unset;
  WorldEnvironment(ctx, &env, &unset);

  uint64_t start = ctx.first;
  while (start < ctx.last) {
    if (Expired(ctx)) return;
    const uint64_t cases = ctx.last - start;
    // Each case bounds its own calls (timeout + 60 s with the abort); this is the last resort.
    const double job_seconds = 120 + static_cast<double>(cases) * (options.timeout_s + 60);
    std::vector<std::string> argv;
    if (job) {
      argv = {ctx.kizuna_run,
              "-n",
              std::to_string(ctx.world.nranks),
              "--timeout",
              fmt::format("{}", job_seconds),
              "--",
              ctx.self,
              "--worker"};
    } else {
      argv = {ctx.self, "--local-worker"};
      // A local child stops starting cases at the run's deadline (a job's ranks could not agree on it).
      if (ctx.deadline) {
        const double left = std::chrono::duration<double>(*ctx.deadline - Clock::now()).count();
        argv.push_back("--seconds");
        argv.push_back(fmt::format("{:.3f}", std::max(left, 0.001)));
      }
    }
    for (const std::string& a :
         {std::string("--seed"), std::to_string(ctx.seed), std::string("--batch-index"), std::to_string(ctx.batch),
          std::string("--first"), std::to_string(start), std::string("--last"), std::to_string(ctx.last),
          std::string("--timeout"), fmt::format("{}", options.timeout_s)})
      argv.push_back(a);
    if (options.mode) {
      argv.push_back("--mode");
      argv.push_back(std::string(ModeName(*options.mode)));
    }
    for (const std::string& a : options.GenerationArgs()) argv.push_back(a);
    const JobResult result = RunJob(argv, env, unset, job_seconds + 30);

    std::map<uint64_t, Reports> reports;
    std::set<int> ended;
    std::deque<std::string> tail;
    std::string create_error;
    bool unavailable = false;
    for (const std::string& line : result.lines) {
      // "[r] @crosscheck K ..." (kizuna-run prefixes every line with its rank) or "@crosscheck K ...".
      int reporter = 0;
      size_t at = std::string::npos;
      if (line.compare(0, std::strlen(kTag), kTag) == 0) {
        at = std::strlen(kTag);
      } else if (line.size() > 2 && line[0] == '[') {
        const size_t close = line.find("] ");
        if (close != std::string::npos && line.compare(close + 2, std::strlen(kTag), kTag) == 0) {
          reporter = std::atoi(line.c_str() + 1);
          at = close + 2 + std::strlen(kTag);
        }
      }
      if (at == std::string::npos) {
        tail.push_back(line);
        if (tail.size() > kTailLines) tail.pop_front();
        continue;
      }
      const std::string rest = line.substr(at);
      if (rest == "end") {
        ended.insert(reporter);
        continue;
      }
      if (rest.rfind("note ", 0) == 0) {
        if (ctx.note != nullptr && ctx.note->empty()) *ctx.note = rest.substr(5);
        continue;
      }
      if (rest.rfind("create ", 0) == 0) {
        unavailable = unavailable || rest.rfind("create unavailable ", 0) == 0;
        if (create_error.empty())
          create_error = fmt::format("rank {}: {}", reporter, rest.substr(rest.find(' ', 7) + 1));
        continue;
      }
      char* end = nullptr;
      const uint64_t k = std::strtoull(rest.c_str(), &end, 10);
      const std::string what = end != nullptr && *end == ' ' ? std::string(end + 1) : std::string();
      Reports& rep = reports[k];
      if (what.rfind("fail ", 0) == 0) {
        rep.failures.push_back(what.substr(5));
      } else if (what.rfind("done ", 0) == 0) {
        const std::string words = what.substr(5);
        const size_t space = words.find(' ');
        rep.done[reporter] = words.substr(0, space);
        rep.hash[reporter] = space == std::string::npos ? "-" : words.substr(space + 1);
      }
    }
    if (!create_error.empty()) {
      if (unavailable && ctx.world.ofi) return SkipRest(ctx, start, "worlds over ofi skipped: " + create_error, sink);
      Outcome o;
      o.failures.push_back("creating the world: " + create_error);
      sink(MakeCase(options, ctx.seed, start, ctx.world), o);
      return;
    }

    uint64_t k = start;
    for (; k < ctx.last; ++k) {
      if (options.drop.count(k) != 0) continue;
      const Case c = MakeCase(options, ctx.seed, k, ctx.world);
      Reports& rep = reports[k];
      Outcome o;
      o.failures = rep.failures;
      if (static_cast<int>(rep.done.size()) == reporters) {
        std::string hashes;
        std::set<std::string> distinct;
        for (const auto& [rank, h] : rep.hash) {
          hashes += fmt::format("{}rank {}: {}", hashes.empty() ? "" : ", ", rank, h);
          if (h != "-") distinct.insert(h);
        }
        if (distinct.size() > 1) o.failures.push_back("the ranks hold different AllReduce results (" + hashes + ")");
        bool skipped = false;
        for (const auto& [rank, d] : rep.done) {
          skipped = skipped || d == "skipped";
          if (d != "ok" && d != "skipped" && rep.failures.empty())
            o.failures.push_back(fmt::format("rank {} reported {}", rank, d));
        }
        o.skipped = skipped && o.failures.empty();
        o.passed = o.failures.empty() && !o.skipped;
        if (!sink(c, o)) return;
        continue;
      }
      // Every child ended normally before this case: the run's deadline came.
      if (static_cast<int>(ended.size()) == reporters && rep.done.empty()) return;
      // The child (or the job) ended inside this case.
      std::string missing;
      for (int r = 0; r < reporters; ++r)
        if (rep.done.count(r) == 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      std::string last_lines;
      for (const std::string& l : tail) last_lines += " | " + l;
      o.failures.push_back(fmt::format("no result from {} {}: {} exited with status {}{}; its last lines:{}",
                                       job ? "rank(s)" : "the batch's process", job ? missing : std::string(),
                                       job ? "kizuna-run" : "it", result.status,
                                       result.timed_out ? " (stopped at its deadline)" : "", last_lines));
      if (!sink(c, o)) return;
      ++k;
      break;
    }
    start = k;
  }
}

int LocalWorkerMain(const BatchContext& ctx) {
  std::string note;
  BatchContext local = ctx;
  local.note = &note;
  RunBatchInProcess(local, [](const Case& c, const Outcome& o) {
    for (const std::string& f : o.failures) Report(fmt::format("{} fail {}", c.index, f));
    Report(fmt::format("{} done {} -", c.index, o.skipped ? "skipped" : o.passed ? "ok" : "failed"));
    return true;
  });
  if (!note.empty()) Report("note " + note);
  Report("end");
  return 0;
}

int ProcessWorkerMain(const BatchContext& ctx) {
  const Options& options = *ctx.options;
  if (ctx.world.mode != Mode::kProcesses) {
    std::fprintf(stderr, "kizuna-crosscheck --worker: batch %llu is a %s batch, not a processes one\n",
                 static_cast<unsigned long long>(ctx.batch), std::string(ModeName(ctx.world.mode)).c_str());
    return 2;
  }
  auto made = ProcessRank::Create(ctx.world, options.timeout_s);
  if (!made.ok()) {
    const bool unavailable = made.status().code() == StatusCode::kUnavailable;
    Report(fmt::format("create {} {}", unavailable ? "unavailable" : "error", made.status().ToString()));
    return 3;
  }
  ProcessRank& rank = **made;
  for (uint64_t k = ctx.first; k < ctx.last; ++k) {
    if (options.drop.count(k) != 0) continue;
    const Case c = MakeCase(options, ctx.seed, k, ctx.world);
    CaseResult r = RunCase(rank, c, options.timeout_s, options.corrupt_case == k);
    for (const std::string& f : r.failures) Report(fmt::format("{} fail {}", k, f));
    const std::string hash = r.hashes.empty() ? "-" : fmt::format("{:016x}", r.hashes[0].second);
    Report(fmt::format("{} done {} {}", k, r.broken ? "broken" : r.failures.empty() ? "ok" : "failed", hash));
    if (r.stuck) std::_Exit(4);
    if (r.broken) {
      rank.AbortAll();
      std::fflush(stdout);
      std::_Exit(3);
    }
  }
  Report("end");
  return 0;
}

}  // namespace kizuna::crosscheck
