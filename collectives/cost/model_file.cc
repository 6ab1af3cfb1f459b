// The "file" algorithm's prediction (collectives/plan/plan_file.h): the plan's own steps, as the
// executor would run them. Stage j carries the j-th send of every rank's every channel (a plan
// file's schedule is a sequence of rounds in which each rank sends and receives), each hop's bytes
// its step's, reduced where the receiving step reduces; the local copies and reductions of the
// busiest rank follow as device work.
#include <map>

#include "collectives/cost/model_internal.h"
#include "collectives/plan/plan_file.h"

namespace kizuna::collectives::cost_internal {

void Model::FilePlan() {
  const PlanFile* file = nullptr;
  if (shape_.plan_files)
    for (const PlanFile& f : *shape_.plan_files)
      if (PlanFileServes(f, req_).ok()) {
        file = &f;
        break;
      }
  if (file == nullptr) return Fail("no plan file serves the request");
  std::vector<RankPlan> plans;
  for (int r = 0; r < p_; ++r) {
    Result<RankPlan> rp = InstantiatePlanFile(*file, req_, r, opt_.chunk_count);
    if (!rp.ok()) return Fail(rp.status().message());
    plans.push_back(std::move(rp).value());
  }
  // Per rank and channel: its sends in order, and its receiving steps per sender in order.
  struct Send {
    int peer;
    uint64_t count;
    size_t nth;  // among this channel's sends to `peer`
  };
  std::map<std::pair<int, size_t>, std::vector<Send>> sends;          // (rank, channel)
  std::map<std::tuple<int, size_t, int>, std::vector<bool>> reduces;  // (rank, channel, from)
  std::vector<uint64_t> copied(static_cast<size_t>(p_), 0), reduced(static_cast<size_t>(p_), 0);
  size_t rounds = 0;
  for (int r = 0; r < p_; ++r)
    for (size_t c = 0; c < plans[static_cast<size_t>(r)].channels.size(); ++c) {
      std::map<int, size_t> to_peer;
      for (const Step& s : plans[static_cast<size_t>(r)].channels[c]) {
        if (s.kind == StepKind::kSend) sends[{r, c}].push_back({s.peer, s.count(), to_peer[s.peer]++});
        if (s.kind == StepKind::kRecv || s.kind == StepKind::kRecvReduce)
          reduces[{r, c, s.peer}].push_back(s.kind == StepKind::kRecvReduce);
        if (s.kind == StepKind::kCopy) copied[static_cast<size_t>(r)] += s.count();
        if (s.kind == StepKind::kReduce) reduced[static_cast<size_t>(r)] += s.count() * (s.srcs.size() - 1);
      }
      rounds = std::max(rounds, sends[{r, c}].size());
    }
  for (size_t j = 0; j < rounds && !failed_; ++j) {
    std::vector<Hop> hops;
    std::vector<uint64_t> counts;
    uint64_t most = 0;
    for (const auto& [key, list] : sends) {
      if (j >= list.size()) continue;
      const Send& s = list[j];
      const auto it = reduces.find({s.peer, key.second, key.first});
      const bool reduce = it != reduces.end() && s.nth < it->second.size() && it->second[s.nth];
      hops.push_back({key.first, s.peer, reduce});
      counts.push_back(s.count);
      most = std::max(most, s.count);
    }
    if (most == 0) continue;
    for (size_t h = 0; h < hops.size(); ++h) hops[h].scale = static_cast<double>(counts[h]) / static_cast<double>(most);
    Stage("file round", hops, static_cast<double>(most) * elem_, 1, 1);
  }
  const auto busiest = [](const std::vector<uint64_t>& v) {
    uint64_t m = 0;
    int at = 0;
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] > m) m = v[i], at = static_cast<int>(i);
    return std::pair<uint64_t, int>(m, at);
  };
  if (const auto [n, r] = busiest(copied); n > 0) Local("file copies", LocalKind::kCopy, 1, n, r);
  if (const auto [n, r] = busiest(reduced); n > 0) Local("file reductions", LocalKind::kReduce, 2, n, r);
}

}  // namespace kizuna::collectives::cost_internal
