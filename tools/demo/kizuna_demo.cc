// kizuna-demo: what kizuna finds on this machine, and a short self-test of every device it finds.
//
// Prints, in order:
//  1. the configuration in effect (KIZUNA_* environment plus --plugin), or with --env the table of
//     every configuration variable and exits;
//  2. the device backends the registry found: name, origin (built-in or plugin path), and the
//     number of devices or the reason the backend is unavailable;
//  3. a device table: backend:index, name, memory, host-accessible, export kinds, uuid;
//  4. a self-test of the first --max-devices devices of each backend: copy, 2-input and 8-input
//     float32 sum reductions, each timed over up to --iters iterations and checked element by
//     element against values computed on the host ("ok", or the first wrong element).
//
// Exit status: 0 when every check passed; 1 when a result was wrong, a device operation failed, a
// backend failed to load for a reason other than missing hardware, or there was no device at all;
// 2 for bad command-line input.
//
// Device memory is filled and read through Buffer::data() when the device is host-accessible, and
// otherwise staged through host memory with stream copies (the table says which).

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/device/device.h"
#include "runtime/device/registry.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna {
namespace {

using device::Buffer;
using device::Device;
using device::DeviceRegistry;
using device::Stream;

constexpr int kMaxInputs = 8;
// Each measured operation runs for about this long (at least one iteration, at most --iters), so
// a throttled or slow device keeps the demo short while a fast one still gets several iterations.
constexpr double kSecondsPerMeasurement = 0.25;
// The self-test's buffers (kMaxInputs inputs + 1 output) may use at most this fraction of a
// device's memory; the rest stays for whoever else shares the device (emulated devices share the
// host's memory with every process on it).
constexpr double kMaxMemoryFraction = 0.5;

// ---- formatting ----

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  if (value == std::floor(value)) return fmt::format("{:.0f} {}", value, kUnits[unit]);
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string FormatNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{:g}", v);
}

