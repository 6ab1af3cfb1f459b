// The public C++ API's calls (communicator.h): each validates its arguments (nothing is enqueued
// on bad input) and hands the engine one call (collectives/engine.h); groups collect calls per
// thread until GroupEnd. Creation is in communicator_create.cc.
#include "runtime/communicator.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/bootstrap/sub_bootstrap.h"
#include "runtime/core/logging.h"
#include "runtime/host_range.h"

namespace kizuna {

using collectives::Collective;
using collectives::CollectiveRequest;

namespace {

// Tags of split bootstraps: above everything the parent bootstrap's users pick by hand.
constexpr uint32_t kSplitTagBase = 1u << 24;
constexpr uint32_t kSplitTagStride = 1u << 17;

}  // namespace

// The calling thread's group (GroupStart / GroupEnd).
struct GroupState {
  int depth = 0;
  std::vector<std::pair<Communicator*, collectives::EngineCall>> calls;
};
namespace {
thread_local GroupState g_group;
}  // namespace

// ---------------------------------------------------------------------------------------------
// Calls and groups

Status Communicator::Enqueue(collectives::EngineCall call) {
  if (engine_->aggregation_device())
    return InvalidArgument(fmt::format("rank {} is an aggregation device of the INA layout: it serves the workers' "
                                       "operations (ServeAggregation) and calls none",
                                       rank()));
  if (g_group.depth > 0) {
    g_group.calls.emplace_back(this, std::move(call));
    return Status::Ok();
  }
  // Every rank makes the same calls in the same order: the N-th is the same call everywhere.
  if (auto_reweigh_ && ++calls_ % static_cast<uint64_t>(config_->reweigh_calls) == 0) KZ_RETURN_IF_ERROR(Reweigh());
  return engine_->Launch(std::span(&call, 1));
}

Status Communicator::Reweigh() {
  return engine_->Reweigh(Deadline::AfterSeconds(config_->timeout_s))
      .WithContext(fmt::format("rank {}: re-measuring the devices", rank()));
}

Status Communicator::GroupStart() {
  ++g_group.depth;
  return Status::Ok();
}

Status Communicator::GroupEnd() {
  if (g_group.depth == 0) return InvalidArgument("GroupEnd without GroupStart");
  if (--g_group.depth > 0) return Status::Ok();
  auto calls = std::move(g_group.calls);
  g_group.calls.clear();
  // Per communicator, in the order each first appeared.
  std::vector<Communicator*> order;
  std::map<Communicator*, std::vector<collectives::EngineCall>> by_comm;
  for (auto& [comm, call] : calls) {
    if (!by_comm.count(comm)) order.push_back(comm);
    by_comm[comm].push_back(std::move(call));
  }
  // One thread driving every rank of an in-process group: it may run them all itself.
  if (order.size() > 1) {
    std::vector<collectives::Engine*> engines;
    std::vector<std::vector<collectives::EngineCall>*> engine_calls;
    for (Communicator* comm : order) {
      engines.push_back(comm->engine_.get());
      engine_calls.push_back(&by_comm[comm]);
    }
    KZ_ASSIGN_OR_RETURN(const bool ran, collectives::Engine::LaunchTogether(engines, engine_calls));
    if (ran) return Status::Ok();
  }
  Status first;
  for (Communicator* comm : order) {
    Status s = comm->engine_->Launch(by_comm[comm]);
    if (!s.ok() && first.ok()) first = s.WithContext(fmt::format("GroupEnd, communicator rank {}", comm->rank()));
  }
  return first;
}

namespace {

Status CheckCommon(const Communicator& comm, std::string_view what, DataType type, device::Stream& stream) {
  if (!IsValid(type))
    return InvalidArgument(fmt::format("{}: data type {} is not one of kizuna's", what, static_cast<int>(type)));
  if (&stream.device() != &comm.device())
    return InvalidArgument(fmt::format("{}: the stream belongs to {}, the communicator to {}", what,
                                       stream.device().label(), comm.device().label()));
  return Status::Ok();
}

Status CheckBuffer(const Communicator& comm, std::string_view what, std::string_view name, const void* p,
                   uint64_t count, DataType type) {
  if (count == 0) return Status::Ok();
  const size_t elem = DataTypeSize(type);
  if (count > SIZE_MAX / elem) return InvalidArgument(fmt::format("{}: {} elements overflow", what, count));
  if (p == nullptr) return InvalidArgument(fmt::format("{}: {} is null with {} elements", what, name, count));
  if (comm.device().Addressable(p, count * elem)) return Status::Ok();
  if (!comm.TakesHostMemory())
    return InvalidArgument(fmt::format("{}: {} [{}, +{} bytes) is not memory of {} (plain host memory is taken only "
                                       "by communicators of one rank per process on one host whose devices the CPU "
                                       "reaches)",
                                       what, name, p, count * elem, comm.device().label()));
  // Plain host memory: no allocation vouches for it, the process's mappings must.
  return CheckHostRange(p, count * elem, /*written=*/name != "send", fmt::format("{}: {}", what, name));
}

// In place exactly as the table in collectives/plan/plan.h says, or no overlap at all.
Result<bool> InPlace(std::string_view what, const void* send, uint64_t send_bytes, const void* recv,
                     uint64_t recv_bytes, const void* in_place_send) {
  if (send_bytes == 0 || recv_bytes == 0 || send == nullptr || recv == nullptr) return send == in_place_send && send;
  if (send == in_place_send) return true;
  const auto* s = static_cast<const uint8_t*>(send);
  const auto* r = static_cast<const uint8_t*>(recv);
  if (s < r + recv_bytes && r < s + send_bytes)
    return InvalidArgument(fmt::format("{}: send and receive buffers overlap without being the in-place "
                                       "arrangement",
                                       what));
  return false;
}

collectives::EngineCall MakeCall(const CollectiveRequest& request, const void* input, void* output,
                                 device::Stream& stream, const CallOptions& options) {
  return {request, input, output, &stream, options.algorithm, options.balance};
}

}  // namespace

#define KZ_CALL_PROLOGUE(name)                         \
  constexpr std::string_view what = name;              \
  KZ_RETURN_IF_ERROR(CheckCommon(*this, what, type, stream))

Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                               device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("AllReduce");
  if (!IsValid(op)) return InvalidArgument(fmt::format("{}: reduction op {} is invalid", what, static_cast<int>(op)));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  const size_t bytes = count * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, bytes, recv, bytes, recv));
  return Enqueue(MakeCall({Collective::kAllReduce, size(), count, type, op, 0, in_place}, send, recv, stream, options));
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t recvcount, DataType type, ReduceOp op,
                                   device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("ReduceScatter");
  if (!IsValid(op)) return InvalidArgument(fmt::format("{}: reduction op {} is invalid", what, static_cast<int>(op)));
  if (recvcount > SIZE_MAX / static_cast<size_t>(size()))
    return InvalidArgument(fmt::format("{}: recvcount {} x {} ranks overflows", what, recvcount, size()));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, recvcount * static_cast<size_t>(size()), type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, recvcount, type));
  const size_t elem = DataTypeSize(type);
  const void* in_place_send = static_cast<const uint8_t*>(recv) - static_cast<size_t>(rank()) * recvcount * elem;
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, recvcount * elem * static_cast<size_t>(size()), recv,
                                             recvcount * elem, in_place_send));
  return Enqueue(
      MakeCall({Collective::kReduceScatter, size(), recvcount, type, op, 0, in_place}, send, recv, stream, options));
}

