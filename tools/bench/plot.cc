#include "tools/bench/plot.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <utility>

#include <fmt/format.h>

namespace kizuna::bench {
namespace {

// The canvas (pixels): the plot area, with room for the axis labels on the left and below and
// for the legend on the right.
constexpr double kWidth = 860, kHeight = 500;
constexpr double kLeft = 80, kRight = 620, kTop = 50, kBottom = 430;
constexpr int kMaxXTicks = 12;
// Decades shown at most on the busbw axis: below that the smallest messages' busbw is noise.
constexpr int kMaxDecades = 6;
// Colours distinguishable in print and by most colour-blind readers (Okabe and Ito's palette).
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string SizeLabel(double log2_bytes) {
  const auto e = static_cast<int>(std::lround(log2_bytes));
  if (e < 10) return fmt::format("{} B", 1ull << e);
  if (e < 20) return fmt::format("{} KiB", 1ull << (e - 10));
  if (e < 30) return fmt::format("{} MiB", 1ull << (e - 20));
  return fmt::format("{} GiB", 1ull << (e - 30));
}

std::string DecadeLabel(int e) {
  if (e >= 0) return fmt::format("{}", static_cast<long long>(std::llround(std::pow(10.0, e))));
  return fmt::format("{:.{}f}", std::pow(10.0, e), -e);
}

struct Point {
  double x = 0;  // log2 of the size
  double measured = 0;
  double predicted = -1;  // -1: no prediction
};

struct Series {
  std::string name;
  std::vector<Point> points;
};

}  // namespace

// Kept whole: the scales from the rows, then the SVG's elements in drawing order, all sharing those scales.
std::string PlotSvg(const std::vector<Row>& rows, double busbw_factor, std::string_view title) {
  std::set<std::string> types, ops;
  for (const Row& r : rows) types.insert(r.type), ops.insert(r.redop);
  std::vector<Series> series;
  double ymin = INFINITY, ymax = 0, xlo = INFINITY, xhi = -INFINITY;
  for (const Row& r : rows) {
    const std::optional<Measurement>& m = r.out_of_place ? r.out_of_place : r.in_place;
    if (r.size_bytes == 0 || !m) continue;
    std::string name = r.requested.empty() ? r.algo : r.requested;
    if (types.size() > 1) name += " " + r.type;
    if (ops.size() > 1) name += " " + r.redop;
    auto it = std::find_if(series.begin(), series.end(), [&](const Series& s) { return s.name == name; });
    if (it == series.end()) it = series.insert(series.end(), Series{name, {}});
    Point p;
    p.x = std::log2(static_cast<double>(r.size_bytes));
    p.measured = m->busbw_gbps;
    if (r.predicted_s && *r.predicted_s > 0)
      p.predicted = static_cast<double>(r.size_bytes) / *r.predicted_s / 1e9 * busbw_factor;
    it->points.push_back(p);
    ymax = std::max({ymax, p.measured, p.predicted});
    for (double v : {p.measured, p.predicted})
      if (v > 0) ymin = std::min(ymin, v);
    xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
  }
  if (series.empty()) xlo = 0, xhi = 1;
  if (xhi - xlo < 1) xlo -= 0.5, xhi += 0.5;
  // Decades of busbw: from the one holding the largest value down to the smallest's, at most
  // kMaxDecades; values below the axis (and 0) sit on its floor.
  const int dtop = ymax > 0 ? static_cast<int>(std::ceil(std::log10(ymax) - 1e-9)) : 1;
  const int dbottom =
      std::max(dtop - kMaxDecades, ymin < INFINITY ? static_cast<int>(std::floor(std::log10(ymin))) : dtop - 1);
  const int decades = std::max(1, dtop - dbottom);
  auto px = [&](double x) { return kLeft + (x - xlo) / (xhi - xlo) * (kRight - kLeft); };
  auto py = [&](double y) {
    const double d = y > 0 ? std::clamp(std::log10(y) - dbottom, 0.0, static_cast<double>(decades)) : 0.0;
    return kBottom - d / decades * (kBottom - kTop);
  };

  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, kHeight);
  out += fmt::format("<text x=\"{}\" y=\"28\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
                     (kLeft + kRight) / 2, Escape(title));
  // Axes, grid and ticks.
  for (int e = dbottom; e <= dbottom + decades; ++e) {
    const double y = py(std::pow(10.0, e));
    out += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", kLeft, y, kRight, y);
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, y + 4,
                       DecadeLabel(e));
  }
  const int first = static_cast<int>(std::ceil(xlo - 1e-9)), last = static_cast<int>(std::floor(xhi + 1e-9));
  const int xstep = std::max(1, (last - first + kMaxXTicks - 1) / kMaxXTicks);
  for (int e = first; e <= last; e += xstep) {
    const double x = px(e);
    out += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/>\n", x, kTop, x, kBottom);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x, kBottom + 18,
                       SizeLabel(e));
  }
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", kLeft,
                     kTop, kRight - kLeft, kBottom - kTop);
  out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">message size</text>\n", (kLeft + kRight) / 2,
                     kBottom + 42);
  out += fmt::format(
      "<text x=\"20\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {0})\">busbw (GB/s, log scale)</text>\n",
      (kTop + kBottom) / 2);
  // The series, and the legend beside the plot.
  for (size_t i = 0; i < series.size(); ++i) {
    Series& s = series[i];
    std::stable_sort(s.points.begin(), s.points.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
    const char* colour = kColours[i % std::size(kColours)];
    std::string measured, predicted;
    for (const Point& p : s.points) {
      measured += fmt::format("{:.1f},{:.1f} ", px(p.x), py(p.measured));
      if (p.predicted >= 0) predicted += fmt::format("{:.1f},{:.1f} ", px(p.x), py(p.predicted));
    }
    out += fmt::format("<polyline class=\"measured\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                       colour, measured);
    for (const Point& p : s.points)
      out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(p.x), py(p.measured),
                         colour);
    if (!predicted.empty())
      out += fmt::format(
          "<polyline class=\"predicted\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\" "
          "points=\"{}\"/>\n",
          colour, predicted);
    const double ly = kTop + 10 + 20.0 * static_cast<double>(i);
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                       kRight + 15, ly, kRight + 45, ly, colour);
    out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", kRight + 52, ly + 4, Escape(s.name));
  }
  const double note = kTop + 10 + 20.0 * static_cast<double>(series.size()) + 10;
  out += fmt::format(
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"gray\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n",
      kRight + 15, note, kRight + 45, note);
  out += fmt::format("<text x=\"{}\" y=\"{}\">predicted (cost model)</text>\n", kRight + 52, note + 4);
  if (series.empty())
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no measurements</text>\n",
                       (kLeft + kRight) / 2, (kTop + kBottom) / 2);
  out += "</svg>\n";
  return out;
}

}  // namespace kizuna::bench
