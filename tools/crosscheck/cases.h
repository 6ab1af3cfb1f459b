// The cross-check's cases: what a world (a set of communicators) is made with, and what one case
// runs on it, both drawn from the seed alone. Cases come in batches that share one world (making
// communicators is the slow part); batch b's world is a function of (seed, b), case k's
// parameters a function of (seed, k) and its batch's world, so `--only-case K` rebuilds case K
// exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/plan/plan.h"
#include "runtime/core/dtype.h"
#include "tools/crosscheck/reference.h"

namespace kizuna::crosscheck {

using collectives::Algorithm;
using collectives::Collective;

// How ranks are driven:
//   threads     every rank in this process, a thread per rank issuing its own calls
//   one-thread  every rank in this process, one thread issuing every rank's calls (in one group,
//               or one after the other: the calls return at once)
//   processes   one rank per process under kizuna-run; each checks its own results, and this
//               process compares what the ranks report
enum class Mode : uint8_t { kThreads, kOneThread, kProcesses };
std::string_view ModeName(Mode m);

// Known failures that may be left out while their fixes land (--skip NAME): each names the inputs
// or checks it removes. The cases are still drawn the same way, so other cases keep their index.
//   signed-zeros          no +-0 inputs for min / max
//   deterministic-avg16   deterministic mode: float16 / bfloat16 avg not compared across algorithms
//   sync-free             no worlds whose frees wait for the device's streams (KIZUNA_EMU_SYNC_FREE)
//   point-to-point        no point-to-point cases
//   host-memory           processes: no plain host memory
//   ofi                   no worlds over libfabric
//   opaque                no worlds on opaque device memory
std::vector<std::string_view> KnownSkips();

struct Options {
  std::optional<Mode> mode;  // nullopt: mixed, the modes in turn per batch
  int min_ranks = 2;
  int max_ranks = 8;
  uint64_t max_bytes = 4u << 20;  // the largest buffer of a case
  int batch = 16;                 // cases per world
  double timeout_s = 60;          // KIZUNA_TIMEOUT of the worlds
  bool nans = false;              // NaN inputs (floating types)
  // Worlds over ofi have at most this many ranks: each connection over libfabric's tcp provider
  // holds about 95 MB (README.md, "Memory"), so 8 ranks in one process would hold 5 GB.
  int ofi_max_ranks = 4;
  std::set<std::string> skip;  // KnownSkips() names
  // The driver's own check: this case's reference takes rank 0's first input element with its
  // top bit flipped after it was uploaded, so the case fails (crosscheck_test.sh).
  std::optional<uint64_t> corrupt_case;
  // Cases not run (--drop-case): narrowing down which earlier cases of a batch a failure needs.
  std::set<uint64_t> drop;

  bool skips(std::string_view name) const { return skip.count(std::string(name)) != 0; }
  // The flags that change what is drawn, for reproducer lines and workers:
  // {"--ranks", "2-8", "--max-bytes", "4194304", "--batch", "16", "--skip", "ofi"}.
  std::vector<std::string> GenerationArgs() const;
  std::string GenerationFlags() const;  // the same, joined by spaces
};

// What a world is made with. Cases that need another configuration get another world.
struct WorldSpec {
  Mode mode = Mode::kThreads;
  int nranks = 2;
  int devices = 1;             // emulated devices; rank r on device r % devices (processes: local rank)
  bool deterministic = false;  // KIZUNA_DETERMINISTIC
  uint64_t chunk_bytes = 0;    // KIZUNA_CHUNK_BYTES; 0: the engine's
  bool opaque = false;         // KIZUNA_EMU_OPAQUE
  bool ofi = false;            // KIZUNA_FABRIC=ofi over tcp on lo; else directconnect, topology full
  bool direct_access = true;   // CommOptions::direct_access (in-process modes)
  uint64_t staging_bytes = 0;  // CommOptions::staging_bytes; 0: the engine's
  // KIZUNA_EMU_LAUNCH_US=20, KIZUNA_EMU_COPY_GBPS=KIZUNA_EMU_REDUCE_GBPS=20: slower streams shift
  // the timing, and fused operations between processes then go through the streams.
  bool throttled = false;
  bool sync_free = false;  // KIZUNA_EMU_SYNC_FREE: frees wait for the device's streams, as cudaFree
  // "threads ranks=4 devices=2 deterministic chunk=3000 opaque ofi no-direct staging=2097152"
  std::string ToString() const;
};

// One execution of a case's collective: which algorithm, which memory.
struct Run {
  std::optional<Algorithm> algorithm;  // nullopt: the engine chooses
  bool host_memory = false;            // processes: plain host memory (malloc)
};

struct Message {
  int from = 0;
  int to = 0;
  uint64_t count = 0;
  DataType type = DataType::kUint8;
};

enum class Pattern : uint8_t {
  kNone,
  kPairs,     // a few messages between random pairs; each rank's calls in one group (or one call alone)
  kChain,     // a -> b -> c ...: each inner rank's group receives from one and sends to the next
  kOneSided,  // several messages a -> b, grouped on one side, one call at a time on the other
  kExchange,  // a <-> b, both directions in each rank's group
};
std::string_view PatternName(Pattern p);

// One point-to-point call of a rank: message `message` of the case, sent or received.
struct P2pCall {
  bool send = false;
  int message = 0;
};
// A rank's calls, in order: a group (GroupStart, calls, GroupEnd) or a call outside any group.
struct Segment {
  bool grouped = true;
  std::vector<P2pCall> calls;
};

struct Case {
  uint64_t index = 0;
  uint64_t key = 0;  // the values' seed
  WorldSpec world;
  // The collective (point-to-point cases: the one every rank calls after the pattern).
  Collective collective = Collective::kAllReduce;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t count = 0;  // elements, as the API counts them (ReduceScatter's recvcount, AllGather's sendcount)
  int root = 0;
  bool in_place = false;
  uint32_t offset = 0;  // elements between the allocation's guard and the buffer (misalignment)
  ValueKind values = ValueKind::kGeneral;
  bool nans = false;
  // Calls of the collective issued back to back on separate buffers before the streams are
  // waited for (in one group per rank when burst_grouped), each checked.
  int burst = 1;
  bool burst_grouped = false;
  std::vector<Run> runs;      // at least one
  bool compare_runs = false;  // every run's outputs bit for bit identical (deterministic mode)
  bool one_group = false;     // one-thread mode: every rank's calls inside one group
  Pattern pattern = Pattern::kNone;
  std::vector<Message> messages;
  std::vector<std::vector<Segment>> segments;  // per rank

  InputSpec inputs() const { return {key, type, op, values, nans}; }
  // "allreduce count=1003 float16 avg in-place offset=1 values=general runs=ring,tree,fused"
  std::string ToString() const;
};

// Elements of each buffer of a rank (NCCL's layout, runtime/communicator.h).
uint64_t InputCount(Collective c, int nranks, uint64_t count);
uint64_t OutputCount(Collective c, int nranks, uint64_t count);
// The algorithms docs/ALGORITHMS.md lists for a collective (fused only where ranks share memory).
std::vector<Algorithm> Serving(Collective c, bool fused);

WorldSpec MakeWorld(const Options& options, uint64_t seed, uint64_t batch);
Case MakeCase(const Options& options, uint64_t seed, uint64_t index, const WorldSpec& world);

}  // namespace kizuna::crosscheck
