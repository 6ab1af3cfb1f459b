#include "tools/crosscheck/cases.h"

#include <algorithm>

#include <fmt/format.h>

#include "tools/crosscheck/rng.h"

namespace kizuna::crosscheck {
namespace {

// Salts that keep the draws of worlds, cases and values apart.
constexpr uint64_t kWorldSalt = 0x574f524c44ull;
constexpr uint64_t kCaseSalt = 0x43415345ull;
constexpr uint64_t kValueSalt = 0x56414c5545ull;

constexpr uint64_t kMiB = 1u << 20;

bool TakesHostMemory(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter || c == Collective::kAllGather ||
         c == Collective::kBroadcast || c == Collective::kReduce;
}

Collective DrawCollective(Rng& rng) {
  const uint64_t u = rng.Below(100);
  if (u < 30) return Collective::kAllReduce;
  if (u < 43) return Collective::kReduceScatter;
  if (u < 56) return Collective::kAllGather;
  if (u < 69) return Collective::kBroadcast;
  if (u < 82) return Collective::kReduce;
  if (u < 95) return Collective::kAllToAll;
  return Collective::kBarrier;
}

ValueKind DrawValues(Rng& rng, DataType type) {
  const uint64_t u = rng.Below(100);
  if (IsFloatingPoint(type)) {
    if (u < 25) return ValueKind::kSmallInt;
    if (u < 45) return ValueKind::kDyadic;
    if (u < 85) return ValueKind::kGeneral;
    return ValueKind::kSignedZero;
  }
  if (u < 35) return ValueKind::kSmallInt;
  if (u < 80) return ValueKind::kGeneral;
  return ValueKind::kExtreme;
}

// Mostly small, log-uniform, a few empty and a few of several MiB; odd sizes often.
uint64_t DrawCount(Rng& rng, uint64_t max_count, int nranks) {
  const uint64_t u = rng.Below(100);
  uint64_t count = 0;
  if (u < 5)
    count = 0;
  else if (u < 65)
    count = rng.LogUniform(1, 4096);
  else if (u < 90)
    count = rng.LogUniform(4096, 256u << 10);
  else
    count = rng.LogUniform(std::min<uint64_t>(256u << 10, std::max<uint64_t>(max_count, 1)),
                           std::max<uint64_t>(max_count, 1));
  if (count > 0 && rng.Chance(0.3)) count += static_cast<uint64_t>(rng.Range(0, nranks + 1));
  return std::min(count, max_count);
}

std::string Algorithms(const std::vector<Run>& runs) {
  std::string s;
  for (const Run& r : runs) {
    s += s.empty() ? "" : ",";
    s += r.algorithm ? std::string(collectives::AlgorithmName(*r.algorithm)) : std::string("auto");
    if (r.host_memory) s += "/host";
  }
  return s;
}

// The collective's part of a case: type, op, count, root, placement, values and runs.
void DrawCollectiveCase(const Options& options, Rng& rng, bool follow_up, Case& c) {
  const WorldSpec& w = c.world;
  const int n = w.nranks;
  c.collective = DrawCollective(rng);
  c.type = AllDataTypes()[rng.Below(static_cast<uint64_t>(kNumDataTypes))];
  c.op = AllReduceOps()[rng.Below(static_cast<uint64_t>(kNumReduceOps))];
  c.values = DrawValues(rng, c.type);
  if (c.values == ValueKind::kSignedZero && (c.op == ReduceOp::kMin || c.op == ReduceOp::kMax) &&
      options.skips("signed-zeros"))
    c.values = ValueKind::kSmallInt;
  c.nans = options.nans && IsFloatingPoint(c.type);
  const size_t elem = DataTypeSize(c.type);
  // The largest buffer holds this many elements per element of `count`.
  const uint64_t factor =
      std::max(InputCount(c.collective, n, 1), OutputCount(c.collective, n, 1)) > 1 ? static_cast<uint64_t>(n) : 1;
  uint64_t max_count = options.max_bytes / (elem * factor);
  // Tiny chunks make many steps: keep a case within about 512 chunks of its largest buffer.
  if (w.chunk_bytes > 0) max_count = std::min(max_count, w.chunk_bytes * 512 / (elem * factor) + 1);
  if (follow_up) max_count = std::min<uint64_t>(max_count, 65536);
  // Some cases issue several calls before waiting: the engine queues them behind each other.
  const bool burst = !follow_up && rng.Chance(0.2);
  if (burst) {
    c.burst = static_cast<int>(rng.Range(2, 4));
    c.burst_grouped = rng.Chance(0.5);
    max_count /= static_cast<uint64_t>(c.burst);
  }
  c.count = c.collective == Collective::kBarrier ? 0 : DrawCount(rng, max_count, n);
  c.root = static_cast<int>(rng.Below(static_cast<uint64_t>(n)));
  c.in_place = rng.Chance(0.35) && c.collective != Collective::kAllToAll && c.collective != Collective::kBarrier;
  c.offset = rng.Chance(0.25) ? static_cast<uint32_t>(rng.Range(1, 3)) : 0;
  c.one_group = w.mode == Mode::kOneThread && rng.Chance(0.6);

  const std::vector<Algorithm> serving = Serving(c.collective, true);
  const bool host_ok = w.mode == Mode::kProcesses && !w.opaque && TakesHostMemory(c.collective);
  const bool host_draw = rng.Chance(0.25);
  const bool host = host_ok && host_draw && !options.skips("host-memory");
  c.runs.clear();
  if (w.deterministic && collectives::IsReduction(c.collective) && !follow_up) {
    // The same case under several algorithms, compared bit for bit.
    std::vector<Algorithm> order = serving;
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);
    const int take = static_cast<int>(rng.Range(2, std::min<int64_t>(4, static_cast<int64_t>(order.size()))));
    for (int i = 0; i < take; ++i) c.runs.push_back({order[static_cast<size_t>(i)], false});
    if (rng.Chance(0.3)) c.runs.push_back({std::nullopt, false});
    if (host) c.runs.push_back({std::nullopt, true});
    const bool narrow = c.type == DataType::kFloat16 || c.type == DataType::kBfloat16;
    c.compare_runs = !(narrow && c.op == ReduceOp::kAvg && options.skips("deterministic-avg16"));
    return;
  }
  const uint64_t u = rng.Below(100);
  Run run;
  if (host)
    run.host_memory = true;
  else if (u < 45)
    run.algorithm = std::nullopt;
  else if (u < 95)
    run.algorithm = rng.Pick(serving);
  else
    run.algorithm = static_cast<Algorithm>(rng.Below(7));  // maybe one that does not serve it: the fallback
  c.runs.push_back(run);
}

void DrawPattern(const Options& options, Rng& rng, Case& c) {
  const int n = c.world.nranks;
  static const std::vector<Pattern> kPatterns = {Pattern::kPairs, Pattern::kChain, Pattern::kOneSided,
                                                 Pattern::kExchange};
  c.pattern = rng.Pick(kPatterns);
  c.segments.assign(static_cast<size_t>(n), {});
  auto message = [&](int from, int to) {
    Message m;
    m.from = from;
    m.to = to;
    m.type = AllDataTypes()[rng.Below(static_cast<uint64_t>(kNumDataTypes))];
    const uint64_t max_count =
        std::max<uint64_t>(1, std::min<uint64_t>(options.max_bytes, kMiB) / DataTypeSize(m.type));
    m.count = rng.Chance(0.05) ? 0 : rng.LogUniform(1, max_count);
    c.messages.push_back(m);
    return static_cast<int>(c.messages.size()) - 1;
  };
  auto pair = [&](int* a, int* b) {
    *a = static_cast<int>(rng.Below(static_cast<uint64_t>(n)));
    *b = (*a + 1 + static_cast<int>(rng.Below(static_cast<uint64_t>(n - 1)))) % n;
  };
  auto& seg = c.segments;
  switch (c.pattern) {
    case Pattern::kPairs: {
      const int m = static_cast<int>(rng.Range(1, 5));
      for (int k = 0; k < m; ++k) {
        int a = 0, b = 0;
        pair(&a, &b);
        message(a, b);
      }
      for (int r = 0; r < n; ++r) {
        Segment s;
        for (int k = 0; k < m; ++k) {
          const Message& msg = c.messages[static_cast<size_t>(k)];
          if (msg.from == r) s.calls.push_back({true, k});
          if (msg.to == r) s.calls.push_back({false, k});
        }
        if (s.calls.empty()) continue;
        s.grouped = s.calls.size() > 1 || rng.Chance(0.5);
        seg[static_cast<size_t>(r)].push_back(s);
      }
      break;
    }
    case Pattern::kChain: {
      const int len = static_cast<int>(rng.Range(2, n));
      const std::vector<int> perm = rng.Permutation(n);
      for (int j = 0; j + 1 < len; ++j) message(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(j) + 1]);
      for (int j = 0; j < len; ++j) {
        Segment s;
        if (j > 0) s.calls.push_back({false, j - 1});
        if (j + 1 < len) s.calls.push_back({true, j});
        if (s.calls.size() == 2 && rng.Chance(0.5)) std::swap(s.calls[0], s.calls[1]);
        s.grouped = s.calls.size() > 1 || rng.Chance(0.5);
        seg[static_cast<size_t>(perm[static_cast<size_t>(j)])].push_back(s);
      }
      break;
    }
    case Pattern::kOneSided: {
      int a = 0, b = 0;
      pair(&a, &b);
      const int k = static_cast<int>(rng.Range(2, 4));
      for (int i = 0; i < k; ++i) message(a, b);
      const bool sender_groups = rng.Chance(0.5);
      for (int side = 0; side < 2; ++side) {
        const bool send = side == 0;
        const int r = send ? a : b;
        if (send == sender_groups) {
          Segment s;
          for (int i = 0; i < k; ++i) s.calls.push_back({send, i});
          seg[static_cast<size_t>(r)].push_back(s);
        } else {
          for (int i = 0; i < k; ++i) seg[static_cast<size_t>(r)].push_back({false, {{send, i}}});
        }
      }
      break;
    }
    default: {  // kExchange
      int a = 0, b = 0;
      pair(&a, &b);
      int ab = static_cast<int>(rng.Range(1, 3)), ba = static_cast<int>(rng.Range(1, 3));
      while (ab + ba > 0) {
        const bool forward = ba == 0 || (ab > 0 && rng.Chance(0.5));
        if (forward) {
          message(a, b);
          --ab;
        } else {
          message(b, a);
          --ba;
        }
      }
      for (int r : {a, b}) {
        Segment s;
        for (size_t k = 0; k < c.messages.size(); ++k) {
          const Message& msg = c.messages[k];
          s.calls.push_back({msg.from == r, static_cast<int>(k)});
        }
        seg[static_cast<size_t>(r)].push_back(s);
      }
      break;
    }
  }
}

}  // namespace

