// The build's view of the machine matches the machine: the CUDA toolkit detection, the CUDA switch,
// and the headers of every system library the project declares (installed by `./kz setup`).
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

// Declared system libraries: their headers must be present (later layers include them; the vendor
// libraries are reached through dlopen at run time, so nothing here links them).
#include <CLI/CLI.hpp>
#include <hwloc.h>
#include <infiniband/verbs.h>
#include <level_zero/ze_api.h>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/version.h>
#include <rdma/fabric.h>
#include <rdma/rdma_cma.h>

#include "bazel/build_config.h"

namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(BuildConfigTest, CudaDetectionMatchesTheMachine) {
  const char* env = std::getenv("KIZUNA_CUDA_PATH");
  bool nvcc_here = Exists("/usr/local/cuda/bin/nvcc") || (env != nullptr && Exists(std::string(env) + "/bin/nvcc"));
  EXPECT_EQ(kizuna::build::kCudaToolkitFound, nvcc_here);
  if (kizuna::build::kCudaToolkitFound) {
    EXPECT_TRUE(Exists(std::string(kizuna::build::kCudaToolkitPath) + "/include/cuda_runtime_api.h"));
    EXPECT_FALSE(std::string(kizuna::build::kCudaToolkitVersion).empty());
  }
  std::string sw = kizuna::build::kCudaSwitch;
  bool expected = sw == "on" || (sw == "auto" && kizuna::build::kCudaToolkitFound);
  EXPECT_EQ(kizuna::build::kWithCuda, expected) << "switch " << sw;
}

TEST(BuildConfigTest, SystemLibraryVersions) {
  EXPECT_GE(FI_MAJOR_VERSION * 100 + FI_MINOR_VERSION, 117);  // libfabric 1.17 (Debian 12) or newer
  EXPECT_GE(TBB_VERSION_MAJOR, 2021);
  EXPECT_GE(HWLOC_API_VERSION, 0x00020000);
  EXPECT_GE(ZE_API_VERSION_CURRENT, ZE_MAKE_VERSION(1, 0));
  EXPECT_GE(NLOHMANN_JSON_VERSION_MAJOR, 3);
  EXPECT_NE(CLI11_VERSION_MAJOR, 0);
  EXPECT_GT(sizeof(ibv_device_attr), 0u);
  EXPECT_GT(sizeof(rdma_cm_id), 0u);
}

}  // namespace
