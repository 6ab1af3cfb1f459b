#include "tools/crosscheck/runner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "devices/host_emulated/backend.h"
#include "runtime/core/deadline.h"
#include "tools/crosscheck/rng.h"

namespace kizuna::crosscheck {
namespace {

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xa5;
constexpr uint8_t kFillByte = 0xee;  // an output not written yet
constexpr uint64_t kMessageSalt = 0x4d5347ull;
// Moving a case's bytes in and out of device memory.
constexpr double kCopySeconds = 60;
// After a run's deadline, how long the calls get to return once the communicators are aborted.
constexpr double kAbortSeconds = 30;
constexpr int kExamples = 3;  // wrong elements named per failure

std::string RunName(const Case& c, size_t run) {
  const Run& r = c.runs[run];
  return fmt::format("run {} ({}{})", run,
                     r.algorithm ? std::string(collectives::AlgorithmName(*r.algorithm)) : std::string("auto"),
                     r.host_memory ? ", host memory" : "");
}

// Memory of one rank: on its device, or plain host memory.
class Region {
 public:
  static Result<Region> Make(RankHandle& h, size_t bytes, bool host) {
    Region r;
    r.bytes_ = bytes;
    if (host) {
      r.host_ = std::make_unique<uint8_t[]>(bytes);
      return r;
    }
    KZ_ASSIGN_OR_RETURN(r.device_, h.stream->device().Allocate(bytes));
    return r;
  }

  uint8_t* data() const { return host_ != nullptr ? host_.get() : static_cast<uint8_t*>(device_->data()); }
  size_t size() const { return bytes_; }

  Status Write(RankHandle& h, const std::vector<uint8_t>& content) {
    if (Direct(h)) {
      std::memcpy(data(), content.data(), bytes_);
      return Status::Ok();
    }
    KZ_RETURN_IF_ERROR(Reach(h));
    std::memcpy(h.bounce->data(), content.data(), bytes_);
    KZ_RETURN_IF_ERROR(h.stream->Copy(data(), h.bounce->data(), bytes_));
    return h.stream->Synchronize(Deadline::AfterSeconds(kCopySeconds));
  }

  Status Read(RankHandle& h, std::vector<uint8_t>* out) {
    out->resize(bytes_);
    if (Direct(h)) {
      std::memcpy(out->data(), data(), bytes_);
      return Status::Ok();
    }
    KZ_RETURN_IF_ERROR(Reach(h));
    KZ_RETURN_IF_ERROR(h.stream->Copy(h.bounce->data(), data(), bytes_));
    KZ_RETURN_IF_ERROR(h.stream->Synchronize(Deadline::AfterSeconds(kCopySeconds)));
    std::memcpy(out->data(), h.bounce->data(), bytes_);
    return Status::Ok();
  }

 private:
  bool Direct(RankHandle& h) const { return host_ != nullptr || h.stream->device().properties().host_accessible; }
  // Host memory from the device, as large as this region, for stream copies.
  Status Reach(RankHandle& h) const {
    if (h.bounce != nullptr && h.bounce->size() >= bytes_) return Status::Ok();
    h.bounce.reset();
    KZ_ASSIGN_OR_RETURN(h.bounce, h.stream->device().AllocateHost(bytes_));
    return Status::Ok();
  }