std::string_view ModeName(Mode m) {
  switch (m) {
    case Mode::kThreads: return "threads";
    case Mode::kOneThread: return "one-thread";
    case Mode::kProcesses: return "processes";
  }
  return "invalid";
}

std::string_view PatternName(Pattern p) {
  switch (p) {
    case Pattern::kNone: return "none";
    case Pattern::kPairs: return "pairs";
    case Pattern::kChain: return "chain";
    case Pattern::kOneSided: return "one-sided";
    case Pattern::kExchange: return "exchange";
  }
  return "invalid";
}

std::vector<std::string_view> KnownSkips() {
  return {"signed-zeros", "deterministic-avg16", "sync-free", "point-to-point", "host-memory", "ofi", "opaque"};
}

std::vector<std::string> Options::GenerationArgs() const {
  std::vector<std::string> a = {"--ranks",     fmt::format("{}-{}", min_ranks, max_ranks),
                                "--max-bytes", std::to_string(max_bytes),
                                "--batch",     std::to_string(batch)};
  if (ofi_max_ranks != Options().ofi_max_ranks) {
    a.push_back("--ofi-max-ranks");
    a.push_back(std::to_string(ofi_max_ranks));
  }
  if (nans) a.push_back("--nans");
  for (uint64_t k : drop) {
    a.push_back("--drop-case");
    a.push_back(std::to_string(k));
  }
  if (corrupt_case) {
    a.push_back("--corrupt-case");
    a.push_back(std::to_string(*corrupt_case));
  }
  for (const std::string& k : skip) {
    a.push_back("--skip");
    a.push_back(k);
  }
  return a;
}

