// kizuna-plan's INA mode: the partial in-network-aggregation planner (collectives/ina/planner.h)
// for a shape given by flags, the sweep of NTT's SWoPP 2024 talk as CSV and SVG, and the table of
// NTT's 2024 talk on collectives.
//
//   kizuna-plan --workers N [--aggregators M] [--worker-ports D] [--agg-ports E] [--solver auto|dp|closed-form]
//               [--layout FILE] [--topology FILE [--bandwidth-gbps X] [--latency-us Y] [--shaping]] [--json]
//   kizuna-plan --sweep [--csv FILE] [--plot FILE.svg] [--workers N] [--worker-ports D] [--agg-ports E]
//               [--aggregators MMAX]
//   kizuna-plan --seed002 [--workers 8] [--worker-ports 4]
//
// Any of these flags selects the mode; the cost model's flags (--coll, --ranks, ...) do not mix
// with it. Exit status as the rest of kizuna-plan: 0 success; 1 a file that could not be written
// (every valid shape has a plan: a ring fits one port per worker); 2 bad command line, with a
// message naming the flag.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace kizuna::plan_tool {

struct InaOptions {
  int workers = 0, aggregators = 0, worker_ports = 8, agg_ports = 8;
  std::string solver = "auto";
  std::string layout, topology, csv, plot;
  double bandwidth_gbps = 0;
  bool shaping = false, sweep = false, seed002 = false;
  std::vector<double> worker_speeds;  // ina::Problem::worker_speeds
};

// Registers the mode's flags on `app` (--latency-us and --json are the cost model's, shared).
void AddInaOptions(CLI::App& app, InaOptions& o);

// Whether the parsed command line gave any of the mode's own flags.
bool InaRequested(const CLI::App& app);

// Runs the mode after parsing; `latency_us` and `json` are the shared flags' values. Returns the
// exit status.
int RunIna(const CLI::App& app, const InaOptions& o, double latency_us, bool json);

}  // namespace kizuna::plan_tool
