// The device conformance tests (what they check: README.md in this folder). Every TEST_P runs once
// per backend whose capability tags the group needs; test names end in the backend's name.
//
// Groups:
//  - DeviceConformance: every backend (unavailable ones skip, broken ones fail): properties,
//    allocation and out-of-memory, stream and event semantics through host callbacks, argument
//    checks, export range checks, cross-backend refusals.
//  - DataConformance (host_accessible): copies and reductions checked byte for byte, stream
//    ordering over long dependent chains, cross-stream data dependencies.
//  - MultiDeviceConformance (host_accessible, multi_device): copies and events across devices.
//  - ExportConformance (host_accessible, export_fd or export_opaque): import in this process and
//    in a second process spawned from this binary.
//  - HostEmulatedFaultInjection: host_emulated only, through its factory with fault injection set.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/config.h"
#include "runtime/dtype.h"
#include "runtime/half.h"
#include "runtime/device/exported_memory.h"
#include "runtime/unique_fd.h"
#include "tests/conformance/device/device_conformance.h"

extern char** environ;

namespace kizuna::device::conformance {

// ---- The groups and their requirements (also printed at startup) ----

const std::vector<TestGroup>& TestGroups() {
  static const std::vector<TestGroup> groups = {
      {"DeviceConformance", {}, {}, ""},
      {"DataConformance",
       {Tag::kHostAccessible},
       {},
       "bytes are checked by reading device memory from the CPU, and the device API has no host-copy "
       "call to stage them through"},
      {"MultiDeviceConformance",
       {Tag::kHostAccessible, Tag::kMultiDevice},
       {},
       "needs a second device of the same backend, and host access to check the bytes"},
      {"ExportConformance",
       {Tag::kHostAccessible},
       {Tag::kExportFd, Tag::kExportOpaque},
       "needs memory export (an fd or an opaque IPC handle), and host access to check the bytes on "
       "both sides"},
  };
  return groups;
}

// ---- Helpers declared in device_conformance.h ----

::testing::AssertionResult HasPattern(const void* p, size_t bytes, uint64_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != PatternByte(seed, i)) {
      if (wrong++ == 0) first = i;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << bytes << " bytes differ from pattern " << seed
                                       << "; first at " << first << ": " << int{b[first]} << " instead of "
                                       << int{PatternByte(seed, first)};
}

::testing::AssertionResult BytesEqual(const void* actual, const void* expected, size_t bytes) {
  if (bytes == 0 || std::memcmp(actual, expected, bytes) == 0) return ::testing::AssertionSuccess();
  const auto* a = static_cast<const uint8_t*>(actual);
  const auto* e = static_cast<const uint8_t*>(expected);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (a[i] != e[i]) {
      if (wrong++ == 0) first = i;
    }
  }
  return ::testing::AssertionFailure() << wrong << " of " << bytes << " bytes differ; first at " << first << ": "
                                       << int{a[first]} << " instead of " << int{e[first]};
}

Status EnqueueGate(Stream& stream, std::shared_ptr<Gate> gate) {
  return stream.EnqueueHostCallback([gate](const Status&) {
    gate->MarkReached();
    // Bounded: a test that fails before opening the gate must not wedge the stream.
    gate->WaitOpen(Deadline::After(kGateMaxHold));
  });
}

void BackendTest::SetUp() {
  const BackendUnderTest& b = under_test();
  const BackendSlot& slot = *b.slot;
  if (!slot.status.ok()) {
    if (slot.status.code() == StatusCode::kUnavailable)
      GTEST_SKIP() << "backend " << b.name << " is unavailable here: " << slot.status.message();
    FAIL() << "backend " << b.name << " (" << slot.origin << ") did not start: " << slot.status.ToString();
  }
  backend_ = slot.backend.get();
  ASSERT_GT(backend_->device_count(), 0) << "backend " << b.name << " started with no devices (a backend "
                                         << "without devices must report kUnavailable instead)";
  device_ = backend_->device(0);
  ASSERT_NE(device_, nullptr) << "backend " << b.name << ": device(0) is null";
}

std::unique_ptr<Buffer> BackendTest::MustAllocate(Device& d, size_t bytes) {
  auto r = d.Allocate(bytes);
  EXPECT_TRUE(r.ok()) << d.label() << ": Allocate(" << bytes << ") -> " << r.status().ToString();
  if (!r.ok()) return nullptr;
  EXPECT_EQ((*r)->size(), bytes);
  return std::move(r).value();
}

