// A rank program for kizuna-run's test: bootstraps over TCP from the environment kizuna-run sets
// (BootstrapFromEnvironment), then checks an AllGather of different-size blobs, a ring of
// Send/Recv and a Barrier, and prints one line per check.
//
//   bootstrap_check [--pid-dir DIR] [--fail-rank R [--exit-code C] [--linger S]]
//
// --pid-dir: each rank writes its pid to DIR/rank.<r>.pid first (so a test can check that stopped
// ranks are gone). --fail-rank: after the checks, rank R exits with status C while the others
// sleep S seconds before their final Barrier (so kizuna-run has running ranks to stop).
// Exit status 0 when every check passed, 1 when one failed (the reason on stderr).

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"

namespace kizuna {
namespace {

bootstrap::Bytes Blob(int rank) {
  // Different sizes per rank, rank 1's empty; starts with the rank so a mix-up shows.
  std::string head = fmt::format("rank {};", rank);
  bootstrap::Bytes b(head.begin(), head.end());
  if (rank == 1) return {};
  for (int i = 0; i < rank * 300; ++i) b.push_back(static_cast<uint8_t>(rank * 7 + i));
  return b;
}

int Main(int argc, char** argv) {
  CLI::App app{"bootstrap_check: a kizuna-run test rank"};
  std::string pid_dir;
  int fail_rank = -1;
  int exit_code = 1;
  double linger_s = 0;
  app.add_option("--pid-dir", pid_dir, "write DIR/rank.<r>.pid");
  app.add_option("--fail-rank", fail_rank, "this rank exits with --exit-code after the checks");
  app.add_option("--exit-code", exit_code, "status of the failing rank");
  app.add_option("--linger", linger_s, "seconds the other ranks sleep before the last Barrier");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto made = bootstrap::BootstrapFromEnvironment();
  if (!made.ok()) {
    fmt::print(stderr, "bootstrap failed: {}\n", made.status().ToString());
    return 1;
  }
  bootstrap::Bootstrap& b = **made;
  const int me = b.rank();
  const int n = b.size();
  if (!pid_dir.empty()) std::ofstream(fmt::format("{}/rank.{}.pid", pid_dir, me)) << getpid() << "\n";
  auto deadline = [] { return Deadline::AfterSeconds(GlobalConfig().timeout_s); };
  auto fail = [&](std::string_view what, const Status& s) {
    fmt::print(stderr, "rank {}: {} failed: {}\n", me, what, s.ToString());
    return 1;
  };

  auto all = b.AllGather(Blob(me), deadline());
  if (!all.ok()) return fail("AllGather", all.status());
  for (int r = 0; r < n; ++r) {
    if ((*all)[r] != Blob(r)) return fail("AllGather", Internal(fmt::format("entry {} is wrong", r)));
  }
  fmt::print("rank {} of {}: allgather of {} blobs ok\n", me, n, n);

  int next = (me + 1) % n, prev = (me + n - 1) % n;
  std::string text = fmt::format("hello from rank {} to rank {}", me, next);
  Status s = b.Send(next, 1, bootstrap::Bytes(text.begin(), text.end()), deadline());
  if (!s.ok()) return fail("Send", s);
  auto got = b.Recv(prev, 1, deadline());
  if (!got.ok()) return fail("Recv", got.status());
  std::string expected = fmt::format("hello from rank {} to rank {}", prev, me);
  if (std::string(got->begin(), got->end()) != expected) return fail("Recv", Internal("wrong message"));
  fmt::print("rank {} of {}: ring send/recv ok\n", me, n);
  fmt::print(stderr, "rank {} of {}: this line went to stderr\n", me, n);
  std::fflush(stdout);

  if (me == fail_rank) {
    fmt::print("rank {}: failing on purpose with status {}\n", me, exit_code);
    std::fflush(stdout);
    return exit_code;
  }
  if (fail_rank >= 0 && linger_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(linger_s));
  s = b.Barrier(deadline());
  if (!s.ok()) return fail("Barrier", s);
  fmt::print("rank {} of {}: barrier ok\n", me, n);
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
