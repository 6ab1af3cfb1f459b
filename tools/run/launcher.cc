#include "tools/run/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "runtime/core/deadline.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::run {
namespace {

using Clock = Deadline::Clock;

// The variables of launchers other than this one: a rank must not see two launchers' views.
constexpr std::string_view kForeignLauncherVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "KIZUNA_UNIQUE_ID", "KIZUNA_UNIQUE_ID_FILE", "KIZUNA_ROOT",
};

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? fmt::format("SIG{}", abbrev) : fmt::format("signal {}", sig);
}

// Writes all of `text` to `fd`. A reader that went away (EPIPE) loses the output, nothing else.
void WriteOut(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 1000);
      continue;
    }
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

template <typename... Args>
void Say(int fd, fmt::format_string<Args...> format, Args&&... args) {
  WriteOut(fd, "kizuna-run: " + fmt::format(format, std::forward<Args>(args)...) + "\n");
}

std::string Describe(const RankOutcome& o) {
  if (o.exited) return fmt::format("exited with status {}", o.code);
  return fmt::format("was killed by {}", SignalName(o.code));
}

int StatusOf(const RankOutcome& o) { return o.exited ? o.code : 128 + o.code; }

// One rank's process and its two output pipes.
struct Rank {
  int index = 0;
  pid_t pid = 0;
  UniqueFd pidfd;
  bool running = false;
  RankOutcome outcome;
  UniqueFd out, err;
  LinePrefixer out_lines, err_lines;
  explicit Rank(int i) : index(i), out_lines(fmt::format("[{}] ", i)), err_lines(fmt::format("[{}] ", i)) {}
};

