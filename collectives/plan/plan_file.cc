#include "collectives/plan/plan_file.h"

#include <algorithm>
#include <charconv>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/core/file.h"
#include "runtime/core/json.h"

namespace kizuna::collectives {

// Every slice inside its buffer and, where the buffer has a block per rank, inside one block.
Status CheckPlanFileSlices(const PlanFile& f);

namespace {

using nlohmann::json;

// Plan files are written by hand or by tools: a few megabytes cover thousands of ranks' steps.
constexpr size_t kMaxPlanFileBytes = 64 << 20;

std::optional<uint64_t> ParseUint(std::string_view s) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// "in[2+1]" -> {kInput, 2, 1}.
std::optional<Slice> ParseSlice(std::string_view s) {
  const size_t open = s.find('['), plus = s.find('+'), close = s.find(']');
  if (open == std::string_view::npos || plus == std::string_view::npos || close != s.size() - 1 || plus < open)
    return std::nullopt;
  Slice out;
  const std::string_view buf = s.substr(0, open);
  if (buf == "in") {
    out.buffer = BufferKind::kInput;
  } else if (buf == "out") {
    out.buffer = BufferKind::kOutput;
  } else if (buf == "scratch") {
    out.buffer = BufferKind::kScratch;
  } else {
    return std::nullopt;
  }
  const auto offset = ParseUint(s.substr(open + 1, plus - open - 1));
  const auto count = ParseUint(s.substr(plus + 1, close - plus - 1));
  if (!offset || !count || *count == 0 || *offset > (uint64_t{1} << 48) || *count > (uint64_t{1} << 48))
    return std::nullopt;
  out.offset = *offset;
  out.count = *count;
  return out;
}

std::optional<StepKind> ParseStepKind(std::string_view s) {
  for (StepKind k : {StepKind::kSend, StepKind::kRecv, StepKind::kRecvReduce, StepKind::kCopy, StepKind::kReduce})
    if (StepKindName(k) == s) return k;
  return std::nullopt;  // kScale is the avg epilogue's, which the engine adds
}

class Parser {
 public:
  explicit Parser(std::string_view source) : source_(source) {}

  Result<PlanFile> Parse(const json& j) {
    PlanFile f;
    f.source = std::string(source_);
    if (!j.is_object()) return Error("", "the file is not a JSON object");
    if (j.value("format", std::string()) != kPlanFileFormat)
      return Error("", fmt::format("\"format\" must be \"{}\" (found {})", kPlanFileFormat,
                                   j.contains("format") ? JsonExcerpt(j["format"]) : "none"));
    const std::string coll = j.value("collective", std::string());
    const auto c = ParseCollective(coll);
    if (!c || IsPointToPoint(*c) || *c == Collective::kBarrier)
      return Error("", fmt::format("\"collective\" must name a collective with data (allreduce, reducescatter, "
                                   "allgather, broadcast, reduce, alltoall); found \"{}\"",
                                   coll));
    f.collective = *c;
    if (!j.contains("nranks") || !j["nranks"].is_number_unsigned() || j["nranks"].get<uint64_t>() < 2 ||
        j["nranks"].get<uint64_t>() > 65536)
      return Error("", "\"nranks\" must be a whole number from 2 to 65536");
    f.nranks = j["nranks"].get<int>();
    if (!j.contains("units") || !j["units"].is_number_unsigned() || j["units"].get<uint64_t>() == 0 ||
        j["units"].get<uint64_t>() > (uint64_t{1} << 40))
      return Error("", "\"units\" must be a positive whole number (the parts a rank's count is cut into)");
    f.units = j["units"].get<uint64_t>();
    const std::string placement = j.value("placement", std::string("out"));
    if (placement != "out" && placement != "in" && placement != "both")
      return Error("", fmt::format("\"placement\" must be \"out\", \"in\" or \"both\" (found \"{}\")", placement));
    f.out_of_place = placement != "in";
    f.in_place = placement != "out";
    if (f.in_place && f.collective == Collective::kAllToAll)
      return Error("", "an alltoall plan cannot be in place (plan.h)");
    f.name = j.value("name", std::string());
    if (f.name.empty()) {
      std::string base = f.source.substr(f.source.find_last_of('/') + 1);
      if (base.size() > 5 && base.ends_with(".json")) base.resize(base.size() - 5);
      f.name = base;
    }
    if (!j.contains("ranks") || !j["ranks"].is_array() || j["ranks"].size() != static_cast<size_t>(f.nranks))
      return Error("", fmt::format("\"ranks\" must be an array of {} ranks (nranks)", f.nranks));
    f.ranks.resize(static_cast<size_t>(f.nranks));
    std::vector<bool> seen(static_cast<size_t>(f.nranks), false);
    for (const json& r : j["ranks"]) {
      if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_unsigned() ||
          r["rank"].get<uint64_t>() >= static_cast<uint64_t>(f.nranks))
        return Error("", fmt::format("every entry of \"ranks\" needs a \"rank\" from 0 to {}: {}", f.nranks - 1,
                                     JsonExcerpt(r)));
      const int rank = r["rank"].get<int>();
      if (seen[static_cast<size_t>(rank)]) return Error(fmt::format("rank {}", rank), "listed twice");
      seen[static_cast<size_t>(rank)] = true;
      RankPlan& rp = f.ranks[static_cast<size_t>(rank)];
      rp.rank = rank;
      if (r.contains("scratch")) {
        if (!r["scratch"].is_number_unsigned() || r["scratch"].get<uint64_t>() > (uint64_t{1} << 40))
          return Error(fmt::format("rank {}", rank), "\"scratch\" must be whole units");
        rp.scratch_count = r["scratch"].get<uint64_t>();
      }
      if (!r.contains("channels") || !r["channels"].is_array() || r["channels"].empty() || r["channels"].size() > 64)
        return Error(fmt::format("rank {}", rank), "\"channels\" must be an array of 1 to 64 arrays of steps");
      for (size_t ch = 0; ch < r["channels"].size(); ++ch) {
        const json& steps = r["channels"][ch];
        if (!steps.is_array())
          return Error(fmt::format("rank {}, channel {}", rank, ch), "a channel is an array of steps");
        std::vector<Step>& out = rp.channels.emplace_back();
        for (size_t i = 0; i < steps.size(); ++i) {
          KZ_ASSIGN_OR_RETURN(Step s,
                              ParseStep(steps[i], f.nranks, fmt::format("rank {}, channel {}, step {}", rank, ch, i)));
          if (s.peer == rank)
            return Error(fmt::format("rank {}, channel {}, step {}", rank, ch, i), "the peer is the rank itself");
          out.push_back(std::move(s));
        }
      }
    }
    KZ_RETURN_IF_ERROR(CheckPlanFileSlices(f));
    return f;
  }

