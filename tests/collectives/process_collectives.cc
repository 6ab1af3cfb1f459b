// A representative subset of the collective matrix with one rank per process, under kizuna-run:
// every collective through every algorithm that serves it, float32 and bfloat16, a count no rank
// count divides. Each rank checks its own results (world.h's reference) and exits non-zero on the
// first wrong element or error, naming it. `fused` runs the fused AllReduce between processes
// over many shapes; `host` passes plain host memory (malloc); `fused-abort R` and `fused-exit R`
// take rank R out of a fused call.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "collectives/algorithms/algorithm.h"
#include "runtime/communicator.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "process_collectives: %s\n", what.c_str());
  return 1;
}

// FusedMatrix's buffers: device buffers `a` and `b` (the cases' inputs and outputs) and host memory
// `host`, through which values go in and out.
struct FusedBuffers {
  std::unique_ptr<device::Buffer> a, b, host;
};

// FusedMatrix's AllReduces, twice: on the same buffers, and the second time on fresh ones for one
// count. Adds the cases passed to `cases`; 0 when all passed, else Fail's.
int FusedAllReduces(Communicator& comm, device::Stream& stream, const FusedBuffers& buffers, int& cases) {
  const int n = comm.size(), r = comm.rank();
  CallOptions options;
  options.algorithm = collectives::Algorithm::kFused;
  const uint64_t big = 1u << 20;
  void* h = buffers.host->data();
  struct Case {
    uint64_t count;
    DataType t;
    ReduceOp op;
    bool in_place;
  };
  std::vector<Case> list;
  for (uint64_t count : {uint64_t{0}, uint64_t{1}, static_cast<uint64_t>(n - 1), uint64_t{7}, uint64_t{10007}, big})
    for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kInt32, DataType::kFloat64})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg})
        if (!(op == ReduceOp::kAvg && t == DataType::kInt32)) list.push_back({count, t, op, false});
  for (uint64_t count : {uint64_t{5}, uint64_t{10007}, big})
    list.push_back({count, DataType::kFloat32, ReduceOp::kSum, true});
  for (int round = 0; round < 2; ++round) {
    for (const Case& c : list) {
      // The second round uses fresh buffers: peers map them anew.
      std::unique_ptr<device::Buffer> fa, fb;
      void* src = buffers.a->data();
      void* dst = buffers.b->data();
      if (round == 1 && c.count == 10007) {
        auto x = comm.device().Allocate(c.count * 8), y = comm.device().Allocate(c.count * 8);
        if (!x.ok() || !y.ok()) return Fail("allocation failed");
        fa = std::move(*x);
        fb = std::move(*y);
        src = fa->data();
        dst = fb->data();
      }
      if (c.in_place) dst = src;
      const size_t bytes = c.count * DataTypeSize(c.t);
      for (uint64_t i = 0; i < c.count; ++i) StoreValue(h, i, c.t, static_cast<double>(InputValue(c.op, r, i)));
      if (Status e = stream.Copy(src, h, bytes); !e.ok()) return Fail("copy in: " + e.ToString());
      const std::string name = fmt::format("fused allreduce count={} {} {}{} on rank {} of {}", c.count,
                                           DataTypeName(c.t), ReduceOpName(c.op), c.in_place ? " in place" : "", r, n);
      Status s = comm.AllReduce(src, dst, c.count, c.t, c.op, stream, options);
      if (s.ok()) s = stream.Synchronize();
      if (s.ok()) s = comm.AsyncError();
      if (s.ok()) s = stream.Copy(h, dst, bytes);
      if (s.ok()) s = stream.Synchronize();
      if (!s.ok()) return Fail(name + ": " + s.ToString());
      for (uint64_t j = 0; j < c.count; ++j) {
        const double got = LoadValue(h, j, c.t), want = Reduced(c.op, n, j, c.t);
        if (!Matches(got, want, c.t, c.op))
          return Fail(fmt::format("{}: element {} is {}, expected {}", name, j, got, want));
      }
      ++cases;
    }
  }
  return 0;
}