std::unique_ptr<Stream> BackendTest::MustCreateStream(Device& d) {
  auto r = d.CreateStream();
  EXPECT_TRUE(r.ok()) << d.label() << ": CreateStream -> " << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<Event> BackendTest::MustCreateEvent(Device& d) {
  auto r = d.CreateEvent();
  EXPECT_TRUE(r.ok()) << d.label() << ": CreateEvent -> " << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

namespace {

using namespace std::chrono_literals;

// Fails the test (and returns from it) when an allocation/creation helper returned null.
#define KZ_ASSERT_NOT_NULL(p) ASSERT_NE((p), nullptr) << #p " could not be created"

// A short deadline for waits that are expected to time out.
Deadline Short() { return Deadline::After(30ms); }

// ---- Reference reductions ----
//
// Computed on the CPU from host copies of the inputs, independent of runtime/host_reduce.cc:
//  - integers: exact modular arithmetic in uint64 (sum, prod wrap modulo 2^bits; avg is the
//    wrapped sum reinterpreted in the type, divided truncating toward zero — dtype.h);
//  - float32 / float64: the exact-as-possible value in long double, compared with an error bound
//    for the backend's (unspecified) summation order: n·eps·Σ|x| for sum, n·eps·|p| for prod;
//  - float16 / bfloat16: inputs are multiples of 1/4 in [-2, 2], so every sum and product of up to
//    8 of them is exact in float32; the expected value is that exact float32 result rounded once
//    to the type (avg: the exact float32 sum divided by n in float32, then rounded — dtype.h's
//    "computed in the accumulation type and rounded once"), and results are compared bit for bit.

template <typename T>
T IntReference(std::span<const T* const> in, size_t i, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  const size_t n = in.size();
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: {
      uint64_t acc = 0;
      for (const T* s : in) acc += static_cast<uint64_t>(static_cast<U>(s[i]));
      const T wrapped = static_cast<T>(static_cast<U>(acc));
      if (op == ReduceOp::kSum) return wrapped;
      if constexpr (std::is_signed_v<T>) return static_cast<T>(static_cast<int64_t>(wrapped) / static_cast<int64_t>(n));
      else return static_cast<T>(static_cast<uint64_t>(wrapped) / static_cast<uint64_t>(n));
    }
    case ReduceOp::kProd: {
      uint64_t acc = 1;
      for (const T* s : in) acc *= static_cast<uint64_t>(static_cast<U>(s[i]));
      return static_cast<T>(static_cast<U>(acc));
    }
    case ReduceOp::kMin: {
      T m = in[0][i];
      for (const T* s : in) m = std::min(m, s[i]);
      return m;
    }
    case ReduceOp::kMax: {
      T m = in[0][i];
      for (const T* s : in) m = std::max(m, s[i]);
      return m;
    }
  }
  return T{};
}

template <typename T>
::testing::AssertionResult CheckIntReduce(const void* out_v, std::span<const void* const> in_v, size_t count,
                                          ReduceOp op) {
  const T* out = static_cast<const T*>(out_v);
  std::vector<const T*> in;
  for (const void* p : in_v) in.push_back(static_cast<const T*>(p));
  size_t wrong = 0, first = 0;
  T first_expected{}, first_actual{};
  for (size_t i = 0; i < count; ++i) {
    const T e = IntReference<T>(in, i, op);
    if (out[i] != e && wrong++ == 0) {
      first = i;
      first_expected = e;
      first_actual = out[i];
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << count << " elements wrong; first [" << first
                                       << "] = " << +first_actual << ", expected " << +first_expected;
}

template <typename T>  // float or double
::testing::AssertionResult CheckFloatReduce(const void* out_v, std::span<const void* const> in_v, size_t count,
                                            ReduceOp op) {
  using R = long double;
  const T* out = static_cast<const T*>(out_v);
  const size_t n = in_v.size();
  const R eps = std::numeric_limits<T>::epsilon();
  const R tiny = std::numeric_limits<T>::denorm_min();
  size_t wrong = 0, first = 0;
  R first_expected = 0, first_actual = 0, first_tol = 0;
  for (size_t i = 0; i < count; ++i) {
    R sum = 0, abs_sum = 0, prod = 1;
    T mn = static_cast<const T*>(in_v[0])[i], mx = mn;
    for (const void* p : in_v) {
      const T x = static_cast<const T*>(p)[i];
      sum += x;
      abs_sum += std::fabs(static_cast<R>(x));
      prod *= x;
      mn = std::min(mn, x);
      mx = std::max(mx, x);
    }
    R expected = 0, tol = 0;
    switch (op) {
      case ReduceOp::kSum: expected = sum; tol = n * eps * abs_sum; break;
      case ReduceOp::kProd: expected = prod; tol = n * eps * std::fabs(prod); break;
      case ReduceOp::kMin: expected = mn; break;
      case ReduceOp::kMax: expected = mx; break;
      case ReduceOp::kAvg: expected = sum / n; tol = (n + 1) * eps * abs_sum / n; break;
    }
    if (tol > 0) tol += tiny;
    const R actual = out[i];
    if (!(std::fabs(actual - expected) <= tol) && wrong++ == 0) {
      first = i;
      first_expected = expected;
      first_actual = actual;
      first_tol = tol;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << count << " elements wrong; first [" << first
                                       << "] = " << static_cast<double>(first_actual) << ", expected "
                                       << static_cast<double>(first_expected) << " within "
                                       << static_cast<double>(first_tol);
}

// float16 / bfloat16: bit-exact against one rounding of the exact float32 result.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
::testing::AssertionResult CheckHalfReduce(const void* out_v, std::span<const void* const> in_v, size_t count,
                                           ReduceOp op) {
  const auto* out = static_cast<const uint16_t*>(out_v);
  const size_t n = in_v.size();
  size_t wrong = 0, first = 0;
  uint16_t first_expected = 0, first_actual = 0;
  for (size_t i = 0; i < count; ++i) {
    // The same operations in the same order in double: exact for these inputs (see above), so
    // the float32 conversion below is exact too.
    double acc = ToFloat(static_cast<const uint16_t*>(in_v[0])[i]);
    for (size_t k = 1; k < n; ++k) {
      const double x = ToFloat(static_cast<const uint16_t*>(in_v[k])[i]);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += x; break;
        case ReduceOp::kProd: acc *= x; break;
        case ReduceOp::kMin: acc = x < acc ? x : acc; break;
        case ReduceOp::kMax: acc = acc < x ? x : acc; break;
      }
    }
    const float exact = static_cast<float>(acc);
    const uint16_t e =
        op == ReduceOp::kAvg ? FromFloat(exact / static_cast<float>(n)) : FromFloat(exact);
    if (out[i] != e && wrong++ == 0) {
      first = i;
      first_expected = e;
      first_actual = out[i];
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " of " << count << " elements wrong; first [" << first
                                       << "] = " << ToFloat(first_actual) << fmt::format(" ({:#06x})", first_actual)
                                       << ", expected " << ToFloat(first_expected)
                                       << fmt::format(" ({:#06x})", first_expected);
}

// Checks `count` elements at `out` against the reference of `inputs` (host copies).
::testing::AssertionResult CheckReduce(const void* out, std::span<const void* const> inputs, size_t count,
                                       DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat16: return CheckHalfReduce<HalfToFloat, FloatToHalf>(out, inputs, count, op);
    case DataType::kBfloat16: return CheckHalfReduce<Bfloat16ToFloat, FloatToBfloat16>(out, inputs, count, op);
    case DataType::kFloat32: return CheckFloatReduce<float>(out, inputs, count, op);
    case DataType::kFloat64: return CheckFloatReduce<double>(out, inputs, count, op);
    case DataType::kInt8: return CheckIntReduce<int8_t>(out, inputs, count, op);
    case DataType::kUint8: return CheckIntReduce<uint8_t>(out, inputs, count, op);
    case DataType::kInt32: return CheckIntReduce<int32_t>(out, inputs, count, op);
    case DataType::kUint32: return CheckIntReduce<uint32_t>(out, inputs, count, op);
    case DataType::kInt64: return CheckIntReduce<int64_t>(out, inputs, count, op);
    case DataType::kUint64: return CheckIntReduce<uint64_t>(out, inputs, count, op);
  }
  return ::testing::AssertionFailure() << "invalid data type " << static_cast<int>(type);
}

// Fills `count` elements of `type` with inputs suited to the checks above: full-range integers
// (so sums and products wrap), floats in [-4, 4], float16/bfloat16 multiples of 1/4 in [-2, 2].
void FillInputs(void* p, size_t count, DataType type, Rng& rng) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kBfloat16: {
      auto* d = static_cast<uint16_t*>(p);
      for (size_t i = 0; i < count; ++i) {
        const float v = static_cast<float>(rng.Uniform(-8, 8)) / 4.0f;
        d[i] = type == DataType::kFloat16 ? FloatToHalf(v) : FloatToBfloat16(v);
      }
      return;
    }
    case DataType::kFloat32: {
      auto* d = static_cast<float*>(p);
      for (size_t i = 0; i < count; ++i) d[i] = static_cast<float>(rng.UniformDouble(-4, 4));
      return;
    }
    case DataType::kFloat64: {
      auto* d = static_cast<double*>(p);
      for (size_t i = 0; i < count; ++i) d[i] = rng.UniformDouble(-4, 4);
      return;
    }
    default: {
      const size_t esize = DataTypeSize(type);
      auto* d = static_cast<uint8_t*>(p);
      for (size_t i = 0; i < count; ++i) {
        const uint64_t v = rng.Next();
        std::memcpy(d + i * esize, &v, esize);  // little-endian: the low bytes
      }
      return;
    }
  }
}

std::string CaseName(DataType type, ReduceOp op, size_t inputs, size_t count) {
  return fmt::format("{} {} of {} input(s), count {}", DataTypeName(type), ReduceOpName(op), inputs, count);
}

// ---- A child process, always reaped ----

class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Kills and reaps a child that was not waited for (a failed assertion must not leave one).
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  Status Spawn(const std::string& path, const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int err = ::posix_spawn(&pid_, path.c_str(), nullptr, nullptr, argv.data(), environ);
    if (err != 0) {
      pid_ = -1;
      return FromErrno(err, "posix_spawn");
    }
    return Status::Ok();
  }

  // The child's wait status; kTimeout (and the child killed) at the deadline.
  Result<int> Wait(Deadline deadline) {
    if (pid_ <= 0) return InvalidArgument("no child to wait for");
    // A pidfd lets us block until the exit with a timeout; without one, poll at 1 ms.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    while (true) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      if (r < 0 && errno != EINTR) return FromErrno(errno, "waitpid");
      if (deadline.Expired()) {
        ::kill(pid_, SIGKILL);
        return Timeout(fmt::format("child {} did not exit in time; killed", pid_));
      }
      if (pidfd.valid()) {
        pollfd p{pidfd.get(), POLLIN, 0};
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
        ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms + 1, 1000)));
      } else {
        std::this_thread::sleep_for(1ms);
      }
    }
  }

 private:
  pid_t pid_ = -1;
};

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exit status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {}", WTERMSIG(status));
  return fmt::format("wait status {:#x}", status);
}

// ============================================================================================
// DeviceConformance: every backend.
// ============================================================================================

class DeviceConformance : public BackendTest {};

TEST_P(DeviceConformance, PropertiesDescribeEachDevice) {
  std::vector<std::string> uuids;
  for (int i = 0; i < backend().device_count(); ++i) {
    SCOPED_TRACE(fmt::format("device {}", i));
    Device* d = backend().device(i);
    ASSERT_NE(d, nullptr);
    const DeviceProperties& p = d->properties();
    EXPECT_EQ(p.backend, backend().name()) << "properties().backend must be the registry name";
    EXPECT_EQ(p.index, i);
    EXPECT_FALSE(p.name.empty()) << "every device needs a human-readable name";
    EXPECT_FALSE(p.uuid.empty()) << "every device needs a host-wide uuid (export/import matches on it)";
    EXPECT_GT(p.memory_bytes, 0u) << "memory_bytes sizes the out-of-memory checks and the cost model";
    EXPECT_GE(p.copy_gbps, 0.0);
    EXPECT_GE(p.reduce_gbps, 0.0);
    EXPECT_GE(p.launch_latency_us, 0.0);
    EXPECT_GE(p.numa_node, -1);
    EXPECT_EQ(d->label(), fmt::format("{}:{}", backend().name(), i));
    EXPECT_EQ(std::count(uuids.begin(), uuids.end(), p.uuid), 0) << "uuid " << p.uuid << " is not unique";
    uuids.push_back(p.uuid);
  }
  EXPECT_EQ(backend().device(backend().device_count()), nullptr) << "device(count) must be null";
  EXPECT_EQ(backend().device(-1), nullptr) << "device(-1) must be null";
}

TEST_P(DeviceConformance, AllocateZeroBytes) {
  auto r = device().Allocate(0);
  KZ_ASSERT_OK(r.status());
  EXPECT_EQ((*r)->size(), 0u);
  EXPECT_EQ(&(*r)->device(), &device());
  EXPECT_FALSE((*r)->imported());
}