// Converts an environment map to the "NAME=value" strings execve takes.
std::vector<std::string> EnvStrings(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

class Runner {
 public:
  explicit Runner(const LaunchOptions& o) : o_(o) {}
  ~Runner();
  Result<LaunchResult> Run();

 private:
  Status Start(const std::vector<std::string>& paths);
  Status StartRank(Rank& r, const std::string& path, const sigset_t& child_mask);
  // The program of rank i (LaunchOptions::more), and which of the apps it belongs to.
  size_t AppOf(int i) const;
  const std::vector<std::string>& CommandOf(int i) const {
    return AppOf(i) == 0 ? o_.command : o_.more[AppOf(i) - 1].command;
  }
  int World() const {
    int n = o_.nprocs;
    for (const LaunchOptions::App& a : o_.more) n += a.nprocs;
    return n;
  }
  void BeginStop(int signal);
  void Reap(Rank& r);
  void Pump(UniqueFd& fd, LinePrefixer& lines, int to);
  // Run's steps: checks the options and finds each app's program (its path, per app), and the
  // CPUs to bind to; stops the ranks at the timeout and kills them after the grace period; acts
  // on the signals that arrived; sets the result's exit code, saying why when it is not 0.
  Result<std::vector<std::string>> Prepare();
  void CheckTimers(Clock::time_point now, std::optional<Clock::time_point> end_at);
  void OnSignals();
  void Finish();
  int Running() const {
    int n = 0;
    for (const Rank& r : ranks_) n += r.running;
    return n;
  }

  const LaunchOptions& o_;
  std::vector<int> cpus_;  // --bind-to core: the CPUs to bind to, in rank order
  std::vector<Rank> ranks_;
  UniqueFd signal_fd_;
  sigset_t old_mask_{};
  bool mask_changed_ = false;
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;
  std::optional<Clock::time_point> kill_at_;
  bool killed_ = false;
  LaunchResult result_;
};

Runner::~Runner() {
  // Whatever happened, no rank outlives the run.
  for (Rank& r : ranks_) {
    if (!r.running) continue;
    kill(-r.pid, SIGKILL);
    kill(r.pid, SIGKILL);
    waitpid(r.pid, nullptr, 0);  // SIGKILL cannot be caught: this returns at once
  }
  if (mask_changed_) pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

Status Runner::StartRank(Rank& r, const std::string& path, const sigset_t& child_mask) {
  int out[2], err[2], report[2];
  if (pipe2(out, O_CLOEXEC) != 0) return FromErrno(errno, "pipe2");
  UniqueFd out_r(out[0]), out_w(out[1]);
  if (pipe2(err, O_CLOEXEC) != 0) return FromErrno(errno, "pipe2");
  UniqueFd err_r(err[0]), err_w(err[1]);
  // The child reports a failed exec here; a successful exec closes it (O_CLOEXEC).
  if (pipe2(report, O_CLOEXEC) != 0) return FromErrno(errno, "pipe2");
  UniqueFd report_r(report[0]), report_w(report[1]);
  UniqueFd null_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_fd.valid()) return FromErrno(errno, "open(/dev/null)");

  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> argv_strings = CommandOf(r.index);
  std::vector<char*> argv = Pointers(argv_strings);
  std::vector<std::string> env_strings = EnvStrings(RankEnvironment(o_.environment, r.index, World(), o_.unique_id));
  std::vector<char*> envp = Pointers(env_strings);
  const pid_t parent = getpid();
  const bool bind = !cpus_.empty();
  cpu_set_t cpu;
  CPU_ZERO(&cpu);
  if (bind) CPU_SET(cpus_[static_cast<size_t>(r.index) % cpus_.size()], &cpu);

  pid_t pid = fork();
  if (pid < 0) return FromErrno(errno, "fork");
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // kizuna-run died before the line above
    signal(SIGPIPE, SIG_DFL);             // kizuna-run ignores it; the program gets the default
    sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    if ((bind && sched_setaffinity(0, sizeof(cpu), &cpu) != 0) || dup2(null_fd.get(), STDIN_FILENO) < 0 ||
        dup2(out_w.get(), STDOUT_FILENO) < 0 || dup2(err_w.get(), STDERR_FILENO) < 0) {
      int e = errno;
      (void)!write(report_w.get(), &e, sizeof(e));
      _exit(127);
    }
    execve(path.c_str(), argv.data(), envp.data());
    int e = errno;
    (void)!write(report_w.get(), &e, sizeof(e));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a kill(-pid) right after fork finds the group
  r.pid = pid;
  r.running = true;
  r.outcome.pid = pid;
  report_w.Reset();
  out_w.Reset();
  err_w.Reset();
  r.out = std::move(out_r);
  r.err = std::move(err_r);
  // Through syscall(): glibc 2.36's <sys/pidfd.h> declares pidfd_open without C linkage for C++.
  r.pidfd.Reset(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!r.pidfd.valid()) return FromErrno(errno, "pidfd_open");

  // Wait for exec (EOF) or its failure (an errno), bounded: a child that cannot even exec within
  // this time is stuck in the kernel.
  int child_errno = 0;
  size_t got = 0;
  Deadline deadline = Deadline::AfterSeconds(30);
  while (got < sizeof(child_errno)) {
    pollfd p{report_r.get(), POLLIN, 0};
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count());
    int pr = poll(&p, 1, std::max(ms, 0));
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) return Timeout(fmt::format("rank {}: the new process did not start '{}' within 30 s", r.index, path));
    ssize_t n = read(report_r.get(), reinterpret_cast<char*>(&child_errno) + got, sizeof(child_errno) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: exec succeeded
    got += static_cast<size_t>(n);
  }
  if (got == sizeof(child_errno))
    return InvalidArgument(fmt::format("cannot execute '{}': {}", path, std::strerror(child_errno)));
  return Status::Ok();
}

size_t Runner::AppOf(int i) const {
  int first = o_.nprocs;
  if (i < first) return 0;
  for (size_t a = 0; a < o_.more.size(); ++a) {
    first += o_.more[a].nprocs;
    if (i < first) return a + 1;
  }
  return o_.more.size();
}

