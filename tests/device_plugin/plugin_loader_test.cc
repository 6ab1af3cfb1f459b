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

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/device/kizuna_device_plugin.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
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

TEST(ExamplePluginConfig, MalformedApiMinorIsAnError) {
  ScopedEnv bad("KZ_EXAMPLE_API_MINOR", "7");
  Config config = TestConfig();
  auto r = LoadDevicePlugin(g_example_plugin, config);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("KZ_EXAMPLE_API_MINOR='7'"));
}

// ---- minor versions ----

// A plugin built against api 1.0 has the smaller table (struct_size ends at event_synchronize) and
// no stream_scale. It still loads and works; Scale answers kNotSupported and enqueues nothing. The
// example plugin serves exactly such a table with KZ_EXAMPLE_API_MINOR=0, and leaves its
// stream_scale pointer in the bytes past struct_size: kizuna must not read (or call) it.
TEST(PluginApiMinor, AMinor0PluginLoadsAndAnswersNotSupportedForScale) {
  Config config = TestConfig();
  std::unique_ptr<Backend> backend;
  {
    ScopedEnv minor0("KZ_EXAMPLE_API_MINOR", "0");  // read by the entry point and by init
    auto loaded = LoadDevicePlugin(g_example_plugin, config);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    backend = std::move(loaded).value();
  }
  Device& dev = *backend->device(0);
  auto buffer = dev.Allocate(3 * 64 * sizeof(int32_t));
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  auto* v = static_cast<int32_t*>((*buffer)->data());
  for (int i = 0; i < 3 * 64; ++i) v[i] = -i;
  auto stream = dev.CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();

  Status s = (*stream)->Scale(v + 64, v, 64, DataType::kInt32, 2);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.ToString();
  EXPECT_THAT(s.message(), AllOf(HasSubstr("example:0"), HasSubstr("has no scale operation"),
                                 HasSubstr("plugin api 1.1"), HasSubstr("built against 1.0")));
  // Argument checks come first, whatever the backend supports; count 0 never reaches it.
  EXPECT_EQ((*stream)->Scale(v + 64, v, 64, DataType::kInt32, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*stream)->Scale(v + 64, v, 0, DataType::kInt32, 2).ok());

  // Nothing was enqueued, the stream is healthy, and the api 1.0 operations work.
  const void* srcs[] = {v, v + 64};
  ASSERT_TRUE((*stream)->Reduce(v + 128, srcs, 64, DataType::kInt32, ReduceOp::kSum).ok());
  Status sync = (*stream)->Synchronize();
  ASSERT_TRUE(sync.ok()) << sync.ToString();
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(v[64 + i], -(64 + i)) << "the refused scale wrote element " << i;
    ASSERT_EQ(v[128 + i], -i - (64 + i)) << "element " << i;
  }
}

// The same library without the knob serves api 1.1, stream_scale included.
TEST(PluginApiMinor, AMinor1PluginScales) {
  Config config = TestConfig();
  auto loaded = LoadDevicePlugin(g_example_plugin, config);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::unique_ptr<Backend> backend = std::move(loaded).value();
  auto buffer = backend->device(0)->Allocate(64 * sizeof(int32_t));
  ASSERT_TRUE(buffer.ok());
  auto* v = static_cast<int32_t*>((*buffer)->data());
  for (int i = 0; i < 64; ++i) v[i] = -i;
  auto stream = backend->device(0)->CreateStream();
  ASSERT_TRUE(stream.ok());
  Status s = (*stream)->Scale(v, v, 64, DataType::kInt32, 3);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE((*stream)->Synchronize().ok());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(v[i], -i / 3) << "element " << i;
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
                   {"plugin api version 99.0",
                    "kizuna's device plugin api " + std::to_string(KZ_DEVICE_PLUGIN_API_MAJOR) + "." +
                        std::to_string(KZ_DEVICE_PLUGIN_API_MINOR)}},
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
