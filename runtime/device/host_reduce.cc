#include "runtime/device/host_reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "runtime/core/half.h"

namespace kizuna {
namespace {

// Elements per block: the accumulator block stays in L1 (4 KiB of float32) while the inputs
// stream through, so each input byte is read once and the output written once.
constexpr size_t kBlock = 1024;
// Below this many bytes touched (inputs + output) one thread is faster than waking others.
constexpr size_t kParallelBytes = size_t{1} << 20;
// ScopedSerialHostWork: this thread's large work stays on it.
thread_local bool t_serial = false;
// Work per oneTBB task; large enough that scheduling costs vanish.
constexpr size_t kTaskBytes = size_t{256} << 10;
// A call that writes at least this many bytes stores them non-temporally (StreamCopy): output
// that large leaves the caches before anyone reads it, and an ordinary store first reads the line
// it overwrites (write-allocate), so streaming stores cut the memory traffic of a copy from 3
// bytes per byte to 2 and of a broadcast from a cached source to 1 (docs/PERFORMANCE.md,
// "Streaming stores").
// Below it the output may still be in cache when it is read next, which streaming would forfeit.
constexpr size_t kStreamingBytes = size_t{4} << 20;
// A large reduction into one output streams only from this many inputs or fewer: the
// write-allocate reads it saves are a quarter of the traffic with 2 inputs but a sixth or less
// from 4, where the pass through an L1 scratch cost more than that (ReduceScatter of 4 and 8
// ranks ran slower streamed: docs/PERFORMANCE.md, "Streaming stores").
constexpr size_t kStreamedReduceInputs = 2;
// Bytes per block of the multi-output kernels: the block (reduced, or the source of a
// broadcast) stays in L1 while it is written to every output.
constexpr size_t kBlockBytes = size_t{8} << 10;

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

// Floating min / max, as IEEE 754-2019's minimum / maximum: -0 orders below +0, and a NaN operand
// makes the result NaN, always the canonical quiet NaN (positive, payload 0). Both rules make the
// result independent of the operands' order, so two ranks that combine the same pair of values in
// opposite orders (recursive doubling, every exchange of partial results) store the same bits. A
// plain compare-and-select (`b < a ? b : a`) keeps whichever operand came first when they compare
// equal (+0 and -0) or unordered (a NaN).
//
// Branch-free, so that it vectorizes: both selections are made, and they differ only when a and b
// compare equal or unordered; for equal values the bits are ANDed (max: +0 & -0 = +0) or ORed (min:
// -0), which leaves two identical values as they are; an unordered pair becomes the canonical NaN.
template <bool kMax, typename F>
inline F OrderedMinMax(F a, F b) {
  using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
  constexpr U kQuietNan = static_cast<U>(sizeof(F) == 4 ? 0x7fc00000u : 0x7ff8000000000000u);
  const F x = kMax ? (a < b ? b : a) : (b < a ? b : a);
  const F y = kMax ? (b < a ? a : b) : (a < b ? a : b);
  const U ux = std::bit_cast<U>(x), uy = std::bit_cast<U>(y);
  const U r = kMax ? (ux & uy) : (ux | uy);
  return std::bit_cast<F>(std::isunordered(a, b) ? kQuietNan : r);
}

// min/max compare in the storage type's signedness (the accumulator of a signed integer is
// unsigned, so compare after converting back). Integers have no ties to break.
template <typename T, typename Acc> inline Acc Min(Acc a, Acc b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(b) < static_cast<T>(a) ? b : a;
  else return OrderedMinMax<false>(a, b);
}
template <typename T, typename Acc> inline Acc Max(Acc a, Acc b) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(a) < static_cast<T>(b) ? b : a;
  else return OrderedMinMax<true>(a, b);
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

// The element arithmetic ReduceLoops runs: storage and accumulator types, the load, the
// combination and the store (Finish). Widened: Traits' load and store around Combine and Finish.
template <typename T, ReduceOp kOp>
struct Widened {
  using S = typename Traits<T>::Storage;
  using Acc = typename Traits<T>::Acc;
  static Acc Load(S v) { return Traits<T>::Load(v); }
  static Acc Op(Acc a, Acc b) { return Combine<T, kOp>(a, b); }
  static S Store(Acc a, size_t n) { return Finish<T, kOp>(a, n); }
};

// float16 / bfloat16 min / max of two or more inputs, on the bits: each value converts to float32
// and back exactly, so the widened min / max of OrderedMinMax stores one input's bits unchanged,
// or the canonical quiet NaN (float16 0x7e00, bfloat16 0x7fc0, what FloatToHalf / FloatToBfloat16
// make of float32's). The same result without the conversions, which cost more than the compare
// (docs/PERFORMANCE.md, "min / max in any order"). Sign-magnitude bits become two's complement keys
// that order as the values do, -0 below +0; a NaN's magnitude is above infinity's.
template <uint16_t kInfinity, uint16_t kQuietNan, bool kMax>
struct HalfBitsMinMax {
  using S = uint16_t;
  using Acc = uint16_t;
  static uint16_t Load(uint16_t v) { return v; }
  static uint16_t Op(uint16_t a, uint16_t b) {
    auto key = [](uint16_t x) {
      const auto v = static_cast<int16_t>(x);
      return static_cast<int16_t>(v ^ ((v >> 15) & 0x7fff));
    };
    const bool take_b = kMax ? key(a) < key(b) : key(b) < key(a);
    const bool nan = ((a & 0x7fffu) > kInfinity) | ((b & 0x7fffu) > kInfinity);
    return nan ? kQuietNan : (take_b ? b : a);
  }
  static uint16_t Store(uint16_t a, size_t /*n*/) { return a; }
};

// Each block makes the fewest passes: the first two inputs are combined as they are loaded and
// the last one as the result is stored, so n = 2 is one fused loop (d = s0 op s1) and n inputs
// take n - 1 passes over an L1-resident accumulator (n >= 2; n = 1 is ReduceTyped's).
template <typename K>
[[gnu::always_inline]] inline void ReduceLoops(void* dst_v, std::span<const void* const> srcs, size_t begin,
                                               size_t end) {
  using S = typename K::S;
  using Acc = typename K::Acc;
  S* dst = static_cast<S*>(dst_v);
  const size_t n = srcs.size();
  auto src = [&](size_t k, size_t b) { return static_cast<const S*>(srcs[k]) + b; };
  if (n == 2) {
    const S* s0 = src(0, begin);
    const S* s1 = src(1, begin);
    S* d = dst + begin;
    for (size_t i = 0; i < end - begin; ++i) d[i] = K::Store(K::Op(K::Load(s0[i]), K::Load(s1[i])), 2);
    return;
  }
  Acc acc[kBlock];
  for (size_t b = begin; b < end; b += kBlock) {
    const size_t len = std::min(kBlock, end - b);
    const S* s0 = src(0, b);
    const S* s1 = src(1, b);
    for (size_t i = 0; i < len; ++i) acc[i] = K::Op(K::Load(s0[i]), K::Load(s1[i]));
    for (size_t k = 2; k + 1 < n; ++k) {
      const S* s = src(k, b);
      for (size_t i = 0; i < len; ++i) acc[i] = K::Op(acc[i], K::Load(s[i]));
    }
    const S* last = src(n - 1, b);
    S* d = dst + b;
    for (size_t i = 0; i < len; ++i) d[i] = K::Store(K::Op(acc[i], K::Load(last[i])), n);
  }
}

template <typename T, ReduceOp kOp>
[[gnu::always_inline]] inline void ReduceTyped(void* dst_v, std::span<const void* const> srcs, size_t begin,
                                               size_t end) {
  using S = typename Traits<T>::Storage;
  if (srcs.size() == 1) {  // a copy, through the accumulator type (a float16 signalling NaN comes out quiet)
    const S* s0 = static_cast<const S*>(srcs[0]) + begin;
    S* d = static_cast<S*>(dst_v) + begin;
    for (size_t i = 0; i < end - begin; ++i) d[i] = Finish<T, kOp>(Traits<T>::Load(s0[i]), 1);
    return;
  }
  constexpr bool kMinMax = kOp == ReduceOp::kMin || kOp == ReduceOp::kMax;
  if constexpr (kMinMax && std::is_same_v<T, F16>)
    return ReduceLoops<HalfBitsMinMax<0x7c00, 0x7e00, kOp == ReduceOp::kMax>>(dst_v, srcs, begin, end);
  else if constexpr (kMinMax && std::is_same_v<T, BF16>)
    return ReduceLoops<HalfBitsMinMax<0x7f80, 0x7fc0, kOp == ReduceOp::kMax>>(dst_v, srcs, begin, end);
  else
    return ReduceLoops<Widened<T, kOp>>(dst_v, srcs, begin, end);
}

template <typename T>
[[gnu::always_inline]] inline void DispatchOp(void* dst, std::span<const void* const> srcs, size_t begin, size_t end,
                                              ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ReduceTyped<T, ReduceOp::kSum>(dst, srcs, begin, end);
    case ReduceOp::kProd: return ReduceTyped<T, ReduceOp::kProd>(dst, srcs, begin, end);
    case ReduceOp::kMin: return ReduceTyped<T, ReduceOp::kMin>(dst, srcs, begin, end);
    case ReduceOp::kMax: return ReduceTyped<T, ReduceOp::kMax>(dst, srcs, begin, end);
    case ReduceOp::kAvg: return ReduceTyped<T, ReduceOp::kAvg>(dst, srcs, begin, end);
  }
}

// ---- Scale: the division that finishes an average (host_reduce.h) ----

// Floating types: widen, divide in the accumulation type, round once on the store: Finish's kAvg
// step with the count replaced by the divisor.
template <typename T>
[[gnu::always_inline]] inline void ScaleFloat(void* dst_v, const void* src_v, size_t begin, size_t end,
                                              uint32_t divisor) {
  using Tr = Traits<T>;
  using S = typename Tr::Storage;
  using Acc = typename Tr::Acc;
  const S* s = static_cast<const S*>(src_v) + begin;
  S* d = static_cast<S*>(dst_v) + begin;
  const auto div = static_cast<Acc>(divisor);
  if (std::has_single_bit(divisor)) {
    // 2^-k is exact in Acc (k <= 31), so x * 2^-k and x / 2^k round the same real number once:
    // the same bits, at a multiply's cost instead of a divide's (rank counts are often powers of 2).
    const Acc inverse = Acc{1} / div;
    for (size_t i = 0; i < end - begin; ++i) d[i] = Tr::Store(Tr::Load(s[i]) * inverse);
    return;
  }
  for (size_t i = 0; i < end - begin; ++i) d[i] = Tr::Store(Tr::Load(s[i]) / div);
}

// 8- and 32-bit integers divide in double, which vectorizes (x86 has no vector integer
// division) and is exact after truncation: x and d are exact in double, and the correctly
// rounded quotient is off by at most |x/d| * 2^-53 < 2^32 / d * 2^-53 < 1/d, while a quotient
// that is not an integer lies at least 1/d from every integer. So the truncated double never
// crosses (or lands on) an integer the true quotient does not reach, and integer quotients are
// exact. static_cast truncates toward zero, as C++ integer division does.
template <typename T>
[[gnu::always_inline]] inline void ScaleNarrowInt(void* dst_v, const void* src_v, size_t begin, size_t end,
                                                  uint32_t divisor) {
  static_assert(sizeof(T) <= 4);
  const T* s = static_cast<const T*>(src_v) + begin;
  T* d = static_cast<T*>(dst_v) + begin;
  const double div = static_cast<double>(divisor);
  for (size_t i = 0; i < end - begin; ++i) {
    const double q = static_cast<double>(s[i]) / div;
    if constexpr (std::is_same_v<T, uint32_t>) {
      // Quotients up to 2^32 - 1 do not fit the int32 conversion that vectorizes (a conversion to
      // int64 does not, before AVX-512): floor (= trunc, q >= 0), shift the exact integer into
      // int32 range, convert, and shift back in uint32 arithmetic.
      constexpr double kHalfRange = 2147483648.0;
      d[i] = static_cast<uint32_t>(static_cast<int32_t>(std::floor(q) - kHalfRange)) + 0x80000000u;
    } else {
      d[i] = static_cast<T>(static_cast<int32_t>(q));
    }
  }
}

// 64-bit integers: doubles cannot hold them exactly, so the division is the integer one, except
// for a power-of-two divisor (rank counts often are), which becomes a shift.
template <typename T>
[[gnu::always_inline]] inline void ScaleWideInt(void* dst_v, const void* src_v, size_t begin, size_t end,
                                                uint32_t divisor) {
  static_assert(sizeof(T) == 8);
  const T* s = static_cast<const T*>(src_v) + begin;
  T* d = static_cast<T*>(dst_v) + begin;
  const size_t n = end - begin;
  if (std::has_single_bit(divisor)) {
    const int k = std::countr_zero(divisor);
    if constexpr (std::is_signed_v<T>) {
      // An arithmetic shift rounds toward minus infinity; adding divisor - 1 to a negative value
      // first makes it round toward zero. Done in uint64 (wrapping, never UB); >> of a negative
      // int64 is arithmetic since C++20.
      const uint64_t mask = uint64_t{divisor} - 1;
      for (size_t i = 0; i < n; ++i) {
        const auto u = static_cast<uint64_t>(s[i]);
        const uint64_t bias = (uint64_t{0} - (u >> 63)) & mask;
        d[i] = static_cast<int64_t>(u + bias) >> k;
      }
    } else {
      for (size_t i = 0; i < n; ++i) d[i] = s[i] >> k;
    }
    return;
  }
  const auto div = static_cast<T>(divisor);  // positive: no INT64_MIN / -1
  for (size_t i = 0; i < n; ++i) d[i] = s[i] / div;
}

bool Overlaps(const void* a, size_t an, const void* b, size_t bn) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

#if defined(__x86_64__)
// One 64-byte line in registers: loaded from anywhere, stored non-temporally to a 16-byte aligned
// address.
struct Line {
  __m128i v[4];
};

Line LoadLine(const uint8_t* s) {
  Line l;
  for (int k = 0; k < 4; ++k) l.v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * k));
  return l;
}

