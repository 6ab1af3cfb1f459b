#include "collectives/transport/transport.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "collectives/transport/device_map.h"
#include "collectives/transport/internal.h"
#include "runtime/core/logging.h"
#include "runtime/core/wire.h"

namespace kizuna::collectives {

namespace transport_internal {

std::string NameList(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& name : names) s += fmt::format("{}{}", s.empty() ? "" : ", ", name);
  return s.empty() ? std::string("none") : s;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += fmt::format(" and {} more", ranks.size() - 16);
  return s;
}

std::string SizeText(size_t n) {
  if (n >= (size_t{1} << 30) && n % (size_t{1} << 30) == 0) return fmt::format("{} GiB", n >> 30);
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n >= (size_t{1} << 10) && n % (size_t{1} << 10) == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
}

}  // namespace transport_internal

namespace {

using transport_internal::DeviceMap;
using transport_internal::NameList;
using transport_internal::Offer;
using transport_internal::Rails;
using transport_internal::RankList;

using fabric::FabricDeviceProperties;
using fabric::Handle;

// ---- The records each rank contributes to the two allgathers ----
//
// Encoded with kizuna::wire (little-endian); records come from other processes, so every length is
// checked before use, and any problem is "malformed connection record from rank q: why".
//
// 1. Reach: which peers this rank can serve on each fabric (a device of the fabric reaches them).
//    magic "KZR1" | rank count (u32) | fabric count (u32) | per fabric: name (string) |
//    bitmap of (rank count + 7) / 8 bytes, bit q of byte q / 8 set when peer q is served.
// 2. Listens: magic "KZT3" | rank count (u32) | listen count (u32) | per listen: fabric (index
//    into Create's list, u32) | device (u32) | point-to-point (u8) | link peer (i32: the rank a
//    point-to-point device reaches, -1 for a switched one) | handle. A rank listens once per
//    fabric device that serves a peer of the pair's fabric; a peer finds the listen meant for it
//    the way the listener chose it (DeviceMap::Serving: the first point-to-point device linked to
//    it, else the switched device). A handle is written as its size (u32), the bytes it shares
//    with the previous handle of the record at its start (u8) and at its end (u8), and the bytes
//    between (a byte run): a node's directconnect ports share all but their port, so a rank with a
//    port per peer sends a few bytes per port, not a whole handle.
constexpr uint8_t kReachMagic[4] = {'K', 'Z', 'R', '1'};
constexpr uint8_t kMagic[4] = {'K', 'Z', 'T', '3'};

struct Reach {
  std::vector<std::string> fabrics;       // names, in the rank's preference order
  std::vector<std::vector<bool>> serves;  // [fabric][peer]
};

using Record = std::vector<Offer>;  // a rank's listens

// Whether `in` starts with `magic` (consumed).
bool Magic(wire::Reader& in, const uint8_t (&magic)[4]) { return std::ranges::equal(in.Take(sizeof magic), magic); }

Status Malformed(int from, std::string_view why) {
  return InvalidArgument(fmt::format("malformed connection record from rank {}: {}", from, why));
}

std::vector<uint8_t> SerializeReach(const Reach& reach, int nranks) {
  std::vector<uint8_t> out(std::begin(kReachMagic), std::end(kReachMagic));
  wire::PutI32(out, nranks);
  wire::PutU32(out, static_cast<uint32_t>(reach.fabrics.size()));
  for (size_t f = 0; f < reach.fabrics.size(); ++f) {
    wire::PutString(out, reach.fabrics[f]);
    std::vector<uint8_t> bits((static_cast<size_t>(nranks) + 7) / 8, 0);
    for (int q = 0; q < nranks; ++q)
      if (reach.serves[f][static_cast<size_t>(q)])
        bits[static_cast<size_t>(q) / 8] |= static_cast<uint8_t>(1u << (q % 8));
    out.insert(out.end(), bits.begin(), bits.end());
  }
  return out;
}

Result<Reach> ParseReach(std::span<const uint8_t> in, int nranks, int from) {
  wire::Reader r(in);
  if (!Magic(r, kReachMagic))
    return Malformed(from, "it does not start with the transport's magic (a different kizuna version?)");
  const uint32_t count = r.U32();
  if (!r.ok() || count != static_cast<uint32_t>(nranks))
    return Malformed(from, fmt::format("it describes {} ranks, the job has {}", count, nranks));
  // Each fabric takes at least its name length and its bitmap: a count beyond what the bytes can
  // hold is refused before anything is allocated for it.
  const size_t bitmap_bytes = (static_cast<size_t>(nranks) + 7) / 8;
  const uint32_t fabrics = r.U32();
  if (!r.ok() || fabrics == 0 || fabrics > r.left() / (4 + bitmap_bytes))
    return Malformed(from, fmt::format("it lists {} fabrics in {} bytes", fabrics, in.size()));
  Reach reach;
  for (uint32_t f = 0; f < fabrics; ++f) {
    std::string name = r.String();
    const std::span<const uint8_t> bits = r.Take(bitmap_bytes);
    if (!r.ok()) return Malformed(from, fmt::format("the entry for fabric {} is truncated", f));
    reach.fabrics.push_back(std::move(name));
    std::vector<bool> serves(static_cast<size_t>(nranks));
    for (int q = 0; q < nranks; ++q) serves[static_cast<size_t>(q)] = (bits[static_cast<size_t>(q) / 8] >> (q % 8)) & 1;
    reach.serves.push_back(std::move(serves));
  }
  if (r.left() != 0) return Malformed(from, fmt::format("{} trailing bytes", r.left()));
  return reach;
}

void PutHandle(std::vector<uint8_t>& out, const Handle& h, const Handle* previous) {
  size_t prefix = 0, suffix = 0;
  if (previous != nullptr && previous->size == h.size) {
    while (prefix < h.size && prefix < 255 && h.data[prefix] == previous->data[prefix]) ++prefix;
    auto same_from_end = [&](size_t i) { return h.data[h.size - 1 - i] == previous->data[h.size - 1 - i]; };
    while (suffix + prefix < h.size && suffix < 255 && same_from_end(suffix)) ++suffix;
  }
  wire::PutU32(out, h.size);
  wire::PutU8(out, static_cast<uint8_t>(prefix));
  wire::PutU8(out, static_cast<uint8_t>(suffix));
  wire::PutBytes(out, h.bytes().subspan(prefix, h.size - prefix - suffix));
}

std::vector<uint8_t> SerializeRecord(const Record& record, int nranks) {
  std::vector<uint8_t> out(std::begin(kMagic), std::end(kMagic));
  wire::PutI32(out, nranks);
  wire::PutU32(out, static_cast<uint32_t>(record.size()));
  for (size_t i = 0; i < record.size(); ++i) {
    const Offer& offer = record[i];
    wire::PutI32(out, offer.fabric);
    wire::PutI32(out, offer.device);
    wire::PutU8(out, offer.point_to_point ? 1 : 0);
    wire::PutI32(out, offer.link_peer);
    PutHandle(out, offer.handle, i > 0 ? &record[i - 1].handle : nullptr);
  }
  return out;
}

Result<Record> ParseRecord(std::span<const uint8_t> in, int nranks, int nfabrics, int from) {
  wire::Reader r(in);
  if (!Magic(r, kMagic))
    return Malformed(from, "it does not start with the transport's magic (a different kizuna version?)");
  const uint32_t count = r.U32();
  if (!r.ok() || count != static_cast<uint32_t>(nranks))
    return Malformed(from, fmt::format("it describes {} ranks, the job has {}", count, nranks));
  // Each listen takes at least 19 bytes: a count beyond what the bytes can hold is refused before
  // anything is allocated for it.
  const uint32_t listens = r.U32();
  if (!r.ok() || listens > r.left() / 19)
    return Malformed(from, fmt::format("it lists {} listens in {} bytes", listens, in.size()));
  Record record;
  for (uint32_t i = 0; i < listens; ++i) {
    const uint32_t fabric = r.U32();
    const uint32_t device = r.U32();
    const uint8_t p2p = r.U8();
    const int32_t link_peer = r.I32();
    const uint32_t size = r.U32();
    const size_t prefix = r.U8(), suffix = r.U8();
    const std::span<const uint8_t> middle = r.Bytes(Handle::kMax);
    if (!r.ok()) return Malformed(from, fmt::format("listen {} is truncated", i));
    if (fabric >= static_cast<uint32_t>(nfabrics) || device > static_cast<uint32_t>(INT32_MAX) || p2p > 1 ||
        link_peer < -1 || link_peer >= nranks)
      return Malformed(from, fmt::format("listen {} names fabric {}, device {}, link peer {} ({} fabrics)", i, fabric,
                                         device, link_peer, nfabrics));
    if (size > Handle::kMax || prefix + suffix + middle.size() != size ||
        ((prefix + suffix) > 0 && (i == 0 || record.back().handle.size != size)))
      return Malformed(from, fmt::format("the handle of listen {} does not add up ({} bytes: {} + {} + {})", i, size,
                                         prefix, middle.size(), suffix));
    Handle handle;
    handle.size = size;
    if (prefix + suffix > 0) handle.data = record.back().handle.data;
    std::copy(middle.begin(), middle.end(), handle.data.begin() + static_cast<ptrdiff_t>(prefix));
    record.push_back(Offer{static_cast<int>(fabric), static_cast<int>(device), p2p != 0, link_peer, handle});
  }
  if (r.left() != 0) return Malformed(from, fmt::format("{} trailing bytes", r.left()));
  return record;
}

// The listen of `record` (rank `from`'s) meant for rank `me` on fabric `f`, as `from` chose it
// (DeviceMap::Serving): its first point-to-point device linked to `me`, else its switched device
// (with rails: the one of the pair's rail, `rail`, which both ends compute alike).
const Offer* OfferFor(const Record& record, int f, int me, int rail) {
  for (const Offer& o : record)
    if (o.fabric == f && o.point_to_point && o.link_peer == me) return &o;
  for (const Offer& o : record)
    if (o.fabric == f && !o.point_to_point && (rail < 0 || o.link_peer == rail)) return &o;
  return nullptr;
}

// ---- Transport::Create's phases ----
//
// Create runs them in order: check the arguments, map each fabric's devices, choose the fabric of
// each pair (round 1), listen and exchange the handles (round 2), find each peer's route; then
// staging and the description, which are the Transport's own. Connections come later
// (connections.cc).

std::vector<std::string> FabricNames(std::span<fabric::Fabric* const> fabrics) {
  std::vector<std::string> names;
  for (fabric::Fabric* f : fabrics) names.push_back(f != nullptr ? f->name() : std::string("(null)"));
  return names;
}

// kInvalidArgument when `fabrics` is empty, holds a null, a fabric twice, or a fabric created for
// another rank, or when a buffer size is 0.
Status CheckArguments(std::span<fabric::Fabric* const> fabrics, const std::vector<std::string>& fabric_names, int rank,
                      int n, const TransportOptions& options, const std::string& where) {
  if (fabrics.empty()) return InvalidArgument(fmt::format("{}: no fabric given", where));
  const int nfabrics = static_cast<int>(fabrics.size());
  for (int f = 0; f < nfabrics; ++f) {
    const fabric::Fabric* fab = fabrics[static_cast<size_t>(f)];
    if (fab == nullptr) return InvalidArgument(fmt::format("{}: fabric {} of the list is null", where, f));
    for (int g = 0; g < f; ++g)
      if (fabric_names[static_cast<size_t>(g)] == fab->name())
        return InvalidArgument(fmt::format("{}: fabric {} is listed twice", where, fab->name()));
    if (fab->context().rank != rank || fab->context().world_size != n)
      return InvalidArgument(fmt::format("{}: fabric {} was created for rank {} of {}, the bootstrap is rank {} of {}",
                                         where, fab->name(), fab->context().rank, fab->context().world_size, rank, n));
  }
  if (options.staging_bytes == 0 || options.control_bytes == 0)
    return InvalidArgument(fmt::format("{}: staging_bytes ({}) and control_bytes ({}) must be positive", where,
                                       options.staging_bytes, options.control_bytes));
  return Status::Ok();
}

}  // namespace

