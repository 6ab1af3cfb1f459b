// The example plugin through the Backend / Device / Stream / Event wrapper. The generic device
// behaviour (dtype x op sweeps, sizes, concurrency) is the conformance suite's job; this file checks
// the conversion of plugin results into Status and the wrapper's plumbing (streams released from
// their own host callbacks, the library outliving its backend).
#include "runtime/device/plugin_backend.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <future>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/device/kizuna_device_plugin.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "tests/device_plugin/plugin_test_util.h"

namespace kizuna::device {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class ExamplePluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = LoadDevicePlugin(g_example_plugin, config_);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    backend_ = std::move(loaded).value();
    ASSERT_EQ(backend_->device_count(), 2);
  }

  Device& device(int i) { return *backend_->device(i); }

  std::unique_ptr<Buffer> Allocate(int dev, size_t bytes) {
    auto b = device(dev).Allocate(bytes);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return b.ok() ? std::move(b).value() : nullptr;
  }

  std::unique_ptr<Stream> CreateStream(int dev) {
    auto s = device(dev).CreateStream();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::unique_ptr<Event> CreateEvent(int dev) {
    auto e = device(dev).CreateEvent();
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }

  Config config_ = TestConfig();
  std::unique_ptr<Backend> backend_;
};

TEST_F(ExamplePluginTest, NameDevicesAndProperties) {
  EXPECT_EQ(backend_->name(), "example");
  EXPECT_EQ(backend_->device(2), nullptr);
  EXPECT_EQ(backend_->device(-1), nullptr);
  for (int i = 0; i < 2; ++i) {
    const DeviceProperties& p = device(i).properties();
    EXPECT_EQ(p.backend, "example");
    EXPECT_EQ(p.index, i);
    EXPECT_EQ(p.name, "example device " + std::to_string(i) + " (host memory)");
    EXPECT_EQ(p.uuid, "kz-example-" + std::to_string(i));
    EXPECT_GT(p.memory_bytes, 0u);
    EXPECT_TRUE(p.host_accessible);
    EXPECT_TRUE(p.export_fd);
    EXPECT_FALSE(p.export_opaque);
    EXPECT_EQ(p.pci_bus_id, "");
    EXPECT_EQ(p.numa_node, -1);
    EXPECT_EQ(p.copy_gbps, 0.0);
    EXPECT_EQ(device(i).label(), "example:" + std::to_string(i));
  }
}

