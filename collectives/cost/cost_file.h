// A machine's measured costs (KIZUNA_COST_FILE, written by kizuna-tune): the cost model's constants
// and, per fabric, the latency and bandwidth of its links, in place of what the fabrics declare.
//
//   # comments
//   oversubscribed_wake_us = 12        every communicator
//   [ranks=4]                          communicators of 4 ranks (kizuna-tune's measurements at 4)
//   # measured ...                     a comment right under a header is the section's note
//   message_overhead_us = 3.1
//   link.directconnect.latency_us = 5.2
//   link.directconnect.gbps = 2.4      GB/s (bytes), as the cost model counts
//
// Names are CostConstantTable()'s, or link.<fabric>.latency_us / link.<fabric>.gbps. A communicator
// takes the entries before the first section, then those of the section for its rank count, or,
// without one, of the section nearest to it (by ratio; the smaller on a tie). Every rank must use
// the same costs: the engine compares them when the communicator forms.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/cost/model.h"
#include "runtime/core/status.h"

namespace kizuna::collectives {

struct LinkCosts {
  double latency_us = 0;  // 0: keep the fabric's
  double gbps = 0;        // 0: keep the fabric's
};

struct CostFile {
  struct Section {
    int ranks = 0;                                        // 0: before any section (every communicator)
    std::vector<std::pair<std::string, double>> entries;  // in file order
    // A comment right under the section's header (kizuna-tune's figures), kept when the file is
    // read and written again.
    std::string note;
  };
  std::string path;  // for messages; "" when parsed from text
  std::vector<Section> sections;
};

// What a communicator of `nranks` uses.
struct AppliedCosts {
  CostConstants constants;
  std::map<std::string, LinkCosts> links;  // by fabric name
  std::string source;                      // "cost.txt, ranks=4" or "defaults"
  // Every value, for the ranks to compare ("k=v,...;link.x.latency_us=...").
  std::string Digest() const;
};

// kInvalidArgument naming the line: an unknown name, a malformed or negative value, a zero speed,
// a malformed section header.
Result<CostFile> ParseCostFile(std::string_view text, std::string path = "");
Result<CostFile> LoadCostFile(const std::string& path);
AppliedCosts CostsFor(const CostFile& file, int nranks);
// The file's text, with `header` lines as comments first.
std::string FormatCostFile(const CostFile& file, const std::vector<std::string>& header);

}  // namespace kizuna::collectives
