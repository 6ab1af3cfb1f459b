#include "runtime/bootstrap/launch_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "runtime/bootstrap/launcher_kvs.h"
#include "runtime/core/file.h"
#include "runtime/core/logging.h"

extern char** environ;

namespace kizuna::bootstrap {
namespace {

// One launcher's variable names; local ones may be empty (the launcher does not set them).
struct LauncherVars {
  Launcher launcher;
  std::string_view rank, size, local_rank, local_size;
};

// Innermost first: the order in which a launcher wins when several are present.
constexpr LauncherVars kLaunchers[] = {
    {Launcher::kTorchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {Launcher::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {Launcher::kPmi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {Launcher::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""},
};

const std::string* Find(const Environment& env, std::string_view name) {
  if (name.empty()) return nullptr;
  auto it = env.find(std::string(name));
  return it == env.end() ? nullptr : &it->second;
}

Result<int64_t> ParseInt(std::string_view name, std::string_view text, int64_t lo, int64_t hi) {
  std::string_view t = text;
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\n')) t.remove_suffix(1);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || ptr != t.data() + t.size() || v < lo || v > hi)
    return InvalidArgument(fmt::format("{}='{}' is not an integer in {}..{}", name, text, lo, hi));
  return v;
}

struct Candidate {
  LauncherVars vars;
  int rank, size, local_rank, local_size;
};

// The launcher's values when its rank and size variables are both set; nullopt when neither is.
Result<std::optional<Candidate>> ReadLauncher(const Environment& env, const LauncherVars& v) {
  const std::string* rank = Find(env, v.rank);
  const std::string* size = Find(env, v.size);
  if (rank == nullptr && size == nullptr) return std::optional<Candidate>();
  if (rank == nullptr || size == nullptr) {
    return InvalidArgument(fmt::format("{} is set but {} is not ({} sets both)", rank ? v.rank : v.size,
                                       rank ? v.size : v.rank, LauncherName(v.launcher)));
  }
  Candidate c{v, 0, 1, 0, 0};
  KZ_ASSIGN_OR_RETURN(int64_t s, ParseInt(v.size, *size, 1, kMaxRanks));
  KZ_ASSIGN_OR_RETURN(int64_t r, ParseInt(v.rank, *rank, 0, kMaxRanks));
  if (r >= s)
    return InvalidArgument(fmt::format("{}={} is not below {}={}", v.rank, r, v.size, s));
  c.rank = static_cast<int>(r);
  c.size = static_cast<int>(s);
  const std::string* lrank = Find(env, v.local_rank);
  const std::string* lsize = Find(env, v.local_size);
  if (lrank != nullptr) {
    KZ_ASSIGN_OR_RETURN(int64_t lr, ParseInt(v.local_rank, *lrank, 0, kMaxRanks));
    c.local_rank = static_cast<int>(lr);
  } else {
    c.local_rank = c.rank;  // no local rank: assume a single host
  }
  if (lsize != nullptr) {
    KZ_ASSIGN_OR_RETURN(int64_t ls, ParseInt(v.local_size, *lsize, 1, kMaxRanks));
    c.local_size = static_cast<int>(ls);
    if (c.local_rank >= c.local_size)
      return InvalidArgument(fmt::format("{}={} is not below {}={}", v.local_rank, c.local_rank, v.local_size, ls));
    if (c.local_size > c.size)
      return InvalidArgument(fmt::format("{}={} exceeds {}={}", v.local_size, ls, v.size, c.size));
  }
  if (c.local_rank >= c.size)
    return InvalidArgument(fmt::format("{}={} is not below {}={}", lrank ? v.local_rank : v.rank, c.local_rank, v.size,
                                       c.size));
  return std::optional<Candidate>(c);
}

Status WriteFileAtomically(const std::string& path, const std::string& content) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return FromErrno(errno, fmt::format("creating '{}' (KIZUNA_UNIQUE_ID_FILE's temporary)", tmp));
  auto fail = [&](int err, std::string_view what) {
    unlink(tmp.c_str());
    return FromErrno(err, fmt::format("{} '{}'", what, tmp));
  };
  // O_CREAT's mode is filtered by the umask and ignored for an existing file: make it 0600 for sure.
  if (fchmod(fd.get(), 0600) != 0) return fail(errno, "fchmod");
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(errno, "writing");
    done += static_cast<size_t>(n);
  }
  if (fsync(fd.get()) != 0) return fail(errno, "fsync");
  fd.Reset();
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return FromErrno(err, fmt::format("renaming '{}' to '{}'", tmp, path));
  }
  // Make the rename itself durable, so a reader on another host of a shared file system sees it.
  UniqueFd d(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.valid()) (void)fsync(d.get());
  return Status::Ok();
}

// Reads the id file whole (a few hundred bytes; anything over 4 KiB is not an id, and a FIFO or
// device is not waited on for ever: ReadFileCapped); nullopt when it does not exist yet.
Result<std::optional<std::string>> ReadSmallFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return std::optional<std::string>();
  KZ_ASSIGN_OR_RETURN(std::string content, ReadFileCapped(path, 4096, "KIZUNA_UNIQUE_ID_FILE", 10.0));
  return std::optional<std::string>(std::move(content));
}

}  // namespace