 private:
  Result<Step> ParseStep(const json& s, int nranks, const std::string& where) {
    if (!s.is_object()) return Error(where, fmt::format("a step is an object: {}", JsonExcerpt(s)));
    const std::string kind_name = s.value("step", std::string());
    const auto kind = ParseStepKind(kind_name);
    if (!kind)
      return Error(where,
                   fmt::format("\"step\" must be send, recv, recv-reduce, copy or reduce (found \"{}\")", kind_name));
    Step step;
    step.kind = *kind;
    const bool transfer = *kind == StepKind::kSend || *kind == StepKind::kRecv || *kind == StepKind::kRecvReduce;
    if (transfer) {
      if (!s.contains("peer") || !s["peer"].is_number_unsigned() ||
          s["peer"].get<uint64_t>() >= static_cast<uint64_t>(nranks))
        return Error(where, fmt::format("\"peer\" must be a rank from 0 to {} (found {})", nranks - 1,
                                        s.contains("peer") ? JsonExcerpt(s["peer"]) : "none"));
      step.peer = s["peer"].get<int>();
    } else if (s.contains("peer")) {
      return Error(where, fmt::format("a {} step has no peer", kind_name));
    }
    auto slice = [&](const json& v, const char* what) -> Result<Slice> {
      const auto sl = v.is_string() ? ParseSlice(v.get<std::string>()) : std::nullopt;
      if (!sl)
        return Error(where, fmt::format("\"{}\" must be a slice such as \"in[0+2]\" (in, out or scratch; first "
                                        "unit + units, at least one): found {}",
                                        what, JsonExcerpt(v)));
      return *sl;
    };
    if (*kind != StepKind::kSend) {
      if (!s.contains("dst")) return Error(where, fmt::format("a {} step needs \"dst\"", kind_name));
      KZ_ASSIGN_OR_RETURN(step.dst, slice(s["dst"], "dst"));
    }
    if (*kind == StepKind::kReduce) {
      if (!s.contains("srcs") || !s["srcs"].is_array() || s["srcs"].size() < 2)
        return Error(where, "a reduce step needs \"srcs\", two slices or more");
      for (const json& v : s["srcs"]) {
        KZ_ASSIGN_OR_RETURN(Slice sl, slice(v, "srcs"));
        step.srcs.push_back(sl);
      }
      step.average = s.value("average", false);
    } else if (*kind != StepKind::kRecv) {
      if (!s.contains("src")) return Error(where, fmt::format("a {} step needs \"src\"", kind_name));
      KZ_ASSIGN_OR_RETURN(Slice sl, slice(s["src"], "src"));
      step.srcs.push_back(sl);
    }
    return step;
  }

