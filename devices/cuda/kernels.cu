// The CUDA backend's reduce and scale kernels: every name kernel_abi.h lists, each a thin
// extern "C" wrapper over one template. The per-element arithmetic is kernel_math.h's (shared with
// its host-side test); this file is the memory side: 16-byte vector loads and stores, a grid-stride
// loop, and scalar paths for the ends and for pointers that do not share an alignment.
//
// Built by nvcc into a fatbin (BUILD: kernels_fatbin) with -fmad=false -ftz=false -prec-div=true,
// and never with --use_fast_math: the results must equal HostReduce's bit for bit.
//
// On an H100 with 256 MiB per buffer and 64 blocks per SM the reduces and scales move about as
// many bytes per second as a device-to-device copy (docs/PERFORMANCE.md, "CUDA backend on an
// H100", the kernels' grid). Fewer blocks per SM are slower on large buffers; on small ones
// (16 MiB) about 8 blocks per SM did best, since every thread first sets up avg's divider
// (kernel_math.h) and should then handle a few vectors.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "devices/cuda/kernel_abi.h"
#include "devices/cuda/kernel_math.h"

namespace kizuna::cuda {
namespace {

using math::Op;

// ---- Loads and stores ----
//
// Inputs are read through the read-only data path (ld.global.nc). That is safe in place too
// (an output equal to an input): every element is read exactly once, by the thread that later
// writes it (to every output), and no thread reads an element after it was written in the same
// launch; kernels of other ranks running at the same time (the fused AllReduce) write other
// elements of the same buffers, which this launch never reads; the next launch (the host
// folds more than KZ_CUDA_MAX_INPUTS inputs into the output in several) starts with the caches
// invalidated.

template <typename S>
__device__ __forceinline__ S LoadElement(const S* p) {
  return __ldg(p);
}

template <typename S>
__device__ __forceinline__ void StoreElement(S* p, S v) {
  *p = v;
}

// Element-misaligned pointers (a float at an odd address) would fault the whole context on a
// typed access; the byte path assembles them instead. Slow, but correct and never a fault.
template <int kBytes>
struct UnsignedOfSize;
template <>
struct UnsignedOfSize<1> { using type = uint8_t; };
template <>
struct UnsignedOfSize<2> { using type = uint16_t; };
template <>
struct UnsignedOfSize<4> { using type = uint32_t; };
template <>
struct UnsignedOfSize<8> { using type = uint64_t; };

template <typename S>
__device__ __forceinline__ S LoadBytes(const S* p) {
  using U = typename UnsignedOfSize<sizeof(S)>::type;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  U u = 0;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(S)); ++i) u |= static_cast<U>(static_cast<U>(__ldg(b + i)) << (8 * i));
  S v;
  memcpy(&v, &u, sizeof v);
  return v;
}

template <typename S>
__device__ __forceinline__ void StoreBytes(S* p, S v) {
  using U = typename UnsignedOfSize<sizeof(S)>::type;
  U u;
  memcpy(&u, &v, sizeof u);
  auto* b = reinterpret_cast<unsigned char*>(p);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(S)); ++i) b[i] = static_cast<unsigned char>(u >> (8 * i));
}

struct TypedAccess {
  template <typename S>
  __device__ __forceinline__ static S Load(const S* p) { return LoadElement(p); }
  template <typename S>
  __device__ __forceinline__ static void Store(S* p, S v) { StoreElement(p, v); }
};

struct ByteAccess {
  template <typename S>
  __device__ __forceinline__ static S Load(const S* p) { return LoadBytes(p); }
  template <typename S>
  __device__ __forceinline__ static void Store(S* p, S v) { StoreBytes(p, v); }
};

// ---- The reduce ----

// One launch's operands. The input pointers are read from the parameter block in place
// (__grid_constant__), never copied to local memory.
struct Operands {
  const void* const* srcs;
  int nsrcs;
  void* const* dsts;  // every output gets the same result (Stream::ReduceMulti)
  int ndsts;
  size_t count;
  uint32_t avg_divisor;
};

// Elements [begin, end), one per thread per step, through Access.
template <typename T, Op kOp, typename Access>
__device__ __forceinline__ void ReduceScalar(const Operands& o, const math::Finisher<T, kOp>& finish, size_t begin,
                                             size_t end, size_t tid, size_t stride) {
  using Tr = math::Traits<T>;
  using S = math::StorageOf<T>;
  for (size_t i = begin + tid; i < end; i += stride) {
    auto acc = Tr::Load(Access::Load(static_cast<const S*>(o.srcs[0]) + i));
#pragma unroll 1
    for (int k = 1; k < o.nsrcs; ++k)
      acc = math::Combine<T, kOp>(acc, Tr::Load(Access::Load(static_cast<const S*>(o.srcs[k]) + i)));
    const S result = finish(acc);
#pragma unroll 1
    for (int j = 0; j < o.ndsts; ++j) Access::Store(static_cast<S*>(o.dsts[j]) + i, result);
  }
}

