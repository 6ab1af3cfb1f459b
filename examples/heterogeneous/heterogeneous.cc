// Ranks on devices of different speeds in one communicator, and what splitting the work by speed
// gains. A benchmark, not a test: it prints times, and checks every result.
//
//   bazel-bin/examples/heterogeneous/heterogeneous [--ranks 8] [--slow 4] [--fast-gbps 8]
//       [--slow-gbps 2] [--bytes 16M] [--iters 5] [--algos fused,pairwise,tree]
//       [--colls allreduce,reducescatter,allgather] [--busy-device K] [--reweigh]
//
// The first ranks run on emulated devices whose copies and reductions are throttled to
// --fast-gbps, the last --slow ranks on devices throttled to --slow-gbps (one emulated backend,
// its devices' throttles scaled apart; each device reports its own speed). Each collective runs with every algorithm
// named that serves it, with the work split by speed (CallOptions::balance, the default) and with
// the even split, alternating which goes first; the median times are compared. What each
// algorithm splits, and the figures: docs/PERFORMANCE.md ("Heterogeneous devices").
// --busy-device K keeps device K's throttle busy with another stream's copies all along (another
// job on that accelerator); --reweigh has the ranks re-measure their devices first
// (Communicator::Reweigh), so that "by speed" follows what the devices do now.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "devices/host_emulated/backend.h"
#include "runtime/communicator.h"

namespace {

using kizuna::CallOptions;
using kizuna::Communicator;
using kizuna::DataType;
using kizuna::ReduceOp;
using kizuna::collectives::Algorithm;

int Fail(const kizuna::Status& s) {
  std::fprintf(stderr, "heterogeneous: %s\n", s.ToString().c_str());
  return 1;
}

// Rank r's input element i: small integers, so that float sums are exact in any order.
float Input(int r, size_t i) { return static_cast<float>((static_cast<size_t>(r) + i) % 7); }

}  // namespace

