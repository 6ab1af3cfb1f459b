#include "runtime/job_status.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <openssl/sha.h>

#include "runtime/bootstrap/auth.h"
#include "runtime/core/host_id.h"
#include "runtime/core/logging.h"
#include "runtime/core/unique_fd.h"

namespace kizuna::status {
namespace {

// The handshake's ends: outside every rank's range, so that a status exchange can never pass for
// a bootstrap connection (the MACs cover them).
constexpr uint32_t kClientEnd = 0xfffffffe;
constexpr uint32_t kServerEnd = 0xfffffffd;
constexpr char kRequest[8] = {'s', 't', 'a', 't', 'u', 's', '?', '\n'};
constexpr size_t kMaxAnswerBytes = size_t{64} << 20;
// How long one question may take the server: a client that stalls cannot hold it longer.
constexpr double kServeWaitS = 2.0;

// Waits for `events` on fd until `deadline`: ok, kTimeout, or the poll's error.
Status WaitFd(int fd, short events, Deadline deadline, std::string_view what) {
  while (true) {
    pollfd p{fd, events, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.Remaining()).count();
    const int r = poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    if (r > 0) return Status::Ok();
    if (r == 0) return Timeout(fmt::format("{}: no answer in time", what));
    if (errno != EINTR) return FromErrno(errno, std::string(what));
  }
}

Status WriteAll(int fd, const void* data, size_t n, Deadline deadline, std::string_view what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, what));
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w < 0) return FromErrno(errno, std::string(what));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Up to `cap` bytes until the peer closes (or exactly `exact` bytes when given).
Result<std::string> ReadAll(int fd, size_t cap, Deadline deadline, std::string_view what, size_t exact = 0) {
  std::string out;
  char buf[65536];
  while (exact == 0 || out.size() < exact) {
    KZ_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, what));
    const size_t want = exact > 0 ? std::min(sizeof buf, exact - out.size()) : sizeof buf;
    const ssize_t r = recv(fd, buf, want, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) return FromErrno(errno, std::string(what));
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > cap) return InvalidArgument(fmt::format("{}: more than {} bytes", what, cap));
  }
  if (exact > 0 && out.size() != exact) return RemoteError(fmt::format("{}: the other end closed", what));
  return out;
}

sockaddr_un Address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), std::min(path.size(), sizeof a.sun_path - 1));
  return a;
}

