// GID selection, KIZUNA_IB_HCA parsing and the MTU mapping: pure functions, no device needed.
#include "fabric/roce/gid.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

namespace kizuna::fabric::roce {
namespace {

GidBytes Gid(const char* text) {
  GidBytes g{};
  EXPECT_EQ(::inet_pton(AF_INET6, text, g.data()), 1) << text;
  return g;
}

GidRow Row(uint32_t index, GidType type, const char* gid, std::string netdev = "eth0") {
  return GidRow{index, type, Gid(gid), std::move(netdev)};
}

// The table a port with one IPv4 and one global IPv6 address has (rdma_rxe and mlx5 look alike):
// RoCE v1 and v2 entries per address, the link-local ones first, an unused row.
std::vector<GidRow> TypicalTable() {
  return {
      Row(0, GidType::kRoceV1, "fe80::5054:ff:fe12:3456"),
      Row(1, GidType::kRoceV2, "fe80::5054:ff:fe12:3456"),
      Row(2, GidType::kRoceV1, "::ffff:10.0.0.1"),
      Row(3, GidType::kRoceV2, "::ffff:10.0.0.1"),
      Row(4, GidType::kRoceV1, "fd00::1"),
      Row(5, GidType::kRoceV2, "fd00::1"),
      Row(6, GidType::kRoceV2, "::", ""),
  };
}

TEST(GidSelection, AutoPicksTheIpv4MappedRoceV2Gid) {
  auto r = SelectGid(TypicalTable(), GidRequest{}, "rxe0:1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->index, 3u);
  EXPECT_EQ(GidToString(r->gid), "::ffff:10.0.0.1");
  EXPECT_EQ(r->netdev, "eth0");
}

TEST(GidSelection, Ipv6ModePicksTheGlobalIpv6RoceV2Gid) {
  auto r = SelectGid(TypicalTable(), GidRequest{AddrFamily::kIpv6, std::nullopt}, "rxe0:1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->index, 5u);
  EXPECT_EQ(GidToString(r->gid), "fd00::1");
}

TEST(GidSelection, LowestIndexWinsAmongEqualCandidates) {
  std::vector<GidRow> t = {Row(7, GidType::kRoceV2, "::ffff:10.0.0.2"), Row(3, GidType::kRoceV2, "::ffff:10.0.0.1")};
  auto r = SelectGid(t, GidRequest{}, "rxe0:1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->index, 3u);
}

TEST(GidSelection, ZeroLinkLocalRoceV1AndNetdevlessRowsAreSkipped) {
  std::vector<GidRow> t = {
      Row(0, GidType::kRoceV2, "::", "eth0"),                     // zero
      Row(1, GidType::kRoceV2, "fe80::1"),                        // link-local
      Row(2, GidType::kRoceV1, "::ffff:10.0.0.1"),                // RoCE v1
      Row(3, GidType::kRoceV2, "::ffff:10.0.0.9", ""),            // no network interface
      Row(4, GidType::kIb, "::ffff:10.0.0.3"),                    // IB
  };
  auto r = SelectGid(t, GidRequest{}, "mlx5_0:1");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("mlx5_0:1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("KIZUNA_IB_ADDR_FAMILY=ipv6"), std::string::npos) << r.status().message();
  // Only link-local: the IPv6 mode finds nothing either.
  auto v6 = SelectGid({Row(1, GidType::kRoceV2, "fe80::1")}, GidRequest{AddrFamily::kIpv6, std::nullopt}, "p");
  EXPECT_FALSE(v6.ok());
}

TEST(GidSelection, NoIpv4AddressMeansNoAutoGidInIpv4Mode) {
  std::vector<GidRow> t = {Row(0, GidType::kRoceV2, "fe80::1"), Row(1, GidType::kRoceV2, "2001:db8::5")};
  EXPECT_FALSE(SelectGid(t, GidRequest{}, "p").ok());
  auto v6 = SelectGid(t, GidRequest{AddrFamily::kIpv6, std::nullopt}, "p");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->index, 1u);
}

TEST(GidSelection, OverrideTakesThatIndexEvenIfAutoWouldNot) {
  auto r = SelectGid(TypicalTable(), GidRequest{AddrFamily::kIpv4, 1}, "rxe0:1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->index, 1u);
  EXPECT_TRUE(IsLinkLocalGid(r->gid));
}

TEST(GidSelection, BadOverrideIsAClearError) {
  auto missing = SelectGid(TypicalTable(), GidRequest{AddrFamily::kIpv4, 42}, "rxe0:1");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("KIZUNA_IB_GID_INDEX=42"), std::string::npos);
  EXPECT_NE(missing.status().message().find("rxe0:1"), std::string::npos);
  EXPECT_NE(missing.status().message().find("::ffff:10.0.0.1"), std::string::npos) << "lists the table";

  auto zero = SelectGid(TypicalTable(), GidRequest{AddrFamily::kIpv4, 6}, "rxe0:1");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("zero"), std::string::npos) << zero.status().message();
}

TEST(GidClassification, Predicates) {
  EXPECT_TRUE(IsZeroGid(Gid("::")));
  EXPECT_FALSE(IsZeroGid(Gid("::1")));
  EXPECT_TRUE(IsLinkLocalGid(Gid("fe80::1")));
  EXPECT_TRUE(IsLinkLocalGid(Gid("febf::1")));
  EXPECT_FALSE(IsLinkLocalGid(Gid("fec0::1")));
  EXPECT_TRUE(IsIpv4MappedGid(Gid("::ffff:192.168.1.7")));
  EXPECT_FALSE(IsIpv4MappedGid(Gid("::192.168.1.7")));
  EXPECT_FALSE(IsIpv4MappedGid(Gid("fd00::ffff:1")));
  EXPECT_EQ(GidToString(Gid("::ffff:192.168.1.7")), "::ffff:192.168.1.7");
}

TEST(HcaList, ParsesDevicesAndPorts) {
  auto r = ParseHcaList(" mlx5_0:1, mlx5_1 ,rxe0:2");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0].device, "mlx5_0");
  EXPECT_EQ((*r)[0].port, 1);
  EXPECT_EQ((*r)[1].device, "mlx5_1");
  EXPECT_FALSE((*r)[1].port.has_value());
  EXPECT_EQ((*r)[2].port, 2);
  auto empty = ParseHcaList("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(HcaList, MalformedEntriesAreErrorsNamingThem) {
  for (const char* bad : {"mlx5_0:x", "mlx5_0:0", "mlx5_0:256", ":1", "mlx5_0,,mlx5_1", "mlx5_0:1:2"}) {
    auto r = ParseHcaList(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("KIZUNA_IB_HCA"), std::string::npos) << r.status().message();
  }
}

TEST(Mtu, EnumMapping) {
  EXPECT_EQ(MtuBytes(1), 256);
  EXPECT_EQ(MtuBytes(2), 512);
  EXPECT_EQ(MtuBytes(3), 1024);
  EXPECT_EQ(MtuBytes(4), 2048);
  EXPECT_EQ(MtuBytes(5), 4096);
  EXPECT_EQ(MtuBytes(0), 0);
  EXPECT_EQ(MtuBytes(6), 0);
  for (int e = 1; e <= 5; ++e) EXPECT_EQ(MtuEnum(MtuBytes(e)), e);
  EXPECT_EQ(MtuEnum(1500), 0);
  EXPECT_EQ(MtuEnum(9000), 0);
}

}  // namespace
}  // namespace kizuna::fabric::roce