// Kept whole: an example, meant to be read top to bottom as one program.
int main(int argc, char** argv) {
  int ranks = 8, slow = 4, iters = 5;
  double fast_gbps = 8, slow_gbps = 2;
  std::string bytes_text = "16M";
  std::vector<std::string> algo_names = {"fused", "pairwise", "tree"}, colls = {"allreduce"};
  CLI::App app{"kizuna: collectives across fast and slow emulated devices, work split by speed vs even"};
  app.add_option("--ranks", ranks, "ranks (one device each)")->check(CLI::Range(2, 8));
  app.add_option("--slow", slow, "how many of them are slow")->check(CLI::Range(0, 7));
  app.add_option("--fast-gbps", fast_gbps, "copy and reduce throughput of the fast devices, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--slow-gbps", slow_gbps, "copy and reduce throughput of the slow devices, GB/s")
      ->check(CLI::PositiveNumber);
  app.add_option("--bytes", bytes_text, "each rank's input (K/M/G suffixes)");
  app.add_option("--iters", iters, "timed calls per variant")->check(CLI::Range(1, 1000));
  app.add_option("--algos", algo_names, "algorithms, comma-separated")->delimiter(',');
  app.add_option("--colls", colls, "allreduce, reducescatter, allgather, comma-separated")->delimiter(',');
  int busy_device = -1;
  bool reweigh = false;
  app.add_option("--busy-device", busy_device, "another job keeps this device's throttle busy all along")
      ->check(CLI::Range(0, 7));
  app.add_flag("--reweigh", reweigh, "the ranks re-measure their devices first (Communicator::Reweigh)");
  CLI11_PARSE(app, argc, argv);
  if (slow >= ranks) return Fail(kizuna::InvalidArgument("--slow must be below --ranks"));
  uint64_t bytes = std::stoull(bytes_text);
  const char unit = bytes_text.empty() ? ' ' : bytes_text.back();
  if (unit == 'K' || unit == 'k') bytes <<= 10;
  if (unit == 'M' || unit == 'm') bytes <<= 20;
  if (unit == 'G' || unit == 'g') bytes <<= 30;
  const size_t count = bytes / sizeof(float) / static_cast<size_t>(ranks) * static_cast<size_t>(ranks);
  std::vector<Algorithm> algos;
  for (const std::string& name : algo_names) {
    auto a = kizuna::collectives::ParseAlgorithm(name);
    if (!a) return Fail(kizuna::InvalidArgument(fmt::format("--algos: no algorithm '{}'", name)));
    algos.push_back(*a);
  }

  // One backend (its devices address each other's memory, as fused needs), each device throttled
  // to its group's speed (KIZUNA_EMU_SPEED_FACTORS).
  kizuna::Config config;
  config.emulated_devices = ranks;
  config.emu_reduce_gbps = config.emu_copy_gbps = fast_gbps;
  for (int r = 0; r < ranks; ++r) config.emu_speed_factors.push_back(r < ranks - slow ? 1.0 : slow_gbps / fast_gbps);
  auto backend = kizuna::host_emulated::CreateHostEmulatedBackend(config);
  if (!backend.ok()) return Fail(backend.status());
  std::vector<kizuna::device::Device*> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back((*backend)->device(r));

  std::vector<std::unique_ptr<Communicator>> comms;
  {
    auto created = Communicator::CreateLocal(devices);
    if (!created.ok()) return Fail(created.status());
    comms = std::move(*created);
  }
  // Inputs of `count` elements; outputs of count (AllReduce), count / ranks (ReduceScatter) or
  // count * ranks (AllGather, whose input is count / ranks: every collective moves `bytes`).
  std::vector<std::unique_ptr<kizuna::device::Buffer>> in, out;
  std::vector<std::unique_ptr<kizuna::device::Stream>> streams;
  for (int r = 0; r < ranks; ++r) {
    auto a = devices[r]->Allocate(count * sizeof(float));
    auto b = devices[r]->Allocate(count * sizeof(float));
    auto s = devices[r]->CreateStream();
    if (!a.ok() || !b.ok() || !s.ok()) return Fail(kizuna::OutOfMemory("buffers"));
    auto* data = static_cast<float*>((*a)->data());
    for (size_t i = 0; i < count; ++i) data[i] = Input(r, i);
    in.push_back(std::move(*a));
    out.push_back(std::move(*b));
    streams.push_back(std::move(*s));
  }
  const size_t block = count / static_cast<size_t>(ranks);
  // Another job on one device: copies back to back on a stream of its own, which share the
  // device's throttle with the ranks' work (as two jobs share one accelerator).
  std::atomic<bool> busy{busy_device >= 0};
  std::thread other([&] {
    if (busy_device < 0) return;
    kizuna::device::Device* d = devices[static_cast<size_t>(busy_device)];
    auto a = d->Allocate(4 << 20), b = d->Allocate(4 << 20);
    auto s = d->CreateStream();
    if (!a.ok() || !b.ok() || !s.ok()) return;
    while (busy.load()) {
      for (int i = 0; i < 16; ++i)
        if (!(*s)->Copy((*b)->data(), (*a)->data(), 4 << 20).ok()) return;
      (void)(*s)->Synchronize();
    }
  });
  struct StopOther {
    std::atomic<bool>& busy;
    std::thread& other;
    ~StopOther() {
      busy = false;
      other.join();
    }
  } stop_other{busy, other};
  if (reweigh) {
    // Collective: each rank measures from a thread of its own.
    std::vector<kizuna::Status> measured(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] { measured[static_cast<size_t>(r)] = comms[r]->Reweigh(); });
    for (auto& t : threads) t.join();
    for (const kizuna::Status& m : measured)
      if (!m.ok()) return Fail(m);
    std::printf("re-measured reduce GB/s:");
    for (const auto& d : comms[0]->topology().ranks) std::printf(" %.2f", d.reduce_gbps);
    std::printf("\n");
  }
  // One call of `coll` on every rank, then a check of a sample of every rank's output.
  auto run = [&](const std::string& coll, Algorithm algo, bool balance) -> kizuna::Result<double> {
    CallOptions options;
    options.algorithm = algo;
    options.balance = balance;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < ranks; ++r) {
      void* o = out[r]->data();
      const void* i = in[r]->data();
      if (coll == "allreduce") {
        KZ_RETURN_IF_ERROR(comms[r]->AllReduce(i, o, count, DataType::kFloat32, ReduceOp::kSum, *streams[r], options));
      } else if (coll == "reducescatter") {
        KZ_RETURN_IF_ERROR(
            comms[r]->ReduceScatter(i, o, block, DataType::kFloat32, ReduceOp::kSum, *streams[r], options));
      } else if (coll == "allgather") {
        KZ_RETURN_IF_ERROR(comms[r]->AllGather(i, o, block, DataType::kFloat32, *streams[r], options));
      } else {
        return kizuna::InvalidArgument(fmt::format("--colls: no collective '{}'", coll));
      }
    }
    for (auto& s : streams) KZ_RETURN_IF_ERROR(s->Synchronize());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (auto& c : comms) KZ_RETURN_IF_ERROR(c->AsyncError());
    const size_t n = coll == "reducescatter" ? block : count;
    for (int r = 0; r < ranks; ++r) {
      const auto* got = static_cast<const float*>(out[r]->data());
      for (size_t i = 0; i < n; i += 997) {
        float want = 0;
        if (coll == "allgather") {
          want = Input(static_cast<int>(i / block), i % block);
        } else {
          const size_t at = coll == "reducescatter" ? static_cast<size_t>(r) * block + i : i;
          for (int q = 0; q < ranks; ++q) want += Input(q, at);
        }
        if (got[i] != want)
          return kizuna::Internal(fmt::format("{} via {}: rank {} element {}: {} != {}", coll,
                                              kizuna::collectives::AlgorithmName(algo), r, i, got[i], want));
      }
    }
    return ms;
  };
  std::printf("%d ranks (%d at %.2f GB/s copy and reduce, %d at %.2f GB/s%s), %s per rank (float32), median of %d\n",
              ranks, ranks - slow, fast_gbps, slow, slow_gbps,
              busy_device >= 0 ? fmt::format("; device {} shared with another job", busy_device).c_str() : "",
              bytes_text.c_str(), iters);
  std::printf("%-14s %-10s %12s %12s %8s\n", "collective", "algorithm", "by speed ms", "even ms", "gain");
  for (const std::string& coll : colls) {
    for (Algorithm algo : algos) {
      std::vector<double> balanced, even;
      bool served = true;
      for (int i = -1; i < iters && served; ++i) {  // i = -1 warms up
        // Alternate which variant goes first, so that neither always runs on a warmer cache.
        const bool even_first = i % 2 != 0;
        double b = 0, e = 0;
        for (bool balance : even_first ? std::vector<bool>{false, true} : std::vector<bool>{true, false}) {
          auto t = run(coll, algo, balance);
          if (!t.ok() && t.status().code() == kizuna::StatusCode::kNotSupported) {
            served = false;  // this algorithm does not serve this collective here
            break;
          }
          if (!t.ok()) return Fail(t.status());
          (balance ? b : e) = *t;
        }
        if (served && i >= 0) balanced.push_back(b), even.push_back(e);
      }
      if (!served) continue;
      std::sort(balanced.begin(), balanced.end());
      std::sort(even.begin(), even.end());
      const double mb = balanced[balanced.size() / 2], me = even[even.size() / 2];
      std::printf("%-14s %-10s %12.2f %12.2f %7.2fx\n", coll.c_str(),
                  std::string(kizuna::collectives::AlgorithmName(algo)).c_str(), mb, me, me / mb);
    }
  }
  comms.clear();
  return 0;
}