Status Runner::Start(const std::vector<std::string>& paths) {
  // SIGINT/SIGTERM/SIGHUP arrive through a signalfd, in the poll loop with everything else.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  if (pthread_sigmask(SIG_BLOCK, &mask, &old_mask_) != 0) return Internal("pthread_sigmask failed");
  mask_changed_ = true;
  signal_fd_.Reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signal_fd_.valid()) return FromErrno(errno, "signalfd");
  const int world = World();
  ranks_.reserve(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) {
    ranks_.emplace_back(i);
    KZ_RETURN_IF_ERROR(
        StartRank(ranks_.back(), paths[AppOf(i)], old_mask_).WithContext(fmt::format("starting rank {}", i)));
  }
  return Status::Ok();
}

void Runner::BeginStop(int sig) {
  if (stopping_) return;
  stopping_ = true;
  stop_signal_ = sig;
  int n = 0;
  for (Rank& r : ranks_) {
    if (!r.running) continue;
    r.outcome.stopped_by_us = true;
    kill(-r.pid, sig);
    ++n;
  }
  if (n > 0) {
    Say(o_.err_fd, "sent {} to {} running rank{}; SIGKILL in {:.1f} s if they do not exit", SignalName(sig), n,
        n == 1 ? "" : "s", o_.grace_s);
  }
  kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_s));
}

