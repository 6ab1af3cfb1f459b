// kizuna-run's machinery with small shell programs as ranks: line prefixing, the rank environment,
// exit statuses (success, the first failure, a signal, a timeout), stopping the other ranks (and
// what they started) with SIGTERM then SIGKILL, and programs that cannot be run.
#include "tools/run/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/core/unique_fd.h"

namespace kizuna::run {
namespace {

using Clock = std::chrono::steady_clock;

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(LinePrefixer, PrefixesEveryLine) {
  LinePrefixer p("[3] ");
  std::string out;
  p.Feed("one\ntwo\n\nthr", out);
  EXPECT_EQ(out, "[3] one\n[3] two\n[3] \n");
  p.Feed("ee\nfour", out);
  EXPECT_EQ(out, "[3] one\n[3] two\n[3] \n[3] three\n");
  p.Finish(out);
  EXPECT_EQ(out, "[3] one\n[3] two\n[3] \n[3] three\n[3] four\n");
  std::string none;
  p.Finish(none);
  EXPECT_EQ(none, "");
}

TEST(LinePrefixer, CutsOverlongLines) {
  LinePrefixer p("[0] ", 4);
  std::string out;
  p.Feed("abcdefghij\nxy", out);
  EXPECT_EQ(out, "[0] abcd\n[0] efgh\n[0] ij\n");
  p.Finish(out);
  EXPECT_EQ(out, "[0] abcd\n[0] efgh\n[0] ij\n[0] xy\n");
  // A line of exactly the limit is one line, not a line and an empty one.
  std::string exact;
  p.Feed("wxyz\n", exact);
  EXPECT_EQ(exact, "[0] wxyz\n");
}

TEST(RankEnvironment, SetsTheRankVariablesAndDropsOtherLaunchers) {
  Environment base = {{"PATH", "/bin"},
                      {"HOME", "/h"},
                      {"RANK", "9"},
                      {"OMPI_COMM_WORLD_RANK", "4"},
                      {"PMI_SIZE", "16"},
                      {"SLURM_PROCID", "2"},
                      {"MASTER_ADDR", "x"},
                      {"KIZUNA_ROOT", "a:1"},
                      {"KIZUNA_UNIQUE_ID_FILE", "/f"},
                      {"KIZUNA_DEBUG", "INFO"}};
  Environment env = RankEnvironment(base, 2, 4, "kz1:127.0.0.1:5:00");
  EXPECT_EQ(env["RANK"], "2");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["LOCAL_RANK"], "2");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["KIZUNA_UNIQUE_ID"], "kz1:127.0.0.1:5:00");
  EXPECT_EQ(env["PATH"], "/bin");
  EXPECT_EQ(env["KIZUNA_DEBUG"], "INFO");
  for (const char* gone : {"OMPI_COMM_WORLD_RANK", "PMI_SIZE", "SLURM_PROCID", "MASTER_ADDR", "KIZUNA_ROOT",
                           "KIZUNA_UNIQUE_ID_FILE"})
    EXPECT_EQ(env.count(gone), 0u) << gone;
}

TEST(FindProgram, SearchesPathAndExplainsFailures) {
  auto sh = FindProgram("sh", "/nonexistent:/bin:/usr/bin");
  ASSERT_TRUE(sh.ok()) << sh.status().ToString();
  EXPECT_EQ(*sh, "/bin/sh");
  auto missing = FindProgram("no-such-program-kz", "/bin:/usr/bin");
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(missing.status().message(), "not found in PATH")) << missing.status().message();
  const char* tmp = getenv("TEST_TMPDIR");
  std::string plain = fmt::format("{}/plain_file.{}", tmp != nullptr ? tmp : "/tmp", getpid());
  std::ofstream(plain) << "data\n";
  chmod(plain.c_str(), 0644);
  EXPECT_TRUE(Contains(FindProgram(plain, "").status().message(), "not executable"))
      << FindProgram(plain, "").status().ToString();
  EXPECT_TRUE(Contains(FindProgram("/tmp", "").status().message(), "directory"));
}

