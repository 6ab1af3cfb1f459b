#include "tools/plan/ina_mode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/ina/layout.h"
#include "collectives/ina/planner.h"
#include "runtime/core/status.h"

namespace kizuna::plan_tool {
namespace {

namespace ina = collectives::ina;

// The mode's own flags; --latency-us and --json are shared with the cost model's table.
constexpr std::string_view kInaFlags[] = {"--workers", "--aggregators",  "--worker-ports", "--agg-ports",
                                          "--solver",  "--layout",       "--topology",     "--bandwidth-gbps",
                                          "--shaping", "--sweep",        "--csv",          "--plot",
                                          "--seed002", "--worker-speeds"};
constexpr std::string_view kShared[] = {"--latency-us", "--json", "--help"};

// The SWoPP 2024 talk's figures: N = 16, 32, 64 workers with D = 8 ports, devices with E = 8 and 16 ports.
constexpr int kSweepWorkers[] = {16, 32, 64};
constexpr int kSweepPorts = 8;
constexpr int kSweepAggPorts[] = {8, 16};

bool Given(const CLI::App& app, std::string_view flag) {
  const CLI::Option* opt = app.get_option_no_throw(std::string(flag));
  return opt && opt->count() > 0;
}

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The plan's bandwidth relative to the D rings, from the exact item values (bandwidth × 2(N−1)
// against D·N), so that a ratio such as 1.09375 prints as the upper bound's 1.0938 does.
double RingRatio(const ina::Problem& p, const ina::Selection& s) {
  return static_cast<double>(s.value) / (static_cast<double>(p.worker_ports) * p.workers);
}

Status WriteFile(const std::string& path, std::string_view flag, const std::string& text) {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "w"));
  if (!f) return InvalidArgument(fmt::format("{} {}: cannot open for writing: {}", flag, path, std::strerror(errno)));
  if (std::fwrite(text.data(), 1, text.size(), f.get()) != text.size() || std::fflush(f.get()) != 0)
    return InvalidArgument(fmt::format("{} {}: cannot write: {}", flag, path, std::strerror(errno)));
  return Status::Ok();
}

// Range checks that name the flag (CheckProblem's messages name the quantity only).
Status CheckFlags(const InaOptions& o, bool sweep) {
  if (o.workers < 2 || o.workers > ina::kMaxWorkers)
    return InvalidArgument(fmt::format("--workers {}: expected 2..{}", o.workers, ina::kMaxWorkers));
  if (o.worker_ports < 1 || o.worker_ports > ina::kMaxPlannerPorts)
    return InvalidArgument(fmt::format("--worker-ports {}: expected 1..{}", o.worker_ports, ina::kMaxPlannerPorts));
  if (o.agg_ports < 3 || o.agg_ports > ina::kMaxPortsPerNode)
    return InvalidArgument(fmt::format("--agg-ports {}: expected 3..{} (a device in a tree needs a parent and two "
                                       "children)",
                                       o.agg_ports, ina::kMaxPortsPerNode));
  if (o.aggregators < 0 || o.aggregators > ina::kMaxAggregators)
    return InvalidArgument(fmt::format("--aggregators {}: expected 0..{}{}", o.aggregators, ina::kMaxAggregators,
                                       sweep ? " (the sweep's largest M)" : ""));
  if (Status s = ina::CheckProblem({o.workers, o.aggregators, o.worker_ports, o.agg_ports}); !s.ok())
    return InvalidArgument(fmt::format("--workers {} --aggregators {} --worker-ports {} --agg-ports {}: {}", o.workers,
                                       o.aggregators, o.worker_ports, o.agg_ports, s.message()));
  if (Status s = ina::CheckWorkerSpeeds({o.workers, o.aggregators, o.worker_ports, o.agg_ports}, o.worker_speeds);
      !s.ok())
    return InvalidArgument(fmt::format("--worker-speeds: {}", s.message()));
  return Status::Ok();
}

std::string BaselineText(const ina::Problem& p, const ina::Baseline& b) {
  const int t = ina::FullTreeAggregators(p.workers, p.aggregator_ports);
  if (b.trees > 0) return fmt::format("{} full tree(s) of {} devices, used alone", b.trees, t);
  std::string why = p.aggregators >= t ? fmt::format("{} full tree(s) of {} devices would not be faster",
                                                     std::min(p.worker_ports, p.aggregators / t), t)
                                       : fmt::format("a full tree needs {} devices", t);
  return fmt::format("{} ring(s), one port per worker each; {}", b.rings, why);
}

