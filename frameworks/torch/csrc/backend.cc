#include "backend.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <utility>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

namespace kizuna::torch_backend {
namespace {

// Set by kizuna.torch.set_deterministic: communicators created afterwards reduce in a fixed order.
bool g_deterministic = false;

// The key under which rank 0 puts the job's unique id in the group's store (each group's store
// has a prefix of its own).
constexpr const char* kUniqueIdKey = "kizuna/unique_id";

std::exception_ptr ErrorOf(const std::string& what) {
  try {
    C10_THROW_ERROR(DistBackendError, "kizuna: " + what);
  } catch (...) {
    return std::current_exception();
  }
}

// A call that has finished when it is returned (kizuna's calls on CPU tensors return done, or are
// waited for before the Work is made): wait() raises its error, the future holds its outputs.
class KizunaWork : public c10d::Work {
 public:
  KizunaWork(c10d::OpType type, const char* title, std::vector<at::Tensor> outputs, std::exception_ptr error)
      : Work(-1, type, title),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<at::ivalue::Future> future_;
};

DataType TypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBfloat16;
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUint8;
    case at::kInt: return DataType::kInt32;
    case at::kUInt32: return DataType::kUint32;
    case at::kLong: return DataType::kInt64;
    case at::kUInt64: return DataType::kUint64;
    case at::kBool:  // bytes of 0 and 1, moved as uint8; MIN and MAX of them are AND and OR (OpOf)
      return DataType::kUint8;
    default:
      TORCH_CHECK(false, "kizuna: tensors of ", t.scalar_type(), " are not supported");
  }
}

ReduceOp OpOf(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      TORCH_CHECK(!boolean, "kizuna: SUM of bool tensors is not supported (use MAX for OR)");
      return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      TORCH_CHECK(!boolean, "kizuna: PRODUCT of bool tensors is not supported (use MIN for AND)");
      return ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!boolean, "kizuna: AVG of bool tensors is not supported");
      return ReduceOp::kAvg;
    default:
      TORCH_CHECK(false, "kizuna: ReduceOp ", static_cast<int>(op.op_),
                  " is not supported (SUM, PRODUCT, MIN, MAX and AVG are)");
  }
}

void CheckCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "kizuna: ", what, " is on ", t.device(), "; this backend takes CPU tensors");
  TORCH_CHECK(t.layout() == at::kStrided, "kizuna: ", what, " is not a dense tensor");
}

const at::Tensor& One(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "kizuna: ", what, ": one tensor per call, got ", tensors.size());
  CheckCpu(tensors[0], what);
  return tensors[0];
}

size_t Bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// `t` itself when contiguous, else a contiguous copy whose result `Finish` writes back.
struct Dense {
  explicit Dense(const at::Tensor& t) : original(t), data(t.is_contiguous() ? t : t.contiguous()) {}
  void Finish() {
    if (!original.is_same(data)) original.copy_(data);
  }
  at::Tensor original;
  at::Tensor data;
};

}  // namespace

KizunaBackend::KizunaBackend(int rank, int size, std::unique_ptr<Config> config,
                             std::unique_ptr<device::DeviceRegistry> registry, std::unique_ptr<Communicator> comm,
                             std::unique_ptr<device::Stream> stream)
    : c10d::Backend(rank, size),
      config_(std::move(config)),
      registry_(std::move(registry)),
      comm_(std::move(comm)),
      stream_(std::move(stream)) {
  zero_copy_ = comm_->TakesHostMemory();
}

KizunaBackend::~KizunaBackend() {
  // The stream and staging before the communicator, the communicator before its device's registry.
  staging_[0].reset();
  staging_[1].reset();
  stream_.reset();
  comm_.reset();
  registry_.reset();
}

void SetDeterministic(bool on) { g_deterministic = on; }

