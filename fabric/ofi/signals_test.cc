// The program's crash and termination signal handlers survive loading libfabric and creating the
// fabric (loader.h, SignalHandlerGuard): on Debian, libfabric.so.1 links libinfinipath, whose
// constructor replaces the handlers of SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM with
// its own (print a backtrace, exit 1). Its own binary, so that libfabric is not loaded yet when
// the first test starts.

#include <signal.h>
#include <sys/resource.h>

#include <cstring>

#include <gtest/gtest.h>

#include "fabric/ofi/fabric.h"
#include "fabric/ofi/loader.h"
#include "fabric/ofi/test_util.h"

namespace kizuna::fabric::ofi {
namespace {

void ProgramHandler(int) {}

void* Code(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(a.sa_sigaction)
                                        : reinterpret_cast<void*>(a.sa_handler);
}

// The fabric, or why it cannot be made here.
Status CreateFabric() {
  auto f = OfiFabric::Create(testing::ConfigFor("tcp"), testing::Rank(0));
  return f.ok() ? Status() : f.status();
}

void CreateFabricThenCrash() {
  const rlimit no_core{0, 0};  // no core file from the test
  ::setrlimit(RLIMIT_CORE, &no_core);
  (void)CreateFabric();                   // the crash below is the point, whatever the fabric says
  volatile int* volatile null = nullptr;  // both volatile: the store is neither removed nor made a trap
  *null = 1;
}

TEST(OfiSignals, CreatingTheFabricKeepsTheProgramsHandlers) {
  // The program's own handlers on two signals, the defaults on the others.
  struct sigaction own {};
  own.sa_handler = ProgramHandler;
  sigemptyset(&own.sa_mask);
  ASSERT_EQ(::sigaction(SIGINT, &own, nullptr), 0);
  ASSERT_EQ(::sigaction(SIGTERM, &own, nullptr), 0);
  struct sigaction before[SignalHandlerGuard::kCount];
  for (size_t i = 0; i < SignalHandlerGuard::kCount; ++i)
    ASSERT_EQ(::sigaction(SignalHandlerGuard::kSignals[i], nullptr, &before[i]), 0);

  const Status created = CreateFabric();
  for (size_t i = 0; i < SignalHandlerGuard::kCount; ++i) {
    struct sigaction after {};
    ASSERT_EQ(::sigaction(SignalHandlerGuard::kSignals[i], nullptr, &after), 0);
    EXPECT_EQ(Code(after), Code(before[i])) << "SIG" << ::sigabbrev_np(SignalHandlerGuard::kSignals[i])
                                            << "'s handler changed (fabric: " << created.ToString() << ")";
  }
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (!created.ok()) GTEST_SKIP() << "no ofi fabric here (" << created.ToString() << "); libfabric was still loaded";
}

// A handler the program installs inside a guarded scope is its own: it stays.
TEST(OfiSignals, AHandlerTheProgramInstallsMeanwhileIsKept) {
  {
    SignalHandlerGuard guard("a test");
    ASSERT_NE(::signal(SIGBUS, ProgramHandler), SIG_ERR);
  }
  struct sigaction now {};
  ASSERT_EQ(::sigaction(SIGBUS, nullptr, &now), 0);
  EXPECT_EQ(Code(now), reinterpret_cast<void*>(ProgramHandler));
  signal(SIGBUS, SIG_DFL);
}

// A crash after the fabric was made is still a crash: killed by SIGSEGV (not "exited with status
// 1"), so that kizuna-run reports it as such and a core dump is written.
TEST(OfiSignals, ACrashAfterCreatingTheFabricIsKilledBySigsegv) {
  // A fresh process for the child (re-executed): libfabric is loaded inside the statement.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CreateFabricThenCrash(), ::testing::KilledBySignal(SIGSEGV), "");
}

}  // namespace
}  // namespace kizuna::fabric::ofi
