// kizuna as a torch.distributed backend (c10d::Backend): every collective of the process group
// API on CPU tensors, through an installed libkizuna's C++ API (README.md).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <kizuna/communicator.h>
#include <kizuna/runtime/device/registry.h>

namespace kizuna::torch_backend {

class KizunaBackend : public c10d::Backend {
 public:
  // torch.distributed's creator (Backend.register_backend): rank 0 makes the unique id and puts it
  // in `store`, the others read it there; `timeout` becomes kizuna's deadlines (KIZUNA_TIMEOUT).
  static c10::intrusive_ptr<c10d::Backend> Create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::duration<float> timeout);

  KizunaBackend(int rank, int size, std::unique_ptr<Config> config, std::unique_ptr<device::DeviceRegistry> registry,
                std::unique_ptr<Communicator> comm, std::unique_ptr<device::Stream> stream);
  ~KizunaBackend() override;

  const std::string getBackendName() const override { return "kizuna"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Whether calls pass the tensors' own memory (processes of one host: the fused path), rather than
  // copies in the device's memory. For the log and the tests.
  bool zero_copy() const { return zero_copy_; }
  // The communicator's flight recorder (its last operations, JSON: Communicator::FlightRecord).
  std::string flight_record() const { return comm_->FlightRecord(); }

 private:
  // Device memory for calls that cannot take host memory, grown as needed and kept.
  void* Staging(int which, size_t bytes);
  // One kizuna call from `in` (in_bytes) into `out` (out_bytes; the same pointer for in-place
  // calls), waited for: on the tensors' own memory where the communicator takes host memory and
  // the call may (`host_ok`), else through the device's staging memory.
  Status Execute(const void* in, size_t in_bytes, void* out, size_t out_bytes, bool host_ok,
                 const std::function<Status(const void*, void*)>& call);
  // Runs `op` (Execute calls) and returns a completed Work carrying `outputs`, or its error
  // (raised by wait()).
  c10::intrusive_ptr<c10d::Work> Run(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                                     const std::function<Status()>& op);

  std::mutex mu_;  // one call at a time
  std::unique_ptr<Config> config_;
  std::unique_ptr<device::DeviceRegistry> registry_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<device::Stream> stream_;
  std::unique_ptr<device::Buffer> staging_[2];
  bool zero_copy_ = false;
};

// Communicators created afterwards reduce in a fixed order (kizuna.torch.set_deterministic).
void SetDeterministic(bool on);

}  // namespace kizuna::torch_backend
