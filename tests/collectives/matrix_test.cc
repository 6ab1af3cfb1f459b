// The collective engine's correctness matrix, in one process (ranks as communicators over
// emulated devices, issued from one thread since calls return at once): every collective x
// algorithm x dtype somewhere, rank counts 1, 2, 3, 4, 5, 7, 8, counts 0, 1, 7, 1,000,003 and one
// of 16 MiB, in place and out of place, against results computed in world.h; again on emulated
// devices whose memory the CPU cannot dereference (Config::emu_opaque), rank counts 2, 3, 4, 8.
//
// On a machine with other devices: KIZUNA_TEST_BACKEND=cuda ./matrix_test runs every case on that
// backend's devices (world.h), skipping with the registry's reason where it is unavailable.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using collectives::CollectiveRequest;

struct Case {
  Collective coll = Collective::kAllReduce;
  std::optional<Algorithm> algo;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;
  bool in_place = false;
  int root = 0;

  std::string ToString() const {
    return fmt::format("{} algo={} {} {} count={} {} root={}", collectives::CollectiveName(coll),
                       algo ? collectives::AlgorithmName(*algo) : "auto", DataTypeName(dtype), ReduceOpName(op), count,
                       in_place ? "in-place" : "out-of-place", root);
  }
};

struct RankBuffers {
  std::unique_ptr<device::Buffer> a, b;  // a: input (or the shared in-place buffer), b: output
  const void* input = nullptr;
  void* output = nullptr;
  uint64_t out_count = 0;            // elements of `output` to read back
  std::vector<uint8_t> downloaded;   // `output` after the call, where the CPU cannot read it in place
  const uint8_t* result = nullptr;   // `output` as the host reads it: in place, or `downloaded`
};

// Checks every output element; stops at the first few wrong ones.
testing::AssertionResult Check(World& w, const Case& c, std::vector<RankBuffers>& bufs) {
  const int n = w.size();
  const uint64_t count = c.count;
  int wrong = 0;
  std::string first;
  auto expect = [&](int r, uint64_t j, double want, ReduceOp op) {
    const double got = LoadValue(bufs[static_cast<size_t>(r)].result, j, c.dtype);
    if (!Matches(got, want, c.dtype, op)) {
      if (wrong++ == 0) first = fmt::format("rank {} element {}: got {}, expected {}", r, j, got, want);
    }
  };
  for (int r = 0; r < n && wrong < 5; ++r) {
    switch (c.coll) {
      case Collective::kAllReduce:
        for (uint64_t j = 0; j < count; ++j) expect(r, j, Reduced(c.op, n, j, c.dtype), c.op);
        break;
      case Collective::kReduceScatter:
        for (uint64_t j = 0; j < count; ++j) expect(r, j, Reduced(c.op, n, r * count + j, c.dtype), c.op);
        break;
      case Collective::kAllGather:
        for (uint64_t j = 0; j < count * n; ++j)
          expect(r, j, static_cast<double>(InputValue(ReduceOp::kSum, static_cast<int>(j / count), j % count)),
                 ReduceOp::kSum);
        break;
      case Collective::kBroadcast:
        for (uint64_t j = 0; j < count; ++j)
          expect(r, j, static_cast<double>(InputValue(ReduceOp::kSum, c.root, j)), ReduceOp::kSum);
        break;
      case Collective::kReduce:
        if (r == c.root)
          for (uint64_t j = 0; j < count; ++j) expect(r, j, Reduced(c.op, n, j, c.dtype), c.op);
        break;
      case Collective::kAllToAll:
        for (uint64_t j = 0; j < count * n; ++j)
          expect(r, j,
                 static_cast<double>(InputValue(ReduceOp::kSum, static_cast<int>(j / count), r * count + j % count)),
                 ReduceOp::kSum);
        break;
      case Collective::kRecv:
        for (uint64_t j = 0; j < count; ++j)
          expect(r, j, static_cast<double>(InputValue(ReduceOp::kSum, (r + n - 1) % n, j)), ReduceOp::kSum);
        break;
      default:
        break;
    }
  }
  if (wrong > 0) return testing::AssertionFailure() << c.ToString() << " on " << n << " ranks: " << first;
  return testing::AssertionSuccess();
}

