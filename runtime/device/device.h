// The device abstraction layer: Backend -> Device -> Buffer, Stream, Event (README.md).
//
// A backend (host_emulated, cuda, level_zero, or a vendor plugin) registers a factory in the
// registry (registry.h); nothing above this layer names a backend. Public entry points are
// non-virtual: they validate arguments and trace, then call the protected Do* virtuals, so
// backends never repeat argument checks.
//
// Device addresses are plain pointers, as in CUDA and NCCL: a pointer returned by Allocate or
// Import, plus an offset. Whether the CPU may dereference one is DeviceProperties::host_accessible.
//
// Threading: Backend, Device and Event methods are thread-safe. A Stream may be used from several
// threads; operations are ordered in the order their enqueue calls returned.
//
// Errors: an operation that fails on the stream (a device fault, an injected fault) puts the
// stream into an error state, like a sticky CUDA error: later operations on that stream are
// skipped, and Synchronize, Query, events recorded afterwards and host callbacks report the
// error. Bad arguments are reported by the enqueue call itself and nothing is enqueued.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/dtype.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::device {

class Device;
class Event;

struct DeviceProperties {
  std::string backend;     // registry name, e.g. "host_emulated"
  int index = 0;           // index within the backend
  std::string name;        // human-readable, e.g. "emulated accelerator 3"
  std::string uuid;        // identical for the same physical device seen from every process on a host
  uint64_t memory_bytes = 0;
  double copy_gbps = 0;          // device-local copy throughput (read + write counted once); 0: unknown
  double reduce_gbps = 0;        // reduce throughput, bytes of input read per second / 1e9; 0: unknown
  double launch_latency_us = 0;  // cost of one stream operation's launch
  bool host_accessible = false;  // the CPU may dereference device pointers
  bool host_compute = false;     // copies and reductions run on the host's CPUs over host memory (emulated)
  // Stream work may fail on purpose (a test's fault injection, KIZUNA_EMU_FAIL_STREAM_OP): work the
  // CPU could do instead must go through the streams, or the faults would never be met.
  bool faults_injected = false;
  bool export_fd = false;        // Export() yields an fd (memfd or DMA-BUF) plus offset
  bool export_opaque = false;    // Export() yields a vendor IPC handle
  bool export_dmabuf = false;    // ExportDmaBuf() yields a DMA-BUF fd (what an RDMA NIC registers)
  std::string pci_bus_id;        // "" when not a PCI device
  int numa_node = -1;            // -1: unknown
};

// Device memory. Destroying a Buffer frees (or, for an imported one, unmaps) the memory; the
// caller must first make sure no stream still uses it (synchronize), as with cudaFree.
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }  // device address; may be null when size() == 0
  size_t size() const { return size_; }
  Device& device() const { return *device_; }
  bool imported() const { return imported_; }  // mapped from another process's export

 protected:
  Buffer(Device* device, void* data, size_t size, bool imported)
      : device_(device), data_(data), size_(size), imported_(imported) {}

 private:
  Device* device_;
  void* data_;
  size_t size_;
  bool imported_;
};

// Memory exported for another process on the same host (the device layer's handle; README.md).
// An allocation found by Device::FindAllocation. The fd is the allocation's own (memfd or
// DMA-BUF), borrowed: valid while the allocation lives; another process takes its own copy with
// pidfd_getfd and maps [0, bytes) of it (Device::Import with an fd export).
struct AllocationRef {
  int fd = -1;
  uint64_t serial = 0;         // unique among this process's allocations, never reused
  const void* base = nullptr;  // the allocation's first byte (its device address)
  uint64_t bytes = 0;          // the allocation's size
};

// Moves between processes with SendExportedMemory / ReceiveExportedMemory (exported_memory.h).
enum class ExportKind : uint8_t { kFd = 1, kOpaque = 2 };

struct ExportedMemory {
  ExportKind kind = ExportKind::kFd;
  UniqueFd fd;                  // kFd: memfd / DMA-BUF file descriptor, owned
  std::vector<uint8_t> opaque;  // kOpaque: a vendor IPC handle, copied as bytes
  uint64_t offset = 0;          // kFd: where the region starts within the fd's object
  uint64_t size = 0;            // bytes in the region
  bool dmabuf = false;          // kFd: the fd is a DMA-BUF (ExportDmaBuf), not the backend's own handle
  std::string backend;          // the exporting backend's registry name
  std::string device_uuid;      // the exporting device (DeviceProperties::uuid)
  int device_index = 0;
};