// What the phases after the argument checks share. What it makes (listens, routes, offers, the
// row of links) goes into the Transport being built, so that a failure in any phase releases all
// of it.
class Transport::Planner {
 public:
  Planner(Transport& t, std::span<fabric::Fabric* const> fabrics, const std::vector<std::string>& fabric_names,
          bootstrap::Bootstrap& bootstrap, Deadline deadline)
      : t_(t),
        fabrics_(fabrics),
        fabric_names_(fabric_names),
        bootstrap_(bootstrap),
        where_(t.where_),
        deadline_(deadline),
        rank_(bootstrap.rank()),
        n_(bootstrap.size()),
        nfabrics_(static_cast<int>(fabrics.size())) {}

  // Which device of each fabric serves which peer.
  Status MapDevices(const device::Device& device, const TransportOptions& options);
  // Round 1: which peers this rank can serve on each fabric. From every rank's answer each rank
  // computes the fabric of each of its pairs: the first in the list that both ends serve.
  Status ChooseFabrics();
  // Round 2: listen once per fabric device that serves a peer of the pair's fabric; the handles go
  // out in one allgather.
  Status ExchangeListens();
  // Finds each peer's listen for this rank, checks it against the pair's fabric, and fills in the
  // peer's route and this rank's row of links; `network` when some peer is reached through a
  // switched device.
  Status Route();