// RunCase's first step on rank r: allocates its buffers and writes their initial contents, an
// input of `in_count` elements and an output of `out_count` (in place: one buffer for both).
testing::AssertionResult PrepareRank(World& w, const Case& c, int r, uint64_t in_count, uint64_t out_count,
                                     RankBuffers& b) {
  const size_t elem = DataTypeSize(c.dtype);
  const ReduceOp value_op = collectives::IsReduction(c.coll) ? c.op : ReduceOp::kSum;
  auto alloc = [&](uint64_t elems) -> std::unique_ptr<device::Buffer> {
    auto buf = w.Allocate(r, std::max<uint64_t>(elems, 1) * elem);
    EXPECT_TRUE(buf.ok()) << buf.status().ToString();
    return buf.ok() ? std::move(*buf) : nullptr;
  };
  // Initial contents: 99 where the call must write (visible if untouched), the input values
  // where it reads; input element i of rank r sits at input + i. Written in place where the CPU
  // may address the device's memory, else into a host image that is uploaded.
  const bool direct = w.host_accessible(r);
  auto fill99 = [&](uint8_t* bytes, uint64_t elems) {
    // One element stored, then copied over the rest in doubling blocks (16 MiB cases stay fast).
    StoreValue(bytes, 0, c.dtype, 99);
    for (size_t done = elem, total = elems * elem; done < total;) {
      const size_t block = std::min(done, total - done);
      std::memcpy(bytes + done, bytes, block);
      done += block;
    }
  };
  auto put_input = [&](uint8_t* bytes, uint64_t offset) {
    for (uint64_t i = 0; i < in_count; ++i)
      StoreValue(bytes, offset + i, c.dtype, static_cast<double>(InputValue(value_op, r, i)));
  };
  // Where the host writes `buf`'s contents, and how they reach it.
  std::vector<uint8_t> image_a, image_b;
  auto target = [&](device::Buffer& buf, std::vector<uint8_t>& image) -> uint8_t* {
    if (direct) return static_cast<uint8_t*>(buf.data());
    image.resize(buf.size());
    return image.data();
  };
  auto commit = [&](device::Buffer& buf, const std::vector<uint8_t>& image) -> Status {
    return direct ? Status::Ok() : w.Upload(r, buf.data(), image);
  };
  b.out_count = out_count;
  Status up;
  if (c.in_place) {
    const uint64_t elems = std::max(in_count, out_count);
    b.a = alloc(elems);
    if (!b.a) return testing::AssertionFailure() << "allocation failed";
    uint64_t input_offset = 0;  // elements into `a` where the input starts
    b.output = b.a->data();
    if (c.coll == Collective::kAllGather) input_offset = static_cast<uint64_t>(r) * c.count;
    b.input = static_cast<uint8_t*>(b.a->data()) + input_offset * elem;
    if (c.coll == Collective::kReduceScatter) {
      b.output = static_cast<uint8_t*>(b.a->data()) + static_cast<uint64_t>(r) * c.count * elem;
      b.out_count = c.count;
    }
    uint8_t* a = target(*b.a, image_a);
    fill99(a, std::max<uint64_t>(elems, 1));
    put_input(a, input_offset);
    up = commit(*b.a, image_a);
  } else {
    b.a = alloc(in_count);
    b.b = alloc(out_count);
    if (!b.a || !b.b) return testing::AssertionFailure() << "allocation failed";
    b.input = b.a->data();
    b.output = b.b->data();
    put_input(target(*b.a, image_a), 0);
    fill99(target(*b.b, image_b), out_count);
    up = commit(*b.a, image_a);
    if (up.ok()) up = commit(*b.b, image_b);
  }
  if (!up.ok()) return testing::AssertionFailure() << "rank " << r << ": uploading the inputs: " << up.ToString();
  return testing::AssertionSuccess();
}