std::string Options::GenerationFlags() const {
  std::string s;
  for (const std::string& a : GenerationArgs()) s += (s.empty() ? "" : " ") + a;
  return s;
}

std::string WorldSpec::ToString() const {
  std::string s = fmt::format("{} ranks={} devices={}", ModeName(mode), nranks, devices);
  if (deterministic) s += " deterministic";
  if (chunk_bytes > 0) s += fmt::format(" chunk={}", chunk_bytes);
  if (opaque) s += " opaque";
  s += ofi ? " fabric=ofi" : " fabric=directconnect";
  if (!direct_access) s += " no-direct-access";
  if (staging_bytes > 0) s += fmt::format(" staging={}", staging_bytes);
  if (throttled) s += " throttled";
  if (sync_free) s += " sync-free";
  return s;
}

std::string Case::ToString() const {
  std::string s;
  if (pattern != Pattern::kNone) {
    s = fmt::format("p2p {}:", PatternName(pattern));
    for (size_t k = 0; k < messages.size(); ++k)
      s += fmt::format(" m{} {}->{} {}x{}", k, messages[k].from, messages[k].to, messages[k].count,
                       DataTypeName(messages[k].type));
    s += ";";
    for (size_t r = 0; r < segments.size(); ++r) {
      if (segments[r].empty()) continue;
      s += fmt::format(" rank {}:", r);
      for (const Segment& seg : segments[r]) {
        std::string calls;
        for (const P2pCall& call : seg.calls)
          calls += fmt::format("{}{} m{}", calls.empty() ? "" : ", ", call.send ? "send" : "recv", call.message);
        s += seg.grouped ? fmt::format(" {{{}}}", calls) : fmt::format(" [{}]", calls);
      }
    }
    s += "; then ";
  }
  if (collective == Collective::kBarrier)
    return s + fmt::format("barrier runs={}{}{}", Algorithms(runs),
                           burst > 1 ? fmt::format(" burst={}{}", burst, burst_grouped ? " grouped" : "") : "",
                           one_group ? " one-group" : "");
  s += fmt::format("{} count={} {}", collectives::CollectiveName(collective), count, DataTypeName(type));
  if (collectives::IsReduction(collective)) s += fmt::format(" {}", ReduceOpName(op));
  if (collectives::HasRoot(collective)) s += fmt::format(" root={}", root);
  if (in_place) s += " in-place";
  if (offset > 0) s += fmt::format(" offset={}", offset);
  s += fmt::format(" values={}{}", ValueKindName(values), nans ? "+nan" : "");
  s += fmt::format(" runs={}", Algorithms(runs));
  if (burst > 1) s += fmt::format(" burst={}{}", burst, burst_grouped ? " grouped" : "");
  if (compare_runs) s += " compared";
  if (one_group) s += " one-group";
  return s;
}

