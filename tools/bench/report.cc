#include "tools/bench/report.h"

#include <fmt/format.h>

namespace kizuna::bench {
namespace {

std::string Placement(const std::optional<Measurement>& m) {
  if (!m) return fmt::format("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A");
  return fmt::format("  {:>7}  {:>6.2f}  {:>6.2f}  {:>5}", FormatMicros(m->time_s), m->algbw_gbps, m->busbw_gbps,
                     m->wrong ? fmt::format("{}", *m->wrong) : std::string("N/A"));
}

std::string CsvNumber(double v) { return fmt::format("{:.6g}", v); }

std::string CsvPlacement(const std::optional<Measurement>& m) {
  if (!m) return ",,,";
  return fmt::format("{},{},{},{}", CsvNumber(m->time_s * 1e6), CsvNumber(m->algbw_gbps), CsvNumber(m->busbw_gbps),
                     m->wrong ? fmt::format("{}", *m->wrong) : std::string());
}

nlohmann::json JsonPlacement(const std::optional<Measurement>& m) {
  if (!m) return nullptr;
  return {{"time_us", m->time_s * 1e6},
          {"algbw_gbps", m->algbw_gbps},
          {"busbw_gbps", m->busbw_gbps},
          {"wrong", m->wrong ? nlohmann::json(*m->wrong) : nlohmann::json(nullptr)}};
}

}  // namespace

Measurement Measure(uint64_t size_bytes, double seconds, double busbw_factor, std::optional<uint64_t> wrong) {
  Measurement m;
  m.time_s = seconds;
  m.algbw_gbps = seconds > 0 ? static_cast<double>(size_bytes) / seconds / 1e9 : 0;
  m.busbw_gbps = m.algbw_gbps * busbw_factor;
  m.wrong = wrong;
  return m;
}

std::string FormatMicros(double seconds) {
  const double us = seconds * 1e6;
  if (us >= 10000.0) return fmt::format("{:7.0f}", us);
  if (us >= 100.0) return fmt::format("{:7.1f}", us);
  return fmt::format("{:7.2f}", us);
}

std::string TableHeader() {
  std::string out;
  out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place\n",
                     "", "", "", "", "");
  out += fmt::format(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:<8}  {:>7}\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
      "algo", "pred");
  out += fmt::format(
      "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>5}  {:>7}  {:>6}  {:>6}  {:>5}  {:<8}  {:>7}\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)");
  return out;
}

std::string TableRow(const Row& row) {
  return fmt::format("{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}  {:<8}  {:>7}\n", row.size_bytes, row.count, row.type,
                     row.redop, row.root, Placement(row.out_of_place), Placement(row.in_place), row.algo,
                     row.predicted_s ? FormatMicros(*row.predicted_s) : std::string("-"));
}

void Totals::Add(const Row& row) {
  for (const auto* m : {&row.out_of_place, &row.in_place}) {
    if (!*m) continue;
    if ((*m)->wrong.value_or(0) > 0) ++failed_measurements;
    busbw_sum += (*m)->busbw_gbps;
    ++measurements;
  }
}

std::string Footer(const Totals& totals, bool stopped) {
  return fmt::format("# Out of bounds values : {} {}\n# Avg bus bandwidth    : {:g}\n#\n", totals.failed_measurements,
                     stopped                      ? "FAILED (the run stopped at an error)"
                     : totals.failed_measurements ? "FAILED"
                                                  : "OK",
                     totals.avg_busbw());
}

std::string CsvHeader() {
  return "size,count,type,redop,root,algo,requested_algo,predicted_us,"
         "oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,"
         "ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong\n";
}

std::string CsvRow(const Row& row) {
  return fmt::format("{},{},{},{},{},{},{},{},{},{}\n", row.size_bytes, row.count, row.type, row.redop, row.root,
                     row.algo, row.requested, row.predicted_s ? CsvNumber(*row.predicted_s * 1e6) : std::string(),
                     CsvPlacement(row.out_of_place), CsvPlacement(row.in_place));
}

nlohmann::json JsonRow(const Row& row) {
  return {{"size", row.size_bytes},
          {"count", row.count},
          {"type", row.type},
          {"redop", row.redop},
          {"root", row.root},
          {"algo", row.algo},
          {"requested_algo", row.requested},
          {"predicted_us", row.predicted_s ? nlohmann::json(*row.predicted_s * 1e6) : nlohmann::json(nullptr)},
          {"out_of_place", JsonPlacement(row.out_of_place)},
          {"in_place", JsonPlacement(row.in_place)}};
}

}  // namespace kizuna::bench
