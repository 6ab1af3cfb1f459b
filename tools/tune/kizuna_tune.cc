// kizuna-tune: this machine's costs, measured, for the cost model (KIZUNA_COST_FILE).
//
//   kizuna-run -n N -- kizuna-tune -o cost.txt [--append] [--max-bytes 16M] [--iters 7]
//
// Run as a job of N ranks (any launcher) on the machine to tune, once per job size that matters
// (the file keeps a [ranks=N] section per size; --append replaces that size's section and keeps
// the others). Each run measures, in well under a minute:
//   - the host's memory bandwidth, every rank copying at once (host_memory_gbps);
//   - each rank's device copy and 2-input reduce rates (unknown_copy_gbps, unknown_reduce_gbps,
//     which the model uses for devices that do not report their own);
//   - every fabric's latency (8 bytes) and bandwidth (4 MiB) between two threads of rank 0, as
//     kizuna-p2p measures them (link.<fabric>.latency_us and .gbps: the fabric's software path,
//     as the model's link terms count it);
//   - AllReduces of the model's choice and of ring, over sizes from 16 B to --max-bytes, in place
//     and not (the median of --iters calls each),
// then fits the constants the model cannot measure one by one (per-message and per-step overheads,
// rendezvous and wake-up costs, the one-shot path, staging copies, host memory) so that the
// model's predictions for those AllReduces come closest to what they took: coordinate descent on
// the median of |log(measured / predicted)| of the worse of the two algorithms. Rank 0 writes the file, with the fit's
// error before and after in its header. Exit status 1 on failure, naming it; 2 for a bad command line.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "collectives/cost/cost_file.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/communicator.h"
#include "runtime/device/registry.h"
#include "tools/bench/sweep.h"
#include "tools/p2p/measure.h"

namespace kizuna {
namespace {

using Clock = std::chrono::steady_clock;
using collectives::Algorithm;
using collectives::Collective;
using collectives::CostConstants;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Whole or not at all: a rank reading the file never sees half of it.
Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return FromErrno(errno, fmt::format("writing {}", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return FromErrno(errno, fmt::format("renaming {} to {}", tmp, path));
  return Status::Ok();
}

// "2026-11-29 04:20 UTC".
std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &tm);
  return text;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// One measured AllReduce: what the model is fitted to.
struct Sample {
  Algorithm algorithm = Algorithm::kRing;
  size_t count = 0;  // float32 elements
  double seconds = 0;
};

// The run's shared state: the communicator, its stream, and a buffer the CPU reaches.
struct Job {
  Communicator* comm = nullptr;
  device::Stream* stream = nullptr;
  float* a = nullptr;  // max_bytes each
  float* b = nullptr;
  size_t max_bytes = 0;

