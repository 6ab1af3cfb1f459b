// kizuna-p2p's measurements (kizuna_p2p.cc has the command line and the report): the two ranks
// connect over each fabric, then rank 0 measures latency (8-byte ping-pong) and bandwidth (a
// window of sends, stopped by rank 1's acknowledgement) over host memory and emulated device
// buffers, and a single-thread memcpy of the same sizes as the one-copy bound.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/bootstrap/bootstrap.h"
#include "runtime/core/config.h"
#include "runtime/device/registry.h"
#include "runtime/core/status.h"

namespace kizuna::p2p {

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

// The bandwidth sizes: from min_bytes to max_bytes by factor, max_bytes last.
std::vector<uint64_t> Sizes(const Options& o);
// Messages per bandwidth size (both ranks compute the same number).
int64_t BandwidthCount(const Options& o, uint64_t size);
// One rank's whole run: every fabric (or o.fabric), both memory kinds. Rank 0's rows are the report.
Result<std::vector<Row>> RunRank(bootstrap::Bootstrap& boot, const Config& config, const Options& o,
                                 device::DeviceRegistry* devices);
// Where KIZUNA_TOPOLOGY is not set and directconnect is measured, a generated 2-worker ring stands
// for it: a temporary file, named in config.topology, removed with `keep`. Adds the choice to
// `notes`.
struct TempTopology {
  std::string path;
  TempTopology() = default;
  TempTopology(const TempTopology&) = delete;
  TempTopology& operator=(const TempTopology&) = delete;
  ~TempTopology();
};
Status ChooseTopology(Config& config, const Options& o, TempTopology& keep, std::vector<std::string>& notes);
// Both ranks as two threads of this process over the in-process bootstrap (with ChooseTopology's
// topology): rank 0's rows.
Result<std::vector<Row>> RunInProcess(Config config, const Options& o, std::vector<std::string>& notes);
// Single-thread memcpy of the bandwidth sizes: the bound of a transfer that copies once.
Result<std::vector<Row>> MemcpyRows(const Options& o);

}  // namespace kizuna::p2p