  // Forwarding (transport.h): routes for the peers no fabric serves directly, through the ranks in
  // between, where a fabric links the whole path and forwards.
  Status Forward();

  // Which fabric serves which peers, over which devices: "directconnect: rank 1 (device w0:port0);
  // ofi: ranks 2, 3 (device tcp;ofi_rxm:lo)"; empty without peers.
  std::string Groups() const;
  const std::vector<int>& reachable() const { return reachable_; }
  const std::vector<int>& unreachable() const { return unreachable_; }

 private:
  Transport& t_;
  const std::span<fabric::Fabric* const> fabrics_;
  const std::vector<std::string>& fabric_names_;
  bootstrap::Bootstrap& bootstrap_;
  const std::string& where_;
  const Deadline deadline_;
  const int rank_;
  const int n_;
  const int nfabrics_;

  std::optional<transport_internal::MachinePlace> place_;  // before rails_, which points to it
  Rails rails_;                                      // before maps_, which point to it
  std::vector<DeviceMap> maps_;                      // per fabric
  std::vector<int> chosen_;                          // the fabric of the pair (rank, q); -1 for none
  std::vector<Reach> reach_;                         // every rank's round 1
  std::vector<Record> records_;                      // every rank's listens
  std::vector<std::string> forwarded_;               // "rank 3 (via 1)", per forwarded peer
  std::vector<int> reachable_;                       // peers some fabric serves
  std::vector<int> unreachable_;                     // peers no fabric serves
  std::vector<std::vector<int>> served_;             // per fabric: the peers it serves
  std::vector<std::set<std::string>> device_names_;  // per fabric: the devices it uses for them
};

