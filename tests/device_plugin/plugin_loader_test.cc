// LoadDevicePlugin's refusals and teardown: every way a broken plugin (testdata/) is refused, the
// example plugin's own knobs refusing to start it, and a teardown bounded by KIZUNA_TIMEOUT that
// keeps an abandoned library loaded.
#include "runtime/device/plugin_backend.h"

#include <chrono>
#include <future>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/config.h"
#include "runtime/device/device.h"
#include "runtime/status.h"
#include "tests/device_plugin/plugin_test_util.h"

namespace kizuna::device {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// stream_destroy takes no timeout in api 1.0: the plugin bounds it by KIZUNA_TIMEOUT. With a host
// callback that does not return, the destroy gives up (the worker finishes the callback later and
// frees the stream itself), and kizuna keeps that library loaded for the worker's sake. A copy of
// the plugin is used, so the library it leaves loaded is not the one other tests unload.
TEST(ExamplePluginTeardown, DestroyIsBoundedByKizunaTimeoutWhenACallbackHangs) {
  const std::string copy = CopyOfExamplePlugin("libkz_example_hung_callback.so");
  Config config = TestConfig();
  std::unique_ptr<Backend> backend;
  {
    ScopedEnv timeout("KIZUNA_TIMEOUT", "0.2");  // read by the plugin in init
    auto loaded = LoadDevicePlugin(copy, config);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    backend = std::move(loaded).value();
  }
  auto stream = backend->device(0)->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  const int threads_with_stream = ThreadCount();

  auto gate = std::make_shared<Gate>();
  auto returned = std::make_shared<std::promise<Status>>();
  auto aborted = std::make_shared<std::promise<Status>>();
  ASSERT_TRUE((*stream)
                  ->EnqueueHostCallback([gate, returned](const Status& s) {
                    EXPECT_TRUE(gate->WaitOpen(std::chrono::seconds(10)));
                    returned->set_value(s);
                  })
                  .ok());
  ASSERT_TRUE((*stream)->EnqueueHostCallback([aborted](const Status& s) { aborted->set_value(s); }).ok());

  const auto start = std::chrono::steady_clock::now();
  stream->reset();  // 0.2 s for the queue, a cancel, 0.2 s for the callback: then it gives up
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(350));
  EXPECT_LT(waited, std::chrono::seconds(5));
  backend.reset();  // every object is gone, but the library must stay: its worker still runs
  EXPECT_TRUE(LibraryLoaded(copy));

  gate->Open();
  auto r = returned->get_future();
  ASSERT_EQ(r.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(r.get().ok());
  // The callback queued behind the hung one still ran, exactly once, told why.
  auto a = aborted->get_future();
  ASSERT_EQ(a.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Status as = a.get();
  EXPECT_EQ(as.code(), StatusCode::kAborted) << as.ToString();
  // The worker then exits on its own (and frees the stream: ASan / valgrind runs would see it).
  EXPECT_TRUE(Eventually([&] { return ThreadCount() < threads_with_stream; }));
  EXPECT_TRUE(LibraryLoaded(copy)) << "an abandoned plugin must stay loaded";
}

// ---- the registry: each plugin file once, each backend name once ----

TEST(ExamplePluginConfig, NoDevicesIsUnavailable) {
  ScopedEnv none("KZ_EXAMPLE_DEVICES", "0");
  Config config = TestConfig();
  auto r = LoadDevicePlugin(g_example_plugin, config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("KZ_EXAMPLE_DEVICES=0"), HasSubstr(g_example_plugin)));
}

TEST(ExamplePluginConfig, MalformedKnobIsAnError) {
  ScopedEnv bad("KZ_EXAMPLE_DEVICES", "lots");
  Config config = TestConfig();
  auto r = LoadDevicePlugin(g_example_plugin, config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("KZ_EXAMPLE_DEVICES='lots'"));
}

// ---- refused plugins ----

struct BrokenCase {
  std::string name;                   // test name
  std::string file;                   // testdata file ("" : a path that does not exist)
  StatusCode code;
  std::vector<std::string> mentions;  // substrings of the message
};

void PrintTo(const BrokenCase& c, std::ostream* os) { *os << c.name; }

class BrokenPluginTest : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(BrokenPluginTest, IsRefusedWithAClearError) {
  const BrokenCase& c = GetParam();
  const std::string path = c.file.empty() ? "/nonexistent/libkz_missing_device.so" : TestData(c.file);
  Config config = TestConfig();
  auto r = LoadDevicePlugin(path, config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(path));
  for (const std::string& m : c.mentions) EXPECT_THAT(r.status().message(), HasSubstr(m));
}

INSTANTIATE_TEST_SUITE_P(
    Loader, BrokenPluginTest,
    ::testing::Values(
        BrokenCase{"ApiMajor99", "libbroken_api_major_99.so", StatusCode::kInvalidArgument,
                   {"plugin api version 99.0", "kizuna's device plugin api 1.0"}},
        BrokenCase{"NoEntryPoint", "libbroken_no_entry_point.so", StatusCode::kInvalidArgument,
                   {"does not export kzDevicePluginGetApi"}},
        BrokenCase{"NullTable", "libbroken_null_table.so", StatusCode::kInvalidArgument, {"returned no api table"}},
        BrokenCase{"ShortTable", "libbroken_short_table.so", StatusCode::kInvalidArgument,
                   {"struct_size", "smaller than"}},
        BrokenCase{"MissingFunction", "libbroken_missing_function.so", StatusCode::kInvalidArgument,
                   {"'stream_query' is NULL"}},
        BrokenCase{"BadName", "libbroken_bad_name.so", StatusCode::kInvalidArgument, {"'Broken-Test!'", "[a-z0-9_]"}},
        BrokenCase{"ExportWithoutImport", "libbroken_export_without_import.so", StatusCode::kInvalidArgument,
                   {"'mem_import_fd' is NULL"}},
        BrokenCase{"InitUnavailable", "libbroken_init_unavailable.so", StatusCode::kUnavailable,
                   {"init failed", "KZ_PLUGIN_ERR_UNAVAILABLE", "no broken_test hardware on this machine"}},
        BrokenCase{"NotASharedLibrary", "broken_plugin.c", StatusCode::kInvalidArgument, {"dlopen failed"}},
        BrokenCase{"NonexistentPath", "", StatusCode::kInvalidArgument, {"dlopen failed", "No such file"}}),
    [](const ::testing::TestParamInfo<BrokenCase>& info) { return info.param.name; });

TEST(BrokenPlugin, EmptyPath) {
  Config config = TestConfig();
  auto r = LoadDevicePlugin("", config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("path is empty"));
}
}  // namespace
}  // namespace kizuna::device
