// The C API's communicators (kizuna.h): creation (blocking or not, from a unique id, the launcher's
// environment or local devices), split and shrink, revoke, abort and destruction, registration,
// and the collectives. c_api.cc has the errors, devices, memory and streams, and says how handles
// work.
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/c_api_entries.h"
#include "runtime/c_api_handles.h"
#include "runtime/communicator.h"
#include "runtime/kizuna.h"

namespace {

using namespace kizuna::c_api_internal;  // NOLINT(build/namespaces): the results and handle tables
using kizuna::Status;
using kizuna::StatusCode;

}  // namespace

extern "C" {

// kzCommInitRank's arguments checked: the device and the id, parsed.
static kzResult_t InitArgs(kzComm_t* comm, const kzUniqueId& id, kzDevice_t device, DeviceRef* ref,
                           kizuna::bootstrap::UniqueId* parsed) {
  if (comm == nullptr) return Invalid("comm is NULL");
  if (!FindDevice(device, "device", ref)) return kzInvalidArgument;
  auto p = kizuna::bootstrap::UniqueId::Parse(std::string(id.internal, strnlen(id.internal, sizeof id.internal)));
  if (!p.ok()) return Report(p.status());
  *parsed = *p;
  return kzSuccess;
}

kzResult_t kzCommInitRank(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device) {
  DeviceRef ref;
  kizuna::bootstrap::UniqueId parsed;
  if (const kzResult_t r = InitArgs(comm, id, device, &ref, &parsed); r != kzSuccess) return r;
  auto c = kizuna::Communicator::Create(parsed, rank, nranks, *ref.device);
  if (!c.ok()) return Report(c.status());
  return AddComm(std::move(*c), Bits(device), std::move(ref.keep), comm);
}

namespace {

// A kzConfig_t the caller passed (not NULL) is one KZ_CONFIG_INITIALIZER set up.
kzResult_t CheckConfig(const kzConfig_t& config) {
  if (config.size != sizeof(kzConfig_t) || config.magic != KZ_CONFIG_MAGIC)
    return Invalid(
        fmt::format("config was not set up with KZ_CONFIG_INITIALIZER (size {}, magic {:#x}; expected "
                    "{} and {:#x})",
                    config.size, config.magic, sizeof(kzConfig_t), KZ_CONFIG_MAGIC));
  if (config.version / 10000 != KZ_MAJOR)
    return Invalid(
        fmt::format("config comes from kizuna.h of version {}, this library is {}", config.version, KZ_VERSION_CODE));
  if (config.blocking != 0 && config.blocking != 1)
    return Invalid(fmt::format("config->blocking is {} (0 or 1)", config.blocking));
  return kzSuccess;
}

}  // namespace

kzResult_t kzCommInitRankConfig(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device,
                                const kzConfig_t* config) {
  if (config == nullptr) return kzCommInitRank(comm, nranks, id, rank, device);
  if (const kzResult_t r = CheckConfig(*config); r != kzSuccess) return r;
  if (config->blocking == 1) return kzCommInitRank(comm, nranks, id, rank, device);
  DeviceRef ref;
  kizuna::bootstrap::UniqueId parsed;
  if (const kzResult_t r = InitArgs(comm, id, device, &ref, &parsed); r != kzSuccess) return r;
  auto entry = std::make_shared<CommEntry>();
  entry->device_keep = std::move(ref.keep);
  entry->device = Bits(device);
  entry->state.store(kCommCreating, std::memory_order_relaxed);
  // The thread holds no reference: the entry's destructor joins it, so the entry outlives it.
  CommEntry* e = entry.get();
  kizuna::device::Device* d = ref.device;
  entry->creator = std::thread([e, d, id = parsed, rank, nranks] {
    auto c = kizuna::Communicator::Create(id, rank, nranks, *d);
    if (c.ok()) {
      e->comm = std::move(*c);
      e->state.store(kCommReady, std::memory_order_release);
    } else {
      e->failure = c.status();
      e->state.store(kCommFailed, std::memory_order_release);
    }
  });
  const uintptr_t handle = Comms().Add(std::move(entry));
  if (handle == 0) return Report(kizuna::OutOfMemory("too many live communicators (their handle table is full)"));
  *comm = CommHandle(handle);
  g_last_error = "the communicator is being created (kzCommInitRankConfig with blocking = 0)";
  return kzInProgress;
}

kzResult_t kzCommFinalize(kzComm_t comm) {
  KZ_C_READY_COMM(comm);
  if (c->finalized.exchange(true)) return Invalid("the communicator was finalized already");
  std::vector<std::shared_ptr<StreamEntry>> streams;
  {
    std::lock_guard lock(c->streams_mu);
    for (const auto& w : c->streams)
      if (auto s = w.lock()) streams.push_back(std::move(s));
  }
  // An event behind each stream's last operation, waited for with the job's deadline.
  const auto deadline = kizuna::Deadline::AfterSeconds(kizuna::GlobalConfig().timeout_s);
  for (const auto& s : streams) {
    auto event = s->stream->device().CreateEvent();
    if (!event.ok()) return Report(event.status());
    if (Status r = s->stream->Record(**event); !r.ok()) return Report(r);
    if (Status w = (*event)->Synchronize(deadline); !w.ok())
      return Report(w.WithContext("kzCommFinalize: waiting for the communicator's operations"));
  }
  return Report(c->comm->AsyncError());
}

kzResult_t kzCommInitAll(kzComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return Invalid("comms is NULL");
  if (ndev < 1) return Invalid(fmt::format("ndev {} (at least 1)", ndev));
  std::vector<kizuna::device::Device*> devices;
  std::vector<uintptr_t> handles;
  for (int i = 0; i < ndev; ++i) {
    kzDevice_t d = nullptr;
    const kzResult_t r = kzDeviceGet(devlist ? devlist[i] : i, &d);
    if (r != kzSuccess) return r;
    DeviceRef ref;
    if (!FindDevice(d, "device", &ref)) return kzInternalError;  // the process's devices are never destroyed
    devices.push_back(ref.device);
    handles.push_back(Bits(d));
  }
  auto all = kizuna::Communicator::CreateLocal(devices);
  if (!all.ok()) return Report(all.status());
  for (int i = 0; i < ndev; ++i) {
    const size_t k = static_cast<size_t>(i);
    const kzResult_t r = AddComm(std::move((*all)[k]), handles[k], nullptr, &comms[i]);
    if (r != kzSuccess) {
      for (int j = 0; j < i; ++j) Comms().Remove(Bits(comms[j]), "comms");
      return r;
    }
  }
  return kzSuccess;
}

kzResult_t kzCommInitFromEnv(kzComm_t* comm) {
  if (comm == nullptr) return Invalid("comm is NULL");
  auto c = kizuna::Communicator::CreateFromEnvironment();
  if (!c.ok()) return Report(c.status());
  // The communicator owns its device: the device's handle lives while the communicator's entry does.
  auto entry = std::make_shared<CommEntry>();
  auto device = std::make_shared<DeviceEntry>();
  device->device = &(*c)->device();
  device->owned = true;
  device->owner = entry;
  entry->device = DeviceTable().Add(std::move(device));
  if (entry->device == 0) return Report(kizuna::OutOfMemory("too many live devices (their handle table is full)"));
  entry->comm = std::move(*c);
  const uintptr_t handle = Comms().Add(std::move(entry));
  if (handle == 0) return Report(kizuna::OutOfMemory("too many live communicators (their handle table is full)"));
  *comm = CommHandle(handle);
  return kzSuccess;
}

kzResult_t kzCommSplit(kzComm_t comm, int color, int key, kzComm_t* newcomm) {
  if (newcomm == nullptr) return Invalid("newcomm is NULL");
  const std::shared_ptr<CommEntry> parent = Comms().Find(Bits(comm), "comm");
  if (parent == nullptr) return kzInvalidArgument;
  if (const kzResult_t r = Ready(*parent); r != kzSuccess) return r;
  DeviceRef ref;
  if (!FindDevice(DeviceHandle(parent->device), "comm's device", &ref)) return kzInvalidArgument;
  auto c = parent->comm->Split(color, key);
  if (!c.ok()) return Report(c.status());
  if (*c == nullptr) {
    *newcomm = nullptr;
    return kzSuccess;
  }
  return AddComm(std::move(*c), parent->device, std::move(ref.keep), newcomm);
}

kzResult_t kzCommShrink(kzComm_t comm, const int* exclude_ranks, int exclude_count, kzComm_t* newcomm,
                        const kzConfig_t* config, int flags) {
  if (newcomm == nullptr) return Invalid("newcomm is NULL");
  if (exclude_count < 0) return Invalid(fmt::format("exclude_count is {}", exclude_count));
  if (exclude_count > 0 && exclude_ranks == nullptr)
    return Invalid(fmt::format("exclude_ranks is NULL with exclude_count {}", exclude_count));
  if (flags != KZ_SHRINK_DEFAULT && flags != KZ_SHRINK_ABORT)
    return Invalid(fmt::format("flags is {} (KZ_SHRINK_DEFAULT or KZ_SHRINK_ABORT)", flags));
  if (config != nullptr) {
    if (const kzResult_t r = CheckConfig(*config); r != kzSuccess) return r;
    if (config->blocking == 0) return Invalid("config->blocking = 0: kzCommShrink creates blocking communicators only");
  }
  const std::shared_ptr<CommEntry> parent = Comms().Find(Bits(comm), "comm");
  if (parent == nullptr) return kzInvalidArgument;
  if (const kzResult_t r = Ready(*parent); r != kzSuccess) return r;
  DeviceRef ref;
  if (!FindDevice(DeviceHandle(parent->device), "comm's device", &ref)) return kzInvalidArgument;
  auto c = parent->comm->Shrink(std::span(exclude_ranks, static_cast<size_t>(exclude_count)),
                                flags == KZ_SHRINK_ABORT ? kizuna::ShrinkMode::kAbort : kizuna::ShrinkMode::kDefault);
  if (!c.ok()) return Report(c.status());
  return AddComm(std::move(*c), parent->device, std::move(ref.keep), newcomm);
}

kzResult_t kzCommRevoke(kzComm_t comm, int flags) {
  if (flags != 0) return Invalid(fmt::format("flags is {} (0)", flags));
  KZ_C_READY_COMM(comm);
  c->comm->Revoke();
  return kzSuccess;
}

kzResult_t kzCommReweigh(kzComm_t comm) {
  KZ_C_READY_COMM(comm);
  if (kizuna::Status s = c->comm->Reweigh(); !s.ok()) return Report(s);
  return kzSuccess;
}

kzResult_t kzCommDestroy(kzComm_t comm) {
  if (comm == nullptr) return kzSuccess;
  // The communicator goes with the last reference: here, or when a call running on another thread
  // returns.
  return Comms().Remove(Bits(comm), "comm") != nullptr ? kzSuccess : kzInvalidArgument;
}

kzResult_t kzCommAbort(kzComm_t comm) {
  const std::shared_ptr<CommEntry> c = Comms().Remove(Bits(comm), "comm");
  if (c == nullptr) return kzInvalidArgument;
  // One still being created is waited for when `c` goes (its entry joins the creating thread).
  if (c->state.load(std::memory_order_acquire) == kCommReady) c->comm->Abort();
  return kzSuccess;
}

kzResult_t kzCommGetAsyncError(kzComm_t comm, kzResult_t* async_error) {
  if (async_error == nullptr) return Invalid("async_error is NULL");
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm");
  if (c == nullptr) return kzInvalidArgument;
  const int state = c->state.load(std::memory_order_acquire);
  if (state != kCommReady) {
    *async_error = state == kCommCreating ? kzInProgress : ToResult(c->failure.code());
    if (state == kCommFailed) g_last_error = c->failure.ToString();
    return kzSuccess;
  }
  const Status s = c->comm->AsyncError();
  if (!s.ok()) g_last_error = s.ToString();
  *async_error = ToResult(s.code());
  return kzSuccess;
}

kzResult_t kzCommRegister(const kzComm_t comm, void* buff, size_t size, void** handle) {
  if (handle == nullptr) return Invalid("handle is NULL");
  KZ_C_READY_COMM(comm);
  auto id = c->comm->Register(buff, size);
  if (!id.ok()) return Report(id.status());
  *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(*id));
  return kzSuccess;
}

