// Helpers shared by this backend's tests (backend_test.cc, memory_test.cc, stream_test.cc): status
// matchers, a gate that holds a stream, and Emu, a backend instance built from a test's own Config
// (SmallConfig, or OpaqueConfig for device memory the CPU cannot reach).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "devices/host_emulated/backend.h"
#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/device/exported_memory.h"
#include "runtime/core/status.h"

namespace kizuna::host_emulated::test {

using device::Backend;
using device::Buffer;
using device::Device;
using device::Event;
using device::ExportedMemory;
using device::Stream;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline testing::AssertionResult HasCode(const Status& s, StatusCode code) {
  if (s.code() == code) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "expected " << StatusCodeName(code) << ", got " << s.ToString();
}

inline testing::AssertionResult Mentions(const Status& s, const std::string& text) {
  if (s.message().find(text) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << s.ToString() << "' does not mention '" << text << "'";
}

inline double MillisecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Holds a host callback (and so its stream) until opened. Its own wait is bounded so that a
// failing test can never hang.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [this] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A backend built from the test's own Config (which must outlive it: hence one object).
class Emu {
 public:
  explicit Emu(Config config) : config_(std::move(config)) {
    auto r = CreateHostEmulatedBackend(config_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) backend_ = std::move(r).value();
  }
  Device& dev(int i) { return *backend_->device(i); }
  Backend& backend() { return *backend_; }

  std::unique_ptr<Buffer> Alloc(int device, size_t bytes) {
    auto r = dev(device).Allocate(bytes);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<Buffer> AllocHost(int device, size_t bytes) {
    auto r = dev(device).AllocateHost(bytes);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<Stream> NewStream(int device) {
    auto r = dev(device).CreateStream();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<Event> NewEvent(int device) {
    auto r = dev(device).CreateEvent();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

 private:
  Config config_;
  std::unique_ptr<Backend> backend_;
};

inline Config SmallConfig() {
  Config c;
  c.emulated_devices = 2;
  c.timeout_s = 10;
  return c;
}

// SmallConfig with device memory the CPU cannot dereference (KIZUNA_EMU_OPAQUE=1).
inline Config OpaqueConfig() {
  Config c = SmallConfig();
  c.emu_opaque = true;
  return c;
}

inline uint8_t* Bytes(const std::unique_ptr<Buffer>& b) { return static_cast<uint8_t*>(b->data()); }

}  // namespace kizuna::host_emulated::test
