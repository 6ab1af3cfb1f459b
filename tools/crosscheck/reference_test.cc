// The cross-check's own reference: hand-worked values, every encoding, results of other
// reduction orders (accepted) and results one step off (refused where the check is exact), and
// cases as a function of (seed, index).
#include "tools/crosscheck/reference.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tools/crosscheck/cases.h"
#include "tools/crosscheck/rng.h"

namespace kizuna::crosscheck {
namespace {

std::vector<uint8_t> Encode(DataType t, const std::vector<long double>& values) {
  const size_t elem = DataTypeSize(t);
  std::vector<uint8_t> out(values.size() * elem);
  for (size_t i = 0; i < values.size(); ++i) {
    if (IsFloatingPoint(t)) {
      EXPECT_TRUE(EncodeFloat(values[i], t, out.data() + i * elem)) << static_cast<double>(values[i]);
    } else {
      const auto v = static_cast<uint64_t>(static_cast<int64_t>(values[i]));
      for (size_t b = 0; b < elem; ++b) out[i * elem + b] = static_cast<uint8_t>(v >> (8 * b));
    }
  }
  return out;
}

// Whether the reduction of `inputs` (one element per rank) accepts `got`.
bool Accepts(DataType t, ReduceOp op, const std::vector<long double>& inputs, long double got,
             std::string* why = nullptr) {
  const std::vector<uint8_t> in = Encode(t, inputs);
  const std::vector<uint8_t> out = Encode(t, {got});
  std::vector<const uint8_t*> ptrs;
  for (size_t q = 0; q < inputs.size(); ++q) ptrs.push_back(in.data() + q * DataTypeSize(t));
  std::string ignored;
  return CheckReduced(t, op, ptrs, out.data(), why != nullptr ? why : &ignored);
}

TEST(Reference, IntegersWrapAndAvgTruncatesTheWrappedSum) {
  EXPECT_TRUE(Accepts(DataType::kInt8, ReduceOp::kSum, {100, 100}, -56));
  EXPECT_FALSE(Accepts(DataType::kInt8, ReduceOp::kSum, {100, 100}, 127));
  EXPECT_TRUE(Accepts(DataType::kUint8, ReduceOp::kSum, {200, 100}, 44));
  EXPECT_TRUE(Accepts(DataType::kInt8, ReduceOp::kAvg, {100, 100}, -28));       // -56 / 2
  EXPECT_TRUE(Accepts(DataType::kInt32, ReduceOp::kAvg, {-7, 0}, -3));          // toward zero
  EXPECT_TRUE(Accepts(DataType::kUint8, ReduceOp::kAvg, {255, 255, 255}, 84));  // 765 mod 256 = 253; / 3 = 84
  std::string why;
  EXPECT_FALSE(Accepts(DataType::kUint8, ReduceOp::kAvg, {255, 255, 255}, 255, &why));
  EXPECT_EQ(why, "want 84");
  EXPECT_TRUE(Accepts(DataType::kInt32, ReduceOp::kProd, {65536, 65536}, 0));
  EXPECT_TRUE(Accepts(DataType::kInt8, ReduceOp::kMin, {-56, 100}, -56));
  EXPECT_TRUE(Accepts(DataType::kUint8, ReduceOp::kMin, {200, 100}, 100));
  EXPECT_TRUE(Accepts(DataType::kInt64, ReduceOp::kMax, {-1, -9}, -1));
}

TEST(Reference, ExactFloatSumsAreExactToTheBit) {
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kSum, {1, 2, -0.5}, 2.5));
  EXPECT_FALSE(Accepts(DataType::kFloat16, ReduceOp::kSum, {1, 2, -0.5}, 2.5L + 0x1p-9L));
  // Signed zeros: -0 only when every input is -0.
  EXPECT_TRUE(Accepts(DataType::kFloat32, ReduceOp::kSum, {-0.0L, -0.0L}, -0.0L));
  EXPECT_FALSE(Accepts(DataType::kFloat32, ReduceOp::kSum, {-0.0L, -0.0L}, 0.0L));
  EXPECT_TRUE(Accepts(DataType::kFloat32, ReduceOp::kSum, {-0.0L, 0.0L}, 0.0L));
  EXPECT_FALSE(Accepts(DataType::kFloat32, ReduceOp::kSum, {1, -1}, -0.0L));
  EXPECT_TRUE(Accepts(DataType::kBfloat16, ReduceOp::kMin, {0.0L, -0.0L}, -0.0L));
  EXPECT_FALSE(Accepts(DataType::kBfloat16, ReduceOp::kMin, {0.0L, -0.0L}, 0.0L));
  EXPECT_TRUE(Accepts(DataType::kFloat64, ReduceOp::kMax, {-0.0L, 0.0L}, 0.0L));
  EXPECT_FALSE(Accepts(DataType::kFloat64, ReduceOp::kMax, {-0.0L, 0.0L}, -0.0L));
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kProd, {1.5, -1.5}, -2.25));
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kProd, {0.0L, -3}, -0.0L));
  EXPECT_FALSE(Accepts(DataType::kFloat16, ReduceOp::kProd, {0.0L, -3}, 0.0L));
}