void Runner::Reap(Rank& r) {
  int status = 0;
  pid_t got = waitpid(r.pid, &status, WNOHANG);
  if (got != r.pid) return;
  r.running = false;
  r.pidfd.Reset();
  if (WIFEXITED(status)) {
    r.outcome.exited = true;
    r.outcome.code = WEXITSTATUS(status);
  } else {
    r.outcome.exited = false;
    r.outcome.code = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  bool failed = !(r.outcome.exited && r.outcome.code == 0);
  if (failed && !stopping_ && o_.keep_going) {
    if (result_.first_failure < 0) result_.first_failure = r.index;
    Say(o_.err_fd, "rank {} {}; the others go on (--keep-going)", r.index, Describe(r.outcome));
  } else if (failed && !stopping_) {
    result_.first_failure = r.index;
    Say(o_.err_fd, "rank {} {}; stopping the other ranks", r.index, Describe(r.outcome));
    BeginStop(SIGTERM);
  } else if (failed && !r.outcome.stopped_by_us) {
    Say(o_.err_fd, "rank {} {}", r.index, Describe(r.outcome));
  }
}

void Runner::Pump(UniqueFd& fd, LinePrefixer& lines, int to) {
  char buf[64 * 1024];
  ssize_t n = read(fd.get(), buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  std::string text;
  if (n <= 0) {
    lines.Finish(text);
    fd.Reset();
  } else {
    lines.Feed(std::string_view(buf, static_cast<size_t>(n)), text);
  }
  WriteOut(to, text);
}

Result<std::vector<std::string>> Runner::Prepare() {
  if (o_.nprocs < 1 || o_.nprocs > kMaxProcs)
    return InvalidArgument(fmt::format("-n {}: expected 1..{}", o_.nprocs, kMaxProcs));
  if (o_.command.empty()) return InvalidArgument("no program given (kizuna-run -n N -- PROGRAM ARGS...)");
  if (!(o_.timeout_s >= 0) || !(o_.grace_s >= 0))
    return InvalidArgument("--timeout and --grace must be non-negative numbers of seconds");
  for (const LaunchOptions::App& a : o_.more) {
    if (a.command.empty()) return InvalidArgument("an empty program after ':'");
    if (a.nprocs < 1) return InvalidArgument(fmt::format("-n {} after ':': expected at least 1", a.nprocs));
  }
  if (World() > kMaxProcs) return InvalidArgument(fmt::format("{} ranks in all: at most {}", World(), kMaxProcs));
  auto path_it = o_.environment.find("PATH");
  std::vector<std::string> paths;
  for (size_t a = 0; a <= o_.more.size(); ++a) {
    const std::vector<std::string>& cmd = a == 0 ? o_.command : o_.more[a - 1].command;
    KZ_ASSIGN_OR_RETURN(std::string path,
                        FindProgram(cmd[0], path_it != o_.environment.end() ? path_it->second : "/usr/bin:/bin"));
    paths.push_back(std::move(path));
  }
  if (o_.bind_to_core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return FromErrno(errno, "sched_getaffinity");
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus_.push_back(cpu);
    if (World() > static_cast<int>(cpus_.size()) && !o_.bind_overload)
      return InvalidArgument(fmt::format("--bind-to core: {} ranks but {} CPUs to bind them to (use "
                                         "--bind-to core:overload-allowed or none to oversubscribe)",
                                         World(), cpus_.size()));
  }
  return paths;
}

void Runner::CheckTimers(Clock::time_point now, std::optional<Clock::time_point> end_at) {
  if (end_at && now >= *end_at && !stopping_) {
    result_.timed_out = true;
    Say(o_.err_fd, "timeout: the ranks ran longer than --timeout {:.1f} s", o_.timeout_s);
    BeginStop(SIGTERM);
  }
  if (kill_at_ && now >= *kill_at_ && !killed_) {
    killed_ = true;
    int n = 0;
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      kill(-r.pid, SIGKILL);
      ++n;
    }
    if (n > 0)
      Say(o_.err_fd, "sent SIGKILL to {} rank{} still running after {:.1f} s", n, n == 1 ? "" : "s", o_.grace_s);
  }
}

void Runner::OnSignals() {
  signalfd_siginfo info;
  while (read(signal_fd_.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    int sig = static_cast<int>(info.ssi_signo);
    if (result_.interrupted_by == 0 && result_.first_failure < 0 && !result_.timed_out) result_.interrupted_by = sig;
    if (!stopping_) {
      Say(o_.err_fd, "received {}; stopping the ranks", SignalName(sig));
      BeginStop(sig);
    } else if (!killed_) {
      // A second interrupt: do not wait out the grace period.
      kill_at_ = Clock::now();
    }
  }
}

void Runner::Finish() {
  for (Rank& r : ranks_) result_.ranks.push_back(r.outcome);
  if (result_.first_failure >= 0) {
    result_.exit_code = StatusOf(ranks_[result_.first_failure].outcome);
  } else if (result_.interrupted_by != 0) {
    result_.exit_code = 128 + result_.interrupted_by;
  } else if (result_.timed_out) {
    result_.exit_code = 124;
  } else {
    result_.exit_code = 0;
  }
  // Order of events decides the status; a timeout or signal that came first wins over failures
  // of ranks stopped afterwards (those never set first_failure, as stopping_ was already set).
  if (result_.exit_code != 0) {
    for (const Rank& r : ranks_) {
      if (r.outcome.stopped_by_us && !(r.outcome.exited && r.outcome.code == 0))
        Say(o_.err_fd, "rank {} {} (stopped by kizuna-run)", r.index, Describe(r.outcome));
    }
    std::string why = result_.first_failure >= 0 ? fmt::format("rank {} failed first", result_.first_failure)
                      : result_.interrupted_by != 0
                          ? fmt::format("interrupted by {}", SignalName(result_.interrupted_by))
                          : std::string("timeout");
    Say(o_.err_fd, "exit status {} ({})", result_.exit_code, why);
  }
}

Result<LaunchResult> Runner::Run() {
  KZ_ASSIGN_OR_RETURN(const std::vector<std::string> paths, Prepare());
  // On failure, the destructor kills the ranks already started.
  KZ_RETURN_IF_ERROR(Start(paths));

  std::optional<Clock::time_point> end_at;
  if (o_.timeout_s > 0)
    end_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeout_s));
  std::optional<Clock::time_point> drain_until;  // set once every rank has exited
  std::vector<pollfd> fds;
  struct Source {
    Rank* rank;
    int what;  // 0 pidfd, 1 stdout, 2 stderr, 3 signalfd
  };
  std::vector<Source> sources;

  while (true) {
    Clock::time_point now = Clock::now();
    if (Running() == 0 && !drain_until) {
      // Output written just before exit may still be in the pipes; a child's child may hold them
      // open for good, so drain briefly rather than until EOF.
      drain_until = now + std::chrono::seconds(1);
    }
    bool pipes_open = false;
    for (const Rank& r : ranks_) pipes_open |= r.out.valid() || r.err.valid();
    if (drain_until && (!pipes_open || now >= *drain_until)) break;
    CheckTimers(now, end_at);

    Clock::time_point wake = now + std::chrono::seconds(3600);
    if (end_at && !stopping_) wake = std::min(wake, *end_at);
    if (kill_at_ && !killed_) wake = std::min(wake, *kill_at_);
    if (drain_until) wake = std::min(wake, *drain_until);
    fds.clear();
    sources.clear();
    fds.push_back({signal_fd_.get(), POLLIN, 0});
    sources.push_back({nullptr, 3});
    for (Rank& r : ranks_) {
      if (r.running) {
        fds.push_back({r.pidfd.get(), POLLIN, 0});
        sources.push_back({&r, 0});
      }
      if (r.out.valid()) {
        fds.push_back({r.out.get(), POLLIN, 0});
        sources.push_back({&r, 1});
      }
      if (r.err.valid()) {
        fds.push_back({r.err.get(), POLLIN, 0});
        sources.push_back({&r, 2});
      }
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
    int pr = poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(ms, 0, 3'600'000)));
    if (pr < 0 && errno != EINTR) return FromErrno(errno, "poll");
    if (pr <= 0) continue;
    // Output first, so a rank's last lines come before the news of its exit.
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Source s = sources[i];
      if (s.what == 1 && s.rank->out.valid()) Pump(s.rank->out, s.rank->out_lines, o_.out_fd);
      if (s.what == 2 && s.rank->err.valid()) Pump(s.rank->err, s.rank->err_lines, o_.err_fd);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Source s = sources[i];
      if (s.what == 0 && s.rank->running) Reap(*s.rank);
      if (s.what == 3) OnSignals();
    }
  }
  Finish();
  return result_;
}

}  // namespace

