// Which fabrics a communicator's connections may use: those every rank has (transport.h).
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/transport/transport.h"
#include "fabric/registry.h"
#include "runtime/core/logging.h"
#include "runtime/core/wire.h"

namespace kizuna::collectives {
namespace {

// Every rank's fabric names, in its preference order, from the allgathered lists.
Result<std::vector<std::vector<std::string>>> GatherFabricNames(std::span<fabric::Fabric* const> available,
                                                                bootstrap::Bootstrap& boot, Deadline deadline) {
  wire::Bytes mine;
  for (const fabric::Fabric* f : available) wire::PutString(mine, f->name());
  KZ_ASSIGN_OR_RETURN(auto lists, boot.AllGather(mine, deadline));
  std::vector<std::vector<std::string>> names(lists.size());
  for (size_t r = 0; r < lists.size(); ++r) {
    wire::Reader in(lists[r]);
    while (in.ok() && in.left() > 0) names[r].push_back(in.String());
    if (!in.AtEnd()) return Internal(fmt::format("rank {} sent a malformed list of its fabrics", r));
  }
  return names;
}

// "rank 0: directconnect, ofi; rank 1: none; ..." (the first 8 ranks).
std::string DescribeEachRank(const std::vector<std::vector<std::string>>& names) {
  std::string each;
  const size_t shown = std::min<size_t>(names.size(), 8);
  for (size_t r = 0; r < shown; ++r) {
    std::string list;
    for (const std::string& name : names[r]) list += (list.empty() ? "" : ", ") + name;
    each += fmt::format("{}rank {}: {}", each.empty() ? "" : "; ", r, list.empty() ? "none" : list);
  }
  if (names.size() > shown) each += fmt::format("; and {} more ranks", names.size() - shown);
  return each;
}

}  // namespace

Result<std::vector<fabric::Fabric*>> AgreeOnFabrics(const fabric::FabricRegistry& registry, bootstrap::Bootstrap& boot,
                                                    int rank, Deadline deadline) {
  Result<std::vector<fabric::Fabric*>> selected = registry.SelectAll();
  const std::vector<fabric::Fabric*> available = selected.ok() ? *selected : std::vector<fabric::Fabric*>{};
  KZ_ASSIGN_OR_RETURN(const auto names, GatherFabricNames(available, boot, deadline));
  std::vector<fabric::Fabric*> common;
  std::string common_names;
  for (const std::string& name : names[0]) {
    bool everywhere = true;
    for (const auto& list : names) everywhere &= std::find(list.begin(), list.end(), name) != list.end();
    if (!everywhere) continue;
    common.push_back(*std::find_if(available.begin(), available.end(),
                                   [&](const fabric::Fabric* f) { return f->name() == name; }));
    common_names += (common_names.empty() ? "" : ", ") + name;
  }
  if (common.empty()) {
    if (!selected.ok()) return selected.status();
    return InvalidArgument(fmt::format("no fabric is available on every rank ({}); make one available everywhere, "
                                       "or set KIZUNA_FABRIC alike on every rank",
                                       DescribeEachRank(names)));
  }
  if (rank == 0) KZ_INFO(kLogInit, "fabrics on every rank, in preference order: {}", common_names);
  return common;
}

}  // namespace kizuna::collectives
