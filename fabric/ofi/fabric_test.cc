// Which providers become devices (pure selection rules), tag layout, handles, and the properties
// the real devices report.

#include <rdma/fabric.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include <gtest/gtest.h>

#include "fabric/ofi/endpoint.h"
#include "fabric/ofi/fabric.h"
#include "fabric/ofi/test_util.h"
#include "fabric/ofi/transfer.h"
#include "fabric/registry.h"

namespace kizuna::fabric::ofi {
namespace {

ProviderEntry Entry(std::string provider, std::string fabric, std::string domain, uint32_t format, bool loopback,
                    bool rma = true) {
  return ProviderEntry{std::move(provider), std::move(fabric), std::move(domain), format, loopback, rma};
}

// What libfabric 1.17 offers on the build machines: tcp;ofi_rxm on eth0 (IPv4, IPv6) and lo,
// the experimental net provider, udp;ofi_rxd, shm.
std::vector<ProviderEntry> BuildMachine() {
  return {
      Entry("tcp;ofi_rxm", "192.0.2.0/24", "eth0", FI_SOCKADDR_IN, false),
      Entry("tcp;ofi_rxm", "fe80::/64", "eth0", FI_SOCKADDR_IN6, false),
      Entry("tcp;ofi_rxm", "127.0.0.1/32", "lo", FI_SOCKADDR_IN, true),
      Entry("net;ofi_rxm", "192.0.2.0/24", "eth0", FI_SOCKADDR_IN, false),
      Entry("udp;ofi_rxd", "192.0.2.0/24", "eth0", FI_SOCKADDR_IN, false),
      Entry("shm", "shm", "shm", FI_ADDR_STR, false),
  };
}

std::vector<std::string> Names(const std::vector<ProviderEntry>& e, const std::vector<size_t>& idx) {
  std::vector<std::string> out;
  for (size_t i : idx) out.push_back(e[i].provider + "@" + e[i].domain + "/" + e[i].fabric);
  return out;
}

TEST(OfiSelection, DefaultIsTcpOnRoutableInterfacesThenShm) {
  const auto e = BuildMachine();
  EXPECT_EQ(Names(e, SelectDevices(e, {})),
            (std::vector<std::string>{"tcp;ofi_rxm@eth0/192.0.2.0/24", "shm@shm/shm"}));
}

TEST(OfiSelection, LoopbackOnlyWhenItIsTheOnlyInterface) {
  // FI_TCP_IFACE=lo: libfabric offers only lo.
  std::vector<ProviderEntry> e = {Entry("tcp;ofi_rxm", "127.0.0.1/32", "lo", FI_SOCKADDR_IN, true),
                                  Entry("tcp;ofi_rxm", "::1/128", "lo", FI_SOCKADDR_IN6, true)};
  EXPECT_EQ(Names(e, SelectDevices(e, {})), (std::vector<std::string>{"tcp;ofi_rxm@lo/127.0.0.1/32"}));
}

TEST(OfiSelection, IPv4AndOneSidedWritesArePreferredPerDomain) {
  std::vector<ProviderEntry> e = {Entry("tcp;ofi_rxm", "fe80::/64", "eth1", FI_SOCKADDR_IN6, false),
                                  Entry("tcp;ofi_rxm", "fd00::/64", "eth1", FI_SOCKADDR_IN6, false),
                                  Entry("tcp;ofi_rxm", "10.0.0.0/8", "eth2", FI_SOCKADDR_IN, false, false),
                                  Entry("tcp;ofi_rxm", "10.0.0.0/8", "eth2", FI_SOCKADDR_IN, false, true)};
  const auto chosen = SelectDevices(e, {});
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen[0], 1u) << "a routable IPv6 network over a link-local one";
  EXPECT_EQ(chosen[1], 3u) << "the entry with one-sided writes";
}

TEST(OfiSelection, KizunaFabricNamesProvidersInOrder) {
  const auto e = BuildMachine();
  SelectionRequest shm_first;
  shm_first.providers = ProvidersFromConfig({"directconnect", "ofi:shm", "ofi:tcp"});
  EXPECT_EQ(shm_first.providers, (std::vector<std::string>{"shm", "tcp"}));
  EXPECT_EQ(Names(e, SelectDevices(e, shm_first)),
            (std::vector<std::string>{"shm@shm/shm", "tcp;ofi_rxm@eth0/192.0.2.0/24"}));
  SelectionRequest udp;
  udp.providers = {"udp"};
  EXPECT_EQ(Names(e, SelectDevices(e, udp)), (std::vector<std::string>{"udp;ofi_rxd@eth0/192.0.2.0/24"}));
  SelectionRequest none;
  none.providers = {"verbs"};
  EXPECT_TRUE(SelectDevices(e, none).empty());
}

TEST(OfiSelection, FiProviderTakesEverythingLibfabricOffers) {
  const auto e = BuildMachine();
  SelectionRequest r;
  r.fi_provider_set = true;
  r.providers = {"shm"};  // FI_PROVIDER wins over KIZUNA_FABRIC's provider list
  EXPECT_EQ(Names(e, SelectDevices(e, r)),
            (std::vector<std::string>{"tcp;ofi_rxm@eth0/192.0.2.0/24", "net;ofi_rxm@eth0/192.0.2.0/24",
                                      "udp;ofi_rxd@eth0/192.0.2.0/24", "shm@shm/shm"}));
}

TEST(OfiSelection, ProviderNamesMatchWholeLayers) {
  EXPECT_TRUE(ProviderMatches("tcp;ofi_rxm", "tcp;ofi_rxm"));
  EXPECT_TRUE(ProviderMatches("tcp;ofi_rxm", "tcp"));
  EXPECT_TRUE(ProviderMatches("verbs;ofi_rxm", "verbs"));
  EXPECT_FALSE(ProviderMatches("tcpx;ofi_rxm", "tcp"));
  EXPECT_FALSE(ProviderMatches("shm", "sh"));
  EXPECT_TRUE(ProvidersFromConfig({"ofi", "ofi:", "roce"}).empty());
}

TEST(OfiSelection, FiTcpIfaceNamingNoInterfaceOfThisHostIsRefused) {
  const std::vector<std::string> here = {"lo", "eth0", "ib0"};
  EXPECT_TRUE(CheckTcpIface("eth0", here).ok());
  EXPECT_TRUE(CheckTcpIface("eth0,ib0", here).ok());
  const Status typo = CheckTcpIface("eth9", here);
  EXPECT_EQ(typo.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(typo.message().find("FI_TCP_IFACE names eth9, which this host does not have (it has: lo, eth0, ib0)"),
            std::string::npos)
      << typo.message();
  EXPECT_NE(typo.message().find("unset FI_TCP_IFACE"), std::string::npos) << typo.message();
  EXPECT_NE(CheckTcpIface("eth0,bond7", here).message().find("names bond7,"), std::string::npos);
}

TEST(OfiSelection, AMissingShmProviderIsExplainedWhereDevShmIsSmall) {
  const FileSystemSpace docker{64u << 20, 60u << 20};  // a container's default --shm-size, nearly empty
  const std::string hint = ShmProviderHint(true, false, docker, 4);
  EXPECT_TRUE(hint.starts_with("; libfabric's shm provider leaves itself out")) << hint;
  EXPECT_NE(hint.find("/dev/shm has 64.0 MiB, 60.0 MiB free"), std::string::npos) << hint;
  EXPECT_NE(hint.find("--shm-size"), std::string::npos) << hint;
  EXPECT_NE(hint.find("KIZUNA_FABRIC=tcp"), std::string::npos) << hint;
  // Not where shm was not asked for, was offered, or /dev/shm has room (32 MiB a core).
  EXPECT_EQ(ShmProviderHint(false, false, docker, 4), "");
  EXPECT_EQ(ShmProviderHint(true, true, docker, 4), "");
  EXPECT_EQ(ShmProviderHint(true, false, FileSystemSpace{1u << 30, 128u << 20}, 4), "");
  EXPECT_NE(ShmProviderHint(true, false, FileSystemSpace{1u << 30, 127u << 20}, 4), "");
  // Where /dev/shm cannot be measured, the reason.
  const std::string unknown = ShmProviderHint(true, false, Unavailable("statvfs(/dev/shm) failed: gone"), 2);
  EXPECT_NE(unknown.find("statvfs(/dev/shm) failed: gone"), std::string::npos) << unknown;
}

TEST(OfiTags, KindConnectionAndSequenceNeverOverlap) {
  TagLayout t;
  EXPECT_EQ(t.Make(TagKind::kData, 0, 0), uint64_t{4} << 60);
  EXPECT_EQ(t.Make(TagKind::kData, 0, 0xffffffffu), (uint64_t{4} << 60) | 0xffffffffu);
  // The connection keeps its low bits only, never spilling into the kind.
  EXPECT_EQ(t.Make(TagKind::kControl, ~uint64_t{0}, 0) >> 60, 3u);
  EXPECT_NE(t.Make(TagKind::kData, 1, 7), t.Make(TagKind::kData, 2, 7));
  TagLayout narrow;
  narrow.bits = 52;
  EXPECT_EQ(narrow.Make(TagKind::kHello, ~uint64_t{0}, 0) >> 48, 1u);
  EXPECT_LT(narrow.Make(TagKind::kData, ~uint64_t{0}, ~0u), uint64_t{1} << 52);
}

TEST(OfiHandles, RoundTripAndMalformedOnesAreRejected) {
  HandleInfo info;
  info.version = kProtocolVersion;
  info.provider_hash = 0x1234;
  info.addr_format = FI_SOCKADDR_IN;
  for (size_t i = 0; i < kTokenBytes; ++i) info.token[i] = static_cast<uint8_t>(i * 7);
  info.process_nonce = 99;
  info.pid = 42;
  info.address = std::string("\x02\x00\x1f\x90\x7f\x00\x00\x01\0\0\0\0\0\0\0\0", 16);
  auto h = EncodeHandle(info);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_LE(h->size, kHandleMaxBytes);
  auto back = ParseHandle(*h);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->address, info.address);
  EXPECT_EQ(back->pid, 42u);
  EXPECT_EQ(std::memcmp(back->token, info.token, kTokenBytes), 0);

  Handle truncated = *h;
  truncated.size -= 1;
  EXPECT_EQ(ParseHandle(truncated).status().code(), StatusCode::kInvalidArgument);
  Handle garbage = *h;
  garbage.data[0] ^= 0xff;
  EXPECT_EQ(ParseHandle(garbage).status().code(), StatusCode::kInvalidArgument);
  info.address = std::string(MaxHandleAddressBytes() + 1, 'x');
  EXPECT_EQ(EncodeHandle(info).status().code(), StatusCode::kNotSupported);
}

class OfiProperties : public ::testing::TestWithParam<std::string> {};

TEST_P(OfiProperties, DevicesDescribeThemselves) {
  testing::World w(GetParam());
  if (!w.status.ok()) GTEST_SKIP() << GetParam() << " is not available here: " << w.status.message();
  Fabric& f = w[0];
  EXPECT_EQ(f.name(), "ofi");
  ASSERT_GE(f.device_count(), 1);
  for (int d = 0; d < f.device_count(); ++d) {
    auto p = f.properties(d);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->fabric, "ofi");
    EXPECT_EQ(p->index, d);
    EXPECT_NE(p->name.find(GetParam() == "shm" ? "shm" : "tcp"), std::string::npos) << p->name;
    // libfabric 1.17: host memory only; fd regions are mapped and registered as host memory.
    EXPECT_EQ(p->ptr_support, uint32_t{kPtrHost | kPtrFd});
    EXPECT_GE(p->max_requests, 16);
    EXPECT_LE(p->max_requests, kMaxRequests);
    EXPECT_GE(p->max_message_bytes, uint64_t{1} << 30);
    EXPECT_FALSE(p->point_to_point);
    EXPECT_FALSE(p->needs_flush);
    // tcp;ofi_rxm and shm both offer FI_RMA with remote CQ data.
    EXPECT_TRUE(p->write_immediate);
  }
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiProperties, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& info) { return info.param == "shm" ? std::string("shm") : std::string("tcp"); });

