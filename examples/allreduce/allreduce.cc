// AllReduce on the devices of this host (emulated ones, or GPUs), the README's example.
//
//   bazel-bin/examples/allreduce/allreduce [COUNT [ITERS]]  8 ranks: the host's 8 emulated
//                                                          devices, one process (ncclCommInitAll)
//   bazel-bin/tools/run/kizuna-run -n 8 -- bazel-bin/examples/allreduce/allreduce
//                                                          8 processes, one rank each
//
// Every rank fills its buffer with rank + 1, the sum over n ranks is n(n+1)/2 everywhere; the
// program checks every element and prints the time of one call (with ITERS > 1: the mean of
// ITERS calls after the first, each on freshly filled buffers).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/communicator.h"
#include "runtime/device/registry.h"

using kizuna::Communicator;
using kizuna::DataType;
using kizuna::ReduceOp;

namespace {

int Fail(const kizuna::Status& s) {
  std::fprintf(stderr, "allreduce: %s\n", s.ToString().c_str());
  return 1;
}

// Every rank's buffer filled with rank + 1 through host memory its device's streams use
// (AllocateHost: pinned memory for a GPU, the device memory itself for an emulated device).
kizuna::Status Fill(Communicator& comm, kizuna::device::Buffer& buffer, kizuna::device::Buffer& host,
                    kizuna::device::Stream& stream, size_t count) {
  auto* h = static_cast<float*>(host.data());
  for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>(comm.rank() + 1);
  if (host.data() == buffer.data()) return kizuna::Status::Ok();
  KZ_RETURN_IF_ERROR(stream.Copy(buffer.data(), host.data(), count * sizeof(float)));
  return stream.Synchronize();
}

// Runs one AllReduce of `count` floats on each communicator, issued from this thread (calls
// return at once), then waits for every stream and checks the results.
int Run(std::vector<std::unique_ptr<Communicator>>& comms, size_t count, int iters) {
  const int n = comms[0]->size();
  const size_t bytes = count * sizeof(float);
  std::vector<std::unique_ptr<kizuna::device::Buffer>> buffers, hosts;
  std::vector<std::unique_ptr<kizuna::device::Stream>> streams;
  for (auto& comm : comms) {
    kizuna::device::Device& device = comm->device();
    auto buffer = device.Allocate(bytes);
    if (!buffer.ok()) return Fail(buffer.status());
    // The CPU reads emulated device memory directly; a GPU's goes through pinned host memory.
    auto host = device.properties().host_accessible ? kizuna::Result<std::unique_ptr<kizuna::device::Buffer>>(nullptr)
                                                    : device.AllocateHost(bytes);
    if (!host.ok()) return Fail(host.status());
    auto stream = device.CreateStream();
    if (!stream.ok()) return Fail(stream.status());
    buffers.push_back(std::move(*buffer));
    hosts.push_back(std::move(*host));
    streams.push_back(std::move(*stream));
  }
  auto host_of = [&](size_t r) -> kizuna::device::Buffer& { return hosts[r] ? *hosts[r] : *buffers[r]; };
  double ms = 0;
  for (int it = 0; it < iters; ++it) {
    for (size_t r = 0; r < comms.size(); ++r)
      if (auto s = Fill(*comms[r], *buffers[r], host_of(r), *streams[r], count); !s.ok()) return Fail(s);
    const auto start = std::chrono::steady_clock::now();
    for (size_t r = 0; r < comms.size(); ++r) {
      void* data = buffers[r]->data();
      if (auto s = comms[r]->AllReduce(data, data, count, DataType::kFloat32, ReduceOp::kSum, *streams[r]); !s.ok())
        return Fail(s);
    }
    for (auto& stream : streams)
      if (auto s = stream->Synchronize(); !s.ok()) return Fail(s);
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (iters == 1 || it > 0) ms += t / (iters == 1 ? 1 : iters - 1);
  }
  for (auto& comm : comms)
    if (auto s = comm->AsyncError(); !s.ok()) return Fail(s);
  const float want = static_cast<float>(n * (n + 1) / 2);
  for (size_t r = 0; r < comms.size(); ++r) {
    if (hosts[r]) {
      auto s = streams[r]->Copy(hosts[r]->data(), buffers[r]->data(), bytes);
      if (s.ok()) s = streams[r]->Synchronize();
      if (!s.ok()) return Fail(s);
    }
    const auto* data = static_cast<const float*>(host_of(r).data());
    for (size_t i = 0; i < count; ++i)
      if (data[i] != want) {
        std::fprintf(stderr, "allreduce: rank %d element %zu is %g, expected %g\n", comms[r]->rank(), i, data[i], want);
        return 1;
      }
  }
  for (auto& comm : comms) {
    auto why = comm->ExplainChoice(kizuna::collectives::Collective::kAllReduce, count, DataType::kFloat32);
    std::printf("rank %d of %d: %zu floats summed in %.2f ms, all %g: ok  [%s]\n", comm->rank(), n, count, ms, want,
                why.ok() ? why->c_str() : why.status().ToString().c_str());
    break;  // one line per process
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (1u << 20);
  const int iters = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  auto launch = kizuna::bootstrap::DetectLaunch(kizuna::bootstrap::ProcessEnvironment());
  if (!launch.ok()) return Fail(launch.status());
  std::vector<std::unique_ptr<Communicator>> comms;
  std::unique_ptr<kizuna::device::DeviceRegistry> registry;
  if (launch->size > 1) {
    // Started by a launcher: this process is one rank.
    auto comm = Communicator::CreateFromEnvironment();
    if (!comm.ok()) return Fail(comm.status());
    comms.push_back(std::move(*comm));
  } else {
    // Alone: one rank per emulated device of this host.
    registry = kizuna::device::DeviceRegistry::Create(kizuna::GlobalConfig());
    auto devices = registry->devices();
    if (devices.empty()) return Fail(kizuna::Unavailable("no devices (is KIZUNA_EMULATED_DEVICES=0?)"));
    auto local = Communicator::CreateLocal(devices);
    if (!local.ok()) return Fail(local.status());
    comms = std::move(*local);
  }
  const int rc = Run(comms, count, iters);
  comms.clear();  // before the registry that owns the devices
  return rc;
}
