// The "file" algorithm: a schedule from a plan file (collectives/plan/plan_file.h) that the
// communicator loaded (CommTopology::plan_files), the first of them that serves the request.
#include "collectives/algorithms/from_file.h"

#include <cstring>
#include <random>
#include <utility>

#include "collectives/algorithms/impl.h"
#include "collectives/algorithms/reference.h"
#include "collectives/algorithms/simulate.h"

namespace kizuna::collectives {
namespace algo {
namespace {

// The first file that serves `request`, or kNotSupported listing why none does.
Result<const PlanFile*> FileFor(const CollectiveRequest& request, const CommTopology& shape) {
  if (!shape.plan_files || shape.plan_files->empty())
    return Status(StatusCode::kNotSupported,
                  fmt::format("file: no plan file for {} loaded (KIZUNA_PLAN_FILE names them)",
                              CollectiveName(request.collective)));
  std::string why;
  for (const PlanFile& f : *shape.plan_files) {
    const Status s = PlanFileServes(f, request);
    if (s.ok()) return &f;
    why += (why.empty() ? "" : "; ") + s.message();
  }
  return Status(StatusCode::kNotSupported, "file: " + why);
}

class FromFile final : public AlgorithmImpl {
 public:
  Algorithm id() const override { return Algorithm::kFile; }

  Status Supports(const CollectiveRequest& request, const CommTopology& shape) const override {
    return FileFor(request, shape).status();
  }

  Result<RankPlan> Build(const CollectiveRequest& request, const CommTopology& shape, const PlanOptions& options,
                         int rank) const override {
    KZ_ASSIGN_OR_RETURN(const PlanFile* f, FileFor(request, shape));
    if (options.deterministic && IsReduction(request.collective))
      return Status(StatusCode::kNotSupported,
                    "file: a plan file reduces in its own order, not rank order (KIZUNA_DETERMINISTIC)");
    KZ_ASSIGN_OR_RETURN(RankPlan rp, InstantiatePlanFile(*f, request, rank, options.chunk_count));
    for (const std::vector<Step>& ch : rp.channels)
      for (const Step& s : ch)
        if (s.peer >= 0)
          KZ_RETURN_IF_ERROR(s.kind == StepKind::kSend ? RequireLink(shape, rank, s.peer, "file", "a send's link")
                                                       : RequireLink(shape, s.peer, rank, "file", "a receive's link"));
    return rp;
  }

