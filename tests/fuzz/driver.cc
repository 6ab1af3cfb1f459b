// The in-tree fuzzing driver: runs a target's LLVMFuzzerTestOneInput (libFuzzer's entry, so the same
// target .cc builds with clang's -fsanitize=fuzzer too, README.md) on every file of a seed corpus,
// then on random mutations of those files, from a fixed seed, for an iteration or time budget.
// Without coverage feedback it finds less than libFuzzer, but it needs only g++ and runs in
// `./kz test`: bit flips, byte inserts and deletions, splices between seeds, tokens taken from the
// seeds, values and array elements replaced, duplicated or removed (half of the inputs keep their
// JSON well formed, to reach the checks behind the syntax), brackets repeated into deep nesting,
// huge and boundary numbers. At the end it names the slowest input (by CPU time) and saves it.
//
// An input that crashes the target (a signal, an abort from a failed check, an uncaught exception,
// memory beyond --memory-mb, longer than --timeout) is written to a file, named on stderr, and the
// driver dies with the same signal (exit 70 for a timeout). Reproduce with the file as argument:
//   bazel-bin/tests/fuzz/topology_fuzz /tmp/topology_fuzz-crash-1234
//
// Options (also from the environment: KZ_FUZZ_ITERATIONS, KZ_FUZZ_SECONDS, KZ_FUZZ_SEED; arguments
// win):
//   --corpus=DIR      seed files (repeatable); every regular file of DIR, in name order
//   --iterations=N    mutated inputs to run (default 1000, unlimited when --seconds is given alone)
//   --seconds=S       stop after S seconds
//   --seed=N          the mutations' random seed (default 1: every run the same)
//   --max-len=N       longest input in bytes (default 262144)
//   --timeout=S       longest one input may run (default 10)
//   --memory-mb=N     the process's address space limit (default 2048; 0: none)
//   --stack-kb=N      the stack of the thread that runs the inputs (default 1024: recursion per
//                     level of nesting overflows it where a file can reach)
//   --out=DIR         where a crashing input goes ($TEST_UNDECLARED_OUTPUTS_DIR, else $TMPDIR, else /tmp)
//   FILE...           run only these inputs (reproducing a crash), no mutations
// libFuzzer's -runs=N, -max_total_time=S, -seed=N and -max_len=N are accepted too.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/mutator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace kizuna::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> corpus_dirs;
  std::vector<std::string> files;
  int64_t iterations = -1;  // -1: not given
  double seconds = 0;       // 0: not given
  uint64_t seed = 1;
  size_t max_len = 256 << 10;
  unsigned timeout_s = 10;
  uint64_t memory_mb = 2048;
  uint64_t stack_kb = 1024;
  std::string out;
};

// ---- What a crash handler needs, prepared before any input runs (it may only call write()). ----

const uint8_t* g_input = nullptr;
size_t g_input_size = 0;
char g_crash_path[4096];
const char* g_name = "fuzz";
int64_t g_index = -1;  // -1: a seed file

void WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}
void Say(const char* s) { WriteAll(2, s, std::strlen(s)); }
void SayNumber(uint64_t v) {
  char buf[24];
  int i = sizeof(buf);
  do {
    buf[--i] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0 && i > 0);
  WriteAll(2, buf + i, sizeof(buf) - i);
}

// Writes the input being run and says where; async-signal-safe.
void SaveInput(const char* why) {
  Say("\n");
  Say(g_name);
  Say(": ");
  Say(why);
  Say(" on ");
  if (g_index < 0) {
    Say("a seed input");
  } else {
    Say("mutated input #");
    SayNumber(static_cast<uint64_t>(g_index));
  }
  Say(" (");
  SayNumber(g_input_size);
  Say(" bytes)\n");
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    Say("cannot write the input to ");
    Say(g_crash_path);
    Say("\n");
    return;
  }
  if (g_input != nullptr) WriteAll(fd, g_input, g_input_size);
  ::close(fd);
  Say("input written to ");
  Say(g_crash_path);
  Say("\nreproduce: ");
  Say(g_name);
  Say(" ");
  Say(g_crash_path);
  Say("\n");
}

