// KIZUNA_TEST_BACKEND (world.h), the switch that moves the engine's tests onto another backend's
// devices: a world on `cuda` skips with the driver's reason where there is no GPU (CI), and runs
// an AllReduce of two ranks on GPU 0 where there is one; a name no backend has is an error naming
// the backends there are.
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/collectives/world.h"

namespace kizuna::test {
namespace {

#define KZ_ASSERT_OK(expr)                         \
  do {                                             \
    const Status kz_s = (expr);                    \
    ASSERT_TRUE(kz_s.ok()) << kz_s.ToString();     \
  } while (0)

// Sets KIZUNA_TEST_BACKEND for one scope.
class ScopedTestBackend {
 public:
  explicit ScopedTestBackend(const char* name) { ::setenv("KIZUNA_TEST_BACKEND", name, 1); }
  ~ScopedTestBackend() { ::unsetenv("KIZUNA_TEST_BACKEND"); }
};

[[maybe_unused]] bool DriverLoads() {
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return false;
  ::dlclose(h);
  return true;
}

TEST(TestBackend, CudaSkipsWithTheReasonOrRuns) {
  ScopedTestBackend backend("cuda");
  World w(2, WorldConfig(1));
#ifndef KIZUNA_TEST_HAVE_CUDA
  // Built without the CUDA backend: the world says so instead of running on something else.
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().ToString();
  EXPECT_NE(w.status().message().find("no backend of that name"), std::string::npos) << w.status().ToString();
  GTEST_SKIP() << "built without the CUDA backend (--//bazel:cuda=off or no toolkit)";
#else
  if (!w.skip_reason().empty()) {
    // No driver or no GPU here: a reason a person can act on, and no error.
    EXPECT_TRUE(w.status().code() == StatusCode::kUnavailable) << w.status().ToString();
    EXPECT_NE(w.skip_reason().find("KIZUNA_TEST_BACKEND=cuda"), std::string::npos) << w.skip_reason();
    if (!DriverLoads()) {
      EXPECT_NE(w.skip_reason().find("libcuda.so.1"), std::string::npos) << w.skip_reason();
    }
    GTEST_SKIP() << w.skip_reason();
  }
  ASSERT_TRUE(w.status().ok()) << w.status().ToString();
  // A GPU: two ranks (on one GPU when there is only one) sum 1 Mi floats.
  constexpr uint64_t kCount = 1 << 20;
  std::vector<std::unique_ptr<device::Buffer>> in, out;
  for (int r = 0; r < 2; ++r) {
    in.push_back(Alloc(w, r, kCount * sizeof(float)));
    out.push_back(Alloc(w, r, kCount * sizeof(float)));
    ASSERT_TRUE(in.back() && out.back());
    std::vector<float> values(kCount);
    for (uint64_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(InputValue(ReduceOp::kSum, r, i));
    KZ_ASSERT_OK(w.Upload(r, in.back()->data(), values));
  }
  for (int r = 0; r < 2; ++r)
    KZ_ASSERT_OK(w.comm(r).AllReduce(in[r]->data(), out[r]->data(), kCount, DataType::kFloat32, ReduceOp::kSum,
                                     w.stream(r)));
  KZ_ASSERT_OK(w.SyncAll());
  for (int r = 0; r < 2; ++r) {
    auto got = w.Download<float>(r, out[r]->data(), kCount);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (uint64_t i = 0; i < kCount; ++i)
      ASSERT_EQ((*got)[i], Reduced(ReduceOp::kSum, 2, i, DataType::kFloat32)) << "rank " << r << " element " << i;
  }
#endif
}

TEST(TestBackend, AnUnknownNameIsAnErrorNamingTheBackends) {
  ScopedTestBackend backend("no_such_backend");
  World w(2, WorldConfig(1));
  EXPECT_TRUE(w.skip_reason().empty());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().ToString();
  EXPECT_NE(w.status().message().find("KIZUNA_TEST_BACKEND=no_such_backend"), std::string::npos);
  EXPECT_NE(w.status().message().find("host_emulated"), std::string::npos) << w.status().ToString();
}

}  // namespace
}  // namespace kizuna::test
