#include "collectives/cost/cost_file.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

#include <fmt/format.h>

#include "runtime/core/file.h"

namespace kizuna::collectives {
namespace {

constexpr size_t kMaxCostFileBytes = size_t{1} << 20;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A link entry's fabric and field ("link.tcp.gbps" -> tcp, gbps), or false.
bool SplitLink(std::string_view name, std::string_view* fabric, std::string_view* field) {
  if (name.substr(0, 5) != "link.") return false;
  const size_t dot = name.rfind('.');
  if (dot <= 5) return false;
  *fabric = name.substr(5, dot - 5);
  *field = name.substr(dot + 1);
  return true;
}

const CostConstantInfo* FindConstant(std::string_view name) {
  for (const CostConstantInfo& c : CostConstantTable())
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace

Result<CostFile> ParseCostFile(std::string_view text, std::string path) {
  CostFile file;
  file.path = path;
  file.sections.emplace_back();
  const std::string where = path.empty() ? std::string("cost file") : path;
  int line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    CostFile::Section& current = file.sections.back();
    if (const std::string_view t = Trim(line);
        !t.empty() && t.front() == '#' && current.ranks > 0 && current.entries.empty() && current.note.empty()) {
      current.note = std::string(Trim(t.substr(1)));
      continue;
    }
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = Trim(line);
    if (line.empty()) continue;
    const std::string at = fmt::format("{} line {}", where, line_no);
    if (line.front() == '[') {
      int ranks = 0;
      const std::string_view body = line.substr(1, line.size() >= 2 ? line.size() - 2 : 0);
      const auto [p, ec] =
          std::from_chars(body.data() + std::min<size_t>(6, body.size()), body.data() + body.size(), ranks);
      if (line.back() != ']' || body.substr(0, 6) != "ranks=" || ec != std::errc() || p != body.data() + body.size() ||
          ranks < 1)
        return InvalidArgument(fmt::format("{}: '{}' is not a section header ([ranks=N], N >= 1)", at, line));
      for (const CostFile::Section& s : file.sections)
        if (s.ranks == ranks) return InvalidArgument(fmt::format("{}: [ranks={}] appears twice", at, ranks));
      file.sections.push_back({ranks, {}, {}});
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) return InvalidArgument(fmt::format("{}: '{}' is not name = value", at, line));
    const std::string_view name = Trim(line.substr(0, eq)), value = Trim(line.substr(eq + 1));
    std::string_view fabric, field;
    bool speed = false;
    if (SplitLink(name, &fabric, &field)) {
      if (field != "latency_us" && field != "gbps")
        return InvalidArgument(fmt::format("{}: '{}': a link's entries are latency_us and gbps", at, name));
      speed = field == "gbps";
    } else if (const CostConstantInfo* c = FindConstant(name); c != nullptr) {
      speed = c->unit == "GB/s";
    } else {
      std::string known;
      for (const CostConstantInfo& c : CostConstantTable()) known += fmt::format("{}, ", c.name);
      return InvalidArgument(
          fmt::format("{}: unknown name '{}' (known: {}link.<fabric>.latency_us, "
                      "link.<fabric>.gbps)",
                      at, name, known));
    }
    double v = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || ec != std::errc() || p != value.data() + value.size() || !std::isfinite(v) || v < 0 ||
        (speed && v == 0))
      return InvalidArgument(
          fmt::format("{}: '{}' is not a {} number", at, value, speed ? "positive" : "finite, non-negative"));
    file.sections.back().entries.emplace_back(std::string(name), v);
  }
  return file;
}

Result<CostFile> LoadCostFile(const std::string& path) {
  KZ_ASSIGN_OR_RETURN(std::string text, ReadFileCapped(path, kMaxCostFileBytes, "KIZUNA_COST_FILE"));
  return ParseCostFile(text, path);
}

AppliedCosts CostsFor(const CostFile& file, int nranks) {
  AppliedCosts out;
  out.source = "defaults";
  const CostFile::Section* chosen = nullptr;
  for (const CostFile::Section& s : file.sections) {
    if (s.ranks == 0) continue;
    auto distance = [&](int r) { return std::abs(std::log(static_cast<double>(r) / nranks)); };
    if (chosen == nullptr || distance(s.ranks) < distance(chosen->ranks) ||
        (distance(s.ranks) == distance(chosen->ranks) && s.ranks < chosen->ranks))
      chosen = &s;
  }
  auto apply = [&](const CostFile::Section& s) {
    for (const auto& [name, v] : s.entries) {
      std::string_view fabric, field;
      if (SplitLink(name, &fabric, &field)) {
        LinkCosts& l = out.links[std::string(fabric)];
        (field == "gbps" ? l.gbps : l.latency_us) = v;
      } else if (const CostConstantInfo* c = FindConstant(name); c != nullptr) {
        out.constants.*c->field = v;
      }
    }
  };
  if (!file.sections.empty() && !file.sections[0].entries.empty()) apply(file.sections[0]);
  if (chosen != nullptr) apply(*chosen);
  if (!file.path.empty() || chosen != nullptr)
    out.source = fmt::format("{}{}", file.path.empty() ? "cost file" : file.path,
                             chosen != nullptr ? fmt::format(", [ranks={}]", chosen->ranks) : "");
  return out;
}

std::string AppliedCosts::Digest() const {
  std::string d = CostConstantsToString(constants);
  for (const auto& [fabric, l] : links) d += fmt::format(";link.{}={},{}", fabric, l.latency_us, l.gbps);
  return d;
}

std::string FormatCostFile(const CostFile& file, const std::vector<std::string>& header) {
  std::string out;
  for (const std::string& h : header) out += fmt::format("# {}\n", h);
  for (const CostFile::Section& s : file.sections) {
    if (s.ranks == 0 && s.entries.empty()) continue;
    if (s.ranks > 0) out += fmt::format("\n[ranks={}]\n", s.ranks);
    if (s.ranks > 0 && !s.note.empty()) out += fmt::format("# {}\n", s.note);
    for (const auto& [name, v] : s.entries) out += fmt::format("{} = {:.4g}\n", name, v);
  }
  return out;
}

}  // namespace kizuna::collectives
