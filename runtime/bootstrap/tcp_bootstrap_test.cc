// TCP-specific behaviour: strangers (a wrong secret, garbage, silence, a port scan, a forged
// proof) are rejected and logged while the real ranks complete; a rank that never shows up or dies
// gives the others kTimeout / kRemoteError naming it, without waiting out long deadlines;
// misconfigured jobs (sizes that disagree, a duplicate rank) fail on every rank with a clear
// message; IPv6.
#include "runtime/bootstrap/bootstrap.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/bootstrap/auth.h"
#include "runtime/bootstrap/test_util.h"

namespace kizuna::bootstrap {
namespace {

using testing::CapturedLog;
using testing::Contains;
using testing::Count;
using testing::In;
using testing::OnThreads;
using testing::Pattern;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string CheckAllGather(Bootstrap& b) {
  auto all = b.AllGather(Pattern(10 + b.rank(), b.rank(), 1), In(20));
  if (!all.ok()) return all.status().ToString();
  for (int r = 0; r < b.size(); ++r)
    if ((*all)[r] != Pattern(10 + r, r, 1)) return fmt::format("entry {} wrong", r);
  return "";
}

TEST(TcpBootstrap, StrangersAreRejectedAndLoggedWhileTheRanksComplete) {
  CapturedLog log;
  const int n = 3;
  UniqueId id = testing::LoopbackId();
  TcpBootstrapOptions options;
  options.handshake_timeout_s = 0.3;

  // Strangers at the root, before any rank: garbage shaped like a frame header, a connection that
  // sends nothing, a port scan (connect, close) ...
  UniqueFd garbage = testing::ConnectRaw(id.root);
  std::string junk = "KZBF\x01 a join frame without any handshake, and then some more bytes........";
  ASSERT_EQ(write(garbage.get(), junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  UniqueFd silent = testing::ConnectRaw(id.root);
  testing::ConnectRaw(id.root).Reset();
  // ... and a rank of another job (a valid hello, another secret), which finds out and closes.
  UniqueId other = id;
  other.secret[0] ^= 0xff;
  std::thread wrong_job([&] {
    UniqueFd fd = testing::ConnectRaw(id.root);
    Status s = AuthenticateAsClient(fd.get(), other.secret, Route{1, 0}, In(10), "the root");
    EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "secret")) << s.message();
  });

  // The real ranks; the last one comes late, so the root is still waiting when the silent
  // stranger's handshake time runs out.
  std::vector<std::string> errors = OnThreads<std::string>(n, [&](int r) -> std::string {
    if (r == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    auto b = CreateTcpBootstrap(id, r, n, In(20), options);
    if (!b.ok()) return b.status().ToString();
    std::string e = CheckAllGather(**b);
    if (!e.empty()) return e;
    Status s = (*b)->Barrier(In(20));
    return s.ok() ? "" : s.ToString();
  });
  wrong_job.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  EXPECT_TRUE(testing::ClosedByPeerWithin(garbage.get(), 1)) << "the garbage connection is still open";
  EXPECT_TRUE(testing::ClosedByPeerWithin(silent.get(), 1)) << "the silent connection is still open";

  std::string text = log.Read();
  EXPECT_GE(Count(text, "rejected a connection from 127.0.0.1:"), 4u) << text;
  EXPECT_TRUE(Contains(text, "did not authenticate within")) << text;
  EXPECT_TRUE(Contains(text, "magic")) << text;
  EXPECT_GE(Count(text, "closed the connection before authenticating"), 2u) << text;
  EXPECT_TRUE(Contains(text, "WARN BOOTSTRAP")) << text;
}

TEST(TcpBootstrap, AForgedProofIsRejected) {
  CapturedLog log;
  UniqueId id = testing::LoopbackId();
  UniqueId other = id;
  other.secret[3] ^= 0x10;
  std::thread stranger([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    UniqueFd fd = testing::ConnectRaw(id.root);
    auto hs = ClientHandshake::Start(other.secret, Route{1, 0});
    ASSERT_TRUE(hs.ok());
    ASSERT_EQ(write(fd.get(), hs->hello().data(), hs->hello().size()), static_cast<ssize_t>(kClientHelloBytes));
    ServerHello reply;
    size_t got = 0;
    while (got < reply.size()) {
      ssize_t n = read(fd.get(), reply.data() + got, reply.size() - got);
      ASSERT_GT(n, 0) << "the root closed before its hello";
      got += static_cast<size_t>(n);
    }
    ClientProof fake{};  // what a stranger without the secret can send
    ASSERT_EQ(write(fd.get(), fake.data(), fake.size()), static_cast<ssize_t>(fake.size()));
    EXPECT_TRUE(testing::ClosedByPeerWithin(fd.get(), 5));
  });
  // Rank 1 arrives after the stranger is dealt with.
  std::vector<Status> got = OnThreads<Status>(2, [&](int r) -> Status {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    auto b = CreateTcpBootstrap(id, r, 2, In(20));
    return b.status();
  });
  stranger.join();
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_TRUE(got[1].ok()) << got[1].ToString();
  EXPECT_TRUE(Contains(log.Read(), "failed authentication")) << log.Read();
}

TEST(TcpBootstrap, ARankOfAnotherJobIsToldAndTheJobCompletes) {
  UniqueId id = testing::LoopbackId();
  UniqueId other = id;
  other.secret[15] ^= 1;
  double stranger_s = 0;
  std::vector<Status> got = OnThreads<Status>(3, [&](int r) -> Status {
    if (r == 2) {  // another job's rank 1, pointed at this job's root
      const auto start = Clock::now();
      auto b = CreateTcpBootstrap(other, 1, 2, In(10));
      stranger_s = Since(start);
      return b.status();
    }
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto b = CreateTcpBootstrap(id, r, 2, In(20));
    if (!b.ok()) return b.status();
    return (*b)->Barrier(In(20));
  });
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_TRUE(got[1].ok()) << got[1].ToString();
  EXPECT_EQ(got[2].code(), StatusCode::kRemoteError) << got[2].ToString();
  // Told at once, not at its deadline, what happened and what to check.
  const std::string refused = "the root at " + id.root.ToString() + " refused this rank";
  EXPECT_TRUE(Contains(got[2].message(), refused)) << got[2].message();
  EXPECT_TRUE(Contains(got[2].message(), "secret")) << got[2].message();
  EXPECT_TRUE(Contains(got[2].message(), "KIZUNA_UNIQUE_ID")) << got[2].message();
  EXPECT_LT(stranger_s, 5.0);
}

TEST(TcpBootstrap, ARankThatNeverShowsUpIsNamedInTheTimeout) {
  UniqueId id = testing::LoopbackId();
  auto start = Clock::now();
  // Rank 2 of 3 never starts.
  std::vector<Status> got = OnThreads<Status>(2, [&](int r) { return CreateTcpBootstrap(id, r, 3, In(1.5)).status(); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kTimeout) << "rank " << r << ": " << got[r].ToString();
    EXPECT_TRUE(Contains(got[r].message(), "rank 2 never joined")) << "rank " << r << ": " << got[r].message();
  }
  EXPECT_LT(Since(start), 5.0);
}

TEST(TcpBootstrap, TheRootNeverShowsUp) {
  UniqueId id = testing::LoopbackId();
  internal::TakeReservedListener(id.root.port).Reset();  // nobody listens there now
  auto start = Clock::now();
  auto b = CreateTcpBootstrap(id, 1, 2, In(0.5));
  EXPECT_EQ(b.status().code(), StatusCode::kTimeout) << b.status().ToString();
  EXPECT_TRUE(Contains(b.status().message(), "could not reach the root")) << b.status().message();
  EXPECT_TRUE(Contains(b.status().message(), "refused")) << b.status().message();
  EXPECT_LT(Since(start), 3.0);
}

TEST(TcpBootstrap, ARankThatDiesMidwayIsNamed) {
  testing::TcpJob job = testing::CreateTcpJob(3);
  for (const Status& s : job.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<std::string> first = OnThreads<std::string>(3, [&](int r) { return CheckAllGather(*job.ranks[r]); });
  for (const std::string& e : first) ASSERT_EQ(e, "");
  job.ranks[2].reset();  // rank 2 leaves (as when its process ends)
  auto start = Clock::now();
  std::vector<Status> got = OnThreads<Status>(2, [&](int r) { return job.ranks[r]->AllGather({}, In(30)).status(); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kRemoteError) << "rank " << r << ": " << got[r].ToString();
    EXPECT_TRUE(Contains(got[r].message(), "rank 2")) << got[r].message();
  }
  EXPECT_LT(Since(start), 5.0) << "the survivors waited for their deadline";
}

TEST(TcpBootstrap, TheRootDyingIsNamed) {
  testing::TcpJob job = testing::CreateTcpJob(3);
  for (const Status& s : job.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  job.ranks[0].reset();
  auto start = Clock::now();
  std::vector<Status> got =
      OnThreads<Status>(2, [&](int r) { return job.ranks[r + 1]->Barrier(In(30)); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kRemoteError) << got[r].ToString();
    EXPECT_TRUE(Contains(got[r].message(), "rank 0")) << got[r].message();
  }
  EXPECT_LT(Since(start), 5.0);
}

TEST(TcpBootstrap, ARankStuckOutsideTheCollectiveIsNamed) {
  testing::TcpJob job = testing::CreateTcpJob(3);
  for (const Status& s : job.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  // Rank 1 never calls the Barrier; the root names it, and rank 2 hears it from the root.
  std::vector<Status> got = OnThreads<Status>(2, [&](int i) { return job.ranks[i == 0 ? 0 : 2]->Barrier(In(1.5)); });
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "rank 1 did not call Barrier")) << s.message();
  }
}

TEST(TcpBootstrap, PointToPointWithADeadOrSilentPeer) {
  testing::TcpJob job = testing::CreateTcpJob(3);
  for (const Status& s : job.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  Bootstrap& r0 = *job.ranks[0];
  Bootstrap& r1 = *job.ranks[1];

  // A Recv nobody answers times out naming the peer and tag, and can be retried.
  auto start = Clock::now();
  auto none = r0.Recv(1, 5, In(0.3));
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().ToString();
  EXPECT_TRUE(Contains(none.status().message(), "rank 1 (tag 5)")) << none.status().message();
  EXPECT_LT(Since(start), 2.0);

  // Rank 1 sends, then leaves: what it sent still arrives, then its absence is an error.
  std::vector<std::string> errors = OnThreads<std::string>(2, [&](int r) -> std::string {
    if (r == 1) {
      Status s = r1.Send(0, 5, Pattern(1000, 1, 5), In(20));
      if (!s.ok()) return s.ToString();
      // Wait for rank 0 to confirm before leaving, so the message is not racing the close.
      auto ack = r1.Recv(0, 6, In(20));
      return ack.ok() ? "" : ack.status().ToString();
    }
    auto got = r0.Recv(1, 5, In(20));
    if (!got.ok() || *got != Pattern(1000, 1, 5)) return "message from rank 1 lost";
    Status s = r0.Send(1, 6, {}, In(20));
    return s.ok() ? "" : s.ToString();
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  job.ranks[1].reset();
  start = Clock::now();
  auto gone = r0.Recv(1, 7, In(20));
  EXPECT_EQ(gone.status().code(), StatusCode::kRemoteError) << gone.status().ToString();
  EXPECT_TRUE(Contains(gone.status().message(), "rank 1")) << gone.status().message();
  EXPECT_LT(Since(start), 5.0);

  // Sending to a rank that has gone: refused at once, naming it.
  job.ranks[2].reset();
  Status s = r0.Send(2, 1, Pattern(10, 0, 1), In(20));
  EXPECT_EQ(s.code(), StatusCode::kRemoteError) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "rank 2")) << s.message();
  EXPECT_LT(Since(start), 5.0);
}

TEST(TcpBootstrap, SizesThatDisagreeFailEveryRank) {
  UniqueId id = testing::LoopbackId();
  std::vector<Status> got = OnThreads<Status>(2, [&](int r) {
    return CreateTcpBootstrap(id, r, r == 0 ? 2 : 3, In(10)).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << got[r].ToString();
    EXPECT_TRUE(Contains(got[r].message(), "size 3")) << got[r].message();
    EXPECT_TRUE(Contains(got[r].message(), "size 2")) << got[r].message();
  }
}

TEST(TcpBootstrap, ADuplicateRankFailsEveryRank) {
  UniqueId id = testing::LoopbackId();
  // Two processes both claim rank 1 of 3 (rank 2 never starts).
  std::vector<Status> got = OnThreads<Status>(3, [&](int r) {
    return CreateTcpBootstrap(id, r == 0 ? 0 : 1, 3, In(10)).status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << "rank " << r << ": " << got[r].ToString();
    EXPECT_TRUE(Contains(got[r].message(), "rank 1 joined twice")) << got[r].message();
  }
}

TEST(TcpBootstrap, BadArgumentsOfCreate) {
  UniqueId id = testing::LoopbackId();
  EXPECT_EQ(CreateTcpBootstrap(id, 2, 2, In(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateTcpBootstrap(id, -1, 2, In(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateTcpBootstrap(id, 0, 0, In(1)).status().code(), StatusCode::kInvalidArgument);
  UniqueId no_port = id;
  no_port.root.port = 0;
  EXPECT_EQ(CreateTcpBootstrap(no_port, 0, 2, In(1)).status().code(), StatusCode::kInvalidArgument);
  UniqueId bad_host = id;
  bad_host.root.host = "not a host";
  EXPECT_EQ(CreateTcpBootstrap(bad_host, 1, 2, In(1)).status().code(), StatusCode::kInvalidArgument);
}

TEST(TcpBootstrap, Ipv6Loopback) {
  {
    Result<UniqueId> probe = CreateUniqueId(HostPort{"::1", 0});
    if (!probe.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << probe.status().ToString();
    internal::TakeReservedListener(probe->root.port).Reset();
  }
  testing::TcpJob job = testing::CreateTcpJob(3, 20, {}, "::1");
  for (const Status& s : job.statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Contains(job.id.ToString(), "kz1:[::1]:")) << job.id.ToString();
  std::vector<std::string> errors = OnThreads<std::string>(3, [&](int r) -> std::string {
    std::string e = CheckAllGather(*job.ranks[r]);
    if (!e.empty()) return e;
    int peer = (r + 1) % 3;
    Status s = job.ranks[r]->Send(peer, 1, Pattern(77, r, peer), In(20));
    if (!s.ok()) return s.ToString();
    auto got = job.ranks[r]->Recv((r + 2) % 3, 1, In(20));
    if (!got.ok()) return got.status().ToString();
    return *got == Pattern(77, (r + 2) % 3, r) ? "" : "wrong bytes";
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpBootstrap, TheRootBindsTheIdsPortWithoutAReservation) {
  // As under kizuna-run: the id was made elsewhere, so the root binds the port itself.
  UniqueId id = testing::LoopbackId();
  internal::TakeReservedListener(id.root.port).Reset();
  testing::TcpJob job;
  std::vector<Status> got = OnThreads<Status>(2, [&](int r) {
    auto b = CreateTcpBootstrap(id, r, 2, In(20));
    if (!b.ok()) return b.status();
    return CheckAllGather(**b).empty() ? Status::Ok() : Internal("allgather");
  });
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_TRUE(got[1].ok()) << got[1].ToString();
}

}  // namespace
}  // namespace kizuna::bootstrap
