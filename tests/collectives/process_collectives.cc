// A representative subset of the collective matrix with one rank per process, under kizuna-run:
// every collective through every algorithm that serves it, float32 and bfloat16, a count no rank
// count divides. Each rank checks its own results (world.h's reference) and exits non-zero on the
// first wrong element or error, naming it.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "runtime/communicator.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "process_collectives: %s\n", what.c_str());
  return 1;
}

int Main() {
  auto created = Communicator::CreateFromEnvironment();
  if (!created.ok()) return Fail(created.status().ToString());
  Communicator& comm = **created;
  const int n = comm.size(), r = comm.rank();
  auto stream_or = comm.device().CreateStream();
  if (!stream_or.ok()) return Fail(stream_or.status().ToString());
  device::Stream& stream = **stream_or;
  int cases = 0;
  const Collective colls[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                              Collective::kBroadcast, Collective::kReduce,        Collective::kAllToAll,
                              Collective::kBarrier};
  for (Collective coll : colls) {
    for (const collectives::AlgorithmImpl* algo : collectives::AllAlgorithms()) {
      collectives::CollectiveRequest probe;
      probe.collective = coll;
      probe.nranks = n;
      probe.count = 7;
      if (!algo->Supports(probe, comm.shape()).ok()) continue;
      for (DataType t : {DataType::kFloat32, DataType::kBfloat16}) {
        const uint64_t count = 10007;
        const ReduceOp op = t == DataType::kFloat32 ? ReduceOp::kSum : ReduceOp::kMax;
        probe.count = count;
        const uint64_t in = probe.input_count(), out = std::max<uint64_t>(probe.output_count(), 1);
        const size_t elem = DataTypeSize(t);
        auto a = comm.device().Allocate(std::max<uint64_t>(in, 1) * elem);
        auto b = comm.device().Allocate(out * elem);
        if (!a.ok() || !b.ok()) return Fail("allocation failed");
        const ReduceOp vop = collectives::IsReduction(coll) ? op : ReduceOp::kSum;
        for (uint64_t i = 0; i < in; ++i)
          StoreValue((*a)->data(), i, t, static_cast<double>(InputValue(vop, r, i)));
        CallOptions options;
        options.algorithm = algo->id();
        void* src = (*a)->data();
        void* dst = (*b)->data();
        const int root = n - 1;
        Status s;
        switch (coll) {
          case Collective::kAllReduce:
            s = comm.AllReduce(src, dst, count, t, op, stream, options);
            break;
          case Collective::kReduceScatter:
            s = comm.ReduceScatter(src, dst, count, t, op, stream, options);
            break;
          case Collective::kAllGather:
            s = comm.AllGather(src, dst, count, t, stream, options);
            break;
          case Collective::kBroadcast:
            s = comm.Broadcast(src, dst, count, t, root, stream, options);
            break;
          case Collective::kReduce:
            s = comm.Reduce(src, dst, count, t, op, root, stream, options);
            break;
          case Collective::kAllToAll:
            s = comm.AllToAll(src, dst, count, t, stream, options);
            break;
          default:
            s = comm.Barrier(stream);
            break;
        }
        const std::string name = fmt::format("{} via {} {} on rank {} of {}", collectives::CollectiveName(coll),
                                             collectives::AlgorithmName(algo->id()), DataTypeName(t), r, n);
        if (!s.ok()) return Fail(name + ": " + s.ToString());
        if (Status e = stream.Synchronize(); !e.ok()) return Fail(name + ": " + e.ToString());
        if (Status e = comm.AsyncError(); !e.ok()) return Fail(name + ": " + e.ToString());
        auto want = [&](uint64_t j) -> double {
          switch (coll) {
            case Collective::kAllReduce:
            case Collective::kReduce:
              return Reduced(op, n, j, t);
            case Collective::kReduceScatter:
              return Reduced(op, n, static_cast<uint64_t>(r) * count + j, t);
            case Collective::kAllGather:
              return static_cast<double>(InputValue(ReduceOp::kSum, static_cast<int>(j / count), j % count));
            case Collective::kBroadcast:
              return static_cast<double>(InputValue(ReduceOp::kSum, root, j));
            case Collective::kAllToAll:
              return static_cast<double>(
                  InputValue(ReduceOp::kSum, static_cast<int>(j / count), static_cast<uint64_t>(r) * count + j % count));
            default:
              return 0;
          }
        };
        const bool check = coll != Collective::kBarrier && (coll != Collective::kReduce || r == root);
        for (uint64_t j = 0; check && j < probe.output_count(); ++j) {
          const double got = LoadValue(dst, j, t);
          if (!Matches(got, want(j), t, op))
            return Fail(fmt::format("{}: element {} is {}, expected {}", name, j, got, want(j)));
        }
        ++cases;
      }
    }
  }
  // Point to point around the ring, in a group.
  if (n > 1) {
    auto a = comm.device().Allocate(4000), b = comm.device().Allocate(4000);
    if (!a.ok() || !b.ok()) return Fail("allocation failed");
    for (int i = 0; i < 1000; ++i) static_cast<float*>((*a)->data())[i] = static_cast<float>(r * 1000 + i);
    if (!Communicator::GroupStart().ok()) return Fail("GroupStart");
    Status s1 = comm.Send((*a)->data(), 1000, DataType::kFloat32, (r + 1) % n, stream);
    Status s2 = comm.Recv((*b)->data(), 1000, DataType::kFloat32, (r + n - 1) % n, stream);
    Status s3 = Communicator::GroupEnd();
    if (!s1.ok() || !s2.ok() || !s3.ok()) return Fail("send/recv: " + s1.ToString() + s2.ToString() + s3.ToString());
    if (Status e = stream.Synchronize(); !e.ok()) return Fail("send/recv: " + e.ToString());
    const int from = (r + n - 1) % n;
    for (int i = 0; i < 1000; ++i)
      if (static_cast<float*>((*b)->data())[i] != static_cast<float>(from * 1000 + i))
        return Fail(fmt::format("send/recv: element {} wrong on rank {}", i, r));
    ++cases;
  }
  std::printf("rank %d of %d: %d cases ok\n", r, n, cases);
  return 0;
}

}  // namespace
}  // namespace kizuna::test

int main() { return kizuna::test::Main(); }