void LinePrefixer::Feed(std::string_view bytes, std::string& out) {
  auto emit = [&] {
    out += prefix_;
    out += partial_;
    out += '\n';
    partial_.clear();
  };
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    size_t take = std::min(nl == std::string_view::npos ? bytes.size() : nl, max_line_ - partial_.size());
    partial_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (!bytes.empty() && bytes.front() == '\n') {
      emit();
      bytes.remove_prefix(1);
    } else if (partial_.size() >= max_line_) {
      emit();  // an overlong line, cut
    }
  }
}

void LinePrefixer::Finish(std::string& out) {
  if (partial_.empty()) return;
  out += prefix_;
  out += partial_;
  out += '\n';
  partial_.clear();
}

Environment RankEnvironment(const Environment& base, int rank, int size, const std::string& unique_id) {
  Environment env = base;
  for (std::string_view name : kForeignLauncherVars) env.erase(std::string(name));
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(size);
  env["LOCAL_RANK"] = std::to_string(rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(size);
  env["KIZUNA_UNIQUE_ID"] = unique_id;
  return env;
}

Result<std::string> FindProgram(const std::string& name, const std::string& path) {
  auto usable = [](const std::string& p) -> std::string {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return std::strerror(errno);
    if (S_ISDIR(st.st_mode)) return "it is a directory";
    if (access(p.c_str(), X_OK) != 0) return "it is not executable";
    return "";
  };
  if (name.empty()) return InvalidArgument("the program name is empty");
  if (name.find('/') != std::string::npos) {
    std::string why = usable(name);
    if (!why.empty()) return InvalidArgument(fmt::format("cannot execute '{}': {}", name, why));
    return name;
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (usable(candidate).empty()) return candidate;
    start = end + 1;
  }
  return InvalidArgument(fmt::format("program '{}' not found in PATH ({})", name, path));
}

Result<LaunchResult> Launch(const LaunchOptions& options) {
  Runner runner(options);
  return runner.Run();
}

}  // namespace kizuna::run
