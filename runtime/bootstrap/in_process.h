// N ranks as threads of one process, over an in-memory store: the Bootstrap of tests of the layers
// above (Gloo's HashStore habit) and of single-process multi-device use.
//
// Same contract as bootstrap.h (deadlines, error codes, one call at a time per object, sticky
// collective failures). Each rank's Bootstrap is normally used by its own thread. Destroying a
// rank's Bootstrap is that rank leaving: others waiting for it, or calling a collective later, get
// kRemoteError naming it; messages it sent before leaving can still be received. Waits block on a
// condition variable (no spinning).
#pragma once

#include <memory>
#include <vector>

#include "runtime/bootstrap/bootstrap.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {

// n Bootstraps sharing one store; result[r] is rank r. n must be in 1..kMaxRanks.
Result<std::vector<std::unique_ptr<Bootstrap>>> CreateInProcessBootstraps(int n);

}  // namespace kizuna::bootstrap