uint64_t InputCount(Collective c, int nranks, uint64_t count) {
  switch (c) {
    case Collective::kReduceScatter:
    case Collective::kAllToAll: return static_cast<uint64_t>(nranks) * count;
    case Collective::kBarrier: return 0;
    default: return count;
  }
}

uint64_t OutputCount(Collective c, int nranks, uint64_t count) {
  switch (c) {
    case Collective::kAllGather:
    case Collective::kAllToAll: return static_cast<uint64_t>(nranks) * count;
    case Collective::kBarrier: return 0;
    default: return count;
  }
}

std::vector<Algorithm> Serving(Collective c, bool fused) {
  std::vector<Algorithm> a;
  switch (c) {
    case Collective::kAllReduce:
      a = {Algorithm::kRing, Algorithm::kTree, Algorithm::kRhd, Algorithm::kRd, Algorithm::kPairwise};
      break;
    case Collective::kReduceScatter:
    case Collective::kAllGather: a = {Algorithm::kRing, Algorithm::kRhd, Algorithm::kPairwise}; break;
    case Collective::kBroadcast:
    case Collective::kReduce: a = {Algorithm::kRing, Algorithm::kTree}; break;
    case Collective::kAllToAll: return {Algorithm::kPairwise};
    case Collective::kBarrier: a = {Algorithm::kRd, Algorithm::kPairwise}; break;
    default: return {Algorithm::kP2p};
  }
  if (fused) a.push_back(Algorithm::kFused);
  return a;
}

WorldSpec MakeWorld(const Options& options, uint64_t seed, uint64_t batch) {
  Rng rng(Key(seed, batch, kWorldSalt));
  WorldSpec w;
  static const Mode kModes[3] = {Mode::kThreads, Mode::kOneThread, Mode::kProcesses};
  w.mode = options.mode ? *options.mode : kModes[batch % 3];
  w.nranks = static_cast<int>(rng.Range(options.min_ranks, options.max_ranks));
  w.devices = rng.Chance(0.5) ? w.nranks : static_cast<int>(rng.Range(1, w.nranks));
  w.deterministic = rng.Chance(0.3);
  if (rng.Chance(0.45))
    w.chunk_bytes = 0;
  else if (rng.Chance(0.25))
    w.chunk_bytes = static_cast<uint64_t>(rng.Range(64, 4096));
  else
    w.chunk_bytes = rng.LogUniform(4096, 2 * kMiB);
  const bool opaque = rng.Chance(0.25), ofi = rng.Chance(0.15), direct = rng.Chance(0.85), staging = rng.Chance(0.3);
  w.opaque = opaque && !options.skips("opaque");
  w.ofi = ofi && !options.skips("ofi");
  if (w.ofi && w.nranks > options.ofi_max_ranks) {
    w.nranks = std::max(2, options.ofi_max_ranks);
    w.devices = std::min(w.devices, w.nranks);
  }
  w.direct_access = direct || w.mode == Mode::kProcesses;
  w.staging_bytes = staging ? 2 * kMiB : 0;
  w.throttled = rng.Chance(0.15);
  w.sync_free = rng.Chance(0.3) && !options.skips("sync-free");
  return w;
}

Case MakeCase(const Options& options, uint64_t seed, uint64_t index, const WorldSpec& world) {
  Rng rng(Key(seed, index, kCaseSalt));
  Case c;
  c.index = index;
  c.key = Key(seed, index, kValueSalt);
  c.world = world;
  const bool p2p = rng.Chance(0.2) && world.nranks >= 2 && !options.skips("point-to-point");
  if (p2p) DrawPattern(options, rng, c);
  DrawCollectiveCase(options, rng, p2p, c);
  return c;
}

}  // namespace kizuna::crosscheck
