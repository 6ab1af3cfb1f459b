#include "tools/bench/values.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/core/half.h"

namespace kizuna::bench {
namespace {

// The period of the sequences that identify ranks (a prime, so 17q and 5i cycle through it).
constexpr uint64_t kIdentityPeriod = 97;
// At most this many ranks contribute to each element of a sum, so sums stay <= 8 * 5 = 40.
constexpr uint64_t kSumContributors = 8;
// The shortest period a Pattern keeps (elements): see Pattern::Pattern.
constexpr uint64_t kMinPeriod = 4096;

uint64_t Mod(int64_t a, uint64_t m) {
  const int64_t r = a % static_cast<int64_t>(m);
  return static_cast<uint64_t>(r < 0 ? r + static_cast<int64_t>(m) : r);
}

double IdentityValue(int rank, uint64_t i) {
  return static_cast<double>(1 + (17 * static_cast<uint64_t>(rank) + 5 * i) % kIdentityPeriod);
}

double SumInput(int nranks, int rank, uint64_t i) {
  const uint64_t n = static_cast<uint64_t>(nranks);
  const uint64_t q = static_cast<uint64_t>(rank);
  if ((i + q) % n >= kSumContributors) return 0;
  return static_cast<double>(1 + (7 * q + 3 * i) % 5);
}

double ProdInput(int nranks, int rank, uint64_t i) {
  const uint64_t slot = (i + static_cast<uint64_t>(rank)) % static_cast<uint64_t>(nranks);
  return slot == 0 || slot == 4 ? 2 : 1;
}

uint64_t InputPeriod(BenchColl coll, ReduceOp op, int nranks) {
  if (!IsReduction(coll) || op == ReduceOp::kMin || op == ReduceOp::kMax) return kIdentityPeriod;
  const uint64_t n = static_cast<uint64_t>(nranks);
  return op == ReduceOp::kProd ? n : 5 * n;
}

double Input(BenchColl coll, ReduceOp op, int nranks, int rank, uint64_t i) {
  if (!IsReduction(coll) || op == ReduceOp::kMin || op == ReduceOp::kMax) return IdentityValue(rank, i);
  return op == ReduceOp::kProd ? ProdInput(nranks, rank, i) : SumInput(nranks, rank, i);
}

}  // namespace

double LoadElement(const void* base, uint64_t i, DataType type) {
  const auto* p = static_cast<const uint8_t*>(base) + i * DataTypeSize(type);
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (type) {
    case DataType::kFloat16:
      return HalfToFloat(load(uint16_t{}));
    case DataType::kBfloat16:
      return Bfloat16ToFloat(load(uint16_t{}));
    case DataType::kFloat32:
      return load(float{});
    case DataType::kFloat64:
      return load(double{});
    case DataType::kInt8:
      return load(int8_t{});
    case DataType::kUint8:
      return load(uint8_t{});
    case DataType::kInt32:
      return load(int32_t{});
    case DataType::kUint32:
      return load(uint32_t{});
    case DataType::kInt64:
      return static_cast<double>(load(int64_t{}));
    case DataType::kUint64:
      return static_cast<double>(load(uint64_t{}));
  }
  return 0;
}

void StoreElement(void* base, uint64_t i, DataType type, double value) {
  auto* p = static_cast<uint8_t*>(base) + i * DataTypeSize(type);
  auto store = [p](auto v) { std::memcpy(p, &v, sizeof v); };
  switch (type) {
    case DataType::kFloat16:
      return store(FloatToHalf(static_cast<float>(value)));
    case DataType::kBfloat16:
      return store(FloatToBfloat16(static_cast<float>(value)));
    case DataType::kFloat32:
      return store(static_cast<float>(value));
    case DataType::kFloat64:
      return store(value);
    case DataType::kInt8:
      return store(static_cast<int8_t>(value));
    case DataType::kUint8:
      return store(static_cast<uint8_t>(value));
    case DataType::kInt32:
      return store(static_cast<int32_t>(value));
    case DataType::kUint32:
      return store(static_cast<uint32_t>(value));
    case DataType::kInt64:
      return store(static_cast<int64_t>(value));
    case DataType::kUint64:
      return store(static_cast<uint64_t>(value));
  }
}

Pattern::Pattern(DataType type, std::span<const double> period) : type_(type), elem_(DataTypeSize(type)) {
  // A short period is repeated up to kMinPeriod elements, so that filling and comparing move
  // large blocks even when the sequence repeats every few elements.
  const uint64_t repeat = (kMinPeriod + period.size() - 1) / period.size();
  period_ = period.size() * repeat;
  values_.reserve(period_);
  for (uint64_t r = 0; r < repeat; ++r) values_.insert(values_.end(), period.begin(), period.end());
  bytes_.resize(2 * period_ * elem_);
  for (uint64_t i = 0; i < 2 * period_; ++i) StoreElement(bytes_.data(), i, type_, values_[i % period_]);
}

void Pattern::Write(void* dst, uint64_t first, uint64_t count) const {
  auto* out = static_cast<uint8_t*>(dst);
  const uint64_t phase = first % period_;
  // Moving on by whole periods keeps the phase, so every chunk starts at the same place.
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(period_, count - done);
    std::memcpy(out + done * elem_, bytes_.data() + phase * elem_, n * elem_);
    done += n;
  }
}

