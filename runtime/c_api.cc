// The C API (kizuna.h) over the C++ one. No exception or C++ type crosses it; every failure is
// a kzResult_t plus the thread's last error message.
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/communicator.h"
#include "runtime/device/registry.h"
#include "runtime/kizuna.h"

struct kzComm {
  std::unique_ptr<kizuna::Communicator> comm;
};
struct kzStream {
  std::unique_ptr<kizuna::device::Stream> stream;
};

namespace {

using kizuna::Status;
using kizuna::StatusCode;

thread_local std::string g_last_error;

kzResult_t ToResult(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return kzSuccess;
    case StatusCode::kInvalidArgument:
      return kzInvalidArgument;
    case StatusCode::kUnavailable:
      return kzUnavailable;
    case StatusCode::kNotSupported:
      return kzNotSupported;
    case StatusCode::kOutOfMemory:
      return kzOutOfMemory;
    case StatusCode::kTimeout:
      return kzTimeout;
    case StatusCode::kAborted:
      return kzAborted;
    case StatusCode::kRemoteError:
      return kzRemoteError;
    case StatusCode::kInternal:
      return kzInternalError;
  }
  return kzInternalError;
}

kzResult_t Report(const Status& s) {
  if (!s.ok()) g_last_error = s.ToString();
  return ToResult(s.code());
}

kzResult_t Invalid(std::string message) { return Report(kizuna::InvalidArgument(std::move(message))); }

// The process's devices: the first available backend's, created on first use and kept for the
// life of the process (communicators, buffers and streams refer to them).
class Devices {
 public:
  static Devices& Get() {
    static Devices* d = new Devices();  // never destroyed: C callers may free at exit in any order
    return *d;
  }
  kizuna::Status status() const { return status_; }
  const std::vector<kizuna::device::Device*>& devices() const { return devices_; }

  std::mutex mu;
  std::map<void*, std::unique_ptr<kizuna::device::Buffer>> buffers;  // guarded by mu

 private:
  Devices() {
    registry_ = kizuna::device::DeviceRegistry::Create(kizuna::GlobalConfig());
    devices_ = registry_->devices();
    if (devices_.empty()) {
      std::string why;
      for (const auto& slot : registry_->backends()) why += fmt::format("; {}: {}", slot.name, slot.status.ToString());
      status_ = kizuna::Unavailable("no devices" + why);
      return;
    }
    const std::string backend = devices_[0]->properties().backend;
    std::erase_if(devices_, [&](kizuna::device::Device* d) { return d->properties().backend != backend; });
  }
  std::unique_ptr<kizuna::device::DeviceRegistry> registry_;
  std::vector<kizuna::device::Device*> devices_;
  kizuna::Status status_;
};

kizuna::device::Device* Dev(kzDevice_t d) { return reinterpret_cast<kizuna::device::Device*>(d); }
kzDevice_t Handle(kizuna::device::Device* d) { return reinterpret_cast<kzDevice_t>(d); }

bool ValidType(kzDataType_t t) { return static_cast<int>(t) >= 0 && static_cast<int>(t) < kizuna::kNumDataTypes; }
bool ValidOp(kzRedOp_t op) { return static_cast<int>(op) >= 0 && static_cast<int>(op) < kizuna::kNumReduceOps; }

#define KZ_C_CHECK_COMM(comm, stream)                                        \
  if ((comm) == nullptr || !(comm)->comm) return Invalid("comm is NULL");   \
  if ((stream) == nullptr || !(stream)->stream) return Invalid("stream is NULL")

#define KZ_C_CHECK_TYPE(t) \
  if (!ValidType(t)) return Invalid(fmt::format("datatype {} is not a kzDataType_t", static_cast<int>(t)))
#define KZ_C_CHECK_OP(op) \
  if (!ValidOp(op)) return Invalid(fmt::format("op {} is not a kzRedOp_t", static_cast<int>(op)))

}  // namespace