  size_t bytes_ = 0;
  std::unique_ptr<uint8_t[]> host_;
  std::unique_ptr<device::Buffer> device_;
};

// One collective call's buffers on a rank: `a` holds the input, and in place the output too; `b`
// the output. Each is [guard | offset | buffer | guard].
struct CollectiveBuffers {
  std::optional<Region> a, b;
  std::vector<uint8_t> a_init, b_init;
  size_t front = kGuard;  // the guard and the offset before each buffer
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
};

// A rank's buffers for one run: one set per collective call of the burst, and one region per
// point-to-point call of its segments, in order.
struct RankBuffers {
  std::vector<CollectiveBuffers> coll;
  std::vector<Region> p2p;
  std::vector<std::vector<uint8_t>> p2p_init;
};

// What a case's ranks put in: every rank's collective input and every message's bytes.
struct CaseInputs {
  std::vector<std::vector<uint8_t>> input;    // per rank
  std::vector<std::vector<uint8_t>> message;  // per message
};

Status PrepareCollective(RankHandle& h, const Case& c, const Run& run, int n, const CaseInputs& in,
                         CollectiveBuffers* b) {
  const int r = h.rank;
  const size_t elem = DataTypeSize(c.type);
  const size_t in_bytes = InputCount(c.collective, n, c.count) * elem;
  const size_t out_bytes = OutputCount(c.collective, n, c.count) * elem;
  const size_t block = c.count * elem;
  b->front = kGuard + c.offset * elem;
  auto frame = [&](size_t body, uint8_t fill) {
    std::vector<uint8_t> v(b->front + body + kGuard, kGuardByte);
    std::fill(v.begin() + static_cast<ptrdiff_t>(b->front), v.begin() + static_cast<ptrdiff_t>(b->front + body), fill);
    return v;
  };
  const std::vector<uint8_t>& mine = in.input[static_cast<size_t>(r)];
  if (c.collective != Collective::kBarrier) {
    if (!c.in_place) {
      b->a_init = frame(in_bytes, 0);
      std::copy(mine.begin(), mine.end(), b->a_init.begin() + static_cast<ptrdiff_t>(b->front));
      b->b_init = frame(out_bytes, kFillByte);
    } else if (c.collective == Collective::kAllGather) {
      b->a_init = frame(out_bytes, kFillByte);
      std::copy(mine.begin(), mine.end(), b->a_init.begin() + static_cast<ptrdiff_t>(b->front + r * block));
    } else {
      b->a_init = frame(in_bytes, 0);
      std::copy(mine.begin(), mine.end(), b->a_init.begin() + static_cast<ptrdiff_t>(b->front));
    }
    KZ_ASSIGN_OR_RETURN(Region a, Region::Make(h, b->a_init.size(), run.host_memory));
    b->a.emplace(std::move(a));
    KZ_RETURN_IF_ERROR(b->a->Write(h, b->a_init));
    uint8_t* base = b->a->data() + b->front;
    if (!c.in_place) {
      KZ_ASSIGN_OR_RETURN(Region out, Region::Make(h, b->b_init.size(), run.host_memory));
      b->b.emplace(std::move(out));
      KZ_RETURN_IF_ERROR(b->b->Write(h, b->b_init));
      b->send = base;
      b->recv = b->b->data() + b->front;
    } else if (c.collective == Collective::kAllGather) {
      b->recv = base;
      b->send = base + r * block;
    } else if (c.collective == Collective::kReduceScatter) {
      b->send = base;
      b->recv = base + r * block;
    } else {
      b->send = b->recv = base;
    }
  }
  return Status::Ok();
}

Status Prepare(RankHandle& h, const Case& c, const Run& run, int n, const CaseInputs& in, RankBuffers* b) {
  const int r = h.rank;
  b->coll.resize(static_cast<size_t>(c.burst));
  for (CollectiveBuffers& cb : b->coll) KZ_RETURN_IF_ERROR(PrepareCollective(h, c, run, n, in, &cb));
  for (const Segment& seg : c.segments.empty() ? std::vector<Segment>() : c.segments[static_cast<size_t>(r)]) {
    for (const P2pCall& call : seg.calls) {
      const Message& m = c.messages[static_cast<size_t>(call.message)];
      const size_t bytes = m.count * DataTypeSize(m.type);
      std::vector<uint8_t> init(kGuard + bytes + kGuard, kGuardByte);
      if (call.send) {
        const std::vector<uint8_t>& payload = in.message[static_cast<size_t>(call.message)];
        std::copy(payload.begin(), payload.end(), init.begin() + kGuard);
      } else {
        std::fill(init.begin() + kGuard, init.begin() + static_cast<ptrdiff_t>(kGuard + bytes), kFillByte);
      }
      KZ_ASSIGN_OR_RETURN(Region region, Region::Make(h, init.size(), false));
      KZ_RETURN_IF_ERROR(region.Write(h, init));
      b->p2p.push_back(std::move(region));
      b->p2p_init.push_back(std::move(init));
    }
  }
  return Status::Ok();
}

Status IssueCollective(RankHandle& h, const Case& c, const CollectiveBuffers& b, const CallOptions& options) {
  Communicator& comm = *h.comm;
  device::Stream& s = *h.stream;
  switch (c.collective) {
    case Collective::kAllReduce: return comm.AllReduce(b.send, b.recv, c.count, c.type, c.op, s, options);
    case Collective::kReduceScatter: return comm.ReduceScatter(b.send, b.recv, c.count, c.type, c.op, s, options);
    case Collective::kAllGather: return comm.AllGather(b.send, b.recv, c.count, c.type, s, options);
    case Collective::kBroadcast: return comm.Broadcast(b.send, b.recv, c.count, c.type, c.root, s, options);
    case Collective::kReduce: return comm.Reduce(b.send, b.recv, c.count, c.type, c.op, c.root, s, options);
    case Collective::kAllToAll: return comm.AllToAll(b.send, b.recv, c.count, c.type, s, options);
    default: return comm.Barrier(s);
  }
}

// A rank's calls of one run: its point-to-point segments, then the collective. The first error;
// every group opened is closed.
Status Issue(RankHandle& h, const Case& c, const RankBuffers& b, const Run& run) {
  Status first;
  auto keep = [&first](Status s) {
    if (!s.ok() && first.ok()) first = std::move(s);
  };
  size_t k = 0;
  if (!c.segments.empty()) {
    for (const Segment& seg : c.segments[static_cast<size_t>(h.rank)]) {
      if (seg.grouped) keep(Communicator::GroupStart());
      for (const P2pCall& call : seg.calls) {
        const Message& m = c.messages[static_cast<size_t>(call.message)];
        uint8_t* p = b.p2p[k++].data() + kGuard;
        keep(call.send ? h.comm->Send(p, m.count, m.type, m.to, *h.stream)
                       : h.comm->Recv(p, m.count, m.type, m.from, *h.stream));
      }
      if (seg.grouped) keep(Communicator::GroupEnd());
    }
  }
  CallOptions options;
  options.algorithm = run.algorithm;
  // Host memory runs each call on the calling thread as it is made: never in a group.
  const bool grouped = c.burst_grouped && !run.host_memory;
  if (grouped) keep(Communicator::GroupStart());
  for (const CollectiveBuffers& cb : b.coll) keep(IssueCollective(h, c, cb, options));
  if (grouped) keep(Communicator::GroupEnd());
  return first;
}

// Work on its own thread, waited for with a deadline. A thread that never finishes is left
// behind (detached): the caller must then end the process, as the work still uses its objects.
class Watched {
 public:
  explicit Watched(std::function<void()> work) : state_(std::make_shared<State>()) {
    thread_ = std::thread([s = state_, work = std::move(work)] {
      work();
      std::lock_guard<std::mutex> lock(s->mu);
      s->done = true;
      s->cv.notify_all();
    });
  }
  ~Watched() {
    if (thread_.joinable()) thread_.detach();
  }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

