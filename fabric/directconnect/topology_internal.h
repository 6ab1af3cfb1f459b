// Shared by topology.cc (parsing) and topology_generators.cc (generators): internal to the
// topology library.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "runtime/core/status.h"

namespace kizuna::fabric::directconnect::internal {

// "w0:3" -> ("w0", 3); the node name may itself contain ':' (the last one separates the port).
Result<std::pair<std::string, int>> SplitPortName(std::string_view s);

}  // namespace kizuna::fabric::directconnect::internal
