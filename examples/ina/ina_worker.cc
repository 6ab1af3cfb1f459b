// A worker of an INA job (collectives/ina), one rank per process under a launcher, with the job's
// aggregation devices (kizuna-aggd) as the ranks after the workers:
//
//   ina_worker check          AllReduce through the layout (Algorithm::kIna) for several sizes,
//                             dtypes, ops, in place and out of place; every element checked
//   ina_worker loop N COUNT   N AllReduces of COUNT floats, checked; on an error it prints it and
//                             exits 1 (the tests kill a process mid-job and expect this, not a hang)
//   ina_worker bench COUNT ITERS [ALGO]
//                             times ITERS AllReduces of COUNT floats with ALGO (default ina) and
//                             prints "bench <algo> <bytes> <seconds per op> <predicted seconds>"
//                             from rank 0 (./kz demo-ina)
// Values are small integers, so every dtype and op is exact in any reduction order.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/cost/model.h"
#include "runtime/communicator.h"
#include "runtime/core/half.h"

namespace kizuna {
namespace {

using collectives::Algorithm;

double ValueOf(int rank, uint64_t i) { return static_cast<double>((rank * 7 + i * 3) % 5); }

void Put(DataType t, uint8_t* p, double v) {
  if (t == DataType::kInt32) {
    const int32_t x = static_cast<int32_t>(v);
    std::memcpy(p, &x, 4);
  } else if (t == DataType::kFloat32) {
    const float x = static_cast<float>(v);
    std::memcpy(p, &x, 4);
  } else if (t == DataType::kBfloat16) {
    const uint16_t x = FloatToBfloat16(static_cast<float>(v));
    std::memcpy(p, &x, 2);
  } else {
    std::memcpy(p, &v, 8);
  }
}

double Get(DataType t, const uint8_t* p) {
  if (t == DataType::kInt32) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return x;
  }
  if (t == DataType::kFloat32) {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  if (t == DataType::kBfloat16) {
    uint16_t x;
    std::memcpy(&x, p, 2);
    return Bfloat16ToFloat(x);
  }
  double x;
  std::memcpy(&x, p, 8);
  return x;
}

double Expected(ReduceOp op, int n, uint64_t i) {
  double acc = ValueOf(0, i);
  for (int r = 1; r < n; ++r) {
    const double v = ValueOf(r, i);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    if (op == ReduceOp::kMin) acc = std::min(acc, v);
  }
  return op == ReduceOp::kAvg ? acc / n : acc;
}

// One checked AllReduce through device buffers (the emulated device's memory is host memory).
Status RunOne(Communicator& comm, device::Stream& stream, uint64_t count, DataType t, ReduceOp op, bool in_place,
              Algorithm algo) {
  const size_t es = DataTypeSize(t), bytes = std::max<size_t>(count * es, 1);
  device::Device& dev = comm.device();
  if (!dev.properties().host_accessible) return NotSupported("ina_worker needs host-accessible device memory");
  KZ_ASSIGN_OR_RETURN(auto in, dev.Allocate(bytes));
  KZ_ASSIGN_OR_RETURN(auto out, dev.Allocate(bytes));
  auto* i8 = static_cast<uint8_t*>(in->data());
  auto* o8 = static_cast<uint8_t*>(out->data());
  std::memset(o8, 0xEE, bytes);
  for (uint64_t i = 0; i < count; ++i) Put(t, (in_place ? o8 : i8) + i * es, ValueOf(comm.rank(), i));
  CallOptions options;
  options.algorithm = algo;
  KZ_RETURN_IF_ERROR(comm.AllReduce(in_place ? o8 : i8, o8, count, t, op, stream, options));
  KZ_RETURN_IF_ERROR(stream.Synchronize());
  KZ_RETURN_IF_ERROR(comm.AsyncError());
  for (uint64_t i = 0; i < count; ++i) {
    const double want = Expected(op, comm.size(), i), got = Get(t, o8 + i * es);
    const double tol = op == ReduceOp::kAvg ? (t == DataType::kBfloat16 ? 0.02 : 1e-6) : 0;
    if (std::fabs(got - want) > tol)
      return Internal(fmt::format("count {} {} {}{}: element {} is {}, expected {}", count, DataTypeName(t),
                                  ReduceOpName(op), in_place ? " in place" : "", i, got, want));
  }
  return Status::Ok();
}

// Kept whole: an example, its modes (check, loop, bench) side by side as the usage line lists them.
int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  auto created = Communicator::CreateFromEnvironment();
  if (!created.ok()) {
    std::fprintf(stderr, "ina_worker: %s\n", created.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **created;
  auto stream = comm.device().CreateStream();
  if (!stream.ok()) {
    std::fprintf(stderr, "ina_worker: %s\n", stream.status().ToString().c_str());
    return 1;
  }
  int checks = 0;
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "ina_worker rank %d: error after %d operations: %s\n", comm.rank(), checks,
                 s.ToString().c_str());
    return 1;
  };
  if (mode == "check") {
    for (uint64_t count : {uint64_t{1}, uint64_t{7}, uint64_t{1003}, uint64_t{300007}})
      for (DataType t : {DataType::kFloat32, DataType::kInt32, DataType::kBfloat16, DataType::kFloat64})
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
          if (op == ReduceOp::kAvg && t == DataType::kInt32) continue;
          if (count == 300007 && op != ReduceOp::kSum) continue;  // the large size once per dtype
          for (bool in_place : {false, true}) {
            if (Status s = RunOne(comm, **stream, count, t, op, in_place, Algorithm::kIna); !s.ok()) return fail(s);
            ++checks;
          }
        }
    std::printf("ina_worker rank %d of %d: %d checks ok\n", comm.rank(), comm.size(), checks);
    return 0;
  }
  if (mode == "loop" && argc > 3) {
    const int n = std::atoi(argv[2]);
    const uint64_t count = std::strtoull(argv[3], nullptr, 10);
    for (int k = 0; k < n; ++k) {
      if (Status s = RunOne(comm, **stream, count, DataType::kFloat32, ReduceOp::kSum, false, Algorithm::kIna); !s.ok())
        return fail(s);
      ++checks;
      if (k == 0 && comm.rank() == 0) {
        std::printf("ina_worker: first operation done\n");
        std::fflush(stdout);
      }
    }
    std::printf("ina_worker rank %d: %d operations ok\n", comm.rank(), checks);
    return 0;
  }
  if (mode == "bench" && argc > 3) {
    const uint64_t count = std::strtoull(argv[2], nullptr, 10);
    const int iters = std::max(1, std::atoi(argv[3]));
    const std::string algo_name = argc > 4 ? argv[4] : "ina";
    const auto algo = collectives::ParseAlgorithm(algo_name);
    if (!algo) return fail(InvalidArgument(fmt::format("unknown algorithm '{}'", algo_name)));
    // Warm-up (connections, registrations, plans), checked.
    if (Status s = RunOne(comm, **stream, count, DataType::kFloat32, ReduceOp::kSum, false, *algo); !s.ok())
      return fail(s);
    auto in = comm.device().Allocate(count * 4);
    auto out = comm.device().Allocate(count * 4);
    if (!in.ok() || !out.ok()) return fail(in.ok() ? out.status() : in.status());
    CallOptions options;
    options.algorithm = *algo;
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < iters; ++k)
      if (Status s = comm.AllReduce((*in)->data(), (*out)->data(), count, DataType::kFloat32, ReduceOp::kSum,
                                    **stream, options);
          !s.ok())
        return fail(s);
    if (Status s = (*stream)->Synchronize(); !s.ok()) return fail(s);
    if (Status s = comm.AsyncError(); !s.ok()) return fail(s);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    // The communicator's own prediction: its chunks and channels, as the call above ran.
    const double predicted = comm.PredictWith(collectives::Collective::kAllReduce, count, DataType::kFloat32, *algo,
                                              collectives::CostConstants{})
                                 .seconds;
    if (comm.rank() == 0) std::printf("bench %s %llu %.6g %.6g\n", algo_name.c_str(),
                                      static_cast<unsigned long long>(count * 4), seconds, predicted);
    return 0;
  }
  std::fprintf(stderr, "usage: ina_worker check | loop N COUNT | bench COUNT ITERS [ALGO]\n");
  return 2;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
