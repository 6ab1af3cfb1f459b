// kizuna-p2p: point-to-point latency and bandwidth of every fabric, between two ranks (perftest's
// ib_write_lat / ib_write_bw for kizuna's fabrics).
//
//   kizuna-p2p [--fabric NAME] [--max-bytes 64M] [--iters 1000] [--window 16] [--json]
//   kizuna-run -n 2 -- kizuna-p2p --processes ...
//
// Two ranks — two threads of this process over the in-process bootstrap, or, with --processes,
// two processes started by kizuna-run that bootstrap from its environment — create each fabric,
// exchange listen handles through the bootstrap and connect both directions. Then, for host memory
// and for emulated device buffers registered by fd (where the fabric registers by fd), rank 0
// measures:
//   latency    8-byte ping-pong; half the round trip, median and p99, after a warm-up;
//   bandwidth  rank 0 to rank 1, sizes doubling (or --factor) from --min-bytes to --max-bytes,
//              `window` sends in flight; the clock stops when rank 1's acknowledgement of the last
//              message arrives, so a send that completes before its bytes land is not counted early.
// The "copies" column says whether the transfers went directly between the two registered regions
// (1) or through an intermediate buffer (2), from the comm's TransferStats. A single-thread memcpy
// of the same sizes, measured in the same run, is printed as the bound of a one-copy transfer.
//
// Exit status: 0 when every measurement ran (fabrics unavailable here are rows with the reason),
// 1 on a failure (the reason on stderr), 2 on bad options.

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "fabric/directconnect/topology.h"
#include "fabric/fabric.h"
#include "fabric/registry.h"
#include "runtime/bootstrap/in_process.h"
#include "runtime/bootstrap/launch_env.h"
#include "runtime/config.h"
#include "runtime/device/registry.h"
#include "runtime/logging.h"
#include "runtime/unique_fd.h"

namespace kizuna {
namespace {

using Clock = std::chrono::steady_clock;
using fabric::Fabric;
using fabric::MemoryDescriptor;
using fabric::Registration;
using fabric::Request;

constexpr size_t kSmallBytes = 4096;   // the reverse direction's buffers (pongs, acknowledgements)
constexpr size_t kLatencyBytes = 8;
constexpr uint64_t kMaxAllowedBytes = uint64_t{1} << 30;

struct Options {
  std::string fabric;  // empty: every fabric in the registry
  bool processes = false;
  uint64_t min_bytes = 8;
  uint64_t max_bytes = uint64_t{64} << 20;
  double factor = 2;
  int window = 16;
  int iters = 1000;         // latency iterations; also the most messages of one bandwidth size
  int warmup = 100;         // latency warm-up iterations
  uint64_t bw_bytes = uint64_t{1} << 30;  // bytes to move per bandwidth size (within the counts)
  std::string memory = "all";             // host | device | all
  bool reference = true;                  // the memcpy rows
  bool json = false;
  double timeout_s = 0;                   // 0: KIZUNA_TIMEOUT
};

// One line of the report. NaN fields print as "-".
struct Row {
  std::string fabric, memory, test;
  uint64_t bytes = 0;
  int64_t iterations = 0;
  double median_us = NAN, p99_us = NAN, gbps = NAN, mmsgs = NAN;
  std::string copies = "-";
  std::string note;