// Runs `script` with /bin/sh as every rank; the ranks' output lands in files.
class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TEST_TMPDIR");
    dir_ = tmp != nullptr ? tmp : "/tmp";
    out_path_ = fmt::format("{}/launch_out.{}", dir_, getpid());
    err_path_ = fmt::format("{}/launch_err.{}", dir_, getpid());
  }

  LaunchResult Run(int n, const std::string& script, double timeout_s = 0, double grace_s = 5,
                   std::vector<LaunchOptions::App> more = {}) {
    UniqueFd out(open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    UniqueFd err(open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    LaunchOptions o;
    o.nprocs = n;
    o.command = {"sh", "-c", script};
    o.timeout_s = timeout_s;
    o.grace_s = grace_s;
    o.more = std::move(more);
    o.environment = {{"PATH", "/usr/bin:/bin"}, {"TMP_DIR", dir_}};
    o.unique_id = "kz1:127.0.0.1:1:0123456789abcdef0123456789abcdef";
    o.out_fd = out.get();
    o.err_fd = err.get();
    auto start = Clock::now();
    Result<LaunchResult> r = Launch(o);
    seconds_ = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : LaunchResult{};
  }

  static std::string Read(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  std::string Out() const { return Read(out_path_); }
  std::string Err() const { return Read(err_path_); }

  std::string dir_, out_path_, err_path_;
  double seconds_ = 0;
};

TEST_F(LaunchTest, FurtherProgramsRunOnTheRanksAfterTheFirst) {
  // "kizuna-run -n 2 -- sh -c A : -n 1 sh -c B": ranks 0-1 run A, rank 2 runs B, all in a world of 3.
  LaunchResult r = Run(2, "echo \"A $RANK of $WORLD_SIZE\"", 0, 5,
                       {LaunchOptions::App{1, {"sh", "-c", "echo \"B $RANK of $WORLD_SIZE\""}}});
  EXPECT_EQ(r.exit_code, 0);
  ASSERT_EQ(r.ranks.size(), 3u);
  const std::string out = Out();
  EXPECT_TRUE(Contains(out, "[0] A 0 of 3")) << out;
  EXPECT_TRUE(Contains(out, "[1] A 1 of 3")) << out;
  EXPECT_TRUE(Contains(out, "[2] B 2 of 3")) << out;
  EXPECT_FALSE(Contains(out, "B 0")) << out;
}

TEST_F(LaunchTest, EveryRankRunsWithItsEnvironmentAndPrefixedOutput) {
  LaunchResult r = Run(3,
                       "echo \"out $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE id $KIZUNA_UNIQUE_ID\"; "
                       "echo \"err $RANK\" >&2; printf 'no newline'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.first_failure, -1);
  ASSERT_EQ(r.ranks.size(), 3u);
  std::string out = Out(), err = Err();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(Contains(out, fmt::format("[{}] out {} of 3 local {}/3 id kz1:127.0.0.1:1:", i, i, i))) << out;
    EXPECT_TRUE(Contains(out, fmt::format("[{}] no newline\n", i))) << out;
    EXPECT_TRUE(Contains(err, fmt::format("[{}] err {}\n", i, i))) << err;
    EXPECT_TRUE(r.ranks[i].exited);
    EXPECT_EQ(r.ranks[i].code, 0);
  }
  EXPECT_FALSE(Contains(err, "kizuna-run:")) << "a clean run says nothing: " << err;
  // Every line carries a prefix.
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("[", 0), 0u) << line;
}

TEST_F(LaunchTest, TheFirstFailureStopsTheOthersAndGivesTheStatus) {
  // Rank 1 fails; the others would sleep for a minute (in a child of the shell: the whole group
  // must be stopped).
  LaunchResult r = Run(4, "echo $$ > $TMP_DIR/pid.$RANK; if [ $RANK = 1 ]; then sleep 0.2; exit 3; fi; sleep 60");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.first_failure, 1);
  EXPECT_LT(seconds_, 10.0);
  for (int i : {0, 2, 3}) {
    EXPECT_TRUE(r.ranks[i].stopped_by_us) << i;
    EXPECT_FALSE(r.ranks[i].exited) << i;
    EXPECT_EQ(r.ranks[i].code, SIGTERM) << i;
    std::ifstream pidfile(fmt::format("{}/pid.{}", dir_, i));
    int pid = 0;
    pidfile >> pid;
    ASSERT_GT(pid, 0);
    EXPECT_NE(kill(pid, 0), 0) << "rank " << i << " is still running";
  }
  std::string err = Err();
  EXPECT_TRUE(Contains(err, "kizuna-run: rank 1 exited with status 3; stopping the other ranks")) << err;
  EXPECT_TRUE(Contains(err, "rank 0 was killed by SIGTERM (stopped by kizuna-run)")) << err;
  EXPECT_TRUE(Contains(err, "exit status 3 (rank 1 failed first)")) << err;
}

TEST_F(LaunchTest, ASignalIsReportedAs128PlusItsNumber) {
  LaunchResult r = Run(2, "if [ $RANK = 0 ]; then kill -SEGV $$; fi; sleep 60");
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV);
  EXPECT_EQ(r.first_failure, 0);
  EXPECT_TRUE(Contains(Err(), "rank 0 was killed by SIGSEGV")) << Err();
}

TEST_F(LaunchTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  // Rank 2 fails only once the other two have installed their trap (each leaves a file; rank 2
  // waits at most 10 s for both): on a loaded machine a shell may not have reached `trap` yet when
  // SIGTERM comes, and would die of it instead of needing SIGKILL.
  std::string dir = ::testing::TempDir() + "launcher-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  LaunchResult r = Run(3,
                       fmt::format("if [ $RANK = 2 ]; then i=0; while [ $(ls {0} | wc -l) -lt 2 ] && [ $i -lt 1000 ]; "
                                   "do sleep 0.01; i=$((i+1)); done; exit 5; fi; trap '' TERM; touch {0}/$RANK; "
                                   "while :; do sleep 0.1; done",
                                   dir),
                       0, 0.3);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_LT(seconds_, 10.0);
  EXPECT_EQ(r.ranks[0].code, SIGKILL);
  EXPECT_TRUE(Contains(Err(), "sent SIGKILL")) << Err();
}

TEST_F(LaunchTest, TimeoutStopsEverything) {
  LaunchResult r = Run(2, "sleep 60", 0.5, 1);
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.first_failure, -1) << "ranks stopped after the timeout are not failures";
  EXPECT_LT(seconds_, 10.0);
  EXPECT_TRUE(Contains(Err(), "timeout")) << Err();
}

TEST_F(LaunchTest, ProgramsThatCannotRun) {
  LaunchOptions o;
  o.nprocs = 2;
  o.command = {"no-such-program-kz"};
  o.environment = {{"PATH", "/usr/bin:/bin"}};
  auto r = Launch(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "not found")) << r.status().message();

  // Executable, but not a format the kernel runs: exec fails in the child, reported here.
  std::string path = fmt::format("{}/not_a_program.{}", dir_, getpid());
  std::ofstream(path) << "\x7f" << "ELF garbage";
  chmod(path.c_str(), 0755);
  o.command = {path};
  r = Launch(o);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status().message(), "cannot execute")) << r.status().message();

  o.command = {};
  EXPECT_EQ(Launch(o).status().code(), StatusCode::kInvalidArgument);
  o.command = {"sh"};
  o.nprocs = 0;
  EXPECT_EQ(Launch(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kizuna::run