// FusedMatrix's other collectives. Adds the cases passed to `cases`; 0 when all passed, else
// Fail's.
int FusedOthers(Communicator& comm, device::Stream& stream, const FusedBuffers& buffers, int& cases) {
  const int n = comm.size(), r = comm.rank();
  CallOptions options;
  options.algorithm = collectives::Algorithm::kFused;
  void* h = buffers.host->data();
  // The other collectives fused runs, out of place and in place (NCCL's layout: AllGather's input
  // is this rank's block of the output, ReduceScatter's output this rank's block of the input).
  const int root = n - 1;
  for (Collective coll : {Collective::kReduceScatter, Collective::kAllGather, Collective::kBroadcast,
                          Collective::kReduce}) {
    for (bool in_place : {false, true}) {
      for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{10007}}) {
        const DataType t = DataType::kFloat32;
        const ReduceOp op = ReduceOp::kSum;
        collectives::CollectiveRequest req{coll, n, count, t, op, root, in_place};
        const uint64_t in = req.input_count(), out = req.output_count();
        uint8_t* abase = static_cast<uint8_t*>(buffers.a->data());
        uint8_t* src = abase;
        uint8_t* dst = static_cast<uint8_t*>(buffers.b->data());
        if (in_place) {
          if (coll == Collective::kAllGather) dst = abase, src = abase + static_cast<uint64_t>(r) * count * 4;
          else if (coll == Collective::kReduceScatter) dst = abase + static_cast<uint64_t>(r) * count * 4;
          else dst = src;
        }
        for (uint64_t i = 0; i < in; ++i) StoreValue(h, i, t, static_cast<double>(InputValue(op, r, i)));
        Status s = stream.Copy(src, h, in * 4);
        if (s.ok()) {
          switch (coll) {
            case Collective::kReduceScatter:
              s = comm.ReduceScatter(src, dst, count, t, op, stream, options);
              break;
            case Collective::kAllGather:
              s = comm.AllGather(src, dst, count, t, stream, options);
              break;
            case Collective::kBroadcast:
              s = comm.Broadcast(src, dst, count, t, root, stream, options);
              break;
            default:
              s = comm.Reduce(src, dst, count, t, op, root, stream, options);
              break;
          }
        }
        const std::string name = fmt::format("fused {} on rank {} of {}", req.ToString(), r, n);
        if (s.ok()) s = stream.Synchronize();
        if (s.ok()) s = comm.AsyncError();
        if (s.ok()) s = stream.Copy(h, dst, out * 4);
        if (s.ok()) s = stream.Synchronize();
        if (!s.ok()) return Fail(name + ": " + s.ToString());
        if (coll == Collective::kReduce && r != root) {
          ++cases;
          continue;
        }
        for (uint64_t j = 0; j < out; ++j) {
          double want = 0;
          if (coll == Collective::kReduceScatter) want = Reduced(op, n, static_cast<uint64_t>(r) * count + j, t);
          else if (coll == Collective::kAllGather)
            want = static_cast<double>(InputValue(op, static_cast<int>(j / count), j % count));
          else if (coll == Collective::kBroadcast) want = static_cast<double>(InputValue(op, root, j));
          else want = Reduced(op, n, j, t);
          const double got = LoadValue(h, j, t);
          if (!Matches(got, want, t, op))
            return Fail(fmt::format("{}: element {} is {}, expected {}", name, j, got, want));
        }
        ++cases;
      }
    }
  }
  return 0;
}

