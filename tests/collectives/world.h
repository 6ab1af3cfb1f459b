// Test support for the collective engine: a "world" of N ranks in this process (communicators
// over emulated devices, several ranks per device when N exceeds the devices), element values
// every dtype represents exactly, and the expected result of every collective computed here,
// independently of the engine (straight loops, wide arithmetic, one conversion at the end).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "collectives/plan.h"
#include "devices/host_emulated/backend.h"
#include "runtime/communicator.h"
#include "runtime/config.h"
#include "runtime/half.h"

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

class World {
 public:
  // n ranks over min(n, max_devices) emulated devices (rank r on device r % devices).
  World(int n, Config config, int max_devices = 8) : config_(std::move(config)) {
    const int ndev = std::min(n, max_devices);
    config_.emulated_devices = ndev;
    auto backend = host_emulated::CreateHostEmulatedBackend(config_);
    if (!backend.ok()) {
      status_ = backend.status();
      return;
    }
    backend_ = std::move(*backend);
    std::vector<device::Device*> devices;
    for (int r = 0; r < n; ++r) devices.push_back(backend_->device(r % ndev));
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
    }
  }
  ~World() {
    streams_.clear();
    comms_.clear();
  }

  const Status& status() const { return status_; }
  int size() const { return static_cast<int>(comms_.size()); }
  Communicator& comm(int r) { return *comms_[static_cast<size_t>(r)]; }
  device::Stream& stream(int r) { return *streams_[static_cast<size_t>(r)]; }
  device::Device& device(int r) { return comm(r).device(); }

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
  Config config_;
  Status status_;
  std::unique_ptr<device::Backend> backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<device::Stream>> streams_;
};

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