  Status Sync() { return stream->Synchronize(); }
  // Every rank's `value`, the largest (an AllReduce of one double through the engine).
  Result<double> Max(double value) {
    auto* d = reinterpret_cast<double*>(b);
    d[0] = value;
    KZ_RETURN_IF_ERROR(comm->AllReduce(d, d, 1, DataType::kFloat64, ReduceOp::kMax, *stream));
    KZ_RETURN_IF_ERROR(Sync());
    return d[0];
  }
  Status Barrier() {
    KZ_RETURN_IF_ERROR(comm->Barrier(*stream));
    return Sync();
  }
};

// Host memory: every rank copies its buffer 4 times at once; bytes read and written by all ranks
// over the slowest rank's time.
Result<double> HostMemoryGbps(Job& job) {
  const size_t bytes = std::min<size_t>(job.max_bytes, size_t{32} << 20);
  std::vector<uint8_t> from(bytes, 1), to(bytes, 0);
  KZ_RETURN_IF_ERROR(job.Barrier());
  const auto start = Clock::now();
  for (int i = 0; i < 4; ++i) std::memcpy(i % 2 ? from.data() : to.data(), i % 2 ? to.data() : from.data(), bytes);
  KZ_ASSIGN_OR_RETURN(double slowest, job.Max(Seconds(start)));
  return 4.0 * 2 * static_cast<double>(bytes) * job.comm->size() / slowest / 1e9;
}

// The largest cache CPU 0 has (sysfs; "32768K"), in MiB; 0 when the kernel does not say.
double LastLevelCacheMib() {
  double largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", index));
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    double value = std::atof(text.c_str());
    if (text.back() == 'K')
      value /= 1024;
    else if (text.back() == 'G')
      value *= 1024;
    else if (text.back() != 'M')
      value /= 1 << 20;
    largest = std::max(largest, value);
  }
  return largest;
}

// A device of the job's kind alone (before the communicator, so that no rank competes with it): a
// copy and a 2-input sum of 16 MiB, the best of 9 (bytes copied; input bytes read). The model
// counts the ranks that share a host's CPUs and memory itself (its host term).
Result<std::pair<double, double>> DeviceRates(const Config& config) {
  auto registry = device::DeviceRegistry::Create(config);
  if (registry->devices().empty()) return Unavailable("no device to measure");
  device::Device& d = *registry->devices()[0];
  const size_t bytes = size_t{16} << 20;
  KZ_ASSIGN_OR_RETURN(auto stream, d.CreateStream());
  KZ_ASSIGN_OR_RETURN(auto a, d.Allocate(bytes));
  KZ_ASSIGN_OR_RETURN(auto b, d.Allocate(bytes));
  if (d.properties().host_accessible) {
    std::memset(a->data(), 0, bytes);
    std::memset(b->data(), 0, bytes);
  }
  double copy = 1e30, reduce = 1e30;
  // The best of 9: on a shared machine one in a few passes runs at half speed or less (3 passes
  // gave copy rates of 12.7-33 GB/s between runs here, a tuned model off by that much).
  for (int i = 0; i < 9; ++i) {
    auto start = Clock::now();
    KZ_RETURN_IF_ERROR(stream->Copy(b->data(), a->data(), bytes));
    KZ_RETURN_IF_ERROR(stream->Synchronize());
    copy = std::min(copy, Seconds(start));
    const void* srcs[2] = {a->data(), b->data()};
    start = Clock::now();
    KZ_RETURN_IF_ERROR(stream->Reduce(b->data(), srcs, bytes / sizeof(float), DataType::kFloat32, ReduceOp::kSum));
    KZ_RETURN_IF_ERROR(stream->Synchronize());
    reduce = std::min(reduce, Seconds(start));
  }
  return std::make_pair(bytes / copy / 1e9, 2.0 * bytes / reduce / 1e9);
}

// Every fabric's latency (8 bytes, half the round trip) and bandwidth (4 MiB, a window of 16) between
// two threads of this process, as kizuna-p2p measures them: the fabric's own path, which the
// model's link terms stand for (its per-message and per-step overheads are the executor's).
Result<std::vector<std::pair<std::string, collectives::LinkCosts>>> FabricLinks(const Config& config) {
  p2p::Options o;
  o.min_bytes = o.max_bytes = size_t{4} << 20;
  o.iters = 200;
  o.warmup = 20;
  o.memory = "host";
  o.reference = false;
  std::vector<std::string> notes;
  std::vector<std::pair<std::string, collectives::LinkCosts>> out;
  // The two threads on CPUs of their own, even where the launcher bound this process to one
  // (kizuna-run --bind-to core): sharing one, every round trip would wait for the scheduler. The
  // job's other ranks are asleep in the rendezvous meanwhile; the binding comes back after.
  cpu_set_t bound, all;
  const bool rebind = sched_getaffinity(0, sizeof bound, &bound) == 0;
  CPU_ZERO(&all);
  for (long c = 0, n = sysconf(_SC_NPROCESSORS_ONLN); c < n && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  if (rebind) sched_setaffinity(0, sizeof all, &all);
  struct Restore {
    bool on;
    cpu_set_t* mask;
    ~Restore() {
      if (on) sched_setaffinity(0, sizeof *mask, mask);
    }
  } restore{rebind, &bound};
  // The best of 3 runs: a run whose threads the scheduler kept apart (a wake-up in every round
  // trip) measures the machine's load, not the fabric.
  for (int run = 0; run < 3; ++run) {
    KZ_ASSIGN_OR_RETURN(std::vector<p2p::Row> rows, p2p::RunInProcess(config, o, notes));
    for (const p2p::Row& r : rows) {
      if (r.memory != "host" || !std::isfinite(r.test == "latency" ? r.median_us : r.gbps)) continue;
      auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == r.fabric; });
      if (it == out.end()) it = out.insert(out.end(), {r.fabric, collectives::LinkCosts{1e30, 0}});
      if (r.test == "latency") it->second.latency_us = std::min(it->second.latency_us, r.median_us);
      if (r.test == "bandwidth") it->second.gbps = std::max(it->second.gbps, r.gbps);
    }
  }
  std::erase_if(out, [](const auto& e) { return e.second.latency_us >= 1e30 || e.second.gbps <= 0; });
  return out;
}