Status Transport::Planner::MapDevices(const device::Device& device, const TransportOptions& options) {
  const std::set<std::string> hosts(options.rank_hosts.begin(), options.rank_hosts.end());
  if (hosts.size() > 1 && options.rank_hosts.size() == static_cast<size_t>(n_)) {
    rails_.hosts = options.rank_hosts;
    std::map<std::string, int> seen;
    for (const std::string& h : options.rank_hosts) rails_.local.push_back(seen[h]++);
    rails_.nics = options.nics;
    // Which NIC is nearest the accelerator matters only where traffic leaves the host.
    auto place = transport_internal::PlaceOf(device.properties(), options.machine_topology);
    if (!place.ok()) return place.status().WithContext(where_);
    place_ = std::move(place).value();
    if (place_) rails_.place = &*place_;
  }
  for (int f = 0; f < nfabrics_; ++f) {
    auto map = DeviceMap::Build(*fabrics_[static_cast<size_t>(f)], device, rank_, rails_);
    if (!map.ok())
      return map.status().WithContext(
          fmt::format("{}: the devices of {}", where_, fabric_names_[static_cast<size_t>(f)]));
    maps_.push_back(std::move(map).value());
    const DeviceMap& m = maps_.back();
    const std::string why = m.why().empty() ? "" : "; " + m.why();
    if (m.rail_count() > 1 && m.RailNic() >= 0)
      KZ_INFO(kLogColl, "{}: local rank {} uses {} between hosts (rail {} of {} on {}{})", where_,
              rails_.local[static_cast<size_t>(rank_)], m.props(m.RailNic()).name,
              rails_.local[static_cast<size_t>(rank_)] % m.rail_count(), m.rail_count(),
              fabric_names_[static_cast<size_t>(f)], why);
    else if (!rails_.local.empty() && m.RailNic() >= 0 && !why.empty())
      KZ_INFO(kLogColl, "{}: local rank {} uses {} between hosts ({}{})", where_,
              rails_.local[static_cast<size_t>(rank_)], m.props(m.RailNic()).name,
              fabric_names_[static_cast<size_t>(f)], why);
  }
  return Status::Ok();
}