kzResult_t kzCommDeregister(const kzComm_t comm, void* handle) {
  KZ_C_READY_COMM(comm);
  return Report(c->comm->Deregister(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle))));
}

kzResult_t kzCommCount(const kzComm_t comm, int* count) {
  if (count == nullptr) return Invalid("count is NULL");
  KZ_C_READY_COMM(comm);
  *count = c->comm->size();
  return kzSuccess;
}

kzResult_t kzCommUserRank(const kzComm_t comm, int* rank) {
  if (rank == nullptr) return Invalid("rank is NULL");
  KZ_C_READY_COMM(comm);
  *rank = c->comm->rank();
  return kzSuccess;
}

kzResult_t kzCommDevice(const kzComm_t comm, kzDevice_t* device) {
  if (device == nullptr) return Invalid("device is NULL");
  const std::shared_ptr<CommEntry> c = Comms().Find(Bits(comm), "comm");
  if (c == nullptr) return kzInvalidArgument;
  *device = DeviceHandle(c->device);
  return kzSuccess;
}

kzResult_t kzAllReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op,
                       kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(c->comm->AllReduce(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype),
                                   static_cast<kizuna::ReduceOp>(op), *s->stream));
}

kzResult_t kzBroadcast(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, int root,
                       kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(
      c->comm->Broadcast(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype), root, *s->stream));
}