  bool Wait(double seconds) {
    std::unique_lock<std::mutex> lock(state_->mu);
    const bool done = state_->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return state_->done; });
    lock.unlock();
    if (done && thread_.joinable()) thread_.join();
    return done;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// Every local rank's calls of one run, as the world's mode drives them, then each stream waited
// for and each communicator's error read. The statuses, per local rank.
void Execute(const Case& c, const Run& run, const std::vector<RankHandle*>& local, std::vector<RankBuffers>& buffers,
             double timeout_s, std::vector<Status>* status) {
  auto finish = [&](size_t i) {
    Status& s = (*status)[i];
    if (s.ok()) s = local[i]->stream->Synchronize(Deadline::AfterSeconds(timeout_s));
    if (s.ok()) s = local[i]->comm->AsyncError();
  };
  if (c.world.mode == Mode::kOneThread) {
    Status group;
    if (c.one_group) group = Communicator::GroupStart();
    for (size_t i = 0; i < local.size(); ++i) (*status)[i] = Issue(*local[i], c, buffers[i], run);
    if (c.one_group) {
      Status end = Communicator::GroupEnd();
      if (group.ok()) group = end;
    }
    bool failed = !group.ok();
    for (size_t i = 0; i < local.size(); ++i) {
      if ((*status)[i].ok()) (*status)[i] = group;
      failed = failed || !(*status)[i].ok();
    }
    // A rank that could not issue its calls leaves the others waiting: abort them all.
    if (failed)
      for (RankHandle* h : local) h->comm->Abort();
    for (size_t i = 0; i < local.size(); ++i) finish(i);
    return;
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < local.size(); ++i) {
    threads.emplace_back([&, i] {
      (*status)[i] = Issue(*local[i], c, buffers[i], run);
      if (!(*status)[i].ok()) local[i]->comm->Abort();  // tells the peers, which fail at once
      finish(i);
    });
  }
  for (std::thread& t : threads) t.join();
}

// The index of the first element where a and b differ (elements of `elem` bytes), or -1.
int64_t FirstDifference(const uint8_t* a, const uint8_t* b, size_t bytes, size_t elem) {
  for (size_t i = 0; i < bytes; ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i / elem);
  return -1;
}

// Checks a rank's regions after a run: guards, an unchanged input, the output of every call of
// the burst against the reference, what point-to-point calls sent and received. Returns the first
// call's output bytes (empty where the rank has no output to compare).
std::vector<uint8_t> CheckRank(RankHandle& h, const Case& c, int n, const CaseInputs& in, RankBuffers& b,
                               const std::string& run_name, std::vector<std::string>* failures) {
  const int r = h.rank;
  const size_t elem = DataTypeSize(c.type);
  const size_t block = c.count * elem;
  const std::string who = fmt::format("{}: rank {}", run_name, r);
  std::string prefix;  // which call of a burst
  auto fail = [&](std::string what) { failures->push_back(fmt::format("{}: {}{}", who, prefix, what)); };
  auto guards = [&](const std::vector<uint8_t>& got, const std::vector<uint8_t>& init, size_t front, const char* name) {
    const size_t body_end = got.size() - kGuard;
    for (size_t i = 0; i < front; ++i)
      if (got[i] != init[i])
        return fail(fmt::format("the guard before the {} was written (byte {} of {})", name, i, front));
    for (size_t i = body_end; i < got.size(); ++i)
      if (got[i] != init[i])
        return fail(fmt::format("the guard after the {} was written (byte {} past its end)", name, i - body_end));
  };

  // Each call of the burst; the first one's output is returned.
  std::vector<uint8_t> first_output;
  for (size_t call = 0; call < b.coll.size() && c.collective != Collective::kBarrier; ++call) {
    CollectiveBuffers& cb = b.coll[call];
    prefix = b.coll.size() > 1 ? fmt::format("call {} of {}: ", call, b.coll.size()) : std::string();
    std::vector<uint8_t> output;
    std::vector<uint8_t> a, bb;
    if (Status s = cb.a->Read(h, &a); !s.ok()) {
      fail("reading the buffer back: " + s.ToString());
      return first_output;
    }
    guards(a, cb.a_init, cb.front, c.in_place ? "buffer" : "input");
    const uint8_t* out = nullptr;
    if (!c.in_place) {
      if (Status s = cb.b->Read(h, &bb); !s.ok()) {
        fail("reading the output back: " + s.ToString());
        return first_output;
      }
      guards(bb, cb.b_init, cb.front, "output");
      const uint8_t* body = a.data() + cb.front;
      const uint8_t* init = cb.a_init.data() + cb.front;
      const int64_t changed = FirstDifference(body, init, a.size() - cb.front - kGuard, elem);
      if (changed >= 0)
        fail(fmt::format("the input was modified (element {} is {}, was {})", changed,
                         FormatElement(body + changed * elem, c.type), FormatElement(init + changed * elem, c.type)));
      out = bb.data() + cb.front;
    } else {
      out = a.data() + cb.front + (cb.recv - (cb.a->data() + cb.front));
    }
    const uint64_t out_count = OutputCount(c.collective, n, c.count);
    const bool has_output = c.collective != Collective::kReduce || r == c.root;
    if (has_output) output.assign(out, out + out_count * elem);

    // Reductions, element by element; copies, block by block.
    int wrong = 0;
    std::string examples;
    auto wrong_element = [&](uint64_t j, const std::string& want) {
      if (++wrong <= kExamples)
        examples += fmt::format("{}element {}: got {}, {}", examples.empty() ? "" : "; ", j,
                                FormatElement(out + j * elem, c.type), want);
    };
    std::vector<const uint8_t*> srcs(static_cast<size_t>(n));
    auto reduced = [&](uint64_t first_input_element) {
      for (uint64_t j = 0; j < c.count; ++j) {
        for (int q = 0; q < n; ++q)
          srcs[static_cast<size_t>(q)] = in.input[static_cast<size_t>(q)].data() + (first_input_element + j) * elem;
        std::string why;
        if (!CheckReduced(c.type, c.op, srcs, out + j * elem, &why)) wrong_element(j, why);
      }
    };
    auto copied = [&](uint64_t out_block, const uint8_t* want) {
      for (uint64_t j = 0; j < c.count; ++j) {
        const uint8_t* got = out + (out_block * c.count + j) * elem;
        if (std::memcmp(got, want + j * elem, elem) != 0)
          wrong_element(out_block * c.count + j, "want " + FormatElement(want + j * elem, c.type));
      }
    };
    switch (c.collective) {
      case Collective::kAllReduce: reduced(0); break;
      case Collective::kReduce:
        if (r == c.root) reduced(0);
        break;
      case Collective::kReduceScatter: reduced(static_cast<uint64_t>(r) * c.count); break;
      case Collective::kAllGather:
        for (int q = 0; q < n; ++q) copied(static_cast<uint64_t>(q), in.input[static_cast<size_t>(q)].data());
        break;
      case Collective::kBroadcast: copied(0, in.input[static_cast<size_t>(c.root)].data()); break;
      case Collective::kAllToAll:
        for (int q = 0; q < n; ++q)
          copied(static_cast<uint64_t>(q), in.input[static_cast<size_t>(q)].data() + static_cast<uint64_t>(r) * block);
        break;
      default: break;
    }
    if (wrong > 0) fail(fmt::format("{} of {} output elements wrong: {}", wrong, out_count, examples));
    if (call == 0) first_output = std::move(output);
  }

  // Point to point: what each call sent is unchanged, what it received is the message.
  prefix.clear();
  size_t k = 0;
  if (!c.segments.empty()) {
    for (const Segment& seg : c.segments[static_cast<size_t>(r)]) {
      for (const P2pCall& call : seg.calls) {
        const Message& m = c.messages[static_cast<size_t>(call.message)];
        const size_t melem = DataTypeSize(m.type);
        const std::string name = fmt::format("m{}'s {} buffer", call.message, call.send ? "send" : "receive");
        std::vector<uint8_t> got;
        if (Status s = b.p2p[k].Read(h, &got); !s.ok()) {
          fail(fmt::format("reading {} back: {}", name, s.ToString()));
          ++k;
          continue;
        }
        guards(got, b.p2p_init[k], kGuard, name.c_str());
        const std::vector<uint8_t>& payload = in.message[static_cast<size_t>(call.message)];
        const int64_t diff = FirstDifference(got.data() + kGuard, payload.data(), payload.size(), melem);
        if (diff >= 0)
          fail(fmt::format("{}: element {} is {}, want {}",
                           call.send ? fmt::format("m{} was modified by its Send", call.message)
                                     : fmt::format("m{} received wrong", call.message),
                           diff, FormatElement(got.data() + kGuard + diff * melem, m.type),
                           FormatElement(payload.data() + diff * melem, m.type)));
        ++k;
      }
    }
  }
  return first_output;
}

}  // namespace

bool FinishesWithin(double seconds, std::function<void()> work) {
  Watched watched(std::move(work));
  return watched.Wait(seconds);
}

uint64_t HashBytes(const uint8_t* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ data[i]) * 0x100000001b3ull;
  return h;
}

