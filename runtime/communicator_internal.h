// What the communicator's files share (communicator.cc: plans, calls, groups, Split;
// communicator_create.cc: creation). Not a public header.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/communicator.h"

namespace kizuna {

struct Communicator::Call {
  collectives::CollectiveRequest request;
  const void* input = nullptr;
  void* output = nullptr;
  device::Stream* stream = nullptr;
  CallOptions options;
};

struct GroupState {
  int depth = 0;
  std::vector<std::pair<Communicator*, Communicator::Call>> calls;
};


struct Communicator::PlanCache {
  std::mutex mu;
  using Key = std::tuple<int, uint64_t, int, int, int, bool, int, uint64_t, int, bool, bool, bool>;
  std::map<Key, std::shared_ptr<const collectives::Plan>> plans;
  // The plan of the last lookup, checked before the map: a loop repeating one call finds it
  // without the lock and the map's key comparisons. Only Launch looks plans up, under call_mu_,
  // which guards these two.
  Key last_key;
  std::shared_ptr<const collectives::Plan> last_plan;
  std::map<std::tuple<int, uint64_t, int, int, int, int>, bool> logged;  // selections logged once
};

}  // namespace kizuna
