// Test support for the collective engine: a "world" of N ranks in this process (communicators
// over one backend's devices, several ranks per device when N exceeds the devices), element
// values every dtype represents exactly, and the expected result of every collective computed
// here, independently of the engine (straight loops, wide arithmetic, one conversion at the end).
//
// Which devices a World uses:
//  - KIZUNA_TEST_BACKEND=<name> in the environment: the devices of that backend of the device
//    registry (DeviceRegistry::Create(config)->Find(name)), ranks round-robin over them (on a
//    machine with one GPU, KIZUNA_TEST_BACKEND=cuda puts every rank on GPU 0). A backend the
//    registry reports unavailable (no driver, no device) makes the world skipped, with the
//    registry's reason; a name no linked backend or plugin has is an error.
//  - otherwise the emulated accelerator (host_emulated), configured by the Config: with
//    Config::emu_opaque its memory is opaque to the CPU, as GPU memory is.
// Tests never dereference device memory: they move bytes with Upload / Download, which copy
// directly where the CPU may address the device's memory and through host memory from
// Device::AllocateHost and a stream copy everywhere else.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/plan/plan.h"
#include "devices/host_emulated/backend.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/communicator.h"
#include "runtime/core/config.h"
#include "runtime/device/registry.h"
#include "runtime/core/half.h"

namespace kizuna::test {

using collectives::Algorithm;
using collectives::Collective;

// A configuration for engine tests: direct links between every pair of ranks on this host, a
// short timeout so that a failing test fails quickly.
inline Config WorldConfig(int devices) {
  Config c;
  c.emulated_devices = devices;
  c.timeout_s = 30;
  c.fabric = {"directconnect"};
  c.topology = "full";
  return c;
}

// The backend named by KIZUNA_TEST_BACKEND, or "" (the emulated accelerator).
inline std::string TestBackendName() {
  const char* name = std::getenv("KIZUNA_TEST_BACKEND");
  return name != nullptr ? std::string(name) : std::string();
}

// Moves bytes between host memory and one device's memory as a test needs them: memcpy where the
// CPU may address the device's memory, else a copy on `stream` through a host buffer from
// Device::AllocateHost (kept and grown as needed), waited for with a deadline.
class DeviceIo {
 public:
  DeviceIo(device::Device& device, device::Stream& stream) : device_(device), stream_(stream) {}

  // dst: device memory; src: host memory.
  Status Upload(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    if (device_.properties().host_accessible) {
      std::memcpy(dst, src, bytes);
      return Status::Ok();
    }
    KZ_RETURN_IF_ERROR(Reserve(bytes));
    std::memcpy(bounce_->data(), src, bytes);
    KZ_RETURN_IF_ERROR(stream_.Copy(dst, bounce_->data(), bytes));
    return stream_.Synchronize(Deadline::AfterSeconds(60));
  }
  // dst: host memory; src: device memory.
  Status Download(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    if (device_.properties().host_accessible) {
      std::memcpy(dst, src, bytes);
      return Status::Ok();
    }
    KZ_RETURN_IF_ERROR(Reserve(bytes));
    KZ_RETURN_IF_ERROR(stream_.Copy(bounce_->data(), src, bytes));
    KZ_RETURN_IF_ERROR(stream_.Synchronize(Deadline::AfterSeconds(60)));
    std::memcpy(dst, bounce_->data(), bytes);
    return Status::Ok();
  }

 private:
  Status Reserve(size_t bytes) {
    if (bounce_ != nullptr && bounce_->size() >= bytes) return Status::Ok();
    bounce_.reset();
    auto b = device_.AllocateHost(bytes);
    if (!b.ok()) return b.status().WithContext(fmt::format("host memory to reach {} through", device_.label()));
    bounce_ = std::move(b).value();
    return Status::Ok();
  }

