#include "tools/bench/sweep.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <utility>

namespace kizuna::bench {
namespace {

constexpr std::array<std::pair<BenchColl, std::string_view>, 7> kNames = {{
    {BenchColl::kAllReduce, "allreduce"},
    {BenchColl::kReduceScatter, "reducescatter"},
    {BenchColl::kAllGather, "allgather"},
    {BenchColl::kBroadcast, "broadcast"},
    {BenchColl::kReduce, "reduce"},
    {BenchColl::kAllToAll, "alltoall"},
    {BenchColl::kSendRecv, "sendrecv"},
}};

// Sizes stay far below 2^64 so that counts times ranks cannot overflow.
constexpr uint64_t kMaxBytes = uint64_t{1} << 50;

}  // namespace

std::string_view BenchCollName(BenchColl c) {
  for (const auto& [coll, name] : kNames)
    if (coll == c) return name;
  return "invalid";
}

std::optional<BenchColl> ParseBenchColl(std::string_view name) {
  // nccl-tests names its programs all_reduce_perf, reduce_scatter_perf, ...: underscores, dashes
  // and case do not matter.
  std::string folded;
  for (char ch : name)
    if (ch != '_' && ch != '-') folded += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const auto& [coll, n] : kNames)
    if (folded == n) return coll;
  return std::nullopt;
}

std::string BenchCollNames() {
  std::string out;
  for (const auto& [coll, name] : kNames) out += fmt::format("{}{}", out.empty() ? "" : ", ", name);
  return out;
}

bool IsReduction(BenchColl c) {
  return c == BenchColl::kAllReduce || c == BenchColl::kReduceScatter || c == BenchColl::kReduce;
}

bool HasRoot(BenchColl c) { return c == BenchColl::kBroadcast || c == BenchColl::kReduce; }

collectives::Collective EngineCollective(BenchColl c) {
  using collectives::Collective;
  switch (c) {
    case BenchColl::kAllReduce:
      return Collective::kAllReduce;
    case BenchColl::kReduceScatter:
      return Collective::kReduceScatter;
    case BenchColl::kAllGather:
      return Collective::kAllGather;
    case BenchColl::kBroadcast:
      return Collective::kBroadcast;
    case BenchColl::kReduce:
      return Collective::kReduce;
    case BenchColl::kAllToAll:
      return Collective::kAllToAll;
    case BenchColl::kSendRecv:
      return Collective::kSend;
  }
  return Collective::kAllReduce;
}

double BusBwFactor(BenchColl c, int nranks) {
  const double n = nranks;
  switch (c) {
    case BenchColl::kAllReduce:
      return 2 * (n - 1) / n;
    case BenchColl::kReduceScatter:
    case BenchColl::kAllGather:
    case BenchColl::kAllToAll:
      return (n - 1) / n;
    case BenchColl::kBroadcast:
    case BenchColl::kReduce:
    case BenchColl::kSendRecv:
      return 1;
  }
  return 1;
}

std::string_view NcclTypeName(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return "half";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat64:
      return "double";
    case DataType::kInt8:
      return "int8";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kUint32:
      return "uint32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUint64:
      return "uint64";
  }
  return "invalid";
}

uint64_t Geometry::in_place_recv_count(int rank) const {
  const uint64_t r = static_cast<uint64_t>(rank);
  const uint64_t input_end = send_offset * r + send_count;
  const uint64_t output_end = recv_offset * r + recv_count;
  return input_end > output_end ? input_end : output_end;
}

Geometry GeometryFor(BenchColl c, uint64_t requested_bytes, DataType t, int nranks) {
  Geometry g;
  g.elem = DataTypeSize(t);
  const uint64_t count = requested_bytes / g.elem;
  const uint64_t n = static_cast<uint64_t>(nranks);
  switch (c) {
    case BenchColl::kAllReduce:
    case BenchColl::kBroadcast:
    case BenchColl::kReduce:
      g.count = g.send_count = g.recv_count = count;
      break;
    case BenchColl::kReduceScatter:
      g.count = count / n;
      g.send_count = g.count * n;
      g.recv_count = g.count;
      g.recv_offset = g.count;
      break;
    case BenchColl::kAllGather:
      g.count = count / n;
      g.send_count = g.count;
      g.recv_count = g.count * n;
      g.send_offset = g.count;
      break;
    case BenchColl::kAllToAll:
      g.count = count / n;
      g.send_count = g.recv_count = g.count * n;
      g.in_place = false;
      break;
    case BenchColl::kSendRecv:
      g.count = g.send_count = g.recv_count = count;
      g.in_place = false;
      break;
  }
  return g;
}

Result<std::vector<uint64_t>> SweepSizes(uint64_t min_bytes, uint64_t max_bytes, uint64_t step_bytes,
                                         uint64_t step_factor) {
  if (min_bytes > max_bytes) return InvalidArgument(fmt::format("-b {} is larger than -e {}", min_bytes, max_bytes));
  if (step_factor > 1 && min_bytes == 0 && max_bytes > 0)
    return InvalidArgument(fmt::format("-b 0 with -f {}: the size would never grow; give -b 1 or more", step_factor));
  if (step_factor <= 1 && step_bytes == 0 && max_bytes > min_bytes)
    return InvalidArgument("-i 0: the size would never grow; give -i 1 or more, or -f 2 or more");
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_bytes; s <= max_bytes;) {
    if (sizes.size() >= kMaxSweepSizes)
      return InvalidArgument(fmt::format(
          "-b {} to -e {} with {} gives more than {} sizes", min_bytes, max_bytes,
          step_factor > 1 ? fmt::format("-f {}", step_factor) : fmt::format("-i {}", step_bytes), kMaxSweepSizes));
    sizes.push_back(s);
    if (s == max_bytes) break;
    // Both bounds are below 2^50 and the factor and step are bounded, so neither overflows.
    s = step_factor > 1 ? s * step_factor : s + step_bytes;
  }
  return sizes;
}

Result<uint64_t> ParseByteSize(std::string_view text, std::string_view flag) {
  size_t used = 0;
  uint64_t value = 0;
  while (used < text.size() && text[used] >= '0' && text[used] <= '9') {
    if (value > kMaxBytes) break;
    value = value * 10 + static_cast<uint64_t>(text[used] - '0');
    ++used;
  }
  if (used == 0)
    return InvalidArgument(fmt::format("{} '{}': expected a size in bytes such as 8, 64K, 1M or 1G", flag, text));
  const std::string_view suffix = text.substr(used);
  int shift = 0;
  if (suffix.empty() || suffix == "B" || suffix == "b")
    shift = 0;
  else if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB")
    shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB")
    shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB")
    shift = 30;
  else if (suffix == "T" || suffix == "t" || suffix == "TB" || suffix == "TiB")
    shift = 40;
  else
    return InvalidArgument(fmt::format("{} '{}': unknown suffix '{}' (use K, M, G or T)", flag, text, suffix));
  if (value >= (kMaxBytes >> shift))
    return InvalidArgument(fmt::format("{} '{}': too large (the limit is 1P)", flag, text));
  return value << shift;
}

}  // namespace kizuna::bench