std::string SolverText(const ina::LayoutPlan& plan) {
  if (plan.solver == ina::Solver::kDp)
    return fmt::format("dp: {} item(s), {} x {} table (devices x ports/{})", plan.dp.items, plan.dp.rows,
                       plan.dp.columns, plan.dp.gcd);
  return "closed-form: O(D^2) over (full trees, other trees), the most rings that fit";
}

// Kept whole: the plan's report in output order (JSON or text), both from the same plan and timings.
int PrintPlan(const InaOptions& o, double latency_us, bool json) {
  const ina::Problem p{o.workers, o.aggregators, o.worker_ports, o.agg_ports};
  auto solver = o.solver == "dp" ? ina::Solver::kDp
                : o.solver == "closed-form" ? ina::Solver::kClosedForm
                                            : ina::Solver::kAuto;
  const auto start = std::chrono::steady_clock::now();
  auto plan = ina::PlanLayout(p, solver, o.worker_speeds);
  const double ms = Ms(std::chrono::steady_clock::now() - start);
  if (!plan.ok()) {
    fmt::print(stderr, "kizuna-plan: {}\n", plan.status().ToString());
    return plan.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  const double total = plan->bandwidth, ratio = RingRatio(p, plan->selection);
  if (json) {
    using nlohmann::json;
    json j = {{"workers", p.workers},
              {"aggregators", p.aggregators},
              {"worker_ports", p.worker_ports},
              {"aggregator_ports", p.aggregator_ports}};
    j["parts"] = json::array();
    for (const ina::Pick& pk : plan->selection.picks) {
      const double bw = pk.item.bandwidth(p.workers);
      j["parts"].push_back({{"kind", std::string(ina::PartKindName(pk.item.kind))},
                            {"count", pk.count},
                            {"aggregators", pk.item.aggregators},
                            {"worker_ports", pk.item.worker_ports},
                            {"bandwidth", bw},
                            {"data_share", bw / total}});
    }
    j["bandwidth"] = total;
    j["ring"] = plan->ring;
    j["ratio"] = ratio;
    j["baseline"] = {{"bandwidth", plan->baseline.bandwidth},
                     {"ratio", plan->baseline.bandwidth / plan->ring},
                     {"trees", plan->baseline.trees},
                     {"rings", plan->baseline.rings}};
    j["upper_bound"] = {{"bandwidth", plan->upper_bound}, {"ratio", plan->upper_bound / plan->ring}};
    j["aggregators_used"] = plan->selection.aggregators;
    j["ports_per_worker"] = {{"min", plan->min_ports}, {"max", plan->max_ports}};
    j["solver"] = std::string(ina::SolverName(plan->solver));
    j["planning_ms"] = ms;
    fmt::print("{}\n", j.dump(2));
  } else {
    std::string out = fmt::format(
        "# kizuna-plan: partial in-network aggregation, {} workers x {} ports, {} aggregation device(s) x {} ports "
        "available\n# per-port model (collectives/ina/layout.h): bandwidths in units of b, one port's bandwidth per "
        "direction\n",
        p.workers, p.worker_ports, p.aggregators, p.aggregator_ports);
    out += fmt::format("{:<14} {:>5} {:>8} {:>13} {:>10} {:>11}\n", "part", "count", "devices", "worker ports",
                       "bandwidth", "data share");
    for (const ina::Pick& pk : plan->selection.picks) {
      const double bw = pk.item.bandwidth(p.workers);
      out += fmt::format("{:<14} {:>5} {:>8} {:>13} {:>10.4f} {:>10.2f}%\n", ina::PartKindName(pk.item.kind), pk.count,
                         pk.item.aggregators, pk.item.worker_ports, bw, 100 * bw / total);
    }
    out += "# devices, worker ports, bandwidth and data share per part: shares follow bandwidth, so every part "
           "takes the same time\n";
    out += fmt::format("{:<17} {:.4f} b = {:.4f} x {} parallel rings ({:.4f} b)\n", "bandwidth", total,
                       ratio, p.worker_ports, plan->ring);
    out += fmt::format("{:<17} {:.4f} b = {:.4f} x rings: {}\n", "baseline", plan->baseline.bandwidth,
                       plan->baseline.bandwidth / plan->ring, BaselineText(p, plan->baseline));
    out += fmt::format("{:<17} {:.4f} b = {:.4f} x rings (LP relaxation of the same knapsack)\n", "upper bound",
                       plan->upper_bound, plan->upper_bound / plan->ring);
    out += fmt::format("{:<17} {} of {}\n", "devices used", plan->selection.aggregators, p.aggregators);
    out += fmt::format("{:<17} max {}, min {} (of {})\n", "ports per worker", plan->max_ports, plan->min_ports,
                       p.worker_ports);
    out += fmt::format("{:<17} {}\n", "solver", SolverText(*plan));
    out += fmt::format("{:<17} {:.3f} ms\n", "planning time", ms);
    std::fputs(out.c_str(), stdout);
  }
  auto write = [&](std::string_view flag, const std::string& path, auto text) {
    if (path.empty()) return true;
    if (Status s = WriteFile(path, flag, text()); !s.ok()) {
      fmt::print(stderr, "kizuna-plan: {}\n", s.message());
      return false;
    }
    if (!json) fmt::print("# {} written to {}\n", flag == "--layout" ? "layout" : "topology", path);
    return true;
  };
  if (!write("--layout", o.layout, [&] { return ina::ToJson(plan->layout); }) ||
      !write("--topology", o.topology,
             [&] { return ina::TopologyJson(plan->layout, o.bandwidth_gbps, latency_us, o.shaping); }))
    return 1;
  return std::fflush(stdout) == 0 ? 0 : 1;
}

int PrintSeed002(const InaOptions& o, bool json) {
  const auto rows = ina::Seed002Table(o.workers, o.worker_ports);
  if (json) {
    nlohmann::json j = {{"workers", o.workers}, {"worker_ports", o.worker_ports}, {"rows", nlohmann::json::array()}};
    for (const ina::StepsRow& r : rows)
      j["rows"].push_back({{"topology", r.topology},
                           {"algorithm", r.algorithm},
                           {"steps", r.steps >= 0 ? nlohmann::json(r.steps) : nlohmann::json(nullptr)},
                           {"transfer_time", r.transfer_time},
                           {"how", r.how}});
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  std::string out = fmt::format(
      "# NTT 2024's table: {} workers with {} ports each, {} parallel channels; an AllReduce of L bytes, b "
      "seconds per byte and port\n",
      o.workers, o.worker_ports, o.worker_ports);
  out += fmt::format("{:<10} {:<40} {:>5}  {}\n", "topology", "algorithm", "steps", "transfer time");
  for (const ina::StepsRow& r : rows)
    out += fmt::format("{:<10} {:<40} {:>5}  {:.4f} L*b\n", r.topology, r.algorithm,
                       r.steps >= 0 ? std::to_string(r.steps) : "n/a", r.transfer_time);
  for (const ina::StepsRow& r : rows) out += fmt::format("# {}: {}\n", r.algorithm, r.how);
  out += fmt::format(
      "# transfer time 2(N-1)/N * L / D for every row: each worker sends and receives 2(N-1)/N of the data, "
      "spread over its {} ports. The talk's rows 2 and 3 come from a MILP; these closed forms give the same counts.\n",
      o.worker_ports);
  std::fputs(out.c_str(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

struct SweepRow {
  int n = 0, d = 0, e = 0, m = 0;
  double baseline = 0, partial = 0, upper = 0;  // ratios to the rings
};

// One panel per (N, D, E): the lines of the talk's figure, written by hand.
std::string Svg(const std::vector<std::vector<SweepRow>>& panels) {
  const int cols = static_cast<int>(std::min<size_t>(3, panels.size()));
  const int rows = static_cast<int>((panels.size() + static_cast<size_t>(cols) - 1) / static_cast<size_t>(cols));
  const double pw = 420, ph = 320, top = 56;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"12\" y=\"20\" font-size=\"15\">Partial in-network aggregation: algorithm bandwidth relative to D "
      "parallel rings (NTT SWoPP 2024's figure, per-port model)</text>\n",
      cols * pw, top + rows * ph);
  struct Line {
    const char *name, *color, *dash;
  };
  const Line lines[] = {{"partial INA", "#1f77b4", ""},
                        {"baseline (aggregation trees or rings)", "#d62728", ""},
                        {"upper bound (LP relaxation)", "#2ca02c", "6,3"},
                        {"ring = 1", "#7f7f7f", "2,3"}};
  double lx = 12;
  for (const Line& l : lines) {
    s += fmt::format(
        "<line x1=\"{}\" y1=\"38\" x2=\"{}\" y2=\"38\" stroke=\"{}\" stroke-width=\"2.5\" stroke-dasharray=\"{}\"/>"
        "<text x=\"{}\" y=\"42\">{}</text>\n",
        lx, lx + 28, l.color, l.dash, lx + 34, l.name);
    lx += 48 + 7.0 * static_cast<double>(std::strlen(l.name));
  }
  for (size_t i = 0; i < panels.size(); ++i) {
    const std::vector<SweepRow>& rs = panels[i];
    const double ox = static_cast<double>(static_cast<int>(i) % cols) * pw;
    const double oy = top + static_cast<double>(static_cast<int>(i) / cols) * ph;
    const double x0 = ox + 58, x1 = ox + pw - 18, y0 = oy + 30, y1 = oy + ph - 48;
    double lo = 1, hi = 1;
    for (const SweepRow& r : rs) lo = std::min({lo, r.baseline, r.partial}), hi = std::max({hi, r.upper, r.partial});
    const double ystep = hi - lo > 2.5 ? 0.5 : 0.25;
    const double ymin = std::floor(lo / ystep) * ystep, ymax = std::ceil(hi / ystep + 1e-9) * ystep;
    const int xmax = std::max(1, rs.back().m);
    auto X = [&](double m) { return x0 + (x1 - x0) * m / xmax; };
    auto Y = [&](double v) { return y1 - (y1 - y0) * (v - ymin) / (ymax - ymin); };
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\">N={}, D={}, E={}</text>\n",
                     (x0 + x1) / 2, oy + 18, rs[0].n, rs[0].d, rs[0].e);
    for (double v = ymin; v <= ymax + 1e-9; v += ystep)
      s += fmt::format(
          "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e0e0e0\"/><text x=\"{3}\" y=\"{4:.1f}\" "
          "text-anchor=\"end\">{5:.2f}</text>\n",
          x0, Y(v), x1, x0 - 6, Y(v) + 4, v);
    const int steps[] = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000};
    int xstep = steps[0];
    for (int st : steps)
      if (xmax / st <= 10) {
        xstep = st;
        break;
      }
    for (int m = 0; m <= xmax; m += xstep)
      s += fmt::format(
          "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#333\"/><text x=\"{0:.1f}\" y=\"{3}\" "
          "text-anchor=\"middle\">{4}</text>\n",
          X(m), y1, y1 + 5, y1 + 18, m);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", x0, y0,
                     x1 - x0, y1 - y0);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">aggregation devices M</text>\n", (x0 + x1) / 2,
                     y1 + 36);
    s += fmt::format(
        "<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" transform=\"rotate(-90 {0} {1})\">bandwidth / rings</text>\n",
        ox + 16, (y0 + y1) / 2);
    // Integer M: the planner's and the baseline's values are steps; the LP bound is piecewise linear.
    auto step_path = [&](double SweepRow::*field) {
      std::string d = fmt::format("M{:.1f},{:.1f}", X(rs[0].m), Y(rs[0].*field));
      for (size_t k = 1; k < rs.size(); ++k)
        d += fmt::format(" H{:.1f} V{:.1f}", X(rs[k].m), Y(rs[k].*field));
      return d;
    };
    std::string upper = fmt::format("M{:.1f},{:.1f}", X(rs[0].m), Y(rs[0].upper));
    for (size_t k = 1; k < rs.size(); ++k) upper += fmt::format(" L{:.1f},{:.1f}", X(rs[k].m), Y(rs[k].upper));
    const std::string paths[] = {step_path(&SweepRow::partial), step_path(&SweepRow::baseline), upper,
                                 fmt::format("M{},{:.1f} H{}", x0, Y(1), x1)};
    for (size_t k = 0; k < 4; ++k)
      s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-dasharray=\"{}\"/>\n",
                       paths[k], lines[k].color, lines[k].dash);
  }
  return s + "</svg>\n";
}