// A process's server for one job: its socket, its thread, and the communicators it describes.
class Server {
 public:
  Server(std::string path, UniqueFd listener, const bootstrap::Secret& secret)
      : path_(std::move(path)), listener_(std::move(listener)), secret_(secret) {
    if (pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
    thread_ = std::thread([this] { Loop(); });
  }
  ~Server() {
    stop_.store(true);
    if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
    thread_.join();
    unlink(path_.c_str());
    // The job's folder goes with its last process's socket (rmdir fails while others remain; the
    // socket of a process that was killed stays, naming it gone, until the folder is removed).
    rmdir(path_.substr(0, path_.rfind('/')).c_str());
    for (int fd : wake_)
      if (fd >= 0) close(fd);
  }
  uint64_t Add(Describe d) {
    std::lock_guard lock(mu_);
    comms_.emplace(next_, std::move(d));
    return next_++;
  }
  void Remove(uint64_t token) {
    std::lock_guard lock(mu_);  // not while the thread describes: the communicator goes next
    comms_.erase(token);
  }

 private:
  void Loop() {
    while (!stop_.load()) {
      pollfd p[2] = {{listener_.get(), POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (poll(p, wake_[0] >= 0 ? 2 : 1, wake_[0] >= 0 ? -1 : 200) <= 0) continue;
      if (stop_.load()) break;
      if (!(p[0].revents & POLLIN)) continue;
      UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!fd.valid()) continue;
      const Status s = Answer(fd.get());
      if (!s.ok()) KZ_INFO(kLogInit, "job status: a question went unanswered: {}", s.ToString());
    }
  }

  Status Answer(int fd) {
    const Deadline deadline = Deadline::AfterSeconds(kServeWaitS);
    KZ_RETURN_IF_ERROR(bootstrap::AuthenticateAsServer(fd, secret_, kServerEnd, deadline, "a status client").status());
    KZ_ASSIGN_OR_RETURN(std::string request, ReadAll(fd, sizeof kRequest, deadline, "the request", sizeof kRequest));
    if (std::memcmp(request.data(), kRequest, sizeof kRequest) != 0) return InvalidArgument("an unknown request");
    nlohmann::ordered_json comms = nlohmann::ordered_json::array();
    {
      std::lock_guard lock(mu_);
      for (auto& [token, describe] : comms_) comms.push_back(describe());
    }
    const nlohmann::ordered_json answer = {
        {"pid", static_cast<int>(getpid())}, {"host", HostId()}, {"communicators", std::move(comms)}};
    const std::string text = answer.dump();
    return WriteAll(fd, text.data(), text.size(), deadline, "the answer");
  }

  const std::string path_;
  UniqueFd listener_;
  const bootstrap::Secret secret_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int wake_[2] = {-1, -1};
  std::mutex mu_;
  std::map<uint64_t, Describe> comms_;  // mu_
  uint64_t next_ = 0;                   // mu_
};

class ServedRegistration final : public Registration {
 public:
  ServedRegistration(std::shared_ptr<Server> server, uint64_t token) : server_(std::move(server)), token_(token) {}
  ~ServedRegistration() override { server_->Remove(token_); }

 private:
  std::shared_ptr<Server> server_;
  uint64_t token_;
};

class Unserved final : public Registration {};

std::mutex g_mu;
std::map<std::string, std::weak_ptr<Server>> g_servers;  // by job folder; g_mu

// The sockets of a job's folder (r<R>-p<PID>.sock), as answers still to ask for; opendir's error,
// named `what`, where the folder cannot be read.
Result<std::vector<ProcessAnswer>> SocketsIn(const std::string& job, std::string_view what) {
  DIR* d = opendir(job.c_str());
  if (d == nullptr) return FromErrno(errno, what);
  std::vector<ProcessAnswer> out;
  while (dirent* e = readdir(d)) {
    ProcessAnswer a;
    char tail[8] = {};
    if (std::sscanf(e->d_name, "r%d-p%d.sock%7s", &a.rank, &a.pid, tail) != 2) continue;
    a.socket = fmt::format("{}/{}", job, e->d_name);
    out.push_back(std::move(a));
  }
  closedir(d);
  return out;
}

// Folders of jobs none of whose processes lives any more, under `base` but `keep`: a process that
// was killed cannot remove its socket, and the folder of a job that lost its last process that way
// would stay for good. A live job's folder stays whole (its dead ranks' sockets name them gone).
void SweepEndedJobs(const std::string& base, const std::string& keep) {
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return;
  std::vector<std::string> jobs;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') jobs.push_back(fmt::format("{}/{}", base, e->d_name));
  closedir(d);
  for (const std::string& job : jobs) {
    if (job == keep) continue;
    auto sockets = SocketsIn(job, job);
    // An empty folder may be a process's that has not bound its socket yet.
    if (!sockets.ok() || sockets->empty()) continue;
    const bool alive = std::any_of(sockets->begin(), sockets->end(),
                                   [](const ProcessAnswer& a) { return kill(a.pid, 0) == 0 || errno != ESRCH; });
    if (alive) continue;
    for (const ProcessAnswer& a : *sockets) unlink(a.socket.c_str());
    rmdir(job.c_str());  // fails, and the folder stays, where it holds anything else
  }
}

Result<std::shared_ptr<Server>> ServerFor(const bootstrap::UniqueId& id, const std::string& run_dir, int rank) {
  const std::string dir = JobDir(id, run_dir);
  std::lock_guard lock(g_mu);
  if (auto s = g_servers[dir].lock()) return s;
  const std::string base = dir.substr(0, dir.rfind('/'));
  for (const std::string& d : {base, dir}) {
    if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return FromErrno(errno, fmt::format("making {}", d));
  }
  SweepEndedJobs(base, dir);
  const std::string path = fmt::format("{}/r{}-p{}.sock", dir, rank, getpid());
  if (path.size() >= sizeof(sockaddr_un{}.sun_path))
    return InvalidArgument(fmt::format("{}: longer than a Unix socket's path may be (KIZUNA_RUN_DIR shorter)", path));
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return FromErrno(errno, "a Unix socket for the job's status");
  unlink(path.c_str());  // a pid reused from a dead process of the same job
  const sockaddr_un a = Address(path);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    return FromErrno(errno, fmt::format("binding {}", path));
  if (listen(fd.get(), 16) != 0) return FromErrno(errno, fmt::format("listening on {}", path));
  auto server = std::make_shared<Server>(path, std::move(fd), id.secret);
  g_servers[dir] = server;
  KZ_INFO(kLogInit, "rank {}: kizuna-status reaches this process at {}", rank, path);
  return server;
}

}  // namespace

std::string JobDir(const bootstrap::UniqueId& id, const std::string& run_dir) {
  std::string material = "kizuna-status job:";
  material.append(reinterpret_cast<const char*>(id.secret.data()), id.secret.size());
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(material.data()), material.size(), digest);
  std::string job;
  for (int i = 0; i < 8; ++i) job += fmt::format("{:02x}", digest[i]);
  const std::string base = run_dir.empty() ? fmt::format("/tmp/kizuna-{}", getuid()) : run_dir;
  return fmt::format("{}/{}", base, job);
}