// AllReduces of `algorithm` (nullopt: the model's choice) over the sizes, in place and not: the
// median of `iters` calls after 2 to warm up, each a sample with the algorithm that ran.
Status Measure(Job& job, std::optional<Algorithm> algorithm, int iters, std::vector<Sample>& out) {
  for (size_t bytes = 16; bytes <= job.max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    for (bool in_place : {false, true}) {
      CallOptions options;
      options.algorithm = algorithm;
      std::vector<double> took;
      for (int i = 0; i < iters + 2; ++i) {
        KZ_RETURN_IF_ERROR(job.Barrier());
        const auto start = Clock::now();
        KZ_RETURN_IF_ERROR(job.comm->AllReduce(job.a, in_place ? job.a : job.b, count, DataType::kFloat32,
                                               ReduceOp::kSum, *job.stream, options));
        KZ_RETURN_IF_ERROR(job.Sync());
        if (i >= 2) took.push_back(Seconds(start));
      }
      // The algorithm is the last timed call's (its flight record); the slowest rank's median is
      // the call's time.
      const nlohmann::json record = nlohmann::json::parse(job.comm->FlightRecord(), nullptr, false);
      std::optional<Algorithm> ran;
      const std::string call = fmt::format("allreduce count={} ", count);
      if (record.is_object()) {
        for (const auto& rec : record["records"])
          if (rec.value("call", "").rfind(call, 0) == 0) ran = collectives::ParseAlgorithm(rec.value("algorithm", ""));
      }
      if (!ran) return Internal(fmt::format("the flight recorder does not say which algorithm ran {}", call));
      KZ_ASSIGN_OR_RETURN(double seconds, job.Max(Median(took)));
      out.push_back({*ran, count, seconds});
    }
  }
  return Status::Ok();
}

// The model's error over the samples: the median and the mean of |log(measured / predicted)|.
std::pair<double, double> Error(const Communicator& comm, const std::vector<Sample>& samples, const CostConstants& k) {
  std::vector<double> e;
  double sum = 0;
  for (const Sample& s : samples) {
    const collectives::Prediction p =
        comm.PredictWith(Collective::kAllReduce, s.count, DataType::kFloat32, s.algorithm, k);
    const double x = p.finite() && p.seconds > 0 ? std::abs(std::log(s.seconds / p.seconds)) : 10.0;
    e.push_back(x);
    sum += x;
  }
  return {Median(e), e.empty() ? 0 : sum / e.size()};
}

