// How this build was configured. KIZUNA_WITH_CUDA (0/1) and KIZUNA_CUDA_SWITCH ("auto", "on",
// "off") come from //bazel:cuda; the toolkit facts from the generated @local_cuda header.
#pragma once

#include "local_cuda/cuda_toolkit.h"

namespace kizuna::build {

inline constexpr bool kWithCuda = KIZUNA_WITH_CUDA != 0;
inline constexpr const char* kCudaSwitch = KIZUNA_CUDA_SWITCH;
inline constexpr bool kCudaToolkitFound = KIZUNA_CUDA_TOOLKIT_FOUND != 0;
inline constexpr const char* kCudaToolkitPath = KIZUNA_CUDA_TOOLKIT_PATH;
inline constexpr const char* kCudaToolkitVersion = KIZUNA_CUDA_TOOLKIT_VERSION;

}  // namespace kizuna::build
