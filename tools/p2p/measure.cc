// kizuna-p2p's measurements (measure.h).
#include "tools/p2p/measure.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "fabric/directconnect/topology.h"
#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/core/config.h"
#include "runtime/core/logging.h"
#include "runtime/core/unique_fd.h"
#include "runtime/device/registry.h"

namespace kizuna::p2p {
namespace {

using Clock = std::chrono::steady_clock;
using fabric::Fabric;
using fabric::MemoryDescriptor;
using fabric::Registration;
using fabric::Request;

// ---- Keeping the two ranks in step ----

// Every rank's local verdict, so that a failure on one rank (a fabric that is unavailable there, a
// registration refused) is known to both and neither waits for the other in vain. Returns the
// first failure in rank order, the peer's prefixed with its rank.
Status Agree(bootstrap::Bootstrap& boot, const Status& mine, Deadline deadline) {
  const std::string& message = mine.message();
  std::vector<uint8_t> blob(1 + message.size());
  blob[0] = static_cast<uint8_t>(mine.code());
  std::memcpy(blob.data() + 1, message.data(), message.size());
  KZ_ASSIGN_OR_RETURN(std::vector<bootstrap::Bytes> all, boot.AllGather(blob, deadline));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) return Internal(fmt::format("rank {} sent an empty verdict", r));
    if (all[r][0] == static_cast<uint8_t>(StatusCode::kOk)) continue;
    if (static_cast<int>(r) == boot.rank()) return mine;
    return Status(static_cast<StatusCode>(all[r][0]),
                  fmt::format("rank {}: {}", r, std::string(all[r].begin() + 1, all[r].end())));
  }
  return Status::Ok();
}

// ---- Connections ----

Status WaitSize(fabric::Comm& comm, Request* r, size_t expected, Deadline deadline, std::string_view what);

struct Connection {
  std::unique_ptr<fabric::ListenComm> listen;
  std::unique_ptr<fabric::SendComm> send;
  std::unique_ptr<fabric::RecvComm> recv;
};

// The devices to connect from and listen on. A point-to-point fabric (direct links) connects over
// its first port linked to the peer and listens on the port the peer will use: the peer's first
// port linked to us, i.e. our linked port whose far end has the lowest port number. A switched
// fabric uses device 0 both ways.
Result<std::pair<int, int>> ChooseDevices(const Fabric& fab, int peer) {
  int send_dev = -1, listen_dev = -1, far_port = 0, switched = -1;
  for (int p = 0; p < fab.device_count(); ++p) {
    KZ_ASSIGN_OR_RETURN(fabric::FabricDeviceProperties props, fab.properties(p));
    if (!props.point_to_point) {
      if (switched < 0) switched = p;
      continue;
    }
    if (!props.link_peer.has_value() || props.link_peer->rank != peer) continue;
    if (send_dev < 0) send_dev = p;
    if (listen_dev < 0 || props.link_peer->port < far_port) {
      listen_dev = p;
      far_port = props.link_peer->port;
    }
  }
  if (send_dev >= 0) return std::make_pair(send_dev, listen_dev);
  if (switched >= 0) return std::make_pair(switched, switched);
  return NotSupported(fmt::format("none of {}'s {} device(s) reaches rank {} (no link to it)", fab.name(),
                                  fab.device_count(), peer));
}

