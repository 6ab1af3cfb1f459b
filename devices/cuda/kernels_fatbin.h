// The CUDA kernels (kernels.cu, every name in kernel_abi.h) compiled by nvcc into one fatbin and
// embedded in the library: SASS for sm_80 and sm_90 plus compute_90 PTX by default, the longer list
// with --//devices/cuda:archs=all (BUILD). The backend passes kKizunaCudaFatbin to
// cuModuleLoadData once per device; the driver picks the SASS for the device's architecture, or
// JIT-compiles the PTX for a newer one.
//
// The image starts with the fatbin header (magic 0xBA55ED50, little endian) and is 8-byte aligned,
// as cuModuleLoadData requires of a fatbin in memory. Generated at build time; both symbols are
// immutable and live for the whole program.
#ifndef KIZUNA_DEVICES_CUDA_KERNELS_FATBIN_H_
#define KIZUNA_DEVICES_CUDA_KERNELS_FATBIN_H_

#include <cstddef>

namespace kizuna::cuda {

alignas(8) extern const unsigned char kKizunaCudaFatbin[];
extern const size_t kKizunaCudaFatbinSize;  // bytes

}  // namespace kizuna::cuda

#endif  // KIZUNA_DEVICES_CUDA_KERNELS_FATBIN_H_
