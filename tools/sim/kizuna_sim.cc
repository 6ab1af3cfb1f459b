// kizuna-sim: the engine's own plans run in simulated time on a modelled cluster (docs/SIMULATOR.md).
//
//   kizuna-sim --network switch --ranks 16 [--link-gbps 25 --latency-us 2]
//   kizuna-sim --network rails --hosts 4 --per-host 8 --nics 8 [--intra-gbps 400 --pcie-gbps 50]
//   kizuna-sim --network rail-only --hosts 4 --per-host 8 --nics 8
//   kizuna-sim --network fat-tree --hosts 32 --per-host 8 --nics 8 --leaf-hosts 4 --oversubscription 2
//   kizuna-sim --network torus2d --dims 4x4          (torus3d --dims 4x4x4, ring or full --ranks 8)
//   ... [--coll allreduce] [--algo all|ring,tree,...] [-b 8 -e 1G -f 8] [--dtype float32]
//       [--chunk-bytes 512K --channels N] [--copy-gbps X --reduce-gbps Y --launch-us Z]
//       [--staged] [--host-cpus C [--ranks-per-host P] [--message-cpu-us M]]
//       [--window 4] [--sharing fair|fifo] [--json FILE] [--plot FILE.svg] [--trace FILE.json]
//   kizuna-sim --network direct --topology FILE [--bundle]   (a direct-connect topology file)
//   kizuna-sim --network direct --layout FILE --algo ina,ring (an INA layout: kizuna-plan --layout's)
//
// For every size and algorithm that serves the collective: the simulated time, busbw (nccl-tests'
// factors), the busiest link and how busy it was, and beside them the cost model's prediction and
// choice over the same shape (each pair's link: its route's slowest link and summed latency).
// Exit status: 0; 1 a plan could not run; 2 a bad command line, with a message naming the flag.
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/parallel_for.h>

#include "collectives/algorithms/algorithm.h"
#include "collectives/cost/model.h"
#include "collectives/cost/selector.h"
#include "collectives/ina/layout.h"
#include "fabric/directconnect/topology.h"
#include "tools/bench/plot.h"
#include "tools/sim/network.h"
#include "tools/sim/timed_run.h"

