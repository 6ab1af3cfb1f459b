// kizuna-run: the local launcher. Starts N ranks of a program on this host, ready to bootstrap:
//
//   kizuna-run -n 8 [--timeout S] [--grace S] -- PROGRAM ARGS... [: -n M PROGRAM2 ARGS... ...]
//
// After ':', further programs run on further ranks (MPMD, as with mpirun), numbered after the
// ones before: "kizuna-run -n 8 -- worker : -n 2 kizuna-aggd" starts ranks 0-7 of worker and
// 8-9 of kizuna-aggd in one job (an INA job: collectives/ina).
//
// It makes a fresh UniqueId on 127.0.0.1 with a free port (the root, rank 0, listens there) and
// gives every rank RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (torchrun's names) and
// KIZUNA_UNIQUE_ID, so that BootstrapFromEnvironment() (runtime/bootstrap/launch_env.h) needs
// nothing else. Variables of other launchers in kizuna-run's own environment are not passed on.
// Every line the ranks print is prefixed with "[rank] " (stdout to stdout, stderr to stderr).
// When a rank fails, the others are stopped (SIGTERM, then SIGKILL after --grace seconds; with
// --keep-going they go on) and kizuna-run exits with the failed rank's status (128 + signal for a
// signal); --timeout stops everything and exits 124; SIGINT/SIGTERM/SIGHUP are forwarded to the
// ranks. Exit 2 for bad command-line input, 127 when the program cannot be executed.
//
// The free port is found by binding port 0 and releasing it: another process could take it in the
// moment before rank 0 binds it, and rank 0 then reports the port as in use.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/unique_fd.h"
#include "tools/run/launcher.h"

namespace kizuna {
namespace {

Result<uint16_t> FreeLoopbackPort() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return FromErrno(errno, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return FromErrno(errno, "bind(127.0.0.1:0)");
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return FromErrno(errno, "getsockname");
  return ntohs(a.sin_port);
}

// Kept whole: the command line (with its ':'-separated apps) and its checks, in order, then one launch.
int Main(int argc, char** argv) {
  CLI::App app{
      "kizuna-run: start N ranks of PROGRAM on this host with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and "
      "KIZUNA_UNIQUE_ID set; their output is prefixed with [rank]; when one fails the others are stopped and its "
      "exit status is kizuna-run's.",
      "kizuna-run"};
  run::LaunchOptions options;
  app.add_option("-n,--np", options.nprocs, fmt::format("number of ranks (1..{})", run::kMaxProcs))->required();
  app.add_option("--timeout", options.timeout_s, "stop everything after S seconds and exit 124 (0: no limit)")
      ->capture_default_str();
  app.add_option("--grace", options.grace_s, "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  app.add_flag("--keep-going", options.keep_going,
               "a rank that fails does not stop the others (jobs that shrink their communicators around a lost "
               "rank); the exit status is still the first failure's");
  std::string bind = "none";
  app.add_option("--bind-to", bind,
                 "core: pin rank r to the r-th CPU kizuna-run may use (a CPU per rank); core:overload-allowed: the "
                 "same with more ranks than CPUs, rank r on CPU r mod C (evenly, which the kernel's balancing does "
                 "not keep for ranks that yield to each other); none")
      ->check(CLI::IsMember({"core", "core:overload-allowed", "none"}))
      ->capture_default_str();
  // Everything from PROGRAM on belongs to the program, options included.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  options.bind_to_core = bind != "none";
  options.bind_overload = bind == "core:overload-allowed";
  options.command = app.remaining();
  if (!options.command.empty() && options.command.front() == "--") options.command.erase(options.command.begin());
  // Split off "... : -n M PROGRAM2 ARGS" segments.
  {
    std::vector<std::vector<std::string>> segments(1);
    for (std::string& a : options.command) {
      if (a == ":") segments.emplace_back();
      else segments.back().push_back(std::move(a));
    }
    options.command = std::move(segments[0]);
    for (size_t i = 1; i < segments.size(); ++i) {
      std::vector<std::string>& seg = segments[i];
      run::LaunchOptions::App more;
      if (seg.size() < 3 || (seg[0] != "-n" && seg[0] != "--np")) {
        fmt::print(stderr, "kizuna-run: after ':' expected '-n M PROGRAM ARGS...'\n");
        return 2;
      }
      try {
        size_t used = 0;
        more.nprocs = std::stoi(seg[1], &used);
        if (used != seg[1].size()) throw std::invalid_argument(seg[1]);
      } catch (const std::exception&) {  // std::stoi reports bad input by exception; it ends here
        fmt::print(stderr, "kizuna-run: after ':': -n {}: not a number\n", seg[1]);
        return 2;
      }
      size_t from = 2;
      if (seg[from] == "--") ++from;
      if (from >= seg.size() || more.nprocs < 1) {
        fmt::print(stderr, "kizuna-run: after ':' expected '-n M PROGRAM ARGS...' with M >= 1\n");
        return 2;
      }
      more.command.assign(seg.begin() + static_cast<ptrdiff_t>(from), seg.end());
      options.more.push_back(std::move(more));
    }
  }
  if (options.command.empty()) {
    fmt::print(stderr,
               "kizuna-run: no program given\nusage: kizuna-run -n N [--timeout S] [--grace S] -- PROGRAM ARGS...\n");
    return 2;
  }
  if (options.command.front().starts_with("-")) {
    fmt::print(stderr, "kizuna-run: unknown option '{}' (put the program after --)\n", options.command.front());
    return 2;
  }
  if (options.nprocs < 1 || options.nprocs > run::kMaxProcs) {
    fmt::print(stderr, "kizuna-run: -n {}: expected 1..{}\n", options.nprocs, run::kMaxProcs);
    return 2;
  }
  if (!(options.timeout_s >= 0) || !(options.grace_s >= 0)) {
    fmt::print(stderr, "kizuna-run: --timeout and --grace take non-negative seconds\n");
    return 2;
  }

  Result<uint16_t> port = FreeLoopbackPort();
  Result<bootstrap::Secret> secret = bootstrap::RandomSecret();
  if (!port.ok() || !secret.ok()) {
    fmt::print(stderr, "kizuna-run: cannot make a unique id: {}\n",
               (port.ok() ? secret.status() : port.status()).ToString());
    return 1;
  }
  bootstrap::UniqueId id;
  id.root = bootstrap::HostPort{"127.0.0.1", *port};
  id.secret = *secret;
  options.unique_id = id.ToString();
  options.environment = bootstrap::ProcessEnvironment();

  // A reader of kizuna-run's output that goes away must not kill it (and, through
  // PR_SET_PDEATHSIG, the ranks) with SIGPIPE; the ranks get the default disposition back.
  signal(SIGPIPE, SIG_IGN);
  Result<run::LaunchResult> result = run::Launch(options);
  if (!result.ok()) {
    fmt::print(stderr, "kizuna-run: {}\n", result.status().message());
    return result.status().code() == StatusCode::kInvalidArgument ? 127 : 1;
  }
  return result->exit_code;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