void StreamLine(uint8_t* d, const Line& l) {
  for (int k = 0; k < 4; ++k) _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * k), l.v[k]);
}
#endif

// Copies with non-temporal stores where the CPU has them (x86-64: SSE2's, in every x86-64; the
// copy is bound by memory, so wider vectors gain nothing). Its stores are weakly ordered: the
// thread must call StoreFence before anything that publishes the data (a release store does not
// order them).
void StreamCopy(void* dst_v, const void* src_v, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<uint8_t*>(dst_v);
  const auto* s = static_cast<const uint8_t*>(src_v);
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) StreamLine(d + i, LoadLine(s + i));
  for (; i + 16 <= bytes; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst_v, src_v, bytes);
#endif
}

// StreamCopy into two destinations at once, each line loaded once and stored to both: one read
// stream and two write streams, where copying 8 KiB blocks to each in turn interrupts the read
// stream (2 ranks' AllGather ran faster this way: docs/PERFORMANCE.md, "AllGather pushes").
// Both destinations must have the same alignment modulo 16.
void StreamCopy2(void* dst0_v, void* dst1_v, const void* src_v, size_t bytes) {
#if defined(__x86_64__)
  auto* d0 = static_cast<uint8_t*>(dst0_v);
  auto* d1 = static_cast<uint8_t*>(dst1_v);
  const auto* s = static_cast<const uint8_t*>(src_v);
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d0) % 16) % 16);
  std::memcpy(d0, s, head);
  std::memcpy(d1, s, head);
  d0 += head, d1 += head, s += head, bytes -= head;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const Line line = LoadLine(s + i);
    StreamLine(d0 + i, line);
    StreamLine(d1 + i, line);
  }
  StreamCopy(d0 + i, s + i, bytes - i);
  StreamCopy(d1 + i, s + i, bytes - i);