Status Communicator::AllGather(const void* send, void* recv, size_t sendcount, DataType type, device::Stream& stream,
                               const CallOptions& options) {
  KZ_CALL_PROLOGUE("AllGather");
  if (sendcount > SIZE_MAX / static_cast<size_t>(size()))
    return InvalidArgument(fmt::format("{}: sendcount {} x {} ranks overflows", what, sendcount, size()));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, sendcount, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, sendcount * static_cast<size_t>(size()), type));
  const size_t elem = DataTypeSize(type);
  const void* in_place_send = static_cast<const uint8_t*>(recv) + static_cast<size_t>(rank()) * sendcount * elem;
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, sendcount * elem, recv,
                                             sendcount * elem * static_cast<size_t>(size()), in_place_send));
  return Enqueue(MakeCall({Collective::kAllGather, size(), sendcount, type, ReduceOp::kSum, 0, in_place}, send, recv,
                          stream, options));
}

Status Communicator::Broadcast(const void* send, void* recv, size_t count, DataType type, int root,
                               device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("Broadcast");
  if (root < 0 || root >= size()) return InvalidArgument(fmt::format("{}: root {} of {} ranks", what, root, size()));
  if (rank() == root) KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  const size_t bytes = count * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, rank() == root ? send : nullptr, bytes, recv, bytes, recv));
  return Enqueue(
      MakeCall({Collective::kBroadcast, size(), count, type, ReduceOp::kSum, root, in_place || rank() != root},
               rank() == root ? send : recv, recv, stream, options));
}

Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op, int root,
                            device::Stream& stream, const CallOptions& options) {
  KZ_CALL_PROLOGUE("Reduce");
  if (!IsValid(op)) return InvalidArgument(fmt::format("{}: reduction op {} is invalid", what, static_cast<int>(op)));
  if (root < 0 || root >= size()) return InvalidArgument(fmt::format("{}: root {} of {} ranks", what, root, size()));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  if (rank() == root) KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  const size_t bytes = count * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, bytes, rank() == root ? recv : nullptr, bytes, recv));
  return Enqueue(MakeCall({Collective::kReduce, size(), count, type, op, root, in_place}, send, recv, stream, options));
}

Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType type, device::Stream& stream,
                              const CallOptions& options) {
  KZ_CALL_PROLOGUE("AllToAll");
  if (count > SIZE_MAX / static_cast<size_t>(size()))
    return InvalidArgument(fmt::format("{}: count {} x {} ranks overflows", what, count, size()));
  const size_t n = count * static_cast<size_t>(size());
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, n, type));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, n, type));
  const size_t bytes = n * DataTypeSize(type);
  KZ_ASSIGN_OR_RETURN(bool in_place, InPlace(what, send, bytes, recv, bytes, nullptr));
  if (in_place && n > 0) return InvalidArgument(fmt::format("{}: in place is not supported", what));
  return Enqueue(
      MakeCall({Collective::kAllToAll, size(), count, type, ReduceOp::kSum, 0, false}, send, recv, stream, options));
}