// Each phase (listen, exchange, connect) has its own deadline of `timeout_s`, so that a rank whose
// phase failed at its deadline can still tell the other.
Result<Connection> Connect(Fabric& fab, bootstrap::Bootstrap& boot, double timeout_s) {
  Deadline deadline = Deadline::AfterSeconds(timeout_s);
  const int peer = 1 - boot.rank();
  Connection c;
  int send_dev = 0;
  Status local = [&]() -> Status {
    KZ_ASSIGN_OR_RETURN(auto devs, ChooseDevices(fab, peer));
    send_dev = devs.first;
    KZ_ASSIGN_OR_RETURN(c.listen, fab.Listen(devs.second));
    return Status::Ok();
  }();
  KZ_RETURN_IF_ERROR(Agree(boot, local, deadline));
  deadline = Deadline::AfterSeconds(timeout_s);
  const auto mine = c.listen->handle().bytes();
  KZ_ASSIGN_OR_RETURN(std::vector<bootstrap::Bytes> handles,
                      boot.AllGather(std::vector<uint8_t>(mine.begin(), mine.end()), deadline));
  deadline = Deadline::AfterSeconds(timeout_s);
  KZ_ASSIGN_OR_RETURN(fabric::Handle theirs, fabric::Handle::FromBytes(handles[static_cast<size_t>(peer)]));
  // Connect and accept interleaved, both non-blocking: a fabric may complete a connection only
  // while the other side accepts, and an accepted RecvComm may still owe the connector its part of
  // the handshake until it is first progressed. So a zero-byte receive (kConnectedTag) is posted as
  // soon as the RecvComm exists and tested while connecting, which progresses it; once both comms
  // exist, each side sends the zero-byte message the other's receive waits for, so both know the
  // connection works both ways. Sleeps with a growing backoff (at most 1 ms) between attempts.
  constexpr int kConnectedTag = 1;
  local = [&]() -> Status {
    auto pause = std::chrono::microseconds(20);
    Request* connected = nullptr;
    bool connected_done = false;
    while (c.send == nullptr || c.recv == nullptr) {
      bool moved = false;
      if (c.send == nullptr) {
        KZ_ASSIGN_OR_RETURN(c.send, fab.Connect(send_dev, theirs));
        moved |= c.send != nullptr;
      }
      if (c.recv == nullptr) {
        KZ_ASSIGN_OR_RETURN(c.recv, c.listen->Accept());
        moved |= c.recv != nullptr;
      }
      if (c.recv != nullptr && connected == nullptr) {
        KZ_ASSIGN_OR_RETURN(connected, c.recv->Recv(nullptr, 0, kConnectedTag, nullptr));
        if (connected == nullptr)
          return Internal(fmt::format("{}: a new comm refused a receive as busy", c.recv->label()));
      }
      if (connected != nullptr && !connected_done) {
        KZ_ASSIGN_OR_RETURN(fabric::Completion done, c.recv->Test(connected));
        connected_done = done.done;
      }
      if (c.send != nullptr && c.recv != nullptr) break;
      if (deadline.Expired())
        return Timeout(fmt::format("{}: rank {} {} by the deadline", fab.name(), peer,
                                   c.send == nullptr ? "did not accept our connection" : "did not connect to us"));
      if (!moved) {
        std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<std::chrono::microseconds>(
                                                        std::max(deadline.Remaining(), std::chrono::nanoseconds(0)))));
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
    KZ_ASSIGN_OR_RETURN(Request * hello, c.send->Send(nullptr, 0, kConnectedTag, nullptr));
    if (hello == nullptr) return Internal(fmt::format("{}: a new comm refused a send as busy", c.send->label()));
    KZ_RETURN_IF_ERROR(WaitSize(*c.send, hello, 0, deadline, "connection check"));
    if (!connected_done) KZ_RETURN_IF_ERROR(WaitSize(*c.recv, connected, 0, deadline, "connection check"));
    return Status::Ok();
  }();
  KZ_RETURN_IF_ERROR(Agree(boot, local, Deadline::AfterSeconds(timeout_s)));
  return c;
}

// ---- Memory ----

enum class MemoryKind { kHost, kDeviceFd };
std::string_view MemoryName(MemoryKind k) { return k == MemoryKind::kHost ? "host" : "device-fd"; }

// A buffer of either kind, owned here, and its descriptor for registration.
struct Buffer {
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, FreeDeleter> host;
  std::unique_ptr<device::Buffer> device;
  device::ExportedMemory exported;
  MemoryDescriptor descriptor;
  uint8_t* data() const { return static_cast<uint8_t*>(descriptor.data); }
};

