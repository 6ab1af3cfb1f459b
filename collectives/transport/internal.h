// What transport.cc, connections.cc and staging.cc share. Not a public header.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "collectives/transport/transport.h"

namespace kizuna::collectives::transport_internal {

// "a, b, c", or "none".
std::string NameList(const std::vector<std::string>& names);
// "rank 3", "ranks 1, 2" (the first 16, then "and N more").
std::string RankList(const std::vector<int>& ranks);
// "8 MiB", "3 KiB", "1000 bytes".
std::string SizeText(size_t n);

// The staging buffer's fd exports, each present when the device makes it and some fabric device
// takes fds.
struct StagingExports {
  std::optional<device::ExportedMemory> dmabuf, exported;
};

}  // namespace kizuna::collectives::transport_internal

namespace kizuna::collectives {

// How comms register the staging buffer (staging.cc).
struct Transport::Staging {
  transport_internal::StagingExports exports;      // of the staging buffer, kept for comms made later
  transport_internal::StagingExports p2p_exports;  // of point-to-point's region
  bool any_takes_fd = false;  // some fabric device that serves a peer registers by fd
  bool host = false;          // the buffers are host memory (kHostMemory everywhere)
  // Some comm registered the device's memory: a comm that refuses it after that is an error (the
  // staging cannot move any more).
  bool registered_device = false;
};

}  // namespace kizuna::collectives