Status Transport::Planner::ChooseFabrics() {
  Reach mine_reach{fabric_names_, {}};
  for (int f = 0; f < nfabrics_; ++f) {
    std::vector<bool> serves(static_cast<size_t>(n_), false);
    for (int q = 0; q < n_; ++q)
      serves[static_cast<size_t>(q)] = q != rank_ && maps_[static_cast<size_t>(f)].Serving(q) >= 0;
    mine_reach.serves.push_back(std::move(serves));
  }
  auto reach_gathered = bootstrap_.AllGather(SerializeReach(mine_reach, n_), deadline_);
  if (!reach_gathered.ok())
    return reach_gathered.status().WithContext(fmt::format("{}: exchanging which peers each fabric reaches", where_));
  std::vector<Reach>& reach = reach_;
  for (int q = 0; q < n_; ++q) {
    auto r = ParseReach((*reach_gathered)[static_cast<size_t>(q)], n_, q);
    if (!r.ok()) return r.status().WithContext(where_);
    if (r->fabrics != fabric_names_)
      return InvalidArgument(
          fmt::format("{}: rank {} connects over fabrics [{}], this rank over [{}]; every rank must "
                      "pass the same fabrics in the same order",
                      where_, q, NameList(r->fabrics), NameList(fabric_names_)));
    reach.push_back(std::move(r).value());
  }
  auto serves = [&](int a, int f, int b) {
    return static_cast<bool>(reach[static_cast<size_t>(a)].serves[static_cast<size_t>(f)][static_cast<size_t>(b)]);
  };
  chosen_.assign(static_cast<size_t>(n_), -1);
  for (int q = 0; q < n_; ++q) {
    if (q == rank_) continue;
    for (int f = 0; f < nfabrics_ && chosen_[static_cast<size_t>(q)] < 0; ++f)
      if (serves(rank_, f, q) && serves(q, f, rank_)) chosen_[static_cast<size_t>(q)] = f;
    if (chosen_[static_cast<size_t>(q)] >= 0) continue;
    for (int f = 0; f < nfabrics_; ++f)
      if (serves(rank_, f, q) != serves(q, f, rank_))
        KZ_WARN(kLogColl,
                "{}: on {}, only {} has a device for the pair of ranks {} and {} (do the ranks see the same "
                "topology?); no other fabric serves the pair, so it is left unconnected",
                where_, fabric_names_[static_cast<size_t>(f)],
                serves(rank_, f, q) ? "this rank" : fmt::format("rank {}", q), rank_, q);
  }
  return Status::Ok();
}

Status Transport::Planner::ExchangeListens() {
  Record mine;
  t_.routes_.assign(static_cast<size_t>(n_), Transport::Route{});
  std::map<std::pair<int, int>, int> listening;  // (fabric, device) -> index into listens_
  for (int q = 0; q < n_; ++q) {
    const int f = chosen_[static_cast<size_t>(q)];
    if (f < 0) continue;
    const DeviceMap& map = maps_[static_cast<size_t>(f)];
    const int dev = map.Serving(q);
    const int rail = map.props(dev).point_to_point ? -1 : map.RailOf(q);
    int& index = listening.try_emplace({f, dev}, -1).first->second;
    if (index < 0) {
      fabric::Fabric& fab = *fabrics_[static_cast<size_t>(f)];
      auto listen = fab.Listen(dev);
      if (!listen.ok())
        return listen.status().WithContext(
            fmt::format("{}: listening for rank {} on {} {}", where_, q, fab.name(), map.props(dev).name));
      const FabricDeviceProperties& props = map.props(dev);
      mine.push_back(Offer{f, dev, props.point_to_point,
                           props.point_to_point ? (props.link_peer ? props.link_peer->rank : -1) : rail,
                           (*listen)->handle()});
      index = static_cast<int>(t_.listens_.size());
      t_.listens_.push_back(Transport::Listen{std::move(listen).value(), f, dev});
    }
    t_.routes_[static_cast<size_t>(q)].listen = index;
  }
  auto gathered = bootstrap_.AllGather(SerializeRecord(mine, n_), deadline_);
  if (!gathered.ok()) return gathered.status().WithContext(fmt::format("{}: exchanging connection handles", where_));
  for (int q = 0; q < n_; ++q) {
    auto record = ParseRecord((*gathered)[static_cast<size_t>(q)], n_, nfabrics_, q);
    if (!record.ok()) return record.status().WithContext(where_);
    records_.push_back(std::move(record).value());
  }
  return Status::Ok();
}

