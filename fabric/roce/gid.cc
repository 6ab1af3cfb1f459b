#include "fabric/roce/gid.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

namespace kizuna::fabric::roce {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string DescribeTable(const std::vector<GidRow>& table) {
  std::string out;
  for (const GidRow& r : table) {
    if (IsZeroGid(r.gid)) continue;
    out += fmt::format("{}[{}] {} {}{}", out.empty() ? "" : ", ", r.index, GidTypeName(r.type), GidToString(r.gid),
                       r.netdev.empty() ? "" : " on " + r.netdev);
  }
  return out.empty() ? "no GIDs at all" : out;
}

}  // namespace

Result<std::vector<HcaSpec>> ParseHcaList(std::string_view text) {
  std::vector<HcaSpec> out;
  text = Trim(text);
  if (text.empty()) return out;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view entry = Trim(text.substr(0, comma));
    const size_t colon = entry.find(':');
    HcaSpec spec;
    spec.device = std::string(Trim(entry.substr(0, colon)));
    if (spec.device.empty())
      return InvalidArgument(fmt::format("KIZUNA_IB_HCA: entry '{}' names no device (form: device[:port],...)", entry));
    if (colon != std::string_view::npos) {
      const std::string_view port = Trim(entry.substr(colon + 1));
      int value = 0;
      const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
      if (ec != std::errc() || end != port.data() + port.size() || value < 1 || value > 255)
        return InvalidArgument(fmt::format("KIZUNA_IB_HCA: entry '{}' has port '{}', not a number in 1..255",
                                           entry, port));
      spec.port = value;
    }
    out.push_back(std::move(spec));
    if (comma == std::string_view::npos) break;
    text = text.substr(comma + 1);
  }
  return out;
}

bool IsZeroGid(const GidBytes& gid) {
  return std::all_of(gid.begin(), gid.end(), [](uint8_t b) { return b == 0; });
}

bool IsLinkLocalGid(const GidBytes& gid) { return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80; }

bool IsIpv4MappedGid(const GidBytes& gid) {
  return std::all_of(gid.begin(), gid.begin() + 10, [](uint8_t b) { return b == 0; }) && gid[10] == 0xff &&
         gid[11] == 0xff;
}

std::string GidToString(const GidBytes& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET6, gid.data(), text, sizeof(text)) == nullptr) return "?";
  return text;
}

std::string_view GidTypeName(GidType type) {
  switch (type) {
    case GidType::kIb: return "IB";
    case GidType::kRoceV1: return "RoCE v1";
    case GidType::kRoceV2: return "RoCE v2";
  }
  return "?";
}

Result<GidRow> SelectGid(const std::vector<GidRow>& table, const GidRequest& request, std::string_view port_name) {
  if (request.index.has_value()) {
    const int want = *request.index;
    auto it = std::find_if(table.begin(), table.end(),
                           [&](const GidRow& r) { return static_cast<int>(r.index) == want; });
    if (it == table.end())
      return InvalidArgument(fmt::format("KIZUNA_IB_GID_INDEX={}: {} has no GID at index {} (its table: {})", want,
                                         port_name, want, DescribeTable(table)));
    if (IsZeroGid(it->gid))
      return InvalidArgument(fmt::format("KIZUNA_IB_GID_INDEX={}: the GID at index {} of {} is zero (unused; its "
                                         "table: {})", want, want, port_name, DescribeTable(table)));
    return *it;
  }
  const bool want_v4 = request.family == AddrFamily::kIpv4;
  const GidRow* best = nullptr;
  for (const GidRow& r : table) {
    if (r.type != GidType::kRoceV2 || r.netdev.empty() || IsZeroGid(r.gid) || IsLinkLocalGid(r.gid)) continue;
    if (IsIpv4MappedGid(r.gid) != want_v4) continue;
    if (best == nullptr || r.index < best->index) best = &r;
  }
  if (best == nullptr)
    return NotSupported(fmt::format("{} has no RoCE v2 GID with an {} address on a network interface (its table: "
                                    "{}); set KIZUNA_IB_ADDR_FAMILY={} or KIZUNA_IB_GID_INDEX",
                                    port_name, want_v4 ? "IPv4" : "IPv6", DescribeTable(table),
                                    want_v4 ? "ipv6" : "ipv4"));
  return *best;
}

int MtuBytes(int mtu_enum) {
  switch (mtu_enum) {
    case 1: return 256;
    case 2: return 512;
    case 3: return 1024;
    case 4: return 2048;
    case 5: return 4096;
    default: return 0;
  }
}

int MtuEnum(int bytes) {
  for (int e = 1; e <= 5; ++e)
    if (MtuBytes(e) == bytes) return e;
  return 0;
}

}  // namespace kizuna::fabric::roce
