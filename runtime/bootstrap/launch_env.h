// Who am I in this job, and how do the ranks meet: rank, size and local rank from the launcher
// that started the process, and the job's UniqueId. Pure functions of an environment map, so tests
// need no real launcher; BootstrapFromEnvironment() puts them together for a real process.
//
// Launchers, and the variables read (both rank and size must be present for a launcher to count):
//   torchrun / kizuna-run   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (MASTER_ADDR, MASTER_PORT)
//   mpirun (Open MPI)       OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   PMI (MPICH's Hydra, Intel MPI, srun --mpi=pmi2)
//                           PMI_RANK, PMI_SIZE (MPI_LOCALRANKID, MPI_LOCALNRANKS)
//   Slurm (srun)            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
//   none                    rank 0 of 1
// The unique id may come through the launcher's key-value store (launcher_kvs.h): PMI-1 (PMI_FD,
// MPICH's Hydra) or PMIx (PMIX_RANK, Open MPI).
//
// When several launchers are present, the innermost wins, in this order: torchrun, Open MPI, PMI,
// Slurm. The others must agree with it, with two exceptions that are how jobs are really started:
// Slurm variables are ignored (srun often starts one torchrun or mpirun per node, and a batch
// script's SLURM_PROCID=0 is inherited by everything it starts), and so is any launcher that
// reports a smaller world (an outer launcher that started one inner launcher per node, e.g.
// `mpirun -np 2 torchrun --nproc-per-node 4`). Any other disagreement is kInvalidArgument naming
// both variables. Each ignored launcher is listed in LaunchInfo::notes.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/bootstrap/bootstrap.h"
#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {

using Environment = std::map<std::string, std::string>;

// Every variable of this process's environment.
Environment ProcessEnvironment();

enum class Launcher : uint8_t { kNone, kTorchrun, kOpenMpi, kPmi, kSlurm };
// "none", "torchrun", "Open MPI", "PMI", "Slurm".
std::string_view LauncherName(Launcher launcher);

struct LaunchInfo {
  Launcher launcher = Launcher::kNone;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 0;  // 0: the launcher does not say
  std::vector<std::string> notes;  // launchers that were present but ignored, and why

  // "rank 3 of 8 (local 1 of 4), from torchrun".
  std::string Describe() const;
};

// Rank, size and local rank from the launcher variables in `env`. Malformed values (not an
// integer, rank >= size, ...) and disagreeing launchers are kInvalidArgument naming the variables.
Result<LaunchInfo> DetectLaunch(const Environment& env);

struct RootAddress {
  HostPort address;
  std::string origin;  // "KIZUNA_ROOT", or "MASTER_ADDR:MASTER_PORT+1"
};

// Where the root listens when this process creates the UniqueId: KIZUNA_ROOT (config.root, as
// host:port), else MASTER_ADDR:(MASTER_PORT+1) (torchrun's store owns MASTER_PORT itself), else
// nullopt (GetUniqueId then picks a local address and a free port).
Result<std::optional<RootAddress>> ConfiguredRoot(const Config& config, const Environment& env);

enum class UniqueIdSource : uint8_t { kVariable, kFile, kLauncher, kGenerated };

struct ObtainedUniqueId {
  UniqueId id;
  UniqueIdSource source = UniqueIdSource::kVariable;
  std::string detail;  // where from, for the log
};

// The job's UniqueId, from (in order):
//   KIZUNA_UNIQUE_ID       (config.unique_id) the printable id; kizuna-run sets it;
//   KIZUNA_UNIQUE_ID_FILE  (config.unique_id_file) a path every rank can read: rank 0 creates the
//                          id (GetUniqueId) and writes it there atomically with mode 0600 (a temporary
//                          file in the same folder, then rename), the others wait for the file until
//                          `deadline`. Use a fresh path per job: a file left from an earlier job is
//                          read as it is, and its ranks then fail to authenticate with the new root;
//   the launcher's store   PMI_FD (PMI-1: MPICH's mpirun) or PMIX_RANK (PMIx: Open MPI's mpirun):
//                          rank 0 creates the id (GetUniqueId) and puts it there, the others get
//                          it after the store's fence (launcher_kvs.h);
//   a single-rank job      a fresh id on the loopback address;
// otherwise kInvalidArgument explaining these options (and GetUniqueId for applications that
// distribute the id themselves, as with ncclGetUniqueId).
Result<ObtainedUniqueId> ObtainUniqueId(const LaunchInfo& launch, const Config& config, const Environment& env,
                                        Deadline deadline);

// Everything above for this process: the launcher from the process environment, the UniqueId,
// then CreateTcpBootstrap, with GlobalConfig().timeout_s (KIZUNA_TIMEOUT) as the deadline of the
// whole sequence. Logs (INFO, BOOTSTRAP) the launcher detected and where the id came from.
Result<std::unique_ptr<Bootstrap>> BootstrapFromEnvironment();

}  // namespace kizuna::bootstrap
