// The machinery of kizuna-run: start N ranks of one program on this host, forward their output
// with a rank prefix, stop them all when one fails, the time runs out, or kizuna-run is
// interrupted, and work out kizuna-run's exit status.
//
// Each rank is its own process group (so stopping a rank also stops what it started) with stdin
// from /dev/null, stdout and stderr on pipes that this process reads with poll(), and
// PR_SET_PDEATHSIG=SIGKILL (if kizuna-run itself is killed, the ranks do not outlive it).
//
// Exit status (LaunchResult::exit_code):
//   0          every rank exited with status 0
//   the first failure's status: its exit code, or 128 + signal number when a signal ended it
//   124        the --timeout passed first (like timeout(1))
//   128 + sig  kizuna-run received SIGINT, SIGTERM or SIGHUP first (it forwards the signal)
// "First" is what kizuna-run saw first; ranks it stopped afterwards do not count as failures.
// Stopping: the signal (SIGTERM, or the one received) to every running rank's process group, then
// SIGKILL to those still running after the grace period.
#pragma once

#include <unistd.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::run {

using Environment = std::map<std::string, std::string>;

// Splits a byte stream into lines and writes each with a prefix ("[3] "). A line longer than
// max_line is cut into pieces, each prefixed, so memory stays bounded.
class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix, size_t max_line = 64 * 1024)
      : prefix_(std::move(prefix)), max_line_(max_line) {}

  // Appends every complete line of `bytes` to `out`, prefixed; keeps an unfinished last line.
  void Feed(std::string_view bytes, std::string& out);
  // End of stream: appends the unfinished line, if any, with a newline.
  void Finish(std::string& out);

 private:
  std::string prefix_;
  size_t max_line_;
  std::string partial_;
};

// The environment of rank `rank`: `base` without the variables of other launchers (RANK,
// OMPI_COMM_WORLD_*, PMI_*, SLURM_PROCID, MASTER_ADDR, KIZUNA_ROOT, KIZUNA_UNIQUE_ID_FILE, ...), plus
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (all ranks are on this host) and KIZUNA_UNIQUE_ID.
Environment RankEnvironment(const Environment& base, int rank, int size, const std::string& unique_id);

// The executable `name` names: itself when it contains a '/', else the first match in `path`
// (colon-separated). kInvalidArgument naming it when it is missing or not executable.
Result<std::string> FindProgram(const std::string& name, const std::string& path);

struct LaunchOptions {
  int nprocs = 1;                    // 1..kMaxProcs
  std::vector<std::string> command;  // PROGRAM ARGS...
  // Further programs after the first (MPMD, as mpirun's "-n 8 a : -n 2 b"): each runs on `nprocs`
  // more ranks, numbered after the ranks before it. The world is nprocs plus all of theirs.
  struct App {
    int nprocs = 1;
    std::vector<std::string> command;
  };
  std::vector<App> more;
  double timeout_s = 0;              // the whole run; 0: no limit
  double grace_s = 5;                // between the stop signal and SIGKILL
  // A rank that fails does not stop the others (jobs that continue without it: Communicator::
  // Shrink); the exit status is still the first failure's, once every rank has ended.
  bool keep_going = false;
  // Pin rank r to the r-th CPU this process may run on (mpirun's --bind-to core); refused when
  // the ranks outnumber those CPUs, unless `bind_overload`: then rank r goes to CPU r mod C, the
  // same number of ranks (give or take one) on each (mpirun's core:overload-allowed).
  bool bind_to_core = false;
  bool bind_overload = false;
  Environment environment;           // the ranks' base environment (usually kizuna-run's own)
  std::string unique_id;             // KIZUNA_UNIQUE_ID given to every rank
  int out_fd = STDOUT_FILENO;        // where the ranks' prefixed stdout goes
  int err_fd = STDERR_FILENO;        // ... their stderr, and kizuna-run's own messages
};

inline constexpr int kMaxProcs = 4096;

struct RankOutcome {
  int pid = 0;
  bool exited = false;     // exit(code)
  int code = 0;            // exit code, or the signal number when !exited
  bool stopped_by_us = false;  // it was still running when kizuna-run began stopping the ranks
};

struct LaunchResult {
  int exit_code = 0;
  int first_failure = -1;  // the rank that failed first, or -1
  bool timed_out = false;
  int interrupted_by = 0;  // signal kizuna-run received, or 0
  std::vector<RankOutcome> ranks;
};

// Runs the ranks to completion. Errors are for what prevents a start (bad options, the program
// cannot be found or executed, no more processes): ranks already started are stopped first. While
// it runs, SIGINT, SIGTERM and SIGHUP are blocked in the calling thread and read through a
// signalfd; call it from a single-threaded process (kizuna-run's main), or those signals may go
// to another thread. Progress messages ("kizuna-run: rank 2 exited with status 3; stopping 3
// ranks") go to err_fd.
Result<LaunchResult> Launch(const LaunchOptions& options);

}  // namespace kizuna::run
