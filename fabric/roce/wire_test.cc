// The handle and remote-key wire forms: round trips and malformed input.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "fabric/roce/endpoint.h"
#include "fabric/roce/transfer.h"

namespace kizuna::fabric::roce {
namespace {

HandleInfo SampleHandle(bool ipv6) {
  HandleInfo h;
  h.ipv6 = ipv6;
  if (ipv6) {
    ::inet_pton(AF_INET6, "fd00::17", h.address);
    h.scope_id = 3;
  } else {
    ::inet_pton(AF_INET, "10.1.2.3", h.address);
  }
  h.port = 40123;
  for (size_t i = 0; i < kSecretBytes; ++i) h.secret[i] = static_cast<uint8_t>(0xa0 + i);
  h.rank = 5;
  ::inet_pton(AF_INET6, "::ffff:10.1.2.3", h.gid.data());
  return h;
}

TEST(RoceHandle, RoundTripsBothFamilies) {
  for (bool ipv6 : {false, true}) {
    const HandleInfo in = SampleHandle(ipv6);
    const Handle h = EncodeHandle(in);
    EXPECT_LE(h.size, kHandleMaxBytes);
    auto out = ParseHandle(h);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(out->ipv6, ipv6);
    EXPECT_EQ(std::memcmp(out->address, in.address, 16), 0);
    EXPECT_EQ(out->port, in.port);
    EXPECT_EQ(out->scope_id, in.scope_id);
    EXPECT_EQ(std::memcmp(out->secret, in.secret, kSecretBytes), 0);
    EXPECT_EQ(out->rank, 5);
    EXPECT_EQ(out->gid, in.gid);
    // Through hex, as handles travel on text channels.
    auto hex = Handle::FromHex(h.ToHex());
    ASSERT_TRUE(hex.ok());
    EXPECT_TRUE(ParseHandle(*hex).ok());
  }
}

TEST(RoceHandle, MalformedHandlesAreInvalidArguments) {
  const Handle good = EncodeHandle(SampleHandle(false));
  Handle truncated = good;
  truncated.size -= 1;
  Handle bad_magic = good;
  bad_magic.data[0] ^= 0xff;
  Handle bad_version = good;
  bad_version.data[4] ^= 0x7f;
  Handle empty;
  Handle garbage;
  garbage.size = good.size;
  garbage.data.fill(0x5a);
  for (const Handle* h : {&truncated, &bad_magic, &bad_version, &empty, &garbage}) {
    auto r = ParseHandle(*h);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  }
  HandleInfo zero_port = SampleHandle(false);
  zero_port.port = 0;
  EXPECT_FALSE(ParseHandle(EncodeHandle(zero_port)).ok());
}

TEST(RoceRemoteKey, RoundTripsAndRejectsGarbage) {
  const KeyInfo in{0x1122334455667788ull, 0x7f0012345000ull, 1u << 20, 0xabcd};
  const RemoteKey k = EncodeKey(in);
  EXPECT_LE(k.size, RemoteKey::kMax);
  auto out = ParseKey(k);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->nonce, in.nonce);
  EXPECT_EQ(out->addr, in.addr);
  EXPECT_EQ(out->size, in.size);
  EXPECT_EQ(out->rkey, in.rkey);

  RemoteKey flipped = k;
  flipped.data[20] ^= 1;  // inside the address: the checksum no longer matches
  EXPECT_EQ(ParseKey(flipped).status().code(), StatusCode::kInvalidArgument);
  RemoteKey shorter = k;
  shorter.size = 8;
  EXPECT_EQ(ParseKey(shorter).status().code(), StatusCode::kInvalidArgument);
  RemoteKey zeros;
  zeros.size = k.size;
  EXPECT_EQ(ParseKey(zeros).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kizuna::fabric::roce
