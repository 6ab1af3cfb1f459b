// Streams and events of the CUDA backend: a device::Stream is a CUDA stream (non-blocking with
// respect to the legacy default stream) of the device's primary context, a device::Event a CUDA
// event without timing. Copies are cuMemcpyAsync (unified addressing: device, peer and pinned
// host memory alike); reduce and scale launch the kernels of kernel_abi.h; host callbacks are
// cuStreamAddCallback, which hands them the stream's status.
//
// Errors: a call the driver refuses at enqueue is returned by the enqueue; an asynchronous fault
// (seen by Query, Synchronize, an event, or a callback's status) is kept as the stream's sticky
// error, as CUDA keeps it for the context. Waits poll the driver (spin briefly, then sleep with a
// growing interval) so that every wait has a deadline and an oversubscribed host keeps its cores.
#pragma once

#include <cuda.h>

#include <memory>
#include <mutex>

#include "devices/cuda/backend.h"
#include "runtime/device/device.h"

namespace kizuna::cuda {

// The stream's sticky error, shared with its in-flight host callbacks (which may outlive it).
struct StreamState {
  std::mutex mu;
  Status error;  // guarded by mu
  void Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.ok()) error = s;
  }
  Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

class CudaStream final : public device::Stream {
 public:
  // `owned`: the stream is destroyed with this object (CreateStream); an adopted one (a
  // framework's, AdoptStream) is left to its owner.
  CudaStream(CudaDevice* device, CUstream stream, bool owned = true);
  ~CudaStream() override;

 protected:
  Status DoCopy(void* dst, const void* src, size_t bytes) override;
  Status DoReduce(void* dst, std::span<const void* const> srcs, size_t count, DataType type, ReduceOp op) override;
  Status DoReduceMulti(std::span<void* const> dsts, std::span<const void* const> srcs, size_t count, DataType type,
                       ReduceOp op) override;
  Status DoScale(void* dst, const void* src, size_t count, DataType type, uint32_t divisor) override;
  Status DoRecord(device::Event& event) override;
  Status DoWait(const device::Event& event) override;
  Status DoHostCallback(device::HostCallback fn) override;
  Result<std::unique_ptr<device::StreamHold>> DoEnqueueHold() override;
  Status DoEnqueueRelease(std::unique_ptr<device::StreamHold> hold) override;
  Status DoSynchronize(Deadline deadline) override;
  Result<bool> DoQuery() override;
  void* DoNativeHandle() const override { return stream_; }

 private:
  CudaDevice& cuda() const { return static_cast<CudaDevice&>(device()); }
  // An enqueue the driver refused: kInvalidArgument stays the caller's; anything else also
  // becomes the stream's sticky error.
  Status Refused(CUresult r, std::string_view what);
  Status Launch(CUfunction f, void* params, size_t elements, size_t element_bytes);

  std::shared_ptr<DeviceCore> core_;
  CUstream stream_;
  bool owned_ = true;
  std::shared_ptr<StreamState> state_;
  std::shared_ptr<struct HoldSlots> holds_;  // created on the first hold
  bool holds_unsupported_ = false;           // the driver refused stream memory waits: callback holds
};

class CudaEvent final : public device::Event {
 public:
  CudaEvent(CudaDevice* device, CUevent event);
  ~CudaEvent() override;
  CUevent handle() const { return event_; }

 protected:
  Result<bool> DoQuery() override;
  Status DoSynchronize(Deadline deadline) override;

 private:
  std::shared_ptr<DeviceCore> core_;
  CUevent event_;
};

}  // namespace kizuna::cuda