c10::intrusive_ptr<c10d::Backend> KizunaBackend::Create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, std::chrono::duration<float> timeout) {
  auto config = std::make_unique<Config>(GlobalConfig());
  if (timeout.count() > 0) config->timeout_s = timeout.count();
  if (g_deterministic) config->deterministic = true;

  // The unique id through the store. Rank 0's root listens on a free port of MASTER_ADDR's host
  // (torchrun's rendezvous host), or of a local address without it: never MASTER_PORT + 1, which a
  // second process group would also want.
  bootstrap::UniqueId id;
  if (rank == 0) {
    const char* master = std::getenv("MASTER_ADDR");
    Result<bootstrap::UniqueId> made = master != nullptr && *master != '\0'
                                           ? bootstrap::CreateUniqueId(bootstrap::HostPort{master, 0})
                                           : bootstrap::GetUniqueId();
    TORCH_CHECK(made.ok(), "kizuna: no unique id for the process group: ", made.status().ToString());
    id = *made;
    store->set(kUniqueIdKey, id.ToString());
  } else {
    const std::vector<uint8_t> text = store->get(kUniqueIdKey);
    Result<bootstrap::UniqueId> parsed = bootstrap::UniqueId::Parse(std::string(text.begin(), text.end()));
    TORCH_CHECK(parsed.ok(), "kizuna: the unique id in the store: ", parsed.status().ToString());
    id = *parsed;
  }

  // CPU tensors live in host memory: the emulated accelerator's devices are host memory too.
  auto registry = device::DeviceRegistry::Create(*config);
  device::Backend* emulated = registry->Find("host_emulated");
  TORCH_CHECK(emulated != nullptr && emulated->device_count() > 0,
              "kizuna: no emulated device for CPU tensors (KIZUNA_EMULATED_DEVICES=0?)");
  const char* local = std::getenv("LOCAL_RANK");
  const int index = (local != nullptr ? std::atoi(local) : rank) % emulated->device_count();
  device::Device* device = emulated->device(index);

  CommOptions options;
  options.config = config.get();
  auto comm = Communicator::Create(id, rank, size, *device, options);
  TORCH_CHECK(comm.ok(), "kizuna: creating the communicator (rank ", rank, " of ", size,
              "): ", comm.status().ToString());
  auto stream = device->CreateStream();
  TORCH_CHECK(stream.ok(), "kizuna: ", stream.status().ToString());
  return c10::make_intrusive<KizunaBackend>(rank, size, std::move(config), std::move(registry), std::move(*comm),
                                            std::move(*stream));
}

