// Helpers of the bootstrap tests: ranks as threads, raw sockets for strangers, captured logs.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/bootstrap/bootstrap.h"
#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/config.h"
#include "runtime/core/deadline.h"
#include "runtime/core/logging.h"
#include "runtime/core/status.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::bootstrap::testing {

inline Deadline In(double seconds) { return Deadline::AfterSeconds(seconds); }

// Runs fn(rank) on `n` threads at once and returns what each returned.
template <typename T>
std::vector<T> OnThreads(int n, const std::function<T(int)>& fn) {
  std::vector<T> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  return out;
}

// A fresh id on the loopback address (the root's socket reserved in this process).
inline UniqueId LoopbackId(const char* host = "127.0.0.1") {
  Result<UniqueId> id = CreateUniqueId(HostPort{host, 0});
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  return id.ok() ? *id : UniqueId{};
}

// Creates `n` TCP ranks of one job concurrently; result[r] is null where creation failed (and
// statuses[r] says why).
struct TcpJob {
  UniqueId id;
  std::vector<std::unique_ptr<Bootstrap>> ranks;
  std::vector<Status> statuses;
};

inline TcpJob CreateTcpJob(int n, double timeout_s = 20, const TcpBootstrapOptions& options = {},
                           const char* host = "127.0.0.1") {
  TcpJob job;
  job.id = LoopbackId(host);
  job.ranks.resize(n);
  job.statuses.resize(n);
  std::vector<std::thread> threads;
  Deadline deadline = In(timeout_s);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Result<std::unique_ptr<Bootstrap>> b = CreateTcpBootstrap(job.id, r, n, deadline, options);
      job.statuses[r] = b.status();
      if (b.ok()) job.ranks[r] = std::move(b).value();
    });
  }
  for (std::thread& t : threads) t.join();
  return job;
}

// A plain TCP connection to `hp` (no handshake): a stranger's.
inline UniqueFd ConnectRaw(const HostPort& hp) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET, hp.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(hp.port);
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, hp.host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(hp.port);
    len = sizeof(sockaddr_in6);
  } else {
    ADD_FAILURE() << "ConnectRaw needs a literal address, got " << hp.host;
    return UniqueFd();
  }
  UniqueFd fd(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid() || connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    ADD_FAILURE() << "cannot connect to " << hp.ToString();
    return UniqueFd();
  }
  return fd;
}

// True when the peer closes `fd` (EOF or reset) within `seconds`, reading and discarding what
// arrives meanwhile.
inline bool ClosedByPeerWithin(int fd, double seconds) {
  Deadline d = Deadline::AfterSeconds(seconds);
  char buf[256];
  while (!d.Expired()) {
    pollfd p{fd, POLLIN, 0};
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(d.Remaining()).count()) + 1;
    if (poll(&p, 1, ms) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
  return false;
}

// A port free on 127.0.0.1 just now (bound, then released).
inline uint16_t FreePort() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return 0;
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

// `bytes` of a pattern that depends on (a, b).
inline Bytes Pattern(size_t bytes, int a, int b) {
  Bytes out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(i * 131 + a * 17 + b * 5 + (i >> 8));
  return out;
}

inline bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Sends this process's WARN (or also INFO) lines to a file for the test's duration.
class CapturedLog {
 public:
  explicit CapturedLog(LogLevel level = LogLevel::kWarn) {
    path_ = fmt::format("{}/bootstrap_log_{}.txt", getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp", getpid());
    std::remove(path_.c_str());
    Config c;
    c.debug = level;
    c.debug_file = path_;
    ConfigureLogging(c);
  }
  ~CapturedLog() { ConfigureLogging(Config()); }
  std::string Read() const {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string path_;
};

// How often `needle` occurs in `text`.
inline size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace kizuna::bootstrap::testing
