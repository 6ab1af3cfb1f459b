#include "collectives/cost/selector.h"

#include <fmt/format.h>

namespace kizuna::collectives {
namespace {

// KIZUNA_ALGO names reserved for algorithms not built yet (docs/ALGORITHMS.md, "Names and overrides").
constexpr std::string_view kNotYetAvailable[] = {"oneshot", "twoshot"};

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

std::string Lower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '_' || c == '-') continue;
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
  }
  return out;
}

bool NotYetAvailable(std::string_view name) {
  const std::string n = Lower(name);
  for (std::string_view a : kNotYetAvailable)
    if (n == a) return true;
  return false;
}

std::string AlgorithmNames() {
  std::string out;
  for (int i = 0; i < kNumAlgorithms; ++i)
    out += fmt::format("{}{}", i ? ", " : "", AlgorithmName(static_cast<Algorithm>(i)));
  return out;
}

std::string CollectiveNames() {
  std::string out;
  for (int i = 0; i < kNumCollectives; ++i)
    out += fmt::format("{}{}", i ? ", " : "", CollectiveName(static_cast<Collective>(i)));
  return out + ", sendrecv";
}

// The candidate the model prefers: the smallest prediction among the supported ones, the first in
// Algorithm order on a tie (infinite predictions included: they tie with each other).
const Candidate* Cheapest(const std::vector<Candidate>& candidates) {
  const Candidate* best = nullptr;
  for (const Candidate& c : candidates) {
    if (!c.supported()) continue;
    if (best == nullptr || c.seconds() < best->seconds()) best = &c;
  }
  return best;
}

}  // namespace

std::optional<Algorithm> AlgoOverrides::For(Collective c) const {
  const auto i = static_cast<size_t>(c);
  // A listed collective keeps its own entry even when that is "none" (a name not available yet).
  if (i < items.size() && !items[i].empty()) return per_collective[i];
  return all;
}

std::string AlgoOverrides::Source(Collective c) const {
  const auto i = static_cast<size_t>(c);
  if (i < per_collective.size() && (per_collective[i] || hier[i])) return "KIZUNA_ALGO=" + items[i];
  if (all) return fmt::format("KIZUNA_ALGO={}", AlgorithmName(*all));
  if (all_hier) return "KIZUNA_ALGO=hier";
  return {};
}

bool AlgoOverrides::HierFor(Collective c) const {
  const auto i = static_cast<size_t>(c);
  if (i < items.size() && !items[i].empty()) return hier[i];
  return all_hier;
}

bool AlgoOverrides::empty() const {
  if (all || all_hier) return false;
  for (size_t i = 0; i < per_collective.size(); ++i)
    if (per_collective[i] || hier[i]) return false;
  return true;
}

Result<AlgoOverrides> ParseAlgoOverrides(std::string_view text) {
  AlgoOverrides out;
  out.text = std::string(text);
  bool have_single = false;  // a single name, available or not
  std::array<bool, kNumCollectives> listed{};
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string item = Trim(text.substr(start, end - start));
    start = end + 1;
    if (item.empty()) continue;
    auto bad = [&](std::string_view why) {
      return InvalidArgument(fmt::format("KIZUNA_ALGO='{}': item '{}': {}", text, item, why));
    };
    // "coll:algorithm", where a hierarchical algorithm's name has a colon of its own
    // ("allreduce:hier:pairwise/ring"); an item that is an algorithm's name as a whole has none.
    size_t colon = item.find(':');
    if (colon != std::string::npos && (ParseAlgorithm(item) || Lower(item.substr(0, colon)) == "hier"))
      colon = std::string::npos;
    const std::string coll_name = colon == std::string::npos ? "" : Trim(std::string_view(item).substr(0, colon));
    const std::string algo_name = Trim(colon == std::string::npos ? item : std::string_view(item).substr(colon + 1));
    if (colon != std::string::npos && coll_name.empty()) return bad("no collective before ':'");
    if (algo_name.empty()) return bad("no algorithm after ':'");

    const bool hier = Lower(algo_name) == "hier";
    std::optional<Algorithm> algo = ParseAlgorithm(algo_name);
    if (!algo && !hier && !NotYetAvailable(algo_name))
      return bad(
          fmt::format("unknown algorithm '{}' (known: {}, hier; not available yet: oneshot, twoshot)",
                      algo_name, AlgorithmNames()));

    if (colon == std::string::npos) {
      if (have_single) return bad("a second algorithm for every collective (give one name, or coll:name items)");
      have_single = true;
      out.all = algo;
      out.all_hier = hier;
    } else {
      const std::optional<Collective> coll = ParseCollective(coll_name);
      if (!coll) return bad(fmt::format("unknown collective '{}' (known: {})", coll_name, CollectiveNames()));
      std::vector<Collective> targets = {*coll};
      if (Lower(coll_name) == "sendrecv") targets = {Collective::kSend, Collective::kRecv};
      for (Collective c : targets) {
        const auto i = static_cast<size_t>(c);
        if (listed[i]) return bad(fmt::format("{} is listed twice", CollectiveName(c)));
        listed[i] = true;
        out.per_collective[i] = algo;
        out.hier[i] = hier;
        out.items[i] = item;
      }
    }
    if (!algo && !hier)
      out.warnings.push_back(
          fmt::format("KIZUNA_ALGO: '{}' is not available yet; the cost model chooses instead", item));
  }
  return out;
}