  Status Error(const std::string& where, const std::string& what) const {
    return InvalidArgument(fmt::format("{}: {}{}", source_, where.empty() ? "" : where + ": ", what));
  }

  std::string_view source_;
};

std::string SliceText(const Slice& s) { return fmt::format("{}[{}+{}]", BufferKindName(s.buffer), s.offset, s.count); }

}  // namespace

Result<PlanFile> ParsePlanFile(std::string_view text, std::string_view source) {
  KZ_ASSIGN_OR_RETURN(json j, ParseJson(text, source));
  return Parser(source).Parse(j);
}

Result<PlanFile> LoadPlanFile(const std::string& path) {
  KZ_ASSIGN_OR_RETURN(std::string text, ReadFileCapped(path, kMaxPlanFileBytes));
  return ParsePlanFile(text, path);
}

Status PlanFileServes(const PlanFile& file, const CollectiveRequest& request) {
  auto no = [&](const std::string& why) {
    return Status(StatusCode::kNotSupported, fmt::format("plan file {} ({}): {}", file.name, file.source, why));
  };
  if (request.collective != file.collective)
    return no(
        fmt::format("it is a {} plan, not {}", CollectiveName(file.collective), CollectiveName(request.collective)));
  if (request.nranks != file.nranks)
    return no(fmt::format("it is for {} ranks, the communicator has {}", file.nranks, request.nranks));
  if (request.count == 0 || request.count % file.units != 0)
    return no(fmt::format("its {} units do not divide the count {}", file.units, request.count));
  if (request.in_place && !file.in_place)
    return no("it is not for in-place buffers (\"placement\": \"in\" or \"both\")");
  if (!request.in_place && !file.out_of_place) return no("it is for in-place buffers only (\"placement\": \"in\")");
  return Status::Ok();
}

namespace {

// A buffer of a plan file's rank: `blocks` blocks of `block_units` units each.
struct Shape {
  uint64_t blocks = 1, block_units = 0;
};
Shape BufferShape(const PlanFile& f, const RankPlan& rp, BufferKind b) {
  const auto n = static_cast<uint64_t>(f.nranks);
  if (b == BufferKind::kScratch) return {1, rp.scratch_count};
  const bool in = b == BufferKind::kInput;
  switch (f.collective) {
    case Collective::kReduceScatter: return in ? Shape{n, f.units} : Shape{1, f.units};
    case Collective::kAllGather: return in ? Shape{1, f.units} : Shape{n, f.units};
    case Collective::kAllToAll: return {n, f.units};
    default: return {1, f.units};
  }
}

uint64_t LargestStepUnits(const PlanFile& f) {
  uint64_t m = 0;
  for (const RankPlan& rp : f.ranks)
    for (const std::vector<Step>& ch : rp.channels)
      for (const Step& s : ch) m = std::max(m, s.count());
  return m;
}

}  // namespace

Status CheckPlanFileSlices(const PlanFile& f) {
  for (const RankPlan& rp : f.ranks)
    for (size_t c = 0; c < rp.channels.size(); ++c)
      for (size_t i = 0; i < rp.channels[c].size(); ++i) {
        const Step& s = rp.channels[c][i];
        std::vector<Slice> all = s.srcs;
        if (s.kind != StepKind::kSend) all.push_back(s.dst);
        for (const Slice& sl : all) {
          const Shape sh = BufferShape(f, rp, sl.buffer);
          const uint64_t size = sh.blocks * sh.block_units;
          std::string why;
          if (sl.end() > size) {
            why = fmt::format("{} ends at unit {}, past the {} unit(s) of its buffer", SliceText(sl), sl.end(), size);
          } else if (sh.blocks > 1 && sl.offset / sh.block_units != (sl.end() - 1) / sh.block_units) {
            why = fmt::format("{} crosses from rank {}'s block into the next ({} units each)", SliceText(sl),
                              sl.offset / sh.block_units, sh.block_units);
          }
          if (!why.empty())
            return InvalidArgument(fmt::format("{}: rank {}, channel {}, step {}: {}", f.source, rp.rank, c, i, why));
        }
      }
  return Status::Ok();
}

uint64_t PlanFilePasses(const PlanFile& file, const CollectiveRequest& request, uint64_t chunk_count) {
  const uint64_t unit = request.count / file.units, largest = LargestStepUnits(file);
  if (largest == 0) return 1;
  if (largest > chunk_count) return 0;  // even one element per unit is too much
  // The smallest divisor P of `unit` with largest x unit / P <= chunk_count.
  const uint64_t need = (largest * unit + chunk_count - 1) / chunk_count;
  for (uint64_t p = std::max<uint64_t>(need, 1); p <= unit; ++p)
    if (unit % p == 0) return p;
  return unit;
}