void OnCrash(int sig) {
  SaveInput(sig == SIGABRT   ? "abort (a failed check, an uncaught exception, memory exhausted)"
            : sig == SIGSEGV ? "segmentation fault (a stack overflow?)"
                             : "fatal signal");
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void OnTimeout(int) {
  SaveInput("timeout (the input ran longer than --timeout)");
  ::_exit(70);
}

// An alternate stack for the calling thread, so that a stack overflow still reaches the handler.
void AddAlternateStack() {
  static thread_local std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  ::sigaltstack(&ss, nullptr);
}

void InstallHandlers() {
  AddAlternateStack();
  struct sigaction sa {};
  sa.sa_handler = OnCrash;
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::sigaction(sig, &sa, nullptr);
  struct sigaction alarm {};
  alarm.sa_handler = OnTimeout;
  sigemptyset(&alarm.sa_mask);
  ::sigaction(SIGALRM, &alarm, nullptr);
}

void RunOne(const Bytes& input, int64_t index, unsigned timeout_s) {
  g_input = input.data();
  g_input_size = input.size();
  g_index = index;
  ::alarm(timeout_s);
  (void)LLVMFuzzerTestOneInput(input.data(), input.size());
  ::alarm(0);
}

// ---- Options and files ----

bool Flag(std::string_view arg, std::string_view name, std::string& value) {
  for (std::string_view prefix : {std::string_view("--"), std::string_view("-")}) {
    if (arg.size() > prefix.size() + name.size() && arg.substr(0, prefix.size()) == prefix &&
        arg.substr(prefix.size(), name.size()) == name && arg[prefix.size() + name.size()] == '=') {
      value = std::string(arg.substr(prefix.size() + name.size() + 1));
      return true;
    }
  }
  return false;
}

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--corpus=DIR]... [--iterations=N] [--seconds=S] [--seed=N] [--max-len=N] "
               "[--timeout=S] [--memory-mb=N] [--stack-kb=N] [--out=DIR] [FILE...]\n",
               g_name, why.c_str(), g_name);
  std::exit(2);
}

uint64_t Number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0') Usage(flag + "=" + v + ": expected a non-negative integer");
  return n;
}

Options Parse(int argc, char** argv) {
  Options o;
  if (const char* e = std::getenv("KZ_FUZZ_ITERATIONS"); e && *e) o.iterations = Number("KZ_FUZZ_ITERATIONS", e);
  if (const char* e = std::getenv("KZ_FUZZ_SECONDS"); e && *e) o.seconds = Number("KZ_FUZZ_SECONDS", e);
  if (const char* e = std::getenv("KZ_FUZZ_SEED"); e && *e) o.seed = Number("KZ_FUZZ_SEED", e);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string v;
    if (Flag(arg, "corpus", v))
      o.corpus_dirs.push_back(v);
    else if (Flag(arg, "iterations", v) || Flag(arg, "runs", v))
      o.iterations = Number("--iterations", v);
    else if (Flag(arg, "seconds", v) || Flag(arg, "max_total_time", v))
      o.seconds = Number("--seconds", v);
    else if (Flag(arg, "seed", v))
      o.seed = Number("--seed", v);
    else if (Flag(arg, "max-len", v) || Flag(arg, "max_len", v))
      o.max_len = Number("--max-len", v);
    else if (Flag(arg, "timeout", v))
      o.timeout_s = static_cast<unsigned>(Number("--timeout", v));
    else if (Flag(arg, "memory-mb", v))
      o.memory_mb = Number("--memory-mb", v);
    else if (Flag(arg, "stack-kb", v))
      o.stack_kb = Number("--stack-kb", v);
    else if (Flag(arg, "out", v))
      o.out = v;
    else if (arg == "--help" || arg == "-h")
      Usage("runs the target on seeds and their mutations");
    else if (!arg.empty() && arg[0] == '-')
      Usage("unknown option " + std::string(arg));
    else
      o.files.emplace_back(arg);
  }
  if (o.iterations < 0) o.iterations = o.seconds > 0 ? INT64_MAX : 1000;
  if (o.max_len == 0) Usage("--max-len must be positive");
  if (o.timeout_s == 0) o.timeout_s = 1;
  if (o.out.empty()) {
    for (const char* env : {"TEST_UNDECLARED_OUTPUTS_DIR", "TMPDIR"})
      if (const char* d = std::getenv(env); d && *d && o.out.empty()) o.out = d;
    if (o.out.empty()) o.out = "/tmp";
  }
  return o;
}

bool ReadFile(const std::string& path, Bytes& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

std::vector<Bytes> LoadCorpus(const Options& o) {
  std::vector<Bytes> corpus;
  for (const std::string& dir : o.corpus_dirs) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) Usage("--corpus=" + dir + ": " + std::strerror(errno));
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d)) {
      const std::string path = dir + "/" + e->d_name;
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(path);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
    for (const std::string& path : names) {
      Bytes b;
      if (!ReadFile(path, b)) Usage("cannot read " + path);
      if (b.size() > o.max_len) b.resize(o.max_len);
      corpus.push_back(std::move(b));
    }
  }
  return corpus;
}


