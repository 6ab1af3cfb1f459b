// One rank of a job that survives a lost rank, under kizuna-run --keep-going (survive_test.sh, the
// cluster test):
//
//   survive kill|stop|pause VICTIM [PER_HOST]
//
// Every rank runs AllReduces of 4096 floats and checks them; at round 5 rank VICTIM kills itself
// (SIGKILL) or freezes (SIGSTOP). The others must fail naming it ("rank VICTIM"), then Shrink it
// away (ShrinkMode::kAbort) and run 20 more AllReduces with exact results. A frozen victim is
// killed afterwards by the new rank 0, so that the job ends. PER_HOST > 0: the ranks claim hosts
// of that many ranks (pretend hosts: the network path between them, on one machine).
// Prints "rank R: lost rank V named after S s: ERROR", "rank R: shrank to N ranks in S s (now rank
// Q)" and "rank R: 20 AllReduces ok after the loss"; exits non-zero naming what went wrong.
// `pause`: the victim stops itself at round 5 and goes on when continued (SIGCONT), the others
// wait for it (kizuna-status's test looks at the job meanwhile); every rank prints "rank R: 10
// AllReduces ok" at the end.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/communicator.h"

namespace kizuna {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kCount = 4096;
constexpr int kLossRound = 5;
constexpr int kRoundsAfter = 20;

int Fail(const std::string& what) {
  std::fprintf(stderr, "survive: %s\n", what.c_str());
  return 1;
}

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One AllReduce round: rank r gives r + 1 + round everywhere; the sum is checked. The call's
// error (the call's, the stream's or the communicator's), or ok.
Status Round(Communicator& comm, device::Stream& stream, float* buf, int round) {
  const int n = comm.size();
  for (size_t k = 0; k < kCount; ++k) buf[k] = static_cast<float>(comm.rank() + 1 + round);
  Status s = comm.AllReduce(buf, buf, kCount, DataType::kFloat32, ReduceOp::kSum, stream);
  if (s.ok()) s = stream.Synchronize(Deadline::AfterSeconds(300));
  if (s.ok()) s = comm.AsyncError();
  if (!s.ok()) return s;
  const float want = static_cast<float>(n * (n + 1) / 2 + n * round);
  for (size_t k = 0; k < kCount; ++k) {
    if (buf[k] != want)
      return Internal(fmt::format("round {}: element {} is {}, expected {} (rank {} of {})", round, k, buf[k], want,
                                  comm.rank(), n));
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  if (argc < 3) return Fail("usage: survive kill|stop|pause VICTIM [PER_HOST]");
  const std::string how = argv[1];
  const int victim = std::atoi(argv[2]);
  const int per_host = argc > 3 ? std::atoi(argv[3]) : 0;
  if (how != "kill" && how != "stop" && how != "pause") return Fail("the first argument is kill, stop or pause");
  CommOptions options;
  if (per_host > 0) {
    const char* rank = std::getenv("RANK");
    options.host_id = fmt::format("pretend-host-{}", rank != nullptr ? std::atoi(rank) / per_host : -1);
  }
  auto created = Communicator::CreateFromEnvironment(options);
  if (!created.ok()) return Fail(created.status().ToString());
  std::unique_ptr<Communicator> comm = std::move(*created);
  const int r = comm->rank(), n = comm->size();
  if (victim < 0 || victim >= n) return Fail(fmt::format("victim {} is not a rank of {}", victim, n));
  if (!comm->device().properties().host_accessible) return Fail("the device's memory is not host-accessible");
  auto stream_or = comm->device().CreateStream();
  if (!stream_or.ok()) return Fail(stream_or.status().ToString());
  device::Stream& stream = **stream_or;
  auto mem = comm->device().Allocate(kCount * sizeof(float) + static_cast<size_t>(n + 1) * sizeof(int64_t));
  if (!mem.ok()) return Fail(mem.status().ToString());
  float* buf = static_cast<float*>((*mem)->data());
  auto* pids = reinterpret_cast<int64_t*>(buf + kCount);
  // Every rank's pid, so that the survivors can end a frozen victim.
  pids[n] = getpid();
  Status s = comm->AllGather(pids + n, pids, 1, DataType::kInt64, stream);
  if (s.ok()) s = stream.Synchronize(Deadline::AfterSeconds(60));
  if (!s.ok()) return Fail("gathering the pids: " + s.ToString());

  if (how == "pause") {
    for (int round = 0; round < 10; ++round) {
      if (round == kLossRound && r == victim) {
        std::printf("rank %d: stopping at round %d\n", r, round);
        std::fflush(stdout);
        raise(SIGSTOP);
      }
      if (Status e = Round(*comm, stream, buf, round); !e.ok())
        return Fail(fmt::format("rank {}: {}", r, e.ToString()));
      if (round == kLossRound - 1) {
        std::printf("rank %d: round %d done\n", r, round);
        std::fflush(stdout);
      }
    }
    std::printf("rank %d: 10 AllReduces ok\n", r);
    return 0;
  }
  int round = 0;
  Clock::time_point call_start;
  for (;; ++round) {
    if (round == kLossRound && r == victim) {
      std::fflush(stdout);
      raise(how == "kill" ? SIGKILL : SIGSTOP);
      return Fail("went on after SIGSTOP");  // a frozen victim is killed, never continued
    }
    if (round > kLossRound + 3) return Fail(fmt::format("rank {}: no error {} rounds after the loss", r, round));
    call_start = Clock::now();
    s = Round(*comm, stream, buf, round);
    if (!s.ok()) break;
  }
  const double detect_s = Since(call_start);
  if (round < kLossRound) return Fail(fmt::format("round {} failed before the loss: {}", round, s.ToString()));
  if (s.ToString().find(fmt::format("rank {}", victim)) == std::string::npos)
    return Fail(fmt::format("rank {}: the error does not name rank {}: {}", r, victim, s.ToString()));
  std::printf("rank %d: lost rank %d named after %.2f s: %s\n", r, victim, detect_s, s.ToString().c_str());
  std::fflush(stdout);

  const Clock::time_point shrink_start = Clock::now();
  const std::vector<int> lost = {victim};
  auto shrunk = comm->Shrink(lost, ShrinkMode::kAbort);
  if (!shrunk.ok()) return Fail(fmt::format("rank {}: Shrink: {}", r, shrunk.status().ToString()));
  std::unique_ptr<Communicator> next = std::move(*shrunk);
  std::printf("rank %d: shrank to %d ranks in %.2f s (now rank %d)\n", r, next->size(), Since(shrink_start),
              next->rank());
  std::fflush(stdout);
  if (next->size() != n - 1 || next->rank() != (r < victim ? r : r - 1))
    return Fail(fmt::format("rank {}: the new communicator is rank {} of {}", r, next->rank(), next->size()));
  for (int i = 0; i < kRoundsAfter; ++i) {
    if (Status e = Round(*next, stream, buf, i); !e.ok())
      return Fail(fmt::format("rank {} after: {}", r, e.ToString()));
  }
  std::printf("rank %d: %d AllReduces ok after the loss\n", r, kRoundsAfter);
  std::fflush(stdout);
  if (how == "stop" && next->rank() == 0) kill(static_cast<pid_t>(pids[victim]), SIGKILL);
  next.reset();
  comm.reset();
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