void* KizunaBackend::Staging(int which, size_t bytes) {
  auto& b = staging_[which];
  if (b == nullptr || b->size() < bytes) {
    b.reset();
    auto made = stream_->device().Allocate(std::max<size_t>(bytes, 4096));
    TORCH_CHECK(made.ok(), "kizuna: staging memory: ", made.status().ToString());
    b = std::move(*made);
  }
  return b->data();
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::Run(c10d::OpType type, const char* title,
                                                  std::vector<at::Tensor> outputs, const std::function<Status()>& op) {
  Status s;
  {
    std::lock_guard lock(mu_);
    s = op();
  }
  return c10::make_intrusive<KizunaWork>(type, title, std::move(outputs), s.ok() ? nullptr : ErrorOf(s.ToString()));
}

Status KizunaBackend::Execute(const void* in, size_t in_bytes, void* out, size_t out_bytes, bool host_ok,
                              const std::function<Status(const void*, void*)>& call) {
  const Deadline deadline = Deadline::AfterSeconds(config_->timeout_s);
  if (zero_copy_ && host_ok) {
    KZ_RETURN_IF_ERROR(call(in, out));
    return stream_->Synchronize(deadline);
  }
  const bool in_place = in == out;
  void* staged_in = Staging(0, in_place ? std::max(in_bytes, out_bytes) : in_bytes);
  if (in_bytes > 0) std::memcpy(staged_in, in, in_bytes);
  void* staged_out = in_place ? staged_in : Staging(1, out_bytes);
  KZ_RETURN_IF_ERROR(call(staged_in, staged_out));
  KZ_RETURN_IF_ERROR(stream_->Synchronize(deadline));
  if (out_bytes > 0 && out != nullptr) std::memcpy(out, staged_out, out_bytes);
  return Status::Ok();
}

// ---- Collectives ---------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> KizunaBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  Dense t(One(tensors, "allreduce"));
  const DataType type = TypeOf(t.data);
  const ReduceOp op = OpOf(opts.reduceOp, t.data);
  return Run(c10d::OpType::ALLREDUCE, "kizuna:all_reduce", tensors, [&]() -> Status {
    void* p = t.data.data_ptr();
    const size_t n = static_cast<size_t>(t.data.numel());
    KZ_RETURN_IF_ERROR(Execute(p, Bytes(t.data), p, Bytes(t.data), true, [&](const void* in, void* out) {
      return comm_->AllReduce(in, out, n, type, op, *stream_);
    }));
    t.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "kizuna: allreduce_coalesced of no tensors");
  for (const auto& t : tensors) {
    CheckCpu(t, "allreduce_coalesced");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "kizuna: allreduce_coalesced of mixed types");
  }
  // One AllReduce of the tensors side by side.
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.reshape({-1}));
  std::vector<at::Tensor> flat{at::cat(flat_parts)};
  c10d::AllreduceOptions one;
  one.reduceOp = opts.reduceOp;
  auto work = allreduce(flat, one);
  if (work->isSuccess()) {
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return c10::make_intrusive<KizunaWork>(c10d::OpType::ALLREDUCE, "kizuna:all_reduce_coalesced", tensors,
                                         work->exception());
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  Dense t(One(tensors, "broadcast"));
  const DataType type = TypeOf(t.data);
  const int root = static_cast<int>(opts.rootRank);
  return Run(c10d::OpType::BROADCAST, "kizuna:broadcast", tensors, [&]() -> Status {
    void* p = t.data.data_ptr();
    const size_t n = static_cast<size_t>(t.data.numel());
    KZ_RETURN_IF_ERROR(Execute(p, Bytes(t.data), p, Bytes(t.data), true, [&](const void* in, void* out) {
      return comm_->Broadcast(in, out, n, type, root, *stream_);
    }));
    t.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  Dense t(One(tensors, "reduce"));
  const DataType type = TypeOf(t.data);
  const ReduceOp op = OpOf(opts.reduceOp, t.data);
  const int root = static_cast<int>(opts.rootRank);
  return Run(c10d::OpType::REDUCE, "kizuna:reduce", tensors, [&]() -> Status {
    void* p = t.data.data_ptr();
    const size_t n = static_cast<size_t>(t.data.numel());
    KZ_RETURN_IF_ERROR(Execute(p, Bytes(t.data), p, Bytes(t.data), true, [&](const void* in, void* out) {
      return comm_->Reduce(in, out, n, type, op, root, *stream_);
    }));
    // Only the root's tensor holds the result; the others keep theirs (as with Gloo).
    if (getRank() == root) t.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& /*opts*/) {
  CheckCpu(output, "all_gather output");
  CheckCpu(input, "all_gather input");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "kizuna: all_gather: output and input types differ");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "kizuna: all_gather: output has ", output.numel(),
              " elements, expected ", input.numel() * getSize(), " (input x ranks)");
  Dense out(output);
  const at::Tensor in = input.contiguous();
  const DataType type = TypeOf(in);
  return Run(c10d::OpType::_ALLGATHER_BASE, "kizuna:all_gather_into_tensor", {output}, [&]() -> Status {
    const size_t n = static_cast<size_t>(in.numel());
    KZ_RETURN_IF_ERROR(Execute(in.data_ptr(), Bytes(in), out.data.data_ptr(), Bytes(out.data), true,
                               [&](const void* i, void* o) { return comm_->AllGather(i, o, n, type, *stream_); }));
    out.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllgatherOptions& opts) {
  const at::Tensor& input = One(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "kizuna: all_gather: one list of ", getSize(), " output tensors expected");
  for (const auto& o : outputs[0]) {
    CheckCpu(o, "all_gather output");
    TORCH_CHECK(o.numel() == input.numel() && o.scalar_type() == input.scalar_type(),
                "kizuna: all_gather: every output must match the input's size and type");
  }
  at::Tensor flat = at::empty({input.numel() * getSize()}, input.options());
  at::Tensor in = input.reshape({-1});
  auto work = _allgather_base(flat, in, opts);
  if (work->isSuccess())
    for (int r = 0; r < getSize(); ++r)
      outputs[0][static_cast<size_t>(r)].copy_(flat.narrow(0, r * input.numel(), input.numel()).view(input.sizes()));
  return c10::make_intrusive<KizunaWork>(c10d::OpType::ALLGATHER, "kizuna:all_gather", outputs[0], work->exception());
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::ReduceScatterOptions& opts) {
  CheckCpu(output, "reduce_scatter output");
  CheckCpu(input, "reduce_scatter input");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "kizuna: reduce_scatter: output and input types differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "kizuna: reduce_scatter: input has ", input.numel(),
              " elements, expected ", output.numel() * getSize(), " (output x ranks)");
  Dense out(output);
  const at::Tensor in = input.contiguous();
  const DataType type = TypeOf(in);
  const ReduceOp op = OpOf(opts.reduceOp, in);
  return Run(c10d::OpType::_REDUCE_SCATTER_BASE, "kizuna:reduce_scatter_tensor", {output}, [&]() -> Status {
    const size_t n = static_cast<size_t>(out.data.numel());
    KZ_RETURN_IF_ERROR(
        Execute(in.data_ptr(), Bytes(in), out.data.data_ptr(), Bytes(out.data), true,
                [&](const void* i, void* o) { return comm_->ReduceScatter(i, o, n, type, op, *stream_); }));
    out.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                             std::vector<std::vector<at::Tensor>>& inputs,
                                                             const c10d::ReduceScatterOptions& opts) {
  at::Tensor& output = const_cast<at::Tensor&>(One(outputs, "reduce_scatter"));
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "kizuna: reduce_scatter: one list of ", getSize(), " input tensors expected");
  std::vector<at::Tensor> parts;
  for (const auto& i : inputs[0]) {
    CheckCpu(i, "reduce_scatter input");
    TORCH_CHECK(i.numel() == output.numel() && i.scalar_type() == output.scalar_type(),
                "kizuna: reduce_scatter: every input must match the output's size and type");
    parts.push_back(i.reshape({-1}));
  }
  at::Tensor flat = at::cat(parts);
  return _reduce_scatter_base(output, flat, opts);
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& /*opts*/) {
  CheckCpu(output, "all_to_all output");
  CheckCpu(input, "all_to_all input");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "kizuna: all_to_all: output and input types differ");
  const int n = getSize(), me = getRank();
  Dense out(output);
  const at::Tensor in = input.contiguous();
  const DataType type = TypeOf(in);
  // Splits count rows (the first dimension); empty: equal parts.
  const int64_t in_row = in.dim() > 0 && in.size(0) > 0 ? in.numel() / in.size(0) : 1;
  const int64_t out_row = out.data.dim() > 0 && out.data.size(0) > 0 ? out.data.numel() / out.data.size(0) : 1;
  auto offsets = [&](const std::vector<int64_t>& splits, const at::Tensor& t, int64_t row, const char* what) {
    std::vector<int64_t> count(static_cast<size_t>(n)), offset(static_cast<size_t>(n) + 1, 0);
    if (splits.empty()) {
      TORCH_CHECK(t.numel() % n == 0, "kizuna: all_to_all: ", what, " of ", t.numel(), " elements is not ", n,
                  " equal parts");
      for (auto& c : count) c = t.numel() / n;
    } else {
      TORCH_CHECK(static_cast<int>(splits.size()) == n, "kizuna: all_to_all: ", splits.size(), " ", what,
                  " splits for ", n, " ranks");
      for (int r = 0; r < n; ++r) count[static_cast<size_t>(r)] = splits[static_cast<size_t>(r)] * row;
    }
    for (int r = 0; r < n; ++r) offset[static_cast<size_t>(r) + 1] = offset[static_cast<size_t>(r)] + count[static_cast<size_t>(r)];
    TORCH_CHECK(offset.back() == t.numel(), "kizuna: all_to_all: the ", what, " splits cover ", offset.back(),
                " elements of ", t.numel());
    return std::make_pair(count, offset);
  };
  const auto [send_count, send_offset] = offsets(input_splits, in, in_row, "input");
  const auto [recv_count, recv_offset] = offsets(output_splits, out.data, out_row, "output");
  const size_t elem = in.element_size();
  const bool equal = input_splits.empty() && output_splits.empty();
  return Run(c10d::OpType::ALLTOALL_BASE, "kizuna:all_to_all_single", {output}, [&]() -> Status {
    KZ_RETURN_IF_ERROR(Execute(in.data_ptr(), Bytes(in), out.data.data_ptr(), Bytes(out.data), false,
                               [&](const void* i, void* o) -> Status {
                                 if (equal) return comm_->AllToAll(i, o, static_cast<size_t>(send_count[0]), type,
                                                                   *stream_);
                                 // Uneven: a send and a receive per peer in one group, this rank's
                                 // own part copied.
                                 auto* src = static_cast<const uint8_t*>(i);
                                 auto* dst = static_cast<uint8_t*>(o);
                                 const auto self = static_cast<size_t>(me);
                                 TORCH_CHECK(send_count[self] == recv_count[self],
                                             "kizuna: all_to_all: this rank sends itself ", send_count[self],
                                             " elements but expects ", recv_count[self]);
                                 std::memcpy(dst + recv_offset[self] * elem, src + send_offset[self] * elem,
                                             static_cast<size_t>(send_count[self]) * elem);
                                 KZ_RETURN_IF_ERROR(Communicator::GroupStart());
                                 Status s;
                                 for (int p = 0; p < n && s.ok(); ++p) {
                                   const auto q = static_cast<size_t>(p);
                                   if (p == me) continue;
                                   if (send_count[q] > 0)
                                     s = comm_->Send(src + send_offset[q] * elem, static_cast<size_t>(send_count[q]),
                                                     type, p, *stream_);
                                   if (s.ok() && recv_count[q] > 0)
                                     s = comm_->Recv(dst + recv_offset[q] * elem, static_cast<size_t>(recv_count[q]),
                                                     type, p, *stream_);
                                 }
                                 Status end = Communicator::GroupEnd();
                                 return s.ok() ? end : s;
                               }));
    out.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::send(std::vector<at::Tensor>& tensors, int dst, int /*tag*/) {
  const at::Tensor t = One(tensors, "send").contiguous();
  const DataType type = TypeOf(t);
  return Run(c10d::OpType::SEND, "kizuna:send", tensors, [&]() -> Status {
    const size_t n = static_cast<size_t>(t.numel());
    return Execute(t.data_ptr(), Bytes(t), nullptr, 0, false,
                   [&](const void* i, void*) { return comm_->Send(i, n, type, dst, *stream_); });
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::recv(std::vector<at::Tensor>& tensors, int src, int /*tag*/) {
  Dense t(One(tensors, "recv"));
  const DataType type = TypeOf(t.data);
  return Run(c10d::OpType::RECV, "kizuna:recv", tensors, [&]() -> Status {
    const size_t n = static_cast<size_t>(t.data.numel());
    KZ_RETURN_IF_ERROR(Execute(nullptr, 0, t.data.data_ptr(), Bytes(t.data), false,
                               [&](const void*, void* o) { return comm_->Recv(o, n, type, src, *stream_); }));
    t.Finish();
    return Status::Ok();
  });
}

c10::intrusive_ptr<c10d::Work> KizunaBackend::barrier(const c10d::BarrierOptions& /*opts*/) {
  return Run(c10d::OpType::BARRIER, "kizuna:barrier", {}, [&]() -> Status {
    KZ_RETURN_IF_ERROR(comm_->Barrier(*stream_));
    return stream_->Synchronize(Deadline::AfterSeconds(config_->timeout_s));
  });
}

}  // namespace kizuna::torch_backend
