// The Bootstrap contract, checked the same way on both implementations (TCP over 127.0.0.1 and
// in-process) with 1, 2, 3 and 5 ranks as threads: AllGather of blobs of different sizes (empty
// ones included) over several rounds, Send/Recv between every pair (self included) with tag
// matching and per-tag order, messages larger than a socket buffer sent both ways at once, Barrier,
// argument checks, the one-call-at-a-time rule and collective mismatches.
#include "runtime/bootstrap/bootstrap.h"

#include <atomic>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/bootstrap/in_process.h"
#include "runtime/bootstrap/test_util.h"

namespace kizuna::bootstrap {
namespace {

using testing::In;
using testing::OnThreads;
using testing::Pattern;

enum class Kind { kTcp, kInProcess };

struct Param {
  Kind kind;
  int n;
};

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  return fmt::format("{}_{}ranks", info.param.kind == Kind::kTcp ? "Tcp" : "InProcess", info.param.n);
}

class BootstrapContract : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const Param& p = GetParam();
    if (p.kind == Kind::kTcp) {
      testing::TcpJob job = testing::CreateTcpJob(p.n);
      for (int r = 0; r < p.n; ++r) ASSERT_TRUE(job.statuses[r].ok()) << "rank " << r << ": " << job.statuses[r].ToString();
      ranks_ = std::move(job.ranks);
    } else {
      auto made = CreateInProcessBootstraps(p.n);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      ranks_ = std::move(made).value();
    }
    for (int r = 0; r < p.n; ++r) {
      ASSERT_EQ(ranks_[r]->rank(), r);
      ASSERT_EQ(ranks_[r]->size(), p.n);
    }
  }

  int n() const { return GetParam().n; }
  Bootstrap& rank(int r) { return *ranks_[r]; }

  // Runs fn on every rank's thread; each returns "" or what went wrong.
  void EveryRank(const std::function<std::string(Bootstrap&)>& fn) {
    std::vector<std::string> errors = OnThreads<std::string>(n(), [&](int r) { return fn(rank(r)); });
    for (int r = 0; r < n(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }

  std::vector<std::unique_ptr<Bootstrap>> ranks_;
};

size_t BlobSize(int rank, int round) {
  if (rank == 1) return 0;  // an empty contribution
  return static_cast<size_t>((rank * 1237 + round * 611) % 3001);
}

class BootstrapMultiRankContract : public BootstrapContract {};

TEST_P(BootstrapContract, AllGatherOfDifferentSizesOverSeveralRounds) {
  EveryRank([&](Bootstrap& b) -> std::string {
    for (int round = 0; round < 4; ++round) {
      Bytes mine = Pattern(BlobSize(b.rank(), round), b.rank(), round);
      auto all = b.AllGather(mine, In(20));
      if (!all.ok()) return all.status().ToString();
      if (static_cast<int>(all->size()) != n()) return fmt::format("{} entries", all->size());
      for (int r = 0; r < n(); ++r)
        if ((*all)[r] != Pattern(BlobSize(r, round), r, round)) return fmt::format("round {}: entry {} wrong", round, r);
    }
    return "";
  });
}

TEST_P(BootstrapContract, SendRecvBetweenEveryPairWithTagsInOrder) {
  EveryRank([&](Bootstrap& b) -> std::string {
    const int me = b.rank();
    // To every rank (itself too): tag 7 twice and tag 9 once, interleaved.
    for (int p = 0; p < n(); ++p) {
      for (auto [tag, seq] : {std::pair{7u, 1}, std::pair{9u, 2}, std::pair{7u, 3}}) {
        Bytes msg = Pattern(100 + 50000 * (seq == 2) + p, me, seq);
        Status s = b.Send(p, tag, msg, In(20));
        if (!s.ok()) return fmt::format("Send to {}: {}", p, s.ToString());
      }
    }
    // Tag 9 first (it overtakes the waiting tag-7 message), then tag 7 in the order sent.
    for (int p = 0; p < n(); ++p) {
      for (auto [tag, seq] : {std::pair{9u, 2}, std::pair{7u, 1}, std::pair{7u, 3}}) {
        auto got = b.Recv(p, tag, In(20));
        if (!got.ok()) return fmt::format("Recv from {} tag {}: {}", p, tag, got.status().ToString());
        if (*got != Pattern(100 + 50000 * (seq == 2) + me, p, seq))
          return fmt::format("Recv from {} tag {}: wrong bytes (message {} expected)", p, tag, seq);
      }
    }
    return "";
  });
}

TEST_P(BootstrapMultiRankContract, LargeMessagesBothWaysAtOnce) {
  // Both ends send first: larger than any socket buffer, so this passes only if a rank keeps
  // taking in while it sends.
  const size_t kBytes = (size_t{8} << 20) + 3;
  EveryRank([&](Bootstrap& b) -> std::string {
    int peer = b.rank() ^ 1;
    if (peer >= n()) return "";
    Status s = b.Send(peer, 1, Pattern(kBytes, b.rank(), 0), In(30));
    if (!s.ok()) return s.ToString();
    auto got = b.Recv(peer, 1, In(30));
    if (!got.ok()) return got.status().ToString();
    return *got == Pattern(kBytes, peer, 0) ? "" : "wrong bytes";
  });
}

TEST_P(BootstrapContract, BarrierWaitsForTheLastRank) {
  std::atomic<int> entered{0};
  std::atomic<int> early{0};
  EveryRank([&](Bootstrap& b) -> std::string {
    if (b.rank() == n() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    entered.fetch_add(1);
    Status s = b.Barrier(In(20));
    if (entered.load() != n()) early.fetch_add(1);
    if (!s.ok()) return s.ToString();
    s = b.Barrier(In(20));
    return s.ok() ? "" : s.ToString();
  });
  EXPECT_EQ(early.load(), 0) << "a rank left the barrier before the last one entered it";
}

TEST_P(BootstrapContract, BadArgumentsAreRejectedAndChangeNothing) {
  Bootstrap& b = rank(0);
  EXPECT_EQ(b.Send(-1, 0, {}, In(1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Send(n(), 0, {}, In(1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Recv(n(), 0, In(1)).status().code(), StatusCode::kInvalidArgument);
  Bytes huge(kMaxMessageBytes + 1);
  Status s = b.Send(0, 0, huge, In(1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::Contains(s.message(), "limit")) << s.message();
  EXPECT_EQ(b.AllGather(huge, In(1)).status().code(), StatusCode::kInvalidArgument);
  // Receiving from itself with nothing sent cannot ever complete: said at once.
  EXPECT_EQ(b.Recv(0, 3, In(5)).status().code(), StatusCode::kInvalidArgument);
  // None of that broke anything.
  EveryRank([&](Bootstrap& r) -> std::string { return r.Barrier(In(20)).ToString() == "ok" ? "" : "barrier failed"; });
}

TEST_P(BootstrapMultiRankContract, OneCallAtATime) {
  Bootstrap& b = rank(0);
  std::atomic<bool> started{false};
  std::thread waiter([&] {
    started = true;
    auto r = b.Recv(1, 42, In(1.0));
    EXPECT_EQ(r.status().code(), StatusCode::kTimeout) << r.status().ToString();
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Status s = b.Barrier(In(5));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(testing::Contains(s.message(), "one call at a time")) << s.message();
  waiter.join();
  // The rejected call did not count as a failure, and a Recv that timed out can be retried.
  EveryRank([&](Bootstrap& r) -> std::string {
    if (r.rank() == 1) {
      Status sent = r.Send(0, 42, Pattern(10, 1, 42), In(20));
      if (!sent.ok()) return sent.ToString();
    }
    if (r.rank() == 0) {
      auto got = r.Recv(1, 42, In(20));
      if (!got.ok()) return got.status().ToString();
    }
    Status bs = r.Barrier(In(20));
    return bs.ok() ? "" : bs.ToString();
  });
}

TEST_P(BootstrapMultiRankContract, CollectiveMismatchIsAnErrorOnEveryRank) {
  std::vector<Status> got = OnThreads<Status>(n(), [&](int r) {
    if (r == n() - 1) return rank(r).Barrier(In(10));
    return rank(r).AllGather(Pattern(5, r, 0), In(10)).status();
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << got[r].ToString();
    EXPECT_TRUE(testing::Contains(got[r].message(), "mismatch") || testing::Contains(got[r].message(), "different"))
        << got[r].message();
  }
  // Sticky: the next collective reports the earlier failure.
  Status again = rank(0).Barrier(In(1));
  EXPECT_EQ(again.code(), StatusCode::kAborted) << again.ToString();
}

// Tests that need at least two ranks: instantiated only for those sizes (not skipped at one).
INSTANTIATE_TEST_SUITE_P(Kinds, BootstrapMultiRankContract,
                         ::testing::Values(Param{Kind::kTcp, 2}, Param{Kind::kTcp, 3}, Param{Kind::kTcp, 5},
                                           Param{Kind::kInProcess, 2}, Param{Kind::kInProcess, 3},
                                           Param{Kind::kInProcess, 5}),
                         Name);

INSTANTIATE_TEST_SUITE_P(Kinds, BootstrapContract,
                         ::testing::Values(Param{Kind::kTcp, 1}, Param{Kind::kTcp, 2}, Param{Kind::kTcp, 3},
                                           Param{Kind::kTcp, 5}, Param{Kind::kInProcess, 1},
                                           Param{Kind::kInProcess, 2}, Param{Kind::kInProcess, 3},
                                           Param{Kind::kInProcess, 5}),
                         Name);

}  // namespace
}  // namespace kizuna::bootstrap