  Row(std::string fabric_name, std::string memory_kind, std::string test_name, uint64_t size = 0, int64_t iters = 0)
      : fabric(std::move(fabric_name)), memory(std::move(memory_kind)), test(std::move(test_name)), bytes(size),
        iterations(iters) {}
};

Result<uint64_t> ParseBytes(const std::string& text, std::string_view option) {
  if (text.empty()) return InvalidArgument(fmt::format("{}: empty size", option));
  size_t used = 0;
  unsigned long long value = 0;
  if (text.front() == '-' || !std::isdigit(static_cast<unsigned char>(text.front())))
    return InvalidArgument(fmt::format("{} '{}': expected a byte count such as 8, 64K, 1M or 1G", option, text));
  while (used < text.size() && std::isdigit(static_cast<unsigned char>(text[used]))) {
    if (value > kMaxAllowedBytes) return InvalidArgument(fmt::format("{} '{}': at most 1G is allowed", option, text));
    value = value * 10 + static_cast<unsigned>(text[used] - '0');
    ++used;
  }
  const std::string suffix = text.substr(used);
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = uint64_t{1} << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = uint64_t{1} << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = uint64_t{1} << 30;
  else if (!suffix.empty())
    return InvalidArgument(fmt::format("{} '{}': unknown suffix '{}' (use K, M or G)", option, text, suffix));
  if (value > kMaxAllowedBytes / scale)
    return InvalidArgument(fmt::format("{} '{}': at most 1G is allowed", option, text));
  return static_cast<uint64_t>(value) * scale;
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
        if (connected == nullptr) return Internal(fmt::format("{}: a new comm refused a receive as busy", c.recv->label()));
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
  auto registry = fabric::FabricRegistry::Create(config, ctx);

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

// ---- Output ----

std::string Num(double v, int precision) { return std::isnan(v) ? "-" : fmt::format("{:.{}f}", v, precision); }

void PrintTable(const std::vector<Row>& rows) {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"fabric", "memory", "test", "bytes", "iters", "median_us", "p99_us", "GB/s", "Mmsg/s", "copies",
                   "note"});
  for (const Row& r : rows) {
    const bool measured = r.test != "-";
    cells.push_back({r.fabric, r.memory, r.test, measured ? std::to_string(r.bytes) : "-",
                     measured ? std::to_string(r.iterations) : "-", Num(r.median_us, 2), Num(r.p99_us, 2),
                     Num(r.gbps, 2), Num(r.mmsgs, 3), r.copies, r.note});
  }
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& line : cells)
    for (size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  for (const auto& line : cells) {
    std::string out;
    for (size_t i = 0; i < line.size(); ++i) {
      const bool left = i < 3 || i >= 9;  // names and notes left, numbers right
      if (i + 1 == line.size()) out += line[i];
      else out += left ? fmt::format("{:<{}}  ", line[i], width[i]) : fmt::format("{:>{}}  ", line[i], width[i]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    fmt::print("{}\n", out);
  }
}

void PrintJson(const std::vector<Row>& rows, const Options& o, const std::vector<std::string>& notes) {
  auto number = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  nlohmann::json j;
  j["mode"] = o.processes ? "processes" : "threads";
  j["window"] = o.window;
  j["iterations"] = o.iters;
  j["notes"] = notes;
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows) {
    j["rows"].push_back({{"fabric", r.fabric}, {"memory", r.memory}, {"test", r.test}, {"bytes", r.bytes},
                         {"iterations", r.iterations}, {"median_us", number(r.median_us)},
                         {"p99_us", number(r.p99_us)}, {"gbps", number(r.gbps)}, {"mmsgs", number(r.mmsgs)},
                         {"copies", r.copies}, {"note", r.note}});
  }
  fmt::print("{}\n", j.dump(2));
}

// ---- The topology for directconnect ----

// A 2-worker ring written to a temporary file, removed on destruction.
struct TempTopology {
  std::string path;
  ~TempTopology() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

Status GenerateRing(TempTopology& out) {
  KZ_ASSIGN_OR_RETURN(fabric::directconnect::Topology ring,
                      fabric::directconnect::GenerateRing(2, fabric::directconnect::LinkParams{}));
  const std::string json = fabric::directconnect::TopologyToJson(ring);
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/kizuna-p2p-ring2-XXXXXX.json", tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp");
  UniqueFd fd(::mkstemps(path.data(), 5));
  if (!fd.valid()) return FromErrno(errno, fmt::format("creating the topology file {}", path));
  out.path = path;
  for (size_t at = 0; at < json.size();) {
    const ssize_t n = ::write(fd.get(), json.data() + at, json.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FromErrno(errno, fmt::format("writing the topology file {}", path));
    at += static_cast<size_t>(n);
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-p2p: point-to-point latency and bandwidth of the fabrics between two ranks"};
  Options o;
  std::string min_bytes = "8", max_bytes = "64M", bw_bytes = "1G";
  app.add_option("--fabric", o.fabric, "measure only this fabric (default: every fabric in the registry)");
  app.add_flag("--processes", o.processes, "run as one of two processes started by kizuna-run -n 2 "
                                          "(default: two threads of this process)");
  app.add_option("--min-bytes", min_bytes, "smallest bandwidth message (K/M/G suffixes)")->capture_default_str();
  app.add_option("--max-bytes", max_bytes, "largest bandwidth message, at most 1G")->capture_default_str();
  app.add_option("-f,--factor", o.factor, "size step of the bandwidth sweep (> 1)")->capture_default_str();
  app.add_option("--window", o.window, "sends (and receives) in flight in the bandwidth test")->capture_default_str();
  app.add_option("--iters", o.iters, "latency iterations; most messages per bandwidth size")->capture_default_str();
  app.add_option("--warmup", o.warmup, "latency warm-up iterations")->capture_default_str();
  app.add_option("--bw-bytes", bw_bytes, "bytes to move per bandwidth size (at least 4 messages)")
      ->capture_default_str();
  app.add_option("--memory", o.memory, "host, device (emulated device buffers registered by fd) or all")
      ->capture_default_str();
  app.add_flag("!--no-reference", o.reference, "skip the single-thread memcpy rows");
  app.add_flag("--json", o.json, "print JSON instead of the table");
  app.add_option("--timeout", o.timeout_s, "deadline of each phase in seconds (default: KIZUNA_TIMEOUT)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto usage = [](const Status& s) {
    fmt::print(stderr, "kizuna-p2p: {}\n", s.message());
    return 2;
  };
  auto fail = [](const Status& s) {
    fmt::print(stderr, "kizuna-p2p: {}\n", s.ToString());
    return 1;
  };
  {
    auto v = ParseBytes(min_bytes, "--min-bytes");
    if (!v.ok()) return usage(v.status());
    o.min_bytes = *v;
    v = ParseBytes(max_bytes, "--max-bytes");
    if (!v.ok()) return usage(v.status());
    o.max_bytes = *v;
    v = ParseBytes(bw_bytes, "--bw-bytes");
    if (!v.ok()) return usage(v.status());
    o.bw_bytes = *v;
  }
  if (o.min_bytes == 0 || o.max_bytes < o.min_bytes)
    return usage(InvalidArgument(fmt::format("--min-bytes {} / --max-bytes {}: need 0 < min <= max", o.min_bytes,
                                             o.max_bytes)));
  if (o.max_bytes < kLatencyBytes)
    return usage(InvalidArgument(fmt::format("--max-bytes {}: at least {} (the latency message)", o.max_bytes,
                                             kLatencyBytes)));
  if (!(o.factor > 1.0) || o.factor > 1024) return usage(InvalidArgument(fmt::format("--factor {}: expected 1 < f <= 1024", o.factor)));
  if (o.window < 1 || o.window > 4096) return usage(InvalidArgument(fmt::format("--window {}: expected 1..4096", o.window)));
  if (o.iters < 1) return usage(InvalidArgument(fmt::format("--iters {}: expected at least 1", o.iters)));
  if (o.warmup < 0) return usage(InvalidArgument(fmt::format("--warmup {}: expected 0 or more", o.warmup)));
  if (o.bw_bytes == 0) return usage(InvalidArgument("--bw-bytes 0: expected a positive size"));
  if (o.memory != "host" && o.memory != "device" && o.memory != "all")
    return usage(InvalidArgument(fmt::format("--memory '{}': expected host, device or all", o.memory)));
  if (o.timeout_s < 0) return usage(InvalidArgument(fmt::format("--timeout {}: expected a positive value", o.timeout_s)));

  Config config = GlobalConfig();
  std::vector<std::string> notes;
  TempTopology topology;
  if (config.topology.empty() && (o.fabric.empty() || o.fabric == "directconnect")) {
    if (Status s = GenerateRing(topology); !s.ok()) return fail(s);
    config.topology = topology.path;
    notes.push_back(fmt::format("KIZUNA_TOPOLOGY is not set: directconnect uses a generated 2-worker ring ({})",
                                topology.path));
  } else if (!config.topology.empty()) {
    notes.push_back(fmt::format("directconnect topology: {} (KIZUNA_TOPOLOGY)", config.topology));
  }
  auto devices = device::DeviceRegistry::Create(config);

  Result<std::vector<Row>> rows = std::vector<Row>{};
  if (o.processes) {
    auto made = bootstrap::BootstrapFromEnvironment();
    if (!made.ok()) return fail(made.status().WithContext("bootstrap (is this running under kizuna-run -n 2?)"));
    if ((*made)->size() != 2)
      return fail(InvalidArgument(fmt::format("--processes needs exactly 2 ranks, the job has {}", (*made)->size())));
    rows = RunRank(**made, config, o, devices.get());
    if (!rows.ok()) return fail(rows.status().WithContext(fmt::format("rank {}", (*made)->rank())));
    if ((*made)->rank() != 0) return 0;
    notes.push_back("2 processes under kizuna-run (TCP bootstrap)");
  } else {
    auto boots = bootstrap::CreateInProcessBootstraps(2);
    if (!boots.ok()) return fail(boots.status());
    Result<std::vector<Row>> peer = std::vector<Row>{};
    // Each rank owns its Bootstrap; a rank that fails destroys it on return, which the other sees
    // as kRemoteError instead of waiting for its deadline.
    std::unique_ptr<bootstrap::Bootstrap> b0 = std::move((*boots)[0]), b1 = std::move((*boots)[1]);
    std::thread t([&, b = std::move(b1)]() mutable {
      peer = RunRank(*b, config, o, devices.get());
      b.reset();
    });
    rows = RunRank(*b0, config, o, devices.get());
    b0.reset();
    t.join();
    if (!rows.ok()) return fail(rows.status().WithContext("rank 0"));
    if (!peer.ok()) return fail(peer.status().WithContext("rank 1"));
    notes.push_back("2 threads of one process (in-process bootstrap)");
  }
  if (o.reference) {
    auto ref = MemcpyRows(o);
    if (!ref.ok()) return fail(ref.status().WithContext("memcpy reference"));
    rows->insert(rows->end(), ref->begin(), ref->end());
  }
  notes.push_back(fmt::format("window {}, latency {} iterations after {} warm-up", o.window, o.iters, o.warmup));

  if (o.json) {
    PrintJson(*rows, o, notes);
  } else {
    for (const std::string& n : notes) fmt::print("# {}\n", n);
    PrintTable(*rows);
  }
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