#else
  std::memcpy(dst0_v, src_v, bytes);
  std::memcpy(dst1_v, src_v, bytes);
#endif
}

// Orders this thread's StreamCopy stores before its later stores.
void StoreFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

// A copy, streaming or not.
void CopyOut(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream) StreamCopy(dst, src, bytes);
  else std::memcpy(dst, src, bytes);
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

namespace {

// The validated work of HostReduceMulti (and of a large HostReduce): the inputs reduced block by
// block into every output. Blocks are small enough that the reduced block is still in L1 when it
// is copied out. Each block is reduced before it is written, and no block is visited twice, so an
// output that is also an input (in place) is only written after its block was read. A call that
// writes kStreamingBytes or more reduces each block into an L1 scratch and streams it to every
// output; otherwise into dsts[0], copied from there into the others.
void ReduceBlocks(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                  ReduceOp op) {
  const size_t esize = DataTypeSize(type);
  const size_t block = std::max<size_t>(kBlock, kBlockBytes / esize / kBlock * kBlock);
  const bool stream = count * esize * dsts.size() >= kStreamingBytes;
  auto range = [&](size_t begin, size_t end) {
    if (!stream) {
      for (size_t b = begin; b < end; b += block) {
        const size_t e = std::min(end, b + block);
        HostReduceRange(dsts[0], srcs, b, e, type, op);
        const auto* from = static_cast<const uint8_t*>(dsts[0]) + b * esize;
        for (size_t j = 1; j < dsts.size(); ++j)
          std::memcpy(static_cast<uint8_t*>(dsts[j]) + b * esize, from, (e - b) * esize);
      }
      return;
    }
    alignas(64) uint8_t scratch[std::max(kBlockBytes, kBlock * sizeof(double))];
    std::vector<const void*> at(srcs.size());
    for (size_t b = begin; b < end; b += block) {
      const size_t e = std::min(end, b + block);
      for (size_t k = 0; k < srcs.size(); ++k) at[k] = static_cast<const uint8_t*>(srcs[k]) + b * esize;
      HostReduceRange(scratch, at, 0, e - b, type, op);
      for (void* dst : dsts) StreamCopy(static_cast<uint8_t*>(dst) + b * esize, scratch, (e - b) * esize);
    }
    StoreFence();
  };
  const size_t touched = count * esize * (srcs.size() + dsts.size());
  if (touched < kParallelBytes || t_serial) {
    range(0, count);
    return;
  }
  const size_t grain = std::max<size_t>(block, kTaskBytes / (esize * (srcs.size() + dsts.size())) / block * block);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, grain),
                    [&](const tbb::blocked_range<size_t>& r) { range(r.begin(), r.end()); });
}

}  // namespace

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
  if (bytes >= kStreamingBytes && srcs.size() <= kStreamedReduceInputs) {
    void* const dsts[] = {dst};
    ReduceBlocks(dsts, srcs, count, type, op);
    return Status::Ok();
  }
  const size_t touched = bytes * (srcs.size() + 1);
  if (touched < kParallelBytes || t_serial) {
    HostReduceRange(dst, srcs, 0, count, type, op);
    return Status::Ok();
  }
  const size_t grain = std::max<size_t>(kBlock, kTaskBytes / (esize * (srcs.size() + 1)) / kBlock * kBlock);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, grain), [&](const tbb::blocked_range<size_t>& r) {
    HostReduceRange(dst, srcs, r.begin(), r.end(), type, op);
  });
  return Status::Ok();
}