std::unique_ptr<Registration> Serve(const bootstrap::UniqueId& id, const std::string& run_dir, int rank,
                                    Describe describe) {
  auto server = ServerFor(id, run_dir, rank);
  if (!server.ok()) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      KZ_WARN(kLogInit, "rank {}: kizuna-status will not reach this process: {}", rank, server.status().ToString());
    });
    return std::make_unique<Unserved>();
  }
  const uint64_t token = (*server)->Add(std::move(describe));
  return std::make_unique<ServedRegistration>(std::move(*server), token);
}

Result<std::vector<ProcessAnswer>> AskJob(const bootstrap::UniqueId& id, const std::string& run_dir, double wait_s) {
  const std::string dir = JobDir(id, run_dir);
  KZ_ASSIGN_OR_RETURN(std::vector<ProcessAnswer> out,
                      SocketsIn(dir, fmt::format("{} (the job's folder: no process of this job serves status here; "
                                                 "is KIZUNA_RUN_DIR the job's?)",
                                                 dir)));
  std::sort(out.begin(), out.end(), [](const ProcessAnswer& x, const ProcessAnswer& y) { return x.rank < y.rank; });
  for (ProcessAnswer& a : out) {
    const Deadline deadline = Deadline::AfterSeconds(wait_s);
    UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return FromErrno(errno, "a Unix socket");
    const sockaddr_un addr = Address(a.socket);
    if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      a.state = errno == ECONNREFUSED || errno == ENOENT ? ProcessAnswer::State::kGone : ProcessAnswer::State::kSilent;
      a.why = fmt::format("connect: {}", std::strerror(errno));
      continue;
    }
    Status s = bootstrap::AuthenticateAsClient(fd.get(), id.secret, bootstrap::Route{kClientEnd, kServerEnd}, deadline,
                                               a.socket);
    if (s.ok()) s = WriteAll(fd.get(), kRequest, sizeof kRequest, deadline, "the request");
    Result<std::string> text = s.ok() ? ReadAll(fd.get(), kMaxAnswerBytes, deadline, "the answer") : s;
    if (!text.ok()) {
      const bool silent = text.status().code() == StatusCode::kTimeout;
      a.state = silent ? ProcessAnswer::State::kSilent : ProcessAnswer::State::kRefused;
      a.why = silent ? fmt::format("no answer within {:.1f} s", wait_s) : text.status().ToString();
      continue;
    }
    a.answer = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (a.answer.is_discarded() || !a.answer.is_object()) {
      a.state = ProcessAnswer::State::kRefused;
      a.why = "a malformed answer";
    }
  }
  return out;
}

}  // namespace kizuna::status
