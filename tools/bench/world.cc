#include "tools/bench/world.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "runtime/bootstrap/launch_env.h"
#include "runtime/core/deadline.h"
#include "runtime/core/logging.h"
#include "tools/bench/values.h"

namespace kizuna::bench {
namespace {

// Host buffers are page aligned, as applications' large buffers usually are.
constexpr size_t kHostAlignment = 4096;

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

std::string DeviceLine(int rank, const device::Device& d) {
  return fmt::format("  Rank {:2d} Group {:2d} Pid {:6d} on {:>10} device {:2d} [{}] {}", rank, 0,
                     static_cast<int>(getpid()), HostName(), d.properties().index, d.label(), d.properties().name);
}

}  // namespace

// One buffer of a rank: device memory, or host memory from the C allocator.
struct World::Memory {
  std::unique_ptr<device::Buffer> buffer;
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, FreeDeleter> host;
  uint8_t* data = nullptr;
};

struct World::Rank {
  Communicator* comm = nullptr;
  std::unique_ptr<device::Stream> stream;
  Memory send, recv;
  std::unique_ptr<device::Buffer> staging;  // AllocateHost memory, when the CPU cannot reach the buffers
};

Result<std::unique_ptr<World>> World::Create(const WorldOptions& options) {
  if (options.config == nullptr) return InvalidArgument("World::Create: no configuration");
  std::unique_ptr<World> w(new World());
  w->config_ = options.config;
  w->mode_ = options.mode;
  w->buffer_bytes_ = options.buffer_bytes;
  w->registry_ = device::DeviceRegistry::Create(*options.config);

  // The backend's devices, or why there are none.
  device::Backend* backend = w->registry_->Find(options.backend);
  if (backend == nullptr) {
    std::string known;
    for (const device::BackendSlot& slot : w->registry_->backends())
      known += fmt::format(
          "{}{}: {}", known.empty() ? "" : "; ", slot.name,
          slot.status.ok() ? fmt::format("{} device(s)", slot.backend->device_count()) : slot.status.ToString());
    return InvalidArgument(fmt::format("--backend {}: not available (backends: {}){}", options.backend,
                                       known.empty() ? "none" : known,
                                       options.backend == "cuda" ? "; was kizuna built with the CUDA backend?" : ""));
  }
  const int available = backend->device_count();
  if (available < 1) return InvalidArgument(fmt::format("--backend {}: no devices", options.backend));
  if (options.devices < 0 || options.devices > available)
    return InvalidArgument(
        fmt::format("--devices {}: backend {} has {} device(s)", options.devices, options.backend, available));
  const int used = options.devices == 0 ? available : options.devices;
  std::vector<device::Device*> devices;
  for (int i = 0; i < used; ++i) devices.push_back(backend->device(i));

  if (options.host_buffers && !devices[0]->properties().host_accessible)
    return InvalidArgument(fmt::format(
        "--buffers host: {} cannot use host memory from the C allocator (its memory is not host accessible, as "
        "a GPU's); use --buffers device",
        devices[0]->label()));
  w->cpu_access_ = options.host_buffers || devices[0]->properties().host_accessible;

  if (options.mode == Mode::kThreads)
    KZ_RETURN_IF_ERROR(w->CreateThreads(options, std::move(devices)));
  else
    KZ_RETURN_IF_ERROR(w->CreateProcs(options, std::move(devices)));
  return w;
}

World::~World() {
  // Buffers and streams go before the communicators, the communicators before the devices.
  ranks_.clear();
  comms_.clear();
  bootstrap_.reset();
  registry_.reset();
}

std::string World::data_path() const {
  return cpu_access_ ? "written and read directly" : "staged through AllocateHost memory and stream copies";
}

Status World::CreateThreads(const WorldOptions& options, std::vector<device::Device*> devices) {
  const int n = options.ranks == 0 ? static_cast<int>(devices.size()) : options.ranks;
  std::vector<device::Device*> per_rank;
  for (int r = 0; r < n; ++r) per_rank.push_back(devices[static_cast<size_t>(r) % devices.size()]);
  CommOptions copts;
  copts.config = config_;
  KZ_ASSIGN_OR_RETURN(comms_, Communicator::CreateLocal(per_rank, copts));
  nranks_ = n;
  leader_ = true;
  for (auto& comm : comms_) {
    device_lines_.push_back(DeviceLine(comm->rank(), comm->device()));
    // A refused option (host buffers the device cannot take) is the same for every rank.
    Status s = AddRank(options);
    if (!s.ok())
      return s.code() == StatusCode::kInvalidArgument ? s : s.WithContext(fmt::format("rank {}", comm->rank()));
  }
  return Status::Ok();
}

Status World::CreateProcs(const WorldOptions& options, std::vector<device::Device*> devices) {
  KZ_ASSIGN_OR_RETURN(bootstrap::LaunchInfo launch, bootstrap::DetectLaunch(bootstrap::ProcessEnvironment()));
  if (options.ranks != 0 && options.ranks != launch.size)
    return InvalidArgument(
        fmt::format("--ranks {}: the launcher started {} rank(s) ({}); leave --ranks out, or "
                    "match it",
                    options.ranks, launch.size, launch.Describe()));
  device::Device* device = devices[static_cast<size_t>(launch.local_rank) % devices.size()];
  SetLogRank(launch.rank);
  KZ_ASSIGN_OR_RETURN(auto boot, bootstrap::BootstrapFromEnvironment());
  bootstrap_ = std::shared_ptr<bootstrap::Bootstrap>(std::move(boot));
  CommOptions copts;
  copts.config = config_;
  KZ_ASSIGN_OR_RETURN(auto comm, Communicator::Create(bootstrap_, *device, copts));
  nranks_ = comm->size();
  leader_ = comm->rank() == 0;
  comms_.push_back(std::move(comm));
  KZ_RETURN_IF_ERROR(AddRank(options));
  // Every rank's device line, for the leader to print. The communicator is idle, so the bootstrap
  // is free for this (it serves one call at a time).
  const std::string mine = DeviceLine(comms_[0]->rank(), *device);
  KZ_ASSIGN_OR_RETURN(auto lines,
                      bootstrap_->AllGather(std::span(reinterpret_cast<const uint8_t*>(mine.data()), mine.size()),
                                            Deadline::AfterSeconds(config_->timeout_s)));
  for (const auto& line : lines) device_lines_.emplace_back(line.begin(), line.end());
  return Status::Ok();
}

Status World::AddRank(const WorldOptions& options) {
  auto rank = std::make_unique<Rank>();
  rank->comm = comms_[ranks_.size()].get();
  device::Device& d = rank->comm->device();
  KZ_ASSIGN_OR_RETURN(rank->stream, d.CreateStream());
  const uint64_t bytes = options.buffer_bytes;
  for (Memory* m : {&rank->send, &rank->recv}) {
    if (options.host_buffers) {
      const size_t rounded =
          std::max<size_t>(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
      m->host.reset(std::aligned_alloc(kHostAlignment, rounded));
      if (!m->host) return OutOfMemory(fmt::format("--buffers host: {} bytes of host memory", rounded));
      m->data = static_cast<uint8_t*>(m->host.get());
      if (!d.Addressable(m->data, bytes) && !rank->comm->TakesHostMemory())
        return InvalidArgument(
            fmt::format("--buffers host: {} does not take host memory from the C allocator in its operations "
                        "(Device::Addressable is false for it), and neither does the communicator (its ranks are "
                        "not processes of one host sharing memory the CPU reaches); use --buffers device",
                        d.label()));
    } else {
      KZ_ASSIGN_OR_RETURN(m->buffer, d.Allocate(bytes));
      m->data = static_cast<uint8_t*>(m->buffer->data());
    }
  }
  if (!cpu_access_) {
    auto staging = d.AllocateHost(bytes);
    if (!staging.ok())
      return staging.status().WithContext(fmt::format(
          "{}'s memory is not host accessible and host memory for its streams (AllocateHost) failed", d.label()));
    rank->staging = std::move(*staging);
  }
  ranks_.push_back(std::move(rank));
  return Status::Ok();
}

Result<AlgorithmChoice> World::Explain(BenchColl coll, uint64_t count, DataType type, bool balance) const {
  // Every rank predicts the same (the selection is a pure function of what all ranks share).
  KZ_ASSIGN_OR_RETURN(std::string line, comms_[0]->ExplainChoice(EngineCollective(coll), count, type, balance));
  return ParseChoice(line);
}

Status World::Fail(Status status) {
  if (!status.ok() && !failed_) {
    failed_ = true;
    // The peers of this process's ranks would otherwise wait for them until the timeout.
    for (auto& comm : comms_) comm->Abort();
  }
  return status;
}

Status World::IssueOne(Rank& rank, const BenchCall& call) {
  const Geometry& g = call.geometry;
  const int r = rank.comm->rank();
  const int n = nranks_;
  const uint64_t e = g.elem;
  uint8_t* send = rank.send.data;
  uint8_t* recv = rank.recv.data;
  if (call.in_place) {
    send = rank.recv.data + g.send_offset * static_cast<uint64_t>(r) * e;
    recv = rank.recv.data + g.recv_offset * static_cast<uint64_t>(r) * e;
  }
  CallOptions options;
  options.algorithm = call.algorithm;
  options.balance = call.balance;
  Communicator& c = *rank.comm;
  device::Stream& s = *rank.stream;
  switch (call.coll) {
    case BenchColl::kAllReduce:
      return c.AllReduce(send, recv, g.count, call.type, call.op, s, options);
    case BenchColl::kReduceScatter:
      return c.ReduceScatter(send, recv, g.count, call.type, call.op, s, options);
    case BenchColl::kAllGather:
      return c.AllGather(send, recv, g.count, call.type, s, options);
    case BenchColl::kBroadcast:
      return c.Broadcast(send, recv, g.count, call.type, call.root, s, options);
    case BenchColl::kReduce:
      return c.Reduce(send, recv, g.count, call.type, call.op, call.root, s, options);
    case BenchColl::kAllToAll:
      return c.AllToAll(send, recv, g.count, call.type, s, options);
    case BenchColl::kSendRecv:
      KZ_RETURN_IF_ERROR(c.Send(send, g.count, call.type, (r + 1) % n, s));
      return c.Recv(recv, g.count, call.type, (r + n - 1) % n, s);
  }
  return InvalidArgument("unknown collective");
}

Status World::Issue(const BenchCall& call) {
  if (failed_) return Aborted("an earlier call failed");
  // A send and a receive between two ranks must be one group, or they could deadlock. Several
  // ranks driven by this thread are one group too, as nccl-tests does with several GPUs per
  // thread: their calls may then run together on this thread (Executor::TryInlineGroup).
  const bool group = call.coll == BenchColl::kSendRecv || ranks_.size() > 1;
  if (group) KZ_RETURN_IF_ERROR(Fail(Communicator::GroupStart()));
  Status first;
  for (auto& rank : ranks_) {
    Status s = IssueOne(*rank, call);
    if (!s.ok()) {
      first = s.WithContext(fmt::format("rank {}", rank->comm->rank()));
      break;
    }
  }
  // GroupEnd also when a call failed: the group state is per thread and must be unwound.
  if (group) {
    Status s = Communicator::GroupEnd();
    if (first.ok()) first = s;
  }
  if (!first.ok()) {
    // Refused because the communicator failed earlier (an error spreading from another rank):
    // report the rank of this process that holds the cause, when one does.
    int culprit = -1;
    Status cause = RootCause(first, &culprit);
    if (culprit >= 0) first = cause.WithContext(fmt::format("rank {}", culprit));
    return Fail(first);
  }
  return Status::Ok();
}

Status World::RootCause(const Status& s, int* culprit) const {
  if (s.code() != StatusCode::kRemoteError && s.code() != StatusCode::kAborted) return s;
  for (auto& other : ranks_) {
    const Status e = other->comm->AsyncError();
    if (!e.ok() && e.code() != StatusCode::kRemoteError && e.code() != StatusCode::kAborted) {
      *culprit = other->comm->rank();
      return e;
    }
  }
  return s;
}

Status World::SyncAll(std::string_view what) {
  for (auto& rank : ranks_) {
    // An idle stream needs no deadline (a clock read inside the timed region of every call).
    Result<bool> idle = rank->stream->Query();
    Status s =
        idle.ok() && *idle ? Status::Ok() : rank->stream->Synchronize(Deadline::AfterSeconds(config_->timeout_s));
    if (s.ok()) s = rank->comm->AsyncError();
    if (s.ok()) continue;
    // A failure spreads: the other ranks see "remote error" or "aborted". Report the rank of
    // this process whose error is the cause, when one has it already.
    int culprit = rank->comm->rank();
    s = RootCause(s, &culprit);
    return Fail(s.WithContext(fmt::format("{}, rank {}", what, culprit)));
  }
  return Status::Ok();
}

Result<std::vector<double>> World::GatherDoubles(double mine) {
  if (mode_ == Mode::kThreads) return std::vector<double>{mine};
  // The communicator is idle between rows (every stream synchronized), so the bootstrap is free.
  KZ_ASSIGN_OR_RETURN(auto all, bootstrap_->AllGather(std::span(reinterpret_cast<const uint8_t*>(&mine), sizeof mine),
                                                      Deadline::AfterSeconds(config_->timeout_s)));
  std::vector<double> out;
  for (const auto& b : all) {
    if (b.size() != sizeof(double)) return Internal("a rank sent a malformed result");
    double v = 0;
    std::memcpy(&v, b.data(), sizeof v);
    out.push_back(v);
  }
  return out;
}

Status World::Upload(Rank& rank, void* dst, uint64_t bytes, const std::function<void(uint8_t*)>& fill) {
  if (bytes == 0) return Status::Ok();
  if (cpu_access_) {
    fill(static_cast<uint8_t*>(dst));
    return Status::Ok();
  }
  auto* host = static_cast<uint8_t*>(rank.staging->data());
  fill(host);
  // The staging memory is reused at once: wait for the copy.
  KZ_RETURN_IF_ERROR(rank.stream->Copy(dst, host, bytes));
  return rank.stream->Synchronize(Deadline::AfterSeconds(config_->timeout_s));
}

Result<const uint8_t*> World::Download(Rank& rank, const void* src, uint64_t bytes) {
  if (cpu_access_ || bytes == 0) return static_cast<const uint8_t*>(src);
  auto* host = static_cast<uint8_t*>(rank.staging->data());
  KZ_RETURN_IF_ERROR(rank.stream->Copy(host, src, bytes));
  KZ_RETURN_IF_ERROR(rank.stream->Synchronize(Deadline::AfterSeconds(config_->timeout_s)));
  return static_cast<const uint8_t*>(host);
}

Status World::Prime() {
  if (failed_) return Aborted("an earlier call failed");
  // Zero bytes are zero in every type: no NaN, no denormal, whatever the rows' types.
  for (auto& rank : ranks_)
    for (Memory* m : {&rank->send, &rank->recv}) {
      Status s = Upload(*rank, m->data, buffer_bytes_, [&](uint8_t* dst) { std::memset(dst, 0, buffer_bytes_); });
      if (!s.ok()) return Fail(s.WithContext(fmt::format("filling rank {}'s buffers", rank->comm->rank())));
    }
  return Status::Ok();
}

Result<double> World::Time(const BenchCall& call, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) KZ_RETURN_IF_ERROR(Issue(call));
  KZ_RETURN_IF_ERROR(SyncAll("warm-up"));
  // Start together: the other processes may still be in their warm-up.
  KZ_RETURN_IF_ERROR(BarrierAll());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) KZ_RETURN_IF_ERROR(Issue(call));
  KZ_RETURN_IF_ERROR(SyncAll("timed calls"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  KZ_ASSIGN_OR_RETURN(auto all, GatherDoubles(seconds));
  return *std::max_element(all.begin(), all.end());
}

Status World::BarrierAll() {
  if (mode_ != Mode::kProcs) return Status::Ok();
  for (auto& rank : ranks_) {
    Status s = rank->comm->Barrier(*rank->stream);
    if (!s.ok()) return Fail(s);
  }
  return SyncAll("barrier");
}

Result<double> World::TimeEach(const BenchCall& call, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) KZ_RETURN_IF_ERROR(Issue(call));
  KZ_RETURN_IF_ERROR(SyncAll("warm-up"));
  std::vector<double> mine(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    KZ_RETURN_IF_ERROR(BarrierAll());
    const auto start = std::chrono::steady_clock::now();
    KZ_RETURN_IF_ERROR(Issue(call));
    KZ_RETURN_IF_ERROR(SyncAll("timed call"));
    mine[static_cast<size_t>(i)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  KZ_ASSIGN_OR_RETURN(std::vector<double> slowest, MaxOverProcesses(mine));
  std::sort(slowest.begin(), slowest.end());
  const size_t m = slowest.size() / 2;
  return slowest.size() % 2 == 1 ? slowest[m] : (slowest[m - 1] + slowest[m]) / 2;
}

Result<std::vector<double>> World::MaxOverProcesses(const std::vector<double>& mine) {
  if (mode_ == Mode::kThreads) return mine;
  const auto* bytes = reinterpret_cast<const uint8_t*>(mine.data());
  KZ_ASSIGN_OR_RETURN(auto all, bootstrap_->AllGather(std::span(bytes, mine.size() * sizeof(double)),
                                                      Deadline::AfterSeconds(config_->timeout_s)));
  std::vector<double> out = mine;
  for (const auto& b : all) {
    if (b.size() != mine.size() * sizeof(double)) return Internal("a rank sent a malformed list of times");
    for (size_t i = 0; i < out.size(); ++i) {
      double v = 0;
      std::memcpy(&v, b.data() + i * sizeof(double), sizeof v);
      out[i] = std::max(out[i], v);
    }
  }
  return out;
}

Result<uint64_t> World::Check(const BenchCall& call) {
  const Geometry& g = call.geometry;
  const uint64_t e = g.elem;
  const int n = nranks_;
  // Inputs: every rank's own pattern; outputs poisoned first so that unwritten elements count.
  for (auto& rank : ranks_) {
    const int r = rank->comm->rank();
    const Pattern input = InputPattern(call.coll, call.op, call.type, n, r);
    Status s;
    if (!call.in_place) {
      s = Upload(*rank, rank->send.data, g.send_count * e, [&](uint8_t* dst) { input.Write(dst, 0, g.send_count); });
      if (s.ok())
        s = Upload(*rank, rank->recv.data, g.recv_count * e,
                   [&](uint8_t* dst) { std::memset(dst, kPoisonByte, g.recv_count * e); });
    } else {
      const uint64_t total = g.in_place_recv_count(r);
      s = Upload(*rank, rank->recv.data, total * e, [&](uint8_t* dst) {
        std::memset(dst, kPoisonByte, total * e);
        input.Write(dst + g.send_offset * static_cast<uint64_t>(r) * e, 0, g.send_count);
      });
    }
    if (!s.ok()) return Fail(s.WithContext(fmt::format("writing rank {}'s inputs", r)));
  }
  KZ_RETURN_IF_ERROR(Issue(call));
  KZ_RETURN_IF_ERROR(SyncAll("checked call"));

  // What every output must hold.
  std::optional<Pattern> reduced;
  std::vector<Pattern> inputs;
  if (IsReduction(call.coll)) {
    reduced.emplace(ReducedPattern(call.op, call.type, n));
  } else {
    for (int q = 0; q < n; ++q) inputs.push_back(InputPattern(call.coll, call.op, call.type, n, q));
  }
  const double tolerance = OutputTolerance(call.op, call.type);
  uint64_t wrong = 0;
  for (auto& rank : ranks_) {
    const int r = rank->comm->rank();
    const uint64_t ur = static_cast<uint64_t>(r);
    if (call.coll == BenchColl::kReduce && r != call.root) continue;  // only the root's output is defined
    const uint8_t* out = rank->recv.data + (call.in_place ? g.recv_offset * ur * e : 0);
    auto host = Download(*rank, out, g.recv_count * e);
    if (!host.ok()) return Fail(host.status().WithContext(fmt::format("reading rank {}'s output", r)));
    const uint8_t* h = *host;
    const uint64_t c = g.count;
    switch (call.coll) {
      case BenchColl::kAllReduce:
      case BenchColl::kReduce:
        wrong += reduced->CountWrong(h, 0, c, tolerance);
        break;
      case BenchColl::kReduceScatter:
        wrong += reduced->CountWrong(h, ur * c, c, tolerance);
        break;
      case BenchColl::kAllGather:
        for (int q = 0; q < n; ++q)
          wrong += inputs[static_cast<size_t>(q)].CountWrong(h + static_cast<uint64_t>(q) * c * e, 0, c, 0);
        break;
      case BenchColl::kAllToAll:
        for (int q = 0; q < n; ++q)
          wrong += inputs[static_cast<size_t>(q)].CountWrong(h + static_cast<uint64_t>(q) * c * e, ur * c, c, 0);
        break;
      case BenchColl::kBroadcast:
        wrong += inputs[static_cast<size_t>(call.root)].CountWrong(h, 0, c, 0);
        break;
      case BenchColl::kSendRecv:
        wrong += inputs[static_cast<size_t>((r + n - 1) % n)].CountWrong(h, 0, c, 0);
        break;
    }
  }
  KZ_ASSIGN_OR_RETURN(auto all, GatherDoubles(static_cast<double>(wrong)));
  double total = 0;
  for (double v : all) total += v;
  return static_cast<uint64_t>(total);
}

}  // namespace kizuna::bench
