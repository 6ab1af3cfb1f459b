// Pure selection logic of the roce fabric, testable without a device: which devices and ports
// KIZUNA_IB_HCA names, which GID a port uses (RoCE v2 auto-selection and the overrides), and the
// verbs MTU enumeration.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/status.h"

namespace kizuna::fabric::roce {

// ---- KIZUNA_IB_HCA ----

// One entry of KIZUNA_IB_HCA: "mlx5_0" (every port) or "mlx5_0:1".
struct HcaSpec {
  std::string device;
  std::optional<int> port;
};
// Parses a comma-separated "device[:port]" list; empty text: no filter (every device). A malformed
// entry (empty name, port not a number in 1..255) is kInvalidArgument naming it.
Result<std::vector<HcaSpec>> ParseHcaList(std::string_view text);

// ---- GIDs ----

enum class GidType : uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };
enum class AddrFamily : uint8_t { kIpv4, kIpv6 };

using GidBytes = std::array<uint8_t, 16>;

// One row of a port's GID table (ibv_query_gid_table).
struct GidRow {
  uint32_t index = 0;
  GidType type = GidType::kIb;
  GidBytes gid{};
  std::string netdev;  // the network interface the GID belongs to; "" when none
};

struct GidRequest {
  AddrFamily family = AddrFamily::kIpv4;   // KIZUNA_IB_ADDR_FAMILY
  std::optional<int> index;                // KIZUNA_IB_GID_INDEX
};

bool IsZeroGid(const GidBytes& gid);
bool IsLinkLocalGid(const GidBytes& gid);     // fe80::/10
bool IsIpv4MappedGid(const GidBytes& gid);    // ::ffff:a.b.c.d
// "::ffff:10.0.0.1" / "fd00::1" — the GID as an address.
std::string GidToString(const GidBytes& gid);
std::string_view GidTypeName(GidType type);

// The GID a port uses. With `request.index`: that row, kInvalidArgument naming
// KIZUNA_IB_GID_INDEX when the table has no such row or the GID there is zero. Otherwise the
// lowest-index RoCE v2 GID on a network interface that is neither zero nor link-local, of the
// requested family (IPv4-mapped for ipv4, any other for ipv6); kNotSupported listing what the
// table holds when there is none. `port_name` ("mlx5_0:1") goes into the messages.
Result<GidRow> SelectGid(const std::vector<GidRow>& table, const GidRequest& request, std::string_view port_name);

// ---- MTU ----

// The bytes of a verbs MTU enumeration value (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5); 0 for
// anything else.
int MtuBytes(int mtu_enum);
// The enumeration value for a byte count (256, 512, 1024, 2048, 4096); 0 for anything else.
int MtuEnum(int bytes);

}  // namespace kizuna::fabric::roce
