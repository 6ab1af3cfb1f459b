// The libfabric loader: missing and wrong libraries are "unavailable" with the reason (never a
// crash), the fabric factory passes that on, and libfabric's error codes become kizuna codes once.

#include <rdma/fi_errno.h>

#include <cstdlib>
#include <utility>

#include <gtest/gtest.h>

#include "fabric/ofi/fabric.h"
#include "fabric/ofi/loader.h"
#include "fabric/ofi/test_util.h"
#include "fabric/registry.h"

namespace kizuna::fabric::ofi {
namespace {

TEST(OfiLoader, AMissingLibraryIsUnavailableWithTheReason) {
  auto lib = LibFabric::Open("/nonexistent/libfabric.so.1");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable) << lib.status().ToString();
  EXPECT_NE(lib.status().message().find("/nonexistent/libfabric.so.1"), std::string::npos) << lib.status().message();
  EXPECT_NE(lib.status().message().find("dlopen"), std::string::npos) << lib.status().message();
}

TEST(OfiLoader, ALibraryThatIsNotLibfabricIsUnavailable) {
  auto lib = LibFabric::Open("libm.so.6");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(lib.status().message().find("fi_getinfo"), std::string::npos)
      << "names the missing symbols: " << lib.status().message();
}

TEST(OfiLoader, TheFactoryReportsAMissingLibraryAsUnavailable) {
  Config config = testing::ConfigFor("tcp;ofi_rxm");
  auto fabric = OfiFabric::CreateWith(config, testing::Rank(0), LibFabric::Open("/nonexistent/libfabric.so.1"));
  ASSERT_FALSE(fabric.ok());
  EXPECT_EQ(fabric.status().code(), StatusCode::kUnavailable) << fabric.status().ToString();
}

TEST(OfiLoader, AnUnknownProviderIsUnavailableNamingWhatIsOffered) {
  auto lib = LibFabric::Default();
  if (!lib.ok()) GTEST_SKIP() << lib.status().message();
  Config config = testing::ConfigFor("no-such-provider");
  auto fabric = OfiFabric::CreateWith(config, testing::Rank(0), lib);
  ASSERT_FALSE(fabric.ok());
  EXPECT_EQ(fabric.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(fabric.status().message().find("no-such-provider"), std::string::npos) << fabric.status().message();
  EXPECT_NE(fabric.status().message().find("offers"), std::string::npos) << fabric.status().message();
}

TEST(OfiLoader, TheDefaultLibraryLoadsOnceAndIsRecentEnough) {
  auto a = LibFabric::Default();
  if (!a.ok()) GTEST_SKIP() << "no libfabric here: " << a.status().message();
  auto b = LibFabric::Default();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_GE((*a)->runtime_version(), kApiVersion);
  EXPECT_FALSE((*a)->VersionString().empty());
}

// The provider defaults loader.cc sets before libfabric reads its parameters (the test runs
// without FI_OFI_RXM_* in its environment, so kizuna's values apply).
TEST(OfiLoader, LoadingSetsTheRxmDefaults) {
  auto lib = LibFabric::Default();
  if (!lib.ok()) GTEST_SKIP() << "no libfabric here: " << lib.status().message();
  for (const auto& [name, value] : {std::pair<const char*, const char*>{"FI_OFI_RXM_USE_RNDV_WRITE", "1"},
                                    {"FI_OFI_RXM_MSG_RX_SIZE", "16"},
                                    {"FI_OFI_RXM_EAGER_LIMIT", "2097152"}}) {
    const char* set = std::getenv(name);
    ASSERT_NE(set, nullptr) << name;
    EXPECT_STREQ(set, value) << name;
  }
}

TEST(OfiLoader, ErrorsAreConvertedOnceWithTextFileAndLine) {
  auto lib = LibFabric::Default();
  if (!lib.ok()) GTEST_SKIP() << lib.status().message();
  const Status s = (*lib)->Error(-FI_ECONNREFUSED, "fi_tsend");
  EXPECT_EQ(s.code(), StatusCode::kRemoteError);
  EXPECT_NE(s.message().find("fi_tsend"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("refused"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("loader_test.cc:"), std::string::npos) << "where it was received: " << s.message();
  EXPECT_EQ((*lib)->Error(-FI_ETRUNC, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*lib)->Error(-FI_ENOMEM, "x").code(), StatusCode::kOutOfMemory);
}

TEST(OfiLoader, ErrorCodesMapToKizunaCodes) {
  EXPECT_EQ(ErrorCode(FI_ECONNRESET), StatusCode::kRemoteError);
  EXPECT_EQ(ErrorCode(FI_ENOTCONN), StatusCode::kRemoteError);
  EXPECT_EQ(ErrorCode(FI_EINVAL), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode(FI_ETRUNC), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode(FI_ENOSYS), StatusCode::kNotSupported);
  EXPECT_EQ(ErrorCode(FI_ENODATA), StatusCode::kNotSupported);
  EXPECT_EQ(ErrorCode(FI_ETIMEDOUT), StatusCode::kTimeout);
  EXPECT_EQ(ErrorCode(FI_ECANCELED), StatusCode::kAborted);
  EXPECT_EQ(ErrorCode(FI_EOTHER), StatusCode::kInternal);
  EXPECT_TRUE(IsConnectionError(FI_ECONNREFUSED));
  EXPECT_FALSE(IsConnectionError(FI_EAGAIN));
}

TEST(OfiLoader, TheFabricIsRegistered) {
  bool found = false;
  for (const FabricRegistration& r : RegisteredFabrics()) found = found || r.name == kFabricName;
  EXPECT_TRUE(found) << "KZ_REGISTER_FABRIC(ofi, ...) must be linked in (alwayslink)";
}

}  // namespace
}  // namespace kizuna::fabric::ofi