TEST_P(DeviceConformance, AllocateManyBuffersWithoutOverlap) {
  constexpr int kBuffers = 1000;
  Rng rng(1);
  std::vector<std::unique_ptr<Buffer>> buffers;
  buffers.reserve(kBuffers);
  for (int i = 0; i < kBuffers; ++i) {
    const size_t bytes = i % 97 == 0 ? 0 : static_cast<size_t>(rng.Uniform(1, 8192));
    auto b = MustAllocate(bytes);
    KZ_ASSERT_NOT_NULL(b);
    buffers.push_back(std::move(b));
  }
  // Live buffers never share bytes.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const auto& b : buffers)
    if (b->size() > 0) ranges.emplace_back(reinterpret_cast<uintptr_t>(b->data()), b->size());
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    ASSERT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first) << "two live buffers overlap";
  if (under_test().Has(Tag::kHostAccessible)) {
    for (size_t i = 0; i < buffers.size(); ++i) FillPattern(buffers[i]->data(), buffers[i]->size(), i);
    for (size_t i = 0; i < buffers.size(); ++i)
      ASSERT_TRUE(HasPattern(buffers[i]->data(), buffers[i]->size(), i)) << "buffer " << i;
  }
  // Free in a scrambled order, then the device must still allocate.
  for (size_t i = buffers.size(); i > 1; --i) std::swap(buffers[i - 1], buffers[rng.Next() % i]);
  buffers.clear();
  auto again = MustAllocate(1 << 20);
  EXPECT_NE(again, nullptr);
}

TEST_P(DeviceConformance, AllocationBeyondMemoryIsOutOfMemory) {
  const uint64_t memory = device().properties().memory_bytes;
  if (memory > 0 && memory < std::numeric_limits<size_t>::max()) {
    KZ_EXPECT_CODE(device().Allocate(static_cast<size_t>(memory) + 1).status(), StatusCode::kOutOfMemory);
  }
  KZ_EXPECT_CODE(device().Allocate(size_t{1} << 62).status(), StatusCode::kOutOfMemory);
  // A failed allocation leaves the device usable.
  auto b = MustAllocate(4096);
  EXPECT_NE(b, nullptr);
}

TEST_P(DeviceConformance, EmptyStreamIsComplete) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  EXPECT_EQ(&stream->device(), &device());
  auto q = stream->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
  KZ_EXPECT_OK(stream->Synchronize(Short()));
  // Several streams and events per device.
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < 8; ++i) {
    streams.push_back(MustCreateStream());
    events.push_back(MustCreateEvent());
    KZ_ASSERT_NOT_NULL(streams.back());
    KZ_ASSERT_NOT_NULL(events.back());
  }
}

TEST_P(DeviceConformance, UnrecordedEventIsComplete) {
  auto event = MustCreateEvent();
  KZ_ASSERT_NOT_NULL(event);
  EXPECT_EQ(&event->device(), &device());
  auto q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q) << "an event that was never recorded counts as complete";
  KZ_EXPECT_OK(event->Synchronize(Short()));
  // Waiting on it delays nothing.
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_OK(stream->Wait(*event));
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, EventQueryBeforeAndAfterCompletion) {
  auto stream = MustCreateStream();
  auto event = MustCreateEvent();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(event);
  auto gate = std::make_shared<Gate>();
  OpenOnExit opener(gate);
  KZ_ASSERT_OK(EnqueueGate(*stream, gate));
  KZ_ASSERT_OK(stream->Record(*event));
  ASSERT_TRUE(gate->WaitReached(TestDeadline())) << "the gate callback never ran";

  auto q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_FALSE(*q) << "the event captured work that is still held";
  auto sq = stream->Query();
  KZ_ASSERT_OK(sq.status());
  EXPECT_FALSE(*sq);
  // The timeout paths: both waits give up at their deadline with kTimeout.
  KZ_EXPECT_CODE(event->Synchronize(Short()), StatusCode::kTimeout);
  KZ_EXPECT_CODE(stream->Synchronize(Short()), StatusCode::kTimeout);

  gate->Open();
  KZ_ASSERT_OK(event->Synchronize(TestDeadline()));
  q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
  sq = stream->Query();
  KZ_ASSERT_OK(sq.status());
  EXPECT_TRUE(*sq);
}

TEST_P(DeviceConformance, EventReRecordCapturesNewWork) {
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  auto event = MustCreateEvent();
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(event->Synchronize(TestDeadline()));

  // Re-recorded on another stream behind held work: pending again, complete once released.
  auto gate = std::make_shared<Gate>();
  OpenOnExit opener(gate);
  KZ_ASSERT_OK(EnqueueGate(*b, gate));
  KZ_ASSERT_OK(b->Record(*event));
  auto q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_FALSE(*q) << "re-recording must capture the new stream's pending work";
  gate->Open();
  KZ_ASSERT_OK(event->Synchronize(TestDeadline()));
  q = event->Query();
  KZ_ASSERT_OK(q.status());
  EXPECT_TRUE(*q);

  // And once more on the first stream, many times in a row.
  for (int i = 0; i < 100; ++i) KZ_ASSERT_OK(a->Record(*event));
  KZ_EXPECT_OK(event->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, CrossStreamWaitOrdersWork) {
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  auto event = MustCreateEvent();
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);
  auto gate = std::make_shared<Gate>();
  auto a_done = std::make_shared<std::atomic<bool>>(false);
  auto b_ran = std::make_shared<std::atomic<bool>>(false);
  auto b_saw_a_done = std::make_shared<std::atomic<bool>>(false);
  OpenOnExit opener(gate);

  KZ_ASSERT_OK(EnqueueGate(*a, gate));
  KZ_ASSERT_OK(a->EnqueueHostCallback([a_done](const Status&) { a_done->store(true); }));
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(b->Wait(*event));
  KZ_ASSERT_OK(b->EnqueueHostCallback([a_done, b_ran, b_saw_a_done](const Status& s) {
    b_saw_a_done->store(a_done->load() && s.ok());
    b_ran->store(true);
  }));

  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  std::this_thread::sleep_for(20ms);  // give a wrongly unordered stream B time to run ahead
  EXPECT_FALSE(b_ran->load()) << "stream B ran past its Wait on an event that had not completed";
  auto qb = b->Query();
  KZ_ASSERT_OK(qb.status());
  EXPECT_FALSE(*qb);

  gate->Open();
  KZ_ASSERT_OK(b->Synchronize(TestDeadline()));
  EXPECT_TRUE(b_ran->load());
  EXPECT_TRUE(b_saw_a_done->load()) << "stream B's work ran before the work its event captured";
  KZ_EXPECT_OK(a->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, HostCallbacksRunInOrderWithOkStatus) {
  constexpr int kCallbacks = 1000;
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> not_ok{0};
  for (int i = 0; i < kCallbacks; ++i) {
    KZ_ASSERT_OK(stream->EnqueueHostCallback([&, i](const Status& s) {
      if (!s.ok()) not_ok.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    }));
  }
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), static_cast<size_t>(kCallbacks));
  for (int i = 0; i < kCallbacks; ++i) ASSERT_EQ(order[i], i) << "callbacks ran out of order";
  EXPECT_EQ(not_ok.load(), 0) << "callbacks on a healthy stream must see an ok status";
}

TEST_P(DeviceConformance, EmptyHostCallbackIsInvalid) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_EXPECT_CODE(stream->EnqueueHostCallback(HostCallback()), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

TEST_P(DeviceConformance, StreamDestructorDrainsQueuedWork) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  auto ran = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < 3; ++i) {
    KZ_ASSERT_OK(stream->EnqueueHostCallback([ran](const Status&) {
      std::this_thread::sleep_for(10ms);
      ran->fetch_add(1);
    }));
  }
  stream.reset();
  EXPECT_EQ(ran->load(), 3) << "destroying a stream must first finish its queued work";
}

TEST_P(DeviceConformance, InvalidCopyArgumentsAreRejected) {
  auto stream = MustCreateStream();
  auto buffer = MustAllocate(4096);
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* p = Bytes(*buffer);
  KZ_EXPECT_CODE(stream->Copy(nullptr, p, 16), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Copy(p, nullptr, 16), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Copy(p + 8, p, 16), StatusCode::kInvalidArgument);  // overlap
  KZ_EXPECT_CODE(stream->Copy(p, p + 15, 16), StatusCode::kInvalidArgument);
  KZ_EXPECT_OK(stream->Copy(p, p + 16, 0));  // nothing to do
  KZ_EXPECT_OK(stream->Copy(nullptr, nullptr, 0));
  auto q = stream->Query();
  KZ_ASSERT_OK(q.status());
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline())) << "a rejected call must not poison the stream";
}