Result<RankPlan> InstantiatePlanFile(const PlanFile& file, const CollectiveRequest& request, int rank,
                                     uint64_t chunk_count) {
  const uint64_t passes = PlanFilePasses(file, request, chunk_count);
  if (passes == 0)
    return Status(StatusCode::kNotSupported,
                  fmt::format("plan file {}: a step of {} units is more than a chunk ({} elements) even at one "
                              "element per unit",
                              file.name, LargestStepUnits(file), chunk_count));
  const uint64_t unit = request.count / file.units, piece = unit / passes;
  const RankPlan& in = file.ranks[static_cast<size_t>(rank)];
  RankPlan out;
  out.rank = rank;
  out.scratch_count = in.scratch_count * unit;
  out.channels.resize(in.channels.size());
  auto map = [&](const Slice& s, uint64_t k) {
    const Shape sh = BufferShape(file, in, s.buffer);
    const uint64_t block = s.offset / std::max<uint64_t>(sh.block_units, 1), w = s.offset - block * sh.block_units;
    return Slice{s.buffer, block * sh.block_units * unit + k * sh.block_units * piece + w * piece, s.count * piece};
  };
  for (uint64_t k = 0; k < passes; ++k)
    for (size_t c = 0; c < in.channels.size(); ++c)
      for (const Step& s : in.channels[c]) {
        Step x = s;
        if (s.kind != StepKind::kSend) x.dst = map(s.dst, k);
        for (Slice& src : x.srcs) src = map(src, k);
        out.channels[c].push_back(std::move(x));
      }
  return out;
}

Result<std::string> PlanToJson(const Plan& plan, std::string_view name) {
  if (plan.aggregators > 0 || IsHostFused(plan.algorithm) || plan.algorithm == Algorithm::kFused)
    return InvalidArgument(fmt::format("{} plans do work outside their steps; a plan file holds steps only",
                                       AlgorithmName(plan.algorithm)));
  if (plan.ranks.size() != static_cast<size_t>(plan.request.nranks))
    return InvalidArgument("a plan file needs every rank's steps");
  json ranks = json::array();
  for (const RankPlan& rp : plan.ranks) {
    if (!rp.epilogue.empty())
      return InvalidArgument(
          fmt::format("rank {} has an epilogue (an avg plan's division); dump the sum's plan", rp.rank));
    json channels = json::array();
    for (const std::vector<Step>& steps : rp.channels) {
      json list = json::array();
      for (const Step& s : steps) {
        json j = {{"step", StepKindName(s.kind)}};
        if (s.peer >= 0) j["peer"] = s.peer;
        if (s.kind != StepKind::kSend) j["dst"] = SliceText(s.dst);
        if (s.kind == StepKind::kReduce) {
          json srcs = json::array();
          for (const Slice& x : s.srcs) srcs.push_back(SliceText(x));
          j["srcs"] = srcs;
          if (s.average) j["average"] = true;
        } else if (!s.srcs.empty()) {
          j["src"] = SliceText(s.srcs[0]);
        }
        list.push_back(j);
      }
      channels.push_back(list);
    }
    ranks.push_back({{"rank", rp.rank}, {"scratch", rp.scratch_count}, {"channels", channels}});
  }
  json j = {{"format", kPlanFileFormat},
            {"name", name},
            {"collective", CollectiveName(plan.request.collective)},
            {"nranks", plan.request.nranks},
            {"units", plan.request.count},
            {"placement", plan.request.in_place ? "in" : "out"},
            {"ranks", ranks}};
  // One step per line: readable, and diffs stay small.
  std::string out = "{\n";
  size_t k = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++k) {
    if (it.key() == "ranks") continue;
    out += fmt::format("  \"{}\": {},\n", it.key(), it.value().dump());
  }
  out += "  \"ranks\": [\n";
  for (size_t r = 0; r < ranks.size(); ++r) {
    const json& rank = ranks[r];
    out += fmt::format("    {{\"rank\": {}, \"scratch\": {}, \"channels\": [\n", rank["rank"].dump(),
                       rank["scratch"].dump());
    for (size_t c = 0; c < rank["channels"].size(); ++c) {
      const json& steps = rank["channels"][c];
      out += "      [\n";
      for (size_t i = 0; i < steps.size(); ++i)
        out += fmt::format("        {}{}\n", steps[i].dump(), i + 1 < steps.size() ? "," : "");
      out += fmt::format("      ]{}\n", c + 1 < rank["channels"].size() ? "," : "");
    }
    out += fmt::format("    ]}}{}\n", r + 1 < ranks.size() ? "," : "");
  }
  out += "  ]\n}\n";
  return out;
}

}  // namespace kizuna::collectives
