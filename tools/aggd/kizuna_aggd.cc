// kizuna-aggd: an aggregation device (docs/ALGORITHMS.md; NTT's Optcast: a spare CPU as the
// switch). It joins an INA job as one of the ranks after the layout's workers
// (KIZUNA_INA_LAYOUT), receives the chunks its children stream up, reduces them as they arrive
// in a bounded number of scratch slots, and sends the result up its tree or back down
// (collectives/algorithms/ina.cc, collectives/executor/serve.cc). It proves the job's secret like
// every rank (the bootstrap's handshake), so a peer without it never gets a connection.
//
//   kizuna-run -n 8 -- worker : -n 2 kizuna-aggd          one job, ranks from the launcher
//   kizuna-aggd --rank 8 --size 10 --unique-id-file F --jobs 0
//       serves job after job: waits for F to hold a new job's id (its rank 0 writes it,
//       KIZUNA_UNIQUE_ID_FILE), serves that job until it ends, frees everything, and waits for
//       the next; a job that dies mid-stream ends the same way (its error is logged).
//
// Exit status: 0 when every job served ended normally (its workers closed their connections),
// 1 when one failed (the last failure is printed), 2 for bad command-line input.
#include <chrono>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/bootstrap/unique_id.h"
#include "runtime/communicator.h"
#include "runtime/core/config.h"
#include "runtime/core/file.h"
#include "runtime/core/logging.h"
#include "runtime/device/registry.h"

namespace kizuna {
namespace {

struct Options {
  int rank = -1;
  int size = 0;
  std::string id_file;
  int jobs = 1;  // 0: forever
};

// An id is about 80 bytes; a file far larger is not an id file (and /dev/zero would never end).
constexpr size_t kMaxIdFileBytes = 4096;

// The next job's id from `path`: its content once it differs from `last` (rank 0 of the next job
// replaces it), checked every 50 ms until the deadline, which names the last reason it was not one.
Result<std::string> WaitForNewId(const std::string& path, const std::string& last, Deadline deadline) {
  std::string why = "it does not exist";
  while (true) {
    Result<std::string> text = ReadFileCapped(path, kMaxIdFileBytes, "unique id file", 1.0);
    if (text.ok()) {
      std::string id = std::move(*text);
      while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
      Result<bootstrap::UniqueId> parsed = bootstrap::UniqueId::Parse(id);
      if (!id.empty() && id != last && parsed.ok()) return id;
      why = id.empty() ? "it is empty" : id == last ? "it holds the last job's id" : parsed.status().message();
    } else {
      why = text.status().message();
    }
    if (deadline.Expired())
      return Timeout(fmt::format("no new job id appeared in {} before the deadline (last look: {})", path, why));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Serves one job on `comm`; ok when it ended normally.
Status ServeJob(Communicator& comm, int job) {
  if (!comm.aggregation_device())
    return InvalidArgument(fmt::format("rank {} is a worker of the INA layout, not an aggregation device: give "
                                       "kizuna-aggd a rank after the layout's {} workers (KIZUNA_INA_LAYOUT)",
                                       comm.rank(), comm.size()));
  uint64_t served = 0;
  const Status why = comm.ServeAggregation(&served);
  const bool ended = why.code() == StatusCode::kUnavailable;
  fmt::print("kizuna-aggd: job {}: rank {}, {} operations served; {}: {}\n", job, comm.rank(), served,
             ended ? "ended" : "failed", why.message());
  std::fflush(stdout);
  return ended ? Status::Ok() : why;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "kizuna-aggd: an aggregation device for in-network aggregation. Joins an INA job (KIZUNA_INA_LAYOUT) as a rank "
      "after its workers and reduces the workers' streams. Under a launcher (kizuna-run, mpirun, srun) it serves that "
      "job; with --unique-id-file it serves job after job.",
      "kizuna-aggd"};
  Options o;
  app.add_option("--rank", o.rank, "this device's rank in the job (after the workers); default: the launcher's");
  app.add_option("--size", o.size, "ranks in the job (workers + aggregation devices); default: the launcher's");
  app.add_option("--unique-id-file", o.id_file, "where each job's rank 0 writes its id (KIZUNA_UNIQUE_ID_FILE)");
  app.add_option("--jobs", o.jobs, "jobs to serve with --unique-id-file (0: until stopped)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const Config& config = GlobalConfig();
  if (config.ina_layout.empty()) {
    fmt::print(stderr, "kizuna-aggd: KIZUNA_INA_LAYOUT is not set: an aggregation device needs the job's layout "
                       "(kizuna-plan --layout FILE)\n");
    return 2;
  }
  if (!o.id_file.empty() && (o.rank < 0 || o.size < 1 || o.rank >= o.size)) {
    fmt::print(stderr, "kizuna-aggd: --unique-id-file needs --rank R and --size S with 0 <= R < S\n");
    return 2;
  }
  if (o.jobs < 0) {
    fmt::print(stderr, "kizuna-aggd: --jobs {}: expected 0 or more\n", o.jobs);
    return 2;
  }

  Status last = Status::Ok();
  if (o.id_file.empty()) {  // one job, from the launcher
    auto comm = Communicator::CreateFromEnvironment();
    if (!comm.ok()) {
      fmt::print(stderr, "kizuna-aggd: joining the job: {}\n", comm.status().ToString());
      return 1;
    }
    SetLogRank((*comm)->rank());
    last = ServeJob(**comm, 1);
  } else {
    auto registry = device::DeviceRegistry::Create(config);
    if (registry->devices().empty()) {
      fmt::print(stderr, "kizuna-aggd: no device to reduce on (KIZUNA_EMULATED_DEVICES=0?)\n");
      return 1;
    }
    device::Device& dev = *registry->devices()[0];
    SetLogRank(o.rank);
    std::string previous;
    for (int job = 1; o.jobs == 0 || job <= o.jobs; ++job) {
      Result<std::string> id = WaitForNewId(o.id_file, previous, Deadline::AfterSeconds(config.timeout_s));
      if (!id.ok()) {
        last = id.status();
        fmt::print(stderr, "kizuna-aggd: {}\n", last.ToString());
        break;
      }
      previous = *id;
      auto comm = Communicator::Create(*bootstrap::UniqueId::Parse(*id), o.rank, o.size, dev);
      if (!comm.ok()) {
        last = comm.status();
        fmt::print(stderr, "kizuna-aggd: job {}: joining: {}\n", job, last.ToString());
        std::fflush(stderr);
        continue;  // a job that never formed: wait for the next one
      }
      const Status s = ServeJob(**comm, job);
      if (!s.ok()) last = s;
    }
  }
  if (!last.ok()) {
    fmt::print(stderr, "kizuna-aggd: {}\n", last.ToString());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
