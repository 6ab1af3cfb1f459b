// StreamEnvironment's registry of live streams by native handle (stream.h), for AdoptStream.
#include <utility>

#include "devices/host_emulated/stream.h"

namespace kizuna::host_emulated {

void StreamEnvironment::AddNative(void* handle, Native native) {
  std::lock_guard lock(natives_mu_);
  // Streams come and go: the entries of destroyed ones go when the map has doubled since.
  if (natives_.size() >= 2 * natives_pruned_at_ + 16) {
    std::erase_if(natives_, [](const auto& e) { return e.second.core.expired(); });
    natives_pruned_at_ = natives_.size();
  }
  natives_[handle] = std::move(native);
}

std::optional<StreamEnvironment::Native> StreamEnvironment::FindNative(void* handle) {
  std::lock_guard lock(natives_mu_);
  const auto it = natives_.find(handle);
  if (it == natives_.end() || it->second.core.expired()) return std::nullopt;
  return it->second;
}

}  // namespace kizuna::host_emulated
