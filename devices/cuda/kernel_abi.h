// The contract between the CUDA backend's host code (stream.cc) and its kernels (kernels.cu):
// kernel names, parameter blocks and launch shape. Plain C layout, included by both g++ and nvcc.
//
// Kernels are compiled once by nvcc into a fatbin (sm_80, sm_90 and compute_90 PTX by default)
// that is embedded in the library (kernels_fatbin.h) and loaded per device with cuModuleLoadData;
// each is looked up by name with cuModuleGetFunction.
//
// Names:
//   kz_reduce_<type>_<op>   type: f16 bf16 f32 f64 i8 u8 i32 u32 i64 u64
//                           op:   sum prod min max avg
//   kz_scale_<type>
// Every kernel takes one parameter, its parameter block by value.
//
// Semantics are runtime/device/host_reduce.h's, bit for bit: float16 / bfloat16 accumulate in float32 and
// round once (round to nearest even); float32 accumulates in float32 in input order, float64 in
// float64; integers wrap (sum, prod modulo 2^bits); avg is the sum in the accumulation type
// (integers: the wrapped sum) divided by the input count (integers: truncation toward zero, signed
// types as signed values). min / max of floating types as host_reduce.h defines them for NaN.
// Scale divides by `divisor` the same way (one input).
//
// Launch shape: a 1-D grid of 1-D blocks of KZ_CUDA_BLOCK_THREADS threads; the kernels use a
// grid-stride loop, so any grid size is correct. Each thread handles KZ_CUDA_VEC_BYTES bytes per
// step with vector loads when every pointer is KZ_CUDA_VEC_BYTES-aligned, element by element
// otherwise (a uniform branch per launch).
#ifndef KIZUNA_DEVICES_CUDA_KERNEL_ABI_H_
#define KIZUNA_DEVICES_CUDA_KERNEL_ABI_H_

#ifdef __cplusplus
extern "C" {
#endif

// Inputs per launch. A reduce of more inputs is split by the host into launches that fold
// into the output (the output becoming the first input of the next launch).
#define KZ_CUDA_MAX_INPUTS 32
// Outputs per launch (Stream::ReduceMulti: the fused AllReduce writes every rank's output). More
// outputs take the device layer's default (one output, then copies).
#define KZ_CUDA_MAX_OUTPUTS 32
#define KZ_CUDA_BLOCK_THREADS 512
#define KZ_CUDA_VEC_BYTES 16

struct KzReduceParams {
  const void* srcs[KZ_CUDA_MAX_INPUTS];  // nsrcs device (or mapped host) addresses
  void* dsts[KZ_CUDA_MAX_OUTPUTS];       // ndsts outputs, each equal to one of srcs or disjoint from all
  unsigned long long count;              // elements
  int nsrcs;                             // 1..KZ_CUDA_MAX_INPUTS
  int ndsts;                             // 1..KZ_CUDA_MAX_OUTPUTS
  // avg only: the divisor (the total number of inputs of the whole reduce, which may span several
  // launches; the launches before the last are sums). Ignored by other ops.
  unsigned int avg_divisor;
};

struct KzScaleParams {
  const void* src;
  void* dst;  // may equal src
  unsigned long long count;
  unsigned int divisor;  // >= 1
};

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KIZUNA_DEVICES_CUDA_KERNEL_ABI_H_