TEST(OfiProperties, TheTestsRunOnLoopbackTcp) {
  // BUILD sets FI_TCP_IFACE=lo: libfabric offers tcp on lo only, which is then the device.
  testing::World w("tcp;ofi_rxm");
  if (!w.status.ok()) GTEST_SKIP() << w.status.message();
  auto p = w[0].properties(0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->name, "tcp;ofi_rxm:lo");
}

TEST(OfiProperties, TheRegistryCreatesItAndSelectsItByName) {
  Config config = testing::ConfigFor("tcp;ofi_rxm");
  config.fabric.push_back("ofi");
  auto registry = FabricRegistry::Create(config, testing::Rank(0));
  bool listed = false;
  for (const FabricSlot& s : registry->fabrics()) {
    if (s.name != "ofi") continue;
    listed = true;
    if (!s.status.ok()) GTEST_SKIP() << s.status.message();
  }
  EXPECT_TRUE(listed);
  auto selected = registry->Select();
  ASSERT_TRUE(selected.ok()) << selected.status().ToString();
  EXPECT_EQ((*selected)->name(), "ofi");
}

// Without KIZUNA_FABRIC, on a machine without RDMA devices and without FI_PROVIDER, the registry
// leaves ofi unstarted and says why (libfabric would offer what tcp and directconnect serve);
// FI_PROVIDER, or a registry asked for every fabric (tools, conformance), starts it.
TEST(OfiProperties, TheRegistryStartsItByDefaultOnlyWhereItAddsSomething) {
  std::error_code ec;
  const bool rdma = std::filesystem::exists("/sys/class/infiniband", ec) &&
                    !std::filesystem::is_empty("/sys/class/infiniband", ec);
  const char* before = std::getenv("FI_PROVIDER");
  const std::string saved = before != nullptr ? before : "";
  ::unsetenv("FI_PROVIDER");
  Config config = testing::ConfigFor("tcp;ofi_rxm");
  config.fabric.clear();
  auto slot_of = [](const FabricRegistry& r) -> const FabricSlot* {
    for (const FabricSlot& s : r.fabrics())
      if (s.name == "ofi") return &s;
    return nullptr;
  };
  auto plain = FabricRegistry::Create(config, testing::Rank(0));
  const FabricSlot* s = slot_of(*plain);
  ASSERT_NE(s, nullptr);
  if (!rdma) {
    EXPECT_EQ(s->status.code(), StatusCode::kUnavailable) << s->status.ToString();
    EXPECT_NE(s->status.message().find("not started"), std::string::npos) << s->status.ToString();
    EXPECT_NE(s->status.message().find("KIZUNA_FABRIC=ofi"), std::string::npos) << s->status.ToString();
  }
  auto every = FabricRegistry::Create(config, testing::Rank(0), /*every=*/true);
  EXPECT_EQ(slot_of(*every)->status.message().find("not started"), std::string::npos)
      << slot_of(*every)->status.ToString();
  ::setenv("FI_PROVIDER", "tcp", 1);
  auto asked = FabricRegistry::Create(config, testing::Rank(0));
  EXPECT_EQ(slot_of(*asked)->status.message().find("not started"), std::string::npos)
      << slot_of(*asked)->status.ToString();
  if (before != nullptr) {
    ::setenv("FI_PROVIDER", saved.c_str(), 1);
  } else {
    ::unsetenv("FI_PROVIDER");
  }
}