// The fused collectives between processes (collectives/direct/same_host_group.h): AllReduce with counts around
// the rank count (empty slices), in place and not, several dtypes and ops, the same buffers again
// (mapped once) and fresh ones; ReduceScatter, AllGather, Broadcast and Reduce in and out of
// place. Each rank checks its whole output.
int FusedMatrix(Communicator& comm, device::Stream& stream) {
  const int n = comm.size(), r = comm.rank();
  if (!comm.topology().direct) return Fail("the ranks of this host do not share buffers (topology().direct is false)");
  int cases = 0;
  const uint64_t big = 1u << 20;
  auto a = comm.device().Allocate(big * 8), b = comm.device().Allocate(big * 8);
  // Values go in and out through host memory and stream copies, so that device memory the CPU
  // cannot touch (KIZUNA_EMU_OPAQUE=1) is exercised as well.
  auto host = comm.device().AllocateHost(big * 8);
  if (!a.ok() || !b.ok() || !host.ok()) return Fail("allocation failed");
  const FusedBuffers buffers{std::move(*a), std::move(*b), std::move(*host)};
  if (int failed = FusedAllReduces(comm, stream, buffers, cases); failed != 0) return failed;
  if (int failed = FusedOthers(comm, stream, buffers, cases); failed != 0) return failed;
  std::printf("rank %d of %d: %d fused cases ok\n", r, n, cases);
  return 0;
}

// Rank `victim` leaves the second fused AllReduce: by Abort() (`how` "abort") or by ending its
// process (`how` "exit"). Every other rank's call must fail promptly with an error naming it.
int FusedFault(Communicator& comm, device::Stream& stream, const std::string& how, int victim) {
  const int r = comm.rank();
  auto a = comm.device().Allocate(4096 * 4);
  if (!a.ok()) return Fail("allocation failed");
  CallOptions options;
  options.algorithm = collectives::Algorithm::kFused;
  for (int call = 0; call < 2; ++call) {
    if (call == 1 && r == victim) {
      if (how == "exit") {
        std::printf("rank %d: leaving before the fused call\n", r);
        std::fflush(stdout);
        std::_Exit(0);
      }
      comm.Abort();
      std::printf("rank %d: aborted before the fused call\n", r);
      return 0;
    }
    const auto start = std::chrono::steady_clock::now();
    Status s = comm.AllReduce((*a)->data(), (*a)->data(), 4096, DataType::kFloat32, ReduceOp::kSum, stream, options);
    if (s.ok()) s = stream.Synchronize();
    if (s.ok()) s = comm.AsyncError();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (call == 0 && !s.ok()) return Fail("the first fused call failed: " + s.ToString());
    if (call == 1) {
      if (s.ok()) return Fail(fmt::format("rank {}: the fused call succeeded without rank {}", r, victim));
      if (s.ToString().find(fmt::format("rank {}", victim)) == std::string::npos)
        return Fail(fmt::format("rank {}: the error does not name rank {}: {}", r, victim, s.ToString()));
      std::printf("rank %d: fused failed after %.2f s as expected: %s\n", r, seconds, s.ToString().c_str());
    }
  }
  return 0;
}