// Host callbacks receive the stream's status when they run: ok, or the error that stopped it.
using HostCallback = std::function<void(const Status&)>;

// A stream held at a point (Stream::EnqueueHold): work enqueued after the hold waits until
// Release() is called, from any thread. Release is idempotent; destroying an unreleased hold
// releases it. The engine holds a caller's stream until a collective is done.
class StreamHold {
 public:
  virtual ~StreamHold() = default;
  virtual void Release() = 0;
};

class Stream {
 public:
  // Waits (up to the configured timeout) for queued work, then releases the stream.
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device& device() const { return *device_; }

  // The backend's own handle of this stream (a CUstream on CUDA; a token on the emulated device),
  // which a framework may keep and hand back to Device::AdoptStream; nullptr where there is none.
  void* native_handle() const { return DoNativeHandle(); }

  // dst[0..bytes) = src[0..bytes). Both are memory this device's streams take (Addressable): device
  // memory of this backend (allocated or imported) or host memory from AllocateHost; they must not
  // overlap.
  Status Copy(void* dst, const void* src, size_t bytes);

  // dst[i] = srcs[0][i] op ... op srcs[n-1][i] for i < count (semantics: runtime/device/host_reduce.h).
  // dst may be exactly one of the inputs. At least one input. The `srcs` array itself is read
  // during the call only (the pointers are copied); the memory it points to is read when the
  // operation runs.
  Status Reduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op);

  // The same reduction written to several outputs in one pass: dsts[j][i] = srcs[0][i] op ... op
  // srcs[n-1][i] for every j (the single-host fused AllReduce: each rank reduces its slice of
  // every rank's input into that slice of every rank's output). Each output is either exactly one
  // of the inputs or disjoint from all of them; outputs are pairwise disjoint. At least one
  // output. Backends without a one-pass kernel get the default: Reduce into dsts[0], then copies.
  Status ReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                     ReduceOp op);

  // dst[i] = src[i] / divisor for i < count: the division that finishes ReduceOp::kAvg after a
  // sum over all ranks (averages of partial averages would be wrong). Rounding is dtype.h's kAvg
  // applied to one already-summed input (runtime/device/host_reduce.h, HostScale): floating types divide
  // in the accumulation type (float32 for float16 / bfloat16 / float32, float64 for float64) and
  // round once to the type; integer types truncate toward zero (signed types divide the value as
  // the signed type: -7 / 2 = -3). dst may equal src (in place); any other overlap is invalid.
  // kInvalidArgument, with nothing enqueued, for divisor 0 (even with count 0), a bad type, null
  // or unaddressable pointers and partial overlap; count 0 is ok and enqueues nothing (the backend
  // is not asked). kNotSupported when the backend has no scale operation (an optional capability,
  // like a device plugin built against plugin api 1.0): the caller falls back, e.g. to a host
  // staging path. Ordered with the stream's other work, and subject to its sticky error.
  Status Scale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor);

  // Captures all work enqueued so far; the event completes when that work has.
  Status Record(Event& event);
  // Later work on this stream waits until `event` completes (an unrecorded event: no wait).
  // The event may belong to another device of the same backend.
  Status Wait(const Event& event);
  // Runs `fn` on a backend thread after all earlier work. It must not block for long and must not
  // synchronize this stream. It may destroy this stream (the backend finishes the teardown on
  // another thread).
  Status EnqueueHostCallback(HostCallback fn);

  // Holds the stream at this point until the returned hold is released: later work waits, earlier
  // work is unaffected, no host thread is blocked where the device can wait on memory (CUDA:
  // cuStreamWaitValue32 on pinned memory). The default is a host callback that blocks until the
  // release (bounded by the configured timeout, plus 30 s): on a backend that runs all host
  // callbacks on one thread (CUDA), holding several streams that way would serialize them.
  Result<std::unique_ptr<StreamHold>> EnqueueHold();
  // Releases `hold` (from any stream of this backend) when this stream reaches this point, so one
  // stream lets another go on without a host thread waiting for it (CUDA: a stream write to the
  // word the hold waits on). The stream owns the hold until then. The default enqueues a host
  // callback that releases it. Should this stream fail first, the hold is still released (a
  // held stream never waits for ever).
  Status EnqueueRelease(std::unique_ptr<StreamHold> hold);

  // Waits until all enqueued work is done; returns the stream's error, if any, else a reported
  // failure (ReportFailure); kTimeout at the deadline.
  Status Synchronize(Deadline deadline);
  // The same with the configured KIZUNA_TIMEOUT as a deadline for the stream to stop moving: a
  // long queue of work that keeps completing (slow but healthy) is waited for, on backends that
  // count their completed work (DoCompleted); elsewhere the timeout bounds the whole wait.
  Status Synchronize();
  // true when all enqueued work is done; the stream's error, if any, else a reported failure.
  Result<bool> Query();
  // Query for the runtime's own checks (is the caller's stream idle?): a reported failure stays
  // for the caller's Synchronize or Query.
  Result<bool> Idle() { return DoQuery(); }
  // Work this stream carried but did not run failed: a collective the stream was held for (the
  // executor reports it before releasing the hold). The next Synchronize or Query that finds the
  // stream's work done returns it, once, so that code waiting on the stream learns that the
  // results it waited for are not there, as it would from a failed kernel — without making the
  // stream unusable for later work. The first failure is kept until then.
  void ReportFailure(const Status& failure);

 protected:
  explicit Stream(Device* device) : device_(device) {}
  virtual Status DoCopy(void* dst, const void* src, size_t bytes) = 0;
  virtual Status DoReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type,
                          ReduceOp op) = 0;
  // Arguments already checked (as Reduce, for every output). The default reduces into dsts[0]
  // and copies it to the other outputs.
  virtual Status DoReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count,
                               DataType type, ReduceOp op);
  // Arguments already checked (divisor >= 1, count >= 1, valid type, addressable, dst == src or
  // disjoint). The default answers kNotSupported ("<backend> has no scale operation"), so a
  // backend that predates the operation says so instead of failing to build.
  virtual Status DoScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor);
  virtual Status DoRecord(Event& event) = 0;
  virtual Status DoWait(const Event& event) = 0;
  virtual Status DoHostCallback(HostCallback fn) = 0;
  virtual Result<std::unique_ptr<StreamHold>> DoEnqueueHold();
  virtual Status DoEnqueueRelease(std::unique_ptr<StreamHold> hold);
  virtual Status DoSynchronize(Deadline deadline) = 0;
  virtual Result<bool> DoQuery() = 0;
  // How many work items have completed so far (any counter that moves when work completes), or
  // nullopt when the backend does not count them.
  virtual std::optional<uint64_t> DoCompleted() const { return std::nullopt; }
  virtual void* DoNativeHandle() const { return nullptr; }

 private:
  Status TakeFailure();

  Device* device_;
  std::atomic<bool> failed_{false};  // a reported failure waits in failure_ (read without the lock)
  std::mutex failure_mu_;
  Status failure_;  // guarded by failure_mu_
};