TEST_P(DeviceConformance, InvalidReduceArgumentsAreRejected) {
  constexpr size_t kCount = 64;
  auto stream = MustCreateStream();
  auto buffer = MustAllocate(4 * kCount * sizeof(float));
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* f = static_cast<float*>(buffer->data());
  const void* a = f;
  const void* b = f + kCount;
  void* out = f + 2 * kCount;
  const void* two[] = {a, b};
  KZ_EXPECT_CODE(stream->Reduce(out, std::span<const void* const>(), kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Reduce(nullptr, two, kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  const void* with_null[] = {a, nullptr};
  KZ_EXPECT_CODE(stream->Reduce(out, with_null, kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Reduce(out, two, kCount, static_cast<DataType>(42), ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(stream->Reduce(out, two, kCount, DataType::kFloat32, static_cast<ReduceOp>(17)),
                 StatusCode::kInvalidArgument);
  // Output overlapping an input by part of its range (not exactly in place).
  const void* shifted[] = {f + 2 * kCount + 1, b};
  KZ_EXPECT_CODE(stream->Reduce(out, shifted, kCount, DataType::kFloat32, ReduceOp::kSum),
                 StatusCode::kInvalidArgument);
  const void* overlap_b[] = {a, f + kCount + kCount / 2};
  KZ_EXPECT_CODE(stream->Reduce(f + kCount, overlap_b, kCount, DataType::kFloat32, ReduceOp::kMax),
                 StatusCode::kInvalidArgument);
  // Count 0 is valid and does nothing.
  KZ_EXPECT_OK(stream->Reduce(out, two, 0, DataType::kFloat32, ReduceOp::kSum));
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline())) << "a rejected call must not poison the stream";
}

TEST_P(DeviceConformance, ExportIsRangeCheckedOrNotSupported) {
  auto buffer = MustAllocate(8192);
  KZ_ASSERT_NOT_NULL(buffer);
  const DeviceProperties& p = device().properties();
  if (!p.export_fd && !p.export_opaque) {
    KZ_EXPECT_CODE(device().Export(*buffer).status(), StatusCode::kNotSupported);
    return;
  }
  KZ_EXPECT_CODE(device().Export(*buffer, 0, 8193).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 8193, 0).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 4096, 4097).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 0, 0).status(), StatusCode::kInvalidArgument);
  KZ_EXPECT_CODE(device().Export(*buffer, 0, std::numeric_limits<size_t>::max()).status(),
                 StatusCode::kInvalidArgument);
  if (backend().device_count() > 1) {
    KZ_EXPECT_CODE(device(1).Export(*buffer).status(), StatusCode::kInvalidArgument);
  }
  auto ok = device().Export(*buffer, 4096, 4096);
  KZ_ASSERT_OK(ok.status());
  EXPECT_EQ(ok->backend, backend().name());
  EXPECT_EQ(ok->device_uuid, p.uuid);
  EXPECT_EQ(ok->device_index, p.index);
  EXPECT_EQ(ok->size, 4096u);
  if (ok->kind == ExportKind::kFd) EXPECT_TRUE(ok->fd.valid());
  else EXPECT_FALSE(ok->opaque.empty());
}

TEST_P(DeviceConformance, ImportFromAnotherBackendIsNotSupported) {
  // A well-formed fd export that names another backend.
  ExportedMemory foreign;
  foreign.kind = ExportKind::kFd;
  foreign.fd = UniqueFd(::memfd_create("kz-conformance-foreign", MFD_CLOEXEC));
  ASSERT_TRUE(foreign.fd.valid()) << "memfd_create: " << std::strerror(errno);
  ASSERT_EQ(::ftruncate(foreign.fd.get(), 4096), 0);
  foreign.size = 4096;
  foreign.backend = std::string(backend().name()) + "_elsewhere";
  foreign.device_uuid = "not-a-device-of-this-backend";
  KZ_EXPECT_CODE(device().Import(foreign).status(), StatusCode::kNotSupported);

  // Real exports of every other backend that exports.
  for (const BackendUnderTest& other : World().backends()) {
    if (!other.available() || other.name == under_test().name) continue;
    if (!other.Has(Tag::kExportFd) && !other.Has(Tag::kExportOpaque)) continue;
    SCOPED_TRACE("memory exported by " + other.name);
    Device* od = other.slot->backend->device(0);
    auto ob = od->Allocate(4096);
    KZ_ASSERT_OK(ob.status());
    auto exported = od->Export(**ob);
    KZ_ASSERT_OK(exported.status());
    KZ_EXPECT_CODE(device().Import(*exported).status(), StatusCode::kNotSupported);
  }
}

TEST_P(DeviceConformance, EventsDoNotCrossBackends) {
  const BackendUnderTest* other = nullptr;
  for (const BackendUnderTest& b : World().backends())
    if (b.available() && b.name != under_test().name && b.slot->backend->device_count() > 0) other = &b;
  if (other == nullptr) GTEST_SKIP() << "no second available backend in this run";
  auto stream = MustCreateStream();
  auto mine = MustCreateEvent();
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(mine);
  auto theirs = other->slot->backend->device(0)->CreateEvent();
  KZ_ASSERT_OK(theirs.status());
  KZ_EXPECT_CODE(stream->Record(**theirs), StatusCode::kNotSupported);
  KZ_EXPECT_CODE(stream->Wait(**theirs), StatusCode::kNotSupported);
  KZ_EXPECT_OK(stream->Record(*mine));
  KZ_EXPECT_OK(stream->Synchronize(TestDeadline()));
}

// ============================================================================================
// DataConformance: host-accessible backends; every byte is checked.
// ============================================================================================

class DataConformance : public BackendTest {};

constexpr size_t kOddSizes[] = {1, 3, 4095, 4096, 65537, (size_t{1} << 20) + 7};
struct OffsetPair {
  size_t src, dst;
};
constexpr OffsetPair kOffsetPairs[] = {{0, 0}, {1, 3}, {3, 1}, {4097, 0}, {0, 4097}, {7, 7}};
constexpr size_t kMaxOffset = 4097;

TEST_P(DataConformance, CopyOddSizesAndOffsetsBetweenBuffers) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  for (size_t size : kOddSizes) {
    const size_t total = size + kMaxOffset + 64;  // 64 guard bytes past the farthest end
    auto src = MustAllocate(total);
    auto dst = MustAllocate(total);
    KZ_ASSERT_NOT_NULL(src);
    KZ_ASSERT_NOT_NULL(dst);
    FillPattern(src->data(), total, 1000 + size);
    for (const OffsetPair& o : kOffsetPairs) {
      SCOPED_TRACE(fmt::format("{} bytes, src offset {}, dst offset {}", size, o.src, o.dst));
      FillPattern(dst->data(), total, 7);
      KZ_ASSERT_OK(stream->Copy(Bytes(*dst) + o.dst, Bytes(*src) + o.src, size));
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
      EXPECT_TRUE(BytesEqual(Bytes(*dst) + o.dst, Bytes(*src) + o.src, size));
      // Nothing outside the destination range was touched.
      std::vector<uint8_t> expect(total);
      FillPattern(expect.data(), total, 7);
      EXPECT_TRUE(BytesEqual(Bytes(*dst), expect.data(), o.dst)) << "bytes before the destination";
      EXPECT_TRUE(BytesEqual(Bytes(*dst) + o.dst + size, expect.data() + o.dst + size, total - o.dst - size))
          << "bytes after the destination";
    }
    EXPECT_TRUE(HasPattern(src->data(), total, 1000 + size)) << "the source changed";
  }
}

TEST_P(DataConformance, CopyWithinOneBuffer) {
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  for (size_t size : kOddSizes) {
    SCOPED_TRACE(fmt::format("{} bytes", size));
    // [guard][src at 5][gap 3][dst][guard]: odd offsets, adjacent but not overlapping.
    const size_t src_off = 5, dst_off = src_off + size + 3, total = dst_off + size + 11;
    auto buffer = MustAllocate(total);
    KZ_ASSERT_NOT_NULL(buffer);
    FillPattern(buffer->data(), total, size);
    std::vector<uint8_t> expect(Bytes(*buffer), Bytes(*buffer) + total);
    std::memcpy(expect.data() + dst_off, expect.data() + src_off, size);
    KZ_ASSERT_OK(stream->Copy(Bytes(*buffer) + dst_off, Bytes(*buffer) + src_off, size));
    // Adjacent ranges (dst ends where src begins) are not an overlap either.
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    EXPECT_TRUE(BytesEqual(Bytes(*buffer), expect.data(), total));
  }
  auto adjacent = MustAllocate(64);
  KZ_ASSERT_NOT_NULL(adjacent);
  FillPattern(adjacent->data(), 64, 3);
  std::vector<uint8_t> expect(Bytes(*adjacent), Bytes(*adjacent) + 64);
  std::memcpy(expect.data(), expect.data() + 32, 32);
  KZ_ASSERT_OK(stream->Copy(Bytes(*adjacent), Bytes(*adjacent) + 32, 32));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(BytesEqual(Bytes(*adjacent), expect.data(), 64));
}

