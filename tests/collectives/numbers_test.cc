// The numbers an AllReduce gives, bit for bit, through every algorithm that serves it:
//  - min / max store the same bits on every rank, whatever order each rank combines the values in
//    (recursive doubling's pairs reduce the same two values in opposite orders): -0 orders below
//    +0 and any NaN gives the canonical quiet NaN (runtime/device/host_reduce.h);
//  - deterministic mode's avg is the same bits whatever the algorithm, fused included, and for
//    float16 / bfloat16 the correctly rounded average (the sum divided before its one rounding:
//    Step::average in collectives/plan/plan.h), computed here in exact integer arithmetic.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/algorithms/algorithm.h"
#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

using collectives::CollectiveRequest;
using collectives::PlanOptions;

// Every algorithm that can run an AllReduce on this world (ina needs a layout: not here).
constexpr Algorithm kAllReduceAlgorithms[] = {Algorithm::kRing, Algorithm::kTree,     Algorithm::kRhd,
                                              Algorithm::kRd,   Algorithm::kPairwise, Algorithm::kFused};

// Fails unless `algo` builds an AllReduce plan of `type` on this world with these options: the
// engine would otherwise fall back to another algorithm, and the test would prove nothing about it.
::testing::AssertionResult Builds(World& w, Algorithm algo, DataType type, ReduceOp op, uint64_t count,
                                  bool deterministic) {
  const CollectiveRequest req{Collective::kAllReduce, w.size(), count, type, op, 0, false};
  PlanOptions options;
  options.deterministic = deterministic;
  auto plan = collectives::BuildPlan(algo, req, w.comm(0).topology(), options, 0);
  if (plan.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << collectives::AlgorithmName(algo) << ": " << plan.status().ToString();
}

// Runs one AllReduce (out of place) of every rank's `inputs` (raw element bytes) through `algo`;
// every rank's output bytes.
std::vector<std::vector<uint8_t>> RunAllReduce(World& w, Algorithm algo,
                                               const std::vector<std::vector<uint8_t>>& inputs, DataType type,
                                               ReduceOp op) {
  const int n = w.size();
  const size_t bytes = inputs[0].size(), count = bytes / DataTypeSize(type);
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(Alloc(w, r, bytes));
    out.push_back(Alloc(w, r, bytes));
    if (in.back() == nullptr || out.back() == nullptr) return {};
    EXPECT_TRUE(w.Upload(r, in.back()->data(), inputs[static_cast<size_t>(r)]).ok());
  }
  CallOptions options;
  options.algorithm = algo;
  for (int r = 0; r < n; ++r) {
    const Status s = w.comm(r).AllReduce(in[static_cast<size_t>(r)]->data(), out[static_cast<size_t>(r)]->data(), count,
                                         type, op, w.stream(r), options);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) return {};
  }
  const Status synced = w.SyncAll();
  EXPECT_TRUE(synced.ok()) << synced.ToString();
  std::vector<std::vector<uint8_t>> results;
  for (int r = 0; r < n; ++r) {
    auto got = w.Download<uint8_t>(r, out[static_cast<size_t>(r)]->data(), bytes);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    results.push_back(got.ok() ? *got : std::vector<uint8_t>());
  }
  return results;
}

uint64_t ElementBits(const std::vector<uint8_t>& bytes, size_t i, size_t esize) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + i * esize, esize);
  return v;
}

void SetElementBits(std::vector<uint8_t>& bytes, size_t i, size_t esize, uint64_t v) {
  std::memcpy(bytes.data() + i * esize, &v, esize);
}

// ---- min / max ----

struct FloatKind {
  DataType type;
  uint64_t sign, quiet_nan, infinity, one;
};
constexpr FloatKind kFloatKinds[] = {
    {DataType::kFloat32, 0x80000000u, 0x7fc00000u, 0x7f800000u, 0x3f800000u},
    {DataType::kFloat64, uint64_t{1} << 63, 0x7ff8000000000000u, 0x7ff0000000000000u, 0x3ff0000000000000u},
    {DataType::kFloat16, 0x8000, 0x7e00, 0x7c00, 0x3c00},
    {DataType::kBfloat16, 0x8000, 0x7fc0, 0x7f80, 0x3f80},
};

