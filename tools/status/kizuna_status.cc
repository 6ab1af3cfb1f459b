// kizuna-status: what a running job is doing, asked from outside (runtime/job_status.h).
//
//   kizuna-status [--id ID | --pid PID] [--run-dir DIR] [--wait S] [--json]
//
// The job is named by its unique id (the printable form, with the secret that authenticates the
// question): --id, else the KIZUNA_UNIQUE_ID of process PID (--pid: any rank's process, read from
// /proc), else this shell's KIZUNA_UNIQUE_ID. Every process of the job that serves its status in
// the job's folder is asked; the table has a row per rank of the job's first communicator (split
// and shrunk ones follow): its process and state (running, idle, failed, stopped, gone, silent),
// the last operation it finished, the one it runs and for how long, what it waits on; then the
// slowest rank: the one the others wait for. --json prints the same as one JSON object.
//
// Exit status: 0 when every rank answered, 3 when some did not (stopped, gone, silent), 1 when the
// job cannot be asked (no folder, a malformed id), 2 for a bad command line.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/bootstrap/unique_id.h"
#include "runtime/job_status.h"

namespace kizuna {
namespace {

using Json = nlohmann::ordered_json;

// A variable of process `pid`'s environment (/proc/PID/environ), or nothing.
std::optional<std::string> EnvironOf(int pid, const std::string& name) {
  std::ifstream in(fmt::format("/proc/{}/environ", pid), std::ios::binary);
  std::string entry;
  while (std::getline(in, entry, '\0'))
    if (entry.rfind(name + "=", 0) == 0) return entry.substr(name.size() + 1);
  return std::nullopt;
}

// "stopped (SIGSTOP)" for a stopped process, "gone" for none, "" otherwise (/proc/PID/stat).
std::string ProcessState(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(in, line)) return "gone";
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return "";
  const char state = line[paren + 2];
  if (state == 'T' || state == 't') return "stopped (SIGSTOP)";
  if (state == 'Z') return "gone (a zombie)";
  return "";
}

struct Row {
  int rank = -1, pid = 0, size = 0;
  std::string comm = "world", host, state, last_call, current_call, waiting, error;
  int64_t last_seq = -1, current_seq = -1;
  double running_s = 0;
  bool answered = false;
};

// A communicator's row from its flight records.
Row RowOf(const Json& c, int pid) {
  Row row;
  row.answered = true;
  row.pid = pid;
  row.rank = c.value("rank", -1);
  row.size = c.value("size", 0);
  row.comm = c.value("comm", "world");
  const std::string host = c.value("host", "");
  row.host = host.substr(0, host.find(':'));
  row.error = c.value("async_error", "");
  const double now = c.value("now_s", 0.0);
  for (const Json& r : c.value("records", Json::array())) {
    const int64_t seq = r.value("seq", int64_t{0});
    if (seq == 0) continue;  // point to point
    const std::string state = r.value("state", "");
    if (state == "running") {
      row.current_seq = seq;
      row.current_call = r.value("call", "");
      row.running_s = now - r.value("start_s", now);
      row.waiting = r.value("waiting", "");
    } else if (seq > row.last_seq) {
      row.last_seq = seq;
      row.last_call = r.value("call", "");
    }
  }
  row.state = !row.error.empty() ? "failed" : row.current_seq >= 0 ? "running" : "idle";
  return row;
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-status: what a running job's ranks are doing, and which one the others wait for",
               "kizuna-status"};
  std::string id_text, run_dir;
  int pid = 0;
  double wait_s = 2;
  bool json = false;
  app.add_option("--id", id_text, "the job's unique id (printable form)");
  app.add_option("--pid", pid, "a process of the job: its KIZUNA_UNIQUE_ID (and KIZUNA_RUN_DIR) are used");
  app.add_option("--run-dir", run_dir, "the job's KIZUNA_RUN_DIR (default: the process's, or /tmp/kizuna-<uid>)");
  app.add_option("--wait", wait_s, "seconds each process may take to answer")->capture_default_str();
  app.add_flag("--json", json, "print JSON instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (id_text.empty() && pid > 0) {
    id_text = EnvironOf(pid, "KIZUNA_UNIQUE_ID").value_or("");
    if (id_text.empty()) {
      std::fprintf(stderr, "kizuna-status: process %d has no KIZUNA_UNIQUE_ID (or is not readable); pass --id\n", pid);
      return 1;
    }
    if (run_dir.empty()) run_dir = EnvironOf(pid, "KIZUNA_RUN_DIR").value_or("");
  }
  if (id_text.empty() && std::getenv("KIZUNA_UNIQUE_ID") != nullptr) id_text = std::getenv("KIZUNA_UNIQUE_ID");
  if (run_dir.empty() && std::getenv("KIZUNA_RUN_DIR") != nullptr) run_dir = std::getenv("KIZUNA_RUN_DIR");
  if (id_text.empty()) {
    std::fprintf(stderr, "kizuna-status: which job? pass --id ID or --pid PID (or set KIZUNA_UNIQUE_ID)\n");
    return 2;
  }
  auto id = bootstrap::UniqueId::Parse(id_text);
  if (!id.ok()) {
    std::fprintf(stderr, "kizuna-status: %s\n", id.status().ToString().c_str());
    return 1;
  }
  auto answers = status::AskJob(*id, run_dir, wait_s);
  if (!answers.ok()) {
    std::fprintf(stderr, "kizuna-status: %s\n", answers.status().ToString().c_str());
    return 1;
  }