Status Communicator::Send(const void* send, size_t count, DataType type, int peer, device::Stream& stream) {
  KZ_CALL_PROLOGUE("Send");
  if (peer < 0 || peer >= size()) return InvalidArgument(fmt::format("{}: peer {} of {} ranks", what, peer, size()));
  if (peer == rank()) return NotSupported(fmt::format("{}: a send to the rank itself (rank {})", what, rank()));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "send", send, count, type));
  return Enqueue(
      MakeCall({Collective::kSend, size(), count, type, ReduceOp::kSum, peer, false}, send, nullptr, stream, {}));
}

Status Communicator::Recv(void* recv, size_t count, DataType type, int peer, device::Stream& stream) {
  KZ_CALL_PROLOGUE("Recv");
  if (peer < 0 || peer >= size()) return InvalidArgument(fmt::format("{}: peer {} of {} ranks", what, peer, size()));
  if (peer == rank()) return NotSupported(fmt::format("{}: a receive from the rank itself (rank {})", what, rank()));
  KZ_RETURN_IF_ERROR(CheckBuffer(*this, what, "recv", recv, count, type));
  return Enqueue(
      MakeCall({Collective::kRecv, size(), count, type, ReduceOp::kSum, peer, false}, nullptr, recv, stream, {}));
}

Status Communicator::Barrier(device::Stream& stream) {
  const DataType type = DataType::kUint8;
  KZ_CALL_PROLOGUE("Barrier");
  return Enqueue(
      MakeCall({Collective::kBarrier, size(), 0, type, ReduceOp::kSum, 0, false}, nullptr, nullptr, stream, {}));
}

#undef KZ_CALL_PROLOGUE

// ---------------------------------------------------------------------------------------------
// Split, abort, errors, the engine's answers

Result<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  if (color < kSplitNoColor)
    return InvalidArgument(fmt::format("Split: color {} (a color is >= 0, or kSplitNoColor)", color));
  const Deadline deadline = Deadline::AfterSeconds(config_->timeout_s);
  const uint32_t tag_base = kSplitTagBase + splits_++ * kSplitTagStride;
  int32_t mine[2] = {color, key};
  KZ_ASSIGN_OR_RETURN(auto all,
                      bootstrap_->AllGather(std::span(reinterpret_cast<const uint8_t*>(mine), sizeof mine), deadline));
  if (color == kSplitNoColor) return std::unique_ptr<Communicator>();
  std::vector<std::tuple<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < size(); ++r) {
    int32_t theirs[2];
    if (all[static_cast<size_t>(r)].size() != sizeof theirs)
      return Internal(fmt::format("Split: rank {} sent a malformed color", r));
    std::memcpy(theirs, all[static_cast<size_t>(r)].data(), sizeof theirs);
    if (theirs[0] == color) members.emplace_back(theirs[1], r);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (auto& [k, r] : members) ranks.push_back(r);
  KZ_ASSIGN_OR_RETURN(auto sub, bootstrap::CreateSubBootstrap(bootstrap_, ranks, tag_base));
  return Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(sub)), *device_, options_);
}