// RunCase's second step: the case's call on rank r's communicator and stream.
testing::AssertionResult IssueCall(World& w, const Case& c, int r, RankBuffers& b, const CallOptions& options) {
  const int n = w.size();
  Communicator& comm = w.comm(r);
  device::Stream& s = w.stream(r);
  Status st;
  switch (c.coll) {
    case Collective::kAllReduce:
      st = comm.AllReduce(b.input, b.output, c.count, c.dtype, c.op, s, options);
      break;
    case Collective::kReduceScatter:
      st = comm.ReduceScatter(b.input, b.output, c.count, c.dtype, c.op, s, options);
      break;
    case Collective::kAllGather:
      st = comm.AllGather(b.input, b.output, c.count, c.dtype, s, options);
      break;
    case Collective::kBroadcast:
      st = comm.Broadcast(b.input, b.output, c.count, c.dtype, c.root, s, options);
      break;
    case Collective::kReduce:
      st = comm.Reduce(b.input, b.output, c.count, c.dtype, c.op, c.root, s, options);
      break;
    case Collective::kAllToAll:
      st = comm.AllToAll(b.input, b.output, c.count, c.dtype, s, options);
      break;
    case Collective::kBarrier:
      st = comm.Barrier(s);
      break;
    case Collective::kRecv:
      EXPECT_TRUE(Communicator::GroupStart().ok());
      st = comm.Send(b.input, c.count, c.dtype, (r + 1) % n, s);
      if (st.ok()) st = comm.Recv(b.output, c.count, c.dtype, (r + n - 1) % n, s);
      EXPECT_TRUE(Communicator::GroupEnd().ok());
      break;
    default:
      return testing::AssertionFailure() << "case not handled";
  }
  if (!st.ok()) return testing::AssertionFailure() << c.ToString() << ": rank " << r << ": " << st.ToString();
  return testing::AssertionSuccess();
}

// Runs one case on every rank of `w` and checks it. Collective::kRecv stands for a ring of
// Send/Recv pairs in a group (rank r sends to r+1, receives from r-1). Where the CPU cannot
// address a device's memory, inputs go up and outputs come back through World::Upload /
// Download; elsewhere the host writes and reads the buffers in place.
testing::AssertionResult RunCase(World& w, const Case& c) {
  const int n = w.size();
  const size_t elem = DataTypeSize(c.dtype);
  CollectiveRequest req;
  req.collective = c.coll == Collective::kRecv ? Collective::kSend : c.coll;
  req.nranks = n;
  req.count = c.count;
  const uint64_t in_count = c.coll == Collective::kRecv ? c.count : req.input_count();
  const uint64_t out_count = c.coll == Collective::kRecv ? c.count : std::max<uint64_t>(req.output_count(), 1);
  std::vector<RankBuffers> bufs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    testing::AssertionResult ready = PrepareRank(w, c, r, in_count, out_count, bufs[static_cast<size_t>(r)]);
    if (!ready) return ready;
  }
  CallOptions options;
  options.algorithm = c.algo;
  for (int r = 0; r < n; ++r) {
    testing::AssertionResult issued = IssueCall(w, c, r, bufs[static_cast<size_t>(r)], options);
    if (!issued) return issued;
  }
  if (Status s = w.SyncAll(); !s.ok())
    return testing::AssertionFailure() << c.ToString() << " on " << n << " ranks: " << s.ToString();
  for (int r = 0; r < n; ++r) {
    RankBuffers& b = bufs[static_cast<size_t>(r)];
    if (w.host_accessible(r)) {
      b.result = static_cast<const uint8_t*>(b.output);
      continue;
    }
    auto got = w.Download<uint8_t>(r, b.output, b.out_count * elem);
    if (!got.ok())
      return testing::AssertionFailure() << "rank " << r << ": downloading the output: " << got.status().ToString();
    b.downloaded = std::move(*got);
    b.result = b.downloaded.data();
  }
  return Check(w, c, bufs);
}

constexpr Collective kCollectives[] = {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                                       Collective::kBroadcast, Collective::kReduce,        Collective::kAllToAll,
                                       Collective::kBarrier};

// The algorithms that serve `coll` on this world (the matrix runs each of them by name).
std::vector<Algorithm> Serving(World& w, Collective coll) {
  std::vector<Algorithm> out;
  CollectiveRequest r;
  r.collective = coll;
  r.nranks = w.size();
  r.count = 7;
  for (const collectives::AlgorithmImpl* a : collectives::AllAlgorithms())
    if (a->Supports(r, w.comm(0).topology()).ok()) out.push_back(a->id());
  return out;
}

class Matrix : public testing::TestWithParam<int> {};