// 8-bit sum, min and max combine four lanes per instruction (the SIMD video intrinsics) instead of
// unpacking 16 bytes per input: lane by lane the same as kernel_math's Combine (a lane add wraps
// modulo 2^8 as the unsigned accumulator does; min / max of integers have no ties to break, equal
// values being equal bits). avg accumulates the same packed sum and divides per lane at the end.
template <typename T, Op kOp>
constexpr bool kPackedBytes = std::is_integral<T>::value && sizeof(T) == 1 && kOp != Op::kProd;

template <typename T, Op kOp>
__device__ __forceinline__ uint32_t CombinePacked(uint32_t a, uint32_t b) {
  constexpr bool kSigned = std::is_signed<T>::value;
  if constexpr (kOp == Op::kSum || kOp == Op::kAvg) return __vadd4(a, b);
  else if constexpr (kOp == Op::kMin) return kSigned ? __vmins4(a, b) : __vminu4(a, b);
  else return kSigned ? __vmaxs4(a, b) : __vmaxu4(a, b);
}

template <typename T, Op kOp>
__device__ __forceinline__ uint4 CombinePacked(uint4 a, uint4 b) {
  return make_uint4(CombinePacked<T, kOp>(a.x, b.x), CombinePacked<T, kOp>(a.y, b.y), CombinePacked<T, kOp>(a.z, b.z),
                    CombinePacked<T, kOp>(a.w, b.w));
}

// One vector (16 bytes) of every input, vector index v from `base` elements. One vector per thread
// per step is what measured best on an H100: the loads of the n inputs are independent, and a
// full-occupancy grid keeps enough of them in flight; unrolling over more vectors per thread only
// added registers (and lost occupancy) for the small element types.
template <typename T, Op kOp>
__device__ __forceinline__ void ReduceVector(const Operands& o, const math::Finisher<T, kOp>& finish, size_t base,
                                             size_t v) {
  using Tr = math::Traits<T>;
  using S = math::StorageOf<T>;
  using Acc = math::AccumulatorOf<T>;
  constexpr int kPerVector = KZ_CUDA_VEC_BYTES / sizeof(S);
  static_assert(sizeof(uint4) == KZ_CUDA_VEC_BYTES, "one vector is a uint4");

  auto vector = [&](int k) { return reinterpret_cast<const uint4*>(static_cast<const S*>(o.srcs[k]) + base) + v; };
  auto store = [&](const uint4& y) {
#pragma unroll 1
    for (int j = 0; j < o.ndsts; ++j) *(reinterpret_cast<uint4*>(static_cast<S*>(o.dsts[j]) + base) + v) = y;
  };
  if constexpr (kPackedBytes<T, kOp>) {
    uint4 acc = __ldg(vector(0));
    for (int k = 1; k < o.nsrcs; ++k) acc = CombinePacked<T, kOp>(acc, __ldg(vector(k)));
    if constexpr (kOp == Op::kAvg) {
      S e[kPerVector];
      memcpy(e, &acc, sizeof e);
#pragma unroll
      for (int j = 0; j < kPerVector; ++j) e[j] = finish(static_cast<Acc>(e[j]));
      memcpy(&acc, e, sizeof acc);
    }
    store(acc);
    return;
  }
  Acc acc[kPerVector];
  {
    const uint4 x = __ldg(vector(0));
    S e[kPerVector];
    memcpy(e, &x, sizeof e);
#pragma unroll
    for (int j = 0; j < kPerVector; ++j) acc[j] = Tr::Load(e[j]);
  }
  for (int k = 1; k < o.nsrcs; ++k) {
    const uint4 x = __ldg(vector(k));
    S e[kPerVector];
    memcpy(e, &x, sizeof e);
#pragma unroll
    for (int j = 0; j < kPerVector; ++j) acc[j] = math::Combine<T, kOp>(acc[j], Tr::Load(e[j]));
  }
  S e[kPerVector];
#pragma unroll
  for (int j = 0; j < kPerVector; ++j) e[j] = finish(acc[j]);
  uint4 y;
  memcpy(&y, e, sizeof y);
  store(y);
}

