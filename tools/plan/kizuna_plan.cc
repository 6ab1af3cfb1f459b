// kizuna-plan: what the cost model predicts for every algorithm, and what the selector chooses,
// for one collective over a range of sizes on a communicator shape described by flags.
//
//   kizuna-plan --coll allreduce --ranks 8 [--min-bytes 8 --max-bytes 1G --factor 4]
//               [--dtype float32] [--op sum] [--root 0] [--in-place] [--deterministic]
//               [--link-gbps X --latency-us Y --reduce-gbps Z --copy-gbps W --launch-us L]
//               [--zero-copy] [--links full|ring] [--direct [--shared-device]]
//               [--slow-rank R --slow-factor F --slow link|device|both --slow-peer Q]
//               [--chunk-bytes 512K --channels 1] [--algo NAME | --algo 'coll:name;coll:name']
//               [--cost 'name=value,...'] [--json]
//   kizuna-plan ... --dump --count N [--rank R]   the plan of the chosen (or --algo) algorithm
//   kizuna-plan ... --dump --count N --json       the same as a plan file (docs/PLAN_FILES.md)
//   kizuna-plan ... --plan-file F [--plan-file G]  load and check plan files: the algorithm 'file'
//   kizuna-plan --constants                       the cost model's constants and where they come from
//
// Sizes follow nccl-tests: bytes are the larger buffer of one rank (allgather: the output,
// reducescatter and alltoall: the input, nranks * count elements; the others count elements).
// Speeds left out (0) are unknown: the cost model's defaults apply, as for a device or link that
// reports none. --algo takes KIZUNA_ALGO's forms; names not available yet warn and let the model
// choose.
//
// The partial in-network-aggregation planner (docs/ALGORITHMS.md; NTT's SWoPP 2024 talk) is this tool's INA
// mode (ina_mode.h), selected by its own flags:
//
//   kizuna-plan --workers N --aggregators M --worker-ports D --agg-ports E [--layout FILE]
//               [--topology FILE [--bandwidth-gbps X --latency-us Y --shaping]] [--solver S] [--json]
//   kizuna-plan --sweep [--csv FILE] [--plot FILE.svg]      the SWoPP 2024 talk's figure: N=16,32,64, D=8, E=8,16
//   kizuna-plan --seed002 [--workers 8 --worker-ports 4]    NTT's 2024 table of transfer steps
//
// Exit status: 0 success; 1 a plan could not be built (--dump) or the INA mode could not write a
// file; 2 bad command line (CLI11's parse errors included), with a message naming the flag.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "collectives/algorithms/algorithm.h"
#include "collectives/algorithms/from_file.h"
#include "collectives/cost/model.h"
#include "collectives/cost/selector.h"
#include "collectives/plan/plan.h"
#include "collectives/plan/topology.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "tools/plan/ina_mode.h"

