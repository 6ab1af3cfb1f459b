// kizuna-trace: the ranks' traces (KIZUNA_TRACE_FILE) on one timeline.
//
//   kizuna-trace merge -o OUT.json RANK_FILES...   one Chrome trace / Perfetto file: every rank's
//                                                  events moved by its measured clock offset (so
//                                                  that rank 0's clock is the timeline's) and the
//                                                  timeline starting at 0; a line per rank
//   kizuna-trace svg -o OUT.svg MERGED.json [--seq S] [--from-us A --to-us B]
//                                                  a picture: a row per rank and channel, a box per
//                                                  event coloured by kind (send, recv, reduce,
//                                                  copy, wait, collective, fused)
//
// Exit status 2 for bad command lines, 1 for unreadable or malformed input (the message names the
// file and what is wrong).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/core/file.h"
#include "runtime/core/status.h"

namespace kizuna {
namespace {

using Json = nlohmann::ordered_json;
constexpr size_t kMaxTraceBytes = size_t{2} << 30;

Result<Json> ReadJson(const std::string& path) {
  KZ_ASSIGN_OR_RETURN(std::string text, ReadFileCapped(path, kMaxTraceBytes, "trace"));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(fmt::format("{}: not JSON", path));
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    return InvalidArgument(fmt::format("{}: no traceEvents array (not a trace)", path));
  return j;
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return FromErrno(errno, fmt::format("writing {}", path));
  return Status::Ok();
}

// Each rank file's events, moved by the file's clock offset, then all shifted so the first starts
// at 0.
Status Merge(const std::vector<std::string>& inputs, const std::string& output) {
  Json merged = Json::array();
  std::set<int64_t> ranks;
  double first = -1;
  struct Loaded {
    Json events;
    double offset = 0;
  };
  std::vector<Loaded> loaded;
  for (const std::string& path : inputs) {
    KZ_ASSIGN_OR_RETURN(Json j, ReadJson(path));
    const Json& other = j.contains("otherData") ? j["otherData"] : Json::object();
    if (!other.contains("kizuna_trace"))
      return InvalidArgument(fmt::format("{}: not a kizuna rank trace (no otherData.kizuna_trace)", path));
    const int64_t rank = other.value("rank", int64_t{-1});
    if (!ranks.insert(rank).second) return InvalidArgument(fmt::format("{}: rank {} given twice", path, rank));
    const double offset = other.value("clock_offset_us", 0.0);
    const bool measured = other.value("clock_offset_measured", false);
    size_t n = 0;
    for (Json& e : j["traceEvents"]) {
      if (e.value("ph", "") != "X") continue;
      const double ts = e.value("ts", 0.0) - offset;
      if (first < 0 || ts < first) first = ts;
      ++n;
    }
    const int64_t dropped = other.value("dropped_events", int64_t{0});
    const std::string note = dropped > 0 ? fmt::format(", {} events dropped (the rank held too many)", dropped) : "";
    std::printf("rank %lld: %zu events from %s, clock offset %.1f us%s (round trip %.1f us)%s\n",
                static_cast<long long>(rank), n, path.c_str(), offset, measured ? "" : " (not measured)",
                other.value("clock_offset_rtt_us", 0.0), note.c_str());
    loaded.push_back({std::move(j["traceEvents"]), offset});
  }
  if (first < 0) first = 0;
  for (Loaded& l : loaded) {
    for (Json& e : l.events) {
      if (e.value("ph", "") == "X") e["ts"] = e.value("ts", 0.0) - l.offset - first;
      merged.push_back(std::move(e));
    }
  }
  Json out = {{"traceEvents", std::move(merged)}, {"displayTimeUnit", "ns"}};
  KZ_RETURN_IF_ERROR(WriteText(output, out.dump() + "\n"));
  std::printf("%zu ranks merged into %s\n", inputs.size(), output.c_str());
  return Status::Ok();
}

std::string Colour(const std::string& cat) {
  static const std::map<std::string, std::string> kColours = {{"collective", "#d0d0d0"}, {"fused", "#b39ddb"},
                                                              {"send", "#64b5f6"},       {"recv", "#81c784"},
                                                              {"reduce", "#ffb74d"},     {"copy", "#fff176"},
                                                              {"wait", "#ef9a9a"}};
  const auto it = kColours.find(cat);
  return it != kColours.end() ? it->second : "#eeeeee";
}

// One row per (rank, timeline), in order; whole operations on the rank's first row.
Status Svg(const std::string& input, const std::string& output, int64_t seq, double from_us, double to_us) {
  KZ_ASSIGN_OR_RETURN(Json j, ReadJson(input));
  struct Box {
    int64_t pid, tid;
    double ts, dur;
    std::string name, cat;
  };
  std::vector<Box> boxes;
  double lo = -1, hi = 0;
  for (const Json& e : j["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    if (seq >= 0 && (!e.contains("args") || e["args"].value("seq", int64_t{-1}) != seq)) continue;
    Box b{e.value("pid", int64_t{0}), e.value("tid", int64_t{0}), e.value("ts", 0.0),
          e.value("dur", 0.0),        e.value("name", ""),        e.value("cat", "")};
    if (from_us >= 0 && b.ts + b.dur < from_us) continue;
    if (to_us >= 0 && b.ts > to_us) continue;
    if (lo < 0 || b.ts < lo) lo = b.ts;
    hi = std::max(hi, b.ts + b.dur);
    boxes.push_back(std::move(b));
  }
  if (boxes.empty()) return InvalidArgument(fmt::format("{}: no events to draw (check --seq and the range)", input));
  if (from_us >= 0) lo = from_us;
  if (to_us >= 0) hi = to_us;
  std::map<std::pair<int64_t, int64_t>, int> rows;
  for (const Box& b : boxes) rows.emplace(std::make_pair(b.pid, b.tid), 0);
  int row = 0;
  for (auto& [key, index] : rows) index = row++;
  constexpr double kLeft = 110, kWidth = 900, kRow = 22, kTop = 30;
  const double span = std::max(hi - lo, 1.0);
  auto x = [&](double us) { return kLeft + (us - lo) / span * kWidth; };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kLeft + kWidth + 20, kTop + row * kRow + 60);
  for (const auto& [key, index] : rows) {
    const double y = kTop + index * kRow;
    svg += fmt::format("<text x=\"4\" y=\"{:.1f}\">rank {} {}</text>\n", y + 15, key.first,
                       key.second == 0 ? "ops" : fmt::format("ch {}", key.second - 1));
    svg += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eeeeee\"/>\n", kLeft,
                       kLeft + kWidth, y + kRow, y + kRow);
  }
  for (const Box& b : boxes) {
    const double y = kTop + rows[{b.pid, b.tid}] * kRow + 2;
    const double x0 = x(std::max(b.ts, lo)), x1 = x(std::min(b.ts + b.dur, hi));
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"#555555\" "
        "stroke-width=\"0.3\"><title>{} ({:.1f} us)</title></rect>\n",
        x0, y, std::max(x1 - x0, 0.5), kRow - 4, Colour(b.cat), b.name, b.dur);
  }
  // The time axis and the legend.
  const double axis = kTop + row * kRow + 14;
  for (int i = 0; i <= 4; ++i) {
    const double us = lo + span * i / 4;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{:.0f} us</text>\n", x(us) - 10, axis, us);
  }
  double lx = kLeft;
  for (const char* cat : {"collective", "fused", "wait", "send", "recv", "reduce", "copy"}) {
    svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>", lx, axis + 12,
                       Colour(cat));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 16, axis + 22, cat);
    lx += 95;
  }
  svg += "</svg>\n";
  KZ_RETURN_IF_ERROR(WriteText(output, svg));
  std::printf("%zu events on %d rows, %.1f us, in %s\n", boxes.size(), row, span, output.c_str());
  return Status::Ok();
}