  std::string Describe(const CollectiveRequest& request, const CommTopology& shape, int) const override {
    auto f = FileFor(request, shape);
    return f.ok() ? fmt::format("plan file {} ({})", (*f)->name, (*f)->source) : std::string();
  }
};

}  // namespace

const AlgorithmImpl& FileAlgorithm() {
  static const FromFile impl;
  return impl;
}

}  // namespace algo

namespace {

// One run of the file in the simulator: `count` elements, cut at `chunk`.
Status CheckOnce(const PlanFile& file, uint64_t count, uint64_t chunk, bool in_place) {
  CollectiveRequest req;
  req.collective = file.collective;
  req.nranks = file.nranks;
  req.count = count;
  req.dtype = DataType::kFloat32;
  req.op = ReduceOp::kSum;
  req.in_place = in_place;
  LinkDesc link;
  link.reachable = true;
  CommTopology shape = CommTopology::Uniform(file.nranks, RankDesc{}, link);
  shape.plan_files = std::make_shared<const PlanFiles>(PlanFiles{file});
  PlanOptions options;
  options.chunk_count = chunk;
  options.channels = 1;
  const std::string where = fmt::format("{}: checked at {} element(s) per unit{}{}", file.source, count / file.units,
                                        in_place ? ", in place" : "", chunk < count ? ", cut into passes" : "");
  Result<Plan> plan = BuildPlan(Algorithm::kFile, req, shape, options, -1);
  if (!plan.ok()) return InvalidArgument(fmt::format("{}: {}", where, plan.status().message()));
  // Small integers: every order of summation gives the same float32 result.
  std::mt19937 rng(static_cast<uint32_t>(count * 7919 + file.units));
  std::vector<reference::Bytes> in(static_cast<size_t>(file.nranks)), out(in.size());
  for (int r = 0; r < file.nranks; ++r) {
    std::vector<float> v(req.input_count());
    for (float& x : v) x = static_cast<float>(rng() % 64);
    in[static_cast<size_t>(r)].resize(v.size() * sizeof(float));
    std::memcpy(in[static_cast<size_t>(r)].data(), v.data(), in[static_cast<size_t>(r)].size());
    out[static_cast<size_t>(r)].assign(req.output_count() * sizeof(float), 0xEE);
  }
  // Every output starts unwritten (0xEE) but where plan.h's table puts the input in place; what
  // the collective leaves alone (Reduce's non-roots) must stay as it was.
  std::vector<reference::Bytes> got = out, work = in, before(out.size());
  std::vector<SimRankBuffers> buffers(static_cast<size_t>(file.nranks));
  const size_t es = sizeof(float);
  for (int r = 0; r < file.nranks; ++r) {
    const auto i = static_cast<size_t>(r);
    if (!in_place) {
      buffers[i] = {work[i].data(), got[i].data()};
    } else if (req.collective == Collective::kReduceScatter) {
      // The output lies inside the input: run on the input; the output is rank r's block of it.
      buffers[i] = {work[i].data(), work[i].data() + static_cast<size_t>(r) * count * es};
    } else {
      // The input lies inside the output (AllGather: at the rank's block), or is it.
      const size_t at = req.collective == Collective::kAllGather ? static_cast<size_t>(r) * count * es : 0;
      std::memcpy(got[i].data() + at, in[i].data(), in[i].size());
      buffers[i] = {got[i].data() + at, got[i].data()};
    }
    const auto* o = static_cast<const uint8_t*>(buffers[i].output);
    before[i].assign(o, o + req.output_count() * es);
  }
  const std::vector<reference::Bytes> want = reference::Expected(req, in, before);
  Result<SimStats> ran = SimulatePlan(*plan, buffers, SimOptions{});
  if (!ran.ok()) return InvalidArgument(fmt::format("{}: {}", where, ran.status().message()));
  for (int r = 0; r < file.nranks; ++r) {
    const auto i = static_cast<size_t>(r);
    const uint8_t* result = static_cast<const uint8_t*>(buffers[i].output);
    for (uint64_t e = 0; e < req.output_count(); ++e) {
      float a = 0, b = 0;
      std::memcpy(&a, result + e * sizeof(float), sizeof a);
      std::memcpy(&b, want[i].data() + e * sizeof(float), sizeof b);
      const bool unwritten = std::memcmp(&a, "\xEE\xEE\xEE\xEE", 4) == 0;
      if (std::memcmp(&a, &b, sizeof a) != 0)
        return InvalidArgument(
            fmt::format("{}: rank {}'s output is wrong at unit {} (element {}): {} where the "
                        "collective gives {}",
                        where, r, e / (count / file.units), e,
                        unwritten ? std::string("nothing written") : fmt::format("{}", a), b));
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckPlanFile(const PlanFile& file) {
  for (bool in_place : {false, true}) {
    if (in_place ? !file.in_place : !file.out_of_place) continue;
    for (uint64_t per_unit : {uint64_t{1}, uint64_t{4}}) {
      const uint64_t count = file.units * per_unit;
      // Whole, then cut into passes of a quarter (chunks of a unit's quarter).
      KZ_RETURN_IF_ERROR(CheckOnce(file, count, UINT64_MAX / 2, in_place));
      if (per_unit > 1) {
        uint64_t largest = 0;
        for (const RankPlan& rp : file.ranks)
          for (const std::vector<Step>& ch : rp.channels)
            for (const Step& s : ch) largest = std::max(largest, s.count());
        if (largest > 0) KZ_RETURN_IF_ERROR(CheckOnce(file, count, largest, in_place));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kizuna::collectives