Status HostReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                       ReduceOp op) {
  if (dsts.empty()) return InvalidArgument("reduce needs at least one output");
  if (dsts.size() == 1 || count == 0) return HostReduce(dsts[0], srcs, count, type, op);
  if (!IsValid(type)) return InvalidArgument(fmt::format("invalid data type {}", static_cast<int>(type)));
  if (!IsValid(op)) return InvalidArgument(fmt::format("invalid reduce op {}", static_cast<int>(op)));
  if (srcs.empty()) return InvalidArgument("reduce needs at least one input");
  const size_t esize = DataTypeSize(type);
  if (count > SIZE_MAX / esize) return InvalidArgument(fmt::format("count {} overflows the address space", count));
  const size_t bytes = count * esize;
  for (size_t j = 0; j < dsts.size(); ++j) {
    if (dsts[j] == nullptr) return InvalidArgument(fmt::format("reduce output {} is null", j));
    for (size_t k = 0; k < srcs.size(); ++k) {
      if (srcs[k] == nullptr) return InvalidArgument(fmt::format("reduce input {} is null", k));
      if (srcs[k] != dsts[j] && Overlaps(srcs[k], bytes, dsts[j], bytes))
        return InvalidArgument(fmt::format("reduce input {} partially overlaps output {}", k, j));
    }
    for (size_t i = 0; i < j; ++i)
      if (Overlaps(dsts[i], bytes, dsts[j], bytes))
        return InvalidArgument(fmt::format("reduce outputs {} and {} overlap", i, j));
  }
  ReduceBlocks(dsts, srcs, count, type, op);
  return Status::Ok();
}

