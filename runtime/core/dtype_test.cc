#include "runtime/core/dtype.h"

#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "runtime/core/half.h"

namespace kizuna {
namespace {

TEST(DataTypeTest, NamesSizesAndParsing) {
  EXPECT_EQ(AllDataTypes().size(), 10u);
  EXPECT_EQ(AllReduceOps().size(), 5u);
  size_t expected_sizes[] = {2, 2, 4, 8, 1, 1, 4, 4, 8, 8};
  for (DataType t : AllDataTypes()) {
    EXPECT_EQ(DataTypeSize(t), expected_sizes[static_cast<int>(t)]);
    EXPECT_EQ(ParseDataType(DataTypeName(t)), t);
  }
  for (ReduceOp op : AllReduceOps()) EXPECT_EQ(ParseReduceOp(ReduceOpName(op)), op);
  EXPECT_EQ(ParseDataType("half"), DataType::kFloat16);
  EXPECT_EQ(ParseDataType("BF16"), DataType::kBfloat16);
  EXPECT_EQ(ParseDataType("double"), DataType::kFloat64);
  EXPECT_FALSE(ParseDataType("float128").has_value());
  EXPECT_FALSE(ParseReduceOp("xor").has_value());
  EXPECT_FALSE(IsValid(static_cast<DataType>(10)));
  EXPECT_EQ(DataTypeSize(static_cast<DataType>(200)), 0u);
  EXPECT_EQ(DataTypeName(static_cast<DataType>(200)), "invalid");
  EXPECT_TRUE(IsFloatingPoint(DataType::kBfloat16));
  EXPECT_FALSE(IsFloatingPoint(DataType::kUint64));
}

// Reference decoding of binary16 from its definition.
double HalfReference(uint16_t h) {
  int sign = (h >> 15) ? -1 : 1;
  int exp = (h >> 10) & 0x1f;
  int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

TEST(HalfTest, DecodesEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    double ref = HalfReference(static_cast<uint16_t>(h));
    float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), ref) << "half bits 0x" << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(HalfTest, RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "half bits 0x" << std::hex << h;
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  // Between each pair of adjacent finite positive halves: the midpoint goes to the even one, and
  // anything nearer to one side goes to that side.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    double lo = HalfReference(static_cast<uint16_t>(h)), hi = HalfReference(static_cast<uint16_t>(h + 1));
    double mid = (lo + hi) / 2;  // exact in float: 12 significant bits
    uint16_t even = (h % 2 == 0) ? static_cast<uint16_t>(h) : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(FloatToHalf(static_cast<float>(mid)), even) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(static_cast<float>(mid), 0.f)), h) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(static_cast<float>(mid), INFINITY)), h + 1) << h;
    ASSERT_EQ(FloatToHalf(static_cast<float>(-mid)), even | 0x8000) << h;
  }
  EXPECT_EQ(FloatToHalf(65504.f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.f), 0x7c00);  // ties to even: 0x7bff is odd, so to infinity
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-INFINITY), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.f, -25)), 0);       // half of the smallest subnormal: to even (0)
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 1);      // above half: up
  EXPECT_EQ(FloatToHalf(1e-30f), 0);
  EXPECT_EQ(FloatToHalf(-0.f), 0x8000);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(Bfloat16Test, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = Bfloat16ToFloat(static_cast<uint16_t>(b));
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16(f))));
      continue;
    }
    ASSERT_EQ(FloatToBfloat16(f), b) << b;
  }
  // 1 + 2^-8 is exactly between 1 (even mantissa) and 1 + 2^-7: to 1.
  EXPECT_EQ(FloatToBfloat16(1.f + std::ldexp(1.f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(FloatToBfloat16(1.f + 3 * std::ldexp(1.f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBfloat16(1.f + std::ldexp(1.f, -8) + std::ldexp(1.f, -20)), 0x3f81);
  EXPECT_EQ(FloatToBfloat16(3.4e38f), 0x7f80);  // rounds past the largest finite: infinity
}

}  // namespace
}  // namespace kizuna