extern "C" {

const char* kzGetErrorString(kzResult_t result) {
  switch (result) {
    case kzSuccess:
      return "success";
    case kzInvalidArgument:
      return "invalid argument";
    case kzUnavailable:
      return "unavailable";
    case kzNotSupported:
      return "not supported";
    case kzOutOfMemory:
      return "out of memory";
    case kzTimeout:
      return "timeout";
    case kzAborted:
      return "aborted";
    case kzRemoteError:
      return "remote error";
    case kzInternalError:
      return "internal error";
  }
  return "unknown result code";
}

const char* kzGetLastError(void) { return g_last_error.c_str(); }

kzResult_t kzGetVersion(int* version) {
  if (version == nullptr) return Invalid("version is NULL");
  *version = KZ_VERSION_CODE;
  return kzSuccess;
}

kzResult_t kzDeviceCount(int* count) {
  if (count == nullptr) return Invalid("count is NULL");
  Devices& d = Devices::Get();
  if (!d.status().ok()) return Report(d.status());
  *count = static_cast<int>(d.devices().size());
  return kzSuccess;
}

kzResult_t kzDeviceGet(int index, kzDevice_t* device) {
  if (device == nullptr) return Invalid("device is NULL");
  Devices& d = Devices::Get();
  if (!d.status().ok()) return Report(d.status());
  if (index < 0 || index >= static_cast<int>(d.devices().size()))
    return Invalid(fmt::format("device index {} (there are {})", index, d.devices().size()));
  *device = Handle(d.devices()[static_cast<size_t>(index)]);
  return kzSuccess;
}

const char* kzDeviceName(kzDevice_t device) {
  if (device == nullptr) return "(null)";
  thread_local std::string name;
  name = Dev(device)->label();
  return name.c_str();
}

kzResult_t kzMalloc(kzDevice_t device, size_t bytes, void** ptr) {
  if (device == nullptr || ptr == nullptr) return Invalid("device or ptr is NULL");
  auto buffer = Dev(device)->Allocate(bytes);
  if (!buffer.ok()) return Report(buffer.status());
  void* p = (*buffer)->data();
  if (p == nullptr) {
    *ptr = nullptr;  // a zero-byte allocation: nothing to track
    return kzSuccess;
  }
  Devices& d = Devices::Get();
  std::lock_guard lock(d.mu);
  d.buffers[p] = std::move(*buffer);
  *ptr = p;
  return kzSuccess;
}

kzResult_t kzFree(kzDevice_t device, void* ptr) {
  if (ptr == nullptr) return kzSuccess;
  Devices& d = Devices::Get();
  std::lock_guard lock(d.mu);
  auto it = d.buffers.find(ptr);
  if (it == d.buffers.end() || &it->second->device() != Dev(device))
    return Invalid(fmt::format("kzFree: {} was not allocated by kzMalloc on this device", ptr));
  d.buffers.erase(it);
  return kzSuccess;
}

kzResult_t kzStreamCreate(kzDevice_t device, kzStream_t* stream) {
  if (device == nullptr || stream == nullptr) return Invalid("device or stream is NULL");
  auto s = Dev(device)->CreateStream();
  if (!s.ok()) return Report(s.status());
  *stream = new kzStream{std::move(*s)};
  return kzSuccess;
}

kzResult_t kzStreamDestroy(kzStream_t stream) {
  delete stream;
  return kzSuccess;
}

kzResult_t kzStreamSynchronize(kzStream_t stream) {
  if (stream == nullptr) return Invalid("stream is NULL");
  return Report(stream->stream->Synchronize());
}

kzResult_t kzGetUniqueId(kzUniqueId* id) {
  if (id == nullptr) return Invalid("id is NULL");
  auto u = kizuna::bootstrap::GetUniqueId();
  if (!u.ok()) return Report(u.status());
  const std::string text = u->ToString();
  if (text.size() >= sizeof id->internal) return Report(kizuna::Internal("unique id text too long"));
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, text.data(), text.size());
  return kzSuccess;
}

kzResult_t kzCommInitRank(kzComm_t* comm, int nranks, kzUniqueId id, int rank, kzDevice_t device) {
  if (comm == nullptr || device == nullptr) return Invalid("comm or device is NULL");
  const std::string text(id.internal, strnlen(id.internal, sizeof id.internal));
  auto parsed = kizuna::bootstrap::UniqueId::Parse(text);
  if (!parsed.ok()) return Report(parsed.status());
  auto c = kizuna::Communicator::Create(*parsed, rank, nranks, *Dev(device));
  if (!c.ok()) return Report(c.status());
  *comm = new kzComm{std::move(*c)};
  return kzSuccess;
}

kzResult_t kzCommInitAll(kzComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr) return Invalid("comms is NULL");
  if (ndev < 1) return Invalid(fmt::format("ndev {} (at least 1)", ndev));
  std::vector<kizuna::device::Device*> devices;
  for (int i = 0; i < ndev; ++i) {
    kzDevice_t d = nullptr;
    const kzResult_t r = kzDeviceGet(devlist ? devlist[i] : i, &d);
    if (r != kzSuccess) return r;
    devices.push_back(Dev(d));
  }
  auto all = kizuna::Communicator::CreateLocal(devices);
  if (!all.ok()) return Report(all.status());
  for (int i = 0; i < ndev; ++i) comms[i] = new kzComm{std::move((*all)[static_cast<size_t>(i)])};
  return kzSuccess;
}