  device::Device& device_;
  device::Stream& stream_;
  std::unique_ptr<device::Buffer> bounce_;
};

class World {
 public:
  // n ranks over min(n, max_devices, the backend's devices) devices, rank r on device r % that.
  World(int n, Config config, int max_devices = 8) : config_(std::move(config)) {
    std::vector<device::Device*> devices;
    const std::string named = TestBackendName();
    device::Backend* backend = nullptr;
    if (!named.empty()) {
      registry_ = device::DeviceRegistry::Create(config_);
      backend = registry_->Find(named);
      if (backend == nullptr) {
        std::string known;
        for (const device::BackendSlot& slot : registry_->backends()) {
          if (slot.name == named && slot.status.code() == StatusCode::kUnavailable) {
            skip_reason_ = fmt::format("KIZUNA_TEST_BACKEND={}: {}", named, slot.status.ToString());
            status_ = slot.status;
            return;
          }
          if (slot.name == named) {
            status_ = slot.status.WithContext(fmt::format("KIZUNA_TEST_BACKEND={}", named));
            return;
          }
          known += fmt::format("{}{}", known.empty() ? "" : ", ", slot.name);
        }
        status_ = InvalidArgument(fmt::format(
            "KIZUNA_TEST_BACKEND={}: no backend of that name in this binary (backends: {}); link its library or "
            "name its plugin in KIZUNA_DEVICE_PLUGINS",
            named, known.empty() ? std::string("none") : known));
        return;
      }
      if (backend->device_count() == 0) {
        skip_reason_ = fmt::format("KIZUNA_TEST_BACKEND={}: the backend has no devices here", named);
        status_ = Unavailable(skip_reason_);
        return;
      }
    } else {
      config_.emulated_devices = std::min(n, max_devices);
      auto created = host_emulated::CreateHostEmulatedBackend(config_);
      if (!created.ok()) {
        status_ = created.status();
        return;
      }
      backend_ = std::move(created).value();
      backend = backend_.get();
    }
    const int ndev = std::max(1, std::min({n, max_devices, backend->device_count()}));
    for (int r = 0; r < n; ++r) devices.push_back(backend->device(r % ndev));
    CommOptions options;
    options.config = &config_;
    options.staging_bytes = 2u << 20;
    auto comms = Communicator::CreateLocal(devices, options);
    if (!comms.ok()) {
      status_ = comms.status();
      return;
    }
    comms_ = std::move(*comms);
    for (int r = 0; r < n; ++r) {
      auto s = devices[static_cast<size_t>(r)]->CreateStream();
      if (!s.ok()) {
        status_ = s.status();
        return;
      }
      streams_.push_back(std::move(*s));
      io_.push_back(std::make_unique<DeviceIo>(*devices[static_cast<size_t>(r)], *streams_.back()));
    }
  }
  ~World() {
    io_.clear();
    streams_.clear();
    comms_.clear();
  }

  const Status& status() const { return status_; }
  // Non-empty when the backend asked for is unavailable here: the test skips, saying this.
  const std::string& skip_reason() const { return skip_reason_; }
  const Config& config() const { return config_; }
  int size() const { return static_cast<int>(comms_.size()); }
  Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }
  device::Stream& stream(int r) { return *streams_[static_cast<size_t>(r)]; }
  device::Device& device(int r) { return comm(r).device(); }
  bool host_accessible(int r) { return device(r).properties().host_accessible; }

  // Device memory on rank r's device; kOutOfMemory and the like as the device says.
  Result<std::unique_ptr<device::Buffer>> Allocate(int r, size_t bytes) { return device(r).Allocate(bytes); }
  // Host bytes into rank r's device memory, and back (see DeviceIo). Not while an operation
  // of rank r still uses the memory.
  Status Upload(int r, void* dst, const void* src, size_t bytes) {
    return io_[static_cast<size_t>(r)]->Upload(dst, src, bytes);
  }
  Status Download(int r, void* dst, const void* src, size_t bytes) {
    return io_[static_cast<size_t>(r)]->Download(dst, src, bytes);
  }
  // Typed forms for whole vectors.
  template <typename T>
  Status Upload(int r, void* dst, const std::vector<T>& src) {
    return Upload(r, dst, src.data(), src.size() * sizeof(T));
  }
  template <typename T>
  Result<std::vector<T>> Download(int r, const void* src, size_t count) {
    std::vector<T> out(count);
    KZ_RETURN_IF_ERROR(Download(r, out.data(), src, count * sizeof(T)));
    return out;
  }

  // Waits for every rank's stream; the first error (a stream's, then a communicator's).
  Status SyncAll() {
    Status first;
    for (int r = 0; r < size(); ++r) {
      Status s = stream(r).Synchronize(Deadline::AfterSeconds(120));
      if (!s.ok() && first.ok()) first = s.WithContext(fmt::format("rank {} stream", r));
    }
    for (int r = 0; r < size(); ++r) {
      Status s = comm(r).AsyncError();
      if (!s.ok() && first.ok()) first = s.WithContext(fmt::format("rank {}", r));
    }
    return first;
  }

 private:
  Config config_;  // outlives the registry, the backend and the communicators (they keep pointers)
  Status status_;
  std::string skip_reason_;
  std::unique_ptr<device::DeviceRegistry> registry_;  // KIZUNA_TEST_BACKEND
  std::unique_ptr<device::Backend> backend_;          // the emulated accelerator otherwise
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
  std::vector<std::unique_ptr<DeviceIo>> io_;
};

// In a test body: skips the test when the world's backend is unavailable here (saying why), and
// fails it when the world could not be built.
#define KZ_ASSERT_WORLD(w)                                                   \
  do {                                                                       \
    if (!(w).skip_reason().empty()) GTEST_SKIP() << (w).skip_reason();       \
    ASSERT_TRUE((w).status().ok()) << (w).status().ToString();               \
  } while (0)