// Every served (collective, algorithm) pair x every dtype, with small counts, ops and placements
// rotating through the cells.
TEST_P(Matrix, EveryCollectiveAlgorithmAndType) {
  const int n = GetParam();
  World w(n, WorldConfig(8));
  KZ_ASSERT_WORLD(w);
  const uint64_t counts[] = {0, 1, 7, 1003};
  int k = n;  // rotation start differs per rank count, so cells see different combinations
  for (Collective coll : kCollectives) {
    for (Algorithm algo : Serving(w, coll)) {
      for (DataType t : AllDataTypes()) {
        Case c;
        c.coll = coll;
        c.algo = algo;
        c.dtype = t;
        c.op = AllReduceOps()[static_cast<size_t>(k % kNumReduceOps)];
        c.count = counts[static_cast<size_t>(k % 4)];
        c.in_place = (k / 4) % 2 == 1 && coll != Collective::kAllToAll;
        c.root = k % n;
        ++k;
        ASSERT_TRUE(RunCase(w, c));
      }
    }
  }
  // Point to point: a ring of Send/Recv in a group.
  if (n > 1) {
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1003}}) {
      Case c;
      c.coll = Collective::kRecv;
      c.count = count;
      ASSERT_TRUE(RunCase(w, c));
    }
  }
}

// 1,000,003 elements through every served algorithm of the reductions and gathers (float32 and one
// other type), so that multi-chunk, multi-channel paths run with a count no rank count divides.
class MatrixLarge : public testing::TestWithParam<int> {};