int Main(int argc, char** argv) {
  CLI::App app{"kizuna-trace: the ranks' traces (KIZUNA_TRACE_FILE) on one timeline", "kizuna-trace"};
  app.require_subcommand(1);
  std::vector<std::string> inputs;
  std::string output, input;
  int64_t seq = -1;
  double from_us = -1, to_us = -1;
  CLI::App* merge = app.add_subcommand("merge", "merge the ranks' trace files into one, on rank 0's clock");
  merge->add_option("files", inputs, "one trace file per rank")->required()->check(CLI::ExistingFile);
  merge->add_option("-o,--output", output, "the merged trace")->required();
  CLI::App* svg = app.add_subcommand("svg", "draw a merged trace as an SVG picture");
  svg->add_option("file", input, "a merged trace")->required()->check(CLI::ExistingFile);
  svg->add_option("-o,--output", output, "the picture")->required();
  svg->add_option("--seq", seq, "only the events of operation S");
  svg->add_option("--from-us", from_us, "the picture's start on the timeline");
  svg->add_option("--to-us", to_us, "the picture's end on the timeline");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports parse errors as exceptions; they end here, at the edge of the program.
    return app.exit(e) == 0 ? 0 : 2;
  }
  const Status s = merge->parsed() ? Merge(inputs, output) : Svg(input, output, seq, from_us, to_us);
  if (!s.ok()) {
    std::fprintf(stderr, "kizuna-trace: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kizuna

int main(int argc, char** argv) { return kizuna::Main(argc, argv); }
