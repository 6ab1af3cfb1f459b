#include "runtime/core/status.h"

#include <cerrno>
#include <memory>

#include <gtest/gtest.h>

namespace kizuna {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  KZ_ASSIGN_OR_RETURN(int h, Half(x));
  KZ_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status Check(bool fail) {
  KZ_RETURN_IF_ERROR(fail ? Timeout("slow") : Status::Ok());
  return Internal("reached the end");
}

TEST(StatusTest, CodesAndMessages) {
  EXPECT_TRUE(Status().ok());
  EXPECT_EQ(Status().ToString(), "ok");
  Status s = InvalidArgument("count is negative");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "invalid argument: count is negative");
  EXPECT_EQ(s.WithContext("AllReduce").ToString(), "invalid argument: AllReduce: count is negative");
  EXPECT_TRUE(Status().WithContext("x").ok());
  for (StatusCode c : {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kUnavailable,
                       StatusCode::kNotSupported, StatusCode::kOutOfMemory, StatusCode::kTimeout,
                       StatusCode::kAborted, StatusCode::kRemoteError, StatusCode::kInternal}) {
    EXPECT_NE(StatusCodeName(c), "unknown status code");
  }
  EXPECT_EQ(Status(StatusCode::kOk, "dropped").message(), "");
}

TEST(StatusTest, ResultCarriesValueOrStatus) {
  Result<int> ok = Quarter(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 2);
  Result<int> bad = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  Result<std::unique_ptr<int>> moved = std::make_unique<int>(7);
  std::unique_ptr<int> p = std::move(moved).value();
  EXPECT_EQ(*p, 7);
  Result<int> from_ok_status = Status::Ok();
  EXPECT_EQ(from_ok_status.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ReturnIfError) {
  EXPECT_EQ(Check(true).code(), StatusCode::kTimeout);
  EXPECT_EQ(Check(false).code(), StatusCode::kInternal);
}

TEST(StatusDeathTest, ValueOfFailedResultAbortsWithTheStatus) {
  Result<int> bad = Timeout("waited too long");
  EXPECT_DEATH((void)bad.value(), "timeout: waited too long");
}

TEST(StatusTest, ForeignCodesNameCallAndLocation) {
  Status s = FromErrno(ENOMEM, "mmap");
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(s.message().find("mmap failed"), std::string::npos);
  EXPECT_NE(s.message().find("runtime/core/status_test.cc:"), std::string::npos) << s.message();
  EXPECT_EQ(FromErrno(ETIMEDOUT, "x").code(), StatusCode::kTimeout);
  EXPECT_EQ(FromErrno(EINVAL, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FromErrno(ENODEV, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(FromErrno(ECONNRESET, "x").code(), StatusCode::kRemoteError);
  EXPECT_EQ(FromErrno(EPERM, "x").code(), StatusCode::kInternal);
  Status f = FromForeign(StatusCode::kUnavailable, "cuda", "cuInit", 100, "CUDA_ERROR_NO_DEVICE");
  EXPECT_EQ(f.code(), StatusCode::kUnavailable);
  EXPECT_NE(f.message().find("cuInit failed: cuda error 100 (CUDA_ERROR_NO_DEVICE)"), std::string::npos)
      << f.message();
}

TEST(ShownTextTest, PrintableAsIsTheRestEscapedAndLongTextCut) {
  EXPECT_EQ(ShownText("abc"), "abc");
  EXPECT_EQ(ShownText(std::string_view("a\0b\n\\", 5)), "a\\x00b\\x0a\\x5c");
  EXPECT_EQ(ShownText(std::string(100, 'x')), std::string(64, 'x') + "...(100 bytes)");
}

// Running out of descriptors names the limit and what to do; a full system table says so too.
TEST(StatusTest, OutOfDescriptorsNamesTheLimit) {
  const std::string emfile = FromErrno(EMFILE, "accept").message();
  EXPECT_NE(emfile.find("ulimit -n"), std::string::npos) << emfile;
  EXPECT_NE(emfile.find("this process may hold"), std::string::npos) << emfile;
  const std::string enfile = FromErrno(ENFILE, "socket").message();
  EXPECT_NE(enfile.find("file-max"), std::string::npos) << enfile;
  EXPECT_EQ(FromErrno(EPIPE, "send").message().find("ulimit"), std::string::npos);
}

}  // namespace
}  // namespace kizuna
