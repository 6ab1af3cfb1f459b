#include "tools/bench/choice.h"

#include <fmt/format.h>

#include <cstdlib>
#include <limits>

namespace kizuna::bench {
namespace {

using collectives::Algorithm;

// "22.8 us" (FormatSeconds' units) at the start of `text` -> seconds; "inf" -> +infinity.
std::optional<double> ParseSeconds(std::string_view text) {
  if (text.substr(0, 3) == "inf") return std::numeric_limits<double>::infinity();
  const std::string s(text.substr(0, 48));
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != ' ') return std::nullopt;
  const std::string_view unit = std::string_view(s).substr(static_cast<size_t>(end - s.c_str()) + 1);
  auto starts = [&](std::string_view u) {
    return unit.substr(0, u.size()) == u &&
           (unit.size() == u.size() || unit[u.size()] == ',' || unit[u.size()] == ')' || unit[u.size()] == ';');
  };
  if (starts("ns")) return v * 1e-9;
  if (starts("us")) return v * 1e-6;
  if (starts("ms")) return v * 1e-3;
  if (starts("s")) return v;
  return std::nullopt;
}

}  // namespace

const AlgorithmChoice::Candidate* AlgorithmChoice::Find(Algorithm a) const {
  for (const Candidate& c : candidates)
    if (c.algorithm == a) return &c;
  return nullptr;
}

std::vector<Algorithm> AlgorithmChoice::Supported() const {
  std::vector<Algorithm> out;
  for (const Candidate& c : candidates)
    if (c.supported) out.push_back(c.algorithm);
  return out;
}

std::optional<Algorithm> AlgorithmChoice::Used(std::optional<Algorithm> forced) const {
  if (!forced) return chosen;
  if (const Candidate* c = Find(*forced); c != nullptr && c->supported) return forced;
  std::optional<Algorithm> best;
  double best_s = std::numeric_limits<double>::infinity();
  for (const Candidate& c : candidates) {
    if (!c.supported) continue;
    const double s = c.predicted_s.value_or(std::numeric_limits<double>::infinity());
    if (!best || s < best_s) {
      best = c.algorithm;
      best_s = s;
    }
  }
  return best;
}

Result<AlgorithmChoice> ParseChoice(std::string_view line) {
  auto bad = [&](std::string_view why) {
    return Internal(fmt::format("cannot read the engine's choice ({}): '{}'", why, line));
  };
  AlgorithmChoice choice;
  choice.line = std::string(line);
  // The request's own text has no ": "; the chosen algorithm follows the first one.
  const size_t colon = line.find(": ");
  if (colon == std::string_view::npos) return bad("no ': '");
  const size_t predicted = line.find(" (predicted ", colon);
  if (predicted == std::string_view::npos) return bad("no '(predicted'");
  const std::string_view chosen_name = line.substr(colon + 2, predicted - colon - 2);
  auto chosen = collectives::ParseAlgorithm(chosen_name);
  if (!chosen) return bad(fmt::format("unknown algorithm '{}'", chosen_name));
  choice.chosen = *chosen;
  const std::string_view rest = line.substr(predicted);
  for (int i = 0; i < collectives::kNumAlgorithms; ++i) {
    const auto a = static_cast<Algorithm>(i);
    AlgorithmChoice::Candidate c;
    c.algorithm = a;
    std::optional<double> seconds;
    if (a == choice.chosen) {
      c.supported = true;
      seconds = ParseSeconds(rest.substr(std::string_view(" (predicted ").size()));
      if (!seconds) return bad("the chosen algorithm's time");
    } else {
      // "; name 66.1 us" for the first other candidate, ", name ..." for the rest.
      const std::string name(collectives::AlgorithmName(a));
      size_t at = std::string_view::npos;
      for (const char* sep : {"; ", ", "}) {
        const std::string key = sep + name + " ";
        for (size_t from = 0; (from = rest.find(key, from)) != std::string_view::npos; from += key.size()) {
          const std::string_view after = rest.substr(from + key.size());
          if (after.substr(0, 13) == "not supported" || ParseSeconds(after)) {
            at = std::min(at, from + key.size());
            break;
          }
        }
      }
      if (at == std::string_view::npos) continue;  // an algorithm the line does not name
      const std::string_view after = rest.substr(at);
      if (after.substr(0, 13) != "not supported") {
        c.supported = true;
        seconds = ParseSeconds(after);
      }
    }
    if (seconds && *seconds < std::numeric_limits<double>::infinity()) c.predicted_s = *seconds;
    choice.candidates.push_back(c);
  }
  return choice;
}

}  // namespace kizuna::bench
