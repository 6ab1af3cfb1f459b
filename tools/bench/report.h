// kizuna-bench's output: nccl-tests' table (the same columns in the same order, then the
// algorithm and the cost model's prediction), its footer, and the JSON and CSV files.
//
//   #       size         count      type   redop    root     time   algbw   busbw #wrong     time ...
//              8             2     float     sum      -1    41.30    0.00    0.00      0    39.87 ...
//   # Out of bounds values : 0 OK
//   # Avg bus bandwidth    : 0.0123
//
// Columns per row: size (bytes, the larger buffer), count (elements passed to the call), type
// (nccl-tests' names: float, half, bfloat16, double, int8, ...), redop ("none" for collectives
// without one), root (-1 for collectives without one); then out of place and in place, each
// time (us per call), algbw and busbw (GB/s, 1e9 bytes) and #wrong (wrong elements over every
// rank; "N/A" without -c); a placement the engine does not have (alltoall, sendrecv in place)
// prints N/A in all four. Then algo (the algorithm the engine ran) and pred (the cost model's
// predicted time for it, us; "-" when there is none).
//
// Footer, as nccl-tests: "Out of bounds values" counts the measurements (row and placement) with
// at least one wrong element, then OK or FAILED; "Avg bus bandwidth" is the mean busbw over every
// measurement printed.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kizuna::bench {

struct Measurement {
  double time_s = 0;
  double algbw_gbps = 0;
  double busbw_gbps = 0;
  std::optional<uint64_t> wrong;  // nullopt: not checked (-c 0)
};

struct Row {
  uint64_t size_bytes = 0;
  uint64_t count = 0;
  std::string type;   // nccl-tests' name
  std::string redop;  // "sum", ..., or "none"
  int root = -1;
  std::string algo;       // the algorithm the engine ran ("-" when unknown)
  std::string requested;  // --algo for this row: "auto" or an algorithm name
  std::optional<double> predicted_s;
  std::optional<Measurement> out_of_place;
  std::optional<Measurement> in_place;  // nullopt: the collective has no in-place form
};

// Measurement from a time and the bytes of the row, with the collective's bus bandwidth factor.
Measurement Measure(uint64_t size_bytes, double seconds, double busbw_factor, std::optional<uint64_t> wrong);

// nccl-tests' time column: 7 wide, 2 decimals below 100 us, 1 below 10 ms, none above.
std::string FormatMicros(double seconds);

// The three header lines of the table, the line of one row, and the footer lines (each ends in a
// newline).
std::string TableHeader();
std::string TableRow(const Row& row);

struct Totals {
  uint64_t failed_measurements = 0;  // measurements with a wrong element
  double busbw_sum = 0;
  uint64_t measurements = 0;

  void Add(const Row& row);
  double avg_busbw() const { return measurements ? busbw_sum / static_cast<double>(measurements) : 0; }
};
// `stopped`: the run ended at an error before every size was measured, which fails it too.
std::string Footer(const Totals& totals, bool stopped = false);

// The CSV file: a header line, then one line per row (empty cells where the table says N/A).
std::string CsvHeader();
std::string CsvRow(const Row& row);
// One row as JSON: {"size":..,"count":..,"type":..,"redop":..,"root":..,"algo":..,"requested_algo":..,
// "predicted_us":..|null,"out_of_place":{"time_us","algbw_gbps","busbw_gbps","wrong"}|null,"in_place":..}.
nlohmann::json JsonRow(const Row& row);

}  // namespace kizuna::bench