// Multiversioned like HostReduceRange: the float16 conversions and the double divisions gain the
// most from AVX2 / F16C.
#if defined(__x86_64__)
[[gnu::target_clones("arch=x86-64-v3", "default")]]
#endif
void HostScaleRange(void* dst, const void* src, size_t begin, size_t end, DataType type, uint32_t divisor) {
  switch (type) {
    case DataType::kFloat16: return ScaleFloat<F16>(dst, src, begin, end, divisor);
    case DataType::kBfloat16: return ScaleFloat<BF16>(dst, src, begin, end, divisor);
    case DataType::kFloat32: return ScaleFloat<float>(dst, src, begin, end, divisor);
    case DataType::kFloat64: return ScaleFloat<double>(dst, src, begin, end, divisor);
    case DataType::kInt8: return ScaleNarrowInt<int8_t>(dst, src, begin, end, divisor);
    case DataType::kUint8: return ScaleNarrowInt<uint8_t>(dst, src, begin, end, divisor);
    case DataType::kInt32: return ScaleNarrowInt<int32_t>(dst, src, begin, end, divisor);
    case DataType::kUint32: return ScaleNarrowInt<uint32_t>(dst, src, begin, end, divisor);
    case DataType::kInt64: return ScaleWideInt<int64_t>(dst, src, begin, end, divisor);
    case DataType::kUint64: return ScaleWideInt<uint64_t>(dst, src, begin, end, divisor);
  }
}