template <typename T, Op kOp>
__device__ __forceinline__ void Reduce(const Operands& o) {
  using S = math::StorageOf<T>;
  constexpr size_t kPerVector = KZ_CUDA_VEC_BYTES / sizeof(S);
  // kernel_abi.h allows 1..KZ_CUDA_MAX_INPUTS; the host validates, and anything else does nothing
  // here rather than read past the parameter block.
  if (o.nsrcs < 1 || o.nsrcs > KZ_CUDA_MAX_INPUTS || o.ndsts < 1 || o.ndsts > KZ_CUDA_MAX_OUTPUTS) return;
  const math::Finisher<T, kOp> finish(o.avg_divisor);
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t count = o.count;

  // The path is the same for every thread of the launch (a uniform branch). Pointers that share
  // their offset within a vector (the usual case: aligned buffers, or the same element offset
  // into each) take vectors after a short scalar head; others go element by element.
  const uintptr_t offset = reinterpret_cast<uintptr_t>(o.dsts[0]) % KZ_CUDA_VEC_BYTES;
  bool same_offset = true;
  uintptr_t any_bits = 0;
#pragma unroll 1
  for (int k = 0; k < o.nsrcs; ++k) {
    const auto a = reinterpret_cast<uintptr_t>(o.srcs[k]);
    same_offset &= a % KZ_CUDA_VEC_BYTES == offset;
    any_bits |= a;
  }
#pragma unroll 1
  for (int j = 0; j < o.ndsts; ++j) {
    const auto a = reinterpret_cast<uintptr_t>(o.dsts[j]);
    same_offset &= a % KZ_CUDA_VEC_BYTES == offset;
    any_bits |= a;
  }
  if (same_offset && offset % sizeof(S) == 0) {
    const size_t head_want = offset == 0 ? 0 : (KZ_CUDA_VEC_BYTES - offset) / sizeof(S);
    const size_t head = head_want < count ? head_want : count;
    const size_t nvec = (count - head) / kPerVector;
    const size_t body_end = head + nvec * kPerVector;
    // The head and the tail (fewer than a vector each) go to the first threads.
    ReduceScalar<T, kOp, TypedAccess>(o, finish, 0, head, tid, stride);
    ReduceScalar<T, kOp, TypedAccess>(o, finish, body_end, count, tid, stride);
    for (size_t v = tid; v < nvec; v += stride) ReduceVector<T, kOp>(o, finish, head, v);
  } else if (any_bits % sizeof(S) == 0) {
    ReduceScalar<T, kOp, TypedAccess>(o, finish, 0, count, tid, stride);
  } else {
    ReduceScalar<T, kOp, ByteAccess>(o, finish, 0, count, tid, stride);
  }
}

template <typename T, Op kOp>
__device__ __forceinline__ void ReduceKernel(const KzReduceParams& p) {
  Reduce<T, kOp>(Operands{p.srcs, p.nsrcs, p.dsts, p.ndsts, p.count, p.avg_divisor});
}

// Scale is avg's finish on one input (host_reduce.h: HostScale).
template <typename T>
__device__ __forceinline__ void ScaleKernel(const KzScaleParams& p) {
  Reduce<T, Op::kAvg>(Operands{&p.src, 1, &p.dst, 1, p.count, p.divisor});
}

}  // namespace
}  // namespace kizuna::cuda

// ---- The entry points (kernel_abi.h) ----

using kizuna::cuda::ReduceKernel;
using kizuna::cuda::ScaleKernel;
using kizuna::cuda::math::BF16;
using kizuna::cuda::math::F16;
using kizuna::cuda::math::Op;

#define KZ_KERNEL extern "C" __global__ void __launch_bounds__(KZ_CUDA_BLOCK_THREADS)