// Both ends of a pair chose its fabric from the same data: a listen that disagrees comes from a
// rank that decided differently (another build), and connecting anyway could pair the wrong comms.
Status Transport::Planner::Route() {
  served_.assign(static_cast<size_t>(nfabrics_), {});
  device_names_.assign(static_cast<size_t>(nfabrics_), {});
  for (int q = 0; q < n_; ++q) {
    if (q == rank_) continue;
    const int f = chosen_[static_cast<size_t>(q)];
    const Record& record = records_[static_cast<size_t>(q)];
    const Offer* theirs = f >= 0 ? OfferFor(record, f, rank_, maps_[static_cast<size_t>(f)].RailOf(q)) : nullptr;
    // The peer listens on the pair's fabric for some peer of it when it made the same choice.
    if (f >= 0 && theirs == nullptr)
      return InvalidArgument(fmt::format(
          "{}: rank {} does not listen for this rank on {}, which both ranks' reports say serves the pair (do the "
          "ranks run the same kizuna build?)",
          where_, q, fabric_names_[static_cast<size_t>(f)]));
    if (f < 0) {
      unreachable_.push_back(q);
      continue;
    }
    const DeviceMap& map = maps_[static_cast<size_t>(f)];
    const int dev = map.ConnectingFor(q, *theirs);
    if (dev < 0)
      return InvalidArgument(fmt::format(
          "{}: rank {} listens for this rank on its {} {} device {}, and no device of this rank {}", where_, q,
          fabric_names_[static_cast<size_t>(f)], theirs->point_to_point ? "point-to-point" : "switched", theirs->device,
          theirs->point_to_point
              ? fmt::format("is linked to port {} of rank {} (do the ranks load the same topology?)", theirs->device, q)
              : std::string("is switched")));
    Transport::Route& route = t_.routes_[static_cast<size_t>(q)];
    route.fabric = f;
    route.connect_dev = dev;
    route.offer = static_cast<int>(t_.offers_.size());
    t_.offers_.push_back(theirs->handle);
    // FabricDeviceProperties::speed_gbps is in gigabits per second (as NICs are rated);
    // LinkDesc::gbps is in gigabytes per second (as the cost model counts bytes): divide by 8.
    const FabricDeviceProperties& via = map.props(dev);
    // A cable to another host at a known rate: the wire's own pace (LinkDesc::paced).
    const bool other_host =
        !rails_.hosts.empty() && rails_.hosts[static_cast<size_t>(q)] != rails_.hosts[static_cast<size_t>(rank_)];
    t_.link_row_[static_cast<size_t>(q)] = LinkDesc{true, via.latency_us, via.speed_gbps / 8.0, true,
                                                    via.point_to_point && via.speed_gbps > 0 && other_host};
    t_.link_row_[static_cast<size_t>(q)].cables = via.point_to_point ? std::max(via.cables, 1) : 1;
    t_.network_ = t_.network_ || !via.point_to_point;
    reachable_.push_back(q);
    served_[static_cast<size_t>(f)].push_back(q);
    device_names_[static_cast<size_t>(f)].insert(via.name);
    device_names_[static_cast<size_t>(f)].insert(
        t_.listens_[static_cast<size_t>(route.listen)].comm->properties().name);
  }
  return Status::Ok();
}

namespace {

// The point-to-point listen of `record` linked to rank `peer` on fabric `f`; nullptr for none.
const Offer* LinkedOffer(const Record& record, int f, int peer) {
  for (const Offer& o : record)
    if (o.fabric == f && o.point_to_point && o.link_peer == peer) return &o;
  return nullptr;
}

// A shortest path from `from` to `to` over `adjacent` (each rank's neighbours, in rank order), both
// ends included; empty when there is none. Where several neighbours are equally close to `to`,
// the pair's ranks pick one ((from + to) mod their number), so that pairs spread over equal paths
// and every rank computes the same path for a pair.
std::vector<int> ShortestPath(const std::vector<std::vector<int>>& adjacent, int from, int to) {
  const size_t n = adjacent.size();
  std::vector<int> dist(n, -1);
  std::vector<int> queue = {to};
  dist[static_cast<size_t>(to)] = 0;
  for (size_t head = 0; head < queue.size(); ++head)
    for (int w : adjacent[static_cast<size_t>(queue[head])])
      if (dist[static_cast<size_t>(w)] < 0) {
        dist[static_cast<size_t>(w)] = dist[static_cast<size_t>(queue[head])] + 1;
        queue.push_back(w);
      }
  if (dist[static_cast<size_t>(from)] < 0) return {};
  std::vector<int> path = {from};
  std::vector<int> closer;
  while (path.back() != to) {
    const int at = path.back();
    closer.clear();
    for (int w : adjacent[static_cast<size_t>(at)])
      if (dist[static_cast<size_t>(w)] == dist[static_cast<size_t>(at)] - 1) closer.push_back(w);
    path.push_back(closer[static_cast<size_t>(from + to) % closer.size()]);
  }
  return path;
}

}  // namespace