// Coordinate descent in log space over the constants the model cannot measure directly.
CostConstants Fit(const Communicator& comm, const std::vector<Sample>& samples, CostConstants k) {
  const double cache_mib = k.host_cache_mib;  // the measured one, where the kernel says
  static constexpr std::string_view kFitted[] = {
      "message_overhead_us", "step_overhead_us",      "direct_rendezvous_us", "oneshot_us",    "oversubscribed_wake_us",
      "host_memory_gbps",    "staging_copy_max_gbps", "handoff_wake_us",      "cache_speedup", "host_cache_mib"};
  // Per algorithm, and the worst of them: a median over all samples could give up one path whole
  // (the fused path's half of them) to fit the other's.
  std::map<Algorithm, std::vector<Sample>> by_algorithm;
  for (const Sample& x : samples) by_algorithm[x.algorithm].push_back(x);
  auto score = [&](const CostConstants& c) {
    double worst = 0;
    for (const auto& [algorithm, group] : by_algorithm) {
      const auto [median, mean] = Error(comm, group, c);
      // The mean: a median would fit half the sizes and leave the others, which a sweep of other
      // sizes then lands on (ring at 2 processes: 17 % on its samples, a factor of 1.5 on the sweep).
      worst = std::max(worst, mean + 0.25 * median);
    }
    return worst;
  };
  double best = score(k);
  for (double step = 4.0; step > 1.05; step = std::sqrt(step)) {
    for (int pass = 0; pass < 4; ++pass) {
      bool moved = false;
      for (std::string_view name : kFitted) {
        double CostConstants::*field = nullptr;
        for (const collectives::CostConstantInfo& info : collectives::CostConstantTable())
          if (info.name == name) field = info.field;
        for (double f : {step, 1 / step}) {
          CostConstants trial = k;
          // Within 16x of the default either way: a fit on a few sizes must not wander to values
          // no machine has (a rendezvous of a nanosecond) to shave an error elsewhere.
          const double d = CostConstants{}.*field;
          double lo = d / 16, hi = d * 16;
          // A cache never slows memory down, and the part of the last-level cache an operation
          // gets is at most what the kernel says the CPU has (a VM's share may be less).
          if (name == "cache_speedup") lo = 1;
          if (name == "host_cache_mib") hi = cache_mib > 0 ? cache_mib : d;
          trial.*field = std::clamp(k.*field * f, lo, hi);
          const double s = score(trial);
          if (s < best - 1e-9) {
            best = s;
            k = trial;
            moved = true;
          }
        }
      }
      if (!moved) break;
    }
  }
  return k;
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-tune: this machine's costs for the cost model (KIZUNA_COST_FILE); run as a job of N ranks",
               "kizuna-tune"};
  std::string out_path;
  bool append = false, verbose = false;
  size_t max_bytes = size_t{16} << 20;
  std::string max_text = "16M";
  int iters = 9;
  app.add_option("-o,--output", out_path, "the cost file rank 0 writes")->required();
  app.add_flag("--append", append, "replace this size's section of an existing file, keep the others");
  app.add_flag("-v,--verbose", verbose, "print every measured AllReduce beside its predictions");
  app.add_option("--max-bytes", max_text, "the largest AllReduce measured (K, M, G suffixes)")->capture_default_str();
  app.add_option("--iters", iters, "timed calls per size (the median is kept)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kizuna-tune: %s\n", s.ToString().c_str());
    return 1;
  };
  auto parsed_max = bench::ParseByteSize(max_text, "--max-bytes");
  if (!parsed_max.ok()) {
    std::fprintf(stderr, "kizuna-tune: %s\n", parsed_max.status().ToString().c_str());
    return 2;
  }
  max_bytes = static_cast<size_t>(*parsed_max);
  const auto start = Clock::now();
  // The measurements run with the model's defaults; the links measured here go into a first file,
  // which a second communicator loads (Split reads the configuration again), so that the fit's
  // predictions see the measured links in their shape.
  Config config = GlobalConfig();
  config.cost_file.clear();
  // The fabrics first, on rank 0 alone, before the job's communicator exists: the other ranks
  // wait for it in the rendezvous, asleep.
  std::vector<std::pair<std::string, collectives::LinkCosts>> links;
  auto launch = bootstrap::DetectLaunch(bootstrap::ProcessEnvironment());
  if (!launch.ok()) return fail(launch.status());
  std::pair<double, double> rates;
  if (launch->rank == 0) {
    auto measured_links = FabricLinks(config);
    if (!measured_links.ok()) return fail(measured_links.status().WithContext("measuring the fabrics"));
    links = std::move(*measured_links);
    auto measured_rates = DeviceRates(config);
    if (!measured_rates.ok()) return fail(measured_rates.status().WithContext("measuring a device"));
    rates = *measured_rates;
  }
  CommOptions options;
  options.config = &config;
  auto created = Communicator::CreateFromEnvironment(options);
  if (!created.ok()) return fail(created.status());
  std::unique_ptr<Communicator> comm = std::move(*created);
  const int rank = comm->rank(), n = comm->size();
  if (!comm->device().properties().host_accessible)
    return fail(NotSupported(
        fmt::format("kizuna-tune measures devices whose memory the CPU reaches; {}'s is not", comm->device().label())));
  auto stream = comm->device().CreateStream();
  if (!stream.ok()) return fail(stream.status());
  max_bytes = std::max<size_t>(max_bytes, 64);
  auto a = comm->device().Allocate(max_bytes), b = comm->device().Allocate(max_bytes);
  if (!a.ok() || !b.ok()) return fail(!a.ok() ? a.status() : b.status());
  std::memset((*a)->data(), 0, max_bytes);
  Job job{comm.get(), stream->get(), static_cast<float*>((*a)->data()), static_cast<float*>((*b)->data()), max_bytes};

  collectives::CostFile measured;
  measured.sections.push_back({n, {}, {}});
  auto& entries = measured.sections.back().entries;
  auto host = HostMemoryGbps(job);
  if (!host.ok()) return fail(host.status());
  entries.emplace_back("unknown_copy_gbps", rates.first);
  entries.emplace_back("unknown_reduce_gbps", rates.second);
  for (const auto& [fabric, link] : links) {
    entries.emplace_back(fmt::format("link.{}.latency_us", fabric), link.latency_us);
    entries.emplace_back(fmt::format("link.{}.gbps", fabric), link.gbps);
  }
  // Rank 0's link entries, to every rank: a small text through the engine, zero-padded.
  std::string text = collectives::FormatCostFile(measured, {});
  {
    constexpr size_t kTextBytes = 4096;
    auto* bytes = reinterpret_cast<uint8_t*>(job.b);
    std::memset(bytes, 0, kTextBytes);
    if (rank == 0) std::memcpy(bytes, text.data(), std::min(text.size(), kTextBytes - 1));
    if (Status s = comm->Broadcast(bytes, bytes, kTextBytes, DataType::kUint8, 0, *job.stream); !s.ok()) return fail(s);
    if (Status s = job.Sync(); !s.ok()) return fail(s);
    text.assign(reinterpret_cast<const char*>(bytes));
  }
  const std::string links_path = fmt::format("{}.links.{}", out_path, rank);
  if (Status s = WriteFileAtomically(links_path, text); !s.ok()) return fail(s);
  // The AllReduces run while the job's communicator is the process's only one, as in most jobs:
  // with a second one, small operations leave the calling thread (Executor::TryOnCaller), which
  // the model, counting one communicator, would not see. Each sample keeps the algorithm that ran.
  std::vector<Sample> samples;
  for (std::optional<Algorithm> algorithm : {std::optional<Algorithm>(), std::optional<Algorithm>(Algorithm::kRing)}) {
    if (Status s = Measure(job, algorithm, iters, samples); !s.ok()) return fail(s);
  }
  config.cost_file = links_path;
  auto split = comm->Split(0, rank);
  std::remove(links_path.c_str());
  if (!split.ok()) return fail(split.status());
  job.comm = split->get();
  if (rank == 0) {
    auto parsed = collectives::ParseCostFile(text);
    if (!parsed.ok()) return fail(parsed.status());
    CostConstants start_k = collectives::CostsFor(*parsed, n).constants;
    start_k.host_memory_gbps = *host;
    if (const double cache = LastLevelCacheMib(); cache > 0) start_k.host_cache_mib = cache;
    const auto before = Error(*job.comm, samples, CostConstants{});
    const CostConstants fitted = Fit(*job.comm, samples, start_k);
    const auto after = Error(*job.comm, samples, fitted);
    for (const Sample& x : samples) {
      if (!verbose) break;
      auto predicted = [&](const CostConstants& k) {
        return job.comm->PredictWith(Collective::kAllReduce, x.count, DataType::kFloat32, x.algorithm, k).seconds * 1e6;
      };
      std::printf("%-18s %10zu B  measured %10.1f us  predicted %10.1f us (defaults) %10.1f us (fitted)\n",
                  std::string(collectives::AlgorithmName(x.algorithm)).c_str(), x.count * sizeof(float),
                  x.seconds * 1e6, predicted(CostConstants{}), predicted(fitted));
    }
    collectives::CostFile::Section section{n, parsed->sections.back().entries, {}};
    for (const collectives::CostConstantInfo& info : collectives::CostConstantTable()) {
      if (info.name == "unknown_copy_gbps" || info.name == "unknown_reduce_gbps") continue;
      if (fitted.*info.field != CostConstants{}.*info.field)
        section.entries.emplace_back(std::string(info.name), fitted.*info.field);
    }
    section.note = fmt::format(
        "{} AllReduces measured ({}); the model's median error on them {:.0f}% with the defaults, "
        "{:.0f}% with this section (mean {:.0f}% -> {:.0f}%)",
        samples.size(), UtcNow(), (std::exp(before.first) - 1) * 100, (std::exp(after.first) - 1) * 100,
        (std::exp(before.second) - 1) * 100, (std::exp(after.second) - 1) * 100);
    collectives::CostFile file;
    if (append) {
      auto old = collectives::LoadCostFile(out_path);
      if (old.ok()) file = std::move(*old);
    }
    std::erase_if(file.sections, [&](const auto& x) { return x.ranks == n; });
    if (file.sections.empty()) file.sections.emplace_back();
    file.sections.push_back(std::move(section));
    std::sort(file.sections.begin(), file.sections.end(),
              [](const auto& x, const auto& y) { return x.ranks < y.ranks; });
    const std::vector<std::string> header = {
        "kizuna cost file (KIZUNA_COST_FILE), written by kizuna-tune: a [ranks=N] section per job size measured"};
    if (Status s = WriteFileAtomically(out_path, collectives::FormatCostFile(file, header)); !s.ok()) return fail(s);
    std::printf(
        "kizuna-tune: %d ranks, %.1f s: %s (host memory %.1f GB/s, device copy %.1f GB/s, reduce %.1f GB/s; "
        "the model's median error on %zu AllReduces %.0f%% -> %.0f%%)\n",
        n, Seconds(start), out_path.c_str(), *host, rates.first, rates.second, samples.size(),
        (std::exp(before.first) - 1) * 100, (std::exp(after.first) - 1) * 100);
  }
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
