// UniqueId: printable round trips (IPv4, IPv6, host names), malformed inputs with clear errors
// that never echo the secret, fresh secrets, reserved root sockets, and where GetUniqueId puts the
// root (KIZUNA_ROOT, MASTER_ADDR:MASTER_PORT+1, or a local address).
#include "runtime/bootstrap/unique_id.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <string>

#include <gtest/gtest.h>

#include "runtime/bootstrap/test_util.h"

namespace kizuna::bootstrap {
namespace {

using testing::Contains;

constexpr const char* kHex = "0123456789abcdef0123456789abcdef";

UniqueId Make(std::string host, uint16_t port) {
  UniqueId id;
  id.root = HostPort{std::move(host), port};
  for (size_t i = 0; i < id.secret.size(); ++i) id.secret[i] = static_cast<uint8_t>(i * 17 + 1);
  return id;
}

TEST(UniqueId, PrintsTheDocumentedForm) {
  UniqueId id;
  id.root = HostPort{"127.0.0.1", 29501};
  auto parsed = UniqueId::Parse(std::string("kz1:127.0.0.1:29501:") + kHex);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->root, id.root);
  EXPECT_EQ(parsed->secret[0], 0x01);
  EXPECT_EQ(parsed->secret[15], 0xef);
  EXPECT_EQ(parsed->ToString(), std::string("kz1:127.0.0.1:29501:") + kHex);
  EXPECT_EQ(parsed->Redacted(), "kz1:127.0.0.1:29501:****");
}

TEST(UniqueId, RoundTrips) {
  for (const auto& [host, port] : std::vector<std::pair<std::string, uint16_t>>{
           {"127.0.0.1", 1}, {"10.1.2.3", 65535}, {"::1", 29501}, {"fd00::2", 80}, {"2001:db8::8a2e:370:7334", 443},
           {"node-17", 29501}, {"node-17.cluster.example", 1234}, {"localhost", 5}, {"a_b", 7}}) {
    UniqueId id = Make(host, port);
    std::string text = id.ToString();
    auto back = UniqueId::Parse(text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.status().ToString();
    EXPECT_EQ(*back, id) << text;
    if (host.find(':') != std::string::npos) {
      EXPECT_TRUE(Contains(text, "[" + host + "]")) << text;
    }
  }
}

TEST(UniqueId, ParseAcceptsSurroundingWhitespaceAndUpperCaseHex) {
  auto id = UniqueId::Parse(std::string("  kz1:[::1]:9:") + "0123456789ABCDEF0123456789ABCDEF" + "\n");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(id->root.host, "::1");
  EXPECT_EQ(id->root.port, 9);
  EXPECT_EQ(id->secret[1], 0x23);
}

TEST(UniqueId, MalformedInputsSayWhatIsWrong) {
  const std::string hex = kHex;
  struct Case {
    std::string text;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "not a kizuna unique id"},
           {"hello", "not a kizuna unique id"},
           {"kz2:127.0.0.1:1:" + hex, "version 'kz2' is not supported"},
           {"kz1:127.0.0.1", "expected host:port"},
           {"kz1:127.0.0.1:29501", "expected ':' and the secret"},
           {"kz1::29501:" + hex, "the host is empty"},
           {"kz1:::1:29501:" + hex, "IPv6 address in brackets"},
           {"kz1:[::1:29501:" + hex, "without a closing ']'"},
           {"kz1:[node1]:29501:" + hex, "not an IPv6 address"},
           {"kz1:[::1]29501:" + hex, "expected ':' and a port after ']'"},
           {"kz1:300.1.1.1:29501:" + hex, "not a valid IPv4 address"},
           {"kz1:bad host:29501:" + hex, "contains 'space'"},
           {"kz1:a..b:29501:" + hex, "empty label"},
           {"kz1:-a:29501:" + hex, "starts with '-'"},
           {"kz1:" + std::string(64, 'a') + ":1:" + hex, "exceeds 63 characters"},
           {"kz1:127.0.0.1:0:" + hex, "port '0' is not a number in 1..65535"},
           {"kz1:127.0.0.1:65536:" + hex, "port '65536'"},
           {"kz1:127.0.0.1:http:" + hex, "port 'http'"},
           {"kz1:127.0.0.1::" + hex, "port ''"},
           {"kz1:127.0.0.1:1:" + hex.substr(1), "32 hex digits, got 31"},
           {"kz1:127.0.0.1:1:" + hex + "0", "32 hex digits, got 33"},
           {"kz1:127.0.0.1:1:" + hex.substr(0, 31) + "g", "non-hex character at position 32"},
           {"kz1:127.0.0.1:1:" + hex + " extra", "hex digits"},
           // The secret where the port or an IPv6 address belongs: named by its length, not quoted.
           {"kz1:127.0.0.1:" + hex + ":29501", "port of 32 characters is not a number"},
           {"kz1:[" + hex + "]:29501:" + hex, "not an IPv6 address"},
       }) {
    auto r = UniqueId::Parse(c.text);
    ASSERT_FALSE(r.ok()) << "accepted: " << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_TRUE(Contains(r.status().message(), c.says)) << c.text << " -> " << r.status().message();
    EXPECT_FALSE(Contains(r.status().message(), hex.substr(0, 16))) << "the error repeats the secret: " << r.status().message();
  }
}