kzResult_t kzCommInitFromEnv(kzComm_t* comm) {
  if (comm == nullptr) return Invalid("comm is NULL");
  auto c = kizuna::Communicator::CreateFromEnvironment();
  if (!c.ok()) return Report(c.status());
  *comm = new kzComm{std::move(*c)};
  return kzSuccess;
}

kzResult_t kzCommSplit(kzComm_t comm, int color, int key, kzComm_t* newcomm) {
  if (comm == nullptr || newcomm == nullptr) return Invalid("comm or newcomm is NULL");
  auto c = comm->comm->Split(color, key);
  if (!c.ok()) return Report(c.status());
  *newcomm = *c ? new kzComm{std::move(*c)} : nullptr;
  return kzSuccess;
}

kzResult_t kzCommDestroy(kzComm_t comm) {
  delete comm;
  return kzSuccess;
}

kzResult_t kzCommAbort(kzComm_t comm) {
  if (comm == nullptr) return Invalid("comm is NULL");
  comm->comm->Abort();
  delete comm;
  return kzSuccess;
}

kzResult_t kzCommGetAsyncError(kzComm_t comm, kzResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) return Invalid("comm or async_error is NULL");
  const Status s = comm->comm->AsyncError();
  if (!s.ok()) g_last_error = s.ToString();
  *async_error = ToResult(s.code());
  return kzSuccess;
}

kzResult_t kzCommCount(const kzComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return Invalid("comm or count is NULL");
  *count = comm->comm->size();
  return kzSuccess;
}

kzResult_t kzCommUserRank(const kzComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return Invalid("comm or rank is NULL");
  *rank = comm->comm->rank();
  return kzSuccess;
}

kzResult_t kzCommDevice(const kzComm_t comm, kzDevice_t* device) {
  if (comm == nullptr || device == nullptr) return Invalid("comm or device is NULL");
  *device = Handle(&comm->comm->device());
  return kzSuccess;
}

kzResult_t kzAllReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op,
                       kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(comm->comm->AllReduce(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype),
                                      static_cast<kizuna::ReduceOp>(op), *stream->stream));
}

kzResult_t kzBroadcast(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, int root,
                       kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(comm->comm->Broadcast(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype), root,
                                      *stream->stream));
}

kzResult_t kzReduce(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzRedOp_t op, int root,
                    kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(comm->comm->Reduce(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype),
                                   static_cast<kizuna::ReduceOp>(op), root, *stream->stream));
}

kzResult_t kzAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, kzDataType_t datatype, kzComm_t comm,
                       kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(comm->comm->AllGather(sendbuff, recvbuff, sendcount, static_cast<kizuna::DataType>(datatype),
                                      *stream->stream));
}

kzResult_t kzReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, kzDataType_t datatype,
                           kzRedOp_t op, kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  KZ_C_CHECK_OP(op);
  return Report(comm->comm->ReduceScatter(sendbuff, recvbuff, recvcount, static_cast<kizuna::DataType>(datatype),
                                          static_cast<kizuna::ReduceOp>(op), *stream->stream));
}

kzResult_t kzAllToAll(const void* sendbuff, void* recvbuff, size_t count, kzDataType_t datatype, kzComm_t comm,
                      kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(
      comm->comm->AllToAll(sendbuff, recvbuff, count, static_cast<kizuna::DataType>(datatype), *stream->stream));
}

kzResult_t kzSend(const void* sendbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm,
                  kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(comm->comm->Send(sendbuff, count, static_cast<kizuna::DataType>(datatype), peer, *stream->stream));
}

kzResult_t kzRecv(void* recvbuff, size_t count, kzDataType_t datatype, int peer, kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  KZ_C_CHECK_TYPE(datatype);
  return Report(comm->comm->Recv(recvbuff, count, static_cast<kizuna::DataType>(datatype), peer, *stream->stream));
}

kzResult_t kzBarrier(kzComm_t comm, kzStream_t stream) {
  KZ_C_CHECK_COMM(comm, stream);
  return Report(comm->comm->Barrier(*stream->stream));
}

kzResult_t kzGroupStart(void) { return Report(kizuna::Communicator::GroupStart()); }
kzResult_t kzGroupEnd(void) { return Report(kizuna::Communicator::GroupEnd()); }

}  // extern "C"
