// kizuna-device-bench: what one device's streams move, through the device interface every
// backend implements — copy bandwidth, and reduce bandwidth for N inputs against it.
//
//   kizuna-device-bench [--backend host_emulated|cuda|NAME] [--device I] [--bytes 256M]
//                       [--inputs 2,4,8] [--dtype float32] [--op sum] [--iters 20] [--warmup 3]
//
// Bandwidth counts every byte read and written, so copy and reduce compare directly: a copy of S
// bytes moves 2S, a reduce of n inputs of S bytes moves (n + 1)S. The copy's figure is the
// ceiling a memory-bound reduce can reach. Each figure is the best of three timed rounds of
// --iters operations enqueued back to back, timed from the first enqueue to the stream's
// synchronization. Inputs are filled on the device (copies from a host buffer), so the figures
// are the same for host-accessible and opaque memory.
//
// Exit status: 0 success; 1 a device error; 2 bad command line.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/config.h"
#include "runtime/device/device.h"
#include "runtime/device/registry.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"

namespace kizuna {
namespace {

std::optional<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t used = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (...) {
    return std::nullopt;
  }
  const std::string suffix = text.substr(used);
  if (suffix.empty()) return v;
  if (suffix == "K" || suffix == "k") return v << 10;
  if (suffix == "M" || suffix == "m") return v << 20;
  if (suffix == "G" || suffix == "g") return v << 30;
  return std::nullopt;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "kizuna-device-bench: %s\n", s.ToString().c_str());
  return 1;
}

// Seconds per operation: the best of three rounds of `iters` back-to-back operations.
template <typename Enqueue>
Result<double> TimeOps(device::Stream& stream, int warmup, int iters, Enqueue enqueue) {
  for (int i = 0; i < warmup; ++i) KZ_RETURN_IF_ERROR(enqueue());
  KZ_RETURN_IF_ERROR(stream.Synchronize());
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) KZ_RETURN_IF_ERROR(enqueue());
    KZ_RETURN_IF_ERROR(stream.Synchronize());
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / iters);
  }
  return best;
}

int Run(const std::string& backend_name, int device_index, uint64_t bytes, const std::vector<int>& inputs,
        DataType type, ReduceOp op, int iters, int warmup) {
  auto registry = device::DeviceRegistry::Create(GlobalConfig());
  device::Backend* backend = registry->Find(backend_name);
  if (backend == nullptr) {
    std::string why = "not linked into this binary";
    for (const auto& slot : registry->backends())
      if (slot.name == backend_name) why = slot.status.ToString();
    return Fail(Unavailable(fmt::format("backend '{}' is not available: {}", backend_name, why)));
  }
  device::Device* dev = backend->device(device_index);
  if (dev == nullptr)
    return Fail(InvalidArgument(fmt::format("--device {}: {} has {} devices", device_index, backend_name,
                                            backend->device_count())));
  const auto& p = dev->properties();
  const size_t esize = DataTypeSize(type);
  const size_t count = bytes / esize;
  bytes = count * esize;
  const int max_inputs = *std::max_element(inputs.begin(), inputs.end());
  std::printf("# kizuna-device-bench: %s (%s), %s per input, %s %s, %d iterations, best of 3\n",
              dev->label().c_str(), p.name.c_str(), fmt::format("{} bytes", bytes).c_str(),
              std::string(DataTypeName(type)).c_str(), std::string(ReduceOpName(op)).c_str(), iters);

  std::vector<std::unique_ptr<device::Buffer>> bufs;
  for (int i = 0; i < max_inputs + 1; ++i) {
    auto b = dev->Allocate(bytes);
    if (!b.ok()) return Fail(b.status());
    bufs.push_back(std::move(*b));
  }
  auto stream = dev->CreateStream();
  if (!stream.ok()) return Fail(stream.status());
  // Fill the inputs with small values (exact in every dtype): through host memory the stream uses.
  {
    auto host = dev->AllocateHost(bytes);
    if (!host.ok()) return Fail(host.status());
    std::memset((*host)->data(), 0, bytes);
    for (auto& b : bufs)
      if (Status s = (*stream)->Copy(b->data(), (*host)->data(), bytes); !s.ok()) return Fail(s);
    if (Status s = (*stream)->Synchronize(); !s.ok()) return Fail(s);
  }
  device::Stream& st = **stream;
  auto copy = TimeOps(st, warmup, iters, [&] { return st.Copy(bufs[1]->data(), bufs[0]->data(), bytes); });
  if (!copy.ok()) return Fail(copy.status());
  const double copy_gbps = 2.0 * static_cast<double>(bytes) / *copy / 1e9;
  std::printf("%-10s %12s %12s %10s\n", "operation", "time(us)", "GB/s", "vs copy");
  std::printf("%-10s %12.1f %12.1f %9.1f%%\n", "copy", *copy * 1e6, copy_gbps, 100.0);
  for (int n : inputs) {
    std::vector<const void*> srcs;
    for (int i = 0; i < n; ++i) srcs.push_back(bufs[static_cast<size_t>(i)]->data());
    void* dst = bufs[static_cast<size_t>(max_inputs)]->data();
    auto t = TimeOps(st, warmup, iters, [&] { return st.Reduce(dst, srcs, count, type, op); });
    if (!t.ok()) return Fail(t.status());
    const double gbps = static_cast<double>(n + 1) * static_cast<double>(bytes) / *t / 1e9;
    std::printf("%-10s %12.1f %12.1f %9.1f%%\n", fmt::format("reduce x{}", n).c_str(), *t * 1e6, gbps,
                100.0 * gbps / copy_gbps);
  }
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) {
  CLI::App app{"kizuna-device-bench: copy and reduce bandwidth of one device"};
  std::string backend = "host_emulated", bytes_text = "64M", dtype_text = "float32", op_text = "sum";
  int device_index = 0, iters = 20, warmup = 3;
  std::vector<int> inputs = {2, 4, 8};
  app.add_option("--backend", backend, "device backend (host_emulated, cuda, a plugin's name)");
  app.add_option("--device", device_index, "device index within the backend")->check(CLI::NonNegativeNumber);
  app.add_option("--bytes", bytes_text, "bytes per input (K/M/G suffix)");
  app.add_option("--inputs", inputs, "reduce input counts")->delimiter(',')->check(CLI::Range(1, 64));
  app.add_option("--dtype", dtype_text, "element type");
  app.add_option("--op", op_text, "reduce op");
  app.add_option("--iters", iters, "timed operations per round")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed operations first")->check(CLI::Range(0, 100000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  auto bytes = kizuna::ParseBytes(bytes_text);
  if (!bytes || *bytes == 0) {
    std::fprintf(stderr, "kizuna-device-bench: --bytes '%s' is not a positive size (e.g. 64M)\n", bytes_text.c_str());
    return 2;
  }
  auto type = kizuna::ParseDataType(dtype_text);
  if (!type) {
    std::fprintf(stderr, "kizuna-device-bench: --dtype '%s' is not a data type\n", dtype_text.c_str());
    return 2;
  }
  auto op = kizuna::ParseReduceOp(op_text);
  if (!op) {
    std::fprintf(stderr, "kizuna-device-bench: --op '%s' is not a reduce op\n", op_text.c_str());
    return 2;
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "kizuna-device-bench: --inputs is empty\n");
    return 2;
  }
  return kizuna::Run(backend, device_index, *bytes, inputs, *type, *op, iters, warmup);
}
