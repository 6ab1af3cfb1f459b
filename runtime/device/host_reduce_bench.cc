// Throughput of the host copy and reduce kernels (the emulated device's hot path), in bytes moved
// per second: inputs read plus output written. Compare with a STREAM-like copy on the same
// machine in the same run (BM_MemcpyOneThread), not with figures from other days.
//
//   bazel run -c opt //runtime/device:host_reduce_bench -- --benchmark_counters_tabular=true
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>

#include "runtime/device/host_reduce.h"

namespace kizuna {
namespace {

struct Buffers {
  Buffers(size_t inputs, size_t bytes) : in(inputs, std::vector<char>(bytes, 1)), out(bytes, 0) {
    for (auto& v : in) srcs.push_back(v.data());
  }
  std::vector<std::vector<char>> in;
  std::vector<char> out;
  std::vector<const void*> srcs;
};

void BM_MemcpyOneThread(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffers b(1, bytes);
  for (auto _ : state) {
    std::memcpy(b.out.data(), b.srcs[0], bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}

void BM_HostCopy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  Buffers b(1, bytes);
  for (auto _ : state) {
    HostCopy(b.out.data(), b.srcs[0], bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}

template <DataType kType, ReduceOp kOp = ReduceOp::kSum>
void BM_HostReduce(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t inputs = static_cast<size_t>(state.range(1));
  Buffers b(inputs, bytes);
  const size_t count = bytes / DataTypeSize(kType);
  for (auto _ : state) {
    Status s = HostReduce(b.out.data(), b.srcs, count, kType, kOp);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (inputs + 1) * bytes));
}

constexpr int64_t kInCache = 256 << 10;
constexpr int64_t kDram = 64 << 20;

BENCHMARK(BM_MemcpyOneThread)->Arg(kInCache)->Arg(kDram)->UseRealTime();
BENCHMARK(BM_HostCopy)->Arg(kInCache)->Arg(kDram)->UseRealTime();
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kFloat32)
    ->ArgsProduct({{kInCache, kDram}, {2, 8}})
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kFloat16)->ArgsProduct({{kInCache, kDram}, {2}})->UseRealTime();
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kBfloat16)->ArgsProduct({{kInCache, kDram}, {2}})->UseRealTime();
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kInt32)->ArgsProduct({{kInCache, kDram}, {2}})->UseRealTime();
// min / max of floating types order signed zeros and canonicalize NaNs (host_reduce.h): a few
// more operations per vector than a plain compare-and-select.
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kFloat32, ReduceOp::kMax)
    ->ArgsProduct({{kInCache, kDram}, {2, 8}})
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kFloat64, ReduceOp::kMin)
    ->ArgsProduct({{kInCache, kDram}, {2}})
    ->UseRealTime();
BENCHMARK_TEMPLATE(BM_HostReduce, DataType::kBfloat16, ReduceOp::kMax)
    ->ArgsProduct({{kInCache, kDram}, {2}})
    ->UseRealTime();

}  // namespace
}  // namespace kizuna

BENCHMARK_MAIN();