namespace kizuna::sim {
namespace {

using collectives::Algorithm;
using collectives::Collective;
using collectives::CollectiveRequest;
using collectives::CommTopology;

Result<uint64_t> Size(const std::string& text, const char* flag) {
  size_t used = 0;
  uint64_t v = 0;
  while (used < text.size() && text[used] >= '0' && text[used] <= '9' && v < (uint64_t{1} << 50))
    v = v * 10 + static_cast<uint64_t>(text[used++] - '0');
  const std::string suffix = text.substr(used);
  int shift = -1;
  if (suffix.empty()) shift = 0;
  if (suffix == "K") shift = 10;
  if (suffix == "M") shift = 20;
  if (suffix == "G") shift = 30;
  if (used == 0 || shift < 0 || v == 0)
    return InvalidArgument(fmt::format("{} '{}': expected a size such as 8, 64K, 1M or 1G", flag, text));
  return v << shift;
}

// The cost model's view of the network: host ids from the rails' hosts, each pair's link its
// route's slowest link and summed latency (`cabled`: only pairs one link apart, as the engine
// sees a network of cables it does not forward over), devices as the simulator has them.
CommTopology ShapeOf(const Network& net, const NetworkSpec& spec, const DeviceModel& d, bool cabled) {
  collectives::RankDesc rank;
  rank.copy_gbps = d.copy_gbps;
  rank.reduce_gbps = d.reduce_gbps;
  rank.launch_us = d.launch_us;
  // Where the network has a symmetry, block 0's rows stand for every block's: the link from
  // g(a) to b is the link from a to g^-1(b). Blocks shifted along one dimension are what a
  // periodic shape says (CommTopology::link_period: the first block's rows alone are kept); for
  // the others (a torus's shifts, XOR) every row is written from the first block's.
  const RankGroup* g = net.Symmetries().empty() ? nullptr : &net.Symmetries().front();
  const bool periodic = g && g->op() == RankGroup::Op::kAdd && g->blocks() == g->order() && g->ranks() == net.ranks() &&
                        g->Generators() == std::vector<int>{1};
  CommTopology shape = periodic ? CommTopology::Uniform(net.ranks(), g->unit(), rank, collectives::LinkDesc{})
                                : CommTopology::Uniform(net.ranks(), rank, collectives::LinkDesc{});
  const bool rails = spec.kind == "rails" || spec.kind == "rail-only" || spec.kind == "fat-tree";
  for (int r = 0; r < net.ranks(); ++r)
    shape.ranks[static_cast<size_t>(r)].host_id =
        rails ? fmt::format("host{}", r / spec.per_host) : fmt::format("r{}", r);
  const int computed = g ? g->unit() : net.ranks();
  for (int a = 0; a < computed; ++a) {
    for (int b = 0; b < net.ranks(); ++b) {
      const auto [gbps, latency] = a == b ? std::pair(0.0, 0.0) : net.RouteSummary(a, b);
      if (gbps <= 0 || (cabled && net.Route(a, b).size() != 1)) continue;
      collectives::LinkDesc& l = shape.link(a, b);
      l.reachable = true;
      l.latency_us = latency * 1e6;
      l.gbps = gbps;
      l.staged = false;
      // Cables between hosts: a route of several cables is a pair the engine forwards through the
      // ranks in between (LinkDesc::hops; the latency is then counted per cable).
      if (const int hops = static_cast<int>(net.Route(a, b).size()); spec.kind == "direct" && hops > 1) {
        l.hops = hops;
        l.latency_us /= hops;
      }
    }
  }
  for (int a = periodic ? net.ranks() : computed; a < net.ranks(); ++a) {
    const int back = g->Inverse(g->ElementTo(a / g->unit())), a0 = a % g->unit();
    for (int b = 0; b < net.ranks(); ++b) shape.link(a, b) = shape.link(a0, g->Apply(back, b));
  }
  return shape;
}

// The workers' shape over an INA layout's cables, as the engine agrees on it over the direct-connect
// fabric the layout's topology file sets up (engine_create.cc): workers reach the workers one
// cable joins them to, and the cables to the aggregation devices are the INA link.
CommTopology LayoutShape(const Network& net, const collectives::ina::Layout& layout, const DeviceModel& d) {
  collectives::RankDesc rank;
  rank.copy_gbps = d.copy_gbps;
  rank.reduce_gbps = d.reduce_gbps;
  rank.launch_us = d.launch_us;
  CommTopology shape = CommTopology::Uniform(layout.workers, rank, collectives::LinkDesc{});
  for (int a = 0; a < layout.workers; ++a) shape.ranks[static_cast<size_t>(a)].host_id = fmt::format("r{}", a);
  auto cable = [&](int a, int b) {
    const auto [gbps, latency] = net.RouteSummary(a, b);
    return collectives::LinkDesc{true, latency * 1e6, gbps, false, true};
  };
  for (int a = 0; a < layout.workers; ++a)
    for (int b = 0; b < layout.workers; ++b)
      if (a != b && net.Route(a, b).size() == 1) shape.link(a, b) = cable(a, b);
  shape.ina = std::make_shared<const collectives::ina::Layout>(layout);
  for (int a = 0; a < layout.workers && !shape.ina_link.reachable; ++a)
    for (int v = layout.workers; v < net.ranks(); ++v)
      if (net.Route(a, v).size() == 1) {
        shape.ina_link = cable(a, v);
        break;
      }
  return shape;
}

// nccl-tests' bus bandwidth factor.
double BusFactor(Collective c, int p) {
  const double n = p;
  switch (c) {
    case Collective::kAllReduce: return 2 * (n - 1) / n;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
    case Collective::kAllToAll: return (n - 1) / n;
    default: return 1;
  }
}

std::string Time(double s) {
  if (s >= 1) return fmt::format("{:.3g} s", s);
  if (s >= 1e-3) return fmt::format("{:.3g} ms", s * 1e3);
  return fmt::format("{:.3g} us", s * 1e6);
}

// The steps' spans as a merged trace (kizuna-trace merge's output: one file, every rank, one
// clock), microseconds from the collective's start, the operation on each rank's timeline 0.
Status WriteTrace(const std::string& path, const TimedResult& run, const std::string& op) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < run.finish.size(); ++r) {
    events.push_back(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", fmt::format("rank {}", r)}}}});
    events.push_back({{"name", op},
                      {"cat", "collective"},
                      {"ph", "X"},
                      {"ts", 0},
                      {"dur", run.finish[r] * 1e6},
                      {"pid", r},
                      {"tid", 0},
                      {"args", {{"seq", 1}}}});
  }
  for (const TracedSpan& s : run.trace)
    events.push_back({{"name", s.name},
                      {"cat", s.cat},
                      {"ph", "X"},
                      {"ts", s.start * 1e6},
                      {"dur", (s.end - s.start) * 1e6},
                      {"pid", s.rank},
                      {"tid", 1 + s.channel},
                      {"args", {{"seq", 1}}}});
  std::ofstream out(path);
  out << nlohmann::json({{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}}).dump() << "\n";
  if (!out) return InvalidArgument(fmt::format("--trace: cannot write {}", path));
  return Status::Ok();
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-sim: the engine's plans in simulated time on a modelled cluster", "kizuna-sim"};
  NetworkSpec spec;
  DeviceModel device;
  std::string dims, coll = "allreduce", algos = "all", min_b = "8", max_b = "1G", dtype = "float32", chunk = "512K",
                    json_path;
  double factor = 8;
  int channels = 0;
  app.add_option("--network", spec.kind, "switch, full, rails, rail-only, fat-tree, torus2d, torus3d, ring, direct")
      ->capture_default_str();
  app.add_option("--ranks", spec.ranks, "switch, full, ring: ranks")->capture_default_str();
  app.add_option("--hosts", spec.hosts, "rails: hosts")->capture_default_str();
  app.add_option("--per-host", spec.per_host, "rails: accelerators per host")->capture_default_str();
  app.add_option("--nics", spec.nics, "rails, fat-tree: NICs per host")->capture_default_str();
  app.add_option("--leaf-hosts", spec.leaf_hosts, "fat-tree: hosts per leaf switch")->capture_default_str();
  app.add_option("--spines", spec.spines, "fat-tree: spine switches (0: one per NIC of a host)")->capture_default_str();
  app.add_option("--oversubscription", spec.oversubscription,
                 "fat-tree: a leaf's host-facing bandwidth over its uplinks' (1: none)")
      ->capture_default_str();
  app.add_option("--dims", dims, "torus: XxY or XxYxZ");
  std::string topology_path;
  bool bundle = false;
  app.add_option("--topology", topology_path,
                 "direct: a direct-connect topology file (kizuna-topo --generate's, an OCS port map); its "
                 "links' bandwidths and latencies where it gives them, --link-gbps and --latency-us otherwise");
  std::string layout_path;
  app.add_option("--layout", layout_path,
                 "direct: an INA layout file (kizuna-plan --layout's) instead of --topology: its workers, "
                 "aggregation devices and cables at --link-gbps and --latency-us, the ina algorithm among the "
                 "others");
  app.add_flag("--bundle", bundle, "direct: parallel cables between two ranks as one link of their sum");
  app.add_option("--link-gbps", spec.link_gbps, "network links, GB/s per direction")->capture_default_str();
  app.add_option("--latency-us", spec.latency_us, "per network link")->capture_default_str();
  app.add_option("--intra-gbps", spec.intra_gbps, "rails: accelerator to host switch, GB/s")->capture_default_str();
  app.add_option("--pcie-gbps", spec.pcie_gbps, "rails: accelerator to NIC, GB/s")->capture_default_str();
  app.add_option("--coll", coll, "allreduce, reducescatter, allgather, broadcast, reduce, alltoall")
      ->capture_default_str();
  app.add_option("--algo", algos, "all, or names separated by commas")->capture_default_str();
  app.add_option("-b,--minbytes", min_b, "smallest size (nccl-tests' bytes)")->capture_default_str();
  app.add_option("-e,--maxbytes", max_b, "largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size factor (> 1)")->capture_default_str();
  app.add_option("--dtype", dtype, "element type")->capture_default_str();
  app.add_option("--chunk-bytes", chunk, "the plans' largest step")->capture_default_str();
  app.add_option("--channels", channels, "channels (0: the engine's, two from 256 KiB)")->capture_default_str();
  app.add_option("--copy-gbps", device.copy_gbps, "device copy speed (0: the cost model's default)");
  app.add_option("--reduce-gbps", device.reduce_gbps, "device reduce speed, input bytes (0: default)");
  app.add_option("--launch-us", device.launch_us, "device operation launch (0: default)");
  app.add_option("--window", device.window, "started steps per channel (the executor's)")->capture_default_str();
  app.add_option("--message-cpu-us", device.message_cpu_us,
                 "with --host-cpus: the executors' CPU time per message at each end, on the host's CPUs, the "
                 "sender's copy of it at --copy-gbps besides unless --staged (emulated devices)")
      ->capture_default_str();
  app.add_flag("--staged", device.staged,
               "transfers copied into and out of the fabric's buffers on the devices (emulated devices)");
  app.add_option("--host-cpus", device.host_cpus,
                 "CPUs a host's devices share for their copies and reductions (emulated devices; 0: each its own)")
      ->capture_default_str();
  app.add_option("--ranks-per-host", device.ranks_per_host,
                 "with --host-cpus: ranks of a host (0: rails' and fat trees' --per-host, otherwise every rank)")
      ->capture_default_str();
  std::string sharing = "fair";
  app.add_option("--sharing", sharing,
                 "how flows share a link: fair (max-min) or fifo (in turn, as the "
                 "direct-connect fabric's shaper)")
      ->capture_default_str();
  std::string symmetry = "auto";
  app.add_option("--symmetry", symmetry,
                 "auto: simulate one host (or rank) for all where the network and the plan look alike from each; "
                 "off: every rank")
      ->capture_default_str();
  std::string reach = "routed";
  app.add_option("--reach", reach,
                 "which pairs the plans may pair: routed (every pair with a route; traffic crosses the ranks "
                 "between, as the engine forwards over cables between hosts) or cabled (pairs one link apart)")
      ->capture_default_str();
  std::string model = "auto";
  app.add_option(
         "--model", model,
         "the cost model's prediction beside each row: on, off, or auto (on up to 4,096 ranks: its pairwise and "
         "tree terms visit every pair of ranks)")
      ->capture_default_str();
  int max_whole = 4096;
  app.add_option("--max-whole-ranks", max_whole,
                 "above this many ranks, an algorithm whose plan differs by host is left out (one by one it would "
                 "take hours) rather than simulated rank by rank")
      ->capture_default_str();
  app.add_option("--json", json_path, "also write every row as JSON to this file");
  std::string plot_path;
  app.add_option("--plot", plot_path,
                 "draw simulated busbw (solid) and the model's (dashed) against size into this SVG");
  std::string trace_path;
  app.add_option("--trace", trace_path,
                 "write each simulated rank's steps to this Chrome trace, named as KIZUNA_TRACE_FILE's (one size "
                 "and one algorithm; kizuna-trace svg draws it)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "kizuna-sim: {}\n", s.message());
    return code;
  };
  if (sharing != "fair" && sharing != "fifo")
    return fail(InvalidArgument(fmt::format("--sharing '{}': fair or fifo", sharing)), 2);
  device.fifo = sharing == "fifo";
  if (device.host_cpus < 0 || device.ranks_per_host < 0)
    return fail(InvalidArgument("--host-cpus and --ranks-per-host must not be negative"), 2);
  if (device.message_cpu_us < 0) return fail(InvalidArgument("--message-cpu-us must not be negative"), 2);
  if (device.message_cpu_us > 0 && device.host_cpus == 0)
    return fail(InvalidArgument("--message-cpu-us needs --host-cpus (the CPUs the messages' handling takes)"), 2);
  if (symmetry != "auto" && symmetry != "off")
    return fail(InvalidArgument(fmt::format("--symmetry '{}': auto or off", symmetry)), 2);
  if (reach != "routed" && reach != "cabled")
    return fail(InvalidArgument(fmt::format("--reach '{}': routed or cabled", reach)), 2);
  if (model != "auto" && model != "on" && model != "off")
    return fail(InvalidArgument(fmt::format("--model '{}': on, off or auto", model)), 2);
  for (size_t at = 0; !dims.empty() && at <= dims.size();) {
    const size_t x = std::min(dims.find('x', at), dims.size());
    try {
      spec.dims.push_back(std::stoi(dims.substr(at, x - at)));
    } catch (...) {
      return fail(InvalidArgument(fmt::format("--dims '{}': expected XxY or XxYxZ", dims)), 2);
    }
    at = x + 1;
  }
  const auto c = collectives::ParseCollective(coll);
  const auto t = ParseDataType(dtype);
  auto lo = Size(min_b, "--minbytes"), hi = Size(max_b, "--maxbytes"), ch = Size(chunk, "--chunk-bytes");
  if (!c || collectives::IsPointToPoint(*c) || *c == Collective::kBarrier)
    return fail(InvalidArgument(fmt::format("--coll '{}': a collective with data", coll)), 2);
  if (!t) return fail(InvalidArgument(fmt::format("--dtype '{}': no such type", dtype)), 2);
  for (const auto* r : {&lo, &hi, &ch})
    if (!r->ok()) return fail(r->status(), 2);
  if (factor <= 1 || channels < 0 || channels > 64) return fail(InvalidArgument("-f must be > 1, --channels 0-64"), 2);
  auto net = Network::Build(spec);
  std::optional<collectives::ina::Layout> layout;
  if (!layout_path.empty()) {
    // The engine's executor window on an INA job's workers (engine_create.cc, kInaWindow).
    if (app.count("--window") == 0) device.window = 16;
    if (spec.kind != "direct") return fail(InvalidArgument("--layout goes with --network direct"), 2);
    if (!topology_path.empty()) return fail(InvalidArgument("--layout and --topology: give one"), 2);
    auto loaded = collectives::ina::LoadLayoutFile(layout_path);
    if (!loaded.ok()) return fail(loaded.status().WithContext("--layout"), 2);
    auto cables = LayoutCables(*loaded, spec.link_gbps, spec.latency_us);
    if (!cables.ok()) return fail(cables.status(), 2);
    cables->bundle = bundle;
    layout = std::move(*loaded);
    net = Network::Direct(*cables);
  } else if (spec.kind == "direct") {
    if (topology_path.empty())
      return fail(InvalidArgument("--network direct needs --topology FILE or --layout FILE"), 2);
    auto topology = fabric::directconnect::LoadTopology(topology_path, "--topology");
    if (!topology.ok()) return fail(topology.status(), 2);
    auto cables = TopologyCables(*topology, spec.link_gbps, spec.latency_us);
    if (!cables.ok()) return fail(cables.status(), 2);
    if (cables->devices > 0)
      return fail(InvalidArgument(fmt::format(
                      "--topology {}: {} aggregation devices; the simulator runs them in INA plans built from a "
                      "layout: give the layout's file (--layout) instead",
                      topology_path, cables->devices)),
                  2);
    cables->bundle = bundle;
    net = Network::Direct(*cables);
  } else if (!topology_path.empty()) {
    return fail(InvalidArgument("--topology goes with --network direct"), 2);
  }
  if (!net.ok()) return fail(net.status(), 2);
  if (device.host_cpus > 0 && device.ranks_per_host == 0)
    device.ranks_per_host =
        spec.kind == "rails" || spec.kind == "rail-only" || spec.kind == "fat-tree" ? spec.per_host : net->ranks();
  std::vector<Algorithm> chosen;
  for (size_t a = 0; a < collectives::kNumAlgorithms; ++a) {
    const auto algo = static_cast<Algorithm>(a);
    const std::string name(collectives::AlgorithmName(algo));
    if (algos == "all" || ("," + algos + ",").find("," + name + ",") != std::string::npos) chosen.push_back(algo);
  }
  if (chosen.empty()) return fail(InvalidArgument(fmt::format("--algo '{}': no such algorithm", algos)), 2);
  const collectives::CostConstants k;
  const CommTopology shape =
      layout ? LayoutShape(*net, *layout, device) : ShapeOf(*net, spec, device, reach == "cabled");
  const int p = shape.nranks;
  const size_t es = DataTypeSize(*t);
  fmt::print("# kizuna-sim: {} over {}\n", coll, net->description());
  fmt::print("# {:>10} {:>10}  {:<18} {:>10} {:>8}  {:<28} {:>10}  {}\n", "bytes", "count", "algorithm", "time",
             "busbw", "busiest link", "model", "model's choice");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<bench::Row> plotted;  // kizuna-bench's plot: the simulation as the measurement
  int status = 0;
  std::map<std::string, std::string> symmetric;  // algorithm -> the symmetry its runs used
  std::map<std::string, std::pair<std::string, std::string>> left_out;  // algorithm -> why, at which sizes
  // Every size's request and the model's choice, then every (size, algorithm) run, in parallel:
  // each worker thread with its own copy of the network (its routes are cached as they are asked
  // for); then the rows, printed in order.
  struct Case {
    CollectiveRequest req;
    collectives::PlanOptions options;
    double bytes = 0;
    uint64_t per_rank_blocks = 1;
    Result<collectives::Selection> sel = InvalidArgument("not selected");
  };
  std::vector<Case> cases;
  // An INA job's chunk over `channels` channels: its 8 MiB of staging over the channels times the
  // window, at most the chunk asked for, in multiples of 64 bytes (executor.cc, slot_bytes_for).
  auto ina_chunk = [&](uint64_t channels) {
    const uint64_t slots = std::max<uint64_t>(1, channels) * static_cast<uint64_t>(std::max(1, device.window));
    return std::max<uint64_t>(1, std::min<uint64_t>(*ch, (uint64_t{8} << 20) / slots / 64 * 64) / es);
  };
  for (double bytes = static_cast<double>(*lo); bytes <= static_cast<double>(*hi) * 1.0000001; bytes *= factor) {
    Case cs;
    cs.bytes = bytes;
    cs.req.collective = *c;
    cs.req.nranks = p;
    cs.req.dtype = *t;
    cs.per_rank_blocks =
        (*c == Collective::kReduceScatter || *c == Collective::kAllGather || *c == Collective::kAllToAll) ? p : 1;
    cs.req.count = std::max<uint64_t>(1, static_cast<uint64_t>(bytes) / es / cs.per_rank_blocks);
    cs.options.chunk_count = std::max<uint64_t>(1, *ch / es);
    // The engine asks for two channels for a collective of 256 KiB or more (engine.cc).
    cs.options.channels = channels > 0 ? channels : (bytes >= 256 << 10 ? 2 : 1);
    // The chunk the engine predicts with (engine.cc, ChoiceOptions); the ina algorithm's runs cut
    // it per part below.
    if (layout) cs.options.chunk_count = ina_chunk(static_cast<uint64_t>(cs.options.channels));
    cases.push_back(std::move(cs));
  }
  struct Outcome {
    Result<TimedResult> run = InvalidArgument("not run");
    std::string how;
    bool skipped = true;
    bool left_out = false;  // too many ranks to simulate one by one
  };
  const bool predict = model == "on" || (model == "auto" && p <= 4096);
  if (!predict) fmt::print("# the cost model's prediction left out (--model): {} ranks\n", p);
  std::vector<std::pair<size_t, Algorithm>> runs;
  for (size_t i = 0; i < cases.size(); ++i)
    for (Algorithm a : chosen)
      if (collectives::GetAlgorithm(a).Supports(cases[i].req, shape).ok()) runs.emplace_back(i, a);
  device.trace = !trace_path.empty();
  if (device.trace && runs.size() != 1)
    return fail(InvalidArgument(fmt::format("--trace: {} runs (sizes x algorithms); trace one", runs.size())), 2);
  std::vector<Outcome> outcomes(runs.size());
  tbb::enumerable_thread_specific<Network> nets(*net);
  tbb::parallel_for(size_t{0}, cases.size() + runs.size(), [&](size_t i) {
    if (i < cases.size()) {
      if (!predict) return;
      Case& cs = cases[i];
      cs.sel = collectives::SelectAlgorithm(cs.req, shape, cs.options, k, collectives::AlgoOverrides{}, std::nullopt,
                                            [](Algorithm a, const CollectiveRequest& r, const CommTopology& s) {
                                              return collectives::GetAlgorithm(a).Supports(r, s);
                                            });
      return;
    }
    const auto [at, a] = runs[i - cases.size()];
    Outcome& o = outcomes[i - cases.size()];
    collectives::PlanOptions options = cases[at].options;
    if (a == Algorithm::kIna && layout) options.chunk_count = ina_chunk(layout->parts.size());  // a channel per part
    o.run =
        RunAlgorithm(a, cases[at].req, shape, options, nets.local(), device, k, symmetry == "auto", &o.how, max_whole);
    o.skipped = !o.run.ok() && o.run.status().message().find("outside their steps") != std::string::npos;
    o.left_out = !o.run.ok() && o.run.status().code() == StatusCode::kNotSupported;
  });
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [at, a] = runs[r];
    const Case& cs = cases[at];
    const auto& req = cs.req;
    const auto& sel = cs.sel;
    const Outcome& o = outcomes[r];
    const auto& run = o.run;
    const std::string& how = o.how;
    if (o.skipped) continue;
    if (o.left_out) {
      auto& [why, sizes] = left_out[std::string(collectives::AlgorithmName(a))];
      why = std::string(o.run.status().message());
      sizes += fmt::format("{}{}", sizes.empty() ? "" : ", ", static_cast<uint64_t>(cs.bytes));
      continue;
    }
    if (!how.empty()) symmetric[std::string(collectives::AlgorithmName(a))] = how;
    if (!run.ok()) {
      fmt::print(stderr, "kizuna-sim: {} at {} bytes: {}\n", collectives::AlgorithmName(a), cs.bytes,
                 run.status().message());
      status = 1;
      continue;
    }
    const uint64_t per_rank_blocks = cs.per_rank_blocks;
    double predicted = std::numeric_limits<double>::infinity();
    if (sel.ok())
      for (const collectives::Candidate& cand : sel->candidates)
        if (cand.algorithm == a && cand.supported()) predicted = cand.seconds();
    const double moved = static_cast<double>(req.count * per_rank_blocks * es);
    const double busbw = moved / run->seconds / 1e9 * BusFactor(*c, p);
    fmt::print("  {:>10} {:>10}  {:<18} {:>10} {:>8.3g}  {:<28} {:>10}  {}\n", static_cast<uint64_t>(moved), req.count,
               collectives::AlgorithmName(a), Time(run->seconds), busbw,
               fmt::format("{} {:.0f}%", run->bottleneck, run->bottleneck_busy * 100),
               predicted < std::numeric_limits<double>::infinity() ? Time(predicted) : "-",
               sel.ok() ? std::string(collectives::AlgorithmName(sel->chosen)) : "-");
    bench::Row row;
    row.size_bytes = static_cast<uint64_t>(moved);
    row.count = req.count;
    row.algo = row.requested = std::string(collectives::AlgorithmName(a));
    if (predicted < std::numeric_limits<double>::infinity()) row.predicted_s = predicted;
    row.out_of_place = bench::Measure(row.size_bytes, run->seconds, BusFactor(*c, p), std::nullopt);
    plotted.push_back(std::move(row));
    if (device.trace) {
      const Status written =
          WriteTrace(trace_path, *run, fmt::format("{} ({})", req.ToString(), collectives::AlgorithmName(a)));
      if (!written.ok()) return fail(written, 1);
    }
    rows.push_back({{"bytes", static_cast<uint64_t>(moved)},
                    {"count", req.count},
                    {"algorithm", collectives::AlgorithmName(a)},
                    {"seconds", run->seconds},
                    {"busbw_gbps", busbw},
                    {"bottleneck", run->bottleneck},
                    {"bottleneck_busy", run->bottleneck_busy},
                    {"flows", run->flows},
                    {"simulated_flows", run->simulated_flows},
                    {"symmetry", how},
                    {"model_seconds", predicted < std::numeric_limits<double>::infinity() ? predicted : -1},
                    {"model_choice", sel.ok() ? std::string(collectives::AlgorithmName(sel->chosen)) : ""}});
  }
  for (const auto& [name, how] : symmetric) fmt::print("# {}: one block simulated for all, {}\n", name, how);
  for (const auto& [name, why] : left_out) fmt::print("# {}: left out at {} bytes: {}\n", name, why.second, why.first);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json({{"network", net->description()}, {"collective", coll}, {"rows", rows}}).dump(1) << "\n";
    if (!out) return fail(InvalidArgument(fmt::format("--json: cannot write {}", json_path)), 1);
  }
  if (!plot_path.empty()) {
    std::ofstream out(plot_path);
    out << bench::PlotSvg(plotted, BusFactor(*c, p), fmt::format("kizuna-sim: {} over {}", coll, net->description()));
    if (!out) return fail(InvalidArgument(fmt::format("--plot: cannot write {}", plot_path)), 1);
  }
  return status;
}

}  // namespace
}  // namespace kizuna::sim

int main(int argc, char** argv) { return kizuna::sim::Main(argc, argv); }
