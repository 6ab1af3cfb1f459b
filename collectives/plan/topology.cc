#include "collectives/plan/topology.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "runtime/core/wire.h"

namespace kizuna::collectives {
namespace {

// Serialize's and the rank rows' encoding (runtime/core/wire.h): a rank's device, then links.
void PutRank(wire::Bytes& out, const RankDesc& r) {
  wire::PutString(out, r.host_id);
  wire::PutString(out, r.device);
  wire::PutF64(out, r.copy_gbps);
  wire::PutF64(out, r.reduce_gbps);
  wire::PutF64(out, r.launch_us);
  wire::PutI32(out, r.host_cpus);
  wire::PutU8(out, static_cast<uint8_t>((r.host_compute ? 1 : 0) | (r.host_memory ? 2 : 0)));
}

void GetRank(wire::Reader& in, RankDesc& r) {
  r.host_id = in.String();
  r.device = in.String();
  r.copy_gbps = in.F64();
  r.reduce_gbps = in.F64();
  r.launch_us = in.F64();
  r.host_cpus = in.I32();
  const uint8_t flags = in.U8();
  r.host_compute = (flags & 1) != 0;
  r.host_memory = (flags & 2) != 0;
}

void PutLink(wire::Bytes& out, const LinkDesc& l) {
  // Bits 3-7: hops - 1 (a path of up to 32 cables).
  const int hops = std::clamp(l.hops, 1, 32);
  wire::PutU8(out,
              static_cast<uint8_t>((l.reachable ? 1 : 0) | (l.staged ? 2 : 0) | (l.paced ? 4 : 0) | ((hops - 1) << 3)));
  wire::PutF64(out, l.latency_us);
  wire::PutF64(out, l.gbps);
  wire::PutU8(out, static_cast<uint8_t>(std::clamp(l.cables, 1, 255)));
}

void GetLink(wire::Reader& in, LinkDesc& l) {
  const uint8_t flags = in.U8();
  l.reachable = (flags & 1) != 0;
  l.staged = (flags & 2) != 0;
  l.paced = (flags & 4) != 0;
  l.hops = 1 + (flags >> 3);
  l.latency_us = in.F64();
  l.gbps = in.F64();
  l.cables = std::max<int>(in.U8(), 1);
}

constexpr uint32_t kShapeMagic = 0x6b7a5348;  // "kzSH"
constexpr int kMaxShapeRanks = 1 << 20;

bool Good(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

bool CommTopology::FullyConnected() const {
  for (int a = 0; a < link_rows(); ++a)
    for (int b = 0; b < nranks; ++b)
      if (a != b && !Adjacent(a, b)) return false;
  return true;
}

int CommTopology::host_count() const {
  std::set<std::string> hosts;
  for (const RankDesc& r : ranks) hosts.insert(r.host_id);
  return static_cast<int>(hosts.size());
}

std::vector<std::vector<int>> CommTopology::hosts() const {
  std::unordered_map<std::string_view, size_t> ids;  // a host's index by its id (thousands of hosts)
  std::vector<std::vector<int>> out;
  for (int r = 0; r < nranks && static_cast<size_t>(r) < ranks.size(); ++r) {
    const auto [it, fresh] = ids.try_emplace(ranks[static_cast<size_t>(r)].host_id, out.size());
    if (fresh) out.emplace_back();
    out[it->second].push_back(r);
  }
  return out;
}

CommTopology CommTopology::Uniform(int n, const RankDesc& rank, const LinkDesc& link) {
  CommTopology s;
  s.nranks = n;
  s.ranks.assign(static_cast<size_t>(n), rank);
  for (int i = 0; i < n; ++i) s.ranks[static_cast<size_t>(i)].device = fmt::format("{}{}", rank.device, i);
  s.links.assign(static_cast<size_t>(n) * static_cast<size_t>(n), link);
  for (int i = 0; i < n; ++i) s.link(i, i) = LinkDesc{};
  return s;
}

CommTopology CommTopology::Uniform(int n, int period, const RankDesc& rank, const LinkDesc& link) {
  CommTopology s;
  s.nranks = n;
  s.link_period = period;
  s.ranks.assign(static_cast<size_t>(n), rank);
  for (int i = 0; i < n; ++i) s.ranks[static_cast<size_t>(i)].device = fmt::format("{}{}", rank.device, i);
  s.links.assign(static_cast<size_t>(s.link_rows()) * static_cast<size_t>(n), link);
  for (int i = 0; i < s.link_rows(); ++i) s.link(i, i) = LinkDesc{};
  return s;
}

Status CommTopology::Validate() const {
  if (nranks < 1 || nranks > kMaxShapeRanks) return InvalidArgument(fmt::format("shape: {} ranks", nranks));
  if (ranks.size() != static_cast<size_t>(nranks))
    return InvalidArgument(fmt::format("shape: {} rank entries for {} ranks", ranks.size(), nranks));
  if (link_period < 0 || (link_period > 0 && nranks % link_period != 0))
    return InvalidArgument(fmt::format("shape: a link period of {} for {} ranks", link_period, nranks));
  if (links.size() != static_cast<size_t>(link_rows()) * static_cast<size_t>(nranks))
    return InvalidArgument(fmt::format("shape: {} link entries for {} ranks", links.size(), nranks));
  for (int i = 0; i < nranks; ++i) {
    const RankDesc& r = ranks[static_cast<size_t>(i)];
    if (!Good(r.copy_gbps) || !Good(r.reduce_gbps) || !Good(r.launch_us))
      return InvalidArgument(fmt::format("shape: rank {} ({}) has a negative or non-finite speed", i, r.device));
    if (r.host_cpus < 0)
      return InvalidArgument(fmt::format("shape: rank {} ({}) has {} CPUs", i, r.device, r.host_cpus));
  }
  for (int a = 0; a < link_rows(); ++a)
    for (int b = 0; b < nranks; ++b) {
      const LinkDesc& l = link(a, b);
      if (!Good(l.latency_us) || !Good(l.gbps))
        return InvalidArgument(fmt::format("shape: link {}->{} has a negative or non-finite speed", a, b));
    }
  return Status::Ok();
}

std::vector<uint8_t> CommTopology::Serialize() const {
  wire::Bytes out;
  wire::PutU32(out, kShapeMagic);
  wire::PutU32(out, static_cast<uint32_t>(nranks));
  for (const RankDesc& r : ranks) PutRank(out, r);
  for (int a = 0; a < nranks; ++a)
    for (int b = 0; b < nranks; ++b) PutLink(out, link(a, b));
  wire::PutU8(out, direct ? 1 : 0);
  wire::PutU64(out, direct_inline_bytes);
  return out;
}

Result<CommTopology> CommTopology::Deserialize(const std::vector<uint8_t>& bytes) {
  wire::Reader in(bytes);
  const uint32_t magic = in.U32(), n = in.U32();
  if (!in.ok() || magic != kShapeMagic || n < 1 || n > kMaxShapeRanks)
    return InvalidArgument("shape: not a serialized communicator shape");
  CommTopology s;
  s.nranks = static_cast<int>(n);
  s.ranks.resize(n);
  for (RankDesc& d : s.ranks) GetRank(in, d);
  if (!in.ok()) return InvalidArgument("shape: truncated rank entry");
  s.links.resize(static_cast<size_t>(n) * n);
  for (LinkDesc& l : s.links) GetLink(in, l);
  if (!in.ok()) return InvalidArgument("shape: truncated link entry");
  s.direct = in.U8() != 0;
  s.direct_inline_bytes = in.U64();
  if (!in.ok()) return InvalidArgument("shape: truncated (no direct-access flags)");
  if (!in.AtEnd()) return InvalidArgument("shape: trailing bytes");
  KZ_RETURN_IF_ERROR(s.Validate());
  return s;
}

std::vector<uint8_t> EncodeRankRow(const RankDesc& me, std::span<const LinkDesc> row) {
  wire::Bytes out;
  PutRank(out, me);
  for (const LinkDesc& l : row) PutLink(out, l);
  return out;
}

Status DecodeRankRow(std::span<const uint8_t> bytes, int rank, CommTopology& shape, std::span<LinkDesc> extra) {
  wire::Reader in(bytes);
  GetRank(in, shape.ranks[static_cast<size_t>(rank)]);
  for (int q = 0; q < shape.nranks; ++q) GetLink(in, shape.link(rank, q));
  for (LinkDesc& l : extra) GetLink(in, l);
  if (!in.AtEnd()) return InvalidArgument(fmt::format("rank {} sent a malformed description of its links", rank));
  return Status::Ok();
}

}  // namespace kizuna::collectives
