// The engine's re-weighing (engine.h, Reweigh): the ranks measure their devices between calls
// and agree on the speeds, so that later plans split work by what the devices do now (another job
// sharing one of them slows it) instead of what they reported at creation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "collectives/engine.h"
#include "runtime/core/logging.h"
#include "runtime/core/wire.h"

namespace kizuna::collectives {
namespace {

// Bytes per probe buffer: long enough that a busy host's scheduling delays (milliseconds) do not
// hide the device's pace (4 MiB at 1 GB/s: 4 ms), short enough that a slow device keeps the call
// under a second (0.1 GB/s: 6 copies and 6 reductions in 0.75 s).
constexpr size_t kProbeBytes = 4 << 20;
// Probe runs per operation, the median kept: what the device does now, another job's share
// included (the fastest would find the moments it left the device alone).
constexpr int kProbeRuns = 5;
// Speeds within this fraction of their mean count as equal: a probe's noise must not unbalance
// devices that are alike.
constexpr double kEqualWithin = 0.15;

using Clock = std::chrono::steady_clock;

// This device's copy and reduce speeds (GB/s: bytes copied, input bytes read), measured on a
// stream of its own.
Result<std::pair<double, double>> MeasureDevice(device::Device& device, Deadline deadline) {
  KZ_ASSIGN_OR_RETURN(auto a, device.Allocate(kProbeBytes));
  KZ_ASSIGN_OR_RETURN(auto b, device.Allocate(kProbeBytes));
  KZ_ASSIGN_OR_RETURN(auto out, device.Allocate(kProbeBytes));
  KZ_ASSIGN_OR_RETURN(auto stream, device.CreateStream());
  const size_t count = kProbeBytes / sizeof(float);
  auto median = [&](auto&& enqueue) -> Result<double> {
    std::vector<double> seconds;
    for (int i = 0; i <= kProbeRuns; ++i) {  // run 0 warms up
      const auto t0 = Clock::now();
      KZ_RETURN_IF_ERROR(enqueue());
      KZ_RETURN_IF_ERROR(stream->Synchronize(deadline));
      if (i > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
  };
  KZ_ASSIGN_OR_RETURN(const double copy_s, median([&] { return stream->Copy(out->data(), a->data(), kProbeBytes); }));
  const void* srcs[2] = {a->data(), b->data()};
  KZ_ASSIGN_OR_RETURN(const double reduce_s, median([&] {
                        return stream->Reduce(out->data(), srcs, count, DataType::kFloat32, ReduceOp::kSum);
                      }));
  return std::pair{kProbeBytes / copy_s / 1e9, 2.0 * kProbeBytes / reduce_s / 1e9};
}

// Speeds within kEqualWithin of their mean become the mean.
void EvenOutNoise(std::vector<double>& speeds) {
  double mean = 0;
  for (double s : speeds) mean += s;
  mean /= static_cast<double>(speeds.size());
  if (std::all_of(speeds.begin(), speeds.end(), [&](double s) { return std::abs(s - mean) <= kEqualWithin * mean; }))
    std::fill(speeds.begin(), speeds.end(), mean);
}

}  // namespace

Status Engine::Reweigh(Deadline deadline) {
  if (aggregation_device_) return InvalidArgument("an aggregation device calls no collective, Reweigh included");
  // The exchange is the bootstrap's, whose every rank must take part: an INA job's aggregation
  // devices never call.
  if (bootstrap_->size() != size_)
    return NotSupported(fmt::format("Reweigh: this job's {} aggregation device(s) take part in no call",
                                    bootstrap_->size() - size_));
  std::lock_guard lock(call_mu_);
  KZ_ASSIGN_OR_RETURN(const auto mine, MeasureDevice(*device_, deadline));
  std::vector<double> copy(static_cast<size_t>(size_)), reduce(static_cast<size_t>(size_));
  if (size_ > 1) {
    wire::Bytes bytes;
    wire::PutF64(bytes, mine.first);
    wire::PutF64(bytes, mine.second);
    KZ_ASSIGN_OR_RETURN(auto all, bootstrap_->AllGather(bytes, deadline));
    if (all.size() < static_cast<size_t>(size_))
      return Internal(fmt::format("Reweigh: {} ranks answered, {} expected", all.size(), size_));
    for (size_t r = 0; r < copy.size(); ++r) {
      wire::Reader in(all[r]);
      copy[r] = in.F64();
      reduce[r] = in.F64();
      if (!in.ok() || !(copy[r] > 0) || !(reduce[r] > 0))
        return Internal(fmt::format("Reweigh: rank {} sent no speeds", r));
    }
  } else {
    copy[0] = mine.first;
    reduce[0] = mine.second;
  }
  EvenOutNoise(copy);
  EvenOutNoise(reduce);
  for (size_t r = 0; r < copy.size(); ++r) {
    shape_.ranks[r].copy_gbps = copy[r];
    shape_.ranks[r].reduce_gbps = reduce[r];
  }
  {
    std::lock_guard plans(plans_mu_);
    plans_.clear();
  }
  last_plan_.reset();
  KZ_INFO(kLogTune, "rank {}: re-measured the devices: copy {} GB/s, reduce {} GB/s (by rank); later plans use them",
          rank_, fmt::join(copy, ", "), fmt::join(reduce, ", "));
  return Status::Ok();
}

}  // namespace kizuna::collectives