Config WorldConfig(const WorldSpec& spec, double timeout_s) {
  Config config = GlobalConfig();
  config.emulated_devices = spec.devices;
  config.timeout_s = timeout_s;
  config.deterministic = spec.deterministic;
  config.chunk_bytes = spec.chunk_bytes > 0 ? std::optional<uint64_t>(spec.chunk_bytes) : std::nullopt;
  config.emu_opaque = spec.opaque;
  config.emu_sync_free = spec.sync_free;
  config.emu_launch_us.reset();
  config.emu_copy_gbps.reset();
  config.emu_reduce_gbps.reset();
  if (spec.throttled) {
    config.emu_launch_us = kThrottleLaunchUs;
    config.emu_copy_gbps = kThrottleGbps;
    config.emu_reduce_gbps = kThrottleGbps;
  }
  config.algo.clear();
  config.device.reset();
  if (spec.ofi) {
    config.fabric = {"ofi"};
    config.topology.clear();
  } else {
    config.fabric = {"directconnect"};
    config.topology = "full";
  }
  return config;
}

Result<std::unique_ptr<LocalWorld>> LocalWorld::Create(const WorldSpec& spec, double timeout_s) {
  std::unique_ptr<LocalWorld> w(new LocalWorld());
  w->config_ = WorldConfig(spec, timeout_s);
  KZ_ASSIGN_OR_RETURN(w->backend_, host_emulated::CreateHostEmulatedBackend(w->config_));
  std::vector<device::Device*> devices;
  for (int r = 0; r < spec.nranks; ++r) devices.push_back(w->backend_->device(r % spec.devices));
  CommOptions options;
  options.config = &w->config_;
  options.staging_bytes = spec.staging_bytes;
  options.direct_access = spec.direct_access;
  KZ_ASSIGN_OR_RETURN(w->comms_, Communicator::CreateLocal(devices, options));
  for (int r = 0; r < spec.nranks; ++r) {
    KZ_ASSIGN_OR_RETURN(auto stream, devices[static_cast<size_t>(r)]->CreateStream());
    w->streams_.push_back(std::move(stream));
    auto h = std::make_unique<RankHandle>();
    h->rank = r;
    h->comm = w->comms_[static_cast<size_t>(r)].get();
    h->stream = w->streams_.back().get();
    w->handles_.push_back(std::move(h));
  }
  return w;
}