  // Rows: every answered communicator; a row per process that did not answer.
  std::vector<Row> rows;
  for (const status::ProcessAnswer& a : *answers) {
    if (a.state == status::ProcessAnswer::State::kAnswered) {
      for (const Json& c : a.answer.value("communicators", Json::array())) rows.push_back(RowOf(c, a.pid));
      continue;
    }
    Row row;
    row.rank = a.rank;
    row.pid = a.pid;
    const std::string proc = ProcessState(a.pid);
    row.state = !proc.empty()                                      ? proc
                : a.state == status::ProcessAnswer::State::kGone   ? "gone"
                : a.state == status::ProcessAnswer::State::kSilent ? "silent"
                                                                   : "refused";
    row.error = a.why;
    rows.push_back(std::move(row));
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
    return std::make_pair(x.comm != "world", x.rank) < std::make_pair(y.comm != "world", y.rank);
  });
  int world = 0;
  for (const Row& r : rows)
    if (r.comm == "world") world = std::max(world, r.size);
  // Ranks of the world without any socket: never served (not started, another run directory).
  std::map<int, bool> seen;
  for (const Row& r : rows)
    if (r.comm == "world") seen[r.rank] = true;
  for (int r = 0; r < world; ++r) {
    if (seen.count(r)) continue;
    Row row;
    row.rank = r;
    row.state = "unknown";
    row.error = "no status socket (not started, or another KIZUNA_RUN_DIR)";
    rows.push_back(std::move(row));
  }
  // The slowest: the world rank that got least far (finished or called); among equals one that
  // did not answer. The others' furthest operation is what it has not reached.
  int64_t furthest = -1;
  for (const Row& r : rows)
    if (r.comm == "world") furthest = std::max({furthest, r.last_seq, r.current_seq});
  const Row* slowest = nullptr;
  auto reach = [](const Row& r) { return std::max(r.last_seq, r.current_seq); };
  for (const Row& r : rows) {
    if (r.comm != "world") continue;
    if (slowest == nullptr || std::make_pair(reach(r), r.answered) < std::make_pair(reach(*slowest), slowest->answered))
      slowest = &r;
  }
  std::string verdict;
  if (furthest < 0) {
    verdict = "no rank answered with its operations";
  } else if (slowest != nullptr && !slowest->answered) {
    verdict = fmt::format("rank {} ({}{}) does not answer; the others are at operation {}", slowest->rank,
                          slowest->state, slowest->pid > 0 ? fmt::format(", pid {}", slowest->pid) : "", furthest);
  } else if (slowest != nullptr && reach(*slowest) < furthest) {
    verdict = fmt::format("rank {} (pid {}) has not called operation {} (it finished operation {})", slowest->rank,
                          slowest->pid, furthest, slowest->last_seq);
  } else if (slowest != nullptr) {
    verdict = "no rank is behind the others";
  }
  // The fused path does not say what it waits on: where a rank is behind, the others wait for it.
  if (slowest != nullptr && (!slowest->answered || reach(*slowest) < furthest)) {
    for (Row& r : rows)
      if (r.comm == "world" && r.state == "running" && r.waiting.empty() && r.current_seq == furthest)
        r.waiting = fmt::format("rank {} (the slowest)", slowest->rank);
  }
  int missing = 0;
  for (const Row& r : rows) missing += r.answered ? 0 : 1;

  if (json) {
    Json out = {{"job", id->Redacted()}, {"ranks", Json::array()}, {"slowest", verdict}};
    for (const Row& r : rows) {
      out["ranks"].push_back({{"comm", r.comm},
                              {"rank", r.rank},
                              {"pid", r.pid},
                              {"host", r.host},
                              {"state", r.state},
                              {"last_done", r.last_seq},
                              {"last_call", r.last_call},
                              {"current", r.current_seq},
                              {"current_call", r.current_call},
                              {"running_s", r.running_s},
                              {"waiting", r.waiting},
                              {"error", r.error}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return missing > 0 ? 3 : 0;
  }
  std::printf("job %s: %zu processes, %d ranks%s\n", id->Redacted().c_str(), answers->size(), world,
              missing > 0 ? fmt::format(", {} not answering", missing).c_str() : "");
  std::printf("%-6s %-5s %-8s %-8s %-18s %-9s %-30s %-8s %s\n", "comm", "rank", "pid", "host", "state", "last done",
              "current", "for", "waits on / error");
  for (const Row& r : rows) {
    const std::string last = r.last_seq >= 0 ? fmt::format("#{}", r.last_seq) : "-";
    const std::string current = r.current_seq >= 0 ? fmt::format("#{} {}", r.current_seq, r.current_call) : "-";
    const std::string took = r.current_seq >= 0 ? fmt::format("{:.1f} s", r.running_s) : "-";
    const std::string note = !r.waiting.empty() ? r.waiting : r.error;
    std::printf("%-6s %-5d %-8d %-8s %-18s %-9s %-30.30s %-8s %s\n", r.comm.c_str(), r.rank, r.pid, r.host.c_str(),
                r.state.c_str(), last.c_str(), current.c_str(), took.c_str(), note.c_str());
  }
  if (!verdict.empty()) std::printf("slowest: %s\n", verdict.c_str());
  return missing > 0 ? 3 : 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