Status HostScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) {
  if (!IsValid(type)) return InvalidArgument(fmt::format("invalid data type {}", static_cast<int>(type)));
  if (divisor == 0) return InvalidArgument("scale divisor is 0");
  if (count == 0) return Status::Ok();
  const size_t esize = DataTypeSize(type);
  if (count > SIZE_MAX / esize) return InvalidArgument(fmt::format("count {} overflows the address space", count));
  const size_t bytes = count * esize;
  if (dst == nullptr) return InvalidArgument("scale output is null");
  if (src == nullptr) return InvalidArgument("scale input is null");
  if (src != dst && Overlaps(src, bytes, dst, bytes))
    return InvalidArgument("scale input partially overlaps the output (only dst == src is allowed)");
  if (bytes < kParallelBytes / 2 || t_serial) {  // one input read, one output written
    HostScaleRange(dst, src, 0, count, type, divisor);
    return Status::Ok();
  }
  // Every task covers a whole number of elements, so in place stays element-wise.
  const size_t grain = std::max<size_t>(kBlock, kTaskBytes / (2 * esize) / kBlock * kBlock);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, grain), [&](const tbb::blocked_range<size_t>& r) {
    HostScaleRange(dst, src, r.begin(), r.end(), type, divisor);
  });
  return Status::Ok();
}

void HostCopy(void* dst, const void* src, size_t bytes) {
  if (Overlaps(dst, bytes, src, bytes)) {  // overlapping: one ordered memmove
    std::memmove(dst, src, bytes);
    return;
  }
  const bool stream = bytes >= kStreamingBytes;
  auto range = [&](size_t begin, size_t end) {
    CopyOut(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin, stream);
    if (stream) StoreFence();
  };
  if (bytes < kParallelBytes || t_serial) {
    range(0, bytes);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<size_t>(0, bytes, kTaskBytes),
                    [&](const tbb::blocked_range<size_t>& r) { range(r.begin(), r.end()); });
}

void HostCopyMulti(std::span<void* const> dsts, const void* src, size_t bytes) {
  const bool stream = bytes * dsts.size() >= kStreamingBytes;
  const bool pair = stream && dsts.size() == 2 &&
                    reinterpret_cast<uintptr_t>(dsts[0]) % 16 == reinterpret_cast<uintptr_t>(dsts[1]) % 16;
  auto range = [&](size_t begin, size_t end) {
    if (pair) {
      StreamCopy2(static_cast<char*>(dsts[0]) + begin, static_cast<char*>(dsts[1]) + begin,
                  static_cast<const char*>(src) + begin, end - begin);
      StoreFence();
      return;
    }
    for (size_t b = begin; b < end; b += kBlockBytes) {
      const size_t len = std::min(kBlockBytes, end - b);
      for (void* dst : dsts) CopyOut(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, len, stream);
    }
    if (stream) StoreFence();
  };
  if (bytes * (dsts.size() + 1) < kParallelBytes || t_serial) {
    range(0, bytes);
    return;
  }
  const size_t grain = std::max(kBlockBytes, kTaskBytes / (dsts.size() + 1) / kBlockBytes * kBlockBytes);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, bytes, grain),
                    [&](const tbb::blocked_range<size_t>& r) { range(r.begin(), r.end()); });
}

ScopedSerialHostWork::ScopedSerialHostWork(bool serial) : previous_(t_serial) { t_serial = t_serial || serial; }

ScopedSerialHostWork::~ScopedSerialHostWork() { t_serial = previous_; }

}  // namespace kizuna