LocalWorld::~LocalWorld() {
  handles_.clear();  // the host memory for stream copies, before the streams and the backend
  streams_.clear();
  comms_.clear();
}

std::vector<RankHandle*> LocalWorld::local() {
  std::vector<RankHandle*> v;
  for (auto& h : handles_) v.push_back(h.get());
  return v;
}

void LocalWorld::AbortAll() {
  for (auto& c : comms_) c->Abort();
}

Result<std::unique_ptr<ProcessRank>> ProcessRank::Create(const WorldSpec& spec, double timeout_s) {
  std::unique_ptr<ProcessRank> p(new ProcessRank());
  p->config_ = WorldConfig(spec, timeout_s);
  CommOptions options;
  options.config = &p->config_;
  options.staging_bytes = spec.staging_bytes;
  KZ_ASSIGN_OR_RETURN(p->comm_, Communicator::CreateFromEnvironment(options));
  if (p->comm_->size() != spec.nranks)
    return InvalidArgument(fmt::format("the job has {} ranks, the world {}", p->comm_->size(), spec.nranks));
  KZ_ASSIGN_OR_RETURN(p->stream_, p->comm_->device().CreateStream());
  p->handle_.rank = p->comm_->rank();
  p->handle_.comm = p->comm_.get();
  p->handle_.stream = p->stream_.get();
  return p;
}