kzResult_t kzReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op, int root,
                    kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(c->comm->Reduce(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype),
                                static_cast<kizuna::ReduceOp>(op), root, *s->stream));
}

kzResult_t kzAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, kzDataType_t datatype, kzComm_t comm,
                       kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->AllGather(sendbuff, recvbuff, sendcount, static_cast<kizuna::DataType>(datatype), *s->stream));
}

kzResult_t kzReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, kzDataType_t datatype, kzRedOp_t op,
                           kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(c->comm->ReduceScatter(sendbuff, recvbuff, recvcount, static_cast<kizuna::DataType>(datatype),
                                       static_cast<kizuna::ReduceOp>(op), *s->stream));
}

kzResult_t kzAllToAll(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzComm_t comm,
                      kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->AllToAll(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype), *s->stream));
}

kzResult_t kzSend(const void* sendbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm,
                  kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->Send(sendbuff, count, static_cast<kizuna::DataType>(datatype), peer, *s->stream));
}

kzResult_t kzRecv(void* recvbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(c->comm->Recv(recvbuff, count, static_cast<kizuna::DataType>(datatype), peer, *s->stream));
}

kzResult_t kzBarrier(kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  return Report(c->comm->Barrier(*s->stream));
}

kzResult_t kzGroupStart(void) { return Report(kizuna::Communicator::GroupStart()); }
kzResult_t kzGroupEnd(void) { return Report(kizuna::Communicator::GroupEnd()); }

}  // extern "C"