TEST_P(DataConformance, RejectedCallsEnqueueNothing) {
  constexpr size_t kCount = 256;
  auto stream = MustCreateStream();
  auto buffer = MustAllocate(4 * kCount * sizeof(int32_t));
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  const size_t total = buffer->size();
  FillPattern(buffer->data(), total, 99);
  auto* v = static_cast<int32_t*>(buffer->data());
  const void* in[] = {v, v + kCount};
  const void* partial[] = {v + 2 * kCount + 3, v + kCount};
  EXPECT_FALSE(stream->Copy(v + 10, v, kCount * sizeof(int32_t)).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, partial, kCount, DataType::kInt32, ReduceOp::kSum).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, in, kCount, static_cast<DataType>(200), ReduceOp::kSum).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, in, kCount, DataType::kInt32, static_cast<ReduceOp>(200)).ok());
  EXPECT_FALSE(stream->Reduce(v + 2 * kCount, std::span<const void* const>(), kCount, DataType::kInt32,
                              ReduceOp::kSum).ok());
  KZ_EXPECT_OK(stream->Reduce(v + 2 * kCount, in, 0, DataType::kInt32, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(buffer->data(), total, 99)) << "a rejected (or empty) call changed memory";
}

// One batch per data type: every op x 1..8 inputs x counts {1, 3, 1031}, enqueued back to back on
// one stream (outputs in one buffer, inputs in another), then checked after one Synchronize.
TEST_P(DataConformance, ReduceEveryTypeOpAndInputCount) {
  constexpr size_t kMaxInputs = 8;
  constexpr size_t kCounts[] = {1, 3, 1031};
  constexpr size_t kMaxCount = 1031;
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  Rng rng(2024);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t esize = DataTypeSize(type);
    const size_t stride = kMaxCount * esize;
    auto inputs = MustAllocate(kMaxInputs * stride);
    KZ_ASSERT_NOT_NULL(inputs);
    for (size_t k = 0; k < kMaxInputs; ++k) FillInputs(Bytes(*inputs) + k * stride, kMaxCount, type, rng);
    const std::vector<uint8_t> host(Bytes(*inputs), Bytes(*inputs) + inputs->size());

    struct Case {
      ReduceOp op;
      size_t n, count, out_offset;
    };
    std::vector<Case> cases;
    size_t out_bytes = 0;
    for (ReduceOp op : AllReduceOps())
      for (size_t n = 1; n <= kMaxInputs; ++n)
        for (size_t count : kCounts) {
          cases.push_back({op, n, count, out_bytes});
          out_bytes += count * esize + 8 * esize;  // a small gap keeps neighbours apart
        }
    auto outputs = MustAllocate(out_bytes);
    KZ_ASSERT_NOT_NULL(outputs);
    FillPattern(outputs->data(), out_bytes, 5);
    for (const Case& c : cases) {
      std::vector<const void*> srcs;
      for (size_t k = 0; k < c.n; ++k) srcs.push_back(Bytes(*inputs) + k * stride);
      KZ_ASSERT_OK(stream->Reduce(Bytes(*outputs) + c.out_offset, srcs, c.count, type, c.op))
          << CaseName(type, c.op, c.n, c.count);
    }
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    for (const Case& c : cases) {
      std::vector<const void*> srcs;
      for (size_t k = 0; k < c.n; ++k) srcs.push_back(host.data() + k * stride);
      EXPECT_TRUE(CheckReduce(Bytes(*outputs) + c.out_offset, srcs, c.count, type, c.op))
          << CaseName(type, c.op, c.n, c.count);
      // The gap after each output is untouched.
      std::vector<uint8_t> gap(8 * esize);
      const size_t gap_at = c.out_offset + c.count * esize;
      for (size_t i = 0; i < gap.size(); ++i) gap[i] = PatternByte(5, gap_at + i);
      EXPECT_TRUE(BytesEqual(Bytes(*outputs) + gap_at, gap.data(), gap.size()))
          << CaseName(type, c.op, c.n, c.count) << " wrote past its output";
    }
    EXPECT_TRUE(BytesEqual(Bytes(*inputs), host.data(), host.size())) << "a reduce changed its inputs";
  }
}

// Large counts take the multi-threaded paths of a backend (host_emulated splits past 1 MiB).
TEST_P(DataConformance, ReduceLargeCount) {
  constexpr size_t kCount = (size_t{1} << 20) + 3;
  constexpr size_t kInputs = 4;
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  Rng rng(7);
  for (DataType type : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(type));
    const size_t bytes = kCount * DataTypeSize(type);
    auto inputs = MustAllocate(kInputs * bytes);
    auto outputs = MustAllocate(kNumReduceOps * bytes);
    KZ_ASSERT_NOT_NULL(inputs);
    KZ_ASSERT_NOT_NULL(outputs);
    std::vector<const void*> srcs;
    for (size_t k = 0; k < kInputs; ++k) {
      FillInputs(Bytes(*inputs) + k * bytes, kCount, type, rng);
      srcs.push_back(Bytes(*inputs) + k * bytes);
    }
    for (size_t o = 0; o < AllReduceOps().size(); ++o)
      KZ_ASSERT_OK(stream->Reduce(Bytes(*outputs) + o * bytes, srcs, kCount, type, AllReduceOps()[o]));
    KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    for (size_t o = 0; o < AllReduceOps().size(); ++o)
      EXPECT_TRUE(CheckReduce(Bytes(*outputs) + o * bytes, srcs, kCount, type, AllReduceOps()[o]))
          << CaseName(type, AllReduceOps()[o], kInputs, kCount);
  }
}

