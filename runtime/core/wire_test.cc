#include "runtime/core/wire.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace kizuna::wire {
namespace {

TEST(Wire, RoundTripsEveryKindInOrder) {
  Bytes out;
  PutU8(out, 0xab);
  PutU16(out, 0xbeef);
  PutU32(out, 0xdeadbeef);
  PutU64(out, 0x0123456789abcdefull);
  PutI32(out, -7);
  PutF64(out, -2.5);
  PutF64(out, std::numeric_limits<double>::infinity());
  PutString(out, "kizuna");
  const uint8_t raw[3] = {1, 2, 3};
  PutBytes(out, raw);
  Reader r(out);
  EXPECT_EQ(r.U8(), 0xab);
  EXPECT_EQ(r.U16(), 0xbeef);
  EXPECT_EQ(r.U32(), 0xdeadbeefu);
  EXPECT_EQ(r.U64(), 0x0123456789abcdefull);
  EXPECT_EQ(r.I32(), -7);
  EXPECT_EQ(r.F64(), -2.5);
  EXPECT_TRUE(std::isinf(r.F64()));
  EXPECT_EQ(r.String(), "kizuna");
  const std::span<const uint8_t> b = r.Bytes();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[2], 3);
  EXPECT_TRUE(r.AtEnd());
}

TEST(Wire, LittleEndianOnTheWire) {
  Bytes out;
  PutU32(out, 0x04030201);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[3], 4);
}

TEST(Wire, ShortInputTurnsNotOkAndStays) {
  Bytes out;
  PutU16(out, 5);
  Reader r(out);
  EXPECT_EQ(r.U32(), 0u);  // only 2 bytes there
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.U8(), 0);  // a byte is there, but the reader failed already
  EXPECT_FALSE(r.AtEnd());
}

TEST(Wire, LengthBeyondTheInputOrTheLimitIsMalformed) {
  Bytes out;
  PutU32(out, 1000);  // a string length with 3 bytes behind it
  out.insert(out.end(), {'a', 'b', 'c'});
  Reader r(out);
  EXPECT_EQ(r.String(), "");
  EXPECT_FALSE(r.ok());

  Bytes small;
  PutString(small, "toolong");
  Reader limited(small);
  EXPECT_EQ(limited.String(3), "");
  EXPECT_FALSE(limited.ok());
}

TEST(Wire, TrailingBytesAreNotAtEnd) {
  Bytes out;
  PutU8(out, 1);
  PutU8(out, 2);
  Reader r(out);
  EXPECT_EQ(r.U8(), 1);
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(r.AtEnd());
  EXPECT_EQ(r.left(), 1u);
}

}  // namespace
}  // namespace kizuna::wire