TEST(Reference, InexactSumsWithinTheBoundOfAnyOrder) {
  // 1 + 2^-11 is not a float16: either neighbour may come out of some order. The bound,
  // eps * sum|x| + ulp / 2 = 3 * 2^-11 here, takes one more step up, not two.
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kSum, {1, 0x1p-11L}, 1));
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kSum, {1, 0x1p-11L}, 1 + 0x1p-10L));
  EXPECT_FALSE(Accepts(DataType::kFloat16, ReduceOp::kSum, {1, 0x1p-11L}, 1 + 0x1p-8L));
  EXPECT_FALSE(Accepts(DataType::kFloat16, ReduceOp::kSum, {1, 0x1p-11L}, 1 - 0x1p-9L));
}

TEST(Reference, AvgIsTheNearestValueWhenTheSumIsExact) {
  const long double third = 4.0L / 3;
  const long double nearest = RoundToType(third, DataType::kFloat32);
  const long double ulp = UlpOf(nearest, DataType::kFloat32);
  EXPECT_TRUE(Accepts(DataType::kFloat32, ReduceOp::kAvg, {1, 1, 2}, nearest));
  EXPECT_FALSE(Accepts(DataType::kFloat32, ReduceOp::kAvg, {1, 1, 2}, nearest + ulp));
  EXPECT_FALSE(Accepts(DataType::kFloat32, ReduceOp::kAvg, {1, 1, 2}, nearest - ulp));
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kAvg, {1, 2}, 1.5));
  EXPECT_TRUE(Accepts(DataType::kFloat16, ReduceOp::kAvg, {-0.0L, -0.0L}, -0.0L));
}

TEST(Reference, NanInNanOut) {
  const long double nan = std::nanl("");
  for (ReduceOp op : AllReduceOps()) {
    EXPECT_TRUE(Accepts(DataType::kFloat32, op, {1, nan}, nan)) << ReduceOpName(op);
    EXPECT_FALSE(Accepts(DataType::kFloat32, op, {1, nan}, 1)) << ReduceOpName(op);
    EXPECT_FALSE(Accepts(DataType::kFloat32, op, {1, 2}, nan)) << ReduceOpName(op);
  }
}

TEST(Reference, EveryHalfAndBfloat16EncodingRoundTrips) {
  for (DataType t : {DataType::kFloat16, DataType::kBfloat16}) {
    for (uint32_t bits = 0; bits < 65536; ++bits) {
      const uint8_t in[2] = {static_cast<uint8_t>(bits), static_cast<uint8_t>(bits >> 8)};
      const long double v = DecodeFloat(in, t);
      if (std::isnan(v)) continue;
      uint8_t out[2] = {0, 0};
      ASSERT_TRUE(EncodeFloat(v, t, out)) << DataTypeName(t) << " " << bits;
      ASSERT_EQ(out[0] | (out[1] << 8), static_cast<int>(bits)) << DataTypeName(t);
    }
  }
  EXPECT_EQ(RoundToType(2049, DataType::kFloat16), 2048);  // ties to even
  EXPECT_EQ(RoundToType(2051, DataType::kFloat16), 2052);
  EXPECT_TRUE(std::isinf(RoundToType(65520, DataType::kFloat16)));
  EXPECT_EQ(RoundToType(65519, DataType::kFloat16), 65504);
  EXPECT_EQ(RoundToType(0x1p-25L, DataType::kFloat16), 0);  // half the smallest subnormal: even
  EXPECT_EQ(RoundToType(0x1.8p-25L, DataType::kFloat16), 0x1p-24L);
}

