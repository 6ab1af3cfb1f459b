// A Bootstrap for a subset of another Bootstrap's ranks (the child of Communicator::Split), made
// of the parent's point-to-point messages: no new rendezvous, no new secret, no new sockets.
//
// AllGather goes through the subset's first member (everyone sends it their bytes, it sends back
// the whole table); Barrier is an AllGather of nothing; Send/Recv are the parent's, with ranks
// translated. Every message uses tags at or above `tag_base`, which the ranks of one split choose
// alike and never reuse (Communicator::Split numbers its splits), so the traffic of different
// children, and the parent's own, never mix.
//
// The parent is shared: it stays alive as long as any child does. Like every Bootstrap it serves
// one call at a time, and the parent's limit applies across children: a communicator and its
// children must not run creation calls (Split, Create) concurrently from different threads —
// the same rule NCCL has for ncclCommSplit.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/bootstrap/bootstrap.h"
#include "runtime/core/status.h"

namespace kizuna::bootstrap {

// `members` are parent ranks in child-rank order (child rank i is parent rank members[i]); the
// calling rank must be one of them. Tags used: [tag_base, tag_base + 2^16 + 3).
Result<std::unique_ptr<Bootstrap>> CreateSubBootstrap(std::shared_ptr<Bootstrap> parent, std::vector<int> members,
                                                      uint32_t tag_base);

}  // namespace kizuna::bootstrap