Result<std::unique_ptr<Communicator>> Communicator::Shrink(std::span<const int> exclude, ShrinkMode mode) {
  std::vector<int> excluded(exclude.begin(), exclude.end());
  std::sort(excluded.begin(), excluded.end());
  for (size_t i = 0; i < excluded.size(); ++i) {
    if (excluded[i] < 0 || excluded[i] >= size())
      return InvalidArgument(fmt::format("Shrink: excluded rank {} is not a rank (size {})", excluded[i], size()));
    if (i > 0 && excluded[i] == excluded[i - 1])
      return InvalidArgument(fmt::format("Shrink: rank {} is excluded twice", excluded[i]));
  }
  if (std::binary_search(excluded.begin(), excluded.end(), rank()))
    return InvalidArgument(
        fmt::format("Shrink: rank {} excludes itself; only the ranks that stay call Shrink", rank()));
  if (mode == ShrinkMode::kDefault && engine_->InFlight() > 0)
    return InvalidArgument(
        fmt::format("Shrink: {} operations are still in flight on rank {}; wait for them, or "
                    "pass ShrinkMode::kAbort to revoke them",
                    engine_->InFlight(), rank()));
  if (mode == ShrinkMode::kAbort) Revoke();
  // The survivors' bootstrap is made of the parent's point-to-point messages between them, which
  // need neither the excluded ranks nor the parent's root (it may be among the lost).
  const uint32_t tag_base = kSplitTagBase + splits_++ * kSplitTagStride;
  std::vector<int> members;
  for (int r = 0; r < size(); ++r)
    if (!std::binary_search(excluded.begin(), excluded.end(), r)) members.push_back(r);
  KZ_ASSIGN_OR_RETURN(auto sub, bootstrap::CreateSubBootstrap(bootstrap_, members, tag_base));
  // Every survivor must exclude the same ranks: a rank that excluded fewer would wait for one
  // that is gone, or form a communicator of another size.
  const Deadline deadline = Deadline::AfterSeconds(config_->timeout_s);
  auto all = sub->AllGather(std::span(reinterpret_cast<const uint8_t*>(excluded.data()), excluded.size() * sizeof(int)),
                            deadline);
  if (!all.ok()) return all.status().WithContext("Shrink: agreeing on the excluded ranks");
  auto text = [](std::span<const int> ranks) {
    return ranks.empty() ? std::string("none") : fmt::format("{}", fmt::join(ranks, ", "));
  };
  for (size_t i = 0; i < all->size(); ++i) {
    const bootstrap::Bytes& theirs = (*all)[i];
    std::vector<int> other(theirs.size() / sizeof(int));
    std::memcpy(other.data(), theirs.data(), other.size() * sizeof(int));
    if (other != excluded)
      return InvalidArgument(
          fmt::format("Shrink: rank {} excludes {} and rank {} excludes {}: every remaining rank "
                      "must exclude the same ranks",
                      rank(), text(excluded), members[i], text(other)));
  }
  KZ_INFO(kLogInit, "rank {}: shrinking {} ranks to {} (excluded: {})", rank(), size(), members.size(), text(excluded));
  return Init(std::shared_ptr<bootstrap::Bootstrap>(std::move(sub)), *device_, options_);
}

void Communicator::Revoke() { engine_->Abort("revoked (Communicator::Revoke)"); }

void Communicator::Abort() { engine_->Abort("Communicator::Abort"); }

Status Communicator::AsyncError() const { return engine_->AsyncError(); }

int Communicator::InFlight() const { return engine_->InFlight(); }

bool Communicator::TakesHostMemory() const { return engine_->TakesHostMemory(); }

Result<uint64_t> Communicator::Register(const void* buffer, size_t bytes) {
  if (buffer == nullptr) return InvalidArgument("Register: buffer is null");
  if (bytes == 0) return InvalidArgument("Register: size 0");
  // Registered as host memory: where the CPU does not reach the device's memory (a GPU's), the
  // fabrics would need its exported form (fd, DMA-BUF), which registration does not take yet.
  if (!device_->properties().host_accessible)
    return NotSupported(fmt::format("Register: {}'s memory is not host-accessible; registering it is not "
                                    "supported yet",
                                    device_->label()));
  return engine_->Register(buffer, bytes);
}

Status Communicator::Deregister(uint64_t handle) { return engine_->Deregister(handle); }

uint64_t Communicator::registered_transfers() const { return engine_->registered_transfers(); }

std::string Communicator::FlightRecord() const { return engine_->FlightRecord(); }

std::string Communicator::DescribeConnections() const { return engine_->DescribeConnections(); }

std::vector<int> Communicator::ConnectedPeers() const { return engine_->ConnectedPeers(); }

Status Communicator::ServeAggregation(uint64_t* served) { return engine_->ServeAggregation(served); }

Result<std::string> Communicator::ExplainChoice(Collective collective, size_t count, DataType type) const {
  return engine_->ExplainChoice(collective, count, type);
}

Result<std::string> Communicator::ExplainChoice(Collective collective, size_t count, DataType type,
                                                bool balance) const {
  return engine_->ExplainChoice(collective, count, type, balance);
}

std::string Communicator::FabricOf(int peer) const { return engine_->FabricOf(peer); }

collectives::Prediction Communicator::PredictWith(Collective collective, size_t count, DataType type,
                                                  collectives::Algorithm algorithm,
                                                  const collectives::CostConstants& constants) const {
  return engine_->PredictWith(collective, count, type, algorithm, constants);
}

}  // namespace kizuna