namespace kizuna {
namespace {

using collectives::Algorithm;
using collectives::Collective;
using collectives::CollectiveRequest;
using collectives::CommTopology;

// Sizes are capped so that counts stay far from overflow; the model itself takes any count.
constexpr uint64_t kMaxBytes = uint64_t{1} << 50;
// Rows of one sweep: a factor barely above 1 would otherwise print for ever.
constexpr double kMaxRows = 10000;

struct Options {
  std::string coll = "allreduce";
  int ranks = 8;
  std::string min_bytes = "8", max_bytes = "1G";
  double factor = 4;
  std::string dtype = "float32", op = "sum";
  int root = 0;
  bool in_place = false, deterministic = false;
  double link_gbps = 0, latency_us = 0, reduce_gbps = 0, copy_gbps = 0, launch_us = 0;
  bool zero_copy = false;
  bool direct = false;         // ranks address each other's buffers (one process): fused applies
  bool shared_device = false;  // every rank on one device (several ranks per GPU)
  int host_cpus = 0;           // CPUs of the ranks' host (0: unknown)
  bool host_compute = false;   // the devices compute on the host's CPUs and memory (emulated)
  std::string links = "full";
  int hosts = 1;              // ranks dealt out in blocks over this many hosts
  bool host_direct = false;   // the ranks of each host share their buffers (hier:fused applies)
  double net_gbps = 0;        // links between hosts (0: as --link-gbps)
  double net_latency_us = 0;  // (0: as --latency-us)
  int slow_rank = -1;
  int slow_peer = -1;
  double slow_factor = 4;
  std::string slow = "both";
  std::string chunk_bytes = "512K";
  int channels = 1;
  std::string algo, cost;
  bool json = false, dump = false, constants = false;
  std::string count;
  int rank = -1;
};

// What the flags resolve to.
struct Setup {
  Collective coll = Collective::kAllReduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t min_bytes = 0, max_bytes = 0, chunk_bytes = 0;
  CommTopology shape;
  collectives::PlanOptions plan;
  collectives::CostConstants constants;
  collectives::AlgoOverrides overrides;
};

// "8", "64K", "1M", "1G", "1T" (binary). `what` names the unit in messages.
Result<uint64_t> ParseSize(const std::string& text, std::string_view flag, std::string_view what = "byte count") {
  size_t used = 0;
  uint64_t value = 0;
  while (used < text.size() && text[used] >= '0' && text[used] <= '9') {
    if (value > kMaxBytes) break;
    value = value * 10 + static_cast<uint64_t>(text[used] - '0');
    ++used;
  }
  if (used == 0)
    return InvalidArgument(fmt::format("{} '{}': expected a {} such as 8, 64K, 1M or 1G", flag, text, what));
  const std::string suffix = text.substr(used);
  int shift = 0;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB")
    shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    shift = 30;
  else if (suffix == "T" || suffix == "t" || suffix == "TiB")
    shift = 40;
  else
    return InvalidArgument(fmt::format("{} '{}': unknown suffix '{}' (use K, M, G or T)", flag, text, suffix));
  if (value > (kMaxBytes >> shift)) return InvalidArgument(fmt::format("{} '{}': at most 1P is allowed", flag, text));
  return value << shift;
}

std::string CollectiveNames() {
  std::string out;
  for (int i = 0; i < collectives::kNumCollectives; ++i)
    out += fmt::format("{}{}", i ? ", " : "", collectives::CollectiveName(static_cast<Collective>(i)));
  return out + ", sendrecv";
}

// Kept whole: one check per command-line option, in --help's order, which reads best as one list.
Result<Setup> Resolve(const Options& o) {
  Setup s;
  auto coll = collectives::ParseCollective(o.coll);
  if (!coll)
    return InvalidArgument(fmt::format("--coll '{}': unknown collective (known: {})", o.coll, CollectiveNames()));
  s.coll = *coll;
  auto dtype = ParseDataType(o.dtype);
  if (!dtype) return InvalidArgument(fmt::format("--dtype '{}': unknown data type", o.dtype));
  s.dtype = *dtype;
  auto op = ParseReduceOp(o.op);
  if (!op) return InvalidArgument(fmt::format("--op '{}': unknown reduction (sum, prod, min, max, avg)", o.op));
  s.op = *op;
  if (o.ranks < 1 || o.ranks > 65536) return InvalidArgument(fmt::format("--ranks {}: expected 1..65536", o.ranks));
  if (collectives::HasRoot(s.coll) && (o.root < 0 || o.root >= o.ranks))
    return InvalidArgument(fmt::format("--root {}: expected 0..{}", o.root, o.ranks - 1));
  if ((s.coll == Collective::kSend || s.coll == Collective::kRecv) && o.ranks < 2)
    return InvalidArgument(fmt::format("--coll {} needs --ranks 2 or more", o.coll));
  KZ_ASSIGN_OR_RETURN(s.min_bytes, ParseSize(o.min_bytes, "--min-bytes"));
  KZ_ASSIGN_OR_RETURN(s.max_bytes, ParseSize(o.max_bytes, "--max-bytes"));
  if (s.max_bytes < s.min_bytes)
    return InvalidArgument(fmt::format("--min-bytes {} / --max-bytes {}: need min <= max", s.min_bytes, s.max_bytes));
  if (!(o.factor > 1.0) || o.factor > 1024)
    return InvalidArgument(fmt::format("--factor {}: expected 1 < f <= 1024", o.factor));
  if (s.min_bytes > 0 &&
      std::log(static_cast<double>(s.max_bytes) / static_cast<double>(s.min_bytes)) / std::log(o.factor) > kMaxRows)
    return InvalidArgument(fmt::format("--min-bytes {} to --max-bytes {} by --factor {}: more than {} sizes",
                                       s.min_bytes, s.max_bytes, o.factor, kMaxRows));
  KZ_ASSIGN_OR_RETURN(s.chunk_bytes, ParseSize(o.chunk_bytes, "--chunk-bytes"));
  if (s.chunk_bytes < DataTypeSize(s.dtype))
    return InvalidArgument(
        fmt::format("--chunk-bytes {}: at least one element ({} bytes)", s.chunk_bytes, DataTypeSize(s.dtype)));
  if (o.channels < 1 || o.channels > 64)
    return InvalidArgument(fmt::format("--channels {}: expected 1..64", o.channels));
  for (const auto& [flag, v] : std::map<std::string, double>{{"--link-gbps", o.link_gbps},
                                                             {"--latency-us", o.latency_us},
                                                             {"--reduce-gbps", o.reduce_gbps},
                                                             {"--copy-gbps", o.copy_gbps},
                                                             {"--launch-us", o.launch_us}})
    if (!(v >= 0) || v > 1e12)
      return InvalidArgument(fmt::format("{} {}: expected a non-negative number (0: unknown)", flag, v));
  if (o.links != "full" && o.links != "ring")
    return InvalidArgument(fmt::format("--links '{}': expected full or ring", o.links));
  if (o.slow_rank < -1 || o.slow_rank >= o.ranks)
    return InvalidArgument(fmt::format("--slow-rank {}: expected 0..{}", o.slow_rank, o.ranks - 1));
  if (!(o.slow_factor >= 1) || o.slow_factor > 1e6)
    return InvalidArgument(fmt::format("--slow-factor {}: expected 1..1e6", o.slow_factor));
  if (o.slow != "link" && o.slow != "device" && o.slow != "both")
    return InvalidArgument(fmt::format("--slow '{}': expected link, device or both", o.slow));
  if (o.slow_peer != -1 && (o.slow_rank < 0 || o.slow_peer < 0 || o.slow_peer >= o.ranks || o.slow_peer == o.slow_rank))
    return InvalidArgument(
        fmt::format("--slow-peer {}: expected a rank other than --slow-rank, 0..{}", o.slow_peer, o.ranks - 1));
  if (o.rank < -1 || o.rank >= o.ranks)
    return InvalidArgument(fmt::format("--rank {}: expected 0..{}", o.rank, o.ranks - 1));
  if (o.dump && o.count.empty()) return InvalidArgument("--dump needs --count N (elements, as plan.h counts them)");
  if (!o.dump && (!o.count.empty() || o.rank != -1)) return InvalidArgument("--count and --rank go with --dump");

  auto overrides = collectives::ParseAlgoOverrides(o.algo);
  if (!overrides.ok()) return InvalidArgument("--algo: " + overrides.status().message());
  s.overrides = std::move(overrides).value();
  auto constants = collectives::ParseCostConstants(o.cost);
  if (!constants.ok()) return InvalidArgument("--cost: " + constants.status().message());
  s.constants = *constants;

  // The unknown speeds stay 0: the cost model's defaults apply to them.
  s.shape = CommTopology::Uniform(o.ranks, collectives::RankDesc{"host", "dev", o.copy_gbps, o.reduce_gbps, o.launch_us},
                               collectives::LinkDesc{true, o.latency_us, o.link_gbps, !o.zero_copy});
  s.shape.direct = o.direct;
  if (o.shared_device)
    for (auto& rank : s.shape.ranks) rank.device = "dev";
  if (o.host_cpus < 0) return InvalidArgument(fmt::format("--host-cpus {}: must be 0 (unknown) or more", o.host_cpus));
  for (auto& rank : s.shape.ranks) {
    rank.host_cpus = o.host_cpus;
    rank.host_compute = o.host_compute;
  }
  if (o.hosts < 1 || o.hosts > o.ranks)
    return InvalidArgument(fmt::format("--hosts {}: expected 1 to --ranks ({})", o.hosts, o.ranks));
  if (o.net_gbps < 0 || o.net_latency_us < 0) return InvalidArgument("--net-gbps and --net-latency-us must be >= 0");
  for (int r = 0; r < o.ranks; ++r) {
    // Host h holds ranks [h * ranks / hosts, (h + 1) * ranks / hosts).
    int host = 0;
    while ((static_cast<int64_t>(host + 1) * o.ranks) / o.hosts <= r) ++host;
    s.shape.ranks[static_cast<size_t>(r)].host_id = fmt::format("host{}", host);
  }
  if (o.host_direct && o.hosts < 2) return InvalidArgument("--host-direct needs --hosts 2 or more");
  s.shape.host_direct = o.host_direct;
  for (int a = 0; a < o.ranks; ++a)
    for (int b = 0; b < o.ranks; ++b)
      if (a != b && s.shape.ranks[static_cast<size_t>(a)].host_id != s.shape.ranks[static_cast<size_t>(b)].host_id) {
        collectives::LinkDesc& l = s.shape.link(a, b);
        if (o.net_gbps > 0) l.gbps = o.net_gbps;
        if (o.net_latency_us > 0) l.latency_us = o.net_latency_us;
      }
  if (o.links == "ring")
    for (int a = 0; a < o.ranks; ++a)
      for (int b = 0; b < o.ranks; ++b)
        s.shape.link(a, b).reachable = a != b && ((a + 1) % o.ranks == b || (b + 1) % o.ranks == a);
  if (o.slow_rank >= 0) {
    const collectives::CostConstants& k = s.constants;
    const int r = o.slow_rank;
    const double f = o.slow_factor;
    if (o.slow != "link") {
      collectives::RankDesc& d = s.shape.ranks[static_cast<size_t>(r)];
      d.copy_gbps = (d.copy_gbps > 0 ? d.copy_gbps : k.unknown_copy_gbps) / f;
      d.reduce_gbps = (d.reduce_gbps > 0 ? d.reduce_gbps : k.unknown_reduce_gbps) / f;
      d.launch_us = (d.launch_us > 0 ? d.launch_us : k.unknown_launch_us) * f;
    }
    if (o.slow != "device")
      for (int q = 0; q < o.ranks; ++q) {
        if (q == r || (o.slow_peer >= 0 && q != o.slow_peer)) continue;
        for (collectives::LinkDesc* l : {&s.shape.link(r, q), &s.shape.link(q, r)}) {
          l->gbps = (l->gbps > 0 ? l->gbps : k.unknown_link_gbps) / f;
          l->latency_us = (l->latency_us > 0 ? l->latency_us : k.unknown_link_latency_us) * f;
        }
      }
  }
  s.plan.chunk_count = std::max<uint64_t>(1, s.chunk_bytes / DataTypeSize(s.dtype));
  s.plan.channels = o.channels;
  s.plan.deterministic = o.deterministic;
  return s;
}

// Elements of `count` (plan.h) for a row of `bytes` (nccl-tests' size: the larger buffer).
uint64_t CountFor(const Setup& s, uint64_t bytes, int ranks) {
  const uint64_t elems = bytes / DataTypeSize(s.dtype);
  switch (s.coll) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return elems / static_cast<uint64_t>(ranks);
    case Collective::kBarrier:
      return 0;
    default:
      return elems;
  }
}

CollectiveRequest RequestFor(const Setup& s, const Options& o, uint64_t count) {
  CollectiveRequest r;
  r.collective = s.coll;
  r.nranks = o.ranks;
  r.count = count;
  r.dtype = s.dtype;
  r.op = s.op;
  r.root = collectives::HasRoot(s.coll) ? o.root : 0;
  r.in_place = o.in_place;
  return r;
}

Status Supports(Algorithm a, const CollectiveRequest& r, const CommTopology& shape) {
  return collectives::GetAlgorithm(a).Supports(r, shape);
}

struct Row {
  uint64_t bytes = 0;
  uint64_t count = 0;
  Result<collectives::Selection> selection = Status(StatusCode::kInternal, "unset");
  std::vector<Status> support;  // per algorithm, when the selection failed
};

std::vector<Row> Sweep(const Setup& s, const Options& o) {
  std::vector<Row> rows;
  std::vector<uint64_t> sizes;
  if (s.coll == Collective::kBarrier) {
    sizes.push_back(0);
  } else {
    for (double b = static_cast<double>(s.min_bytes); b <= static_cast<double>(s.max_bytes) * (1 + 1e-9);
         b *= o.factor) {
      sizes.push_back(static_cast<uint64_t>(b));
      if (b == 0) break;  // --min-bytes 0: one row
    }
  }
  for (uint64_t bytes : sizes) {
    Row row;
    row.bytes = bytes;
    row.count = CountFor(s, bytes, o.ranks);
    const CollectiveRequest r = RequestFor(s, o, row.count);
    row.selection = collectives::SelectAlgorithm(r, s.shape, s.plan, s.constants, s.overrides, std::nullopt, Supports);
    if (!row.selection.ok())
      for (int a = 0; a < collectives::kNumAlgorithms; ++a)
        row.support.push_back(Supports(static_cast<Algorithm>(a), r, s.shape));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string Describe(const Setup& s, const Options& o) {
  const collectives::CostConstants& k = s.constants;
  auto value = [](double v, double unknown, std::string_view unit) {
    return v > 0 ? fmt::format("{} {}", v, unit) : fmt::format("{} {} (default)", unknown, unit);
  };
  std::string out =
      fmt::format("# kizuna-plan: {} over {} ranks, {} {}{}{}\n", collectives::CollectiveName(s.coll), o.ranks,
                  DataTypeName(s.dtype), collectives::IsReduction(s.coll) ? std::string(ReduceOpName(s.op)) : "-",
                  o.in_place ? ", in place" : "", o.deterministic ? ", deterministic" : "");
  out +=
      fmt::format("# links: {}, {}, {}, {}\n", o.links == "ring" ? "neighbours only (ring)" : "every pair",
                  value(o.link_gbps, k.unknown_link_gbps, "GB/s"), value(o.latency_us, k.unknown_link_latency_us, "us"),
                  o.zero_copy ? "zero-copy" : "staged at both ends");
  if (o.direct)
    out += fmt::format("# direct: the ranks address each other's buffers (one process){}\n",
                       o.shared_device ? ", all on one device" : "");
  out +=
      fmt::format("# devices: copy {}, reduce {}, launch {}\n", value(o.copy_gbps, k.unknown_copy_gbps, "GB/s"),
                  value(o.reduce_gbps, k.unknown_reduce_gbps, "GB/s"), value(o.launch_us, k.unknown_launch_us, "us"));
  if (o.host_cpus > 0 || o.host_compute)
    out += fmt::format("# host: {} CPUs{}\n", o.host_cpus > 0 ? std::to_string(o.host_cpus) : "unknown",
                       o.host_compute ? fmt::format(", devices computing on it share {} GB/s of memory traffic",
                                                    k.host_memory_gbps)
                                      : "");
  if (o.slow_rank >= 0)
    out += fmt::format("# rank {}: {} {}x slower\n", o.slow_rank,
                       o.slow == "device" ? std::string("device")
                       : o.slow_peer >= 0 ? fmt::format("{}links to and from rank {}",
                                                        o.slow == "both" ? "device and " : "", o.slow_peer)
                       : o.slow == "link" ? std::string("links")
                                          : std::string("links and device"),
                       o.slow_factor);
  out += fmt::format("# plan: chunk {} bytes ({} elements), {} channel(s){}\n", s.chunk_bytes, s.plan.chunk_count,
                     s.plan.channels, o.algo.empty() ? "" : fmt::format(", algo '{}'", o.algo));
  return out;
}

std::string Pad(const std::string& s, size_t width, bool right) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

void PrintTable(const Setup& s, const Options& o, const std::vector<Row>& rows) {
  std::string out = Describe(s, o);
  // Reasons, once each, as notes the cells refer to.
  std::vector<std::string> notes;
  auto note = [&](const std::string& text) {
    for (size_t i = 0; i < notes.size(); ++i)
      if (notes[i] == text) return i + 1;
    notes.push_back(text);
    return notes.size();
  };
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> header = {"bytes", "count"};
  for (int a = 0; a < collectives::kNumAlgorithms; ++a)
    header.push_back(std::string(collectives::AlgorithmName(static_cast<Algorithm>(a))));
  header.push_back("choice");
  header.push_back("by");
  table.push_back(header);
  for (const Row& row : rows) {
    std::vector<std::string> line = {std::to_string(row.bytes), std::to_string(row.count)};
    if (!row.selection.ok()) {
      for (int a = 0; a < collectives::kNumAlgorithms; ++a) {
        const Status& st = row.support[static_cast<size_t>(a)];
        line.push_back(
            st.ok() ? "?"
                    : fmt::format("n/s [{}]",
                                  note(fmt::format("{}: {}", collectives::AlgorithmName(static_cast<Algorithm>(a)),
                                                   st.message()))));
      }
      line.push_back("none");
      line.push_back(fmt::format("[{}]", note(row.selection.status().ToString())));
    } else {
      const collectives::Selection& sel = *row.selection;
      for (const collectives::Candidate& c : sel.candidates) {
        if (c.supported())
          line.push_back(c.prediction.finite()
                             ? collectives::FormatSeconds(c.seconds())
                             : fmt::format("? [{}]", note(fmt::format("{}: no prediction: {}",
                                                                      collectives::AlgorithmName(c.algorithm),
                                                                      c.prediction.note))));
        else
          line.push_back(fmt::format(
              "n/s [{}]", note(fmt::format("{}: {}", collectives::AlgorithmName(c.algorithm), c.support.message()))));
      }
      line.push_back(std::string(collectives::AlgorithmName(sel.chosen)));
      if (sel.forced)
        line.push_back("forced");
      else if (sel.requested)
        line.push_back(fmt::format("fallback [{}]", note(sel.reason)));
      else
        line.push_back("model");
    }
    table.push_back(std::move(line));
  }
  std::vector<size_t> width(table[0].size(), 0);
  for (const auto& line : table)
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  for (size_t r = 0; r < table.size(); ++r) {
    std::string text;
    for (size_t i = 0; i < table[r].size(); ++i) {
      const bool last = i + 1 == table[r].size();
      // Numbers right-aligned, names left-aligned; the header follows its column.
      const bool right = i < 2 + static_cast<size_t>(collectives::kNumAlgorithms);
      text += (i ? "  " : "") + (last ? table[r][i] : Pad(table[r][i], width[i], right));
    }
    out += text + "\n";
  }
  for (size_t i = 0; i < notes.size(); ++i) out += fmt::format("[{}] {}\n", i + 1, notes[i]);
  std::fputs(out.c_str(), stdout);
}

void PrintJson(const Setup& s, const Options& o, const std::vector<Row>& rows) {
  using nlohmann::json;
  auto number = [](double v) { return v < std::numeric_limits<double>::infinity() ? json(v) : json(nullptr); };
  json j;
  j["collective"] = std::string(collectives::CollectiveName(s.coll));
  j["ranks"] = o.ranks;
  j["dtype"] = std::string(DataTypeName(s.dtype));
  j["op"] = std::string(ReduceOpName(s.op));
  j["root"] = o.root;
  j["in_place"] = o.in_place;
  j["deterministic"] = o.deterministic;
  j["chunk_bytes"] = s.chunk_bytes;
  j["chunk_count"] = s.plan.chunk_count;
  j["channels"] = s.plan.channels;
  j["algo"] = o.algo;
  j["shape"] = {{"links", o.links},         {"link_gbps", o.link_gbps}, {"latency_us", o.latency_us},
                {"staged", !o.zero_copy},   {"copy_gbps", o.copy_gbps}, {"reduce_gbps", o.reduce_gbps},
                {"launch_us", o.launch_us}, {"slow_rank", o.slow_rank}, {"slow_factor", o.slow_factor},
                {"slow", o.slow},           {"slow_peer", o.slow_peer}, {"direct", o.direct},
                {"shared_device", o.shared_device}, {"host_cpus", o.host_cpus},
                {"host_compute", o.host_compute}, {"hosts", o.hosts}, {"host_direct", o.host_direct}};
  json constants = json::object();
  for (const collectives::CostConstantInfo& c : collectives::CostConstantTable())
    constants[std::string(c.name)] = s.constants.*c.field;
  j["constants"] = constants;
  j["warnings"] = s.overrides.warnings;
  j["rows"] = json::array();
  for (const Row& row : rows) {
    json r = {{"bytes", row.bytes}, {"count", row.count}};
    if (!row.selection.ok()) {
      r["chosen"] = nullptr;
      r["error"] = row.selection.status().message();
    } else {
      const collectives::Selection& sel = *row.selection;
      r["chosen"] = std::string(collectives::AlgorithmName(sel.chosen));
      r["forced"] = sel.forced;
      r["reason"] = sel.reason;
      r["algorithms"] = json::array();
      for (const collectives::Candidate& c : sel.candidates) {
        json a = {{"name", std::string(collectives::AlgorithmName(c.algorithm))}, {"supported", c.supported()}};
        if (!c.supported()) {
          a["reason"] = c.support.message();
        } else {
          const collectives::Prediction& p = c.prediction;
          a["seconds"] = number(p.seconds);
          a["alpha_s"] = p.alpha_s;
          a["beta_s"] = p.beta_s;
          a["gamma_s"] = p.gamma_s;
          // A count; a double only so that it cannot overflow.
          if (p.stages < 9e15)
            a["stages"] = static_cast<uint64_t>(p.stages);
          else
            a["stages"] = p.stages;
          a["structure"] = p.structure;
          if (!p.finite()) a["note"] = p.note;
        }
        r["algorithms"].push_back(std::move(a));
      }
    }
    j["rows"].push_back(std::move(r));
  }
  fmt::print("{}\n", j.dump(2));
}

void PrintConstants(const collectives::CostConstants& k) {
  fmt::print("# cost model constants (collectives/cost/model.h); override with --cost 'name=value,...'\n");
  const collectives::CostConstants defaults;
  for (const collectives::CostConstantInfo& c : collectives::CostConstantTable())
    fmt::print("{:<24} {:>6} {:<5} {}\n", c.name, k.*c.field, c.unit,
               k.*c.field == defaults.*c.field ? std::string(c.source)
                                               : fmt::format("set by --cost (default {})", defaults.*c.field));
}

int Dump(const Setup& s, const Options& o) {
  auto count = ParseSize(o.count, "--count", "element count");
  if (!count.ok()) {
    fmt::print(stderr, "kizuna-plan: {}\n", count.status().message());
    return 2;
  }
  const CollectiveRequest r = RequestFor(s, o, *count);
  auto sel = collectives::SelectAlgorithm(r, s.shape, s.plan, s.constants, s.overrides, std::nullopt, Supports);
  if (!sel.ok()) {
    fmt::print(stderr, "kizuna-plan: {}\n", sel.status().ToString());
    return 1;
  }
  if (o.json && o.rank != -1) {
    fmt::print(stderr, "kizuna-plan: --dump --json prints every rank (a plan file); leave out --rank\n");
    return 2;
  }
  if (!o.json) {
    fmt::print("# {}\n", collectives::SelectionToString(*sel));
    fmt::print("# {}\n", collectives::ExplainPrediction(sel->chosen, r, s.shape, s.plan, s.constants));
  }
  auto plan = collectives::BuildPlan(sel->chosen, r, s.shape, s.plan, o.rank);
  if (!plan.ok()) {
    fmt::print(stderr, "kizuna-plan: building the {} plan: {}\n", collectives::AlgorithmName(sel->chosen),
               plan.status().ToString());
    return 1;
  }
  if (o.json) {
    auto text = collectives::PlanToJson(*plan, fmt::format("{}-{}-{}", collectives::AlgorithmName(sel->chosen),
                                                           collectives::CollectiveName(r.collective), r.nranks));
    if (!text.ok()) {
      fmt::print(stderr, "kizuna-plan: --dump --json: {}\n", text.status().message());
      return 1;
    }
    std::fputs(text->c_str(), stdout);
    return 0;
  }
  std::fputs(collectives::PlanToString(*plan).c_str(), stdout);
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-plan: the cost model's prediction for every algorithm and the selector's choice, per size; "
               "with --workers, --sweep or --seed002 the partial in-network-aggregation planner",
               "kizuna-plan"};
  Options o;
  app.add_option("--coll", o.coll,
                 "allreduce, reducescatter, allgather, broadcast, reduce, alltoall, send, recv, barrier")
      ->capture_default_str();
  app.add_option("-n,--ranks", o.ranks, "communicator size")->capture_default_str();
  app.add_option("-b,--min-bytes", o.min_bytes, "smallest size (K/M/G suffixes; nccl-tests' meaning)")
      ->capture_default_str();
  app.add_option("-e,--max-bytes", o.max_bytes, "largest size")->capture_default_str();
  app.add_option("-f,--factor", o.factor, "size step (> 1)")->capture_default_str();
  app.add_option("-d,--dtype", o.dtype, "element type")->capture_default_str();
  app.add_option("-o,--op", o.op, "reduction: sum, prod, min, max, avg")->capture_default_str();
  app.add_option("-r,--root", o.root, "root (broadcast, reduce) or peer (send, recv)")->capture_default_str();
  app.add_flag("--in-place", o.in_place, "in-place buffers (plan.h's table)");
  app.add_flag("--deterministic", o.deterministic, "KIZUNA_DETERMINISTIC=1: reductions in rank order");
  app.add_option("--link-gbps", o.link_gbps, "link bandwidth per direction, GB/s (0: unknown)")->capture_default_str();
  app.add_option("--latency-us", o.latency_us, "link latency, us (0: unknown)")->capture_default_str();
  app.add_option("--reduce-gbps", o.reduce_gbps, "device reduce throughput, input GB/s (0: unknown)")
      ->capture_default_str();
  app.add_option("--copy-gbps", o.copy_gbps, "device copy throughput, GB/s (0: unknown)")->capture_default_str();
  app.add_option("--launch-us", o.launch_us, "device operation launch cost, us (0: unknown)")->capture_default_str();
  app.add_flag("--zero-copy", o.zero_copy, "links move device memory directly (default: staged at both ends)");
  app.add_flag("--direct", o.direct, "the ranks address each other's buffers (ranks of one process): fused applies");
  app.add_flag("--shared-device", o.shared_device, "every rank on one device (several ranks per GPU)");
  app.add_option("--host-cpus", o.host_cpus, "CPUs of the ranks' host: more ranks than CPUs take turns (0: unknown)")
      ->capture_default_str();
  app.add_flag("--host-compute", o.host_compute,
               "the devices compute on the host (emulated): they share its memory bandwidth");
  app.add_option("--hosts", o.hosts, "hosts the ranks are on, in blocks (the hierarchical algorithms need 2 or more)")
      ->capture_default_str();
  app.add_flag("--host-direct", o.host_direct,
               "the ranks of each host share their buffers across processes (hier:fused applies)");
  app.add_option("--net-gbps", o.net_gbps, "links between hosts, GB/s (0: as --link-gbps)")->capture_default_str();
  app.add_option("--net-latency-us", o.net_latency_us, "links between hosts, us (0: as --latency-us)")
      ->capture_default_str();
  app.add_option("--links", o.links, "full (every pair linked) or ring (neighbours only)")->capture_default_str();
  app.add_option("--slow-rank", o.slow_rank, "make this rank slower (-1: none)")->capture_default_str();
  app.add_option("--slow-factor", o.slow_factor, "how much slower (>= 1)")->capture_default_str();
  app.add_option("--slow", o.slow, "what is slower: link, device or both")->capture_default_str();
  app.add_option("--slow-peer", o.slow_peer, "slow only the links between --slow-rank and this rank (-1: all)")
      ->capture_default_str();
  app.add_option("--chunk-bytes", o.chunk_bytes, "largest step (the executor's default chunk is 512K)")
      ->capture_default_str();
  app.add_option("--channels", o.channels, "channels")->capture_default_str();
  app.add_option("--algo", o.algo, "force an algorithm, as KIZUNA_ALGO: 'ring' or 'allreduce:ring;allgather:rhd'");
  app.add_option("--cost", o.cost, "override cost constants: 'unknown_link_gbps=12.5,...' (see --constants)");
  app.add_flag("--json", o.json, "print JSON instead of the table");
  app.add_flag("--dump", o.dump,
               "print the plan of the chosen algorithm for --count elements (with --json: as a "
               "plan file, docs/PLAN_FILES.md)");
  std::vector<std::string> plan_files;
  app.add_option("--plan-file", plan_files,
                 "load and check a plan file (KIZUNA_PLAN_FILE): the algorithm 'file' "
                 "(repeatable)");
  app.add_option("--count", o.count, "--dump: elements (plan.h's count)");
  app.add_option("--rank", o.rank, "--dump: only this rank's steps (-1: every rank)")->capture_default_str();
  app.add_flag("--constants", o.constants, "print the cost model's constants and exit");
  plan_tool::InaOptions ina;
  plan_tool::AddInaOptions(app, ina);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (plan_tool::InaRequested(app)) return plan_tool::RunIna(app, ina, o.latency_us, o.json);
  auto setup = Resolve(o);
  if (!setup.ok()) {
    fmt::print(stderr, "kizuna-plan: {}\n", setup.status().message());
    return 2;
  }
  for (const std::string& w : setup->overrides.warnings) fmt::print(stderr, "kizuna-plan: warning: {}\n", w);
  if (o.constants) {
    PrintConstants(setup->constants);
    return 0;
  }
  if (!plan_files.empty()) {
    collectives::PlanFiles files;
    for (const std::string& path : plan_files) {
      auto f = collectives::LoadPlanFile(path);
      Status checked = f.ok() ? collectives::CheckPlanFile(*f) : f.status();
      if (!checked.ok()) {
        fmt::print(stderr, "kizuna-plan: {}\n", checked.message());
        return 1;
      }
      fmt::print(stderr, "kizuna-plan: {} ({}): {} on {} ranks in {} units, checked\n", f->name, path,
                 collectives::CollectiveName(f->collective), f->nranks, f->units);
      files.push_back(std::move(f).value());
    }
    setup->shape.plan_files = std::make_shared<const collectives::PlanFiles>(std::move(files));
  }
  if (o.dump) return Dump(*setup, o);
  const std::vector<Row> rows = Sweep(*setup, o);
  if (o.json)
    PrintJson(*setup, o, rows);
  else
    PrintTable(*setup, o, rows);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
