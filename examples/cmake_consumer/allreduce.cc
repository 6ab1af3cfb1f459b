// An AllReduce through kizuna's C++ API, from a program built outside kizuna's tree: one rank per
// process, under a launcher (kizuna-run, torchrun, mpirun). Exits 0 when every element is right.
#include <cstdio>
#include <memory>

#include <kizuna/communicator.h>

namespace {

int Fail(const kizuna::Status& s) {
  std::fprintf(stderr, "allreduce_cxx: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  const size_t count = 1 << 16;
  auto comm = kizuna::Communicator::CreateFromEnvironment();
  if (!comm.ok()) return Fail(comm.status());
  kizuna::Communicator& c = **comm;
  kizuna::device::Device& device = c.device();
  auto buffer = device.Allocate(count * sizeof(double));
  if (!buffer.ok()) return Fail(buffer.status());
  auto stream = device.CreateStream();
  if (!stream.ok()) return Fail(stream.status());
  // The emulated accelerator's memory is host-accessible: the CPU fills and reads it.
  auto* data = static_cast<double*>((*buffer)->data());
  for (size_t i = 0; i < count; ++i) data[i] = c.rank() * 0.5 + static_cast<double>(i);
  if (auto s = c.AllReduce(data, data, count, kizuna::DataType::kFloat64, kizuna::ReduceOp::kMax, **stream); !s.ok())
    return Fail(s);
  if (auto s = (*stream)->Synchronize(); !s.ok()) return Fail(s);
  for (size_t i = 0; i < count; ++i) {
    const double want = (c.size() - 1) * 0.5 + static_cast<double>(i);
    if (data[i] != want) {
      std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", c.rank(), i, data[i], want);
      return 1;
    }
  }
  std::printf("C++: rank %d of %d: AllReduce (max) of %zu doubles ok (kizuna %s)\n", c.rank(), c.size(), count,
              kizuna::VersionString(kizuna::kVersion).c_str());
  return 0;
}