TEST_P(DataConformance, ReduceInPlace) {
  constexpr size_t kCount = 1031;
  auto stream = MustCreateStream();
  KZ_ASSERT_NOT_NULL(stream);
  Rng rng(11);
  for (DataType type : AllDataTypes()) {
    for (ReduceOp op : AllReduceOps()) {
      // dst == srcs[0] (the NCCL in-place form), and dst == the last of four inputs.
      for (size_t inplace_at : {size_t{0}, size_t{3}}) {
        const size_t n = inplace_at == 0 ? 3 : 4;
        SCOPED_TRACE(CaseName(type, op, n, kCount) + fmt::format(", output is input {}", inplace_at));
        const size_t bytes = kCount * DataTypeSize(type);
        auto buffer = MustAllocate(n * bytes);
        KZ_ASSERT_NOT_NULL(buffer);
        for (size_t k = 0; k < n; ++k) FillInputs(Bytes(*buffer) + k * bytes, kCount, type, rng);
        const std::vector<uint8_t> host(Bytes(*buffer), Bytes(*buffer) + n * bytes);
        std::vector<const void*> srcs, host_srcs;
        for (size_t k = 0; k < n; ++k) {
          srcs.push_back(Bytes(*buffer) + k * bytes);
          host_srcs.push_back(host.data() + k * bytes);
        }
        void* dst = Bytes(*buffer) + inplace_at * bytes;
        KZ_ASSERT_OK(stream->Reduce(dst, srcs, kCount, type, op));
        KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
        EXPECT_TRUE(CheckReduce(dst, host_srcs, kCount, type, op));
      }
    }
  }
  // In place at a large count (the parallel path reads and writes the same memory).
  constexpr size_t kLarge = (size_t{1} << 20) + 3;
  auto big = MustAllocate(3 * kLarge * sizeof(float));
  KZ_ASSERT_NOT_NULL(big);
  auto* f = static_cast<float*>(big->data());
  FillInputs(f, 3 * kLarge, DataType::kFloat32, rng);
  const std::vector<float> host(f, f + 3 * kLarge);
  const void* srcs[] = {f, f + kLarge, f + 2 * kLarge};
  const void* host_srcs[] = {host.data(), host.data() + kLarge, host.data() + 2 * kLarge};
  KZ_ASSERT_OK(stream->Reduce(f, srcs, kLarge, DataType::kFloat32, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(CheckReduce(f, host_srcs, kLarge, DataType::kFloat32, ReduceOp::kSum));
}

TEST_P(DataConformance, ReduceCountZeroAndRepeatedInputs) {
  constexpr size_t kCount = 333;
  auto stream = MustCreateStream();
  auto buffer = MustAllocate(3 * kCount * sizeof(int64_t));
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* v = static_cast<int64_t*>(buffer->data());
  Rng rng(5);
  FillInputs(v, 2 * kCount, DataType::kInt64, rng);
  FillPattern(v + 2 * kCount, kCount * sizeof(int64_t), 17);
  const void* in[] = {v, v + kCount};
  KZ_ASSERT_OK(stream->Reduce(v + 2 * kCount, in, 0, DataType::kInt64, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(v + 2 * kCount, kCount * sizeof(int64_t), 17)) << "count 0 wrote memory";

  // The same input may appear several times (only the output's overlap is restricted).
  const void* repeated[] = {v, v + kCount, v, v};
  KZ_ASSERT_OK(stream->Reduce(v + 2 * kCount, repeated, kCount, DataType::kInt64, ReduceOp::kSum));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(CheckReduce(v + 2 * kCount, repeated, kCount, DataType::kInt64, ReduceOp::kSum));
}

// 1,000 dependent operations on one stream: x <- 3x + 1 (mod 2^64) as a reduce of {x, x, x, one}
// into y followed by a copy of y back into x. The map is a bijection, so any reordering, skipped or
// repeated operation changes the final value; host callbacks every 100 operations check the value
// at that point and their own order.
TEST_P(DataConformance, StreamOrderingOverALongDependentChain) {
  constexpr size_t kCount = 257;
  constexpr int kSteps = 500;  // two operations each
  constexpr int kCheckEvery = 50;
  auto stream = MustCreateStream();
  auto buffer = MustAllocate(3 * kCount * sizeof(uint64_t));
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(buffer);
  auto* x = static_cast<uint64_t*>(buffer->data());
  uint64_t* y = x + kCount;
  uint64_t* one = x + 2 * kCount;
  for (size_t i = 0; i < kCount; ++i) {
    x[i] = i * 0x9e3779b97f4a7c15ull;
    one[i] = 1;
  }
  // expected[s][i]: the value of x after s steps.
  std::vector<std::vector<uint64_t>> expected(kSteps + 1, std::vector<uint64_t>(kCount));
  for (size_t i = 0; i < kCount; ++i) expected[0][i] = x[i];
  for (int s = 1; s <= kSteps; ++s)
    for (size_t i = 0; i < kCount; ++i) expected[s][i] = 3 * expected[s - 1][i] + 1;

  std::mutex mu;
  std::vector<int> seen_steps;  // guarded by mu
  std::atomic<int> wrong_values{0}, not_ok{0};
  const void* srcs[] = {x, x, x, one};
  for (int s = 1; s <= kSteps; ++s) {
    KZ_ASSERT_OK(stream->Reduce(y, srcs, kCount, DataType::kUint64, ReduceOp::kSum));
    KZ_ASSERT_OK(stream->Copy(x, y, kCount * sizeof(uint64_t)));
    if (s % kCheckEvery == 0) {
      KZ_ASSERT_OK(stream->EnqueueHostCallback([&, s](const Status& st) {
        if (!st.ok()) not_ok.fetch_add(1);
        if (std::memcmp(x, expected[s].data(), kCount * sizeof(uint64_t)) != 0) wrong_values.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        seen_steps.push_back(s);
      }));
    }
  }
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_TRUE(BytesEqual(x, expected[kSteps].data(), kCount * sizeof(uint64_t)));
  EXPECT_EQ(wrong_values.load(), 0) << "a host callback saw work after it, or missed work before it";
  EXPECT_EQ(not_ok.load(), 0);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen_steps.size(), static_cast<size_t>(kSteps / kCheckEvery));
  for (size_t i = 0; i < seen_steps.size(); ++i) EXPECT_EQ(seen_steps[i], static_cast<int>(i + 1) * kCheckEvery);
}

// Stream B consumes what stream A produces, ordered only by an event; A is held behind a gate so
// B would visibly run early if the Wait were ignored.
TEST_P(DataConformance, CrossStreamWaitOrdersData) {
  constexpr size_t kBytes = (size_t{1} << 20) + 5;
  auto a = MustCreateStream();
  auto b = MustCreateStream();
  auto event = MustCreateEvent();
  auto src = MustAllocate(kBytes);
  auto mid = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(a);
  KZ_ASSERT_NOT_NULL(b);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(mid);
  KZ_ASSERT_NOT_NULL(dst);
  FillPattern(src->data(), kBytes, 1);
  FillPattern(mid->data(), kBytes, 2);
  FillPattern(dst->data(), kBytes, 3);
  auto gate = std::make_shared<Gate>();
  OpenOnExit opener(gate);
  KZ_ASSERT_OK(EnqueueGate(*a, gate));
  KZ_ASSERT_OK(a->Copy(mid->data(), src->data(), kBytes));
  KZ_ASSERT_OK(a->Record(*event));
  KZ_ASSERT_OK(b->Wait(*event));
  KZ_ASSERT_OK(b->Copy(dst->data(), mid->data(), kBytes));
  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(HasPattern(dst->data(), kBytes, 3)) << "stream B copied before the event it waits on completed";
  gate->Open();
  KZ_ASSERT_OK(b->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(dst->data(), kBytes, 1));
  KZ_EXPECT_OK(a->Synchronize(TestDeadline()));
}

TEST_P(DataConformance, HostCallbackSeesEarlierWork) {
  constexpr size_t kBytes = (size_t{4} << 20) + 1;
  auto stream = MustCreateStream();
  auto src = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(stream);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  FillPattern(src->data(), kBytes, 21);
  FillPattern(dst->data(), kBytes, 22);
  std::atomic<int> seen{-1};
  KZ_ASSERT_OK(stream->Copy(dst->data(), src->data(), kBytes));
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) {
    seen.store(s.ok() && std::memcmp(dst->data(), src->data(), kBytes) == 0 ? 1 : 0);
  }));
  KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
  EXPECT_EQ(seen.load(), 1) << "the callback ran before the copy enqueued ahead of it had finished";
}

TEST_P(DataConformance, StreamDestructorFinishesCopies) {
  constexpr size_t kBytes = (size_t{8} << 20) + 3;
  auto src = MustAllocate(kBytes);
  auto dst = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  FillPattern(src->data(), kBytes, 31);
  FillPattern(dst->data(), kBytes, 32);
  {
    auto stream = MustCreateStream();
    KZ_ASSERT_NOT_NULL(stream);
    KZ_ASSERT_OK(stream->Copy(dst->data(), src->data(), kBytes));
  }
  EXPECT_TRUE(HasPattern(dst->data(), kBytes, 31));
}

TEST_P(DataConformance, ConcurrentStreamsOnOneDevice) {
  constexpr int kStreams = 4;
  constexpr size_t kBytes = (size_t{1} << 20) + 9;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Buffer>> srcs, dsts;
  for (int s = 0; s < kStreams; ++s) {
    streams.push_back(MustCreateStream());
    srcs.push_back(MustAllocate(kBytes));
    dsts.push_back(MustAllocate(kBytes));
    KZ_ASSERT_NOT_NULL(streams.back());
    KZ_ASSERT_NOT_NULL(srcs.back());
    KZ_ASSERT_NOT_NULL(dsts.back());
    FillPattern(srcs.back()->data(), kBytes, 40 + s);
  }
  for (int round = 0; round < 4; ++round)
    for (int s = 0; s < kStreams; ++s) KZ_ASSERT_OK(streams[s]->Copy(dsts[s]->data(), srcs[s]->data(), kBytes));
  for (int s = 0; s < kStreams; ++s) KZ_ASSERT_OK(streams[s]->Synchronize(TestDeadline()));
  for (int s = 0; s < kStreams; ++s) EXPECT_TRUE(HasPattern(dsts[s]->data(), kBytes, 40 + s)) << "stream " << s;
}

// ============================================================================================
// MultiDeviceConformance: two devices of one backend.
// ============================================================================================

class MultiDeviceConformance : public BackendTest {};

TEST_P(MultiDeviceConformance, CopyBetweenDevices) {
  Device& d0 = device(0);
  Device& d1 = device(1);
  auto s0 = MustCreateStream(d0);
  auto s1 = MustCreateStream(d1);
  KZ_ASSERT_NOT_NULL(s0);
  KZ_ASSERT_NOT_NULL(s1);
  for (size_t size : kOddSizes) {
    const size_t total = size + kMaxOffset + 64;
    auto b0 = MustAllocate(d0, total);
    auto b1 = MustAllocate(d1, total);
    KZ_ASSERT_NOT_NULL(b0);
    KZ_ASSERT_NOT_NULL(b1);
    for (const OffsetPair& o : kOffsetPairs) {
      // Device 0 -> 1 on device 0's stream, 1 -> 0 on device 1's stream, and 0 -> 1 driven by the
      // destination's stream.
      struct Leg {
        Stream* stream;
        Buffer* from;
        Buffer* to;
        const char* what;
      };
      const Leg legs[] = {{s0.get(), b0.get(), b1.get(), "0 -> 1 on device 0's stream"},
                          {s1.get(), b1.get(), b0.get(), "1 -> 0 on device 1's stream"},
                          {s1.get(), b0.get(), b1.get(), "0 -> 1 on device 1's stream"}};
      for (const Leg& leg : legs) {
        SCOPED_TRACE(fmt::format("{} bytes {}, offsets {} -> {}", size, leg.what, o.src, o.dst));
        FillPattern(leg.from->data(), total, size + 1);
        FillPattern(leg.to->data(), total, 9);
        KZ_ASSERT_OK(leg.stream->Copy(Bytes(*leg.to) + o.dst, Bytes(*leg.from) + o.src, size));
        KZ_ASSERT_OK(leg.stream->Synchronize(TestDeadline()));
        EXPECT_TRUE(BytesEqual(Bytes(*leg.to) + o.dst, Bytes(*leg.from) + o.src, size));
        std::vector<uint8_t> expect(total);
        FillPattern(expect.data(), total, 9);
        EXPECT_TRUE(BytesEqual(Bytes(*leg.to), expect.data(), o.dst));
        EXPECT_TRUE(BytesEqual(Bytes(*leg.to) + o.dst + size, expect.data() + o.dst + size, total - o.dst - size));
      }
    }
  }
}