// Plain host memory (malloc), as MPI and Gloo users pass it: AllReduce through the one-shot and
// the staged fused path (SameHostGroup::RunStaged), in place and not, and the other fused collectives; AllToAll, which
// fused does not serve, is refused naming why.
int HostMemory(Communicator& comm, device::Stream& stream) {
  const int n = comm.size(), r = comm.rank();
  if (!comm.TakesHostMemory()) return Fail("the communicator does not take host memory");
  int cases = 0;
  const int root = n - 1;
  for (Collective coll : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                          Collective::kBroadcast, Collective::kReduce}) {
    for (bool in_place : {false, true}) {
      for (uint64_t count : {uint64_t{0}, uint64_t{7}, uint64_t{5000}, uint64_t{1} << 20}) {
        const DataType t = DataType::kFloat32;
        const ReduceOp op = ReduceOp::kSum;
        collectives::CollectiveRequest req{coll, n, count, t, op, root, in_place};
        const uint64_t in = req.input_count(), out = req.output_count();
        std::vector<float> a(std::max<uint64_t>(in, out) * static_cast<uint64_t>(n) + 1),
            b(std::max<uint64_t>(out, 1));
        float* src = a.data();
        float* dst = b.data();
        if (in_place) {
          if (coll == Collective::kAllGather) dst = a.data(), src = a.data() + static_cast<uint64_t>(r) * count;
          else if (coll == Collective::kReduceScatter) dst = a.data() + static_cast<uint64_t>(r) * count;
          else dst = src;
        }
        for (uint64_t i = 0; i < in; ++i) src[i] = static_cast<float>(InputValue(op, r, i));
        Status s;
        switch (coll) {
          case Collective::kAllReduce:
            s = comm.AllReduce(src, dst, count, t, op, stream);
            break;
          case Collective::kReduceScatter:
            s = comm.ReduceScatter(src, dst, count, t, op, stream);
            break;
          case Collective::kAllGather:
            s = comm.AllGather(src, dst, count, t, stream);
            break;
          case Collective::kBroadcast:
            s = comm.Broadcast(src, dst, count, t, root, stream);
            break;
          default:
            s = comm.Reduce(src, dst, count, t, op, root, stream);
            break;
        }
        const std::string name = fmt::format("host-memory {} on rank {} of {}", req.ToString(), r, n);
        if (s.ok()) s = stream.Synchronize();
        if (s.ok()) s = comm.AsyncError();
        if (!s.ok()) return Fail(name + ": " + s.ToString());
        const bool check = coll != Collective::kReduce || r == root;
        for (uint64_t j = 0; check && j < out; ++j) {
          double want = 0;
          if (coll == Collective::kAllReduce || coll == Collective::kReduce) want = Reduced(op, n, j, t);
          else if (coll == Collective::kReduceScatter) want = Reduced(op, n, static_cast<uint64_t>(r) * count + j, t);
          else if (coll == Collective::kAllGather)
            want = static_cast<double>(InputValue(op, static_cast<int>(j / count), j % count));
          else want = static_cast<double>(InputValue(op, root, j));
          if (!Matches(dst[j], want, t, op))
            return Fail(fmt::format("{}: element {} is {}, expected {}", name, j, dst[j], want));
        }
        ++cases;
      }
    }
  }
  // Bad host buffers are refused before anything runs, on every rank alike (each makes the same
  // bad call), never a crash in the reduction: a wild pointer, a read-only receive buffer, and a
  // receive buffer that runs off the end of its mapping.
  {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    auto* region = static_cast<float*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                            -1, 0));
    if (region == MAP_FAILED) return Fail("mmap failed");
    munmap(reinterpret_cast<char*>(region) + page, page);  // nothing mapped after the first page
    std::vector<float> good(4096, 1.0f);
    auto* read_only = static_cast<float*>(mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (read_only == MAP_FAILED) return Fail("mmap failed");
    const size_t fits = page / sizeof(float);
    struct Bad {
      const char* name;
      float* recv;
      size_t count;
    };
    for (const Bad& bad : {Bad{"a wild receive pointer", reinterpret_cast<float*>(0x1000), 64},
                           Bad{"a read-only receive buffer", read_only, fits},
                           Bad{"a receive buffer past its mapping", region, fits + 1024}}) {
      const Status s = comm.AllReduce(good.data(), bad.recv, bad.count, DataType::kFloat32, ReduceOp::kSum, stream);
      if (s.code() != StatusCode::kInvalidArgument || s.ToString().find("host memory") == std::string::npos)
        return Fail(fmt::format("AllReduce with {}: expected kInvalidArgument naming host memory, got {}", bad.name,
                                s.ToString()));
      ++cases;
    }
    munmap(region, page);
    munmap(read_only, page);
  }
  // A per-call algorithm that cannot serve host memory falls back to fused, as CallOptions says.
  for (collectives::Algorithm forced : {collectives::Algorithm::kRing, collectives::Algorithm::kTree}) {
    std::vector<float> v(1000, static_cast<float>(r + 1));
    CallOptions options;
    options.algorithm = forced;
    Status s = comm.AllReduce(v.data(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, stream, options);
    if (s.ok()) s = stream.Synchronize();
    if (s.ok()) s = comm.AsyncError();
    const std::string name = fmt::format("host-memory AllReduce with {} asked for", collectives::AlgorithmName(forced));
    if (!s.ok()) return Fail(name + ": " + s.ToString());
    if (v[999] != static_cast<float>(n * (n + 1) / 2)) return Fail(fmt::format("{}: got {}", name, v[999]));
    ++cases;
  }
  std::vector<float> x(4 * static_cast<size_t>(n)), y(4 * static_cast<size_t>(n));
  const Status refused = comm.AllToAll(x.data(), y.data(), 4, DataType::kFloat32, stream);
  if (refused.ok() || refused.ToString().find("host memory") == std::string::npos)
    return Fail("AllToAll with host memory: expected a refusal naming host memory, got " + refused.ToString());
  std::printf("rank %d of %d: %d host-memory cases ok\n", r, n, cases);
  return 0;
}