// A buffer of `bytes` on rank r's device; a failed allocation fails the test and gives null.
// `n` communicators made by threads of this process over an in-process bootstrap: rank r on
// `device_of(r)` with `options_of(r)` (tests that set per-rank options: pretend hosts, versions).
// Each rank's result, in rank order.
inline std::vector<Result<std::unique_ptr<Communicator>>> CreateByThreads(
    int n, const std::function<device::Device*(int)>& device_of, const std::function<CommOptions(int)>& options_of) {
  std::vector<Result<std::unique_ptr<Communicator>>> created;
  auto boots = bootstrap::CreateInProcessBootstraps(n);
  for (int r = 0; r < n; ++r) created.emplace_back(boots.ok() ? Internal("not run") : boots.status());
  if (!boots.ok()) return created;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      created[static_cast<size_t>(r)] = Communicator::Create(
          std::shared_ptr<bootstrap::Bootstrap>(std::move((*boots)[static_cast<size_t>(r)])), *device_of(r),
          options_of(r));
    });
  for (auto& t : threads) t.join();
  return created;
}

inline std::unique_ptr<device::Buffer> Alloc(World& w, int r, size_t bytes) {
  auto b = w.device(r).Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : nullptr;
}

// ---- Values ----

// Element i of rank r's input: small integers, so that every order of reduction is exact in every
// dtype (sum over 16 ranks <= 80; products <= 2^4).
inline int64_t InputValue(ReduceOp op, int r, uint64_t i) {
  if (op == ReduceOp::kProd) return ((static_cast<uint64_t>(r) + i) % 4 == 0) ? 2 : 1;
  return static_cast<int64_t>((static_cast<uint64_t>(r) * 7 + i * 3) % 5) + 1;
}

inline void StoreValue(void* base, uint64_t i, DataType t, double v) {
  auto* p = static_cast<uint8_t*>(base);
  switch (t) {
    case DataType::kFloat16: {
      uint16_t h = FloatToHalf(static_cast<float>(v));
      std::memcpy(p + i * 2, &h, 2);
      break;
    }
    case DataType::kBfloat16: {
      uint16_t h = FloatToBfloat16(static_cast<float>(v));
      std::memcpy(p + i * 2, &h, 2);
      break;
    }
    case DataType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(p + i * 4, &f, 4);
      break;
    }
    case DataType::kFloat64:
      std::memcpy(p + i * 8, &v, 8);
      break;
    case DataType::kInt8: {
      auto x = static_cast<int8_t>(static_cast<int64_t>(v));
      std::memcpy(p + i, &x, 1);
      break;
    }
    case DataType::kUint8: {
      auto x = static_cast<uint8_t>(static_cast<int64_t>(v));
      std::memcpy(p + i, &x, 1);
      break;
    }
    case DataType::kInt32: {
      auto x = static_cast<int32_t>(static_cast<int64_t>(v));
      std::memcpy(p + i * 4, &x, 4);
      break;
    }
    case DataType::kUint32: {
      auto x = static_cast<uint32_t>(static_cast<int64_t>(v));
      std::memcpy(p + i * 4, &x, 4);
      break;
    }
    case DataType::kInt64: {
      auto x = static_cast<int64_t>(v);
      std::memcpy(p + i * 8, &x, 8);
      break;
    }
    case DataType::kUint64: {
      auto x = static_cast<uint64_t>(static_cast<int64_t>(v));
      std::memcpy(p + i * 8, &x, 8);
      break;
    }
  }
}

inline double LoadValue(const void* base, uint64_t i, DataType t) {
  const auto* p = static_cast<const uint8_t*>(base);
  switch (t) {
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return HalfToFloat(h);
    }
    case DataType::kBfloat16: {
      uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return Bfloat16ToFloat(h);
    }
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, p + i * 8, 8);
      return d;
    }
    case DataType::kInt8:
      return static_cast<int8_t>(p[i]);
    case DataType::kUint8:
      return p[i];
    case DataType::kInt32: {
      int32_t x;
      std::memcpy(&x, p + i * 4, 4);
      return x;
    }
    case DataType::kUint32: {
      uint32_t x;
      std::memcpy(&x, p + i * 4, 4);
      return x;
    }
    case DataType::kInt64: {
      int64_t x;
      std::memcpy(&x, p + i * 8, 8);
      return static_cast<double>(x);
    }
    case DataType::kUint64: {
      uint64_t x;
      std::memcpy(&x, p + i * 8, 8);
      return static_cast<double>(x);
    }
  }
  return 0;
}

// The reduction of InputValue(op, q, i) over ranks q = 0..n-1, as the engine must produce it.
// Values are small, so sums and products are exact everywhere; avg divides once (integers
// truncate toward zero, floating types compare with a tolerance: see Matches).
inline double Reduced(ReduceOp op, int n, uint64_t i, DataType t) {
  double acc = static_cast<double>(InputValue(op, 0, i));
  for (int q = 1; q < n; ++q) {
    const double v = static_cast<double>(InputValue(op, q, i));
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kAvg) acc = IsFloatingPoint(t) ? acc / n : std::trunc(acc / n);
  return acc;
}

inline bool Matches(double got, double want, DataType t, ReduceOp op) {
  if (op == ReduceOp::kAvg && IsFloatingPoint(t)) {
    const double rel = (t == DataType::kFloat16 || t == DataType::kBfloat16) ? 1.0 / 128 : 1e-6;
    return std::fabs(got - want) <= rel * std::fabs(want);
  }
  return got == want;
}

}  // namespace kizuna::test