ProcessRank::~ProcessRank() {
  handle_.bounce.reset();
  stream_.reset();
  comm_.reset();
}

CaseResult RunCase(Ranks& ranks, const Case& c, double timeout_s, bool corrupt) {
  CaseResult result;
  const int n = ranks.nranks();
  const std::vector<RankHandle*> local = ranks.local();
  CaseInputs in;
  const size_t elem = DataTypeSize(c.type);
  const uint64_t in_count = InputCount(c.collective, n, c.count);
  for (int q = 0; q < n; ++q) {
    in.input.emplace_back(in_count * elem);
    FillInputs(c.inputs(), q, in_count, in.input.back().data());
  }
  for (size_t k = 0; k < c.messages.size(); ++k) {
    in.message.emplace_back(c.messages[k].count * DataTypeSize(c.messages[k].type));
    FillBytes(Key(c.key, kMessageSalt, k), in.message.back().size(), in.message.back().data());
  }

  std::vector<std::vector<uint8_t>> first(local.size());
  for (size_t ri = 0; ri < c.runs.size(); ++ri) {
    const Run& run = c.runs[ri];
    const std::string run_name = RunName(c, ri);
    std::vector<RankBuffers> buffers(local.size());
    for (size_t i = 0; i < local.size(); ++i) {
      Status s = Prepare(*local[i], c, run, n, in, &buffers[i]);
      if (!s.ok()) {
        result.failures.push_back(
            fmt::format("{}: rank {}: preparing its buffers: {}", run_name, local[i]->rank, s.ToString()));
        result.broken = true;
        return result;
      }
    }
    // After the upload: the top bit of rank 0's first element (a sign, where the type has one).
    if (corrupt && ri == 0 && !in.input[0].empty()) in.input[0][elem - 1] ^= 0x80;
    std::vector<Status> status(local.size());
    {
      Watched watched([&] { Execute(c, run, local, buffers, timeout_s, &status); });
      if (!watched.Wait(timeout_s + 30)) {
        ranks.AbortAll();
        result.broken = true;
        if (!watched.Wait(kAbortSeconds)) {
          result.stuck = true;
          result.failures.push_back(fmt::format("{}: the calls did not return within {} s, nor {} s after Abort",
                                                run_name, timeout_s + 30, kAbortSeconds));
          return result;
        }
        result.failures.push_back(
            fmt::format("{}: the calls did not return within {} s (returned after Abort)", run_name, timeout_s + 30));
      }
    }
    for (size_t i = 0; i < local.size(); ++i) {
      if (!status[i].ok()) {
        result.failures.push_back(fmt::format("{}: rank {}: {}", run_name, local[i]->rank, status[i].ToString()));
        result.broken = true;
      }
    }
    if (result.broken) return result;

    std::vector<std::vector<uint8_t>> outputs(local.size());
    for (size_t i = 0; i < local.size(); ++i)
      outputs[i] = CheckRank(*local[i], c, n, in, buffers[i], run_name, &result.failures);
    // Every rank's AllReduce output, the same bytes.
    if (c.collective == Collective::kAllReduce) {
      for (size_t i = 1; i < local.size(); ++i) {
        const int64_t d = FirstDifference(outputs[i].data(), outputs[0].data(), outputs[0].size(), elem);
        if (d < 0) continue;  // the same count: the same size
        result.failures.push_back(
            fmt::format("{}: ranks {} and {} hold different AllReduce results: element {}: {} vs {}", run_name,
                        local[0]->rank, local[i]->rank, d, FormatElement(outputs[0].data() + d * elem, c.type),
                        FormatElement(outputs[i].data() + d * elem, c.type)));
        break;
      }
    }
    if (ri == 0) {
      if (c.collective == Collective::kAllReduce)
        for (size_t i = 0; i < local.size(); ++i)
          result.hashes.emplace_back(local[i]->rank, HashBytes(outputs[i].data(), outputs[i].size()));
      first = std::move(outputs);
      continue;
    }
    if (!c.compare_runs) continue;
    for (size_t i = 0; i < local.size(); ++i) {
      const int64_t d = FirstDifference(outputs[i].data(), first[i].data(), first[i].size(), elem);
      if (d < 0) continue;
      result.failures.push_back(
          fmt::format("{}: rank {}: deterministic mode, but the result differs from {}'s: element {}: {} vs {}",
                      run_name, local[i]->rank, RunName(c, 0), d, FormatElement(outputs[i].data() + d * elem, c.type),
                      FormatElement(first[i].data() + d * elem, c.type)));
    }
  }
  return result;
}

}  // namespace kizuna::crosscheck