// Rank 0 passes device memory, the others plain host memory, to an AllReduce too large for the
// one-shot path: every rank fails at once with a mismatch that says to pass one kind of memory.
int HostMixed(Communicator& comm, device::Stream& stream) {
  const int r = comm.rank();
  const uint64_t count = 1 << 16;
  std::vector<float> host(count, 1.0f);
  std::unique_ptr<device::Buffer> dev;
  float* buf = host.data();
  if (r == 0) {
    auto b = comm.device().Allocate(count * sizeof(float));
    if (!b.ok()) return Fail(b.status().ToString());
    dev = std::move(*b);
    buf = static_cast<float*>(dev->data());
  }
  Status s = comm.AllReduce(buf, buf, count, DataType::kFloat32, ReduceOp::kSum, stream);
  if (s.ok()) s = stream.Synchronize();
  if (s.ok()) s = comm.AsyncError();
  if (s.ok()) return Fail("device and host memory in one AllReduce: expected a mismatch, got ok");
  if (s.ToString().find("same kind of memory") == std::string::npos)
    return Fail("device and host memory in one AllReduce: expected a mismatch naming the memory, got " + s.ToString());
  std::printf("rank %d: mixed memory refused as expected: %s\n", r, s.ToString().c_str());
  return 0;
}

// The ranks call AllReduces of different sizes, so each takes another protocol (rank 0: one cache
// line, rank 1: a one-shot slot, the others: mapped buffers): every rank fails at once naming the
// mismatch, none waits for its deadline.
int Mismatch(Communicator& comm, device::Stream& stream) {
  const int r = comm.rank();
  const uint64_t count = r == 0 ? 2 : r == 1 ? 4096 : uint64_t{1} << 18;
  auto b = comm.device().Allocate(count * sizeof(float));
  if (!b.ok()) return Fail(b.status().ToString());
  auto* buf = static_cast<float*>((*b)->data());
  const auto start = std::chrono::steady_clock::now();
  Status s = comm.AllReduce(buf, buf, count, DataType::kFloat32, ReduceOp::kSum, stream);
  if (s.ok()) s = stream.Synchronize();
  if (s.ok()) s = comm.AsyncError();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok()) return Fail("AllReduces of different sizes: expected a mismatch, got ok");
  if (s.ToString().find("mismatch") == std::string::npos)
    return Fail("AllReduces of different sizes: expected a mismatch, got " + s.ToString());
  std::printf("rank %d: mismatch named after %.2f s as expected: %s\n", r, seconds, s.ToString().c_str());
  return 0;
}

// Main's matrix, one case: `coll` through `algo` in `t`, on a count no rank count divides, each
// rank checking its whole output. 0 when it passed, else Fail's.
int MatrixCase(Communicator& comm, device::Stream& stream, Collective coll, const collectives::AlgorithmImpl& algo,
               DataType t, uint64_t count) {
  const int n = comm.size(), r = comm.rank();
  collectives::CollectiveRequest probe;
  probe.collective = coll;
  probe.nranks = n;
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
  options.algorithm = algo.id();
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
                                       collectives::AlgorithmName(algo.id()), DataTypeName(t), r, n);
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
        return static_cast<double>(InputValue(ReduceOp::kSum, static_cast<int>(j / count),
                                              static_cast<uint64_t>(r) * count + j % count));
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
  return 0;
}