// A table printed with aligned columns (two spaces apart, indented by two).
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void Add(std::vector<std::string> row) {
    row.resize(rows_[0].size());
    rows_.push_back(std::move(row));
  }
  void Print() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& row : rows_)
      for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    for (const auto& row : rows_) {
      std::string line = " ";
      for (size_t c = 0; c < row.size(); ++c) {
        line += ' ';
        // The last column is not padded, so lines carry no trailing blanks.
        line += c + 1 < row.size() ? fmt::format("{:<{}} ", row[c], width[c]) : row[c];
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      fmt::print("{}\n", line);
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// ---- configuration ----

void PrintVariables() {
  std::map<std::string, std::string> env = KizunaEnvironment();
  Table t({"variable", "set to", "form", "default", "meaning"});
  for (const ConfigVariable& v : ConfigVariables()) {
    auto it = env.find(std::string(v.name));
    t.Add({std::string(v.name), it == env.end() ? "-" : it->second, std::string(v.form),
           v.default_value.empty() ? "-" : std::string(v.default_value), std::string(v.meaning)});
  }
  fmt::print("kizuna configuration variables (read once at start-up; malformed values are reported and ignored)\n\n");
  t.Print();
}

void PrintConfig(const Config& c) {
  std::vector<std::string> throttles;
  if (c.emu_mem_bytes) throttles.push_back(fmt::format("memory {} per device", FormatBytes(*c.emu_mem_bytes)));
  if (c.emu_copy_gbps) throttles.push_back(fmt::format("copy {} GB/s", FormatNumber(*c.emu_copy_gbps)));
  if (c.emu_reduce_gbps) throttles.push_back(fmt::format("reduce {} GB/s", FormatNumber(*c.emu_reduce_gbps)));
  if (c.emu_launch_us) throttles.push_back(fmt::format("launch {} us", FormatNumber(*c.emu_launch_us)));
  std::vector<std::string> faults;
  if (c.emu_fail_alloc) faults.push_back(fmt::format("allocation #{}", *c.emu_fail_alloc));
  if (c.emu_fail_stream_op) faults.push_back(fmt::format("stream operation #{}", *c.emu_fail_stream_op));

  fmt::print("configuration (KIZUNA_* environment; kizuna-demo --env lists every variable)\n");
  Table t({"setting", "value", "variable"});
  t.Add({"timeout", fmt::format("{} s", FormatNumber(c.timeout_s)), "KIZUNA_TIMEOUT"});
  t.Add({"emulated devices", fmt::format("{}", c.emulated_devices), "KIZUNA_EMULATED_DEVICES"});
  t.Add({"emulation throttles", throttles.empty() ? "none" : fmt::format("{}", fmt::join(throttles, ", ")),
         "KIZUNA_EMU_*"});
  t.Add({"fault injection", faults.empty() ? "none" : fmt::format("fail {}", fmt::join(faults, ", ")),
         "KIZUNA_EMU_FAIL_*"});
  t.Add({"device plugins", c.device_plugins.empty() ? "none" : fmt::format("{}", fmt::join(c.device_plugins, ":")),
         "KIZUNA_DEVICE_PLUGINS, --plugin"});
  t.Add({"tuner plugin", c.tuner_plugin.empty() ? "none" : c.tuner_plugin, "KIZUNA_TUNER_PLUGIN"});
  t.Print();
}

// ---- backends and devices ----

// Prints the backend table; returns the number of backends that failed for a reason other than
// missing hardware (a broken plugin, a backend error).
int PrintBackends(const DeviceRegistry& registry) {
  int failed = 0;
  fmt::print("\ndevice backends\n");
  Table t({"backend", "origin", "status"});
  for (const device::BackendSlot& slot : registry.backends()) {
    std::string status;
    if (slot.status.ok()) {
      int n = slot.backend->device_count();
      status = fmt::format("ok, {} device{}", n, n == 1 ? "" : "s");
    } else if (slot.status.code() == StatusCode::kUnavailable) {
      status = fmt::format("unavailable: {}", slot.status.message());
    } else {
      status = fmt::format("FAILED: {}", slot.status.ToString());
      ++failed;
    }
    t.Add({slot.name, slot.origin, status});
  }
  if (registry.backends().empty()) t.Add({"(none)", "", "no backend is built in and no plugin was given"});
  t.Print();
  return failed;
}

std::string ExportKinds(const device::DeviceProperties& p) {
  if (p.export_fd && p.export_opaque) return "fd, ipc";
  if (p.export_fd) return "fd";
  if (p.export_opaque) return "ipc";
  return "none";
}

void PrintDevices(const std::vector<Device*>& devices) {
  fmt::print("\ndevices\n");
  Table t({"device", "name", "memory", "host-accessible", "export", "uuid"});
  for (const Device* d : devices) {
    const device::DeviceProperties& p = d->properties();
    t.Add({d->label(), p.name, p.memory_bytes == 0 ? "unknown" : FormatBytes(p.memory_bytes),
           p.host_accessible ? "yes" : "no (staged)", ExportKinds(p), p.uuid.empty() ? "-" : p.uuid});
  }
  t.Print();
}

// ---- self-test ----

// Input k's element i. Small integers, so every float32 sum of up to kMaxInputs inputs is exact
// and the expected result does not depend on the order of additions; 1021 is prime, so an element
// copied from the wrong index is caught (the pattern repeats only every 1021 elements).
class Pattern {
 public:
  static constexpr uint32_t kModulus = 1021;
  static constexpr uint32_t kStride = 31;     // between neighbouring elements
  static constexpr uint32_t kInputStep = 17;  // between inputs (< kModulus: one subtraction wraps)

  // Fills data[0..count) with input k.
  static void Fill(float* data, size_t count, int k) {
    uint32_t v = (kInputStep * static_cast<uint32_t>(k)) % kModulus;
    for (size_t i = 0; i < count; ++i) {
      data[i] = static_cast<float>(v);
      v = Next(v);
    }
  }

  // The first index where data differs from the sum of the first n inputs, with what was found
  // and expected; "" when every element is right.
  static std::string FirstWrong(const float* data, size_t count, int n) {
    uint32_t base = 0;  // input 0's element i
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      uint32_t v = base;  // input k's element i
      for (int k = 0; k < n; ++k) {
        expected += static_cast<float>(v);
        v += kInputStep;
        if (v >= kModulus) v -= kModulus;
      }
      // Bitwise equality also catches a NaN left by the poison fill.
      if (std::memcmp(&data[i], &expected, sizeof(float)) != 0)
        return fmt::format("element {} is {} instead of {}", i, data[i], expected);
      base = Next(base);
    }
    return "";
  }

 private:
  static uint32_t Next(uint32_t v) { return v + kStride >= kModulus ? v + kStride - kModulus : v + kStride; }
};

// Writes and reads device buffers as float arrays: directly when the CPU may dereference device
// pointers, otherwise through a host staging buffer and stream copies.
class HostAccess {
 public:
  HostAccess(Device& device, Stream& stream, size_t count)
      : direct_(device.properties().host_accessible), stream_(stream), count_(count) {}

  Status Fill(Buffer& buffer, int k) {
    if (direct_) {
      Pattern::Fill(static_cast<float*>(buffer.data()), count_, k);
      return Status::Ok();
    }
    Pattern::Fill(Staging(), count_, k);
    return Upload(buffer);
  }

  // Overwrites the buffer with NaN, so an operation that writes nothing cannot pass its check.
  Status Poison(Buffer& buffer) {
    float* p = direct_ ? static_cast<float*>(buffer.data()) : Staging();
    std::fill_n(p, count_, std::numeric_limits<float>::quiet_NaN());
    return direct_ ? Status::Ok() : Upload(buffer);
  }

  // "" when buffer holds the sum of the first n inputs, else the first wrong element.
  Result<std::string> Check(const Buffer& buffer, int n) {
    if (direct_) return Pattern::FirstWrong(static_cast<const float*>(buffer.data()), count_, n);
    KZ_RETURN_IF_ERROR(stream_.Copy(Staging(), buffer.data(), count_ * sizeof(float))
                           .WithContext("copying device memory to host staging memory"));
    KZ_RETURN_IF_ERROR(stream_.Synchronize());
    return Pattern::FirstWrong(Staging(), count_, n);
  }

 private:
  float* Staging() {
    if (staging_.empty()) staging_.resize(count_);
    return staging_.data();
  }
  Status Upload(Buffer& buffer) {
    KZ_RETURN_IF_ERROR(stream_.Copy(buffer.data(), Staging(), count_ * sizeof(float))
                           .WithContext("copying host staging memory to the device"));
    return stream_.Synchronize();
  }

  bool direct_;
  Stream& stream_;
  size_t count_;
  std::vector<float> staging_;
};

struct Measurement {
  int iterations = 0;
  double gbps = 0;  // bytes read per second / 1e9
};

// Runs `enqueue` once to warm up (first touch of memory, lazy setup), then as many times as fit
// in kSecondsPerMeasurement (1 to max_iters), and reports the throughput of the timed runs.
Result<Measurement> Measure(Stream& stream, const std::function<Status()>& enqueue, uint64_t bytes_read,
                            int max_iters) {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  KZ_RETURN_IF_ERROR(enqueue());
  KZ_RETURN_IF_ERROR(stream.Synchronize());
  double warmup = std::chrono::duration<double>(Clock::now() - t0).count();
  int iters = max_iters;
  if (warmup > 0) iters = static_cast<int>(std::clamp(kSecondsPerMeasurement / warmup, 1.0, double(max_iters)));

  t0 = Clock::now();
  for (int i = 0; i < iters; ++i) KZ_RETURN_IF_ERROR(enqueue());
  KZ_RETURN_IF_ERROR(stream.Synchronize());
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  Measurement m;
  m.iterations = iters;
  m.gbps = seconds > 0 ? static_cast<double>(bytes_read) * iters / seconds / 1e9 : 0;
  return m;
}

struct Row {
  std::string device, operation, bytes_read, iterations, gbps, check;
};

// Fixed column widths, so rows can be printed as each measurement finishes.
class SelfTestPrinter {
 public:
  explicit SelfTestPrinter(size_t device_width) : device_width_(std::max<size_t>(device_width, 6)) {}
  void Header() const { Print({"device", "operation", "bytes read", "iters", "GB/s", "check"}); }
  void Print(const Row& r) const {
    std::string line = fmt::format("  {:<{}}  {:<15}  {:>10}  {:>5}  {:>8}  {}", r.device, device_width_,
                                   r.operation, r.bytes_read, r.iterations, r.gbps, r.check);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
    std::fflush(stdout);
  }

 private:
  size_t device_width_;
};

// Self-tests one device with `bytes` per buffer. Prints one row per operation; returns false when
// an operation failed or a result was wrong.
// Kept whole: sizing, buffers, then the operations in the order of its printed rows, all sharing the buffers.
bool SelfTest(Device& dev, uint64_t bytes, int max_iters, const SelfTestPrinter& out) {
  const std::string label = dev.label();
  auto fail = [&](std::string_view what, const Status& s) {
    out.Print({label, std::string(what), "", "", "", fmt::format("FAILED: {}", s.ToString())});
    return false;
  };

  const uint64_t memory = dev.properties().memory_bytes;
  const uint64_t budget = static_cast<uint64_t>(static_cast<double>(memory) * kMaxMemoryFraction);
  if (memory > 0 && (kMaxInputs + 1) * bytes > budget) {
    // Shrink to the largest power of two that fits.
    uint64_t fit = std::bit_floor(budget / (kMaxInputs + 1));
    if (fit < sizeof(float)) {
      out.Print({label, "(all)", "", "", "",
                 fmt::format("skipped: {} of device memory is too little for the self-test", FormatBytes(memory))});
      return true;
    }
    fmt::print("  ({}: buffers reduced to {}, so that {} of them fit in half of its {} of memory)\n", label,
               FormatBytes(fit), kMaxInputs + 1, FormatBytes(memory));
    bytes = fit;
  }
  const size_t count = bytes / sizeof(float);

  // Buffers are declared before the stream, so the stream (destroyed first) has finished all work
  // before any buffer is freed, also on early returns.
  std::vector<std::unique_ptr<Buffer>> inputs;
  std::unique_ptr<Buffer> output;
  auto stream_or = dev.CreateStream();
  if (!stream_or.ok()) return fail("create stream", stream_or.status());
  std::unique_ptr<Stream> stream = std::move(stream_or).value();

  for (int k = 0; k <= kMaxInputs; ++k) {
    auto b = dev.Allocate(bytes);
    if (!b.ok()) return fail(fmt::format("allocate {}", FormatBytes(bytes)), b.status());
    if (k < kMaxInputs) inputs.push_back(std::move(b).value());
    else output = std::move(b).value();
  }
  HostAccess host(dev, *stream, count);
  for (int k = 0; k < kMaxInputs; ++k) {
    Status s = host.Fill(*inputs[k], k);
    if (!s.ok()) return fail("fill inputs", s);
  }

  struct Op {
    std::string name;
    int inputs;  // 1: a copy of input 0
  };
  const Op ops[] = {{"copy", 1}, {"reduce sum x2", 2}, {"reduce sum x8", kMaxInputs}};
  bool all_ok = true;
  for (const Op& op : ops) {
    Status s = host.Poison(*output);
    if (!s.ok()) return fail(op.name, s);
    std::vector<const void*> srcs;
    for (int k = 0; k < op.inputs; ++k) srcs.push_back(inputs[k]->data());
    auto enqueue = [&]() -> Status {
      if (op.inputs == 1) return stream->Copy(output->data(), srcs[0], bytes);
      return stream->Reduce(output->data(), srcs, count, DataType::kFloat32, ReduceOp::kSum);
    };
    const uint64_t bytes_read = bytes * op.inputs;
    auto m = Measure(*stream, enqueue, bytes_read, max_iters);
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kNotSupported) {
        out.Print({label, op.name, FormatBytes(bytes_read), "", "", fmt::format("n/a: {}", m.status().message())});
        continue;
      }
      all_ok = false;
      out.Print({label, op.name, FormatBytes(bytes_read), "", "", fmt::format("FAILED: {}", m.status().ToString())});
      // A failed stream stays failed (sticky errors): the remaining operations cannot run on it.
      break;
    }
    auto wrong = host.Check(*output, op.inputs);
    std::string check;
    if (!wrong.ok()) {
      check = fmt::format("FAILED reading the result: {}", wrong.status().ToString());
      all_ok = false;
    } else if (!wrong->empty()) {
      check = fmt::format("WRONG: {}", *wrong);
      all_ok = false;
    } else {
      check = "ok";
    }
    out.Print({label, op.name, FormatBytes(bytes_read), fmt::format("{}", m->iterations),
               fmt::format("{:.2f}", m->gbps), check});
  }
  Status s = stream->Synchronize();
  if (!s.ok() && all_ok) return fail("synchronize", s);
  return all_ok;
}