class Event {
 public:
  virtual ~Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device& device() const { return *device_; }

  // true when the work captured by the last Record is done (or the event was never recorded);
  // that work's error, if it failed.
  Result<bool> Query();
  Status Synchronize(Deadline deadline);
  Status Synchronize();  // deadline: the configured KIZUNA_TIMEOUT

 protected:
  explicit Event(Device* device) : device_(device) {}
  virtual Result<bool> DoQuery() = 0;
  virtual Status DoSynchronize(Deadline deadline) = 0;

 private:
  Device* device_;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceProperties& properties() const { return properties_; }
  const Config& config() const { return *config_; }
  // "host_emulated:3" — how logs and errors name the device.
  std::string label() const;

  // Allocates `bytes` of device memory (0 is valid and yields an empty buffer).
  // kOutOfMemory when the device has no room; never a crash.
  Result<std::unique_ptr<Buffer>> Allocate(size_t bytes);
  // Allocates `bytes` of host memory for this device, as cudaMallocHost does: the CPU reads and
  // writes data() directly, and this device's streams take it wherever they take device memory
  // (copy source and destination, reduce and scale inputs and output) — the way bytes get in and
  // out of memory the CPU cannot reach, and the staging memory of fabrics that cannot reach the
  // device. A host-accessible device returns ordinary device memory (the default). kNotSupported
  // when the device has no such memory; kOutOfMemory when the host has no room.
  Result<std::unique_ptr<Buffer>> AllocateHost(size_t bytes);
  Result<std::unique_ptr<Stream>> CreateStream();
  // A Stream for a native stream of this device that someone else (a framework) created and
  // keeps: work enqueued on it goes onto that native stream, in its order; destroying the returned
  // object releases the wrapper only (the native stream stays, and its work goes on). `native` as
  // Stream::native_handle gives it (null is CUDA's legacy default stream; the emulated device
  // refuses it). kInvalidArgument when `native` is not a live stream of this device (the backend
  // checks what it can), kNotSupported when the backend adopts nothing.
  Result<std::unique_ptr<Stream>> AdoptStream(void* native);
  Result<std::unique_ptr<Event>> CreateEvent();