// Element i of rank r, by i % 4: zeros of either sign (both signs among the ranks), a NaN with a
// payload and sign of its own on some ranks, small numbers mixed with zeros of either sign, -0
// everywhere.
uint64_t MinMaxInput(const FloatKind& f, int r, size_t i) {
  const uint64_t h = (i * 2654435761u + static_cast<uint64_t>(r) * 40503u) >> 3;
  switch (i % 4) {
    case 0: return (r == 0 || (r != 1 && h % 2 == 0)) ? 0 : f.sign;
    case 1:
      if (r == static_cast<int>(i % 3) || h % 5 == 0) return f.quiet_nan | (r + 1) | (h % 2 == 0 ? 0 : f.sign);
      return f.one | (r % 2 == 0 ? f.sign : 0);
    case 2: return h % 3 == 0 ? (f.one | f.sign) : (h % 3 == 1 ? 0 : f.sign);
    default: return f.sign;
  }
}

// IEEE 754-2019 minimum / maximum of the ranks' elements, from the values' classes above (no
// operand order anywhere): any NaN gives the canonical quiet NaN; max prefers +0 to -0 and min
// the reverse.
uint64_t MinMaxExpected(const FloatKind& f, ReduceOp op, const std::vector<uint64_t>& v) {
  auto nan = [&](uint64_t x) { return (x & ~f.sign) > f.infinity; };
  auto value = [&](uint64_t x) {  // the values MinMaxInput makes: +-1, +-0
    if ((x & ~f.sign) == 0) return 0.0;
    return (x & f.sign) ? -1.0 : 1.0;
  };
  for (uint64_t x : v)
    if (nan(x)) return f.quiet_nan;
  uint64_t best = v[0];
  for (uint64_t x : v) {
    const double a = value(x), b = value(best);
    const bool neg_x = (x & f.sign) != 0, neg_best = (best & f.sign) != 0;
    if (op == ReduceOp::kMax ? (a > b || (a == b && neg_best && !neg_x)) : (a < b || (a == b && !neg_best && neg_x)))
      best = x;
  }
  return best;
}

// 4 ranks pair up in recursive doubling and halving-doubling with no fold; 5 fold a pair first.
class MinMaxTest : public ::testing::TestWithParam<int> {};

TEST_P(MinMaxTest, SignedZerosAndNaNsGiveEveryRankTheSameBits) {
  const int n = GetParam();
  constexpr size_t kCount = 37;
  for (uint64_t chunk : {uint64_t{0}, uint64_t{64}}) {  // whole, and steps of a few elements
    Config config = WorldConfig(n);
    if (chunk) config.chunk_bytes = chunk;
    World w(n, config);
    KZ_ASSERT_WORLD(w);
    for (const FloatKind& f : kFloatKinds) {
      const size_t esize = DataTypeSize(f.type);
      std::vector<std::vector<uint8_t>> inputs(static_cast<size_t>(n), std::vector<uint8_t>(kCount * esize));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < kCount; ++i)
          SetElementBits(inputs[static_cast<size_t>(r)], i, esize, MinMaxInput(f, r, i));
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax})
        for (Algorithm algo : kAllReduceAlgorithms) {
          SCOPED_TRACE(fmt::format("{} ranks, chunk {} bytes, {} {} via {}", n, chunk, DataTypeName(f.type),
                                   ReduceOpName(op), collectives::AlgorithmName(algo)));
          ASSERT_TRUE(Builds(w, algo, f.type, op, kCount, false));
          const auto results = RunAllReduce(w, algo, inputs, f.type, op);
          ASSERT_EQ(results.size(), static_cast<size_t>(n));
          for (size_t i = 0; i < kCount; ++i) {
            std::vector<uint64_t> element;
            for (int r = 0; r < n; ++r) element.push_back(MinMaxInput(f, r, i));
            const uint64_t want = MinMaxExpected(f, op, element);
            for (int r = 0; r < n; ++r) {
              const uint64_t got = ElementBits(results[static_cast<size_t>(r)], i, esize);
              ASSERT_EQ(got, ElementBits(results[0], i, esize)) << fmt::format(
                  "element {}: rank {} has {:#x}, rank 0 {:#x}", i, r, got, ElementBits(results[0], i, esize));
              ASSERT_EQ(got, want) << fmt::format("element {} on rank {}: {:#x}, expected {:#x}", i, r, got, want);
            }
          }
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, MinMaxTest, ::testing::Values(4, 5));