int Run(const Options& o);

int Main(int argc, char** argv) {
  const char* slash = std::strrchr(argv[0], '/');
  g_name = slash ? slash + 1 : argv[0];
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  const Options o = Parse(argc, argv);
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/%s-crash-%d", o.out.c_str(), g_name,
                static_cast<int>(::getpid()));
  if (o.memory_mb > 0) {
    // Memory beyond the limit fails the allocation (std::bad_alloc, then an abort): the input is saved.
    rlimit r{o.memory_mb << 20, o.memory_mb << 20};
    if (::setrlimit(RLIMIT_AS, &r) != 0) std::perror("setrlimit(RLIMIT_AS)");
  }
  InstallHandlers();  // the process's handlers; each thread that runs inputs adds its alternate stack
  std::set_terminate([] {
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "%s: uncaught exception: %s\n", g_name, ex.what());
      } catch (...) {
        std::fprintf(stderr, "%s: uncaught exception\n", g_name);
      }
    }
    std::abort();
  });
  // Inputs run on a thread with a small stack, as a library's caller may give it: recursion that
  // grows with the input's nesting overflows here at depths a file can reach, not only far beyond.
  struct Call {
    const Options* o;
    int result = 1;
  } call{&o};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (pthread_attr_setstacksize(&attr, static_cast<size_t>(o.stack_kb) << 10) != 0)
    Usage("--stack-kb=" + std::to_string(o.stack_kb) + ": not a usable stack size");
  pthread_t thread;
  if (pthread_create(
          &thread, &attr,
          [](void* p) -> void* {
            auto* c = static_cast<Call*>(p);
            c->result = Run(*c->o);
            return nullptr;
          },
          &call) != 0)
    Usage("cannot start the thread that runs the inputs");
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  return call.result;
}

int Run(const Options& o) {
  AddAlternateStack();
  if (!o.files.empty()) {  // reproduce
    for (const std::string& path : o.files) {
      Bytes b;
      if (!ReadFile(path, b)) Usage("cannot read " + path);
      std::fprintf(stderr, "%s: running %s (%zu bytes)\n", g_name, path.c_str(), b.size());
      RunOne(b, -1, o.timeout_s);
    }
    std::fprintf(stderr, "%s: %zu input(s) ran without a crash\n", g_name, o.files.size());
    return 0;
  }

  const std::vector<Bytes> corpus = LoadCorpus(o);
  const Clock::time_point start = Clock::now();
  double slowest = 0;
  size_t largest = 0;
  Bytes slowest_input;
  // CPU time, not wall time: on a busy machine the slowest input by the clock is the one that was
  // preempted.
  auto cpu_seconds = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  auto timed = [&](const Bytes& b, int64_t index) {
    const double t0 = cpu_seconds();
    RunOne(b, index, o.timeout_s);
    const double s = cpu_seconds() - t0;
    if (s > slowest) slowest = s, slowest_input = b;
    largest = std::max(largest, b.size());
  };
  for (const Bytes& b : corpus) timed(b, -1);
  Mutator mutator(corpus, o.max_len, o.seed);
  int64_t runs = 0;
  for (; runs < o.iterations; ++runs) {
    if (o.seconds > 0 && (runs & 15) == 0 && std::chrono::duration<double>(Clock::now() - start).count() >= o.seconds)
      break;
    timed(mutator.Next(), runs);
  }
  // The slowest input, to look at: a parser that is slow on small inputs is quadratic somewhere.
  const std::string slowest_path = o.out + "/" + g_name + "-slowest";
  std::ofstream(slowest_path, std::ios::binary)
      .write(reinterpret_cast<const char*>(slowest_input.data()), static_cast<std::streamsize>(slowest_input.size()));
  std::fprintf(stderr,
               "%s: %zu seed input(s) and %lld mutated input(s) (seed %llu) in %.1f s without a crash; largest %zu "
               "bytes, slowest %.3f s of CPU (%zu bytes, in %s)\n",
               g_name, corpus.size(), static_cast<long long>(runs), static_cast<unsigned long long>(o.seed),
               std::chrono::duration<double>(Clock::now() - start).count(), largest, slowest, slowest_input.size(),
               slowest_path.c_str());
  return 0;
}

}  // namespace
}  // namespace kizuna::fuzz

int main(int argc, char** argv) { return kizuna::fuzz::Main(argc, argv); }