// inet_pton reads a C string: "127.0.0.1\0junk" passed as 127.0.0.1, and the id carried the NUL and
// the junk into every rank's connect.
TEST(UniqueId, AHostWithANulByteIsRefused) {
  const std::string hex = kHex;
  for (const std::string& host : {std::string("127.0.0.1\0junk", 14), std::string("::1\0x", 5)}) {
    const std::string text = "kz1:" + (host[0] == ':' ? "[" + host + "]" : host) + ":29501:" + hex;
    auto r = UniqueId::Parse(text);
    ASSERT_FALSE(r.ok()) << "accepted a host with a NUL byte";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().find('\0'), std::string::npos) << "the message carries the NUL";
    EXPECT_TRUE(Contains(r.status().message(), "\\x00")) << r.status().message();
  }
  EXPECT_FALSE(ParseHostPort(std::string("10.0.0.1\0:80", 12), "KIZUNA_ROOT").ok());
  EXPECT_FALSE(ValidateHost(std::string("10.0.0.1\0", 9), "host").ok());
}

// Messages go to logs: what they quote of the text is cut and its control bytes escaped, and a
// version is quoted only when it is as short as one (without its ':', a whole id, secret included,
// would be the "version").
TEST(UniqueId, MessagesQuoteTheTextCutAndEscaped) {
  const std::string hex = kHex;
  auto r = UniqueId::Parse("kz1:bad\x1b[2Jhost:29501:" + hex);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "host name 'bad\\x1b[2Jhost' contains '\\x1b'")) << r.status().message();
  const std::string long_host = std::string(300, '1') + ".2";
  r = UniqueId::Parse("kz1:" + long_host + ":29501:" + hex);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 200u) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "...(302 bytes)")) << r.status().message();
  r = UniqueId::Parse("kz2" + hex);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(Contains(r.status().message(), hex.substr(0, 16))) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "version of 35 characters is not supported")) << r.status().message();
}

TEST(HostPort, ParseAndPrint) {
  auto a = ParseHostPort("10.0.0.1:29501", "KIZUNA_ROOT");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 29501);
  EXPECT_EQ(a->ToString(), "10.0.0.1:29501");
  auto b = ParseHostPort("[fd00::2]:7", "KIZUNA_ROOT");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "fd00::2");
  EXPECT_EQ(b->ToString(), "[fd00::2]:7");
  auto c = ParseHostPort("node1:80", "x");
  ASSERT_TRUE(c.ok());
  for (const char* bad : {"node1", "node1:", "node1:0", "fd00::2:7", ":80", "[fd00::2]", "a b:1"}) {
    auto r = ParseHostPort(bad, "KIZUNA_ROOT");
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(r.status().message(), "KIZUNA_ROOT")) << r.status().message();
  }
}

TEST(HostPort, Loopback) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("::ffff:127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("LocalHost"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("fd00::2"));
  EXPECT_FALSE(IsLoopbackHost("node1"));
}

TEST(UniqueId, FreshSecretsAndAReservedPort) {
  auto a = CreateUniqueId(HostPort{"127.0.0.1", 0});
  auto b = CreateUniqueId(HostPort{"127.0.0.1", 0});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->secret, b->secret);
  EXPECT_NE(a->root.port, 0);
  EXPECT_NE(a->root.port, b->root.port);
  // The port stays taken until the root adopts the socket.
  HostPort same{"127.0.0.1", a->root.port};
  EXPECT_EQ(CreateUniqueId(same).status().code(), StatusCode::kUnavailable);
  UniqueFd reserved = internal::TakeReservedListener(a->root.port);
  EXPECT_TRUE(reserved.valid());
  EXPECT_FALSE(internal::TakeReservedListener(a->root.port).valid()) << "taken twice";
  internal::TakeReservedListener(b->root.port).Reset();
  EXPECT_EQ(CreateUniqueId(HostPort{"not valid", 0}).status().code(), StatusCode::kInvalidArgument);
}

TEST(GetUniqueId, RootFromKizunaRoot) {
  uint16_t port = testing::FreePort();
  ASSERT_NE(port, 0);
  Config c;
  c.root = "127.0.0.1:" + std::to_string(port);
  auto id = GetUniqueId(c, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1"}});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(id->root, (HostPort{"127.0.0.1", port}));
  internal::TakeReservedListener(port).Reset();
}

TEST(GetUniqueId, RootNextToTorchrunsStore) {
  uint16_t port = testing::FreePort();
  ASSERT_NE(port, 0);
  // MASTER_PORT is where torchrun's store listens; the root takes the next port.
  auto id = GetUniqueId(Config(), {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port - 1)}});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(id->root, (HostPort{"127.0.0.1", port}));
  internal::TakeReservedListener(port).Reset();
}

TEST(GetUniqueId, LocalAddressWithoutConfiguration) {
  auto id = GetUniqueId(Config(), {});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_NE(id->root.port, 0);
  EXPECT_TRUE(ValidateHost(id->root.host, "x").ok());
  internal::TakeReservedListener(id->root.port).Reset();
}

TEST(GetUniqueId, BadConfigurationIsAnError) {
  Config c;
  c.root = "nonsense";
  EXPECT_EQ(GetUniqueId(c, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(GetUniqueId(Config(), {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "65535"}}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kizuna::bootstrap
