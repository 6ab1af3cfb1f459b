// The loader's error paths, which every machine can exercise: a missing library, a library that
// lacks functions, zeInit failing (the real loader without a driver, and each branch of
// InitDrivers), and the ze_result_t names and Status codes.
#include "devices/level_zero/loader.h"

#include <climits>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "runtime/core/status.h"

namespace kizuna::level_zero {
namespace {

bool Mentions(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

// The partial library built next to this test (BUILD: data), by absolute path.
std::string PartialLibrary() {
  char resolved[PATH_MAX];
  const char* relative = "devices/level_zero/libze_partial_for_test.so";
  return ::realpath(relative, resolved) != nullptr ? std::string(resolved) : std::string(relative);
}

TEST(LevelZeroLoader, MissingLibraryIsNamed) {
  auto r = OpenLoader("libkz_no_such_ze_loader.so.1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Mentions(r.status(), "cannot load libkz_no_such_ze_loader.so.1")) << r.status().ToString();
}

TEST(LevelZeroLoader, MissingSymbolsAreNamed) {
  const std::string path = PartialLibrary();
  auto r = OpenLoader(path);
  ASSERT_FALSE(r.ok()) << path << " has only two functions, yet it loaded";
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  const std::string m = r.status().message();
  EXPECT_TRUE(Mentions(r.status(), "libze_partial_for_test.so")) << m;
  EXPECT_TRUE(Mentions(r.status(), "lacks zeDriverGetApiVersion, ")) << m;  // the first missing one, listed first
  EXPECT_TRUE(Mentions(r.status(), "zeMemAllocDevice")) << m;
  EXPECT_TRUE(Mentions(r.status(), "zeMemCloseIpcHandle")) << m;  // the last one
  // Present functions are not listed; the optional one is never required.
  EXPECT_FALSE(Mentions(r.status(), "zeInit")) << m;
  EXPECT_FALSE(Mentions(r.status(), "zeDriverGet,")) << m;
  EXPECT_FALSE(Mentions(r.status(), "zeDevicePciGetPropertiesExt")) << m;
}

TEST(LevelZeroLoader, LibraryWithoutLevelZeroNamesEveryFunction) {
  auto r = OpenLoader("libc.so.6");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Mentions(r.status(), "lacks zeInit, zeDriverGet, ")) << r.status().ToString();
}

ze_result_t InitUninitialized(ze_init_flags_t) { return ZE_RESULT_ERROR_UNINITIALIZED; }
ze_result_t InitDeviceLost(ze_init_flags_t) { return ZE_RESULT_ERROR_DEVICE_LOST; }
ze_result_t InitOk(ze_init_flags_t flags) {
  return flags == 0 ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ENUMERATION;
}

TEST(LevelZeroLoader, InitDriversNamesTheResult) {
  ZeApi api;
  api.library = "/usr/lib/libze_loader.so.1";
  api.zeInit = &InitUninitialized;
  Status s = InitDrivers(api);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Mentions(s, "zeInit: ZE_RESULT_ERROR_UNINITIALIZED (no Level Zero driver")) << s.ToString();

  api.zeInit = &InitDeviceLost;
  s = InitDrivers(api);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Mentions(s, "zeInit: ZE_RESULT_ERROR_DEVICE_LOST")) << s.ToString();
  EXPECT_FALSE(Mentions(s, "no Level Zero driver")) << s.ToString();

  api.zeInit = &InitOk;  // InitDrivers passes flags 0 (all driver types)
  EXPECT_TRUE(InitDrivers(api).ok());
}

// The real loader of this machine (libze1, a dependency of libze-dev in ./kz setup).
TEST(LevelZeroLoader, RealLoaderWithoutDriverIsUnavailable) {
  auto api = OpenLoader(kLoaderLibrary);
  if (!api.ok()) {
    EXPECT_TRUE(Mentions(api.status(), kLoaderLibrary)) << api.status().ToString();
    GTEST_SKIP() << "no Level Zero loader here: " << api.status().ToString();
  }
  const Status s = InitDrivers(**api);
  if (s.ok()) GTEST_SKIP() << "a Level Zero driver is installed here: the no-driver path cannot be seen";
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Mentions(s, "zeInit: ZE_RESULT_")) << s.ToString();
  // Loader 1.8 without a driver answers exactly this (README.md, as seen on the build machines).
  EXPECT_TRUE(Mentions(s, "ZE_RESULT_ERROR_UNINITIALIZED (no Level Zero driver")) << s.ToString();
  // Loader() gives the same answer, every call.
  auto once = Loader();
  ASSERT_FALSE(once.ok());
  EXPECT_EQ(once.status().message(), s.message());
  EXPECT_EQ(Loader().status().message(), s.message());
}

TEST(LevelZeroLoader, ResultNames) {
  EXPECT_EQ(ResultName(ZE_RESULT_SUCCESS), "ZE_RESULT_SUCCESS");
  EXPECT_EQ(ResultName(ZE_RESULT_NOT_READY), "ZE_RESULT_NOT_READY");
  EXPECT_EQ(ResultName(ZE_RESULT_ERROR_UNINITIALIZED), "ZE_RESULT_ERROR_UNINITIALIZED");
  EXPECT_EQ(ResultName(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY), "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY");
  EXPECT_EQ(ResultName(ZE_RESULT_ERROR_OVERLAPPING_REGIONS), "ZE_RESULT_ERROR_OVERLAPPING_REGIONS");
  EXPECT_EQ(ResultName(ZE_RESULT_ERROR_UNKNOWN), "ZE_RESULT_ERROR_UNKNOWN");
  EXPECT_EQ(ResultName(static_cast<ze_result_t>(0x12345678)), "ze_result_t 0x12345678");
}

TEST(LevelZeroLoader, ErrorCodes) {
  auto code = [](ze_result_t r) { return ZeError(r, "zeX").code(); };
  EXPECT_EQ(code(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY), StatusCode::kOutOfMemory);
  EXPECT_EQ(code(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY), StatusCode::kOutOfMemory);
  EXPECT_EQ(code(ZE_RESULT_ERROR_INVALID_ARGUMENT), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ZE_RESULT_ERROR_INVALID_NULL_POINTER), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE), StatusCode::kNotSupported);
  EXPECT_EQ(code(ZE_RESULT_ERROR_UNSUPPORTED_SIZE), StatusCode::kNotSupported);
  EXPECT_EQ(code(ZE_RESULT_ERROR_UNINITIALIZED), StatusCode::kUnavailable);
  EXPECT_EQ(code(ZE_RESULT_ERROR_DEVICE_LOST), StatusCode::kInternal);
  EXPECT_EQ(code(static_cast<ze_result_t>(0x12345678)), StatusCode::kInternal);
  EXPECT_EQ(ZeError(ZE_RESULT_ERROR_DEVICE_LOST, "level_zero:0: zeEventHostSynchronize").message(),
            "level_zero:0: zeEventHostSynchronize: ZE_RESULT_ERROR_DEVICE_LOST");
}

}  // namespace
}  // namespace kizuna::level_zero