uint64_t Pattern::CountWrong(const void* src, uint64_t first, uint64_t count, double relative_tolerance) const {
  const auto* in = static_cast<const uint8_t*>(src);
  const uint64_t phase = first % period_;
  uint64_t wrong = 0;
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(period_, count - done);
    const uint8_t* got = in + done * elem_;
    const uint8_t* want = bytes_.data() + phase * elem_;
    if (std::memcmp(got, want, n * elem_) != 0) {
      // Only chunks that differ are looked at element by element.
      for (uint64_t k = 0; k < n; ++k) {
        if (std::memcmp(got + k * elem_, want + k * elem_, elem_) == 0) continue;
        if (relative_tolerance > 0) {
          const double g = LoadElement(got, k, type_);
          const double w = values_[(phase + k) % period_];
          if (std::fabs(g - w) <= relative_tolerance * std::fabs(w)) continue;
        }
        ++wrong;
      }
    }
    done += n;
  }
  return wrong;
}

Pattern InputPattern(BenchColl coll, ReduceOp op, DataType type, int nranks, int rank) {
  std::vector<double> period(InputPeriod(coll, op, nranks));
  for (uint64_t i = 0; i < period.size(); ++i) period[i] = Input(coll, op, nranks, rank, i);
  return Pattern(type, period);
}

Pattern ReducedPattern(ReduceOp op, DataType type, int nranks) {
  const uint64_t n = static_cast<uint64_t>(nranks);
  std::vector<double> period(InputPeriod(BenchColl::kAllReduce, op, nranks));
  for (uint64_t i = 0; i < period.size(); ++i) {
    double acc = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        // Only ranks q with (i + q) mod n < 8 contribute: q = (c - i) mod n for c < min(n, 8).
        for (uint64_t c = 0; c < std::min(n, kSumContributors); ++c)
          acc += SumInput(nranks, static_cast<int>(Mod(static_cast<int64_t>(c) - static_cast<int64_t>(i % n), n)), i);
        break;
      case ReduceOp::kProd:
        acc = 1;
        for (uint64_t c : {uint64_t{0}, uint64_t{4}})
          if (c < n) acc *= 2;
        break;
      case ReduceOp::kMin:
      case ReduceOp::kMax: {
        acc = IdentityValue(0, i);
        for (int q = 1; q < nranks; ++q)
          acc = op == ReduceOp::kMin ? std::min(acc, IdentityValue(q, i)) : std::max(acc, IdentityValue(q, i));
        break;
      }
    }
    if (op == ReduceOp::kAvg) {
      // dtype.h's avg: the sum divided once, in float32 for float16 / bfloat16 / float32 (then
      // rounded to the type by StoreElement), in float64 for float64; integers truncate.
      if (type == DataType::kFloat64)
        acc = acc / static_cast<double>(n);
      else if (IsFloatingPoint(type))
        acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
      else
        acc = std::trunc(acc / static_cast<double>(n));
    }
    period[i] = acc;
  }
  return Pattern(type, period);
}

double OutputTolerance(ReduceOp op, DataType type) {
  if (op != ReduceOp::kAvg || !IsFloatingPoint(type)) return 0;
  // One rounding of the quotient in the type: half an ulp, doubled for a backend that rounds the
  // float32 quotient and then the type (float16 has 11 significant bits, bfloat16 8).
  switch (type) {
    case DataType::kFloat16:
      return 1.0 / 1024;
    case DataType::kBfloat16:
      return 1.0 / 128;
    case DataType::kFloat32:
      return 1e-6;
    default:
      return 1e-15;
  }
}

}  // namespace kizuna::bench