Environment ProcessEnvironment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

std::string_view LauncherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::kNone: return "none";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kOpenMpi: return "Open MPI";
    case Launcher::kPmi: return "PMI";
    case Launcher::kSlurm: return "Slurm";
  }
  return "?";
}

std::string LaunchInfo::Describe() const {
  std::string local = local_size > 0 ? fmt::format("local {} of {}", local_rank, local_size)
                                     : fmt::format("local {}", local_rank);
  if (launcher == Launcher::kNone)
    return fmt::format("rank {} of {} (no launcher detected: a single process)", rank, size);
  return fmt::format("rank {} of {} ({}), from {}", rank, size, local, LauncherName(launcher));
}

Result<LaunchInfo> DetectLaunch(const Environment& env) {
  std::vector<Candidate> found;
  for (const LauncherVars& v : kLaunchers) {
    KZ_ASSIGN_OR_RETURN(std::optional<Candidate> c, ReadLauncher(env, v));
    if (c) found.push_back(*c);
  }
  LaunchInfo info;
  if (found.empty()) return info;
  const Candidate& chosen = found.front();
  info.launcher = chosen.vars.launcher;
  info.rank = chosen.rank;
  info.size = chosen.size;
  info.local_rank = chosen.local_rank;
  info.local_size = chosen.local_size;
  for (size_t i = 1; i < found.size(); ++i) {
    const Candidate& other = found[i];
    if (other.rank == chosen.rank && other.size == chosen.size) continue;
    if (other.vars.launcher == Launcher::kSlurm) {
      info.notes.push_back(fmt::format("ignored {}={}, {}={} (Slurm, outside {}: it started that launcher, or they "
                                       "were inherited from a batch script)",
                                       other.vars.rank, other.rank, other.vars.size, other.size,
                                       LauncherName(chosen.vars.launcher)));
      continue;
    }
    if (other.size < chosen.size) {
      info.notes.push_back(
          fmt::format("ignored {}={}, {}={} ({} started {} processes, each running {}: an outer "
                      "launcher)",
                      other.vars.rank, other.rank, other.vars.size, other.size, LauncherName(other.vars.launcher),
                      other.size, LauncherName(chosen.vars.launcher)));
      continue;
    }
    return InvalidArgument(fmt::format("conflicting launcher variables: {}={}, {}={} ({}) but {}={}, {}={} ({}); "
                                       "unset the variables of the launcher that did not start this process",
                                       chosen.vars.rank, chosen.rank, chosen.vars.size, chosen.size,
                                       LauncherName(chosen.vars.launcher), other.vars.rank, other.rank, other.vars.size,
                                       other.size, LauncherName(other.vars.launcher)));
  }
  return info;
}

Result<std::optional<RootAddress>> ConfiguredRoot(const Config& config, const Environment& env) {
  if (!config.root.empty()) {
    Result<HostPort> hp = ParseHostPort(config.root, "KIZUNA_ROOT");
    if (!hp.ok()) return hp.status();
    return std::optional<RootAddress>(RootAddress{*hp, "KIZUNA_ROOT"});
  }
  const std::string* addr = Find(env, "MASTER_ADDR");
  const std::string* port = Find(env, "MASTER_PORT");
  if (addr == nullptr && port == nullptr) return std::optional<RootAddress>();
  if (addr == nullptr || port == nullptr)
    return InvalidArgument(fmt::format("{} is set but {} is not (torchrun sets both)",
                                       addr ? "MASTER_ADDR" : "MASTER_PORT", addr ? "MASTER_PORT" : "MASTER_ADDR"));
  KZ_ASSIGN_OR_RETURN(int64_t p, ParseInt("MASTER_PORT", *port, 1, 65534));
  std::string host = *addr;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  KZ_RETURN_IF_ERROR(ValidateHost(host, "MASTER_ADDR"));
  // MASTER_PORT itself is torchrun's store: the root listens on the next port.
  return std::optional<RootAddress>(
      RootAddress{HostPort{host, static_cast<uint16_t>(p + 1)}, "MASTER_ADDR:MASTER_PORT+1"});
}

