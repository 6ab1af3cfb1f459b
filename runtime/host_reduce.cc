#include "runtime/host_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "runtime/half.h"

namespace kizuna {
namespace {

// Elements per block: the accumulator block stays in L1 (4 KiB of float32) while the inputs
// stream through, so each input byte is read once and the output written once.
constexpr size_t kBlock = 1024;
// Below this many bytes touched (inputs + output) one thread is faster than waking others.
constexpr size_t kParallelBytes = size_t{1} << 20;
// Work per oneTBB task; large enough that scheduling costs vanish.
constexpr size_t kTaskBytes = size_t{256} << 10;

struct F16 {};
struct BF16 {};

// Storage type -> accumulation type, load and store.
template <typename T, bool = std::is_integral_v<T>> struct AccOf { using type = T; };
// Integers accumulate in the unsigned type of the same width: wrapping, never UB.
template <typename T> struct AccOf<T, true> { using type = std::make_unsigned_t<T>; };

// F16 / BF16 are tags: their elements are read and written as plain uint16_t, so that the
// vectorizer sees integer lanes (it gives up on loads of a struct).
template <typename T> struct Traits {
  using Storage = T;
  using Acc = typename AccOf<T>::type;
  static Acc Load(T v) { return static_cast<Acc>(v); }
  static T Store(Acc v) { return static_cast<T>(v); }
};
template <> struct Traits<F16> {
  using Storage = uint16_t;
  using Acc = float;
  static float Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(float v) { return FloatToHalf(v); }
};
template <> struct Traits<BF16> {
  using Storage = uint16_t;
  using Acc = float;
  static float Load(uint16_t v) { return Bfloat16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBfloat16(v); }
};

// min/max compare in the storage type's signedness (the accumulator of a signed integer is
// unsigned, so compare after converting back).
template <typename T, typename Acc> inline Acc Min(Acc a, Acc b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(b) < static_cast<T>(a) ? b : a;
  else return b < a ? b : a;
}
template <typename T, typename Acc> inline Acc Max(Acc a, Acc b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(a) < static_cast<T>(b) ? b : a;
  else return a < b ? b : a;
}

template <typename T, ReduceOp kOp>
inline typename Traits<T>::Acc Combine(typename Traits<T>::Acc a, typename Traits<T>::Acc b) {
  using Acc = typename Traits<T>::Acc;
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) return static_cast<Acc>(a + b);
  else if constexpr (kOp == ReduceOp::kProd) return static_cast<Acc>(a * b);
  else if constexpr (kOp == ReduceOp::kMin) return Min<T, Acc>(a, b);
  else return Max<T, Acc>(a, b);
}

template <typename T, ReduceOp kOp>
inline typename Traits<T>::Storage Finish(typename Traits<T>::Acc a, size_t n) {
  using Tr = Traits<T>;
  using Acc = typename Tr::Acc;
  if constexpr (kOp != ReduceOp::kAvg) {
    return Tr::Store(a);
  } else if constexpr (std::is_integral_v<T>) {
    // The wrapped sum reinterpreted in T, divided truncating toward zero.
    if constexpr (std::is_signed_v<T>)
      return static_cast<T>(static_cast<int64_t>(static_cast<T>(a)) / static_cast<int64_t>(n));
    else
      return static_cast<T>(static_cast<uint64_t>(static_cast<T>(a)) / static_cast<uint64_t>(n));
  } else {
    return Tr::Store(a / static_cast<Acc>(n));
  }
}

// Each block makes the fewest passes: the first two inputs are combined as they are loaded and
// the last one as the result is stored, so n = 2 is one fused loop (d = s0 op s1) and n inputs
// take n - 1 passes over an L1-resident accumulator.
template <typename T, ReduceOp kOp>
[[gnu::always_inline]] inline void ReduceTyped(void* dst_v, std::span<const void* const> srcs, size_t begin, size_t end) {
  using Tr = Traits<T>;
  using Acc = typename Tr::Acc;
  using S = typename Tr::Storage;
  S* dst = static_cast<S*>(dst_v);
  const size_t n = srcs.size();
  auto src = [&](size_t k, size_t b) { return static_cast<const S*>(srcs[k]) + b; };
  if (n == 1) {
    const S* s0 = src(0, begin);
    for (size_t i = 0; i < end - begin; ++i) dst[begin + i] = Finish<T, kOp>(Tr::Load(s0[i]), 1);
    return;
  }
  if (n == 2) {
    const S* s0 = src(0, begin);
    const S* s1 = src(1, begin);
    S* d = dst + begin;
    for (size_t i = 0; i < end - begin; ++i) d[i] = Finish<T, kOp>(Combine<T, kOp>(Tr::Load(s0[i]), Tr::Load(s1[i])), 2);
    return;
  }
  Acc acc[kBlock];
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t len = std::min(kBlock, end - b);
    const S* s0 = src(0, b);
    const S* s1 = src(1, b);
    for (size_t i = 0; i < len; ++i) acc[i] = Combine<T, kOp>(Tr::Load(s0[i]), Tr::Load(s1[i]));
    for (size_t k = 2; k + 1 < n; ++k) {
      const S* s = src(k, b);
      for (size_t i = 0; i < len; ++i) acc[i] = Combine<T, kOp>(acc[i], Tr::Load(s[i]));
    }
    const S* last = src(n - 1, b);
    S* d = dst + b;
    for (size_t i = 0; i < len; ++i) d[i] = Finish<T, kOp>(Combine<T, kOp>(acc[i], Tr::Load(last[i])), n);
  }
}