  // Exports [offset, offset + size) of a buffer allocated on this device for another process.
  // kNotSupported when the device exports nothing (properties().export_fd/export_opaque false).
  Result<ExportedMemory> Export(const Buffer& buffer, size_t offset, size_t size);
  Result<ExportedMemory> Export(const Buffer& buffer) { return Export(buffer, 0, buffer.size()); }

  // Exports [offset, offset + size) as a DMA-BUF fd (ExportedMemory::dmabuf), the form an RDMA NIC
  // registers (ibv_reg_dmabuf_mr) — not necessarily one Import() takes. The same range checks as
  // Export; backends may also require page alignment (the error says so). kNotSupported when
  // properties().export_dmabuf is false.
  Result<ExportedMemory> ExportDmaBuf(const Buffer& buffer, size_t offset, size_t size);

  // Maps memory exported by another process (or this one) into this device's address space.
  // The returned buffer keeps its own reference to the memory: the ExportedMemory may be dropped.
  Result<std::unique_ptr<Buffer>> Import(const ExportedMemory& exported);

  // True when `ptr`'s [ptr, ptr + bytes) lies in memory this device can use in stream operations.
  // Backends that cannot tell return true (the default).
  virtual bool Addressable(const void* ptr, size_t bytes) const;

  // The live allocation of this device holding [ptr, ptr + bytes), in a form another process on
  // this host can map once and keep (the single-host direct algorithms map each peer's buffers on
  // first use and reuse the mapping for as long as the allocation lives). kNotSupported when the
  // backend cannot say (the default); kInvalidArgument when the range is not inside one of its
  // own exportable allocations (imports, plain host memory).
  virtual Result<AllocationRef> FindAllocation(const void* ptr, size_t bytes) const;

 protected:
  Device(DeviceProperties properties, const Config* config)
      : properties_(std::move(properties)), config_(config) {}
  virtual Result<std::unique_ptr<Buffer>> DoAllocate(size_t bytes) = 0;
  // The default: DoAllocate when the device is host accessible, else kNotSupported.
  virtual Result<std::unique_ptr<Buffer>> DoAllocateHost(size_t bytes);
  virtual Result<std::unique_ptr<Stream>> DoCreateStream() = 0;
  // The default: kNotSupported.
  virtual Result<std::unique_ptr<Stream>> DoAdoptStream(void* native);
  virtual Result<std::unique_ptr<Event>> DoCreateEvent() = 0;
  virtual Result<ExportedMemory> DoExport(const Buffer& buffer, size_t offset, size_t size);
  virtual Result<std::unique_ptr<Buffer>> DoImport(const ExportedMemory& exported);
  virtual Result<ExportedMemory> DoExportDmaBuf(const Buffer& buffer, size_t offset, size_t size);

  DeviceProperties properties_;

 private:
  const Config* config_;  // outlives the device (owned by whoever created the registry)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual int device_count() const = 0;
  // nullptr when index is out of range.
  virtual Device* device(int index) = 0;
};

}  // namespace kizuna::device