// Rank `frozen` stops its own process (SIGSTOP: alive, never answering) before an AllReduce the
// others call on the staged path (KIZUNA_ALGO=ring, a short KIZUNA_TIMEOUT): they fail at their
// deadline naming it as the rank that does not answer. 0 on the others when it was so named.
int Frozen(Communicator& comm, device::Stream& stream, int frozen) {
  const int r = comm.rank();
  auto a = comm.device().Allocate(4000);
  if (!a.ok()) return Fail("allocation failed");
  if (r == frozen) {
    std::fflush(stdout);
    raise(SIGSTOP);  // kizuna-run kills it at its timeout
    return Fail("continued after SIGSTOP");
  }
  const auto start = std::chrono::steady_clock::now();
  Status s = comm.AllReduce((*a)->data(), (*a)->data(), 1000, DataType::kFloat32, ReduceOp::kSum, stream);
  if (s.ok()) s = stream.Synchronize(Deadline::AfterSeconds(120));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string error = comm.AsyncError().ToString();
  if (s.ok() || error.find(fmt::format("rank {} does not answer", frozen)) == std::string::npos)
    return Fail(fmt::format("frozen rank {}: expected an error naming it as not answering, got {} / {}", frozen,
                            s.ToString(), error));
  std::printf("rank %d: frozen rank %d named after %.1f s\n", r, frozen, took);
  std::fflush(stdout);
  return 0;
}

// Main's last case: point to point around the ring, in a group. 0 when it passed, else Fail's.
int RingSendRecv(Communicator& comm, device::Stream& stream) {
  const int n = comm.size(), r = comm.rank();
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
  return 0;
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  // "hosts [K]": the ranks claim hosts of K ranks each (default 1; the last host may have fewer),
  // so that ranks of different hosts reach each other over a network fabric: the matrix then runs
  // through the executor's network path, the small collectives on the calling thread with their
  // first transfers inside the operation headers, and with K > 1 hier:fused's host level through
  // each host's group.
  CommOptions options;
  if (mode == "hosts" || mode == "hosts-mismatch") {
    const char* rank = std::getenv("RANK");
    const int per_host = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
    options.host_id = fmt::format("pretend-host-{}", rank != nullptr ? std::atoi(rank) / per_host : -1);
  }
  auto created = Communicator::CreateFromEnvironment(options);
  if (!created.ok()) return Fail(created.status().ToString());
  Communicator& comm = **created;
  const int n = comm.size(), r = comm.rank();
  auto stream_or = comm.device().CreateStream();
  if (!stream_or.ok()) return Fail(stream_or.status().ToString());
  device::Stream& stream = **stream_or;
  if (mode == "fused") return FusedMatrix(comm, stream);
  if (mode == "host") return HostMemory(comm, stream);
  if (mode == "host-mixed") return HostMixed(comm, stream);
  if (mode == "mismatch" || mode == "hosts-mismatch") return Mismatch(comm, stream);
  if (mode == "frozen") return Frozen(comm, stream, argc > 2 ? std::atoi(argv[2]) : 1);
  if (mode == "fused-abort" || mode == "fused-exit")
    return FusedFault(comm, stream, mode.substr(6), argc > 2 ? std::atoi(argv[2]) : 1);
  if (!mode.empty() && mode != "hosts")
    return Fail("unknown mode " + mode +
                " (hosts [K], hosts-mismatch, fused, host, mismatch, fused-abort R, fused-exit R, frozen R)");
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
      if (!algo->Supports(probe, comm.topology()).ok()) continue;
      for (DataType t : {DataType::kFloat32, DataType::kBfloat16}) {
        // Between pretend hosts also a count whose transfers fit in operation headers.
        for (uint64_t count : mode == "hosts" ? std::vector<uint64_t>{5, 10007, 40009} : std::vector<uint64_t>{10007}) {
          if (int failed = MatrixCase(comm, stream, coll, *algo, t, count); failed != 0) return failed;
          ++cases;
        }
      }
    }
  }
  // Point to point around the ring, in a group.
  if (n > 1) {
    if (int failed = RingSendRecv(comm, stream); failed != 0) return failed;
    ++cases;
  }
  std::printf("rank %d of %d: %d cases ok\n", r, n, cases);
  return 0;
}

}  // namespace
}  // namespace kizuna::test

int main(int argc, char** argv) { return kizuna::test::Main(argc, argv); }
