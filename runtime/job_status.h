// A job's status, asked from outside while it runs (kizuna-status): every process of a job that
// met through a unique id serves its communicators' flight records on a Unix-domain socket in the
// job's run directory, to a client that proves it knows the job's secret (the bootstrap's
// handshake, runtime/bootstrap/auth.h, in both directions).
//
//   <run dir>/<job>/r<R>-p<PID>.sock   R: the process's rank in the first communicator it made in
//                                      the job; <job>: a hash of the secret (not the secret)
//
// The run directory is KIZUNA_RUN_DIR, else /tmp/kizuna-<uid>; the job's folder is private to the
// user (0700). A process serves from its first such communicator's creation until its last one
// of the job is destroyed; one thread, asleep in poll() between questions. A socket whose process
// died stays behind (its connect is refused: the rank is gone); a stopped process's connect
// succeeds but nothing answers (the client's deadline says so). The last process to leave removes
// the job's folder when nothing else is in it.
//
// The answer, one JSON object: {"pid", "host", "communicators": [{"rank", "size", "comm" (world,
// or split / shrink and its size), "async_error", "now_s", "records": [...]}]} where records are
// the flight recorder's (Communicator::FlightRecord).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/core/deadline.h"
#include "runtime/core/status.h"

namespace kizuna::status {

// The job's folder: <run_dir or /tmp/kizuna-<uid>>/<hash of the id's secret>.
std::string JobDir(const bootstrap::UniqueId& id, const std::string& run_dir);

// A communicator's part of the answer, asked on the server's thread while the communicator lives.
using Describe = std::function<nlohmann::ordered_json()>;

// Served while held: the communicator keeps it and drops it before it goes.
class Registration {
 public:
  virtual ~Registration() = default;
};

// Registers a communicator of job `id`; its process serves the job from the first registration.
// Errors (the folder cannot be made, the socket not bound) are logged once and give a
// registration that serves nothing: status is for operators, never a reason for a job to fail.
std::unique_ptr<Registration> Serve(const bootstrap::UniqueId& id, const std::string& run_dir, int rank,
                                    Describe describe);

// One process's answer, as kizuna-status gathers them.
struct ProcessAnswer {
  std::string socket;  // its path
  int rank = -1;       // from the socket's name
  int pid = 0;
  enum class State { kAnswered, kGone, kSilent, kRefused } state = State::kAnswered;
  std::string why;                // for kGone, kSilent, kRefused
  nlohmann::ordered_json answer;  // kAnswered
};

// Asks every process of job `id` found in its folder, each within `wait_s`.
Result<std::vector<ProcessAnswer>> AskJob(const bootstrap::UniqueId& id, const std::string& run_dir, double wait_s);

}  // namespace kizuna::status
