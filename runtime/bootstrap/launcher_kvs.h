// The launcher's key-value store, where the launcher offers one, for passing rank 0's unique id to
// the other ranks without a file or a variable set by hand:
//   PMI-1   the wire protocol of MPICH's Hydra (mpiexec / mpirun.mpich) and other PMI-1 launchers:
//           commands on the socket PMI_FD names (no library needed);
//   PMIx    Open MPI's (mpirun.openmpi; PMIX_RANK, PMIX_NAMESPACE): libpmix.so.2 through dlopen,
//           so machines without it build and run.
// Rank 0 puts the value, every rank meets at the store's fence, the others get it. A program that
// also initialises MPI shares the same channel: MPI's own PMI client runs beside this one (PMIx
// counts initialisations; a PMI-1 server answers each command as it comes).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {

class LauncherKvs {
 public:
  virtual ~LauncherKvs() = default;
  // "PMI-1 (PMI_FD 6)", "PMIx (namespace 664010753)".
  virtual std::string Describe() const = 0;
  // Rank 0 (`rank`) stores `value` under `key`; all ranks fence; the others return rank 0's
  // value (rank 0 returns its own). Errors name the store and the step; kTimeout at `deadline`.
  virtual Result<std::string> Share(int rank, std::string_view key, std::string_view value, Deadline deadline) = 0;
};

// The store the environment names (PMI_FD, else PMIX_RANK with PMIX_NAMESPACE), or nullptr when it
// names none. kUnavailable when it names PMIx but libpmix.so.2 cannot be loaded; kInvalidArgument
// for a malformed PMI_FD.
Result<std::unique_ptr<LauncherKvs>> OpenLauncherKvs(const Environment& env);

// The PMI-1 client over an already connected socket `fd` (not owned: the launcher gave it to the
// process, and MPI may use it after kizuna). `finalize_at_exit`: the session is finalized when the
// process exits (the launcher's own socket); tests on a socket pair of their own pass false.
std::unique_ptr<LauncherKvs> Pmi1OverFd(int fd, bool finalize_at_exit = false);

}  // namespace kizuna::bootstrap
