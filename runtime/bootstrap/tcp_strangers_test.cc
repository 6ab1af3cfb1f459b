// What a party without the secret can try against the TCP bootstrap beyond sending garbage (see
// tcp_bootstrap_test.cc for that): holding every authentication slot with silent connections,
// reflecting a rank's own handshake back to it from a departed rank's port, and flooding the log.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/bootstrap/auth.h"
#include "runtime/bootstrap/bootstrap.h"
#include "runtime/bootstrap/test_util.h"
#include "runtime/core/logging.h"

namespace kizuna::bootstrap {
namespace {

using testing::CapturedLog;
using testing::Contains;
using testing::Count;
using testing::In;
using testing::OnThreads;
using testing::Pattern;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A plain connection to 127.0.0.1:port, or an invalid fd (nobody listens there any more).
UniqueFd TryConnect(uint16_t port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return UniqueFd();
  return fd;
}

// Slowloris: strangers that connect and send nothing fill every slot for authenticating
// connections and refill them as they are dropped. The oldest unauthenticated connection gives way
// to a new one, so the real ranks still get through, well within a deadline much shorter than the
// time a silent connection is allowed.
TEST(TcpBootstrap, AFloodOfSilentStrangersDoesNotKeepTheRanksOut) {
  UniqueId id = testing::LoopbackId();
  TcpBootstrapOptions options;
  options.max_pending_connections = 8;
  options.handshake_timeout_s = 30;
  // Twice as many as there are slots before any rank starts (the root's socket already listens),
  // then one more every 20 ms for as long as the ranks are joining.
  std::vector<UniqueFd> strangers;
  for (int i = 0; i < 16; ++i) strangers.push_back(testing::ConnectRaw(id.root));
  std::atomic<bool> joining{true};
  std::thread flood([&] {
    for (int i = 0; i < 200 && joining.load(); ++i) {
      strangers.push_back(TryConnect(id.root.port));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto start = Clock::now();
  std::vector<Status> got = OnThreads<Status>(3, [&](int r) -> Status {
    auto b = CreateTcpBootstrap(id, r, 3, In(3), options);
    if (!b.ok()) return b.status();
    return (*b)->Barrier(In(3));
  });
  joining = false;
  flood.join();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].ToString();
  EXPECT_LT(Since(start), 3.5);
}

// "listening for peers at HOST:PORT" of rank `rank`, from the INFO lines.
uint16_t PeerPortFromLog(const std::string& log, int rank, int size) {
  std::string who = fmt::format("bootstrap rank {}/{}: joined the root", rank, size);
  size_t at = log.find(who);
  if (at == std::string::npos) return 0;
  const std::string marker = "listening for peers at 127.0.0.1:";
  size_t m = log.find(marker, at);
  if (m == std::string::npos) return 0;
  return static_cast<uint16_t>(std::atoi(log.c_str() + m + marker.size()));
}

// A listening socket on 127.0.0.1:port (the port of a rank that has left).
UniqueFd ListenOn(uint16_t port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd.get(), 4) != 0) return UniqueFd();
  return fd;
}

// Copies exactly n bytes from one socket to another; false when either end closes first.
bool Relay(int from, int to, size_t n) {
  std::vector<uint8_t> buf(n);
  size_t got = 0;
  while (got < n) {
    pollfd p{from, POLLIN, 0};
    if (poll(&p, 1, 3000) <= 0) return false;
    ssize_t k = read(from, buf.data() + got, n - got);
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return write(to, buf.data(), n) == static_cast<ssize_t>(n);
}

// A frame as the bootstrap writes it: "KZBF", type, tag, 0 (u32 each), length (u64), payload;
// little-endian.
std::string Frame(uint32_t type, uint32_t tag, const std::string& payload) {
  std::string f;
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) f.push_back(static_cast<char>(v >> (8 * i)));
  };
  u32(0x46425a4b);
  u32(type);
  u32(tag);
  u32(0);
  uint64_t length = payload.size();
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>(length >> (8 * i)));
  return f + payload;
}