KZ_KERNEL kz_reduce_f16_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<F16, Op::kSum>(p); }
KZ_KERNEL kz_reduce_f16_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<F16, Op::kProd>(p); }
KZ_KERNEL kz_reduce_f16_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<F16, Op::kMin>(p); }
KZ_KERNEL kz_reduce_f16_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<F16, Op::kMax>(p); }
KZ_KERNEL kz_reduce_f16_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<F16, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_bf16_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<BF16, Op::kSum>(p); }
KZ_KERNEL kz_reduce_bf16_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<BF16, Op::kProd>(p); }
KZ_KERNEL kz_reduce_bf16_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<BF16, Op::kMin>(p); }
KZ_KERNEL kz_reduce_bf16_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<BF16, Op::kMax>(p); }
KZ_KERNEL kz_reduce_bf16_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<BF16, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_f32_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<float, Op::kSum>(p); }
KZ_KERNEL kz_reduce_f32_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<float, Op::kProd>(p); }
KZ_KERNEL kz_reduce_f32_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<float, Op::kMin>(p); }
KZ_KERNEL kz_reduce_f32_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<float, Op::kMax>(p); }
KZ_KERNEL kz_reduce_f32_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<float, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_f64_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<double, Op::kSum>(p); }
KZ_KERNEL kz_reduce_f64_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<double, Op::kProd>(p); }
KZ_KERNEL kz_reduce_f64_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<double, Op::kMin>(p); }
KZ_KERNEL kz_reduce_f64_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<double, Op::kMax>(p); }
KZ_KERNEL kz_reduce_f64_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<double, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_i8_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<int8_t, Op::kSum>(p); }
KZ_KERNEL kz_reduce_i8_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<int8_t, Op::kProd>(p); }
KZ_KERNEL kz_reduce_i8_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<int8_t, Op::kMin>(p); }
KZ_KERNEL kz_reduce_i8_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<int8_t, Op::kMax>(p); }
KZ_KERNEL kz_reduce_i8_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<int8_t, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_u8_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint8_t, Op::kSum>(p); }
KZ_KERNEL kz_reduce_u8_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint8_t, Op::kProd>(p); }
KZ_KERNEL kz_reduce_u8_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint8_t, Op::kMin>(p); }
KZ_KERNEL kz_reduce_u8_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint8_t, Op::kMax>(p); }
KZ_KERNEL kz_reduce_u8_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint8_t, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_i32_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<int32_t, Op::kSum>(p); }
KZ_KERNEL kz_reduce_i32_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<int32_t, Op::kProd>(p); }
KZ_KERNEL kz_reduce_i32_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<int32_t, Op::kMin>(p); }
KZ_KERNEL kz_reduce_i32_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<int32_t, Op::kMax>(p); }
KZ_KERNEL kz_reduce_i32_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<int32_t, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_u32_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint32_t, Op::kSum>(p); }
KZ_KERNEL kz_reduce_u32_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint32_t, Op::kProd>(p); }
KZ_KERNEL kz_reduce_u32_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint32_t, Op::kMin>(p); }
KZ_KERNEL kz_reduce_u32_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint32_t, Op::kMax>(p); }
KZ_KERNEL kz_reduce_u32_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint32_t, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_i64_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<int64_t, Op::kSum>(p); }
KZ_KERNEL kz_reduce_i64_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<int64_t, Op::kProd>(p); }
KZ_KERNEL kz_reduce_i64_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<int64_t, Op::kMin>(p); }
KZ_KERNEL kz_reduce_i64_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<int64_t, Op::kMax>(p); }
KZ_KERNEL kz_reduce_i64_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<int64_t, Op::kAvg>(p); }

KZ_KERNEL kz_reduce_u64_sum(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint64_t, Op::kSum>(p); }
KZ_KERNEL kz_reduce_u64_prod(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint64_t, Op::kProd>(p); }
KZ_KERNEL kz_reduce_u64_min(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint64_t, Op::kMin>(p); }
KZ_KERNEL kz_reduce_u64_max(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint64_t, Op::kMax>(p); }
KZ_KERNEL kz_reduce_u64_avg(const __grid_constant__ KzReduceParams p) { ReduceKernel<uint64_t, Op::kAvg>(p); }

KZ_KERNEL kz_scale_f16(const __grid_constant__ KzScaleParams p) { ScaleKernel<F16>(p); }
KZ_KERNEL kz_scale_bf16(const __grid_constant__ KzScaleParams p) { ScaleKernel<BF16>(p); }
KZ_KERNEL kz_scale_f32(const __grid_constant__ KzScaleParams p) { ScaleKernel<float>(p); }
KZ_KERNEL kz_scale_f64(const __grid_constant__ KzScaleParams p) { ScaleKernel<double>(p); }
KZ_KERNEL kz_scale_i8(const __grid_constant__ KzScaleParams p) { ScaleKernel<int8_t>(p); }
KZ_KERNEL kz_scale_u8(const __grid_constant__ KzScaleParams p) { ScaleKernel<uint8_t>(p); }
KZ_KERNEL kz_scale_i32(const __grid_constant__ KzScaleParams p) { ScaleKernel<int32_t>(p); }
KZ_KERNEL kz_scale_u32(const __grid_constant__ KzScaleParams p) { ScaleKernel<uint32_t>(p); }
KZ_KERNEL kz_scale_i64(const __grid_constant__ KzScaleParams p) { ScaleKernel<int64_t>(p); }
KZ_KERNEL kz_scale_u64(const __grid_constant__ KzScaleParams p) { ScaleKernel<uint64_t>(p); }

#undef KZ_KERNEL