// Pieces (transfer.h): a receive posts one per piece of its capacity; a message sends its full
// pieces and a shorter last one, of 0 bytes where it would otherwise end on a boundary early.
TEST(OfiPieces, ReceivesAndSendsAgreeOnWhereAMessageEnds) {
  const uint64_t p = kRxmPieceBytes;
  EXPECT_EQ(RecvPieces(0, p), 1u);
  EXPECT_EQ(RecvPieces(1, p), 1u);
  EXPECT_EQ(RecvPieces(p, p), 1u);
  EXPECT_EQ(RecvPieces(p + 1, p), 2u);
  EXPECT_EQ(RecvPieces(32 * p, p), 32u);
  EXPECT_EQ(SendPieces(0, 0, p), 1u);          // an empty message still arrives
  EXPECT_EQ(SendPieces(0, 5 * p, p), 1u);
  EXPECT_EQ(SendPieces(p, p, p), 1u);          // fills its receive: no end marker
  EXPECT_EQ(SendPieces(p, 2 * p, p), 2u);      // ends on a boundary early: a piece of 0 bytes
  EXPECT_EQ(SendPieces(p + 1, p + 1, p), 2u);
  EXPECT_EQ(SendPieces(3 * p / 2, 3 * p, p), 2u);
  // Every piece a message sends has a posted receive.
  for (uint64_t capacity : {uint64_t{0}, uint64_t{7}, p - 1, p, p + 1, 3 * p, 3 * p + 5})
    for (uint64_t size : {uint64_t{0}, uint64_t{1}, p - 1, p, p + 1, 2 * p, 3 * p, 3 * p + 5}) {
      if (size <= capacity) {
        EXPECT_LE(SendPieces(size, capacity, p), RecvPieces(capacity, p)) << size << " " << capacity;
        // Other providers: one piece each way.
        EXPECT_EQ(SendPieces(size, capacity, kWholeMessage), 1u);
        EXPECT_EQ(RecvPieces(capacity, kWholeMessage), 1u);
      }
    }
}

}  // namespace
}  // namespace kizuna::fabric::ofi
