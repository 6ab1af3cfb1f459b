#include "runtime/host_reduce.h"

#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/half.h"

namespace kizuna {
namespace {

TEST(HostReduceTest, Float16AccumulatesInFloat32AndRoundsOnce) {
  // 2048 + 1 + 1 in float16 pairwise would be 2048 (each +1 ties to even); in float32 it is 2050.
  std::vector<uint16_t> a = {FloatToHalf(2048.f)}, b = {FloatToHalf(1.f)}, c = {FloatToHalf(1.f)}, out(1);
  const void* srcs[] = {a.data(), b.data(), c.data()};
  ASSERT_TRUE(HostReduce(out.data(), srcs, 1, DataType::kFloat16, ReduceOp::kSum).ok());
  EXPECT_EQ(HalfToFloat(out[0]), 2050.f);
}

TEST(HostReduceTest, IntegersWrapAndAverageTruncates) {
  std::vector<int8_t> a = {127, -128, -7, 5}, b = {1, -1, 0, 0}, out(4);
  const void* srcs[] = {a.data(), b.data()};
  ASSERT_TRUE(HostReduce(out.data(), srcs, 4, DataType::kInt8, ReduceOp::kSum).ok());
  EXPECT_EQ(out, (std::vector<int8_t>{-128, 127, -7, 5}));
  ASSERT_TRUE(HostReduce(out.data(), srcs, 4, DataType::kInt8, ReduceOp::kAvg).ok());
  EXPECT_EQ(out, (std::vector<int8_t>{-64, 63, -3, 2}));  // wrapped sum / 2, toward zero
  std::vector<int32_t> x = {-5, 7}, y = {3, -9}, o(2);
  const void* s2[] = {x.data(), y.data()};
  ASSERT_TRUE(HostReduce(o.data(), s2, 2, DataType::kInt32, ReduceOp::kMin).ok());
  EXPECT_EQ(o, (std::vector<int32_t>{-5, -9}));
  ASSERT_TRUE(HostReduce(o.data(), s2, 2, DataType::kInt32, ReduceOp::kMax).ok());
  EXPECT_EQ(o, (std::vector<int32_t>{3, 7}));
  std::vector<int64_t> big = {INT64_MAX}, two = {2}, p(1);
  const void* s3[] = {big.data(), two.data()};
  ASSERT_TRUE(HostReduce(p.data(), s3, 1, DataType::kInt64, ReduceOp::kProd).ok());
  EXPECT_EQ(p[0], -2);  // wraps modulo 2^64
}

TEST(HostReduceTest, InPlaceAndSingleInput) {
  std::vector<float> a(1000), b(1000);
  std::iota(a.begin(), a.end(), 0.f);
  std::iota(b.begin(), b.end(), 1.f);
  const void* srcs[] = {a.data(), b.data()};
  ASSERT_TRUE(HostReduce(a.data(), srcs, a.size(), DataType::kFloat32, ReduceOp::kSum).ok());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], 2.f * i + 1) << i;
  std::vector<float> out(1000);
  const void* one[] = {b.data()};
  ASSERT_TRUE(HostReduce(out.data(), one, out.size(), DataType::kFloat32, ReduceOp::kAvg).ok());
  EXPECT_EQ(out, b);
}

TEST(HostReduceTest, ParallelPathMatchesSerial) {
  const size_t n = (size_t{1} << 21) + 3;  // big enough for the multi-threaded split, not a block multiple
  std::vector<double> a(n), b(n), c(n), par(n), ser(n);
  for (size_t i = 0; i < n; ++i) a[i] = i * 0.5, b[i] = -double(i % 97), c[i] = 3.0;
  const void* srcs[] = {a.data(), b.data(), c.data()};
  ASSERT_TRUE(HostReduce(par.data(), srcs, n, DataType::kFloat64, ReduceOp::kSum).ok());
  HostReduceRange(ser.data(), srcs, 0, n, DataType::kFloat64, ReduceOp::kSum);
  EXPECT_EQ(par, ser);
  EXPECT_EQ(par[n - 1], (n - 1) * 0.5 - double((n - 1) % 97) + 3.0);
}

TEST(HostReduceTest, RejectsBadArguments) {
  float a[4] = {}, out[4] = {};
  const void* srcs[] = {a};
  EXPECT_EQ(HostReduce(out, {}, 4, DataType::kFloat32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HostReduce(nullptr, srcs, 4, DataType::kFloat32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HostReduce(out, srcs, 4, static_cast<DataType>(42), ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(HostReduce(out, srcs, 4, DataType::kFloat32, static_cast<ReduceOp>(9)).code(),
            StatusCode::kInvalidArgument);
  const void* shifted[] = {a + 1};
  EXPECT_EQ(HostReduce(a, shifted, 3, DataType::kFloat32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(HostReduce(out, srcs, 0, DataType::kFloat32, ReduceOp::kSum).ok());
}

TEST(HostCopyTest, LargeAndOverlapping) {
  std::vector<uint8_t> src(3 << 20), dst(3 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  HostCopy(dst.data(), src.data(), src.size());
  EXPECT_EQ(src, dst);
  HostCopy(dst.data() + 1, dst.data(), dst.size() - 1);  // overlapping: memmove semantics
  EXPECT_EQ(dst[1], src[0]);
  EXPECT_EQ(dst.back(), src[src.size() - 2]);
}

}  // namespace
}  // namespace kizuna