// A party without the secret that can take a connection meant for a rank (here: it listens on the
// port of a rank that has left) must not be able to use that rank's handshake elsewhere: relayed
// (reflected) to the sender's own listener, it would otherwise come back as an authenticated
// connection on which anything can be sent in any rank's name.
TEST(TcpBootstrap, AHandshakeReflectedToItsSenderIsRefused) {
  CapturedLog log(LogLevel::kInfo);
  testing::TcpJob job = testing::CreateTcpJob(3);
  for (const Status& s : job.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  uint16_t port1 = PeerPortFromLog(log.Read(), 1, 3);
  uint16_t port2 = PeerPortFromLog(log.Read(), 2, 3);
  ASSERT_NE(port1, 0) << log.Read();
  ASSERT_NE(port2, 0) << log.Read();
  job.ranks[2].reset();  // rank 2 leaves; the stranger takes its port
  UniqueFd trap = ListenOn(port2);
  ASSERT_TRUE(trap.valid()) << "cannot listen on rank 2's old port " << port2;

  std::atomic<bool> injected{false};
  std::thread stranger([&] {
    pollfd p{trap.get(), POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) return;
    UniqueFd victim(accept(trap.get(), nullptr, nullptr));  // rank 1, sending to "rank 2"
    UniqueFd back = testing::ConnectRaw(HostPort{"127.0.0.1", port1});  // rank 1's own listener
    if (!victim.valid() || !back.valid()) return;
    if (!Relay(victim.get(), back.get(), kClientHelloBytes)) return;  // rank 1's hello ...
    if (!Relay(back.get(), victim.get(), kServerHelloBytes)) return;  // ... answered by rank 1 ...
    if (!Relay(victim.get(), back.get(), kClientProofBytes)) return;  // ... and proved by rank 1.
    std::string hello;
    for (uint32_t v : {0u, 1u})
      for (int i = 0; i < 4; ++i) hello.push_back(static_cast<char>(v >> (8 * i)));
    std::string frames = Frame(6, 0, hello) + Frame(7, 9, "forged by a stranger");  // as rank 0
    injected = write(back.get(), frames.data(), frames.size()) == static_cast<ssize_t>(frames.size());
    // Hold both ends open until rank 1 has looked.
    testing::ClosedByPeerWithin(back.get(), 3);
  });
  Bytes data = Pattern(100, 1, 2);
  Status sent = job.ranks[1]->Send(2, 1, data, In(3));
  auto got = job.ranks[1]->Recv(0, 9, In(1));
  stranger.join();
  EXPECT_FALSE(got.ok()) << "rank 1 received a message the stranger sent in rank 0's name (handshake "
                         << (injected ? "reflected" : "?") << ")";
  EXPECT_FALSE(sent.ok()) << "rank 1's Send to the stranger was reported delivered";
  EXPECT_TRUE(Contains(log.Read(), "addressed to rank 2")) << log.Read();
}

// Each rejected stranger is worth a warning, but strangers decide how many there are: after a
// burst the warnings thin out to about one a second, and the next one shown counts the rest.
// Nothing here guesses how long the root takes: every rejection is logged (those not shown at
// TRACE), so the test waits until the root has dealt with each stranger, and rank 1 joins (ending
// the root's rendezvous) only when the test lets it.
TEST(TcpBootstrap, WarningsAboutStrangersAreRateLimited) {
  // The rate limit (tcp_internal.h): a burst of 32 warnings, then one a second.
  constexpr size_t kBurst = 32;
  constexpr double kPerSecond = 1;
  CapturedLog log(LogLevel::kTrace);
  UniqueId id = testing::LoopbackId();
  std::promise<void> let_rank1_join;
  std::shared_future<void> rank1_may_join = let_rank1_join.get_future().share();
  std::thread ranks([&] {
    std::vector<Status> got = OnThreads<Status>(2, [&](int r) -> Status {
      if (r == 1) rank1_may_join.wait();
      return CreateTcpBootstrap(id, r, 2, In(120)).status();
    });
    EXPECT_TRUE(got[0].ok()) << got[0].ToString();
    EXPECT_TRUE(got[1].ok()) << got[1].ToString();
  });
  // Rejections the root has logged (a warning shown, or its TRACE line), once there are `n`.
  auto logged_rejections = [&](size_t n) {
    const Deadline deadline = In(30);
    while (Count(log.Read(), "rejected a connection from") < n && !deadline.Expired())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Count(log.Read(), "rejected a connection from");
  };
  // A port scan: 100 connections, each closed at once; then another one after a second and more.
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < 100; ++i) testing::ConnectRaw(id.root).Reset();
  EXPECT_EQ(logged_rejections(100), 100u) << log.Read();
  // Not a wait for something to happen: the bucket refills with time (kPerSecond), so 1.2 s after
  // the root rejected the last of the scan it has a warning to spare. A busy machine can only make
  // the pause longer, which the upper bound below allows for.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  testing::ConnectRaw(id.root).Reset();
  EXPECT_EQ(logged_rejections(101), 101u) << log.Read();
  // Between the first rejection and the last the bucket refilled by at most this many warnings.
  const double refill = Since(start) * kPerSecond;
  let_rank1_join.set_value();
  ranks.join();

  const std::string text = log.Read();
  std::vector<std::string> shown;  // the warnings, in order
  for (size_t b = 0, e; b < text.size(); b = e + 1) {
    e = text.find('\n', b);
    if (e == std::string::npos) e = text.size();
    const std::string line = text.substr(b, e - b);
    if (Contains(line, "WARN BOOTSTRAP") && Contains(line, "rejected a connection from")) shown.push_back(line);
  }
  // The whole burst, and the one after the pause; no more than the burst and the refill.
  EXPECT_GE(shown.size(), kBurst + 1) << text;
  EXPECT_LE(shown.size(), kBurst + static_cast<size_t>(refill)) << "refill " << refill << "\n" << text;
  ASSERT_FALSE(shown.empty()) << text;
  EXPECT_TRUE(Contains(shown.back(), "more rejected connections not shown")) << text;
}

}  // namespace
}  // namespace kizuna::bootstrap