// ---- deterministic avg ----

// float16 / bfloat16 elements: precision (significand bits after the leading one) and bias.
struct HalfKind {
  DataType type;
  int precision, bias;
};
constexpr HalfKind kHalfKinds[] = {{DataType::kBfloat16, 7, 127}, {DataType::kFloat16, 10, 15}};

// Values in [0.25, 1) on the type's grid, as multiples of 2^-12 (every such float16 and bfloat16 is
// one): around the 0.505 averages where the sum's rounding to the type used to show.
uint16_t HalfInput(const HalfKind& k, std::mt19937& rng, int64_t* scaled) {
  const int64_t step = int64_t{1} << (12 - (k.precision + 2));  // the grid of [0.25, 0.5) in 2^-12 units
  for (;;) {
    const int64_t units = 1024 + static_cast<int64_t>(rng() % 3072);  // [0.25, 1) in 2^-12 units
    const int64_t grid = units < 2048 ? step : 2 * step;
    const int64_t v = units / grid * grid;
    if (v < 1024) continue;
    *scaled = v;
    // Encode v * 2^-12: v = m * 2^s with m in [2^p, 2^(p+1)).
    int s = 0;
    int64_t m = v;
    while (m >= (int64_t{2} << k.precision)) {
      m >>= 1;
      ++s;
    }
    const int exponent = s - 12 + k.precision + k.bias;
    return static_cast<uint16_t>((exponent << k.precision) | (m - (int64_t{1} << k.precision)));
  }
}

// sum * 2^-12 / n rounded to the nearest float16 / bfloat16, ties to even, in exact integer
// arithmetic (sum > 0; the quotient is a normal number of the type).
uint16_t CorrectlyRoundedAverage(const HalfKind& k, int64_t sum, int n) {
  // q = sum / (n * 2^(12 + e)), with e chosen so that 2^p <= q < 2^(p+1).
  for (int e = -k.precision - 4;; ++e) {
    const int shift = 12 + e;  // may be negative
    const __int128 num = shift >= 0 ? static_cast<__int128>(sum) : static_cast<__int128>(sum) << -shift;
    const __int128 den = shift >= 0 ? static_cast<__int128>(n) << shift : static_cast<__int128>(n);
    __int128 q = num / den;
    const __int128 rem = num % den;
    if (q >= (__int128{2} << k.precision)) continue;  // e too small
    if (q < (__int128{1} << k.precision)) return 0;   // not reached for these inputs
    if (2 * rem > den || (2 * rem == den && (q & 1) != 0)) ++q;
    int exponent = e + k.precision + k.bias;
    if (q == (__int128{2} << k.precision)) {  // rounded up into the next binade
      q >>= 1;
      ++exponent;
    }
    return static_cast<uint16_t>((exponent << k.precision) | static_cast<int>(q - (__int128{1} << k.precision)));
  }
}

TEST(DeterministicAvgTest, HalfTypesAreCorrectlyRoundedAndTheSameForEveryAlgorithm) {
  constexpr int kRanks = 5;
  constexpr size_t kCount = 49;
  for (uint64_t chunk : {uint64_t{0}, uint64_t{64}}) {
    Config config = WorldConfig(kRanks);
    config.deterministic = true;
    if (chunk) config.chunk_bytes = chunk;
    World w(kRanks, config);
    KZ_ASSERT_WORLD(w);
    for (const HalfKind& k : kHalfKinds) {
      std::mt19937 rng(2025);
      std::vector<std::vector<uint8_t>> inputs(kRanks, std::vector<uint8_t>(kCount * 2));
      std::vector<int64_t> sums(kCount, 0);
      for (int r = 0; r < kRanks; ++r)
        for (size_t i = 0; i < kCount; ++i) {
          int64_t scaled = 0;
          SetElementBits(inputs[static_cast<size_t>(r)], i, 2, HalfInput(k, rng, &scaled));
          sums[i] += scaled;
        }
      std::vector<uint8_t> want(kCount * 2);
      for (size_t i = 0; i < kCount; ++i) SetElementBits(want, i, 2, CorrectlyRoundedAverage(k, sums[i], kRanks));
      for (Algorithm algo : kAllReduceAlgorithms) {
        SCOPED_TRACE(fmt::format("{} avg via {}, chunk {} bytes", DataTypeName(k.type),
                                 collectives::AlgorithmName(algo), chunk));
        ASSERT_TRUE(Builds(w, algo, k.type, ReduceOp::kAvg, kCount, true));
        const auto results = RunAllReduce(w, algo, inputs, k.type, ReduceOp::kAvg);
        ASSERT_EQ(results.size(), static_cast<size_t>(kRanks));
        for (int r = 0; r < kRanks; ++r) {
          size_t wrong = 0, first = kCount;
          for (size_t i = 0; i < kCount; ++i)
            if (ElementBits(results[static_cast<size_t>(r)], i, 2) != ElementBits(want, i, 2) && wrong++ == 0)
              first = i;
          EXPECT_EQ(wrong, 0u) << fmt::format(
              "rank {}: {} of {} elements differ from the correctly rounded average; first [{}] = {:#06x}, expected "
              "{:#06x}",
              r, wrong, kCount, first, first < kCount ? ElementBits(results[static_cast<size_t>(r)], first, 2) : 0,
              first < kCount ? ElementBits(want, first, 2) : 0);
        }
      }
    }
  }
}