Status Transport::Planner::Forward() {
  if (unreachable_.empty()) return Status::Ok();
  // Per fabric, each rank's neighbours: the pairs whose fabric it is, over point-to-point links
  // (each end listening for the other, so that every hop of a path has its handle and device).
  auto pair_fabric = [&](int a, int b) {
    for (int f = 0; f < nfabrics_; ++f)
      if (reach_[static_cast<size_t>(a)].serves[static_cast<size_t>(f)][static_cast<size_t>(b)] &&
          reach_[static_cast<size_t>(b)].serves[static_cast<size_t>(f)][static_cast<size_t>(a)])
        return f;
    return -1;
  };
  std::vector<std::vector<std::vector<int>>> adjacent(static_cast<size_t>(nfabrics_),
                                                      std::vector<std::vector<int>>(static_cast<size_t>(n_)));
  for (int a = 0; a < n_; ++a)
    for (int b = 0; b < n_; ++b)
      if (const int f = a == b ? -1 : pair_fabric(a, b);
          f >= 0 && LinkedOffer(records_[static_cast<size_t>(b)], f, a) != nullptr &&
          LinkedOffer(records_[static_cast<size_t>(a)], f, b) != nullptr)
        adjacent[static_cast<size_t>(f)][static_cast<size_t>(a)].push_back(b);
  std::vector<int> still;
  for (int q : unreachable_) {
    bool routed = false;
    std::string why;
    for (int f = 0; f < nfabrics_ && !routed; ++f) {
      const std::vector<int> there = ShortestPath(adjacent[static_cast<size_t>(f)], rank_, q);
      const std::vector<int> back = ShortestPath(adjacent[static_cast<size_t>(f)], q, rank_);
      if (there.size() < 3 || back.size() < 3) continue;
      std::vector<fabric::Fabric::Hop> hops;
      for (size_t i = 1; i + 1 < there.size(); ++i) {
        const Record& relay = records_[static_cast<size_t>(there[i])];
        hops.push_back({LinkedOffer(relay, f, there[i - 1])->handle, LinkedOffer(relay, f, there[i + 1])->device});
      }
      const Offer* target = LinkedOffer(records_[static_cast<size_t>(q)], f, there[there.size() - 2]);
      fabric::Fabric& fab = *fabrics_[static_cast<size_t>(f)];
      auto handle = fab.Forward(hops, target->handle);
      if (!handle.ok()) {
        why = handle.status().message();
        continue;
      }
      // Out over the link to the first rank of the path, as a connection to it would go; in on the
      // listen where the last rank of the path back connects.
      const Transport::Route& first = t_.routes_[static_cast<size_t>(there[1])];
      const Transport::Route& last = t_.routes_[static_cast<size_t>(back[back.size() - 2])];
      Transport::Route& route = t_.routes_[static_cast<size_t>(q)];
      route = Transport::Route{f, first.connect_dev, last.listen, static_cast<int>(t_.offers_.size())};
      t_.offers_.push_back(*handle);
      LinkDesc link = t_.link_row_[static_cast<size_t>(there[1])];
      link.hops = static_cast<int>(there.size()) - 1;
      link.cables = 1;
      t_.link_row_[static_cast<size_t>(q)] = link;
      std::string via;
      for (size_t i = 1; i + 1 < there.size(); ++i) via += fmt::format("{}{}", i > 1 ? ", " : "", there[i]);
      forwarded_.push_back(fmt::format("rank {} (via {})", q, via));
      reachable_.push_back(q);
      routed = true;
    }
    if (routed) continue;
    still.push_back(q);
    if (!why.empty()) KZ_INFO(kLogColl, "{}: rank {} is not forwarded to: {}", where_, q, why);
  }
  unreachable_ = std::move(still);
  std::sort(reachable_.begin(), reachable_.end());
  return Status::Ok();
}

std::string Transport::Planner::Groups() const {
  std::string groups;
  for (int f = 0; f < nfabrics_; ++f) {
    const auto& names = device_names_[static_cast<size_t>(f)];
    if (served_[static_cast<size_t>(f)].empty()) continue;
    std::string devices;
    for (const std::string& name : names) devices += fmt::format("{}{}", devices.empty() ? "" : ", ", name);
    groups += fmt::format("{}{}: {} ({} {})", groups.empty() ? "" : "; ", fabric_names_[static_cast<size_t>(f)],
                          RankList(served_[static_cast<size_t>(f)]), names.size() == 1 ? "device" : "devices", devices);
  }
  if (!forwarded_.empty()) groups += fmt::format("; forwarded: {}", NameList(forwarded_));
  return groups;
}