TEST_F(ExamplePluginTest, AllocateCopyAndReduce) {
  constexpr size_t kCount = 5000;  // several of the plugin's reduce blocks, and a partial one
  auto a = Allocate(0, kCount * sizeof(float));
  auto b = Allocate(0, kCount * sizeof(float));
  auto c = Allocate(0, kCount * sizeof(float));
  auto stream = CreateStream(0);
  ASSERT_TRUE(a && b && c && stream);
  ASSERT_NE(a->data(), nullptr);
  EXPECT_EQ(a->size(), kCount * sizeof(float));
  EXPECT_FALSE(a->imported());
  EXPECT_EQ(&a->device(), &device(0));

  auto* fa = static_cast<float*>(a->data());
  auto* fb = static_cast<float*>(b->data());
  auto* fc = static_cast<float*>(c->data());
  for (size_t i = 0; i < kCount; ++i) {
    fa[i] = static_cast<float>(i);
    fb[i] = 2.0f * static_cast<float>(i);
  }
  ASSERT_TRUE(stream->Copy(c->data(), a->data(), kCount * sizeof(float)).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(fc, fa, kCount * sizeof(float)), 0);

  const void* srcs[] = {a->data(), b->data()};
  ASSERT_TRUE(stream->Reduce(c->data(), srcs, kCount, DataType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(fc[i], 3.0f * static_cast<float>(i)) << "element " << i;

  // In place, wrapping: int8 100 + 100 = -56.
  auto* i8 = static_cast<int8_t*>(a->data());
  auto* j8 = static_cast<int8_t*>(b->data());
  i8[0] = 100;
  j8[0] = 100;
  const void* in_place[] = {a->data(), b->data()};
  ASSERT_TRUE(stream->Reduce(a->data(), in_place, 1, DataType::kInt8, ReduceOp::kSum).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(i8[0], -56);

  // bfloat16 accumulates in float32 and rounds once, to nearest even: 1 + 2^-8 is a tie that
  // rounds down to 1 (even), (1 + 2^-7) + 2^-8 a tie that rounds up to 1 + 2^-6.
  auto* x = static_cast<uint16_t*>(a->data());
  auto* y = static_cast<uint16_t*>(b->data());
  auto* z = static_cast<uint16_t*>(c->data());
  x[0] = 0x3f80;  // 1
  x[1] = 0x3f81;  // 1 + 2^-7
  y[0] = y[1] = 0x3b80;  // 2^-8
  const void* bf_srcs[] = {a->data(), b->data()};
  ASSERT_TRUE(stream->Reduce(c->data(), bf_srcs, 2, DataType::kBfloat16, ReduceOp::kSum).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(z[0], 0x3f80);
  EXPECT_EQ(z[1], 0x3f82);
  EXPECT_EQ(stream->Query().value(), true);
}

// Little-endian bytes of typed values, so that one table of cases covers every dtype.
template <typename T>
std::vector<uint8_t> AsBytes(std::initializer_list<T> values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// stream_scale (api 1.1) through the wrapper: truncation toward zero for negative integers,
// float16 / bfloat16 divided in float32 and rounded once (a subnormal tie goes to even), in place,
// and ordered after a copy on the same stream. The conformance suite sweeps the rest.
TEST_F(ExamplePluginTest, ScaleEveryTypeInPlaceAndInOrder) {
  struct Case {
    DataType type;
    uint32_t divisor;
    std::vector<uint8_t> in, expected;
  };
  const Case cases[] = {
      {DataType::kInt8, 2, AsBytes<int8_t>({-7, 7, -128, 127, -1}), AsBytes<int8_t>({-3, 3, -64, 63, 0})},
      {DataType::kUint8, 2, AsBytes<uint8_t>({255, 7, 0}), AsBytes<uint8_t>({127, 3, 0})},
      {DataType::kInt32, 3, AsBytes<int32_t>({-7, INT32_MIN, INT32_MAX}),
       AsBytes<int32_t>({-2, INT32_MIN / 3, INT32_MAX / 3})},
      {DataType::kUint32, 3, AsBytes<uint32_t>({UINT32_MAX, 5}), AsBytes<uint32_t>({UINT32_MAX / 3, 1})},
      {DataType::kInt64, 4, AsBytes<int64_t>({-9, INT64_MIN, 9}), AsBytes<int64_t>({-2, INT64_MIN / 4, 2})},
      {DataType::kUint64, 3, AsBytes<uint64_t>({UINT64_MAX, 2}), AsBytes<uint64_t>({UINT64_MAX / 3, 0})},
      // 1/3 = 0x3555; 3 * 2^-24 / 2 = 1.5 * 2^-24, a tie between subnormals 1 and 2: even (2).
      {DataType::kFloat16, 3, AsBytes<uint16_t>({0x3c00, 0xbc00}), AsBytes<uint16_t>({0x3555, 0xb555})},
      {DataType::kFloat16, 2, AsBytes<uint16_t>({0x0003, 0x0001}), AsBytes<uint16_t>({0x0002, 0x0000})},
      // float32 1/3 = 0x3eaaaaab rounds up to bfloat16 0x3eab.
      {DataType::kBfloat16, 3, AsBytes<uint16_t>({0x3f80}), AsBytes<uint16_t>({0x3eab})},
      {DataType::kBfloat16, 2, AsBytes<uint16_t>({0x0003, 0xc040}), AsBytes<uint16_t>({0x0002, 0xbfc0})},
      {DataType::kFloat32, 3, AsBytes<float>({1.0f, -6.0f}), AsBytes<float>({1.0f / 3.0f, -2.0f})},
      {DataType::kFloat64, 3, AsBytes<double>({1.0, -6.0}), AsBytes<double>({1.0 / 3.0, -2.0})},
  };
  auto staging = Allocate(0, 64);
  auto work = Allocate(0, 64);
  auto stream = CreateStream(0);
  ASSERT_TRUE(staging && work && stream);
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(DataTypeName(c.type)) + " / " + std::to_string(c.divisor));
    const size_t count = c.in.size() / DataTypeSize(c.type);
    std::memcpy(staging->data(), c.in.data(), c.in.size());
    std::memset(work->data(), 0xee, 64);
    // The scale reads what the copy before it wrote: the stream keeps them in order.
    ASSERT_TRUE(stream->Copy(work->data(), staging->data(), c.in.size()).ok());
    Status s = stream->Scale(work->data(), work->data(), count, c.type, c.divisor);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(stream->Synchronize().ok());
    EXPECT_EQ(std::memcmp(work->data(), c.expected.data(), c.expected.size()), 0);
    EXPECT_EQ(static_cast<const uint8_t*>(work->data())[c.in.size()], 0xee) << "wrote past the count";
  }

  // Several of the plugin's blocks, out of place.
  constexpr size_t kCount = 5000;
  auto a = Allocate(0, kCount * sizeof(float));
  auto b = Allocate(0, kCount * sizeof(float));
  ASSERT_TRUE(a && b);
  auto* fa = static_cast<float*>(a->data());
  auto* fb = static_cast<float*>(b->data());
  for (size_t i = 0; i < kCount; ++i) fa[i] = static_cast<float>(i) - 2500.0f;
  ASSERT_TRUE(stream->Scale(b->data(), a->data(), kCount, DataType::kFloat32, 7).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(fb[i], fa[i] / 7.0f) << "element " << i;
}

TEST_F(ExamplePluginTest, FailedScaleIsSticky) {
  // KZ_EXAMPLE_FAIL_STREAM_OP counts scales too: here the first one fails.
  std::unique_ptr<Backend> faulty;
  {
    ScopedEnv fail("KZ_EXAMPLE_FAIL_STREAM_OP", "2");
    auto loaded = LoadDevicePlugin(g_example_plugin, config_);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    faulty = std::move(loaded).value();
  }
  Device& dev = *faulty->device(0);
  auto buffer = dev.Allocate(3 * 64);
  auto stream = dev.CreateStream();
  ASSERT_TRUE(buffer.ok() && stream.ok());
  auto* p = static_cast<int8_t*>((*buffer)->data());
  std::memset(p, -8, 64);
  std::memset(p + 64, 1, 2 * 64);
  ASSERT_TRUE((*stream)->Copy(p + 64, p, 32).ok());                      // op 1: runs
  ASSERT_TRUE((*stream)->Scale(p + 64, p, 64, DataType::kInt8, 2).ok());   // op 2: fails
  ASSERT_TRUE((*stream)->Scale(p + 128, p, 64, DataType::kInt8, 4).ok());  // op 3: skipped
  Status s = (*stream)->Synchronize();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("injected fault: stream operation #2"), HasSubstr("stream_synchronize")));
  EXPECT_EQ(p[64], -8);   // the copy ran
  EXPECT_EQ(p[100], 1);   // the failed scale wrote nothing (it would have written -4)
  EXPECT_EQ(p[128], 1);   // the later one was skipped (-2)
}

// The plugin's own checks of stream_scale, straight through its api table (kizuna's wrapper
// refuses these before they reach a plugin): each is KZ_PLUGIN_ERR_INVALID_ARGUMENT with a message
// and enqueues nothing.
TEST(ExamplePluginAbi, StreamScaleRefusesBadArgumentsAndEnqueuesNothing) {
  struct Closer {
    void* handle;
    ~Closer() {
      if (handle != nullptr) dlclose(handle);
    }
  } lib{dlopen(g_example_plugin.c_str(), RTLD_NOW | RTLD_LOCAL)};
  ASSERT_NE(lib.handle, nullptr) << dlerror();
  auto get_api = reinterpret_cast<kz_device_plugin_get_api_fn>(dlsym(lib.handle, KZ_DEVICE_PLUGIN_ENTRY_POINT));
  ASSERT_NE(get_api, nullptr);
  const kz_device_plugin_api_t* api = get_api(KZ_DEVICE_PLUGIN_API_MAJOR, KZ_DEVICE_PLUGIN_API_MINOR);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->api_minor, 1u);
  ASSERT_GE(api->struct_size, offsetof(kz_device_plugin_api_t, stream_scale) + sizeof(api->stream_scale));
  ASSERT_NE(api->stream_scale, nullptr);

  void* ctx = nullptr;
  ASSERT_EQ(api->init(&ctx), KZ_PLUGIN_OK) << api->last_error();
  void* mem = nullptr;
  kz_plugin_stream_t stream = nullptr;
  ASSERT_EQ(api->mem_alloc(ctx, 0, 64 * sizeof(int32_t), &mem), KZ_PLUGIN_OK);
  ASSERT_EQ(api->stream_create(ctx, 0, &stream), KZ_PLUGIN_OK);
  auto* v = static_cast<int32_t*>(mem);
  for (int i = 0; i < 64; ++i) v[i] = -i;

  auto refused = [&](kz_plugin_result_t rc, const char* why) {
    EXPECT_EQ(rc, KZ_PLUGIN_ERR_INVALID_ARGUMENT) << why;
    EXPECT_THAT(api->last_error(), HasSubstr(why));
  };
  refused(api->stream_scale(ctx, stream, v + 32, v, 32, KZ_PLUGIN_INT32, 0), "divisor is 0");
  refused(api->stream_scale(ctx, stream, v + 32, v, 32, 99, 2), "unknown dtype 99");
  refused(api->stream_scale(ctx, stream, nullptr, v, 32, KZ_PLUGIN_INT32, 2), "dst is NULL");
  refused(api->stream_scale(ctx, stream, v + 32, nullptr, 32, KZ_PLUGIN_INT32, 2), "src is NULL");
  refused(api->stream_scale(ctx, stream, v + 1, v, 32, KZ_PLUGIN_INT32, 2), "partially overlaps");
  refused(api->stream_scale(ctx, nullptr, v + 32, v, 32, KZ_PLUGIN_INT32, 2), "is not a stream");
  EXPECT_EQ(api->stream_scale(ctx, stream, v + 32, v, 0, KZ_PLUGIN_INT32, 2), KZ_PLUGIN_OK);
  EXPECT_EQ(api->stream_synchronize(ctx, stream, 10'000'000'000ull), KZ_PLUGIN_OK);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(v[i], -i) << "a refused scale wrote element " << i;

  EXPECT_EQ(api->stream_scale(ctx, stream, v, v, 64, KZ_PLUGIN_INT32, 2), KZ_PLUGIN_OK);
  EXPECT_EQ(api->stream_synchronize(ctx, stream, 10'000'000'000ull), KZ_PLUGIN_OK);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(v[i], -i / 2) << "element " << i;

  EXPECT_EQ(api->stream_destroy(ctx, stream), KZ_PLUGIN_OK);
  EXPECT_EQ(api->mem_free(ctx, 0, mem), KZ_PLUGIN_OK);
  api->finalize(ctx);
}

TEST_F(ExamplePluginTest, EmptyAndImpossibleAllocations) {
  auto empty = device(0).Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ((*empty)->size(), 0u);
  EXPECT_EQ((*empty)->data(), nullptr);

  auto huge = device(0).Allocate(size_t{1} << 62);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kOutOfMemory);
  // Converted once at the boundary: the call, the plugin, its code and message, and where.
  EXPECT_THAT(huge.status().message(),
              AllOf(HasSubstr("example:0"), HasSubstr("mem_alloc failed"), HasSubstr("device plugin 'example'"),
                    HasSubstr("KZ_PLUGIN_ERR_OUT_OF_MEMORY"), HasSubstr("bytes requested"),
                    HasSubstr("plugin_backend.cc:")));
}

TEST_F(ExamplePluginTest, EventsOrderWorkAcrossDevices) {
  constexpr size_t kBytes = size_t{8} << 20;  // large enough that the copy takes a while
  auto src = Allocate(0, kBytes);
  auto mid = Allocate(0, kBytes);
  auto dst = Allocate(1, kBytes);
  auto s0 = CreateStream(0);
  auto s1 = CreateStream(1);
  auto event = CreateEvent(0);
  ASSERT_TRUE(src && mid && dst && s0 && s1 && event);

  auto unrecorded = event->Query();
  ASSERT_TRUE(unrecorded.ok());
  EXPECT_TRUE(*unrecorded);  // never recorded: complete

  std::memset(src->data(), 0x5a, kBytes);
  ASSERT_TRUE(s0->Copy(mid->data(), src->data(), kBytes).ok());
  ASSERT_TRUE(s0->Record(*event).ok());
  ASSERT_TRUE(s1->Wait(*event).ok());
  ASSERT_TRUE(s1->Copy(dst->data(), mid->data(), kBytes).ok());

  std::promise<Status> called;
  ASSERT_TRUE(s1->EnqueueHostCallback([&](const Status& s) { called.set_value(s); }).ok());
  ASSERT_TRUE(s1->Synchronize().ok());
  auto done = called.get_future();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  EXPECT_TRUE(event->Synchronize().ok());
  EXPECT_EQ(event->Query().value(), true);
  const auto* d = static_cast<const unsigned char*>(dst->data());
  EXPECT_EQ(d[0], 0x5a);
  EXPECT_EQ(d[kBytes - 1], 0x5a);
  EXPECT_EQ(std::memcmp(dst->data(), src->data(), kBytes), 0);
}

TEST_F(ExamplePluginTest, SynchronizeHonoursTheDeadline) {
  auto stream = CreateStream(0);
  auto event = CreateEvent(0);
  ASSERT_TRUE(stream && event);
  Gate gate;
  std::promise<Status> first;
  ASSERT_TRUE(stream
                  ->EnqueueHostCallback([&](const Status& s) {
                    EXPECT_TRUE(gate.WaitOpen(std::chrono::seconds(10)));
                    first.set_value(s);
                  })
                  .ok());
  ASSERT_TRUE(stream->Record(*event).ok());

  const auto start = std::chrono::steady_clock::now();
  Status s = stream->Synchronize(Deadline::After(std::chrono::milliseconds(50)));
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("stream_synchronize"));
  EXPECT_GE(waited, std::chrono::milliseconds(40));
  EXPECT_LT(waited, std::chrono::seconds(5));

  EXPECT_EQ(stream->Query().value(), false);
  EXPECT_EQ(event->Query().value(), false);
  Status es = event->Synchronize(Deadline::After(std::chrono::milliseconds(20)));
  EXPECT_EQ(es.code(), StatusCode::kTimeout) << es.ToString();

  gate.Open();
  EXPECT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(stream->Query().value(), true);
  EXPECT_TRUE(event->Synchronize().ok());
  auto f = first.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
}

TEST_F(ExamplePluginTest, ExportAndImportShareMemory) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto buffer = Allocate(0, 4 * page);
  ASSERT_TRUE(buffer);
  auto exported = device(0).Export(*buffer, page + 16, 2 * page);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->kind, ExportKind::kFd);
  EXPECT_TRUE(exported->fd.valid());
  EXPECT_EQ(exported->offset, page + 16);
  EXPECT_EQ(exported->size, 2 * page);
  EXPECT_EQ(exported->backend, "example");
  EXPECT_EQ(exported->device_uuid, "kz-example-0");
  // Sealed: no holder of the fd can shrink (or grow) the memory under another's mapping, nor add
  // seals that would stop later imports.
  const int seals = fcntl(exported->fd.get(), F_GET_SEALS);
  ASSERT_GE(seals, 0) << std::strerror(errno);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  const int shrink = ftruncate(exported->fd.get(), static_cast<off_t>(page));
  const int shrink_errno = errno;
  EXPECT_NE(shrink, 0);
  EXPECT_EQ(shrink_errno, EPERM);
  EXPECT_NE(ftruncate(exported->fd.get(), static_cast<off_t>(8 * page)), 0);
  EXPECT_NE(fcntl(exported->fd.get(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE), 0);

  auto imported = device(1).Import(*exported);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  EXPECT_TRUE((*imported)->imported());
  EXPECT_EQ((*imported)->size(), 2 * page);
  exported->fd.Reset();  // the import keeps its own mapping

  auto* original = static_cast<unsigned char*>(buffer->data());
  auto* mapped = static_cast<unsigned char*>((*imported)->data());
  original[page + 16] = 0xab;
  original[3 * page + 15] = 0xcd;
  EXPECT_EQ(mapped[0], 0xab);
  EXPECT_EQ(mapped[2 * page - 1], 0xcd);
  mapped[1] = 0xef;
  EXPECT_EQ(original[page + 17], 0xef);

  // A stream copies out of the imported memory like out of any other.
  auto out = Allocate(1, 2 * page);
  auto stream = CreateStream(1);
  ASSERT_TRUE(out && stream);
  ASSERT_TRUE(stream->Copy(out->data(), mapped, 2 * page).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(std::memcmp(out->data(), mapped, 2 * page), 0);
}

TEST_F(ExamplePluginTest, PluginRejectionsBecomeStatuses) {
  // A well-formed descriptor of a range the fd does not have: the wrapper cannot know, the plugin
  // refuses, and its reason reaches the caller.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ExportedMemory bogus;
  bogus.kind = ExportKind::kFd;
  bogus.fd = UniqueFd(memfd_create("plugin_backend_test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(bogus.fd.valid());
  ASSERT_EQ(ftruncate(bogus.fd.get(), static_cast<off_t>(page)), 0);
  ASSERT_EQ(fcntl(bogus.fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  bogus.offset = 0;
  bogus.size = 2 * page;
  bogus.backend = "example";
  auto r = device(0).Import(bogus);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("mem_import_fd failed"), HasSubstr("KZ_PLUGIN_ERR_INVALID_ARGUMENT"),
                    HasSubstr("outside the fd's")));

  bogus.kind = ExportKind::kOpaque;
  bogus.opaque = {1, 2, 3};
  auto opaque = device(0).Import(bogus);
  EXPECT_EQ(opaque.status().code(), StatusCode::kNotSupported) << opaque.status().ToString();
}

TEST_F(ExamplePluginTest, ImportRequiresMemorySealedAgainstShrinking) {
  // Memory another process could shrink under the mapping (turning a later touch into SIGBUS) is
  // refused, however well the range fits today.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto describe = [&](int fd) {
    ExportedMemory m;
    m.kind = ExportKind::kFd;
    m.fd = UniqueFd(fd);
    m.size = page;
    m.backend = "example";
    return m;
  };
  auto expect_refused = [&](ExportedMemory m, const char* why) {
    SCOPED_TRACE(why);
    ASSERT_TRUE(m.fd.valid()) << std::strerror(errno);
    auto r = device(0).Import(m);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("mem_import_fd failed"), HasSubstr("not sealed against shrinking"),
                      HasSubstr("the exporter must seal it"), HasSubstr("F_SEAL_SHRINK")));
  };

  // A memfd that cannot be sealed at all (no MFD_ALLOW_SEALING).
  ExportedMemory unsealable = describe(memfd_create("plugin_backend_test_unsealable", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(unsealable.fd.get(), static_cast<off_t>(page)), 0);
  expect_refused(std::move(unsealable), "memfd without seals");

  // Sealed, but only against growing.
  ExportedMemory grow_only = describe(memfd_create("plugin_backend_test_grow", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(grow_only.fd.get(), static_cast<off_t>(page)), 0);
  ASSERT_EQ(fcntl(grow_only.fd.get(), F_ADD_SEALS, F_SEAL_GROW), 0);
  expect_refused(std::move(grow_only), "memfd sealed against growing only");

  // A plain file.
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/plugin_backend_test_XXXXXX";
  const int file = mkstemp(pattern.data());
  ASSERT_GE(file, 0) << std::strerror(errno);
  unlink(pattern.c_str());
  ASSERT_EQ(ftruncate(file, static_cast<off_t>(page)), 0);
  expect_refused(describe(file), "regular file");

  // Sealed against shrinking: accepted.
  ExportedMemory sealed = describe(memfd_create("plugin_backend_test_sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(sealed.fd.get(), static_cast<off_t>(page)), 0);
  ASSERT_EQ(fcntl(sealed.fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto ok = device(0).Import(sealed);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  static_cast<unsigned char*>((*ok)->data())[page - 1] = 0x42;
  unsigned char last = 0;
  ASSERT_EQ(pread(sealed.fd.get(), &last, 1, static_cast<off_t>(page - 1)), 1);
  EXPECT_EQ(last, 0x42);
}

TEST_F(ExamplePluginTest, StickyStreamErrorReachesEveryObserver) {
  // A second instance of the same plugin, whose second copy fails when it runs.
  std::unique_ptr<Backend> faulty;
  {
    ScopedEnv fail("KZ_EXAMPLE_FAIL_STREAM_OP", "2");
    auto loaded = LoadDevicePlugin(g_example_plugin, config_);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    faulty = std::move(loaded).value();
  }
  Device& dev = *faulty->device(0);
  auto a = dev.Allocate(64);
  auto b = dev.Allocate(64);
  auto c = dev.Allocate(64);
  auto stream = dev.CreateStream();
  auto event = dev.CreateEvent();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && stream.ok() && event.ok());
  std::memset((*a)->data(), 1, 64);
  std::memset((*b)->data(), 0, 64);
  std::memset((*c)->data(), 7, 64);

  ASSERT_TRUE((*stream)->Copy((*b)->data(), (*a)->data(), 32).ok());  // op 1: runs
  ASSERT_TRUE((*stream)->Copy((*b)->data(), (*a)->data(), 64).ok());  // op 2: fails on the stream
  ASSERT_TRUE((*stream)->Copy((*b)->data(), (*c)->data(), 64).ok());  // op 3: skipped (sticky)
  ASSERT_TRUE((*stream)->Record(**event).ok());
  std::promise<Status> callback_status;
  ASSERT_TRUE((*stream)->EnqueueHostCallback([&](const Status& s) { callback_status.set_value(s); }).ok());

  Status s = (*stream)->Synchronize();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("example:0: stream_synchronize failed"), HasSubstr("device plugin 'example'"),
                    HasSubstr("injected fault: stream operation #2"), HasSubstr("plugin_backend.cc:")));
  auto q = (*stream)->Query();
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), StatusCode::kInternal);
  auto eq = (*event)->Query();
  ASSERT_FALSE(eq.ok());
  EXPECT_THAT(eq.status().message(), HasSubstr("injected fault"));
  EXPECT_EQ((*event)->Synchronize().code(), StatusCode::kInternal);

  auto f = callback_status.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Status cs = f.get();
  EXPECT_EQ(cs.code(), StatusCode::kInternal);
  EXPECT_THAT(cs.message(), AllOf(HasSubstr("example:0"), HasSubstr("KZ_PLUGIN_ERR_INTERNAL")));

  const auto* out = static_cast<const unsigned char*>((*b)->data());
  EXPECT_EQ(out[0], 1);   // op 1 ran
  EXPECT_EQ(out[40], 0);  // op 2 failed (it would have written 1), op 3 was skipped (7)

  // The first instance is untouched by the second's failure, and the two do not mix.
  auto healthy = CreateStream(0);
  ASSERT_TRUE(healthy);
  EXPECT_TRUE(healthy->Synchronize().ok());
  Status mixed = healthy->Record(**event);
  EXPECT_EQ(mixed.code(), StatusCode::kNotSupported) << mixed.ToString();
}

TEST_F(ExamplePluginTest, LibraryOutlivesTheBackend) {
  // Objects may be released after the backend; the plugin's code must still be mapped for their
  // destructors (finalize and dlclose wait for the last of them).
  auto buffer = Allocate(1, 4096);
  auto stream = CreateStream(1);
  auto event = CreateEvent(1);
  ASSERT_TRUE(buffer && stream && event);
  ASSERT_TRUE(stream->Copy(buffer->data(), static_cast<char*>(buffer->data()) + 2048, 1024).ok());
  ASSERT_TRUE(stream->Record(*event).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  backend_.reset();
  event.reset();
  stream.reset();
  buffer.reset();
  SUCCEED();
}

// The review's repro: the stream holds the last reference to the plugin (the backend is gone) and
// is destroyed inside its own host callback, on the plugin's worker thread. stream_destroy,
// finalize and dlclose must not run there (the worker would wait for itself, or return into
// unmapped code): they run on a thread of kizuna's, the worker is joined, and the library is
// unloaded.
TEST_F(ExamplePluginTest, StreamReleasedInItsOwnCallbackIsDestroyedOffThePluginThread) {
  auto stream = CreateStream(0);
  ASSERT_TRUE(stream);
  // Counted with the stream's worker running (and whatever a first pthread_create may have
  // started, such as a sanitizer's helper): the worker is the one that must go away.
  const int threads_with_stream = ThreadCount();
  ASSERT_GT(threads_with_stream, 1);
  backend_.reset();  // the stream holds the last reference to the library now

  std::promise<Status> called;
  Stream* raw = stream.get();
  ASSERT_TRUE(raw->EnqueueHostCallback([&stream, &called](const Status& s) {
                   stream.reset();  // destroys the stream from its own callback
                   called.set_value(s);
                 })
                  .ok());
  auto f = called.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(stream, nullptr);

  // The plugin's worker is joined (not leaked), and the library is finalized and unloaded.
  EXPECT_TRUE(Eventually([&] { return ThreadCount() < threads_with_stream; }))
      << ThreadCount() << " threads, " << threads_with_stream << " with the stream";
  EXPECT_TRUE(Eventually([] { return !LibraryLoaded(g_example_plugin); })) << "the plugin was never unloaded";
}

// The same when the callback's own captures own the stream: they are destroyed after the callback
// returns, still on the plugin's thread. Work queued after the callback still runs first.
TEST_F(ExamplePluginTest, StreamOwnedByItsCallbackIsDestroyedOffThePluginThread) {
  auto buffer = Allocate(0, 4096);
  std::shared_ptr<Stream> stream = CreateStream(0);
  ASSERT_TRUE(buffer && stream);
  const int threads_with_stream = ThreadCount();
  std::memset(buffer->data(), 0, 4096);
  static_cast<char*>(buffer->data())[2048] = 7;

  std::promise<void> called;
  std::promise<Status> later;
  ASSERT_TRUE(stream->EnqueueHostCallback([keep = stream, &called](const Status&) { called.set_value(); }).ok());
  ASSERT_TRUE(stream->Copy(buffer->data(), static_cast<char*>(buffer->data()) + 2048, 1024).ok());
  ASSERT_TRUE(stream->EnqueueHostCallback([&later](const Status& s) { later.set_value(s); }).ok());
  stream.reset();  // the first callback's capture is the last owner
  auto c = called.get_future();
  ASSERT_EQ(c.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto l = later.get_future();
  ASSERT_EQ(l.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(l.get().ok());
  EXPECT_TRUE(Eventually([&] { return ThreadCount() < threads_with_stream; }));
  EXPECT_EQ(static_cast<char*>(buffer->data())[0], 7) << "the copy queued behind the callback did not run";
}

// stream_destroy takes no timeout in api 1.0: the plugin bounds it by KIZUNA_TIMEOUT. With a host
// callback that does not return, the destroy gives up (the worker finishes the callback later and
// frees the stream itself), and kizuna keeps that library loaded for the worker's sake. A copy of

}  // namespace
}  // namespace kizuna::device