TEST_P(MultiDeviceConformance, EventOrdersStreamsOfTwoDevices) {
  constexpr size_t kBytes = (size_t{1} << 20) + 17;
  Device& d0 = device(0);
  Device& d1 = device(1);
  auto s0 = MustCreateStream(d0);
  auto s1 = MustCreateStream(d1);
  auto event = MustCreateEvent(d0);
  auto src = MustAllocate(d0, kBytes);
  auto dst = MustAllocate(d1, kBytes);
  KZ_ASSERT_NOT_NULL(s0);
  KZ_ASSERT_NOT_NULL(s1);
  KZ_ASSERT_NOT_NULL(event);
  KZ_ASSERT_NOT_NULL(src);
  KZ_ASSERT_NOT_NULL(dst);
  auto staging = MustAllocate(d0, kBytes);
  KZ_ASSERT_NOT_NULL(staging);
  FillPattern(src->data(), kBytes, 51);
  FillPattern(staging->data(), kBytes, 52);
  FillPattern(dst->data(), kBytes, 53);
  auto gate = std::make_shared<Gate>();
  OpenOnExit opener(gate);
  KZ_ASSERT_OK(EnqueueGate(*s0, gate));
  KZ_ASSERT_OK(s0->Copy(staging->data(), src->data(), kBytes));
  KZ_ASSERT_OK(s0->Record(*event));
  KZ_ASSERT_OK(s1->Wait(*event));  // an event of device 0 waited on by device 1's stream
  KZ_ASSERT_OK(s1->Copy(dst->data(), staging->data(), kBytes));
  ASSERT_TRUE(gate->WaitReached(TestDeadline()));
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(HasPattern(dst->data(), kBytes, 53)) << "device 1's stream ran past its wait";
  gate->Open();
  KZ_ASSERT_OK(s1->Synchronize(TestDeadline()));
  EXPECT_TRUE(HasPattern(dst->data(), kBytes, 51));
  KZ_EXPECT_OK(s0->Synchronize(TestDeadline()));
}

// ============================================================================================
// ExportConformance: export, then import in this process and in a second one.
// ============================================================================================

class ExportConformance : public BackendTest {};

TEST_P(ExportConformance, ImportInTheSameProcess) {
  constexpr size_t kBytes = 65536 + 13;
  struct Range {
    size_t offset, size;
  };
  // Whole buffer, a page-aligned window, and an odd window not starting on a page.
  const Range ranges[] = {{0, kBytes}, {4096, 8192}, {4096 + 7, 1003}};
  std::vector<int> importers = {0};
  if (backend().device_count() > 1) importers.push_back(1);
  for (int importer : importers) {
    for (const Range& r : ranges) {
      SCOPED_TRACE(fmt::format("range [{}, +{}) imported on device {}", r.offset, r.size, importer));
      Device& target = device(importer);
      auto buffer = MustAllocate(kBytes);
      auto stream = MustCreateStream(target);
      KZ_ASSERT_NOT_NULL(buffer);
      KZ_ASSERT_NOT_NULL(stream);
      FillPattern(buffer->data(), kBytes, 61);
      std::unique_ptr<Buffer> imported;
      {
        auto exported = device().Export(*buffer, r.offset, r.size);
        KZ_ASSERT_OK(exported.status());
        EXPECT_EQ(exported->size, r.size);
        auto im = target.Import(*exported);
        KZ_ASSERT_OK(im.status());
        imported = std::move(im).value();
      }  // the ExportedMemory is gone; the import keeps its own reference
      ASSERT_EQ(imported->size(), r.size);
      EXPECT_TRUE(imported->imported());
      EXPECT_EQ(&imported->device(), &target);
      std::vector<uint8_t> expect(kBytes);
      FillPattern(expect.data(), kBytes, 61);
      EXPECT_TRUE(BytesEqual(imported->data(), expect.data() + r.offset, r.size)) << "import shows other bytes";

      // Writes through the import (a stream copy on the importing device) land in the original.
      auto staging = MustAllocate(target, r.size);
      KZ_ASSERT_NOT_NULL(staging);
      FillPattern(staging->data(), r.size, 62);
      KZ_ASSERT_OK(stream->Copy(imported->data(), staging->data(), r.size));
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
      EXPECT_TRUE(HasPattern(Bytes(*buffer) + r.offset, r.size, 62));
      EXPECT_TRUE(BytesEqual(Bytes(*buffer), expect.data(), r.offset)) << "bytes before the exported range";
      EXPECT_TRUE(BytesEqual(Bytes(*buffer) + r.offset + r.size, expect.data() + r.offset + r.size,
                             kBytes - r.offset - r.size))
          << "bytes after the exported range";
      // Imported memory is not exported again.
      KZ_EXPECT_CODE(target.Export(*imported).status(), StatusCode::kNotSupported);
      KZ_ASSERT_OK(stream->Synchronize(TestDeadline()));
    }
  }
}

// The parent exports a window of a buffer, hands it to a child process (this binary, run with
// --child-import) over a Unix socket, and both check each other's bytes. The child's side is in
// conformance_main.cc.
TEST_P(ExportConformance, ImportInAChildProcess) {
  constexpr size_t kBytes = (size_t{1} << 20) + 4096 + 29;
  constexpr size_t kOffset = 4096 + 7;
  constexpr size_t kSize = (size_t{1} << 20) + 11;
  auto buffer = MustAllocate(kBytes);
  KZ_ASSERT_NOT_NULL(buffer);
  uint8_t* p = Bytes(*buffer);
  FillPattern(p, kBytes, 71);
  for (size_t i = 0; i < kSize; ++i) p[kOffset + i] = ParentByte(i);
  std::vector<uint8_t> outside(p, p + kBytes);

  auto exported = device().Export(*buffer, kOffset, kSize);
  KZ_ASSERT_OK(exported.status());

  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0) << std::strerror(errno);
  UniqueFd parent_end(sv[0]), child_end(sv[1]);
  // Only the child's end survives the exec.
  ASSERT_EQ(::fcntl(child_end.get(), F_SETFD, 0), 0) << std::strerror(errno);

  std::vector<std::string> args = {"device_conformance_test",
                                   fmt::format("{}{}:{}:{}", kChildImportFlag, under_test().name,
                                               device().properties().index, child_end.get())};
  for (const std::string& plugin : CommandLinePlugins()) args.push_back("--plugin=" + plugin);
  ChildProcess child;
  KZ_ASSERT_OK(child.Spawn("/proc/self/exe", args));
  child_end.Reset();  // the child's death now shows as end-of-file on our end

  const Deadline deadline = Deadline::AfterSeconds(kChildTimeoutSeconds + 5);
  KZ_ASSERT_OK(SendExportedMemory(parent_end.get(), *exported, deadline));
  auto report = ReceiveReport(parent_end.get(), 4096, deadline);
  auto waited = child.Wait(deadline);
  KZ_ASSERT_OK(report.status());
  EXPECT_EQ(*report, kChildOk) << "the child reported: " << (report->empty() ? "(nothing)" : *report);
  KZ_ASSERT_OK(waited.status());
  EXPECT_TRUE(WIFEXITED(*waited) && WEXITSTATUS(*waited) == 0) << "child: " << DescribeWaitStatus(*waited);

  // The child's writes are visible here; bytes outside the exported window are untouched.
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < kSize; ++i)
    if (p[kOffset + i] != ChildByte(i) && wrong++ == 0) first = i;
  EXPECT_EQ(wrong, 0u) << "bytes of the child's pattern missing; first at " << first;
  EXPECT_TRUE(BytesEqual(p, outside.data(), kOffset));
  EXPECT_TRUE(BytesEqual(p + kOffset + kSize, outside.data() + kOffset + kSize, kBytes - kOffset - kSize));
}

