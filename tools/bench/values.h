// The values of the check iteration: what every rank's input holds, and what every output must
// hold afterwards, exactly, in every element type for every reduction.
//
// Inputs are small non-negative integers, so every order of reduction gives the same result in
// every type (float16 and bfloat16 hold integers exactly up to 2048 and 256, int8 up to 127):
//   non-reductions, min, max   rank q, element i:  1 + (17q + 5i) mod 97           (1..97)
//   sum, avg                   1 + (7q + 3i) mod 5 when (i + q) mod n < 8, else 0  (sums <= 40)
//   prod                       2 when (i + q) mod n is 0 or 4, else 1              (products <= 4)
// At most 8 ranks contribute to a sum and 2 to a product, whatever the rank count n, so sums and
// products stay exact for any n. Avg is the exact sum divided as runtime/core/dtype.h says (floating
// types in float32, float64 in float64, rounded once; integers truncated). For the collectives that
// move data, distinct ranks' inputs differ at every element (for n <= 97) and neighbouring elements
// of one input differ, so data from the wrong rank or the wrong place is caught.
//
// Every sequence is periodic in i (period 97, 5n or n), so a Pattern keeps one period and fills or
// compares memory a period at a time with memcpy / memcmp: checking a large buffer costs about as
// much as copying it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/core/dtype.h"
#include "tools/bench/sweep.h"

namespace kizuna::bench {

// The infinite sequence value(i) = period[i mod period.size()], as elements of one type.
class Pattern {
 public:
  // `period` holds at least one value; each is converted to `type` (values must be representable).
  Pattern(DataType type, std::span<const double> period);

  DataType type() const { return type_; }
  // A multiple of the period given (short periods are repeated; see values.cc).
  uint64_t period() const { return period_; }
  double value(uint64_t i) const { return values_[i % period_]; }

  // dst[k] = value(first + k) for k < count (dst: host memory of count elements).
  void Write(void* dst, uint64_t first, uint64_t count) const;
  // The number of k < count where src[k] differs from value(first + k). `relative_tolerance` > 0
  // accepts |got - want| <= tolerance * |want| (for avg in floating types); 0 demands equal bits.
  uint64_t CountWrong(const void* src, uint64_t first, uint64_t count, double relative_tolerance) const;

 private:
  DataType type_;
  size_t elem_;
  uint64_t period_ = 1;
  std::vector<double> values_;
  // Two periods back to back: elements [p, p + period) are contiguous for any phase p < period.
  std::vector<uint8_t> bytes_;
};

// Rank `rank`'s input (element i of its send buffer) for a collective, op and type over n ranks.
Pattern InputPattern(BenchColl coll, ReduceOp op, DataType type, int nranks, int rank);
// The reduction of every rank's InputPattern, element by element (reductions only).
Pattern ReducedPattern(ReduceOp op, DataType type, int nranks);
// The tolerance CountWrong needs for the outputs of `op` in `type` (0 unless avg of a floating type).
double OutputTolerance(ReduceOp op, DataType type);

// The byte that fills output buffers before the check's collective runs, so that elements the
// collective failed to write are counted: 0xff... is NaN in every floating type and -1 or the
// largest value in integer types, never an expected value.
inline constexpr uint8_t kPoisonByte = 0xff;

// Element i of a host array of `type`, as a double; and the reverse (values representable).
double LoadElement(const void* base, uint64_t i, DataType type);
void StoreElement(void* base, uint64_t i, DataType type, double value);

}  // namespace kizuna::bench
