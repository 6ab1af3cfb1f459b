// Ranks on devices of different speeds in one communicator, and what splitting the work by speed
// gains. A benchmark, not a test: it prints times, and checks every result.
//
//   bazel-bin/examples/heterogeneous/heterogeneous [--ranks 8] [--slow 4] [--fast-gbps 8]
//       [--slow-gbps 2] [--bytes 16M] [--iters 5]
//
// The first ranks run on emulated devices whose reductions are throttled to --fast-gbps, the last
// --slow ranks on devices throttled to --slow-gbps (two emulated backends in this process, so
// each group reports its own speed). For the algorithms that can split work unevenly (pairwise
// AllReduce: each rank reduces its part of the vector; the double binary tree: two trees share the
// data), each AllReduce runs with the work split by speed and with the even split, alternating,
// and the median times are compared.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
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

}  // namespace

// Kept whole: an example, meant to be read top to bottom as one program.
int main(int argc, char** argv) {
  int ranks = 8, slow = 4, iters = 5;
  double fast_gbps = 8, slow_gbps = 2;
  std::string bytes_text = "16M";
  CLI::App app{"kizuna: AllReduce across fast and slow emulated devices, work split by speed vs even"};
  app.add_option("--ranks", ranks, "ranks (one device each)")->check(CLI::Range(2, 8));
  app.add_option("--slow", slow, "how many of them are slow")->check(CLI::Range(1, 7));
  app.add_option("--fast-gbps", fast_gbps, "reduce throughput of the fast devices, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--slow-gbps", slow_gbps, "reduce throughput of the slow devices, GB/s")->check(CLI::PositiveNumber);
  app.add_option("--bytes", bytes_text, "message size (K/M/G suffixes)");
  app.add_option("--iters", iters, "timed calls per variant")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  if (slow >= ranks) return Fail(kizuna::InvalidArgument("--slow must be below --ranks"));
  uint64_t bytes = std::stoull(bytes_text);
  const char unit = bytes_text.empty() ? ' ' : bytes_text.back();
  if (unit == 'K' || unit == 'k') bytes <<= 10;
  if (unit == 'M' || unit == 'm') bytes <<= 20;
  if (unit == 'G' || unit == 'g') bytes <<= 30;
  const size_t count = bytes / sizeof(float);

  kizuna::Config fast_config, slow_config;
  fast_config.emulated_devices = slow_config.emulated_devices = ranks;
  fast_config.emu_reduce_gbps = fast_gbps;
  slow_config.emu_reduce_gbps = slow_gbps;
  auto fast_backend = kizuna::host_emulated::CreateHostEmulatedBackend(fast_config);
  auto slow_backend = kizuna::host_emulated::CreateHostEmulatedBackend(slow_config);
  if (!fast_backend.ok()) return Fail(fast_backend.status());
  if (!slow_backend.ok()) return Fail(slow_backend.status());
  std::vector<kizuna::device::Device*> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back((r < ranks - slow ? **fast_backend : **slow_backend).device(r));

  std::vector<std::unique_ptr<Communicator>> comms;
  {
    auto created = Communicator::CreateLocal(devices);
    if (!created.ok()) return Fail(created.status());
    comms = std::move(*created);
  }
  std::vector<std::unique_ptr<kizuna::device::Buffer>> in, out;
  std::vector<std::unique_ptr<kizuna::device::Stream>> streams;
  for (int r = 0; r < ranks; ++r) {
    auto a = devices[r]->Allocate(count * sizeof(float));
    auto b = devices[r]->Allocate(count * sizeof(float));
    auto s = devices[r]->CreateStream();
    if (!a.ok() || !b.ok() || !s.ok()) return Fail(kizuna::OutOfMemory("buffers"));
    auto* data = static_cast<float*>((*a)->data());
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>((r + i) % 7);
    in.push_back(std::move(*a));
    out.push_back(std::move(*b));
    streams.push_back(std::move(*s));
  }
  auto run = [&](Algorithm algo, bool balance) -> kizuna::Result<double> {
    CallOptions options;
    options.algorithm = algo;
    options.balance = balance;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < ranks; ++r)
      KZ_RETURN_IF_ERROR(comms[r]->AllReduce(in[r]->data(), out[r]->data(), count, DataType::kFloat32,
                                             ReduceOp::kSum, *streams[r], options));
    for (auto& s : streams) KZ_RETURN_IF_ERROR(s->Synchronize());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (auto& c : comms) KZ_RETURN_IF_ERROR(c->AsyncError());
    for (int r = 0; r < ranks; ++r) {
      const auto* got = static_cast<const float*>(out[r]->data());
      for (size_t i = 0; i < count; i += 997) {
        float want = 0;
        for (int q = 0; q < ranks; ++q) want += static_cast<float>((q + i) % 7);
        if (got[i] != want) return kizuna::Internal(fmt::format("rank {} element {}: {} != {}", r, i, got[i], want));
      }
    }
    return ms;
  };
  std::printf("%d ranks (%d at %.1f GB/s reduce, %d at %.1f GB/s), AllReduce of %zu float32 (%s), median of %d\n",
              ranks, ranks - slow, fast_gbps, slow, slow_gbps, count, bytes_text.c_str(), iters);
  std::printf("%-10s %14s %14s %8s\n", "algorithm", "by speed ms", "even ms", "gain");
  for (Algorithm algo : {Algorithm::kPairwise, Algorithm::kTree}) {
    std::vector<double> balanced, even;
    for (bool warm : {true, false}) {
      for (int i = 0; i < (warm ? 1 : iters); ++i) {
        // Alternate which variant goes first, so that neither always runs on a warmer cache.
        const bool even_first = i % 2 == 1;
        kizuna::Result<double> e = even_first ? run(algo, false) : kizuna::Result<double>(0.0);
        if (!e.ok()) return Fail(e.status());
        auto b = run(algo, true);
        if (!b.ok()) return Fail(b.status());
        if (!even_first) e = run(algo, false);
        if (!e.ok()) return Fail(e.status());
        if (!warm) {
          balanced.push_back(*b);
          even.push_back(*e);
        }
      }
    }
    std::sort(balanced.begin(), balanced.end());
    std::sort(even.begin(), even.end());
    const double mb = balanced[balanced.size() / 2], me = even[even.size() / 2];
    std::printf("%-10s %14.2f %14.2f %7.2fx\n", std::string(kizuna::collectives::AlgorithmName(algo)).c_str(), mb,
                me, me / mb);
  }
  comms.clear();
  return 0;
}
