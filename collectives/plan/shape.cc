#include "collectives/plan/shape.h"

#include <cmath>
#include <cstring>
#include <set>

#include <fmt/format.h>

namespace kizuna::collectives {
namespace {

// A little-endian byte writer/reader for Serialize. The format is internal: every rank of one
// communicator runs the same build.
class Writer {
 public:
  void U32(uint32_t v) { Raw(&v, sizeof v); }
  void F64(double v) { Raw(&v, sizeof v); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  std::vector<uint8_t> bytes;

 private:
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  bool U32(uint32_t* v) { return Raw(v, sizeof *v); }
  bool F64(double* v) { return Raw(v, sizeof *v); }
  bool Str(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n) || n > b_.size() - pos_) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  bool Raw(void* p, size_t n) {
    if (n > b_.size() - pos_) return false;
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

constexpr uint32_t kShapeMagic = 0x6b7a5348;  // "kzSH"
constexpr int kMaxShapeRanks = 1 << 20;

bool Good(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

bool CommShape::FullyConnected() const {
  for (int a = 0; a < nranks; ++a)
    for (int b = 0; b < nranks; ++b)
      if (a != b && !link(a, b).reachable) return false;
  return true;
}

int CommShape::host_count() const {
  std::set<std::string> hosts;
  for (const RankDesc& r : ranks) hosts.insert(r.host_id);
  return static_cast<int>(hosts.size());
}

CommShape CommShape::Uniform(int n, const RankDesc& rank, const LinkDesc& link) {
  CommShape s;
  s.nranks = n;
  s.ranks.assign(static_cast<size_t>(n), rank);
  for (int i = 0; i < n; ++i) s.ranks[static_cast<size_t>(i)].device = fmt::format("{}{}", rank.device, i);
  s.links.assign(static_cast<size_t>(n) * static_cast<size_t>(n), link);
  for (int i = 0; i < n; ++i) s.link(i, i) = LinkDesc{};
  return s;
}

Status CommShape::Validate() const {
  if (nranks < 1 || nranks > kMaxShapeRanks) return InvalidArgument(fmt::format("shape: {} ranks", nranks));
  if (ranks.size() != static_cast<size_t>(nranks))
    return InvalidArgument(fmt::format("shape: {} rank entries for {} ranks", ranks.size(), nranks));
  if (links.size() != static_cast<size_t>(nranks) * static_cast<size_t>(nranks))
    return InvalidArgument(fmt::format("shape: {} link entries for {} ranks", links.size(), nranks));
  for (int i = 0; i < nranks; ++i) {
    const RankDesc& r = ranks[static_cast<size_t>(i)];
    if (!Good(r.copy_gbps) || !Good(r.reduce_gbps) || !Good(r.launch_us))
      return InvalidArgument(fmt::format("shape: rank {} ({}) has a negative or non-finite speed", i, r.device));
    if (r.host_cpus < 0)
      return InvalidArgument(fmt::format("shape: rank {} ({}) has {} CPUs", i, r.device, r.host_cpus));
  }
  for (int a = 0; a < nranks; ++a)
    for (int b = 0; b < nranks; ++b) {
      const LinkDesc& l = link(a, b);
      if (!Good(l.latency_us) || !Good(l.gbps))
        return InvalidArgument(fmt::format("shape: link {}->{} has a negative or non-finite speed", a, b));
    }
  return Status::Ok();
}

std::vector<uint8_t> CommShape::Serialize() const {
  Writer w;
  w.U32(kShapeMagic);
  w.U32(static_cast<uint32_t>(nranks));
  for (const RankDesc& r : ranks) {
    w.Str(r.host_id);
    w.Str(r.device);
    w.F64(r.copy_gbps);
    w.F64(r.reduce_gbps);
    w.F64(r.launch_us);
    w.U32(static_cast<uint32_t>(r.host_cpus));
    w.U32(r.host_compute ? 1u : 0u);
  }
  for (const LinkDesc& l : links) {
    w.U32((l.reachable ? 1u : 0u) | (l.staged ? 2u : 0u));
    w.F64(l.latency_us);
    w.F64(l.gbps);
  }
  w.U32(direct ? 1u : 0u);
  w.U32(static_cast<uint32_t>(std::min<uint64_t>(direct_inline_bytes, UINT32_MAX)));
  return std::move(w.bytes);
}

Result<CommShape> CommShape::Deserialize(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  uint32_t magic = 0, n = 0;
  if (!r.U32(&magic) || magic != kShapeMagic || !r.U32(&n) || n < 1 || n > kMaxShapeRanks)
    return InvalidArgument("shape: not a serialized communicator shape");
  CommShape s;
  s.nranks = static_cast<int>(n);
  s.ranks.resize(n);
  for (RankDesc& d : s.ranks) {
    uint32_t cpus = 0, compute = 0;
    if (!r.Str(&d.host_id) || !r.Str(&d.device) || !r.F64(&d.copy_gbps) || !r.F64(&d.reduce_gbps) ||
        !r.F64(&d.launch_us) || !r.U32(&cpus) || !r.U32(&compute))
      return InvalidArgument("shape: truncated rank entry");
    if (cpus > static_cast<uint32_t>(INT32_MAX)) return InvalidArgument("shape: a rank's CPU count is out of range");
    d.host_cpus = static_cast<int>(cpus);
    d.host_compute = compute != 0;
  }
  s.links.resize(static_cast<size_t>(n) * n);
  for (LinkDesc& l : s.links) {
    uint32_t flags = 0;
    if (!r.U32(&flags) || !r.F64(&l.latency_us) || !r.F64(&l.gbps)) return InvalidArgument("shape: truncated link entry");
    l.reachable = (flags & 1u) != 0;
    l.staged = (flags & 2u) != 0;
  }
  uint32_t direct = 0;
  if (!r.U32(&direct)) return InvalidArgument("shape: truncated (no direct-access flag)");
  s.direct = direct != 0;
  uint32_t inline_bytes = 0;
  if (!r.U32(&inline_bytes)) return InvalidArgument("shape: truncated (no inline size)");
  s.direct_inline_bytes = inline_bytes;
  if (!r.done()) return InvalidArgument("shape: trailing bytes");
  KZ_RETURN_IF_ERROR(s.Validate());
  return s;
}

}  // namespace kizuna::collectives