Result<Buffer> MakeBuffer(MemoryKind kind, size_t bytes, device::Device* dev) {
  Buffer b;
  if (kind == MemoryKind::kHost) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    b.host.reset(std::aligned_alloc(4096, rounded));
    if (b.host == nullptr) return OutOfMemory(fmt::format("cannot allocate {} bytes of host memory", bytes));
    b.descriptor = MemoryDescriptor::Host(b.host.get(), bytes);
  } else {
    if (dev == nullptr) return Unavailable("no emulated device (the host_emulated backend is unavailable)");
    KZ_ASSIGN_OR_RETURN(b.device, dev->Allocate(bytes));
    KZ_ASSIGN_OR_RETURN(b.exported, dev->Export(*b.device));
    const bool host_accessible = dev->properties().host_accessible;
    if (!host_accessible)
      return NotSupported(fmt::format("{}'s memory is not host accessible: the tool fills buffers by CPU",
                                      dev->properties().name));
    b.descriptor = MemoryDescriptor::FromExport(b.device->data(), b.exported, host_accessible);
  }
  // Touch every page now so that page faults are not measured.
  std::memset(b.descriptor.data, 0x5a, bytes);
  return b;
}

// ---- Posting and waiting ----

// Posts with `post` until it is accepted: a busy comm (nullptr) is progressed by waiting briefly
// on `oldest` when there is one, else by sleeping briefly. kTimeout at the deadline.
template <typename Post>
Result<Request*> PostUntilAccepted(fabric::Comm& comm, Post&& post, Request* oldest, Deadline deadline,
                                   std::string_view what) {
  for (;;) {
    KZ_ASSIGN_OR_RETURN(Request * r, post());
    if (r != nullptr) return r;
    if (deadline.Expired()) return Timeout(fmt::format("{} on {}: the comm stayed busy until the deadline", what,
                                                       comm.label()));
    if (oldest != nullptr) return static_cast<Request*>(nullptr);  // the caller completes `oldest` first
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status WaitSize(fabric::Comm& comm, Request* r, size_t expected, Deadline deadline, std::string_view what) {
  Result<size_t> got = comm.Wait(r, deadline);
  if (!got.ok()) return got.status().WithContext(fmt::format("{} on {}", what, comm.label()));
  if (*got != expected)
    return Internal(fmt::format("{} on {}: {} bytes expected, {} reported", what, comm.label(), expected, *got));
  return Status::Ok();
}

// ---- Measurements ----

struct Side {
  Connection* conn;
  Registration* send_reg;
  Registration* recv_reg;
  uint8_t* send_data;
  uint8_t* recv_data;
};

// 8-byte ping-pong: rank 0 sends and waits for the reply, rank 1 replies (its next receive is
// posted before it replies). Returns rank 0's half round trips in microseconds.
Result<std::vector<double>> PingPong(int rank, Side& s, int warmup, int iters, Deadline deadline) {
  std::vector<double> half_rtt_us;
  half_rtt_us.reserve(static_cast<size_t>(iters));
  fabric::SendComm& send = *s.conn->send;
  fabric::RecvComm& recv = *s.conn->recv;
  auto post_recv = [&] { return recv.Recv(s.recv_data, kLatencyBytes, 0, s.recv_reg); };
  auto post_send = [&] { return send.Send(s.send_data, kLatencyBytes, 0, s.send_reg); };
  const int total = warmup + iters;
  if (rank == 0) {
    for (int i = 0; i < total; ++i) {
      const auto t0 = Clock::now();
      KZ_ASSIGN_OR_RETURN(Request * r, PostUntilAccepted(recv, post_recv, nullptr, deadline, "receive"));
      KZ_ASSIGN_OR_RETURN(Request * q, PostUntilAccepted(send, post_send, nullptr, deadline, "send"));
      KZ_RETURN_IF_ERROR(WaitSize(send, q, kLatencyBytes, deadline, "ping"));
      KZ_RETURN_IF_ERROR(WaitSize(recv, r, kLatencyBytes, deadline, "pong"));
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (i >= warmup) half_rtt_us.push_back(us / 2);
    }
  } else {
    KZ_ASSIGN_OR_RETURN(Request * r, PostUntilAccepted(recv, post_recv, nullptr, deadline, "receive"));
    for (int i = 0; i < total; ++i) {
      KZ_RETURN_IF_ERROR(WaitSize(recv, r, kLatencyBytes, deadline, "ping"));
      if (i + 1 < total) {
        KZ_ASSIGN_OR_RETURN(r, PostUntilAccepted(recv, post_recv, nullptr, deadline, "receive"));
      }
      KZ_ASSIGN_OR_RETURN(Request * q, PostUntilAccepted(send, post_send, nullptr, deadline, "send"));
      KZ_RETURN_IF_ERROR(WaitSize(send, q, kLatencyBytes, deadline, "pong"));
    }
  }
  return half_rtt_us;
}

// `count` messages of `size` bytes from rank 0 to rank 1 with up to `window` in flight on each
// side, then an 8-byte acknowledgement back. Rank 0 returns the seconds from its first post until
// the acknowledgement arrived; rank 1 returns 0.
Result<double> Stream(int rank, Side& s, size_t size, int64_t count, int window, Deadline deadline) {
  fabric::SendComm& send = *s.conn->send;
  fabric::RecvComm& recv = *s.conn->recv;
  std::deque<Request*> in_flight;
  int64_t posted = 0, done = 0;
  if (rank == 0) {
    auto post_ack = [&] { return recv.Recv(s.recv_data, kLatencyBytes, 0, s.recv_reg); };
    KZ_ASSIGN_OR_RETURN(Request * ack, PostUntilAccepted(recv, post_ack, nullptr, deadline, "receive"));
    auto post = [&] { return send.Send(s.send_data, size, 0, s.send_reg); };
    const auto t0 = Clock::now();
    while (done < count) {
      while (posted < count && static_cast<int>(in_flight.size()) < window) {
        Request* oldest = in_flight.empty() ? nullptr : in_flight.front();
        KZ_ASSIGN_OR_RETURN(Request * r, PostUntilAccepted(send, post, oldest, deadline, "send"));
        if (r == nullptr) break;  // busy: complete the oldest first
        in_flight.push_back(r);
        ++posted;
      }
      KZ_RETURN_IF_ERROR(WaitSize(send, in_flight.front(), size, deadline, "send"));
      in_flight.pop_front();
      ++done;
    }
    KZ_RETURN_IF_ERROR(WaitSize(recv, ack, kLatencyBytes, deadline, "acknowledgement"));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  auto post = [&] { return recv.Recv(s.recv_data, size, 0, s.recv_reg); };
  while (done < count) {
    while (posted < count && static_cast<int>(in_flight.size()) < window) {
      Request* oldest = in_flight.empty() ? nullptr : in_flight.front();
      KZ_ASSIGN_OR_RETURN(Request * r, PostUntilAccepted(recv, post, oldest, deadline, "receive"));
      if (r == nullptr) break;
      in_flight.push_back(r);
      ++posted;
    }
    KZ_RETURN_IF_ERROR(WaitSize(recv, in_flight.front(), size, deadline, "receive"));
    in_flight.pop_front();
    ++done;
  }
  auto post_ack = [&] { return send.Send(s.send_data, kLatencyBytes, 0, s.send_reg); };
  KZ_ASSIGN_OR_RETURN(Request * ack, PostUntilAccepted(send, post_ack, nullptr, deadline, "send"));
  KZ_RETURN_IF_ERROR(WaitSize(send, ack, kLatencyBytes, deadline, "acknowledgement"));
  return 0.0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  return v[std::min(k, v.size() - 1)];
}

Deadline PhaseDeadline(double timeout_s) { return Deadline::AfterSeconds(timeout_s); }

// Latency and bandwidth rows for one fabric and memory kind. Buffers: rank 0 sends from a
// max-bytes buffer and receives into a small one, rank 1 the other way round.
Status MeasureMemory(int rank, bootstrap::Bootstrap& boot, Connection& conn, const std::string& fabric_name,
                     MemoryKind kind, device::Device* dev, const Options& o, double timeout_s, std::vector<Row>& rows) {
  const size_t big = static_cast<size_t>(o.max_bytes);
  Buffer send_buf, recv_buf;
  Side side{&conn, nullptr, nullptr, nullptr, nullptr};
  Status local = [&]() -> Status {
    if (kind == MemoryKind::kDeviceFd) {
      for (fabric::Comm* c : {static_cast<fabric::Comm*>(conn.send.get()), static_cast<fabric::Comm*>(conn.recv.get())})
        if ((c->properties().ptr_support & fabric::kPtrFd) == 0)
          return NotSupported(fmt::format("{} does not register memory by fd", c->properties().name));
    }
    KZ_ASSIGN_OR_RETURN(send_buf, MakeBuffer(kind, rank == 0 ? big : kSmallBytes, dev));
    KZ_ASSIGN_OR_RETURN(recv_buf, MakeBuffer(kind, rank == 0 ? kSmallBytes : big, dev));
    KZ_ASSIGN_OR_RETURN(side.send_reg, conn.send->Register(send_buf.descriptor));
    KZ_ASSIGN_OR_RETURN(side.recv_reg, conn.recv->Register(recv_buf.descriptor));
    side.send_data = send_buf.data();
    side.recv_data = recv_buf.data();
    return Status::Ok();
  }();
  Status agreed = Agree(boot, local, PhaseDeadline(timeout_s));
  const std::string memory(MemoryName(kind));
  if (agreed.code() == StatusCode::kNotSupported || agreed.code() == StatusCode::kUnavailable) {
    Row row(fabric_name, memory, "-");
    row.note = "skipped: " + agreed.message();
    rows.push_back(row);
    if (side.send_reg != nullptr) KZ_RETURN_IF_ERROR(conn.send->Deregister(side.send_reg));
    if (side.recv_reg != nullptr) KZ_RETURN_IF_ERROR(conn.recv->Deregister(side.recv_reg));
    return Status::Ok();
  }
  KZ_RETURN_IF_ERROR(agreed.WithContext(memory));

  KZ_ASSIGN_OR_RETURN(std::vector<double> lat, PingPong(rank, side, o.warmup, o.iters, PhaseDeadline(timeout_s)));
  if (rank == 0) {
    Row row(fabric_name, memory, "latency", kLatencyBytes, o.iters);
    row.median_us = Percentile(lat, 0.5);
    row.p99_us = Percentile(lat, 0.99);
    rows.push_back(row);
  }
  const int window = std::max(1, std::min({o.window, conn.send->properties().max_requests,
                                           conn.recv->properties().max_requests}));
  for (uint64_t size : Sizes(o)) {
    const int64_t count = BandwidthCount(o, size);
    const int64_t warm = std::max<int64_t>(1, std::min<int64_t>(window, count / 4));
    KZ_RETURN_IF_ERROR(Stream(rank, side, size, warm, window, PhaseDeadline(timeout_s)).status());
    const uint64_t staged_before = conn.send->stats().staged_bytes + conn.recv->stats().staged_bytes;
    KZ_ASSIGN_OR_RETURN(double seconds, Stream(rank, side, size, count, window, PhaseDeadline(timeout_s)));
    if (rank != 0) continue;
    const uint64_t staged = conn.send->stats().staged_bytes + conn.recv->stats().staged_bytes - staged_before;
    Row row(fabric_name, memory, "bandwidth", size, count);
    row.gbps = static_cast<double>(size) * static_cast<double>(count) / seconds / 1e9;
    row.mmsgs = static_cast<double>(count) / seconds / 1e6;
    row.copies = staged == 0 ? "1" : "2";
    rows.push_back(row);
  }
  KZ_RETURN_IF_ERROR(conn.send->Deregister(side.send_reg));
  KZ_RETURN_IF_ERROR(conn.recv->Deregister(side.recv_reg));
  return Status::Ok();
}

}  // namespace

TempTopology::~TempTopology() {
  if (!path.empty()) ::unlink(path.c_str());
}

Status ChooseTopology(Config& config, const Options& o, TempTopology& keep, std::vector<std::string>& notes) {
  if (config.topology.empty() && (o.fabric.empty() || o.fabric == "directconnect")) {
    KZ_ASSIGN_OR_RETURN(fabric::directconnect::Topology ring,
                        fabric::directconnect::GenerateRing(2, fabric::directconnect::LinkParams{}));
    const std::string json = fabric::directconnect::TopologyToJson(ring);
    const char* tmpdir = std::getenv("TMPDIR");
    std::string path = fmt::format("{}/kizuna-p2p-ring2-XXXXXX.json", tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp");
    UniqueFd fd(::mkstemps(path.data(), 5));
    if (!fd.valid()) return FromErrno(errno, fmt::format("creating the topology file {}", path));
    keep.path = path;
    for (size_t at = 0; at < json.size();) {
      const ssize_t n = ::write(fd.get(), json.data() + at, json.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return FromErrno(errno, fmt::format("writing the topology file {}", path));
      at += static_cast<size_t>(n);
    }
    config.topology = path;
    notes.push_back(fmt::format("KIZUNA_TOPOLOGY is not set: directconnect uses a generated 2-worker ring ({})", path));
  } else if (!config.topology.empty()) {
    notes.push_back(fmt::format("directconnect topology: {} (KIZUNA_TOPOLOGY)", config.topology));
  }
  return Status::Ok();
}

Result<std::vector<Row>> RunInProcess(Config config, const Options& o, std::vector<std::string>& notes) {
  TempTopology topology;
  KZ_RETURN_IF_ERROR(ChooseTopology(config, o, topology, notes));
  auto devices = device::DeviceRegistry::Create(config);
  KZ_ASSIGN_OR_RETURN(auto boots, bootstrap::CreateInProcessBootstraps(2));
  Result<std::vector<Row>> rows = std::vector<Row>{}, peer = std::vector<Row>{};
  // Each rank owns its Bootstrap; a rank that fails destroys it on return, which the other sees
  // as kRemoteError instead of waiting for its deadline.
  std::unique_ptr<bootstrap::Bootstrap> b0 = std::move(boots[0]), b1 = std::move(boots[1]);
  std::thread t([&, b = std::move(b1)]() mutable {
    peer = RunRank(*b, config, o, devices.get());
    b.reset();
  });
  rows = RunRank(*b0, config, o, devices.get());
  b0.reset();
  t.join();
  if (!rows.ok()) return rows.status().WithContext("rank 0");
  if (!peer.ok()) return peer.status().WithContext("rank 1");
  notes.push_back("2 threads of one process (in-process bootstrap)");
  return rows;
}

std::vector<uint64_t> Sizes(const Options& o) {
  std::vector<uint64_t> sizes;
  for (double s = static_cast<double>(o.min_bytes); s <= static_cast<double>(o.max_bytes) * 1.0000001; s *= o.factor) {
    const uint64_t b = static_cast<uint64_t>(std::llround(s));
    if (sizes.empty() || b != sizes.back()) sizes.push_back(b);
  }
  if (sizes.empty() || sizes.back() != o.max_bytes) sizes.push_back(o.max_bytes);
  return sizes;
}

// Messages per bandwidth size: enough to move about bw_bytes, within [4, iters] (at least 4 so
// that the window fills; both ranks compute the same number).
int64_t BandwidthCount(const Options& o, uint64_t size) {
  const uint64_t want = (o.bw_bytes + size - 1) / size;
  return std::max<int64_t>(4, std::min<int64_t>(o.iters, static_cast<int64_t>(std::min<uint64_t>(want, INT32_MAX))));
}

// One rank's whole run: every fabric (or o.fabric), both memory kinds. Rank 0's rows are the report.
Result<std::vector<Row>> RunRank(bootstrap::Bootstrap& boot, const Config& config, const Options& o,
                                 device::DeviceRegistry* devices) {
  const int rank = boot.rank();
  SetLogRank(rank);
  const double timeout_s = o.timeout_s > 0 ? o.timeout_s : config.timeout_s;
  fabric::FabricContext ctx;
  ctx.rank = rank;
  ctx.world_size = boot.size();
  ctx.local_rank = rank;
  auto registry = fabric::FabricRegistry::Create(config, ctx, /*every=*/true);  // each fabric linked in

  device::Device* dev = nullptr;
  if (device::Backend* emu = devices->Find("host_emulated"); emu != nullptr && emu->device_count() > 0)
    dev = emu->device(config.device.value_or(rank) % emu->device_count());

  std::vector<MemoryKind> kinds;
  if (o.memory != "device") kinds.push_back(MemoryKind::kHost);
  if (o.memory != "host") kinds.push_back(MemoryKind::kDeviceFd);

  std::vector<Row> rows;
  bool found = false;
  std::string linked;
  for (const fabric::FabricSlot& slot : registry->fabrics()) {
    linked += (linked.empty() ? "" : ", ") + slot.name;
    if (!o.fabric.empty() && slot.name != o.fabric) continue;
    found = true;
    Status avail = Agree(boot, slot.status, PhaseDeadline(timeout_s));
    if (!avail.ok() && slot.status.ok() && avail.code() != StatusCode::kUnavailable &&
        avail.code() != StatusCode::kNotSupported)
      return avail;
    if (!avail.ok()) {
      Row row(slot.name, "-", "-");
      row.note = "unavailable: " + avail.message();
      rows.push_back(row);
      continue;
    }
    Result<Connection> conn = Connect(*slot.fabric, boot, timeout_s);
    if (!conn.ok()) return conn.status().WithContext(fmt::format("{}: connecting", slot.name));
    for (MemoryKind kind : kinds)
      KZ_RETURN_IF_ERROR(MeasureMemory(rank, boot, *conn, slot.name, kind, dev, o, timeout_s, rows)
                             .WithContext(fmt::format("{} {}", slot.name, MemoryName(kind))));
    // Both ranks finish with this fabric before either destroys its comms (a destroyed comm fails
    // the peer's outstanding requests).
    KZ_RETURN_IF_ERROR(boot.Barrier(PhaseDeadline(timeout_s)).WithContext(slot.name));
  }
  if (!found)
    return InvalidArgument(fmt::format("--fabric {}: no such fabric in this build (linked: {})", o.fabric,
                                       linked.empty() ? "none" : linked));
  return rows;
}

// Single-thread memcpy of the bandwidth sizes: the bound of a transfer that copies once.
Result<std::vector<Row>> MemcpyRows(const Options& o) {
  std::vector<Row> rows;
  KZ_ASSIGN_OR_RETURN(Buffer src, MakeBuffer(MemoryKind::kHost, o.max_bytes, nullptr));
  KZ_ASSIGN_OR_RETURN(Buffer dst, MakeBuffer(MemoryKind::kHost, o.max_bytes, nullptr));
  for (uint64_t size : Sizes(o)) {
    const int64_t count = BandwidthCount(o, size);
    std::memcpy(dst.data(), src.data(), size);  // warm-up
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(dst.data(), src.data(), size);
      // Keeps the compiler from merging or dropping repeated copies.
      asm volatile("" : : "r"(dst.data()) : "memory");
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    Row row("memcpy", "host", "bandwidth", size, count);
    row.gbps = static_cast<double>(size) * static_cast<double>(count) / seconds / 1e9;
    row.mmsgs = static_cast<double>(count) / seconds / 1e6;
    row.copies = "1";
    row.note = "1 thread, the bound of one copy";
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kizuna::p2p