// Kept whole: the command line, then the report it prints, section by section, in output order.
int Main(int argc, char** argv) {
  CLI::App app{
      "kizuna-demo: the device backends and devices kizuna finds on this machine, and a short self-test of "
      "each device (copy, 2- and 8-input float32 sum reductions, every result checked)."};
  uint64_t bytes = uint64_t{64} << 20;
  int iters = 5;
  int max_devices = 2;
  bool env = false;
  std::vector<std::string> plugins;
  app.add_option("--bytes", bytes, "size of each self-test buffer; suffixes K, M, G are powers of 1024")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("64M");
  app.add_option("--iters", iters, "timed iterations per operation, at most (1..1000)")->capture_default_str();
  app.add_option("--max-devices", max_devices, "devices self-tested per backend (0..1024)")->capture_default_str();
  app.add_option("--plugin", plugins, "device plugin to load, in addition to KIZUNA_DEVICE_PLUGINS (repeatable)")
      ->type_name("PATH");
  app.add_flag("--env", env, "print every KIZUNA_* configuration variable (form, default, meaning) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (bytes < sizeof(float) || bytes % sizeof(float) != 0 || bytes > (uint64_t{16} << 30)) {
    fmt::print(stderr, "kizuna-demo: --bytes {}: expected a multiple of 4 (float32 elements) from 4 B to 16 GiB\n",
               FormatBytes(bytes));
    return 2;
  }
  if (iters < 1 || iters > 1000) {
    fmt::print(stderr, "kizuna-demo: --iters {}: expected 1..1000\n", iters);
    return 2;
  }
  if (max_devices < 0 || max_devices > 1024) {
    fmt::print(stderr, "kizuna-demo: --max-devices {}: expected 0..1024\n", max_devices);
    return 2;
  }
  if (env) {
    PrintVariables();
    return 0;
  }

  // The registry keeps a pointer to the configuration: `config` outlives it.
  Config config = GlobalConfig();
  config.device_plugins.insert(config.device_plugins.end(), plugins.begin(), plugins.end());
  PrintConfig(config);

  std::unique_ptr<DeviceRegistry> registry = DeviceRegistry::Create(config);
  int failed_backends = PrintBackends(*registry);
  std::vector<Device*> devices = registry->devices();
  if (devices.empty()) {
    fmt::print("\nno devices: nothing to self-test (KIZUNA_EMULATED_DEVICES=0 and no plugin with devices?)\n");
    return 1;
  }
  PrintDevices(devices);

  size_t label_width = 0;
  for (const Device* d : devices) label_width = std::max(label_width, d->label().size());
  fmt::print("\nself-test: float32, {} per buffer, up to {} timed iteration{} per operation\n", FormatBytes(bytes),
             iters, iters == 1 ? "" : "s");
  SelfTestPrinter printer(label_width);
  printer.Header();
  int failed_devices = 0, tested = 0;
  std::vector<std::string> untested;
  for (const device::BackendSlot& slot : registry->backends()) {
    if (slot.backend == nullptr) continue;
    int n = slot.backend->device_count();
    for (int i = 0; i < n && i < max_devices; ++i) {
      Device* d = slot.backend->device(i);
      if (d == nullptr) continue;
      ++tested;
      if (!SelfTest(*d, bytes, iters, printer)) ++failed_devices;
    }
    if (n > max_devices) untested.push_back(fmt::format("{} device{} of {}", n - max_devices,
                                                        n - max_devices == 1 ? "" : "s", slot.name));
  }
  if (!untested.empty())
    fmt::print("  (not self-tested: {}; --max-devices raises the limit)\n", fmt::join(untested, ", "));

  fmt::print("\n");
  if (failed_devices == 0 && failed_backends == 0) {
    fmt::print("all checks passed ({} device{} self-tested)\n", tested, tested == 1 ? "" : "s");
    return 0;
  }
  if (failed_devices > 0) fmt::print("{} of {} devices FAILED the self-test\n", failed_devices, tested);
  if (failed_backends > 0)
    fmt::print("{} backend{} FAILED to load (see the backend table)\n", failed_backends,
               failed_backends == 1 ? "" : "s");
  return 1;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