Result<Selection> SelectAlgorithm(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                                  const CostConstants& constants, const AlgoOverrides& overrides,
                                  std::optional<Algorithm> per_call, const SupportsFn& supports) {
  KZ_RETURN_IF_ERROR(shape.Validate().WithContext("algorithm selection"));
  if (shape.nranks != request.nranks)
    return InvalidArgument(fmt::format("algorithm selection: the shape describes {} ranks, the request ({}) {}",
                                       shape.nranks, request.ToString(), request.nranks));
  if (!supports) return InvalidArgument("algorithm selection: no SupportsFn given");

  Selection sel;
  sel.request = request;
  sel.candidates.reserve(kNumAlgorithms);
  // Every rank must choose alike, and ranks may place their buffers differently (a Broadcast's
  // root alone decides whether it runs in place): the algorithms are compared on the call out of
  // place on every rank. A placement an algorithm cannot serve stays its own rank's refusal.
  CollectiveRequest compared = request;
  compared.in_place = false;
  for (int i = 0; i < kNumAlgorithms; ++i) {
    Candidate c;
    c.algorithm = static_cast<Algorithm>(i);
    c.support = supports(c.algorithm, request, shape);
    if (c.supported()) c.prediction = Predict(c.algorithm, compared, shape, options, constants);
    sel.candidates.push_back(std::move(c));
  }

  const Candidate* best = Cheapest(sel.candidates);
  if (best == nullptr) {
    std::string why;
    for (const Candidate& c : sel.candidates)
      why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", AlgorithmName(c.algorithm), c.support.message());
    return NotSupported(fmt::format("no algorithm can serve {}: {}", request.ToString(), why));
  }

  std::string source;
  if (!per_call && overrides.HierFor(request.collective)) {
    // "hier": the model picks among the hierarchical algorithms.
    source = overrides.Source(request.collective);
    const Candidate* hier = nullptr;
    std::string why;
    for (const Candidate& c : sel.candidates) {
      if (!IsHierarchical(c.algorithm)) continue;
      if (!c.supported()) {
        why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", AlgorithmName(c.algorithm), c.support.message());
      } else if (hier == nullptr || c.seconds() < hier->seconds()) {
        hier = &c;
      }
    }
    sel.chosen = hier != nullptr ? hier->algorithm : best->algorithm;
    sel.forced = hier != nullptr;
    if (hier != nullptr) sel.requested = hier->algorithm;
    sel.reason = hier != nullptr ? fmt::format("forced by {} (the model's pick of the hierarchical algorithms)", source)
                                 : fmt::format("{} cannot serve {}: {}; using {}", source,
                                               CollectiveName(request.collective), why, AlgorithmName(best->algorithm));
    return sel;
  }
  if (per_call) {
    sel.requested = per_call;
    source = fmt::format("the call's algorithm option ({})", AlgorithmName(*per_call));
  } else if (std::optional<Algorithm> o = overrides.For(request.collective)) {
    sel.requested = o;
    source = overrides.Source(request.collective);
  }
  if (sel.requested) {
    const auto i = static_cast<size_t>(*sel.requested);
    if (i >= sel.candidates.size())
      return InvalidArgument(
          fmt::format("algorithm selection: {} names algorithm {}, which does not exist", source, i));
    const Candidate& forced = sel.candidates[i];
    if (forced.supported()) {
      sel.chosen = forced.algorithm;
      sel.forced = true;
      sel.reason = "forced by " + source;
      return sel;
    }
    sel.chosen = best->algorithm;
    sel.reason = fmt::format("{} cannot serve {}: {}; using {}", source, CollectiveName(request.collective),
                             forced.support.message(), AlgorithmName(best->algorithm));
    return sel;
  }
  sel.chosen = best->algorithm;
  sel.reason = "chosen by the model";
  return sel;
}

std::string SelectionToString(const Selection& selection) {
  const Candidate& chosen = selection.candidate(selection.chosen);
  std::string out = fmt::format("{}: {} (predicted {}) {}", selection.request.ToString(),
                                AlgorithmName(selection.chosen), FormatSeconds(chosen.seconds()), selection.reason);
  bool first = true;
  for (const Candidate& c : selection.candidates) {
    if (c.algorithm == selection.chosen) continue;
    out += first ? "; " : ", ";
    first = false;
    if (c.supported())
      out += fmt::format("{} {}", AlgorithmName(c.algorithm), FormatSeconds(c.seconds()));
    else
      out += fmt::format("{} not supported ({})", AlgorithmName(c.algorithm), c.support.message());
  }
  return out;
}

}  // namespace kizuna::collectives
