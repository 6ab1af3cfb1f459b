// One rank of the traps test (traps_test.sh), under kizuna-run or started by hand with a launcher's
// environment:
//
//   trap_rank allreduce [PER_HOST]   create a communicator from the environment, run checked
//                                    AllReduces; PER_HOST > 0: the ranks claim hosts of that many
//                                    ranks (pretend hosts: the network path, on one machine)
//   trap_rank hold DIR               the same, but rank 0 first writes its KIZUNA_UNIQUE_ID to
//                                    DIR/id and rank 1 waits (at most 30 s) for DIR/go before it
//                                    joins: room for a stranger to knock at the root meanwhile
//
// Prints "rank R of N: allreduce ok" on success; on failure "rank R: FAILED: ERROR" (R from RANK
// when there is no communicator) and exits 1. The test asserts the error text, so every failure
// prints the Status as kizuna returned it.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "runtime/communicator.h"

namespace kizuna::test {
namespace {

std::string RankName() {
  const char* rank = std::getenv("RANK");
  return rank != nullptr ? rank : "?";
}

int Fail(const std::string& what) {
  std::printf("rank %s: FAILED: %s\n", RankName().c_str(), what.c_str());
  std::fflush(stdout);
  return 1;
}

// Rank 0 publishes the job's unique id; rank 1 waits until the test lets it join.
int Hold(const std::string& dir) {
  if (RankName() == "0") {
    const char* id = std::getenv("KIZUNA_UNIQUE_ID");
    if (id == nullptr) return Fail("hold: KIZUNA_UNIQUE_ID is not set (run under kizuna-run)");
    {
      std::ofstream out(dir + "/id.tmp");
      out << id << "\n";
      if (!out) return Fail("hold: cannot write " + dir + "/id.tmp");
    }
    if (std::rename((dir + "/id.tmp").c_str(), (dir + "/id").c_str()) != 0) return Fail("hold: rename");
  } else if (RankName() == "1") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (::access((dir + "/go").c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > until) return Fail("hold: " + dir + "/go never appeared");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return 0;
}

// AllReduces of a few sizes (a small one, and ones that take several chunks), every element
// checked: rank r gives r + 1 + round, so the sum is n(n+1)/2 + n * round.
Status AllReduces(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  KZ_ASSIGN_OR_RETURN(auto stream, comm.device().CreateStream());
  constexpr size_t kMax = size_t{1} << 20;
  KZ_ASSIGN_OR_RETURN(auto dev, comm.device().Allocate(kMax * sizeof(float)));
  KZ_ASSIGN_OR_RETURN(auto host, comm.device().AllocateHost(kMax * sizeof(float)));
  auto* h = static_cast<float*>(host->data());
  int round = 0;
  for (size_t count : {size_t{1}, size_t{4099}, kMax}) {
    for (size_t k = 0; k < count; ++k) h[k] = static_cast<float>(r + 1 + round);
    KZ_RETURN_IF_ERROR(stream->Copy(dev->data(), h, count * sizeof(float)));
    KZ_RETURN_IF_ERROR(comm.AllReduce(dev->data(), dev->data(), count, DataType::kFloat32, ReduceOp::kSum, *stream));
    KZ_RETURN_IF_ERROR(stream->Copy(h, dev->data(), count * sizeof(float)));
    KZ_RETURN_IF_ERROR(stream->Synchronize(Deadline::AfterSeconds(60)));
    KZ_RETURN_IF_ERROR(comm.AsyncError());
    const float want = static_cast<float>(n * (n + 1) / 2 + n * round);
    for (size_t k = 0; k < count; ++k)
      if (h[k] != want)
        return Internal(fmt::format("AllReduce of {} floats: element {} is {}, expected {}", count, k, h[k], want));
    ++round;
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  CommOptions options;
  if (mode == "allreduce" && argc > 2 && std::atoi(argv[2]) > 0) {
    const char* rank = std::getenv("RANK");
    options.host_id = fmt::format("pretend-host-{}", rank != nullptr ? std::atoi(rank) / std::atoi(argv[2]) : -1);
  } else if (mode == "hold") {
    if (argc < 3) return Fail("usage: trap_rank hold DIR");
    if (int failed = Hold(argv[2]); failed != 0) return failed;
  } else if (mode != "allreduce") {
    return Fail("usage: trap_rank allreduce [PER_HOST] | hold DIR");
  }
  auto created = Communicator::CreateFromEnvironment(options);
  if (!created.ok()) return Fail(created.status().ToString());
  Communicator& comm = **created;
  if (Status s = AllReduces(comm); !s.ok()) return Fail(s.ToString());
  std::printf("rank %d of %d: allreduce ok\n", comm.rank(), comm.size());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace kizuna::test

int main(int argc, char** argv) { return kizuna::test::Main(argc, argv); }
