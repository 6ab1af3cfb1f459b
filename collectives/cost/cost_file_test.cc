// KIZUNA_COST_FILE's format: constants and link costs, sections by rank count, the section a
// communicator takes, and every malformed line refused naming it.
#include "collectives/cost/cost_file.h"

#include <gtest/gtest.h>

namespace kizuna::collectives {
namespace {

constexpr std::string_view kFile = R"(# measured by kizuna-tune
oversubscribed_wake_us = 12   # every size
[ranks=2]
oneshot_us = 0.7
link.directconnect.latency_us = 3.5
[ranks=8]
oneshot_us = 9
link.directconnect.gbps = 1.25
)";

TEST(CostFile, SectionsApplyByRankCount) {
  auto file = ParseCostFile(kFile, "cost.txt");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const AppliedCosts two = CostsFor(*file, 2);
  EXPECT_EQ(two.constants.oversubscribed_wake_us, 12);
  EXPECT_EQ(two.constants.oneshot_us, 0.7);
  EXPECT_EQ(two.links.at("directconnect").latency_us, 3.5);
  EXPECT_EQ(two.links.at("directconnect").gbps, 0);
  EXPECT_EQ(two.source, "cost.txt, [ranks=2]");
  // 4 is as far from 2 as from 8 (by ratio): the smaller wins. 6 is nearer 8.
  EXPECT_EQ(CostsFor(*file, 4).constants.oneshot_us, 0.7);
  EXPECT_EQ(CostsFor(*file, 6).constants.oneshot_us, 9);
  EXPECT_EQ(CostsFor(*file, 64).links.at("directconnect").gbps, 1.25);
  // What is not in the file keeps its default.
  EXPECT_EQ(two.constants.host_memory_gbps, CostConstants{}.host_memory_gbps);
  EXPECT_NE(two.Digest(), CostsFor(*file, 8).Digest());
  EXPECT_EQ(CostsFor(CostFile{}, 4).source, "defaults");
  EXPECT_EQ(CostsFor(CostFile{}, 4).Digest(), AppliedCosts{}.Digest());
}

TEST(CostFile, FormatReadsBack) {
  auto file = ParseCostFile(kFile);
  ASSERT_TRUE(file.ok());
  const std::string text = FormatCostFile(*file, {"a header line"});
  EXPECT_EQ(text.rfind("# a header line\n", 0), 0u) << text;
  auto again = ParseCostFile(text);
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
  for (int n : {1, 2, 4, 8, 100}) EXPECT_EQ(CostsFor(*again, n).Digest(), CostsFor(*file, n).Digest()) << n;
}

TEST(CostFile, MalformedLinesAreNamed) {
  const std::pair<std::string_view, std::string_view> bad[] = {
      {"nonsense = 1", "line 1: unknown name 'nonsense'"},
      {"\noneshot_us 3", "line 2: 'oneshot_us 3' is not name = value"},
      {"oneshot_us = -1", "'-1' is not a finite, non-negative number"},
      {"oneshot_us = abc", "'abc' is not a finite, non-negative number"},
      {"host_memory_gbps = 0", "'0' is not a positive number"},
      {"link.tcp.gbps = 0", "'0' is not a positive number"},
      {"link.tcp.speed = 3", "a link's entries are latency_us and gbps"},
      {"[ranks=0]", "is not a section header"},
      {"[rank=4]", "is not a section header"},
      {"[ranks=4]\n[ranks=4]", "[ranks=4] appears twice"},
  };
  for (const auto& [text, want] : bad) {
    auto f = ParseCostFile(text, "f.txt");
    ASSERT_FALSE(f.ok()) << text;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(want), std::string::npos) << f.status().ToString();
    EXPECT_NE(f.status().message().find("f.txt"), std::string::npos) << f.status().ToString();
  }
  EXPECT_FALSE(LoadCostFile("/nonexistent/cost.txt").ok());
}

}  // namespace
}  // namespace kizuna::collectives
