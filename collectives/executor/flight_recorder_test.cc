// The flight recorder alone: the last kCapacity operations kept in order, an End for a record
// overwritten since ignored, running and failed records in the JSON (text escaped).
#include "collectives/executor/flight_recorder.h"

#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>

namespace kizuna::collectives {
namespace {

CollectiveRequest Request(uint64_t count) {
  CollectiveRequest r;
  r.count = count;
  r.nranks = 4;
  return r;
}

TEST(FlightRecorder, KeepsTheLastOperationsInOrder) {
  FlightRecorder rec;
  std::vector<uint64_t> tickets;
  const size_t n = FlightRecorder::kCapacity + 10;
  for (size_t i = 0; i < n; ++i) {
    tickets.push_back(rec.Begin(i + 1, Request(i), Algorithm::kRing, 1, RunPath::kExecutor));
    if (i + 1 < n) rec.End(tickets.back(), Status::Ok());
  }
  rec.End(tickets[0], Timeout("late"));  // overwritten since: ignored
  const auto records = rec.Snapshot();
  ASSERT_EQ(records.size(), FlightRecorder::kCapacity);
  EXPECT_EQ(records.front().seq, 11u);
  EXPECT_EQ(records.back().seq, n);
  EXPECT_EQ(records.back().end_s, 0.0);  // still running
  for (size_t i = 0; i + 1 < records.size(); ++i) {
    EXPECT_TRUE(records[i].status.ok());
    EXPECT_GE(records[i].end_s, records[i].start_s);
  }
}

TEST(FlightRecorder, JsonSaysWhatRanAndHowItEnded) {
  FlightRecorder rec;
  rec.End(rec.Begin(1, Request(8), Algorithm::kRing, 1, RunPath::kCaller), Status::Ok());
  rec.End(rec.Begin(2, Request(9), Algorithm::kTree, 2, RunPath::kExecutor), Timeout("rank 3 \"never\" came"));
  rec.Begin(3, Request(10), Algorithm::kFused, 1, RunPath::kInline);
  const std::string json = rec.ToJson(5);
  EXPECT_NE(json.find("\"rank\":5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"call\":\"allreduce count=8 float32 sum nranks=4\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"path\":\"caller\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"members\":2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\":\"failed\",\"error\":\"timeout: rank 3 \\\"never\\\" came\""), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"seq\":3,\"call\":\"allreduce count=10 float32 sum nranks=4\",\"algorithm\":\"fused\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"state\":\"running\""), std::string::npos) << json;
}

// What it costs an operation: printed, not asserted (a benchmark is not a timed test).
TEST(FlightRecorder, CostPerOperation) {
  FlightRecorder rec;
  const CollectiveRequest req = Request(2);
  const int n = 200000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) rec.End(rec.Begin(i, req, Algorithm::kRing, 1, RunPath::kCaller), Status::Ok());
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
  std::printf("flight recorder: %.0f ns per operation (Begin + End)\n", ns);
  EXPECT_EQ(rec.Snapshot().size(), FlightRecorder::kCapacity);
}

}  // namespace
}  // namespace kizuna::collectives