template <typename T>
[[gnu::always_inline]] inline void DispatchOp(void* dst, std::span<const void* const> srcs, size_t begin, size_t end, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ReduceTyped<T, ReduceOp::kSum>(dst, srcs, begin, end);
    case ReduceOp::kProd: return ReduceTyped<T, ReduceOp::kProd>(dst, srcs, begin, end);
    case ReduceOp::kMin: return ReduceTyped<T, ReduceOp::kMin>(dst, srcs, begin, end);
    case ReduceOp::kMax: return ReduceTyped<T, ReduceOp::kMax>(dst, srcs, begin, end);
    case ReduceOp::kAvg: return ReduceTyped<T, ReduceOp::kAvg>(dst, srcs, begin, end);
  }
}

bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

// Compiled for x86-64-v3 (AVX2, FMA, F16C) and for the baseline, chosen at load time by the CPU
// (GCC function multiversioning): the build stays portable, and machines that have AVX2 get the
// wider vectors (about 2x in cache, see docs/PERFORMANCE.md).
#if defined(__x86_64__)
[[gnu::target_clones("arch=x86-64-v3", "default")]]
#endif
void HostReduceRange(void* dst, std::span<const void* const> srcs, size_t begin, size_t end, DataType type,
                     ReduceOp op) {
  switch (type) {
    case DataType::kFloat16: return DispatchOp<F16>(dst, srcs, begin, end, op);
    case DataType::kBfloat16: return DispatchOp<BF16>(dst, srcs, begin, end, op);
    case DataType::kFloat32: return DispatchOp<float>(dst, srcs, begin, end, op);
    case DataType::kFloat64: return DispatchOp<double>(dst, srcs, begin, end, op);
    case DataType::kInt8: return DispatchOp<int8_t>(dst, srcs, begin, end, op);
    case DataType::kUint8: return DispatchOp<uint8_t>(dst, srcs, begin, end, op);
    case DataType::kInt32: return DispatchOp<int32_t>(dst, srcs, begin, end, op);
    case DataType::kUint32: return DispatchOp<uint32_t>(dst, srcs, begin, end, op);
    case DataType::kInt64: return DispatchOp<int64_t>(dst, srcs, begin, end, op);
    case DataType::kUint64: return DispatchOp<uint64_t>(dst, srcs, begin, end, op);
  }
}

Status HostReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) {
  if (!IsValid(type)) return InvalidArgument(fmt::format("invalid data type {}", static_cast<int>(type)));
  if (!IsValid(op)) return InvalidArgument(fmt::format("invalid reduce op {}", static_cast<int>(op)));
  if (srcs.empty()) return InvalidArgument("reduce needs at least one input");
  if (count == 0) return Status::Ok();
  const size_t esize = DataTypeSize(type);
  if (count > SIZE_MAX / esize) return InvalidArgument(fmt::format("count {} overflows the address space", count));
  const size_t bytes = count * esize;
  if (dst == nullptr) return InvalidArgument("reduce output is null");
  for (size_t k = 0; k < srcs.size(); ++k) {
    if (srcs[k] == nullptr) return InvalidArgument(fmt::format("reduce input {} is null", k));
    if (srcs[k] != dst && Overlaps(srcs[k], bytes, dst, bytes))
      return InvalidArgument(fmt::format("reduce input {} partially overlaps the output", k));
  }
  const size_t touched = bytes * (srcs.size() + 1);
  if (touched < kParallelBytes) {
    HostReduceRange(dst, srcs, 0, count, type, op);
    return Status::Ok();
  }
  const size_t grain = std::max<size_t>(kBlock, kTaskBytes / (esize * (srcs.size() + 1)) / kBlock * kBlock);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, grain),
                    [&](const tbb::blocked_range<size_t>& r) { HostReduceRange(dst, srcs, r.begin(), r.end(), type, op); });
  return Status::Ok();
}

void HostCopy(void* dst, const void* src, size_t bytes) {
  if (bytes < kParallelBytes) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (Overlaps(dst, bytes, src, bytes)) {  // overlapping: one ordered memmove
    std::memmove(dst, src, bytes);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, bytes, kTaskBytes), [&](const tbb::blocked_range<size_t>& r) {
    std::memcpy(static_cast<char*>(dst) + r.begin(), static_cast<const char*>(src) + r.begin(), r.size());
  });
}

}  // namespace kizuna