// ============================================================================================
// HostEmulatedFaultInjection: host_emulated only. Fault injection is a property of that backend's
// factory (Config::emu_fail_alloc / emu_fail_stream_op), so these tests build their own instance
// instead of using the registry's.
// ============================================================================================

class HostEmulatedFaultInjection : public ::testing::Test {
 protected:
  // Config first: the backend keeps a reference to it.
  void Start(std::optional<uint64_t> fail_alloc, std::optional<uint64_t> fail_stream_op) {
    config_ = World().config();
    config_.emulated_devices = 2;
    config_.emu_fail_alloc = fail_alloc;
    config_.emu_fail_stream_op = fail_stream_op;
    auto b = host_emulated::CreateHostEmulatedBackend(config_);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = std::move(b).value();
    ASSERT_EQ(backend_->device_count(), 2);
  }
  Device& device(int i) { return *backend_->device(i); }

  Config config_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(HostEmulatedFaultInjection, AllocationFailureSurfacesFromAllocate) {
  ASSERT_NO_FATAL_FAILURE(Start(/*fail_alloc=*/3, std::nullopt));
  // Allocations are numbered from 1 across the backend's devices, empty ones included.
  KZ_ASSERT_OK_AND_ASSIGN(auto first, device(0).Allocate(64));
  KZ_ASSERT_OK_AND_ASSIGN(auto second, device(1).Allocate(0));
  auto third = device(0).Allocate(64);
  ASSERT_FALSE(third.ok()) << "allocation #3 should have failed";
  EXPECT_EQ(third.status().code(), StatusCode::kOutOfMemory) << third.status().ToString();
  EXPECT_NE(third.status().message().find("injected"), std::string::npos) << third.status().ToString();
  KZ_ASSERT_OK_AND_ASSIGN(auto fourth, device(0).Allocate(64));
  EXPECT_EQ(fourth->size(), 64u);
}

TEST_F(HostEmulatedFaultInjection, StreamFailureIsStickyAndReachesEventsAndCallbacks) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/2));
  constexpr size_t kBytes = 4096;
  KZ_ASSERT_OK_AND_ASSIGN(auto buffer, device(0).Allocate(6 * kBytes));
  uint8_t* p = Bytes(*buffer);
  FillPattern(p, 6 * kBytes, 81);
  std::vector<uint8_t> before(p, p + 6 * kBytes);
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());
  KZ_ASSERT_OK_AND_ASSIGN(auto healthy_event, device(0).CreateEvent());
  KZ_ASSERT_OK_AND_ASSIGN(auto failed_event, device(0).CreateEvent());
  std::atomic<int> callback_code{-1};

  KZ_ASSERT_OK(stream->Copy(p + kBytes, p, kBytes));  // operation #1: runs
  KZ_ASSERT_OK(stream->Record(*healthy_event));
  KZ_ASSERT_OK(stream->Copy(p + 3 * kBytes, p + 2 * kBytes, kBytes));  // #2: fails
  KZ_ASSERT_OK(stream->Record(*failed_event));
  KZ_ASSERT_OK(stream->EnqueueHostCallback(  // #3: runs, and is told why the stream stopped
      [&](const Status& s) { callback_code.store(static_cast<int>(s.code())); }));
  KZ_ASSERT_OK(stream->Copy(p + 5 * kBytes, p + 4 * kBytes, kBytes));  // #4: skipped

  const Status sync = stream->Synchronize(TestDeadline());
  EXPECT_EQ(sync.code(), StatusCode::kInternal) << sync.ToString();
  EXPECT_NE(sync.message().find("injected"), std::string::npos) << sync.ToString();
  auto q = stream->Query();
  EXPECT_FALSE(q.ok()) << "Query must report the sticky error";
  EXPECT_EQ(callback_code.load(), static_cast<int>(StatusCode::kInternal)) << "the callback saw the wrong status";

  EXPECT_TRUE(BytesEqual(p + kBytes, p, kBytes)) << "operation #1 (before the fault) did not run";
  EXPECT_TRUE(BytesEqual(p + 3 * kBytes, before.data() + 3 * kBytes, kBytes)) << "the failed copy wrote";
  EXPECT_TRUE(BytesEqual(p + 5 * kBytes, before.data() + 5 * kBytes, kBytes)) << "work after the fault ran";

  // An event recorded before the fault is fine; one recorded after it carries the error.
  auto hq = healthy_event->Query();
  KZ_ASSERT_OK(hq.status());
  EXPECT_TRUE(*hq);
  KZ_EXPECT_OK(healthy_event->Synchronize(TestDeadline()));
  EXPECT_FALSE(failed_event->Query().ok());
  KZ_EXPECT_CODE(failed_event->Synchronize(TestDeadline()), StatusCode::kInternal);

  // Another stream that waits on the failed event inherits the error, also across devices ...
  KZ_ASSERT_OK_AND_ASSIGN(auto waiter, device(1).CreateStream());
  std::atomic<int> waiter_code{-1};
  KZ_ASSERT_OK(waiter->Wait(*failed_event));
  KZ_ASSERT_OK(waiter->EnqueueHostCallback([&](const Status& s) { waiter_code.store(static_cast<int>(s.code())); }));
  EXPECT_FALSE(waiter->Synchronize(TestDeadline()).ok());
  EXPECT_NE(waiter_code.load(), static_cast<int>(StatusCode::kOk));

  // ... while an independent stream keeps working.
  KZ_ASSERT_OK_AND_ASSIGN(auto independent, device(0).CreateStream());
  KZ_ASSERT_OK(independent->Copy(p + 5 * kBytes, p + 4 * kBytes, kBytes));
  KZ_EXPECT_OK(independent->Synchronize(TestDeadline()));
  EXPECT_TRUE(BytesEqual(p + 5 * kBytes, p + 4 * kBytes, kBytes));
}

TEST_F(HostEmulatedFaultInjection, FailedHostCallbackStopsTheStream) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/1));
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());
  KZ_ASSERT_OK_AND_ASSIGN(auto event, device(0).CreateEvent());
  std::atomic<int> first_code{-1}, second_code{-1};
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) { first_code.store(static_cast<int>(s.code())); }));
  KZ_ASSERT_OK(stream->Record(*event));
  KZ_ASSERT_OK(stream->EnqueueHostCallback([&](const Status& s) { second_code.store(static_cast<int>(s.code())); }));
  KZ_EXPECT_CODE(stream->Synchronize(TestDeadline()), StatusCode::kInternal);
  EXPECT_EQ(first_code.load(), static_cast<int>(StatusCode::kInternal)) << "the failed callback itself";
  EXPECT_EQ(second_code.load(), static_cast<int>(StatusCode::kInternal)) << "a callback after the failure";
  KZ_EXPECT_CODE(event->Synchronize(TestDeadline()), StatusCode::kInternal);
}

TEST_F(HostEmulatedFaultInjection, FailedReduceLeavesItsOutputAlone) {
  ASSERT_NO_FATAL_FAILURE(Start(std::nullopt, /*fail_stream_op=*/1));
  constexpr size_t kCount = 1000;
  KZ_ASSERT_OK_AND_ASSIGN(auto buffer, device(0).Allocate(3 * kCount * sizeof(float)));
  auto* f = static_cast<float*>(buffer->data());
  FillPattern(f, 3 * kCount * sizeof(float), 91);
  KZ_ASSERT_OK_AND_ASSIGN(auto stream, device(0).CreateStream());
  const void* srcs[] = {f, f + kCount};
  KZ_ASSERT_OK(stream->Reduce(f + 2 * kCount, srcs, kCount, DataType::kFloat32, ReduceOp::kSum));
  KZ_EXPECT_CODE(stream->Synchronize(TestDeadline()), StatusCode::kInternal);
  EXPECT_TRUE(HasPattern(f, 3 * kCount * sizeof(float), 91));
  auto q = stream->Query();
  EXPECT_FALSE(q.ok());
}

// ============================================================================================
// Instantiation: each group for the backends its tags select (device_conformance.h).
// ============================================================================================

INSTANTIATE_TEST_SUITE_P(Backends, DeviceConformance, ::testing::ValuesIn(World().ParamsFor("DeviceConformance")),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, DataConformance, ::testing::ValuesIn(World().ParamsFor("DataConformance")),
                         BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, MultiDeviceConformance,
                         ::testing::ValuesIn(World().ParamsFor("MultiDeviceConformance")), BackendTestName);
INSTANTIATE_TEST_SUITE_P(Backends, ExportConformance, ::testing::ValuesIn(World().ParamsFor("ExportConformance")),
                         BackendTestName);
// A run whose backends lack a capability leaves its group empty; that is reported at startup.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DataConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiDeviceConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ExportConformance);

}  // namespace
}  // namespace kizuna::device::conformance
