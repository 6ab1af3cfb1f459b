#include "collectives/transport/transport.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

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

std::string SizeText(size_t n) {
  if (n >= (size_t{1} << 30) && n % (size_t{1} << 30) == 0) return fmt::format("{} GiB", n >> 30);
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return fmt::format("{} MiB", n >> 20);
  if (n >= (size_t{1} << 10) && n % (size_t{1} << 10) == 0) return fmt::format("{} KiB", n >> 10);
  return fmt::format("{} bytes", n);
}

}  // namespace transport_internal

namespace {

using transport_internal::NameList;
using transport_internal::SizeText;

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
// 2. Handles: magic "KZT2" | rank count (u32) | per rank q: flags (u8) [| fabric index (u32) |
//    device (u32) | handle bytes (a byte run)]. Entry q carries the handle this rank listens
//    on for q, the fabric (index into Create's list) and its device, and whether that device is
//    point-to-point (the connecting side then needs the port at the far end of exactly that link).
constexpr uint8_t kReachMagic[4] = {'K', 'Z', 'R', '1'};
constexpr uint8_t kMagic[4] = {'K', 'Z', 'T', '2'};
constexpr uint8_t kHasHandle = 1u << 0;
constexpr uint8_t kPointToPoint = 1u << 1;
constexpr uint8_t kKnownFlags = kHasHandle | kPointToPoint;

struct Reach {
  std::vector<std::string> fabrics;       // names, in the rank's preference order
  std::vector<std::vector<bool>> serves;  // [fabric][peer]
};

struct Offer {
  int fabric = -1;
  int device = -1;
  bool point_to_point = false;
  Handle handle;
};
using Record = std::vector<std::optional<Offer>>;  // indexed by the peer the offer is for

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

std::vector<uint8_t> SerializeRecord(const Record& record) {
  std::vector<uint8_t> out(std::begin(kMagic), std::end(kMagic));
  wire::PutU32(out, static_cast<uint32_t>(record.size()));
  for (const std::optional<Offer>& offer : record) {
    if (!offer) {
      wire::PutU8(out, 0);
      continue;
    }
    wire::PutU8(out, static_cast<uint8_t>(kHasHandle | (offer->point_to_point ? kPointToPoint : 0)));
    wire::PutI32(out, offer->fabric);
    wire::PutI32(out, offer->device);
    wire::PutBytes(out, offer->handle.bytes());
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
  Record record(static_cast<size_t>(nranks));
  for (int q = 0; q < nranks; ++q) {
    const uint8_t flags = r.U8();
    if (!r.ok()) return Malformed(from, fmt::format("it ends before the entry for rank {}", q));
    if ((flags & ~kKnownFlags) != 0) return Malformed(from, fmt::format("unknown flags {:#x} for rank {}", flags, q));
    if ((flags & kHasHandle) == 0) continue;
    const uint32_t fabric = r.U32();
    const uint32_t device = r.U32();
    const uint32_t size = r.U32();
    if (!r.ok()) return Malformed(from, fmt::format("the entry for rank {} is truncated", q));
    if (fabric >= static_cast<uint32_t>(nfabrics) || device > static_cast<uint32_t>(INT32_MAX))
      return Malformed(from, fmt::format("the entry for rank {} names fabric {} and device {} ({} fabrics)", q, fabric,
                                         device, nfabrics));
    if (size > Handle::kMax)
      return Malformed(from, fmt::format("the handle for rank {} has {} bytes (at most {})", q, size, Handle::kMax));
    const std::span<const uint8_t> bytes = r.Take(size);
    if (!r.ok()) return Malformed(from, fmt::format("the handle for rank {} is truncated", q));
    auto handle = Handle::FromBytes(bytes);
    if (!handle.ok()) return Malformed(from, handle.status().message());
    record[static_cast<size_t>(q)] =
        Offer{static_cast<int>(fabric), static_cast<int>(device), (flags & kPointToPoint) != 0, *handle};
  }
  if (r.left() != 0) return Malformed(from, fmt::format("{} trailing bytes", r.left()));
  return record;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += fmt::format(" and {} more", ranks.size() - 16);
  return s;
}

// ---- Which fabric device serves which peer ----

class DeviceMap {
 public:
  static Result<DeviceMap> Build(fabric::Fabric& fabric, const device::Device& device) {
    DeviceMap m;
    for (int d = 0; d < fabric.device_count(); ++d) {
      KZ_ASSIGN_OR_RETURN(FabricDeviceProperties p, fabric.properties(d));
      m.props_.push_back(std::move(p));
    }
    // The switched device nearest the rank's accelerator: one that names it, then one on its NUMA
    // node, then the first.
    const device::DeviceProperties& dp = device.properties();
    auto first_switched = [&](auto&& pred) {
      for (size_t d = 0; d < m.props_.size(); ++d)
        if (!m.props_[d].point_to_point && pred(m.props_[d])) return static_cast<int>(d);
      return -1;
    };
    m.switched_ = first_switched([&](const FabricDeviceProperties& p) {
      return !dp.uuid.empty() &&
             std::find(p.near_device_uuids.begin(), p.near_device_uuids.end(), dp.uuid) != p.near_device_uuids.end();
    });
    if (m.switched_ < 0 && dp.numa_node >= 0)
      m.switched_ = first_switched([&](const FabricDeviceProperties& p) { return p.numa_node == dp.numa_node; });
    if (m.switched_ < 0) m.switched_ = first_switched([](const FabricDeviceProperties&) { return true; });
    return m;
  }

  const FabricDeviceProperties& props(int d) const { return props_[static_cast<size_t>(d)]; }

  // The device this rank listens on for `peer`: the first port linked to it, else the switched
  // device; -1 when none reaches it.
  int Serving(int peer) const {
    for (size_t d = 0; d < props_.size(); ++d)
      if (props_[d].point_to_point && props_[d].link_peer && props_[d].link_peer->rank == peer)
        return static_cast<int>(d);
    return switched_;
  }

  // The device to connect from to `peer`'s offer: for a point-to-point listener, the port at the
  // far end of exactly that link (with two links between a pair, each direction uses its own);
  // for a switched one, this rank's switched device. -1 when there is none.
  int ConnectingFor(int peer, const Offer& offer) const {
    if (!offer.point_to_point) return switched_;
    for (size_t d = 0; d < props_.size(); ++d) {
      const FabricDeviceProperties& p = props_[d];
      if (p.point_to_point && p.link_peer && p.link_peer->rank == peer && p.link_peer->port == offer.device)
        return static_cast<int>(d);
    }
    return -1;
  }

 private:
  std::vector<FabricDeviceProperties> props_;
  int switched_ = -1;
};

// ---- Transport::Create's phases ----
//
// Create runs them in order: check the arguments, map each fabric's devices, choose the fabric of
// each pair (round 1), listen and exchange the handles (round 2), match the offers, connect and
// accept, register the control buffers; then staging and the description, which are the
// Transport's own.

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

// What the phases after the argument checks share. The comms it makes live in the Transport being
// built (its peers and listens, passed in), so that a failure in any phase releases all of them.
class Connector {
 public:
  using Peers = std::vector<std::unique_ptr<Transport::Peer>>;
  using Listens = std::vector<std::unique_ptr<fabric::ListenComm>>;

  Connector(std::span<fabric::Fabric* const> fabrics, const std::vector<std::string>& fabric_names,
            bootstrap::Bootstrap& bootstrap, const std::string& where, Deadline deadline, Peers& peers,
            Listens& listens)
      : fabrics_(fabrics),
        fabric_names_(fabric_names),
        bootstrap_(bootstrap),
        where_(where),
        deadline_(deadline),
        rank_(bootstrap.rank()),
        n_(bootstrap.size()),
        nfabrics_(static_cast<int>(fabrics.size())),
        peers_(peers),
        listens_(listens) {}

  // Which device of each fabric serves which peer.
  Status MapDevices(const device::Device& device);
  // Round 1: which peers this rank can serve on each fabric. From every rank's answer each rank
  // computes the fabric of each of its pairs: the first in the list that both ends serve.
  Status ChooseFabrics();
  // Round 2: listen once per peer, on the device of the pair's fabric that serves it; the handles
  // go out in one allgather.
  Status ExchangeOffers();
  // Checks each peer's offer to this rank against the pair's fabric, and makes a Peer for each one
  // to connect to (the rest are unreachable).
  Status MatchOffers();
  // Connects to every peer and accepts from every peer.
  Status ConnectAll();
  // Registers each peer's control buffers (`control_bytes` each) and fills in this rank's row of
  // links; `network` becomes true when some peer is reached through a switched device.
  Status RegisterControl(size_t control_bytes, std::vector<LinkDesc>& link_row, bool& network);

  // Which fabric serves which peers, over which devices: "directconnect: rank 1 (device w0:port0);
  // ofi: ranks 2, 3 (device tcp;ofi_rxm:lo)"; empty without peers.
  std::string Groups() const;
  const std::vector<int>& connected() const { return connected_; }
  const std::vector<int>& unreachable() const { return unreachable_; }

 private:
  // The offer a peer's record holds for this rank, and the device to connect to it from.
  struct Pending {
    int connect_dev = -1;
    const Handle* handle = nullptr;
  };

  // One round of ConnectAll for peer q: a connect and an accept when still missing. Adds q to
  // no_send / no_recv for what is still missing; `progressed` when either completed.
  Status TryConnect(int q, bool& progressed, std::vector<int>& no_send, std::vector<int>& no_recv);

  const std::span<fabric::Fabric* const> fabrics_;
  const std::vector<std::string>& fabric_names_;
  bootstrap::Bootstrap& bootstrap_;
  const std::string& where_;
  const Deadline deadline_;
  const int rank_;
  const int n_;
  const int nfabrics_;
  Peers& peers_;
  Listens& listens_;

  std::vector<DeviceMap> maps_;                      // per fabric
  std::vector<int> chosen_;                          // the fabric of the pair (rank, q); -1 for none
  std::vector<Record> records_;                      // every rank's offers
  std::vector<Pending> pending_;                     // per peer
  std::vector<int> unreachable_;                     // peers no fabric serves
  std::vector<int> connected_;                       // peers with comms both ways
  std::vector<std::vector<int>> served_;             // per fabric: the peers it serves
  std::vector<std::set<std::string>> device_names_;  // per fabric: the devices it uses for them
};

Status Connector::MapDevices(const device::Device& device) {
  for (int f = 0; f < nfabrics_; ++f) {
    auto map = DeviceMap::Build(*fabrics_[static_cast<size_t>(f)], device);
    if (!map.ok())
      return map.status().WithContext(
          fmt::format("{}: the devices of {}", where_, fabric_names_[static_cast<size_t>(f)]));
    maps_.push_back(std::move(map).value());
  }
  return Status::Ok();
}

Status Connector::ChooseFabrics() {
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
  std::vector<Reach> reach;
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

Status Connector::ExchangeOffers() {
  Record mine(static_cast<size_t>(n_));
  for (int q = 0; q < n_; ++q) {
    const int f = chosen_[static_cast<size_t>(q)];
    if (f < 0) continue;
    fabric::Fabric& fab = *fabrics_[static_cast<size_t>(f)];
    const DeviceMap& map = maps_[static_cast<size_t>(f)];
    const int dev = map.Serving(q);
    auto listen = fab.Listen(dev);
    if (!listen.ok())
      return listen.status().WithContext(
          fmt::format("{}: listening for rank {} on {} {}", where_, q, fab.name(), map.props(dev).name));
    mine[static_cast<size_t>(q)] = Offer{f, dev, map.props(dev).point_to_point, (*listen)->handle()};
    listens_[static_cast<size_t>(q)] = std::move(listen).value();
  }
  auto gathered = bootstrap_.AllGather(SerializeRecord(mine), deadline_);
  if (!gathered.ok()) return gathered.status().WithContext(fmt::format("{}: exchanging connection handles", where_));
  for (int q = 0; q < n_; ++q) {
    auto record = ParseRecord((*gathered)[static_cast<size_t>(q)], n_, nfabrics_, q);
    if (!record.ok()) return record.status().WithContext(where_);
    records_.push_back(std::move(record).value());
  }
  return Status::Ok();
}

// Both ends of a pair chose its fabric from the same data: an offer that disagrees comes from a
// rank that decided differently (another build), and connecting anyway could pair the wrong comms.
Status Connector::MatchOffers() {
  pending_.assign(static_cast<size_t>(n_), Pending{});
  for (int q = 0; q < n_; ++q) {
    if (q == rank_) continue;
    const int f = chosen_[static_cast<size_t>(q)];
    const std::optional<Offer>& theirs = records_[static_cast<size_t>(q)][static_cast<size_t>(rank_)];
    if (f < 0 && !theirs) {
      unreachable_.push_back(q);
      continue;
    }
    if (f < 0 || !theirs || theirs->fabric != f)
      return InvalidArgument(fmt::format(
          "{}: rank {} {} for this rank, but both ranks' reports say the pair is served by {} (do the ranks run the "
          "same kizuna build?)",
          where_, q,
          theirs ? fmt::format("listens on {}", fabric_names_[static_cast<size_t>(theirs->fabric)])
                 : std::string("does not listen"),
          f < 0 ? std::string("no fabric") : fabric_names_[static_cast<size_t>(f)]));
    const DeviceMap& map = maps_[static_cast<size_t>(f)];
    const int dev = map.ConnectingFor(q, *theirs);
    if (dev < 0)
      return InvalidArgument(fmt::format(
          "{}: rank {} listens for this rank on its {} {} device {}, and no device of this rank {}", where_, q,
          fabric_names_[static_cast<size_t>(f)], theirs->point_to_point ? "point-to-point" : "switched", theirs->device,
          theirs->point_to_point
              ? fmt::format("is linked to port {} of rank {} (do the ranks load the same topology?)", theirs->device, q)
              : std::string("is switched")));
    pending_[static_cast<size_t>(q)] = Pending{dev, &theirs->handle};
    peers_[static_cast<size_t>(q)] = std::make_unique<Transport::Peer>();
    peers_[static_cast<size_t>(q)]->rank = q;
    peers_[static_cast<size_t>(q)]->fabric = fabrics_[static_cast<size_t>(f)];
  }
  return Status::Ok();
}

// Connects and accepts are interleaved and non-blocking, so no pair waits for another; between
// rounds that changed nothing it sleeps briefly (the 2-core machines this runs on in CI must not
// be spun).
Status Connector::ConnectAll() {
  constexpr auto kMinSleep = std::chrono::microseconds(20);
  constexpr auto kMaxSleep = std::chrono::microseconds(1000);
  auto sleep = kMinSleep;
  for (;;) {
    bool progressed = false;
    std::vector<int> no_send, no_recv;
    for (int q = 0; q < n_; ++q) KZ_RETURN_IF_ERROR(TryConnect(q, progressed, no_send, no_recv));
    if (no_send.empty() && no_recv.empty()) return Status::Ok();
    if (deadline_.Expired()) {
      std::string missing;
      if (!no_send.empty()) missing += fmt::format("no connection to {}", RankList(no_send));
      if (!no_recv.empty())
        missing += fmt::format("{}no connection from {}", missing.empty() ? "" : ", ", RankList(no_recv));
      return Timeout(fmt::format("{}: {} by the deadline", where_, missing));
    }
    if (progressed) {
      sleep = kMinSleep;
      continue;
    }
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(sleep, deadline_.Remaining()));
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

Status Connector::TryConnect(int q, bool& progressed, std::vector<int>& no_send, std::vector<int>& no_recv) {
  Transport::Peer* p = peers_[static_cast<size_t>(q)].get();
  if (p == nullptr) return Status::Ok();
  const Pending& pend = pending_[static_cast<size_t>(q)];
  if (p->send == nullptr) {
    auto send = p->fabric->Connect(pend.connect_dev, *pend.handle);
    if (!send.ok()) {
      auto props = p->fabric->properties(pend.connect_dev);
      return send.status().WithContext(fmt::format("{}: connecting to rank {} from {} {}", where_, q, p->fabric->name(),
                                                   props.ok() ? props->name : "?"));
    }
    if (*send != nullptr) {
      p->send = std::move(send).value();
      progressed = true;
      KZ_TRACE(kLogColl, "{}: connected to rank {}: {}", where_, q, p->send->label());
    } else {
      no_send.push_back(q);
    }
  }
  if (p->recv == nullptr) {
    auto recv = listens_[static_cast<size_t>(q)]->Accept();
    if (!recv.ok())
      return recv.status().WithContext(fmt::format("{}: accepting rank {}'s connection on {} {}", where_, q,
                                                   p->fabric->name(),
                                                   listens_[static_cast<size_t>(q)]->properties().name));
    if (*recv != nullptr) {
      p->recv = std::move(recv).value();
      progressed = true;
      KZ_TRACE(kLogColl, "{}: accepted rank {}: {}", where_, q, p->recv->label());
    } else {
      no_recv.push_back(q);
    }
  }
  return Status::Ok();
}

// Control buffers: host memory, which every fabric registers.
Status Connector::RegisterControl(size_t control_bytes, std::vector<LinkDesc>& link_row, bool& network) {
  auto register_control = [&](fabric::Comm& comm, std::vector<uint8_t>& buffer, int q,
                              std::string_view dir) -> Result<fabric::Registration*> {
    buffer.assign(control_bytes, 0);
    auto reg = comm.Register(fabric::MemoryDescriptor::Host(buffer.data(), buffer.size()));
    if (!reg.ok())
      return reg.status().WithContext(fmt::format("{}: registering the control buffer {} rank {}", where_, dir, q));
    return *reg;
  };
  served_.assign(static_cast<size_t>(nfabrics_), {});
  device_names_.assign(static_cast<size_t>(nfabrics_), {});
  for (int q = 0; q < n_; ++q) {
    Transport::Peer* p = peers_[static_cast<size_t>(q)].get();
    if (p == nullptr) continue;
    KZ_ASSIGN_OR_RETURN(p->send_control, register_control(*p->send, p->control_out, q, "to"));
    KZ_ASSIGN_OR_RETURN(p->recv_control, register_control(*p->recv, p->control_in, q, "from"));
    // FabricDeviceProperties::speed_gbps is in gigabits per second (as NICs are rated);
    // LinkDesc::gbps is in gigabytes per second (as the cost model counts bytes): divide by 8.
    const FabricDeviceProperties& via = p->send->properties();
    link_row[static_cast<size_t>(q)] = LinkDesc{true, via.latency_us, via.speed_gbps / 8.0, true};
    connected_.push_back(q);
    const size_t f = static_cast<size_t>(chosen_[static_cast<size_t>(q)]);
    served_[f].push_back(q);
    device_names_[f].insert(via.name);
    device_names_[f].insert(p->recv->properties().name);
    network = network || !via.point_to_point;
  }
  return Status::Ok();
}

std::string Connector::Groups() const {
  std::string groups;
  for (int f = 0; f < nfabrics_; ++f) {
    const auto& names = device_names_[static_cast<size_t>(f)];
    if (served_[static_cast<size_t>(f)].empty()) continue;
    std::string devices;
    for (const std::string& name : names) devices += fmt::format("{}{}", devices.empty() ? "" : ", ", name);
    groups += fmt::format("{}{}: {} ({} {})", groups.empty() ? "" : "; ", fabric_names_[static_cast<size_t>(f)],
                          RankList(served_[static_cast<size_t>(f)]), names.size() == 1 ? "device" : "devices", devices);
  }
  return groups;
}

}  // namespace

Transport::~Transport() {
  // Comms first: their registrations (and any mapping of the staging fd a fabric keeps) must go
  // before the memory they describe.
  peers_.clear();
  listens_.clear();
  staging_.reset();
}

Result<std::unique_ptr<Transport>> Transport::CreateSingle(device::Device& device, const TransportOptions& options) {
  if (options.staging_bytes == 0) return InvalidArgument("transport: staging_bytes must be positive");
  std::unique_ptr<Transport> t(new Transport());
  t->rank_ = 0;
  t->nranks_ = 1;
  t->peers_.resize(1);
  t->listens_.resize(1);
  t->link_row_.assign(1, LinkDesc{});
  if (options.force_host_staging) {
    KZ_ASSIGN_OR_RETURN(t->staging_, device.AllocateHost(options.staging_bytes));
    t->host_staging_ = true;
    t->staging_text_ = "through host memory (forced by TransportOptions::force_host_staging)";
    t->description_ = fmt::format("a single rank (no fabric); staging {}", t->staging_text_);
  } else {
    KZ_ASSIGN_OR_RETURN(t->staging_, device.Allocate(options.staging_bytes));
    t->staging_text_ = "unregistered";
    t->description_ = "a single rank (no fabric)";
  }
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
  t->peers_.resize(static_cast<size_t>(n));
  t->listens_.resize(static_cast<size_t>(n));
  t->link_row_.assign(static_cast<size_t>(n), LinkDesc{});

  Connector connector(fabrics, fabric_names, bootstrap, where, deadline, t->peers_, t->listens_);
  KZ_RETURN_IF_ERROR(connector.MapDevices(device));
  KZ_RETURN_IF_ERROR(connector.ChooseFabrics());
  KZ_RETURN_IF_ERROR(connector.ExchangeOffers());
  KZ_RETURN_IF_ERROR(connector.MatchOffers());
  KZ_RETURN_IF_ERROR(connector.ConnectAll());
  KZ_RETURN_IF_ERROR(connector.RegisterControl(options.control_bytes, t->link_row_, t->network_));

  TransportOptions staging_options = options;
  if (t->network_) staging_options.staging_bytes = std::max(options.staging_bytes, options.network_staging_bytes);
  KZ_RETURN_IF_ERROR(t->SetUpStaging(device, staging_options, where));

  const std::string groups = connector.Groups();
  const std::vector<int>& connected = connector.connected();
  const std::vector<int>& unreachable = connector.unreachable();
  t->description_ =
      fmt::format("{}{}; staging {}", groups.empty() ? fmt::format("no peers over {}", NameList(fabric_names)) : groups,
                  unreachable.empty() ? std::string() : fmt::format("; unreachable: {}", RankList(unreachable)),
                  t->staging_text_);
  KZ_INFO(kLogColl, "{}: {} peer(s) ({}){}{}", where, connected.size(),
          connected.empty() ? std::string("none") : RankList(connected),
          groups.empty() ? std::string() : fmt::format(" over {}", groups),
          unreachable.empty() ? std::string() : fmt::format("; {} unreachable", RankList(unreachable)));
  // No rank returns before every rank has its connections: a handshake completes on one side
  // first, and a rank that closed its transport at once would leave its peer reading that
  // handshake until the deadline.
  if (Status all = bootstrap.Barrier(deadline); !all.ok())
    return all.WithContext(fmt::format("{}: waiting for every rank's connections", where));
  return t;
}

}  // namespace kizuna::collectives