// The other types' avg, the same bits through every algorithm: integers truncate the sum toward
// zero, float32 / float64 divide the sum (in rank order, in the type) once.
TEST(DeterministicAvgTest, IntegerAndWideFloatTypesAgreeAcrossAlgorithms) {
  constexpr int kRanks = 5;
  constexpr size_t kCount = 49;
  Config config = WorldConfig(kRanks);
  config.deterministic = true;
  World w(kRanks, config);
  KZ_ASSERT_WORLD(w);
  std::mt19937 rng(11);
  for (DataType type : {DataType::kInt8, DataType::kInt32, DataType::kUint32, DataType::kInt64, DataType::kFloat32,
                        DataType::kFloat64}) {
    const size_t esize = DataTypeSize(type);
    std::vector<std::vector<uint8_t>> inputs(kRanks, std::vector<uint8_t>(kCount * esize));
    std::vector<uint8_t> want(kCount * esize);
    for (size_t i = 0; i < kCount; ++i) {
      int64_t isum = 0;
      float fsum = 0;
      double dsum = 0;
      for (int r = 0; r < kRanks; ++r) {
        // Integers in [-25, 25] (unsigned: [0, 50]), so that negative sums truncate toward zero;
        // floats with bits below the sum's precision.
        const int64_t iv = static_cast<int64_t>(rng() % 51) - (type == DataType::kUint32 ? 0 : 25);
        const double fv = std::ldexp(static_cast<double>(rng() % (1u << 30)), -30) - 0.5;
        auto& in = inputs[static_cast<size_t>(r)];
        switch (type) {
          case DataType::kFloat32: {
            const auto x = static_cast<float>(fv);
            std::memcpy(in.data() + i * 4, &x, 4);
            fsum = r == 0 ? x : fsum + x;
            break;
          }
          case DataType::kFloat64:
            std::memcpy(in.data() + i * 8, &fv, 8);
            dsum = r == 0 ? fv : dsum + fv;
            break;
          default:
            SetElementBits(in, i, esize, static_cast<uint64_t>(iv));
            isum += iv;
            break;
        }
      }
      switch (type) {
        case DataType::kFloat32: {
          const float avg = fsum / static_cast<float>(kRanks);
          std::memcpy(want.data() + i * 4, &avg, 4);
          break;
        }
        case DataType::kFloat64: {
          const double avg = dsum / kRanks;
          std::memcpy(want.data() + i * 8, &avg, 8);
          break;
        }
        default:
          SetElementBits(want, i, esize, static_cast<uint64_t>(isum / kRanks));  // C++ truncates toward zero
          break;
      }
    }
    for (Algorithm algo : kAllReduceAlgorithms) {
      SCOPED_TRACE(fmt::format("{} avg via {}", DataTypeName(type), collectives::AlgorithmName(algo)));
      ASSERT_TRUE(Builds(w, algo, type, ReduceOp::kAvg, kCount, true));
      const auto results = RunAllReduce(w, algo, inputs, type, ReduceOp::kAvg);
      ASSERT_EQ(results.size(), static_cast<size_t>(kRanks));
      for (int r = 0; r < kRanks; ++r) EXPECT_EQ(results[static_cast<size_t>(r)], want) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace kizuna::test