int RunSweep(const CLI::App& app, const InaOptions& o, bool json) {
  std::vector<int> ns(std::begin(kSweepWorkers), std::end(kSweepWorkers));
  std::vector<int> es(std::begin(kSweepAggPorts), std::end(kSweepAggPorts));
  int d = kSweepPorts;
  if (Given(app, "--workers")) ns = {o.workers};
  if (Given(app, "--agg-ports")) es = {o.agg_ports};
  if (Given(app, "--worker-ports")) d = o.worker_ports;
  const auto solver = o.solver == "dp" ? ina::Solver::kDp
                      : o.solver == "closed-form" ? ina::Solver::kClosedForm
                                                  : ina::Solver::kAuto;
  std::vector<std::vector<SweepRow>> panels;
  std::string csv = "N,D,E,M,ring,baseline,partial_ina,upper_bound\n", summary;
  const auto start = std::chrono::steady_clock::now();
  int plans = 0;
  for (int e : es)
    for (int n : ns) {
      // Up to where the baseline stops growing (D full trees), unless --aggregators says otherwise.
      const int t = ina::FullTreeAggregators(n, e);
      const int mmax = Given(app, "--aggregators") ? o.aggregators : std::min(d * t, ina::kMaxAggregators);
      std::vector<SweepRow> rows;
      for (int m = 0; m <= mmax; ++m) {
        const ina::Problem p{n, m, d, e};
        if (Status s = ina::CheckProblem(p); !s.ok()) {
          fmt::print(stderr, "kizuna-plan: --sweep: {}\n", s.message());
          return 2;
        }
        const double ring = ina::RingBandwidth(p);
        auto plan = ina::PlanLayout(p, solver);
        ++plans;
        if (!plan.ok() && plan.status().code() != StatusCode::kNotSupported) {
          fmt::print(stderr, "kizuna-plan: --sweep N={} M={} D={} E={}: {}\n", n, m, d, e, plan.status().ToString());
          return 1;
        }
        rows.push_back({n, d, e, m, ina::BaselineOf(p).bandwidth / ring,
                        plan.ok() ? RingRatio(p, plan->selection) : 0, ina::UpperBound(p) / ring});
        const SweepRow& r = rows.back();
        csv +=
            fmt::format("{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f}\n", n, d, e, m, 1.0, r.baseline, r.partial, r.upper);
      }
      auto first_gain = [&](double SweepRow::*field) {
        for (const SweepRow& r : rows)
          if (r.*field > 1 + 1e-9) return fmt::format("M={} ({:.4f})", r.m, r.*field);
        return std::string("never");
      };
      summary += fmt::format(
          "N={} D={} E={} (full tree: {} devices), M=0..{}: above the rings first: partial INA {}, baseline {}; at "
          "M={}: partial INA {:.4f}, baseline {:.4f}, upper bound {:.4f}\n",
          n, d, e, t, mmax, first_gain(&SweepRow::partial), first_gain(&SweepRow::baseline), mmax, rows.back().partial,
          rows.back().baseline, rows.back().upper);
      panels.push_back(std::move(rows));
    }
  const double ms = Ms(std::chrono::steady_clock::now() - start);
  if (!o.csv.empty()) {
    if (Status s = WriteFile(o.csv, "--csv", csv); !s.ok()) {
      fmt::print(stderr, "kizuna-plan: {}\n", s.message());
      return 1;
    }
  }
  if (!o.plot.empty()) {
    if (Status s = WriteFile(o.plot, "--plot", Svg(panels)); !s.ok()) {
      fmt::print(stderr, "kizuna-plan: {}\n", s.message());
      return 1;
    }
  }
  if (o.csv.empty()) {
    std::fputs(csv.c_str(), stdout);
  } else if (json) {
    fmt::print("{}\n", nlohmann::json({{"csv", o.csv}, {"plot", o.plot}, {"plans", plans}, {"ms", ms}}).dump());
  } else {
    fmt::print("# {} plans in {:.1f} ms; CSV written to {}{}\n{}", plans, ms, o.csv,
               o.plot.empty() ? "" : fmt::format(", plot to {}", o.plot), summary);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

Status Exclusive(const CLI::App& app, std::string_view mode, std::initializer_list<std::string_view> flags) {
  for (std::string_view f : flags)
    if (Given(app, f)) return InvalidArgument(fmt::format("{} does not go with {}", f, mode));
  return Status::Ok();
}

}  // namespace

void AddInaOptions(CLI::App& app, InaOptions& o) {
  app.add_option("--workers", o.workers, "INA planner: workers N (selects the INA mode)");
  app.add_option("--aggregators", o.aggregators, "INA: aggregation devices available M (--sweep: the largest M)")
      ->capture_default_str();
  app.add_option("--worker-ports", o.worker_ports, "INA: ports per worker D")->capture_default_str();
  app.add_option("--agg-ports", o.agg_ports, "INA: ports per aggregation device E")->capture_default_str();
  app.add_option("--solver", o.solver, "INA: auto, dp (SWoPP 2024's DP) or closed-form")->capture_default_str();
  app.add_option("--layout", o.layout, "INA: write the layout as JSON (KIZUNA_INA_LAYOUT's format) to FILE");
  app.add_option("--topology", o.topology, "INA: write the layout's direct-connect topology file to FILE");
  app.add_option("--bandwidth-gbps", o.bandwidth_gbps, "INA --topology: link bandwidth per direction (0: unknown)")
      ->capture_default_str();
  app.add_option("--worker-speeds", o.worker_speeds,
                 "INA: each worker's reduce speed, comma-separated (the fastest take the reducing roles)")
      ->delimiter(',');
  app.add_flag("--shaping", o.shaping, "INA --topology: pace transfers to the links' bandwidth and latency");
  app.add_flag("--sweep", o.sweep, "INA: NTT SWoPP 2024's sweep over M (N=16,32,64, D=8, E=8,16) as CSV");
  app.add_option("--csv", o.csv, "INA --sweep: write the CSV to FILE (default: standard output)");
  app.add_option("--plot", o.plot, "INA --sweep: write an SVG plot to FILE");
  app.add_flag("--seed002", o.seed002, "INA: NTT 2024's table of transfer steps (--workers 8 --worker-ports 4)");
}

bool InaRequested(const CLI::App& app) {
  for (std::string_view f : kInaFlags)
    if (Given(app, f)) return true;
  return false;
}

int RunIna(const CLI::App& app, const InaOptions& given, double latency_us, bool json) {
  InaOptions o = given;
  auto bad = [](const Status& s) {
    fmt::print(stderr, "kizuna-plan: {}\n", s.message());
    return 2;
  };
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || std::find(std::begin(kInaFlags), std::end(kInaFlags), name) != std::end(kInaFlags) ||
        std::find(std::begin(kShared), std::end(kShared), name) != std::end(kShared))
      continue;
    return bad(InvalidArgument(
        fmt::format("{} belongs to the cost model's table; the INA planner (--workers, --sweep, --seed002) does not "
                    "take it",
                    name)));
  }
  if (o.solver != "auto" && o.solver != "dp" && o.solver != "closed-form")
    return bad(InvalidArgument(fmt::format("--solver '{}': expected auto, dp or closed-form", o.solver)));
  if (!(o.bandwidth_gbps >= 0) || o.bandwidth_gbps > 1e9)
    return bad(InvalidArgument(fmt::format("--bandwidth-gbps {}: expected a non-negative number", o.bandwidth_gbps)));
  if (o.seed002) {
    if (Status s = Exclusive(app, "--seed002",
                             {"--aggregators", "--agg-ports", "--solver", "--layout", "--topology", "--bandwidth-gbps",
                              "--shaping", "--sweep", "--csv", "--plot", "--latency-us"});
        !s.ok())
      return bad(s);
    if (!Given(app, "--workers")) o.workers = 8;
    if (!Given(app, "--worker-ports")) o.worker_ports = 4;
    if (o.workers < 2 || o.workers > ina::kMaxWorkers)
      return bad(InvalidArgument(fmt::format("--workers {}: expected 2..{}", o.workers, ina::kMaxWorkers)));
    if (o.worker_ports < 1 || o.worker_ports > ina::kMaxPlannerPorts)
      return bad(InvalidArgument(
          fmt::format("--worker-ports {}: expected 1..{}", o.worker_ports, ina::kMaxPlannerPorts)));
    return PrintSeed002(o, json);
  }
  if (o.sweep) {
    if (Status s = Exclusive(app, "--sweep",
                             {"--layout", "--topology", "--bandwidth-gbps", "--shaping", "--latency-us"});
        !s.ok())
      return bad(s);
    // Validate the flags given against the sweep's grid.
    InaOptions check = o;
    if (!Given(app, "--workers")) check.workers = 64;
    if (!Given(app, "--aggregators")) check.aggregators = 0;
    if (!Given(app, "--agg-ports")) check.agg_ports = 8;
    if (!Given(app, "--worker-ports")) check.worker_ports = kSweepPorts;
    if (Status s = CheckFlags(check, true); !s.ok()) return bad(s);
    return RunSweep(app, o, json);
  }
  if (Status s = Exclusive(app, "a single plan (use --sweep)", {"--csv", "--plot"}); !s.ok()) return bad(s);
  if (!Given(app, "--workers"))
    return bad(InvalidArgument("the INA planner needs --workers N (or --sweep, or --seed002)"));
  if (o.topology.empty())
    if (Status s = Exclusive(app, "no --topology FILE", {"--bandwidth-gbps", "--shaping", "--latency-us"}); !s.ok())
      return bad(s);
  if (Status s = CheckFlags(o, false); !s.ok()) return bad(s);
  return PrintPlan(o, latency_us, json);
}

}  // namespace kizuna::plan_tool