// A reduction in the reverse rank order, rounding to the type after every step, as an algorithm
// that stores each partial result may: the reference must accept it, for every type, op and kind
// of input. Where the check is exact, the next value of the type must be refused.
TEST(Reference, AcceptsOtherOrdersAndRefusesNeighbours) {
  Rng rng(7);
  int exact_refusals = 0;
  for (DataType t : AllDataTypes()) {
    if (!IsFloatingPoint(t)) continue;  // integers: IntegerResultsOffByOneAreRefused
    const size_t elem = DataTypeSize(t);
    for (ReduceOp op : AllReduceOps()) {
      for (int k = 0; k < kNumValueKinds; ++k) {
        for (int trial = 0; trial < 40; ++trial) {
          const int n = static_cast<int>(rng.Range(2, 8));
          const InputSpec spec{rng.Next(), t, op, static_cast<ValueKind>(k), false};
          std::vector<uint8_t> in(static_cast<size_t>(n) * elem);
          for (int q = 0; q < n; ++q) InputElement(spec, q, 0, in.data() + static_cast<size_t>(q) * elem);
          std::vector<const uint8_t*> ptrs;
          for (int q = 0; q < n; ++q) ptrs.push_back(in.data() + static_cast<size_t>(q) * elem);
          std::vector<uint8_t> got(elem);
          long double acc = DecodeFloat(ptrs[static_cast<size_t>(n - 1)], t);
          for (int q = n - 2; q >= 0; --q) {
            const long double v = DecodeFloat(ptrs[static_cast<size_t>(q)], t);
            switch (op) {
              case ReduceOp::kSum:
              case ReduceOp::kAvg: acc = RoundToType(acc + v, t); break;
              case ReduceOp::kProd: acc = RoundToType(acc * v, t); break;
              case ReduceOp::kMin:
                if (v < acc || (v == acc && std::signbit(v))) acc = v;
                break;
              case ReduceOp::kMax:
                if (v > acc || (v == acc && !std::signbit(v))) acc = v;
                break;
            }
          }
          // avg: the division in float32 for 16-bit types, then the rounding to the type.
          const bool narrow = t == DataType::kFloat16 || t == DataType::kBfloat16;
          if (op == ReduceOp::kAvg) acc = RoundToType(RoundToType(acc / n, narrow ? DataType::kFloat32 : t), t);
          ASSERT_TRUE(EncodeFloat(acc, t, got.data()));
          std::string why;
          ASSERT_TRUE(CheckReduced(t, op, ptrs, got.data(), &why))
              << DataTypeName(t) << " " << ReduceOpName(op) << " " << ValueKindName(static_cast<ValueKind>(k))
              << " n=" << n << ": got " << FormatElement(got.data(), t) << ", " << why;
          // The next value up: refused when the reference is exact (min / max always are).
          const long double next = acc + UlpOf(acc, t);
          ASSERT_TRUE(EncodeFloat(next, t, got.data()));
          if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
            EXPECT_FALSE(CheckReduced(t, op, ptrs, got.data(), &why));
            ++exact_refusals;
          } else if (static_cast<ValueKind>(k) == ValueKind::kSmallInt && op != ReduceOp::kAvg) {
            EXPECT_FALSE(CheckReduced(t, op, ptrs, got.data(), &why))
                << DataTypeName(t) << " " << ReduceOpName(op) << " accepted the next value "
                << FormatElement(got.data(), t);
            ++exact_refusals;
          }
        }
      }
    }
  }
  EXPECT_GT(exact_refusals, 100);
}

