// The connections a fabric is still making. Fabric::Connect is non-blocking: the caller calls it
// again with the same device and handle until it yields a comm, so a backend whose connect takes
// several steps keeps each attempt's state (a T) here, found again by (device index, handle bytes).
//
// Thread-safe: every method takes the map's own lock, held only while the map is read or changed.
// An attempt is shared (shared_ptr) with whoever found it; serializing the use of one attempt is
// the caller's business (the fabrics lock the attempt's own mutex around its Poll and Wait).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "fabric/fabric.h"

namespace kizuna::fabric {

template <typename T>
class PendingConnects {
 public:
  // The attempt for `handle` on device `dev`; nullptr when there is none.
  std::shared_ptr<T> Find(int dev, const Handle& handle) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(KeyOf(dev, handle));
    return it == pending_.end() ? nullptr : it->second;
  }

  // Records `attempt` as the one for (dev, handle), replacing any other.
  void Add(int dev, const Handle& handle, std::shared_ptr<T> attempt) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[KeyOf(dev, handle)] = std::move(attempt);
  }

  // Forgets `attempt` (it yielded a comm, or failed) if it is still the one recorded for
  // (dev, handle): another thread may have replaced it with a fresh attempt meanwhile, which stays.
  void Remove(int dev, const Handle& handle, const std::shared_ptr<T>& attempt) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(KeyOf(dev, handle));
    if (it != pending_.end() && it->second == attempt) pending_.erase(it);
  }

  // One step of Fabric::Connect over these attempts: finds the attempt for (dev, handle) or makes
  // one with `start()` (a Result<std::shared_ptr<T>>), polls it under its own mutex (T::mu,
  // T::Poll), and forgets it once it yielded a comm or failed.
  template <typename Start>
  Result<std::unique_ptr<SendComm>> Step(int dev, const Handle& handle, Start&& start) {
    std::shared_ptr<T> attempt = Find(dev, handle);
    if (attempt == nullptr) {
      KZ_ASSIGN_OR_RETURN(attempt, start());
      Add(dev, handle, attempt);
    }
    Result<std::unique_ptr<SendComm>> r = [&] {
      std::lock_guard<std::mutex> lock(attempt->mu);
      return attempt->Poll();
    }();
    if (!r.ok() || *r != nullptr) Remove(dev, handle, attempt);
    return r;
  }

  // Forgets every attempt (the fabric is going away).
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();
  }

 private:
  using Key = std::pair<int, std::string>;
  static Key KeyOf(int dev, const Handle& handle) {
    return {dev, std::string(reinterpret_cast<const char*>(handle.data.data()), handle.size)};
  }

  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<T>> pending_;  // guarded by mu_
};

}  // namespace kizuna::fabric