TEST_P(MatrixLarge, LargeCounts) {
  const int n = GetParam();
  World w(n, WorldConfig(8));
  KZ_ASSERT_WORLD(w);
  int k = 0;
  for (Collective coll : kCollectives) {
    if (coll == Collective::kBarrier) continue;
    for (Algorithm algo : Serving(w, coll)) {
      Case c;
      c.coll = coll;
      c.algo = algo;
      c.dtype = (k % 2) ? DataType::kBfloat16 : DataType::kFloat32;
      c.op = (k % 3) ? ReduceOp::kSum : ReduceOp::kMax;
      c.count = coll == Collective::kAllToAll || coll == Collective::kAllGather || coll == Collective::kReduceScatter
                    ? 1000003 / static_cast<uint64_t>(n)
                    : 1000003;
      c.in_place = k % 2 == 0 && coll != Collective::kAllToAll;
      c.root = n - 1;
      ++k;
      ASSERT_TRUE(RunCase(w, c));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Matrix, testing::Values(1, 2, 3, 4, 5, 7, 8),
                         [](const testing::TestParamInfo<int>& p) { return fmt::format("n{}", p.param); });
INSTANTIATE_TEST_SUITE_P(Ranks, MatrixLarge, testing::Values(3, 8),
                         [](const testing::TestParamInfo<int>& p) { return fmt::format("n{}", p.param); });

// One float32 message of `bytes` per collective (the engine's choice of algorithm); AllReduce in
// place when `in_place_allreduce`.
void EveryCollectiveOnce(World& w, uint64_t bytes, bool in_place_allreduce) {
  for (Collective coll : kCollectives) {
    if (coll == Collective::kBarrier) continue;
    Case c;
    c.coll = coll;
    c.dtype = DataType::kFloat32;
    c.count = bytes / 4;
    c.in_place = in_place_allreduce && coll == Collective::kAllReduce;
    ASSERT_TRUE(RunCase(w, c));
  }
}

// 16 MiB per collective, 4 ranks.
TEST(MatrixSixteenMiB, EveryCollective) {
  World w(4, WorldConfig(4));
  KZ_ASSERT_WORLD(w);
  EveryCollectiveOnce(w, 16u << 20, false);
}

// The shape that the GPU machine runs (KIZUNA_TEST_BACKEND=cuda there: 4 ranks on one GPU), 4 MiB
// per collective: 4 ranks on one emulated device whose memory the CPU cannot reach and whose frees
// wait for every stream of the device, as cudaFree does (Config::emu_sync_free). An engine that
// frees memory during an operation, while a caller's stream is held, fails here instead of
// hanging a GPU.
TEST(MatrixGpuShape, FourRanksOnOneDeviceThatSynchronizesAtFrees) {
  Config config = WorldConfig(1);
  config.emu_opaque = true;
  config.emu_sync_free = true;
  World w(4, config, /*max_devices=*/1);
  KZ_ASSERT_WORLD(w);
  EveryCollectiveOnce(w, 4u << 20, true);
}

// Tiny chunks (KIZUNA_CHUNK_BYTES=64): every step is a chunk, so the pipelined multi-chunk paths
// run on small data, with 5 ranks over 2 devices (several ranks per device).
TEST(MatrixChunks, TinyChunksSharedDevices) {
  Config config = WorldConfig(2);
  config.chunk_bytes = 64;
  World w(5, config, /*max_devices=*/2);
  KZ_ASSERT_WORLD(w);
  int k = 0;
  for (Collective coll : kCollectives) {
    for (Algorithm algo : Serving(w, coll)) {
      Case c;
      c.coll = coll;
      c.algo = algo;
      c.dtype = AllDataTypes()[static_cast<size_t>(k % kNumDataTypes)];
      c.op = AllReduceOps()[static_cast<size_t>(k % kNumReduceOps)];
      c.count = 301;
      c.in_place = k % 2 == 1 && coll != Collective::kAllToAll;
      c.root = k % 5;
      ++k;
      ASSERT_TRUE(RunCase(w, c));
    }
  }
}

// ---- Opaque memory: emulated devices whose memory the CPU cannot dereference, as GPU memory ----

Config OpaqueConfig(int devices) {
  Config c = WorldConfig(devices);
  c.emu_opaque = true;
  return c;
}

// The staging path the transport reports, against what is true of the emulated device over
// direct links: its memory is a sealed memfd, which directconnect maps whether or not the CPU may
// dereference the device's own addresses, so staging is registered by fd either way. Other
// backends (KIZUNA_TEST_BACKEND) have their own truth, and are only shown.
void ExpectStagingPath(World& w) {
  for (int r = 0; r < w.size(); ++r) {
    const std::string d = w.comm(r).DescribeConnections();
    if (w.device(r).properties().backend != "host_emulated") {
      if (r == 0) std::printf("rank 0 connections: %s\n", d.c_str());
      continue;
    }
    EXPECT_NE(d.find("staging by fd (device export)"), std::string::npos)
        << "rank " << r << " (host accessible: " << w.host_accessible(r) << "): " << d;
  }
}

// Every served (collective, algorithm) pair on opaque memory, twice each with rotating dtypes,
// ops, counts (0, 1, 7, 1003) and placements; AllReduce sum in every dtype; Send/Recv.
class MatrixOpaque : public testing::TestWithParam<int> {};

TEST_P(MatrixOpaque, EveryCollectiveAndAlgorithm) {
  const int n = GetParam();
  World w(n, OpaqueConfig(8));
  KZ_ASSERT_WORLD(w);
  ExpectStagingPath(w);
  const uint64_t counts[] = {0, 1, 7, 1003};
  int k = n;
  const std::vector<Algorithm> allreduce = Serving(w, Collective::kAllReduce);
  for (DataType t : AllDataTypes()) {
    Case c;
    c.algo = allreduce[static_cast<size_t>(k) % allreduce.size()];
    c.dtype = t;
    c.count = counts[static_cast<size_t>(k % 3) + 1];  // 1, 7 or 1003: every dtype computes something
    c.in_place = k % 2 == 1;
    ++k;
    ASSERT_TRUE(RunCase(w, c));
  }
  constexpr DataType kTypes[] = {DataType::kFloat32, DataType::kBfloat16, DataType::kInt32,
                                 DataType::kFloat16, DataType::kUint8,    DataType::kFloat64};
  for (Collective coll : kCollectives) {
    for (Algorithm algo : Serving(w, coll)) {
      for (int rep = 0; rep < 2; ++rep) {
        Case c;
        c.coll = coll;
        c.algo = algo;
        c.dtype = kTypes[static_cast<size_t>(k) % std::size(kTypes)];
        c.op = AllReduceOps()[static_cast<size_t>(k % kNumReduceOps)];
        c.count = counts[static_cast<size_t>(k % 4)];
        c.in_place = (k / 4) % 2 == 1 && coll != Collective::kAllToAll;
        c.root = k % n;
        ++k;
        ASSERT_TRUE(RunCase(w, c));
      }
    }
  }
  for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{1003}}) {
    Case c;
    c.coll = Collective::kRecv;
    c.count = count;
    ASSERT_TRUE(RunCase(w, c));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, MatrixOpaque, testing::Values(2, 3, 4, 8),
                         [](const testing::TestParamInfo<int>& p) { return fmt::format("n{}", p.param); });

// 1,000,003 elements on opaque memory: multi-chunk, two channels, a count no rank count divides.
TEST(MatrixOpaqueLarge, AllReduceOfAMillionElements) {
  World w(4, OpaqueConfig(4));
  KZ_ASSERT_WORLD(w);
  Case c;
  c.dtype = DataType::kFloat32;
  c.count = 1000003;
  c.in_place = true;
  ASSERT_TRUE(RunCase(w, c));
}

}  // namespace
}  // namespace kizuna::test
