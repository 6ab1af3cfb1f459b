// In-process specifics: timeouts name the missing ranks, a rank that leaves (its Bootstrap
// destroyed) is named, and what it sent before leaving still arrives. The shared contract is in
// bootstrap_test.cc.
#include "runtime/bootstrap/in_process.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/bootstrap/test_util.h"

namespace kizuna::bootstrap {
namespace {

using testing::Contains;
using testing::In;
using testing::OnThreads;
using testing::Pattern;

TEST(InProcessBootstrap, RejectsBadCounts) {
  EXPECT_EQ(CreateInProcessBootstraps(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateInProcessBootstraps(-3).status().code(), StatusCode::kInvalidArgument);
  auto one = CreateInProcessBootstraps(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0]->kind(), "in-process");
}

TEST(InProcessBootstrap, TimeoutNamesTheMissingRanks) {
  auto made = CreateInProcessBootstraps(4);
  ASSERT_TRUE(made.ok());
  auto& b = *made;
  // Ranks 1 and 3 never call the AllGather.
  std::vector<Status> got = OnThreads<Status>(2, [&](int i) {
    return b[i * 2]->AllGather(Pattern(3, i, 0), In(0.3)).status();
  });
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "ranks 1, 3 did not call AllGather")) << s.message();
  }
  // Sticky afterwards.
  EXPECT_EQ(b[0]->Barrier(In(1)).code(), StatusCode::kAborted);
}

TEST(InProcessBootstrap, ARankThatLeavesDuringACollectiveIsNamed) {
  auto made = CreateInProcessBootstraps(3);
  ASSERT_TRUE(made.ok());
  auto& b = *made;
  // Rank 2 leaves while the others are waiting in a Barrier.
  std::thread leaver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    b[2].reset();
  });
  auto start = std::chrono::steady_clock::now();
  std::vector<Status> got = OnThreads<Status>(2, [&](int r) { return b[r]->Barrier(In(20)); });
  leaver.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "rank 2 left")) << s.message();
  }
}

TEST(InProcessBootstrap, WhatALeavingRankSentStillArrives) {
  auto made = CreateInProcessBootstraps(3);
  ASSERT_TRUE(made.ok());
  auto& b = *made;
  ASSERT_TRUE(b[2]->Send(0, 4, Pattern(9, 2, 4), In(1)).ok());
  b[2].reset();
  auto kept = b[0]->Recv(2, 4, In(1));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, Pattern(9, 2, 4));
  // Then its absence is an error, as is sending to it; the survivors still talk.
  auto gone = b[0]->Recv(2, 4, In(5));
  EXPECT_EQ(gone.status().code(), StatusCode::kRemoteError);
  EXPECT_TRUE(Contains(gone.status().message(), "rank 2 left")) << gone.status().message();
  EXPECT_EQ(b[1]->Send(2, 1, {}, In(1)).code(), StatusCode::kRemoteError);
  ASSERT_TRUE(b[1]->Send(0, 8, Pattern(5, 1, 8), In(1)).ok());
  auto fine = b[0]->Recv(1, 8, In(1));
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(*fine, Pattern(5, 1, 8));
}

TEST(InProcessBootstrap, RecvTimeoutIsNotSticky) {
  auto made = CreateInProcessBootstraps(2);
  ASSERT_TRUE(made.ok());
  auto& b = *made;
  auto r = b[0]->Recv(1, 1, In(0.1));
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(Contains(r.status().message(), "rank 1 (tag 1)")) << r.status().message();
  ASSERT_TRUE(b[1]->Send(0, 1, Pattern(1, 1, 1), In(1)).ok());
  EXPECT_TRUE(b[0]->Recv(1, 1, In(1)).ok());
  std::vector<Status> got = OnThreads<Status>(2, [&](int i) { return b[i]->Barrier(In(5)); });
  EXPECT_TRUE(got[0].ok() && got[1].ok());
}

}  // namespace
}  // namespace kizuna::bootstrap