Result<ObtainedUniqueId> ObtainUniqueId(const LaunchInfo& launch, const Config& config, const Environment& env,
                                        Deadline deadline) {
  ObtainedUniqueId out;
  if (!config.unique_id.empty()) {
    Result<UniqueId> id = UniqueId::Parse(config.unique_id);
    if (!id.ok()) return id.status().WithContext("KIZUNA_UNIQUE_ID");
    out.id = *id;
    out.source = UniqueIdSource::kVariable;
    out.detail = "KIZUNA_UNIQUE_ID";
    return out;
  }
  if (!config.unique_id_file.empty()) {
    const std::string& path = config.unique_id_file;
    out.source = UniqueIdSource::kFile;
    if (launch.rank == 0) {
      KZ_ASSIGN_OR_RETURN(out.id, GetUniqueId(config, env));
      KZ_RETURN_IF_ERROR(WriteFileAtomically(path, out.id.ToString() + "\n"));
      out.detail = fmt::format("created by this rank and written to KIZUNA_UNIQUE_ID_FILE '{}'", path);
      return out;
    }
    // Wait for rank 0's rename; the file is complete whenever it exists.
    auto start = Deadline::Clock::now();
    auto sleep = std::chrono::milliseconds(5);
    while (true) {
      KZ_ASSIGN_OR_RETURN(std::optional<std::string> content, ReadSmallFile(path));
      if (content) {
        Result<UniqueId> id = UniqueId::Parse(*content);
        if (!id.ok()) return id.status().WithContext(fmt::format("KIZUNA_UNIQUE_ID_FILE '{}'", path));
        out.id = *id;
        out.detail = fmt::format("read from KIZUNA_UNIQUE_ID_FILE '{}'", path);
        return out;
      }
      if (deadline.Expired()) {
        return Timeout(fmt::format("KIZUNA_UNIQUE_ID_FILE '{}' did not appear within {:.1f} s (rank 0 writes it; is "
                                   "rank 0 running, and is the path on a file system both can see?)",
                                   path, std::chrono::duration<double>(Deadline::Clock::now() - start).count()));
      }
      std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(sleep, deadline.Remaining()));
      sleep = std::min<std::chrono::milliseconds>(sleep * 2, std::chrono::milliseconds(200));
    }
  }
  if (launch.size > 1) {
    KZ_ASSIGN_OR_RETURN(std::unique_ptr<LauncherKvs> kvs, OpenLauncherKvs(env));
    if (kvs != nullptr) {
      std::string mine;
      if (launch.rank == 0) {
        KZ_ASSIGN_OR_RETURN(UniqueId id, GetUniqueId(config, env));
        mine = id.ToString();
      }
      Result<std::string> shared = kvs->Share(launch.rank, "kizuna_unique_id", mine, deadline);
      if (!shared.ok()) return shared.status().WithContext("passing the unique id through the launcher");
      Result<UniqueId> id = UniqueId::Parse(*shared);
      if (!id.ok()) return id.status().WithContext(fmt::format("the unique id from {}", kvs->Describe()));
      out.id = *id;
      out.source = UniqueIdSource::kLauncher;
      out.detail = fmt::format("{} through the launcher's store, {}", launch.rank == 0 ? "created and shared" : "read",
                               kvs->Describe());
      return out;
    }
  }
  if (launch.size == 1) {
    KZ_ASSIGN_OR_RETURN(out.id, CreateUniqueId(HostPort{"127.0.0.1", 0}));
    out.source = UniqueIdSource::kGenerated;
    out.detail = "created for a single-rank job";
    return out;
  }
  return InvalidArgument(fmt::format(
      "no rendezvous id for {}: set KIZUNA_UNIQUE_ID to the id printed by rank 0's GetUniqueId (kizuna-run sets it), "
      "or KIZUNA_UNIQUE_ID_FILE to a fresh path all ranks can read (rank 0 writes it, the others wait for it), or "
      "have rank 0 call GetUniqueId() and distribute the text yourself (MPI_Bcast, a torch store); launchers with "
      "a key-value store need none of these (MPICH's mpirun: PMI-1, PMI_FD; Open MPI's: PMIx, PMIX_RANK)",
      launch.Describe()));
}

Result<std::unique_ptr<Bootstrap>> BootstrapFromEnvironment() {
  const Config& config = GlobalConfig();
  Deadline deadline = Deadline::AfterSeconds(config.timeout_s);
  Environment env = ProcessEnvironment();
  KZ_ASSIGN_OR_RETURN(LaunchInfo launch, DetectLaunch(env));
  KZ_INFO(kLogBootstrap, "launcher: {}", launch.Describe());
  for (const std::string& note : launch.notes) KZ_INFO(kLogBootstrap, "launcher: {}", note);
  KZ_ASSIGN_OR_RETURN(ObtainedUniqueId id, ObtainUniqueId(launch, config, env, deadline));
  KZ_INFO(kLogBootstrap, "unique id {} {}", id.id.Redacted(), id.detail);
  return CreateTcpBootstrap(id.id, launch.rank, launch.size, deadline);
}

}  // namespace kizuna::bootstrap