TEST(Reference, IntegerResultsOffByOneAreRefused) {
  Rng rng(11);
  for (DataType t : AllDataTypes()) {
    if (IsFloatingPoint(t)) continue;
    const size_t elem = DataTypeSize(t);
    for (ReduceOp op : AllReduceOps()) {
      for (int k = 0; k < kNumValueKinds; ++k) {
        const int n = static_cast<int>(rng.Range(2, 8));
        const InputSpec spec{rng.Next(), t, op, static_cast<ValueKind>(k), false};
        std::vector<uint8_t> in(static_cast<size_t>(n) * elem);
        std::vector<const uint8_t*> ptrs;
        for (int q = 0; q < n; ++q) {
          InputElement(spec, q, 0, in.data() + static_cast<size_t>(q) * elem);
          ptrs.push_back(in.data() + static_cast<size_t>(q) * elem);
        }
        // Find the accepted value by asking for it, then change one bit.
        std::string why;
        std::vector<uint8_t> got(elem, 0);
        (void)CheckReduced(t, op, ptrs, got.data(), &why);
        if (why.empty()) {
          got[0] ^= 1;
        } else {
          const std::string digits = why.substr(5);
          const uint64_t want = digits[0] == '-' ? static_cast<uint64_t>(std::stoll(digits)) : std::stoull(digits);
          for (size_t b = 0; b < elem; ++b) got[b] = static_cast<uint8_t>(want >> (8 * b));
          ASSERT_TRUE(CheckReduced(t, op, ptrs, got.data(), &why)) << DataTypeName(t) << " " << why;
          got[0] ^= 1;
        }
        EXPECT_FALSE(CheckReduced(t, op, ptrs, got.data(), &why)) << DataTypeName(t) << " " << ReduceOpName(op);
      }
    }
  }
}

TEST(Cases, AFunctionOfTheSeedAndTheIndex) {
  Options options;
  for (uint64_t k = 0; k < 200; ++k) {
    const WorldSpec w = MakeWorld(options, 42, k / 16);
    EXPECT_EQ(MakeCase(options, 42, k, w).ToString(), MakeCase(options, 42, k, w).ToString());
    EXPECT_EQ(MakeWorld(options, 42, k / 16).ToString(), w.ToString());
  }
  EXPECT_NE(MakeCase(options, 42, 5, MakeWorld(options, 42, 0)).ToString(),
            MakeCase(options, 43, 5, MakeWorld(options, 43, 0)).ToString());
  // Mixed mode: the modes in turn.
  EXPECT_EQ(MakeWorld(options, 1, 0).mode, Mode::kThreads);
  EXPECT_EQ(MakeWorld(options, 1, 1).mode, Mode::kOneThread);
  EXPECT_EQ(MakeWorld(options, 1, 2).mode, Mode::kProcesses);
}

TEST(Cases, SkipsLeaveTheirCasesOut) {
  Options options;
  for (std::string_view k : KnownSkips()) options.skip.insert(std::string(k));
  for (uint64_t k = 0; k < 2000; ++k) {
    const WorldSpec w = MakeWorld(options, 9, k / 16);
    const Case c = MakeCase(options, 9, k, w);
    EXPECT_FALSE(w.opaque || w.ofi || w.sync_free);
    EXPECT_EQ(c.pattern, Pattern::kNone);
    if (c.op == ReduceOp::kMin || c.op == ReduceOp::kMax) {
      EXPECT_NE(c.values, ValueKind::kSignedZero);
    }
    const bool narrow = c.type == DataType::kFloat16 || c.type == DataType::kBfloat16;
    if (narrow && c.op == ReduceOp::kAvg) {
      EXPECT_FALSE(c.compare_runs);
    }
    for (const crosscheck::Run& r : c.runs) EXPECT_FALSE(r.host_memory);
  }
}

TEST(Cases, BuffersStayWithinMaxBytes) {
  Options options;
  options.max_bytes = 1 << 16;
  for (uint64_t k = 0; k < 2000; ++k) {
    const WorldSpec w = MakeWorld(options, 3, k / 16);
    const Case c = MakeCase(options, 3, k, w);
    const uint64_t largest =
        std::max(InputCount(c.collective, w.nranks, c.count), OutputCount(c.collective, w.nranks, c.count));
    EXPECT_LE(largest * DataTypeSize(c.type), options.max_bytes) << c.ToString();
    for (const Message& m : c.messages) EXPECT_LE(m.count * DataTypeSize(m.type), options.max_bytes);
  }
}

}  // namespace
}  // namespace kizuna::crosscheck
