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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace kizuna::fuzz {
namespace {

using Bytes = std::vector<uint8_t>;
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

// ---- Mutations ----

// splitmix64: the same sequence on every platform and library, unlike std's distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }

 private:
  uint64_t s_;
};

constexpr uint8_t kInterestingBytes[] = {0,   1,   '\t', '\n', '\r', ' ',  '"',  '\\', ':', ',', '[',
                                         ']', '{', '}',  '-',  '+',  '.',  'e',  '0',  '9', 'w', 'a',
                                         '/', '%', 0x7f, 0x80, 0xc0, 0xe2, 0xed, 0xf0, 0xff};

const char* const kBuiltinTokens[] = {"true",
                                      "false",
                                      "null",
                                      "\"\"",
                                      "[]",
                                      "{}",
                                      "\\u0000",
                                      "\\ud800",
                                      "\\\"",
                                      "0",
                                      "-0",
                                      "-1",
                                      "1",
                                      "63",
                                      "64",
                                      "65",
                                      "255",
                                      "256",
                                      "1023",
                                      "1024",
                                      "1025",
                                      "65535",
                                      "65536",
                                      "65537",
                                      "2147483647",
                                      "2147483648",
                                      "-2147483649",
                                      "4294967296",
                                      "9223372036854775807",
                                      "9223372036854775808",
                                      "-9223372036854775808",
                                      "-9223372036854775809",
                                      "18446744073709551615",
                                      "18446744073709551616",
                                      "1e308",
                                      "1e309",
                                      "-1e309",
                                      "1e-400",
                                      "4.9e-324",
                                      "0.5",
                                      "1.5e2",
                                      "NaN",
                                      "Infinity",
                                      "0x10",
                                      "1K",
                                      "16M",
                                      "2G",
                                      "8T",
                                      "1KiB",
                                      "99999999999999999999T",
                                      " ",
                                      "\t",
                                      ":",
                                      "::",
                                      "[::1]",
                                      "[",
                                      "]",
                                      "127.0.0.1",
                                      "localhost",
                                      "kz1:",
                                      "kz2:",
                                      "^",
                                      ",",
                                      ";",
                                      "ALL",
                                      "^ALL",
                                      "%h",
                                      "%p"};

// Words and short strings of the seeds, to insert elsewhere: key names, node names, kinds.
std::vector<std::string> HarvestTokens(const std::vector<Bytes>& corpus) {
  std::set<std::string> tokens(std::begin(kBuiltinTokens), std::end(kBuiltinTokens));
  auto word = [](uint8_t c) { return std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':'; };
  for (const Bytes& b : corpus) {
    for (size_t i = 0; i < b.size() && tokens.size() < 2000;) {
      if (b[i] == '"') {
        size_t j = i + 1;
        while (j < b.size() && b[j] != '"' && j - i < 40) j += b[j] == '\\' ? 2 : 1;
        if (j < b.size() && b[j] == '"')
          tokens.emplace(b.begin() + static_cast<ptrdiff_t>(i), b.begin() + static_cast<ptrdiff_t>(j + 1));
        i = j + 1;
      } else if (word(b[i])) {
        size_t j = i;
        while (j < b.size() && word(b[j])) ++j;
        if (j - i >= 2 && j - i <= 40)
          tokens.emplace(b.begin() + static_cast<ptrdiff_t>(i), b.begin() + static_cast<ptrdiff_t>(j));
        i = j;
      } else {
        ++i;
      }
    }
  }
  return {tokens.begin(), tokens.end()};
}

class Mutator {
 public:
  Mutator(const std::vector<Bytes>& corpus, size_t max_len, uint64_t seed)
      : corpus_(corpus), tokens_(HarvestTokens(corpus)), max_len_(max_len), rng_(seed) {}

  Bytes Next() {
    // Mostly a seed with a few mutations; sometimes the last input mutated further (deeper changes).
    Bytes b = !last_.empty() && rng_.OneIn(8) ? last_ : corpus_.empty() ? Bytes() : corpus_[rng_.Below(corpus_.size())];
    // Few mutations per input, and half of the inputs mutated only in ways that keep JSON well
    // formed: most formats here are JSON, which one stray byte already sends to the syntax error.
    const size_t n = rng_.OneIn(2) ? 1 : 1 + rng_.Below(rng_.OneIn(8) ? 16 : 4);
    const bool structural = rng_.OneIn(2);
    for (size_t i = 0; i < n; ++i) Mutate(b, structural);
    if (b.size() > max_len_) b.resize(max_len_);
    last_ = b;
    return b;
  }

 private:
  size_t Pos(const Bytes& b) { return rng_.Below(b.size() + 1); }
  uint8_t InterestingByte() {
    return rng_.OneIn(2) ? kInterestingBytes[rng_.Below(sizeof(kInterestingBytes))] : static_cast<uint8_t>(rng_.Next());
  }
  void Insert(Bytes& b, size_t at, std::string_view s, size_t times = 1) {
    if (b.size() + s.size() * times > max_len_)
      times = s.empty() ? 0 : (max_len_ - std::min(max_len_, b.size())) / s.size();
    Bytes add;
    add.reserve(s.size() * times);
    for (size_t t = 0; t < times; ++t) add.insert(add.end(), s.begin(), s.end());
    b.insert(b.begin() + static_cast<ptrdiff_t>(std::min(at, b.size())), add.begin(), add.end());
  }
  // A run of digits near `at` (or an empty range at `at`).
  std::pair<size_t, size_t> NumberAt(const Bytes& b, size_t at) {
    size_t i = at;
    while (i < b.size() && !std::isdigit(b[i])) ++i;
    if (i == b.size()) return {at, at};
    size_t j = i;
    while (j < b.size() && (std::isdigit(b[j]) || b[j] == '.' || b[j] == 'e' || b[j] == 'E')) ++j;
    if (i > 0 && b[i - 1] == '-') --i;
    return {i, j};
  }

  // The string literal around `at`, or else the string literal, number or word after it:
  // [begin, end), or {at, at} when none. Whether `at` is inside a string is found from the start.
  std::pair<size_t, size_t> TokenAt(const Bytes& b, size_t at) {
    auto word = [](uint8_t c) { return std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '+'; };
    size_t open = b.size();  // the opening quote of the string `at` is in, if any
    for (size_t i = 0; i < at && i < b.size(); ++i) {
      if (open == b.size()) {
        if (b[i] == '"') open = i;
      } else if (b[i] == '\\') {
        ++i;
      } else if (b[i] == '"') {
        open = b.size();
      }
    }
    size_t i = open < b.size() ? open : at;
    while (i < b.size() && b[i] != '"' && !word(b[i])) ++i;
    if (i >= b.size()) return {at, at};
    size_t j = i + 1;
    if (b[i] == '"') {
      while (j < b.size() && b[j] != '"') j += b[j] == '\\' ? 2 : 1;
      return {i, std::min(j + 1, b.size())};
    }
    while (j < b.size() && word(b[j])) ++j;
    return {i, j};
  }
  // Whether [from, to) is an object's key: a ':' follows it.
  static bool IsKey(const Bytes& b, size_t to) {
    while (to < b.size() && (b[to] == ' ' || b[to] == '\n' || b[to] == '\t' || b[to] == '\r')) ++to;
    return to < b.size() && b[to] == ':';
  }
  // Whether what starts at `from` is an array's element: '[' or ',' before it (a ',' before a '{'
  // or '[' cannot be in an object, whose members start with a key).
  static bool InArray(const Bytes& b, size_t from) {
    while (from > 0 && (b[from - 1] == ' ' || b[from - 1] == '\n' || b[from - 1] == '\t' || b[from - 1] == '\r'))
      --from;
    return from > 0 && (b[from - 1] == '[' || b[from - 1] == ',');
  }

  // The end of the bracketed element that starts at `open` ('[' or '{'), past its closer; 0 if none.
  size_t ElementEnd(const Bytes& b, size_t open) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = open; i < b.size(); ++i) {
      const uint8_t c = b[i];
      if (in_string) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        ++depth;
      } else if ((c == ']' || c == '}') && --depth == 0) {
        return i + 1;
      }
    }
    return 0;
  }
  // A random '[' or '{' at or after `at` and the end of its element: {0, 0} when none.
  std::pair<size_t, size_t> ElementAt(const Bytes& b, size_t at) {
    size_t i = at;
    while (i < b.size() && b[i] != '[' && b[i] != '{') ++i;
    if (i == b.size()) return {0, 0};
    const size_t end = ElementEnd(b, i);
    return end == 0 ? std::pair<size_t, size_t>{0, 0} : std::pair<size_t, size_t>{i, end};
  }
  // A token as a JSON value: numbers and literals as they are, anything else quoted.
  std::string AsValue(const std::string& token) {
    if (token.empty()) return "\"\"";
    const char c = token[0];
    if (c == '"' || c == '-' || (c >= '0' && c <= '9') || token == "true" || token == "false" || token == "null")
      return token;
    return "\"" + token + "\"";
  }

  void Mutate(Bytes& b, bool structural) {
    // Those that keep JSON well formed: nesting closed again, numbers, values, elements.
    static const int kStructural[] = {8, 9, 15, 16, 17, 18, 19};
    const int kind = structural ? kStructural[rng_.Below(std::size(kStructural))] : static_cast<int>(rng_.Below(20));
    switch (kind) {
      case 0:  // flip a bit
        if (!b.empty()) b[rng_.Below(b.size())] ^= static_cast<uint8_t>(1u << rng_.Below(8));
        break;
      case 1:  // set a byte
        if (!b.empty()) b[rng_.Below(b.size())] = InterestingByte();
        break;
      case 2: {  // insert bytes
        const size_t at = Pos(b), n = 1 + rng_.Below(8);
        for (size_t i = 0; i < n && b.size() < max_len_; ++i)
          b.insert(b.begin() + static_cast<ptrdiff_t>(at), InterestingByte());
        break;
      }
      case 3: {  // erase a range
        if (b.empty()) break;
        const size_t at = rng_.Below(b.size());
        const size_t n = 1 + rng_.Below(std::min<size_t>(b.size() - at, rng_.OneIn(4) ? b.size() : 16));
        b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
        break;
      }
      case 4: {  // copy a range of this input elsewhere
        if (b.empty()) break;
        const size_t from = rng_.Below(b.size());
        const size_t n = 1 + rng_.Below(std::min<size_t>(b.size() - from, 64));
        const std::string chunk(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(from + n));
        Insert(b, Pos(b), chunk);
        break;
      }
      case 5: {  // splice: a range of another seed, inserted or overwriting
        if (corpus_.empty()) break;
        const Bytes& o = corpus_[rng_.Below(corpus_.size())];
        if (o.empty()) break;
        const size_t from = rng_.Below(o.size());
        const size_t n = 1 + rng_.Below(o.size() - from);
        const std::string chunk(o.begin() + static_cast<ptrdiff_t>(from), o.begin() + static_cast<ptrdiff_t>(from + n));
        const size_t at = Pos(b);
        if (rng_.OneIn(2)) b.resize(std::min(b.size(), at));  // this input's head, the other's tail
        Insert(b, at, chunk);
        break;
      }
      case 6:
      case 7:  // a token: a key, a name, a keyword, a boundary number
        Insert(b, Pos(b), tokens_[rng_.Below(tokens_.size())]);
        break;
      case 8: {  // deep nesting: brackets repeated around the limits and far beyond
        static const char* const kOpen[] = {"[", "{\"a\":", "[{\"k\":", "[[", "{\"nodes\":[", "{\"parts\":["};
        static const size_t kDepths[] = {8, 63, 64, 65, 66, 100, 1000, 10000, 75000};
        const std::string_view open = kOpen[rng_.Below(std::size(kOpen))];
        const size_t depth = kDepths[rng_.Below(std::size(kDepths))];
        const size_t at = Pos(b);
        Insert(b, at, open, depth);
        if (structural || rng_.OneIn(2)) {  // closed too, so that the text stays valid where it was
          std::string close;
          for (auto it = open.rbegin(); it != open.rend(); ++it)
            if (*it == '[')
              close += ']';
            else if (*it == '{')
              close += '}';
          Insert(b, std::min(b.size(), at + open.size() * depth), close, depth);
        }
        break;
      }
      case 9: {  // a number replaced by a huge or boundary one
        static const char* const kNumbers[] = {
            "0",      "-1",   "65536", "2147483648", "18446744073709551616", "1e309", "-9223372036854775809",
            "1e-400", "0.1e1"};
        const auto [from, to] = NumberAt(b, Pos(b));
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        if (rng_.OneIn(3))
          Insert(b, from, "9", 20 + rng_.Below(rng_.OneIn(4) ? 5000 : 400));
        else
          Insert(b, from, kNumbers[rng_.Below(std::size(kNumbers))]);
        break;
      }
      case 10: {  // a short range repeated many times (long arrays, long strings)
        if (b.empty()) break;
        const size_t from = rng_.Below(b.size());
        const size_t n = 1 + rng_.Below(std::min<size_t>(b.size() - from, 32));
        const std::string chunk(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(from + n));
        Insert(b, from, chunk, 2 + rng_.Below(rng_.OneIn(8) ? 20000 : 100));
        break;
      }
      case 11:  // truncate
        b.resize(Pos(b));
        break;
      case 12: {  // swap two bytes
        if (b.size() < 2) break;
        std::swap(b[rng_.Below(b.size())], b[rng_.Below(b.size())]);
        break;
      }
      case 13:
      case 14: {  // a token replaced by another, as it is
        const auto [from, to] = TokenAt(b, Pos(b));
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        Insert(b, from, tokens_[rng_.Below(tokens_.size())]);
        break;
      }
      case 15:
      case 16:
      case 17: {  // a value or key replaced by a token made a JSON value (a key by a string): the text
                  // stays well formed
        const auto [from, to] = TokenAt(b, Pos(b));
        const bool key = IsKey(b, to);
        std::string value = AsValue(tokens_[rng_.Below(tokens_.size())]);
        if (key && value[0] != '"') value = "\"" + value + "\"";
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        Insert(b, from, value);
        break;
      }
      case 18: {  // an array's element duplicated (a node described twice, more links)
        const auto [from, to] = ElementAt(b, Pos(b));
        if (to == 0 || (structural && !InArray(b, from))) break;
        const std::string element(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(to));
        Insert(b, to, ", " + element, rng_.OneIn(8) ? 1 + rng_.Below(1000) : 1);
        break;
      }
      case 19: {  // an array's bracketed element removed, with the comma after it
        const auto [from, to] = ElementAt(b, Pos(b));
        if (to == 0 || (structural && !InArray(b, from))) break;
        size_t end = to;
        while (end < b.size() && (b[end] == ' ' || b[end] == '\n')) ++end;
        if (end < b.size() && b[end] == ',') ++end;
        b.erase(b.begin() + static_cast<ptrdiff_t>(from), b.begin() + static_cast<ptrdiff_t>(end));
        break;
      }
    }
  }

  const std::vector<Bytes>& corpus_;
  const std::vector<std::string> tokens_;
  const size_t max_len_;
  Rng rng_;
  Bytes last_;
};

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