Result<std::unique_ptr<Transport>> Transport::CreateSingle(device::Device& device, const TransportOptions& options) {
  if (options.staging_bytes == 0) return InvalidArgument("transport: staging_bytes must be positive");
  std::unique_ptr<Transport> t(new Transport());
  t->rank_ = 0;
  t->nranks_ = 1;
  t->where_ = "transport (a single rank)";
  t->device_ = &device;
  t->peers_.resize(1);
  t->routes_.resize(1);
  t->link_row_.assign(1, LinkDesc{});
  t->control_bytes_ = options.control_bytes;
  t->staging_bytes_ = options.staging_bytes;
  t->how_ = std::make_unique<Staging>();
  t->how_->host = options.force_host_staging;
  t->host_staging_ = options.force_host_staging;
  t->staging_text_ = options.force_host_staging ? "through host memory (forced by TransportOptions::force_host_staging)"
                                                : "unregistered";
  t->groups_ = "a single rank (no fabric)";
  return t;
}

Result<std::unique_ptr<Transport>> Transport::Create(std::span<fabric::Fabric* const> fabrics,
                                                     bootstrap::Bootstrap& bootstrap, device::Device& device,
                                                     const TransportOptions& options, Deadline deadline) {
  const int rank = bootstrap.rank();
  const int n = bootstrap.size();
  const std::vector<std::string> fabric_names = FabricNames(fabrics);
  const std::string where = fmt::format("transport (rank {} of {} on {})", rank, n, NameList(fabric_names));
  KZ_RETURN_IF_ERROR(CheckArguments(fabrics, fabric_names, rank, n, options, where));

  std::unique_ptr<Transport> t(new Transport());
  t->rank_ = rank;
  t->nranks_ = n;
  t->where_ = where;
  t->device_ = &device;
  t->fabrics_.assign(fabrics.begin(), fabrics.end());
  t->peers_.resize(static_cast<size_t>(n));
  t->awaiting_since_.resize(static_cast<size_t>(n));
  t->one_way_.resize(static_cast<size_t>(n));
  t->link_row_.assign(static_cast<size_t>(n), LinkDesc{});
  t->control_bytes_ = options.control_bytes;

  Planner planner(*t, fabrics, fabric_names, bootstrap, deadline);
  KZ_RETURN_IF_ERROR(planner.MapDevices(device, options));
  KZ_RETURN_IF_ERROR(planner.ChooseFabrics());
  KZ_RETURN_IF_ERROR(planner.ExchangeListens());
  KZ_RETURN_IF_ERROR(planner.Route());
  if (options.forward) KZ_RETURN_IF_ERROR(planner.Forward());

  TransportOptions staging_options = options;
  if (t->network_) staging_options.staging_bytes = std::max(options.staging_bytes, options.network_staging_bytes);
  KZ_RETURN_IF_ERROR(t->SetUpStaging(device, staging_options));

  const std::string groups = planner.Groups();
  const std::vector<int>& reachable = planner.reachable();
  const std::vector<int>& unreachable = planner.unreachable();
  t->groups_ = fmt::format(
      "{}{}", groups.empty() ? fmt::format("no peers over {}", NameList(fabric_names)) : groups,
      unreachable.empty() ? std::string() : fmt::format("; unreachable: {}", RankList(unreachable)));
  KZ_INFO(kLogColl, "{}: {} reachable peer(s) ({}){}{}; {} listen comm(s); {}", where, reachable.size(),
          reachable.empty() ? std::string("none") : RankList(reachable),
          groups.empty() ? std::string() : fmt::format(" over {}", groups),
          unreachable.empty() ? std::string() : fmt::format("; {} unreachable", RankList(unreachable)),
          t->listens_.size(),
          options.connect_at_creation ? "connecting to every one now"
                                      : "each connected when an operation first needs it");
  if (!options.connect_at_creation) return t;
  KZ_RETURN_IF_ERROR(t->ConnectAll(deadline));
  // No rank returns before every rank has its connections: a handshake completes on one side
  // first, and a rank that closed its transport at once would leave its peer reading that
  // handshake until the deadline.
  if (Status all = bootstrap.Barrier(deadline); !all.ok())
    return all.WithContext(fmt::format("{}: waiting for every rank's connections", where));
  return t;
}

}  // namespace kizuna::collectives
